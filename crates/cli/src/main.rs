//! The `graphopt` command: argument parsing and printing over the
//! [`graphopt`] library, where every capability lives.
//!
//! `optimize`, `grad`, `remat`, `check`, `inspect`, `plan`, `run`, `print` and `passes`. Errors are
//! one line on stderr (`error: <file>: <what and where>`) with exit status
//! 1; usage errors exit with 2.

mod check;
mod grad;
mod inspect;
mod optimize;
mod plan;
mod quantize;
mod remat;
mod run;
mod util;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "graphopt",
    version,
    about = "Make ONNX models need less memory, and prove nothing broke."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Optimize a model: import, run a pass pipeline, export.
    Optimize(optimize::Args),
    /// Run two models on the same inputs and compare every output.
    Check(check::Args),
    /// Summarize a model: inputs, outputs, ops, parameters, opsets.
    Inspect {
        input: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Bind a symbolic dim for shape inference (NAME=VALUE), repeatable.
        #[arg(long = "dim", value_name = "NAME=VALUE")]
        dims: Vec<String>,
    },
    /// Differentiate a model into a training graph (loss and gradients).
    Grad(grad::Args),
    /// Memory plan: lower bounds, schedule, arena offsets, max batch.
    Plan(plan::Args),
    /// Fit a training graph into a memory budget by recomputing forward values.
    Remat(remat::Args),
    /// Run a model in graphopt's runtime (one planned arena); latency and memory.
    Run(run::Args),
    /// Print a model in the ONNX textual syntax (large tensors elided).
    Print {
        input: PathBuf,
        /// Print all tensor data, however large.
        #[arg(long)]
        full: bool,
    },
    /// List every pass with its one-line doc.
    Passes,
}

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when stdout is a closed pipe
    // (`graphopt optimize ... | head`) instead of panicking in println!.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread
    // starts touches no Rust state.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Optimize(a) => optimize::run(a),
        Cmd::Check(a) => check::run(a),
        Cmd::Inspect { input, json, dims } => inspect::run(&input, json, &dims),
        Cmd::Grad(a) => grad::run(a),
        Cmd::Plan(a) => plan::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Remat(a) => remat::run(a),
        Cmd::Print { input, full } => print(&input, full),
        Cmd::Passes => {
            let mut out = String::new();
            for p in graphopt::passes::registry() {
                out += &format!("{:<22} {}\n", p.name, p.doc);
            }
            util::print_out(&out);
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print(input: &std::path::Path, full: bool) -> graphopt::Result<()> {
    let session = graphopt::load(input)?;
    let opts = graphopt::text::PrintOptions {
        elide_above: if full {
            None
        } else {
            graphopt::text::PrintOptions::default().elide_above
        },
    };
    util::print_out(&graphopt::text::print_model(session.model(), &opts));
    Ok(())
}
