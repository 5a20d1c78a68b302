//! [`Session::partition_within`]: pipeline cuts under per-device budgets
//! (issue 24, `graphopt partition --budget`).
//!
//! Among the cuts whose every stage's planned bytes fit its device, the
//! one whose slowest stage (forward FLOPs) is least:
//! 1. the FLOPs-balanced cuts ([`Session::partition`]), planned exactly
//!    ([`Session::plan_pipeline`]); if every stage fits, they are the
//!    answer;
//! 2. otherwise a search over every allowed cut ([`Cutter::search`],
//!    dynamic programming) keeps only stages whose *estimate* fits. A
//!    stage planned already is estimated at its exact bytes; another at
//!    its parameters × the least bytes per parameter byte (weights,
//!    gradients, optimizer state) the stages planned so far showed, plus
//!    the inputs it receives or reads times the micro-batches it holds
//!    ([`crate::partition::Schedule::held`]), plus the bytes of the activations its nodes
//!    make × the least arena per activation byte seen; or, when more, the
//!    weights, state and arenas of the largest stage planned inside it plus
//!    its own inputs in flight. The estimate leans low, so that a cut that
//!    fits is not ruled out for a guess (it assumes a stage's arenas do not
//!    shrink as it grows);
//! 3. the cuts found are planned exactly, and become exact in the
//!    estimate; the search runs again until its cuts fit, at most
//!    [`ROUNDS`] times. Each round plans one more range exactly, so it
//!    ends with the least slowest stage among the cuts the estimate lets
//!    through.
//!
//! No cut fitting (by the estimate), or none found in [`ROUNDS`] searches,
//! is a [`crate::ErrorKind::Budget`] error naming what the FLOPs-balanced
//! cuts plan per stage.

use super::data::DataSource;
use super::pipeline::StageRecord;
use super::TrainOptions;
use crate::error::{Error, Result};
use crate::partition::{Cutter, Partition, PartitionOptions};
use crate::session::Session;
use graphopt_plan::{human_bytes, DimValues};
use std::collections::HashMap;

/// Searches after the FLOPs-balanced cuts, at most.
const ROUNDS: usize = 16;

/// What exact plans taught the estimate.
#[derive(Default)]
struct Learned {
    /// Bytes a stage holds per byte of its parameters (weights, gradients,
    /// optimizer state): the least ratio among the stages planned.
    per_param: Option<f64>,
    /// The least arena bytes per byte of activations a stage's nodes make
    /// among the stages planned.
    arena: Option<f64>,
    /// The stages planned, by (start, end, stage): their exact bytes, and
    /// those without their inputs in flight.
    exact: HashMap<(usize, usize, usize), (u64, u64)>,
}

fn least(x: &mut Option<f64>, ratio: f64) {
    *x = Some(x.map_or(ratio, |x| x.min(ratio)));
}

impl Learned {
    fn learn(&mut self, c: &Cutter, cuts: &[usize], records: &[StageRecord]) {
        for (&(a, b), r) in c.ranges(cuts).iter().zip(records) {
            let total = r.total();
            self.exact
                .insert((a, b, r.stage), (total, total - r.in_flight_bytes));
            let params = c.param_bytes(a, b);
            if params > 0 {
                let held = r.weights_bytes + r.optimizer_state_bytes + r.gradient_bytes;
                least(&mut self.per_param, held as f64 / params as f64);
            }
            let act = c.activation_bytes(a, b);
            if act > 0 {
                least(&mut self.arena, r.arena_bytes as f64 / act as f64);
            }
        }
    }

    fn estimate(&self, c: &Cutter, a: usize, b: usize, stage: usize, held: usize) -> u64 {
        if let Some(&(e, _)) = self.exact.get(&(a, b, stage)) {
            return e;
        }
        // A stage holds at least the weights, state and arenas of a stage
        // planned inside it, besides its own inputs in flight.
        let inside = self
            .exact
            .iter()
            .filter(|(&(a2, b2, s2), _)| s2 == stage && a <= a2 && b2 <= b)
            .map(|(_, &(_, without))| without + c.input_bytes(a, b) * held as u64)
            .max()
            .unwrap_or(0);
        let guess = c.held_bytes(a, b, self.per_param.unwrap_or(0.0), held)
            + (c.activation_bytes(a, b) as f64 * self.arena.unwrap_or(0.0)) as u64;
        guess.max(inside)
    }
}

impl Session {
    /// [`Session::partition`], planned ([`Session::plan_pipeline`] for
    /// `train` on `data`) and under per-device budgets: `budgets` holds one
    /// size for every stage, one per stage, or none (no bound: the
    /// FLOPs-balanced cuts). The cuts are the ones whose slowest stage
    /// (forward FLOPs) is least among those whose every stage's planned
    /// bytes fit its budget (see the module doc). Returns the partition and
    /// its stages' plans.
    pub fn partition_within(
        &self,
        opts: &PartitionOptions,
        data: &dyn DataSource,
        train: &TrainOptions,
        budgets: &[u64],
    ) -> Result<(Partition, Vec<StageRecord>)> {
        let k = opts.stages;
        if budgets.len() > 1 && budgets.len() != k {
            return Err(Error::new(format!(
                "--budget: {} sizes for {k} stages: give one size, or one per stage",
                budgets.len()
            )));
        }
        let have = |s: usize| match budgets {
            [] => u64::MAX,
            [one] => *one,
            each => each[s],
        };
        let fits = |r: &[StageRecord]| r.iter().all(|x| x.total() <= have(x.stage));
        // The model's types at the micro-batch's shapes.
        let micro = train.micro_batches.unwrap_or(opts.micro_batches);
        let feed = self.first_micro_batch(data, train, micro)?;
        let g = &self.model.graph;
        let shapes = g
            .runtime_inputs()
            .filter_map(|v| {
                let t = feed.get(g.name(v))?;
                Some((
                    g.name(v).to_string(),
                    t.shape.iter().map(|&d| d as i64).collect(),
                ))
            })
            .collect();
        let c = Cutter::new(
            self,
            opts,
            &DimValues {
                bound: opts.dims.clone(),
                shapes,
                default: None,
            },
        )?;
        let mut cuts = c.balanced()?;
        let mut p = c.build(&cuts);
        let mut planned = self.plan_pipeline(&p, data, train)?;
        let balanced: Vec<u64> = planned.iter().map(StageRecord::total).collect();
        let mut learned = Learned::default();
        // Whether the search ran out of cuts (rather than of rounds).
        let mut none = false;
        for _ in 0..ROUNDS {
            if fits(&planned) {
                return Ok((p, planned));
            }
            learned.learn(&c, &cuts, &planned);
            let held = |s: usize| opts.schedule.held(micro, k, s);
            let Some(next) = c.search(&|a, b, s| learned.estimate(&c, a, b, s, held(s)) <= have(s))
            else {
                none = true;
                break;
            };
            cuts = next;
            p = c.build(&cuts);
            planned = self.plan_pipeline(&p, data, train)?;
        }
        if fits(&planned) {
            return Ok((p, planned));
        }
        let list = |xs: &mut dyn Iterator<Item = u64>| -> String {
            xs.map(human_bytes).collect::<Vec<_>>().join(" / ")
        };
        let what = if none {
            format!("no cut into {k} stages fits")
        } else {
            format!("no cut into {k} stages that fits was found in {ROUNDS} searches")
        };
        Err(self.err(Error::budget(format!(
            "--budget {}: {what} (the FLOPs-balanced cuts plan {} per stage); try more stages or micro-batches, or --schedule 1f1b",
            list(&mut budgets.iter().copied()),
            list(&mut balanced.into_iter()),
        ))))
    }
}
