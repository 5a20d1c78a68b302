//! `graphopt prune`: structured pruning ([`graphopt::Session::prune`]);
//! this file turns arguments into that call and prints what it returns.

use crate::util::{json_text, print_out};
use graphopt::{PruneOptions, PruneReport};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    input: PathBuf,
    /// Where to write the pruned model.
    #[arg(short = 'o', value_name = "OUT.onnx")]
    output: PathBuf,
    /// The fraction of each group's units removed, in [0, 1).
    #[arg(long, value_name = "R")]
    ratio: Option<f64>,
    /// Parameters to keep: a fraction of the model's (0.5) or a count;
    /// the ratio that meets it is searched.
    #[arg(long, value_name = "P")]
    target_params: Option<f64>,
    /// FLOPs to keep (at the --dim sizes): a fraction or a count.
    #[arg(long, value_name = "F")]
    target_flops: Option<f64>,
    /// Unstructured: set this fraction of every MatMul/Gemm/Conv weight's
    /// elements (the smallest) to zero, stored as sparse initializers
    /// where that makes the file smaller (needs --unstructured).
    #[arg(long, value_name = "S", requires = "unstructured")]
    sparsity: Option<f64>,
    /// With --sparsity: weights one by one, not whole channels.
    #[arg(long, requires = "sparsity")]
    unstructured: bool,
    /// l1 | l2 | taylor | random (default l1). taylor ranks by
    /// |w · dL/dw| on --calibration (the loss of --loss).
    #[arg(long)]
    criterion: Option<String>,
    /// With --criterion taylor: sum | mean | mse | l1 | cross_entropy (as
    /// `graphopt grad`; default sum).
    #[arg(long)]
    loss: Option<String>,
    /// With --criterion taylor: the calibration array holding the loss's
    /// target (default `target`).
    #[arg(long, value_name = "NAME")]
    target: Option<String>,
    /// With --criterion taylor and cross_entropy: the class axis (default 1).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    class_axis: Option<i64>,
    /// channel | head | all (default all).
    #[arg(long)]
    granularity: Option<String>,
    /// Rank units across groups (importance over each group's mean).
    #[arg(long, conflicts_with = "per_layer")]
    global: bool,
    /// The same ratio in every group (the default).
    #[arg(long)]
    per_layer: bool,
    /// Keep channel counts multiples of N.
    #[arg(long, value_name = "N")]
    round_to: Option<usize>,
    /// Tensors whose dims stay (comma-separated names).
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    protect: Vec<String>,
    /// Bind a symbolic dim (NAME=VALUE), repeatable; others are 1. FLOPs
    /// are counted at these sizes.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Inputs the output error is measured on: an npz of graph inputs per
    /// batch, or a directory of them (default: seeded random inputs).
    #[arg(long, value_name = "X.npz|DIR")]
    calibration: Option<PathBuf>,
    /// Do not measure the output error.
    #[arg(long)]
    no_measure: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Write the report as JSON.
    #[arg(long, value_name = "R.json")]
    report: Option<PathBuf>,
}

pub fn run(a: Args) -> graphopt::Result<()> {
    let amount = graphopt::prune_amount(a.ratio, a.target_params, a.target_flops, a.sparsity)?;
    let mut opts = PruneOptions::new(amount);
    if let Some(c) = &a.criterion {
        opts.pass.criterion = graphopt::prune_criterion(c)?;
    }
    if let Some(l) = &a.loss {
        opts.loss = graphopt::parse_loss(l)?;
    }
    if let Some(t) = &a.target {
        opts.target = t.clone();
    }
    if let Some(c) = a.class_axis {
        opts.class_axis = c;
    }
    if let Some(g) = &a.granularity {
        opts.pass.granularity = graphopt::prune_granularity(g)?;
    }
    if a.global {
        opts.pass.global = true;
    }
    if let Some(n) = a.round_to {
        opts.pass.round_to = n;
    }
    opts.pass.protect = a.protect.clone();
    opts.pass.dims = graphopt::util::parse_dims(&a.dims)?;
    opts.calibration = a.calibration.clone().map(Into::into);
    opts.measure = !a.no_measure;
    let mut session = graphopt::load(&a.input)?;
    session.check_output_path(&a.output)?;
    let r = session.prune(&opts)?;
    session.save(&a.output)?;
    if a.json {
        print_out(&json_text(&r)?);
    } else {
        print_out(&text(&a, &r));
    }
    for w in &r.warnings {
        eprintln!("warning: prune: {w}");
    }
    if let Some(path) = &a.report {
        graphopt::util::write_atomic(path, json_text(&r)?.as_bytes())?;
    }
    Ok(())
}

/// Groups printed before "... N more" (`--report` has them all).
const SHOWN: usize = 12;

fn text(a: &Args, r: &PruneReport) -> String {
    if let Some(s) = &r.sparsity {
        let mut out = format!(
            "{} -> {}\n{} weights at sparsity {}: {} of {} elements set to zero; {} stored sparse\n  weights in the file {} -> {} bytes ({:.1}%); at run time nothing is saved (runtimes load them dense), FLOPs unchanged\n",
            a.input.display(),
            a.output.display(),
            s.weights,
            s.sparsity,
            s.zeroed,
            s.elements,
            s.stored_sparse,
            s.file_bytes_before,
            s.file_bytes_after,
            100.0 * s.file_bytes_after as f64 / s.file_bytes_before.max(1) as f64
        );
        if let Some(e) = &r.error {
            out += &format!(
                "  error vs the unpruned model on {}: rel L2 {:.3e}, max abs {:.3e}\n",
                r.calibration, e.rel_l2, e.max_abs
            );
        }
        return out;
    }
    let mut out = format!(
        "{} -> {}\n{} groups pruned by {}{} at ratio {:.3}",
        a.input.display(),
        a.output.display(),
        r.groups.iter().filter(|g| g.removed > 0).count(),
        r.criterion,
        if r.global { " (global)" } else { "" },
        r.ratio
    );
    if r.trials > 0 {
        out += &format!(" (searched, {} tries)", r.trials);
    }
    out += "\n";
    out += &format!(
        "  parameters {} -> {} ({:.1}%)\n",
        r.params_before,
        r.params_after,
        100.0 * r.params_ratio
    );
    let dims: Vec<String> = r.dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
    match (r.flops_before, r.flops_after, r.flops_ratio) {
        (Some(b), Some(f), Some(x)) => {
            out += &format!(
                "  FLOPs {:.4} G -> {:.4} G ({:.1}%){}\n",
                b as f64 / 1e9,
                f as f64 / 1e9,
                100.0 * x,
                if dims.is_empty() {
                    String::new()
                } else {
                    format!(" at {}", dims.join(", "))
                }
            )
        }
        _ => out += "  FLOPs not known at these dims (bind them with --dim)\n",
    }
    match (&r.error, &r.error_skipped) {
        (Some(e), _) => {
            out += &format!(
                "  error vs the unpruned model on {} (before fine-tuning): rel L2 {:.3e}, max abs {:.3e}\n",
                r.calibration, e.rel_l2, e.max_abs
            )
        }
        (None, Some(why)) => out += &format!("  error NOT measured: {why}\n"),
        _ => {}
    }
    out += "groups:\n";
    for g in r.groups.iter().take(SHOWN) {
        out += &format!(
            "  {:<40} {} of {} {}{} removed ({} weights)\n",
            g.source,
            g.removed,
            g.units,
            g.kind,
            if g.block > 1 {
                format!(" x {}", g.block)
            } else {
                String::new()
            },
            g.weights.len()
        );
    }
    if r.groups.len() > SHOWN {
        out += &format!(
            "  ... {} more (--report lists them all)\n",
            r.groups.len() - SHOWN
        );
    }
    if !r.left_alone.is_empty() {
        out += &format!("left alone ({}):\n", r.left_alone.len());
        for (s, why) in r.left_alone.iter().take(SHOWN) {
            out += &format!("  {s}: {why}\n");
        }
        if r.left_alone.len() > SHOWN {
            out += &format!(
                "  ... {} more (--report lists them all)\n",
                r.left_alone.len() - SHOWN
            );
        }
    }
    out
}
