//! Nodes made no-ops by a constant operand: the neutral element of an
//! element-wise op, a `Where` whose condition is constant, reductions and
//! repetitions over size-1 dims, and single-input `Concat`.
//!
//! Every rule here needs two things before it fires:
//! 1. the constant is *neutral*: every element is the identity for the op;
//! 2. nothing is broadcast: the constant's shape fits inside `x`'s
//!    (right-aligned, each dim 1 or equal to `x`'s known dim) *and* the
//!    inferred output shape is `x`'s, so the result is `x` element for
//!    element, not `x` copied into a larger tensor.
//!
//! Signed zeros: the pass declares `exact()`, which promises bit-identical
//! outputs, and `-0 + (+0)` is `+0` (IEEE 754 round-to-nearest), so
//! `x + (+0)` is NOT `x` for `x = -0`; likewise `x - (-0)`. Only the
//! constants that are the identity bit for bit are neutral here: `x + (-0)`,
//! `x - (+0)`, `x * 1`, `x / 1` return `x` exactly for every `x` (NaN
//! payloads aside: any NaN stays a NaN). We keep `exact()` and drop the two
//! sign-changing rewrites rather than the other way round: they are rare in
//! exported models (a zero bias is the only source), while dropping
//! `exact()` would let every rewrite of `eliminate_noops` round
//! differently unnoticed. Integer zeros have no sign and always qualify.

use super::same_shape;
use crate::pattern::{const_ints, const_tensor, sweep_constants, TypedGraph};
use crate::util::bypass;
use crate::{PassError, PassStats};
use graphopt_ir::{Dim, Graph, NodeId, Shape, Tensor, ValueId};

/// True when a constant of shape `c` broadcast against `x` gives `x`'s shape.
fn fits_inside(c: &[i64], x: &Shape) -> bool {
    c.len() <= x.rank()
        && c.iter()
            .rev()
            .zip(x.dims.iter().rev())
            .all(|(&c, d)| c == 1 || *d == Dim::Known(c))
}

/// Every element of the constant `c` satisfies `pred` (there is at least one).
fn all_elems(c: &Tensor, pred: impl Fn(f64) -> bool) -> bool {
    c.to_f64_vec()
        .is_some_and(|v| !v.is_empty() && v.into_iter().all(pred))
}

/// `op(x, c)` (or `op(c, x)` when `commutes`) with `c` a neutral constant
/// that broadcasts nothing ==> `x`.
///
/// `Add(x, -0)`, `Sub(x, +0)`, `Mul(x, 1)`, `Div(x, 1)`, `And(x, true)`,
/// `Or(x, false)` ==> `x` (integer zeros for `Add` and `Sub` too); not
/// `Add(x, +0)` nor `Sub(x, -0)`, which turn `-0` into `+0`, unless
/// `any_zero` (the non-exact `eliminate_zero_add` pass) says a zero of
/// either sign counts.
pub(crate) fn neutral_operand(
    g: &mut Graph,
    t: &TypedGraph,
    n: NodeId,
    stats: &mut PassStats,
    any_zero: bool,
) -> Result<(), PassError> {
    let d = g.node(n);
    // The neutral element, bit for bit when the constant is a float.
    let (neutral, commutes): (f64, bool) = match d.op_type.as_str() {
        "Add" => (-0.0, true),
        "Sub" => (0.0, false),
        "Mul" => (1.0, true),
        "Div" => (1.0, false),
        "And" => (1.0, true),
        "Or" => (0.0, true),
        _ => return Ok(()),
    };
    let (Some(a), Some(b), Some(y)) = (d.input(0), d.input(1), d.output(0)) else {
        return Ok(());
    };
    let slots: &[(ValueId, ValueId)] = if commutes {
        &[(a, b), (b, a)]
    } else {
        &[(a, b)]
    };
    for &(x, c) in slots {
        let Some(ct) = const_tensor(g, c) else {
            continue;
        };
        let Some(xs) = t.shape(x) else {
            continue;
        };
        let float = ct.dtype.is_float();
        let is_neutral =
            |v: f64| v == neutral && (!float || any_zero || v.is_sign_negative() == neutral.is_sign_negative());
        if all_elems(&ct, is_neutral)
            && fits_inside(&ct.dims, xs)
            && same_shape(t, x, y, true)
            && bypass(g, n, x, stats)?
        {
            sweep_constants(g, &[c]);
            return Ok(());
        }
    }
    Ok(())
}

/// `Where(true, a, b)` ==> `a` and `Where(false, a, b)` ==> `b`, when the
/// output has the kept operand's shape.
pub(super) fn where_const(
    g: &mut Graph,
    t: &TypedGraph,
    n: NodeId,
    stats: &mut PassStats,
) -> Result<(), PassError> {
    let d = g.node(n);
    let (Some(cond), Some(a), Some(b), Some(y)) = (d.input(0), d.input(1), d.input(2), d.output(0))
    else {
        return Ok(());
    };
    let Some(ct) = const_tensor(g, cond) else {
        return Ok(());
    };
    let keep = if all_elems(&ct, |v| v != 0.0) {
        a
    } else if all_elems(&ct, |v| v == 0.0) {
        b
    } else {
        return Ok(());
    };
    let fits = t.shape(keep).is_some_and(|s| fits_inside(&ct.dims, s));
    if fits && same_shape(t, keep, y, true) && bypass(g, n, keep, stats)? {
        sweep_constants(g, &[cond]);
    }
    Ok(())
}

/// `Reduce*(x, axes, keepdims=1)` over axes whose dims are all 1 ==> `x`
/// (`ReduceSum/Mean/Max/Min/Prod`: each returns its one element), and any
/// `Reduce*` with empty axes and `noop_with_empty_axes=1` ==> `x`.
pub(super) fn reduce_over_ones(
    g: &mut Graph,
    t: &TypedGraph,
    n: NodeId,
    stats: &mut PassStats,
) -> Result<(), PassError> {
    let d = g.node(n);
    let Some(x) = d.input(0) else {
        return Ok(());
    };
    if d.attr_int("keepdims").unwrap_or(1) == 0 {
        return Ok(());
    }
    let axes_input = d.input(1);
    let axes = match axes_input {
        Some(a) => match const_ints(g, a) {
            Some(v) => Some(v),
            None => return Ok(()),
        },
        None => d.attr_ints("axes").map(<[i64]>::to_vec),
    };
    let noop_empty = d.attr_int("noop_with_empty_axes").unwrap_or(0) != 0;
    let Some(shape) = t.shape(x) else {
        return Ok(());
    };
    let r = shape.rank() as i64;
    let ok = match axes {
        Some(a) if a.is_empty() && noop_empty => true,
        Some(a) if !a.is_empty() => a.iter().all(|&ax| {
            let ax = if ax < 0 { ax + r } else { ax };
            (0..r).contains(&ax) && shape.dims[ax as usize] == Dim::Known(1)
        }),
        None if noop_empty => true,
        // No axes: every dim is reduced.
        _ => shape.dims.iter().all(|d| *d == Dim::Known(1)),
    };
    if ok && bypass(g, n, x, stats)? {
        if let Some(a) = axes_input {
            sweep_constants(g, &[a]);
        }
    }
    Ok(())
}

/// `Tile(x, [1, ..., 1])` ==> `x`; `Expand(x, [1, ..., 1])` with no more
/// entries than `x` has dims ==> `x` (symbolic dims allowed: broadcasting
/// against 1 keeps them).
pub(super) fn repeat_ones(
    g: &mut Graph,
    t: &TypedGraph,
    n: NodeId,
    stats: &mut PassStats,
) -> Result<(), PassError> {
    let d = g.node(n);
    let (Some(x), Some(s)) = (d.input(0), d.input(1)) else {
        return Ok(());
    };
    let Some(v) = const_ints(g, s) else {
        return Ok(());
    };
    let rank_ok = match d.op_type.as_str() {
        "Tile" => t.rank(x).is_none_or(|r| r == v.len()),
        _ => t.rank(x).is_some_and(|r| v.len() <= r),
    };
    if rank_ok && v.iter().all(|&r| r == 1) && bypass(g, n, x, stats)? {
        sweep_constants(g, &[s]);
    }
    Ok(())
}

/// `Concat(x)` (one input) ==> `x`.
pub(super) fn single_concat(
    g: &mut Graph,
    n: NodeId,
    stats: &mut PassStats,
) -> Result<(), PassError> {
    let d = g.node(n);
    if let ([Some(x)], Some(_)) = (d.inputs(), d.output(0)) {
        let x = *x;
        bypass(g, n, x, stats)?;
    }
    Ok(())
}
