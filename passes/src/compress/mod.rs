//! Weight compression beyond fewer bits per value, in standard ONNX ops.
//!
//! Three methods ([`Method`]), each in its own file:
//! - `cluster` (palettization): each weight value becomes the nearest of
//!   2^bits k-means centroids; the file stores the centroid indices
//!   (uint4 up to 4 bits, else uint8) and the codebook, and the graph
//!   gathers the weight back (`Cast` + `Gather`). Per tensor, or one
//!   codebook per group of `G` slices along the weight's first axis
//!   (output channels of Conv and of Gemm with `transB`; input rows of a
//!   MatMul weight).
//! - `lowrank`: a MatMul/Gemm weight `W [K, N]` becomes two thin factors
//!   `A [K, r]` and `B [r, N]` (`x·W ≈ (x·A)·B`); a Conv weight
//!   `[O, I, k...]` becomes a k×k Conv with `r` outputs followed by a 1x1
//!   Conv. Truncated SVD, activation-aware when calibration statistics
//!   ([`Gram`]) are given: the error minimized is `‖X·W − X·A·B‖` on the
//!   calibration inputs `X` (SVD-LLM's truncation-aware whitening), else
//!   `‖W − A·B‖`. A layer is factored only where `r·(K+N) < 0.8·K·N`.
//! - `share`: weights of the same shape within a relative L2 distance of
//!   each other are merged into one tensor (the first in file order).
//!
//! Rules the output keeps:
//! 1. A weight is a float32 initializer of the main graph (not a graph
//!    input or output) with at least [`Compress::min_weight_elems`]
//!    elements, every read of which is a weight slot of MatMul (2-D),
//!    Gemm, Conv, ConvTranspose or Gather (embedding rows; `cluster` and
//!    `share` only). Others are left as they are; weights read by an
//!    excluded node (by op type or name, or [`Compress::keep_nodes`]) are
//!    listed in [`CompressReport::kept`] with why.
//! 2. `cluster` keeps the weight's value name (readers are untouched), and
//!    writes its decoding just before the first reader. uint4 indices need
//!    opset 21: the model is upgraded (`upgrade_opset`), or, where that is
//!    refused, the indices are stored uint8 with a warning.
//! 3. A compression that would not make the weight smaller is not made.
//! 4. Already compressed weights (codebooks, indices, factors below the
//!    size floor, quantized weights) are not weights by rule 1: running
//!    the pass twice changes nothing more.
//!
//! Not exact. Subgraph (If/Loop/Scan body) weights are not compressed yet.
//!
//! cluster:2 (4 centroids) on a weight `[2, 4]`:
//! ```text
//! before:                                  after:
//! <float[2,4] w = {...}> {                 <uint4[2,4] w_palette_indices = {...},
//!   y = MatMul (x, w)                       float[4] w_palette_codebook = {...}> {
//! }                                          w_palette_indices_i32 = Cast <to: int = 6> (w_palette_indices)
//!                                            w = Gather <axis: int = 0> (w_palette_codebook, w_palette_indices_i32)
//!                                            y = MatMul (x, w)
//!                                          }
//! ```
//! With `per-channel-groups=G` the codebook is `[ng, k]`, the indices
//! `[ng, numel/ng]`, and `GatherElements <axis: 1>` then a `Reshape` to the
//! weight's shape decode it.
//!
//! lowrank (rank 2) on a MatMul weight `[8, 6]`:
//! ```text
//! before:                                  after:
//! <float[8,6] w = {...}> {                 <float[8,2] w_lowrank_a = {...},
//!   y = MatMul (x, w)                       float[2,6] w_lowrank_b = {...}> {
//! }                                          w_lowrank_t = MatMul (x, w_lowrank_a)
//!                                            y = MatMul (w_lowrank_t, w_lowrank_b)
//!                                          }
//! ```
//!
//! share: `w2` within the distance of `w1` is read as `w1`:
//! ```text
//! before:                                  after:
//! <float[4,4] w1 = {...},                  <float[4,4] w1 = {...}> {
//!  float[4,4] w2 = {...}> {                  h = MatMul (x, w1)
//!   h = MatMul (x, w1)                       y = MatMul (h, w1)
//!   y = MatMul (h, w2)                     }
//! }
//! ```

mod cluster;
pub mod kmeans;
pub mod linalg;
mod lowrank;
mod share;

use crate::quantize::weight_bytes;
use crate::upgrade_opset::UpgradeOpset;
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::{DType, Graph, Model, NodeId, Use, ValueId};
use std::collections::BTreeMap;

/// How weights are compressed.
#[derive(Clone, Debug, PartialEq)]
pub enum Method {
    /// k-means palettization: `bits` (2, 3, 4, 6 or 8) per index, one
    /// codebook per tensor or per `group` slices of the first axis.
    Cluster { bits: u32, group: Option<u64> },
    /// Low-rank factorization with ranks chosen by [`Rank`].
    LowRank(Rank),
    /// Weights within `tolerance` relative L2 of an earlier one share it.
    Share { tolerance: f64 },
}

/// How `lowrank` chooses each layer's rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rank {
    /// The least rank keeping this fraction (0, 1] of the layer's energy
    /// (sum of squared singular values; of `X·W` with calibration).
    Energy(f64),
    /// This rank in every layer.
    Fixed(u64),
    /// Every layer at this fraction of its parameters:
    /// `r = ⌊f·K·N/(K+N)⌋`.
    Params(f64),
}

/// The energy `lowrank` keeps when none is given: only layers with a
/// decaying spectrum are factored.
pub const DEFAULT_ENERGY: f64 = 0.95;

impl Method {
    /// Parses `cluster:BITS[:per-channel-groups=G]`,
    /// `lowrank[:ENERGY|:RANK|:params=F]` or `share[:TOL]`
    /// (`default_tolerance` when no `TOL`). Errors are one line.
    pub fn parse(spec: &str, default_tolerance: f64) -> Result<Method, PassError> {
        let s = spec.trim().to_ascii_lowercase();
        let mut parts = s.split(':');
        let head = parts.next().unwrap_or("");
        let rest: Vec<&str> = parts.collect();
        let bad = |why: String| PassError(format!("--compress {spec}: {why}"));
        match head {
            "cluster" | "palettize" => {
                let Some(b) = rest.first() else {
                    return Err(bad("expected cluster:BITS (2, 3, 4, 6 or 8)".into()));
                };
                let bits: u32 = b
                    .parse()
                    .map_err(|_| bad(format!("bits '{b}' is not a number")))?;
                if ![2, 3, 4, 6, 8].contains(&bits) {
                    return Err(bad(format!("bits must be 2, 3, 4, 6 or 8, not {bits}")));
                }
                let mut group = None;
                for opt in &rest[1..] {
                    let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
                    match k {
                        "per-channel-groups" | "groups" | "g" => {
                            let g: u64 = v.parse().ok().filter(|&g| g >= 1).ok_or_else(|| {
                                bad(format!("per-channel-groups '{v}' must be a whole number >= 1"))
                            })?;
                            group = Some(g);
                        }
                        _ => {
                            return Err(bad(format!(
                                "unknown option '{opt}' (expected per-channel-groups=G)"
                            )))
                        }
                    }
                }
                Ok(Method::Cluster { bits, group })
            }
            "lowrank" | "low-rank" | "svd" => {
                if rest.len() > 1 {
                    return Err(bad("expected lowrank[:ENERGY|:RANK|:params=F]".into()));
                }
                let Some(a) = rest.first() else {
                    return Ok(Method::LowRank(Rank::Energy(DEFAULT_ENERGY)));
                };
                if let Some(f) = a.strip_prefix("params=") {
                    let f: f64 = f.parse().map_err(|_| bad(format!("params '{f}' is not a number")))?;
                    if !(f > 0.0 && f < 1.0) {
                        return Err(bad(format!("params must be a fraction in (0, 1), not {f}")));
                    }
                    return Ok(Method::LowRank(Rank::Params(f)));
                }
                if a.contains('.') || a.contains('e') {
                    let e: f64 = a.parse().map_err(|_| bad(format!("energy '{a}' is not a number")))?;
                    if !(e > 0.0 && e <= 1.0) {
                        return Err(bad(format!("the energy must be in (0, 1], not {e}")));
                    }
                    return Ok(Method::LowRank(Rank::Energy(e)));
                }
                let r: i64 = a.parse().map_err(|_| {
                    bad(format!("'{a}' is neither an energy in (0, 1] nor a rank"))
                })?;
                if r <= 0 {
                    return Err(bad(format!("the rank must be at least 1, not {r}")));
                }
                Ok(Method::LowRank(Rank::Fixed(r as u64)))
            }
            "share" => {
                let tolerance = match rest.first() {
                    None => default_tolerance,
                    Some(t) => t.parse::<f64>().map_err(|_| bad(format!("tolerance '{t}' is not a number")))?,
                };
                if !(tolerance.is_finite() && tolerance >= 0.0) || rest.len() > 1 {
                    return Err(bad("expected share[:TOL], TOL a relative L2 distance >= 0".into()));
                }
                Ok(Method::Share { tolerance })
            }
            _ => Err(bad(
                "unknown method; valid: cluster:BITS[:per-channel-groups=G], lowrank[:ENERGY|:RANK|:params=F], share[:TOL]"
                    .into(),
            )),
        }
    }

    /// The method as users spell it.
    pub fn name(&self) -> String {
        match self {
            Method::Cluster { bits, group: None } => format!("cluster:{bits}"),
            Method::Cluster {
                bits,
                group: Some(g),
            } => format!("cluster:{bits}:per-channel-groups={g}"),
            Method::LowRank(Rank::Energy(e)) => format!("lowrank:{e}"),
            Method::LowRank(Rank::Fixed(r)) => format!("lowrank:{r}"),
            Method::LowRank(Rank::Params(f)) => format!("lowrank:params={f}"),
            Method::Share { tolerance } => format!("share:{tolerance}"),
        }
    }
}

/// Statistics of one activation over the calibration inputs: `XᵀX` of its
/// rows (the last axis is the feature axis), for activation-aware
/// `lowrank`.
#[derive(Clone, Debug)]
pub struct Gram {
    pub dim: usize,
    /// Row-major `dim × dim` (made exactly symmetric by [`Gram::full`]).
    pub xtx: Vec<f64>,
    pub rows: u64,
}

impl Gram {
    pub fn new(dim: usize) -> Gram {
        Gram {
            dim,
            xtx: vec![0.0; dim * dim],
            rows: 0,
        }
    }

    /// Adds the rows of `x` (a whole number of rows of `dim`): `XᵀX` by
    /// matrixmultiply's packed GEMM (through ndarray).
    pub fn add(&mut self, x: &[f32]) -> Result<(), String> {
        let d = self.dim;
        if d == 0 || !x.len().is_multiple_of(d) {
            return Err(format!("{} values are not rows of {d} features", x.len()));
        }
        let rows = x.len() / d;
        let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let xm = ndarray::ArrayView2::from_shape((rows, d), &xs).expect("rows x dim");
        let g = xm.t().dot(&xm);
        for (a, b) in self.xtx.iter_mut().zip(g.iter()) {
            *a += b;
        }
        self.rows += rows as u64;
        Ok(())
    }

    /// Sums another activation's statistics into this one (same `dim`).
    pub fn merge(&mut self, other: &Gram) {
        if other.dim == self.dim {
            for (a, b) in self.xtx.iter_mut().zip(&other.xtx) {
                *a += b;
            }
            self.rows += other.rows;
        }
    }

    /// The second moment `XᵀX / rows`, shrunk toward `μ·I` (μ its mean
    /// eigenvalue) by `ρ = dim / (dim + rows)`, Ledoit-Wolf style: with
    /// fewer rows than features `XᵀX` is singular, and factors whitened by
    /// it fit the calibration rows exactly (zero error there) while
    /// generalizing no better than plain SVD; as rows grow, `ρ` goes to 0.
    pub fn shrunk(&self) -> Vec<f64> {
        let d = self.dim;
        let rows = self.rows.max(1) as f64;
        let mut m = self.full();
        let mu = (0..d).map(|i| m[i * d + i]).sum::<f64>() / (d.max(1) as f64 * rows);
        let rho = d as f64 / (d as f64 + rows);
        for (i, x) in m.iter_mut().enumerate() {
            *x *= (1.0 - rho) / rows;
            if i % (d + 1) == 0 {
                *x += rho * mu;
            }
        }
        m
    }

    /// The full symmetric matrix.
    pub fn full(&self) -> Vec<f64> {
        let d = self.dim;
        let mut m = self.xtx.clone();
        for i in 0..d {
            for j in 0..i {
                m[i * d + j] = m[j * d + i];
            }
        }
        m
    }
}

/// The pass and its options. `Compress` (the constant) is the registry's
/// configuration: cluster:4, per tensor.
#[derive(Clone, Debug)]
pub struct Compress {
    pub method: Method,
    /// Op types or node names whose weights stay as they are.
    pub exclude: Vec<String>,
    /// Main-graph nodes whose weights stay as they are (ids are stable
    /// across clones): the `--max-error` fallback.
    pub keep_nodes: Vec<NodeId>,
    /// Weights with fewer elements stay as they are.
    pub min_weight_elems: u64,
    /// Calibration statistics by activation name (`lowrank`).
    pub grams: BTreeMap<String, Gram>,
}

#[allow(non_upper_case_globals)]
pub const Compress: Compress = Compress {
    method: Method::Cluster {
        bits: 4,
        group: None,
    },
    exclude: Vec::new(),
    keep_nodes: Vec::new(),
    min_weight_elems: 1024,
    grams: BTreeMap::new(),
};

impl Default for Compress {
    fn default() -> Self {
        Compress
    }
}

/// One weight compressed.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub weight: String,
    /// The nodes reading it (labels).
    pub nodes: Vec<String>,
    pub op: String,
    /// `cluster 4-bit, 16 centroids, per tensor, uint4`, `rank 64 of 768`, ...
    pub detail: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Relative L2 error of the weight (`lowrank` with calibration: of
    /// the layer's output on the calibration inputs; `share`: of the
    /// weight against the one it now reads).
    pub weight_error: f64,
}

/// What one compression did.
#[derive(Clone, Debug, Default)]
pub struct CompressReport {
    pub method: String,
    pub layers: Vec<Layer>,
    /// Main-graph nodes reading a compressed weight, program order.
    pub compressed: Vec<NodeId>,
    /// Weights (or nodes) left as they were, and why.
    pub kept: Vec<(String, String)>,
    pub weight_bytes_before: u64,
    pub weight_bytes_after: u64,
    pub opset_before: Option<i64>,
    pub opset_after: Option<i64>,
    pub warnings: Vec<String>,
}

impl CompressReport {
    pub fn stats(&self) -> PassStats {
        let mut s = PassStats::default();
        s.add("weights_compressed", self.layers.len() as u64);
        s.add(
            "bytes_saved",
            self.weight_bytes_before
                .saturating_sub(self.weight_bytes_after),
        );
        s.add(
            "opset_raised",
            (self.opset_before != self.opset_after) as u64,
        );
        s
    }
}

impl Pass for Compress {
    fn name(&self) -> &'static str {
        "compress"
    }
    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }
    fn run_in(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassStats, PassError> {
        let r = self.compress(model)?;
        let mut s = r.stats();
        s.warnings = r.warnings;
        Ok(s)
    }
    fn exact(&self) -> bool {
        false
    }
}

/// How a weight is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reader {
    MatMul,
    /// Gemm with this `transB`.
    Gemm(bool),
    Conv,
    ConvTranspose,
    Gather,
}

impl Reader {
    fn of(g: &Graph, u: Use, rank: usize) -> Option<Reader> {
        let Use::Input { node, slot } = u else {
            return None;
        };
        let d = g.node(node);
        if !d.domain.is_empty() && d.domain != "ai.onnx" {
            return None;
        }
        match (d.op_type.as_str(), slot) {
            ("MatMul", 1) if rank == 2 => Some(Reader::MatMul),
            ("Gemm", 1) if rank == 2 => Some(Reader::Gemm(d.attr_int("transB").unwrap_or(0) != 0)),
            ("Conv", 1) if rank >= 3 => Some(Reader::Conv),
            ("ConvTranspose", 1) if rank >= 3 => Some(Reader::ConvTranspose),
            ("Gather", 0) if rank == 2 => Some(Reader::Gather),
            _ => None,
        }
    }
}

/// A weight the method may compress.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub v: ValueId,
    pub name: String,
    /// Every read: node, input slot, how.
    pub readers: Vec<(NodeId, usize, Reader)>,
}

impl Compress {
    /// Compresses `model` in place and reports what it did. On error the
    /// model is unchanged.
    pub fn compress(&self, model: &mut Model) -> Result<CompressReport, PassError> {
        self.validate()?;
        let before = weight_bytes(&model.graph);
        let opset_before = model.onnx_opset();
        let Some(opset) = opset_before else {
            return Err(PassError(
                "compress: the model imports no default-domain opset".into(),
            ));
        };
        let mut m = model.clone();
        let mut report = CompressReport {
            method: self.method.name(),
            ..CompressReport::default()
        };
        // uint4 indices need opset 21 (and IR 10).
        let mut uint4 = false;
        if let Method::Cluster { bits, .. } = self.method {
            if bits <= 4 {
                uint4 = opset >= 21;
                if !uint4 {
                    let mut up = m.clone();
                    match (UpgradeOpset { target: 21 }).run(&mut up) {
                        Ok(_) => {
                            m = up;
                            uint4 = true;
                        }
                        Err(e) => report.warnings.push(format!(
                            "indices stored uint8, not uint4: uint4 needs opset 21 and the upgrade was refused ({e})"
                        )),
                    }
                }
            }
        }
        constants_to_initializers(&mut m.graph, self.min_weight_elems);
        let targets = self.targets(&m.graph, &mut report);
        let g = &mut m.graph;
        match &self.method {
            Method::Cluster { bits, group } => {
                cluster::apply(g, &targets, *bits, *group, uint4, &mut report)?
            }
            Method::LowRank(rank) => {
                lowrank::apply(g, &targets, *rank, &self.grams, &mut report)?
            }
            Method::Share { tolerance } => share::apply(g, &targets, *tolerance, &mut report)?,
        }
        let mut readers: Vec<NodeId> = Vec::new();
        for l in &report.layers {
            for t in targets.iter().filter(|t| l.weight == t.name) {
                readers.extend(t.readers.iter().map(|r| r.0));
            }
        }
        readers.sort_by_key(|&n| model.graph.position(n));
        readers.dedup();
        report.compressed = readers;
        if report.layers.is_empty() {
            // Nothing compressed: the model stays exactly as it was (no
            // opset upgrade for nothing).
            report.weight_bytes_before = before;
            report.weight_bytes_after = before;
            report.opset_before = opset_before;
            report.opset_after = opset_before;
            return Ok(report);
        }
        if uint4 && m.ir_version < 10 {
            m.ir_version = 10;
        }
        graphopt_ir::verify::verify_model(&m)
            .map_err(|e| PassError(format!("compress: the output is invalid IR: {e}")))?;
        *model = m;
        report.weight_bytes_before = before;
        report.weight_bytes_after = weight_bytes(&model.graph);
        report.opset_before = opset_before;
        report.opset_after = model.onnx_opset();
        Ok(report)
    }

    /// Refuses options no compression can follow (bits, rank, energy,
    /// fraction, tolerance), in one line.
    pub fn validate(&self) -> Result<(), PassError> {
        let bad = |why: String| Err(PassError(format!("--compress {}: {why}", self.method.name())));
        match &self.method {
            Method::Cluster { bits, group } => {
                if ![2, 3, 4, 6, 8].contains(bits) {
                    return bad(format!("bits must be 2, 3, 4, 6 or 8, not {bits}"));
                }
                if *group == Some(0) {
                    return bad("per-channel-groups must be at least 1".into());
                }
            }
            Method::LowRank(Rank::Energy(e)) if !(*e > 0.0 && *e <= 1.0) => {
                return bad(format!("the energy must be in (0, 1], not {e}"))
            }
            Method::LowRank(Rank::Fixed(0)) => return bad("the rank must be at least 1".into()),
            Method::LowRank(Rank::Params(f)) if !(*f > 0.0 && *f < 1.0) => {
                return bad(format!("params must be a fraction in (0, 1), not {f}"))
            }
            Method::Share { tolerance } if !(tolerance.is_finite() && *tolerance >= 0.0) => {
                return bad("the tolerance must be a number >= 0".into())
            }
            _ => {}
        }
        Ok(())
    }

    /// The activation names whose [`Gram`] `lowrank` whitens with: input 0
    /// of each MatMul/Gemm (not `transA`) reading a weight it may factor.
    pub fn gram_inputs(&self, model: &Model) -> Vec<String> {
        let mut r = CompressReport::default();
        let g = &model.graph;
        let mut names = Vec::new();
        for t in self.targets(g, &mut r) {
            for &(n, _, how) in &t.readers {
                let d = g.node(n);
                let plain = match how {
                    Reader::MatMul => true,
                    Reader::Gemm(_) => d.attr_int("transA").unwrap_or(0) == 0,
                    _ => false,
                };
                if let (true, Some(x)) = (plain, d.input(0)) {
                    let name = g.name(x).to_string();
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
        }
        names
    }

    /// The weights by rule 1, in initializer order.
    fn targets(&self, g: &Graph, report: &mut CompressReport) -> Vec<Target> {
        let mut out = Vec::new();
        for &v in g.initializers() {
            let Some(t) = g.initializer(v) else { continue };
            let uses = g.uses(v);
            if uses.is_empty() {
                continue;
            }
            let rank = t.dims.len();
            let readers: Option<Vec<(NodeId, usize, Reader)>> = uses
                .iter()
                .map(|&u| Reader::of(g, u, rank).map(|r| (u.node(), slot_of(u), r)))
                .collect();
            let Some(readers) = readers else {
                continue;
            };
            let name = g.name(v).to_string();
            if t.dtype != DType::F32 {
                if matches!(t.dtype, DType::F16 | DType::BF16) {
                    report
                        .kept
                        .push((name, format!("{} weights are not compressed yet", t.dtype.name())));
                }
                continue;
            }
            if t.numel().unwrap_or(0) < self.min_weight_elems {
                continue;
            }
            if g.is_input(v) || g.is_output(v) {
                report.kept.push((
                    name,
                    "a graph input or output (overridable or returned): kept".into(),
                ));
                continue;
            }
            if let Some(why) = readers.iter().find_map(|&(n, _, _)| self.excluded(g, n)) {
                report.kept.push((name, why));
                continue;
            }
            out.push(Target { v, name, readers });
        }
        out
    }

    fn excluded(&self, g: &Graph, n: NodeId) -> Option<String> {
        let d = g.node(n);
        let label = node_label(g, n);
        if self
            .exclude
            .iter()
            .any(|e| e == &d.op_type || (!d.name.is_empty() && e == &d.name))
        {
            return Some(format!("read by {label}, excluded"));
        }
        if self.keep_nodes.contains(&n) {
            return Some(format!("read by {label}, kept to meet the error bound"));
        }
        None
    }
}

/// Weights held in `Constant` nodes (PaddleOCR's exports, `--passes
/// none`) become initializers when every read is a weight slot rule 1
/// allows, so that they are weights like any other. (The default pipeline's
/// `fold_constants` does the same for every Constant.)
fn constants_to_initializers(g: &mut Graph, min_elems: u64) {
    let found: Vec<(NodeId, graphopt_ir::Tensor)> = g
        .nodes()
        .filter_map(|n| {
            let d = g.node(n);
            if d.op_type != "Constant" || !(d.domain.is_empty() || d.domain == "ai.onnx") {
                return None;
            }
            // Every spelling of a Constant's value (`value`, `value_floats`).
            let t = crate::fold_constants::consteval::constant_value(d).ok().flatten()?;
            let v = d.output(0)?;
            let rank = t.dims.len();
            let reads = g.uses(v);
            let ok = t.dtype == DType::F32
                && t.numel().unwrap_or(0) >= min_elems
                && !g.is_output(v)
                && !reads.is_empty()
                && reads.iter().all(|&u| Reader::of(g, u, rank).is_some());
            ok.then_some((n, t))
        })
        .collect();
    for (n, t) in found {
        crate::fold_constants::replace_by_constants(g, n, vec![t]);
    }
}

fn slot_of(u: Use) -> usize {
    match u {
        Use::Input { slot, .. } => slot as usize,
        Use::Capture { .. } => usize::MAX,
    }
}

/// A node as reports name it: its name, else `Op#index`.
pub(crate) fn node_label(g: &Graph, n: NodeId) -> String {
    let d = g.node(n);
    if d.name.is_empty() {
        format!("{}#{}", d.op_type, n.index())
    } else {
        d.name.clone()
    }
}

/// The readers' labels and op types (`MatMul`, `Conv`, ...; joined when mixed).
pub(crate) fn readers_of(g: &Graph, t: &Target) -> (Vec<String>, String) {
    let nodes = t.readers.iter().map(|r| node_label(g, r.0)).collect();
    let mut ops: Vec<&str> = t
        .readers
        .iter()
        .map(|r| g.node(r.0).op_type.as_str())
        .collect();
    ops.sort();
    ops.dedup();
    (nodes, ops.join("+"))
}

/// The float32 values of `v`'s initializer.
pub(crate) fn values(g: &Graph, v: ValueId) -> Vec<f32> {
    g.initializer(v)
        .and_then(|t| t.raw())
        .map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
        .unwrap_or_default()
}

/// `‖a − b‖ / ‖a‖` (0 for an all-zero `a` equal to `b`).
pub(crate) fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (x as f64).powi(2);
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (num / den).sqrt()
    }
}

#[cfg(test)]
mod tests;
