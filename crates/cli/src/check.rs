//! `graphopt check A.onnx B.onnx [--inputs X.npz] [--rtol R] [--atol A] [--json]`:
//! both models on the same inputs, every output compared; exit 1 past the
//! tolerance.

use crate::util::{json_text, print_out};
use graphopt::{CheckOptions, Inputs, Scale, Tolerance};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The reference model.
    reference: PathBuf,
    /// The model to compare with it (inputs and outputs matched by name).
    candidate: PathBuf,
    /// Inputs by name (numpy `np.savez`); default: seeded random inputs.
    #[arg(long, value_name = "FILE.npz")]
    inputs: Option<PathBuf>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 7, conflicts_with = "inputs")]
    seed: u64,
    /// Bind a symbolic dim of the random inputs (NAME=VALUE), repeatable;
    /// unbound ones are 4.
    #[arg(long = "dim", value_name = "NAME=VALUE", conflicts_with = "inputs")]
    dims: Vec<String>,
    /// Relative tolerance: |b - a| <= atol + rtol * |a| per element.
    #[arg(long, default_value_t = 1e-5, value_name = "R")]
    rtol: f64,
    /// Absolute tolerance.
    #[arg(long, default_value_t = 1e-5, value_name = "A")]
    atol: f64,
    /// Measure rtol against each output's largest magnitude instead of each
    /// element's (as --validate does for low precision).
    #[arg(long)]
    tensor_scale: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> graphopt::Result<()> {
    let inputs = match &a.inputs {
        Some(p) => Inputs::Npz(p.clone()),
        None => Inputs::Random {
            seed: a.seed,
            dims: graphopt::util::parse_dims(&a.dims)?,
            default_dim: 4,
        },
    };
    let reference = graphopt::load(&a.reference)?;
    let candidate = graphopt::load(&a.candidate)?;
    let report = reference.check(
        &candidate,
        &CheckOptions {
            inputs,
            tolerance: Tolerance {
                rtol: a.rtol,
                atol: a.atol,
                scale: if a.tensor_scale {
                    Scale::Tensor
                } else {
                    Scale::Element
                },
            },
        },
    )?;
    if a.json {
        print_out(&json_text(&report)?);
    } else {
        let mut out = format!(
            "reference {}\ncandidate {}\ninputs    {}\ntolerance rtol {} atol {} ({})\n",
            report.reference,
            report.candidate,
            report.inputs,
            a.rtol,
            a.atol,
            if a.tensor_scale {
                "per tensor"
            } else {
                "per element"
            }
        );
        out += &format!(
            "{:<28} {:>12} {:>12} {:>12} {:>14}  {}\n",
            "output", "max abs", "max rel", "rel L2", "mismatched", "result"
        );
        for o in &report.outputs {
            let result = match (&o.error, o.identical, o.ok) {
                (Some(e), _, _) => format!("FAIL ({e})"),
                (None, true, _) => "identical".into(),
                (None, false, true) => "ok".into(),
                (None, false, false) => "FAIL".into(),
            };
            out += &format!(
                "{:<28} {:>12.3e} {:>12.3e} {:>12.3e} {:>14}  {result}\n",
                o.name,
                o.max_abs,
                o.max_rel,
                o.rel_l2,
                format!("{}/{}", o.mismatched, o.elements)
            );
        }
        out += if report.ok {
            "PASSED: every output within tolerance\n"
        } else {
            "FAILED\n"
        };
        print_out(&out);
    }
    report.require_ok()
}
