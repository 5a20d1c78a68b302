//! What a rule sees of one node: input types, constant inputs, shape values
//! and attributes, all through accessors that never panic.

use super::SVal;
use crate::{DType, Dim, Graph, NodeData, Shape, Tensor, TensorType, Type, TypeKind, ValueId};
use std::cell::RefCell;
use std::collections::HashMap;

pub(crate) struct Cx<'a> {
    pub g: &'a Graph,
    pub node: &'a NodeData,
    pub opset: i64,
    pub vals: &'a HashMap<ValueId, SVal>,
    pub outer: &'a HashMap<ValueId, Type>,
    /// Initializers of graph inputs count as their values
    /// ([`super::InferOptions::input_defaults`]).
    pub input_defaults: bool,
    /// Inconsistencies found in the node's inputs.
    pub warns: RefCell<Vec<String>>,
}

/// Largest constant tensor read for its values.
const MAX_CONST_READ: u64 = 1 << 16;

impl<'a> Cx<'a> {
    /// Records an inconsistency in this node's inputs.
    pub fn warn(&self, msg: impl std::fmt::Display) {
        let n = self.node;
        self.warns
            .borrow_mut()
            .push(format!("node '{}' ({}): {msg}", n.name, n.qualified_op()));
    }
    pub fn op(&self) -> &str {
        &self.node.op_type
    }
    /// Number of input slots (present or not).
    pub fn nin(&self) -> usize {
        self.node.inputs().len()
    }
    pub fn nout(&self) -> usize {
        self.node.outputs().len()
    }
    pub fn has(&self, i: usize) -> bool {
        self.node.input(i).is_some()
    }
    pub fn ty(&self, i: usize) -> Option<&'a Type> {
        let v = self.node.input(i)?;
        self.outer.get(&v).or_else(|| self.g.ty(v))
    }
    pub fn tt(&self, i: usize) -> Option<&'a TensorType> {
        self.ty(i)?.as_tensor()
    }
    /// Element type of input `i` (`None` when unknown or undefined).
    pub fn elem(&self, i: usize) -> Option<DType> {
        self.tt(i)
            .map(|t| t.elem)
            .filter(|e| *e != DType::Undefined)
    }
    pub fn shape(&self, i: usize) -> Option<&'a Shape> {
        self.tt(i)?.shape.as_ref()
    }
    pub fn dims(&self, i: usize) -> Option<&'a [Dim]> {
        self.shape(i).map(|s| s.dims.as_slice())
    }
    pub fn rank(&self, i: usize) -> Option<usize> {
        self.shape(i).map(|s| s.rank())
    }
    /// The shape value of input `i`.
    pub fn val(&self, i: usize) -> Option<&'a SVal> {
        self.vals.get(&self.node.input(i)?)
    }
    /// Input `i` as fully known integers.
    pub fn ints(&self, i: usize) -> Option<Vec<i64>> {
        if let Some(v) = self.val(i) {
            if let Some(k) = v.known() {
                return Some(k);
            }
        }
        let t = self.const_tensor(i)?;
        t.to_i64_vec()
    }
    /// Input `i` as a vector of dims (partially known).
    pub fn dim_vals(&self, i: usize) -> Option<Vec<Dim>> {
        if let Some(v) = self.val(i) {
            return Some(v.elems.clone());
        }
        self.ints(i)
            .map(|v| v.into_iter().map(Dim::Known).collect())
    }
    /// Input `i` as known floats (constant tensors, or integer shape values).
    pub fn floats(&self, i: usize) -> Option<Vec<f64>> {
        if let Some(t) = self.const_tensor(i) {
            if let Some(f) = t.to_f64_vec() {
                return Some(f);
            }
        }
        self.val(i)?
            .known()
            .map(|v| v.into_iter().map(|x| x as f64).collect())
    }
    /// The constant tensor behind input `i`: an initializer (not an
    /// overridable input, unless `input_defaults`) or the value of a
    /// `Constant` node.
    pub fn const_tensor(&self, i: usize) -> Option<Tensor> {
        let v = self.node.input(i)?;
        let t = if let Some(t) = self.g.constant(v) {
            t.clone()
        } else if let Some(t) = self.input_defaults.then(|| self.g.initializer(v)).flatten() {
            t.clone()
        } else {
            let p = self.g.producer_node(v)?;
            if p.op_type != "Constant" || !(p.domain.is_empty() || p.domain == "ai.onnx") {
                return None;
            }
            constant_tensor(p)?
        };
        (t.numel().ok()? <= MAX_CONST_READ && t.check().is_ok()).then_some(t)
    }
    pub fn ai(&self, name: &str) -> Option<i64> {
        self.node.attr_int(name)
    }
    pub fn ai_or(&self, name: &str, d: i64) -> i64 {
        self.ai(name).unwrap_or(d)
    }
    pub fn aints(&self, name: &str) -> Option<&'a [i64]> {
        self.node.attr_ints(name)
    }
    pub fn afloats(&self, name: &str) -> Option<&'a [f32]> {
        match &self.node.attr(name)?.value {
            crate::AttrValue::Floats(v) => Some(v),
            _ => None,
        }
    }
    pub fn astr(&self, name: &str) -> Option<&'a str> {
        self.node.attr_str(name)
    }
    /// A dtype attribute (`to`, `dtype`, `output_dtype`).
    pub fn adtype(&self, name: &str) -> Option<DType> {
        let c = self.ai(name)?;
        let c = i32::try_from(c).ok()?;
        let d = DType::from_onnx(c);
        (d != DType::Undefined && !matches!(d, DType::Other(_))).then_some(d)
    }
}

/// A tensor type (element type may be `Undefined` when not known).
pub(crate) fn tensor(elem: Option<DType>, dims: Option<Vec<Dim>>) -> Option<Type> {
    Some(Type::tensor(
        elem.unwrap_or(DType::Undefined),
        dims.map(Shape::new),
    ))
}

/// The tensor a `Constant` node produces.
pub(crate) fn constant_tensor(p: &NodeData) -> Option<Tensor> {
    if let Some(t) = p.attr_tensor("value") {
        return Some(t.clone());
    }
    if let Some(v) = p.attr_int("value_int") {
        return Some(Tensor::scalar_i64(v));
    }
    if let Some(v) = p.attr_ints("value_ints") {
        return Tensor::from_i64(vec![v.len() as i64], v).ok();
    }
    if let Some(v) = p.attr_float("value_float") {
        return Some(Tensor::scalar_f32(v));
    }
    if let Some(a) = p.attr("value_floats") {
        if let crate::AttrValue::Floats(v) = &a.value {
            return Tensor::from_f32(vec![v.len() as i64], v).ok();
        }
    }
    None
}

/// The type of a value of `Type` wrapped in a sequence/optional, unwrapped.
pub(crate) fn seq_elem(t: &Type) -> Option<&Type> {
    match &t.kind {
        TypeKind::Sequence(Some(e)) => Some(e),
        _ => None,
    }
}
