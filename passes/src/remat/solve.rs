//! Choosing the drop set: four strategies over one [`Problem`], all scored
//! by its simulator ([`Problem::simulate`]): the least extra FLOPs whose
//! simulated peak fits the budget.
//!
//! - `optimal`: depth-first branch-and-bound over the candidates (largest
//!   saved bytes first, "keep" tried before "drop"), pruned by the FLOPs of
//!   the best drop set found (the `fast` answer to start with) and by
//!   [`super::sim::LowerBound`]: a partial choice whose bound already
//!   exceeds the budget is cut. Exact for the simulator's model (one copy
//!   per dropped node, placed before its first backward reader) when it
//!   finishes within the time limit ([`Solution::proven_optimal`]);
//!   otherwise the best found.
//! - `fast`: rank candidates by saved bytes per FLOP of recomputation
//!   (pointwise ops first, then the products with the smallest inner
//!   dimension); walk the ranking, dropping each candidate (with the views
//!   of its outputs) when that lowers the simulated (peak, memory × time),
//!   until the budget holds; then un-drop the costliest dropped nodes one
//!   by one while the budget still holds. The `sqrt` and `per-block` drop
//!   sets that fit are refined the same way; the cheapest answer wins.
//!   `O(k)` simulations per walk and per refinement.
//! - `sqrt` (Chen et al. 2016): the forward pass's articulation values
//!   (cut points: the only activation crossing that step) are the
//!   possible checkpoints; keep every `s`-th one, drop every other
//!   candidate. `s = round(sqrt(cuts))` unless another stride fits the
//!   budget and that one does not.
//! - `per-block`: the cut points grouped into the blocks that repeat (the
//!   op-type sequence between cuts, with the period, up to 24 segments,
//!   that matches most),
//!   one checkpoint per block boundary (every `e`-th boundary when one per
//!   block does not fit), everything inside the blocks dropped; what lies
//!   outside the repeated blocks (embeddings, head) is kept, as with
//!   `torch.utils.checkpoint` around each layer.
//! - `auto`: `optimal` up to [`AUTO_OPTIMAL_MAX`] candidates, else `fast`.

use super::sim::{Problem, Simulated};
use std::time::{Duration, Instant};

/// Candidates up to which `auto` runs the exact solver.
pub const AUTO_OPTIMAL_MAX: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    Auto,
    Optimal,
    Fast,
    Sqrt,
    PerBlock,
}

impl Strategy {
    pub fn parse(s: &str) -> Option<Strategy> {
        Some(match s {
            "auto" => Strategy::Auto,
            "optimal" => Strategy::Optimal,
            "fast" => Strategy::Fast,
            "sqrt" => Strategy::Sqrt,
            "per-block" | "per_block" => Strategy::PerBlock,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Auto => "auto",
            Strategy::Optimal => "optimal",
            Strategy::Fast => "fast",
            Strategy::Sqrt => "sqrt",
            Strategy::PerBlock => "per-block",
        }
    }

    pub const ALL: [Strategy; 5] = [
        Strategy::Auto,
        Strategy::Optimal,
        Strategy::Fast,
        Strategy::Sqrt,
        Strategy::PerBlock,
    ];
}

/// A chosen drop set.
#[derive(Clone, Debug)]
pub struct Solution {
    /// By position in [`Problem::order`].
    pub drop: Vec<bool>,
    pub sim: Simulated,
    /// The strategy that produced it (`auto` resolved).
    pub strategy: Strategy,
    /// `optimal` finished its search.
    pub proven_optimal: bool,
}

/// The best drop set of `strategy` whose simulated peak is at most
/// `budget`; `None` when the strategy has none.
pub fn solve(p: &Problem, strategy: Strategy, budget: u64, limit: Duration) -> Option<Solution> {
    let deadline = Instant::now() + limit;
    match strategy {
        Strategy::Auto => {
            if p.candidates.len() <= AUTO_OPTIMAL_MAX {
                solve(p, Strategy::Optimal, budget, limit)
            } else {
                solve(p, Strategy::Fast, budget, limit)
            }
        }
        Strategy::Fast => fast(p, budget, deadline),
        // A margin for the seed and the last steps between clock checks.
        Strategy::Optimal => optimal(p, budget, Instant::now() + limit.mul_f64(0.9)),
        Strategy::Sqrt => best_of(p, Strategy::Sqrt, sqrt_family(p), budget),
        Strategy::PerBlock => best_of(p, Strategy::PerBlock, per_block_family(p), budget),
    }
}

/// The drop set that costs almost nothing: elementwise candidates whose
/// non-weight inputs the backward pass keeps anyway (read by a backward
/// node from a node that is not dropped), or that are themselves outputs
/// of such dropped nodes. Recomputing them repeats a few cheap
/// elementwise ops from values that stay alive regardless, so their own
/// bytes are no longer held from the forward into the backward pass.
/// This is the policy PyTorch's min-cut partitioner applies by default to
/// pointwise ops; on a decomposed GELU, `x·½·(1 + erf(x/√2))`, only `x`
/// stays saved, as with torch's fused GELU.
pub fn pointwise_from_saved(p: &Problem) -> Vec<bool> {
    let n = p.len();
    // Elementwise forward nodes that may be recomputed at all.
    let recomputable: Vec<bool> = {
        let mut r = vec![false; n];
        for &i in p.candidates.iter().chain(&p.followers) {
            r[i] = p.nodes[i].elementwise;
        }
        r
    };
    let mut inc = recomputable.clone();
    let read_by_backward = |k: usize| p.vals[k].readers.iter().any(|&r| !p.nodes[r].forward);
    // A weight: no producer and no arena bytes (initializers that are not
    // graph inputs). Graph inputs count like computed values: recomputing
    // from one the backward pass does not read would extend its life.
    let weight = |k: usize| p.vals[k].producer.is_none() && p.vals[k].size == 0;
    loop {
        let mut changed = false;
        for i in 0..n {
            if !inc[i] {
                continue;
            }
            let ok = p.nodes[i].ins.iter().all(|&k| {
                weight(k)
                    || match p.vals[k].producer {
                        Some(j) if inc[j] => true,
                        _ => read_by_backward(k),
                    }
            });
            if !ok {
                inc[i] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut drop = p.base_drop();
    for &c in &p.candidates {
        drop[c] |= inc[c];
    }
    drop
}

/// Every candidate dropped: the least peak these strategies aim at.
pub fn drop_all(p: &Problem) -> Vec<bool> {
    let mut d = p.base_drop();
    for &c in &p.candidates {
        d[c] = true;
    }
    d
}

fn best_of(
    p: &Problem,
    strategy: Strategy,
    family: Vec<(Vec<bool>, bool)>,
    budget: u64,
) -> Option<Solution> {
    let mut best: Option<(Solution, bool)> = None;
    for (drop, preferred) in family {
        let sim = p.simulate(&drop);
        if sim.peak > budget {
            continue;
        }
        let better = match &best {
            None => true,
            Some((b, bpref)) => {
                (sim.extra_flops, !preferred, sim.peak) < (b.sim.extra_flops, !*bpref, b.sim.peak)
            }
        };
        if better {
            best = Some((
                Solution {
                    drop,
                    sim,
                    strategy,
                    proven_optimal: false,
                },
                preferred,
            ));
        }
    }
    best.map(|b| b.0)
}

/// FLOPs of recomputing candidate `i`: its own and those of the
/// followers above it that its copy would recompute too (shared ones
/// counted once per candidate).
fn closure_flops(p: &Problem, i: usize, follower: &[bool]) -> u64 {
    let mut total = p.flops(i);
    let mut stack: Vec<usize> = p.nodes[i]
        .ins
        .iter()
        .filter_map(|&k| p.vals[k].producer)
        .collect();
    let mut seen = std::collections::HashSet::new();
    while let Some(q) = stack.pop() {
        if !follower[q] || !seen.insert(q) {
            continue;
        }
        total = total.saturating_add(p.flops(q));
        stack.extend(p.nodes[q].ins.iter().filter_map(|&k| p.vals[k].producer));
    }
    total
}

/// The greedy walk of `fast`: candidates by saved bytes per FLOP of
/// recomputation (followers included), each dropped when that lowers the
/// simulated (peak, memory × time); stops once the peak fits `budget`.
/// Returns the last state and the state of least peak seen.
fn greedy(
    p: &Problem,
    budget: u64,
    deadline: Instant,
) -> (Vec<bool>, Simulated, Vec<bool>, Simulated) {
    let mut follower = vec![false; p.len()];
    for &f in &p.followers {
        follower[f] = true;
    }
    let mut ranked: Vec<(usize, f64)> = p
        .candidates
        .iter()
        .copied()
        .filter(|&i| p.saved_bytes(i) > 0)
        .map(|i| {
            (
                i,
                p.saved_bytes(i) as f64 / (closure_flops(p, i, &follower) as f64 + 1.0),
            )
        })
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    let mut is_cand = vec![false; p.len()];
    for &c in &p.candidates {
        is_cand[c] = true;
    }
    let mut drop = p.base_drop();
    let mut sim = p.simulate(&drop);
    let mut least = (drop.clone(), sim);
    for _pass in 0..2 {
        let mut changed = false;
        for &(i, _) in &ranked {
            if sim.peak <= budget || Instant::now() > deadline {
                break;
            }
            if drop[i] {
                continue;
            }
            let group: Vec<usize> = p
                .with_views(i, &is_cand)
                .into_iter()
                .filter(|&q| !drop[q])
                .collect();
            for &q in &group {
                drop[q] = true;
            }
            let s = p.simulate(&drop);
            if (s.peak, s.area) < (sim.peak, sim.area) {
                sim = s;
                changed = true;
                if s.peak < least.1.peak {
                    least = (drop.clone(), s);
                }
            } else {
                for &q in &group {
                    drop[q] = false;
                }
            }
        }
        if !changed || sim.peak <= budget {
            break;
        }
    }
    (drop, sim, least.0, least.1)
}

fn fast(p: &Problem, budget: u64, deadline: Instant) -> Option<Solution> {
    let (drop, sim, _, _) = greedy(p, budget, deadline);
    let mut best = (sim.peak <= budget).then(|| refine(p, drop, sim, budget, deadline));
    // The greedy walk drops one node at a time and stops where no single
    // drop lowers the peak (chains of convolutions need several at once);
    // the checkpoint sets of `sqrt` and `per-block` that fit, refined the
    // same way, are the other starting points: the two with the most
    // slack.
    let mut starts: Vec<(Vec<bool>, Simulated)> = sqrt_family(p)
        .into_iter()
        .chain(per_block_family(p))
        .map(|(d, _)| {
            let s = p.simulate(&d);
            (d, s)
        })
        .filter(|(_, s)| s.peak <= budget)
        .collect();
    starts.sort_by_key(|(_, s)| (s.peak, s.extra_flops));
    for (d, s) in starts.into_iter().take(2) {
        if Instant::now() > deadline {
            break;
        }
        let r = refine(p, d, s, budget, deadline);
        if best
            .as_ref()
            .is_none_or(|b| r.sim.extra_flops < b.sim.extra_flops)
        {
            best = Some(r);
        }
    }
    best
}

/// The least simulated peak the solvers find (the greedy walk to the end,
/// the `sqrt` and `per-block` drop sets), with its drop set.
pub fn least_peak(p: &Problem, limit: Duration) -> (Vec<bool>, Simulated) {
    let (_, _, mut best, mut bsim) = greedy(p, 0, Instant::now() + limit);
    for (d, _) in sqrt_family(p).into_iter().chain(per_block_family(p)) {
        let s = p.simulate(&d);
        if s.peak < bsim.peak {
            (best, bsim) = (d, s);
        }
    }
    (best, bsim)
}

/// Un-drops the costliest dropped nodes while the budget holds.
fn refine(
    p: &Problem,
    mut drop: Vec<bool>,
    mut sim: Simulated,
    budget: u64,
    deadline: Instant,
) -> Solution {
    let mut dropped: Vec<usize> = p.candidates.iter().copied().filter(|&i| drop[i]).collect();
    dropped.sort_by(|&a, &b| p.flops(b).cmp(&p.flops(a)).then(a.cmp(&b)));
    for i in dropped {
        if Instant::now() > deadline {
            break;
        }
        drop[i] = false;
        let s = p.simulate(&drop);
        if s.peak <= budget && s.extra_flops <= sim.extra_flops {
            sim = s;
        } else {
            drop[i] = true;
        }
    }
    Solution {
        drop,
        sim,
        strategy: Strategy::Fast,
        proven_optimal: false,
    }
}

struct Bnb<'a> {
    p: &'a Problem,
    order: Vec<usize>,
    gaps: Vec<Vec<(usize, usize, i128)>>,
    /// The bound with the kept candidates' gaps added.
    profile: Vec<i128>,
    /// The gaps of the undecided candidates, summed.
    open: Vec<i128>,
    budget: i128,
    drop: Vec<bool>,
    best: Option<(u64, Vec<bool>, Simulated)>,
    deadline: Instant,
    timed_out: bool,
    steps: u64,
}

impl Bnb<'_> {
    fn add_gaps(&mut self, c: usize, sign: i128) {
        for &(a, b, s) in &self.gaps[c] {
            for x in &mut self.profile[a..b] {
                *x += sign * s;
            }
        }
    }

    fn open_gaps(&mut self, c: usize, sign: i128) {
        for &(a, b, s) in &self.gaps[c] {
            for x in &mut self.open[a..b] {
                *x += sign * s;
            }
        }
    }

    /// A lower bound on the FLOPs still to spend: at the step where
    /// keeping every undecided candidate overshoots the budget most, the
    /// undecided candidates dropped must free the excess from their gaps
    /// there; the cheapest way, fractionally (by FLOPs per byte), bounds
    /// every completion.
    fn cover_bound(&self, depth: usize) -> u64 {
        let (mut t, mut worst) = (0usize, i128::MIN);
        for (k, (&a, &b)) in self.profile.iter().zip(&self.open).enumerate() {
            if a + b > worst {
                (t, worst) = (k, a + b);
            }
        }
        let mut excess = worst - self.budget;
        if excess <= 0 {
            return 0;
        }
        let mut items: Vec<(f64, i128)> = self.order[depth..]
            .iter()
            .filter_map(|&c| {
                let bytes: i128 = self.gaps[c]
                    .iter()
                    .filter(|&&(a, b, _)| a <= t && t < b)
                    .map(|&(_, _, s)| s)
                    .sum();
                (bytes > 0).then(|| {
                    let f = self.p.flops(self.p.candidates[c]) as f64;
                    (f / bytes as f64, bytes)
                })
            })
            .collect();
        items.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cost = 0f64;
        for (per_byte, bytes) in items {
            let take = bytes.min(excess);
            cost += per_byte * take as f64;
            excess -= take;
            if excess <= 0 {
                break;
            }
        }
        if excess > 0 {
            return u64::MAX; // cannot be covered
        }
        // Round down, minus a margin for float error: a bound, never more.
        (cost * (1.0 - 1e-9)).floor().max(0.0) as u64
    }

    fn fits(&self) -> bool {
        self.profile.iter().all(|&x| x <= self.budget)
    }

    fn dfs(&mut self, depth: usize, cost: u64) {
        self.steps += 1;
        if self.steps.is_multiple_of(32) && Instant::now() > self.deadline {
            self.timed_out = true;
        }
        if self.timed_out {
            return;
        }
        if self.best.as_ref().is_some_and(|b| cost >= b.0) {
            return;
        }
        if depth < self.order.len() {
            let more = self.cover_bound(depth);
            if more == u64::MAX
                || self
                    .best
                    .as_ref()
                    .is_some_and(|b| cost.saturating_add(more) >= b.0)
            {
                return;
            }
        }
        if depth == self.order.len() {
            let s = self.p.simulate(&self.drop);
            if s.peak as i128 <= self.budget
                && self.best.as_ref().is_none_or(|b| s.extra_flops < b.0)
            {
                self.best = Some((s.extra_flops, self.drop.clone(), s));
            }
            return;
        }
        let (c, i) = (self.order[depth], self.p.candidates[self.order[depth]]);
        self.open_gaps(c, -1);
        // Keep.
        self.add_gaps(c, 1);
        if self.fits() {
            self.dfs(depth + 1, cost);
        }
        self.add_gaps(c, -1);
        // Drop.
        self.drop[i] = true;
        self.dfs(depth + 1, cost.saturating_add(self.p.flops(i)));
        self.drop[i] = false;
        self.open_gaps(c, 1);
    }
}

fn optimal(p: &Problem, budget: u64, deadline: Instant) -> Option<Solution> {
    let lb = p.lower_bound();
    let mut profile = lb.base.clone();
    if profile.iter().any(|&x| x > budget as i128) {
        return None; // even dropping everything cannot fit
    }
    let mut order: Vec<usize> = (0..p.candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (ia, ib) = (p.candidates[a], p.candidates[b]);
        p.saved_bytes(ib).cmp(&p.saved_bytes(ia)).then(ia.cmp(&ib))
    });
    let seed = fast(p, budget, deadline);
    let best = seed.map(|s| (s.sim.extra_flops, s.drop, s.sim));
    if profile.is_empty() {
        profile.push(0);
    }
    let mut open = vec![0i128; profile.len()];
    for g in &lb.gaps {
        for &(a, b, s) in g {
            for x in &mut open[a..b] {
                *x += s;
            }
        }
    }
    let mut b = Bnb {
        p,
        order,
        gaps: lb.gaps,
        profile,
        open,
        budget: budget as i128,
        drop: p.base_drop(),
        best,
        deadline,
        timed_out: false,
        steps: 0,
    };
    b.dfs(0, 0);
    let timed_out = b.timed_out;
    b.best.map(|(_, drop, sim)| Solution {
        drop,
        sim,
        strategy: Strategy::Optimal,
        proven_optimal: !timed_out,
    })
}

/// The forward pass's cut points: positions after which exactly one
/// activation (of at least 1/100 of the largest, and not live over half
/// the forward pass or more, as masks are) is live into the rest of the
/// forward pass; with the value crossing there.
pub fn cut_points(p: &Problem) -> Vec<(usize, usize)> {
    let n = p.len();
    let max = p
        .vals
        .iter()
        .filter(|v| v.producer.is_some_and(|q| p.nodes[q].forward))
        .map(|v| v.size)
        .max()
        .unwrap_or(0);
    let floor = (max / 100).max(1);
    let n_forward = p.nodes.iter().filter(|x| x.forward).count();
    let mut count = vec![0i64; n + 1];
    let mut xor = vec![0u64; n + 1];
    for (k, v) in p.vals.iter().enumerate() {
        let Some(q) = v.producer else { continue };
        if !p.nodes[q].forward || v.size < floor {
            continue;
        }
        let lf = v
            .readers
            .iter()
            .copied()
            .filter(|&r| p.nodes[r].forward)
            .max()
            .unwrap_or(q);
        // Values live over most of the forward pass (an attention mask,
        // position embeddings) are side inputs, not the stream to cut.
        if lf <= q || (lf - q) * 2 > n_forward {
            continue;
        }
        // Crosses the steps after q .. after lf - 1.
        count[q] += 1;
        count[lf] -= 1;
        xor[q] ^= k as u64 + 1;
        xor[lf] ^= k as u64 + 1;
    }
    let mut out = Vec::new();
    let (mut c, mut x) = (0i64, 0u64);
    for i in 0..n {
        c += count[i];
        x ^= xor[i];
        if c == 1 && p.nodes[i].forward {
            let k = (x - 1) as usize;
            if p.vals[k].producer == Some(i) {
                out.push((i, k));
            }
        }
    }
    out
}

/// The producers to keep so that value `k` stays stored: its node and,
/// through views, the node of the storage it views.
fn keep_chain(p: &Problem, k: usize, drop: &mut [bool]) {
    let mut k = k;
    while let Some(q) = p.vals[k].producer {
        drop[q] = false;
        if p.nodes[q].view {
            k = p.nodes[q].ins[0];
        } else {
            break;
        }
    }
}

/// Chen's sqrt(n) checkpoints, one drop set per stride (the sqrt stride
/// marked preferred).
fn sqrt_family(p: &Problem) -> Vec<(Vec<bool>, bool)> {
    let cuts = cut_points(p);
    let k = cuts.len();
    let pref = ((k as f64).sqrt().round() as usize).max(1);
    let mut out = Vec::new();
    for s in 1..=k.max(1) {
        let mut d = drop_all(p);
        for (j, &(_, v)) in cuts.iter().enumerate() {
            if (j + 1) % s == 0 {
                keep_chain(p, v, &mut d);
            }
        }
        out.push((d, s == pref));
    }
    out
}

/// Repeated blocks between cut points: one drop set per `e` (keep every
/// `e`-th block boundary), `e = 1` preferred.
fn per_block_family(p: &Problem) -> Vec<(Vec<bool>, bool)> {
    let cuts = cut_points(p);
    if cuts.is_empty() {
        return Vec::new();
    }
    // Segment j: forward nodes in (cut j-1, cut j].
    let mut sigs: Vec<u64> = Vec::new();
    let mut start = 0usize;
    for &(c, _) in &cuts {
        let mut h: u64 = 0xcbf29ce484222325;
        for i in start..=c {
            if p.nodes[i].forward {
                h = (h ^ p.nodes[i].op).wrapping_mul(0x100000001b3);
                h = (h ^ p.nodes[i].outs.len() as u64).wrapping_mul(0x100000001b3);
                h = (h ^ p.nodes[i].ins.len() as u64).wrapping_mul(0x100000001b3);
            }
        }
        h = (h ^ (c - start) as u64).wrapping_mul(0x100000001b3);
        sigs.push(h);
        start = c + 1;
    }
    let m = sigs.len();
    let (mut period, mut matches) = (1usize, 0usize);
    for q in 1..=24.min(m.saturating_sub(1)) {
        let c = (0..m - q).filter(|&j| sigs[j] == sigs[j + q]).count();
        if c > matches {
            (period, matches) = (q, c);
        }
    }
    let j0 = (0..m.saturating_sub(period))
        .find(|&j| sigs[j] == sigs[j + period])
        .unwrap_or(0);
    // Block boundaries: cut j0-1 (or the region start), then every
    // `period` segments.
    let region_start = if j0 == 0 { 0 } else { cuts[j0 - 1].0 + 1 };
    let mut bounds: Vec<usize> = Vec::new();
    let mut j = j0 + period - 1;
    let mut last_block_end = None;
    while j < m {
        // The block must repeat the first one to count.
        if sigs[j] == sigs[j0 + period - 1] {
            bounds.push(j);
            last_block_end = Some(cuts[j].0);
        }
        j += period;
    }
    let Some(region_end) = last_block_end else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in 1..=bounds.len().max(1) {
        let mut d = p.base_drop();
        for &c in &p.candidates {
            if c >= region_start && c <= region_end {
                d[c] = true;
            }
        }
        for (t, &b) in bounds.iter().enumerate() {
            if (t + 1) % e == 0 || t + 1 == bounds.len() {
                keep_chain(p, cuts[b].1, &mut d);
            }
        }
        out.push((d, e == 1));
    }
    out
}

/// The frontier of one strategy: (simulated peak, extra FLOPs, drop set)
/// at budgets from the store-all peak down to the least reachable, in
/// `points` steps, and at the peaks of the `sqrt` and `per-block` drop
/// sets, keeping only Pareto-optimal points (ascending peak);
/// with the longest single solve in seconds.
pub fn frontier(
    p: &Problem,
    strategy: Strategy,
    points: usize,
    limit: Duration,
) -> (Vec<Solution>, f64) {
    let mut sols: Vec<Solution> = Vec::new();
    let mut longest = 0f64;
    match strategy {
        Strategy::Sqrt | Strategy::PerBlock => {
            let fam = if strategy == Strategy::Sqrt {
                sqrt_family(p)
            } else {
                per_block_family(p)
            };
            let t0 = Instant::now();
            for (drop, _) in fam {
                let sim = p.simulate(&drop);
                sols.push(Solution {
                    drop,
                    sim,
                    strategy,
                    proven_optimal: false,
                });
            }
            longest = t0.elapsed().as_secs_f64();
        }
        _ => {
            let hi = p.simulate(&vec![false; p.len()]).peak;
            let lo = least_peak(p, limit).1.peak.min(hi);
            let steps = points.max(2);
            // Evenly spaced budgets, and the peaks of the baselines' drop
            // sets (to compare at equal memory).
            let mut budgets: Vec<u64> = (0..steps)
                .map(|s| hi - ((hi - lo) as u128 * s as u128 / (steps - 1) as u128) as u64)
                .collect();
            budgets.extend(
                sqrt_family(p)
                    .into_iter()
                    .chain(per_block_family(p))
                    .map(|(d, _)| p.simulate(&d).peak)
                    .filter(|&b| b < hi),
            );
            budgets.sort_unstable_by(|a, b| b.cmp(a));
            budgets.dedup();
            for b in budgets {
                let t0 = Instant::now();
                let sol = solve(p, strategy, b, limit);
                longest = longest.max(t0.elapsed().as_secs_f64());
                if let Some(sol) = sol {
                    sols.push(sol);
                }
            }
        }
    }
    (pareto(sols), longest)
}

/// The Pareto-optimal solutions, ascending peak (descending FLOPs).
pub fn pareto(mut sols: Vec<Solution>) -> Vec<Solution> {
    sols.sort_by_key(|a| (a.sim.peak, a.sim.extra_flops));
    let mut out: Vec<Solution> = Vec::new();
    for s in sols {
        if out
            .last()
            .is_none_or(|l| s.sim.extra_flops < l.sim.extra_flops)
        {
            out.push(s);
        }
    }
    out
}
