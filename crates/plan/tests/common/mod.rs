//! Graph builders shared by the integration tests.
#![allow(dead_code)]

use graphopt_ir::{DType, Graph, NewNode, Tensor, Type, ValueId};

/// A graph under construction with f32 tensors of given element counts.
pub struct B {
    pub g: Graph,
}

impl B {
    pub fn new() -> B {
        B { g: Graph::new("g") }
    }
    pub fn input(&mut self, name: &str, n: i64) -> ValueId {
        let v = self
            .g
            .add_value(name, Some(Type::known(DType::F32, &[n])))
            .unwrap();
        self.g.inputs.push(v);
        v
    }
    pub fn weight(&mut self, name: &str, n: i64) -> ValueId {
        let t = Tensor::from_f32(vec![n], &vec![0.0; n as usize]).unwrap();
        let v = self
            .g
            .add_value(name, Some(Type::known(DType::F32, &[n])))
            .unwrap();
        self.g.set_initializer(v, t);
        v
    }
    pub fn node(&mut self, op: &str, name: &str, ins: &[ValueId], out: &str, n: i64) -> ValueId {
        let o = self
            .g
            .add_value(out, Some(Type::known(DType::F32, &[n])))
            .unwrap();
        self.g
            .add_node(NewNode::new(op).name(name).inputs(ins).outputs(&[o]))
            .unwrap();
        o
    }
    pub fn output(&mut self, v: ValueId) {
        self.g.outputs.push(v);
    }
}
