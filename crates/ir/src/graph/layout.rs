//! Program order as a doubly linked list over node ids, after Cranelift's
//! `Layout`: inserting a node before or after another and removing one are
//! O(1), and no edit renumbers anything. Iteration follows the links, so it
//! is deterministic.
//!
//! Each linked node also carries a sequence number that grows along the
//! order (Cranelift's `seq`): a new node takes the midpoint between its
//! neighbours, and only when there is no gap left is the whole list
//! renumbered (O(n), rare: numbers start `STRIDE` apart). Comparing two
//! nodes' places is then O(1) ([`Layout::precedes`]).
//!
//! Two views are materialized lazily, on first use after an edit, and
//! dropped by the next edit: the order as a slice ([`Layout::as_slice`],
//! what `Graph::order` returns) and each node's position
//! ([`Layout::position`]). A pass that edits and asks for positions in
//! turn pays O(n) per question; it should anchor insertions on nodes
//! instead (`Graph::insert_node_before`/`insert_node_after`).

use super::NodeId;
use std::sync::OnceLock;

const NONE: u32 = u32::MAX;
/// Gap between sequence numbers after a renumbering.
const STRIDE: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
    seq: u64,
    linked: bool,
}

const UNLINKED: Link = Link {
    prev: NONE,
    next: NONE,
    seq: 0,
    linked: false,
};

#[derive(Clone, Debug)]
pub(super) struct Layout {
    /// Indexed by `NodeId`.
    links: Vec<Link>,
    head: u32,
    tail: u32,
    len: usize,
    slice: OnceLock<Vec<NodeId>>,
    positions: OnceLock<Vec<u32>>,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            links: Vec::new(),
            head: NONE,
            tail: NONE,
            len: 0,
            slice: OnceLock::new(),
            positions: OnceLock::new(),
        }
    }
}

/// Two layouts are equal when they list the same nodes in the same order
/// (whatever the caches hold).
impl PartialEq for Layout {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

fn id(i: u32) -> Option<NodeId> {
    (i != NONE).then_some(NodeId(i))
}

impl Layout {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn contains(&self, n: NodeId) -> bool {
        self.links.get(n.index()).is_some_and(|l| l.linked)
    }

    fn edited(&mut self) {
        self.slice.take();
        self.positions.take();
    }

    fn slot(&mut self, n: NodeId) -> &mut Link {
        if self.links.len() <= n.index() {
            self.links.resize(n.index() + 1, UNLINKED);
        }
        &mut self.links[n.index()]
    }

    /// Links `n` between `prev` and `next` (neighbours, or NONE at the ends).
    fn link(&mut self, n: NodeId, prev: u32, next: u32) {
        debug_assert!(!self.contains(n), "node {n} is already in the order");
        let lo = match prev {
            NONE => 0,
            p => self.links[p as usize].seq,
        };
        let hi = match next {
            NONE => lo.saturating_add(2 * STRIDE),
            x => self.links[x as usize].seq,
        };
        let (seq, renumber) = if hi - lo >= 2 {
            (lo + (hi - lo) / 2, false)
        } else {
            (lo, true)
        };
        *self.slot(n) = Link {
            prev,
            next,
            seq,
            linked: true,
        };
        match prev {
            NONE => self.head = n.0,
            p => self.links[p as usize].next = n.0,
        }
        match next {
            NONE => self.tail = n.0,
            x => self.links[x as usize].prev = n.0,
        }
        self.len += 1;
        if renumber {
            self.renumber();
        }
        self.edited();
    }

    fn renumber(&mut self) {
        let mut i = self.head;
        let mut seq = STRIDE;
        while i != NONE {
            self.links[i as usize].seq = seq;
            seq += STRIDE;
            i = self.links[i as usize].next;
        }
    }

    /// True when live node `a` comes before live node `b` (O(1)).
    pub(super) fn precedes(&self, a: NodeId, b: NodeId) -> bool {
        debug_assert!(self.contains(a) && self.contains(b));
        self.links[a.index()].seq < self.links[b.index()].seq
    }

    pub(super) fn push_back(&mut self, n: NodeId) {
        self.link(n, self.tail, NONE);
    }

    /// Links `n` right before `anchor` (which must be in the order).
    pub(super) fn insert_before(&mut self, n: NodeId, anchor: NodeId) {
        debug_assert!(self.contains(anchor));
        let prev = self.links[anchor.index()].prev;
        self.link(n, prev, anchor.0);
    }

    /// Links `n` right after `anchor` (which must be in the order).
    pub(super) fn insert_after(&mut self, n: NodeId, anchor: NodeId) {
        debug_assert!(self.contains(anchor));
        let next = self.links[anchor.index()].next;
        self.link(n, anchor.0, next);
    }

    /// Links `n` at position `pos` (the end if `pos` is past it). Finding
    /// the node now at `pos` walks the list unless the slice view is
    /// current.
    pub(super) fn insert_at(&mut self, n: NodeId, pos: usize) {
        if pos >= self.len {
            return self.push_back(n);
        }
        let anchor = match self.slice.get() {
            Some(s) => s[pos],
            None => self.iter().nth(pos).expect("pos < len"),
        };
        self.insert_before(n, anchor);
    }

    pub(super) fn remove(&mut self, n: NodeId) {
        if !self.contains(n) {
            return;
        }
        let Link { prev, next, .. } = self.links[n.index()];
        match prev {
            NONE => self.head = next,
            p => self.links[p as usize].next = next,
        }
        match next {
            NONE => self.tail = prev,
            x => self.links[x as usize].prev = prev,
        }
        self.links[n.index()] = UNLINKED;
        self.len -= 1;
        self.edited();
    }

    /// Replaces the whole order (the caller checked it lists distinct nodes).
    pub(super) fn set(&mut self, order: &[NodeId]) {
        for l in &mut self.links {
            *l = UNLINKED;
        }
        self.head = NONE;
        self.tail = NONE;
        self.len = 0;
        for &n in order {
            self.push_back(n);
        }
        self.edited();
    }

    pub(super) fn prev(&self, n: NodeId) -> Option<NodeId> {
        self.links
            .get(n.index())
            .filter(|l| l.linked)
            .and_then(|l| id(l.prev))
    }

    pub(super) fn next(&self, n: NodeId) -> Option<NodeId> {
        self.links
            .get(n.index())
            .filter(|l| l.linked)
            .and_then(|l| id(l.next))
    }

    pub(super) fn iter(&self) -> Iter<'_> {
        Iter {
            links: &self.links,
            front: self.head,
            back: self.tail,
            left: self.len,
        }
    }

    /// The order as a slice (built on first use after an edit).
    pub(super) fn as_slice(&self) -> &[NodeId] {
        self.slice.get_or_init(|| self.iter().collect())
    }

    /// The position of `n` in the order (positions are built on first use
    /// after an edit).
    pub(super) fn position(&self, n: NodeId) -> Option<usize> {
        if !self.contains(n) {
            return None;
        }
        let pos = self.positions.get_or_init(|| {
            let mut pos = vec![NONE; self.links.len()];
            for (i, m) in self.iter().enumerate() {
                pos[m.index()] = i as u32;
            }
            pos
        });
        Some(pos[n.index()] as usize)
    }
}

/// Program order, front to back (or back to front).
pub struct Iter<'a> {
    links: &'a [Link],
    front: u32,
    back: u32,
    left: usize,
}

impl Iterator for Iter<'_> {
    type Item = NodeId;
    fn next(&mut self) -> Option<NodeId> {
        if self.left == 0 {
            return None;
        }
        let n = id(self.front)?;
        self.front = self.links[n.index()].next;
        self.left -= 1;
        Some(n)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<NodeId> {
        if self.left == 0 {
            return None;
        }
        let n = id(self.back)?;
        self.back = self.links[n.index()].prev;
        self.left -= 1;
        Some(n)
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(l: &Layout) -> Vec<u32> {
        l.iter().map(|n| n.0).collect()
    }

    #[test]
    fn edits_keep_the_order() {
        let mut l = Layout::default();
        for i in 0..4 {
            l.push_back(NodeId(i));
        }
        assert_eq!(ids(&l), [0, 1, 2, 3]);
        l.insert_before(NodeId(4), NodeId(0));
        l.insert_after(NodeId(5), NodeId(3));
        l.insert_after(NodeId(6), NodeId(1));
        assert_eq!(ids(&l), [4, 0, 1, 6, 2, 3, 5]);
        assert_eq!(l.position(NodeId(6)), Some(3));
        l.remove(NodeId(4));
        l.remove(NodeId(5));
        l.remove(NodeId(2));
        assert_eq!(ids(&l), [0, 1, 6, 3]);
        assert_eq!(l.as_slice(), &[NodeId(0), NodeId(1), NodeId(6), NodeId(3)]);
        assert_eq!(l.position(NodeId(3)), Some(3));
        assert_eq!(l.position(NodeId(2)), None);
        l.insert_at(NodeId(2), 2);
        l.insert_at(NodeId(7), 99);
        assert_eq!(ids(&l), [0, 1, 2, 6, 3, 7]);
        assert_eq!(
            l.iter().rev().map(|n| n.0).collect::<Vec<_>>(),
            [7, 3, 6, 2, 1, 0]
        );
        assert_eq!(l.iter().len(), 6);
        let mut m = Layout::default();
        m.set(l.as_slice());
        assert_eq!(l, m);
        m.remove(NodeId(0));
        m.remove(NodeId(7));
        assert_eq!(ids(&m), [1, 2, 6, 3]);
        assert_ne!(l, m);
    }

    #[test]
    fn sequence_numbers_follow_the_order() {
        let mut l = Layout::default();
        l.push_back(NodeId(0));
        l.push_back(NodeId(1));
        // Always inserting right after node 0 exhausts the gap and
        // renumbers; `precedes` must agree with the order throughout.
        for i in 2..200 {
            l.insert_after(NodeId(i), NodeId(0));
            let order: Vec<NodeId> = l.iter().collect();
            for w in order.windows(2) {
                assert!(l.precedes(w[0], w[1]) && !l.precedes(w[1], w[0]));
            }
        }
        for i in 200..260 {
            l.insert_before(NodeId(i), NodeId(1));
        }
        let order: Vec<NodeId> = l.iter().collect();
        assert!(order.windows(2).all(|w| l.precedes(w[0], w[1])));
        assert_eq!(order[0], NodeId(0));
        assert_eq!(order[1], NodeId(199));
        assert_eq!(*order.last().unwrap(), NodeId(1));
    }
}
