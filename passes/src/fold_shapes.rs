//! Shape folding from inferred shapes.
//!
//! Exporters compute shapes at run time: `Shape(x)`, `Gather` a dim,
//! `Unsqueeze`, `Concat` with constants, `Reshape(y, that)`. When shape
//! inference knows every dim involved, the whole chain is a constant. This
//! pass runs inference (which also writes the inferred types into the
//! model's values: later passes and the exported file gain them), reads its
//! *shape values* (small integer tensors known as vectors of dims), and
//! replaces each node whose output is fully known by an int64 (or int32,
//! bool...: the output's own dtype) initializer. The producers left unread
//! are dropped here; `dce` sweeps the rest.
//!
//! 1. Symbolic dims (`batch`, `seq`) are never folded: only values whose
//!    every element is a known integer are. `--dim NAME=VALUE` style
//!    bindings are not applied here (the model stays general).
//! 2. Only integer and bool outputs are folded, of rank 0 or 1 as their
//!    inferred type says; a float result of shape arithmetic stays.
//! 3. Graph outputs, unread values, `Constant` nodes (`fold_constants`' job)
//!    and nodes with subgraphs are left alone.
//! 4. Subgraphs: each is folded from its own inference (after the main
//!    graph's, which types their formal inputs); values captured from the
//!    enclosing graphs have the types inference gave them there, so a
//!    `Shape` of a captured value with static dims folds inside an `If`
//!    branch too (silero VAD's decoder condition on `state`'s first dim,
//!    inside the sample-rate `If`).
//!
//! 5. A `Reshape` target that is not fully known is still rewritten to a
//!    constant when every element is known, or the same symbolic dim as the
//!    data input's dim at that position (written `0`: copy that dim), except
//!    at most one element that becomes `-1` (Reshape infers it). Not with
//!    `allowzero = 1`, where `0` means an empty dim. This is what makes the
//!    `Shape -> Gather -> Concat` chains of dynamic-batch exports die (ViT,
//!    BERT: the head split and merge on `batch`).
//!
//! Exact: the folded values are what the nodes compute.
//!
//! ```text
//! before:                                      after (with dce):
//! g (float[1,3,4] x) => (float[1,12] y)        g (float[1,3,4] x) => (float[1,12] y)
//!   <int64[1] i = {0}, int64[1] m = {-1}> {      <int64[2] c = {1, -1}> {
//!   s = Shape (x)                                y = Reshape (x, c)
//!   d = Gather (s, i)                          }
//!   c = Concat <axis = 0> (d, m)
//!   y = Reshape (x, c)
//! }
//!
//! g (float[batch,seq,64] x)                    g (float[batch,seq,64] x)
//!   => (float[batch,seq,4,16] y)                 => (float[batch,seq,4,16] y)
//!   <int64 i0 = {0}, int64 i1 = {1},             <int64[4] shape = {0, 0, 4, 16}> {
//!    int64[2] hd = {4, 16},                      y = Reshape (x, shape)
//!    int64[1] zero = {0}> {                    }
//!   s = Shape (x)
//!   b = Gather (s, i0)
//!   q = Gather (s, i1)
//!   ub = Unsqueeze (b, zero)
//!   uq = Unsqueeze (q, zero)
//!   t = Concat <axis = 0> (ub, uq, hd)
//!   y = Reshape (x, t)
//! }
//! ```

use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::infer::{const_shape_values, infer_model, InferOptions, TypeTable};
use graphopt_ir::{DType, Dim, Graph, Model, NodeId, Tensor, Type, ValueId};
use std::collections::{BTreeMap, HashMap};

pub struct FoldShapes;

impl Pass for FoldShapes {
    fn name(&self) -> &'static str {
        "fold_shapes"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let opts = InferOptions::default();
        let opset = model.onnx_opset().unwrap_or(18);
        let report = infer_model(model, &opts);
        fold_subgraphs(&mut model.graph, &HashMap::new(), opset, &opts, &mut stats);
        fold(&mut model.graph, &report.shape_values, &mut stats);
        // Inference wrote its types into the model. When nothing was
        // folded they are the types the type-reading passes would infer
        // again, so the context takes them as they are.
        if !stats.changed {
            cx.set_types(TypeTable::of(&model.graph));
        }
        Ok(stats)
    }
}

/// Folds every subgraph of `g` (innermost first), each from an inference
/// of its own in which captured values have the types `outer` (by name,
/// the enclosing graphs' values) or `g` gives them.
fn fold_subgraphs(
    g: &mut Graph,
    outer: &HashMap<String, Type>,
    opset: i64,
    opts: &InferOptions,
    stats: &mut PassStats,
) {
    let holders: Vec<NodeId> = g.nodes().filter(|&n| g.node(n).has_subgraphs()).collect();
    if holders.is_empty() {
        return;
    }
    let mut known = outer.clone();
    for v in g.values() {
        if !g.is_live_value(v) || g.is_outer(v) {
            continue;
        }
        match g.ty(v) {
            Some(t) => known.insert(g.name(v).to_string(), t.clone()),
            // A local value without a type shadows an outer one.
            None => known.remove(g.name(v)),
        };
    }
    for n in holders {
        let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
        for a in &mut attrs {
            for sub in a.graphs_mut() {
                fold_subgraphs(sub, &known, opset, opts, stats);
                let mut typed = sub.clone();
                for v in typed.values().collect::<Vec<_>>() {
                    if typed.is_outer(v) {
                        if let Some(t) = known.get(typed.name(v)) {
                            typed.value_mut(v).ty = Some(t.clone());
                        }
                    }
                }
                let vals = const_shape_values(&typed, opset, opts);
                fold(sub, &vals, stats);
            }
        }
        g.node_mut(n).attributes = attrs;
        g.refresh_captures(n);
    }
}

/// `v` as a tensor, if its shape value is fully known and its type says how
/// to store it.
fn known_tensor(g: &Graph, v: ValueId, elems: &[Dim]) -> Option<Tensor> {
    let vals: Vec<i64> = elems.iter().map(Dim::known).collect::<Option<_>>()?;
    let t = g.ty(v)?.as_tensor()?;
    let dims: Vec<i64> = match t.shape.as_ref()?.dims.as_slice() {
        [] if vals.len() == 1 => vec![],
        [d] if d.known().is_none_or(|k| k == vals.len() as i64) => vec![vals.len() as i64],
        _ => return None,
    };
    let raw: Vec<u8> = match t.elem {
        DType::I64 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::I32 => vals
            .iter()
            .map(|&x| i32::try_from(x).ok().map(|y| y.to_le_bytes()))
            .collect::<Option<Vec<_>>>()?
            .concat(),
        DType::Bool => vals
            .iter()
            .map(|&x| matches!(x, 0 | 1).then_some(x as u8))
            .collect::<Option<Vec<_>>>()?,
        _ => return None,
    };
    Tensor::from_raw(t.elem, dims, raw.into()).ok()
}

/// A Reshape target as constants, `0` (copy the input's dim) and at most
/// one `-1`, if `elems` (the target's shape value) allows it (rule 5).
fn relative_target(in_dims: &[Dim], elems: &[Dim]) -> Option<Vec<i64>> {
    let mut out = Vec::with_capacity(elems.len());
    let mut inferred = false;
    for (i, e) in elems.iter().enumerate() {
        let v = match e {
            Dim::Known(k) => *k,
            Dim::Sym(s) if matches!(in_dims.get(i), Some(Dim::Sym(t)) if t == s) => 0,
            _ => -1,
        };
        if v == -1 {
            if inferred {
                return None;
            }
            inferred = true;
        }
        out.push(v);
    }
    Some(out)
}

fn fold(g: &mut Graph, vals: &BTreeMap<ValueId, Vec<Dim>>, stats: &mut PassStats) {
    let mut freed: Vec<ValueId> = Vec::new();
    for n in g.order().to_vec() {
        let node = g.node(n);
        let std_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        if !std_domain || node.op_type == "Constant" || node.has_subgraphs() {
            continue;
        }
        let [Some(o)] = node.outputs() else { continue };
        let o = *o;
        if g.is_output(o) || g.uses(o).is_empty() {
            continue;
        }
        let Some(t) = vals.get(&o).and_then(|e| known_tensor(g, o, e)) else {
            continue;
        };
        let ty = Type::known(t.dtype, &t.dims);
        freed.extend(node.inputs().iter().flatten().copied());
        g.remove_node(n);
        g.set_initializer(o, t);
        g.value_mut(o).ty = Some(ty);
        stats.add("nodes_folded", 1);
    }
    // Reshape targets with symbolic elements (rule 5).
    for n in g.order().to_vec() {
        let node = g.node(n);
        let std_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        if !std_domain || node.op_type != "Reshape" || node.attr_int("allowzero").unwrap_or(0) != 0 {
            continue;
        }
        let (Some(&Some(x)), Some(&Some(s))) = (node.inputs().first(), node.inputs().get(1)) else {
            continue;
        };
        if g.constant(s).is_some() {
            continue;
        }
        let Some(elems) = vals.get(&s) else { continue };
        let in_dims: Vec<Dim> = g
            .ty(x)
            .and_then(|t| t.as_tensor())
            .and_then(|t| t.shape.as_ref())
            .map(|s| s.dims.clone())
            .unwrap_or_default();
        let Some(target) = relative_target(&in_dims, elems) else {
            continue;
        };
        let Ok(t) = Tensor::from_i64(vec![target.len() as i64], &target) else {
            continue;
        };
        let c = g.add_initializer("shape", t);
        g.set_input(n, 1, Some(c));
        freed.push(s);
        stats.add("reshape_targets_folded", 1);
    }
    // Producers (and constants) that only the folded nodes read: the
    // `Shape`, `Gather`... upstream of a folded value, and folded values
    // whose readers were folded as well.
    while let Some(v) = freed.pop() {
        if !g.is_live_value(v) || !g.uses(v).is_empty() || g.is_output(v) || g.is_input(v) {
            continue;
        }
        if let Some((p, _)) = g.producer(v) {
            let node = g.node(p);
            let dead = !node.has_subgraphs()
                && node
                    .outputs()
                    .iter()
                    .flatten()
                    .all(|&o| g.uses(o).is_empty() && !g.is_output(o));
            if dead {
                let outs: Vec<ValueId> = node.outputs().iter().flatten().copied().collect();
                freed.extend(node.inputs().iter().flatten().copied());
                g.remove_node(p);
                for o in outs {
                    g.remove_value(o);
                }
                stats.add("nodes_removed", 1);
            }
        } else if !g.is_outer(v) && g.take_initializer(v).is_some() {
            g.remove_value(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn static_reshape_chain_folds() {
        assert_pass(
            &FoldShapes,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,4] x) => (float[1,12] y) <int64[1] i = {0}, int64[1] m = {-1}> {
  s = Shape (x)
  d = Gather (s, i)
  c = Concat <axis = 0> (d, m)
  y = Reshape (x, c)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,4] x) => (float[1,12] y) <int64[2] c = {1, -1}> {
  y = Reshape (x, c)
}
"#,
        );
    }

    #[test]
    fn symbolic_dims_stay() {
        assert_unchanged(
            &FoldShapes,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,12] x) => (int64[3] c) <int64[1] i = {0}, int64[2] t = {3, 4}> {
  s = Shape (x)
  d = Gather (s, i)
  c = Concat <axis = 0> (d, t)
}
"#,
        );
    }

    #[test]
    fn symbolic_reshape_target_becomes_relative() {
        assert_pass(
            &FoldShapes,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,12] x) => (float[N,3,4] y) <int64[1] i = {0}, int64[2] t = {3, 4}> {
  s = Shape (x)
  d = Gather (s, i)
  c = Concat <axis = 0> (d, t)
  y = Reshape (x, c)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,12] x) => (float[N,3,4] y) <int64[3] shape = {0, 3, 4}> {
  y = Reshape (x, shape)
}
"#,
        );
    }

    #[test]
    fn two_unknown_reshape_elements_stay() {
        assert_unchanged(
            &FoldShapes,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,M,12] x) => (float[M,N,3,4] y) <int64[1] i = {0}, int64[1] j = {1}, int64[2] t = {3, 4}> {
  s = Shape (x)
  d = Gather (s, i)
  e = Gather (s, j)
  c = Concat <axis = 0> (e, d, t)
  y = Reshape (x, c)
}
"#,
        );
    }

    #[test]
    fn partly_known_picks_the_known_part() {
        assert_pass(
            &FoldShapes,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3,3] x) => (float[N,9] y) <int64 one = {1}, int64[1] z = {0}, int64[1] m = {-1}> {
  s = Shape (x)
  a = Gather (s, one)
  b = Mul (a, a)
  u = Unsqueeze (b, z)
  c = Concat <axis = 0> (m, u)
  y = Reshape (x, c)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3,3] x) => (float[N,9] y) <int64[2] c = {-1, 9}> {
  y = Reshape (x, c)
}
"#,
        );
    }
}
