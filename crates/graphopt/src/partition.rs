//! [`Session::partition`]: cuts a model into pipeline stages (issue 24),
//! one standalone ONNX file per stage, for `mpirun -np K graphopt train
//! --pipeline DIR`.
//!
//! - **Where it cuts.** The nodes in program (topological) order are split
//!   into K contiguous ranges whose largest forward FLOPs (at the given
//!   dims, 1 where unbound) is as small as the order allows: a binary
//!   search on that largest cost, each candidate checked greedily. A cut
//!   never separates the readers of one parameter (tied weights),
//!   so every parameter lives in one stage.
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
        let k = opts.stages;
        if k == 0 {
            return Err(Error::new("--stages 0: expected at least 1"));
        }
        if opts.micro_batches == 0 {
            return Err(Error::new("--micro-batches 0: expected at least 1"));
        }
        // Symbolic types for the stage files, bound ones for the FLOPs.
        let mut model = self.model.clone();
        model
            .graph
            .topo_sort()
            .map_err(|e| self.err(Error::new(e.to_string())))?;
        infer_model(&mut model, &InferOptions::default());
        let mut bound = model.clone();
        let mut dims = opts.dims.clone();
        for d in graphopt_plan::input_dim_names(&model) {
            if !dims.iter().any(|(n, _)| *n == d) {
                dims.push((d, 1));
            }
        }
        infer_model(
            &mut bound,
            &InferOptions {
                dims,
                ..InferOptions::default()
            },
        );
        let g = &model.graph;
        let order: Vec<NodeId> = g.nodes().collect();
        let n = order.len();
        let flops: Vec<u64> = bound
            .graph
            .nodes()
            .map(|x| graphopt_passes::remat::cost::node_flops(&bound.graph, x))
            .collect();
        // Cut points: before node p (1..n). Not inside the span of a
        // parameter's readers (the initializers `grad` trains by default).
        let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &x)| (x, i)).collect();
        let mut allowed = vec![true; n + 1];
        let default = graphopt_autodiff::GradOptions::default();
        for v in graphopt_autodiff::trainable(g, &default) {
            let readers: Vec<usize> = g
                .uses(v)
                .iter()
                .filter_map(|u| pos.get(&u.node()).copied())
                .collect();
            if let (Some(&lo), Some(&hi)) = (readers.iter().min(), readers.iter().max()) {
                for a in allowed.iter_mut().take(hi + 1).skip(lo + 1) {
                    *a = false;
                }
            }
        }
        let cuts = balanced_cuts(&flops, &allowed, k).ok_or_else(|| {
            let most = allowed[1..n].iter().filter(|&&a| a).count() + 1;
            self.err(Error::new(format!(
                "--stages {k}: the graph allows at most {most} stages ({n} nodes; a cut may not separate the readers of one parameter)"
            )))
        })?;
        let mut bounds = vec![0];
        bounds.extend(&cuts);
        bounds.push(n);
        let stage_of: HashMap<NodeId, usize> = order
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, bounds.partition_point(|&b| b <= i) - 1))
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
        for &x in &order {
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
        let fixed = shape_values(g, &order);
        let mut stages = Vec::new();
        let mut models = Vec::new();
        // In the model's value order (stable, and the same on every rank).
        let crossing = |after: usize| -> Vec<ValueId> {
            g.values()
                .filter(|v| made.get(v).is_some_and(|&m| m <= after))
                .filter(|v| last_read.get(v).is_some_and(|&r| r > after))
                .collect()
        };
        for s in 0..k {
            let receives = if s == 0 { Vec::new() } else { crossing(s - 1) };
            let sends = if s + 1 == k {
                outputs.clone()
            } else {
                crossing(s)
            };
            let nodes: Vec<NodeId> = order[bounds[s]..bounds[s + 1]].to_vec();
            let mut reads_here: HashSet<ValueId> = HashSet::new();
            for &x in &nodes {
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
            let mut m = model.clone();
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
                nodes: nodes.len(),
                flops: nodes.iter().map(|x| flops[pos[x]]).sum(),
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
        let mb = opts.micro_batches;
        Ok(Partition {
            manifest: Manifest {
                format: MANIFEST_FORMAT.into(),
                model: self.label(),
                schedule: opts.schedule,
                micro_batches: mb,
                outputs: outputs.iter().map(|v| g.name(*v).to_string()).collect(),
                bubble: (k - 1) as f64 / (mb + k - 1) as f64,
                stages,
            },
            models,
        })
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
}
