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
use graphopt_ir::{DType, Tensor};
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
            let mut all: Vec<(String, HostTensor)> = Vec::new();
            for f in &files {
                let shard = read_npz(f)?;
                if all.is_empty() {
                    all = shard;
                    continue;
                }
                let names = |a: &[(String, HostTensor)]| -> Vec<String> {
                    a.iter().map(|(n, _)| n.clone()).collect()
                };
                if names(&shard) != names(&all) {
                    return Err(Error::new(format!(
                        "{}: arrays {:?} differ from the first shard's {:?}",
                        f.display(),
                        names(&shard),
                        names(&all)
                    )));
                }
                for ((name, a), (_, b)) in all.iter_mut().zip(shard) {
                    if a.dtype != b.dtype || a.shape.get(1..) != b.shape.get(1..) {
                        return Err(Error::new(format!(
                            "{}: array '{name}' is {}{:?}, the first shard's is {}{:?}",
                            f.display(),
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
            return ArrayData::new(all, &label);
        }
        ArrayData::new(read_npz(path)?, &label)
    }
}

fn read_npz(path: &Path) -> Result<Vec<(String, HostTensor)>> {
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
        if self.threads == Some(0) {
            return Err(Error::new("--threads 0: expected at least 1"));
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
        // 1. The training step.
        let mut step_session = Session::from_model(self.model.clone());
        let first = data.gather(&(0..opts.batch).collect::<Vec<_>>())?;
        let feed_name = |array: &str| -> String {
            if array == opts.target {
                "target".to_string()
            } else {
                array.to_string()
            }
        };
        let dims = DimValues {
            bound: Vec::new(),
            // The arrays the step reads: the model's inputs and the target.
            shapes: first
                .iter()
                .map(|(n, t)| (feed_name(n), t.shape.iter().map(|&d| d as i64).collect()))
                .filter(|(n, _): &(String, Vec<i64>)| {
                    n == "target" || {
                        let g = &self.model.graph;
                        g.value_by_name(n).is_some_and(|v| g.is_input(v))
                    }
                })
                .collect(),
            default: None,
        };
        check_arrays(&self.model.graph, &first, data, opts)?;
        let grad = step_session.grad(&GradOptions {
            autodiff: AutodiffOptions {
                output: opts.output.clone(),
                loss: opts.loss,
                class_axis: opts.class_axis,
                trainable: opts.trainable.clone(),
                frozen: opts.frozen.clone(),
                optimizer,
                params_as_inputs: true,
                // Only where there is a Dropout to switch (else grad warns
                // that the option changed nothing).
                dropout_train: opts.dropout_train && has_dropout(&self.model.graph),
                ..AutodiffOptions::default()
            },
            dims: dims.clone(),
            ..GradOptions::default()
        })?;
        // The gradients feed the updates only: not outputs, so each dies
        // once its update has read it.
        let g = &mut step_session.model_mut().graph;
        let grads: Vec<String> = grad.params.iter().map(|p| format!("{p}_grad")).collect();
        let keep: Vec<_> = g
            .outputs
            .iter()
            .copied()
            .filter(|&v| !grads.iter().any(|n| n == g.name(v)))
            .collect();
        g.outputs = keep;
        // 2. Planned once, bound to the CPU runtime.
        let planned =
            graphopt_plan::plan_model(step_session.model(), &dims, &PlanOptions::default())
                .map_err(|e| self.err(e))?;
        let mut exe = Executable::new(&planned.model, &planned.plan, &CpuBackend)
            .map_err(|e| Error::runtime(e.to_string()))?;
        let mut state: State = BTreeMap::new();
        for (name, t) in &grad.initial_state {
            state.insert(name.clone(), host_of(t, name)?);
        }
        let data_names = data.names();
        let inputs = exe.input_infos();
        for (name, info) in &inputs {
            if state.contains_key(name) {
                continue;
            }
            let array = if name == "target" { &opts.target } else { name };
            let Some((_, t)) = first.iter().find(|(n, _)| n == array) else {
                let what = if name == "target" {
                    " (the loss's target; name another array with --target)".to_string()
                } else {
                    String::new()
                };
                return Err(Error::new(format!(
                    "{}: no array '{array}'{what}; it has {}",
                    data.label(),
                    data_names.join(", ")
                )));
            };
            if t.dtype != info.dtype || t.shape != info.shape {
                return Err(Error::new(format!(
                    "{}: array '{array}' is {}{:?} per batch, the model's input '{name}' wants {}{:?}",
                    data.label(),
                    t.dtype.name(),
                    t.shape,
                    info.dtype.name(),
                    info.shape
                )));
            }
        }
        let outputs = exe.output_names();
        let loss_at = outputs
            .iter()
            .position(|o| o == "loss")
            .ok_or_else(|| Error::new("the training graph has no 'loss' output"))?;
        // Output index -> the state entry it replaces.
        let feedback: Vec<(usize, String)> = outputs
            .iter()
            .enumerate()
            .filter_map(|(i, o)| {
                let s = o.strip_suffix("_new")?;
                state.contains_key(s).then(|| (i, s.to_string()))
            })
            .collect();
        let weights_bytes: u64 = grad
            .params
            .iter()
            .filter_map(|p| state.get(p))
            .map(|t| t.data.len() as u64)
            .sum();
        let state_bytes: u64 = grad
            .state_inputs
            .iter()
            .filter_map(|p| state.get(p))
            .map(|t| t.data.len() as u64)
            .sum();
        let param_elements: u64 = grad
            .params
            .iter()
            .filter_map(|p| state.get(p))
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum();

        // 3. Where to start, and the schedule.
        let per_epoch = n / opts.batch;
        let total = match opts.length {
            TrainLength::Epochs(e) => e * per_epoch,
            TrainLength::Steps(s) => s,
        };
        let mut start = 0usize;
        let mut resumed_from = None;
        if let Some(r) = &opts.resume {
            let file = checkpoint_file(r)?;
            let arrays = read_npz(&file)?;
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
            start = meta(STEP_KEY)
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

        let threads = opts.threads.unwrap_or_else(graphopt_plan::default_threads);
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

        // 4. The loop: batches gathered one ahead on a second thread.
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
            let mut feed: Vec<HostTensor> = Vec::with_capacity(inputs.len());
            for _ in start..total {
                let w0 = Instant::now();
                let Ok((step, epoch, batch)) = rx.recv() else {
                    break;
                };
                let wait = w0.elapsed().as_secs_f64();
                data_wait += wait;
                let mut batch = batch?;
                feed.clear();
                for (name, _) in &inputs {
                    let t = match state.get(name) {
                        Some(t) => t.clone(),
                        None => {
                            let array = if name == "target" { &opts.target } else { name };
                            let i = batch
                                .iter()
                                .position(|(n, _)| n == array)
                                .expect("checked on the first batch");
                            std::mem::replace(
                                &mut batch[i].1,
                                HostTensor {
                                    dtype: DType::F32,
                                    shape: Vec::new(),
                                    data: Vec::new(),
                                },
                            )
                        }
                    };
                    feed.push(t);
                }
                let (mut outs, _) = exe
                    .run(&feed, &ropts)
                    .map_err(|e| Error::runtime(format!("step {}: {e}", step + 1)))?;
                let loss = outs[loss_at]
                    .to_f32()
                    .and_then(|v| v.first().copied())
                    .map(f64::from)
                    .unwrap_or(f64::NAN);
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
                for (i, name) in &feedback {
                    let t = std::mem::replace(
                        &mut outs[*i],
                        HostTensor {
                            dtype: DType::F32,
                            shape: Vec::new(),
                            data: Vec::new(),
                        },
                    );
                    state.insert(name.clone(), t);
                }
                let rec = StepRecord {
                    step: step + 1,
                    epoch,
                    loss,
                    lr,
                    time_s: t0.elapsed().as_secs_f64(),
                    data_wait_s: wait,
                };
                progress(&rec);
                log.push(rec);
                let done = step + 1;
                if done % opts.every == 0 && done < total {
                    if let Some(c) = write_checkpoint(&state, done)? {
                        checkpoints.push(c);
                    }
                }
                let epoch_end = done % per_epoch == 0;
                if let (Some(ev), true) = (eval, epoch_end || done == total) {
                    let value = eval_state.measure(
                        self,
                        &mut exe,
                        ev,
                        &state,
                        &grad.params,
                        opts,
                        &inputs,
                        loss_at,
                        &ropts,
                    )?;
                    evals.push(EvalRecord {
                        step: done,
                        epoch,
                        metric: opts.metric,
                        value: value.0,
                        examples: value.1,
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
            if let Some(c) = write_checkpoint(&state, total)? {
                checkpoints.push(c);
            }
        }

        // 6. The trained weights into the session's model.
        let g = &mut self.model.graph;
        for p in &grad.params {
            let (Some(v), Some(t)) = (g.value_by_name(p), state.get(p)) else {
                continue;
            };
            let tensor = Tensor::from_raw(
                t.dtype,
                t.shape.iter().map(|&d| d as i64).collect(),
                t.data.clone().into(),
            )
            .map_err(|e| Error::new(format!("parameter '{p}': {e}")))?;
            g.set_initializer(v, tensor);
        }
        let time_s = t0.elapsed().as_secs_f64();
        let steps = total.saturating_sub(start);
        Ok(TrainReport {
            data: data.label(),
            examples: n,
            batch: opts.batch,
            dropped_per_epoch: n % opts.batch,
            steps,
            epochs: total as f64 / per_epoch as f64,
            loss: opts.loss.name().to_string(),
            optimizer: opts.optimizer.name.clone(),
            params: grad.params.clone(),
            param_elements,
            weights_bytes,
            state_bytes,
            arena_bytes: exe.arena_planned_bytes(),
            workspace_bytes: exe.workspace_bytes(),
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
            warnings: grad.warnings.clone(),
        })
    }
}

/// Runs the eval data through the current weights: the inference model
/// (parameters as inputs) for accuracy, the training step's loss output
/// for the loss. Plans are made once per batch size.
#[derive(Default)]
struct EvalRunner {
    plans: Vec<(usize, Executable, Vec<String>)>,
}

impl EvalRunner {
    #[allow(clippy::too_many_arguments)]
    fn measure(
        &mut self,
        session: &Session,
        step_exe: &mut Executable,
        eval: &dyn DataSource,
        state: &State,
        params: &[String],
        opts: &TrainOptions,
        step_inputs: &[(String, graphopt_exec::TensorInfo)],
        loss_at: usize,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<(f64, usize)> {
        let n = eval.examples();
        match opts.metric {
            Metric::Loss => {
                // Full batches through the step, its updates discarded.
                let mut sum = 0.0;
                let batches = n / opts.batch;
                if batches == 0 {
                    return Err(Error::new(format!(
                        "--metric loss: {} has fewer examples than a batch",
                        eval.label()
                    )));
                }
                for b in 0..batches {
                    let idx: Vec<usize> = (b * opts.batch..(b + 1) * opts.batch).collect();
                    let batch = eval.gather(&idx)?;
                    let feed = feed_for(step_inputs, state, &batch, opts, &eval.label())?;
                    let (outs, _) = step_exe
                        .run(&feed, ropts)
                        .map_err(|e| Error::runtime(format!("eval: {e}")))?;
                    sum += outs[loss_at]
                        .to_f32()
                        .and_then(|v| v.first().copied())
                        .unwrap_or(f32::NAN) as f64;
                }
                Ok((sum / batches as f64, batches * opts.batch))
            }
            Metric::Accuracy => {
                let (mut right, mut total) = (0usize, 0usize);
                let mut at = 0;
                while at < n {
                    let len = opts.batch.min(n - at);
                    let idx: Vec<usize> = (at..at + len).collect();
                    at += len;
                    let batch = eval.gather(&idx)?;
                    let k = match self.plans.iter().position(|p| p.0 == len) {
                        Some(k) => k,
                        None => {
                            self.plans
                                .push(Self::plan(session, &batch, params, opts, len)?);
                            self.plans.len() - 1
                        }
                    };
                    let (_, exe, out_names) = &mut self.plans[k];
                    let infos = exe.input_infos();
                    let feed = feed_for(&infos, state, &batch, opts, &eval.label())?;
                    let (outs, _) = exe
                        .run(&feed, ropts)
                        .map_err(|e| Error::runtime(format!("eval: {e}")))?;
                    let out_at = match &opts.output {
                        Some(o) => out_names.iter().position(|x| x == o).unwrap_or(0),
                        None => 0,
                    };
                    let target = batch
                        .iter()
                        .find(|(n, _)| *n == opts.target)
                        .map(|(_, t)| t)
                        .ok_or_else(|| {
                            Error::new(format!("{}: no array '{}'", eval.label(), opts.target))
                        })?;
                    let (r, t) = argmax_hits(&outs[out_at], target, opts.class_axis)?;
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
        session: &Session,
        batch: &[(String, HostTensor)],
        params: &[String],
        opts: &TrainOptions,
        len: usize,
    ) -> Result<(usize, Executable, Vec<String>)> {
        let mut m = session.model().clone();
        let g = &mut m.graph;
        for p in params {
            if let Some(v) = g.value_by_name(p) {
                g.take_initializer(v);
                if !g.inputs.contains(&v) {
                    g.inputs.push(v);
                }
            }
        }
        let dims = DimValues {
            bound: Vec::new(),
            shapes: batch
                .iter()
                .filter(|(n, _)| *n != opts.target)
                .map(|(n, t)| (n.clone(), t.shape.iter().map(|&d| d as i64).collect()))
                .collect(),
            default: None,
        };
        let planned = graphopt_plan::plan_model(&m, &dims, &PlanOptions::default())
            .map_err(|e| session.err(e))?;
        let exe = Executable::new(&planned.model, &planned.plan, &CpuBackend)
            .map_err(|e| Error::runtime(format!("eval: {e}")))?;
        let names = exe.output_names();
        Ok((len, exe, names))
    }
}

fn feed_for(
    infos: &[(String, graphopt_exec::TensorInfo)],
    state: &State,
    batch: &[(String, HostTensor)],
    opts: &TrainOptions,
    label: &str,
) -> Result<Vec<HostTensor>> {
    infos
        .iter()
        .map(|(name, info)| {
            if let Some(t) = state.get(name) {
                return Ok(t.clone());
            }
            let array = if name == "target" { &opts.target } else { name };
            let t = batch
                .iter()
                .find(|(n, _)| n == array)
                .map(|(_, t)| t)
                .ok_or_else(|| Error::new(format!("{label}: no array '{array}'")))?;
            if t.dtype != info.dtype || t.shape != info.shape {
                return Err(Error::new(format!(
                    "{label}: array '{array}' is {}{:?}, the model's input '{name}' wants {}{:?}",
                    t.dtype.name(),
                    t.shape,
                    info.dtype.name(),
                    info.shape
                )));
            }
            Ok(t.clone())
        })
        .collect()
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
