//! Slice of a Slice becomes one Slice.
//!
//! `Slice(Slice(x, s1, e1, a1, p1), s2, e2, a2, p2)` with every `starts`,
//! `ends`, `axes` and `steps` a constant (opset ≥ 10, the input form), the
//! inner result read by the outer Slice only ==> one `Slice` of `x` whose
//! per-axis ranges are:
//! 1. on an axis only one of the two slices, that slice's range;
//! 2. on an axis both slice, with step 1 in both and non-negative starts and
//!    ends, `[s1 + s2, min(e1, s1 + e2))`, which is what the two steps give
//!    after clamping to the dim (the inner slice is empty exactly when the
//!    merged one is).
//!
//! Other shared axes (a negative start, or a step other than 1) are left
//! alone. Negative axes are made non-negative with the rank of `x` from
//! shape inference, or left alone without it. Exporters emit such chains
//! for `x[:, a:b][..., c:d]` (an STFT's real and imaginary halves in silero
//! VAD). The merged Slice copies the same elements in the same order, so
//! outputs stay bit-identical. New constants are initializers named after
//! the outer Slice's output. Works in subgraphs.
//!
//! ```text
//! before:                                       after:
//! g (float[4,6] x) => (float[2,3] y)            g (float[4,6] x) => (float[2,3] y)
//!   <int64[1] s1 = {1}, int64[1] e1 = {3},        <int64[2] y_starts = {1, 2},
//!    int64[1] a1 = {0}, int64[1] s2 = {2},         int64[2] y_ends = {3, 5},
//!    int64[1] e2 = {5}, int64[1] a2 = {1}> {       int64[2] y_axes = {0, 1}> {
//!   t = Slice (x, s1, e1, a1)                     y = Slice (x, y_starts, y_ends, y_axes)
//!   y = Slice (t, s2, e2, a2)                   }
//! }
//! ```

use crate::pattern::{const_ints, is_op, only_use, replace_nodes, walk_typed, TypedGraph};
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::{Graph, Model, NewNode, NodeId, Tensor, ValueId};

pub struct MergeSlices;

impl Pass for MergeSlices {
    fn name(&self) -> &'static str {
        "merge_slices"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        if model.onnx_opset().unwrap_or(0) < 10 {
            return Ok(stats);
        }
        let typed = cx.types(model);
        walk_typed(&mut model.graph, typed, &mut |g, tg| {
            merge(g, &TypedGraph { tg }, &mut stats)
        })?;
        Ok(stats)
    }
}

/// A Slice's constant parameters: (axis, start, end, step) per sliced axis.
fn params(g: &Graph, t: &TypedGraph, n: NodeId, x: ValueId) -> Option<Vec<(i64, i64, i64, i64)>> {
    let d = g.node(n);
    let starts = const_ints(g, d.input(1)?)?;
    let ends = const_ints(g, d.input(2)?)?;
    let axes = match d.input(3) {
        Some(v) => const_ints(g, v)?,
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match d.input(4) {
        Some(v) => const_ints(g, v)?,
        None => vec![1; starts.len()],
    };
    if d.inputs().len() > 5
        || ends.len() != starts.len()
        || axes.len() != starts.len()
        || steps.len() != starts.len()
    {
        return None;
    }
    let mut out = Vec::with_capacity(starts.len());
    for i in 0..starts.len() {
        let axis = if axes[i] < 0 {
            axes[i] + t.rank(x)? as i64
        } else {
            axes[i]
        };
        if axis < 0 || out.iter().any(|&(a, _, _, _)| a == axis) {
            return None;
        }
        out.push((axis, starts[i], ends[i], steps[i]));
    }
    Some(out)
}

fn merge(g: &mut Graph, t: &TypedGraph, stats: &mut PassStats) -> Result<(), PassError> {
    for outer in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(outer) || !is_op(g.node(outer), "Slice") {
            continue;
        }
        let Some(mid) = g.node(outer).input(0) else { continue };
        let Some((inner, 0)) = g.producer(mid) else { continue };
        if !is_op(g.node(inner), "Slice") || only_use(g, mid) != Some(outer) {
            continue;
        }
        let Some(x) = g.node(inner).input(0) else { continue };
        let (Some(p1), Some(p2)) = (params(g, t, inner, x), params(g, t, outer, mid)) else {
            continue;
        };
        let Some(merged) = combine(&p1, &p2) else { continue };
        let Some(y) = g.node(outer).output(0) else { continue };
        let base = g.name(y).to_string();
        let column = |k: usize| -> Vec<i64> {
            merged
                .iter()
                .map(|p| [p.0, p.1, p.2, p.3][k])
                .collect()
        };
        let len = merged.len() as i64;
        let mut inputs = vec![x];
        for (k, suffix) in [(1, "starts"), (2, "ends"), (0, "axes"), (3, "steps")] {
            if k == 3 && merged.iter().all(|p| p.3 == 1) {
                break;
            }
            let tensor = Tensor::from_i64(vec![len], &column(k)).map_err(PassError::from)?;
            inputs.push(g.add_initializer(&format!("{base}_{suffix}"), tensor));
        }
        let new = NewNode::new("Slice")
            .name(g.node(outer).name.clone())
            .inputs(&inputs)
            .outputs(&[y]);
        replace_nodes(g, &[inner, outer], outer, new)?;
        stats.add("slices_merged", 1);
        stats.add("nodes_removed", 1);
    }
    Ok(())
}

/// The merged (axis, start, end, step) list, in axis order of first
/// appearance, or None when a shared axis cannot be merged.
fn combine(
    p1: &[(i64, i64, i64, i64)],
    p2: &[(i64, i64, i64, i64)],
) -> Option<Vec<(i64, i64, i64, i64)>> {
    let mut out: Vec<(i64, i64, i64, i64)> = p1.to_vec();
    for &(a, s2, e2, st2) in p2 {
        match out.iter_mut().find(|p| p.0 == a) {
            None => out.push((a, s2, e2, st2)),
            Some(p) => {
                let (_, s1, e1, st1) = *p;
                if st1 != 1 || st2 != 1 || s1 < 0 || e1 < 0 || s2 < 0 || e2 < 0 {
                    return None;
                }
                *p = (a, s1.saturating_add(s2), e1.min(s1.saturating_add(e2)), 1);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_axis_ranges_compose() {
        // x[1:9][2:4] == x[3:5]; x[1:3][0:10] == x[1:3]; x[5:][0:2] == x[5:7].
        assert_eq!(combine(&[(0, 1, 9, 1)], &[(0, 2, 4, 1)]), Some(vec![(0, 3, 5, 1)]));
        assert_eq!(combine(&[(0, 1, 3, 1)], &[(0, 0, 10, 1)]), Some(vec![(0, 1, 3, 1)]));
        assert_eq!(
            combine(&[(0, 5, i64::MAX, 1)], &[(0, 0, 2, 1)]),
            Some(vec![(0, 5, 7, 1)])
        );
        assert_eq!(
            combine(&[(0, 0, i64::MAX, 1)], &[(0, 1, i64::MAX, 1)]),
            Some(vec![(0, 1, i64::MAX, 1)])
        );
        assert_eq!(combine(&[(0, 0, 4, 2)], &[(0, 0, 2, 1)]), None);
        assert_eq!(combine(&[(0, -3, 4, 1)], &[(0, 0, 2, 1)]), None);
        assert_eq!(
            combine(&[(1, 0, 4, 2)], &[(0, 0, 2, 1)]),
            Some(vec![(1, 0, 4, 2), (0, 0, 2, 1)])
        );
    }
}
