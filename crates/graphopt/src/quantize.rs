//! [`Session::quantize`]: int8 / int4 quantization through the `quantize`
//! pass, with activation ranges calibrated in tract, the error against the
//! float model measured on the calibration inputs, and, with a bound
//! (`max_error`), the most sensitive layers put back to float until the
//! error fits.
//!
//! Calibration runs the float model in tract on one npz per batch (or
//! seeded random inputs, with a warning) and collects, per activation the
//! pass wants a range for, min/max, a percentile of |x|, or the threshold
//! that minimizes the KL divergence of the clipped histogram (TensorRT's
//! entropy calibration). No Python is needed.
//!
//! The quantized model runs in tract with its constant `DequantizeLinear`s
//! folded to float weights first ([`dequantize_constants`]): that folding
//! computes `(q - zero_point) * scale` in f32, exactly as onnxruntime's
//! kernel does, and spares tract the blocked int4 form it cannot load.

use crate::check::{compare_outputs, output_names, run_in_tract, Scale, Tolerance};
use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::optimize::PipelineOptions;
use crate::precision::{memory, MemoryFigures};
use crate::session::Session;
use crate::util::Capture;
use graphopt_ir::{DType, Graph, Model, NodeId, Tensor};
use graphopt_passes::quantize::{weight_bytes, QuantMode, QuantReport, Quantize};
use graphopt_passes::Pass;
use graphopt_plan::DimValues;
use graphopt_tract::TractTensor;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

pub use graphopt_passes::quantize::QuantMode as QuantizeMode;

/// How activation ranges are taken from the calibration data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Calibrate {
    MinMax,
    /// The P-th percentile of |x| (P in (0, 100]), within min/max.
    Percentile(f64),
    /// The |x| threshold minimizing the KL divergence of the clipped,
    /// 128-level histogram from the full one (2048 bins).
    Entropy,
}

impl Calibrate {
    /// `minmax`, `percentile` (99.999), `percentile:P`, `entropy`.
    pub fn parse(s: &str) -> Result<Calibrate> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "minmax" => Ok(Calibrate::MinMax),
            "entropy" => Ok(Calibrate::Entropy),
            "percentile" => Ok(Calibrate::Percentile(99.999)),
            _ => match s.strip_prefix("percentile:") {
                Some(p) => match p.parse::<f64>() {
                    Ok(p) if p > 0.0 && p <= 100.0 => Ok(Calibrate::Percentile(p)),
                    _ => Err(Error::new(format!(
                        "--calibrate {s}: the percentile must be a number in (0, 100]"
                    ))),
                },
                None => Err(Error::new(format!(
                    "--calibrate {s}: expected minmax, percentile[:P] or entropy"
                ))),
            },
        }
    }

    pub fn name(&self) -> String {
        match self {
            Calibrate::MinMax => "minmax".into(),
            Calibrate::Percentile(p) => format!("percentile:{p}"),
            Calibrate::Entropy => "entropy".into(),
        }
    }
}

/// Where calibration batches come from.
#[derive(Clone, Debug)]
pub enum Calibration {
    /// One npz per batch of graph inputs, or a directory of them (read in
    /// name order).
    Files(PathBuf),
    /// Batches in memory, each the model's runtime inputs (by name or in
    /// order), as a Python iterable of dicts gives them.
    Batches(Vec<Inputs>),
}

impl From<PathBuf> for Calibration {
    fn from(p: PathBuf) -> Calibration {
        Calibration::Files(p)
    }
}

/// What [`Session::quantize`] does.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    pub mode: QuantMode,
    /// The calibration batches. `None`: seeded random inputs (4
    /// batches), with a warning. An array holding NaN or Inf is an error
    /// naming the file (or batch) and the array: no batch is skipped.
    pub calibration: Option<Calibration>,
    /// Symbolic dims of the random calibration inputs (others 4).
    pub dims: Vec<(String, i64)>,
    pub calibrate: Calibrate,
    pub per_channel: bool,
    pub symmetric: bool,
    pub block_size: i64,
    /// Op types or node names left float.
    pub exclude: Vec<String>,
    /// Bound on the relative L2 error of every output against the float
    /// model on the calibration inputs; layers go back to float, the most
    /// sensitive first, until it holds, and a result still over it is an
    /// error (the session is left unchanged).
    pub max_error: Option<f64>,
    /// Weights with fewer elements stay float.
    pub min_weight_elems: u64,
    /// Measure the error even without `max_error` (tract runs the models);
    /// when tract cannot run them, the report says why.
    pub measure: bool,
    /// Plan memory before and after at these dims (`None`: no plans).
    pub memory: Option<DimValues>,
    pub pipeline: PipelineOptions,
}

impl QuantizeOptions {
    /// Refuses options no quantization can follow: a block size other than
    /// 32, 64 or 128, a `max_error` that is not a positive number, a
    /// percentile outside (0, 100], a negative dim.
    pub fn validate(&self) -> Result<()> {
        if ![32, 64, 128].contains(&self.block_size) {
            return Err(Error::new(format!(
                "--block-size {}: expected 32, 64 or 128",
                self.block_size
            )));
        }
        if let Some(e) = self.max_error {
            if !(e.is_finite() && e > 0.0) {
                return Err(Error::new(format!(
                    "--max-error {e}: expected a positive number"
                )));
            }
        }
        if let Calibrate::Percentile(p) = self.calibrate {
            if !(p > 0.0 && p <= 100.0) {
                return Err(Error::new(format!(
                    "--calibrate percentile:{p}: the percentile must be a number in (0, 100]"
                )));
            }
        }
        crate::validate::dims(&self.dims)
    }

    pub fn new(mode: QuantMode) -> QuantizeOptions {
        QuantizeOptions {
            mode,
            calibration: None,
            dims: Vec::new(),
            calibrate: Calibrate::MinMax,
            per_channel: true,
            symmetric: false,
            block_size: 32,
            exclude: Vec::new(),
            max_error: None,
            min_weight_elems: Quantize.min_weight_elems,
            measure: true,
            memory: None,
            pipeline: PipelineOptions::default(),
        }
    }
}

/// A weight quantized, and how.
#[derive(Clone, Debug, Serialize)]
pub struct QuantizedWeight {
    pub name: String,
    pub format: String,
}

/// Something left float, and why.
#[derive(Clone, Debug, Serialize)]
pub struct KeptFloat {
    pub name: String,
    pub why: String,
}

/// An op type left float.
#[derive(Clone, Debug, Serialize)]
pub struct KeptOp {
    pub op: String,
    pub count: u64,
    pub why: String,
}

/// The error against the float model on the calibration inputs.
#[derive(Clone, Debug, Serialize)]
pub struct QuantError {
    /// Worst over outputs and batches.
    pub rel_l2: f64,
    pub max_abs: f64,
    /// Per output: worst relative L2 over batches.
    pub outputs: BTreeMap<String, f64>,
    pub batches: usize,
}

/// What [`Session::quantize`] did.
#[derive(Clone, Debug, Serialize)]
pub struct QuantizeReport {
    pub mode: &'static str,
    pub calibration: String,
    pub calibrate: String,
    pub per_channel: bool,
    pub symmetric: bool,
    pub block_size: i64,
    pub weights_bytes_before: u64,
    pub weights_bytes_after: u64,
    pub weights_ratio: f64,
    /// Nodes quantized by op type (subgraphs included).
    pub nodes_quantized: BTreeMap<String, u64>,
    pub weights: Vec<QuantizedWeight>,
    pub activations_quantized: u64,
    pub activations_calibrated: usize,
    pub kept_float: Vec<KeptFloat>,
    pub kept_ops: Vec<KeptOp>,
    pub error: Option<QuantError>,
    /// Why the error was not measured.
    pub error_skipped: Option<String>,
    pub max_error: Option<f64>,
    /// Main-graph nodes put back to float to meet `max_error`.
    pub fallback: Vec<String>,
    /// Quantizations tried.
    pub runs: usize,
    pub opset_before: Option<i64>,
    pub opset_after: Option<i64>,
    pub memory_before: Option<MemoryFigures>,
    pub memory_after: Option<MemoryFigures>,
    pub time_ms: f64,
    pub warnings: Vec<String>,
}

impl Session {
    /// Quantizes the model (see the module doc). Whole or not at all: an
    /// error leaves the session unchanged.
    pub fn quantize(&mut self, opts: &QuantizeOptions) -> Result<QuantizeReport> {
        self.transact(|s| s.quantize_step(opts))
    }

    pub(crate) fn quantize_step(&mut self, opts: &QuantizeOptions) -> Result<QuantizeReport> {
        opts.validate()?;
        let t0 = Instant::now();
        let mut warnings = Vec::new();
        let mut base = Quantize {
            mode: opts.mode,
            per_channel: opts.per_channel,
            symmetric: opts.symmetric,
            block_size: opts.block_size,
            exclude: opts
                .exclude
                .iter()
                .map(|e| e.trim().to_string())
                .filter(|e| !e.is_empty())
                .collect(),
            min_weight_elems: opts.min_weight_elems,
            ..Quantize
        };
        let needs_data = opts.mode == QuantMode::Static || opts.max_error.is_some() || opts.measure;
        let (batches, label) = if needs_data {
            let (b, l) = self.calibration_batches(opts)?;
            if opts.calibration.is_none() {
                warnings.push(format!(
                    "no --calibration: {l}; ranges and errors on random data say little about real inputs"
                ));
            }
            (b, l)
        } else {
            (Vec::new(), "none".to_string())
        };
        let trial = |q: &Quantize| -> Result<(Model, QuantReport)> {
            let mut m = self.model.clone();
            let r = q.quantize(&mut m).map_err(|e| Error::new(e.0))?;
            graphopt_ir::verify::verify_model(&m)
                .map_err(|e| Error::new(format!("after quantize: IR is invalid: {e}")))?;
            Ok((m, r))
        };
        let mut calibrated = 0;
        if opts.mode == QuantMode::Static {
            let (_, dry) = trial(&base)?;
            let wanted: Vec<String> = dry
                .wanted_ranges
                .iter()
                .filter(|n| self.model.graph.value_by_name(n).is_some())
                .cloned()
                .collect();
            base.ranges = calibrate(&self.model, &wanted, &batches, opts.calibrate)?;
            calibrated = base.ranges.len();
        }
        // Error measurement, and the fallback to float.
        let measurer = if opts.max_error.is_some() || opts.measure {
            match Measurer::new(&self.model, &batches) {
                Ok(m) => Some(m),
                Err(e) if opts.max_error.is_none() => {
                    warnings.push(format!("error not measured: {e}"));
                    None
                }
                Err(e) => return Err(self.err(Error::new(format!("--max-error cannot run: {e}")))),
            }
        } else {
            None
        };
        let mut config = base.clone();
        let mut runs = 1;
        let mut fallback = Vec::new();
        let mut error = None;
        let mut error_skipped = None;
        if let Some(meas) = &measurer {
            let (m, r) = trial(&config)?;
            match meas.error(&m) {
                Ok(e) => error = Some(e),
                Err(e) => error_skipped = Some(e.message().to_string()),
            }
            if let (Some(bound), Some(e)) = (opts.max_error, &error) {
                if e.rel_l2 > bound {
                    let ranked = meas.sensitivity(&self.model, &m, &r.quantized)?;
                    // Doubling, then bisection: the fewest of the most
                    // sensitive nodes whose return to float fits the bound.
                    let mut try_k = |k: usize| -> Result<(Quantize, QuantError)> {
                        let q = Quantize {
                            keep_nodes: ranked.iter().take(k).copied().collect(),
                            ..base.clone()
                        };
                        let (m2, _) = trial(&q)?;
                        runs += 1;
                        Ok((q, meas.error(&m2)?))
                    };
                    let (mut lo, mut hi) = (0, None);
                    let mut k = 1.min(ranked.len());
                    let mut best = None;
                    while k > 0 {
                        let (q, e2) = try_k(k)?;
                        if e2.rel_l2 <= bound {
                            hi = Some(k);
                            best = Some((q, e2));
                            break;
                        }
                        lo = k;
                        if k == ranked.len() {
                            break;
                        }
                        k = (k * 2).min(ranked.len());
                    }
                    if let Some(mut h) = hi {
                        while h - lo > 1 {
                            let mid = (lo + h) / 2;
                            let (q, e2) = try_k(mid)?;
                            if e2.rel_l2 <= bound {
                                h = mid;
                                best = Some((q, e2));
                            } else {
                                lo = mid;
                            }
                        }
                        let (q, e2) = best.expect("set with hi");
                        if h >= ranked.len() {
                            return Err(self.err(Error::new(format!(
                                "--max-error {bound}: the {} model fits only with every quantized layer back to float (error {:.3e} with them all quantized); nothing was quantized",
                                opts.mode.name(),
                                e.rel_l2
                            ))));
                        }
                        fallback = ranked
                            .iter()
                            .take(h)
                            .map(|&n| node_label(&self.model, n))
                            .collect();
                        config = q;
                        error = Some(e2);
                    } else {
                        return Err(self.err(Error::new(format!(
                            "--max-error {bound}: the {} model is at relative L2 error {:.3e} on {label} and no layer put back to float brings it under; nothing was quantized",
                            opts.mode.name(),
                            e.rel_l2
                        ))));
                    }
                }
            }
            if let (Some(bound), None) = (opts.max_error, &error) {
                return Err(self.err(Error::new(format!(
                    "--max-error {bound}: the quantized model cannot be measured: {}",
                    error_skipped.as_deref().unwrap_or("unknown")
                ))));
            }
            if let (Some(bound), Some(e)) = (opts.max_error, &error) {
                if e.rel_l2 > bound {
                    return Err(self.err(Error::new(format!(
                        "--max-error {bound}: the {} model is still at relative L2 error {:.3e} on {label} with {} nodes put back to float; nothing was quantized",
                        opts.mode.name(),
                        e.rel_l2,
                        fallback.len()
                    ))));
                }
            }
        }
        let mem = |m: &Model| opts.memory.as_ref().map(|d| memory(m, d));
        let memory_before = mem(&self.model);
        let captured = Rc::new(RefCell::new(None));
        let pass: Vec<Box<dyn Pass>> = vec![Box::new(Capture {
            name: "quantize",
            run: Box::new(move |model| {
                let r = config.quantize(model)?;
                let mut stats = r.stats();
                stats.warnings = r.warnings.clone();
                Ok((r, stats))
            }),
            out: captured.clone(),
        })];
        self.run_passes(&pass, 1, &opts.pipeline)?;
        let r = captured.borrow_mut().take().unwrap_or_default();
        warnings.extend(r.warnings.iter().cloned());
        Ok(QuantizeReport {
            mode: opts.mode.name(),
            calibration: label,
            calibrate: opts.calibrate.name(),
            per_channel: opts.per_channel,
            symmetric: opts.symmetric,
            block_size: opts.block_size,
            weights_bytes_before: r.weight_bytes_before,
            weights_bytes_after: r.weight_bytes_after,
            weights_ratio: if r.weight_bytes_before == 0 {
                1.0
            } else {
                r.weight_bytes_after as f64 / r.weight_bytes_before as f64
            },
            nodes_quantized: r.by_op.clone(),
            weights: r
                .weights
                .iter()
                .map(|(n, f)| QuantizedWeight {
                    name: n.clone(),
                    format: f.clone(),
                })
                .collect(),
            activations_quantized: r.activations,
            activations_calibrated: calibrated,
            kept_float: r
                .kept_float
                .iter()
                .map(|(n, w)| KeptFloat {
                    name: n.clone(),
                    why: w.clone(),
                })
                .collect(),
            kept_ops: r
                .kept_ops
                .iter()
                .map(|(op, (c, w))| KeptOp {
                    op: op.clone(),
                    count: *c,
                    why: w.clone(),
                })
                .collect(),
            error,
            error_skipped,
            max_error: opts.max_error,
            fallback,
            runs,
            opset_before: r.opset_before,
            opset_after: r.opset_after,
            memory_before,
            memory_after: mem(&self.model),
            time_ms: t0.elapsed().as_secs_f64() * 1e3,
            warnings,
        })
    }

    fn calibration_batches(
        &self,
        opts: &QuantizeOptions,
    ) -> Result<(Vec<Vec<TractTensor>>, String)> {
        match &opts.calibration {
            Some(Calibration::Batches(batches)) => {
                if batches.is_empty() {
                    return Err(Error::new("calibration: no batch given"));
                }
                let b = batches
                    .iter()
                    .enumerate()
                    .map(|(i, inputs)| {
                        inputs
                            .materialize(&self.model)
                            .map(|(t, _)| t)
                            .map_err(|e| e.within(&format!("calibration batch {i}")))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok((b, format!("{} batches in memory", batches.len())))
            }
            Some(Calibration::Files(p)) if p.is_dir() => {
                let mut files: Vec<PathBuf> = std::fs::read_dir(p)
                    .map_err(|e| Error::new(format!("{}: {e}", p.display())))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|f| f.extension().is_some_and(|x| x == "npz"))
                    .collect();
                files.sort();
                if files.is_empty() {
                    return Err(Error::new(format!(
                        "--calibration {}: the directory holds no .npz file",
                        p.display()
                    )));
                }
                let b = files
                    .iter()
                    .map(|f| self.calibration_file(f, &files))
                    .collect::<Result<Vec<_>>>()?;
                Ok((b, format!("{} ({} batches)", p.display(), files.len())))
            }
            Some(Calibration::Files(p)) => Ok((
                vec![self.calibration_file(p, std::slice::from_ref(p))?],
                p.display().to_string(),
            )),
            None => {
                let b = (1..=4)
                    .map(|seed| graphopt_tract::sample_inputs(&self.model, &opts.dims, 4, seed))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok((b, "4 batches of seeded random inputs".into()))
            }
        }
    }
}

impl Session {
    /// One calibration npz, its arrays finite: a NaN or Inf would end up
    /// in an activation range (minmax skips them, so a batch of NaNs
    /// gives no range at all) and in the error bound, without a word.
    /// Refusing is the documented behaviour (no batch is skipped). `files`
    /// are all the batches, for the message.
    fn calibration_file(&self, f: &PathBuf, files: &[PathBuf]) -> Result<Vec<TractTensor>> {
        let t = graphopt_tract::npz::read_inputs(f, &self.model).map_err(Error::from)?;
        let place = match files.iter().position(|x| x == f) {
            Some(i) if files.len() > 1 => format!(
                "{} (calibration batch {} of {})",
                f.display(),
                i + 1,
                files.len()
            ),
            _ => f.display().to_string(),
        };
        crate::validate::ensure_finite(&place, crate::inputs::named(&self.model, &t))?;
        Ok(t)
    }
}

fn node_label(m: &Model, n: NodeId) -> String {
    let g = &m.graph;
    if !g.is_live_node(n) {
        return format!("#{}", n.index());
    }
    let d = g.node(n);
    if d.name.is_empty() {
        format!("{}#{}", d.op_type, n.index())
    } else {
        d.name.clone()
    }
}

fn f32_values(t: &TractTensor) -> Vec<f32> {
    t.cast_to::<f32>()
        .ok()
        .and_then(|c| {
            c.to_plain_array_view::<f32>()
                .ok()
                .map(|a| a.iter().copied().collect())
        })
        .unwrap_or_default()
}

/// Ranges of `names` over the batches, run in tract on the float model.
fn calibrate(
    model: &Model,
    names: &[String],
    batches: &[Vec<TractTensor>],
    how: Calibrate,
) -> Result<BTreeMap<String, (f32, f32)>> {
    if names.is_empty() {
        return Ok(BTreeMap::new());
    }
    let n_out = model.graph.outputs.len();
    // Per name: min, max and (for percentile/entropy) a sample of values.
    const SAMPLE: usize = 1 << 18;
    let mut lo = vec![f32::INFINITY; names.len()];
    let mut hi = vec![f32::NEG_INFINITY; names.len()];
    let mut samples: Vec<Vec<f32>> = vec![Vec::new(); names.len()];
    for b in batches {
        let outs = run_in_tract(model, names, b)
            .map_err(|e| Error::new(format!("calibration: tract cannot run the model: {e:#}")))?;
        for (i, t) in outs.iter().skip(n_out).enumerate().take(names.len()) {
            let v = f32_values(t);
            for &x in &v {
                if x.is_finite() {
                    lo[i] = lo[i].min(x);
                    hi[i] = hi[i].max(x);
                }
            }
            if how != Calibrate::MinMax {
                let step = (v.len() / (SAMPLE / batches.len().max(1)).max(1)).max(1);
                samples[i].extend(v.iter().step_by(step).filter(|x| x.is_finite()));
            }
        }
    }
    let mut out = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        if !lo[i].is_finite() || !hi[i].is_finite() {
            continue;
        }
        let t = match how {
            Calibrate::MinMax => None,
            Calibrate::Percentile(p) => Some(percentile_abs(&samples[i], p)),
            Calibrate::Entropy => Some(entropy_threshold(&samples[i])),
        };
        let (l, h) = match t {
            Some(t) if t > 0.0 => (lo[i].max(-t), hi[i].min(t)),
            _ => (lo[i], hi[i]),
        };
        out.insert(n.clone(), (l, h));
    }
    Ok(out)
}

fn percentile_abs(v: &[f32], p: f64) -> f32 {
    if v.is_empty() {
        return 0.0;
    }
    let mut a: Vec<f32> = v.iter().map(|x| x.abs()).collect();
    a.sort_by(|x, y| x.total_cmp(y));
    let i = ((p / 100.0) * (a.len() - 1) as f64).round() as usize;
    a[i.min(a.len() - 1)]
}

/// TensorRT's entropy calibration on |x|: 2048 bins; for each threshold
/// bin i in 128..=2048, the distribution clipped at i (outliers added to
/// the last bin) against its 128-level quantization; the i with least KL.
pub fn entropy_threshold(v: &[f32]) -> f32 {
    const BINS: usize = 2048;
    const LEVELS: usize = 128;
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if amax == 0.0 || v.is_empty() {
        return amax;
    }
    let w = amax / BINS as f32;
    let mut hist = vec![0f64; BINS];
    for x in v {
        let b = ((x.abs() / w) as usize).min(BINS - 1);
        hist[b] += 1.0;
    }
    let mut best = (f64::INFINITY, BINS);
    for i in (LEVELS..=BINS).step_by(16) {
        let mut p: Vec<f64> = hist[..i].to_vec();
        p[i - 1] += hist[i..].iter().sum::<f64>();
        // Quantize the clipped p into LEVELS levels, spread back over the
        // non-empty bins of each level.
        let mut q = vec![0f64; i];
        let per = i as f64 / LEVELS as f64;
        for l in 0..LEVELS {
            let (s, e) = (
                (l as f64 * per) as usize,
                (((l + 1) as f64 * per) as usize).min(i),
            );
            let total: f64 = hist[s..e].iter().sum();
            let nz = hist[s..e].iter().filter(|&&x| x > 0.0).count();
            if nz > 0 {
                for (k, q) in q[s..e].iter_mut().enumerate() {
                    if hist[s + k] > 0.0 {
                        *q = total / nz as f64;
                    }
                }
            }
        }
        let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
        if sp == 0.0 || sq == 0.0 {
            continue;
        }
        p.iter_mut().for_each(|x| *x /= sp);
        q.iter_mut().for_each(|x| *x /= sq);
        // onnxruntime's smoothing: empty bins get 1e-4, taken evenly from
        // the others, so that mass outside q costs in proportion.
        if !smooth(&mut p) || !smooth(&mut q) {
            continue;
        }
        let kl: f64 = p.iter().zip(&q).map(|(a, b)| a * (a / b).ln()).sum();
        if kl < best.0 {
            best = (kl, i);
        }
    }
    w * best.1 as f32
}

fn smooth(d: &mut [f64]) -> bool {
    const EPS: f64 = 1e-4;
    let zeros = d.iter().filter(|&&x| x == 0.0).count();
    let nonzeros = d.len() - zeros;
    if nonzeros == 0 {
        return false;
    }
    let eps1 = EPS * zeros as f64 / nonzeros as f64;
    if eps1 >= 1.0 {
        return false;
    }
    for x in d.iter_mut() {
        *x = if *x == 0.0 { EPS } else { *x - eps1 };
    }
    d.iter().all(|&x| x > 0.0)
}

/// Runs the float model once per batch and compares candidates with it.
struct Measurer {
    batches: Vec<Vec<TractTensor>>,
    reference: Vec<Vec<TractTensor>>,
    names: Vec<String>,
}

impl Measurer {
    fn new(model: &Model, batches: &[Vec<TractTensor>]) -> Result<Measurer> {
        let batches: Vec<_> = batches.iter().take(8).cloned().collect();
        let reference = batches
            .iter()
            .map(|b| run_in_tract(model, &[], b))
            .collect::<anyhow::Result<Vec<_>>>()
            .map_err(|e| Error::new(format!("tract cannot run the float model: {e:#}")))?;
        Ok(Measurer {
            batches,
            reference,
            names: output_names(model),
        })
    }

    fn error(&self, m: &Model) -> Result<QuantError> {
        let m = dequantize_constants(m)?;
        let tol = Tolerance {
            rtol: 0.0,
            atol: 0.0,
            scale: Scale::Tensor,
        };
        let mut e = QuantError {
            rel_l2: 0.0,
            max_abs: 0.0,
            outputs: BTreeMap::new(),
            batches: self.batches.len(),
        };
        for (b, r) in self.batches.iter().zip(&self.reference) {
            let got = run_in_tract(&m, &[], b)
                .map_err(|e| Error::new(format!("tract cannot run the quantized model: {e:#}")))?;
            for d in compare_outputs(&self.names, r, &got, &tol) {
                if !d.rel_l2.is_finite() && d.error.is_none() {
                    continue;
                }
                if let Some(err) = d.error {
                    return Err(Error::new(format!("output '{}': {err}", d.name)));
                }
                if d.shape.is_empty() && d.elements == 0 {
                    continue;
                }
                e.rel_l2 = e.rel_l2.max(d.rel_l2);
                e.max_abs = e.max_abs.max(d.max_abs);
                let o = e.outputs.entry(d.name).or_insert(0.0);
                *o = o.max(d.rel_l2);
            }
        }
        Ok(e)
    }

    /// Quantized main-graph nodes, most sensitive first: the relative L2
    /// error a node's output gains over the worst of its inputs, in the
    /// quantized model against the float one (first batch).
    fn sensitivity(&self, float: &Model, q: &Model, nodes: &[NodeId]) -> Result<Vec<NodeId>> {
        let g = &float.graph;
        let mut names: Vec<String> = Vec::new();
        let mut io: Vec<(NodeId, String, Vec<String>)> = Vec::new();
        for &n in nodes {
            if !g.is_live_node(n) {
                continue;
            }
            let d = g.node(n);
            let Some(o) = d.output(0) else { continue };
            let ins: Vec<String> = d
                .inputs()
                .iter()
                .flatten()
                .filter(|&&v| g.constant(v).is_none() && !g.is_input(v))
                .map(|&v| g.name(v).to_string())
                .collect();
            let out = g.name(o).to_string();
            for x in ins.iter().chain(std::iter::once(&out)) {
                if !names.contains(x) && !g.is_output(g.value_by_name(x).expect("a value")) {
                    names.push(x.clone());
                }
            }
            io.push((n, out, ins));
        }
        let qd = dequantize_constants(q)?;
        let b = &self.batches[0];
        let n_out = float.graph.outputs.len();
        let fr = run_in_tract(float, &names, b).map_err(Error::from)?;
        let qr = run_in_tract(&qd, &names, b).map_err(Error::from)?;
        let mut err: BTreeMap<&str, f64> = BTreeMap::new();
        let tol = Tolerance::default();
        for (i, n) in names.iter().enumerate() {
            let (Some(x), Some(y)) = (fr.get(n_out + i), qr.get(n_out + i)) else {
                continue;
            };
            let d = compare_outputs(
                std::slice::from_ref(n),
                std::slice::from_ref(x),
                std::slice::from_ref(y),
                &tol,
            );
            err.insert(n, d[0].rel_l2);
        }
        // Graph outputs: their error from the main comparison.
        let outs = compare_outputs(
            &self.names,
            &self.reference[0],
            &run_in_tract(&qd, &[], b).map_err(Error::from)?,
            &tol,
        );
        for o in &outs {
            err.insert(&o.name, o.rel_l2);
        }
        let mut scored: Vec<(f64, NodeId)> = io
            .iter()
            .map(|(n, out, ins)| {
                let e_out = err.get(out.as_str()).copied().unwrap_or(0.0);
                let e_in = ins
                    .iter()
                    .map(|i| err.get(i.as_str()).copied().unwrap_or(0.0))
                    .fold(0.0, f64::max);
                (e_out - e_in, *n)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        Ok(scored.into_iter().map(|(_, n)| n).collect())
    }
}

/// `y = DequantizeLinear(q, s[, z])` with constant inputs ==> `y` a float
/// initializer, computed as onnxruntime computes it: `(q - z) * s` in f32,
/// per tensor, per axis or blocked. In every graph.
pub fn dequantize_constants(m: &Model) -> Result<Model> {
    let mut m = m.clone();
    fold_dq(&mut m.graph)?;
    Ok(m)
}

fn fold_dq(g: &mut Graph) -> Result<()> {
    for n in g.nodes().collect::<Vec<_>>() {
        if g.node(n).has_subgraphs() {
            let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
            let mut r = Ok(());
            for a in &mut attrs {
                for sub in a.graphs_mut() {
                    if r.is_ok() {
                        r = fold_dq(sub);
                    }
                }
            }
            g.node_mut(n).attributes = attrs;
            g.refresh_captures(n);
            r?;
            continue;
        }
        let d = g.node(n);
        if d.op_type != "DequantizeLinear" || !d.domain.is_empty() {
            continue;
        }
        let ins: Vec<_> = d.inputs().iter().flatten().copied().collect();
        if ins.is_empty() || ins.iter().any(|&v| g.constant(v).is_none()) {
            continue;
        }
        let Some(y) = d.output(0) else { continue };
        let axis = d.attr_int("axis").unwrap_or(1);
        let block = d.attr_int("block_size").unwrap_or(0);
        let q = g.constant(ins[0]).expect("checked");
        let s = g.constant(ins[1]).expect("checked");
        let z = ins.get(2).and_then(|&v| g.constant(v));
        let Some(t) = dequantize(q, s, z, axis, block) else {
            continue;
        };
        g.remove_node(n);
        g.set_initializer(y, t);
        // The integer tensors go too (tract loads every initializer, and
        // has no 4-bit types).
        for v in ins {
            if g.uses(v).is_empty() && !g.is_input(v) && !g.is_output(v) {
                g.take_initializer(v);
                g.remove_value(v);
            }
        }
    }
    emulate_dynamic(g)?;
    Ok(())
}

/// `q, s, z = DynamicQuantizeLinear(x); y = DequantizeLinear(q, s, z)` ==>
/// the same arithmetic in float ops tract runs (it wants constant scales):
/// `s = (max(x, 0) - min(x, 0)) / 255`, `z = clip(round(-min(x, 0) / s), 0,
/// 255)`, `y = (clip(round(x / s) + z, 0, 255) - z) * s`.
fn emulate_dynamic(g: &mut Graph) -> Result<()> {
    use graphopt_ir::{NewNode, Type};
    for n in g.nodes().collect::<Vec<_>>() {
        let d = g.node(n);
        if d.op_type != "DequantizeLinear" || !d.domain.is_empty() || d.inputs().len() != 3 {
            continue;
        }
        let (Some(q), Some(y)) = (d.input(0), d.output(0)) else {
            continue;
        };
        let Some((p, 0)) = g.producer(q) else {
            continue;
        };
        let pd = g.node(p);
        if pd.op_type != "DynamicQuantizeLinear"
            || pd.outputs().iter().flatten().copied().collect::<Vec<_>>()
                != d.inputs().iter().flatten().copied().collect::<Vec<_>>()
        {
            continue;
        }
        let Some(x) = pd.input(0) else { continue };
        let f = |g: &mut Graph, h: &str| g.fresh_value(h, Some(Type::tensor(DType::F32, None)));
        let c = |g: &mut Graph, h: &str, v: f32| g.add_initializer(h, Tensor::scalar_f32(v));
        let zero = c(g, "dql_zero", 0.0);
        let q255 = c(g, "dql_255", 255.0);
        let mut nodes: Vec<NewNode> = Vec::new();
        let mut op = |g: &mut Graph,
                      o: &str,
                      ins: &[graphopt_ir::ValueId],
                      out: Option<graphopt_ir::ValueId>| {
            let out = out.unwrap_or_else(|| f(g, "dql"));
            let mut nn = NewNode::new(o).inputs(ins).outputs(&[out]);
            if o.starts_with("Reduce") {
                nn = nn.attr(graphopt_ir::Attribute::new(
                    "keepdims",
                    graphopt_ir::AttrValue::Int(0),
                ));
            }
            nodes.push(nn);
            out
        };
        let mx = op(g, "ReduceMax", &[x], None);
        let mn = op(g, "ReduceMin", &[x], None);
        let mx = op(g, "Max", &[mx, zero], None);
        let mn = op(g, "Min", &[mn, zero], None);
        let rg = op(g, "Sub", &[mx, mn], None);
        let sc = op(g, "Div", &[rg, q255], None);
        let nm = op(g, "Neg", &[mn], None);
        let zf = op(g, "Div", &[nm, sc], None);
        let zr = op(g, "Round", &[zf], None);
        let zp = op(g, "Clip", &[zr, zero, q255], None);
        let xs = op(g, "Div", &[x, sc], None);
        let xr = op(g, "Round", &[xs], None);
        let xz = op(g, "Add", &[xr, zp], None);
        let qc = op(g, "Clip", &[xz, zero, q255], None);
        let qz = op(g, "Sub", &[qc, zp], None);
        g.remove_node(n);
        op(g, "Mul", &[qz, sc], Some(y));
        for nn in nodes {
            g.insert_node_before(p, nn)?;
        }
        let outs: Vec<_> = g.node(p).outputs().iter().flatten().copied().collect();
        if outs
            .iter()
            .all(|&v| g.uses(v).is_empty() && !g.is_output(v))
        {
            g.remove_node(p);
            for v in outs {
                g.remove_value(v);
            }
        }
    }
    Ok(())
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value m * 2^-24.
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn ints(t: &Tensor) -> Option<Vec<i32>> {
    let raw = t.raw()?;
    Some(match t.dtype {
        DType::I8 => raw.iter().map(|&b| b as i8 as i32).collect(),
        DType::U8 => raw.iter().map(|&b| b as i32).collect(),
        DType::U4 | DType::I4 => {
            let n = t.numel().ok()? as usize;
            (0..n)
                .map(|i| {
                    let nib = (raw[i / 2] >> (4 * (i % 2))) & 0xF;
                    if t.dtype == DType::I4 {
                        ((nib << 4) as i8 >> 4) as i32
                    } else {
                        nib as i32
                    }
                })
                .collect()
        }
        DType::I32 => raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => return None,
    })
}

fn dequantize(q: &Tensor, s: &Tensor, z: Option<&Tensor>, axis: i64, block: i64) -> Option<Tensor> {
    let sv: Vec<f32> = match s.dtype {
        DType::F32 => s
            .raw()?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => s
            .raw()?
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => return None,
    };
    let qv = ints(q)?;
    let zv = match z {
        Some(z) => ints(z)?,
        None => vec![0; sv.len()],
    };
    let r = q.dims.len() as i64;
    let dims = &q.dims;
    let a = if axis < 0 { axis + r } else { axis };
    // Index of the scale for each element.
    let n = qv.len();
    let mut out = vec![0f32; n];
    if sv.len() == 1 {
        for i in 0..n {
            out[i] = (qv[i] - zv[0]) as f32 * sv[0];
        }
    } else if block > 0 {
        if !(0..r).contains(&a) {
            return None;
        }
        let a = a as usize;
        let mut sdims = dims.clone();
        sdims[a] = (dims[a] + block - 1) / block;
        for (i, o) in out.iter_mut().enumerate() {
            // Unravel i in dims, map axis a to its block, ravel in sdims.
            let mut rem = i;
            let mut si = 0usize;
            let mut mul = 1usize;
            for k in (0..dims.len()).rev() {
                let d = dims[k] as usize;
                let mut c = rem % d;
                rem /= d;
                if k == a {
                    c /= block as usize;
                }
                si += c * mul;
                mul *= sdims[k] as usize;
            }
            *o = (qv[i] - zv[si]) as f32 * sv[si];
        }
    } else {
        if !(0..r).contains(&a) {
            return None;
        }
        let a = a as usize;
        let stride: usize = dims[a + 1..].iter().product::<i64>() as usize;
        let nc = dims[a] as usize;
        for i in 0..n {
            let c = (i / stride) % nc;
            out[i] = (qv[i] - zv[c]) as f32 * sv[c];
        }
    }
    if s.dtype == DType::F16 {
        let raw: Vec<u8> = out
            .iter()
            .flat_map(|x| graphopt_passes::lower_precision::f32_to_f16_bits(*x).to_le_bytes())
            .collect();
        return Tensor::from_raw(DType::F16, dims.clone(), raw.into()).ok();
    }
    Tensor::from_f32(dims.clone(), &out).ok()
}

impl Session {
    /// The weights' bytes (initializers and Constant nodes, subgraphs
    /// included), as the quantization report counts them.
    pub fn weights_bytes(&self) -> u64 {
        weight_bytes(&self.model.graph)
    }
}
