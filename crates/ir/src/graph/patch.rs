//! Rewrites applied in one step, after tract's `ModelPatch`: a [`Patch`]
//! lists the nodes to remove, the uses to redirect, the values to rename
//! and the nodes to add; [`Graph::apply`] checks all of it against the
//! graph first and changes nothing when any part would fail, so a rewrite
//! never stops halfway.
//!
//! Applying, in this order (each step sees the previous ones):
//! 1. the removed nodes let go of their inputs and outputs (they keep
//!    their place in program order until step 5, so new nodes can be
//!    placed next to them);
//! 2. `replace_uses(old, new)`: every read of `old` (node inputs, subgraph
//!    captures, graph outputs) reads `new`;
//! 3. values left without producer or reader (outputs of removed nodes
//!    that no new node defines, replaced values) are removed;
//! 4. renames;
//! 5. new nodes are added at their places; removed nodes leave the order.

use super::{Graph, NewNode, NodeId, Use, ValueId};
use crate::IrError;

/// Where a new node goes in program order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// At the start of program order (nodes placed at the start keep the
    /// patch's order).
    Start,
    /// Right before this node (which may be one the patch removes).
    Before(NodeId),
    /// Right after this node (which may be one the patch removes); nodes
    /// placed after the same node keep the patch's order.
    After(NodeId),
    /// At the end of program order.
    End,
}

/// A rewrite of one graph, checked as a whole and applied in one step
/// (see the module doc for the order).
#[derive(Clone, Debug, Default)]
pub struct Patch {
    /// What the rewrite is, for error messages ("fuse_gelu: ...").
    pub label: String,
    add: Vec<(Place, NewNode)>,
    replace: Vec<(ValueId, ValueId)>,
    remove: Vec<NodeId>,
    rename: Vec<(ValueId, String)>,
}

impl Patch {
    pub fn new(label: impl Into<String>) -> Patch {
        Patch {
            label: label.into(),
            ..Patch::default()
        }
    }

    /// Adds `node` at `place`. Its outputs may be outputs of removed nodes
    /// (the value then keeps its name and readers).
    pub fn add_node(&mut self, place: Place, node: NewNode) -> &mut Patch {
        self.add.push((place, node));
        self
    }

    /// Every read of `old` will read `new`. Replacements must not chain
    /// (`new` of one is not `old` of another).
    pub fn replace_uses(&mut self, old: ValueId, new: ValueId) -> &mut Patch {
        self.replace.push((old, new));
        self
    }

    pub fn remove_node(&mut self, n: NodeId) -> &mut Patch {
        if !self.remove.contains(&n) {
            self.remove.push(n);
        }
        self
    }

    pub fn remove_nodes(&mut self, ns: &[NodeId]) -> &mut Patch {
        for &n in ns {
            self.remove_node(n);
        }
        self
    }

    /// Renames `v` to `name` once the removed values are gone (so `name`
    /// may be the name of a value the patch removes).
    pub fn rename(&mut self, v: ValueId, name: impl Into<String>) -> &mut Patch {
        self.rename.push((v, name.into()));
        self
    }

    fn err(&self, msg: String) -> IrError {
        if self.label.is_empty() {
            IrError::new(msg)
        } else {
            IrError::new(format!("{}: {msg}", self.label))
        }
    }

    /// Outputs of the new nodes.
    fn defined(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.add
            .iter()
            .flat_map(|(_, n)| n.outputs.iter().flatten().copied())
    }

    /// Values step 3 removes, given the graph before the patch.
    fn dropped(&self, g: &Graph) -> Vec<ValueId> {
        let defined: Vec<ValueId> = self.defined().collect();
        let mut out = Vec::new();
        let outs = self
            .remove
            .iter()
            .flat_map(|&n| g.node(n).outputs().iter().flatten().copied());
        for v in outs.chain(self.replace.iter().map(|&(old, _)| old)) {
            if defined.contains(&v) || out.contains(&v) {
                continue;
            }
            let d = g.value(v);
            let produced = d.producer.is_some_and(|(p, _)| !self.remove.contains(&p));
            if produced || d.initializer.is_some() || d.outer || g.is_input(v) {
                continue;
            }
            out.push(v);
        }
        out
    }

    /// Checks that applying the patch to `g` cannot fail and leaves no read
    /// of an undefined value. Changes nothing.
    pub fn check(&self, g: &Graph) -> Result<(), IrError> {
        for (i, &n) in self.remove.iter().enumerate() {
            if !g.is_live_node(n) || !g.order.contains(n) || self.remove[..i].contains(&n) {
                return Err(self.err(format!("removes node {n}, which is not in the graph")));
            }
        }
        let removed_reader = |u: &Use| self.remove.contains(&u.node());
        let replaced = |v: ValueId| self.replace.iter().any(|&(old, _)| old == v);
        let defined: Vec<ValueId> = self.defined().collect();
        let dropped = self.dropped(g);
        // A value that will be gone (or undefined) after the patch.
        let gone = |v: ValueId| {
            dropped.contains(&v)
                || (g
                    .value(v)
                    .producer
                    .is_some_and(|(p, _)| self.remove.contains(&p))
                    && !defined.contains(&v))
        };
        // 2. Replacements.
        for &(old, new) in &self.replace {
            if !g.is_live_value(old) || !g.is_live_value(new) || old == new {
                return Err(self.err(format!(
                    "replaces {old} by {new}: both must be distinct live values"
                )));
            }
            if replaced(new) || gone(new) {
                return Err(self.err(format!(
                    "replaces '{}' by '{}', which the patch removes or replaces",
                    g.name(old),
                    g.name(new)
                )));
            }
            g.can_replace_all_uses(old, new)
                .map_err(|e| self.err(e.0))?;
        }
        // 3. Nothing may read a value that is gone.
        for &v in &dropped {
            let read = g.uses(v).iter().any(|u| !removed_reader(u)) || g.is_output(v);
            if read && !replaced(v) {
                return Err(self.err(format!(
                    "'{}' would be read but no longer defined",
                    g.name(v)
                )));
            }
        }
        // 4. Renames: `name` must be free once the dropped values are gone,
        // in this graph and every subgraph.
        for (i, (v, name)) in self.rename.iter().enumerate() {
            if !g.is_live_value(*v) || gone(*v) || replaced(*v) {
                return Err(self.err(format!("renames {v}, which the patch removes")));
            }
            if self.rename[..i].iter().any(|(w, n)| n == name || w == v) {
                return Err(self.err(format!("renames twice or to '{name}' twice")));
            }
            if g.name(*v) == name {
                continue;
            }
            let holder = g.value_by_name(name);
            if holder.is_some_and(|h| !dropped.contains(&h))
                || self.rename.iter().any(|(w, _)| g.name(*w) == name)
            {
                return Err(self.err(format!("cannot rename '{}': '{name}' exists", g.name(*v))));
            }
            // A subgraph may hold `name` only as a capture of the dropped
            // value (step 2 points those captures elsewhere first).
            let capture_ok = holder.is_some();
            if g.subgraphs().any(|(_, s)| s.holds_name(name, capture_ok)) {
                return Err(self.err(format!(
                    "cannot rename '{}': a subgraph uses '{name}'",
                    g.name(*v)
                )));
            }
        }
        // 5. New nodes.
        let mut outs: Vec<ValueId> = Vec::new();
        for (place, new) in &self.add {
            if let Place::Before(a) | Place::After(a) = *place {
                if !g.order.contains(a) {
                    return Err(self.err(format!(
                        "places node '{}' ({}) next to {a}, which is not in the graph",
                        new.name, new.op_type
                    )));
                }
            }
            for &i in new.inputs.iter().flatten() {
                if !g.is_live_value(i) || gone(i) || replaced(i) {
                    return Err(self.err(format!(
                        "node '{}' ({}) reads {i}, which is not defined after the patch",
                        new.name, new.op_type
                    )));
                }
            }
            for &o in new.outputs.iter().flatten() {
                let d = g.value(o);
                let free = d.producer.is_none_or(|(p, _)| self.remove.contains(&p));
                if !g.is_live_value(o)
                    || !free
                    || d.initializer.is_some()
                    || d.outer
                    || g.is_input(o)
                    || outs.contains(&o)
                    || replaced(o)
                {
                    return Err(self.err(format!(
                        "node '{}' ({}) redefines value '{}'",
                        new.name, new.op_type, d.name
                    )));
                }
                outs.push(o);
            }
        }
        Ok(())
    }
}

impl Graph {
    /// Applies `patch` after checking it ([`Patch::check`]): on error the
    /// graph is unchanged. Returns the new nodes, in the patch's order.
    pub fn apply(&mut self, mut patch: Patch) -> Result<Vec<NodeId>, IrError> {
        patch.check(self)?;
        let dropped = patch.dropped(self);
        // 1.
        for &n in &patch.remove {
            self.detach_node(n);
        }
        // 2.
        for &(old, new) in &patch.replace {
            self.replace_all_uses(old, new)
                .map_err(|e| patch.err(e.0))?;
        }
        // 3.
        for v in dropped {
            if self.uses(v).is_empty() && !self.is_output(v) {
                self.remove_value(v);
            }
        }
        // 4.
        for (v, name) in &patch.rename {
            self.rename_value(*v, name).map_err(|e| patch.err(e.0))?;
        }
        // 5.
        let mut ids = Vec::with_capacity(patch.add.len());
        let mut after: Vec<(NodeId, NodeId)> = Vec::new();
        let mut start: Option<NodeId> = None;
        for (place, new) in std::mem::take(&mut patch.add) {
            let id = self.create_node(new).map_err(|e| patch.err(e.0))?;
            match place {
                Place::Start => {
                    match start {
                        Some(p) => self.order.insert_after(id, p),
                        None => self.order.insert_at(id, 0),
                    }
                    start = Some(id);
                }
                Place::Before(a) => self.order.insert_before(id, a),
                Place::After(a) => {
                    let last = after.iter_mut().find(|(x, _)| *x == a);
                    let prev = last.as_ref().map_or(a, |(_, p)| *p);
                    self.order.insert_after(id, prev);
                    match last {
                        Some(l) => l.1 = id,
                        None => after.push((a, id)),
                    }
                }
                Place::End => self.order.push_back(id),
            }
            self.refresh_captures(id);
            ids.push(id);
        }
        for &n in &patch.remove {
            self.order.remove(n);
        }
        Ok(ids)
    }

    /// True when this graph or a subgraph of it has a value named `name`;
    /// with `capture_ok`, captures of enclosing values do not count.
    fn holds_name(&self, name: &str, capture_ok: bool) -> bool {
        self.value_by_name(name)
            .is_some_and(|v| !(capture_ok && self.is_outer(v)))
            || self
                .subgraphs()
                .any(|(_, s)| s.holds_name(name, capture_ok))
    }

    /// Would [`Graph::replace_all_uses`]`(old, new)` succeed? (It fails when
    /// a subgraph reading `old` defines a value named like `new`.)
    fn can_replace_all_uses(&self, old: ValueId, new: ValueId) -> Result<(), IrError> {
        let (old_name, new_name) = (self.name(old), self.name(new));
        for u in self.uses(old) {
            if let Use::Capture { node } = *u {
                for a in &self.node(node).attributes {
                    for s in a.graphs() {
                        s.can_replace_capture(old_name, new_name)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Mirrors `replace_capture`'s failures.
    fn can_replace_capture(&self, old: &str, new: &str) -> Result<(), IrError> {
        let Some(v) = self.value_by_name(old).filter(|&v| self.is_outer(v)) else {
            return Ok(());
        };
        match self.value_by_name(new) {
            Some(w) if self.is_outer(w) => self.can_replace_all_uses(v, w),
            Some(_) => Err(IrError::new(format!(
                "subgraph '{}' defines '{new}', which shadows the outer value it must now read",
                self.name
            ))),
            None if self.defines_name_deep(new) => Err(IrError::new(format!(
                "cannot rename '{old}': '{new}' exists"
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Type};

    fn f32() -> Option<Type> {
        Some(Type::tensor(DType::F32, None))
    }

    /// x -> Relu -> a -> Neg -> y (graph output)
    fn chain() -> (Graph, [ValueId; 3], [NodeId; 2]) {
        let mut g = Graph::new("g");
        let x = g.add_value("x", f32()).unwrap();
        let a = g.add_value("a", f32()).unwrap();
        let y = g.add_value("y", f32()).unwrap();
        g.inputs.push(x);
        g.outputs.push(y);
        let r = g
            .add_node(NewNode::new("Relu").inputs(&[x]).outputs(&[a]))
            .unwrap();
        let n = g
            .add_node(NewNode::new("Neg").inputs(&[a]).outputs(&[y]))
            .unwrap();
        (g, [x, a, y], [r, n])
    }

    #[test]
    fn replaces_nodes_in_place() {
        let (mut g, [x, a, y], [r, n]) = chain();
        let mut p = Patch::new("fuse");
        p.remove_nodes(&[r, n]).add_node(
            Place::After(n),
            NewNode::new("Abs").inputs(&[x]).outputs(&[y]),
        );
        let ids = g.apply(p).unwrap();
        assert_eq!(g.order(), &ids[..]);
        assert!(!g.is_live_value(a));
        assert_eq!(g.producer(y), Some((ids[0], 0)));
        crate::verify::verify_graph(&g, &[]).unwrap();
    }

    #[test]
    fn bypass_keeps_the_output_name() {
        let (mut g, [_, a, y], [_, n]) = chain();
        let mut p = Patch::new("bypass");
        p.remove_node(n).replace_uses(y, a).rename(a, "y");
        g.apply(p).unwrap();
        assert_eq!(g.name(g.outputs[0]), "y");
        assert_eq!(g.outputs[0], a);
        assert!(!g.is_live_value(y));
        crate::verify::verify_graph(&g, &[]).unwrap();
    }

    #[test]
    fn a_failing_patch_changes_nothing() {
        let (g0, [x, a, y], [r, n]) = chain();
        let bad: Vec<Patch> = vec![
            // Leaves `a` read by Neg but undefined.
            {
                let mut p = Patch::new("t");
                p.remove_node(r);
                p
            },
            // Renames to a name that stays taken.
            {
                let mut p = Patch::new("t");
                p.rename(a, "x");
                p
            },
            // Redefines `a`, which Relu still defines.
            {
                let mut p = Patch::new("t");
                p.add_node(Place::End, NewNode::new("Abs").inputs(&[x]).outputs(&[a]));
                p
            },
            // The new node reads a value the patch removes.
            {
                let mut p = Patch::new("t");
                p.remove_nodes(&[r, n])
                    .add_node(Place::End, NewNode::new("Abs").inputs(&[a]).outputs(&[y]));
                p
            },
        ];
        for p in bad {
            let mut g = g0.clone();
            let e = g.apply(p).unwrap_err();
            assert!(e.0.starts_with("t: "), "{e}");
            assert_eq!(g, g0);
        }
    }
}
