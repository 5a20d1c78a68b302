//! `graphopt optimize IN -o OUT`.

use crate::util::{human_bytes, write_atomic};
use anyhow::{bail, Context};
use graphopt_ir::Model;
use graphopt_onnx::{ExternalData, SaveOptions};
use graphopt_passes::manager::{initializer_bytes, run_pipeline, ManagerOptions, PassRun};
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
    /// Run the IR verifier after every pass (always on in debug builds).
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
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let _dims = crate::util::parse_dims(&a.dims)?;
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
        verify: a.verify,
        dump_filter: a.dump_ir.clone(),
        dump: Some(&printer),
        dump_sink: Some(&mut stderr),
        max_rounds: rounds,
        stop_after: a.stop_after,
    };
    let t1 = Instant::now();
    let runs = run_pipeline(&mut model, &passes, &mut opts)
        .with_context(|| a.input.display().to_string())?;
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
        let mut ops = BTreeMap::new();
        count_ops(&m.graph, &mut ops);
        Summary {
            nodes: m.graph.node_count_deep(),
            initializers: count_inits(&m.graph),
            init_bytes: initializer_bytes(&m.graph),
            ops,
        }
    }
}

fn count_ops(g: &graphopt_ir::Graph, ops: &mut BTreeMap<String, usize>) {
    for n in g.nodes() {
        *ops.entry(g.node(n).qualified_op()).or_default() += 1;
    }
    for (_, s) in g.subgraphs() {
        count_ops(s, ops);
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
