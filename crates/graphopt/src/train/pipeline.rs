//! Pipeline training (issue 24): `mpirun -np K graphopt train MODEL
//! --pipeline DIR`, one stage of [`crate::partition`] per rank, under the
//! manifest's schedule (GPipe or 1F1B, see [`actions`]).
//!
//! Each step, with M micro-batches of `batch / M` examples (the order of
//! the passes is the schedule's):
//! 1. forward: for each micro-batch, stage k receives the tensors crossing
//!    its first cut from rank k - 1 (stage 0 reads only the data), runs
//!    its stage, sends what crosses its last cut to rank k + 1, and keeps
//!    its inputs (not its activations);
//! 2. backward: for each micro-batch, stage k receives the gradients of
//!    what it sent, runs its backward graph (the stage again, then its
//!    gradient: `graphopt grad` of the stage's forward with those seeds,
//!    `Σ sent · seed`; the last stage's is the loss), adds its parameters'
//!    gradients and sends its inputs' gradients to rank k - 1;
//! 3. each rank updates its own parameters (the micro-batches' gradients
//!    averaged for a mean loss), with the optimizer's update graph.
//!
//! The gradients equal one process's with `--micro-batches M` (the same
//! micro-batches), within float rounding. A message is one tensor list
//! with names, types and shapes ([`encode`]). At the end every rank sends
//! its trained parameters to rank 0, which writes the model.
//!
//! Not yet: checkpoints, eval and budgets with a pipeline.

use super::data::{slice_rows, to_feed, DataSource};
use super::dist::Layout;
use super::step::{grad_input, scalar_of, update_graph, Bound};
use super::{State, StepRecord, TrainOptions, TrainReport};
use crate::distributed::{Collective, Scheme};
use crate::error::{Error, Result};
use crate::grad::Loss;
use crate::partition::{read_manifest, Manifest, Schedule, StageInfo};
use crate::session::Session;
use graphopt_autodiff::{GradOptions as AutodiffOptions, Optimizer};
use graphopt_exec::HostTensor;
use graphopt_ir::{DType, Model, NewNode, Tensor};
use graphopt_plan::DimValues;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// One stage's bytes, as its rank planned them.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct StageRecord {
    pub stage: usize,
    pub params: usize,
    pub weights_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub gradient_bytes: u64,
    /// The arenas and workspaces of its forward, backward and update
    /// graphs (planned; the runtime allocates exactly these).
    pub arena_bytes: u64,
    /// The largest bytes of inputs it kept for micro-batches in flight.
    pub in_flight_bytes: u64,
}

impl StageRecord {
    /// Everything the stage holds.
    pub fn total(&self) -> u64 {
        self.weights_bytes
            + self.optimizer_state_bytes
            + self.gradient_bytes
            + self.arena_bytes
            + self.in_flight_bytes
    }
}

/// A pipelined run.
#[derive(Clone, Debug, Serialize)]
pub struct PipelineRecord {
    pub stages: usize,
    pub schedule: String,
    pub micro_batches: usize,
    pub bubble: f64,
    /// Seconds rank 0 spent sending and receiving (waiting included).
    pub comm_s: f64,
    pub per_stage: Vec<StageRecord>,
}

/// The name under which a rank's [`StageRecord`] (JSON) travels to rank 0
/// with its trained parameters.
const STAGE_RECORD: &str = "__stage";

/// The seed input of a sent tensor's gradient.
fn seed_input(name: &str) -> String {
    format!("{name}__seed")
}

/// Tensors with their names as one message.
fn encode(tensors: &[(String, HostTensor)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend((tensors.len() as u32).to_le_bytes());
    for (n, t) in tensors {
        b.extend((n.len() as u32).to_le_bytes());
        b.extend(n.as_bytes());
        b.extend(t.dtype.to_onnx().to_le_bytes());
        b.extend((t.shape.len() as u32).to_le_bytes());
        for &d in &t.shape {
            b.extend((d as u64).to_le_bytes());
        }
        b.extend((t.data.len() as u64).to_le_bytes());
        b.extend(&t.data);
    }
    b
}

fn decode(b: &[u8]) -> Result<Vec<(String, HostTensor)>> {
    let bad = || Error::runtime("a pipeline message is malformed");
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let end = at.checked_add(n).ok_or_else(bad)?;
        let s = b.get(at..end).ok_or_else(bad)?;
        at = end;
        Ok(s)
    };
    let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes")) as usize;
    let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes")) as usize;
    let count = u32_(take(4)?);
    // Each tensor takes at least 20 bytes: no count claims more.
    let mut out = Vec::with_capacity(count.min(b.len() / 20));
    for _ in 0..count {
        let len = u32_(take(4)?);
        let name = String::from_utf8(take(len)?.to_vec()).map_err(|_| bad())?;
        let dtype = DType::from_onnx(i32::from_le_bytes(take(4)?.try_into().expect("4 bytes")));
        let rank = u32_(take(4)?);
        let mut shape = Vec::with_capacity(rank.min(b.len() / 8));
        for _ in 0..rank {
            shape.push(u64_(take(8)?));
        }
        let n = u64_(take(8)?);
        let data = take(n)?.to_vec();
        out.push((name, HostTensor { dtype, shape, data }));
    }
    Ok(out)
}

/// A rank's messages to its neighbours. A message waits until the rank's
/// next receive and is sent with it ([`Collective::send_recv_message`]:
/// the send does not wait for the receive), so that two neighbours sending
/// to each other at once (1F1B's steady state, GPipe's turn from forward to
/// backward) never wait on each other.
#[derive(Default)]
struct Link {
    pending: Option<(usize, Vec<u8>)>,
    seconds: f64,
}

impl Link {
    fn send(&mut self, comm: &dyn Collective, to: usize, t: &[(String, HostTensor)]) -> Result<()> {
        self.flush(comm)?;
        self.pending = Some((to, encode(t)));
        Ok(())
    }

    fn recv(&mut self, comm: &dyn Collective, from: usize) -> Result<Vec<(String, HostTensor)>> {
        let c = Instant::now();
        let msg = match self.pending.take() {
            Some((to, out)) => comm.send_recv_message(&out, to, from),
            None => comm.recv_message(from),
        }
        .map_err(|e| Error::runtime(e.0))?;
        self.seconds += c.elapsed().as_secs_f64();
        decode(&msg)
    }

    /// Sends what waits (blocking).
    fn flush(&mut self, comm: &dyn Collective) -> Result<()> {
        if let Some((to, out)) = self.pending.take() {
            let c = Instant::now();
            comm.send_message(&out, to)
                .map_err(|e| Error::runtime(e.0))?;
            self.seconds += c.elapsed().as_secs_f64();
        }
        Ok(())
    }
}

/// Stage `k`'s passes in one step, in order: `(true, m)` the forward of
/// micro-batch m, `(false, m)` its backward.
/// - GPipe: every forward, then every backward.
/// - 1F1B: `K - 1 - k` forwards first (at most M), then one forward and
///   one backward in turn, then the backwards left: a stage holds at most
///   `K - k` micro-batches' inputs instead of M.
fn actions(schedule: Schedule, k: usize, stages: usize, micro: usize) -> Vec<(bool, usize)> {
    match schedule {
        Schedule::Gpipe => (0..micro)
            .map(|m| (true, m))
            .chain((0..micro).map(|m| (false, m)))
            .collect(),
        Schedule::OneFOneB => {
            let warm = (stages - 1 - k).min(micro);
            let mut a: Vec<(bool, usize)> = (0..warm).map(|m| (true, m)).collect();
            for i in 0..micro - warm {
                a.push((true, warm + i));
                a.push((false, i));
            }
            a.extend((micro - warm..micro).map(|m| (false, m)));
            a
        }
    }
}

/// A graph planned on first use, at the shapes of its first feed.
struct Lazy {
    model: Model,
    bound: Option<Bound>,
}

impl Lazy {
    fn new(model: Model) -> Lazy {
        Lazy { model, bound: None }
    }

    fn run(
        &mut self,
        session: &Session,
        state: &State,
        feed: &State,
        data: &dyn DataSource,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<Vec<(String, HostTensor)>> {
        self.plan(session, state, feed, data)?;
        let b = self.bound.as_mut().expect("planned");
        let outs = b.run(state, feed, ropts)?;
        Ok(b.outputs.iter().cloned().zip(outs).collect())
    }

    /// Plans the graph at the shapes of `feed` (and `state`), once.
    fn plan(
        &mut self,
        session: &Session,
        state: &State,
        feed: &State,
        data: &dyn DataSource,
    ) -> Result<()> {
        if self.bound.is_none() {
            let g = &self.model.graph;
            let shapes = g
                .inputs
                .iter()
                .filter_map(|&v| {
                    let n = g.name(v);
                    let t = feed.get(n).or_else(|| state.get(n))?;
                    Some((n.to_string(), t.shape.iter().map(|&d| d as i64).collect()))
                })
                .collect();
            let dims = DimValues {
                bound: Vec::new(),
                shapes,
                default: None,
            };
            self.bound = Some(Bound::new(
                session,
                &self.model,
                &dims,
                &State::new(),
                data,
            )?);
        }
        Ok(())
    }

    fn bytes(&self) -> u64 {
        self.bound.as_ref().map_or(0, |b| b.bytes())
    }
}

/// The stage's backward graph: `graphopt grad` of the stage with `Σ
/// ReduceSum(sent · seed)` as its loss (the last stage: the training
/// loss), the gradients of its float inputs as outputs. Returns it, the
/// trainable parameters, their values and `grad`'s warnings.
fn backward_graph(
    stage: &Model,
    info: &StageInfo,
    last: bool,
    opts: &TrainOptions,
    dims: &DimValues,
) -> Result<(Model, Vec<String>, State, Vec<String>)> {
    let mut m = stage.clone();
    let output = if last {
        opts.output.clone()
    } else {
        let g = &mut m.graph;
        let mut pairs = Vec::new();
        for name in &info.sends {
            let v = g.value_by_name(name).ok_or_else(|| {
                Error::new(format!("stage {}: no value '{name}' to send", info.index))
            })?;
            let ty = g.ty(v).cloned();
            if !ty
                .as_ref()
                .and_then(|t| t.elem())
                .is_some_and(|d| d.is_float())
            {
                continue;
            }
            let seed = g.fresh_value(&seed_input(name), ty);
            g.inputs.push(seed);
            pairs.push((v, seed, format!("{name}__vjp")));
        }
        let total = super::step::dot_sum(g, &pairs, "vjp_total")?;
        let total = total.ok_or_else(|| {
            Error::new(format!(
                "stage {}: sends no float tensor, so no gradient flows back through it",
                info.index
            ))
        })?;
        let vjp = g.fresh_value("vjp", None);
        g.add_node(NewNode::new("Identity").inputs(&[total]).outputs(&[vjp]))?;
        g.outputs = vec![vjp];
        Some("vjp".to_string())
    };
    super::step::grad_graph(
        &m,
        AutodiffOptions {
            output,
            loss: if last { opts.loss } else { Loss::Sum },
            class_axis: opts.class_axis,
            trainable: opts.trainable.clone(),
            // Folded shape values are constants, never parameters.
            frozen: opts
                .frozen
                .iter()
                .chain(&info.static_receives)
                .cloned()
                .collect(),
            optimizer: Optimizer::None,
            params_as_inputs: true,
            input_grads: info.index > 0,
            dropout_train: opts.dropout_train && super::step::has_dropout(&stage.graph),
        },
        dims,
    )
}

/// A stage's backward and update graphs, its trainable parameters, and
/// their values with the optimizer's initial state.
struct StageGraphs {
    backward: Model,
    /// `None` for a stage without trainable parameters (only its inputs'
    /// gradients flow back through it).
    update: Option<Model>,
    params: Vec<String>,
    state: State,
    warnings: Vec<String>,
}

impl StageGraphs {
    /// From the stage specialized to `feed` (its first micro-batch, with
    /// the seeds of what it sends).
    fn build(
        stage: &Model,
        info: &StageInfo,
        last: bool,
        opts: &TrainOptions,
        optimizer: Optimizer,
        feed: &State,
    ) -> Result<StageGraphs> {
        let dims = DimValues {
            bound: Vec::new(),
            shapes: feed
                .iter()
                .filter(|(n, _)| !info.static_receives.contains(n))
                .map(|(n, t)| (n.clone(), t.shape.iter().map(|&d| d as i64).collect()))
                .collect(),
            default: None,
        };
        let (backward, params, mut state, mut warnings) =
            backward_graph(stage, info, last, opts, &dims)?;
        // A stage without parameters only passes gradients back.
        let update = if params.is_empty() {
            None
        } else {
            let base = AutodiffOptions {
                optimizer,
                ..AutodiffOptions::default()
            };
            let (m, optimizer_state, w) = update_graph(&params, &state, &base)?;
            state.extend(optimizer_state);
            warnings.extend(w);
            Some(m)
        };
        Ok(StageGraphs {
            backward,
            update,
            params,
            state,
            warnings,
        })
    }
}

/// Zeros shaped like `t`: the seed of a sent tensor, for planning.
fn zeros_like(t: &HostTensor) -> HostTensor {
    HostTensor {
        dtype: t.dtype,
        shape: t.shape.clone(),
        data: vec![0u8; t.data.len()],
    }
}

impl Session {
    /// Each stage's bytes when the pipeline `p` (cut from this session's
    /// model by [`Session::partition`]) trains on batches of `opts.batch`
    /// examples of `data` with `opts` (micro-batches: the manifest's
    /// unless given): the graphs the ranks of `train --pipeline` build,
    /// planned on this process. The forward runs once, the first
    /// micro-batch through the stages in turn, to give each stage its
    /// inputs' shapes and shape values. [`Session::partition_within`]
    /// cuts under per-device budgets.
    pub fn plan_pipeline(
        &self,
        p: &crate::partition::Partition,
        data: &dyn DataSource,
        opts: &TrainOptions,
    ) -> Result<Vec<StageRecord>> {
        opts.validate()?;
        let m = &p.manifest;
        let micro = opts.micro_batches.unwrap_or(m.micro_batches);
        let all = self.first_micro_batch(data, opts, micro)?;
        let optimizer = opts.optimizer.build()?;
        let ropts = crate::run::cpu_run_options(opts.threads);
        let mut received = State::new();
        let mut out = Vec::new();
        for (k, (info, stage)) in m.stages.iter().zip(&p.models).enumerate() {
            let last = k + 1 == m.stages.len();
            let mut feed: State = all
                .iter()
                .filter(|(n, _)| info.data_inputs.contains(n) || (last && *n == "target"))
                .map(|(n, t)| (n.clone(), t.clone()))
                .collect();
            feed.extend(std::mem::take(&mut received));
            // GPipe keeps every micro-batch's inputs; 1F1B at most K - k.
            let held = m.schedule.held(micro, m.stages.len(), k);
            let in_flight = feed.values().map(|t| t.data.len() as u64).sum::<u64>() * held as u64;
            let spec = specialize(stage, info, &feed)?;
            if !last {
                let mut fw = Lazy::new(spec.clone());
                let outs = fw.run(self, &State::new(), &feed, data, &ropts)?;
                for s in &info.sends {
                    let t = outs
                        .iter()
                        .find(|(o, _)| o == s)
                        .map(|(_, t)| t.clone())
                        .ok_or_else(|| Error::new(format!("stage {k}: no output '{s}'")))?;
                    if t.dtype.is_float() {
                        feed.insert(seed_input(s), zeros_like(&t));
                    }
                    received.insert(s.clone(), t);
                }
            }
            let built = StageGraphs::build(&spec, info, last, opts, optimizer, &feed)?;
            let plan = |model: &Model, feed: &State| -> Result<u64> {
                let mut l = Lazy::new(model.clone());
                l.plan(self, &built.state, feed, data)?;
                Ok(l.bytes())
            };
            let forward_bytes = if last {
                0
            } else {
                plan(&params_as_inputs(&spec, &built.params), &feed)?
            };
            let grads: State = built
                .params
                .iter()
                .filter_map(|p| built.state.get(p).map(|t| (grad_input(p), zeros_like(t))))
                .collect();
            let of = |keep: &dyn Fn(&String) -> bool| -> u64 {
                built
                    .state
                    .iter()
                    .filter(|(n, _)| keep(n))
                    .map(|(_, t)| t.data.len() as u64)
                    .sum()
            };
            let layout = Layout::new(Scheme::Dp, 0, 1, &built.params, &built.state)?;
            out.push(StageRecord {
                stage: k,
                params: built.params.len(),
                weights_bytes: of(&|n| built.params.contains(n)),
                optimizer_state_bytes: of(&|n| !built.params.contains(n)),
                gradient_bytes: layout.padded() as u64 * 4,
                arena_bytes: forward_bytes
                    + plan(&built.backward, &feed)?
                    + match &built.update {
                        Some(u) => plan(u, &grads)?,
                        None => 0,
                    },
                in_flight_bytes: in_flight,
            });
        }
        Ok(out)
    }
}

impl Session {
    /// The feed of the first micro-batch of the first batch (`opts.batch`
    /// examples in `micro` micro-batches): what a pipeline is planned at.
    pub(crate) fn first_micro_batch(
        &self,
        data: &dyn DataSource,
        opts: &TrainOptions,
        micro: usize,
    ) -> Result<State> {
        let b = opts.batch;
        if data.examples() < b {
            return Err(Error::new(format!(
                "--batch {b}: {} has only {} examples",
                data.label(),
                data.examples()
            )));
        }
        if micro == 0 || !b.is_multiple_of(micro) {
            return Err(Error::new(format!(
                "--batch {b}: does not split into the pipeline's {micro} micro-batches"
            )));
        }
        let batch = data.gather(&(0..b).collect::<Vec<_>>())?;
        Ok(slice_rows(&to_feed(batch, &self.model, opts), 0, b / micro))
    }
}

impl Session {
    /// Trains the session's model (the whole model: rank 0 writes it back)
    /// as one stage of the pipeline in `dir` ([`crate::partition`]), this
    /// process being rank `comm.rank()` = stage. See the module doc. An
    /// `eval` set, like a budget or checkpoints, is refused (not yet).
    pub fn train_pipeline(
        &mut self,
        comm: &dyn Collective,
        dir: &Path,
        data: &dyn DataSource,
        eval: Option<&dyn DataSource>,
        opts: &TrainOptions,
        progress: &mut dyn FnMut(&StepRecord),
    ) -> Result<TrainReport> {
        opts.validate()?;
        for (set, what) in [
            (eval.is_some(), "--eval"),
            (opts.budget.is_some(), "--budget"),
            (opts.checkpoint.is_some(), "--checkpoint"),
            (opts.resume.is_some(), "--resume"),
            (opts.distributed.is_some(), "--distributed"),
        ] {
            if set {
                return Err(Error::unsupported(format!(
                    "{what} with --pipeline: not yet"
                )));
            }
        }
        let manifest = read_manifest(dir)?;
        self.transact(|s| s.pipeline_steps(comm, dir, &manifest, data, opts, progress))
    }

    fn pipeline_steps(
        &mut self,
        comm: &dyn Collective,
        dir: &Path,
        manifest: &Manifest,
        data: &dyn DataSource,
        opts: &TrainOptions,
        progress: &mut dyn FnMut(&StepRecord),
    ) -> Result<TrainReport> {
        let t0 = Instant::now();
        let (k, stages) = (comm.rank(), manifest.stages.len());
        if comm.ranks() != stages {
            return Err(Error::new(format!(
                "--pipeline {}: {stages} stages, but {} ranks were launched (mpirun -np {stages})",
                dir.display(),
                comm.ranks()
            )));
        }
        let n = data.examples();
        let micro = opts.micro_batches.unwrap_or(manifest.micro_batches);
        if n < opts.batch {
            return Err(Error::new(format!(
                "--batch {}: {} has only {n} examples",
                opts.batch,
                data.label()
            )));
        }
        if micro == 0 || !opts.batch.is_multiple_of(micro) {
            return Err(Error::new(format!(
                "--batch {}: does not split into the pipeline's {micro} micro-batches",
                opts.batch
            )));
        }
        super::agree(comm, &self.model, opts, n)?;
        let info = &manifest.stages[k];
        let last = k + 1 == stages;
        let stage = graphopt_onnx::load(&dir.join(&info.file))?.model;
        let optimizer = opts.optimizer.build()?;
        let lr = super::learning_rate(optimizer);
        let rows = opts.batch / micro;
        let mean = opts.loss != Loss::Sum;
        let ropts = crate::run::cpu_run_options(opts.threads);
        let threads = ropts.threads;
        let (per_epoch, total) = opts.steps(n);
        // The graphs: forward (the stage as written), backward and update
        // (built on the first micro-batch, at its shapes).
        let mut forward: Option<Lazy> = None;
        // The stage with its static inputs folded (at the first
        // micro-batch), and those values: every later micro-batch must
        // bring the same.
        let mut folded: Option<(Model, State)> = None;
        let mut backward: Option<Lazy> = None;
        let mut update: Option<Lazy> = None;
        let mut params: Vec<String> = Vec::new();
        let mut layout: Option<Layout> = None;
        let mut state = State::new();
        let mut log = Vec::new();
        let mut warnings: Vec<String> = Vec::new();
        let schedule = manifest.schedule;
        let mut link = Link::default();
        let mut in_flight_peak = 0u64;
        let wants =
            |name: &str| info.data_inputs.iter().any(|d| d == name) || (last && name == "target");
        for step in 0..total {
            let raw = data.gather(&opts.batch_order(n, step, 0..opts.batch))?;
            let batch: State = to_feed(raw, &self.model, opts)
                .into_iter()
                .filter(|(name, _)| wants(name))
                .collect();
            // 1. The schedule's forward and backward passes. A rank keeps
            //    each micro-batch's inputs from its forward to its backward;
            //    what it sends waits until its next receive, and goes with
            //    it (`Link`).
            let mut kept: Vec<Option<State>> = vec![None; micro];
            let mut acc: Vec<f32> = Vec::new();
            let mut losses = Vec::with_capacity(micro);
            for (forward_pass, m) in actions(schedule, k, stages, micro) {
                if forward_pass {
                    let mut feed = slice_rows(&batch, m, rows);
                    if k > 0 {
                        feed.extend(link.recv(comm, k - 1)?);
                    }
                    match &folded {
                        None => {
                            let values: State = info
                                .static_receives
                                .iter()
                                .filter_map(|n| feed.get(n).map(|t| (n.clone(), t.clone())))
                                .collect();
                            folded = Some((specialize(&stage, info, &feed)?, values));
                        }
                        Some((_, values)) => {
                            if let Some((n, _)) =
                                values.iter().find(|(n, t)| feed.get(*n) != Some(*t))
                            {
                                return Err(Error::runtime(format!(
                                    "stage {k}: '{n}' (a shape value) changed between micro-batches"
                                )));
                            }
                        }
                    }
                    let stage = &folded.as_ref().expect("folded").0;
                    if !last {
                        let fw = forward.get_or_insert_with(|| Lazy::new(stage.clone()));
                        let outs = fw.run(self, &state, &feed, data, &ropts)?;
                        let send: Vec<(String, HostTensor)> = info
                            .sends
                            .iter()
                            .map(|s| {
                                outs.iter()
                                    .find(|(o, _)| o == s)
                                    .map(|(_, t)| (s.clone(), t.clone()))
                                    .ok_or_else(|| {
                                        Error::new(format!("stage {k}: no output '{s}'"))
                                    })
                            })
                            .collect::<Result<_>>()?;
                        link.send(comm, k + 1, &send)?;
                    }
                    kept[m] = Some(feed);
                    let held: u64 = kept
                        .iter()
                        .flatten()
                        .flat_map(|f| f.values())
                        .map(|t| t.data.len() as u64)
                        .sum();
                    in_flight_peak = in_flight_peak.max(held);
                    continue;
                }
                let mut feed = kept[m].take().ok_or_else(|| {
                    Error::new(format!(
                        "stage {k}: micro-batch {m} went back before forward"
                    ))
                })?;
                if !last {
                    for (name, t) in link.recv(comm, k + 1)? {
                        feed.insert(seed_input(&name), t);
                    }
                }
                if backward.is_none() {
                    let stage = &folded.as_ref().expect("folded").0;
                    let built = StageGraphs::build(stage, info, last, opts, optimizer, &feed)?;
                    state.extend(built.state);
                    warnings.extend(built.warnings);
                    layout = Some(Layout::new(Scheme::Dp, 0, 1, &built.params, &state)?);
                    // From the next forward on, the forward reads the
                    // trained values.
                    if !last {
                        forward = Some(Lazy::new(params_as_inputs(stage, &built.params)));
                    }
                    params = built.params;
                    backward = Some(Lazy::new(built.backward));
                    update = built.update.map(Lazy::new);
                }
                let l = layout.as_ref().expect("built");
                if acc.is_empty() {
                    acc = vec![0f32; l.padded()];
                }
                let b = backward.as_mut().expect("built");
                let outs = b.run(self, &state, &feed, data, &ropts)?;
                let get = |name: &str| outs.iter().find(|(o, _)| o == name).map(|(_, t)| t);
                if last {
                    losses.push(get("loss").map_or(f64::NAN, scalar_of));
                }
                l.add_grads(&mut acc, &mut |p| {
                    get(&format!("{p}_grad"))
                        .cloned()
                        .ok_or_else(|| Error::new(format!("stage {k}: no gradient of '{p}'")))
                })?;
                if k > 0 {
                    let mut back = Vec::new();
                    for r in &info.receives {
                        let Some(t) = feed.get(r) else { continue };
                        if !t.dtype.is_float() {
                            continue;
                        }
                        let gr = get(&format!("{r}_grad"))
                            .cloned()
                            .unwrap_or_else(|| zeros_like(t));
                        back.push((r.clone(), gr));
                    }
                    link.send(comm, k - 1, &back)?;
                }
            }
            link.flush(comm)?;
            // 3. This stage's update.
            let l = layout.as_ref().expect("built");
            let scale = if mean { 1.0 / micro as f32 } else { 1.0 };
            let mut grads = State::new();
            for (p, off, shape) in &l.params {
                let e: usize = shape.iter().product();
                let v: Vec<f32> = acc[*off..off + e].iter().map(|x| x * scale).collect();
                grads.insert(grad_input(p), HostTensor::from_f32(shape, &v));
            }
            let outs = match update.as_mut() {
                Some(u) => u.run(self, &state, &grads, data, &ropts)?,
                None => Vec::new(),
            };
            for (o, t) in outs {
                if let Some(name) = o.strip_suffix("_new") {
                    if state.contains_key(name) {
                        state.insert(name.to_string(), t);
                    }
                }
            }
            // The loss, from the last stage to every rank.
            let mut loss = losses.iter().sum::<f64>();
            if mean {
                loss /= micro as f64;
            }
            let mut bytes = loss.to_le_bytes();
            comm.broadcast(&mut bytes, stages - 1)
                .map_err(|e| Error::runtime(e.0))?;
            let loss = f64::from_le_bytes(bytes);
            if !loss.is_finite() {
                return Err(Error::with_kind(
                    crate::error::ErrorKind::Tolerance,
                    format!("step {}: the loss is {loss}; training stopped", step + 1),
                ));
            }
            let rec = StepRecord {
                step: step + 1,
                epoch: step / per_epoch + 1,
                loss,
                lr,
                time_s: t0.elapsed().as_secs_f64(),
                data_wait_s: 0.0,
                total_steps: total,
            };
            progress(&rec);
            log.push(rec);
        }
        // Every stage's bytes and trained parameters to rank 0.
        let weights_bytes: u64 = params
            .iter()
            .filter_map(|p| state.get(p))
            .map(|t| t.data.len() as u64)
            .sum();
        let state_bytes: u64 = state
            .iter()
            .filter(|(k, _)| !params.contains(k))
            .map(|(_, t)| t.data.len() as u64)
            .sum();
        let mine = StageRecord {
            stage: k,
            params: params.len(),
            weights_bytes,
            optimizer_state_bytes: state_bytes,
            gradient_bytes: layout.as_ref().map_or(0, |l| l.padded() as u64 * 4),
            arena_bytes: forward.as_ref().map_or(0, Lazy::bytes)
                + backward.as_ref().map_or(0, Lazy::bytes)
                + update.as_ref().map_or(0, Lazy::bytes),
            in_flight_bytes: in_flight_peak,
        };
        let param_elements: u64 = params
            .iter()
            .filter_map(|p| state.get(p))
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum();
        let trained: Vec<(String, HostTensor)> = params
            .iter()
            .filter_map(|p| state.remove(p).map(|t| (p.clone(), t)))
            .collect();
        let mut per_stage = vec![mine.clone()];
        let mut all = trained.clone();
        if k == 0 {
            for from in 1..stages {
                let got = comm
                    .recv_message(from)
                    .map_err(|e| Error::runtime(e.0))
                    .and_then(|m| decode(&m))?;
                let rec = got
                    .iter()
                    .find(|(n, _)| n == STAGE_RECORD)
                    .and_then(|(_, t)| serde_json::from_slice(&t.data).ok())
                    .ok_or_else(|| {
                        Error::runtime(format!("rank {from} sent no record of its stage"))
                    })?;
                per_stage.push(rec);
                all.extend(got.into_iter().filter(|(n, _)| n != STAGE_RECORD));
            }
        } else {
            let mut msg = trained;
            let rec = serde_json::to_vec(&mine).map_err(|e| Error::new(e.to_string()))?;
            msg.push((
                STAGE_RECORD.into(),
                HostTensor {
                    dtype: DType::U8,
                    shape: vec![rec.len()],
                    data: rec,
                },
            ));
            comm.send_message(&encode(&msg), 0)
                .map_err(|e| Error::runtime(e.0))?;
        }
        // Every rank's model gets the weights it trained (rank 0: all).
        let g = &mut self.model.graph;
        for (p, t) in all {
            let Some(v) = g.value_by_name(&p) else {
                continue;
            };
            let dims = t.shape.iter().map(|&d| d as i64).collect();
            let tensor = Tensor::from_raw(t.dtype, dims, t.data.into())
                .map_err(|e| Error::new(format!("parameter '{p}': {e}")))?;
            g.set_initializer(v, tensor);
        }
        let time_s = t0.elapsed().as_secs_f64();
        let pipeline = PipelineRecord {
            stages,
            schedule: schedule.name().into(),
            micro_batches: micro,
            bubble: (stages - 1) as f64 / (micro + stages - 1) as f64,
            comm_s: link.seconds,
            per_stage,
        };
        Ok(TrainReport {
            data: data.label(),
            examples: n,
            batch: opts.batch,
            micro_batches: micro,
            micro_batch: rows,
            budget_bytes: None,
            distributed: None,
            pipeline: Some(pipeline),
            recompute: None,
            planned_bytes: mine.weights_bytes
                + mine.optimizer_state_bytes
                + mine.gradient_bytes
                + mine.arena_bytes,
            donated_bytes: 0,
            dropped_per_epoch: n % opts.batch,
            steps: total,
            epochs: total as f64 / per_epoch as f64,
            loss: opts.loss.name().to_string(),
            optimizer: opts.optimizer.name.clone(),
            param_elements,
            params,
            weights_bytes: mine.weights_bytes,
            state_bytes: mine.optimizer_state_bytes,
            arena_bytes: mine.arena_bytes,
            workspace_bytes: 0,
            peak_rss_bytes: crate::run::peak_rss_bytes(),
            time_s,
            data_wait_s: 0.0,
            steps_per_s: if time_s > 0.0 {
                total as f64 / time_s
            } else {
                0.0
            },
            first_loss: log.first().map(|r| r.loss),
            last_loss: log.last().map(|r| r.loss),
            log,
            evals: Vec::new(),
            checkpoints: Vec::new(),
            resumed_from: None,
            threads,
            warnings,
        })
    }
}

/// `stage` specialized to the first micro-batch: its static inputs (see
/// [`StageInfo::static_receives`]) made constants of their values in
/// `feed`, every other input given its shape there, and the shapes inferred
/// again, so that the gradient's rules see every shape (the plans are for
/// these shapes anyway).
fn specialize(stage: &Model, info: &StageInfo, feed: &State) -> Result<Model> {
    use graphopt_ir::{Shape, Type};
    let mut m = stage.clone();
    let g = &mut m.graph;
    for name in &info.static_receives {
        let (Some(v), Some(t)) = (g.value_by_name(name), feed.get(name)) else {
            continue;
        };
        let dims = t.shape.iter().map(|&d| d as i64).collect();
        let tensor = Tensor::from_raw(t.dtype, dims, t.data.clone().into())
            .map_err(|e| Error::new(format!("'{name}': {e}")))?;
        g.inputs.retain(|&i| i != v);
        g.set_initializer(v, tensor);
    }
    for v in g.inputs.clone() {
        if let Some(t) = feed.get(g.name(v)) {
            let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
            g.value_mut(v).ty = Some(Type::tensor(t.dtype, Some(Shape::known(&dims))));
        }
    }
    graphopt_ir::infer::infer_model(&mut m, &graphopt_ir::infer::InferOptions::default());
    Ok(m)
}

/// `stage` with `params` as graph inputs (fed the trained values) rather
/// than initializers.
fn params_as_inputs(stage: &Model, params: &[String]) -> Model {
    let mut m = stage.clone();
    let g = &mut m.graph;
    for p in params {
        if let Some(v) = g.value_by_name(p) {
            if g.take_initializer(v).is_some() && !g.inputs.contains(&v) {
                g.inputs.push(v);
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a pipeline does not do yet is refused before anything is
    /// read or run (the folder does not exist), one line each.
    #[test]
    fn eval_budget_and_checkpoints_are_refused_with_a_pipeline() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/train/digits_mlp.onnx");
        let data = crate::train::ArrayData::new(
            vec![("x".to_string(), HostTensor::from_f32(&[1, 1], &[0.0]))],
            "data",
        )
        .unwrap();
        let comm = graphopt_exec::collective::Solo;
        let base = TrainOptions::new(1);
        let with = |f: &dyn Fn(&mut TrainOptions)| {
            let mut o = base.clone();
            f(&mut o);
            o
        };
        let cases: [(TrainOptions, bool, &str); 3] = [
            (base.clone(), true, "--eval with --pipeline: not yet"),
            (
                with(&|o| o.budget = Some(1 << 20)),
                false,
                "--budget with --pipeline: not yet",
            ),
            (
                with(&|o| o.checkpoint = Some("ck".into())),
                false,
                "--checkpoint with --pipeline: not yet",
            ),
        ];
        for (opts, eval, want) in cases {
            let mut s = crate::load(&path).unwrap();
            let e = s
                .train_pipeline(
                    &comm,
                    Path::new("no-such-folder"),
                    &data,
                    eval.then_some(&data as &dyn DataSource),
                    &opts,
                    &mut |_| {},
                )
                .unwrap_err();
            assert_eq!(e.to_string(), want);
        }
    }

    #[test]
    fn messages_round_trip_and_refuse_truncation() {
        let t = vec![
            ("a".to_string(), HostTensor::from_f32(&[2, 1], &[1.0, -2.5])),
            (
                "ids".to_string(),
                HostTensor {
                    dtype: DType::I64,
                    shape: vec![3],
                    data: [1i64, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect(),
                },
            ),
        ];
        let b = encode(&t);
        let back = decode(&b).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].0, "a");
        assert_eq!(back[0].1.to_f32().unwrap(), [1.0, -2.5]);
        assert_eq!(back[1].1.shape, vec![3]);
        assert_eq!(back[1].1.data, t[1].1.data);
        assert_eq!(
            decode(&b[..b.len() - 1]).unwrap_err().to_string(),
            "a pipeline message is malformed"
        );
        // A length near the address space's end is refused, not wrapped.
        let mut huge = encode(&t[..1]);
        let at = huge.len() - 8 - 8;
        huge[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge).is_err());
    }
}
