//! Memory-aware scheduling: pick a topological order with a low peak of
//! live bytes.
//!
//! Candidates (the best peak wins, ties go to the earlier candidate, and
//! the original order is the first candidate, so the result is never worse
//! than the original order):
//! 1. the original order;
//! 2. greedy list scheduling: among ready nodes, run the one that frees the
//!    most bytes net of what it allocates (ties: original position);
//! 3. the same, preferring the node that allocates the least;
//! 4. depth-first post-order from the sinks, as XLA's `DFSMemoryScheduler`:
//!    operands with the largest subtree first, so big subtrees finish (and
//!    free their temporaries) before small ones start.
//!
//! Every candidate is scored by [`crate::liveness`] under the in-place
//! rules, so merging is taken into account.

use crate::inplace::{inplace_rule, InPlace};
use crate::liveness::{peak, value_size};
use crate::PlanError;
use graphopt_ir::{Graph, NodeId, ValueId};

/// Checks that `schedule` lists every node of `g` once, producers first.
pub fn check_schedule(g: &Graph, schedule: &[NodeId]) -> Result<(), PlanError> {
    let cap = g.order().iter().map(|n| n.index() + 1).max().unwrap_or(0);
    let mut member = vec![false; cap];
    for n in g.nodes() {
        member[n.index()] = true;
    }
    let mut pos = vec![usize::MAX; cap];
    for (i, &n) in schedule.iter().enumerate() {
        if n.index() >= cap || pos[n.index()] != usize::MAX || !member[n.index()] {
            return Err(PlanError::BadSchedule(format!(
                "node {n} is unknown or listed twice"
            )));
        }
        pos[n.index()] = i;
    }
    if schedule.len() != g.node_count() {
        return Err(PlanError::BadSchedule(format!(
            "{} nodes scheduled, the graph has {}",
            schedule.len(),
            g.node_count()
        )));
    }
    for (i, &n) in schedule.iter().enumerate() {
        let d = g.node(n);
        for &v in d.inputs().iter().flatten().chain(d.captures()) {
            if let Some((p, _)) = g.producer(v) {
                if pos
                    .get(p.index())
                    .is_some_and(|&pp| pp != usize::MAX && pp >= i)
                {
                    return Err(PlanError::BadSchedule(format!(
                        "'{}' reads '{}' before '{}' writes it",
                        d.name,
                        g.name(v),
                        g.node(p).name
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Dependency lists over program order positions.
struct Deps {
    nodes: Vec<NodeId>,
    preds: Vec<Vec<usize>>,
    succs: Vec<Vec<usize>>,
}

/// The dependency lists, plus an edge from every other reader of a
/// donated input to the producer of its output (so that the output is
/// written after the input's last read), where that adds no cycle.
fn deps_donating(g: &Graph, donations: &[(ValueId, ValueId)]) -> Deps {
    let mut d = deps(g);
    let cap = d.nodes.iter().map(|n| n.index() + 1).max().unwrap_or(0);
    let mut pos = vec![usize::MAX; cap];
    for (i, n) in d.nodes.iter().enumerate() {
        pos[n.index()] = i;
    }
    for &(input, output) in donations {
        let Some((p, _)) = g.producer(output) else {
            continue;
        };
        let Some(&pi) = pos.get(p.index()).filter(|&&x| x != usize::MAX) else {
            continue;
        };
        // Nodes reachable from the producer: an edge into it from any of
        // them would close a cycle.
        let mut after = vec![false; d.nodes.len()];
        let mut stack = vec![pi];
        while let Some(x) = stack.pop() {
            for &s in &d.succs[x] {
                if !after[s] {
                    after[s] = true;
                    stack.push(s);
                }
            }
        }
        for u in g.uses(input) {
            let Some(&ri) = pos.get(u.node().index()).filter(|&&x| x != usize::MAX) else {
                continue;
            };
            if ri != pi && !after[ri] && !d.preds[pi].contains(&ri) {
                d.preds[pi].push(ri);
                d.succs[ri].push(pi);
            }
        }
    }
    d
}

fn deps(g: &Graph) -> Deps {
    let nodes: Vec<NodeId> = g.nodes().collect();
    let cap = nodes.iter().map(|n| n.index() + 1).max().unwrap_or(0);
    let mut pos = vec![usize::MAX; cap];
    for (i, n) in nodes.iter().enumerate() {
        pos[n.index()] = i;
    }
    let mut preds = vec![Vec::new(); nodes.len()];
    let mut succs = vec![Vec::new(); nodes.len()];
    for (i, &n) in nodes.iter().enumerate() {
        let d = g.node(n);
        for &v in d.inputs().iter().flatten().chain(d.captures()) {
            if let Some((p, _)) = g.producer(v) {
                if let Some(&pi) = pos.get(p.index()) {
                    if pi != usize::MAX && pi != i && !preds[i].contains(&pi) {
                        preds[i].push(pi);
                        succs[pi].push(i);
                    }
                }
            }
        }
    }
    Deps {
        nodes,
        preds,
        succs,
    }
}

/// Greedy list scheduling. `prefer_small` ranks by bytes allocated first.
fn list_schedule(g: &Graph, d: &Deps, prefer_small: bool) -> Vec<NodeId> {
    let n = d.nodes.len();
    let nvals = g.values().map(|v| v.index() + 1).max().unwrap_or(0);
    // Remaining reads (by node) of each value.
    let mut readers = vec![0usize; nvals];
    for &nid in &d.nodes {
        let nd = g.node(nid);
        let mut seen: Vec<usize> = nd
            .inputs()
            .iter()
            .flatten()
            .chain(nd.captures())
            .map(|v| v.index())
            .collect();
        seen.sort_unstable();
        seen.dedup();
        for v in seen {
            readers[v] += 1;
        }
    }
    let arena_value = |v: graphopt_ir::ValueId| g.initializer(v).is_none() || g.is_input(v);
    let mut indeg: Vec<usize> = d.preds.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut out = Vec::with_capacity(n);
    while !ready.is_empty() {
        let score = |i: usize| -> (i128, i128) {
            let nd = g.node(d.nodes[i]);
            let view = nd.domain.is_empty() && inplace_rule(&nd.op_type) == InPlace::View;
            let alloc: u64 = if view {
                0
            } else {
                nd.outputs()
                    .iter()
                    .flatten()
                    .filter_map(|&o| value_size(g, o))
                    .sum()
            };
            let mut ins: Vec<graphopt_ir::ValueId> = nd
                .inputs()
                .iter()
                .flatten()
                .chain(nd.captures())
                .copied()
                .collect();
            ins.sort_unstable();
            ins.dedup();
            let freed: u64 = ins
                .iter()
                .filter(|&&v| readers[v.index()] == 1 && !g.is_output(v) && arena_value(v))
                .filter_map(|&v| value_size(g, v))
                .sum();
            let net = freed as i128 - alloc as i128;
            if prefer_small {
                (-(alloc as i128), net)
            } else {
                (net, -(alloc as i128))
            }
        };
        let (k, _) = ready
            .iter()
            .enumerate()
            .max_by(|(_, &a), (_, &b)| score(a).cmp(&score(b)).then(b.cmp(&a)))
            .expect("ready is not empty");
        let i = ready.swap_remove(k);
        out.push(d.nodes[i]);
        let nd = g.node(d.nodes[i]);
        let mut ins: Vec<usize> = nd
            .inputs()
            .iter()
            .flatten()
            .chain(nd.captures())
            .map(|v| v.index())
            .collect();
        ins.sort_unstable();
        ins.dedup();
        for v in ins {
            readers[v] = readers[v].saturating_sub(1);
        }
        for &s in &d.succs[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(s);
            }
        }
    }
    out
}

/// Depth-first post-order from the sinks, largest operand subtree first.
fn dfs_schedule(g: &Graph, d: &Deps) -> Vec<NodeId> {
    let n = d.nodes.len();
    // Subtree weight: bytes produced by a node and its ancestors (capped
    // sums of a DAG overcount shared parts; fine for an ordering hint).
    let mut weight = vec![0u128; n];
    for i in 0..n {
        let own: u64 = g
            .node(d.nodes[i])
            .outputs()
            .iter()
            .flatten()
            .filter_map(|&o| value_size(g, o))
            .sum();
        // Saturating: shared ancestors are counted once per path, which
        // grows exponentially along a training graph's residual chains.
        weight[i] = d.preds[i]
            .iter()
            .fold(own as u128, |acc, &p| acc.saturating_add(weight[p]));
    }
    let mut done = vec![false; n];
    let mut out = Vec::with_capacity(n);
    // Sinks in original order; then anything left (cannot happen in a DAG).
    let roots: Vec<usize> = (0..n).filter(|&i| d.succs[i].is_empty()).collect();
    for r in roots.into_iter().chain(0..n) {
        if done[r] {
            continue;
        }
        // Iterative post-order: (node, expanded).
        let mut stack = vec![(r, false)];
        while let Some((i, expanded)) = stack.pop() {
            if done[i] {
                continue;
            }
            if expanded {
                done[i] = true;
                out.push(d.nodes[i]);
                continue;
            }
            stack.push((i, true));
            let mut ps: Vec<usize> = d.preds[i].iter().copied().filter(|&p| !done[p]).collect();
            // Pushed last = visited first: the heaviest operand goes first.
            ps.sort_by(|&a, &b| weight[a].cmp(&weight[b]).then(b.cmp(&a)));
            for p in ps {
                stack.push((p, false));
            }
        }
    }
    out
}

/// A schedule and its peak live bytes (plus, with donations, the bytes of
/// the donated inputs the order does not let their outputs overwrite).
#[derive(Clone, Debug)]
pub struct Scheduled {
    pub order: Vec<NodeId>,
    pub peak: u64,
    pub original_peak: u64,
    /// Which heuristic won (`original`, `greedy-free`, `greedy-small`, `dfs`).
    pub heuristic: &'static str,
}

/// Picks the schedule with the lowest peak among the heuristics above.
/// The graph must be acyclic and its program order topological.
pub fn memory_aware_schedule(g: &Graph, reorder: bool) -> Result<Scheduled, PlanError> {
    memory_aware_schedule_with(g, reorder, false)
}

/// [`memory_aware_schedule`], scoring with values of unknown size left out
/// when `ignore_unknown` (see [`crate::liveness::liveness_with`]).
pub fn memory_aware_schedule_with(
    g: &Graph,
    reorder: bool,
    ignore_unknown: bool,
) -> Result<Scheduled, PlanError> {
    memory_aware_schedule_donating(g, reorder, ignore_unknown, &[])
}

/// [`memory_aware_schedule_with`] for a plan with donations: the
/// heuristics order each donated output's producer after its input's other
/// readers, and every candidate is scored with the donations it allows.
pub fn memory_aware_schedule_donating(
    g: &Graph,
    reorder: bool,
    ignore_unknown: bool,
    donations: &[(ValueId, ValueId)],
) -> Result<Scheduled, PlanError> {
    let original: Vec<NodeId> = g.nodes().collect();
    check_schedule(g, &original)?;
    // A donation the order refuses costs its input a second copy outside
    // the arena (a runtime feeds it back): counted with the peak.
    let peak_of = |order: &[NodeId]| -> Result<u64, PlanError> {
        let l = crate::liveness::liveness_donating(g, order, ignore_unknown, donations)?;
        let refused: u64 = donations
            .iter()
            .filter(|p| !l.donated.contains(p))
            .filter_map(|&(i, _)| value_size(g, i))
            .sum();
        Ok(peak(&l.storages, order.len()).0 + refused)
    };
    let original_peak = peak_of(&original)?;
    let mut best = Scheduled {
        order: original,
        peak: original_peak,
        original_peak,
        heuristic: "original",
    };
    if !reorder {
        return Ok(best);
    }
    let d = deps_donating(g, donations);
    let candidates: [(&'static str, Vec<NodeId>); 3] = [
        ("greedy-free", list_schedule(g, &d, false)),
        ("greedy-small", list_schedule(g, &d, true)),
        ("dfs", dfs_schedule(g, &d)),
    ];
    for (name, order) in candidates {
        if check_schedule(g, &order).is_err() {
            continue; // a cycle left nodes out: keep what we have
        }
        let p = peak_of(&order)?;
        if p < best.peak {
            best.order = order;
            best.peak = p;
            best.heuristic = name;
        }
    }
    Ok(best)
}

#[cfg(test)]
mod overflow_tests {
    use super::*;
    use graphopt_ir::{DType, NewNode, Shape, Type};

    /// 140 diamonds in a chain: 2^140 paths from the input, so the DFS
    /// order's subtree weights (which count shared ancestors once per path)
    /// exceed u128; they saturate instead of overflowing.
    #[test]
    fn subtree_weights_saturate_on_many_paths() {
        let mut g = Graph::new("diamonds");
        let ty = || Some(Type::tensor(DType::F32, Some(Shape::known(&[1024]))));
        let mut prev = g.add_value("x", ty()).unwrap();
        g.inputs.push(prev);
        for i in 0..140 {
            let a = g.add_value(format!("a{i}"), ty()).unwrap();
            let b = g.add_value(format!("b{i}"), ty()).unwrap();
            let c = g.add_value(format!("c{i}"), ty()).unwrap();
            g.add_node(NewNode::new("Relu").inputs(&[prev]).outputs(&[a]))
                .unwrap();
            g.add_node(NewNode::new("Neg").inputs(&[prev]).outputs(&[b]))
                .unwrap();
            g.add_node(NewNode::new("Add").inputs(&[a, b]).outputs(&[c]))
                .unwrap();
            prev = c;
        }
        g.outputs.push(prev);
        let s = memory_aware_schedule(&g, true).unwrap();
        assert_eq!(s.order.len(), 420);
    }
}
