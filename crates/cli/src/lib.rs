//! The `graphopt` command: argument parsing and printing over the
//! [`graphopt`] library, where every capability lives. The binary
//! (`src/main.rs`) and the Python package's `graphopt` console script both
//! call [`main_with_args`], so the two are the same command.
//!
//! `optimize`, `grad`, `remat`, `prune`, `train`, `check`, `inspect`, `plan`, `run`, `print` and `passes`. Errors are
//! one line on stderr (`error: <file>: <what and where>`) with exit status
//! 1; usage errors exit with 2.

mod check;
mod grad;
mod inspect;
mod optimize;
mod partition;
mod plan;
mod prune;
mod quantize;
mod remat;
mod run;
mod train;
mod util;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

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
    /// Cut a model into pipeline stages for `train --pipeline`.
    Partition(partition::Args),
    /// Structured pruning: remove whole channels, hidden units and heads.
    Prune(Box<prune::Args>),
    /// Fit a training graph into a memory budget by recomputing forward values.
    Remat(remat::Args),
    /// Run a model in graphopt's runtime (one planned arena); latency and memory.
    Run(run::Args),
    /// Train a model with graphopt's training step; writes the trained model.
    Train(Box<train::Args>),
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

/// The `graphopt` process: [`main_with_args`] with the process's
/// arguments, ending quietly (like other Unix tools) when stdout is a
/// closed pipe (`graphopt optimize ... | head`) instead of panicking in
/// `println!`.
pub fn process_main() -> std::process::ExitCode {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread
    // starts touches no Rust state.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let code = main_with_args(std::env::args_os());
    if train::rank_failed() {
        // A failed rank of an MPI run: the others that failed at the same
        // point print their line before `mpirun`, seeing this process
        // exit, ends them.
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Runs the command with these arguments (the first is the program name,
/// as in `std::env::args_os()`) and returns its exit status: 0 on success,
/// 1 on an error (one line on stderr: `error: <file>: <what and where>`),
/// 2 on a usage error (clap's message on stderr; `--help` and `--version`
/// print to stdout and return 0). Never exits the process.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let result = match cli.cmd {
        Cmd::Optimize(a) => optimize::run(a),
        Cmd::Check(a) => check::run(a),
        Cmd::Inspect { input, json, dims } => inspect::run(&input, json, &dims),
        Cmd::Grad(a) => grad::run(a),
        Cmd::Plan(a) => plan::run(a),
        Cmd::Partition(a) => partition::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Train(a) => train::run(*a),
        Cmd::Remat(a) => remat::run(a),
        Cmd::Prune(a) => prune::run(*a),
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
        Ok(()) => 0,
        Err(e) => {
            // One write: the lines of several processes (mpirun's ranks)
            // sharing a stderr do not interleave.
            let line = format!("error: {e}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            1
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
