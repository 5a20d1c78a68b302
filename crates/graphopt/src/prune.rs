//! [`Session::prune`]: structured pruning through the `prune` pass, with
//! the output error against the unpruned model measured on the
//! calibration inputs (seeded random inputs when none are given, with a
//! warning). The error is reported, not bounded: pruning before
//! fine-tuning always moves the outputs, and `graphopt train` is what
//! brings them back.

use crate::error::{Error, Result};
use crate::grad::Loss;
use crate::inputs::Inputs;
use crate::optimize::PipelineOptions;
use crate::quantize::{Calibration, Measurer, QuantError};
use crate::run::RunOptions;
use crate::session::Session;
use crate::util::Capture;
use graphopt_exec::HostTensor;
use graphopt_passes::prune::{Amount, Criterion, Granularity, Prune, PruneReport as PassReport};
use graphopt_passes::Pass;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

pub use graphopt_passes::prune::sparsity::SparsityReport;
pub use graphopt_passes::prune::{
    Amount as PruneAmount, Criterion as PruneCriterion, Granularity as PruneGranularity,
    PrunedGroup,
};

/// What [`Session::prune`] does.
#[derive(Clone, Debug)]
pub struct PruneOptions {
    /// The pass's options: amount, criterion, granularity, global ranking,
    /// `round_to`, protected tensors, dims (unbound ones 1) and seed. Its
    /// `taylor` scores are computed here, from `calibration`.
    pub pass: Prune,
    /// Batches the error is measured on (`None`: seeded random inputs).
    pub calibration: Option<Calibration>,
    /// Measure the output error against the unpruned model.
    pub measure: bool,
    /// `--criterion taylor`: the loss whose gradients rank the units (as
    /// `graphopt grad --loss`), and the calibration array holding its
    /// target (mse, l1, cross_entropy), and the class axis.
    pub loss: Loss,
    pub target: String,
    pub class_axis: i64,
    pub pipeline: PipelineOptions,
}

impl PruneOptions {
    pub fn new(amount: Amount) -> PruneOptions {
        PruneOptions {
            pass: Prune { amount, ..Prune },
            calibration: None,
            measure: true,
            loss: Loss::Sum,
            target: "target".into(),
            class_axis: 1,
            pipeline: PipelineOptions::default(),
        }
    }
}

/// What [`Session::prune`] did.
#[derive(Clone, Debug, Serialize)]
pub struct PruneReport {
    pub criterion: String,
    pub ratio: f64,
    pub global: bool,
    pub groups: Vec<PrunedGroup>,
    /// Groups left alone: where they start, and why.
    pub left_alone: Vec<(String, String)>,
    pub params_before: u64,
    pub params_after: u64,
    pub params_ratio: f64,
    pub flops_before: Option<u64>,
    pub flops_after: Option<u64>,
    pub flops_ratio: Option<f64>,
    /// The dims FLOPs are counted at (unbound symbolic dims are 1).
    pub dims: Vec<(String, i64)>,
    pub calibration: String,
    /// Output error against the unpruned model, before any fine-tuning.
    pub error: Option<QuantError>,
    pub error_skipped: Option<String>,
    pub measured_in: Option<String>,
    pub trials: usize,
    /// `--sparsity S --unstructured`.
    pub sparsity: Option<SparsityReport>,
    pub time_ms: f64,
    pub warnings: Vec<String>,
}

impl Session {
    /// Prunes the model (see the module doc). Whole or not at all: an
    /// error leaves the session unchanged.
    pub fn prune(&mut self, opts: &PruneOptions) -> Result<PruneReport> {
        self.transact(|s| s.prune_step(opts))
    }

    fn prune_step(&mut self, opts: &PruneOptions) -> Result<PruneReport> {
        crate::validate::dims(&opts.pass.dims)?;
        let t0 = Instant::now();
        let mut pass = opts.pass.clone();
        pass.protect = pass
            .protect
            .iter()
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect();
        if pass.criterion == Criterion::Taylor {
            if opts.calibration.is_none() {
                return Err(self.err(Error::new(
                    "--criterion taylor needs --calibration: its gradients are taken on those inputs",
                )));
            }
            pass.taylor = self.taylor_scores(opts)?;
        }
        pass.validate().map_err(|e| self.err(Error::new(e.0)))?;
        let mut warnings = Vec::new();
        let mut pruned = self.model.clone();
        let r: PassReport = pass
            .prune(&mut pruned)
            .map_err(|e| self.err(Error::new(e.0)))?;
        let (mut error, mut error_skipped, mut measured_in) = (None, None, None);
        let mut label = "none".to_string();
        if opts.measure {
            let (batches, l) = self.calibration_batches(&opts.calibration, &opts.pass.dims)?;
            if opts.calibration.is_none() {
                warnings.push(format!(
                    "no --calibration: {l}; errors on random data say little about real inputs"
                ));
            }
            label = l;
            match Measurer::new(&self.model, &batches) {
                Ok(m) => {
                    measured_in = Some(m.engine.clone());
                    match m.error(&pruned) {
                        Ok(e) => error = Some(e),
                        Err(e) => error_skipped = Some(e.message().to_string()),
                    }
                }
                Err(e) => error_skipped = Some(format!("the unpruned model: {}", e.message())),
            }
        }
        let captured = Rc::new(RefCell::new(None));
        let done = RefCell::new(Some((pruned, r)));
        let passes: Vec<Box<dyn Pass>> = vec![Box::new(Capture {
            name: "prune",
            run: Box::new(move |model| {
                let (m, r) = done.borrow_mut().take().expect("runs once");
                *model = m;
                let stats = r.stats();
                Ok((r, stats))
            }),
            out: captured.clone(),
        })];
        self.run_passes(&passes, 1, &opts.pipeline)?;
        let r = captured.borrow_mut().take().unwrap_or_default();
        warnings.extend(r.warnings.iter().cloned());
        let ratio = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
        Ok(PruneReport {
            criterion: r.criterion.clone(),
            ratio: r.ratio,
            global: opts.pass.global,
            groups: r.groups.clone(),
            left_alone: r.left_alone.clone(),
            params_before: r.params_before,
            params_after: r.params_after,
            params_ratio: ratio(r.params_after, r.params_before),
            flops_before: r.flops_before,
            flops_after: r.flops_after,
            flops_ratio: match (r.flops_after, r.flops_before) {
                (Some(a), Some(b)) => Some(ratio(a, b)),
                _ => None,
            },
            dims: r.dims.clone(),
            calibration: label,
            error,
            error_skipped,
            measured_in,
            trials: r.trials,
            sparsity: r.sparsity.clone(),
            time_ms: t0.elapsed().as_secs_f64() * 1e3,
            warnings,
        })
    }
}

impl Session {
    /// `|w · dL/dw|` per element of every trainable weight, summed over
    /// the calibration batches: the training graph of `opts.loss` (as
    /// `graphopt grad` builds it, no optimizer) run in graphopt's runtime.
    fn taylor_scores(&self, opts: &PruneOptions) -> Result<BTreeMap<String, Vec<f64>>> {
        let batches: Vec<Vec<(String, HostTensor)>> = match &opts.calibration {
            Some(Calibration::Files(p)) => crate::quantize::calibration_files(p)?
                .iter()
                .map(|f| crate::train::read_npz(f))
                .collect::<Result<_>>()?,
            Some(Calibration::Batches(b)) => b
                .iter()
                .map(|i| match i {
                    Inputs::Named(v) => Ok(v.clone()),
                    _ => Err(Error::new(
                        "--criterion taylor: calibration batches must name their arrays",
                    )),
                })
                .collect::<Result<_>>()?,
            None => Vec::new(),
        };
        let needs_target = matches!(opts.loss, Loss::Mse | Loss::L1 | Loss::CrossEntropy);
        let mut train = Session::from_model(self.model.clone());
        train.grad(&crate::GradOptions {
            autodiff: crate::AutodiffOptions {
                loss: opts.loss,
                class_axis: opts.class_axis,
                ..crate::AutodiffOptions::default()
            },
            ..crate::GradOptions::default()
        })?;
        let inputs: Vec<String> = train
            .model()
            .graph
            .runtime_inputs()
            .map(|v| train.model().graph.name(v).to_string())
            .collect();
        let mut scores: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for (i, batch) in batches.iter().enumerate() {
            let mut feed = Vec::new();
            for (n, t) in batch {
                if needs_target && *n == opts.target {
                    feed.push(("target".to_string(), t.clone()));
                } else if inputs.contains(n) && n != "target" {
                    feed.push((n.clone(), t.clone()));
                }
            }
            if needs_target && !feed.iter().any(|(n, _)| n == "target") {
                return Err(Error::new(format!(
                    "--criterion taylor: calibration batch {i} has no array '{}' (the loss's target; name another with --target)",
                    opts.target
                )));
            }
            let r = train
                .run(&RunOptions {
                    inputs: Inputs::Named(feed),
                    ..RunOptions::default()
                })
                .map_err(|e| e.within("--criterion taylor: the training graph"))?;
            for (name, g) in r.output_names.iter().zip(&r.outputs) {
                let Some(p) = name.strip_suffix("_grad") else {
                    continue;
                };
                let Some(w) = self
                    .model
                    .graph
                    .value_by_name(p)
                    .and_then(|v| self.model.graph.initializer(v))
                    .and_then(|t| t.to_f64_vec())
                else {
                    continue;
                };
                let Some(g) = g.to_f32() else { continue };
                if g.len() != w.len() {
                    continue;
                }
                let acc = scores
                    .entry(p.to_string())
                    .or_insert_with(|| vec![0.0; w.len()]);
                for ((a, &w), &g) in acc.iter_mut().zip(&w).zip(&g) {
                    *a += (w * g as f64).abs();
                }
            }
        }
        if scores.is_empty() {
            return Err(Error::new(
                "--criterion taylor: the training graph gave no weight gradient",
            ));
        }
        Ok(scores)
    }
}

/// Parses `--ratio`, `--target-params`, `--target-flops` and `--sparsity`
/// (exactly one).
pub fn prune_amount(
    ratio: Option<f64>,
    target_params: Option<f64>,
    target_flops: Option<f64>,
    sparsity: Option<f64>,
) -> Result<Amount> {
    match (ratio, target_params, target_flops, sparsity) {
        (Some(r), None, None, None) => Ok(Amount::Ratio(r)),
        (None, Some(p), None, None) => Ok(Amount::TargetParams(p)),
        (None, None, Some(f), None) => Ok(Amount::TargetFlops(f)),
        (None, None, None, Some(s)) => Ok(Amount::Sparsity(s)),
        (None, None, None, None) => Err(Error::new(
            "prune: give one of --ratio, --target-params, --target-flops or --sparsity",
        )),
        _ => Err(Error::new(
            "prune: give only one of --ratio, --target-params, --target-flops or --sparsity",
        )),
    }
}

/// Parses a criterion name (`l1`, `l2`, `random`).
pub fn prune_criterion(s: &str) -> Result<Criterion> {
    Criterion::parse(s).map_err(|e| Error::new(e.0))
}

/// Parses a granularity name (`channel`, `head`, `all`).
pub fn prune_granularity(s: &str) -> Result<Granularity> {
    Granularity::parse(s).map_err(|e| Error::new(e.0))
}
