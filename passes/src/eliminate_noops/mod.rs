//! No-op elimination.
//!
//! Removes nodes that return their input unchanged, and folds pairs of nodes
//! that undo each other exactly:
//! 1. `Dropout(x)` in inference (no `training_mode`, or a constant false one),
//!    when its mask output is absent or unused ==> `x`;
//! 2. `Cast(x, to=T)` with `x` already of type `T` ==> `x`;
//! 3. `Reshape`/`Expand`/`Squeeze`/`Unsqueeze`/`Flatten` whose output shape
//!    is the input shape ==> `x` (`Expand` and `Squeeze` only on fully known
//!    shapes: a symbolic dim may be 1 at run time);
//! 4. `Transpose(x, perm=identity)`, `Pad(x, pads=0)`, `Slice` whose every
//!    axis starts at 0 and ends past the end with step 1 ==> `x`;
//! 5. `Transpose(Transpose(x, p1), p2)` ==> `Transpose(x, p1∘p2)`, dropped
//!    when the composition is the identity;
//! 6. `Reshape(Reshape(x, s1), s2)` ==> `Reshape(x, s2)` when `s2` is a
//!    constant without `0` entries (a `0` copies a dim of the *inner* result);
//! 7. `Squeeze(Unsqueeze(x, a), a)` and `Unsqueeze(Squeeze(x, a), a)` ==> `x`;
//! 8. `Cast(Cast(x: T0, T1), T0)` ==> `x` when every `T0` value is exact in
//!    `T1` (f32→f64→f32, int widening then narrowing back); f32→f16→f32 is
//!    kept because it rounds;
//! 9. `Add(x, 0)`, `Sub(x, 0)`, `Mul(x, 1)`, `Div(x, 1)`, `And(x, true)`,
//!    `Or(x, false)` (constant operand, either side for the commutative
//!    ones), `Where(true, a, b)` / `Where(false, a, b)`, `Tile`/`Expand` by
//!    ones, `Reduce{Sum,Mean,Max,Min,Prod}` with keepdims over size-1 dims
//!    and single-input `Concat` ==> the operand, when no broadcast enlarges
//!    it (`neutral.rs`, which also says why `x + 0` counts as exact);
//! 10. `Unsqueeze(Unsqueeze(x))` and `Squeeze(Squeeze(x))` ==> one node with
//!     composed axes, and rule 6 extended to a `0` in `s2` whose dim is
//!     known (`chains.rs`);
//! 11. `Reshape(f(Reshape(x, s1)), s2)` with `f` an element-wise chain whose
//!     other operands are one-element constants, and the result shaped like
//!     `x` ==> `f(x)` (`sandwich.rs`).
//!
//! Types come from shape inference run on a copy of the model (the model's
//! own declared types are not refined by this pass). A graph output keeps its
//! name: the surviving value is renamed to it, as `eliminate_identity` does;
//! where that is impossible (the value is a graph input, another output or a
//! captured outer value) the node stays. Only structure changes, so outputs
//! stay bit-identical. Works in If/Loop/Scan bodies too.
//!
//! ```text
//! before:                                    after:
//! g (float[2,3] x) => (float[2,3] y) {       g (float[2,3] x) => (float[2,3] y) {
//!   a = Transpose <perm = [1, 0]> (x)          y = Relu (x)
//!   b = Transpose <perm = [1, 0]> (a)        }
//!   c = Cast <to = 1> (b)
//!   y = Relu (c)
//! }
//! ```

use crate::pattern::{const_ints, const_tensor, is_op, TypedGraph};
use crate::util::{bypass, for_each_subgraph};
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::infer::TypeTable;
use graphopt_ir::{AttrValue, Attribute, DType, Dim, Graph, Model, NodeId, Shape, ValueId};

pub struct EliminateNoops;

impl Pass for EliminateNoops {
    fn name(&self) -> &'static str {
        "eliminate_noops"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let typed = cx.types(model);
        crate::pattern::walk_typed(&mut model.graph, typed, &mut |g, tg| {
            eliminate(g, tg, &mut stats)
        })?;
        // Function bodies have no inferred types; the type-free rules apply.
        for f in &mut model.functions {
            let empty = TypeTable::default();
            for_each_subgraph(&mut f.body, &mut |g| eliminate(g, &empty, &mut stats))?;
            eliminate(&mut f.body, &empty, &mut stats)?;
        }
        Ok(stats)
    }
}

fn eliminate(g: &mut Graph, tg: &TypeTable, stats: &mut PassStats) -> Result<(), PassError> {
    let t = TypedGraph { tg };
    for n in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(n) {
            continue;
        }
        let d = g.node(n);
        if !(d.domain.is_empty() || d.domain == "ai.onnx") || d.has_subgraphs() {
            continue;
        }
        let (Some(x), Some(y)) = (d.input(0), d.output(0)) else {
            continue;
        };
        // Extra outputs (Dropout's mask) must be unused.
        if d.outputs()
            .iter()
            .skip(1)
            .flatten()
            .any(|&o| g.is_output(o) || !g.uses(o).is_empty())
        {
            continue;
        }
        match d.op_type.as_str() {
            "Transpose" => {
                if let Some(p) = producer_if(g, x, "Transpose") {
                    let (Some(p1), Some(p2)) = (perm_of(g, &t, p), perm_of(g, &t, n)) else {
                        continue;
                    };
                    if p1.len() != p2.len() {
                        continue;
                    }
                    let inner = g.node(p).input(0).expect("producer_if checks input 0");
                    let composed: Vec<i64> = p2.iter().map(|&i| p1[i as usize]).collect();
                    g.set_input(n, 0, Some(inner));
                    set_ints(g, n, "perm", composed);
                    drop_if_dead(g, p, stats);
                    stats.add("pairs_folded", 1);
                }
                let x = g.node(n).input(0).expect("Transpose has input 0");
                if perm_of(g, &t, n).is_some_and(|p| is_identity(&p)) {
                    bypass(g, n, x, stats)?;
                }
            }
            "Reshape" => {
                if let Some(p) = producer_if(g, x, "Reshape") {
                    let allowzero = g.node(n).attr_int("allowzero").unwrap_or(0) != 0;
                    let inner = g.node(p).input(0).expect("producer_if checks input 0");
                    let s2 = g.node(n).input(1).and_then(|s| const_ints(g, s));
                    let mut ok = s2.as_ref().is_some_and(|s| allowzero || !s.contains(&0));
                    if !ok {
                        if let Some(s) = s2.and_then(|s| chains::resolve_zeros(&t, &s, inner, x)) {
                            chains::set_target(g, n, &s);
                            ok = true;
                        }
                    }
                    if ok {
                        let inner = g.node(p).input(0).expect("producer_if checks input 0");
                        g.set_input(n, 0, Some(inner));
                        drop_if_dead(g, p, stats);
                        stats.add("pairs_folded", 1);
                    }
                }
                let x = g.node(n).input(0).expect("Reshape has input 0");
                if same_shape(&t, x, y, true) {
                    bypass(g, n, x, stats)?;
                } else {
                    sandwich::fold(g, &t, n, stats)?;
                }
            }
            "Flatten" if same_shape(&t, x, y, true) => {
                bypass(g, n, x, stats)?;
            }
            "Expand" => {
                if same_shape(&t, x, y, false) {
                    bypass(g, n, x, stats)?;
                } else {
                    neutral::repeat_ones(g, &t, n, stats)?;
                }
            }
            "Squeeze" | "Unsqueeze" => {
                let squeeze = d.op_type == "Squeeze";
                chains::merge_same(g, &t, n, stats);
                let x = g.node(n).input(0).expect("Squeeze has input 0");
                let other = if squeeze { "Unsqueeze" } else { "Squeeze" };
                if let Some(p) = producer_if(g, x, other) {
                    if let (Some(mut a1), Some(mut a2)) = (axes_of(g, p), axes_of(g, n)) {
                        a1.sort_unstable();
                        a2.sort_unstable();
                        let signs_agree = a1.iter().all(|&a| a >= 0) || a1.iter().all(|&a| a < 0);
                        if !a1.is_empty() && a1 == a2 && signs_agree {
                            let inner = g.node(p).input(0).expect("producer_if checks input 0");
                            if bypass(g, n, inner, stats)? {
                                drop_if_dead(g, p, stats);
                                stats.add("pairs_folded", 1);
                            }
                            continue;
                        }
                    }
                }
                let empty_axes = axes_of(g, n).is_some_and(|a| a.is_empty());
                let squeeze_all = g.node(n).op_type == "Squeeze" && axes_of(g, n).is_none();
                if (g.node(n).op_type == "Unsqueeze" && empty_axes)
                    || same_shape(&t, x, y, !squeeze_all)
                {
                    bypass(g, n, x, stats)?;
                }
            }
            "Cast" => {
                let Some(to) = d.attr_int("to").map(|c| DType::from_onnx(c as i32)) else {
                    continue;
                };
                if let Some(p) = producer_if(g, x, "Cast") {
                    let inner = g.node(p).input(0).expect("producer_if checks input 0");
                    let mid = g.node(p).attr_int("to").map(|c| DType::from_onnx(c as i32));
                    if let (Some(t0), Some(mid)) = (t.elem(inner).or(t.elem_of(g, inner)), mid) {
                        if t0 == to && exact_round_trip(t0, mid) {
                            if bypass(g, n, inner, stats)? {
                                drop_if_dead(g, p, stats);
                                stats.add("pairs_folded", 1);
                            }
                            continue;
                        }
                    }
                }
                if t.elem(x).or(t.elem_of(g, x)) == Some(to) {
                    bypass(g, n, x, stats)?;
                }
            }
            "Dropout" => {
                let training = match d.input(2) {
                    None => Some(false),
                    Some(m) => const_tensor(g, m)
                        .and_then(|t| t.to_i64_vec())
                        .map(|v| v.iter().any(|&b| b != 0)),
                };
                // Dropout-1..6 had `is_test`; only is_test=1 is inference.
                let legacy_train = d.attr("is_test").is_some() && d.attr_int("is_test") != Some(1);
                if training == Some(false) && !legacy_train {
                    bypass(g, n, x, stats)?;
                }
            }
            "Pad" => {
                let pads = match d.input(1) {
                    Some(p) => const_ints(g, p),
                    None => d.attr_ints("pads").map(<[i64]>::to_vec),
                };
                if pads.is_some_and(|p| p.iter().all(|&v| v == 0)) {
                    bypass(g, n, x, stats)?;
                }
            }
            "Slice" if slice_is_whole(g, &t, n, x) => {
                bypass(g, n, x, stats)?;
            }
            "Add" | "Sub" | "Mul" | "Div" | "And" | "Or" => {
                neutral::neutral_operand(g, &t, n, stats, false)?;
            }
            "Where" => neutral::where_const(g, &t, n, stats)?,
            "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" => {
                neutral::reduce_over_ones(g, &t, n, stats)?;
            }
            "Tile" => neutral::repeat_ones(g, &t, n, stats)?,
            "Concat" => neutral::single_concat(g, n, stats)?,
            _ => {}
        }
    }
    Ok(())
}

/// The node producing `v`, if it is a default-domain `op` with input 0.
fn producer_if(g: &Graph, v: ValueId, op: &str) -> Option<NodeId> {
    let (p, _) = g.producer(v)?;
    let d = g.node(p);
    (is_op(d, op) && d.input(0).is_some() && !d.has_subgraphs()).then_some(p)
}

/// Removes `n` when none of its outputs is read any more, with the
/// constants only it read.
fn drop_if_dead(g: &mut Graph, n: NodeId, stats: &mut PassStats) {
    let outs: Vec<ValueId> = g.node(n).outputs().iter().flatten().copied().collect();
    if outs
        .iter()
        .any(|&o| g.is_output(o) || !g.uses(o).is_empty())
    {
        return;
    }
    let read: Vec<ValueId> = g.node(n).inputs().iter().flatten().copied().collect();
    g.remove_node(n);
    for o in outs {
        g.remove_value(o);
    }
    crate::pattern::sweep_constants(g, &read);
    stats.add("nodes_removed", 1);
}

fn is_identity(p: &[i64]) -> bool {
    p.iter().enumerate().all(|(i, &v)| v == i as i64)
}

/// A Transpose's permutation (the default reverses the dims: needs the rank).
fn perm_of(g: &Graph, t: &TypedGraph, n: NodeId) -> Option<Vec<i64>> {
    let d = g.node(n);
    let p = match d.attr_ints("perm") {
        Some(p) => p.to_vec(),
        None => {
            let r = t.shape(d.input(0)?)?.rank() as i64;
            (0..r).rev().collect()
        }
    };
    let mut seen = vec![false; p.len()];
    for &i in &p {
        let slot = seen.get_mut(usize::try_from(i).ok()?)?;
        if std::mem::replace(slot, true) {
            return None;
        }
    }
    Some(p)
}

fn set_ints(g: &mut Graph, n: NodeId, name: &str, v: Vec<i64>) {
    let attrs = &mut g.node_mut(n).attributes;
    attrs.retain(|a| a.name != name);
    attrs.push(Attribute::new(name, AttrValue::Ints(v)));
}

/// Squeeze/Unsqueeze axes, from the attribute (opset < 13) or a constant input.
fn axes_of(g: &Graph, n: NodeId) -> Option<Vec<i64>> {
    let d = g.node(n);
    match d.input(1) {
        Some(a) => const_ints(g, a),
        None => d.attr_ints("axes").map(<[i64]>::to_vec),
    }
}

/// True when `x` and `y` have the same inferred shape. With `symbolic`, a
/// named dim equals itself; otherwise every dim must be known.
fn same_shape(t: &TypedGraph, x: ValueId, y: ValueId, symbolic: bool) -> bool {
    let (Some(a), Some(b)) = (t.shape(x), t.shape(y)) else {
        return false;
    };
    a.rank() == b.rank()
        && a.dims.iter().zip(&b.dims).all(|(p, q)| match (p, q) {
            (Dim::Known(p), Dim::Known(q)) => p == q,
            (Dim::Sym(p), Dim::Sym(q)) => symbolic && p == q,
            _ => false,
        })
}

/// True when the Slice node `n` on `x` selects every element.
fn slice_is_whole(g: &Graph, t: &TypedGraph, n: NodeId, x: ValueId) -> bool {
    let d = g.node(n);
    let get = |slot: usize, attr: &str| -> Option<Option<Vec<i64>>> {
        if d.attr(attr).is_some() {
            return Some(d.attr_ints(attr).map(<[i64]>::to_vec));
        }
        match d.input(slot) {
            Some(v) => const_ints(g, v).map(Some),
            None => Some(None),
        }
    };
    let (Some(Some(starts)), Some(Some(ends))) = (get(1, "starts"), get(2, "ends")) else {
        return false;
    };
    let (Some(axes), Some(steps)) = (get(3, "axes"), get(4, "steps")) else {
        return false;
    };
    if starts.len() != ends.len() {
        return false;
    }
    let shape: Option<&Shape> = t.shape(x);
    let dim = |axis: i64| -> Option<i64> {
        let s = shape?;
        let r = s.rank() as i64;
        let a = if axis < 0 { axis + r } else { axis };
        s.dims.get(usize::try_from(a).ok()?)?.known()
    };
    (0..starts.len()).all(|i| {
        let axis = axes.as_ref().map_or(Some(i as i64), |a| a.get(i).copied());
        let step = steps.as_ref().map_or(Some(1), |s| s.get(i).copied());
        let (Some(axis), Some(1)) = (axis, step) else {
            return false;
        };
        let len = dim(axis);
        let start_ok = starts[i] == 0 || len.is_some_and(|l| starts[i] <= -l);
        // Exporters write INT64_MAX (or INT32_MAX) for "to the end".
        let end_ok = ends[i] >= i32::MAX as i64 || len.is_some_and(|l| ends[i] >= l);
        start_ok && end_ok
    })
}

/// True when every value of `a` converts to `b` and back unchanged.
fn exact_round_trip(a: DType, b: DType) -> bool {
    use DType::*;
    if a == b {
        return true;
    }
    match a {
        Bool => b.is_int() || matches!(b, F16 | BF16 | F32 | F64),
        F16 | BF16 => matches!(b, F32 | F64),
        F32 => b == F64,
        I8 => matches!(b, I16 | I32 | I64 | F16 | F32 | F64),
        U8 => matches!(b, I16 | U16 | I32 | U32 | I64 | U64 | F16 | F32 | F64),
        I16 => matches!(b, I32 | I64 | F32 | F64),
        U16 => matches!(b, I32 | U32 | I64 | U64 | F32 | F64),
        I32 => matches!(b, I64 | F64),
        U32 => matches!(b, I64 | U64 | F64),
        _ => false,
    }
}

mod chains;
pub(crate) mod neutral;
mod sandwich;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn doc_example() {
        assert_pass(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) {
  a = Transpose <perm = [1, 0]> (x)
  b = Transpose <perm = [1, 0]> (a)
  c = Cast <to = 1> (b)
  y = Relu (c)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) {
  y = Relu (x)
}
"#,
        );
    }

    #[test]
    fn lossy_cast_pair_is_kept() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  h = Cast <to = 10> (x)
  y = Cast <to = 1> (h)
}
"#,
        );
    }

    #[test]
    fn dropout_with_used_mask_or_training_is_kept() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, bool t) => (float[2] y, bool[2] m, float[2] z) {
  y, m = Dropout (x)
  z = Dropout (x, , t)
}
"#,
        );
    }

    #[test]
    fn output_passthrough_of_input_is_kept() {
        // y is an output and x an input: no name can be kept, so it stays.
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) {
  y = Transpose <perm = [0, 1]> (x)
}
"#,
        );
    }

    #[test]
    fn squeeze_all_on_symbolic_dims_is_kept() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3] x) => (float[N,3] y) {
  s = Squeeze (x)
  y = Relu (s)
}
"#,
        );
    }

    #[test]
    fn reshape_pair_with_known_zero_dim_folds() {
        assert_pass(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[6,2,2] y) <int64[2] s1 = {6, 4}, int64[3] s2 = {0, 2, 2}> {
  a = Reshape (x, s1)
  b = Reshape (a, s2)
  y = Relu (b)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[6,2,2] y) <int64[3] shape = {6, 2, 2}> {
  b = Reshape (x, shape)
  y = Relu (b)
}
"#,
        );
    }

    #[test]
    fn reshape_pair_with_unknown_zero_dim_is_kept() {
        // a's dim 0 is 3N, unknown: s2's 0 cannot be written out.
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3,4] x) => (float[M,2,2] y) <int64[2] s1 = {-1, 4}, int64[3] s2 = {0, 2, 2}> {
  a = Reshape (x, s1)
  b = Reshape (a, s2)
  y = Relu (b)
}
"#,
        );
    }

    #[test]
    fn neutral_operands_fold() {
        assert_pass(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3] x, bool[N,3] m) => (float[N,3] y, bool[N,3] z)
  <float[3] zero = {0, 0, 0}, float[3] negzero = {-0.0, -0.0, -0.0}, float one = {1}, bool t = {1}, bool f = {0}> {
  a = Add (x, negzero)
  b = Mul (one, a)
  c = Sub (b, zero)
  d = Div (c, one)
  y = Relu (d)
  p = And (t, m)
  q = Or (p, f)
  z = Not (q)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3] x, bool[N,3] m) => (float[N,3] y, bool[N,3] z) {
  y = Relu (x)
  z = Not (m)
}
"#,
        );
    }

    #[test]
    fn neutral_operand_must_not_fire() {
        // 1. the constant broadcasts x to [2,3]; 2. the operand is not a
        // constant; 3. `0 - x` is not x; 4. the constant is not all-neutral;
        // 5. y is an output and x an input: no name to keep; 6. `x + (+0)`
        // and `x - (-0)` turn -0 into +0, so they are not bit-exact no-ops.
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[3] x, float[3] w) => (float[2,3] o1, float[3] o2, float[3] o3, float[3] o4, float[3] y, float[3] o5, float[3] o6)
  <float[2,3] zeros = {-0.0, -0.0, -0.0, -0.0, -0.0, -0.0}, float zero = {0}, float[3] mixed = {1, 1, 2}, float negzero = {-0.0}> {
  a = Add (x, zeros)
  o1 = Relu (a)
  b = Mul (x, w)
  o2 = Relu (b)
  c = Sub (zero, x)
  o3 = Relu (c)
  d = Mul (x, mixed)
  o4 = Relu (d)
  y = Add (x, negzero)
  e = Add (x, zero)
  o5 = Relu (e)
  f = Sub (x, negzero)
  o6 = Relu (f)
}
"#,
        );
    }

    #[test]
    fn neutral_operand_on_graph_output_keeps_name() {
        assert_pass(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[3] x) => (float[3] y) <float one = {1}> {
  r = Relu (x)
  y = Mul (r, one)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[3] x) => (float[3] y) {
  y = Relu (x)
}
"#,
        );
    }

    #[test]
    fn unsqueeze_chain_merges_with_input_axes() {
        assert_pass(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (int64[N] x) => (int64[N,1,1,1] y) <int64[2] a1 = {1, 2}, int64[1] a2 = {-1}> {
  u = Unsqueeze (x, a1)
  v = Unsqueeze (u, a2)
  y = Neg (v)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (int64[N] x) => (int64[N,1,1,1] y) <int64[3] axes = {1, 2, 3}> {
  v = Unsqueeze (x, axes)
  y = Neg (v)
}
"#,
        );
    }

    #[test]
    fn bad_perm_does_not_panic() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) {
  a = Transpose <perm = [5, 0]> (x)
  b = Transpose <perm = [1, 0]> (a)
  y = Relu (b)
}
"#,
        );
    }
}
