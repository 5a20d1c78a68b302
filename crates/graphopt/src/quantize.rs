//! [`Session::quantize`]: int8 / int4 quantization through the `quantize`
//! pass, with activation ranges calibrated in tract, the error against the
//! float model measured on the calibration inputs, and, with a bound
//! (`max_error`), the most sensitive layers put back to float until the
//! error fits.
//!
//! Calibration runs the float model in tract on one npz per batch (or
//! seeded random inputs, with a warning) and hands the values of every
//! activation the pass wants a range for to the pass's
//! `quantize::calibrate` (min/max, a percentile of |x|, or TensorRT's
//! entropy threshold). No Python is needed.
//!
//! The quantized model runs in tract with its constant `DequantizeLinear`s
//! folded to float weights first (the `dequantize_constants` pass): that folding
//! computes `(q - zero_point) * scale` in f32, exactly as onnxruntime's
//! kernel does, and spares tract the blocked int4 form it cannot load.

use crate::check::{compare_outputs, output_names, run_in_tract, Scale, Tolerance};
use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::optimize::PipelineOptions;
use crate::precision::{memory, MemoryFigures};
use crate::session::Session;
use crate::util::Capture;
use graphopt_ir::{Model, NodeId};
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

pub use graphopt_passes::quantize::calibrate::entropy_threshold;
pub use graphopt_passes::quantize::Calibrate;
use graphopt_passes::quantize::RangeCollector;

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

/// Something the model had quantized already, left as it was.
#[derive(Clone, Debug, Serialize)]
pub struct AlreadyQuantized {
    pub name: String,
    pub what: String,
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
    /// What the model had quantized already (integer ops, Q/DQ pairs,
    /// dequantized weights and the nodes reading them), left as it was.
    pub already_quantized: Vec<AlreadyQuantized>,
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
            already_quantized: r
                .already_quantized
                .iter()
                .map(|(n, w)| AlreadyQuantized {
                    name: n.clone(),
                    what: w.clone(),
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

/// Ranges of `names` over the batches, run in tract on the float model
/// (the statistics are the `quantize` pass's [`RangeCollector`]).
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
    let mut ranges = RangeCollector::new(names.len(), batches.len(), how);
    for b in batches {
        let outs = run_in_tract(model, names, b)
            .map_err(|e| Error::new(format!("calibration: tract cannot run the model: {e:#}")))?;
        for (i, t) in outs.iter().skip(n_out).enumerate().take(names.len()) {
            ranges.add(i, &f32_values(t));
        }
    }
    Ok(ranges.finish(names))
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

/// The model with constant `DequantizeLinear`s folded to float weights
/// and dynamic quantization spelled in float ops, as tract runs it (the
/// `dequantize_constants` pass, on a copy).
pub fn dequantize_constants(m: &Model) -> Result<Model> {
    Ok(graphopt_passes::dequantize_constants::dequantize_constants(
        m,
    )?)
}

impl Session {
    /// The weights' bytes (initializers and Constant nodes, subgraphs
    /// included), as the quantization report counts them.
    pub fn weights_bytes(&self) -> u64 {
        weight_bytes(&self.model.graph)
    }
}
