//! [`Session::quantize`]: int8 / int4 quantization through the `quantize`
//! pass, with activation ranges calibrated on the calibration inputs, the
//! error against the float model measured on them, and a bound on that
//! error (`max_error`, 5% by default) that the most sensitive layers going
//! back to float (their activations first) make hold, or the quantization
//! is refused.
//!
//! Calibration runs the float model in graphopt's runtime (tract where the
//! runtime lacks a kernel; [`crate::reference`]) on one npz per batch (or
//! seeded random inputs, with a warning) and hands the values of every
//! activation the pass wants a range for to the pass's
//! `quantize::calibrate` (min/max, a percentile of |x|, or TensorRT's
//! entropy threshold). No Python is needed.
//!
//! The error is measured in tract (graphopt's runtime where tract cannot
//! run the model), on the quantized model with its constant
//! `DequantizeLinear`s folded to float weights first (the
//! `dequantize_constants` pass): that folding computes
//! `(q - zero_point) * scale` in f32, exactly as onnxruntime's kernel does,
//! and spares tract the blocked int4 form it cannot load.

use crate::check::{compare_outputs, output_names, Scale, Tolerance};
use crate::reference::{run_once, Engine, Reference};

/// The engine that measures errors first: tract, faster than graphopt's
/// runtime on convolutions today (issue 20); the runtime runs what tract
/// cannot (If, Loop, Scan, STFT front ends). Calibration runs in the
/// runtime first.
const MEASURE_FIRST: Engine = Engine::Tract;
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
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

pub use graphopt_passes::quantize::QuantMode as QuantizeMode;

pub use graphopt_passes::quantize::calibrate::entropy_threshold;
pub use graphopt_passes::quantize::Calibrate;
use graphopt_passes::quantize::RangeCollector;

/// The default bound on every output's relative L2 error against the
/// float model: 5%.
pub const DEFAULT_MAX_ERROR: f64 = 0.05;

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
    /// model on the calibration inputs (default [`DEFAULT_MAX_ERROR`]).
    /// Past it, in dynamic mode, convolutions whose activation
    /// quantization alone breaks it keep float activations (or stay float);
    /// then layers go back to float, the most sensitive first, until it
    /// holds. A model that meets it only all float, or whose error cannot
    /// be measured, is an error (the session is left unchanged). `None`:
    /// no bound (the error is still measured and reported).
    pub max_error: Option<f64>,
    /// Weights with fewer elements stay float.
    pub min_weight_elems: u64,
    /// Measure the error against the float model (tract runs both, graphopt's
    /// runtime where tract cannot: If, Loop, Scan). `false` turns the bound
    /// off too: an unmeasured error bounds nothing.
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

    /// A bound as users spell it: a positive number, or `none` (no bound).
    pub fn parse_max_error(s: &str) -> Result<Option<f64>> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        match t.parse::<f64>() {
            Ok(e) if e.is_finite() && e > 0.0 => Ok(Some(e)),
            _ => Err(Error::new(format!(
                "--max-error {s}: expected a positive number or 'none'"
            ))),
        }
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
            max_error: Some(DEFAULT_MAX_ERROR),
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
    /// Jittered copies of the first batch measured too (their error is in
    /// `rel_l2`; see [`jitter`]): an output that moves past the bound on
    /// such noise, as another engine's rounding moves it, was never within
    /// it. 0 when the float model could not take them (a warning says why).
    pub jittered: usize,
}

/// One layer quantized alone: the output error it causes with its
/// activations quantized, and with its weights only.
#[derive(Clone, Debug, Serialize)]
pub struct SoloError {
    pub node: String,
    pub error: f64,
    pub weights_only_error: f64,
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
    /// The bound that held (`None`: off, and `bound_off` says why).
    pub max_error: Option<f64>,
    pub bound_off: Option<String>,
    /// Where the float model ran for the error: tract, or graphopt's
    /// runtime and why tract could not.
    pub measured_in: Option<String>,
    /// Where static calibration ran: graphopt's runtime, or tract and why
    /// the runtime could not.
    pub calibrated_in: Option<String>,
    /// Convolutions whose dynamic activation quantization alone broke the
    /// bound, kept with int8 weights and float activations.
    pub weight_only: Vec<SoloError>,
    /// Convolutions whose quantization alone broke the bound even with
    /// float activations: kept float.
    pub solo_float: Vec<SoloError>,
    /// Main-graph nodes given back to meet `max_error` (float activations,
    /// int8 weights for int4 ones, or float, as each label says), most
    /// sensitive first (after `weight_only` and `solo_float`).
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
        // The bound holds only where the error is measured.
        let bound = if opts.measure { opts.max_error } else { None };
        let needs_data = opts.mode == QuantMode::Static || opts.measure;
        let (batches, label) = if needs_data {
            let (b, l) = self.calibration_batches(&opts.calibration, &opts.dims)?;
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
        let mut calibrated_in = None;
        if opts.mode == QuantMode::Static {
            let (_, dry) = trial(&base)?;
            let wanted: Vec<String> = dry
                .wanted_ranges
                .iter()
                .filter(|n| self.model.graph.value_by_name(n).is_some())
                .cloned()
                .collect();
            let (ranges, engine) = calibrate(&self.model, &wanted, &batches, opts.calibrate)?;
            base.ranges = ranges;
            calibrated = base.ranges.len();
            calibrated_in = engine;
        }
        // Error measurement, and the fallback to float.
        let measurer = if opts.measure {
            Measurer::bounded(
                &self.model,
                &batches,
                bound,
                &mut warnings,
                "float",
                "quantizes",
            )
            .map_err(|e| self.err(e))?
        } else {
            None
        };
        let mut config = base.clone();
        let mut runs = 1;
        let mut fallback = Vec::new();
        let mut weight_only = Vec::new();
        let mut solo_float = Vec::new();
        let mut error = None;
        let mut error_skipped = None;
        if let Some(meas) = &measurer {
            let (m, r) = trial(&config)?;
            let quantized = r.quantized.clone();
            match meas.error(&m) {
                Ok(e) => error = Some(e),
                Err(e) => error_skipped = Some(e.message().to_string()),
            }
            if let (Some(bound), Some(e)) = (bound, error.clone()) {
                if e.rel_l2 > bound && opts.mode == QuantMode::Dynamic {
                    // Convolutions whose dynamic (per-tensor) activation
                    // quantization alone breaks the bound keep float
                    // activations, or stay float if even their weights do.
                    let convs: Vec<NodeId> = r
                        .quantized
                        .iter()
                        .copied()
                        .filter(|&n| {
                            self.model.graph.is_live_node(n)
                                && self.model.graph.node(n).op_type == "Conv"
                        })
                        .collect();
                    // Group testing: a group quantized alone (the rest
                    // float) within the bound clears its members; one over
                    // it is split, down to single convolutions.
                    let alone = |group: &[NodeId], weights_only: bool| {
                        let q = Quantize {
                            keep_nodes: r
                                .quantized
                                .iter()
                                .copied()
                                .filter(|o| !group.contains(o))
                                .collect(),
                            weight_only_nodes: if weights_only {
                                group.to_vec()
                            } else {
                                Vec::new()
                            },
                            ..base.clone()
                        };
                        meas.error_on(&trial(&q)?.0, 1)
                    };
                    let mut groups = vec![convs.clone()];
                    while let Some(group) = groups.pop() {
                        if group.is_empty() {
                            continue;
                        }
                        runs += 1;
                        let e1 = alone(&group, false)?;
                        if e1.rel_l2 <= bound {
                            continue;
                        }
                        if group.len() > 1 {
                            let (x, y) = group.split_at(group.len() / 2);
                            groups.push(y.to_vec());
                            groups.push(x.to_vec());
                            continue;
                        }
                        let n = group[0];
                        runs += 1;
                        let e2 = alone(&group, true)?;
                        let solo = SoloError {
                            node: node_label(&self.model, n),
                            error: e1.rel_l2,
                            weights_only_error: e2.rel_l2,
                        };
                        if e2.rel_l2 <= bound {
                            weight_only.push(solo);
                            config.weight_only_nodes.push(n);
                        } else {
                            solo_float.push(solo);
                            config.keep_nodes.push(n);
                        }
                    }
                    if !config.weight_only_nodes.is_empty() || !config.keep_nodes.is_empty() {
                        runs += 1;
                        error = Some(meas.error(&trial(&config)?.0)?);
                    }
                }
            }
            if let (Some(bound), Some(e)) = (bound, error.clone()) {
                if e.rel_l2 > bound {
                    // First the activations of the most sensitive nodes go
                    // back to float (their weights stay int8: no memory is
                    // lost), or in int4 their weights to int8, then, if that
                    // is not enough, whole nodes (the
                    // errors do not always fall as layers go back: they can
                    // cancel, so each stage searches on its own).
                    let stages: &[Back] = if opts.mode.activations() {
                        &[Back::Activations, Back::Whole]
                    } else if opts.mode == QuantMode::Int4Weights {
                        &[Back::Int8, Back::Whole]
                    } else {
                        &[Back::Whole]
                    };
                    let mut met = None;
                    let mut pre = config.clone();
                    for &stage in stages {
                        let (m, r) = trial(&pre)?;
                        // Weights stored int4 (others are int8 already: a
                        // reduction axis no block divides, or int8 kept).
                        let int4: std::collections::BTreeSet<&str> = r
                            .weights
                            .iter()
                            .filter(|(_, f)| f.contains("int4"))
                            .map(|(w, _)| w.as_str())
                            .collect();
                        let g = &self.model.graph;
                        let reads_int4 = |n: NodeId| {
                            g.is_live_node(n)
                                && g.node(n)
                                    .inputs()
                                    .iter()
                                    .flatten()
                                    .any(|&x| int4.contains(g.name(x)))
                        };
                        let ranked: Vec<NodeId> = meas
                            .sensitivity(&self.model, &m, &r.quantized)?
                            .into_iter()
                            .filter(|n| match stage {
                                Back::Activations => !pre.weight_only_nodes.contains(n),
                                Back::Int8 => !pre.int8_nodes.contains(n) && reads_int4(*n),
                                Back::Whole => true,
                            })
                            .collect();
                        let step = |k: usize| {
                            let mut q = pre.clone();
                            let top = ranked.iter().take(k).copied();
                            match stage {
                                Back::Activations => q.weight_only_nodes.extend(top),
                                Back::Int8 => q.int8_nodes.extend(top),
                                Back::Whole => q.keep_nodes.extend(top),
                            }
                            q
                        };
                        let found = fewest_measured(meas, ranked.len(), bound, &mut runs, |k| {
                            let q = step(k);
                            let m = trial(&q)?.0;
                            Ok((q, m))
                        })?;
                        match found {
                            Some((k, q, e2)) if stage != Back::Whole || k < ranked.len() => {
                                let what = match stage {
                                    Back::Activations => "activations float",
                                    Back::Int8 => "int8 weights",
                                    Back::Whole => "float",
                                };
                                fallback.extend(
                                    ranked.iter().take(k).map(|&n| {
                                        format!("{} ({what})", node_label(&self.model, n))
                                    }),
                                );
                                met = Some((q, e2));
                                break;
                            }
                            Some(_) => break,
                            None if stage != Back::Whole => {
                                // Every activation float is not enough with
                                // the convolutions kept float above. Every
                                // weight int8 with float activations (the
                                // least weight memory) may still fit:
                                // errors can cancel. (Without such
                                // convolutions it is the candidate just
                                // tried.)
                                if stage == Back::Activations && !config.keep_nodes.is_empty() {
                                    let all = Quantize {
                                        weight_only_nodes: quantized.clone(),
                                        ..base.clone()
                                    };
                                    runs += 1;
                                    let e2 = meas.error(&trial(&all)?.0)?;
                                    if e2.rel_l2 <= bound {
                                        weight_only.clear();
                                        solo_float.clear();
                                        fallback.push(
                                            "every quantized node (activations float)".to_string(),
                                        );
                                        met = Some((all, e2));
                                        break;
                                    }
                                }
                                // Whole nodes next, from there.
                                pre = step(ranked.len());
                            }
                            None => break,
                        }
                    }
                    match met {
                        Some((q, e2)) => {
                            config = q;
                            error = Some(e2);
                        }
                        None => {
                            return Err(self.err(Error::new(format!(
                                "--max-error {bound}: the {} model meets the bound only with every quantized layer back to float (relative L2 error {:.3e} with them quantized, on {label}); nothing was written",
                                opts.mode.name(),
                                e.rel_l2
                            ))));
                        }
                    }
                }
            }
            if let (Some(bound), None) = (bound, &error) {
                return Err(self.err(Error::new(format!(
                    "--max-error {bound}: the quantized model cannot be run to measure its error ({}); nothing was written (--max-error none quantizes without the bound)",
                    error_skipped.as_deref().unwrap_or("unknown")
                ))));
            }
            if let (Some(bound), Some(e)) = (bound, &error) {
                if e.rel_l2 > bound {
                    return Err(self.err(Error::new(format!(
                        "--max-error {bound}: the {} model is still at relative L2 error {:.3e} on {label} with {} nodes given back; nothing was written",
                        opts.mode.name(),
                        e.rel_l2,
                        fallback.len()
                    ))));
                }
            }
        }
        let measured_in = measurer.as_ref().map(|m| m.engine.clone());
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
            max_error: bound,
            bound_off: match (opts.measure, opts.max_error) {
                (false, _) => Some("the error is not measured (--no-measure)".into()),
                (true, None) => Some("--max-error none".into()),
                _ => None,
            },
            measured_in,
            calibrated_in,
            weight_only,
            solo_float,
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

    /// The calibration batches (or 4 seeded random ones at `dims`) and
    /// how to name them in reports.
    pub(crate) fn calibration_batches(
        &self,
        calibration: &Option<Calibration>,
        dims: &[(String, i64)],
    ) -> Result<(Vec<Vec<TractTensor>>, String)> {
        match calibration {
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
                let files = calibration_files(p)?;
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
                    .map(|seed| graphopt_tract::sample_inputs(&self.model, dims, 4, seed))
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

/// What the fallback gives back, one stage after another: float
/// activations (weights stay int8), int8 weights for int4 ones, whole
/// nodes float.
#[derive(Clone, Copy, PartialEq)]
enum Back {
    Activations,
    Int8,
    Whole,
}

/// The least `k` in `1..=len` whose candidate `make(k)` meets `bound`,
/// by doubling, then bisection (the error is assumed to fall as `k`
/// grows); `None` when even `len` does not.
fn fewest<Q>(
    len: usize,
    bound: f64,
    mut make: impl FnMut(usize) -> Result<(Q, QuantError)>,
) -> Result<Option<(usize, Q, QuantError)>> {
    let (mut lo, mut k) = (0, 1.min(len));
    let mut best = None;
    while k > 0 {
        let (q, e) = make(k)?;
        if e.rel_l2 <= bound {
            best = Some((k, q, e));
            break;
        }
        lo = k;
        if k == len {
            return Ok(None);
        }
        k = (k * 2).min(len);
    }
    let Some((mut hi, mut q, mut e)) = best else {
        return Ok(None);
    };
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let (q2, e2) = make(mid)?;
        if e2.rel_l2 <= bound {
            (hi, q, e) = (mid, q2, e2);
        } else {
            lo = mid;
        }
    }
    Ok(Some((hi, q, e)))
}

/// The least `k` whose candidate meets `bound`, as [`fewest`] searches it,
/// on the calibration batches only; then checked on every batch (the
/// jittered copies too), and searched again on every batch if they push
/// it over. `make(k)` gives the candidate and its model; each one made
/// counts in `runs`.
/// The npz files of `--calibration P`: P itself, or the `.npz` files of
/// the directory P in name order (none is an error).
pub(crate) fn calibration_files(p: &Path) -> Result<Vec<PathBuf>> {
    if !p.is_dir() {
        return Ok(vec![p.to_path_buf()]);
    }
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
    Ok(files)
}

pub(crate) fn fewest_measured<Q>(
    meas: &Measurer,
    len: usize,
    bound: f64,
    runs: &mut usize,
    mut make: impl FnMut(usize) -> Result<(Q, Model)>,
) -> Result<Option<(usize, Q, QuantError)>> {
    fn search<Q>(
        meas: &Measurer,
        len: usize,
        bound: f64,
        full: bool,
        runs: &mut usize,
        make: &mut impl FnMut(usize) -> Result<(Q, Model)>,
    ) -> Result<Option<(usize, Q, QuantError)>> {
        fewest(len, bound, |k| {
            *runs += 1;
            let (q, m) = make(k)?;
            let e = if full {
                meas.error(&m)?
            } else {
                meas.error_on(&m, meas.calibration)?
            };
            Ok((q, e))
        })
    }
    let Some((k, _, _)) = search(meas, len, bound, false, runs, &mut make)? else {
        return Ok(None);
    };
    *runs += 1;
    let (q, m) = make(k)?;
    let full = meas.error(&m)?;
    if full.rel_l2 <= bound {
        return Ok(Some((k, q, full)));
    }
    search(meas, len, bound, true, runs, &mut make)
}

pub(crate) fn node_label(m: &Model, n: NodeId) -> String {
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

pub(crate) fn f32_values(t: &TractTensor) -> Vec<f32> {
    t.cast_to::<f32>()
        .ok()
        .and_then(|c| {
            c.to_plain_array_view::<f32>()
                .ok()
                .map(|a| a.iter().copied().collect())
        })
        .unwrap_or_default()
}

/// Calibrated `(min, max)` by value name.
type Ranges = BTreeMap<String, (f32, f32)>;

/// Ranges of `names` over the batches, the float model run in graphopt's
/// runtime (tract where the runtime refuses), and where it ran (the
/// statistics are the `quantize` pass's [`RangeCollector`]).
fn calibrate(
    model: &Model,
    names: &[String],
    batches: &[Vec<TractTensor>],
    how: Calibrate,
) -> Result<(Ranges, Option<String>)> {
    if names.is_empty() {
        return Ok((BTreeMap::new(), None));
    }
    let n_out = model.graph.outputs.len();
    let mut runner = Reference::new(model, names, Engine::Runtime);
    let mut ranges = RangeCollector::new(names.len(), batches.len(), how);
    for b in batches {
        let outs = runner
            .run(b)
            .map_err(|e| Error::new(format!("calibration: {e}")))?;
        for (i, t) in outs.iter().skip(n_out).enumerate().take(names.len()) {
            ranges.add(i, &f32_values(t));
        }
    }
    Ok((ranges.finish(names), Some(engine_label(&runner))))
}

pub(crate) fn engine_label(r: &Reference) -> String {
    match r.engine() {
        (e, None) => e.name().to_string(),
        (e, Some(why)) => format!("{} ({}: {why})", e.name(), e.other().name()),
    }
}

/// Noisy copies of the first batch the error is measured on as well:
/// quantization error can be chaotic (a near-tie in a softmax, a dynamic
/// scale one bit off), so one input's error can sit under the bound while
/// the same model is over it in another engine (PP-OCRv4's recognizer:
/// 0.043 in tract, 0.043 to 0.077 in onnxruntime as the input moves by
/// 1e-6). The worst of the three bounds it better.
const JITTERED: usize = 2;

/// `t` with every float element that is not a whole number moved by one
/// part in 2^20 (float16 and bfloat16: 2^-10) up or down, a fixed pattern
/// per copy. Whole numbers (lengths, counts a model may cast to integers)
/// and other types are left as they are.
fn jitter(t: &TractTensor, copy: usize) -> TractTensor {
    let dt = t.datum_type();
    if !dt.is_float() {
        return t.clone();
    }
    let rel = if dt.size_of() <= 2 {
        1.0 / 1024.0
    } else {
        1.0 / 1048576.0
    };
    // In float64, which holds every float type's values exactly.
    let moved = || -> Option<TractTensor> {
        let mut f = t.cast_to::<f64>().ok()?.into_owned();
        let mut v = f.to_plain_array_view_mut::<f64>().ok()?;
        for (i, x) in v.iter_mut().enumerate() {
            if x.fract() == 0.0 || !x.is_finite() {
                continue;
            }
            let h = (i as u64 ^ (copy as u64) << 40).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let s = if h >> 63 == 0 { 1.0 } else { -1.0 };
            *x *= 1.0 + s * rel;
        }
        f.cast_to_dt(dt).ok().map(|c| c.into_owned())
    };
    moved().unwrap_or_else(|| t.clone())
}

/// Whether `b` is finite wherever `a` is (float outputs).
fn finite_where(a: &[TractTensor], b: &[TractTensor]) -> bool {
    a.iter().zip(b).all(|(x, y)| {
        !x.datum_type().is_float()
            || f32_values(x)
                .iter()
                .zip(f32_values(y))
                .all(|(p, q)| !p.is_finite() || q.is_finite())
    })
}

/// Runs the float model once per batch and compares candidates with it.
pub(crate) struct Measurer {
    /// The calibration batches, then the jittered copies.
    pub(crate) batches: Vec<Vec<TractTensor>>,
    /// How many of `batches` are calibration batches.
    pub(crate) calibration: usize,
    /// Why the jittered copies are not measured.
    pub(crate) jitter_dropped: Option<String>,
    pub(crate) reference: Vec<Vec<TractTensor>>,
    pub(crate) names: Vec<String>,
    /// Where the float model ran.
    pub(crate) engine: String,
}

impl Measurer {
    /// The measurer of a transform bounded by `bound`: `None` with a
    /// warning when the `what` model (`float`, `uncompressed`) cannot run
    /// and there is no bound, an error when there is one (`verb`:
    /// what `--max-error none` does instead).
    pub(crate) fn bounded(
        model: &Model,
        batches: &[Vec<TractTensor>],
        bound: Option<f64>,
        warnings: &mut Vec<String>,
        what: &str,
        verb: &str,
    ) -> Result<Option<Measurer>> {
        match Measurer::new(model, batches) {
            Ok(m) => {
                if let Some(why) = &m.jitter_dropped {
                    warnings.push(format!(
                        "the error is measured on the calibration batches only, not on jittered copies: {why}"
                    ));
                }
                Ok(Some(m))
            }
            Err(e) => match bound {
                None => {
                    warnings.push(format!("error not measured: {e}"));
                    Ok(None)
                }
                Some(b) => Err(Error::new(format!(
                    "--max-error {b:?}: the {what} model cannot be run to measure the error ({e}); nothing was written (--max-error none {verb} without the bound)"
                ))),
            },
        }
    }

    pub(crate) fn new(model: &Model, batches: &[Vec<TractTensor>]) -> Result<Measurer> {
        let mut batches: Vec<_> = batches.iter().take(8).cloned().collect();
        let calibration = batches.len();
        let mut runner = Reference::new(model, &[], MEASURE_FIRST);
        let mut reference = batches
            .iter()
            .map(|b| runner.run(b))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(Error::new)?;
        // The jittered copies, unless the float model fails on them or
        // gives a NaN or Inf where it gave a finite value: then the error
        // is measured on the calibration batches alone, with a warning.
        let mut jitter_dropped = None;
        if let Some(first) = batches.first().cloned() {
            let mut more = Vec::new();
            for c in 0..JITTERED {
                let b: Vec<TractTensor> = first.iter().map(|t| jitter(t, c)).collect();
                match runner.run(&b) {
                    Ok(r) if finite_where(&reference[0], &r) => more.push((b, r)),
                    Ok(_) => {
                        jitter_dropped = Some("the float model gives NaN or Inf on them".into());
                        break;
                    }
                    Err(e) => {
                        jitter_dropped = Some(format!("the float model fails on them ({e})"));
                        break;
                    }
                }
            }
            if jitter_dropped.is_none() {
                for (b, r) in more {
                    batches.push(b);
                    reference.push(r);
                }
            }
        }
        Ok(Measurer {
            batches,
            calibration,
            reference,
            names: output_names(model),
            engine: engine_label(&runner),
            jitter_dropped,
        })
    }

    pub(crate) fn error(&self, m: &Model) -> Result<QuantError> {
        self.error_on(m, self.batches.len())
    }

    /// The error on the first `n` batches (the jittered copies last).
    pub(crate) fn error_on(&self, m: &Model, n: usize) -> Result<QuantError> {
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
            batches: n.min(self.calibration),
            jittered: n.min(self.batches.len()).saturating_sub(self.calibration),
        };
        let mut runner = Reference::new(&m, &[], MEASURE_FIRST);
        for (b, r) in self.batches.iter().zip(&self.reference).take(n) {
            let got = runner
                .run(b)
                .map_err(|e| Error::new(format!("the quantized model: {e}")))?;
            for d in compare_outputs(&self.names, r, &got, &tol) {
                if let Some(err) = d.error {
                    return Err(Error::new(format!("output '{}': {err}", d.name)));
                }
                if d.shape.is_empty() && d.elements == 0 {
                    continue;
                }
                // A NaN or Inf where the float model has a finite value is
                // an infinite error: over any bound.
                let rel = if d.rel_l2.is_nan() {
                    f64::INFINITY
                } else {
                    d.rel_l2
                };
                e.rel_l2 = e.rel_l2.max(rel);
                e.max_abs = e.max_abs.max(d.max_abs);
                let o = e.outputs.entry(d.name).or_insert(0.0);
                *o = o.max(rel);
            }
        }
        Ok(e)
    }

    /// Quantized main-graph nodes, most sensitive first: the relative L2
    /// error a node's output gains over the worst of its inputs, in the
    /// quantized model against the float one (first batch).
    pub(crate) fn sensitivity(
        &self,
        float: &Model,
        q: &Model,
        nodes: &[NodeId],
    ) -> Result<Vec<NodeId>> {
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
        let (fr, _) = run_once(float, &names, b, MEASURE_FIRST).map_err(Error::new)?;
        let (qr, _) = run_once(&qd, &names, b, MEASURE_FIRST).map_err(Error::new)?;
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
        let outs = compare_outputs(&self.names, &self.reference[0], &qr[..n_out], &tol);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Dynamic quantization spelled in float ops (how its error is
    /// measured) gives an all-zero input zeros in both engines, as the
    /// kernels do: not 0 / 0, a NaN that made a bounded quantization of a
    /// TTS model measure an infinite error in graphopt's runtime.
    #[test]
    fn emulated_dynamic_quantization_of_zeros_is_zeros() {
        let m = graphopt_text::parse_model(
            r#"<ir_version: 8, opset_import: ["" : 13]>
            g (float[2,3] x) => (float[2,3] y) {
              xq, xs, xz = DynamicQuantizeLinear (x)
              y = DequantizeLinear (xq, xs, xz)
            }"#,
        )
        .unwrap();
        let m = dequantize_constants(&m).unwrap();
        assert!(m
            .graph
            .nodes()
            .all(|n| m.graph.node(n).op_type != "DynamicQuantizeLinear"));
        for engine in [Engine::Runtime, Engine::Tract] {
            for x in [[0f32; 6], [0.5, -1.0, 2.0, 0.0, 0.25, -0.75]] {
                let t = TractTensor::from_shape(&[2, 3], &x).unwrap();
                let (y, ran) = run_once(&m, &[], &[t], engine).unwrap();
                assert_eq!(ran, engine);
                let y = f32_values(&y[0]);
                assert_eq!(y.len(), 6);
                for (a, b) in x.iter().zip(&y) {
                    // Within half a step of 3 / 255.
                    assert!(
                        (a - b).abs() <= 1.5 / 255.0 + 1e-6,
                        "{engine:?} {x:?} -> {y:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn jitter_moves_floats_by_a_millionth_and_nothing_else() {
        let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.37 - 5.0).collect();
        let t = TractTensor::from_shape(&[8, 8], &x).unwrap();
        let (a, b) = (jitter(&t, 0), jitter(&t, 1));
        let (va, vb) = (f32_values(&a), f32_values(&b));
        let mut moved = 0;
        for ((x, ya), yb) in x.iter().zip(&va).zip(&vb) {
            for y in [ya, yb] {
                // One part in 2^20, and half an f32 ulp of rounding.
                assert!(
                    (y - x).abs() <= x.abs() * (1.0 / 1048576.0 + 1.0 / 8388608.0),
                    "{x} {y}"
                );
                moved += (y != x) as usize;
            }
        }
        // Nearly every nonzero element moves, and the two copies differ.
        assert!(moved >= 2 * 60, "{moved}");
        assert!(va.iter().zip(&vb).filter(|(p, q)| p != q).count() > 20);
        // The same pattern every time (the output is deterministic).
        assert_eq!(f32_values(&jitter(&t, 0)), va);
        // Integers (token ids), and whole numbers in floats (lengths a
        // model may cast), are left alone.
        let ids = TractTensor::from_shape(&[4], &[1i64, 2, 3, 4]).unwrap();
        assert_eq!(jitter(&ids, 0), ids);
        let whole = TractTensor::from_shape(&[3], &[3f32, 0.0, -16000.0]).unwrap();
        assert_eq!(jitter(&whole, 1), whole);
        // float64 moves in float64.
        let x64 = TractTensor::from_shape(&[2], &[0.1f64, 1e300]).unwrap();
        let j = jitter(&x64, 0);
        let v = j.to_plain_array_view::<f64>().unwrap();
        assert!(v.iter().all(|y| y.is_finite()));
        assert!((v[0] - 0.1).abs() > 0.0 && (v[0] - 0.1).abs() <= 0.1 / 1048576.0 * 1.01);
    }
}
