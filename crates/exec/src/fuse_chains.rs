//! Fuses chains of elementwise nodes into one node for the CPU runtime, so
//! that the chain runs as one loop over tiles ([`crate::cpu::chain`]) and
//! its intermediates are never planned.
//!
//! A chain is a set of default-domain elementwise nodes whose values are
//! each read only by one node of the set, except the last node's output,
//! which is float32. The nodes:
//! - on float32: Add, Sub, Mul, Div, Pow, Max and Min of two inputs; Neg,
//!   Abs, Sqrt, Reciprocal, Exp, Log, Erf, Tanh, Sigmoid, Relu;
//! - Not, And, Or and Xor of booleans;
//! - Where of a boolean condition and two float32 values;
//! - Cast to float32 of a float32 or boolean value, or of an input of
//!   another type the kernel loads (bool, int8, uint8, int32, uint32,
//!   int64, float16, bfloat16, float64; [`crate::cpu::elementwise::TO_F32`]).
//!
//! Comparisons (Greater, Less, ...) stay nodes: their boolean output is a
//! quarter of their float input, and fused into a later chain they would
//! keep that input alive until the chain runs (resnet18's training step:
//! its ReLU masks `Greater(y, 0)`, made in the forward pass and read by
//! the backward `Where`, took the arena from 209.5 to 241.7 MB when they
//! were fused). The chain then reads the mask as an input.
//!
//! Its external operands (activations, constants, broadcast rows or
//! scalars, each once however often it is read) become the fused node's
//! inputs. Each chain gets an op of its own, `ElementwiseChain.<k>` in
//! domain `graphopt.exec`, typed for the planner by a model-local function
//! whose body is the chain itself; the kernel reads the steps from the
//! node's `ops` and `args` attributes. The planner's in-place table treats
//! these ops as elementwise ([`graphopt_plan::inplace_rule_in`]), so the
//! output may take the storage of a same-sized input that dies there.
//!
//! Before (GELU as the TorchScript exporter writes it):
//! ```text
//! d = Div(x, c1); e = Erf(d); a = Add(e, c2); m = Mul(x, a); y = Mul(m, c3)
//! ```
//! After (`d`, `e`, `a`, `m` are gone):
//! ```text
//! y = graphopt.exec::ElementwiseChain.0(x, c1, c2, c3)
//!       <ops = ["Div", "Erf", "Add", "Mul", "Mul"],
//!        args = [0,1,-1, 4,-1,-1, 5,2,-1, 0,6,-1, 7,3,-1]>
//! ```
//! Chains run only on graphopt's CPU runtime: it plans and runs a lowered
//! copy ([`crate::lower::lowered_copy`]); the model a user holds is not
//! rewritten.

use std::collections::{HashMap, HashSet};

use crate::cpu::chain::{loadable, Kind, Op, MAX_INPUTS};
use crate::lower::{default_domain, import_exec_domain, replace_node, CODED_DOMAIN};
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{
    AttrValue, Attribute, DType, Function, Graph, Model, NewNode, NodeId, OpsetImport, Use, ValueId,
};
use graphopt_plan::CHAIN_OP;

/// Most steps of one chain (each holds a 2 KiB tile of scratch).
const MAX_STEPS: usize = 24;

/// Fuses every chain of at least two nodes in the main graph of `m` (see
/// the module docs). Returns the chains made and the nodes they replaced.
pub fn fuse_chains(m: &mut Model) -> (usize, usize) {
    // Element types of every value (a model may come without them).
    let mut typed = m.clone();
    infer_model(&mut typed, &InferOptions::default());
    let g = &typed.graph;
    let elem = |v: ValueId| g.ty(v).and_then(|t| t.elem());
    let f32_value = |v: ValueId| elem(v) == Some(DType::F32);
    let of_kind = |v: &Option<ValueId>, k: Kind| {
        let t = v.and_then(elem);
        match k {
            Kind::Float => t == Some(DType::F32),
            Kind::Bool => t == Some(DType::Bool),
            Kind::Any => t.is_some_and(loadable),
        }
    };
    // A Cast's only attributes: `to` float (and `saturate`, which only
    // float8 targets read).
    let attributes_ok = |d: &graphopt_ir::NodeData, op: Op| {
        d.attributes.iter().all(|a| {
            op == Op::Cast
                && match a.name.as_str() {
                    "to" => a.value == AttrValue::Int(i64::from(DType::F32.to_onnx())),
                    "saturate" => true,
                    _ => false,
                }
        })
    };
    let eligible = |n: NodeId| -> bool {
        let d = g.node(n);
        let Some(op) = Op::of(&d.op_type) else {
            return false;
        };
        default_domain(&d.domain)
            && attributes_ok(d, op)
            && !d.has_subgraphs()
            && d.inputs().len() == op.arity()
            && d.inputs()
                .iter()
                .zip(op.operands())
                .all(|(i, &k)| of_kind(i, k))
            && d.outputs().len() == 1
            && of_kind(&d.output(0), op.result())
    };
    // The node that alone reads `v` (in one or more slots), if `v` is not
    // a graph output.
    let sole_reader = |v: ValueId| -> Option<NodeId> {
        if g.is_output(v) {
            return None;
        }
        let mut reader = None;
        for u in g.uses(v) {
            match *u {
                Use::Input { node, .. } if reader.is_none_or(|r| r == node) => reader = Some(node),
                _ => return None,
            }
        }
        reader
    };
    // Node `n` joins its reader's chain.
    let joins = |n: NodeId| -> bool {
        eligible(n)
            && g.node(n)
                .output(0)
                .and_then(sole_reader)
                .is_some_and(eligible)
    };
    let mut chains: Vec<Vec<NodeId>> = Vec::new();
    for &sink in g.order().iter().rev() {
        // The kernel writes float32.
        if !eligible(sink) || joins(sink) || !g.node(sink).output(0).is_some_and(f32_value) {
            continue;
        }
        let mut members = vec![sink];
        let mut stack = vec![sink];
        while let Some(n) = stack.pop() {
            for v in g.node(n).inputs().iter().flatten() {
                if let Some((p, _)) = g.producer(*v) {
                    if joins(p) && !members.contains(&p) {
                        members.push(p);
                        stack.push(p);
                    }
                }
            }
        }
        if members.len() >= 2 {
            members.sort_by_key(|&n| g.position(n));
            chains.push(members);
        }
    }
    // Names of the chains' ops: numbered past any already in the model.
    let mut next = m
        .functions
        .iter()
        .filter(|f| f.domain == CODED_DOMAIN && graphopt_plan::chain_op(&f.name))
        .count();
    let opset = m.onnx_opset().unwrap_or(18);
    let (mut made, mut fused) = (0, 0);
    for members in chains {
        let Some(chain) = Chain::of(g, &members) else {
            continue;
        };
        let op = loop {
            let name = format!("{CHAIN_OP}.{next}");
            next += 1;
            if m.function(CODED_DOMAIN, &name).is_none() {
                break name;
            }
        };
        m.functions.push(chain.function(&op, opset));
        chain.replace(&mut m.graph, &members, &op);
        made += 1;
        fused += members.len();
    }
    if made > 0 {
        import_exec_domain(m);
    }
    (made, fused)
}

/// A chain's external operands and steps.
struct Chain {
    inputs: Vec<ValueId>,
    ops: Vec<String>,
    /// Three per step: an input index, `inputs + s` for step `s`, or -1.
    args: Vec<i64>,
}

impl Chain {
    /// The chain of `members` (in graph order, the last the sink), or
    /// `None` past the size limits.
    fn of(g: &Graph, members: &[NodeId]) -> Option<Chain> {
        let inner: HashSet<ValueId> = members
            .iter()
            .filter_map(|&n| g.node(n).output(0))
            .collect();
        let mut inputs = Vec::new();
        for &n in members {
            for &v in g.node(n).inputs().iter().flatten() {
                if !inner.contains(&v) && !inputs.contains(&v) {
                    inputs.push(v);
                }
            }
        }
        if inputs.len() > MAX_INPUTS || members.len() > MAX_STEPS {
            return None;
        }
        let step_of: HashMap<ValueId, usize> = members
            .iter()
            .enumerate()
            .filter_map(|(s, &n)| g.node(n).output(0).map(|o| (o, s)))
            .collect();
        let index = |v: ValueId| -> i64 {
            match step_of.get(&v) {
                Some(s) => (inputs.len() + s) as i64,
                None => inputs.iter().position(|&i| i == v).unwrap_or(0) as i64,
            }
        };
        let mut ops = Vec::new();
        let mut args = Vec::new();
        for &n in members {
            let d = g.node(n);
            ops.push(d.op_type.clone());
            for k in 0..3 {
                args.push(d.input(k).map_or(-1, index));
            }
        }
        Some(Chain { inputs, ops, args })
    }

    /// The function typing op `op`: the chain's nodes over formals `x0..`,
    /// output `y`.
    fn function(&self, op: &str, opset: i64) -> Function {
        let mut b = Graph::new(op);
        let formals: Vec<ValueId> = (0..self.inputs.len())
            .map(|i| b.add_value(format!("x{i}"), None).expect("fresh body"))
            .collect();
        let mut vals = formals.clone();
        let last = self.ops.len() - 1;
        for (s, op_type) in self.ops.iter().enumerate() {
            let name = if s == last {
                "y".to_string()
            } else {
                format!("t{s}")
            };
            let out = b.add_value(name, None).expect("fresh body");
            let ins: Vec<ValueId> = self.args[3 * s..3 * s + 3]
                .iter()
                .filter(|&&a| a >= 0)
                .map(|&a| vals[a as usize])
                .collect();
            let mut node = NewNode::new(op_type.as_str()).inputs(&ins).outputs(&[out]);
            if op_type == "Cast" {
                node = node.attr(Attribute::new(
                    "to",
                    AttrValue::Int(i64::from(DType::F32.to_onnx())),
                ));
            }
            b.add_node(node).expect("well-formed body");
            vals.push(out);
        }
        b.inputs = formals;
        b.outputs = vec![*vals.last().expect("a step")];
        Function {
            name: op.to_string(),
            domain: CODED_DOMAIN.to_string(),
            overload: String::new(),
            attributes: vec!["ops".into(), "args".into()],
            attribute_defaults: Vec::new(),
            opset_imports: vec![OpsetImport {
                domain: String::new(),
                version: opset,
            }],
            doc_string: format!(
                "graphopt's CPU runtime: {} elementwise nodes ({}) run as one loop over tiles",
                self.ops.len(),
                self.ops.join(", ")
            ),
            metadata_props: Vec::new(),
            body: b,
        }
    }

    /// Puts the fused node in the sink's place and removes the others.
    fn replace(&self, g: &mut Graph, members: &[NodeId], op: &str) {
        let (&sink, rest) = members.split_last().expect("a chain has nodes");
        let attributes = vec![
            Attribute::new(
                "ops",
                AttrValue::Strings(self.ops.iter().map(|o| o.as_bytes().to_vec()).collect()),
            ),
            Attribute::new("args", AttrValue::Ints(self.args.clone())),
        ];
        let inputs = self.inputs.iter().map(|&v| Some(v)).collect();
        replace_node(g, sink, CODED_DOMAIN, op, inputs, attributes, None);
        for &n in rest.iter().rev() {
            let outs: Vec<ValueId> = g.node(n).outputs().iter().flatten().copied().collect();
            g.remove_node(n);
            for o in outs {
                g.remove_value(o);
            }
        }
    }
}
