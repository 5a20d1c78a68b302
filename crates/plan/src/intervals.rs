//! Offset assignment for buffers with lifetimes: every greedy strategy,
//! then the canonical search of [`crate::search`], keeping the best.
//!
//! The search driver runs *restarts*: short decision searches, each with
//! one static order of the portfolio ([`Preorder::ALL`], lightly shuffled
//! after the first round) and a node limit that follows the Luby sequence
//! (1, 1, 2, 1, 1, 2, 4, ... times a base). Hard instances have heavy-tailed
//! search times: most orders get stuck in one bad subtree, a few finish at
//! once, and restarts find those few without knowing in advance which.
//!
//! 1. The capacity asked is the *goal*: the lower bound, or the caller's
//!    `target` when one is given (MiniMalloc's solver takes its capacity
//!    the same way). Restarts run at the goal until one fits.
//! 2. Every fourth slot bisects instead, so an instance whose bound cannot
//!    be reached still improves on greedy: every other probe between the
//!    proven floor and the best arena so far, the others between the
//!    highest capacity a probe gave up on and the best arena (an instance
//!    whose floor is far out of reach, as MiniMalloc's D and J, still
//!    comes down step by step).
//! 3. In three slots of four, the restart also restarts *inside* the
//!    search: a part that the search split off as independent gets its
//!    own node budget and, when that runs out, is searched again with its
//!    buffers' ranks reshuffled, keeping what was placed elsewhere. Hard
//!    instances (MiniMalloc's I) need lucky orders in several regions at
//!    once; retrying one region at a time finds them far sooner.
//! 4. Restarts run in batches of two, one per thread. A batch's tasks are
//!    fixed before it runs and results are read in task order, so the
//!    outcome is the same with one thread or two; only the optional wall
//!    clock limit can make it depend on the machine.
//!
//! The result is never worse than the best greedy strategy.

use crate::buffer::{aligned_lower_bound, lower_bound, Buffer};
use crate::greedy::Greedy;
use crate::search::{Outcome, Preorder, Prepared, Searcher};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Options of [`plan_intervals`].
#[derive(Clone, Debug)]
pub struct IntervalOptions {
    /// Every offset is a multiple of this (0 and 1 mean none).
    pub alignment: u64,
    /// Run the search after the greedy strategies.
    pub search: bool,
    /// Total search nodes allowed; the search stops earlier when it proves
    /// its arena optimal. With no time limit this alone decides when the
    /// search ends, so plans are identical run to run and machine to
    /// machine.
    pub node_budget: u64,
    /// Optional wall-clock limit (opt-in: results then depend on speed).
    pub time_limit: Option<Duration>,
    /// A capacity to try first instead of the lower bound (a known good
    /// arena, as MiniMalloc's benchmarks give one); the search still tries
    /// lower afterwards.
    pub target: Option<u64>,
    /// Worker threads (1 or 2; more are allowed but a batch holds two
    /// tasks).
    pub threads: usize,
}

impl Default for IntervalOptions {
    fn default() -> IntervalOptions {
        IntervalOptions {
            alignment: 256,
            search: true,
            node_budget: 400_000,
            time_limit: None,
            target: None,
            threads: 2,
        }
    }
}

/// Search nodes per buffer of [`default_node_budget`].
pub const NODES_PER_BUFFER: u64 = 1_300;

/// The node budget `graphopt plan --intervals` uses unless told otherwise:
/// [`NODES_PER_BUFFER`] per buffer, at least 200,000. Scaled by the
/// instance's size because the search's restarts are (their node limits
/// follow the buffer count), so larger instances get as many restarts as
/// smaller ones. A count, not a clock: the plan is the same on every run.
///
/// On MiniMalloc's hard set (lower bound as the only target) the slowest
/// to reach its bound is I, at 466,174 nodes (374 buffers: budget
/// 486,200); D and J end above theirs (1.0415x and 1.0487x) but reach
/// their best known arena, 1,048,576, at 62,625 and 56,993 nodes (see
/// benches/README.md).
pub fn default_node_budget(buffers: usize) -> u64 {
    (buffers as u64)
        .saturating_mul(NODES_PER_BUFFER)
        .max(200_000)
}

/// Offsets for a buffer list, with how they were found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IntervalPlan {
    /// `offsets[i]` belongs to the caller's `bufs[i]`.
    pub offsets: Vec<u64>,
    /// `max(offset + size)` over live buffers.
    pub arena: u64,
    /// The max-load lower bound, with sizes rounded to the alignment (see
    /// [`crate::aligned_lower_bound`]); the plain one when unaligned.
    pub lower_bound: u64,
    /// The best arena among the greedy strategies.
    pub greedy_arena: u64,
    /// The strategy that produced `offsets` (`greedy-size-best`, `search-WAT`, ...).
    pub strategy: String,
    /// True when `arena` is known to be the least possible.
    pub optimal: bool,
    /// Search nodes visited.
    pub nodes: u64,
    /// Seconds from the start until `offsets` were found (the only field
    /// that differs run to run).
    #[serde(skip)]
    pub found_after_s: f64,
    /// Every improvement on the best greedy arena, in order: the arena,
    /// the seconds from the start and the search nodes visited by the end
    /// of the batch that found it (time-to-target figures for benches).
    #[serde(skip)]
    pub improvements: Vec<Improvement>,
}

/// One improvement of [`IntervalPlan::improvements`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Improvement {
    pub arena: u64,
    pub seconds: f64,
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
    // With alignment, rounded sizes give a higher bound that a placement
    // can actually reach: the search aims at it.
    let lb = lower_bound(bufs).max(aligned_lower_bound(bufs, align));
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
    let mut found_after_s = start.elapsed().as_secs_f64();
    let mut improvements = Vec::new();
    if opts.search && arena > lb {
        let prep = Prepared::new(bufs, align);
        let r = drive(&prep, lb, arena, opts, start);
        nodes = r.nodes;
        proven_lo = r.proven_lo;
        improvements = r.improvements;
        if let Some((a, live_offs, name, at)) = r.best {
            if a < arena {
                arena = a;
                offsets = vec![0; bufs.len()];
                for (k, &i) in prep.orig.iter().enumerate() {
                    offsets[i] = live_offs[k];
                }
                strategy = name;
                found_after_s = at;
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
        found_after_s,
        improvements,
    }
}

struct DriveResult {
    /// Best arena, live offsets, strategy name, seconds to find.
    best: Option<(u64, Vec<u64>, String, f64)>,
    proven_lo: u64,
    nodes: u64,
    improvements: Vec<Improvement>,
}

/// The `i`-th term (1-based) of the Luby sequence 1 1 2 1 1 2 4 1 1 2 ...
pub(crate) fn luby(mut i: u64) -> u64 {
    loop {
        let mut k = 1u32;
        while (1u64 << k) - 1 < i {
            k += 1;
        }
        if i == (1u64 << k) - 1 {
            return 1u64 << (k - 1);
        }
        i -= (1u64 << (k - 1)) - 1;
    }
}

/// One restart: an order, a shuffle seed, a capacity and a node limit.
#[derive(Clone, Copy)]
struct Task {
    order: Preorder,
    seed: u64,
    cap: u64,
    limit: u64,
    /// Per-part restarts inside the search (see [`Searcher`]); 0: off.
    part_base: u64,
    /// A bisection probe below the best arena.
    probe: bool,
}

struct TaskResult {
    out: Outcome,
    nodes: u64,
    solution: Vec<u64>,
}

fn run_task(p: &Prepared, t: Task, deadline: Option<Instant>) -> TaskResult {
    let mut s = Searcher::with_seed(p, t.order, t.seed);
    s.part_base = t.part_base;
    let out = s.run(t.cap, t.limit, deadline);
    TaskResult {
        out,
        nodes: s.nodes,
        solution: if out == Outcome::Found {
            s.solution.clone()
        } else {
            Vec::new()
        },
    }
}

/// Runs a batch of tasks, on up to `threads` threads, results in order.
fn run_batch(
    p: &Prepared,
    tasks: &[Task],
    threads: usize,
    deadline: Option<Instant>,
) -> Vec<TaskResult> {
    // The search recurses once per placed buffer: give it a roomy stack.
    let stack = (16 << 20) + p.len() * 2048;
    let spawn_ok = threads > 1 && tasks.len() > 1;
    std::thread::scope(|s| {
        let handles: Vec<_> = tasks
            .iter()
            .map(|&t| {
                if spawn_ok {
                    std::thread::Builder::new()
                        .stack_size(stack)
                        .spawn_scoped(s, move || run_task(p, t, deadline))
                        .ok()
                } else {
                    None
                }
            })
            .collect();
        tasks
            .iter()
            .zip(handles)
            .map(|(&t, h)| match h.map(|h| h.join()) {
                Some(Ok(r)) => r,
                // Sequential: still on a thread with a large stack.
                _ => std::thread::Builder::new()
                    .stack_size(stack)
                    .spawn_scoped(s, move || run_task(p, t, deadline))
                    .ok()
                    .and_then(|h| h.join().ok())
                    .unwrap_or(TaskResult {
                        out: Outcome::Aborted,
                        nodes: 0,
                        solution: Vec::new(),
                    }),
            })
            .collect()
    })
}

/// Per-part restart budget of [`Searcher::part_base`]: nodes per buffer of
/// the part, times the Luby sequence.
const PART_BASE: u64 = 12;

fn drive(
    p: &Prepared,
    lb: u64,
    greedy: u64,
    opts: &IntervalOptions,
    start: Instant,
) -> DriveResult {
    let deadline = opts.time_limit.map(|d| start + d);
    let mut res = DriveResult {
        best: None,
        proven_lo: lb,
        nodes: 0,
        improvements: Vec::new(),
    };
    let mut hi = greedy; // best arena so far: look for less
    let mut goal = opts.target.unwrap_or(lb).max(lb);
    if goal >= hi {
        goal = lb;
    }
    let live_arena = |sol: &[u64]| -> u64 {
        sol.iter()
            .enumerate()
            .map(|(k, &o)| o + p.size_of(k))
            .max()
            .unwrap_or(0)
    };
    let base = (p.len() as u64 * 4).max(256);
    let orders = Preorder::ALL.len() as u64;
    let (mut restart, mut probe, mut part_restart) = (0u64, 0u64, 0u64);
    // The highest capacity a bisection probe aborted at (not a proof).
    let mut hard = lb;
    let mut slot = 0u64;
    let step = (lb / 1000).max(1);
    loop {
        if hi <= res.proven_lo
            || res.nodes >= opts.node_budget
            || deadline.is_some_and(|d| Instant::now() >= d)
        {
            return res;
        }
        goal = goal.max(res.proven_lo);
        if goal >= hi {
            goal = res.proven_lo;
        }
        let left = opts.node_budget - res.nodes;
        let mut tasks = Vec::with_capacity(2);
        for _ in 0..2 {
            slot += 1;
            let bisect = slot.is_multiple_of(4)
                && hi > goal.saturating_add(step)
                && hi - res.proven_lo > step;
            // Slots 1-3 of every four also restart inside independent
            // parts (see `Searcher::part_base`), with their own sequence
            // of orders and seeds; slot 0, when it does not bisect, keeps
            // the plain search.
            let parts = !bisect && !slot.is_multiple_of(4);
            let (cap, i) = if bisect {
                probe += 1;
                let lo = goal.max(res.proven_lo);
                // Odd probes bisect between the highest capacity a probe
                // gave up on (`hard`) and the best arena, so an instance
                // whose floor is far out of reach still improves; even
                // ones between the floor and the best arena (later probes
                // get larger limits).
                if hard < lo || hard.saturating_add(step) >= hi {
                    hard = lo;
                }
                let from = if probe % 2 == 1 { hard } else { lo };
                (from + (hi - from) / 2, probe + 3)
            } else if parts {
                part_restart += 1;
                (goal, part_restart - 1)
            } else {
                restart += 1;
                (goal, restart - 1)
            };
            let order = Preorder::ALL[(i % orders) as usize];
            let seed = i / orders;
            let limit = base.saturating_mul(luby(seed + 1) * if bisect { 2 } else { 1 });
            tasks.push(Task {
                order,
                seed,
                cap,
                limit: limit.min(left.div_ceil(2)).max(1),
                part_base: if parts { PART_BASE } else { 0 },
                probe: bisect,
            });
        }
        let results = run_batch(p, &tasks, opts.threads, deadline);
        let batch_end = res.nodes + results.iter().map(|r| r.nodes).sum::<u64>();
        for (t, r) in tasks.iter().zip(results) {
            res.nodes += r.nodes;
            match r.out {
                Outcome::Found => {
                    let a = live_arena(&r.solution);
                    if a < hi {
                        hi = a;
                        let name = if t.seed == 0 {
                            format!("search-{}", t.order.0)
                        } else {
                            format!("search-{}-{}", t.order.0, t.seed)
                        };
                        let at = start.elapsed().as_secs_f64();
                        res.improvements.push(Improvement {
                            arena: a,
                            seconds: at,
                            nodes: batch_end,
                        });
                        res.best = Some((a, r.solution, name, at));
                    }
                }
                Outcome::Infeasible => {
                    res.proven_lo = res.proven_lo.max(t.cap + 1);
                }
                Outcome::Aborted => {
                    if t.probe && t.cap < hi {
                        hard = hard.max(t.cap);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::luby;

    #[test]
    fn luby_sequence() {
        let v: Vec<u64> = (1..=15).map(luby).collect();
        assert_eq!(v, [1, 1, 2, 1, 1, 2, 4, 1, 1, 2, 1, 1, 2, 4, 8]);
    }
}
