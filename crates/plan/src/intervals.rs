//! Offset assignment for buffers with lifetimes: every greedy strategy,
//! then the canonical search of [`crate::search`], keeping the best.
//!
//! The search driver, in rounds with a doubling node limit until the
//! deadline or until the arena equals the lower bound:
//! 1. ask the decision search for a placement at the lower bound, once per
//!    preorder (most real instances fit there);
//! 2. bisect capacities between the lower bound and the best arena so far
//!    (each success lowers the best; an abort only moves this round's lower
//!    end, an exhausted search moves the proven one).
//!
//! The result is therefore never worse than the best greedy strategy.

use crate::buffer::{lower_bound, Buffer};
use crate::greedy::Greedy;
use crate::search::{Outcome, Preorder, Prepared, Searcher};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Options of [`plan_intervals`].
#[derive(Clone, Debug)]
pub struct IntervalOptions {
    /// Every offset is a multiple of this (0 and 1 mean none).
    pub alignment: u64,
    /// Wall-clock budget of the search (the greedy pass always runs).
    pub time_limit: Duration,
    /// Run the search after the greedy strategies.
    pub search: bool,
    /// Total search nodes allowed. With a budget that runs out before the
    /// time limit, the result does not depend on the machine's speed.
    pub node_budget: u64,
}

impl Default for IntervalOptions {
    fn default() -> IntervalOptions {
        IntervalOptions {
            alignment: 256,
            time_limit: Duration::from_secs(1),
            search: true,
            node_budget: u64::MAX,
        }
    }
}

/// Offsets for a buffer list, with how they were found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IntervalPlan {
    /// `offsets[i]` belongs to the caller's `bufs[i]`.
    pub offsets: Vec<u64>,
    /// `max(offset + size)` over live buffers.
    pub arena: u64,
    /// The max-load lower bound.
    pub lower_bound: u64,
    /// The best arena among the greedy strategies.
    pub greedy_arena: u64,
    /// The strategy that produced `offsets` (`greedy-size-best`, `search-WAT`, ...).
    pub strategy: String,
    /// True when `arena` is known to be the least possible.
    pub optimal: bool,
    /// Search nodes visited.
    pub nodes: u64,
}

/// `max(offset + size)` over live buffers.
pub fn arena_of(bufs: &[Buffer], offsets: &[u64]) -> u64 {
    bufs.iter()
        .zip(offsets)
        .filter(|(b, _)| b.is_live())
        .map(|(b, &o)| o.saturating_add(b.size))
        .max()
        .unwrap_or(0)
}

/// Assigns offsets to `bufs` so that buffers alive at the same time never
/// share bytes, using as small an arena as the options allow.
pub fn plan_intervals(bufs: &[Buffer], opts: &IntervalOptions) -> IntervalPlan {
    let start = Instant::now();
    let align = opts.alignment.max(1);
    let lb = lower_bound(bufs);
    let mut best: Option<(u64, Vec<u64>, String)> = None;
    for g in Greedy::ALL {
        let offs = g.assign(bufs, align);
        let a = arena_of(bufs, &offs);
        if best.as_ref().is_none_or(|(ba, _, _)| a < *ba) {
            best = Some((a, offs, g.name()));
        }
    }
    let (mut arena, mut offsets, mut strategy) =
        best.unwrap_or((0, vec![0; bufs.len()], "empty".into()));
    let greedy_arena = arena;
    let mut nodes = 0;
    let mut proven_lo = lb;
    if opts.search && arena > lb {
        let deadline = start + opts.time_limit;
        let prep = Prepared::new(bufs, align);
        // The search may recurse once per buffer: give it a roomy stack.
        let found = std::thread::scope(|s| {
            std::thread::Builder::new()
                .stack_size((16 << 20) + prep.len() * 1024)
                .spawn_scoped(s, || drive(&prep, lb, arena, deadline, opts.node_budget))
                .ok()
                .and_then(|h| h.join().ok())
        });
        if let Some(r) = found {
            nodes = r.nodes;
            proven_lo = r.proven_lo;
            if let Some((a, live_offs, name)) = r.best {
                if a < arena {
                    arena = a;
                    offsets = vec![0; bufs.len()];
                    for (k, &i) in prep.orig.iter().enumerate() {
                        offsets[i] = live_offs[k];
                    }
                    strategy = name;
                }
            }
        }
    }
    IntervalPlan {
        offsets,
        arena,
        lower_bound: lb,
        greedy_arena,
        strategy,
        optimal: arena <= proven_lo,
        nodes,
    }
}

struct DriveResult {
    best: Option<(u64, Vec<u64>, String)>,
    proven_lo: u64,
    nodes: u64,
}

fn drive(p: &Prepared, lb: u64, mut hi: u64, deadline: Instant, budget: u64) -> DriveResult {
    let mut searchers: Vec<(String, Searcher)> = Vec::new();
    for seed in 0..3u64 {
        // Seeded variants only of the two orders that win most often.
        let n_orders = if seed == 0 { Preorder::ALL.len() } else { 2 };
        for &o in &Preorder::ALL[..n_orders] {
            let name = if seed == 0 {
                format!("search-{}", o.0)
            } else {
                format!("search-{}-{seed}", o.0)
            };
            searchers.push((name, Searcher::with_seed(p, o, seed)));
        }
    }
    let mut res = DriveResult {
        best: None,
        proven_lo: lb,
        nodes: 0,
    };
    let live_arena = |sol: &[u64]| -> u64 {
        sol.iter()
            .enumerate()
            .map(|(k, &o)| o + p.size_of(k))
            .max()
            .unwrap_or(0)
    };
    let step = (lb / 1000).max(1);
    let mut limit = (p.len() as u64).max(16) * 2;
    let mut turn = 0usize;
    loop {
        let mut aborted = false;
        let mut lb_tries = 0;
        let mut probes = 0;
        // 1. The lower bound, with every searcher (most instances fit there).
        // 2. Bisection between the proven floor and the best arena so far.
        let mut lo = res.proven_lo;
        loop {
            if Instant::now() >= deadline || res.nodes >= budget || hi <= res.proven_lo {
                return res;
            }
            let at_bound = res.proven_lo == lb && lb_tries < searchers.len();
            let (cap, k) = if at_bound {
                lb_tries += 1;
                (lb, lb_tries - 1)
            } else if hi - lo > step && probes < 3 {
                probes += 1;
                turn += 1;
                (lo + (hi - lo) / 2, turn % searchers.len())
            } else {
                break;
            };
            let (name, s) = &mut searchers[k];
            // Probes above the bound are easier but need room for a dive.
            let l = if at_bound {
                limit
            } else {
                limit.saturating_mul(2)
            };
            let out = s.run(cap, l.min(budget - res.nodes), deadline);
            res.nodes += s.nodes;
            match out {
                Outcome::Found => {
                    let a = live_arena(&s.solution);
                    if a < hi {
                        hi = a;
                        res.best = Some((a, s.solution.clone(), name.clone()));
                    }
                }
                Outcome::Infeasible => {
                    res.proven_lo = res.proven_lo.max(cap + 1);
                    lo = lo.max(cap + 1);
                }
                Outcome::Aborted => {
                    aborted = true;
                    if !at_bound {
                        lo = cap + 1;
                    }
                }
            }
        }
        if !aborted {
            return res;
        }
        limit = limit.saturating_mul(2);
    }
}
