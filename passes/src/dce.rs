//! Dead-code elimination.
//!
//! Removes what cannot affect a graph output:
//! 1. nodes none of whose outputs is read (by a live node, a subgraph, or
//!    as a graph output);
//! 2. initializers nothing reads (graph inputs are the model's interface and
//!    are never removed, even when unused);
//! 3. `value_info` entries of values that no longer exist, and values that
//!    nothing defines or reads;
//! 4. the same inside If/Loop/Scan bodies, after which a node's captures of
//!    outer values shrink, which can free outer nodes in turn.
//!
//! Runs anywhere; it is the sweep after every other pass.
//!
//! ```text
//! before:                                  after:
//! g (float[2] x) => (float[2] y)           g (float[2] x) => (float[2] y)
//!   <float[2] w = {1, 2}> {                {
//!   t = Neg (x)                              y = Relu (x)
//!   y = Relu (x)                           }
//! }
//! ```

use crate::util::for_each_subgraph;
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{Graph, Model};

pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for_each_subgraph(&mut model.graph, &mut |g| {
            sweep(g, &mut stats);
            Ok::<(), PassError>(())
        })?;
        sweep(&mut model.graph, &mut stats);
        Ok(stats)
    }
}

/// One backward sweep over `g` (its subgraphs are already swept).
fn sweep(g: &mut Graph, stats: &mut PassStats) {
    // Backward over program order: when a node is visited, every reader of
    // its outputs has been visited already.
    let size = g.order().iter().map(|n| n.index() + 1).max().unwrap_or(0);
    let mut dead = vec![false; size];
    let mut removed = Vec::new();
    for n in g.nodes().rev().collect::<Vec<_>>() {
        let live = g.node(n).outputs().iter().flatten().any(|&o| {
            g.is_output(o) || g.uses(o).iter().any(|u| !dead.get(u.node().index()).copied().unwrap_or(false))
        });
        if !live {
            dead[n.index()] = true;
            removed.push(n);
        }
    }
    let outputs: Vec<_> = removed
        .iter()
        .flat_map(|&n| g.node(n).outputs().iter().flatten().copied().collect::<Vec<_>>())
        .collect();
    g.remove_nodes(&removed);
    for v in outputs {
        g.remove_value(v);
    }
    stats.add("nodes_removed", removed.len() as u64);

    let mut bytes = 0;
    let mut inits = 0;
    let mut others = 0;
    for v in g.values().collect::<Vec<_>>() {
        if !g.uses(v).is_empty() || g.is_output(v) || g.is_input(v) || g.producer(v).is_some() {
            continue;
        }
        if let Some(t) = g.take_initializer(v) {
            bytes += t.nbytes();
            inits += 1;
        } else if g.take_sparse_initializer(v).is_some() {
            inits += 1;
        } else {
            others += 1;
        }
        g.remove_value(v);
    }
    stats.add("initializers_removed", inits);
    stats.add("bytes_saved", bytes);
    stats.add("values_removed", others);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn removes_dead_nodes_and_weights() {
        assert_pass(
            &Dce,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
  t = Mul (x, w)
  u = Neg (t)
  y = Relu (x)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  y = Relu (x)
}
"#,
        );
    }

    #[test]
    fn keeps_unused_graph_inputs_and_outputs() {
        assert_unchanged(
            &Dce,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, float[2] unused) => (float[2] y, float[2] x2) {
  y = Relu (x)
  x2 = Neg (y)
}
"#,
        );
    }
}
