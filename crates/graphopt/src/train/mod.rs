//! [`Session::train`]: trains the session's model with graphopt's training
//! step, run in graphopt's runtime, and leaves the trained weights in the
//! session's (inference) model.
//!
//! How a run goes:
//! 1. The training step is built once: [`Session::grad`] on a copy of the
//!    model, with the optimizer and the parameters as graph inputs. With an
//!    optimizer the gradients are not graph outputs: each dies once its
//!    update has read it.
//! 2. It is planned once for the batch's shapes and bound to the CPU
//!    runtime. The model's donation table (written by `grad`) lets each
//!    `<name>_new` output be written over its input: the parameters and
//!    the optimizer state live in the step's arena, held once, and stay
//!    there from step to step.
//!    - With `micro_batches`, the gradients of equal slices of the batch
//!      are summed (averaged for a mean loss) and a separate update graph
//!      steps once: the whole batch's update, within float rounding.
//!    - With a `budget`, the largest micro-batch whose planned bytes
//!      (parameters, optimizer state, accumulators, arenas, workspaces)
//!      fit is chosen. Where a micro-batch does not fit as it is, and
//!      `remat` is on, [`Session::remat`] first rewrites the graph that
//!      holds the batch to recompute forward values, aimed at the bytes
//!      missing (at most `REMAT_TRIES` plans per micro-batch count).
//! 3. Batches come from a [`DataSource`]. Each epoch visits the examples
//!    in a permutation drawn from `seed` and the epoch number (or in order
//!    without `shuffle`). The last partial batch of an epoch is dropped (a
//!    batch of another size would be another plan), and the report says
//!    how many examples that leaves out. [`MappedData`] reads files in
//!    place (memory-mapped), [`ArrayData`] holds arrays in memory. The next batch is gathered on a
//!    second thread while the step runs; the time the step loop waits for
//!    it is reported.
//! 4. A loss that is not finite stops the run with an error naming the
//!    step; checkpoints already written stay.
//! 5. Checkpoints (`checkpoint`, every `every` steps and at the end) are
//!    npz files of the parameters, the optimizer state and the position in
//!    the data (`__step`), written atomically. Resuming from one replays the
//!    same permutation from that position, so that the losses equal those
//!    of an uninterrupted run bit for bit (same threads and options).
//! 6. On success the session's model is the model it had, with its
//!    trainable initializers set to the trained values: saving it writes a
//!    plain inference model. On an error the session is unchanged.
//!
//! Not yet: CUDA (the step runs on the CPU runtime only).

use crate::distributed::{Collective, RankBytes, Scheme, Solo};
use crate::error::{Error, ErrorKind, Result};
use crate::grad::{Loss, OptimizerSpec};
use crate::run::{peak_rss_bytes, to_tract};
use crate::session::Session;
use crate::util::write_atomic;
use graphopt_autodiff::Optimizer;
use graphopt_exec::HostTensor;
use graphopt_ir::Tensor;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

mod checkpoint;
mod cuts;
mod data;
mod dist;
mod eval;
mod pipeline;
mod report;
mod step;

pub(crate) use data::read_npz;
pub use data::{epoch_permutation, ArrayData, DataSource, MappedData};
pub use pipeline::{PipelineRecord, StageRecord};
pub use report::{train_svg, DistRecord, EvalRecord, RecomputeRecord, StepRecord, TrainReport};

use checkpoint::{
    checkpoint_file, resume, scalar_i64, BATCH_KEY, EXAMPLES_KEY, SEED_KEY, SHUFFLE_KEY, STEP_KEY,
};
use data::{check_arrays, check_feed, to_feed};
use eval::EvalRunner;
use step::{host_of, StepGraphs};

/// How long to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainLength {
    Epochs(usize),
    Steps(usize),
}

/// The default of [`TrainOptions::bucket_bytes`].
pub const DEFAULT_BUCKET_BYTES: u64 = 25 << 20;

/// `--remat auto|none` of `train`: whether a budget may use recomputation.
pub fn parse_train_remat(s: &str) -> Result<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(true),
        "none" => Ok(false),
        _ => Err(Error::new(format!("--remat {s}: expected auto or none"))),
    }
}

/// What the eval pass measures after each epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// The share of positions whose arg-max over the class axis is the
    /// target (classification outputs).
    #[default]
    Accuracy,
    /// The training loss on the eval data (its full batches).
    Loss,
}

impl Metric {
    pub fn parse(s: &str) -> Result<Metric> {
        match s.trim().to_ascii_lowercase().as_str() {
            "accuracy" => Ok(Metric::Accuracy),
            "loss" => Ok(Metric::Loss),
            _ => Err(Error::new(format!(
                "--metric {s}: expected accuracy or loss"
            ))),
        }
    }
}

/// What [`Session::train`] does.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub loss: Loss,
    /// The output the loss reads (default: the first).
    pub output: Option<String>,
    /// The data array holding the loss's target (fed to the training
    /// graph's `target` input). Default `target`.
    pub target: String,
    /// Class axis of `cross_entropy` (default 1; -1 for `[batch, seq,
    /// vocab]` logits).
    pub class_axis: i64,
    /// Default: SGD with torch's defaults.
    pub optimizer: OptimizerSpec,
    /// Globs of trainable / frozen initializers, as `grad`'s.
    pub trainable: Vec<String>,
    pub frozen: Vec<String>,
    /// Dropout in training mode (default true, as torch's `model.train()`).
    pub dropout_train: bool,
    pub batch: usize,
    pub length: TrainLength,
    pub seed: u64,
    pub shuffle: bool,
    /// Threads of the runtime (default: the planner's default).
    pub threads: Option<usize>,
    pub metric: Metric,
    /// Write checkpoints into this folder (created if missing).
    pub checkpoint: Option<PathBuf>,
    /// Steps between checkpoints (and one at the end). Default 100.
    pub every: usize,
    /// Continue from the latest checkpoint in this folder (or this file).
    pub resume: Option<PathBuf>,
    /// Split each batch into this many equal micro-batches: their
    /// gradients are accumulated (averaged for a mean loss) and the
    /// optimizer steps once per batch, as it would on the whole batch.
    pub micro_batches: Option<usize>,
    /// Bytes the step may plan for: parameters, optimizer state, gradient
    /// accumulators, arenas and workspaces. Without `micro_batches`, the
    /// fewest micro-batches that fit are chosen.
    pub budget: Option<u64>,
    /// Under a `budget`, recompute forward values in the backward pass
    /// where the micro-batches alone do not fit (default true): the
    /// largest micro-batch that fits, with recomputation if needed, wins.
    pub remat: bool,
    /// Several ranks share each batch ([`crate::distributed`]): run
    /// through [`Session::train_on`] with the communicator. `batch` is the
    /// global batch; each rank gets `batch / ranks` of its examples, and
    /// `micro_batches` and `budget` apply per rank.
    pub distributed: Option<Scheme>,
    /// dp and zero1: bytes of a bucket of gradients, all-reduced as soon
    /// as the backward pass has made all of its gradients, while the rest
    /// of the pass runs (default 25 MiB, as torch's DDP).
    pub bucket_bytes: u64,
}

impl TrainOptions {
    /// Cross-entropy, SGD, `batch` examples, one epoch, seed 0, shuffled.
    pub fn new(batch: usize) -> TrainOptions {
        TrainOptions {
            loss: Loss::CrossEntropy,
            output: None,
            target: "target".into(),
            class_axis: 1,
            optimizer: OptimizerSpec::named("sgd"),
            trainable: Vec::new(),
            frozen: Vec::new(),
            dropout_train: true,
            batch,
            length: TrainLength::Epochs(1),
            seed: 0,
            shuffle: true,
            threads: None,
            metric: Metric::Accuracy,
            checkpoint: None,
            every: 100,
            resume: None,
            micro_batches: None,
            budget: None,
            remat: true,
            distributed: None,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
        }
    }

    /// Steps per epoch over `n` examples (the last partial batch left
    /// out), and steps in all.
    pub fn steps(&self, n: usize) -> (usize, usize) {
        let per_epoch = n / self.batch.max(1);
        let total = match self.length {
            TrainLength::Epochs(e) => e * per_epoch,
            TrainLength::Steps(s) => s,
        };
        (per_epoch, total)
    }

    /// The examples at positions `within` (of `0..batch`) of step `step`'s
    /// batch: the epoch's permutation of `n` examples (drawn from `seed`
    /// and the epoch), or file order without `shuffle`.
    pub fn batch_order(&self, n: usize, step: usize, within: std::ops::Range<usize>) -> Vec<usize> {
        let per_epoch = (n / self.batch.max(1)).max(1);
        let at = (step % per_epoch) * self.batch;
        let range = at + within.start..at + within.end;
        if self.shuffle {
            epoch_permutation(n, self.seed, step / per_epoch)[range].to_vec()
        } else {
            range.collect()
        }
    }

    /// Refuses a zero batch, length or checkpoint interval, zero threads,
    /// an optimizer other than sgd or adamw, and an empty target name.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 {
            return Err(Error::new("--batch 0: expected at least 1"));
        }
        match self.length {
            TrainLength::Epochs(0) => return Err(Error::new("--epochs 0: expected at least 1")),
            TrainLength::Steps(0) => return Err(Error::new("--steps 0: expected at least 1")),
            _ => {}
        }
        if self.every == 0 {
            return Err(Error::new("--every 0: expected at least 1"));
        }
        if let Some(n) = self.threads {
            crate::validate::run_threads("--threads", n)?;
        }
        if let Some(m) = self.micro_batches {
            if m == 0 || !self.batch.is_multiple_of(m) {
                return Err(Error::new(format!(
                    "--micro-batches {m}: the batch of {} does not split into {m} equal micro-batches",
                    self.batch
                )));
            }
        }
        if self.bucket_bytes == 0 {
            return Err(Error::new("--bucket-size 0: expected a number of bytes"));
        }
        if self.budget == Some(0) {
            return Err(Error::new("--budget 0: expected a number of bytes"));
        }
        if self.target.trim().is_empty() {
            return Err(Error::new("--target: expected an array name"));
        }
        match self.optimizer.build()? {
            Optimizer::None => Err(Error::new(
                "training needs an optimizer: --optimizer sgd or adamw",
            )),
            _ => Ok(()),
        }
    }
}

/// The state a step reads and replaces: parameters and optimizer state.
type State = BTreeMap<String, HostTensor>;

impl Session {
    /// The main graph's initializers as host tensors, by name, in graph
    /// order (`names` empty: all of them). A name that is not an
    /// initializer is an error naming it.
    pub fn weights(&self, names: &[String]) -> Result<Vec<(String, HostTensor)>> {
        let g = &self.model.graph;
        for n in names {
            if g.value_by_name(n).and_then(|v| g.initializer(v)).is_none() {
                return Err(Error::new(format!(
                    "'{n}' is not an initializer of the model"
                )));
            }
        }
        g.initializers()
            .iter()
            .filter(|&&v| names.is_empty() || names.iter().any(|n| n == g.name(v)))
            .filter_map(|&v| g.initializer(v).map(|t| (g.name(v).to_string(), t)))
            .map(|(n, t)| Ok((n.clone(), host_of(t, &n)?)))
            .collect()
    }
}

impl Session {
    /// Trains the model on `data` (see the module doc); `eval`, when given,
    /// is measured after every epoch and at the end. Whole or not at all: on
    /// an error the session keeps its weights.
    pub fn train(
        &mut self,
        data: &dyn DataSource,
        eval: Option<&dyn DataSource>,
        opts: &TrainOptions,
    ) -> Result<TrainReport> {
        self.train_with(data, eval, opts, &mut |_| {})
    }

    /// [`Session::train`], calling `progress` after every step (the CLI
    /// draws its progress bar from it).
    pub fn train_with(
        &mut self,
        data: &dyn DataSource,
        eval: Option<&dyn DataSource>,
        opts: &TrainOptions,
        progress: &mut dyn FnMut(&StepRecord),
    ) -> Result<TrainReport> {
        if let Some(s) = opts.distributed {
            return Err(Error::new(format!(
                "--distributed {}: train through Session::train_on with the communicator (graphopt::distributed::World)",
                s.name()
            )));
        }
        self.train_on(&Solo, data, eval, opts, progress)
    }

    /// [`Session::train_with`] as one rank of `comm`: with
    /// `opts.distributed`, this rank trains on its share of each batch and
    /// the ranks sum their gradients (see [`crate::distributed`]). Rank 0
    /// writes the checkpoints and alone measures `eval`; every rank ends
    /// with the same trained weights.
    pub fn train_on(
        &mut self,
        comm: &dyn Collective,
        data: &dyn DataSource,
        eval: Option<&dyn DataSource>,
        opts: &TrainOptions,
        progress: &mut dyn FnMut(&StepRecord),
    ) -> Result<TrainReport> {
        opts.validate()?;
        self.transact(|s| s.train_step(comm, data, eval, opts, progress))
    }

    fn train_step(
        &mut self,
        comm: &dyn Collective,
        data: &dyn DataSource,
        eval: Option<&dyn DataSource>,
        opts: &TrainOptions,
        progress: &mut dyn FnMut(&StepRecord),
    ) -> Result<TrainReport> {
        let t0 = Instant::now();
        let n = data.examples();
        if n < opts.batch {
            return Err(Error::new(format!(
                "--batch {}: {} has only {n} examples",
                opts.batch,
                data.label()
            )));
        }
        let optimizer = opts.optimizer.build()?;
        let lr = learning_rate(optimizer);
        // 0. This rank's share of each batch; the ranks agree on the model
        //    and the options or all refuse.
        let (rank, ranks) = (comm.rank(), comm.ranks());
        let scheme = opts.distributed.unwrap_or(Scheme::Dp);
        if !opts.batch.is_multiple_of(ranks) {
            return Err(Error::new(format!(
                "--batch {}: does not split into {ranks} ranks' equal shares",
                opts.batch
            )));
        }
        let local = opts.batch / ranks;
        if let Some(m) = opts.micro_batches.filter(|m| !local.is_multiple_of(*m)) {
            return Err(Error::new(format!(
                "--micro-batches {m}: each rank's {local} examples do not split into {m} equal micro-batches"
            )));
        }
        if opts.distributed.is_some() {
            agree(comm, &self.model, opts, n)?;
        }
        // The options of one rank: its share of the batch.
        let lopts = TrainOptions {
            batch: local,
            ..opts.clone()
        };
        let lopts = &lopts;
        // 1. The step's graphs, and the micro-batch count: given, chosen
        //    under the budget (the largest micro-batch that fits, with
        //    recomputation if needed: `StepGraphs::fit`), or one.
        let first = data.gather(&(rank * local..(rank + 1) * local).collect::<Vec<_>>())?;
        check_arrays(&self.model.graph, &first, data, lopts)?;
        let first = to_feed(first, &self.model, opts);
        check_feed(&first, data, opts)?;
        let mut graphs = StepGraphs::new(self, opts, optimizer);
        graphs.ranks = (scheme, rank, ranks);
        graphs.split = opts.distributed.is_some();
        let mut stepper = graphs.fit(self, &first, data, lopts)?;
        // The first batch only gave the shapes to plan for.
        drop(first);
        let recompute = stepper.remat.as_ref().map(|r| RecomputeRecord {
            strategy: r.strategy.clone(),
            recomputed_nodes: r.recomputed_nodes.len(),
            extra_flops_pct: r.extra_flops_pct(),
            lower_bound_before_bytes: r.lower_bound_before_bytes,
            lower_bound_after_bytes: r.lower_bound_after_bytes,
        });
        let mut state = graphs.take_state(stepper.micro);
        let params = stepper.params.clone();
        let bytes_of = |names: &mut dyn Iterator<Item = &String>, state: &State| -> u64 {
            names
                .filter_map(|p| state.get(p))
                .map(|t| t.data.len() as u64)
                .sum()
        };
        let weights_bytes = bytes_of(&mut params.iter(), &state);
        let state_bytes = bytes_of(&mut state.keys().filter(|k| !params.contains(k)), &state);
        let param_elements: u64 = params
            .iter()
            .filter_map(|p| state.get(p))
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum();

        // 2. Where to start, and the schedule.
        let (per_epoch, total) = opts.steps(n);
        let mut start = 0usize;
        let mut resumed_from = None;
        if let Some(r) = &opts.resume {
            let file = checkpoint_file(r)?;
            match stepper.layout.as_ref().filter(|l| l.sharded()) {
                // A checkpoint holds the optimizer state per parameter, as
                // one process does: this rank keeps its slice of it.
                Some(l) => {
                    let mut full = l.unsliced_like(&state);
                    start = resume(&file, &mut full, n, opts)?;
                    state = l.slice_state(full, &state)?;
                }
                None => start = resume(&file, &mut state, n, opts)?,
            }
            resumed_from = Some((file.display().to_string(), start));
        }
        if let Some(dir) = &opts.checkpoint {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create", e))?;
        }
        // This rank's share: the rank-th slice of each batch's order.
        let schedule = |step: usize| -> (usize, Vec<usize>) {
            (
                step / per_epoch + 1,
                opts.batch_order(n, step, rank * local..(rank + 1) * local),
            )
        };

        let ropts = crate::run::cpu_run_options(opts.threads);
        let threads = ropts.threads;
        let mut log = Vec::new();
        let mut evals = Vec::new();
        let mut checkpoints = Vec::new();
        let mut data_wait = 0.0;
        // Every rank gathers the state (a collective under zero1/zero2);
        // rank 0 writes it.
        let write_checkpoint = |state: &State, step: usize| -> Result<Option<String>> {
            let Some(dir) = &opts.checkpoint else {
                return Ok(None);
            };
            if rank != 0 {
                return Ok(None);
            }
            let mut arrays = Vec::new();
            for (k, v) in [
                (STEP_KEY, step as i64),
                (SEED_KEY, opts.seed as i64),
                (BATCH_KEY, opts.batch as i64),
                (EXAMPLES_KEY, n as i64),
                (SHUFFLE_KEY, opts.shuffle as i64),
            ] {
                arrays.push((k.to_string(), to_tract(&scalar_i64(v))?));
            }
            for (k, t) in state {
                arrays.push((k.clone(), to_tract(t)?));
            }
            let bytes = graphopt_tract::npz::write(&arrays)?;
            let path = dir.join(format!("step-{step:08}.npz"));
            write_atomic(&path, &bytes)?;
            Ok(Some(path.display().to_string()))
        };
        let mut eval_state = EvalRunner::default();
        let model = &self.model;

        // 3. The loop: batches gathered one ahead on a second thread.
        let result: Result<()> = std::thread::scope(|scope| {
            let (tx, rx) = sync_channel::<(usize, usize, Result<Vec<(String, HostTensor)>>)>(1);
            let producer = scope.spawn(move || {
                for step in start..total {
                    let (epoch, order) = schedule(step);
                    if tx.send((step, epoch, data.gather(&order))).is_err() {
                        break;
                    }
                }
            });
            for _ in start..total {
                let w0 = Instant::now();
                let Ok((step, epoch, batch)) = rx.recv() else {
                    break;
                };
                let wait = w0.elapsed().as_secs_f64();
                data_wait += wait;
                let batch = to_feed(batch?, model, opts);
                let loss = stepper
                    .step(&batch, &mut state, &ropts, comm)
                    .map_err(|e| Error::runtime(format!("step {}: {e}", step + 1)))?;
                if !loss.is_finite() {
                    let last = checkpoints.last().map_or(String::new(), |c: &String| {
                        format!("; last checkpoint: {c}")
                    });
                    return Err(Error::with_kind(
                        ErrorKind::Tolerance,
                        format!(
                            "step {}: the loss is {loss}; training stopped{last}",
                            step + 1
                        ),
                    ));
                }
                let rec = StepRecord {
                    step: step + 1,
                    epoch,
                    loss,
                    lr,
                    time_s: t0.elapsed().as_secs_f64(),
                    data_wait_s: wait,
                    total_steps: total,
                };
                progress(&rec);
                log.push(rec);
                let done = step + 1;
                if opts.checkpoint.is_some() && done % opts.every == 0 && done < total {
                    let now = stepper.whole_state(&state, comm)?;
                    if let Some(c) = write_checkpoint(&now, done)? {
                        checkpoints.push(c);
                    }
                }
                let epoch_end = done % per_epoch == 0;
                if let (Some(ev), true, 0) = (eval, epoch_end || done == total, rank) {
                    let now = stepper.snapshot(&state);
                    let (value, examples) =
                        eval_state.measure(model, &mut stepper, ev, &now, lopts, &ropts)?;
                    evals.push(EvalRecord {
                        step: done,
                        epoch,
                        metric: opts.metric,
                        value,
                        examples,
                    });
                }
            }
            drop(rx);
            producer
                .join()
                .map_err(|_| Error::runtime("the data thread panicked"))?;
            Ok(())
        });
        result?;
        // (A snapshot copies the state: only when there is a checkpoint.)
        if total > start && opts.checkpoint.is_some() {
            let now = stepper.whole_state(&state, comm)?;
            if let Some(c) = write_checkpoint(&now, total)? {
                checkpoints.push(c);
            }
        }

        // 4. The trained weights into the session's model: read out of the
        //    step's arena, which goes before they are moved in (no third
        //    copy).
        let mut state = stepper.take_state(state);
        let (micro, planned_bytes, donated_bytes, arena_bytes, workspace_bytes) = (
            stepper.micro,
            stepper.planned_bytes(),
            stepper.donated_bytes(),
            stepper.arena_bytes(),
            stepper.workspace_bytes(),
        );
        let distributed = match opts.distributed {
            None => None,
            Some(scheme) => {
                let mine = RankBytes {
                    rank,
                    weights_bytes,
                    optimizer_state_bytes: state_bytes,
                    gradient_bytes: stepper.gradient_bytes(),
                    arena_bytes: arena_bytes + workspace_bytes,
                };
                Some(DistRecord {
                    engine: comm.engine().to_string(),
                    scheme,
                    rank,
                    ranks,
                    local_batch: local,
                    comm_s: stepper.comm_s,
                    buckets: stepper.buckets.0,
                    buckets_overlapped: stepper.buckets.1,
                    per_rank: gather_bytes(comm, &mine)?,
                })
            }
        };
        drop(stepper);
        drop(graphs.fused.take());
        drop(graphs.grads.take());
        drop(graphs.update.take());
        let g = &mut self.model.graph;
        for p in &params {
            let (Some(v), Some(t)) = (g.value_by_name(p), state.remove(p)) else {
                continue;
            };
            let dims = t.shape.iter().map(|&d| d as i64).collect();
            let tensor = Tensor::from_raw(t.dtype, dims, t.data.into())
                .map_err(|e| Error::new(format!("parameter '{p}': {e}")))?;
            g.set_initializer(v, tensor);
        }
        drop(state);
        let time_s = t0.elapsed().as_secs_f64();
        let steps = total.saturating_sub(start);
        Ok(TrainReport {
            data: data.label(),
            examples: n,
            batch: opts.batch,
            micro_batches: micro,
            micro_batch: opts.batch / micro,
            budget_bytes: opts.budget,
            distributed,
            pipeline: None,
            recompute,
            planned_bytes,
            donated_bytes,
            dropped_per_epoch: n % opts.batch,
            steps,
            epochs: total as f64 / per_epoch as f64,
            loss: opts.loss.name().to_string(),
            optimizer: opts.optimizer.name.clone(),
            params,
            param_elements,
            weights_bytes,
            state_bytes,
            arena_bytes,
            workspace_bytes,
            peak_rss_bytes: peak_rss_bytes(),
            time_s,
            data_wait_s: data_wait,
            steps_per_s: if time_s > 0.0 {
                steps as f64 / time_s
            } else {
                0.0
            },
            first_loss: log.first().map(|r| r.loss),
            last_loss: log.last().map(|r| r.loss),
            log,
            evals,
            checkpoints,
            resumed_from,
            threads,
            warnings: std::mem::take(&mut graphs.warnings),
        })
    }
}

/// The optimizer's learning rate, as the step log reports it.
fn learning_rate(o: Optimizer) -> f64 {
    match o {
        Optimizer::Sgd { lr, .. } => lr as f64,
        Optimizer::AdamW { lr, .. } => lr,
        Optimizer::None => 0.0,
    }
}

/// The ranks compare a fingerprint of the model, of the options that
/// shape the step and of the data's size; each rank refuses, naming the
/// ranks that differ from rank 0.
fn agree(
    comm: &dyn Collective,
    model: &graphopt_ir::Model,
    opts: &TrainOptions,
    n: usize,
) -> Result<()> {
    use crate::distributed::Fnv;
    let mut h = Fnv::new();
    h.u64(crate::distributed::model_fingerprint(model));
    h.u64(opts.batch as u64).u64(opts.seed).u64(n as u64);
    h.u64(opts.micro_batches.unwrap_or(0) as u64);
    h.str(opts.loss.name()).str(&opts.optimizer.name);
    h.str(&format!("{:?}", opts.optimizer));
    h.str(&format!(
        "{:?}{:?}{:?}",
        opts.distributed, opts.trainable, opts.frozen
    ));
    h.str(opts.output.as_deref().unwrap_or(""))
        .str(&opts.target);
    h.u64(opts.shuffle as u64).u64(opts.class_axis as u64);
    h.str(&format!("{:?}{:?}{}", opts.length, opts.budget, opts.remat));
    h.str(&format!("{:?}{:?}", opts.checkpoint, opts.resume));
    h.u64(opts.every as u64).u64(opts.dropout_train as u64);
    let me = h.finish().to_le_bytes();
    let mut all = vec![0u8; 8 * comm.ranks()];
    comm.all_gather_bytes(&me, &mut all)
        .map_err(|e| Error::runtime(e.0))?;
    let differ: Vec<String> = all
        .chunks(8)
        .enumerate()
        .filter(|(_, c)| *c != &all[..8])
        .map(|(r, _)| r.to_string())
        .collect();
    if !differ.is_empty() {
        return Err(Error::new(format!(
            "--distributed: rank{} {} {} another model, options or data size than rank 0",
            if differ.len() > 1 { "s" } else { "" },
            differ.join(", "),
            if differ.len() > 1 { "have" } else { "has" }
        )));
    }
    Ok(())
}

/// Every rank's bytes, in rank order.
fn gather_bytes(comm: &dyn Collective, mine: &RankBytes) -> Result<Vec<RankBytes>> {
    let fields = [
        mine.weights_bytes,
        mine.optimizer_state_bytes,
        mine.gradient_bytes,
        mine.arena_bytes,
    ];
    let send: Vec<u8> = fields.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut all = vec![0u8; send.len() * comm.ranks()];
    comm.all_gather_bytes(&send, &mut all)
        .map_err(|e| Error::runtime(e.0))?;
    Ok(all
        .chunks(send.len())
        .enumerate()
        .map(|(rank, c)| {
            let f = |i: usize| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            RankBytes {
                rank,
                weights_bytes: f(0),
                optimizer_state_bytes: f(1),
                gradient_bytes: f(2),
                arena_bytes: f(3),
            }
        })
        .collect())
}
