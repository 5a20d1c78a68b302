//! Graph algorithms over the IR: dependency views for petgraph, a stable
//! topological order, cycle reporting.

use crate::{Graph, IrError, NodeId};
use petgraph::graph::DiGraph;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The node dependency graph as a petgraph `DiGraph` (edge producer →
/// consumer, captures included). Node weights are the IR's `NodeId`s; the
/// petgraph index of a node is its position in program order.
pub fn dependency_graph(g: &Graph) -> DiGraph<NodeId, ()> {
    let mut pos = vec![usize::MAX; g.order().iter().map(|n| n.index() + 1).max().unwrap_or(0)];
    let mut dg = DiGraph::with_capacity(g.node_count(), g.node_count() * 2);
    for (i, n) in g.nodes().enumerate() {
        pos[n.index()] = i;
        dg.add_node(n);
    }
    for n in g.nodes() {
        let d = g.node(n);
        let reads = d.inputs().iter().flatten().chain(d.captures().iter());
        for &v in reads {
            if let Some((p, _)) = g.producer(v) {
                if let Some(&pi) = pos.get(p.index()) {
                    if pi != usize::MAX {
                        dg.add_edge((pi as u32).into(), (pos[n.index()] as u32).into(), ());
                    }
                }
            }
        }
    }
    dg
}

/// A topological order that keeps the current order where it can: among
/// ready nodes the earliest in program order goes first (Kahn with a heap).
pub fn stable_topo_order(g: &Graph) -> Result<Vec<NodeId>, IrError> {
    let dg = dependency_graph(g);
    let n = dg.node_count();
    let mut indeg = vec![0usize; n];
    for e in dg.raw_edges() {
        indeg[e.target().index()] += 1;
    }
    let mut heap: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| indeg[i] == 0).map(Reverse).collect();
    let mut out = Vec::with_capacity(n);
    while let Some(Reverse(i)) = heap.pop() {
        out.push(dg[petgraph::graph::NodeIndex::new(i)]);
        for s in dg.neighbors(petgraph::graph::NodeIndex::new(i)) {
            indeg[s.index()] -= 1;
            if indeg[s.index()] == 0 {
                heap.push(Reverse(s.index()));
            }
        }
    }
    if out.len() != n {
        // Name a node on a cycle: a strongly connected component of size > 1
        // or with a self loop.
        let sccs = petgraph::algo::tarjan_scc(&dg);
        let cyc = sccs
            .into_iter()
            .find(|c| c.len() > 1 || dg.contains_edge(c[0], c[0]))
            .unwrap_or_default();
        let names: Vec<String> = cyc
            .iter()
            .take(4)
            .map(|&i| {
                let d = g.node(dg[i]);
                format!("'{}' ({})", d.name, d.op_type)
            })
            .collect();
        return Err(IrError::new(format!(
            "the graph has a cycle through nodes {}",
            names.join(", ")
        )));
    }
    Ok(out)
}
