//! The `graphopt` command.
//!
//! `optimize`, `inspect`, `plan`, `print` and `passes`. Errors are one line on
//! stderr (`error: <file>: <what and where>`) with exit status 1; usage
//! errors exit with 2.

mod inspect;
mod optimize;
mod plan;
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
    /// Memory plan: lower bounds, schedule, arena offsets, max batch.
    Plan(plan::Args),
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
        Cmd::Inspect { input, json, dims } => inspect::run(&input, json, &dims),
        Cmd::Plan(a) => plan::run(a),
        Cmd::Print { input, full } => print(&input, full),
        Cmd::Passes => {
            for p in graphopt_passes::registry() {
                println!("{:<22} {}", p.name, p.doc);
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let msg = e.to_string().replace('\n', " ");
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn print(input: &std::path::Path, full: bool) -> anyhow::Result<()> {
    let loaded = graphopt_onnx::load(input)?;
    let opts = graphopt_text::PrintOptions {
        elide_above: if full {
            None
        } else {
            graphopt_text::PrintOptions::default().elide_above
        },
    };
    let text = graphopt_text::print_model(&loaded.model, &opts);
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`graphopt print m.onnx | head`) is not an error.
    let _ = out.write_all(text.as_bytes());
    Ok(())
}
