//! `graphopt optimize IN -o OUT`: arguments to [`graphopt::Session`] calls,
//! and the printed table and JSON report of what they returned.

use crate::util::{human_bytes, json_text, print_out};
use graphopt::onnx::ExternalData;
use graphopt::{
    Inputs, OptimizeFileOptions, OptimizeFileReport, OptimizeOptions, PipelineOptions, Precision,
    PrecisionOptions, PrecisionReport, SaveOptions, ValidateOptions,
};
use std::path::PathBuf;

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
    /// Passes to leave out of the pipeline (comma-separated). Default: none,
    /// or `fuse_conv_bn` with --precision (folded BatchNorm weights lose
    /// more in fp16); `--skip ''` keeps every pass.
    #[arg(long, value_name = "PASS,...", value_delimiter = ',')]
    skip: Option<Vec<String>>,
    /// Raise the default-domain opset to N before the pipeline (e.g. 20, so
    /// that TorchScript exports at opset 14 get LayerNormalization and Gelu
    /// fusion).
    #[arg(long, value_name = "N")]
    opset: Option<i64>,
    /// Write a JSON report: node counts, initializer bytes, time per pass.
    #[arg(long, value_name = "REPORT.json")]
    report: Option<PathBuf>,
    /// Dump the IR before and after passes (`all` or a comma list of passes) to stderr.
    #[arg(long, value_name = "PASSES", num_args = 0..=1, default_missing_value = "all")]
    dump_ir: Option<String>,
    /// Print the time each pass took.
    #[arg(long)]
    time_passes: bool,
    /// Run the IR verifier after every pass (release builds otherwise
    /// verify once, after the last pass; debug builds always after every
    /// pass). Either way an invalid model is never written.
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
    /// Give a graph input's whole shape for the memory plans
    /// (NAME=D0,D1,...), repeatable.
    #[arg(long = "shape", value_name = "NAME=D0,D1,...")]
    shapes: Vec<String>,
    /// Print nothing but errors.
    #[arg(short, long)]
    quiet: bool,
    /// Mixed precision (`--precision` and its flags), boxed to keep the
    /// command enum small.
    #[command(flatten)]
    lp: Box<PrecisionArgs>,
    /// Quantization (`--quantize` and its flags).
    #[command(flatten)]
    q: Box<crate::quantize::QuantizeArgs>,
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
    /// fp32 until it does not. Ending over tolerance is an error (nothing is
    /// written unless --force); a validation that cannot run is an error
    /// unless `--validate=best-effort`.
    #[arg(long, requires = "precision", value_name = "best-effort", num_args = 0..=1, default_missing_value = "strict")]
    validate: Option<String>,
    /// With --validate: write the output even when it ends over tolerance
    /// (the exit status is still 1).
    #[arg(long, requires = "validate")]
    force: bool,
    /// Relative tolerance of --validate: per output, every element within
    /// atol + rtol * max|reference|.
    #[arg(long, default_value_t = 1e-2, value_name = "R")]
    rtol: f64,
    /// Absolute tolerance of --validate.
    #[arg(long, default_value_t = 1e-3, value_name = "A")]
    atol: f64,
    /// Inputs by input name (numpy `np.savez`, uncompressed): what
    /// --validate runs (default: seeded random inputs), and the input
    /// shapes of the memory plans.
    #[arg(long, value_name = "FILE.npz")]
    inputs: Option<PathBuf>,
    /// fp16: skip the range check (one run of the fp32 model in tract on
    /// the --inputs or seeded random inputs, which keeps fp32 the nodes
    /// around activations beyond 65504/8 or with a root mean square below
    /// 1e-5).
    #[arg(long, requires = "precision")]
    no_range_check: bool,
}

pub fn run(a: Args) -> graphopt::Result<()> {
    let dims = graphopt::util::parse_dims(&a.dims)?;
    // Input shapes for the memory plans: --shape, then the --inputs arrays.
    let mut shapes = graphopt::util::parse_shapes(&a.shapes)?;
    if let Some(p) = &a.lp.inputs {
        shapes.extend(graphopt::util::npz_shapes(p)?);
    }
    let memory = graphopt::plan::DimValues {
        bound: dims.clone(),
        shapes,
        default: None,
    };
    let best_effort = match a.lp.validate.as_deref() {
        None => false,
        Some(v) => graphopt::parse_validate_mode(v)?,
    };
    let pipeline = PipelineOptions {
        verify: a.verify,
        dump_ir: a.dump_ir.clone(),
        stop_after: a.stop_after,
    };
    let inputs = || match &a.lp.inputs {
        Some(p) => Inputs::Npz(p.clone()),
        None => Inputs::random(&dims),
    };
    let precision = match &a.lp.precision {
        Some(p) => Some(PrecisionOptions {
            precision: Precision::parse(p)?,
            keep_fp32: a.lp.keep_fp32.clone(),
            keep_io_types: !a.lp.no_keep_io_types,
            any_runtime: a.lp.any_runtime,
            validate: a.lp.validate.as_ref().map(|_| ValidateOptions {
                inputs: inputs(),
                rtol: a.lp.rtol,
                atol: a.lp.atol,
                best_effort,
                force: a.lp.force,
            }),
            memory: Some(memory.clone()),
            range_check: (!a.lp.no_range_check).then(inputs),
            pipeline: pipeline.clone(),
        }),
        None => None,
    };
    let opts = OptimizeFileOptions {
        optimize: OptimizeOptions {
            passes: a.passes.clone(),
            opset: a.opset,
            max_rounds: None,
            skip: a.skip.clone(),
            compress: a
                .q
                .compress_options(&dims, memory.clone(), pipeline.clone())?,
            precision,
            quantize: a.q.options(&dims, memory, pipeline.clone())?,
            pipeline,
        },
        save: SaveOptions {
            external: if a.no_external_data {
                Some(ExternalData::Never)
            } else {
                a.external_data
                    .map(|threshold| ExternalData::Always { threshold })
            },
            location: None,
        },
    };
    let (_, r) = graphopt::optimize_file(&a.input, &a.output, &opts)?;
    if a.time_passes {
        let mut t = format!(
            "{:<24} {:>10} {:>8} {:>8}\n",
            "pass", "time", "nodes", "changed"
        );
        for p in &r.passes {
            t += &format!(
                "{:<24} {:>8.2}ms {:>8} {:>8}\n",
                format!("{} (round {})", p.name, p.round),
                p.time_ms,
                p.nodes_after,
                p.changed
            );
        }
        t += &format!(
            "import {:.2}ms, passes {:.2}ms, export {:.2}ms\n",
            r.time_import_ms, r.time_passes_ms, r.time_export_ms
        );
        eprint!("{t}");
    }
    for p in &r.passes {
        for w in &p.warnings {
            eprintln!("warning: {}: {w}", p.name);
        }
    }
    if let Some(c) = &r.compress {
        for w in &c.warnings {
            eprintln!("warning: compress: {w}");
        }
    }
    if let Some(q) = &r.quantize {
        for w in &q.warnings {
            eprintln!("warning: quantize: {w}");
        }
    }
    if let Some(why) = r
        .precision
        .as_ref()
        .and_then(|p| p.validation_skipped.as_ref())
    {
        eprintln!("warning: --validate skipped (best effort): {why}");
    }
    if !a.quiet {
        let mut out = table(&r);
        out += &fusions(&r);
        if let Some(p) = &r.precision {
            if r.skipped_by_policy && !r.skipped.is_empty() {
                out += &format!(
                    "  before lowering, the pipeline left out {} (folded BatchNorm loses more in fp16; --skip '' keeps it)\n",
                    r.skipped.join(", ")
                );
            }
            out += &precision_text(p);
        }
        if let Some(c) = &r.compress {
            out += &crate::quantize::compress_text(c);
        }
        if let Some(q) = &r.quantize {
            out += &crate::quantize::text(q);
        }
        if r.reordered {
            out += "note: the input's nodes were not in topological order; the output's are\n";
        }
        print_out(&out);
    }
    if let Some(path) = &a.report {
        graphopt::util::write_atomic(path, json_text(&r)?.as_bytes())?;
    }
    // --force wrote it; a validation over tolerance still fails the run.
    r.outcome()
}

/// An onnxsim-style table of what changed.
fn table(r: &OptimizeFileReport) -> String {
    let mut names: Vec<&String> = r.ops_before.keys().chain(r.ops_after.keys()).collect();
    names.sort();
    names.dedup();
    let mut out = format!("{:<28} {:>12} {:>12}\n", "", "input", "output");
    for n in names {
        let (x, y) = (
            r.ops_before.get(n).copied().unwrap_or(0),
            r.ops_after.get(n).copied().unwrap_or(0),
        );
        let mark = if x != y { " *" } else { "" };
        out += &format!("{:<28} {:>12} {:>12}{mark}\n", n, x, y);
    }
    out += &format!(
        "{:<28} {:>12} {:>12}\n",
        "nodes", r.nodes_before, r.nodes_after
    );
    out += &format!(
        "{:<28} {:>12} {:>12}\n",
        "initializers", r.initializers_before, r.initializers_after
    );
    out += &format!(
        "{:<28} {:>12} {:>12}\n",
        "initializer bytes",
        human_bytes(r.initializer_bytes_before),
        human_bytes(r.initializer_bytes_after)
    );
    out += &format!(
        "{:<28} {:>12} {:>12}\n",
        "file size",
        human_bytes(r.file_bytes_before),
        human_bytes(r.file_bytes_after)
    );
    out
}

/// Which fusions fired, and the opset change.
fn fusions(r: &OptimizeFileReport) -> String {
    let mut out = String::new();
    if r.opset_before != r.opset_after {
        out += &format!(
            "opset: {} -> {}\n",
            r.opset_before.map_or("-".into(), |v| v.to_string()),
            r.opset_after.map_or("-".into(), |v| v.to_string())
        );
    }
    if !r.fusions.is_empty() {
        let list: Vec<String> = r
            .fusions
            .iter()
            .map(|(name, c)| {
                let removed = c.get("nodes_removed").copied().unwrap_or(0);
                format!("{name} ({removed} nodes removed)")
            })
            .collect();
        out += &format!("fusions fired: {}\n", list.join(", "));
    }
    if r.stopped_early {
        out += "note: --stop-after ended the pipeline early\n";
    }
    out
}

fn precision_text(r: &PrecisionReport) -> String {
    let mut out = format!(
        "precision {}: {} of {} nodes compute low; Casts {} -> {}; weights {} -> {} ({:.3}x)\n",
        r.mode,
        r.nodes_lowered,
        r.nodes_total,
        r.casts_before,
        r.casts_after,
        human_bytes(r.weights_bytes_before),
        human_bytes(r.weights_bytes_after),
        r.weights_ratio
    );
    if !r.kept_no_kernel.is_empty() {
        out += &format!(
            "  kept fp32 (no low-precision kernel in onnxruntime's CPU provider): {}\n",
            r.kept_no_kernel.join(", ")
        );
    }
    if !r.kept_sensitive.is_empty() {
        let nodes: Vec<String> = r
            .kept_sensitive
            .iter()
            .map(|k| format!("{} (gain {:.1})", k.node, k.gain))
            .collect();
        out += &format!(
            "  kept fp32 (signal-processing basis): {}\n",
            nodes.join(", ")
        );
    }
    if !r.kept_before_log.is_empty() {
        out += &format!(
            "  kept fp32 (its result reaches a Log): {}\n",
            r.kept_before_log.join(", ")
        );
    }
    if !r.kept_constant_compute.is_empty() {
        let n = r.kept_constant_compute.len();
        let shown: Vec<&str> = r
            .kept_constant_compute
            .iter()
            .take(8)
            .map(String::as_str)
            .collect();
        out += &format!(
            "  kept fp32 (arithmetic on constants, computed at run time): {n} node(s): {}{}\n",
            shown.join(", "),
            if n > shown.len() { ", ..." } else { "" }
        );
    }
    if !r.kept_fp32_weights.is_empty() {
        out += "  weights kept fp32:\n";
        for k in &r.kept_fp32_weights {
            out += &format!("    {}: {}\n", k.name, k.why);
        }
    }
    if let Some(rc) = &r.range_check {
        match &rc.skipped {
            Some(why) => out += &format!("  range check skipped: {why}\n"),
            None if rc.out_of_range.is_empty() => {}
            None => {
                let shown: Vec<String> = rc
                    .out_of_range
                    .iter()
                    .take(4)
                    .map(|o| format!("{} (max {:.1e}, rms {:.1e})", o.value, o.max_abs, o.rms))
                    .collect();
                out += &format!(
                    "  range check ({}): {} activation(s) outside fp16's range, e.g. {}; {} node(s) kept fp32\n",
                    rc.inputs,
                    rc.out_of_range.len(),
                    shown.join(", "),
                    rc.kept_nodes.len()
                );
            }
        }
    }
    if let Some(why) = &r.validation_skipped {
        out += &format!("  NOT validated (best effort): {why}\n");
    }
    if let Some(v) = &r.validation {
        out += &format!(
            "  validated in tract on {} inputs (rtol {}, atol {}): {} ({} runs)\n",
            v.inputs,
            v.rtol,
            v.atol,
            if v.ok {
                "within tolerance"
            } else {
                "NOT within tolerance"
            },
            v.runs
        );
        out += &format!("    first: {}\n", v.first.describe());
        if !v.kept_nodes.is_empty() || !v.kept_weights.is_empty() {
            out += &format!(
                "    kept fp32 by validation: {}\n",
                v.kept_nodes
                    .iter()
                    .chain(&v.kept_weights)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            out += &format!("    final: {}\n", v.last.describe());
        }
        if let Some(n) = &v.note {
            out += &format!("    note: {n}\n");
        }
    }
    match (&r.memory_before, &r.memory_after) {
        (Some(b), Some(a)) if b.error.is_none() && a.error.is_none() => {
            out += &format!(
                "memory at {}: weights {} -> {}; activations lower bound {} -> {}; arena {} -> {}\n",
                if b.dims.is_empty() { "static shapes" } else { &b.dims },
                human_bytes(b.weights_bytes),
                human_bytes(a.weights_bytes),
                human_bytes(b.lower_bound_bytes),
                human_bytes(a.lower_bound_bytes),
                human_bytes(b.arena_bytes),
                human_bytes(a.arena_bytes)
            );
            if a.dynamic_values > 0 || b.dynamic_values > 0 {
                out += &format!(
                    "  ({} / {} values of unknown size are dynamic, outside the arenas)\n",
                    b.dynamic_values, a.dynamic_values
                );
            }
        }
        (Some(b), Some(a)) => {
            let e = b.error.as_ref().or(a.error.as_ref()).expect("one failed");
            out += &format!("memory plan unavailable: {e}\n");
        }
        _ => {}
    }
    out
}
