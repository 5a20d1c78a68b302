//! Exact offset assignment by depth-first search over canonical solutions,
//! after MiniMalloc (Moffitt, "MiniMalloc: A Lightweight Memory Allocator
//! for Hardware-Accelerated Machine Learning", ASPLOS 2023). Our own code;
//! the ideas it uses:
//!
//! 1. **Canonical solutions.** Push every buffer of a solution down until it
//!    rests on a buffer that overlaps it in time (or on 0): the result is
//!    still a solution, and each buffer's offset is the top of some buffer.
//!    Listing the buffers by `(offset, rank)` gives a unique sequence, so the
//!    search places buffers in that order only: each at its *minimum
//!    offset* (the highest top among placed buffers overlapping it), never
//!    below the previous placement, ties broken by a static rank.
//! 2. **Dominance.** Placing a buffer at or above the lowest *top* any
//!    unplaced buffer could reach leaves a gap that buffer could fill: skip.
//! 3. **Section inference.** Time is cut into sections (maximal sets of
//!    buffers alive together). In a section, the unplaced buffers stack
//!    above `max(floor, current offset)`, so `floor + unplaced sizes` must
//!    fit the capacity. The floor also rises to the lowest minimum offset of
//!    the section's unplaced buffers.
//! 4. **Decomposition.** When no unplaced buffer crosses a section boundary,
//!    the two sides are independent: solve them one after the other, and a
//!    side that fails fails the node (no re-search of the other side).
//!
//! The search answers a decision question (does everything fit below
//! `capacity`?) under a node limit and a deadline; the driver in
//! [`crate::intervals`] asks it at the lower bound and bisects above it.

use crate::buffer::{align_up, Buffer};
use std::time::Instant;

const UNPLACED: u64 = u64::MAX;

/// How a decision search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything fits; the offsets are in the searcher's solution.
    Found,
    /// Proven impossible at this capacity.
    Infeasible,
    /// Node limit or deadline hit first.
    Aborted,
}

/// A static buffer order used to break ties among equal minimum offsets.
/// Letters name sort keys, all decreasing: `W` lifetime width, `A` area,
/// `T` the largest section total the buffer takes part in, `Z` size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preorder(pub &'static str);

impl Preorder {
    /// The orders tried in turn (MiniMalloc's three, then size-first).
    pub const ALL: [Preorder; 5] = [
        Preorder("TWA"),
        Preorder("WAT"),
        Preorder("TAW"),
        Preorder("AWT"),
        Preorder("ZWT"),
    ];
}

/// The problem after preprocessing: live buffers only, time compressed into
/// sections, pairwise overlaps listed.
pub struct Prepared {
    /// Index into the caller's buffer list, per live buffer.
    pub orig: Vec<usize>,
    size: Vec<u64>,
    width: Vec<u64>,
    sec_lo: Vec<u32>,
    sec_hi: Vec<u32>,
    overlaps: Vec<Vec<u32>>,
    sections: Vec<Vec<u32>>,
    align: u64,
}

impl Prepared {
    pub fn new(bufs: &[Buffer], align: u64) -> Prepared {
        let orig: Vec<usize> = (0..bufs.len()).filter(|&i| bufs[i].is_live()).collect();
        let n = orig.len();
        // Sweep: (time, 0 = end / 1 = start, buffer). Ends first: half-open.
        let mut pts: Vec<(i64, u8, u32)> = Vec::with_capacity(2 * n);
        for (k, &i) in orig.iter().enumerate() {
            pts.push((bufs[i].lower, 1, k as u32));
            pts.push((bufs[i].upper, 0, k as u32));
        }
        pts.sort_unstable();
        let mut sections: Vec<Vec<u32>> = Vec::new();
        let mut active: Vec<u32> = Vec::new();
        let mut pos = vec![usize::MAX; n];
        let mut sec_lo = vec![0u32; n];
        let mut sec_hi = vec![0u32; n];
        let mut overlaps: Vec<Vec<u32>> = vec![Vec::new(); n];
        // A section is a maximal clique: snapshot the live set at the first
        // end after some start.
        let mut started = false;
        for &(_, kind, k) in &pts {
            let k = k as usize;
            if kind == 0 {
                if started {
                    sections.push(active.clone());
                    started = false;
                }
                sec_hi[k] = sections.len() as u32;
                let p = pos[k];
                active.swap_remove(p);
                if p < active.len() {
                    pos[active[p] as usize] = p;
                }
            } else {
                for &o in &active {
                    overlaps[o as usize].push(k as u32);
                    overlaps[k].push(o);
                }
                started = true;
                sec_lo[k] = sections.len() as u32;
                pos[k] = active.len();
                active.push(k as u32);
            }
        }
        for s in &mut sections {
            s.sort_unstable();
        }
        for o in &mut overlaps {
            o.sort_unstable();
        }
        Prepared {
            size: orig.iter().map(|&i| bufs[i].size).collect(),
            width: orig.iter().map(|&i| bufs[i].length()).collect(),
            orig,
            sec_lo,
            sec_hi,
            overlaps,
            sections,
            align: align.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.orig.len()
    }

    /// Size of live buffer `k`.
    pub fn size_of(&self, k: usize) -> u64 {
        self.size[k]
    }

    pub fn is_empty(&self) -> bool {
        self.orig.is_empty()
    }

    /// Static ranks (0 = first) of the live buffers under `order`.
    fn ranks(&self, order: Preorder, seed: u64) -> Vec<u32> {
        let n = self.len();
        let mut sec_total = vec![0u64; self.sections.len()];
        for (s, m) in self.sections.iter().enumerate() {
            sec_total[s] = m.iter().map(|&b| self.size[b as usize]).sum();
        }
        let total: Vec<u64> = (0..n)
            .map(|b| {
                (self.sec_lo[b]..self.sec_hi[b])
                    .map(|s| sec_total[s as usize])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let key = |b: usize, c: char| -> u128 {
            match c {
                'W' => self.width[b] as u128,
                'A' => self.width[b] as u128 * self.size[b] as u128,
                'T' => total[b] as u128,
                _ => self.size[b] as u128,
            }
        };
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| {
            for c in order.0.chars() {
                let o = key(b, c).cmp(&key(a, c));
                if o.is_ne() {
                    return o;
                }
            }
            a.cmp(&b)
        });
        if seed != 0 {
            // Diversify restarts: swap neighbours with probability 1/8.
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for i in 0..n.saturating_sub(1) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(8) {
                    idx.swap(i, i + 1);
                }
            }
        }
        let mut rank = vec![0u32; n];
        for (r, &b) in idx.iter().enumerate() {
            rank[b] = r as u32;
        }
        rank
    }
}

/// One sub-problem: unplaced buffers confined to sections `[lo, hi)`.
struct Part {
    bufs: Vec<u32>,
    lo: u32,
    hi: u32,
}

/// A decision search at one capacity with one preorder.
pub struct Searcher<'a> {
    p: &'a Prepared,
    cap: u64,
    rank: Vec<u32>,
    off: Vec<u64>,
    /// The last solution found, per live buffer.
    pub solution: Vec<u64>,
    min_off: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    cuts: Vec<u32>,
    trail_min: Vec<(u32, u64)>,
    trail_floor: Vec<(u32, u64)>,
    mark: Vec<bool>,
    pub nodes: u64,
    /// Raise section floors to their unplaced buffers' lowest minimum offset.
    pub unalloc_floor: bool,
    /// Check each changed section with the release-time stacking bound.
    pub release_bound: bool,
    node_limit: u64,
    deadline: Instant,
    ticks: u64,
    late: bool,
}

impl<'a> Searcher<'a> {
    pub fn new(p: &'a Prepared, order: Preorder) -> Searcher<'a> {
        Searcher::with_seed(p, order, 0)
    }

    /// A searcher whose static order is `order` lightly shuffled by `seed`
    /// (0: not shuffled).
    pub fn with_seed(p: &'a Prepared, order: Preorder, seed: u64) -> Searcher<'a> {
        let n = p.len();
        let ns = p.sections.len();
        Searcher {
            p,
            cap: 0,
            rank: p.ranks(order, seed),
            off: vec![UNPLACED; n],
            solution: vec![0; n],
            min_off: vec![0; n],
            floor: vec![0; ns],
            total: vec![0; ns],
            cuts: vec![0; ns.saturating_sub(1)],
            trail_min: Vec::new(),
            trail_floor: Vec::new(),
            mark: vec![false; ns],
            nodes: 0,
            unalloc_floor: true,
            release_bound: false,
            node_limit: 0,
            deadline: Instant::now(),
            ticks: 0,
            late: false,
        }
    }

    /// Searches for a placement below `cap`.
    pub fn run(&mut self, cap: u64, node_limit: u64, deadline: Instant) -> Outcome {
        let p = self.p;
        self.cap = cap;
        self.node_limit = node_limit;
        self.deadline = deadline;
        self.nodes = 0;
        self.late = Instant::now() > deadline;
        self.off.fill(UNPLACED);
        self.min_off.fill(0);
        self.floor.fill(0);
        for (s, m) in p.sections.iter().enumerate() {
            self.total[s] = m.iter().map(|&b| p.size[b as usize]).sum();
        }
        self.cuts.fill(0);
        for b in 0..p.len() {
            if p.size[b] > cap {
                return Outcome::Infeasible;
            }
            for i in p.sec_lo[b]..p.sec_hi[b].saturating_sub(1) {
                self.cuts[i as usize] += 1;
            }
        }
        if self.total.iter().any(|&t| t > cap) {
            return Outcome::Infeasible;
        }
        let all = Part {
            bufs: (0..p.len() as u32).collect(),
            lo: 0,
            hi: p.sections.len() as u32,
        };
        let cutpoints: Vec<u32> = (0..self.cuts.len() as u32)
            .filter(|&i| self.cuts[i as usize] == 0)
            .map(|i| i + 1)
            .collect();
        self.solve_split(&all, &cutpoints)
    }

    /// Solves the pieces of `part` between `cutpoints` one by one.
    fn solve_split(&mut self, part: &Part, cutpoints: &[u32]) -> Outcome {
        let mut bounds = Vec::with_capacity(cutpoints.len() + 2);
        bounds.push(part.lo);
        bounds.extend_from_slice(cutpoints);
        bounds.push(part.hi);
        for w in bounds.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let bufs: Vec<u32> = part
                .bufs
                .iter()
                .copied()
                .filter(|&b| {
                    self.off[b as usize] == UNPLACED
                        && self.p.sec_lo[b as usize] >= lo
                        && self.p.sec_hi[b as usize] <= hi
                })
                .collect();
            if bufs.is_empty() {
                continue;
            }
            let sub = Part { bufs, lo, hi };
            match self.search(&sub, 0, 0) {
                Outcome::Found => {}
                other => return other,
            }
        }
        Outcome::Found
    }

    fn search(&mut self, part: &Part, last_off: u64, last_rank: u32) -> Outcome {
        self.nodes += 1;
        if self.nodes > self.node_limit || self.out_of_time() {
            return Outcome::Aborted;
        }
        let p = self.p;
        let mut order: Vec<(u64, u32, u32)> = part
            .bufs
            .iter()
            .filter(|&&b| self.off[b as usize] == UNPLACED)
            .map(|&b| (self.min_off[b as usize], self.rank[b as usize], b))
            .collect();
        if order.is_empty() {
            return Outcome::Found;
        }
        order.sort_unstable();
        let min_height = order
            .iter()
            .map(|&(o, _, b)| o + p.size[b as usize])
            .min()
            .unwrap_or(u64::MAX);
        for &(o, rk, b) in &order {
            if o >= min_height {
                break; // dominance: everything from here leaves a gap
            }
            if o < last_off || (o == last_off && rk < last_rank) {
                continue; // not canonical
            }
            let bu = b as usize;
            if o + p.size[bu] > self.cap {
                continue;
            }
            if self.out_of_time() {
                return Outcome::Aborted;
            }
            let (tm, tf) = (self.trail_min.len(), self.trail_floor.len());
            let ok = self.place(part, bu, o);
            let mut out = Outcome::Infeasible;
            if ok {
                // Cut points inside this part that the placement opened.
                let mut cps: Vec<u32> = Vec::new();
                for i in p.sec_lo[bu]..p.sec_hi[bu].saturating_sub(1) {
                    let c = &mut self.cuts[i as usize];
                    *c -= 1;
                    if *c == 0 && i + 1 > part.lo && i + 1 < part.hi {
                        cps.push(i + 1);
                    }
                }
                out = if cps.is_empty() {
                    self.search(part, o, rk)
                } else {
                    self.solve_split(part, &cps)
                };
                for i in p.sec_lo[bu]..p.sec_hi[bu].saturating_sub(1) {
                    self.cuts[i as usize] += 1;
                }
            }
            self.unplace(bu, tm, tf);
            if out != Outcome::Infeasible {
                return out;
            }
        }
        Outcome::Infeasible
    }

    /// Reads the clock every 64 calls.
    fn out_of_time(&mut self) -> bool {
        self.ticks += 1;
        if self.ticks & 63 == 0 {
            self.late = Instant::now() > self.deadline;
        }
        self.late
    }

    /// Places `b` at `o`, updates bounds, and checks section inference.
    fn place(&mut self, part: &Part, b: usize, o: u64) -> bool {
        let p = self.p;
        self.off[b] = o;
        self.solution[b] = o;
        let top = o + p.size[b];
        let raised = align_up(top, p.align);
        let mut affected: Vec<u32> = Vec::new();
        for &q in &p.overlaps[b] {
            let q = q as usize;
            if self.off[q] == UNPLACED && self.min_off[q] < raised {
                self.trail_min.push((q as u32, self.min_off[q]));
                self.min_off[q] = raised;
                if !self.unalloc_floor {
                    continue;
                }
                for s in p.sec_lo[q]..p.sec_hi[q] {
                    if !self.mark[s as usize] {
                        self.mark[s as usize] = true;
                        affected.push(s);
                    }
                }
            }
        }
        for s in p.sec_lo[b]..p.sec_hi[b] {
            let s = s as usize;
            self.trail_floor.push((s as u32, self.floor[s]));
            self.floor[s] = self.floor[s].max(top);
            self.total[s] -= p.size[b];
        }
        for &s in &affected {
            let s = s as usize;
            self.mark[s] = false;
            // The floor can only rise to the lowest minimum offset of the
            // section's unplaced buffers; a raised buffer now sits at
            // `raised`, so sections already that high cannot change, and
            // one unplaced buffer at or below the floor ends the scan.
            let f = self.floor[s];
            if f >= raised {
                continue;
            }
            let mut lowest = u64::MAX;
            for &q in &p.sections[s] {
                let q = q as usize;
                if self.off[q] == UNPLACED {
                    let m = self.min_off[q];
                    if m <= f {
                        lowest = u64::MAX;
                        break;
                    }
                    lowest = lowest.min(m);
                }
            }
            if lowest != u64::MAX {
                self.trail_floor.push((s as u32, f));
                self.floor[s] = lowest;
            }
        }
        if self.release_bound {
            let mut rs: Vec<(u64, u64)> = Vec::new();
            for &s in &affected {
                rs.clear();
                rs.extend(
                    p.sections[s as usize]
                        .iter()
                        .filter(|&&q| self.off[q as usize] == UNPLACED)
                        .map(|&q| (self.min_off[q as usize].max(o), p.size[q as usize])),
                );
                rs.sort_unstable();
                let mut t = 0u64;
                for &(r, z) in &rs {
                    t = t.max(r) + z;
                }
                if t > self.cap {
                    return false;
                }
            }
        }
        (part.lo..part.hi).all(|s| {
            let s = s as usize;
            self.total[s] == 0 || self.floor[s].max(o).saturating_add(self.total[s]) <= self.cap
        })
    }

    fn unplace(&mut self, b: usize, tm: usize, tf: usize) {
        let p = self.p;
        while self.trail_floor.len() > tf {
            let (s, f) = self.trail_floor.pop().expect("len checked");
            self.floor[s as usize] = f;
        }
        while self.trail_min.len() > tm {
            let (q, m) = self.trail_min.pop().expect("len checked");
            self.min_off[q as usize] = m;
        }
        for s in p.sec_lo[b]..p.sec_hi[b] {
            self.total[s as usize] += p.size[b];
        }
        self.off[b] = UNPLACED;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sections_are_cliques() {
        // 0:[0,4) 1:[1,2) 2:[3,5): cliques {0,1} and {0,2}.
        let bufs = [
            Buffer::new(0, 0, 4, 1),
            Buffer::new(1, 1, 2, 1),
            Buffer::new(2, 3, 5, 1),
        ];
        let p = Prepared::new(&bufs, 1);
        assert_eq!(p.sections, vec![vec![0, 1], vec![0, 2]]);
        assert_eq!(
            (p.sec_lo.clone(), p.sec_hi.clone()),
            (vec![0, 0, 1], vec![2, 1, 2])
        );
        assert_eq!(p.overlaps[0], vec![1, 2]);
    }

    #[test]
    fn finds_a_tight_packing() {
        // A staircase that greedy-by-size packs badly at capacity 3.
        let bufs = [
            Buffer::new(0, 0, 2, 2),
            Buffer::new(1, 1, 3, 1),
            Buffer::new(2, 2, 4, 2),
            Buffer::new(3, 0, 1, 1),
            Buffer::new(4, 3, 4, 1),
        ];
        let p = Prepared::new(&bufs, 1);
        let mut s = Searcher::new(&p, Preorder::ALL[0]);
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(s.run(3, 1 << 20, deadline), Outcome::Found);
        assert_eq!(s.run(2, 1 << 20, deadline), Outcome::Infeasible);
    }
}
