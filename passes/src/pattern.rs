//! Matching helpers shared by the rewriting passes (eliminate_noops and the
//! fusions): constants that are initializers or `Constant` nodes, single
//! consumers, pattern replacement that keeps the final value's name, and
//! inferred types read from a typed copy of the model.

use crate::PassError;
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{
    AttrValue, DType, Graph, Model, NewNode, NodeData, NodeId, Shape, Tensor, ValueId,
};

/// True for default-domain `op`.
pub(crate) fn is_op(d: &NodeData, op: &str) -> bool {
    d.op_type == op && (d.domain.is_empty() || d.domain == "ai.onnx")
}

/// The constant value of `v`: an initializer that is not a graph input,
/// or the output of a `Constant` node.
pub(crate) fn const_tensor(g: &Graph, v: ValueId) -> Option<Tensor> {
    if let Some(t) = g.constant(v) {
        return Some(t.clone());
    }
    let (p, _) = g.producer(v)?;
    let d = g.node(p);
    if !is_op(d, "Constant") {
        return None;
    }
    let a = d.attributes.first()?;
    match &a.value {
        AttrValue::Tensor(t) if a.name == "value" => Some(t.clone()),
        AttrValue::Float(f) if a.name == "value_float" => Some(Tensor::scalar_f32(*f)),
        AttrValue::Floats(f) if a.name == "value_floats" => {
            Tensor::from_f32(vec![f.len() as i64], f).ok()
        }
        AttrValue::Int(i) if a.name == "value_int" => Some(Tensor::scalar_i64(*i)),
        AttrValue::Ints(i) if a.name == "value_ints" => {
            Tensor::from_i64(vec![i.len() as i64], i).ok()
        }
        _ => None,
    }
}

/// A constant integer tensor's values.
pub(crate) fn const_ints(g: &Graph, v: ValueId) -> Option<Vec<i64>> {
    let t = const_tensor(g, v)?;
    if !t.dtype.is_int() {
        return None;
    }
    t.to_i64_vec()
}

/// The only node reading `v` (through one input slot), when `v` is not a
/// graph output.
pub(crate) fn only_use(g: &Graph, v: ValueId) -> Option<NodeId> {
    match g.uses(v) {
        [u @ graphopt_ir::Use::Input { .. }] if !g.is_output(v) => Some(u.node()),
        _ => None,
    }
}

/// The node producing `v` if it is a default-domain `op`.
pub(crate) fn producer_op(g: &Graph, v: ValueId, op: &str) -> Option<NodeId> {
    let (p, _) = g.producer(v)?;
    is_op(g.node(p), op).then_some(p)
}

/// Replaces the nodes `remove` (whose last, `last`, computes the value
/// the new node takes over) by `new`, placed where `last` was. `new`'s
/// outputs must be `last`'s outputs, so the value keeps its name. Values
/// only the removed nodes defined are removed, and so are constants they
/// read that nothing reads any more.
pub(crate) fn replace_nodes(
    g: &mut Graph,
    remove: &[NodeId],
    last: NodeId,
    new: NewNode,
) -> Result<NodeId, PassError> {
    let pos = g.order().iter().position(|&n| n == last).unwrap_or(0);
    let before = g
        .order()
        .iter()
        .take(pos)
        .filter(|n| remove.contains(n))
        .count();
    let kept: Vec<ValueId> = new.outputs.iter().flatten().copied().collect();
    let mut read: Vec<ValueId> = Vec::new();
    let mut defined: Vec<ValueId> = Vec::new();
    for &n in remove {
        read.extend(g.node(n).inputs().iter().flatten());
        defined.extend(g.node(n).outputs().iter().flatten());
    }
    g.remove_nodes(remove);
    for v in defined {
        if !kept.contains(&v) && g.uses(v).is_empty() && !g.is_output(v) {
            g.remove_value(v);
        }
    }
    let id = g.insert_node(pos - before, new)?;
    sweep_constants(g, &read);
    Ok(id)
}

/// Removes the constants among `vals` (initializers, Constant nodes) that
/// nothing reads any more.
pub(crate) fn sweep_constants(g: &mut Graph, vals: &[ValueId]) {
    for &v in vals {
        if !g.is_live_value(v) || !g.uses(v).is_empty() || g.is_output(v) || g.is_input(v) {
            continue;
        }
        if g.producer(v).is_none() && g.take_initializer(v).is_some() {
            g.remove_value(v);
        } else if let Some(p) = producer_op(g, v, "Constant") {
            g.remove_node(p);
            g.remove_value(v);
        }
    }
}

/// A copy of `m` with inferred types (the model itself keeps its own).
pub(crate) fn typed_copy(m: &Model) -> Model {
    let mut c = m.clone();
    infer_model(&mut c, &InferOptions::default());
    c
}

/// Runs `f` on `g` and every subgraph (innermost first), each paired with
/// its counterpart in `tg`, a typed copy taken before any change.
pub(crate) fn walk_typed(
    g: &mut Graph,
    tg: &Graph,
    f: &mut dyn FnMut(&mut Graph, &Graph) -> Result<(), PassError>,
) -> Result<(), PassError> {
    let empty = Graph::default();
    let nodes: Vec<_> = g.nodes().filter(|&n| g.node(n).has_subgraphs()).collect();
    for n in nodes {
        let tnode = tg.is_live_node(n).then(|| tg.node(n));
        for (ai, a) in g.node_mut(n).attributes.iter_mut().enumerate() {
            for (gi, sub) in a.graphs_mut().enumerate() {
                let tsub = tnode
                    .and_then(|t| t.attributes.get(ai))
                    .and_then(|ta| ta.graphs().nth(gi))
                    .unwrap_or(&empty);
                walk_typed(sub, tsub, f)?;
            }
        }
        g.refresh_captures(n);
    }
    f(g, tg)
}

/// Reads inferred types of a graph's values from its typed copy.
pub(crate) struct TypedGraph<'a> {
    pub tg: &'a Graph,
}

impl TypedGraph<'_> {
    /// Inferred (or declared) shape of `v`, if `v` existed before the
    /// pass started.
    pub(crate) fn shape(&self, v: ValueId) -> Option<&Shape> {
        if !self.tg.is_live_value(v) {
            return None;
        }
        self.tg.ty(v)?.shape()
    }

    pub(crate) fn elem(&self, v: ValueId) -> Option<DType> {
        if !self.tg.is_live_value(v) {
            return None;
        }
        self.tg
            .ty(v)?
            .elem()
            .filter(|d| !matches!(d, DType::Undefined))
    }

    /// Declared element type in the graph being rewritten (for values the
    /// typed copy does not know).
    pub(crate) fn elem_of(&self, g: &Graph, v: ValueId) -> Option<DType> {
        g.ty(v)?.elem().filter(|d| !matches!(d, DType::Undefined))
    }

    pub(crate) fn rank(&self, v: ValueId) -> Option<usize> {
        self.shape(v).map(Shape::rank)
    }
}
