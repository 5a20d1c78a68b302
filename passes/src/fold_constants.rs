//! Constant folding.
//!
//! 1. `Constant` nodes become initializers (every `value*` form; a
//!    `sparse_value` stays a node, since densifying it would grow the file).
//! 2. A node whose inputs are all constants is evaluated by the constant
//!    evaluator (`consteval`), and its outputs become initializers.
//!
//! Exactness: the evaluator only computes what it can compute bit-identically
//! to onnxruntime (see its module doc: data movement, wrapping integer
//! arithmetic, IEEE-exact float ops in the tensor's own width; no `Exp`,
//! no float reductions, no NaN results). So this pass is [`Pass::exact`].
//!
//! Size cap: folding must never inflate the file. A node is folded when its
//! result is at most [`SMALL_RESULT`] bytes (1 KiB: a handful of shape
//! vectors, whose node and attribute encoding costs about as much), or when
//! its result is no larger than the constant inputs that folding frees (those
//! read by this node only). So `Transpose(W)` on a weight read once is folded
//! (the transposed copy replaces `W`), but a `ConstantOfShape` or `Expand`
//! or `Tile` that blows a few bytes up into megabytes is not, nor a
//! transpose of a weight that is also read elsewhere (it would be stored
//! twice). This is the same policy as onnxsim's size limit, applied per node.
//!
//! What is left alone:
//! - nodes whose output is a graph output (an initializer as graph output is
//!   poorly supported by runtimes, and the output's name must stay);
//! - graph inputs with a default initializer (overridable, so not constant);
//! - non-default domains, nodes with subgraphs, random ops (never in the
//!   evaluator's list).
//!
//! In subgraphs, a captured outer constant counts as a constant. Inputs
//! that break an op's contract (Reshape to the wrong element count, Gather
//! out of range) are an error in the main graph, which the runtime would
//! execute and fail on; in subgraphs they are left alone (a branch that
//! never runs may hold them).
//!
//! Run [`crate::dce`] afterwards to drop the producers made dead; the
//! constant inputs this pass frees are removed here already.
//!
//! ```text
//! before:                                      after:
//! g (float[2,3] x) => (float[3,2] y) {         g (float[2,3] x) => (float[3,2] y)
//!   s = Constant <value_ints = [3, 2]> ()        <int64[2] s = {3, 2}> {
//!   y = Reshape (x, s)                           y = Reshape (x, s)
//! }                                            }
//!
//! g (float[N] x) => (float[N] y)               g (float[N] x) => (float[N] y)
//!   <int64 a = {2}, int64 b = {3}> {             <float d = {6.0}> {
//!   c = Mul (a, b)                               y = Add (x, d)
//!   d = Cast <to = 1> (c)                      }
//!   y = Add (x, d)
//! }
//! ```

#[path = "consteval/mod.rs"]
pub(crate) mod consteval;

use crate::{Pass, PassError, PassStats};
use consteval::EvalError;
use graphopt_ir::{Graph, Model, NodeId, Tensor, Type, ValueId};
use std::collections::HashMap;

/// Results up to this many bytes are always folded.
pub const SMALL_RESULT: u64 = 1024;

pub struct FoldConstants;

impl Pass for FoldConstants {
    fn name(&self) -> &'static str {
        "fold_constants"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let opset = model.onnx_opset().unwrap_or(1);
        fold_graph(&mut model.graph, opset, &HashMap::new(), true, &mut stats)?;
        Ok(stats)
    }
}

/// Folds `g`, then its subgraphs (which see `g`'s constants as captures).
/// `outer` holds the constants of enclosing graphs, by name.
fn fold_graph(
    g: &mut Graph,
    opset: i64,
    outer: &HashMap<String, Tensor>,
    top: bool,
    stats: &mut PassStats,
) -> Result<(), PassError> {
    let mut freed: Vec<ValueId> = Vec::new();
    for n in g.order().to_vec() {
        let node = g.node(n);
        let std_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        if !std_domain || node.has_subgraphs() {
            continue;
        }
        if node.outputs().iter().flatten().any(|&o| g.is_output(o)) {
            continue;
        }
        if node.op_type == "Constant" {
            let t = consteval::constant_value(node)
                .map_err(|m| PassError(format!("node '{}' (Constant): {m}", node.name)))?;
            let (Some(t), [Some(_)]) = (t, node.outputs()) else {
                continue;
            };
            replace_by_constants(g, n, vec![t]);
            stats.add("constants_to_initializers", 1);
            continue;
        }
        if node.inputs().iter().all(Option::is_none) {
            continue;
        }
        let Some(inputs) = constant_inputs(g, n, outer) else {
            continue;
        };
        let refs: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
        let limit = SMALL_RESULT.max(freed_bytes(g, n));
        match consteval::eval(node, &refs, opset, limit) {
            Ok(outs) => {
                let ins: Vec<ValueId> = node.inputs().iter().flatten().copied().collect();
                replace_by_constants(g, n, outs);
                freed.extend(ins);
                stats.add("nodes_folded", 1);
            }
            Err(EvalError::Skip) => {}
            Err(EvalError::Invalid(m)) if top => {
                return Err(PassError(format!(
                    "node '{}' ({}): {m}",
                    g.node(n).name,
                    g.node(n).op_type
                )))
            }
            Err(EvalError::Invalid(_)) => {}
        }
    }
    // Drop the constant inputs that folding left unread.
    freed.sort();
    freed.dedup();
    for v in freed {
        if g.is_live_value(v)
            && g.uses(v).is_empty()
            && !g.is_output(v)
            && !g.is_input(v)
            && !g.is_outer(v)
            && g.producer(v).is_none()
        {
            if let Some(t) = g.take_initializer(v) {
                stats.add("bytes_freed", t.nbytes());
                g.remove_value(v);
            }
        }
    }
    fold_groups(g, opset, outer, stats);
    // Subgraphs, with this graph's constants visible through captures.
    let holders: Vec<NodeId> = g.nodes().filter(|&n| g.node(n).has_subgraphs()).collect();
    for n in holders {
        let mut seen = outer.clone();
        for &c in g.node(n).captures() {
            let name = g.name(c).to_string();
            if let Some(t) = g.constant(c) {
                seen.insert(name, t.clone());
            } else if !g.is_outer(c) {
                // A local non-constant value shadows any outer constant.
                seen.remove(&name);
            }
        }
        let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
        let mut result = Ok(());
        'outer: for a in &mut attrs {
            for sub in a.graphs_mut() {
                result = fold_graph(sub, opset, &seen, false, stats);
                if result.is_err() {
                    break 'outer;
                }
            }
        }
        g.node_mut(n).attributes = attrs;
        g.refresh_captures(n);
        result?;
    }
    Ok(())
}

/// Folds connected groups of nodes computed from constants that the
/// per-node rule refused, when the group as a whole does not inflate the
/// file: what the rest of the graph reads from the group (its frontier) is
/// at most [`SMALL_RESULT`] or the bytes of the constants only the group
/// reads. Three Slices and a Concat that reorder an LSTM weight's gates
/// are each refused (each slice copies part of a weight the others still
/// read), while together they replace the weight by its reordered copy.
/// No intermediate result may be larger than that bound either, so a
/// group that would compute something large is given up early.
fn fold_groups(g: &mut Graph, opset: i64, outer: &HashMap<String, Tensor>, stats: &mut PassStats) {
    // Candidates, in program order: default-domain nodes without subgraphs
    // or graph outputs whose every input is a constant or a candidate's output.
    let mut cand: Vec<NodeId> = Vec::new();
    let mut made: HashMap<ValueId, usize> = HashMap::new();
    let mut group: Vec<usize> = Vec::new(); // union-find over candidates
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    for &n in g.order() {
        let d = g.node(n);
        if !(d.domain.is_empty() || d.domain == "ai.onnx")
            || d.has_subgraphs()
            || d.op_type == "Constant"
            || d.inputs().iter().all(Option::is_none)
            || d.outputs().iter().flatten().any(|&o| g.is_output(o))
        {
            continue;
        }
        let mut links = Vec::new();
        let all_const = d.inputs().iter().flatten().all(|&v| {
            if let Some(&i) = made.get(&v) {
                links.push(i);
                true
            } else {
                g.constant(v).is_some() || (g.is_outer(v) && outer.contains_key(g.name(v)))
            }
        });
        if !all_const {
            continue;
        }
        let i = cand.len();
        cand.push(n);
        group.push(i);
        for l in links {
            let (a, b) = (find(&mut group, l), find(&mut group, i));
            group[a] = b;
        }
        for &o in d.outputs().iter().flatten() {
            made.insert(o, i);
        }
    }
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in 0..cand.len() {
        let r = find(&mut group, i);
        groups.entry(r).or_default().push(i);
    }
    let mut roots: Vec<usize> = groups.keys().copied().collect();
    roots.sort_unstable();
    for r in roots {
        let members: Vec<NodeId> = groups[&r].iter().map(|&i| cand[i]).collect();
        if members.len() < 2 {
            continue;
        }
        fold_group(g, &members, opset, outer, stats);
    }
}

/// Evaluates one group (in program order) and replaces it by its frontier
/// values when that does not inflate the file; otherwise changes nothing.
fn fold_group(
    g: &mut Graph,
    members: &[NodeId],
    opset: i64,
    outer: &HashMap<String, Tensor>,
    stats: &mut PassStats,
) {
    let inside = |u: &graphopt_ir::Use| match u {
        graphopt_ir::Use::Input { node, .. } => members.contains(node),
        _ => false,
    };
    // Constants only the group reads: what folding it frees.
    let mut reads: Vec<ValueId> = members
        .iter()
        .flat_map(|&n| g.node(n).inputs().iter().flatten().copied())
        .filter(|&v| g.constant(v).is_some())
        .collect();
    reads.sort();
    reads.dedup();
    let freed: Vec<ValueId> = reads
        .into_iter()
        .filter(|&v| !g.is_output(v) && g.uses(v).iter().all(inside))
        .collect();
    let limit = SMALL_RESULT.max(freed.iter().filter_map(|&v| g.constant(v)).map(|t| t.nbytes()).sum());
    let mut vals: HashMap<ValueId, Tensor> = HashMap::new();
    for &n in members {
        let node = g.node(n);
        let mut ins: Vec<Option<Tensor>> = Vec::new();
        for i in node.inputs() {
            ins.push(match i {
                None => None,
                Some(v) => Some(match vals.get(v).or_else(|| g.constant(*v)) {
                    Some(t) => t.clone(),
                    None => match outer.get(g.name(*v)) {
                        Some(t) => t.clone(),
                        None => return,
                    },
                }),
            });
        }
        let refs: Vec<Option<&Tensor>> = ins.iter().map(Option::as_ref).collect();
        let Ok(outs) = consteval::eval(node, &refs, opset, limit) else {
            return;
        };
        for (o, t) in node.outputs().iter().zip(outs) {
            if let Some(o) = o {
                vals.insert(*o, t);
            }
        }
    }
    let frontier: Vec<ValueId> = {
        let mut f: Vec<ValueId> = vals
            .keys()
            .copied()
            .filter(|&v| g.uses(v).iter().any(|u| !inside(u)))
            .collect();
        f.sort();
        f
    };
    let kept: u64 = frontier.iter().map(|v| vals[v].nbytes()).sum();
    if kept > limit {
        return;
    }
    let produced: Vec<ValueId> = members
        .iter()
        .flat_map(|&n| g.node(n).outputs().iter().flatten().copied())
        .collect();
    for &n in members {
        g.remove_node(n);
    }
    for v in produced {
        if frontier.contains(&v) {
            let t = vals.remove(&v).expect("evaluated");
            let ty = Type::known(t.dtype, &t.dims);
            g.set_initializer(v, t);
            let d = g.value_mut(v);
            let denotation = d.ty.as_ref().and_then(|t| t.denotation.clone());
            d.ty = Some(Type { denotation, ..ty });
        } else if g.uses(v).is_empty() {
            g.remove_value(v);
        }
    }
    for v in freed {
        if g.is_live_value(v) && g.uses(v).is_empty() && !g.is_input(v) && !g.is_outer(v) {
            if let Some(t) = g.take_initializer(v) {
                stats.add("bytes_freed", t.nbytes());
                g.remove_value(v);
            }
        }
    }
    stats.add("nodes_folded", members.len() as u64);
    stats.add("groups_folded", 1);
}

/// The node's inputs as tensors, if every present one is constant.
fn constant_inputs(
    g: &Graph,
    n: NodeId,
    outer: &HashMap<String, Tensor>,
) -> Option<Vec<Option<Tensor>>> {
    g.node(n)
        .inputs()
        .iter()
        .map(|i| match i {
            None => Some(None),
            Some(v) => {
                if let Some(t) = g.constant(*v) {
                    Some(Some(t.clone()))
                } else if g.is_outer(*v) {
                    outer.get(g.name(*v)).cloned().map(Some)
                } else {
                    None
                }
            }
        })
        .collect()
}

/// Bytes of the constant inputs that only node `n` reads (and that are not
/// graph outputs): what folding `n` frees.
fn freed_bytes(g: &Graph, n: NodeId) -> u64 {
    let mut ins: Vec<ValueId> = g.node(n).inputs().iter().flatten().copied().collect();
    ins.sort();
    ins.dedup();
    ins.into_iter()
        .filter(|&v| !g.is_output(v) && g.uses(v).iter().all(|u| u.node() == n))
        .filter_map(|v| g.constant(v))
        .map(|t| t.nbytes())
        .sum()
}

/// `n`'s outputs become initializers holding `outs`; `n` goes.
pub(crate) fn replace_by_constants(g: &mut Graph, n: NodeId, outs: Vec<Tensor>) {
    let vals: Vec<Option<ValueId>> = g.node(n).outputs().to_vec();
    g.remove_node(n);
    for (v, t) in vals.into_iter().zip(outs) {
        let Some(v) = v else { continue };
        let ty = Type::known(t.dtype, &t.dims);
        g.set_initializer(v, t);
        let d = g.value_mut(v);
        let denotation = d.ty.as_ref().and_then(|t| t.denotation.clone());
        d.ty = Some(Type { denotation, ..ty });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn constant_node_becomes_initializer() {
        assert_pass(
            &FoldConstants,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[3,2] y) {
  s = Constant <value_ints = [3, 2]> ()
  y = Reshape (x, s)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[3,2] y) <int64[2] s = {3, 2}> {
  y = Reshape (x, s)
}
"#,
        );
    }

    #[test]
    fn folds_chains_and_frees_inputs() {
        assert_pass(
            &FoldConstants,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N] x) => (float[N] y) <int64 a = {2}, int64 b = {3}> {
  c = Mul (a, b)
  d = Cast <to = 1> (c)
  y = Add (x, d)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N] x) => (float[N] y) <float d = {6.0}> {
  y = Add (x, d)
}
"#,
        );
    }

    #[test]
    fn overridable_inputs_and_graph_outputs_are_kept() {
        assert_unchanged(
            &FoldConstants,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (int64[2] a, float[2] x) => (int64[2] y, float[2] z) <int64[2] a = {1, 2}, int64[2] b = {3, 4}> {
  c = Add (a, b)
  y = Neg (b)
  z = Mul (x, x)
}
"#,
        );
    }

    #[test]
    fn big_results_are_not_materialized() {
        // 64 KiB of zeros from an 8-byte shape: folding would inflate the file.
        assert_unchanged(
            &FoldConstants,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[128,128] x) => (float[128,128] y) <int64[2] s = {128, 128}> {
  z = ConstantOfShape (s)
  y = Add (x, z)
}
"#,
        );
    }

    #[test]
    fn invalid_constant_math_is_an_error() {
        let mut m = graphopt_text::parse_model(
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) <int64[3] a = {1, 2, 3}, int64[1] s = {2}> {
  r = Reshape (a, s)
  c = Cast <to = 1> (r)
  y = Add (x, c)
}
"#,
        )
        .unwrap();
        let e = FoldConstants.run(&mut m).unwrap_err();
        assert!(e.0.contains("Reshape") && e.0.contains("3 elements"), "{e}");
    }

    #[test]
    fn constant_without_value_is_an_error() {
        let mut m = graphopt_text::parse_model(
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  c = Constant ()
  y = Add (x, c)
}
"#,
        )
        .unwrap();
        let e = FoldConstants.run(&mut m).unwrap_err();
        assert!(e.0.contains("no value attribute"), "{e}");
    }

    #[test]
    fn outer_constants_fold_inside_subgraphs() {
        assert_pass(
            &FoldConstants,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (bool cond, float[2] x) => (float[2] y) <int64 k = {4}> {
  y = If (cond) <then_branch = t () => (float[2] a) {
    kk = Mul (k, k)
    kf = Cast <to = 1> (kk)
    a = Add (x, kf)
  }, else_branch = e () => (float[2] b) {
    b = Neg (x)
  }>
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (bool cond, float[2] x) => (float[2] y) <int64 k = {4}> {
  y = If (cond) <then_branch = t () => (float[2] a) <float kf = {16.0}> {
    a = Add (x, kf)
  }, else_branch = e () => (float[2] b) {
    b = Neg (x)
  }>
}
"#,
        );
    }
}
