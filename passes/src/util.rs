//! Helpers shared by passes.

use crate::{PassError, PassStats};
use graphopt_ir::{Graph, NodeId, Patch, ValueId};

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

/// `y = op(x, ...)` (node `n`, output 0) ==> readers of `y` read `x`; `n`
/// is removed.
///
/// A graph output `y` keeps its name (part of the model's interface) by
/// renaming `x`, which takes over `y`'s type, doc string, metadata and
/// value_info entry. Returns false, changing nothing, when that is
/// impossible: `x` is a graph input or output, a capture of an enclosing
/// graph's value, or a subgraph already uses the name; or when a subgraph
/// reading `y` could not be pointed at `x` (it defines a value named like
/// `x`). The rewrite is one [`Patch`], checked before it changes anything.
pub(crate) fn bypass(
    g: &mut Graph,
    n: NodeId,
    x: ValueId,
    stats: &mut PassStats,
) -> Result<bool, PassError> {
    let Some(y) = g.node(n).output(0) else {
        return Ok(false);
    };
    let keep_name = g.is_output(y);
    if keep_name && (g.is_input(x) || g.is_output(x) || g.is_outer(x)) {
        return Ok(false);
    }
    let mut patch = Patch::new("bypass");
    patch.remove_node(n).replace_uses(y, x);
    if keep_name {
        patch.rename(x, g.name(y));
    }
    if patch.check(g).is_err() {
        return Ok(false);
    }
    let d = g.value(y).clone();
    let in_value_info = g.value_info.contains(&y);
    g.apply(patch)?;
    if keep_name {
        let xd = g.value_mut(x);
        if d.ty.is_some() {
            xd.ty = d.ty;
        }
        xd.doc_string = d.doc_string;
        xd.metadata_props = d.metadata_props;
        if in_value_info && !g.value_info.contains(&x) {
            g.value_info.push(x);
        }
    }
    stats.add("nodes_removed", 1);
    Ok(true)
}
