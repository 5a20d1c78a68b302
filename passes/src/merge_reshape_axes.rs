//! Unsqueeze or Squeeze of a Reshape becomes one Reshape.
//!
//! `Unsqueeze(Reshape(x, s), axes)` ==> `Reshape(x, s')` with `s'` the
//! constant target `s` with a `1` inserted at each of `axes`, and
//! `Squeeze(Reshape(x, s), axes)` ==> `Reshape(x, s')` with the entries at
//! `axes` dropped, which must be literal `1`s in `s`. Preconditions: `s`
//! and `axes` are constants (`axes` from the attribute before opset 13);
//! `s` has no `0` entry unless the Reshape has `allowzero = 1` (a `0`
//! copies the input dim at the same index, which the inserted or dropped
//! entries would shift); the Reshape's output is read by the Unsqueeze or
//! Squeeze only. A `-1` entry still stands for the same count, as the
//! inserted or dropped dims are 1. Exporters emit the pair when a view is
//! followed by `unsqueeze` (the dynamo exporter's attention in
//! torchvision's ViT: `Reshape` to `[B, N, 3, H, D]`, then `Unsqueeze(0)`).
//! The new target is an initializer named after the output. Only shapes
//! change, so outputs stay bit-identical. Works in subgraphs.
//!
//! ```text
//! before:                                      after:
//! g (float[2,6] x) => (float[1,2,3,2] y)       g (float[2,6] x) => (float[1,2,3,2] y)
//!   <int64[3] s = {2, 3, 2},                     <int64[4] y_shape = {1, 2, 3, 2}> {
//!    int64[1] a = {0}> {                         y = Reshape (x, y_shape)
//!   r = Reshape (x, s)                         }
//!   y = Unsqueeze (r, a)
//! }
//! ```

use crate::pattern::{const_ints, is_op, only_use, replace_nodes};
use crate::util::for_each_subgraph;
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{Graph, Model, NewNode, Tensor};

pub struct MergeReshapeAxes;

impl Pass for MergeReshapeAxes {
    fn name(&self) -> &'static str {
        "merge_reshape_axes"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for_each_subgraph(&mut model.graph, &mut |g| merge(g, &mut stats))?;
        merge(&mut model.graph, &mut stats)?;
        Ok(stats)
    }
}

/// The target `s` with `axes` inserted as 1s (`unsqueeze`) or dropped
/// (`!unsqueeze`, each a literal 1), or None when the axes do not fit.
fn new_target(s: &[i64], axes: &[i64], unsqueeze: bool) -> Option<Vec<i64>> {
    let rank = if unsqueeze { s.len() + axes.len() } else { s.len() } as i64;
    let mut norm = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = if a < 0 { a + rank } else { a };
        if !(0..rank).contains(&a) || norm.contains(&a) {
            return None;
        }
        norm.push(a);
    }
    if axes.is_empty() {
        return None;
    }
    if unsqueeze {
        let mut rest = s.iter();
        Some(
            (0..rank)
                .map(|i| if norm.contains(&i) { Some(1) } else { rest.next().copied() })
                .collect::<Option<Vec<i64>>>()?,
        )
    } else {
        if norm.iter().any(|&a| s[a as usize] != 1) {
            return None;
        }
        Some(
            s.iter()
                .enumerate()
                .filter(|(i, _)| !norm.contains(&(*i as i64)))
                .map(|(_, &v)| v)
                .collect(),
        )
    }
}

fn merge(g: &mut Graph, stats: &mut PassStats) -> Result<(), PassError> {
    for n in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(n) {
            continue;
        }
        let d = g.node(n);
        let unsqueeze = is_op(d, "Unsqueeze");
        if !(unsqueeze || is_op(d, "Squeeze")) {
            continue;
        }
        let (Some(r), Some(y)) = (d.input(0), d.output(0)) else {
            continue;
        };
        let axes = match d.input(1) {
            Some(a) => const_ints(g, a),
            None => d.attr_ints("axes").map(<[i64]>::to_vec),
        };
        let Some(axes) = axes else { continue };
        let Some((p, 0)) = g.producer(r) else { continue };
        let pd = g.node(p);
        if !is_op(pd, "Reshape") || only_use(g, r) != Some(n) || pd.outputs().len() != 1 {
            continue;
        }
        let (Some(x), Some(sv)) = (pd.input(0), pd.input(1)) else {
            continue;
        };
        let Some(s) = const_ints(g, sv) else { continue };
        let allowzero = pd.attr_int("allowzero").unwrap_or(0) != 0;
        if !allowzero && s.contains(&0) {
            continue;
        }
        let Some(target) = new_target(&s, &axes, unsqueeze) else {
            continue;
        };
        let attrs = pd.attributes.clone();
        let name = pd.name.clone();
        let shape = Tensor::from_i64(vec![target.len() as i64], &target).map_err(PassError::from)?;
        let hint = format!("{}_shape", g.name(y));
        let sv2 = g.add_initializer(&hint, shape);
        let mut new = NewNode::new("Reshape").name(name).inputs(&[x, sv2]).outputs(&[y]);
        new.attributes = attrs;
        replace_nodes(g, &[p, n], n, new)?;
        stats.add("pairs_merged", 1);
        stats.add("nodes_removed", 1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(new_target(&[2, 3, 2], &[0], true), Some(vec![1, 2, 3, 2]));
        assert_eq!(new_target(&[2, -1], &[-1, 1], true), Some(vec![2, 1, -1, 1]));
        assert_eq!(new_target(&[2, 1, 3, 1], &[1, -1], false), Some(vec![2, 3]));
        assert_eq!(new_target(&[2, -1, 3], &[1], false), None);
        assert_eq!(new_target(&[2, 3], &[3], true), None);
        assert_eq!(new_target(&[2, 3], &[0, 0], true), None);
    }
}
