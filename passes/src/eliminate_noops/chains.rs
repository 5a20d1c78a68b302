//! Chains of shape ops that one node of the same op can do:
//! `Unsqueeze(Unsqueeze(x))`, `Squeeze(Squeeze(x))`, and the inner Reshape
//! of a Reshape pair whose outer target copies dims (`0`) that are known.
//!
//! The outer node is rewired to read the inner one's input, with its axes
//! (or target) rewritten; the inner node goes once nothing else reads it.
//! Axes keep the form of the node's opset: the `axes` attribute before
//! opset 13, a constant input from 13 on (a fresh initializer, so a shared
//! constant is never edited in place).

use super::{axes_of, drop_if_dead, producer_if, set_ints};
use crate::pattern::{sweep_constants, TypedGraph};
use crate::PassStats;
use graphopt_ir::{Dim, Graph, NodeId, Tensor, ValueId};

/// Normalizes `axes` against `rank`; None when out of range or repeated.
fn normalize(axes: &[i64], rank: Option<usize>) -> Option<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = if a < 0 { a + rank? as i64 } else { a };
        let a = usize::try_from(a).ok()?;
        if rank.is_some_and(|r| a >= r) || out.contains(&a) {
            return None;
        }
        out.push(a);
    }
    out.sort_unstable();
    Some(out)
}

/// The `k`-th position (from 0) not in `taken`, counting from 0 upwards.
fn nth_free(taken: &[usize], k: usize) -> usize {
    (0..).filter(|p| !taken.contains(p)).nth(k).expect("unbounded")
}

/// `Unsqueeze(Unsqueeze(x, a1), a2)` ==> `Unsqueeze(x, a)` where `a` is `a2`
/// plus, for each `i` in `a1`, the `i`-th position of the result not in `a2`;
/// `Squeeze(Squeeze(x, a1), a2)` ==> `Squeeze(x, a)` where `a` is `a1` plus,
/// for each `j` in `a2`, the `j`-th dim of `x` not in `a1`.
pub(super) fn merge_same(g: &mut Graph, t: &TypedGraph, n: NodeId, stats: &mut PassStats) -> bool {
    let op = g.node(n).op_type.clone();
    let Some(x1) = g.node(n).input(0) else {
        return false;
    };
    let Some(p) = producer_if(g, x1, &op) else {
        return false;
    };
    let inner = g.node(p).input(0).expect("producer_if checks input 0");
    // Both nodes must use the same form (same opset, so they do).
    if g.node(p).input(1).is_some() != g.node(n).input(1).is_some() {
        return false;
    }
    let (Some(a1), Some(a2)) = (axes_of(g, p), axes_of(g, n)) else {
        return false;
    };
    if a1.is_empty() || a2.is_empty() {
        return false;
    }
    let r = t.rank(inner);
    let merged = if op == "Unsqueeze" {
        let r1 = r.map(|r| r + a1.len());
        let (Some(a1), Some(a2)) = (normalize(&a1, r1), normalize(&a2, r1.map(|r| r + a2.len())))
        else {
            return false;
        };
        let mut m = a2.clone();
        m.extend(a1.iter().map(|&i| nth_free(&a2, i)));
        m
    } else {
        let (Some(a1), Some(a2)) = (normalize(&a1, r), normalize(&a2, r.map(|r| r.saturating_sub(a1.len()))))
        else {
            return false;
        };
        let mut m = a1.clone();
        m.extend(a2.iter().map(|&j| nth_free(&a1, j)));
        m
    };
    let mut merged: Vec<i64> = merged.into_iter().map(|a| a as i64).collect();
    merged.sort_unstable();
    set_axes(g, n, merged);
    g.set_input(n, 0, Some(inner));
    drop_if_dead(g, p, stats);
    stats.add("pairs_folded", 1);
    true
}

/// Writes Squeeze/Unsqueeze axes in the node's own form.
fn set_axes(g: &mut Graph, n: NodeId, axes: Vec<i64>) {
    match g.node(n).input(1) {
        Some(old) => {
            let t = Tensor::from_i64(vec![axes.len() as i64], &axes).expect("1-D i64 tensor");
            let v = g.add_initializer("axes", t);
            g.set_input(n, 1, Some(v));
            sweep_constants(g, &[old]);
        }
        None => set_ints(g, n, "axes", axes),
    }
}

/// `Reshape(Reshape(x, s1), s2)` where `s2` has `0` entries ==>
/// `Reshape(x, s2')`, each `0` replaced by the inner result's known dim
/// there, or kept where `x` has the same dim there (then it copies the same
/// size from `x`). None when some `0` cannot be resolved.
pub(super) fn resolve_zeros(
    t: &TypedGraph,
    s2: &[i64],
    x: ValueId,
    mid: ValueId,
) -> Option<Vec<i64>> {
    let ms = t.shape(mid)?;
    let xs = t.shape(x);
    s2.iter()
        .enumerate()
        .map(|(i, &s)| {
            if s != 0 {
                return Some(s);
            }
            match ms.dims.get(i)? {
                Dim::Known(d) if *d > 0 => Some(*d),
                d @ Dim::Sym(_) if xs.and_then(|xs| xs.dims.get(i)) == Some(d) => Some(0),
                _ => None,
            }
        })
        .collect()
}

/// Replaces a Reshape's target by `s` (a fresh initializer).
pub(super) fn set_target(g: &mut Graph, n: NodeId, s: &[i64]) {
    let old = g.node(n).input(1).expect("Reshape has a target");
    let t = Tensor::from_i64(vec![s.len() as i64], s).expect("1-D i64 tensor");
    let v = g.add_initializer("shape", t);
    g.set_input(n, 1, Some(v));
    sweep_constants(g, &[old]);
}
