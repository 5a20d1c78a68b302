//! The verifier: structural invariants checked after every pass in tests and
//! debug builds, and on request in release.
//!
//! It checks, for the graph and every subgraph:
//! 1. every live value is defined exactly once (node output, graph input,
//!    initializer, or a capture of an enclosing graph's value);
//! 2. every node input and graph output names a live value, and the use
//!    lists agree with the node inputs;
//! 3. nodes are in topological order (a value is defined before it is read);
//! 4. a capture names a value of an enclosing scope, and never appears in
//!    the main graph;
//! 5. declared types agree with initializer data.

use crate::{Graph, IrError, Model, NodeId, TypeKind, Use, ValueId};
use std::collections::HashSet;

/// Verifies a whole model: its graph and its functions' bodies.
pub fn verify_model(m: &Model) -> Result<(), IrError> {
    verify_graph(&m.graph, &[])?;
    for f in &m.functions {
        verify_graph(&f.body, &[])
            .map_err(|e| IrError::new(format!("in function '{}': {e}", f.name)))?;
    }
    Ok(())
}

/// Verifies `g`; `outer` lists the names visible from enclosing graphs.
pub fn verify_graph(g: &Graph, outer: &[&HashSet<String>]) -> Result<(), IrError> {
    let ctx = |msg: String| {
        if g.name.is_empty() {
            IrError::new(msg)
        } else {
            IrError::new(format!("in graph '{}': {msg}", g.name))
        }
    };
    let node_desc = |n: NodeId| {
        let d = g.node(n);
        format!("node '{}' ({})", d.name, d.qualified_op())
    };

    // 1. Definitions.
    let mut defined: Vec<bool> = Vec::new();
    let define = |v: ValueId, defined: &mut Vec<bool>| {
        if defined.len() <= v.index() {
            defined.resize(v.index() + 1, false);
        }
        std::mem::replace(&mut defined[v.index()], true)
    };
    for &v in &g.inputs {
        if !g.is_live_value(v) {
            return Err(ctx(format!("graph input {v} was removed")));
        }
        if define(v, &mut defined) {
            return Err(ctx(format!("graph input '{}' is listed twice", g.name(v))));
        }
        if g.producer(v).is_some() {
            return Err(ctx(format!(
                "graph input '{}' is also produced by a node",
                g.name(v)
            )));
        }
    }
    for &v in g.initializers().iter().chain(g.sparse_initializers()) {
        if g.is_input(v) {
            continue;
        }
        if define(v, &mut defined) {
            return Err(ctx(format!("initializer '{}' is defined twice", g.name(v))));
        }
        if g.producer(v).is_some() {
            return Err(ctx(format!(
                "initializer '{}' is also produced by a node",
                g.name(v)
            )));
        }
    }
    let mut visible: HashSet<String> = HashSet::new();
    for v in g.values() {
        if !g.is_outer(v) && outer.iter().any(|s| s.contains(g.name(v))) {
            return Err(ctx(format!(
                "'{}' shadows a value of an enclosing graph (ONNX names are unique across scopes)",
                g.name(v)
            )));
        }
        if g.is_outer(v) {
            if outer.is_empty() {
                return Err(ctx(format!(
                    "value '{}' is used but never defined",
                    g.name(v)
                )));
            }
            if !outer.iter().any(|s| s.contains(g.name(v))) {
                return Err(ctx(format!(
                    "subgraph reads '{}', which no enclosing graph defines",
                    g.name(v)
                )));
            }
            define(v, &mut defined);
        }
    }

    // 2 & 3. Walk in program order.
    let mut avail: Vec<bool> = defined.clone();
    avail.resize(g.values().map(|v| v.index() + 1).max().unwrap_or(0), false);
    let is_avail = |avail: &Vec<bool>, v: ValueId| avail.get(v.index()).copied().unwrap_or(false);
    let mut seen_nodes = HashSet::new();
    for n in g.nodes() {
        if !g.is_live_node(n) || !seen_nodes.insert(n) {
            return Err(ctx(format!("{n} is dead or listed twice in program order")));
        }
        let d = g.node(n);
        for (slot, i) in d.inputs().iter().enumerate() {
            let Some(i) = *i else { continue };
            if !g.is_live_value(i) {
                return Err(ctx(format!("{} reads removed value {i}", node_desc(n))));
            }
            if !is_avail(&avail, i) {
                let why = if g.producer(i).is_some() {
                    "before it is defined (nodes are not in topological order)"
                } else {
                    "but nothing defines it"
                };
                return Err(ctx(format!("{} reads '{}' {why}", node_desc(n), g.name(i))));
            }
            let u = Use::Input {
                node: n,
                slot: slot as u32,
            };
            if !g.uses(i).contains(&u) {
                return Err(ctx(format!(
                    "use list of '{}' misses {}",
                    g.name(i),
                    node_desc(n)
                )));
            }
        }
        // The recorded captures are exactly the outer names the subgraphs read.
        let mut read: Vec<&str> = Vec::new();
        for a in &d.attributes {
            for sub in a.graphs() {
                for sv in sub.values() {
                    if sub.is_outer(sv) && !read.contains(&sub.name(sv)) {
                        read.push(sub.name(sv));
                    }
                }
            }
        }
        let mut recorded: Vec<&str> = d.captures().iter().map(|&c| g.name(c)).collect();
        read.sort_unstable();
        recorded.sort_unstable();
        if read != recorded {
            return Err(ctx(format!(
                "{}: its subgraphs read {read:?} but the node records captures {recorded:?}",
                node_desc(n)
            )));
        }
        for &c in d.captures() {
            if !g.uses(c).contains(&Use::Capture { node: n }) {
                return Err(ctx(format!(
                    "use list of '{}' misses the capture by {}",
                    g.name(c),
                    node_desc(n)
                )));
            }
            if !is_avail(&avail, c) {
                return Err(ctx(format!(
                    "{} captures '{}' before it is defined",
                    node_desc(n),
                    g.name(c)
                )));
            }
        }
        for (slot, o) in d.outputs().iter().enumerate() {
            let Some(o) = *o else { continue };
            if g.producer(o) != Some((n, slot as u32)) {
                return Err(ctx(format!(
                    "output '{}' of {} has another producer",
                    g.name(o),
                    node_desc(n)
                )));
            }
            if is_avail(&avail, o) {
                return Err(ctx(format!("{} redefines '{}'", node_desc(n), g.name(o))));
            }
            avail[o.index()] = true;
        }
    }
    for v in g.values() {
        for u in g.uses(v) {
            let n = u.node();
            if !g.is_live_node(n) {
                return Err(ctx(format!(
                    "use list of '{}' names removed node {n}",
                    g.name(v)
                )));
            }
            if matches!(u, Use::Capture { .. }) && !g.node(n).captures().contains(&v) {
                return Err(ctx(format!(
                    "stale capture of '{}' by {}",
                    g.name(v),
                    node_desc(n)
                )));
            }
            if let Use::Input { slot, .. } = u {
                if g.node(n).input(*slot as usize) != Some(v) {
                    return Err(ctx(format!(
                        "stale use of '{}' in {}",
                        g.name(v),
                        node_desc(n)
                    )));
                }
            }
        }
        if !is_avail(&avail, v) && !g.uses(v).is_empty() {
            return Err(ctx(format!(
                "value '{}' is used but never defined",
                g.name(v)
            )));
        }
        visible.insert(g.name(v).to_string());
    }
    for &o in &g.outputs {
        if !g.is_live_value(o) || !is_avail(&avail, o) {
            return Err(ctx(format!(
                "graph output '{}' is never defined",
                g.name(o)
            )));
        }
    }

    // 5. Types against data.
    for &v in g.initializers() {
        let t = g.initializer(v).expect("listed initializers have data");
        t.check()
            .map_err(|e| ctx(format!("initializer '{}': {e}", g.name(v))))?;
        if let Some(ty) = g.ty(v) {
            if let TypeKind::Tensor(tt) = &ty.kind {
                if tt.elem != t.dtype {
                    return Err(ctx(format!(
                        "initializer '{}' holds {} but is declared {}",
                        g.name(v),
                        t.dtype,
                        tt.elem
                    )));
                }
                if let Some(s) = &tt.shape {
                    let ok = s.rank() == t.dims.len()
                        && s.dims
                            .iter()
                            .zip(&t.dims)
                            .all(|(d, &x)| d.known().is_none_or(|k| k == x));
                    if !ok {
                        return Err(ctx(format!(
                            "initializer '{}' has dims {:?} but is declared {s}",
                            g.name(v),
                            t.dims
                        )));
                    }
                }
            }
        }
    }

    // 4. Subgraphs see this graph's names and everything enclosing.
    let mut scopes: Vec<&HashSet<String>> = outer.to_vec();
    scopes.push(&visible);
    for (n, sub) in g.subgraphs() {
        verify_graph(sub, &scopes)
            .map_err(|e| ctx(format!("in a subgraph of {}: {e}", node_desc(n))))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, NewNode, Type};

    fn small() -> (Graph, ValueId, ValueId, ValueId) {
        small_added(false)
    }

    /// x -> r1 -> y -> r2 -> z, its nodes added in that order, or the other
    /// way round (out of order) when `reversed`.
    fn small_added(reversed: bool) -> (Graph, ValueId, ValueId, ValueId) {
        let mut g = Graph::new("g");
        let x = g
            .add_value("x", Some(Type::known(DType::F32, &[2])))
            .unwrap();
        g.inputs.push(x);
        let y = g.add_value("y", None).unwrap();
        let z = g.add_value("z", None).unwrap();
        let mut nodes = [
            NewNode::new("Relu").name("r1").inputs(&[x]).outputs(&[y]),
            NewNode::new("Relu").name("r2").inputs(&[y]).outputs(&[z]),
        ];
        if reversed {
            nodes.reverse();
        }
        for n in nodes {
            g.add_node(n).unwrap();
        }
        g.outputs.push(z);
        (g, x, y, z)
    }

    #[test]
    fn accepts_a_valid_graph() {
        let (g, ..) = small();
        verify_graph(&g, &[]).unwrap();
    }

    #[test]
    fn rejects_out_of_order_nodes() {
        // (set_order refuses such an order; adding nodes does not.)
        let (mut g, ..) = small_added(true);
        let (mut s, ..) = small();
        let rev: Vec<_> = s.nodes().rev().collect();
        let e = s.set_order(rev).unwrap_err().to_string();
        assert!(
            e.contains("schedule puts node 'r2' before the producer of its input 'y'"),
            "{e}"
        );
        let e = verify_graph(&g, &[]).unwrap_err().to_string();
        assert!(
            e.contains("node 'r2' (Relu) reads 'y' before it is defined"),
            "{e}"
        );
        g.topo_sort().unwrap();
        verify_graph(&g, &[]).unwrap();
    }

    #[test]
    fn rejects_undefined_output() {
        let (mut g, _, _, z) = small();
        let (n, _) = g.producer(z).unwrap();
        g.remove_node(n);
        let e = verify_graph(&g, &[]).unwrap_err().to_string();
        assert!(e.contains("graph output 'z' is never defined"), "{e}");
    }

    #[test]
    fn replace_all_uses_keeps_use_lists() {
        let (mut g, x, y, _) = small();
        g.replace_all_uses(y, x).unwrap();
        let (n, _) = g.producer(y).unwrap();
        g.remove_node(n);
        g.remove_value(y);
        verify_graph(&g, &[]).unwrap();
        assert_eq!(g.uses(x).len(), 1);
    }

    #[test]
    fn cycle_is_named() {
        let mut g = Graph::new("g");
        let a = g.add_value("a", None).unwrap();
        let b = g.add_value("b", None).unwrap();
        g.add_node(NewNode::new("Relu").name("p").inputs(&[b]).outputs(&[a]))
            .unwrap();
        g.add_node(NewNode::new("Relu").name("q").inputs(&[a]).outputs(&[b]))
            .unwrap();
        let e = g.topo_sort().unwrap_err().to_string();
        assert!(
            e.contains("cycle") && e.contains("'p'") && e.contains("'q'"),
            "{e}"
        );
    }

    #[test]
    fn failed_insert_changes_nothing() {
        let (mut g, x, _, z) = small();
        let fresh = g.add_value("fresh", None).unwrap();
        // `z` already has a producer: the node is refused and `fresh` keeps none.
        assert!(g
            .add_node(NewNode::new("Split").inputs(&[x]).outputs(&[fresh, z]))
            .is_err());
        assert!(g.producer(fresh).is_none());
        verify_graph(&g, &[]).unwrap();
    }

    #[test]
    fn fresh_names_avoid_subgraph_names() {
        use crate::{AttrValue, Attribute};
        let (mut g, x, _, _) = small();
        let mut sub = Graph::new("body");
        let t = sub.add_value("taken", None).unwrap();
        let xo = sub.value_or_outer("x");
        sub.add_node(NewNode::new("Neg").inputs(&[xo]).outputs(&[t]))
            .unwrap();
        sub.outputs.push(t);
        let c = g
            .add_value("c", Some(Type::known(DType::Bool, &[])))
            .unwrap();
        g.inputs.push(c);
        let out = g.add_value("out", None).unwrap();
        g.add_node(
            NewNode::new("If")
                .inputs(&[c])
                .outputs(&[out])
                .attr(Attribute::new(
                    "then_branch",
                    AttrValue::Graph(Box::new(sub.clone())),
                ))
                .attr(Attribute::new(
                    "else_branch",
                    AttrValue::Graph(Box::new(sub)),
                )),
        )
        .unwrap();
        g.outputs.push(out);
        verify_graph(&g, &[]).unwrap();
        assert_eq!(g.fresh_name("taken"), "taken_1");
        assert!(g.rename_value(x, "taken").is_err());
        // A subgraph defining a name of the enclosing graph is rejected.
        let shadow = g.add_value("taken", None).unwrap();
        g.inputs.push(shadow);
        let e = verify_graph(&g, &[]).unwrap_err().to_string();
        assert!(e.contains("shadows"), "{e}");
    }
}
