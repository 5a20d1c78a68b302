//! What a training run reports: per step, per eval, in all; and its SVG.

use super::Metric;
use serde::Serialize;

/// One step.
#[derive(Clone, Debug, Serialize)]
pub struct StepRecord {
    /// 1-based.
    pub step: usize,
    /// 1-based.
    pub epoch: usize,
    pub loss: f64,
    pub lr: f64,
    /// Seconds since the run started, at the end of this step.
    pub time_s: f64,
    /// Seconds this step waited for its batch.
    pub data_wait_s: f64,
    /// Steps the run will take in all (for progress and ETA).
    pub total_steps: usize,
}

/// One eval pass.
#[derive(Clone, Debug, Serialize)]
pub struct EvalRecord {
    pub step: usize,
    pub epoch: usize,
    pub metric: Metric,
    pub value: f64,
    pub examples: usize,
}

/// What recomputation did to the training step (a `budget` that the
/// micro-batches alone do not meet, with `remat` on).
#[derive(Clone, Debug, Serialize)]
pub struct RecomputeRecord {
    /// The solver [`crate::Session::remat`] used.
    pub strategy: String,
    /// Nodes computed a second time in the backward pass.
    pub recomputed_nodes: usize,
    /// FLOPs of the graph holding the batch, more than without recomputation.
    pub extra_flops_pct: f64,
    /// The planner's lower bound of that graph's peak, before and after.
    pub lower_bound_before_bytes: u64,
    pub lower_bound_after_bytes: u64,
}

/// A run shared by several ranks ([`crate::distributed`]).
#[derive(Clone, Debug, Serialize)]
pub struct DistRecord {
    /// "mpi", or "solo" for one process.
    pub engine: String,
    pub scheme: crate::distributed::Scheme,
    /// This report's rank, and how many there are.
    pub rank: usize,
    pub ranks: usize,
    /// Examples each rank trains on per step.
    pub local_batch: usize,
    /// Seconds this rank spent in collectives (waiting for the others
    /// included).
    pub comm_s: f64,
    /// Gradient buckets of the last step's reductions (dp and zero1: the
    /// last micro-batch's all-reduce; zero2: the last micro-batch's
    /// reductions to each slice's owner), and how many started while the
    /// backward pass was still running.
    pub buckets: usize,
    pub buckets_overlapped: usize,
    /// Every rank's bytes, in rank order.
    pub per_rank: Vec<crate::distributed::RankBytes>,
}

/// What [`Session::train`] did.
#[derive(Clone, Debug, Serialize)]
pub struct TrainReport {
    pub data: String,
    pub examples: usize,
    pub batch: usize,
    /// Micro-batches per step, and their examples.
    pub micro_batches: usize,
    pub micro_batch: usize,
    pub budget_bytes: Option<u64>,
    /// The ranks, when the run was distributed.
    pub distributed: Option<DistRecord>,
    /// The stages, when the run was a pipeline.
    pub pipeline: Option<super::pipeline::PipelineRecord>,
    /// Recomputation, when the budget needed it.
    pub recompute: Option<RecomputeRecord>,
    /// What the step plans for: parameters, optimizer state, gradient
    /// accumulators, arenas and workspaces.
    pub planned_bytes: u64,
    /// Parameters and optimizer state the step keeps in its arena, written
    /// over by their updates (donation): held once, inside `arena_bytes`.
    pub donated_bytes: u64,
    /// Examples each epoch leaves out (the last partial batch).
    pub dropped_per_epoch: usize,
    pub steps: usize,
    pub epochs: f64,
    pub loss: String,
    pub optimizer: String,
    pub params: Vec<String>,
    pub param_elements: u64,
    /// Parameter bytes, and the optimizer state's (AdamW's moments; this
    /// rank's slice under zero1/zero2).
    pub weights_bytes: u64,
    pub state_bytes: u64,
    /// The step's planned arena and kernel workspace.
    pub arena_bytes: u64,
    pub workspace_bytes: u64,
    pub peak_rss_bytes: Option<u64>,
    pub time_s: f64,
    pub data_wait_s: f64,
    pub steps_per_s: f64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub log: Vec<StepRecord>,
    pub evals: Vec<EvalRecord>,
    pub checkpoints: Vec<String>,
    /// The checkpoint resumed from, and its step.
    pub resumed_from: Option<(String, usize)>,
    pub threads: usize,
    pub warnings: Vec<String>,
}

impl TrainReport {
    /// The step log as CSV: `step,epoch,loss,lr,time_s,data_wait_s`.
    pub fn log_csv(&self) -> String {
        let mut s = String::from("step,epoch,loss,lr,time_s,data_wait_s\n");
        for r in &self.log {
            s.push_str(&format!(
                "{},{},{},{},{:.6},{:.6}\n",
                r.step, r.epoch, r.loss, r.lr, r.time_s, r.data_wait_s
            ));
        }
        s
    }
}

/// The loss against the step (and the eval metric, on its own axis
/// below, when there is one), as an SVG.
pub fn train_svg(title: &str, r: &TrainReport) -> String {
    use graphopt_plan::svg::chart::{Axis, Plot, Series, Svg, Unit};
    const LEFT: f64 = 90.0;
    const W: f64 = 960.0;
    let evals = !r.evals.is_empty();
    let mut svg = Svg::new(W, if evals { 700.0 } else { 440.0 });
    svg.title(LEFT, 24.0, &format!("Training: {title}"));
    svg.caption(
        LEFT,
        44.0,
        &format!(
            "{} steps of {} examples, {} loss, {}; {:.2} steps/s, data wait {:.2} s",
            r.steps, r.batch, r.loss, r.optimizer, r.steps_per_s, r.data_wait_s
        ),
    );
    let loss = Series::nth("training loss", 0, 1);
    let first = r.log.first().map_or(0, |s| s.step.saturating_sub(1)) as f64;
    let last = r.log.last().map_or(1, |s| s.step) as f64;
    let hi = r.log.iter().map(|s| s.loss).fold(0.0, f64::max);
    let lo = r.log.iter().map(|s| s.loss).fold(f64::INFINITY, f64::min);
    let p = Plot::new(
        LEFT,
        70.0,
        W - LEFT - 20.0,
        300.0,
        &Axis::new("step", Unit::Count, first, last),
        &Axis::new("loss", Unit::Number, lo.min(hi).min(0.0), hi),
    );
    p.axes(&mut svg);
    let pts: Vec<(f64, f64)> = r.log.iter().map(|s| (s.step as f64, s.loss)).collect();
    p.line(&mut svg, &pts, &loss);
    if evals {
        // Its own panel: solid, in the third colour.
        let metric = Series::with_color(
            match r.evals[0].metric {
                Metric::Accuracy => "eval accuracy",
                Metric::Loss => "eval loss",
            },
            "#2ca02c",
            0,
            1,
        );
        let (unit, scale) = match r.evals[0].metric {
            Metric::Accuracy => (Unit::Percent, 100.0),
            Metric::Loss => (Unit::Number, 1.0),
        };
        let top = r.evals.iter().map(|e| e.value * scale).fold(0.0, f64::max);
        let q = Plot::new(
            LEFT,
            440.0,
            W - LEFT - 20.0,
            200.0,
            &Axis::new("step", Unit::Count, first, last),
            &Axis::new(&metric.label, unit, 0.0, top),
        );
        q.axes(&mut svg);
        let pts: Vec<(f64, f64)> = r
            .evals
            .iter()
            .map(|e| (e.step as f64, e.value * scale))
            .collect();
        q.line(&mut svg, &pts, &metric);
        svg.legend(LEFT + 10.0, 58.0, &[&loss, &metric]);
    } else {
        svg.legend(LEFT + 10.0, 58.0, &[&loss]);
    }
    svg.finish()
}
