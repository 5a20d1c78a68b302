//! [`Session::remat`]: fit a training graph's peak memory into a budget by
//! recomputing forward values in the backward pass (the `remat` pass of
//! `graphopt-passes`); [`Session::remat_sweep`]: the Pareto frontier of
//! peak memory against extra FLOPs, per strategy.
//!
//! Memory is the planner's: the lower bound (peak of live bytes under the
//! memory-aware schedule, in-place merging included) and the arena, at the
//! given dims. The solvers score drop sets with the pass's simulator; every
//! answer is then rewritten and scheduled for real, and the budget is held
//! against that real figure: when the simulator's answer misses, it is
//! solved again against a tighter simulated budget (at most
//! [`CALIBRATION_ROUNDS`] times).

use crate::error::{Error, Result};
use crate::session::{PlanGraph, Session};
use crate::torch_policy::{torch_policy, TorchPolicy};
use graphopt_exec::lower::lowered_copy;
use graphopt_ir::{Graph, Model};
use graphopt_passes::remat::{self, cost, solve, Problem, Strategy};
use graphopt_plan::donation::{declared_donations, resolve};
use graphopt_plan::liveness::{live_bytes, liveness_with};
use graphopt_plan::schedule::memory_aware_schedule_donating;
use graphopt_plan::{human_bytes, plan_model, DimValues, PlanOptions};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Tries of the simulated budget before giving up on a real budget.
pub const CALIBRATION_ROUNDS: usize = 6;

/// A memory budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    Bytes(u64),
    /// Percent of the store-everything lower bound.
    Percent(f64),
}

impl Budget {
    /// The budget in bytes, a percentage taken of `store_all` (the
    /// store-everything lower bound).
    pub fn bytes(self, store_all: u64) -> u64 {
        match self {
            Budget::Bytes(b) => b,
            Budget::Percent(p) => (store_all as f64 * p / 100.0) as u64,
        }
    }

    /// `40%`, `2GiB`, `500000000`.
    pub fn parse(s: &str) -> Result<Budget> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| Error::new(format!("--budget {s}: expected PCT% or a size")))?;
            if !(v > 0.0 && v.is_finite()) {
                return Err(Error::new(format!("--budget {s}: must be above 0%")));
            }
            return Ok(Budget::Percent(v));
        }
        graphopt_plan::parse_size(t)
            .map(Budget::Bytes)
            .map_err(|e| Error::new(format!("--budget {e}")))
    }
}

/// What [`Session::remat`] does.
#[derive(Clone, Debug)]
pub struct RematOptions {
    pub budget: Budget,
    pub dims: DimValues,
    pub strategy: Strategy,
    /// Wall-clock limit of one solve (the exact solver stops there with
    /// its best answer).
    pub time_limit: Duration,
    /// Plan with the model's donation table (`<p>_new` written over
    /// `<p>`), as `plan` and `run` do by default. Default true.
    pub donate: bool,
}

impl Default for RematOptions {
    fn default() -> RematOptions {
        RematOptions {
            budget: Budget::Percent(50.0),
            dims: DimValues::default(),
            strategy: Strategy::Auto,
            time_limit: Duration::from_secs(10),
            donate: true,
        }
    }
}

/// What [`Session::remat`] did.
#[derive(Clone, Debug, Serialize)]
pub struct RematReport {
    pub strategy: String,
    /// `optimal` finished its search (exact within the pass's model).
    pub proven_optimal: bool,
    pub budget_bytes: u64,
    pub lower_bound_before_bytes: u64,
    pub lower_bound_after_bytes: u64,
    pub arena_before_bytes: u64,
    pub arena_after_bytes: u64,
    pub weights_bytes: u64,
    /// Inputs held once in the arena, written over by their donated
    /// outputs (parameters and optimizer state), after remat.
    pub donated_bytes: u64,
    pub flops_before: u64,
    pub flops_after: u64,
    pub recomputed_nodes: Vec<String>,
    pub dropped_values: Vec<String>,
    pub solve_seconds: f64,
    /// The decision per torch.fx node, when the model came from torch's
    /// dynamo exporter (its nodes name their fx nodes; see
    /// [`crate::torch_policy`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_policy: Option<TorchPolicy>,
    /// Live bytes per schedule step, before and after (for plots).
    #[serde(skip)]
    pub timeline_before: Vec<u64>,
    #[serde(skip)]
    pub timeline_after: Vec<u64>,
}

impl RematReport {
    /// FLOPs added by recomputation, in percent of the step's.
    pub fn extra_flops_pct(&self) -> f64 {
        100.0 * (self.flops_after as f64 / self.flops_before.max(1) as f64 - 1.0)
    }
}

/// One point of a frontier.
#[derive(Clone, Debug, Serialize)]
pub struct FrontierPoint {
    /// The planner's lower bound after remat.
    pub peak_bytes: u64,
    /// `peak_bytes` / the store-everything lower bound.
    pub peak_fraction: f64,
    pub extra_flops: u64,
    /// `extra_flops` / the training graph's FLOPs, in percent.
    pub extra_flops_pct: f64,
    pub recomputed_nodes: usize,
    /// `optimal` finished its search for this point.
    pub proven_optimal: bool,
}

/// The frontier of one strategy.
#[derive(Clone, Debug, Serialize)]
pub struct StrategyFrontier {
    pub strategy: String,
    pub points: Vec<FrontierPoint>,
    /// Seconds to compute the whole frontier (with the planner's check of
    /// every point), and the slowest single solve (the sweep of the
    /// strides for `sqrt` and `per-block`).
    pub seconds: f64,
    pub max_solve_seconds: f64,
}

/// What [`Session::remat_sweep`] returns.
#[derive(Clone, Debug, Serialize)]
pub struct RematSweep {
    pub lower_bound_store_all_bytes: u64,
    /// Bytes of the graph outputs (the loss and the gradients), all live
    /// at the last step: no recomputation goes below this.
    pub outputs_bytes: u64,
    pub flops: u64,
    pub nodes: usize,
    pub candidates: usize,
    pub frontiers: Vec<StrategyFrontier>,
    /// The budget given to [`Session::remat_sweep_with_budget`], in bytes.
    pub budget_bytes: Option<u64>,
    /// The frontier point the budget would choose, or without a budget
    /// the knee; `None` when no point fits the budget.
    pub chosen: Option<SweepChoice>,
    /// Live bytes per schedule step of the store-all graph (for plots).
    #[serde(skip)]
    pub timeline_before: Vec<u64>,
}

/// Seconds one recomputation solve may take by default (the exact solver
/// returns its best when it runs out), for every front end.
pub const REMAT_TIME_LIMIT_S: f64 = 10.0;

/// Budgets per strategy that [`Session::remat_sweep`] tries by default.
pub const SWEEP_POINTS: usize = 10;

/// A strategy by name, or an error listing the names.
pub fn parse_strategy(s: &str) -> Result<Strategy> {
    Strategy::parse(s).ok_or_else(|| {
        Error::new(format!(
            "unknown strategy '{s}' (auto, optimal, fast, sqrt, per-block)"
        ))
    })
}

/// The strategies [`Session::remat_sweep`] compares when none is named:
/// `auto` (the exact solver within its time limit, else `fast`), `fast`
/// (the greedy walk), and the two fixed schemes users know, `sqrt`
/// (Chen et al.'s sqrt(n) segments) and `per-block`. `optimal` is left out:
/// `auto` already runs it where it finishes.
pub const SWEEP_STRATEGIES: &[Strategy] = &[
    Strategy::Auto,
    Strategy::Fast,
    Strategy::Sqrt,
    Strategy::PerBlock,
];

/// Why [`SweepChoice`] picked its point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChoiceReason {
    /// The fewest extra FLOPs whose peak fits the budget (what
    /// [`Session::remat`] aims at with that budget).
    Budget,
    /// No budget: the knee, the point furthest below the chord from the
    /// store-all end to the least-peak end (both axes scaled to the
    /// frontier's range), i.e. the most memory saved per extra FLOP.
    Knee,
    /// No budget and no knee (a frontier of one or two points, or a
    /// straight one): the least peak.
    LeastPeak,
}

/// One point of the first swept strategy's frontier, picked by a budget or
/// as the knee, with the memory timeline of the graph rewritten with it.
#[derive(Clone, Debug, Serialize)]
pub struct SweepChoice {
    pub strategy: String,
    /// Index in that frontier's `points`.
    pub index: usize,
    pub reason: ChoiceReason,
    pub peak_bytes: u64,
    pub extra_flops_pct: f64,
    pub recomputed_nodes: usize,
    /// Live bytes per schedule step after the rewrite (for plots).
    #[serde(skip)]
    pub timeline_after: Vec<u64>,
}

/// The training graph with shapes at the dims, its problem and baseline.
struct Prepared {
    inferred: Model,
    problem: Problem,
    lower_bound: u64,
    arena: u64,
    weights: u64,
    flops: u64,
    timeline: Vec<u64>,
}

impl Session {
    /// [`Session::remat_prepare_training_with`] at the default plan options.
    fn remat_prepare_training(&mut self, dims: &DimValues) -> Result<Prepared> {
        self.remat_prepare_training_with(dims, &PlanOptions::default())
    }

    /// [`Session::remat_prepare_with`], refusing a model with no backward
    /// pass (an inference model): there is nothing to recompute for, and
    /// the budget error the solvers would give says nothing of the cause.
    fn remat_prepare_training_with(
        &mut self,
        dims: &DimValues,
        popts: &PlanOptions,
    ) -> Result<Prepared> {
        let pre = self.remat_prepare_with(dims, popts)?;
        if let Some(why) = remat::not_a_training_graph(&pre.inferred.graph, &pre.problem) {
            return Err(self.err(Error::new(format!(
                "no backward pass: remat recomputes forward values for a training graph; \
                 build one with `graphopt grad` ({why})"
            ))));
        }
        Ok(pre)
    }

    fn remat_prepare_with(&mut self, dims: &DimValues, opts: &PlanOptions) -> Result<Prepared> {
        let topo = graphopt_ir::stable_topo_order(&self.model.graph)?;
        if topo.as_slice() != self.model.graph.order() {
            self.model.graph.set_order(topo)?;
        }
        // Values of data-dependent size stay outside the arena (dynamic
        // allocations), as `graphopt plan` counts them.
        let before = plan_model(&self.model, dims, opts).map_err(|e| self.err(e))?;
        let problem = Problem::new(&before.model.graph);
        let flops = cost::graph_flops(&before.model.graph);
        let timeline = timeline(&before.model.graph, &before.plan.schedule)?;
        Ok(Prepared {
            problem,
            lower_bound: before.plan.lower_bound_bytes,
            arena: before.plan.arena_bytes,
            weights: before.plan.weights_bytes,
            flops,
            timeline,
            inferred: before.model,
        })
    }

    /// Recomputes the elementwise forward values that come cheaply from
    /// values the backward pass keeps anyway
    /// ([`solve::pointwise_from_saved`]), when that does not raise the
    /// planner's lower bound at `dims`; returns how many copies went in.
    pub(crate) fn recompute_pointwise(&mut self, dims: &DimValues) -> Result<usize> {
        // Only the lower bound is compared: no offset search.
        let popts = PlanOptions {
            search: false,
            ..PlanOptions::default()
        };
        let pre = self.remat_prepare_with(dims, &popts)?;
        let p = &pre.problem;
        let drop = solve::pointwise_from_saved(p);
        if drop == p.base_drop() {
            return Ok(0);
        }
        let mut model = self.model.clone();
        let rw = remat::rewrite(&mut model.graph, p, &drop).map_err(|e| self.err(e))?;
        graphopt_ir::verify::verify_model(&model).map_err(|e| {
            self.err(Error::verify(format!(
                "after recomputing pointwise ops: {e}"
            )))
        })?;
        let after = plan_model(&model, dims, &popts).map_err(|e| self.err(e))?;
        if after.plan.lower_bound_bytes > pre.lower_bound {
            return Ok(0);
        }
        self.model = model;
        Ok(rw.recomputed_nodes.len())
    }

    /// Rewrites the (training) model so that its peak memory fits
    /// `opts.budget`, and schedules it: see the module docs. Refuses a
    /// budget below what recomputation can reach, naming that minimum
    /// ([`crate::ErrorKind::Budget`]). Whole or not at all: on an error the
    /// session is as it was.
    pub fn remat(&mut self, opts: &RematOptions) -> Result<RematReport> {
        opts.validate()?;
        self.transact(|s| s.remat_step(opts))
    }

    fn remat_step(&mut self, opts: &RematOptions) -> Result<RematReport> {
        let t0 = Instant::now();
        let popts = PlanOptions {
            donate: opts.donate,
            ..PlanOptions::default()
        };
        let pre = self.remat_prepare_training_with(&opts.dims, &popts)?;
        let budget = opts.budget.bytes(pre.lower_bound);
        let p = &pre.problem;
        let sim_all = p.simulate(&vec![false; p.len()]).peak.max(1);
        let ratio = pre.lower_bound as f64 / sim_all as f64;
        // Simulated budgets to try: scaled by the store-all ratio, then
        // the budget itself, then tighter.
        let mut tries: Vec<u64> = vec![(budget as f64 / ratio.max(1e-9)) as u64, budget];
        for k in 1..CALIBRATION_ROUNDS.saturating_sub(1) {
            tries.push((budget as f64 * 0.93f64.powi(k as i32)) as u64);
        }
        tries.dedup();
        let mut chosen = None;
        if budget >= pre.lower_bound {
            chosen = Some((vec![false; p.len()], false, Strategy::Auto));
        } else {
            for b in tries {
                let Some(sol) = solve(p, opts.strategy, b, opts.time_limit) else {
                    continue;
                };
                let real = real_peak(&pre.inferred, p, &sol.drop, opts.donate)?;
                if real <= budget {
                    chosen = Some((sol.drop, sol.proven_optimal, sol.strategy));
                    break;
                }
            }
        }
        let solve_seconds = t0.elapsed().as_secs_f64();
        let Some((drop, proven, used)) = chosen else {
            let (least, _) = solve::least_peak(p, opts.time_limit);
            let min = real_peak(&pre.inferred, p, &least, opts.donate)?.min(pre.lower_bound);
            let msg = if min > budget {
                format!(
                    "budget {} is below the least peak recomputation reaches here: {} ({min} bytes; \
                     store-all {})",
                    human_bytes(budget),
                    human_bytes(min),
                    human_bytes(pre.lower_bound)
                )
            } else {
                // `auto` already runs the best solver that finishes: between
                // the least peak and a little above it, the solvers' drop
                // sets can miss the budget on the real planner (seen on
                // resnet18 at 80% of store-all), so more budget is the fix.
                let hint = if opts.strategy == Strategy::Auto {
                    "try a larger budget"
                } else {
                    "try --strategy auto"
                };
                format!(
                    "the {} strategy finds no drop set within the budget {} (the least peak \
                     recomputation reaches here is {}, {min} bytes; {hint})",
                    opts.strategy.name(),
                    human_bytes(budget),
                    human_bytes(min)
                )
            };
            return Err(self.err(Error::budget(msg)));
        };
        let mut model = self.model.clone();
        let rw = remat::rewrite(&mut model.graph, p, &drop).map_err(|e| self.err(e))?;
        let after = plan_model(&model, &opts.dims, &popts).map_err(|e| self.err(e))?;
        model
            .graph
            .set_order(after.plan.schedule.clone())
            .map_err(|e| self.err(e))?;
        graphopt_ir::verify::verify_model(&model)
            .map_err(|e| self.err(Error::verify(format!("after remat: {e}"))))?;
        let flops_after = cost::graph_flops(&after.model.graph);
        let timeline_after = timeline(&after.model.graph, &after.plan.schedule)?;
        self.model = model;
        Ok(RematReport {
            strategy: used.name().to_string(),
            proven_optimal: proven,
            budget_bytes: budget,
            lower_bound_before_bytes: pre.lower_bound,
            lower_bound_after_bytes: after.plan.lower_bound_bytes,
            arena_before_bytes: pre.arena,
            arena_after_bytes: after.plan.arena_bytes,
            weights_bytes: pre.weights,
            donated_bytes: after.plan.donated_bytes,
            flops_before: pre.flops,
            flops_after,
            recomputed_nodes: rw.recomputed_nodes,
            dropped_values: rw.dropped_values,
            solve_seconds,
            torch_policy: torch_policy(&after.model.graph),
            timeline_before: pre.timeline,
            timeline_after,
        })
    }

    /// The Pareto frontier (planner's peak against extra FLOPs) of each
    /// strategy in `strategies` ([`SWEEP_STRATEGIES`] when empty), at
    /// `points` budgets between store-all and the least reachable (`sqrt`
    /// and `per-block`: their strides). The model is not changed. The knee
    /// of the first strategy's frontier is [`RematSweep::chosen`].
    pub fn remat_sweep(
        &mut self,
        dims: &DimValues,
        strategies: &[Strategy],
        points: usize,
        time_limit: Duration,
    ) -> Result<RematSweep> {
        self.remat_sweep_with_budget(dims, strategies, points, time_limit, None)
    }

    /// [`Session::remat_sweep`], with [`RematSweep::chosen`] the point of
    /// the first strategy's frontier that `budget` picks (the fewest extra
    /// FLOPs within it) when one is given, and the knee otherwise; the
    /// chosen drop set is rewritten and scheduled for its memory timeline.
    pub fn remat_sweep_with_budget(
        &mut self,
        dims: &DimValues,
        strategies: &[Strategy],
        points: usize,
        time_limit: Duration,
        budget: Option<Budget>,
    ) -> Result<RematSweep> {
        let strategies = if strategies.is_empty() {
            SWEEP_STRATEGIES
        } else {
            strategies
        };
        crate::validate::remat_sweep(dims, strategies, points, time_limit)?;
        // remat_prepare puts the graph in topological order; a failure
        // after it leaves the session as it was.
        self.transact(|s| s.sweep_step(dims, strategies, points, time_limit, budget))
    }

    fn sweep_step(
        &mut self,
        dims: &DimValues,
        strategies: &[Strategy],
        points: usize,
        time_limit: Duration,
        budget: Option<Budget>,
    ) -> Result<RematSweep> {
        let pre = self.remat_prepare_training(dims)?;
        let p = &pre.problem;
        let mut frontiers = Vec::new();
        // The drop sets of the first frontier's points, by index.
        let mut first_drops: Vec<Vec<bool>> = Vec::new();
        for (si, &s) in strategies.iter().enumerate() {
            let t0 = Instant::now();
            let (sols, longest) = solve::frontier(p, s, points, time_limit);
            let mut pts = Vec::new();
            for (k, sol) in sols.iter().enumerate() {
                let real = real_peak(&pre.inferred, p, &sol.drop, true)?;
                pts.push((
                    k,
                    FrontierPoint {
                        peak_bytes: real,
                        peak_fraction: real as f64 / pre.lower_bound.max(1) as f64,
                        extra_flops: sol.sim.extra_flops,
                        extra_flops_pct: 100.0 * sol.sim.extra_flops as f64
                            / pre.flops.max(1) as f64,
                        recomputed_nodes: sol.sim.clones,
                        proven_optimal: sol.proven_optimal,
                    },
                ));
            }
            // Pareto on the real peak.
            pts.sort_by_key(|(_, a)| (a.peak_bytes, a.extra_flops));
            let mut front: Vec<FrontierPoint> = Vec::new();
            for (k, q) in pts {
                if front.last().is_none_or(|l| q.extra_flops < l.extra_flops) {
                    front.push(q);
                    if si == 0 {
                        first_drops.push(sols[k].drop.clone());
                    }
                }
            }
            frontiers.push(StrategyFrontier {
                strategy: s.name().to_string(),
                points: front,
                seconds: t0.elapsed().as_secs_f64(),
                max_solve_seconds: longest,
            });
        }
        let g = &pre.inferred.graph;
        let outputs_bytes = g
            .outputs
            .iter()
            .filter_map(|&v| graphopt_plan::liveness::value_size(g, v))
            .sum();
        let budget_bytes = budget.map(|b| b.bytes(pre.lower_bound));
        let chosen = match frontiers.first() {
            Some(f) => match choose(&f.points, budget_bytes) {
                Some((index, reason)) => {
                    let mut model = self.model.clone();
                    remat::rewrite(&mut model.graph, p, &first_drops[index])
                        .map_err(|e| self.err(e))?;
                    // The schedule is all a timeline needs: no offset search.
                    let popts = PlanOptions {
                        search: false,
                        ..PlanOptions::default()
                    };
                    let after = plan_model(&model, dims, &popts).map_err(|e| self.err(e))?;
                    let q = &f.points[index];
                    Some(SweepChoice {
                        strategy: f.strategy.clone(),
                        index,
                        reason,
                        peak_bytes: q.peak_bytes,
                        extra_flops_pct: q.extra_flops_pct,
                        recomputed_nodes: q.recomputed_nodes,
                        timeline_after: timeline(&after.model.graph, &after.plan.schedule)?,
                    })
                }
                None => None,
            },
            None => None,
        };
        Ok(RematSweep {
            lower_bound_store_all_bytes: pre.lower_bound,
            outputs_bytes,
            flops: pre.flops,
            nodes: p.len(),
            candidates: p.candidates.len(),
            frontiers,
            budget_bytes,
            chosen,
            timeline_before: pre.timeline,
        })
    }
}

impl Session {
    /// The largest value of `batch_dim` (default: the first symbolic input
    /// dim) at which weights + arena fit `budget` bytes once the training
    /// graph is rematerialized to the least peak the solvers reach
    /// (`fast`'s walk to its end, `sqrt`, `per-block`); bisection as
    /// [`Session::max_batch`], with memory assumed to grow with the batch.
    /// `graph` says which graph's arena counts ([`PlanGraph`]: the CPU
    /// runtime's lowered copy of the rewritten model, or the rewritten model
    /// as written), as in [`Session::max_batch`]. Returns the dim, the
    /// batch, and weights + arena there.
    pub fn max_batch_remat(
        &self,
        dims: &DimValues,
        batch_dim: Option<&str>,
        budget: u64,
        time_limit: Duration,
        graph: PlanGraph,
    ) -> Result<(String, i64, u64)> {
        crate::validate::max_batch_remat(dims, time_limit)?;
        let name = match batch_dim {
            Some(n) => n.to_string(),
            None => graphopt_plan::input_dim_names(&self.model)
                .into_iter()
                .next()
                .ok_or_else(|| self.err(Error::new("no symbolic input dim to use as the batch")))?,
        };
        let total = |b: i64| -> Result<u64> {
            let mut d = dims.clone();
            d.bound.retain(|(k, _)| *k != name);
            d.bound.push((name.clone(), b));
            let mut s = self.clone();
            let pre = s.remat_prepare_training(&d)?;
            let (least, _) = solve::least_peak(&pre.problem, time_limit);
            let mut model = s.model.clone();
            remat::rewrite(&mut model.graph, &pre.problem, &least)?;
            let plan = |m: &Model| {
                let m = match graph {
                    PlanGraph::CpuRuntime => std::borrow::Cow::Owned(lowered_copy(m).0),
                    PlanGraph::AsWritten => std::borrow::Cow::Borrowed(m),
                };
                plan_model(&m, &d, &PlanOptions::default()).map_err(|e| self.err(e))
            };
            let after = plan(&model)?;
            // Without recomputation when the rewrite plans no smaller.
            let store_all = match graph {
                PlanGraph::AsWritten => pre.arena,
                PlanGraph::CpuRuntime => plan(&s.model)?.plan.arena_bytes,
            };
            Ok(after.plan.weights_bytes + after.plan.arena_bytes.min(store_all))
        };
        let first = total(1)?;
        if first > budget {
            return Err(self.err(Error::budget(format!(
                "the budget of {} is too small even for {name}=1 with recomputation (weights + arena = {})",
                human_bytes(budget),
                human_bytes(first)
            ))));
        }
        let (mut lo, mut lo_total) = (1i64, first);
        let mut hi = None;
        while hi.is_none() {
            let b = lo.saturating_mul(2);
            if b > 1 << 30 {
                return Err(self.err(Error::new(format!(
                    "memory does not grow with '{name}' (is it the batch dim?)"
                ))));
            }
            let t = total(b)?;
            if t <= budget {
                (lo, lo_total) = (b, t);
            } else {
                hi = Some(b);
            }
        }
        let mut hi = hi.expect("set above");
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let t = total(mid)?;
            if t <= budget {
                (lo, lo_total) = (mid, t);
            } else {
                hi = mid;
            }
        }
        Ok((name, lo, lo_total))
    }
}

/// The point of a frontier (sorted by rising peak) that `budget` picks:
/// the fewest extra FLOPs within it; without a budget the knee, else the
/// least peak. `None` when no point fits the budget.
fn choose(points: &[FrontierPoint], budget: Option<u64>) -> Option<(usize, ChoiceReason)> {
    if let Some(b) = budget {
        return points
            .iter()
            .enumerate()
            .filter(|(_, q)| q.peak_bytes <= b)
            .min_by_key(|(_, q)| (q.extra_flops, q.peak_bytes))
            .map(|(i, _)| (i, ChoiceReason::Budget));
    }
    let (least, most) = (points.first()?, points.last()?);
    let dx = most.extra_flops_pct - least.extra_flops_pct;
    let dy = most.peak_fraction - least.peak_fraction;
    let mut best: Option<(usize, f64)> = None;
    if dx.abs() > 0.0 && dy.abs() > 0.0 {
        for (i, q) in points.iter().enumerate() {
            // Memory saved past the store-all end, less FLOPs spent past it,
            // both as fractions of the frontier's range.
            let saved = (most.peak_fraction - q.peak_fraction) / dy;
            let spent = (most.extra_flops_pct - q.extra_flops_pct) / dx;
            let gain = saved - spent;
            if gain > 1e-9 && best.is_none_or(|(_, g)| gain > g) {
                best = Some((i, gain));
            }
        }
    }
    match best {
        Some((i, _)) => Some((i, ChoiceReason::Knee)),
        None => Some((0, ChoiceReason::LeastPeak)),
    }
}

/// The planner's lower bound of the graph rewritten with `drop`: with the
/// model's donation table when `donate`, as `plan_model` schedules it.
fn real_peak(inferred: &Model, p: &Problem, drop: &[bool], donate: bool) -> Result<u64> {
    let mut g: Graph = inferred.graph.clone();
    remat::rewrite(&mut g, p, drop)?;
    let declared = if donate {
        declared_donations(inferred)
    } else {
        Vec::new()
    };
    let (pairs, _) = resolve(&g, &declared);
    Ok(memory_aware_schedule_donating(&g, true, true, &pairs)?.peak)
}

fn timeline(g: &Graph, schedule: &[graphopt_ir::NodeId]) -> Result<Vec<u64>> {
    let l = liveness_with(g, schedule, true)?;
    Ok(live_bytes(&l.storages, schedule.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points by rising peak, as a frontier holds them.
    fn front(pts: &[(f64, f64)]) -> Vec<FrontierPoint> {
        pts.iter()
            .map(|&(pf, pct)| FrontierPoint {
                peak_bytes: (pf * 1000.0) as u64,
                peak_fraction: pf,
                extra_flops: (pct * 100.0) as u64,
                extra_flops_pct: pct,
                recomputed_nodes: 0,
                proven_optimal: false,
            })
            .collect()
    }

    #[test]
    fn the_knee_saves_most_per_flop() {
        // 60% of the memory saved for 5% FLOPs, then 10% more for 30%.
        let f = front(&[(0.3, 35.0), (0.4, 5.0), (0.7, 2.0), (1.0, 0.0)]);
        assert_eq!(choose(&f, None), Some((1, ChoiceReason::Knee)));
        // A straight frontier has no knee: the least peak.
        let f = front(&[(0.5, 10.0), (0.75, 5.0), (1.0, 0.0)]);
        assert_eq!(choose(&f, None), Some((0, ChoiceReason::LeastPeak)));
        assert_eq!(choose(&[], None), None);
    }

    #[test]
    fn a_budget_picks_the_fewest_flops_within_it() {
        let f = front(&[(0.3, 35.0), (0.4, 5.0), (0.7, 2.0), (1.0, 0.0)]);
        assert_eq!(choose(&f, Some(700)), Some((2, ChoiceReason::Budget)));
        assert_eq!(choose(&f, Some(699)), Some((1, ChoiceReason::Budget)));
        assert_eq!(choose(&f, Some(5000)), Some((3, ChoiceReason::Budget)));
        assert_eq!(choose(&f, Some(299)), None);
    }
}
