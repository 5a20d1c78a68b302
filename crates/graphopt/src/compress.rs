//! [`Session::compress`]: weight compression through the `compress` pass
//! (k-means palettes, low-rank factors, shared weights), with the error
//! against the uncompressed model measured on the calibration inputs and
//! bounded (`max_error`, 5% relative L2 by default): past the bound, the
//! layers whose compression moves the outputs most are left as they were,
//! fewest first, until it holds, or the compression is refused.
//!
//! `lowrank` with calibration inputs is activation-aware: the inputs of
//! every MatMul/Gemm it may factor are collected (graphopt's runtime, tract
//! where it lacks a kernel) into `XᵀX` statistics the pass whitens with.
//! Without calibration it is plain SVD (random inputs say nothing about
//! which directions matter).
//!
//! The error is measured as `quantize` measures it (the same measurer:
//! tract first, jittered copies of the first batch), on the compressed
//! model as it will be written (graphopt's runtime where tract cannot load
//! it: uint4 indices). That measured model is the one the session takes
//! when no layer had to go back: the compression runs once, not twice.

use crate::error::{Error, Result};
use crate::optimize::PipelineOptions;
use crate::precision::{memory, MemoryFigures};
use crate::quantize::{
    f32_values, fewest_measured, node_label, Calibration, Measurer, QuantError, DEFAULT_MAX_ERROR,
};
use crate::reference::{Engine, Reference};
use crate::session::Session;
use crate::util::Capture;
use graphopt_ir::Model;
use graphopt_passes::compress::{Compress, CompressReport as PassReport, Gram, Method};
use graphopt_passes::Pass;
use graphopt_plan::DimValues;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

pub use graphopt_passes::compress::{Method as CompressMethod, Rank as CompressRank};

/// What [`Session::compress`] does.
#[derive(Clone, Debug)]
pub struct CompressOptions {
    pub method: Method,
    /// Calibration batches for the error and for activation-aware
    /// `lowrank`. `None`: seeded random inputs for the error (a warning),
    /// plain SVD.
    pub calibration: Option<Calibration>,
    /// Symbolic dims of the random inputs (others 4).
    pub dims: Vec<(String, i64)>,
    /// Op types or node names whose weights stay as they are.
    pub exclude: Vec<String>,
    /// Bound on every output's relative L2 error (default
    /// [`DEFAULT_MAX_ERROR`]); `None`: measured, not bounded.
    pub max_error: Option<f64>,
    /// Weights with fewer elements stay as they are.
    pub min_weight_elems: u64,
    /// Measure the error (off turns the bound off too).
    pub measure: bool,
    /// Plan memory before and after at these dims (`None`: no plans).
    pub memory: Option<DimValues>,
    pub pipeline: PipelineOptions,
}

impl CompressOptions {
    pub fn new(method: Method) -> CompressOptions {
        CompressOptions {
            method,
            calibration: None,
            dims: Vec::new(),
            exclude: Vec::new(),
            max_error: Some(DEFAULT_MAX_ERROR),
            min_weight_elems: Compress.min_weight_elems,
            measure: true,
            memory: None,
            pipeline: PipelineOptions::default(),
        }
    }

    /// The method as users spell it (`cluster:4`, `lowrank:0.9`,
    /// `share`); `share`'s tolerance defaults to the error bound.
    pub fn parse(spec: &str, max_error: Option<f64>) -> Result<CompressOptions> {
        let method = Method::parse(spec, max_error.unwrap_or(DEFAULT_MAX_ERROR))
            .map_err(|e| Error::new(e.0))?;
        Ok(CompressOptions {
            max_error,
            ..CompressOptions::new(method)
        })
    }

    pub fn validate(&self) -> Result<()> {
        if let Some(e) = self.max_error {
            if !(e.is_finite() && e > 0.0) {
                return Err(Error::new(format!(
                    "--max-error {e}: expected a positive number"
                )));
            }
        }
        crate::validate::dims(&self.dims)
    }
}

/// One weight compressed.
#[derive(Clone, Debug, Serialize)]
pub struct CompressedLayer {
    pub weight: String,
    pub nodes: Vec<String>,
    pub op: String,
    /// `cluster 4-bit, 16 centroids, per tensor, uint4`, `rank 64 of 768, ...`.
    pub method: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Relative L2 error of the weight (`lowrank` with calibration: of the
    /// layer's output on the calibration inputs; `share`: against the
    /// weight it now reads).
    pub error: f64,
}

/// What [`Session::compress`] did.
#[derive(Clone, Debug, Serialize)]
pub struct CompressReport {
    pub method: String,
    pub calibration: String,
    /// Whether `lowrank` whitened with calibration statistics.
    pub activation_aware: bool,
    pub weights_bytes_before: u64,
    pub weights_bytes_after: u64,
    pub weights_ratio: f64,
    pub layers: Vec<CompressedLayer>,
    /// Weights left as they were, and why.
    pub kept: Vec<(String, String)>,
    /// End-to-end error against the uncompressed model.
    pub error: Option<QuantError>,
    pub error_skipped: Option<String>,
    /// The bound that held (`None`: off, and `bound_off` says why).
    pub max_error: Option<f64>,
    pub bound_off: Option<String>,
    pub measured_in: Option<String>,
    /// Nodes whose weights were left uncompressed to meet the bound, most
    /// sensitive first.
    pub fallback: Vec<String>,
    /// Compressions tried.
    pub runs: usize,
    pub opset_before: Option<i64>,
    pub opset_after: Option<i64>,
    pub memory_before: Option<MemoryFigures>,
    pub memory_after: Option<MemoryFigures>,
    pub time_ms: f64,
    pub warnings: Vec<String>,
}

impl Session {
    /// Compresses the model's weights (see the module doc). Whole or not at
    /// all: an error leaves the session unchanged.
    pub fn compress(&mut self, opts: &CompressOptions) -> Result<CompressReport> {
        self.transact(|s| s.compress_step(opts))
    }

    pub(crate) fn compress_step(&mut self, opts: &CompressOptions) -> Result<CompressReport> {
        opts.validate()?;
        let t0 = Instant::now();
        let mut warnings = Vec::new();
        let mut base = Compress {
            method: opts.method.clone(),
            exclude: opts
                .exclude
                .iter()
                .map(|e| e.trim().to_string())
                .filter(|e| !e.is_empty())
                .collect(),
            min_weight_elems: opts.min_weight_elems,
            ..Compress
        };
        base.validate().map_err(|e| self.err(Error::new(e.0)))?;
        let bound = if opts.measure { opts.max_error } else { None };
        let lowrank = matches!(opts.method, Method::LowRank(_));
        let wants_grams = lowrank && opts.calibration.is_some();
        let (batches, label) = if opts.measure || wants_grams {
            let (b, l) = self.calibration_batches(&opts.calibration, &opts.dims)?;
            if opts.calibration.is_none() {
                warnings.push(format!(
                    "no --calibration: {l}; errors on random data say little about real inputs"
                ));
            }
            (b, l)
        } else {
            (Vec::new(), "none".to_string())
        };
        if wants_grams {
            let names = base.gram_inputs(&self.model);
            base.grams = grams(&self.model, &names, &batches)?;
        }
        let activation_aware = !base.grams.is_empty();
        let trial = |c: &Compress| -> Result<(Model, PassReport)> {
            let mut m = self.model.clone();
            let r = c.compress(&mut m).map_err(|e| Error::new(e.0))?;
            Ok((m, r))
        };
        let measurer = if opts.measure {
            Measurer::bounded(
                &self.model,
                &batches,
                bound,
                &mut warnings,
                "uncompressed",
                "compresses",
            )
            .map_err(|e| self.err(e))?
        } else {
            None
        };
        let mut config = base.clone();
        let mut runs = 1;
        let mut fallback = Vec::new();
        let mut error = None;
        let mut error_skipped = None;
        // The measured compression of `config`, kept for the session.
        let mut measured: Option<(Model, PassReport)> = None;
        if let Some(meas) = &measurer {
            let (m, r) = trial(&config)?;
            match meas.error(&m) {
                Ok(e) => error = Some(e),
                Err(e) => error_skipped = Some(e.message().to_string()),
            }
            if let (Some(bound), Some(e)) = (bound, error.clone()) {
                if e.rel_l2 > bound {
                    let ranked = meas.sensitivity(&self.model, &m, &r.compressed)?;
                    let step = |k: usize| Compress {
                        keep_nodes: ranked.iter().take(k).copied().collect(),
                        ..config.clone()
                    };
                    let found = fewest_measured(meas, ranked.len(), bound, &mut runs, |k| {
                        let c = step(k);
                        let m = trial(&c)?.0;
                        Ok((c, m))
                    })?;
                    match found {
                        Some((k, c, e2)) if k < ranked.len() => {
                            fallback
                                .extend(ranked.iter().take(k).map(|&n| node_label(&self.model, n)));
                            config = c;
                            error = Some(e2);
                        }
                        _ => {
                            return Err(self.err(Error::new(format!(
                                "--max-error {bound:?}: {} meets the bound only with every compressed layer left as it was (relative L2 error {:.3e} with them compressed, on {label}); nothing was written",
                                opts.method.name(),
                                e.rel_l2
                            ))));
                        }
                    }
                }
            }
            if let (Some(bound), None) = (bound, &error) {
                return Err(self.err(Error::new(format!(
                    "--max-error {bound:?}: the compressed model cannot be run to measure its error ({}); nothing was written (--max-error none compresses without the bound)",
                    error_skipped.as_deref().unwrap_or("unknown")
                ))));
            }
            if fallback.is_empty() {
                measured = Some((m, r));
            }
        }
        let measured_in = measurer.as_ref().map(|m| m.engine.clone());
        let mem = |m: &Model| opts.memory.as_ref().map(|d| memory(m, d));
        let memory_before = mem(&self.model);
        let captured = Rc::new(RefCell::new(None));
        let measured = RefCell::new(measured);
        let pass: Vec<Box<dyn Pass>> = vec![Box::new(Capture {
            name: "compress",
            // The warnings are the report's (printed once, from there).
            run: Box::new(move |model| {
                let r = match measured.borrow_mut().take() {
                    Some((m, r)) => {
                        *model = m;
                        r
                    }
                    None => config.compress(model)?,
                };
                let stats = r.stats();
                Ok((r, stats))
            }),
            out: captured.clone(),
        })];
        self.run_passes(&pass, 1, &opts.pipeline)?;
        let r = captured.borrow_mut().take().unwrap_or_default();
        warnings.extend(r.warnings.iter().cloned());
        Ok(CompressReport {
            method: opts.method.name(),
            calibration: label,
            activation_aware,
            weights_bytes_before: r.weight_bytes_before,
            weights_bytes_after: r.weight_bytes_after,
            weights_ratio: if r.weight_bytes_before == 0 {
                1.0
            } else {
                r.weight_bytes_after as f64 / r.weight_bytes_before as f64
            },
            layers: r
                .layers
                .iter()
                .map(|l| CompressedLayer {
                    weight: l.weight.clone(),
                    nodes: l.nodes.clone(),
                    op: l.op.clone(),
                    method: l.detail.clone(),
                    bytes_before: l.bytes_before,
                    bytes_after: l.bytes_after,
                    error: l.weight_error,
                })
                .collect(),
            kept: r.kept.clone(),
            error,
            error_skipped,
            max_error: bound,
            bound_off: match (opts.measure, opts.max_error) {
                (false, _) => Some("the error is not measured (--no-measure)".into()),
                (true, None) => Some("--max-error none".into()),
                _ => None,
            },
            measured_in,
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
}

/// `XᵀX` of each named activation over the batches (the float model in
/// graphopt's runtime, tract where the runtime refuses), by name. An
/// activation whose values cannot be had is left out (its layer is
/// factored by plain SVD).
fn grams(
    model: &Model,
    names: &[String],
    batches: &[Vec<graphopt_tract::TractTensor>],
) -> Result<BTreeMap<String, Gram>> {
    let mut out: BTreeMap<String, Gram> = BTreeMap::new();
    if names.is_empty() {
        return Ok(out);
    }
    let n_out = model.graph.outputs.len();
    let mut runner = Reference::new(model, names, Engine::Runtime);
    for b in batches {
        let outs = runner
            .run(b)
            .map_err(|e| Error::new(format!("calibration statistics: {e}")))?;
        for (name, t) in names.iter().zip(outs.iter().skip(n_out)) {
            let Some(&dim) = t.shape().last() else {
                continue;
            };
            let g = out.entry(name.clone()).or_insert_with(|| Gram::new(dim));
            if g.dim == dim {
                g.add(&f32_values(t))
                    .map_err(|e| Error::new(format!("calibration statistics of '{name}': {e}")))?;
            }
        }
    }
    Ok(out)
}
