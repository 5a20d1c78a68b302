//! `graphopt optimize IN -o OUT`.

use crate::util::{human_bytes, write_atomic};
use anyhow::bail;
use graphopt_ir::{DType, Model};
use graphopt_onnx::{ExternalData, SaveOptions};
use graphopt_passes::manager::{run_pipeline, ManagerOptions, PassRun};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The model to optimize (never modified).
    input: PathBuf,
    /// Where to write the optimized model (atomically).
    #[arg(short, long)]
    output: PathBuf,
    /// Comma-separated passes to run instead of the default pipeline, or
    /// `none` for a pure import→export round trip.
    #[arg(long, value_name = "LIST|none")]
    passes: Option<String>,
    /// Write a JSON report: node counts, initializer bytes, time per pass.
    #[arg(long, value_name = "REPORT.json")]
    report: Option<PathBuf>,
    /// Dump the IR before and after passes (`all` or a comma list of passes) to stderr.
    #[arg(long, value_name = "PASSES", num_args = 0..=1, default_missing_value = "all")]
    dump_ir: Option<String>,
    /// Print the time each pass took.
    #[arg(long)]
    time_passes: bool,
    /// Run the IR verifier after every pass (always on; kept for compatibility).
    #[arg(long)]
    verify: bool,
    /// Stop after this many pass runs (to bisect a bad rewrite).
    #[arg(long, value_name = "N")]
    stop_after: Option<usize>,
    /// Write initializers of at least THRESHOLD bytes (default 1024) to an
    /// external data file beside the output.
    #[arg(long, value_name = "THRESHOLD", num_args = 0..=1, default_missing_value = "1024")]
    external_data: Option<u64>,
    /// Keep all data inline, even if the input used external data.
    #[arg(long, conflicts_with = "external_data")]
    no_external_data: bool,
    /// Bind a symbolic dim (NAME=VALUE), repeatable.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Print nothing but errors.
    #[arg(short, long)]
    quiet: bool,
    /// Mixed precision (`--precision` and its flags), boxed to keep the
    /// command enum small.
    #[command(flatten)]
    lp: Box<PrecisionArgs>,
}

/// `--precision` and the flags that go with it.
#[derive(clap::Args)]
pub struct PrecisionArgs {
    /// Lower to fp16 or bf16 compute (matrix products low, an autocast-like
    /// fp32 keep-list), or store weights fp16 with fp32 compute. Runs after
    /// the pass pipeline.
    #[arg(long, value_name = "fp16|bf16|fp16-weights")]
    precision: Option<String>,
    /// Keep these op types or node names in fp32, besides the default list;
    /// `-NAME` takes an op off the default list (e.g. `-Softmax`).
    #[arg(
        long = "keep-fp32",
        value_name = "OP|NAME,...",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    keep_fp32: Vec<String>,
    /// Lower the graph inputs and outputs too (by default they keep their types).
    #[arg(long)]
    no_keep_io_types: bool,
    /// Lower ops even where onnxruntime's CPU provider has no low-precision
    /// kernel (for GPU runtimes; the output may not run on a CPU).
    #[arg(long)]
    any_runtime: bool,
    /// Run the original and the lowered model in tract on the CPU; where the
    /// error exceeds the tolerance, find the nodes responsible and keep them
    /// fp32 until it does not.
    #[arg(long, requires = "precision")]
    validate: bool,
    /// Relative tolerance of --validate: per output, every element within
    /// atol + rtol * max|reference|.
    #[arg(long, default_value_t = 1e-2, value_name = "R")]
    rtol: f64,
    /// Absolute tolerance of --validate.
    #[arg(long, default_value_t = 1e-3, value_name = "A")]
    atol: f64,
    /// Inputs for --validate, by input name (numpy `np.savez`, uncompressed);
    /// default: seeded random inputs.
    #[arg(long, value_name = "FILE.npz", requires = "validate")]
    inputs: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let dims = crate::util::parse_dims(&a.dims)?;
    if let (Ok(i), Ok(o)) = (a.input.canonicalize(), a.output.canonicalize()) {
        if i == o {
            bail!(
                "{}: the output would overwrite the input; choose another -o",
                a.output.display()
            );
        }
    }
    let passes = match &a.passes {
        Some(list) => graphopt_passes::parse_pipeline(list)?,
        None => graphopt_passes::default_pipeline(),
    };
    let rounds = if a.passes.is_none() { 8 } else { 1 };

    let t0 = Instant::now();
    let loaded = graphopt_onnx::load(&a.input)?;
    let import_time = t0.elapsed();
    let mut model = loaded.model;
    let before = Summary::of(&model);

    let printer =
        |m: &Model| graphopt_text::print_model(m, &graphopt_text::PrintOptions::default());
    let mut stderr = std::io::stderr();
    let mut opts = ManagerOptions {
        // Always: verification is linear and cheap, and an invalid rewrite
        // must never reach the output file. (`--verify` is kept for scripts.)
        verify: true,
        dump_filter: a.dump_ir.clone(),
        dump: Some(&printer),
        dump_sink: Some(&mut stderr),
        max_rounds: rounds,
        stop_after: a.stop_after,
    };
    let t1 = Instant::now();
    let runs = run_pipeline(&mut model, &passes, &mut opts)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.input.display()))?;
    // With --precision, the planner measures activation memory before and
    // after lowering (at the --dim values, other input dims 1).
    let mem_before =
        a.lp.precision
            .as_ref()
            .map(|_| memory(&model, &dims, &a.input));
    let precision = match &a.lp.precision {
        Some(p) => Some(
            lower(&mut model, p, &a, &dims)
                .map_err(|e| anyhow::anyhow!("{}: {e:#}", a.input.display()))?,
        ),
        None => None,
    };
    let memory_change = mem_before.map(|b| MemoryChange {
        before: b,
        after: memory(&model, &dims, &a.input),
    });
    let pass_time = t1.elapsed();
    let after = Summary::of(&model);

    let save = SaveOptions {
        external: if a.no_external_data {
            ExternalData::Never
        } else if let Some(t) = a.external_data {
            ExternalData::Always { threshold: t }
        } else {
            ExternalData::Auto {
                input_used_external: loaded.info.used_external_data,
            }
        },
        location: None,
    };
    let t2 = Instant::now();
    let saved = graphopt_onnx::save(&model, &a.output, &save)?;
    let export_time = t2.elapsed();

    let in_size = std::fs::metadata(&a.input).map(|m| m.len()).unwrap_or(0);
    let out_size = saved.model_bytes + saved.external_bytes;
    if a.time_passes {
        eprintln!(
            "{:<24} {:>10} {:>8} {:>8}",
            "pass", "time", "nodes", "changed"
        );
        for r in &runs {
            eprintln!(
                "{:<24} {:>8.2}ms {:>8} {:>8}",
                format!("{} (round {})", r.pass, r.round + 1),
                r.time.as_secs_f64() * 1e3,
                r.nodes_after,
                r.stats.changed
            );
        }
        eprintln!(
            "import {:.2}ms, passes {:.2}ms, export {:.2}ms",
            ms(import_time),
            ms(pass_time),
            ms(export_time)
        );
    }
    if !a.quiet {
        print_table(&before, &after, in_size, out_size);
        if let Some(p) = &precision {
            p.print();
        }
        if let Some(m) = &memory_change {
            m.print();
        }
        if loaded.info.reordered {
            println!("note: the input's nodes were not in topological order; the output's are");
        }
    }
    if let Some(path) = &a.report {
        let report = json!({
            "input": a.input.display().to_string(),
            "output": a.output.display().to_string(),
            "passes": runs.iter().map(run_json).collect::<Vec<_>>(),
            "nodes_before": before.nodes,
            "nodes_after": after.nodes,
            "initializers_before": before.initializers,
            "initializers_after": after.initializers,
            "initializer_bytes_before": before.init_bytes,
            "initializer_bytes_after": after.init_bytes,
            "file_bytes_before": in_size,
            "file_bytes_after": out_size,
            "external_data_bytes": saved.external_bytes,
            "ops_before": before.ops,
            "ops_after": after.ops,
            "time_import_ms": ms(import_time),
            "time_passes_ms": ms(pass_time),
            "time_export_ms": ms(export_time),
            "precision": precision.as_ref().map(|p| p.json()),
            "memory": memory_change.as_ref().map(MemoryChange::json),
        });
        let mut text = serde_json::to_string_pretty(&report)?;
        text.push('\n');
        write_atomic(path, text.as_bytes())?;
    }
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn run_json(r: &PassRun) -> serde_json::Value {
    json!({
        "name": r.pass,
        "round": r.round + 1,
        "time_ms": ms(r.time),
        "changed": r.stats.changed,
        "nodes_before": r.nodes_before,
        "nodes_after": r.nodes_after,
        "initializer_bytes_before": r.initializer_bytes_before,
        "initializer_bytes_after": r.initializer_bytes_after,
        "counters": r.stats.counters,
    })
}

/// Counts for the before/after table.
struct Summary {
    nodes: usize,
    initializers: usize,
    init_bytes: u64,
    ops: BTreeMap<String, usize>,
}

impl Summary {
    fn of(m: &Model) -> Summary {
        Summary {
            nodes: m.graph.node_count_deep(),
            initializers: count_inits(&m.graph),
            init_bytes: m.graph.initializer_bytes_deep(),
            ops: crate::util::op_histogram(&m.graph),
        }
    }
}

fn count_inits(g: &graphopt_ir::Graph) -> usize {
    g.initializers().len() + g.subgraphs().map(|(_, s)| count_inits(s)).sum::<usize>()
}

/// An onnxsim-style table of what changed.
fn print_table(b: &Summary, a: &Summary, in_size: u64, out_size: u64) {
    let mut names: Vec<&String> = b.ops.keys().chain(a.ops.keys()).collect();
    names.sort();
    names.dedup();
    println!("{:<28} {:>12} {:>12}", "", "input", "output");
    for n in names {
        let (x, y) = (
            b.ops.get(n).copied().unwrap_or(0),
            a.ops.get(n).copied().unwrap_or(0),
        );
        let mark = if x != y { " *" } else { "" };
        println!("{:<28} {:>12} {:>12}{mark}", n, x, y);
    }
    println!("{:<28} {:>12} {:>12}", "nodes", b.nodes, a.nodes);
    println!(
        "{:<28} {:>12} {:>12}",
        "initializers", b.initializers, a.initializers
    );
    println!(
        "{:<28} {:>12} {:>12}",
        "initializer bytes",
        human_bytes(b.init_bytes),
        human_bytes(a.init_bytes)
    );
    println!(
        "{:<28} {:>12} {:>12}",
        "file size",
        human_bytes(in_size),
        human_bytes(out_size)
    );
}

// ---- memory plans around --precision ----------------------------------

/// Weights, activation lower bound and arena from the planner.
struct Memory {
    dims: String,
    weights: u64,
    lower_bound: u64,
    arena: u64,
    unknown: usize,
}

/// Plans `model` at the `--dim` values (other input dims 1); values whose
/// size stays unknown are left out and counted.
fn memory(
    model: &Model,
    dims: &[(String, i64)],
    input: &std::path::Path,
) -> Result<Memory, String> {
    let opts = graphopt_plan::PlanOptions {
        ignore_unknown: true,
        node_budget: 20_000,
        ..Default::default()
    };
    let (_, plan, used) =
        crate::plan::plan_at(model, dims, 1, &opts, input).map_err(|e| format!("{e:#}"))?;
    Ok(Memory {
        dims: used
            .iter()
            .map(|(k, v, _)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", "),
        weights: plan.weights_bytes,
        lower_bound: plan.lower_bound_bytes,
        arena: plan.arena_bytes,
        unknown: plan.unknown_size.len(),
    })
}

struct MemoryChange {
    before: Result<Memory, String>,
    after: Result<Memory, String>,
}

impl MemoryChange {
    fn print(&self) {
        match (&self.before, &self.after) {
            (Ok(b), Ok(a)) => {
                println!(
                    "memory at {}: weights {} -> {}; activations lower bound {} -> {}; arena {} -> {}",
                    if b.dims.is_empty() { "static shapes" } else { &b.dims },
                    human_bytes(b.weights),
                    human_bytes(a.weights),
                    human_bytes(b.lower_bound),
                    human_bytes(a.lower_bound),
                    human_bytes(b.arena),
                    human_bytes(a.arena)
                );
                if a.unknown > 0 || b.unknown > 0 {
                    println!(
                        "  ({} / {} values of unknown size left out of the plans)",
                        b.unknown, a.unknown
                    );
                }
            }
            (Err(e), _) | (_, Err(e)) => println!("memory plan unavailable: {e}"),
        }
    }

    fn json(&self) -> serde_json::Value {
        let one = |m: &Result<Memory, String>| match m {
            Ok(m) => {
                json!({"dims": m.dims, "weights_bytes": m.weights, "lower_bound_bytes": m.lower_bound, "arena_bytes": m.arena, "unknown_size_values": m.unknown})
            }
            Err(e) => json!({"error": e}),
        };
        json!({"before": one(&self.before), "after": one(&self.after)})
    }
}

// ---- --precision ------------------------------------------------------

use graphopt_passes::lower_precision::{LowerPrecision, LowerReport, Precision};
use graphopt_tract::TractTensor;

/// What `--precision` did, for the printout and the report.
struct PrecisionOutcome {
    mode: Precision,
    report: LowerReport,
    nodes_total: usize,
    /// `Err(why)` when validation could not run.
    validation: Option<Result<Validation, String>>,
}

/// What `--validate` found.
struct Validation {
    inputs: String,
    rtol: f64,
    atol: f64,
    first: Check,
    last: Check,
    /// Nodes (name, or `Op#id` when unnamed) and weights kept fp32.
    kept_nodes: Vec<String>,
    kept_weights: Vec<String>,
    runs: usize,
    note: Option<String>,
}

/// One comparison with the fp32 reference.
#[derive(Clone)]
struct Check {
    ok: bool,
    max_abs: f64,
    rel_l2: f64,
    /// Why the candidate could not run, if it could not.
    error: Option<String>,
}

impl Check {
    fn describe(&self) -> String {
        match &self.error {
            Some(e) => format!("does not run in tract: {e}"),
            None => format!("max abs {:.3e}, rel L2 {:.3e}", self.max_abs, self.rel_l2),
        }
    }
    fn json(&self) -> serde_json::Value {
        json!({"ok": self.ok, "max_abs": finite(self.max_abs), "rel_l2": finite(self.rel_l2), "error": self.error})
    }
}

fn finite(x: f64) -> serde_json::Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(x.to_string())
    }
}

impl PrecisionOutcome {
    fn print(&self) {
        let r = &self.report;
        println!(
            "precision {}: {} of {} nodes compute low; Casts {} -> {}; weights {} -> {} ({:.3}x)",
            self.mode.name(),
            r.lowered_total,
            self.nodes_total,
            r.casts_before,
            r.casts_after,
            human_bytes(r.weight_bytes_before),
            human_bytes(r.weight_bytes_after),
            ratio(r.weight_bytes_after, r.weight_bytes_before)
        );
        if !r.kept_no_kernel.is_empty() {
            let ops: Vec<&str> = r.kept_no_kernel.iter().map(String::as_str).collect();
            println!(
                "  kept fp32 (no low-precision kernel in onnxruntime's CPU provider): {}",
                ops.join(", ")
            );
        }
        if !r.kept_sensitive.is_empty() {
            let nodes: Vec<String> = r
                .kept_sensitive
                .iter()
                .map(|(n, g)| format!("{n} (gain {g:.1})"))
                .collect();
            println!(
                "  kept fp32 (signal-processing basis): {}",
                nodes.join(", ")
            );
        }
        if !r.kept_fp32_weights.is_empty() {
            println!("  weights kept fp32:");
            for (name, why) in &r.kept_fp32_weights {
                println!("    {name}: {why}");
            }
        }
        if let Some(Err(why)) = &self.validation {
            println!("  NOT validated: {why}");
        }
        if let Some(Ok(v)) = &self.validation {
            println!(
                "  validated in tract on {} inputs (rtol {}, atol {}): {} ({} runs)",
                v.inputs,
                v.rtol,
                v.atol,
                if v.last.ok {
                    "within tolerance"
                } else {
                    "NOT within tolerance"
                },
                v.runs
            );
            println!("    first: {}", v.first.describe());
            if !v.kept_nodes.is_empty() || !v.kept_weights.is_empty() {
                println!(
                    "    kept fp32 by validation: {}",
                    v.kept_nodes
                        .iter()
                        .chain(&v.kept_weights)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                println!("    final: {}", v.last.describe());
            }
            if let Some(n) = &v.note {
                println!("    note: {n}");
            }
        }
    }

    fn json(&self) -> serde_json::Value {
        let r = &self.report;
        json!({
            "mode": self.mode.name(),
            "nodes_lowered": r.lowered_total,
            "weights_bytes_before": r.weight_bytes_before,
            "weights_bytes_after": r.weight_bytes_after,
            "weights_ratio": ratio(r.weight_bytes_after, r.weight_bytes_before),
            "casts_before": r.casts_before,
            "casts_after": r.casts_after,
            "clamped": r.clamped.iter().map(|(n, c)| json!({"name": n, "values": c})).collect::<Vec<_>>(),
            "kept_no_kernel": r.kept_no_kernel,
            "kept_sensitive": r.kept_sensitive.iter().map(|(n, g)| json!({"node": n, "gain": g})).collect::<Vec<_>>(),
            "kept_fp32_weights": r.kept_fp32_weights.iter().map(|(n, w)| json!({"name": n, "why": w})).collect::<Vec<_>>(),
            "warnings": r.warnings,
            "validation": self.validation.as_ref().map(|v| match v {
                Err(why) => json!({"ok": null, "skipped": why}),
                Ok(v) => json!({
                "inputs": v.inputs,
                "rtol": v.rtol,
                "atol": v.atol,
                "ok": v.last.ok,
                "max_abs": finite(v.last.max_abs),
                "rel_l2": finite(v.last.rel_l2),
                "first": v.first.json(),
                "final": v.last.json(),
                "kept_nodes": v.kept_nodes,
                "kept_weights": v.kept_weights,
                "runs": v.runs,
                "note": v.note,
            })}),
        })
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

/// Lowers `model` per the flags, validating and falling back if asked.
fn lower(
    model: &mut Model,
    mode: &str,
    a: &Args,
    dims: &[(String, i64)],
) -> anyhow::Result<PrecisionOutcome> {
    let mode = Precision::parse(mode)?;
    let (mut keep, mut allow) = (Vec::new(), Vec::new());
    for k in
        a.lp.keep_fp32
            .iter()
            .map(|k| k.trim())
            .filter(|k| !k.is_empty())
    {
        match k.strip_prefix('-') {
            Some(op) => allow.push(op.to_string()),
            None => keep.push(k.trim_start_matches('+').to_string()),
        }
    }
    let base = LowerPrecision {
        precision: mode,
        keep_fp32: keep,
        allow_low: allow,
        keep_io_types: !a.lp.no_keep_io_types,
        ort_cpu: !a.lp.any_runtime,
        ..LowerPrecision
    };
    let nodes_total = model.graph.node_count_deep();
    let run = |lp: &LowerPrecision| -> anyhow::Result<(Model, LowerReport)> {
        let mut m = model.clone();
        let r = lp.lower(&mut m)?;
        graphopt_ir::verify::verify_model(&m)
            .map_err(|e| anyhow::anyhow!("after lower_precision: IR is invalid: {e}"))?;
        Ok((m, r))
    };
    let (mut lowered, mut report) = run(&base)?;
    let mut validation = None;
    if a.lp.validate {
        if mode == Precision::BF16 {
            bail!("--validate runs the models in tract, which has no bfloat16; validate bf16 output in onnxruntime (tests-py/precision_models.py)");
        }
        let (inputs, label) = match &a.lp.inputs {
            Some(p) => (
                graphopt_tract::npz::read_inputs(p, model)?,
                p.display().to_string(),
            ),
            None => (
                graphopt_tract::sample_inputs(model, dims, 4, 7)?,
                "seeded random".to_string(),
            ),
        };
        match Validator::new(model, inputs, a.lp.rtol, a.lp.atol) {
            Ok(v) => {
                let (m, r, val) = v.fallback(&base, &run, (lowered, report), label)?;
                lowered = m;
                report = r;
                validation = Some(Ok(val));
            }
            Err(e) => {
                // Not an error: the lowering is done; say loudly that it is
                // unchecked (onnxruntime can check it: tests-py/precision_models.py).
                let why = format!("{e:#}").replace('\n', " ");
                eprintln!("warning: --validate skipped: {why}");
                validation = Some(Err(why));
            }
        }
    }
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    *model = lowered;
    Ok(PrecisionOutcome {
        mode,
        report,
        nodes_total,
        validation,
    })
}

/// Runs candidates against the fp32 reference in tract.
struct Validator {
    inputs: Vec<TractTensor>,
    reference: Vec<TractTensor>,
    /// Main-graph float intermediates of the fp32 model, by name: whether
    /// each is finite everywhere. A candidate whose low intermediate
    /// overflows where the reference is finite fails, even if a runtime
    /// (tract fuses `Cast(MatMul)` into an fp32-output MatMul) hides it in
    /// the final outputs.
    finite: BTreeMap<String, bool>,
    rtol: f64,
    atol: f64,
}

/// A lowering function: a configuration in, the lowered model out.
type Lowering<'a> = dyn Fn(&LowerPrecision) -> anyhow::Result<(Model, LowerReport)> + 'a;

/// One thing validation can keep fp32.
#[derive(Clone, Debug, PartialEq)]
enum Item {
    Node(graphopt_ir::NodeId),
    Weight(String),
}

impl Validator {
    fn new(
        model: &Model,
        inputs: Vec<TractTensor>,
        rtol: f64,
        atol: f64,
    ) -> anyhow::Result<Validator> {
        let reference = run_with_outputs(model, &[], &inputs)
            .map_err(|e| anyhow::anyhow!("tract cannot run the fp32 model: {e:#}"))?;
        let names = intermediates(model, DType::F32);
        let finite = match run_with_outputs(model, &names, &inputs) {
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
            finite,
            rtol,
            atol,
        })
    }

    fn check(&self, m: &Model) -> Check {
        let low: Vec<String> = [DType::F16, DType::BF16]
            .into_iter()
            .flat_map(|d| intermediates(m, d))
            .filter(|n| self.finite.get(n) == Some(&true))
            .collect();
        let n_out = m.graph.outputs.len();
        let got = run_with_outputs(m, &low, &self.inputs)
            .or_else(|_| run_with_outputs(m, &[], &self.inputs));
        match got {
            Ok(got) => {
                let mut c = self.compare(&got[..n_out.min(got.len())]);
                if got.len() > n_out {
                    if let Some(bad) = low.iter().zip(&got[n_out..]).find(|(_, t)| !all_finite(t)) {
                        c.ok = false;
                        c.error = Some(format!("'{}' overflows in low precision", bad.0));
                    }
                }
                c
            }
            Err(e) => Check {
                ok: false,
                max_abs: f64::INFINITY,
                rel_l2: f64::INFINITY,
                error: Some(format!("{:#}", e).replace('\n', " ")),
            },
        }
    }

    /// Per output tensor: every element within `atol + rtol * max|ref|`
    /// (NaN matches NaN). The scale is the tensor's, not the element's:
    /// low-precision arithmetic errs in proportion to the operands, so an
    /// element near zero in a tensor of large values carries the tensor's
    /// absolute error. Also measures max abs and rel L2.
    fn compare(&self, got: &[TractTensor]) -> Check {
        let mut c = Check {
            ok: got.len() == self.reference.len(),
            max_abs: 0.0,
            rel_l2: 0.0,
            error: None,
        };
        let (mut num, mut den) = (0f64, 0f64);
        for (x, y) in self.reference.iter().zip(got) {
            if x.shape() != y.shape() {
                c.ok = false;
                c.error = Some(format!("shape {:?} vs {:?}", x.shape(), y.shape()));
                continue;
            }
            let (Ok(xf), Ok(yf)) = (x.cast_to::<f64>(), y.cast_to::<f64>()) else {
                c.ok &= x == y;
                continue;
            };
            let (Ok(xs), Ok(ys)) = (
                xf.to_plain_array_view::<f64>(),
                yf.to_plain_array_view::<f64>(),
            ) else {
                continue;
            };
            let scale = xs
                .iter()
                .filter(|p| p.is_finite())
                .fold(0f64, |m, p| m.max(p.abs()));
            for (p, q) in xs.iter().zip(ys.iter()) {
                if p.is_nan() && q.is_nan() || p == q {
                    continue;
                }
                let d = (p - q).abs();
                let d = if d.is_nan() { f64::INFINITY } else { d };
                if d > self.atol + self.rtol * scale {
                    c.ok = false;
                }
                c.max_abs = c.max_abs.max(d);
                num += d * d;
                den += p * p;
            }
        }
        c.rel_l2 = if den == 0.0 {
            num.sqrt()
        } else {
            (num / den).sqrt()
        };
        c
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
        start: (Model, LowerReport),
        label: String,
    ) -> anyhow::Result<(Model, LowerReport, Validation)> {
        const MAX_CULPRITS: usize = 24;
        let (mut m, mut r) = start;
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
                (m, r) = run(&config(&all))?;
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
        let names = graph_node_names(&m);
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
        let v = Validation {
            inputs: label,
            rtol: self.rtol,
            atol: self.atol,
            first,
            last,
            kept_nodes,
            kept_weights,
            runs,
            note,
        };
        Ok((m, r, v))
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

/// Runs `m` in tract with the values `names` as extra outputs (after the
/// model's own).
fn run_with_outputs(
    m: &Model,
    names: &[String],
    inputs: &[TractTensor],
) -> anyhow::Result<Vec<TractTensor>> {
    let mut m = graphopt_tract::fp16_proxy(m)?;
    for n in names {
        if let Some(v) = m.graph.value_by_name(n) {
            m.graph.outputs.push(v);
        }
    }
    // With --no-keep-io-types the inputs are fp16 now: round them the same way.
    let g = &m.graph;
    let runtime: Vec<_> = g
        .inputs
        .iter()
        .filter(|&&v| g.initializer(v).is_none())
        .collect();
    let mut inputs = inputs.to_vec();
    for (t, &&v) in inputs.iter_mut().zip(&runtime) {
        if g.ty(v).and_then(|ty| ty.elem()) == Some(DType::F16)
            && t.datum_type() == tract_onnx::prelude::DatumType::F32
        {
            *t = t
                .cast_to_dt(tract_onnx::prelude::DatumType::F16)?
                .into_owned();
        }
    }
    let bytes = graphopt_tract::prepare(&m)?;
    graphopt_tract::run_bytes(&bytes, &inputs)
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
fn graph_node_names(m: &Model) -> BTreeMap<graphopt_ir::NodeId, String> {
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
