//! Helpers shared by passes.

use graphopt_ir::Graph;

/// Runs `f` on every subgraph of every node of `g`, innermost first, then
/// refreshes the nodes' captures (a subgraph may read fewer outer values
/// afterwards).
pub(crate) fn for_each_subgraph<E>(
    g: &mut Graph,
    f: &mut dyn FnMut(&mut Graph) -> Result<(), E>,
) -> Result<(), E> {
    let nodes: Vec<_> = g.nodes().filter(|&n| g.node(n).has_subgraphs()).collect();
    for n in nodes {
        for a in &mut g.node_mut(n).attributes {
            for sub in a.graphs_mut() {
                for_each_subgraph(sub, f)?;
                f(sub)?;
            }
        }
        g.refresh_captures(n);
    }
    Ok(())
}
