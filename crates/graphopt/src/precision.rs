//! [`Session::lower_precision`]: fp16/bf16 lowering through the pass
//! manager, validated against the fp32 model in tract, with bisection to
//! the nodes that break the tolerance.
//!
//! Validation is honest: a result that ends over tolerance is an error and
//! leaves the session unchanged, unless [`ValidateOptions::force`]; a
//! validation that cannot run is an error, unless
//! [`ValidateOptions::best_effort`].

use crate::check::{compare_outputs, output_names, run_in_tract, OutputDiff, Scale, Tolerance};
use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::optimize::PipelineOptions;
use crate::session::Session;
use crate::util::Capture;
use graphopt_ir::{DType, Model, NodeId};
use graphopt_passes::lower_precision::{LowerPrecision, LowerReport, Precision};
use graphopt_passes::Pass;
use graphopt_plan::{DimValues, PlanOptions};
use graphopt_tract::TractTensor;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// What [`Session::lower_precision`] does.
#[derive(Clone, Debug)]
pub struct PrecisionOptions {
    pub precision: Precision,
    /// Op types or node names to keep fp32 besides the default keep-list;
    /// `-OP` takes an op off the default list (e.g. `-Softmax`).
    pub keep_fp32: Vec<String>,
    /// Graph inputs and outputs keep their types (default true).
    pub keep_io_types: bool,
    /// Lower ops even where onnxruntime's CPU provider has no low-precision
    /// kernel (for GPU runtimes).
    pub any_runtime: bool,
    /// Check against the fp32 model and keep the nodes that break the
    /// tolerance fp32.
    pub validate: Option<ValidateOptions>,
    /// Plan memory before and after at these dims and input shapes
    /// (`None`: no plans).
    pub memory: Option<DimValues>,
    /// fp16: run the fp32 model once in tract on these inputs and keep
    /// fp32 the nodes around activations fp16 cannot hold (see
    /// [`RANGE_HIGH`], [`RANGE_LOW`]); `None` skips the check.
    pub range_check: Option<Inputs>,
    pub pipeline: PipelineOptions,
}

/// fp16 range check: an activation whose largest magnitude reaches this
/// (1/8 of fp16's largest finite value, for inputs larger than the sample)
/// is kept fp32, with its producer and readers.
pub const RANGE_HIGH: f64 = 65504.0 / 8.0;

/// fp16 range check: a nonzero activation whose root mean square is below
/// this is kept fp32 too: most of its values would be fp16 subnormals
/// (below 6.1e-5, with at most 10 bits down to 6e-8) or flushed to zero. A
/// network whose activations decay layer by layer (randomly initialised
/// MobileNetV2 reaches 1e-9) would otherwise compute zeros.
pub const RANGE_LOW: f64 = 1e-5;

impl PrecisionOptions {
    /// `precision` with the defaults: default keep-list, io types kept,
    /// onnxruntime-CPU kernels only, no validation.
    pub fn new(precision: Precision) -> PrecisionOptions {
        PrecisionOptions {
            precision,
            keep_fp32: Vec::new(),
            keep_io_types: true,
            any_runtime: false,
            validate: None,
            memory: None,
            range_check: Some(Inputs::default()),
            pipeline: PipelineOptions::default(),
        }
    }
}

/// `strict` or `best-effort` (`--validate[=MODE]`): whether a validation
/// that cannot run is a note rather than an error.
pub fn parse_validate_mode(mode: &str) -> Result<bool> {
    match mode {
        "strict" => Ok(false),
        "best-effort" | "best_effort" => Ok(true),
        other => Err(Error::new(format!(
            "validate={other}: expected strict or best-effort"
        ))),
    }
}

/// How to validate a lowering.
#[derive(Clone, Debug)]
pub struct ValidateOptions {
    pub inputs: Inputs,
    /// Per output, every element within `atol + rtol * max|reference|`.
    pub rtol: f64,
    pub atol: f64,
    /// A validation that cannot run (tract cannot run the model, bf16) is a
    /// note in the report instead of an error.
    pub best_effort: bool,
    /// Keep the lowering even when it ends over tolerance (the report says
    /// so); otherwise that is an error and the session is left unchanged.
    pub force: bool,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions {
            inputs: Inputs::default(),
            rtol: 1e-2,
            atol: 1e-3,
            best_effort: false,
            force: false,
        }
    }
}

/// One comparison with the fp32 reference.
#[derive(Clone, Debug, Serialize)]
pub struct ValidationCheck {
    pub ok: bool,
    /// Worst over outputs.
    pub max_abs: f64,
    pub rel_l2: f64,
    /// Why the candidate could not run or failed besides the outputs.
    pub error: Option<String>,
    pub outputs: Vec<OutputDiff>,
}

impl ValidationCheck {
    pub fn describe(&self) -> String {
        match &self.error {
            Some(e) => e.clone(),
            None => format!("max abs {:.3e}, rel L2 {:.3e}", self.max_abs, self.rel_l2),
        }
    }
}

/// What validation found.
#[derive(Clone, Debug, Serialize)]
pub struct Validation {
    pub inputs: String,
    pub rtol: f64,
    pub atol: f64,
    /// The final lowering is within tolerance.
    pub ok: bool,
    pub max_abs: f64,
    pub rel_l2: f64,
    pub first: ValidationCheck,
    #[serde(rename = "final")]
    pub last: ValidationCheck,
    /// Nodes (name, or `Op#id` when unnamed) and weights kept fp32.
    pub kept_nodes: Vec<String>,
    pub kept_weights: Vec<String>,
    /// Lowerings run.
    pub runs: usize,
    pub note: Option<String>,
}

/// Weights, activation lower bound and arena from the planner.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryFigures {
    pub dims: String,
    pub weights_bytes: u64,
    pub lower_bound_bytes: u64,
    pub arena_bytes: u64,
    /// Values of unknown size, left out of the arena (dynamic).
    pub dynamic_values: usize,
    /// Why the model could not be planned.
    pub error: Option<String>,
}

/// A constant clamped to fp16's range.
#[derive(Clone, Debug, Serialize)]
pub struct Clamped {
    pub name: String,
    /// Values clamped to ±65504.
    pub values: u64,
}

/// A product against a signal-processing basis kept fp32.
#[derive(Clone, Debug, Serialize)]
pub struct KeptSensitive {
    pub node: String,
    pub gain: f64,
}

/// A weight kept fp32, and why.
#[derive(Clone, Debug, Serialize)]
pub struct KeptWeight {
    pub name: String,
    pub why: String,
}

/// An activation outside fp16's comfortable range in the fp32 model.
#[derive(Clone, Debug, Serialize)]
pub struct OutOfRange {
    pub value: String,
    pub max_abs: f64,
    pub rms: f64,
}

/// What the fp16 range check found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RangeCheck {
    pub inputs: String,
    /// Activations beyond [`RANGE_HIGH`] or below [`RANGE_LOW`], in program
    /// order.
    pub out_of_range: Vec<OutOfRange>,
    /// Nodes kept fp32 for them (name, or `Op#id` when unnamed).
    pub kept_nodes: Vec<String>,
    /// Why the check did not run (the model still lowers).
    pub skipped: Option<String>,
}

/// What [`Session::lower_precision`] did.
#[derive(Clone, Debug, Serialize)]
pub struct PrecisionReport {
    pub mode: &'static str,
    pub nodes_lowered: u64,
    pub nodes_total: usize,
    pub weights_bytes_before: u64,
    pub weights_bytes_after: u64,
    pub weights_ratio: f64,
    pub casts_before: u64,
    pub casts_after: u64,
    /// Constants clamped to fp16's range.
    pub clamped: Vec<Clamped>,
    /// Ops kept fp32 for lack of a low-precision kernel in onnxruntime's CPU
    /// provider.
    pub kept_no_kernel: Vec<String>,
    /// Products against a constant signal-processing basis (DFT/STFT-like)
    /// kept fp32.
    pub kept_sensitive: Vec<KeptSensitive>,
    /// Weights kept fp32, and why (quantization parameter, custom-op input,
    /// beyond fp16's range, rounding, arithmetic on constants).
    pub kept_fp32_weights: Vec<KeptWeight>,
    /// Matrix products kept fp32 because their result reaches a Log through
    /// clamps and shifts only (a log-mel spectrogram's mel MatMul).
    pub kept_before_log: Vec<String>,
    /// Nodes (name or op type) kept fp32 because they compute a constant at
    /// run time from constants alone (a kernel the folder found too large to
    /// store), or feed such a computation.
    pub kept_constant_compute: Vec<String>,
    pub warnings: Vec<String>,
    pub validation: Option<Validation>,
    /// fp16 only: activations measured in the fp32 model that fp16 cannot
    /// hold, and the nodes kept fp32 for them.
    pub range_check: Option<RangeCheck>,
    /// Why validation did not run (only with `best_effort`).
    pub validation_skipped: Option<String>,
    pub memory_before: Option<MemoryFigures>,
    pub memory_after: Option<MemoryFigures>,
    /// `stop_after` was reached before the lowering ran.
    pub stopped_early: bool,
}

impl Session {
    /// Lowers the model to fp16/bf16 compute (or fp16 storage), through the
    /// pass manager, validating and falling back to fp32 where asked.
    /// Whole or not at all: on an error the session is as it was.
    pub fn lower_precision(&mut self, opts: &PrecisionOptions) -> Result<PrecisionReport> {
        opts.validate(&self.model).map_err(|e| self.err(e))?;
        self.transact(|s| s.lower_precision_step(opts))
    }

    pub(crate) fn lower_precision_step(
        &mut self,
        opts: &PrecisionOptions,
    ) -> Result<PrecisionReport> {
        let mut base = LowerPrecision {
            precision: opts.precision,
            keep_io_types: opts.keep_io_types,
            ort_cpu: !opts.any_runtime,
            ..LowerPrecision
        };
        for k in opts
            .keep_fp32
            .iter()
            .map(|k| k.trim())
            .filter(|k| !k.is_empty())
        {
            match k.strip_prefix('-') {
                Some(op) => base.allow_low.push(op.to_string()),
                None => base.keep_fp32.push(k.trim_start_matches('+').to_string()),
            }
        }
        let nodes_total = self.model.graph.node_count_deep();
        let range_check = match (&opts.range_check, opts.precision) {
            (Some(inputs), Precision::F16) => {
                let r = range_check(&self.model, inputs);
                base.keep_nodes.extend(r.1.iter().copied());
                Some(r.0)
            }
            _ => None,
        };
        let (mut config, mut validation, mut skipped) = (base.clone(), None, None);
        if let Some(v) = &opts.validate {
            match self.validate_lowering(&base, v) {
                Ok((c, val)) => {
                    if !val.ok && !v.force {
                        return Err(self.err(Error::tolerance(format!(
                            "--validate: the {} model is NOT within tolerance (rtol {}, atol {}) on {} inputs: {}{}; nothing was lowered (--force keeps it anyway)",
                            opts.precision.name(),
                            v.rtol,
                            v.atol,
                            val.inputs,
                            val.last.describe(),
                            val.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
                        ))));
                    }
                    config = c;
                    validation = Some(val);
                }
                Err(e) if v.best_effort => skipped = Some(e.message().to_string()),
                Err(e) => {
                    return Err(self.err(Error::new(format!(
                        "--validate cannot run: {e} (--validate=best-effort lowers without it)"
                    ))))
                }
            }
        }
        let memory = |m: &Model| opts.memory.as_ref().map(|d| memory(m, d));
        let memory_before = memory(&self.model);
        let captured = Rc::new(RefCell::new(None));
        let pass: Vec<Box<dyn Pass>> = vec![Box::new(Capture {
            name: "lower_precision",
            run: Box::new(move |model| {
                let r = config.lower(model)?;
                let mut stats = r.stats();
                stats.warnings = r.warnings.clone();
                Ok((r, stats))
            }),
            out: captured.clone(),
        })];
        let stopped_early = self.run_passes(&pass, 1, &opts.pipeline)?;
        let r = captured.borrow_mut().take().unwrap_or_default();
        Ok(PrecisionReport {
            mode: opts.precision.name(),
            nodes_lowered: r.lowered_total,
            nodes_total,
            weights_bytes_before: r.weight_bytes_before,
            weights_bytes_after: r.weight_bytes_after,
            weights_ratio: if r.weight_bytes_before == 0 {
                1.0
            } else {
                r.weight_bytes_after as f64 / r.weight_bytes_before as f64
            },
            casts_before: r.casts_before,
            casts_after: r.casts_after,
            clamped: r
                .clamped
                .iter()
                .map(|(name, values)| Clamped {
                    name: name.clone(),
                    values: *values,
                })
                .collect(),
            kept_no_kernel: r.kept_no_kernel.iter().cloned().collect(),
            kept_sensitive: r
                .kept_sensitive
                .iter()
                .map(|(node, gain)| KeptSensitive {
                    node: node.clone(),
                    gain: *gain,
                })
                .collect(),
            kept_fp32_weights: r
                .kept_fp32_weights
                .iter()
                .map(|(name, why)| KeptWeight {
                    name: name.clone(),
                    why: why.clone(),
                })
                .collect(),
            kept_before_log: r.kept_before_log.clone(),
            kept_constant_compute: r.kept_constant_compute.clone(),
            warnings: r.warnings.clone(),
            validation,
            range_check,
            validation_skipped: skipped,
            memory_before,
            memory_after: memory(&self.model),
            stopped_early,
        })
    }

    /// Finds the configuration whose lowering passes validation (or the
    /// best one found), without changing the session.
    fn validate_lowering(
        &self,
        base: &LowerPrecision,
        v: &ValidateOptions,
    ) -> Result<(LowerPrecision, Validation)> {
        if base.precision == Precision::BF16 {
            return Err(Error::new(
                "tract, the in-Rust reference, has no bfloat16; validate bf16 output in onnxruntime (tests-py/precision_models.py)",
            ));
        }
        let (inputs, label) = v.inputs.materialize(&self.model)?;
        let validator = Validator::new(&self.model, inputs, v.rtol, v.atol)?;
        let lower = |lp: &LowerPrecision| -> Result<(Model, LowerReport)> {
            let mut m = self.model.clone();
            let r = lp.lower(&mut m)?;
            graphopt_ir::verify::verify_model(&m)
                .map_err(|e| Error::verify(format!("after lower_precision: IR is invalid: {e}")))?;
            Ok((m, r))
        };
        validator.fallback(base, &lower, label)
    }
}

/// Weights beyond which the range check is skipped: the check holds about
/// 2.5 more copies of the weights (the typed copy, its encoding, tract's
/// model) and every activation at once. BERT-base (440 MB): +1.1 GB peak
/// RSS and +2.6 s (release, 2 cores).
const RANGE_CHECK_MAX_WEIGHTS: u64 = 1 << 30;

/// Runs the fp32 `model` once in tract with every main-graph float
/// intermediate as an output, and returns what it found with the nodes to
/// keep fp32: the producer and the readers of each activation beyond
/// [`RANGE_HIGH`] or below [`RANGE_LOW`]. A model tract cannot run is
/// skipped, with the reason.
fn range_check(model: &Model, inputs: &Inputs) -> (RangeCheck, Vec<NodeId>) {
    let skipped = |why: String| {
        (
            RangeCheck {
                skipped: Some(why),
                ..Default::default()
            },
            Vec::new(),
        )
    };
    if model.graph.initializer_bytes_deep() > RANGE_CHECK_MAX_WEIGHTS {
        return skipped("weights over 1 GiB (use --validate to check a lowering)".into());
    }
    let mut typed = model.clone();
    graphopt_ir::infer::infer_model(&mut typed, &Default::default());
    let (tensors, label) = match inputs.materialize(&typed) {
        Ok(x) => x,
        Err(e) => return skipped(format!("no inputs: {e}")),
    };
    let names = intermediates(&typed, DType::F32);
    // Low values present (a mixed model): tract needs the fp16 emulation;
    // else the typed copy runs as it is, every intermediate an output,
    // without another copy of the weights.
    let mixed = typed.graph.values().any(|v| {
        matches!(
            typed.graph.ty(v).and_then(|t| t.elem()),
            Some(DType::F16 | DType::BF16)
        )
    });
    let run = if mixed {
        run_in_tract(&typed, &names, &tensors)
    } else {
        for n in &names {
            if let Some(v) = typed.graph.value_by_name(n) {
                typed.graph.outputs.push(v);
            }
        }
        graphopt_tract::prepare_owned(typed).and_then(|b| graphopt_tract::run_bytes(&b, &tensors))
    };
    let outs = match run {
        Ok(o) => o,
        Err(e) => return skipped(format!("tract cannot run the fp32 model: {e:#}")),
    };
    // Node ids and names are the model's own (the typed copy is a clone).
    let g = &model.graph;
    let mut check = RangeCheck {
        inputs: label,
        ..Default::default()
    };
    let mut keep: Vec<NodeId> = Vec::new();
    // The graph outputs come first, then the intermediates.
    let output_names: Vec<String> = g.outputs.iter().map(|&v| g.name(v).to_string()).collect();
    let checked = output_names.iter().chain(names.iter());
    for (name, t) in checked.zip(outs.iter()) {
        let Some((max_abs, rms)) = magnitude(t) else {
            continue;
        };
        if !(max_abs >= RANGE_HIGH || (max_abs > 0.0 && rms < RANGE_LOW)) {
            continue;
        }
        let Some(v) = g.value_by_name(name) else {
            continue;
        };
        check.out_of_range.push(OutOfRange {
            value: name.clone(),
            max_abs,
            rms,
        });
        let producer = g.producer(v).map(|(n, _)| n);
        let readers = g.uses(v).iter().map(|u| u.node());
        for n in producer.into_iter().chain(readers) {
            if !keep.contains(&n) {
                keep.push(n);
            }
        }
    }
    keep.sort_by_key(|&n| g.position(n));
    let labels = node_names(model);
    check.kept_nodes = keep.iter().filter_map(|n| labels.get(n).cloned()).collect();
    (check, keep)
}

/// Largest magnitude and root mean square of a float tensor's finite
/// values (None for other types or no finite value).
fn magnitude(t: &TractTensor) -> Option<(f64, f64)> {
    if !t.datum_type().is_float() {
        return None;
    }
    let f = t.cast_to::<f64>().ok()?;
    let a = f.to_plain_array_view::<f64>().ok()?;
    let (mut max, mut sq, mut n) = (0f64, 0f64, 0u64);
    for &x in a.iter().filter(|x| x.is_finite()) {
        max = max.max(x.abs());
        sq += x * x;
        n += 1;
    }
    (n > 0).then(|| (max, (sq / n as f64).sqrt()))
}

/// Plans `model` at `dims` (other input dims 1); values whose size stays
/// unknown are dynamic, outside the arena, and counted.
pub(crate) fn memory(model: &Model, dims: &DimValues) -> MemoryFigures {
    let opts = PlanOptions {
        node_budget: 20_000,
        ..Default::default()
    };
    match graphopt_plan::plan_model(model, dims, &opts) {
        Ok(p) => MemoryFigures {
            dims: p
                .dims
                .iter()
                .map(|d| format!("{}={}", d.name, d.value))
                .collect::<Vec<_>>()
                .join(", "),
            weights_bytes: p.plan.weights_bytes,
            lower_bound_bytes: p.plan.lower_bound_bytes,
            arena_bytes: p.plan.arena_bytes,
            dynamic_values: p.plan.dynamic_values.len(),
            error: None,
        },
        Err(e) => MemoryFigures {
            error: Some(e.to_string()),
            ..Default::default()
        },
    }
}

/// Runs candidates against the fp32 reference in tract.
struct Validator {
    inputs: Vec<TractTensor>,
    reference: Vec<TractTensor>,
    names: Vec<String>,
    /// Main-graph float intermediates of the fp32 model, by name: whether
    /// each is finite everywhere. A candidate whose low intermediate
    /// overflows where the reference is finite fails, even if a runtime
    /// (tract fuses `Cast(MatMul)` into an fp32-output MatMul) hides it in
    /// the final outputs.
    finite: BTreeMap<String, bool>,
    tol: Tolerance,
}

/// One thing validation can keep fp32.
#[derive(Clone, Debug, PartialEq)]
enum Item {
    Node(NodeId),
    Weight(String),
}

type Lowering<'a> = dyn Fn(&LowerPrecision) -> Result<(Model, LowerReport)> + 'a;

impl Validator {
    fn new(model: &Model, inputs: Vec<TractTensor>, rtol: f64, atol: f64) -> Result<Validator> {
        let reference = run_in_tract(model, &[], &inputs)
            .map_err(|e| Error::runtime(format!("tract cannot run the fp32 model: {e:#}")))?;
        let names = intermediates(model, DType::F32);
        let finite = match run_in_tract(model, &names, &inputs) {
            Ok(outs) => names
                .into_iter()
                .zip(outs.into_iter().skip(model.graph.outputs.len()))
                .map(|(n, t)| (n, all_finite(&t)))
                .collect(),
            Err(_) => BTreeMap::new(),
        };
        Ok(Validator {
            inputs,
            reference,
            names: output_names(model),
            finite,
            tol: Tolerance {
                rtol,
                atol,
                scale: Scale::Tensor,
            },
        })
    }

    fn check(&self, m: &Model) -> ValidationCheck {
        let low: Vec<String> = [DType::F16, DType::BF16]
            .into_iter()
            .flat_map(|d| intermediates(m, d))
            .filter(|n| self.finite.get(n) == Some(&true))
            .collect();
        let n_out = m.graph.outputs.len();
        let got =
            run_in_tract(m, &low, &self.inputs).or_else(|_| run_in_tract(m, &[], &self.inputs));
        match got {
            Ok(got) => {
                let outputs = compare_outputs(
                    &self.names,
                    &self.reference,
                    &got[..n_out.min(got.len())],
                    &self.tol,
                );
                let mut c = ValidationCheck {
                    ok: outputs.len() == self.reference.len() && outputs.iter().all(|o| o.ok),
                    max_abs: outputs.iter().fold(0.0, |a, o| a.max(o.max_abs)),
                    rel_l2: outputs.iter().fold(0.0, |a, o| a.max(o.rel_l2)),
                    error: None,
                    outputs,
                };
                if got.len() > n_out {
                    if let Some(bad) = low.iter().zip(&got[n_out..]).find(|(_, t)| !all_finite(t)) {
                        c.ok = false;
                        c.error = Some(format!("'{}' overflows in low precision", bad.0));
                    }
                }
                c
            }
            Err(e) => ValidationCheck {
                ok: false,
                max_abs: f64::INFINITY,
                rel_l2: f64::INFINITY,
                error: Some(format!("does not run in tract: {e:#}").replace('\n', " ")),
                outputs: Vec::new(),
            },
        }
    }

    /// Checks the lowered model; while it is out of tolerance, finds by
    /// bisection the first node (or weight) whose lowering breaks the
    /// tolerance and keeps it fp32. Each search lowers only a prefix of the
    /// candidates (in program order), so it finds where the error first
    /// appears, the way `--stop-after` bisects a bad rewrite.
    fn fallback(
        &self,
        base: &LowerPrecision,
        run: &Lowering<'_>,
        label: String,
    ) -> Result<(LowerPrecision, Validation)> {
        const MAX_CULPRITS: usize = 24;
        let (mut m, mut r) = run(base)?;
        let first = self.check(&m);
        let mut last = first.clone();
        let mut runs = 1;
        let mut kept: Vec<Item> = Vec::new();
        let mut note = None;
        let config = |kept: &[Item]| {
            let mut lp = base.clone();
            for k in kept {
                match k {
                    Item::Node(n) => lp.keep_nodes.push(*n),
                    Item::Weight(w) => lp.keep_weights.push(w.clone()),
                }
            }
            lp
        };
        while !last.ok {
            let items: Vec<Item> = r
                .lowered
                .iter()
                .chain(&r.subgraph_hosts)
                .map(|&n| Item::Node(n))
                .chain(r.weights_lowered.iter().cloned().map(Item::Weight))
                .filter(|i| !kept.contains(i))
                .collect();
            if items.is_empty() {
                note = Some(
                    "nothing left to keep fp32; the error comes from fp32 differences alone".into(),
                );
                break;
            }
            if kept.len() >= MAX_CULPRITS {
                // Too many culprits to chase one by one: keep everything.
                let mut all = kept.clone();
                all.extend(items);
                (m, _) = run(&config(&all))?;
                last = self.check(&m);
                runs += 1;
                kept = all;
                note = Some(format!(
                    "more than {MAX_CULPRITS} nodes out of tolerance; kept every candidate fp32"
                ));
                break;
            }
            let with_prefix = |k: usize| {
                let mut ks = kept.clone();
                ks.extend(items[k..].iter().cloned());
                config(&ks)
            };
            // Invariant: lowering items[..lo] passes, items[..hi] fails.
            let (mut lo, mut hi) = (0usize, items.len());
            if runs == 1 {
                let (m0, _) = run(&with_prefix(0))?;
                runs += 1;
                if !self.check(&m0).ok {
                    note = Some("out of tolerance even with every candidate kept fp32".into());
                    break;
                }
            }
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                let (mm, _) = run(&with_prefix(mid))?;
                runs += 1;
                if self.check(&mm).ok {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            kept.push(items[hi - 1].clone());
            (m, r) = run(&config(&kept))?;
            last = self.check(&m);
            runs += 1;
        }
        let names = node_names(&m);
        let kept_nodes = kept
            .iter()
            .filter_map(|k| match k {
                Item::Node(n) => Some(
                    names
                        .get(n)
                        .cloned()
                        .unwrap_or_else(|| format!("#{}", n.index())),
                ),
                Item::Weight(_) => None,
            })
            .collect();
        let kept_weights = kept
            .iter()
            .filter_map(|k| match k {
                Item::Weight(w) => Some(w.clone()),
                Item::Node(_) => None,
            })
            .collect();
        Ok((
            config(&kept),
            Validation {
                inputs: label,
                rtol: self.tol.rtol,
                atol: self.tol.atol,
                ok: last.ok,
                max_abs: last.max_abs,
                rel_l2: last.rel_l2,
                first,
                last,
                kept_nodes,
                kept_weights,
                runs,
                note,
            },
        ))
    }
}

/// Names of main-graph node outputs of element type `d` (not graph outputs).
fn intermediates(m: &Model, d: DType) -> Vec<String> {
    let g = &m.graph;
    g.nodes()
        .flat_map(|n| {
            g.node(n)
                .outputs()
                .iter()
                .flatten()
                .copied()
                .collect::<Vec<_>>()
        })
        .filter(|&v| !g.is_output(v) && g.ty(v).and_then(|t| t.elem()) == Some(d))
        .map(|v| g.name(v).to_string())
        .collect()
}

fn all_finite(t: &TractTensor) -> bool {
    match t.cast_to::<f64>() {
        Ok(f) => f
            .to_plain_array_view::<f64>()
            .map(|a| a.iter().all(|x| x.is_finite()))
            .unwrap_or(true),
        Err(_) => true,
    }
}

/// Main-graph node ids to display names (`name`, or `Op#id` when unnamed).
fn node_names(m: &Model) -> BTreeMap<NodeId, String> {
    let g = &m.graph;
    g.nodes()
        .map(|n| {
            let d = g.node(n);
            let name = if d.name.is_empty() {
                format!("{}#{}", d.op_type, n.index())
            } else {
                d.name.clone()
            };
            (n, name)
        })
        .collect()
}
