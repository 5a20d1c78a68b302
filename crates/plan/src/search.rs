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
use crate::intervals::luby;
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
/// Letters name sort keys, decreasing: `W`/`L` lifetime length, `A` area
/// (size × length), `T` the largest section total the buffer takes part
/// in, `Z` size, `S` start, `E` end, `O` number of overlapping buffers,
/// `C` number of sections spanned; `s`/`e` are start/end increasing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preorder(pub &'static str);

impl Preorder {
    /// The portfolio the restarts cycle through. MiniMalloc's own orders
    /// (total then area, area then total) plus the ones that solved the
    /// most hard instances alone in our measurements (a greedy set cover
    /// over every two- and three-letter order: `TLA` solves A, D, F, J, K;
    /// `EZ` C, D, G; `TCA` H; `TOL` E; `sZ` B). Order matters: early
    /// entries get the first, unperturbed tries.
    pub const ALL: [Preorder; 8] = [
        Preorder("TLA"),
        Preorder("EZ"),
        Preorder("TCA"),
        Preorder("sZ"),
        Preorder("TOL"),
        Preorder("TA"),
        Preorder("TL"),
        Preorder("AT"),
    ];
}

/// The problem after preprocessing: live buffers only, time compressed into
/// sections, pairwise overlaps listed.
pub struct Prepared {
    /// Index into the caller's buffer list, per live buffer.
    pub orig: Vec<usize>,
    size: Vec<u64>,
    width: Vec<u64>,
    lower: Vec<i64>,
    upper: Vec<i64>,
    sec_lo: Vec<u32>,
    sec_hi: Vec<u32>,
    overlaps: Vec<Vec<u32>>,
    sections: Vec<Vec<u32>>,
    align: u64,
    /// The least size among the buffers that overlap each buffer
    /// (`u64::MAX`: none): what lifting it raises it by at least.
    min_lift: Vec<u64>,
    /// The least of `min_lift`.
    least_lift: u64,
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
        let size: Vec<u64> = orig.iter().map(|&i| bufs[i].size).collect();
        let min_lift: Vec<u64> = overlaps
            .iter()
            .map(|o| {
                o.iter()
                    .map(|&r| size[r as usize])
                    .min()
                    .unwrap_or(u64::MAX)
            })
            .collect();
        Prepared {
            least_lift: min_lift.iter().copied().min().unwrap_or(u64::MAX),
            min_lift,
            size,
            width: orig.iter().map(|&i| bufs[i].length()).collect(),
            lower: orig.iter().map(|&i| bufs[i].lower).collect(),
            upper: orig.iter().map(|&i| bufs[i].upper).collect(),
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
        let key = |b: usize, c: char| -> i128 {
            match c {
                'W' | 'L' => self.width[b] as i128,
                'A' => self.width[b] as i128 * self.size[b] as i128,
                'T' => total[b] as i128,
                'S' => self.lower[b] as i128,
                'E' => self.upper[b] as i128,
                'O' => self.overlaps[b].len() as i128,
                'C' => (self.sec_hi[b] - self.sec_lo[b]) as i128,
                // Lower-case: the same key, increasing.
                's' => -(self.lower[b] as i128),
                'e' => -(self.upper[b] as i128),
                _ => self.size[b] as i128,
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
    /// The state hash of the unplaced buffers outside the part, which a
    /// search inside it never changes: `hash ^ outside` describes the part
    /// alone, so a part proven empty is recognised again after placements
    /// elsewhere.
    outside: u128,
}

/// Section totals with the maximum of every block of [`BLOCK`] sections,
/// so that the monotonic-floor test (`offset + total <= capacity` in every
/// section of the part) and the search for sections above a threshold
/// skip whole blocks. Flat arrays and plain loops: on MiniMalloc's
/// instances (100-200 sections) this is several times faster than the
/// recursive segment tree it replaced, and the answers are the same.
struct MaxTree {
    vals: Vec<i64>,
    block_max: Vec<i64>,
}

/// Sections per block of [`MaxTree`].
const BLOCK: usize = 16;

impl MaxTree {
    fn new(vals: &[u64]) -> MaxTree {
        let vals: Vec<i64> = vals.iter().map(|&v| v as i64).collect();
        let block_max = vals
            .chunks(BLOCK)
            .map(|c| c.iter().copied().max().unwrap_or(i64::MIN))
            .collect();
        MaxTree { vals, block_max }
    }

    /// Adds `v` to every section in `[ql, qr)`.
    fn range_add(&mut self, ql: usize, qr: usize, v: i64) {
        if ql >= qr {
            return;
        }
        for x in &mut self.vals[ql..qr] {
            *x += v;
        }
        for b in ql / BLOCK..=(qr - 1) / BLOCK {
            let hi = ((b + 1) * BLOCK).min(self.vals.len());
            self.block_max[b] = self.vals[b * BLOCK..hi]
                .iter()
                .copied()
                .max()
                .unwrap_or(i64::MIN);
        }
    }

    /// The largest total in `[ql, qr)` (`i64::MIN` when empty).
    fn max(&self, ql: usize, qr: usize) -> i64 {
        let mut m = i64::MIN;
        let mut i = ql;
        while i < qr {
            let b = i / BLOCK;
            let bend = (b + 1) * BLOCK;
            if i == b * BLOCK && bend <= qr {
                m = m.max(self.block_max[b]);
                i = bend;
            } else {
                let e = bend.min(qr);
                for &x in &self.vals[i..e] {
                    m = m.max(x);
                }
                i = e;
            }
        }
        m
    }

    /// Pushes every section in `[ql, qr)` whose total exceeds `thr`, in
    /// increasing order.
    fn above(&self, ql: usize, qr: usize, thr: i64, out: &mut Vec<u32>) {
        let mut i = ql;
        while i < qr {
            let b = i / BLOCK;
            let e = ((b + 1) * BLOCK).min(qr);
            if self.block_max[b] > thr {
                for (k, &x) in self.vals[i..e].iter().enumerate() {
                    if x > thr {
                        out.push((i + k) as u32);
                    }
                }
            }
            i = e;
        }
    }
}

/// A decision search at one capacity with one preorder.
///
/// State kept incrementally (each change trailed and undone on backtrack):
/// 1. `min_off[b]`: the highest aligned top among placed buffers that
///    overlap unplaced buffer `b` — where `b` would go next (with its
///    Zobrist key `zcur[b]`);
/// 2. `total[s]`: unplaced bytes of section `s`, also in a `MaxTree`;
/// 3. the unplaced buffers, in all and per section.
///
/// A section's floor is the least `min_off` among its unplaced buffers:
/// every placed buffer of the section overlaps them all (a section is a
/// clique), so it is also at least every placed top there (MiniMalloc's
/// section floor). A node is pruned when some section cannot hold its
/// unplaced bytes above `max(floor, offset)`. The floor is computed only
/// for the few sections the `MaxTree` reports as tight (total above
/// what a placement left room for); the offset part is one query. Buffers
/// behind the canonical position count with the height a lift gives them
/// (`behind_floors_fit`).
pub struct Searcher<'a> {
    p: &'a Prepared,
    cap: u64,
    rank: Vec<u32>,
    base_rank: Vec<u32>,
    /// The identical buffer ranked just before this one (`u32::MAX`: none).
    twin: Vec<u32>,
    off: Vec<u64>,
    /// The last solution found, per live buffer.
    pub solution: Vec<u64>,
    min_off: Vec<u64>,
    total: Vec<u64>,
    tree: MaxTree,
    cuts: Vec<u32>,
    /// Undo records of `min_off` (buffer, old value, old `zcur`).
    trail_min: Vec<(u32, u64, u128)>,
    /// `zob_of(b, min_off[b])`, kept with `min_off`.
    zcur: Vec<u128>,
    tight: Vec<u32>,
    tight_behind: Vec<u32>,
    /// The unplaced buffers (any order), and where each is in it.
    free: Vec<u32>,
    free_pos: Vec<u32>,
    /// Per section, its unplaced buffers (any order); `sec_pos[sec_base[b]
    /// + s - sec_lo[b]]` is where `b` is in section `s`'s list.
    sec_free: Vec<Vec<u32>>,
    sec_pos: Vec<u32>,
    sec_base: Vec<usize>,
    /// Scratch: the unplaced buffers of the part being searched.
    part_free: Vec<u32>,
    /// Zobrist hash of the state: every unplaced buffer with its minimum
    /// offset. Subtrees proven empty are remembered by hash (with the part
    /// and the canonical bound), since different placements below can
    /// leave the same state above.
    hash: u128,
    zob: Vec<u128>,
    failed: std::collections::HashSet<u128>,
    /// Remember failed states (see `hash`).
    pub memo: bool,
    cand: Vec<(u64, u32, u32)>,
    scratch: Vec<(u64, u64)>,
    pub nodes: u64,
    /// Per-part restarts (see `solve_part`); 0: off.
    pub part_base: u64,
    part_stop: u64,
    reshuffles: u64,
    seed: u64,
    salt: u128,
    /// Also test touched sections with the release-date stacking bound:
    /// unplaced buffers sorted by `max(min_off, offset)` and stacked must
    /// end below the capacity (exact for one machine with release dates).
    pub release_bound: bool,
    node_limit: u64,
    deadline: Option<Instant>,
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
        let rank = p.ranks(order, seed);
        // Identical buffers (same lifetime and size) are interchangeable:
        // only solutions that place them in rank order are searched.
        let mut twin = vec![u32::MAX; n];
        let mut by_key: Vec<(i64, i64, u64, u32, u32)> = (0..n)
            .map(|b| (p.lower[b], p.upper[b], p.size[b], rank[b], b as u32))
            .collect();
        by_key.sort_unstable();
        for w in by_key.windows(2) {
            if (w[0].0, w[0].1, w[0].2) == (w[1].0, w[1].1, w[1].2) {
                twin[w[1].4 as usize] = w[0].4;
            }
        }
        let mut sec_base = vec![0usize; n + 1];
        for b in 0..n {
            sec_base[b + 1] = sec_base[b] + (p.sec_hi[b] - p.sec_lo[b]) as usize;
        }
        Searcher {
            p,
            cap: 0,
            base_rank: rank.clone(),
            rank,
            twin,
            off: vec![UNPLACED; n],
            solution: vec![0; n],
            min_off: vec![0; n],
            total: vec![0; ns],
            tree: MaxTree::new(&[]),
            cuts: vec![0; ns.saturating_sub(1)],
            trail_min: Vec::new(),
            zcur: vec![0; n],
            tight: Vec::new(),
            tight_behind: Vec::new(),
            free: Vec::with_capacity(n),
            free_pos: vec![0; n],
            sec_free: vec![Vec::new(); ns],
            sec_pos: vec![0; sec_base[n]],
            sec_base,
            part_free: Vec::new(),
            hash: 0,
            zob: (0..n as u64)
                .map(|i| mix128(i.wrapping_add(0x5151)))
                .collect(),
            failed: std::collections::HashSet::new(),
            memo: true,
            cand: Vec::new(),
            scratch: Vec::new(),
            nodes: 0,
            part_base: 0,
            part_stop: u64::MAX,
            reshuffles: 0,
            seed,
            salt: 0,
            release_bound: false,
            node_limit: 0,
            deadline: None,
            ticks: 0,
            late: false,
        }
    }

    /// Searches for a placement below `cap`, visiting at most `node_limit`
    /// nodes and stopping at `deadline` if one is given.
    pub fn run(&mut self, cap: u64, node_limit: u64, deadline: Option<Instant>) -> Outcome {
        let p = self.p;
        self.cap = cap;
        self.node_limit = node_limit;
        self.deadline = deadline;
        self.nodes = 0;
        self.late = deadline.is_some_and(|d| Instant::now() > d);
        self.off.fill(UNPLACED);
        self.free.clear();
        for b in 0..p.len() {
            self.free_pos[b] = b as u32;
            self.free.push(b as u32);
        }
        for (s, m) in p.sections.iter().enumerate() {
            self.sec_free[s].clear();
            for (i, &b) in m.iter().enumerate() {
                self.sec_free[s].push(b);
                let b = b as usize;
                self.sec_pos[self.sec_base[b] + s - p.sec_lo[b] as usize] = i as u32;
            }
        }
        self.min_off.fill(0);
        self.failed.clear();
        self.hash = 0;
        for b in 0..p.len() {
            self.zcur[b] = self.zob_of(b, 0);
            self.hash ^= self.zcur[b];
        }
        self.trail_min.clear();
        self.cand.clear();
        for (s, m) in p.sections.iter().enumerate() {
            self.total[s] = m.iter().map(|&b| p.size[b as usize]).sum();
        }
        self.tree = MaxTree::new(&self.total);
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
            outside: 0,
        };
        let cutpoints: Vec<u32> = (0..self.cuts.len() as u32)
            .filter(|&i| self.cuts[i as usize] == 0)
            .map(|i| i + 1)
            .collect();
        self.rank.copy_from_slice(&self.base_rank);
        self.part_stop = u64::MAX;
        self.reshuffles = 0;
        self.salt = 0;
        let out = self.solve_split(&all, &cutpoints);
        if out == Outcome::Infeasible && self.reshuffles > 0 {
            // Parts searched under different ranks: not a proof.
            return Outcome::Aborted;
        }
        out
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
            let inside = bufs.iter().fold(0u128, |h, &b| h ^ self.zcur[b as usize]);
            let sub = Part {
                bufs,
                lo,
                hi,
                outside: self.hash ^ inside,
            };
            match self.solve_part(&sub) {
                Outcome::Found => {}
                other => return other,
            }
        }
        Outcome::Found
    }

    /// Solves one independent part. With `part_base` set, a part below
    /// the top level gets its own restarts: a node budget (Luby times
    /// `part_base` per buffer), and after each abort its buffers' ranks are
    /// lightly reshuffled. The regions of an instance fail or succeed
    /// independently, so a lucky order in one is kept while another is
    /// retried.
    fn solve_part(&mut self, part: &Part) -> Outcome {
        let top = part.lo == 0 && part.hi as usize == self.p.sections.len();
        if self.part_base == 0 || top {
            return self.search(part, 0, 0);
        }
        let outer = self.part_stop;
        let mut k = 0u64;
        loop {
            k += 1;
            let budget = self
                .part_base
                .saturating_mul(part.bufs.len() as u64)
                .saturating_mul(luby(k));
            self.part_stop = outer.min(self.nodes.saturating_add(budget));
            let out = self.search(part, 0, 0);
            self.part_stop = outer;
            if out != Outcome::Aborted
                || self.nodes > self.node_limit
                || self.nodes > outer
                || self.late
            {
                return out;
            }
            self.reshuffle(&part.bufs);
        }
    }

    /// Lightly reshuffles the ranks among `bufs` (deterministic in the
    /// searcher's seed and the number of reshuffles so far). Failed-state
    /// memos made under the old ranks no longer apply: a fresh salt hides
    /// them, and a later `Infeasible` is no longer a proof.
    fn reshuffle(&mut self, bufs: &[u32]) {
        self.reshuffles += 1;
        self.salt = mix128(self.seed ^ self.reshuffles.wrapping_mul(0xA24B_AED4_963E_E407));
        let mut by_rank: Vec<u32> = bufs.to_vec();
        by_rank.sort_unstable_by_key(|&b| self.rank[b as usize]);
        let ranks: Vec<u32> = by_rank.iter().map(|&b| self.rank[b as usize]).collect();
        let mut x = self.salt as u64 | 1;
        for i in 0..by_rank.len().saturating_sub(1) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(8) {
                by_rank.swap(i, i + 1);
            }
        }
        for (&b, &r) in by_rank.iter().zip(&ranks) {
            self.rank[b as usize] = r;
        }
    }

    /// Searches `part` for placements after `(last_off, next_rank)`: every
    /// later placement is at a higher offset, or at `last_off` with a rank
    /// of at least `next_rank` (one more than the last placed buffer's; 0
    /// when nothing of the part is placed yet).
    fn search(&mut self, part: &Part, last_off: u64, next_rank: u32) -> Outcome {
        self.nodes += 1;
        if self.nodes > self.node_limit || self.nodes > self.part_stop || self.out_of_time() {
            return Outcome::Aborted;
        }
        let p = self.p;
        let key = self.hash
            ^ part.outside
            ^ self.salt
            ^ mix128(
                (part.lo as u64) << 32
                    ^ part.hi as u64
                    ^ last_off.rotate_left(17)
                    ^ (next_rank as u64).rotate_left(47),
            );
        if self.memo && self.failed.contains(&key) {
            return Outcome::Infeasible;
        }
        // Dominance: nothing may start at or above the lowest top an
        // unplaced buffer could reach.
        // Also: a buffer below the canonical position (offset, rank)
        // cannot be placed where it is: a later buffer that overlaps it
        // must lift it, placed at or above `last_off` and below the
        // buffer's top (else the dominance rule ends the branch). None: a
        // dead end.
        let mut bufs = std::mem::take(&mut self.part_free);
        bufs.clear();
        if part.bufs.len() > self.free.len() {
            // Fewer unplaced buffers in all than in the part: those of
            // the part are the ones confined to its sections.
            bufs.extend(
                self.free.iter().copied().filter(|&b| {
                    p.sec_lo[b as usize] >= part.lo && p.sec_hi[b as usize] <= part.hi
                }),
            );
        } else {
            bufs.extend(
                part.bufs
                    .iter()
                    .copied()
                    .filter(|&b| self.off[b as usize] == UNPLACED),
            );
        }
        let mut min_height = u64::MAX;
        let mut stuck = false;
        for &b in &bufs {
            let bu = b as usize;
            let m = self.min_off[bu];
            let top = m + p.size[bu];
            min_height = min_height.min(top);
            if stuck || m > last_off || (m == last_off && self.rank[bu] >= next_rank) {
                continue;
            }
            stuck = !p.overlaps[bu].iter().any(|&r| {
                let r = r as usize;
                let o = self.min_off[r].max(last_off);
                self.off[r] == UNPLACED
                    && o < top
                    && align_up(o + p.size[r], p.align) + p.size[bu] <= self.cap
            });
        }
        if min_height == u64::MAX {
            self.part_free = bufs;
            return Outcome::Found;
        }
        if stuck || !self.behind_floors_fit(part, last_off, next_rank) {
            self.part_free = bufs;
            if self.memo && self.failed.len() < 1 << 20 {
                self.failed.insert(key);
            }
            return Outcome::Infeasible;
        }
        let base = self.cand.len();
        for &b in &bufs {
            let bu = b as usize;
            let o = self.min_off[bu];
            let rk = self.rank[bu];
            // Canonical: (offset, rank) increases along a branch.
            let tw = self.twin[bu];
            if o < min_height
                && (o > last_off || (o == last_off && rk >= next_rank))
                && (tw == u32::MAX || self.off[tw as usize] != UNPLACED)
                && o + p.size[bu] <= self.cap
            {
                self.cand.push((o, rk, b));
            }
        }
        self.part_free = bufs;
        let end = self.cand.len();
        self.cand[base..end].sort_unstable();
        // Pre-checks, before touching any state. After placing `b` at `o`
        // every section of the part must hold its unplaced bytes above
        // `o`; in b's own sections above b's aligned top. Totals only
        // shrink by b's size in b's sections, so:
        // 1. the largest total of the part must fit above `o` (and `o`
        //    only grows along the candidate list: a failure ends the loop);
        // 2. b's sections must fit their other bytes above b's top.
        let cap = self.cap as i64;
        let part_max = self.tree.max(part.lo as usize, part.hi as usize);
        for i in base..end {
            let (o, rk, b) = self.cand[i];
            let bu = b as usize;
            if part_max > cap - o as i64 {
                break;
            }
            // (A section holding only b needs just b's unaligned top to
            // fit, which the candidate test checked.)
            let size = p.size[bu] as i64;
            let lift = align_up(o + p.size[bu], p.align) as i64 - size;
            let own_max = self.tree.max(p.sec_lo[bu] as usize, p.sec_hi[bu] as usize);
            if own_max > size && own_max > cap - lift {
                continue;
            }
            let tm = self.trail_min.len();
            let saved = self.hash;
            let ok = self.place(bu, o);
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
                    self.search(part, o, rk + 1)
                } else {
                    self.solve_split(part, &cps)
                };
                for i in p.sec_lo[bu]..p.sec_hi[bu].saturating_sub(1) {
                    self.cuts[i as usize] += 1;
                }
            }
            self.unplace(bu, tm);
            self.hash = saved;
            if out != Outcome::Infeasible {
                self.cand.truncate(base);
                return out;
            }
        }
        self.cand.truncate(base);
        if self.memo && self.failed.len() < 1 << 20 {
            self.failed.insert(key);
        }
        Outcome::Infeasible
    }

    /// Section inference with the canonical order: an unplaced buffer
    /// *behind* `(last_off, next_rank)` (lower minimum offset, or the same
    /// with a lower rank) cannot be placed where it is; a later placement
    /// at or above `last_off` must lift it, so it ends at least
    /// `last_off + min_lift` high. A section's floor is the least such
    /// bound over its unplaced buffers (their minimum offset for the
    /// others), and its unplaced bytes must fit above it. Only sections
    /// with less than `least_lift` to spare above `last_off` can fail.
    fn behind_floors_fit(&mut self, part: &Part, last_off: u64, next_rank: u32) -> bool {
        let p = self.p;
        let thr = self.cap as i64 - last_off.saturating_add(p.least_lift).min(self.cap) as i64;
        self.tight_behind.clear();
        self.tree.above(
            part.lo as usize,
            part.hi as usize,
            thr,
            &mut self.tight_behind,
        );
        for k in 0..self.tight_behind.len() {
            let s = self.tight_behind[k] as usize;
            let room = self.cap - self.total[s];
            let fits = self.sec_free[s].iter().any(|&q| {
                let q = q as usize;
                let m = self.min_off[q];
                let floor = if m > last_off || (m == last_off && self.rank[q] >= next_rank) {
                    m
                } else {
                    align_up(last_off.saturating_add(p.min_lift[q]), p.align)
                };
                floor <= room
            });
            if !fits {
                return false;
            }
        }
        true
    }

    fn zob_of(&self, b: usize, min_off: u64) -> u128 {
        mix128(self.zob[b] as u64 ^ min_off.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ self.zob[b]
    }

    /// Reads the clock every 64 calls.
    fn out_of_time(&mut self) -> bool {
        let Some(d) = self.deadline else {
            return false;
        };
        self.ticks += 1;
        if self.ticks & 63 == 0 {
            self.late = Instant::now() > d;
        }
        self.late
    }

    /// Places `b` at `o`, raises the minimum offsets of the buffers it
    /// overlaps, and checks section inference (see the type's docs).
    fn place(&mut self, b: usize, o: u64) -> bool {
        let p = self.p;
        self.off[b] = o;
        self.solution[b] = o;
        self.take_free(b);
        self.hash ^= self.zcur[b];
        let size = p.size[b];
        let raised = align_up(o + size, p.align);
        let (blo, bhi) = (p.sec_lo[b] as usize, p.sec_hi[b] as usize);
        for s in blo..bhi {
            self.total[s] -= size;
        }
        self.tree.range_add(blo, bhi, -(size as i64));
        // Raise the buffers b overlaps; their sections span [ulo, uhi).
        // `high`: the highest minimum offset among them afterwards.
        let (mut ulo, mut uhi) = (blo, bhi);
        let mut high = raised;
        for &q in &p.overlaps[b] {
            let qu = q as usize;
            if self.off[qu] != UNPLACED {
                continue;
            }
            let m = self.min_off[qu];
            if m < raised {
                let z = self.zob_of(qu, raised);
                self.trail_min.push((q, m, self.zcur[qu]));
                self.hash ^= self.zcur[qu] ^ z;
                self.zcur[qu] = z;
                self.min_off[qu] = raised;
                ulo = ulo.min(p.sec_lo[qu] as usize);
                uhi = uhi.max(p.sec_hi[qu] as usize);
            } else {
                high = high.max(m);
            }
        }
        // The pre-checks in `search` covered the offset floor and b's own
        // sections at b's top. Which sections can fail now, given that a
        // section's floor is the least minimum offset of its unplaced
        // buffers:
        // 1. outside b's sections, only where a buffer was raised, and
        //    only if the total exceeds `cap - raised` (the raised buffer
        //    keeps the floor at most `raised`);
        // 2. in b's sections every unplaced buffer overlaps b, so the floor
        //    is at most `high`: only totals above `cap - high`.
        // The exact floor is computed for these few tight sections only.
        let cap = self.cap as i64;
        self.tight.clear();
        let thr = cap - raised.min(self.cap) as i64;
        self.tree.above(ulo, blo, thr, &mut self.tight);
        self.tree.above(bhi, uhi, thr, &mut self.tight);
        self.tree
            .above(blo, bhi, cap - high.min(self.cap) as i64, &mut self.tight);
        for k in 0..self.tight.len() {
            let s = self.tight[k] as usize;
            // The section fits iff some unplaced buffer may start low
            // enough: stop at the first one.
            let room = self.cap - self.total[s];
            let fits = self.sec_free[s]
                .iter()
                .any(|&q| self.min_off[q as usize] <= room);
            if !fits {
                return false;
            }
            if self.release_bound && !self.stacks(s, o) {
                return false;
            }
        }
        true
    }

    /// The release-date bound of section `s`: its unplaced buffers, each at
    /// or above `max(min_off, floor)`, stacked in release order.
    fn stacks(&mut self, s: usize, floor: u64) -> bool {
        let p = self.p;
        self.scratch.clear();
        for &q in &p.sections[s] {
            let q = q as usize;
            if self.off[q] == UNPLACED {
                self.scratch.push((self.min_off[q].max(floor), p.size[q]));
            }
        }
        self.scratch.sort_unstable();
        let mut t = 0u64;
        for &(r, z) in &self.scratch {
            t = t.max(r) + z;
        }
        t <= self.cap
    }

    fn unplace(&mut self, b: usize, tm: usize) {
        let p = self.p;
        while self.trail_min.len() > tm {
            let (q, m, z) = self.trail_min.pop().expect("len checked");
            self.zcur[q as usize] = z;
            self.min_off[q as usize] = m;
        }
        let size = p.size[b];
        for s in p.sec_lo[b]..p.sec_hi[b] {
            self.total[s as usize] += size;
        }
        self.tree
            .range_add(p.sec_lo[b] as usize, p.sec_hi[b] as usize, size as i64);
        self.off[b] = UNPLACED;
        self.put_free(b);
    }

    /// Removes `b` from the unplaced lists.
    fn take_free(&mut self, b: usize) {
        let p = self.p;
        let i = self.free_pos[b] as usize;
        self.free.swap_remove(i);
        if let Some(&m) = self.free.get(i) {
            self.free_pos[m as usize] = i as u32;
        }
        let lo = p.sec_lo[b] as usize;
        for s in lo..p.sec_hi[b] as usize {
            let i = self.sec_pos[self.sec_base[b] + s - lo] as usize;
            let list = &mut self.sec_free[s];
            list.swap_remove(i);
            if let Some(&m) = list.get(i) {
                let m = m as usize;
                self.sec_pos[self.sec_base[m] + s - p.sec_lo[m] as usize] = i as u32;
            }
        }
    }

    /// Puts `b` back into the unplaced lists.
    fn put_free(&mut self, b: usize) {
        let p = self.p;
        self.free_pos[b] = self.free.len() as u32;
        self.free.push(b as u32);
        let lo = p.sec_lo[b] as usize;
        for s in lo..p.sec_hi[b] as usize {
            self.sec_pos[self.sec_base[b] + s - lo] = self.sec_free[s].len() as u32;
            self.sec_free[s].push(b as u32);
        }
    }
}

/// A 128-bit mix of `x` (two rounds of splitmix64).
fn mix128(x: u64) -> u128 {
    let f = |mut z: u64| {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let a = f(x);
    ((a as u128) << 64) | f(a ^ 0xD6E8_FEB8_6659_FD93) as u128
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Whether some offsets (multiples of `align`) below `cap` fit every
    /// buffer (exhaustive).
    fn fits_brute(bufs: &[Buffer], cap: u64, align: u64) -> bool {
        fn go(bufs: &[Buffer], cap: u64, align: u64, offs: &mut Vec<u64>) -> bool {
            let i = offs.len();
            if i == bufs.len() {
                return true;
            }
            let b = &bufs[i];
            if b.size > cap {
                return false;
            }
            for o in (0..=cap - b.size).step_by(align as usize) {
                let clash = offs.iter().zip(bufs).any(|(&q, c)| {
                    c.lower < b.upper && b.lower < c.upper && q < o + b.size && o < q + c.size
                });
                if !clash {
                    offs.push(o);
                    if go(bufs, cap, align, offs) {
                        return true;
                    }
                    offs.pop();
                }
            }
            false
        }
        go(bufs, cap, align, &mut Vec::new())
    }

    #[test]
    fn a_lone_buffer_fits_its_size() {
        // The first buffer of the order may start at 0.
        let bufs = [Buffer::new(0, 0, 2, 3)];
        let p = Prepared::new(&bufs, 1);
        for order in Preorder::ALL {
            assert_eq!(Searcher::new(&p, order).run(3, 1000, None), Outcome::Found);
        }
    }

    #[test]
    fn agrees_with_exhaustive_search() {
        // Small random instances: the search finds a placement exactly
        // when one exists, for every order, and its placements are valid.
        let mut x = 0x1234_5678_9ABC_DEF1u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..300 {
            let n = 1 + next(6) as usize;
            let bufs: Vec<Buffer> = (0..n)
                .map(|i| {
                    let lo = next(5) as i64;
                    Buffer::new(i as u64, lo, lo + 1 + next(4) as i64, 1 + next(4))
                })
                .collect();
            let align = 1 + next(2);
            let p = Prepared::new(&bufs, align);
            let lb = crate::buffer::lower_bound(&bufs);
            for cap in lb..lb + 3 {
                let want = fits_brute(&bufs, cap, align);
                for (k, order) in Preorder::ALL.into_iter().enumerate() {
                    let mut s = Searcher::with_seed(&p, order, k as u64 % 3);
                    let out = s.run(cap, 1 << 20, None);
                    assert_eq!(
                        out == Outcome::Found,
                        want,
                        "{bufs:?} cap {cap} align {align} {order:?}"
                    );
                    if out == Outcome::Found {
                        let mut offs = vec![0; n];
                        for (k, &i) in p.orig.iter().enumerate() {
                            offs[i] = s.solution[k];
                        }
                        crate::check_plan(&bufs, &offs, cap, align, &[])
                            .unwrap_or_else(|e| panic!("{bufs:?} cap {cap}: {e:?}"));
                    }
                }
            }
        }
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
        assert_eq!(s.run(3, 1 << 20, None), Outcome::Found);
        assert_eq!(s.run(2, 1 << 20, None), Outcome::Infeasible);
    }
}
