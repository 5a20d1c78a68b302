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
//!    runtime. The parameters and the optimizer state live outside the
//!    arena; each step reads them and its `<name>_new` outputs replace them.
//! 3. Batches come from a [`DataSource`]. Each epoch visits the examples
//!    in a permutation drawn from `seed` and the epoch number (or in order
//!    without `shuffle`). The last partial batch of an epoch is dropped (a
//!    batch of another size would be another plan), and the report says
//!    how many examples that leaves out. The next batch is gathered on a
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
//! Not yet: micro-batches, a memory budget choosing the batch, recompute,
//! CUDA, donation of the parameters' buffers (the step's outputs are
//! copies), memory-mapped shards.

use crate::error::{Error, ErrorKind, Result};
use crate::grad::{GradOptions, Loss, OptimizerSpec};
use crate::run::{peak_rss_bytes, to_host, to_tract};
use crate::session::Session;
use crate::util::write_atomic;
use graphopt_autodiff::{GradOptions as AutodiffOptions, Optimizer};
use graphopt_exec::{CpuBackend, Executable, HostTensor};
use graphopt_ir::{DType, Model, Tensor};
use graphopt_plan::human_bytes;
use graphopt_plan::{DimValues, PlanOptions};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

/// Examples to train on: arrays with a leading example axis.
pub trait DataSource: Sync {
    /// Examples in the source.
    fn examples(&self) -> usize;
    /// The arrays' names.
    fn names(&self) -> Vec<String>;
    /// The examples at `indices`, each array stacked along a new leading
    /// axis, by name.
    fn gather(&self, indices: &[usize]) -> Result<Vec<(String, HostTensor)>>;
    /// Where the data came from, for messages.
    fn label(&self) -> String;
}

/// Arrays in memory (an npz, a folder of npz shards, or the caller's).
#[derive(Clone, Debug)]
pub struct ArrayData {
    arrays: Vec<(String, HostTensor)>,
    examples: usize,
    label: String,
}

impl ArrayData {
    /// Arrays that share their leading dim (the examples). Refuses no
    /// arrays, scalars, arrays of different lengths, and floats holding
    /// NaN or Inf (naming the array and the first bad example).
    pub fn new(arrays: Vec<(String, HostTensor)>, label: &str) -> Result<ArrayData> {
        let Some((first, t)) = arrays.first() else {
            return Err(Error::new(format!("{label}: no arrays")));
        };
        let Some(&examples) = t.shape.first() else {
            return Err(Error::new(format!(
                "{label}: array '{first}' is a scalar; every array needs a leading example axis"
            )));
        };
        for (name, t) in &arrays {
            if t.shape.first() != Some(&examples) {
                return Err(Error::new(format!(
                    "{label}: array '{name}' has {} examples, '{first}' has {examples}",
                    t.shape.first().map_or("no".to_string(), |n| n.to_string()),
                )));
            }
            if let Some(i) = first_non_finite(t) {
                let per = t.shape[1..].iter().product::<usize>().max(1);
                return Err(Error::new(format!(
                    "{label}: array '{name}' holds NaN or Inf (example {})",
                    i / per
                )));
            }
        }
        Ok(ArrayData {
            arrays,
            examples,
            label: label.to_string(),
        })
    }

    /// Shards (each a label and its arrays) concatenated along the example
    /// axis: every shard must have the same arrays, in the same order, of
    /// the same element type and per-example shape.
    pub fn concat(
        shards: Vec<(String, Vec<(String, HostTensor)>)>,
        label: &str,
    ) -> Result<ArrayData> {
        let mut all: Vec<(String, HostTensor)> = Vec::new();
        for (where_, shard) in shards {
            if all.is_empty() {
                all = shard;
                continue;
            }
            let names = |a: &[(String, HostTensor)]| -> Vec<String> {
                a.iter().map(|(n, _)| n.clone()).collect()
            };
            if names(&shard) != names(&all) {
                return Err(Error::new(format!(
                    "{where_}: arrays {:?} differ from the first shard's {:?}",
                    names(&shard),
                    names(&all)
                )));
            }
            for ((name, a), (_, b)) in all.iter_mut().zip(shard) {
                if a.dtype != b.dtype || a.shape.is_empty() || a.shape.get(1..) != b.shape.get(1..)
                {
                    return Err(Error::new(format!(
                        "{where_}: array '{name}' is {}{:?}, the first shard's is {}{:?}",
                        b.dtype.name(),
                        b.shape,
                        a.dtype.name(),
                        a.shape
                    )));
                }
                a.shape[0] += b.shape[0];
                a.data.extend_from_slice(&b.data);
            }
        }
        ArrayData::new(all, label)
    }

    /// One npz (`np.savez`), or a folder of npz shards concatenated in name
    /// order (each with the same arrays).
    pub fn load(path: &Path) -> Result<ArrayData> {
        let label = path.display().to_string();
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::io(path, "read", e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "npz"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::new(format!("{label}: no .npz shards")));
            }
            let shards = files
                .iter()
                .map(|f| Ok((f.display().to_string(), read_npz(f)?)))
                .collect::<Result<Vec<_>>>()?;
            return ArrayData::concat(shards, &label);
        }
        ArrayData::new(read_npz(path)?, &label)
    }
}

pub(crate) fn read_npz(path: &Path) -> Result<Vec<(String, HostTensor)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
    let arrays = graphopt_tract::npz::read(&bytes)
        .map_err(|e| Error::with_kind(ErrorKind::Parse, format!("{}: {e:#}", path.display())))?;
    arrays
        .iter()
        .map(|(n, t)| {
            to_host(t)
                .map(|h| (n.clone(), h))
                .map_err(|e| Error::new(format!("{}: array '{n}': {e}", path.display())))
        })
        .collect()
}

fn first_non_finite(t: &HostTensor) -> Option<usize> {
    match t.dtype {
        DType::F32 => t
            .data
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        DType::F64 => t
            .data
            .chunks_exact(8)
            .position(|c| !f64::from_le_bytes(c.try_into().expect("8 bytes")).is_finite()),
        DType::F16 => t.data.chunks_exact(2).position(|c| {
            // Exponent all ones: Inf or NaN.
            u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00
        }),
        _ => None,
    }
}

impl DataSource for ArrayData {
    fn examples(&self) -> usize {
        self.examples
    }

    fn names(&self) -> Vec<String> {
        self.arrays.iter().map(|(n, _)| n.clone()).collect()
    }

    fn gather(&self, indices: &[usize]) -> Result<Vec<(String, HostTensor)>> {
        let mut out = Vec::with_capacity(self.arrays.len());
        for (name, t) in &self.arrays {
            let per = t.data.len() / self.examples.max(1);
            let mut data = Vec::with_capacity(per * indices.len());
            for &i in indices {
                if i >= self.examples {
                    return Err(Error::new(format!(
                        "{}: example {i} of {}",
                        self.label, self.examples
                    )));
                }
                data.extend_from_slice(&t.data[i * per..(i + 1) * per]);
            }
            let mut shape = t.shape.clone();
            shape[0] = indices.len();
            out.push((
                name.clone(),
                HostTensor {
                    dtype: t.dtype,
                    shape,
                    data,
                },
            ));
        }
        Ok(out)
    }

    fn label(&self) -> String {
        self.label.clone()
    }
}

/// How long to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainLength {
    Epochs(usize),
    Steps(usize),
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
    /// Parameter bytes, and the optimizer state's (AdamW's moments).
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

/// A deterministic permutation of `0..n` for `(seed, epoch)`: Fisher-Yates
/// driven by SplitMix64, so any front end can reproduce it.
pub fn epoch_permutation(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut state = seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

/// The state a step reads and replaces: parameters and optimizer state.
type State = BTreeMap<String, HostTensor>;

const STEP_KEY: &str = "__step";
const SEED_KEY: &str = "__seed";
const BATCH_KEY: &str = "__batch";
const EXAMPLES_KEY: &str = "__examples";
const SHUFFLE_KEY: &str = "__shuffle";

/// The batch's arrays against the model's runtime inputs: each present,
/// of its element type and rank, its fixed dims equal.
fn check_arrays(
    g: &graphopt_ir::Graph,
    batch: &[(String, HostTensor)],
    data: &dyn DataSource,
    opts: &TrainOptions,
) -> Result<()> {
    use graphopt_ir::Dim;
    for v in g.runtime_inputs() {
        let name = g.name(v);
        let Some((_, t)) = batch.iter().find(|(n, _)| n == name) else {
            return Err(Error::new(format!(
                "{}: no array '{name}' (a model input); it has {}",
                data.label(),
                data.names().join(", ")
            )));
        };
        let Some(tt) = g.ty(v).and_then(|t| t.as_tensor()) else {
            continue;
        };
        let want = match &tt.shape {
            Some(s) => format!(
                "{}[{}]",
                tt.elem.name(),
                s.dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match d {
                        Dim::Known(k) => k.to_string(),
                        Dim::Sym(n) => n.clone(),
                        Dim::Unknown => format!("?{i}"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => tt.elem.name().to_string(),
        };
        let fits = t.dtype == tt.elem
            && tt.shape.as_ref().is_none_or(|s| {
                s.dims.len() == t.shape.len()
                    && s.dims.iter().zip(&t.shape).all(|(d, &n)| match d {
                        Dim::Known(k) => *k == n as i64,
                        _ => true,
                    })
            });
        if !fits {
            return Err(Error::new(format!(
                "{}: array '{name}' is {}{:?} per batch of {}, the model's input '{name}' is {want}",
                data.label(),
                t.dtype.name(),
                t.shape,
                opts.batch
            )));
        }
    }
    Ok(())
}

fn has_dropout(g: &graphopt_ir::Graph) -> bool {
    g.nodes().any(|n| {
        let d = g.node(n);
        d.op_type == "Dropout" || d.attributes.iter().any(|a| a.graphs().any(has_dropout))
    })
}

fn host_of(t: &Tensor, name: &str) -> Result<HostTensor> {
    let data = t.raw().ok_or_else(|| {
        Error::new(format!(
            "initializer '{name}': its data is not loaded (external data?)"
        ))
    })?;
    Ok(HostTensor {
        dtype: t.dtype,
        shape: t.dims.iter().map(|&d| d as usize).collect(),
        data: data.to_vec(),
    })
}

fn scalar_i64(v: i64) -> HostTensor {
    HostTensor::from_i64(&[], &[v])
}

fn read_i64(t: &HostTensor) -> Option<i64> {
    (t.dtype == DType::I64 && t.data.len() == 8)
        .then(|| i64::from_le_bytes(t.data[..8].try_into().expect("8 bytes")))
}

/// The checkpoint `resume` names: the file, or the latest `step-*.npz` in
/// the folder.
fn checkpoint_file(p: &Path) -> Result<PathBuf> {
    if !p.is_dir() {
        return Ok(p.to_path_buf());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(p)
        .map_err(|e| Error::io(p, "read", e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|f| {
            f.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step-") && n.ends_with(".npz"))
        })
        .collect();
    files.sort();
    files.pop().ok_or_else(|| {
        Error::new(format!(
            "--resume {}: no step-*.npz checkpoint",
            p.display()
        ))
    })
}

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
        opts.validate()?;
        self.transact(|s| s.train_step(data, eval, opts, progress))
    }

    fn train_step(
        &mut self,
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
        let lr = match optimizer {
            Optimizer::Sgd { lr, .. } => lr as f64,
            Optimizer::AdamW { lr, .. } => lr,
            Optimizer::None => 0.0,
        };
        // 1. The step's graphs, and the micro-batch count: given, chosen
        //    under the budget (the fewest micro-batches that fit), or one.
        let first = data.gather(&(0..opts.batch).collect::<Vec<_>>())?;
        check_arrays(&self.model.graph, &first, data, opts)?;
        let first = to_feed(first, &self.model, opts);
        check_feed(&first, data, opts)?;
        let mut graphs = StepGraphs::new(self, opts, optimizer);
        let counts: Vec<usize> = match (opts.micro_batches, opts.budget) {
            (Some(m), _) => vec![m],
            (None, None) => vec![1],
            (None, Some(_)) => (1..=opts.batch)
                .filter(|m| opts.batch.is_multiple_of(*m))
                .collect(),
        };
        let mut chosen: Option<Stepper> = None;
        let mut tried: Vec<String> = Vec::new();
        for m in counts {
            let s = graphs.stepper(self, &first, m, data)?;
            let need = s.planned_bytes();
            match opts.budget {
                Some(b) if need > b => {
                    tried.push(format!("{} x {}: {}", m, opts.batch / m, human_bytes(need)));
                }
                _ => {
                    chosen = Some(s);
                    break;
                }
            }
        }
        let Some(mut stepper) = chosen else {
            return Err(Error::budget(format!(
                "--budget {}: no micro-batch fits (micro-batches x examples: {})",
                human_bytes(opts.budget.unwrap_or(0)),
                tried.join(", ")
            )));
        };
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
        let per_epoch = n / opts.batch;
        let total = match opts.length {
            TrainLength::Epochs(e) => e * per_epoch,
            TrainLength::Steps(s) => s,
        };
        let mut start = 0usize;
        let mut resumed_from = None;
        if let Some(r) = &opts.resume {
            let file = checkpoint_file(r)?;
            start = resume(&file, &mut state, n, opts)?;
            resumed_from = Some((file.display().to_string(), start));
        }
        if let Some(dir) = &opts.checkpoint {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create", e))?;
        }
        let schedule = |step: usize| -> (usize, Vec<usize>) {
            let epoch = step / per_epoch;
            let at = (step % per_epoch) * opts.batch;
            let order: Vec<usize> = if opts.shuffle {
                epoch_permutation(n, opts.seed, epoch)[at..at + opts.batch].to_vec()
            } else {
                (at..at + opts.batch).collect()
            };
            (epoch + 1, order)
        };

        let threads = opts
            .threads
            .unwrap_or_else(graphopt_exec::cpu::par::default_threads);
        let ropts = graphopt_exec::RunOptions {
            threads,
            poison: false,
        };
        let mut log = Vec::new();
        let mut evals = Vec::new();
        let mut checkpoints = Vec::new();
        let mut data_wait = 0.0;
        let write_checkpoint = |state: &State, step: usize| -> Result<Option<String>> {
            let Some(dir) = &opts.checkpoint else {
                return Ok(None);
            };
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
                    .step(&batch, &mut state, &ropts)
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
                if done % opts.every == 0 && done < total {
                    if let Some(c) = write_checkpoint(&stepper.snapshot(&state), done)? {
                        checkpoints.push(c);
                    }
                }
                let epoch_end = done % per_epoch == 0;
                if let (Some(ev), true) = (eval, epoch_end || done == total) {
                    let now = stepper.snapshot(&state);
                    let (value, examples) =
                        eval_state.measure(model, &mut stepper, ev, &now, opts, &ropts)?;
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
        if total > start {
            if let Some(c) = write_checkpoint(&stepper.snapshot(&state), total)? {
                checkpoints.push(c);
            }
        }

        // 4. The trained weights into the session's model: read out of the
        //    step's arena, which goes before they are moved in (no third
        //    copy).
        let mut state = stepper.snapshot(&state);
        let (micro, planned_bytes, donated_bytes, arena_bytes, workspace_bytes) = (
            stepper.micro,
            stepper.planned_bytes(),
            stepper.donated_bytes(),
            stepper.arena_bytes(),
            stepper.workspace_bytes(),
        );
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

/// Restores `state` from checkpoint `file`; returns the steps it had done.
fn resume(file: &Path, state: &mut State, n: usize, opts: &TrainOptions) -> Result<usize> {
    let arrays = read_npz(file)?;
    let get = |k: &str| arrays.iter().find(|(n, _)| n == k).map(|(_, t)| t);
    let meta = |k: &str| get(k).and_then(read_i64);
    let expect = [
        (SEED_KEY, opts.seed as i64, "--seed"),
        (BATCH_KEY, opts.batch as i64, "--batch"),
        (EXAMPLES_KEY, n as i64, "the data's example count"),
        (SHUFFLE_KEY, opts.shuffle as i64, "--no-shuffle"),
    ];
    for (k, want, what) in expect {
        if meta(k) != Some(want) {
            return Err(Error::new(format!(
                "--resume {}: it was written with another {what} ({} there, {want} now)",
                file.display(),
                meta(k).map_or("none".to_string(), |v| v.to_string())
            )));
        }
    }
    let start = meta(STEP_KEY)
        .filter(|&s| s >= 0)
        .ok_or_else(|| Error::new(format!("--resume {}: no {STEP_KEY}", file.display())))?
        as usize;
    for (name, t) in state.iter_mut() {
        let c = get(name).ok_or_else(|| {
            Error::new(format!(
                "--resume {}: no array '{name}' (a checkpoint of another model?)",
                file.display()
            ))
        })?;
        if c.dtype != t.dtype || c.shape != t.shape {
            return Err(Error::new(format!(
                "--resume {}: array '{name}' is {}{:?}, the model's is {}{:?}",
                file.display(),
                c.dtype.name(),
                c.shape,
                t.dtype.name(),
                t.shape
            )));
        }
        *t = c.clone();
    }
    Ok(start)
}

/// A batch by the names the step's graphs read: the target array becomes
/// `target`; arrays that are neither a model input nor the target go.
fn to_feed(batch: Vec<(String, HostTensor)>, model: &Model, opts: &TrainOptions) -> State {
    let g = &model.graph;
    batch
        .into_iter()
        .filter_map(|(n, t)| {
            if n == opts.target {
                Some(("target".to_string(), t))
            } else if g.value_by_name(&n).is_some_and(|v| g.is_input(v)) {
                Some((n, t))
            } else {
                None
            }
        })
        .collect()
}

/// The loss's target is there when the loss needs one.
fn check_feed(batch: &State, data: &dyn DataSource, opts: &TrainOptions) -> Result<()> {
    let needs_target = matches!(opts.loss, Loss::Mse | Loss::L1 | Loss::CrossEntropy);
    if needs_target && !batch.contains_key("target") {
        return Err(Error::new(format!(
            "{}: no array '{}' (the loss's target; name another array with --target); it has {}",
            data.label(),
            opts.target,
            data.names().join(", ")
        )));
    }
    Ok(())
}

/// The dims of a batch of `rows` examples.
fn batch_dims(batch: &State, rows: usize) -> DimValues {
    DimValues {
        bound: Vec::new(),
        shapes: batch
            .iter()
            .map(|(n, t)| {
                let mut s: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                s[0] = rows as i64;
                (n.clone(), s)
            })
            .collect(),
        default: None,
    }
}

/// Examples `k * rows .. (k + 1) * rows` of every array.
fn slice_rows(batch: &State, k: usize, rows: usize) -> State {
    batch
        .iter()
        .map(|(n, t)| {
            let per = t.data.len() / t.shape[0].max(1);
            let mut shape = t.shape.clone();
            shape[0] = rows;
            (
                n.clone(),
                HostTensor {
                    dtype: t.dtype,
                    shape,
                    data: t.data[k * rows * per..(k + 1) * rows * per].to_vec(),
                },
            )
        })
        .collect()
}

/// The training graphs a run may need, each built once: the fused step
/// (gradients and the update in one graph), the gradients alone, and the
/// update alone (micro-batches).
struct StepGraphs {
    opts: AutodiffOptions,
    fused: Option<(Model, Vec<String>, State)>,
    grads: Option<(Model, Vec<String>, State)>,
    update: Option<(Model, State)>,
    warnings: Vec<String>,
}

impl StepGraphs {
    fn new(session: &Session, opts: &TrainOptions, optimizer: Optimizer) -> StepGraphs {
        StepGraphs {
            opts: AutodiffOptions {
                output: opts.output.clone(),
                loss: opts.loss,
                class_axis: opts.class_axis,
                trainable: opts.trainable.clone(),
                frozen: opts.frozen.clone(),
                optimizer,
                params_as_inputs: true,
                // Only where there is a Dropout to switch (else grad warns
                // that the option changed nothing).
                dropout_train: opts.dropout_train && has_dropout(&session.model.graph),
                ..AutodiffOptions::default()
            },
            fused: None,
            grads: None,
            update: None,
            warnings: Vec::new(),
        }
    }

    /// `Session::grad` of `model` with these options; the gradients are
    /// outputs only without an optimizer.
    fn build(
        &mut self,
        model: &Model,
        opts: AutodiffOptions,
        dims: &DimValues,
    ) -> Result<(Model, Vec<String>, State)> {
        let mut s = Session::from_model(model.clone());
        let r = s.grad(&GradOptions {
            autodiff: opts,
            dims: dims.clone(),
            ..GradOptions::default()
        })?;
        for w in &r.warnings {
            if !self.warnings.contains(w) {
                self.warnings.push(w.clone());
            }
        }
        let mut state = State::new();
        for (name, t) in &r.initial_state {
            state.insert(name.clone(), host_of(t, name)?);
        }
        // With an optimizer, `grad` leaves the gradients out of the outputs.
        let m = s.into_model();
        Ok((m, r.params, state))
    }

    /// The step for `micro` micro-batches, planned for `first`'s shapes.
    fn stepper(
        &mut self,
        session: &Session,
        first: &State,
        micro: usize,
        data: &dyn DataSource,
    ) -> Result<Stepper> {
        let batch = first.values().next().map_or(0, |t| t.shape[0]);
        if micro == 0 || !batch.is_multiple_of(micro) {
            return Err(Error::new(format!(
                "--micro-batches {micro}: the batch of {batch} does not split into {micro} equal micro-batches"
            )));
        }
        let rows = batch / micro;
        let dims = batch_dims(first, rows);
        if micro == 1 {
            if self.fused.is_none() {
                let built = self.build(&session.model, self.opts.clone(), &dims)?;
                self.fused = Some(built);
            }
            let (m, params, state) = self.fused.as_ref().expect("built");
            let fused = Bound::new(session, m, &dims, first, data)?;
            return Ok(Stepper {
                micro,
                fused: Some(fused),
                grads: None,
                update: None,
                params: params.clone(),
                held_bytes: state_bytes(state, None),
                param_bytes: state_bytes(state, Some(params)),
                mean: self.opts.loss != Loss::Sum,
                restore: None,
            });
        }
        if self.grads.is_none() {
            let opts = AutodiffOptions {
                optimizer: Optimizer::None,
                ..self.opts.clone()
            };
            let built = self.build(&session.model, opts, &dims)?;
            self.grads = Some(built);
        }
        let (_, params, gstate) = self.grads.as_ref().expect("built");
        let params = params.clone();
        if self.update.is_none() {
            let um = update_model(&params, gstate)?;
            let opts = AutodiffOptions {
                output: None,
                loss: Loss::Sum,
                trainable: params.clone(),
                frozen: Vec::new(),
                dropout_train: false,
                ..self.opts.clone()
            };
            let (m, _, mut state) = self.build(&um, opts, &DimValues::default())?;
            // The parameters' values are the gradient graph's: keep the
            // optimizer state only.
            state.retain(|k, _| !params.contains(k));
            self.update = Some((m, state));
        }
        let (gm, _, gstate) = self.grads.as_ref().expect("built");
        let (um, ustate) = self.update.as_ref().expect("built");
        let grads = Bound::new(session, gm, &dims, first, data)?;
        let update = Bound::new(session, um, &DimValues::default(), &State::new(), data)?;
        Ok(Stepper {
            micro,
            fused: None,
            grads: Some(grads),
            update: Some(update),
            held_bytes: state_bytes(gstate, None) + state_bytes(ustate, None),
            param_bytes: state_bytes(gstate, Some(&params)),
            params,
            mean: self.opts.loss != Loss::Sum,
            restore: None,
        })
    }

    /// The parameters and optimizer state before the first step, for the
    /// step of `micro` micro-batches, moved out (held once).
    fn take_state(&mut self, micro: usize) -> State {
        if micro == 1 {
            return self
                .fused
                .as_mut()
                .map(|f| std::mem::take(&mut f.2))
                .unwrap_or_default();
        }
        let mut state = self
            .grads
            .as_mut()
            .map(|g| std::mem::take(&mut g.2))
            .unwrap_or_default();
        if let Some(u) = self.update.as_mut() {
            state.append(&mut u.1);
        }
        state
    }
}

/// Bytes of `state` (of the entries `only` names, when given).
fn state_bytes(state: &State, only: Option<&Vec<String>>) -> u64 {
    state
        .iter()
        .filter(|(k, _)| only.is_none_or(|o| o.contains(k)))
        .map(|(_, t)| t.data.len() as u64)
        .sum()
}

/// The optimizer's update alone, as a model the gradient builder turns into
/// a training step: for each parameter `p` a graph input `p__grad` (the
/// accumulated gradient), and `y = Σ ReduceSum(p · p__grad)`, whose gradient
/// with respect to `p` is exactly `p__grad`. The update the builder then
/// emits is the one the fused step has, applied to the given gradient.
fn update_model(params: &[String], state: &State) -> Result<Model> {
    use graphopt_ir::{Graph, NewNode, Shape, Type};
    let mut g = Graph::new("update");
    let mut sum = None;
    for p in params {
        let t = state
            .get(p)
            .ok_or_else(|| Error::new(format!("parameter '{p}' has no value")))?;
        let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        let ty = Type::tensor(t.dtype, Some(Shape::known(&dims)));
        let pv = g.fresh_value(p, Some(ty.clone()));
        let tensor = Tensor::from_raw(t.dtype, dims, t.data.clone().into())
            .map_err(|e| Error::new(format!("parameter '{p}': {e}")))?;
        g.set_initializer(pv, tensor);
        let gv = g.fresh_value(&grad_input(p), Some(ty));
        g.inputs.push(gv);
        let prod = g.fresh_value(&format!("{p}__prod"), None);
        g.add_node(NewNode::new("Mul").inputs(&[pv, gv]).outputs(&[prod]))?;
        let r = g.fresh_value(&format!("{p}__sum"), None);
        g.add_node(
            NewNode::new("ReduceSum")
                .inputs(&[prod])
                .outputs(&[r])
                .attr(graphopt_ir::Attribute::new(
                    "keepdims",
                    graphopt_ir::AttrValue::Int(0),
                )),
        )?;
        sum = Some(match sum {
            None => r,
            Some(s) => {
                let a = g.fresh_value("update__total", None);
                g.add_node(NewNode::new("Add").inputs(&[s, r]).outputs(&[a]))?;
                a
            }
        });
    }
    let y = sum.ok_or_else(|| Error::new("no trainable parameters"))?;
    g.outputs.push(y);
    Ok(Model::new(g, 17))
}

/// The update graph's input for parameter `p`'s accumulated gradient.
fn grad_input(p: &str) -> String {
    format!("{p}__grad")
}

/// A graph planned for one batch size and bound to the CPU runtime.
struct Bound {
    exe: Executable,
    inputs: Vec<(String, graphopt_exec::TensorInfo)>,
    outputs: Vec<String>,
    /// Inputs that a donated output overwrites (the plan's donations).
    donated: Vec<String>,
    /// The donated inputs' values live in the arena (after a kept run);
    /// the host's copies are gone.
    kept: bool,
}

impl Bound {
    /// Plans `model` at `dims`; checks that `first` (a batch of the size
    /// planned for, or nothing) has each data input's type and shape.
    fn new(
        session: &Session,
        model: &Model,
        dims: &DimValues,
        first: &State,
        data: &dyn DataSource,
    ) -> Result<Bound> {
        let planned = graphopt_plan::plan_model(model, dims, &PlanOptions::default())
            .map_err(|e| session.err(e))?;
        let exe = Executable::new(&planned.model, &planned.plan, &CpuBackend)
            .map_err(|e| Error::runtime(e.to_string()))?;
        let inputs = exe.input_infos();
        let rows = dims.shapes.first().and_then(|s| s.1.first().copied());
        for (name, info) in &inputs {
            let Some(t) = first.get(name) else { continue };
            let mut shape = t.shape.clone();
            if let Some(r) = rows {
                shape[0] = r as usize;
            }
            if t.dtype != info.dtype || shape != info.shape {
                return Err(Error::new(format!(
                    "{}: array '{name}' is {}{:?} per batch, the model's input '{name}' wants {}{:?}",
                    data.label(),
                    t.dtype.name(),
                    shape,
                    info.dtype.name(),
                    info.shape
                )));
            }
        }
        let outputs = exe.output_names();
        let donated = exe.donated_pairs().into_iter().map(|(i, _)| i).collect();
        Ok(Bound {
            exe,
            inputs,
            outputs,
            donated,
            kept: false,
        })
    }

    /// A training step that keeps the donated state in the arena: the
    /// first run takes it from `state` (whose copies of it are then
    /// dropped), later runs leave it where the previous run wrote it. The
    /// other outputs come back (`None` for the donated ones).
    fn run_kept(
        &mut self,
        state: &mut State,
        batch: &State,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<Vec<Option<HostTensor>>> {
        let feed = self
            .inputs
            .iter()
            .map(|(name, _)| {
                if self.kept && self.donated.contains(name) {
                    return Ok(None);
                }
                state
                    .get(name)
                    .or_else(|| batch.get(name))
                    .map(Some)
                    .ok_or_else(|| Error::new(format!("no value for the step's input '{name}'")))
            })
            .collect::<Result<Vec<_>>>()?;
        let (outs, _) = self
            .exe
            .run_donated(&feed, ropts)
            .map_err(|e| Error::runtime(e.to_string()))?;
        if !self.kept {
            for name in &self.donated {
                state.remove(name);
            }
            self.kept = true;
        }
        Ok(outs)
    }

    /// `state` with the values the arena holds for it.
    fn snapshot(&self, state: &State) -> State {
        let mut all = state.clone();
        if self.kept {
            for name in &self.donated {
                if let Some(t) = self.exe.read_input(name) {
                    all.insert(name.clone(), t);
                }
            }
        }
        all
    }

    fn at(&self, name: &str) -> Result<usize> {
        self.outputs
            .iter()
            .position(|o| o == name)
            .ok_or_else(|| Error::new(format!("the training graph has no '{name}' output")))
    }

    /// Runs on `state` and `batch` (looked up by input name).
    fn run(
        &mut self,
        state: &State,
        batch: &State,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<Vec<HostTensor>> {
        let feed =
            self.inputs
                .iter()
                .map(|(name, _)| {
                    state.get(name).or_else(|| batch.get(name)).ok_or_else(|| {
                        Error::new(format!("no value for the step's input '{name}'"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
        let (outs, _) = self
            .exe
            .run_borrowed(&feed, ropts)
            .map_err(|e| Error::runtime(e.to_string()))?;
        Ok(outs)
    }

    /// The `<name>_new` outputs into `state`.
    fn feed_back(&self, outs: Vec<HostTensor>, state: &mut State) {
        for (o, t) in self.outputs.iter().zip(outs) {
            if let Some(s) = o.strip_suffix("_new") {
                if state.contains_key(s) {
                    state.insert(s.to_string(), t);
                }
            }
        }
    }

    fn bytes(&self) -> u64 {
        self.exe.arena_planned_bytes() + self.exe.workspace_bytes()
    }
}

fn scalar_of(t: &HostTensor) -> f64 {
    t.to_f32()
        .and_then(|v| v.first().copied())
        .map(f64::from)
        .unwrap_or(f64::NAN)
}

/// One training step: the fused graph, or `micro` gradient runs summed and
/// one update.
struct Stepper {
    micro: usize,
    fused: Option<Bound>,
    grads: Option<Bound>,
    update: Option<Bound>,
    params: Vec<String>,
    /// Bytes of the parameters and optimizer state, and of the parameters.
    held_bytes: u64,
    param_bytes: u64,
    /// The loss is a mean over the batch (the micro-batches' gradients are
    /// averaged), not a sum.
    mean: bool,
    /// Kept state an eval overwrote, to give back before the next step.
    restore: Option<State>,
}

impl Stepper {
    /// The parameters and optimizer state as they are now: `state` with
    /// what the fused step keeps in its arena.
    fn snapshot(&self, state: &State) -> State {
        let mut all = match &self.fused {
            Some(f) => f.snapshot(state),
            None => state.clone(),
        };
        if let Some(r) = &self.restore {
            all.extend(r.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        all
    }

    /// Donated bytes: parameters and state held once, in the arena.
    fn donated_bytes(&self) -> u64 {
        self.fused.as_ref().map_or(0, |f| f.exe.donated_bytes())
    }
}

impl Stepper {
    /// Parameters, optimizer state, gradient accumulators (micro-batches)
    /// and every graph's arena and workspace.
    fn planned_bytes(&self) -> u64 {
        let held = self.held_bytes;
        let acc: u64 = if self.micro > 1 { self.param_bytes } else { 0 };
        // Donated state lives in the arena: counted there, not twice.
        held.saturating_sub(self.donated_bytes())
            + acc
            + self.arena_bytes()
            + self.workspace_bytes()
    }

    fn bounds(&self) -> impl Iterator<Item = &Bound> {
        self.fused.iter().chain(&self.grads).chain(&self.update)
    }

    fn arena_bytes(&self) -> u64 {
        self.bounds().map(|b| b.exe.arena_planned_bytes()).sum()
    }

    fn workspace_bytes(&self) -> u64 {
        self.bounds()
            .map(|b| b.bytes() - b.exe.arena_planned_bytes())
            .sum()
    }

    /// One step on `batch`; returns its loss.
    fn step(
        &mut self,
        batch: &State,
        state: &mut State,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<f64> {
        if let Some(f) = &mut self.fused {
            if let Some(back) = self.restore.take() {
                // An eval ran the step's graph over the kept state: give
                // it back before stepping on.
                state.extend(back);
                f.kept = false;
            }
            let outs = f.run_kept(state, batch, ropts)?;
            let loss = outs[f.at("loss")?].as_ref().map_or(f64::NAN, scalar_of);
            let outs: Vec<HostTensor> = outs
                .into_iter()
                .map(|o| {
                    o.unwrap_or(HostTensor {
                        dtype: DType::F32,
                        shape: Vec::new(),
                        data: Vec::new(),
                    })
                })
                .collect();
            let donated = f.donated.clone();
            for (o, t) in f.outputs.iter().zip(outs) {
                if let Some(name) = o.strip_suffix("_new") {
                    if state.contains_key(name) && !donated.iter().any(|d| d == name) {
                        state.insert(name.to_string(), t);
                    }
                }
            }
            return Ok(loss);
        }
        let (Some(g), Some(u)) = (&mut self.grads, &mut self.update) else {
            return Err(Error::new("no step graph"));
        };
        let rows = batch.values().next().map_or(0, |t| t.shape[0]) / self.micro;
        let mut acc: BTreeMap<&str, Vec<f32>> = BTreeMap::new();
        let mut loss = 0.0;
        for k in 0..self.micro {
            let micro = slice_rows(batch, k, rows);
            let outs = g.run(state, &micro, ropts)?;
            loss += scalar_of(&outs[g.at("loss")?]);
            for p in &self.params {
                let t = &outs[g.at(&format!("{p}_grad"))?];
                let v = t.to_f32().ok_or_else(|| {
                    Error::unsupported(format!(
                        "micro-batches need float32 gradients; '{p}' is {}",
                        t.dtype.name()
                    ))
                })?;
                match acc.get_mut(p.as_str()) {
                    Some(a) => a.iter_mut().zip(&v).for_each(|(a, b)| *a += b),
                    None => {
                        acc.insert(p, v);
                    }
                }
            }
        }
        // A mean loss over the batch is the mean of the micro-batches'.
        let scale = if self.mean {
            1.0 / self.micro as f32
        } else {
            1.0
        };
        let mut grads = State::new();
        for p in &self.params {
            let v = &acc[p.as_str()];
            let shape = state.get(p).map(|t| t.shape.clone()).unwrap_or_default();
            let scaled: Vec<f32> = v.iter().map(|x| x * scale).collect();
            grads.insert(grad_input(p), HostTensor::from_f32(&shape, &scaled));
        }
        let outs = u.run(state, &grads, ropts)?;
        u.feed_back(outs, state);
        Ok(if self.mean {
            loss / self.micro as f64
        } else {
            loss
        })
    }

    /// The loss of `batch` (the size the loss graph was planned for), no
    /// update.
    fn loss_only(
        &mut self,
        batch: &State,
        state: &State,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<f64> {
        if let Some(f) = &mut self.fused {
            // The step's graph writes its updates over the kept state:
            // run it on a copy, and give the state back before the next
            // step.
            let all = f.snapshot(state);
            let outs = f.run(&all, batch, ropts)?;
            if f.kept && self.restore.is_none() {
                self.restore = Some(
                    f.donated
                        .iter()
                        .filter_map(|n| all.get(n).map(|t| (n.clone(), t.clone())))
                        .collect(),
                );
            }
            return Ok(scalar_of(&outs[f.at("loss")?]));
        }
        let b = self
            .grads
            .as_mut()
            .ok_or_else(|| Error::new("no step graph"))?;
        let outs = b.run(state, batch, ropts)?;
        Ok(scalar_of(&outs[b.at("loss")?]))
    }

    /// Examples per run of the loss graph.
    fn loss_rows(&self, batch: usize) -> usize {
        batch / self.micro
    }
}

/// Runs the eval data through the current weights: the inference model
/// (parameters as inputs) for accuracy, the step's loss graph for the
/// loss. Plans are made once per batch size.
#[derive(Default)]
struct EvalRunner {
    plans: Vec<(usize, Executable, Vec<String>)>,
}

impl EvalRunner {
    fn measure(
        &mut self,
        model: &Model,
        stepper: &mut Stepper,
        eval: &dyn DataSource,
        state: &State,
        opts: &TrainOptions,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<(f64, usize)> {
        let n = eval.examples();
        match opts.metric {
            Metric::Loss => {
                // Full batches through the loss graph, no update.
                let rows = stepper.loss_rows(opts.batch);
                let batches = n / rows;
                if batches == 0 {
                    return Err(Error::new(format!(
                        "--metric loss: {} has fewer examples than a batch",
                        eval.label()
                    )));
                }
                let mut sum = 0.0;
                for b in 0..batches {
                    let idx: Vec<usize> = (b * rows..(b + 1) * rows).collect();
                    let batch = to_feed(eval.gather(&idx)?, model, opts);
                    sum += stepper.loss_only(&batch, state, ropts)?;
                }
                Ok((sum / batches as f64, batches * rows))
            }
            Metric::Accuracy => {
                let (mut right, mut total) = (0usize, 0usize);
                let mut at = 0;
                while at < n {
                    let len = opts.batch.min(n - at);
                    let idx: Vec<usize> = (at..at + len).collect();
                    at += len;
                    let raw = eval.gather(&idx)?;
                    let target = raw
                        .iter()
                        .find(|(n, _)| *n == opts.target)
                        .map(|(_, t)| t.clone())
                        .ok_or_else(|| {
                            Error::new(format!("{}: no array '{}'", eval.label(), opts.target))
                        })?;
                    let batch = to_feed(raw, model, opts);
                    let k = match self.plans.iter().position(|p| p.0 == len) {
                        Some(k) => k,
                        None => {
                            self.plans
                                .push(Self::plan(model, &batch, &stepper.params, len)?);
                            self.plans.len() - 1
                        }
                    };
                    let (_, exe, out_names) = &mut self.plans[k];
                    let feed = exe
                        .input_infos()
                        .iter()
                        .map(|(name, _)| {
                            state.get(name).or_else(|| batch.get(name)).ok_or_else(|| {
                                Error::new(format!("{}: no array '{name}'", eval.label()))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let (outs, _) = exe
                        .run_borrowed(&feed, ropts)
                        .map_err(|e| Error::runtime(format!("eval: {e}")))?;
                    let out_at = match &opts.output {
                        Some(o) => out_names.iter().position(|x| x == o).unwrap_or(0),
                        None => 0,
                    };
                    let (r, t) = argmax_hits(&outs[out_at], &target, opts.class_axis)?;
                    right += r;
                    total += t;
                }
                Ok((right as f64 / total.max(1) as f64, n))
            }
        }
    }

    /// The inference model with the trainable parameters as graph inputs,
    /// planned for a batch of `len`.
    fn plan(
        model: &Model,
        batch: &State,
        params: &[String],
        len: usize,
    ) -> Result<(usize, Executable, Vec<String>)> {
        let mut m = model.clone();
        let g = &mut m.graph;
        for p in params {
            if let Some(v) = g.value_by_name(p) {
                g.take_initializer(v);
                if !g.inputs.contains(&v) {
                    g.inputs.push(v);
                }
            }
        }
        let mut dims = batch_dims(batch, len);
        dims.shapes.retain(|(n, _)| n != "target");
        let planned = graphopt_plan::plan_model(&m, &dims, &PlanOptions::default())?;
        let exe = Executable::new(&planned.model, &planned.plan, &CpuBackend)
            .map_err(|e| Error::runtime(format!("eval: {e}")))?;
        let names = exe.output_names();
        Ok((len, exe, names))
    }
}

/// Positions whose arg-max over `axis` of `logits` equals `target` (the
/// logits' shape without that axis), and how many positions there are.
fn argmax_hits(logits: &HostTensor, target: &HostTensor, axis: i64) -> Result<(usize, usize)> {
    let v = logits
        .to_f32()
        .ok_or_else(|| Error::new("--metric accuracy: the output is not float"))?;
    let r = logits.shape.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..r).contains(&a) {
        return Err(Error::new(format!(
            "--class-axis {axis}: the output has rank {r}"
        )));
    }
    let a = a as usize;
    let classes = logits.shape[a];
    let inner: usize = logits.shape[a + 1..].iter().product();
    let outer: usize = logits.shape[..a].iter().product();
    let t: Vec<i64> = match target.dtype {
        DType::I64 => target
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        DType::I32 => target
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
            .collect(),
        d => {
            return Err(Error::new(format!(
                "--metric accuracy: the target is {}, expected int64 class indices",
                d.name()
            )))
        }
    };
    if t.len() != outer * inner {
        return Err(Error::new(format!(
            "--metric accuracy: the target has {} elements, the output {} positions",
            t.len(),
            outer * inner
        )));
    }
    let mut hits = 0;
    for o in 0..outer {
        for i in 0..inner {
            let mut best = (f32::NEG_INFINITY, 0usize);
            for c in 0..classes {
                let x = v[(o * classes + c) * inner + i];
                if x > best.0 {
                    best = (x, c);
                }
            }
            if t[o * inner + i] == best.1 as i64 {
                hits += 1;
            }
        }
    }
    Ok((hits, outer * inner))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_seeded_and_complete() {
        let a = epoch_permutation(100, 7, 0);
        let mut s = a.clone();
        s.sort();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_eq!(a, epoch_permutation(100, 7, 0));
        assert_ne!(a, epoch_permutation(100, 7, 1));
        assert_ne!(a, epoch_permutation(100, 8, 0));
    }

    #[test]
    fn arrays_must_agree_and_be_finite() {
        let x = HostTensor::from_f32(&[3, 2], &[0.0, 1.0, 2.0, 3.0, f32::NAN, 5.0]);
        let y = HostTensor::from_i64(&[3], &[0, 1, 2]);
        let e = ArrayData::new(vec![("x".into(), x), ("y".into(), y.clone())], "d.npz")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "d.npz: array 'x' holds NaN or Inf (example 2)");
        let x = HostTensor::from_f32(&[2, 2], &[0.0; 4]);
        let e = ArrayData::new(vec![("x".into(), x), ("y".into(), y)], "d.npz")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'y' has 3 examples, 'x' has 2"), "{e}");
    }

    #[test]
    fn gather_stacks_examples() {
        let x = HostTensor::from_f32(&[3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let d = ArrayData::new(vec![("x".into(), x)], "d").unwrap();
        let b = d.gather(&[2, 0]).unwrap();
        assert_eq!(b[0].1.shape, vec![2, 2]);
        assert_eq!(b[0].1.to_f32().unwrap(), vec![4.0, 5.0, 0.0, 1.0]);
    }

    #[test]
    fn accuracy_over_a_middle_class_axis() {
        // [1, 3 classes, 2 positions]: arg-max 2 then 0.
        let l = HostTensor::from_f32(&[1, 3, 2], &[0.0, 5.0, 1.0, 0.0, 9.0, 1.0]);
        let t = HostTensor::from_i64(&[1, 2], &[2, 1]);
        assert_eq!(argmax_hits(&l, &t, 1).unwrap(), (1, 2));
    }
}
