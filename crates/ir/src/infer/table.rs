//! Inferred types as a side table: what a pass reads when it wants the
//! types inference would give, without writing them into the model.

use super::{infer_model, InferOptions};
use crate::{Graph, Model, NodeId, Type, ValueId};

/// The inferred type of every value of one graph (indexed by [`ValueId`]),
/// and the same for each of its subgraphs.
///
/// Built by [`TypeTable::infer`] from a snapshot of the model; ids refer to
/// that snapshot. Values created after it are not in the table, and values
/// removed since keep their old entry, so a pass that reads the table while
/// it rewrites sees the types as they were when it started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TypeTable {
    types: Vec<Option<Type>>,
    /// `(node, attribute index, graph index in the attribute)`, sorted.
    subs: Vec<((NodeId, usize, usize), TypeTable)>,
}

impl TypeTable {
    /// Infers the types of `m` (on a copy: `m` keeps its own types).
    pub fn infer(m: &Model, opts: &InferOptions) -> TypeTable {
        let mut c = m.clone();
        infer_model(&mut c, opts);
        TypeTable::of(&c.graph)
    }

    /// The types `g` (and its subgraphs) declare now.
    pub fn of(g: &Graph) -> TypeTable {
        let mut types = Vec::new();
        for v in g.values() {
            if types.len() <= v.index() {
                types.resize(v.index() + 1, None);
            }
            types[v.index()] = g.ty(v).cloned();
        }
        let mut subs = Vec::new();
        for n in g.nodes() {
            for (ai, a) in g.node(n).attributes.iter().enumerate() {
                for (gi, sub) in a.graphs().enumerate() {
                    subs.push(((n, ai, gi), TypeTable::of(sub)));
                }
            }
        }
        subs.sort_by_key(|(k, _)| *k);
        TypeTable { types, subs }
    }

    /// The type of `v`, if `v` was live when the table was built and its
    /// type is known.
    pub fn ty(&self, v: ValueId) -> Option<&Type> {
        self.types.get(v.index())?.as_ref()
    }

    /// The table of graph `graph` of attribute `attr` of node `n`.
    pub fn sub(&self, n: NodeId, attr: usize, graph: usize) -> Option<&TypeTable> {
        self.subs
            .binary_search_by_key(&(n, attr, graph), |(k, _)| *k)
            .ok()
            .map(|i| &self.subs[i].1)
    }
}
