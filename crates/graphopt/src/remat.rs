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
use crate::session::Session;
use graphopt_ir::{Graph, Model};
use graphopt_passes::remat::{self, cost, solve, Problem, Strategy};
use graphopt_plan::liveness::{live_bytes, liveness_with};
use graphopt_plan::schedule::memory_aware_schedule_with;
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
}

impl Default for RematOptions {
    fn default() -> RematOptions {
        RematOptions {
            budget: Budget::Percent(50.0),
            dims: DimValues::default(),
            strategy: Strategy::Auto,
            time_limit: Duration::from_secs(10),
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
    pub flops_before: u64,
    pub flops_after: u64,
    pub recomputed_nodes: Vec<String>,
    pub dropped_values: Vec<String>,
    pub solve_seconds: f64,
    /// Live bytes per schedule step, before and after (for plots).
    #[serde(skip)]
    pub timeline_before: Vec<u64>,
    #[serde(skip)]
    pub timeline_after: Vec<u64>,
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
    #[serde(skip)]
    pub timeline_before: Vec<u64>,
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
    fn remat_prepare(&mut self, dims: &DimValues) -> Result<Prepared> {
        self.remat_prepare_with(dims, &PlanOptions::default())
    }

    /// [`Session::remat_prepare`], refusing a model with no backward pass
    /// (an inference model): there is nothing to recompute for, and the
    /// budget error the solvers would give says nothing of the cause.
    fn remat_prepare_training(&mut self, dims: &DimValues) -> Result<Prepared> {
        let pre = self.remat_prepare(dims)?;
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
        graphopt_ir::verify::verify_model(&model)
            .map_err(|e| self.err(Error::new(format!("after recomputing pointwise ops: {e}"))))?;
        let after = plan_model(&model, dims, &popts).map_err(|e| self.err(e))?;
        if after.plan.lower_bound_bytes > pre.lower_bound {
            return Ok(0);
        }
        self.model = model;
        Ok(rw.recomputed_nodes.len())
    }

    /// Rewrites the (training) model so that its peak memory fits
    /// `opts.budget`, and schedules it: see the module docs. Refuses a
    /// budget below what recomputation can reach, naming that minimum.
    pub fn remat(&mut self, opts: &RematOptions) -> Result<RematReport> {
        opts.validate()?;
        let t0 = Instant::now();
        let pre = self.remat_prepare_training(&opts.dims)?;
        let budget = match opts.budget {
            Budget::Bytes(b) => b,
            Budget::Percent(p) => (pre.lower_bound as f64 * p / 100.0) as u64,
        };
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
                let real = real_peak(&pre.inferred, p, &sol.drop)?;
                if real <= budget {
                    chosen = Some((sol.drop, sol.proven_optimal, sol.strategy));
                    break;
                }
            }
        }
        let solve_seconds = t0.elapsed().as_secs_f64();
        let Some((drop, proven, used)) = chosen else {
            let (least, _) = solve::least_peak(p, opts.time_limit);
            let min = real_peak(&pre.inferred, p, &least)?.min(pre.lower_bound);
            let msg = if min > budget {
                format!(
                    "budget {} is below the least peak recomputation reaches here: {} ({min} bytes; \
                     store-all {})",
                    human_bytes(budget),
                    human_bytes(min),
                    human_bytes(pre.lower_bound)
                )
            } else {
                format!(
                    "the {} strategy finds no drop set within the budget {} (the least peak \
                     recomputation reaches here is {}, {min} bytes; try --strategy auto)",
                    opts.strategy.name(),
                    human_bytes(budget),
                    human_bytes(min)
                )
            };
            return Err(self.err(Error::new(msg)));
        };
        let mut model = self.model.clone();
        let rw = remat::rewrite(&mut model.graph, p, &drop).map_err(|e| self.err(e))?;
        let popts = PlanOptions::default();
        let after = plan_model(&model, &opts.dims, &popts).map_err(|e| self.err(e))?;
        model
            .graph
            .set_order(after.plan.schedule.clone())
            .map_err(|e| self.err(e))?;
        graphopt_ir::verify::verify_model(&model)
            .map_err(|e| self.err(Error::new(format!("after remat: {e}"))))?;
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
            flops_before: pre.flops,
            flops_after,
            recomputed_nodes: rw.recomputed_nodes,
            dropped_values: rw.dropped_values,
            solve_seconds,
            timeline_before: pre.timeline,
            timeline_after,
        })
    }

    /// The Pareto frontier (planner's peak against extra FLOPs) of each
    /// strategy in `strategies`, at `points` budgets between store-all and
    /// the least reachable (`sqrt` and `per-block`: their strides). The
    /// model is not changed.
    pub fn remat_sweep(
        &mut self,
        dims: &DimValues,
        strategies: &[Strategy],
        points: usize,
        time_limit: Duration,
    ) -> Result<RematSweep> {
        crate::validate::remat_sweep(dims, strategies, points, time_limit)?;
        let pre = self.remat_prepare_training(dims)?;
        let p = &pre.problem;
        let mut frontiers = Vec::new();
        for &s in strategies {
            let t0 = Instant::now();
            let (sols, longest) = solve::frontier(p, s, points, time_limit);
            let mut pts = Vec::new();
            for sol in &sols {
                let real = real_peak(&pre.inferred, p, &sol.drop)?;
                pts.push(FrontierPoint {
                    peak_bytes: real,
                    peak_fraction: real as f64 / pre.lower_bound.max(1) as f64,
                    extra_flops: sol.sim.extra_flops,
                    extra_flops_pct: 100.0 * sol.sim.extra_flops as f64 / pre.flops.max(1) as f64,
                    recomputed_nodes: sol.sim.clones,
                    proven_optimal: sol.proven_optimal,
                });
            }
            // Pareto on the real peak.
            pts.sort_by_key(|a| (a.peak_bytes, a.extra_flops));
            let mut front: Vec<FrontierPoint> = Vec::new();
            for q in pts {
                if front.last().is_none_or(|l| q.extra_flops < l.extra_flops) {
                    front.push(q);
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
        Ok(RematSweep {
            lower_bound_store_all_bytes: pre.lower_bound,
            outputs_bytes,
            flops: pre.flops,
            nodes: p.len(),
            candidates: p.candidates.len(),
            frontiers,
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
    /// Returns the dim, the batch, and weights + arena there.
    pub fn max_batch_remat(
        &self,
        dims: &DimValues,
        batch_dim: Option<&str>,
        budget: u64,
        time_limit: Duration,
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
            let after = plan_model(&model, &d, &PlanOptions::default()).map_err(|e| self.err(e))?;
            Ok(after.plan.weights_bytes + after.plan.arena_bytes.min(pre.arena))
        };
        let first = total(1)?;
        if first > budget {
            return Err(self.err(Error::new(format!(
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

/// The planner's lower bound of the graph rewritten with `drop`.
fn real_peak(inferred: &Model, p: &Problem, drop: &[bool]) -> Result<u64> {
    let mut g: Graph = inferred.graph.clone();
    remat::rewrite(&mut g, p, drop)?;
    Ok(memory_aware_schedule_with(&g, true, true)?.peak)
}

fn timeline(g: &Graph, schedule: &[graphopt_ir::NodeId]) -> Result<Vec<u64>> {
    let l = liveness_with(g, schedule, true)?;
    Ok(live_bytes(&l.storages, schedule.len()))
}

/// An SVG with the frontiers (peak fraction against extra FLOPs %) and,
/// when given, the memory timelines before and after.
pub fn remat_svg(
    title: &str,
    frontiers: &[StrategyFrontier],
    before: &[u64],
    after: Option<&[u64]>,
) -> String {
    let (w, h, pad) = (900.0f64, 300.0f64, 70.0f64);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"{pad}\" y=\"20\" font-size=\"14\">{}</text>\n",
        w + 2.0 * pad,
        2.0 * h + 4.0 * pad,
        esc(title)
    );
    // Panel 1: frontier.
    let xmax = frontiers
        .iter()
        .flat_map(|f| f.points.iter().map(|p| p.extra_flops_pct))
        .fold(1.0f64, f64::max);
    let y0 = pad;
    s += &format!(
        "<rect x=\"{pad}\" y=\"{y0}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#888\"/>\n<text x=\"{pad}\" y=\"{}\">peak / store-all (0..1) against extra FLOPs % (0..{xmax:.1})</text>\n",
        y0 - 6.0
    );
    for (k, f) in frontiers.iter().enumerate() {
        let c = colors[k % colors.len()];
        let pts: Vec<String> = f
            .points
            .iter()
            .map(|p| {
                format!(
                    "{:.1},{:.1}",
                    pad + w * p.extra_flops_pct / xmax,
                    y0 + h * (1.0 - p.peak_fraction.min(1.0))
                )
            })
            .collect();
        s += &format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>\n<text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>\n",
            pts.join(" "),
            pad + w - 120.0,
            y0 + 16.0 * (k as f64 + 1.0),
            esc(&f.strategy)
        );
        for p in &pts {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            s += &format!("<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{c}\"/>\n");
        }
    }
    // Panel 2: timelines.
    let y1 = y0 + h + 2.0 * pad;
    let series: Vec<(&str, &[u64], &str)> = std::iter::once(("before", before, "#d62728"))
        .chain(after.map(|a| ("after", a, "#1f77b4")))
        .collect();
    let ymax = series
        .iter()
        .flat_map(|x| x.1.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let tmax = series.iter().map(|x| x.1.len()).max().unwrap_or(1).max(1) as f64;
    s += &format!(
        "<rect x=\"{pad}\" y=\"{y1}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#888\"/>\n<text x=\"{pad}\" y=\"{}\">live bytes per schedule step (max {})</text>\n",
        y1 - 6.0,
        human_bytes(ymax as u64)
    );
    for (k, (name, v, c)) in series.iter().enumerate() {
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                format!(
                    "{:.1},{:.1}",
                    pad + w * i as f64 / tmax,
                    y1 + h * (1.0 - b as f64 / ymax)
                )
            })
            .collect();
        s += &format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\"/>\n<text x=\"{}\" y=\"{}\" fill=\"{c}\">{name}</text>\n",
            pts.join(" "),
            pad + w - 120.0,
            y1 + 16.0 * (k as f64 + 1.0)
        );
    }
    s += "</svg>\n";
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
