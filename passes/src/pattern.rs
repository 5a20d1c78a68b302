//! Matching helpers shared by the rewriting passes (eliminate_noops and the
//! fusions): constants that are initializers or `Constant` nodes, single
//! consumers, pattern replacement that keeps the final value's name, and
//! inferred types read from the pipeline's cached type table
//! ([`crate::PassContext::types`]).

use crate::PassError;
use graphopt_ir::infer::TypeTable;
use graphopt_ir::{
    AttrValue, DType, Graph, NewNode, NodeData, NodeId, Patch, Place, Shape, Tensor, ValueId,
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

/// The input of two-input node `n` that is not `v` (`v` itself when both
/// are; None when neither is).
pub(crate) fn other_input(g: &Graph, n: NodeId, v: ValueId) -> Option<ValueId> {
    let d = g.node(n);
    if d.inputs().len() != 2 {
        return None;
    }
    let (i0, i1) = (d.input(0)?, d.input(1)?);
    if i0 == v {
        Some(i1)
    } else if i1 == v {
        Some(i0)
    } else {
        None
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
///
/// One [`Patch`]: when the replacement is impossible (the new node would
/// redefine a value, or a removed value is still read) the graph is left
/// as it was and the error says why.
pub(crate) fn replace_nodes(
    g: &mut Graph,
    remove: &[NodeId],
    last: NodeId,
    new: NewNode,
) -> Result<NodeId, PassError> {
    let read: Vec<ValueId> = remove
        .iter()
        .flat_map(|&n| g.node(n).inputs().iter().flatten().copied())
        .collect();
    let mut patch = Patch::new(format!("replacing nodes by {}", new.op_type));
    patch.remove_nodes(remove).add_node(Place::After(last), new);
    let id = g.apply(patch)?[0];
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

/// Runs `f` on `g` and every subgraph (innermost first), each paired with
/// its counterpart in `tg`, the types inferred before any change.
pub(crate) fn walk_typed(
    g: &mut Graph,
    tg: &TypeTable,
    f: &mut dyn FnMut(&mut Graph, &TypeTable) -> Result<(), PassError>,
) -> Result<(), PassError> {
    let empty = TypeTable::default();
    let nodes: Vec<_> = g.nodes().filter(|&n| g.node(n).has_subgraphs()).collect();
    for n in nodes {
        for (ai, a) in g.node_mut(n).attributes.iter_mut().enumerate() {
            for (gi, sub) in a.graphs_mut().enumerate() {
                let tsub = tg.sub(n, ai, gi).unwrap_or(&empty);
                walk_typed(sub, tsub, f)?;
            }
        }
        g.refresh_captures(n);
    }
    f(g, tg)
}

/// Reads inferred types of a graph's values from the type table.
pub(crate) struct TypedGraph<'a> {
    pub tg: &'a TypeTable,
}

impl TypedGraph<'_> {
    /// Inferred (or declared) shape of `v`, if `v` existed before the
    /// pass started.
    pub(crate) fn shape(&self, v: ValueId) -> Option<&Shape> {
        self.tg.ty(v)?.shape()
    }

    pub(crate) fn elem(&self, v: ValueId) -> Option<DType> {
        self.tg
            .ty(v)?
            .elem()
            .filter(|d| !matches!(d, DType::Undefined))
    }

    /// Declared element type in the graph being rewritten (for values the
    /// type table does not know).
    pub(crate) fn elem_of(&self, g: &Graph, v: ValueId) -> Option<DType> {
        g.ty(v)?.elem().filter(|d| !matches!(d, DType::Undefined))
    }

    pub(crate) fn rank(&self, v: ValueId) -> Option<usize> {
        self.shape(v).map(Shape::rank)
    }
}
