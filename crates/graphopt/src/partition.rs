//! [`Session::partition`]: cuts a model into pipeline stages (issue 24),
//! one standalone ONNX file per stage, for `mpirun -np K graphopt train
//! --pipeline DIR`.
//!
//! - **Where it cuts.** The nodes in program (topological) order are split
//!   into K contiguous ranges whose largest forward FLOPs (at the given
//!   dims, 1 where unbound) is as small as the order allows: a binary
//!   search on that largest cost, each candidate checked greedily. A cut
//!   never separates the readers of one parameter (tied weights),
//!   so every parameter lives in one stage. Under per-device budgets,
//!   [`Session::partition_within`] (`train/cuts.rs`) picks the least
//!   slowest stage among the cuts whose every stage fits its device.
//! - **What a stage is.** Its nodes and initializers; its inputs are the
//!   values earlier stages make that it or a later stage reads (received
//!   from the previous stage, in the manifest's order), and the model's
//!   inputs it reads (every rank reads the data); its outputs are what it
//!   hands on: values a later stage reads, and the model's outputs (the
//!   last stage's). A value that passes a stage without being read there
//!   is both its input and its output. Each stage file runs anywhere ONNX
//!   runs (an inference model of its part).
//! - **Training it.** Each rank builds its stage's backward pass from the
//!   stage file (`graphopt grad` of the stage with the seed gradients of
//!   its outputs), so the stage's forward is computed again in its
//!   backward: a rank keeps only its inputs per micro-batch in flight, as
//!   GPipe does.
//!
//! `manifest.json` gives the stages (files, the tensors crossing each cut,
//! parameters and FLOPs), the schedule and the micro-batch count, and the
//! bubble `(K - 1) / (M + K - 1)`.

use crate::error::{Error, Result};
use crate::session::Session;
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{Model, NodeId, ValueId};
use graphopt_plan::DimValues;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The manifest's format tag.
pub const MANIFEST_FORMAT: &str = "graphopt-pipeline/1";

/// How the micro-batches go through the stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Schedule {
    /// Every micro-batch forward, then every micro-batch backward: a stage
    /// keeps the inputs of all M micro-batches.
    #[serde(rename = "gpipe")]
    Gpipe,
    /// One forward, one backward in turn after a warm-up (PipeDream-Flush,
    /// as Megatron-LM runs it): stage k keeps at most `K - k` micro-batches'
    /// inputs. The same bubble as GPipe.
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl Schedule {
    pub fn parse(s: &str) -> Result<Schedule> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gpipe" => Ok(Schedule::Gpipe),
            "1f1b" => Ok(Schedule::OneFOneB),
            _ => Err(Error::new(format!(
                "--schedule {s}: expected gpipe or 1f1b"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Schedule::Gpipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
        }
    }

    /// How many micro-batches' inputs stage `stage` of `stages` keeps at
    /// once: GPipe all `micro`, 1F1B at most `stages - stage`.
    pub fn held(self, micro: usize, stages: usize, stage: usize) -> usize {
        match self {
            Schedule::Gpipe => micro,
            Schedule::OneFOneB => micro.min(stages - stage),
        }
    }
}

/// What [`Session::partition`] does.
#[derive(Clone, Debug)]
pub struct PartitionOptions {
    pub stages: usize,
    /// Micro-batches per batch (recorded for the run; default 1 per stage,
    /// i.e. `stages`).
    pub micro_batches: usize,
    pub schedule: Schedule,
    /// Dims at which the FLOPs are counted (unbound ones: 1).
    pub dims: Vec<(String, i64)>,
}

impl PartitionOptions {
    pub fn new(stages: usize) -> PartitionOptions {
        PartitionOptions {
            stages,
            micro_batches: stages,
            schedule: Schedule::Gpipe,
            dims: Vec::new(),
        }
    }
}

/// One stage as the manifest gives it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StageInfo {
    pub index: usize,
    /// The stage's file, beside the manifest.
    pub file: String,
    pub nodes: usize,
    /// Forward FLOPs at the partition's dims.
    pub flops: u64,
    /// The initializers `grad` trains by default
    /// (`graphopt_autodiff::trainable`), and their bytes.
    pub params: Vec<String>,
    pub param_bytes: u64,
    /// What it receives from the previous stage, in message order.
    pub receives: Vec<String>,
    /// Those of `receives` that depend on the input shapes only (shape
    /// arithmetic: integer scalars and 1-D values made from `Shape` and
    /// constants): a rank folds them into its stage as constants at the
    /// first micro-batch, so that its graphs are planned with every shape
    /// known.
    #[serde(default)]
    pub static_receives: Vec<String>,
    /// The model's inputs it reads from the data.
    pub data_inputs: Vec<String>,
    /// What it sends to the next stage, in message order (the last stage:
    /// the model's outputs).
    pub sends: Vec<String>,
}

/// `manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: String,
    /// The model that was cut.
    pub model: String,
    pub schedule: Schedule,
    pub micro_batches: usize,
    /// The model's outputs (produced by, or passed to, the last stage).
    pub outputs: Vec<String>,
    /// Idle share of a step (GPipe and 1F1B alike): `(K - 1) / (M + K - 1)`.
    pub bubble: f64,
    pub stages: Vec<StageInfo>,
}

/// The stages and their models.
pub struct Partition {
    pub manifest: Manifest,
    pub models: Vec<Model>,
}

impl Session {
    /// Cuts the model into `opts.stages` pipeline stages (see the module
    /// doc). A stage count the graph cannot give (fewer nodes, or cuts
    /// that would separate a parameter's readers) is an error naming the
    /// most it allows.
    pub fn partition(&self, opts: &PartitionOptions) -> Result<Partition> {
        let c = Cutter::new(self, opts, &DimValues::new(&opts.dims))?;
        let cuts = c.balanced()?;
        Ok(c.build(&cuts))
    }
}

/// The model in program order, as the cut search sees it: what each node
/// costs and holds at the partition's dims.
pub(crate) struct Cutter<'a> {
    session: &'a Session,
    opts: PartitionOptions,
    /// Symbolic types (the stage files keep their dims symbolic).
    model: Model,
    order: Vec<NodeId>,
    /// Forward FLOPs of each node.
    flops: Vec<u64>,
    /// `prefix[p]`: FLOPs of the nodes before cut point `p` (1 at least
    /// each).
    prefix: Vec<u64>,
    /// Bytes of each node's float outputs (its activations), summed to
    /// cut point `p`.
    act: Vec<u64>,
    /// Bytes of the parameters whose first reader comes before `p`.
    param: Vec<u64>,
    /// `cross[p]`: bytes of the values made before `p` and read at or
    /// after it (what a stage starting at `p` receives).
    cross: Vec<u64>,
    /// The model's data inputs: bytes, and their readers in order.
    data: Vec<(u64, Vec<usize>)>,
    /// Cut points (before node `p`, `1..n`) that do not separate the
    /// readers of one parameter.
    allowed: Vec<bool>,
}

impl<'a> Cutter<'a> {
    pub(crate) fn new(
        session: &'a Session,
        opts: &PartitionOptions,
        dims: &DimValues,
    ) -> Result<Cutter<'a>> {
        let k = opts.stages;
        if k == 0 {
            return Err(Error::new("--stages 0: expected at least 1"));
        }
        if opts.micro_batches == 0 {
            return Err(Error::new("--micro-batches 0: expected at least 1"));
        }
        let mut model = session.model.clone();
        model
            .graph
            .topo_sort()
            .map_err(|e| session.err(Error::new(e.to_string())))?;
        infer_model(&mut model, &InferOptions::default());
        let (bound, _) = graphopt_plan::bind_model(&model, dims)
            .map_err(|e| session.err(Error::new(e.to_string())))?;
        let (g, b) = (&model.graph, &bound.graph);
        let order: Vec<NodeId> = g.nodes().collect();
        let n = order.len();
        let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &x)| (x, i)).collect();
        let bytes = |v: ValueId| -> u64 {
            b.ty(v)
                .and_then(|t| Some((t.elem()?, t.shape()?.numel()?)))
                .and_then(|(d, numel)| d.storage_bytes(numel))
                .unwrap_or(0)
        };
        let flops: Vec<u64> = order
            .iter()
            .map(|&x| graphopt_passes::remat::cost::node_flops(b, x))
            .collect();
        let sums = |each: &dyn Fn(usize) -> u64| -> Vec<u64> {
            std::iter::once(0)
                .chain((0..n).scan(0u64, |s, i| {
                    *s += each(i);
                    Some(*s)
                }))
                .collect()
        };
        let prefix = sums(&|i| flops[i].max(1));
        let act = sums(&|i| {
            g.node(order[i])
                .outputs()
                .iter()
                .flatten()
                .filter(|&&v| b.ty(v).and_then(|t| t.elem()).is_some_and(|d| d.is_float()))
                .map(|&v| bytes(v))
                .sum()
        });
        let readers = |v: ValueId| -> Vec<usize> {
            let mut r: Vec<usize> = g
                .uses(v)
                .iter()
                .filter_map(|u| pos.get(&u.node()).copied())
                .collect();
            r.sort_unstable();
            r
        };
        // Cut points: not inside the span of a parameter's readers (the
        // initializers `grad` trains by default).
        let mut allowed = vec![true; n + 1];
        let mut first_read = vec![0u64; n];
        let default = graphopt_autodiff::GradOptions::default();
        for v in graphopt_autodiff::trainable(g, &default) {
            let r = readers(v);
            if let (Some(&lo), Some(&hi)) = (r.first(), r.last()) {
                for a in allowed.iter_mut().take(hi + 1).skip(lo + 1) {
                    *a = false;
                }
                first_read[lo] += g.initializer(v).map_or(0, |t| t.nbytes());
            }
        }
        let param = sums(&|i| first_read[i]);
        // Values cross the cut points after their maker up to their last
        // reader (the model's outputs: read after the last stage).
        let mut diff = vec![0i128; n + 2];
        for (i, &x) in order.iter().enumerate() {
            for &v in g.node(x).outputs().iter().flatten() {
                let last = if g.outputs.contains(&v) {
                    n
                } else {
                    readers(v).last().copied().unwrap_or(i)
                };
                if last > i {
                    diff[i + 1] += bytes(v) as i128;
                    diff[last + 1] -= bytes(v) as i128;
                }
            }
        }
        let cross: Vec<u64> = diff[..=n]
            .iter()
            .scan(0i128, |s, d| {
                *s += d;
                Some(*s as u64)
            })
            .collect();
        let data = g
            .runtime_inputs()
            .map(|v| (bytes(v), readers(v)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        Ok(Cutter {
            session,
            opts: opts.clone(),
            model,
            order,
            flops,
            prefix,
            act,
            param,
            cross,
            data,
            allowed,
        })
    }

    /// The cuts whose largest stage has the fewest FLOPs.
    pub(crate) fn balanced(&self) -> Result<Vec<usize>> {
        let (k, n) = (self.opts.stages, self.order.len());
        balanced_cuts(&self.flops, &self.allowed, k).ok_or_else(|| {
            let most = self.allowed[1..n].iter().filter(|&&a| a).count() + 1;
            self.session.err(Error::new(format!(
                "--stages {k}: the graph allows at most {most} stages ({n} nodes; a cut may not separate the readers of one parameter)"
            )))
        })
    }

    /// The stage ranges of `cuts`: `(start, end)` cut points.
    pub(crate) fn ranges(&self, cuts: &[usize]) -> Vec<(usize, usize)> {
        let mut b = vec![0];
        b.extend(cuts);
        b.push(self.order.len());
        b.windows(2).map(|w| (w[0], w[1])).collect()
    }

    /// What a stage over nodes `a..b` holds besides its arena, by the
    /// model's types: its parameters' bytes (`per_param` times: weights,
    /// gradients, optimizer state), and its inputs (received, and the data
    /// it reads) kept for `held` micro-batches.
    pub(crate) fn held_bytes(&self, a: usize, b: usize, per_param: f64, held: usize) -> u64 {
        let params = (self.param[b] - self.param[a]) as f64 * per_param;
        params as u64 + self.input_bytes(a, b) * held as u64
    }

    /// Bytes of one micro-batch's inputs of a stage over nodes `a..b`:
    /// what it receives, and the data its nodes read.
    pub(crate) fn input_bytes(&self, a: usize, b: usize) -> u64 {
        let data: u64 = self
            .data
            .iter()
            .filter(|(_, r)| r.get(r.partition_point(|&x| x < a)).is_some_and(|&x| x < b))
            .map(|(bytes, _)| bytes)
            .sum();
        self.cross[a] + data
    }

    /// Bytes of the activations nodes `a..b` make.
    pub(crate) fn activation_bytes(&self, a: usize, b: usize) -> u64 {
        self.act[b] - self.act[a]
    }

    /// Bytes of the trainable parameters nodes `a..b` read.
    pub(crate) fn param_bytes(&self, a: usize, b: usize) -> u64 {
        self.param[b] - self.param[a]
    }

    /// The cuts whose largest stage has the fewest FLOPs among those where
    /// every stage `s` over nodes `a..b` has `fits(a, b, s)`; `None` when
    /// no cut does. Dynamic programming over the allowed cut points.
    pub(crate) fn search(&self, fits: &dyn Fn(usize, usize, usize) -> bool) -> Option<Vec<usize>> {
        fitting_cuts(&self.prefix, &self.allowed, self.opts.stages, fits)
    }

    /// The stages of `cuts` (see the module doc).
    pub(crate) fn build(&self, cuts: &[usize]) -> Partition {
        let k = self.opts.stages;
        let g = &self.model.graph;
        let order = &self.order;
        let ranges = self.ranges(cuts);
        let stage_of: HashMap<NodeId, usize> = ranges
            .iter()
            .enumerate()
            .flat_map(|(s, &(a, b))| order[a..b].iter().map(move |&x| (x, s)))
            .collect();
        // Where each value is made (stage) and the last stage that reads
        // it (the model's outputs: read "after" the last stage).
        let reads = |x: NodeId| -> Vec<ValueId> {
            let d = g.node(x);
            d.inputs()
                .iter()
                .flatten()
                .copied()
                .chain(d.captures().iter().copied())
                .collect()
        };
        let mut made: HashMap<ValueId, usize> = HashMap::new();
        let mut last_read: HashMap<ValueId, usize> = HashMap::new();
        for &x in order {
            let s = stage_of[&x];
            for o in g.node(x).outputs().iter().flatten() {
                made.insert(*o, s);
            }
            for v in reads(x) {
                let e = last_read.entry(v).or_insert(s);
                *e = (*e).max(s);
            }
        }
        let outputs: Vec<ValueId> = g.outputs.clone();
        for &o in &outputs {
            last_read.insert(o, k);
        }
        let data: HashSet<ValueId> = g.runtime_inputs().collect();
        let fixed = shape_values(g, order);
        let default = graphopt_autodiff::GradOptions::default();
        let mut stages = Vec::new();
        let mut models = Vec::new();
        // In the model's value order (stable, and the same on every rank).
        let crossing = |after: usize| -> Vec<ValueId> {
            g.values()
                .filter(|v| made.get(v).is_some_and(|&m| m <= after))
                .filter(|v| last_read.get(v).is_some_and(|&r| r > after))
                .collect()
        };
        for (s, &(a, b)) in ranges.iter().enumerate() {
            let receives = if s == 0 { Vec::new() } else { crossing(s - 1) };
            let sends = if s + 1 == k {
                outputs.clone()
            } else {
                crossing(s)
            };
            let nodes = &order[a..b];
            let mut reads_here: HashSet<ValueId> = HashSet::new();
            for &x in nodes {
                reads_here.extend(reads(x));
            }
            let data_inputs: Vec<ValueId> = g
                .inputs
                .iter()
                .copied()
                .filter(|v| {
                    data.contains(v)
                        && (reads_here.contains(v) || (s + 1 == k && outputs.contains(v)))
                })
                .collect();
            let mut m = self.model.clone();
            let sg = &mut m.graph;
            let drop: Vec<NodeId> = order.iter().copied().filter(|x| stage_of[x] != s).collect();
            sg.remove_nodes(&drop);
            let mut ins = receives.clone();
            ins.extend(
                data_inputs
                    .iter()
                    .copied()
                    .filter(|v| !receives.contains(v)),
            );
            sg.inputs = ins;
            sg.outputs = sends.clone();
            for v in sg.initializers().to_vec() {
                if sg.uses(v).is_empty() && !sg.outputs.contains(&v) {
                    sg.take_initializer(v);
                }
            }
            let trained = graphopt_autodiff::trainable(sg, &default);
            let params: Vec<String> = trained.iter().map(|&v| sg.name(v).to_string()).collect();
            let param_bytes = trained
                .iter()
                .filter_map(|&v| sg.initializer(v))
                .map(|t| t.nbytes())
                .sum();
            let name = |v: &ValueId| g.name(*v).to_string();
            stages.push(StageInfo {
                index: s,
                file: format!("stage_{s}.onnx"),
                nodes: b - a,
                flops: self.flops[a..b].iter().sum(),
                params,
                param_bytes,
                receives: receives.iter().map(name).collect(),
                static_receives: receives
                    .iter()
                    .filter(|v| fixed.contains(v))
                    .map(name)
                    .collect(),
                data_inputs: data_inputs.iter().map(name).collect(),
                sends: sends.iter().map(name).collect(),
            });
            models.push(m);
        }
        let mb = self.opts.micro_batches;
        Partition {
            manifest: Manifest {
                format: MANIFEST_FORMAT.into(),
                model: self.session.label(),
                schedule: self.opts.schedule,
                micro_batches: mb,
                outputs: outputs.iter().map(|v| g.name(*v).to_string()).collect(),
                bubble: (k - 1) as f64 / (mb + k - 1) as f64,
                stages,
            },
            models,
        }
    }
}

/// Values that depend on the input shapes only: made by `Shape`/`Size`,
/// `Constant`, from non-float initializers, or by an op (no subgraph, not
/// random) whose inputs all are; integer scalars and 1-D values only
/// (shape arithmetic).
fn shape_values(g: &graphopt_ir::Graph, order: &[NodeId]) -> HashSet<ValueId> {
    const RANDOM: [&str; 6] = [
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    ];
    // Float initializers are parameters (they change as they train): not
    // shape arithmetic.
    let mut derived: HashSet<ValueId> = g
        .initializers()
        .iter()
        .copied()
        .filter(|&v| g.initializer(v).is_some_and(|t| !t.dtype.is_float()))
        .collect();
    for &x in order {
        let d = g.node(x);
        let ok = match d.op_type.as_str() {
            "Shape" | "Size" | "Constant" => true,
            op if RANDOM.contains(&op) || op == "Dropout" || d.has_subgraphs() => false,
            _ => d.inputs().iter().flatten().all(|v| derived.contains(v)),
        };
        if ok {
            derived.extend(d.outputs().iter().flatten().copied());
        }
    }
    derived
        .into_iter()
        .filter(|&v| {
            g.producer(v).is_some()
                && g.ty(v).is_some_and(|t| {
                    t.elem().is_some_and(|d| !d.is_float())
                        && t.shape().is_some_and(|s| s.rank() <= 1)
                })
        })
        .collect()
}

/// K - 1 cut points (each in `1..n`, `allowed`) minimizing the largest
/// stage cost, every stage non-empty; `None` when the allowed points are
/// too few.
fn balanced_cuts(cost: &[u64], allowed: &[bool], k: usize) -> Option<Vec<usize>> {
    let n = cost.len();
    let points: Vec<usize> = (1..n).filter(|&p| allowed[p]).collect();
    if k == 1 {
        return Some(Vec::new());
    }
    if points.len() < k - 1 {
        return None;
    }
    let prefix: Vec<u64> = std::iter::once(0)
        .chain(cost.iter().scan(0u64, |s, &c| {
            *s += c.max(1);
            Some(*s)
        }))
        .collect();
    let range = |a: usize, b: usize| prefix[b] - prefix[a];
    // Greedy for a largest cost `t`: cut at the last allowed point that
    // keeps the stage within `t`, leaving enough points for the rest.
    let fit = |t: u64| -> Option<Vec<usize>> {
        let mut cuts = Vec::new();
        let mut start = 0;
        let mut i = 0; // index into points
        while cuts.len() < k - 1 {
            let left = k - 1 - cuts.len();
            // Candidates after `start`, keeping `left - 1` points after.
            let mut best = None;
            while i < points.len() && points.len() - i >= left {
                let p = points[i];
                if p <= start {
                    i += 1;
                    continue;
                }
                if range(start, p) > t {
                    break;
                }
                best = Some(i);
                i += 1;
            }
            let b = best?;
            cuts.push(points[b]);
            start = points[b];
            i = b + 1;
        }
        (range(start, n) <= t).then_some(cuts)
    };
    let (mut lo, mut hi) = (1u64, prefix[n]);
    let mut best = fit(hi)?;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match fit(mid) {
            Some(c) => {
                best = c;
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    Some(best)
}

/// K - 1 cut points (each in `1..n`, `allowed`) minimizing the largest
/// stage cost (`prefix`: the costs summed up to each point) among those
/// whose every stage `s` over `a..b` has `fits(a, b, s)`; `None` when no
/// cut does. Dynamic programming over the allowed points, O(K·P²) at worst.
fn fitting_cuts(
    prefix: &[u64],
    allowed: &[bool],
    k: usize,
    fits: &dyn Fn(usize, usize, usize) -> bool,
) -> Option<Vec<usize>> {
    let n = prefix.len() - 1;
    let mut pts = vec![0];
    pts.extend((1..n).filter(|&p| allowed[p]));
    pts.push(n);
    let m = pts.len();
    const NONE: u64 = u64::MAX;
    // best[s][j]: the least largest stage of s stages over nodes
    // 0..pts[j]; from[s][j]: where the last of them starts.
    let mut best = vec![vec![NONE; m]; k + 1];
    let mut from = vec![vec![0usize; m]; k + 1];
    best[0][0] = 0;
    for s in 1..=k {
        for j in 1..m {
            if s == k && j + 1 != m {
                continue;
            }
            for i in (0..j).rev() {
                let c = prefix[pts[j]] - prefix[pts[i]];
                if c >= best[s][j] {
                    break; // earlier starts only cost more
                }
                let before = best[s - 1][i];
                if before == NONE || !fits(pts[i], pts[j], s - 1) {
                    continue;
                }
                best[s][j] = before.max(c);
                from[s][j] = i;
            }
        }
    }
    if best[k][m - 1] == NONE {
        return None;
    }
    let mut cuts = Vec::new();
    let mut j = m - 1;
    for s in (1..=k).rev() {
        j = from[s][j];
        if s > 1 {
            cuts.push(pts[j]);
        }
    }
    cuts.reverse();
    Some(cuts)
}

/// Writes `manifest.json` and the stage files into `dir` (created), each
/// atomically.
pub fn write_partition(p: &Partition, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "create", e))?;
    for (s, m) in p.manifest.stages.iter().zip(&p.models) {
        let bytes = graphopt_onnx::encode(m)?;
        crate::util::write_atomic(&dir.join(&s.file), &bytes)?;
    }
    let json = serde_json::to_string_pretty(&p.manifest)
        .map_err(|e| Error::new(format!("manifest: {e}")))?;
    crate::util::write_atomic(&dir.join("manifest.json"), format!("{json}\n").as_bytes())
}

/// Reads `DIR/manifest.json`, checking its format and stage files.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, "read", e))?;
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| Error::new(format!("{}: not a pipeline manifest: {e}", path.display())))?;
    if m.format != MANIFEST_FORMAT {
        return Err(Error::new(format!(
            "{}: format '{}', expected '{MANIFEST_FORMAT}'",
            path.display(),
            m.format
        )));
    }
    if m.stages.is_empty() || m.stages.iter().enumerate().any(|(i, s)| s.index != i) {
        return Err(Error::new(format!(
            "{}: the stages are not numbered 0..{}",
            path.display(),
            m.stages.len()
        )));
    }
    for w in m.stages.windows(2) {
        if w[0].sends != w[1].receives {
            return Err(Error::new(format!(
                "{}: stage {} sends other tensors than stage {} receives",
                path.display(),
                w[0].index,
                w[1].index
            )));
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_balance_the_largest_stage() {
        let cost = [5, 1, 1, 1, 5, 1, 1, 5];
        let all = vec![true; cost.len() + 1];
        let c = balanced_cuts(&cost, &all, 3).unwrap();
        let stages: Vec<u64> = [0]
            .iter()
            .chain(&c)
            .zip(c.iter().chain([&cost.len()]))
            .map(|(&a, &b)| cost[a..b].iter().sum())
            .collect();
        // 20 in all over 3 stages, each 5 in its own: 7 at best.
        assert_eq!(stages.iter().max(), Some(&7), "{c:?} {stages:?}");
        // Cuts only where allowed.
        let mut some = vec![false; cost.len() + 1];
        some[6] = true;
        assert_eq!(balanced_cuts(&cost, &some, 2).unwrap(), [6]);
        assert!(balanced_cuts(&cost, &some, 3).is_none());
        assert!(balanced_cuts(&cost[..2], &all[..3], 3).is_none());
    }

    /// Every way to cut `0..n` at `k - 1` allowed points.
    fn every_cut(n: usize, allowed: &[bool], k: usize) -> Vec<Vec<usize>> {
        if k == 1 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for p in 1..n {
            if allowed[p] {
                for mut rest in every_cut(n - p, &allowed[p..], k - 1) {
                    rest.iter_mut().for_each(|c| *c += p);
                    rest.insert(0, p);
                    out.push(rest);
                }
            }
        }
        out
    }

    #[test]
    fn fitting_cuts_are_the_least_slowest_stage_among_those_that_fit() {
        // Small random cases against every cut: costs, allowed points and
        // a "memory" per node that each stage's budget bounds.
        let mut seed = 0x2545f491u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        let mut found = 0;
        for _ in 0..400 {
            let n = 2 + next(9) as usize;
            let k = 1 + next(4) as usize;
            let cost: Vec<u64> = (0..n).map(|_| 1 + next(20)).collect();
            let mem: Vec<u64> = (0..n).map(|_| next(10)).collect();
            let mut allowed: Vec<bool> = (0..=n).map(|_| next(5) != 0).collect();
            allowed[0] = true;
            allowed[n] = true;
            let budgets: Vec<u64> = (0..k).map(|_| 5 + next(30)).collect();
            let prefix: Vec<u64> = std::iter::once(0)
                .chain(cost.iter().scan(0, |s, &c| {
                    *s += c;
                    Some(*s)
                }))
                .collect();
            let fits = |a: usize, b: usize, s: usize| mem[a..b].iter().sum::<u64>() <= budgets[s];
            let slowest = |cuts: &[usize]| -> u64 {
                let mut b = vec![0];
                b.extend(cuts);
                b.push(n);
                b.windows(2)
                    .map(|w| prefix[w[1]] - prefix[w[0]])
                    .max()
                    .unwrap()
            };
            let fitting = |cuts: &[usize]| -> bool {
                let mut b = vec![0];
                b.extend(cuts);
                b.push(n);
                b.windows(2).enumerate().all(|(s, w)| fits(w[0], w[1], s))
            };
            let best = every_cut(n, &allowed, k)
                .into_iter()
                .filter(|c| fitting(c))
                .map(|c| slowest(&c))
                .min();
            let got = fitting_cuts(&prefix, &allowed, k, &fits);
            match (best, &got) {
                (None, None) => {}
                (Some(b), Some(c)) => {
                    assert!(fitting(c), "{c:?} does not fit");
                    assert_eq!(slowest(c), b, "{cost:?} {mem:?} {budgets:?} {allowed:?}");
                    found += 1;
                }
                _ => panic!("{best:?} vs {got:?}: {cost:?} {mem:?} {budgets:?} {allowed:?}"),
            }
        }
        assert!(found > 100, "{found} cases with an answer");
    }
}
