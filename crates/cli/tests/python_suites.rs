//! The Python-side suites, run against the `graphopt` binary cargo built:
//! - every real model in `testdata/models` round-trips with `--passes none`
//!   to bit-identical onnxruntime outputs, and through the default pipeline
//!   within tolerance;
//! - the ONNX backend node tests (generated from the installed `onnx`
//!   wheel) round-trip to outputs bit-identical to the original's;
//! - the same node tests, where every op has a CPU kernel, run in
//!   graphopt's runtime to the cases' expected outputs (`--exec`);
//! - every real model lowered with `--precision fp16|bf16|fp16-weights
//!   --validate` passes the full onnx checker and runs in onnxruntime
//!   within tolerance of the reference outputs;
//! - every real model's training graph (`graphopt grad --loss mse`) passes
//!   the full onnx checker, uses only the default domain, and runs in plain
//!   onnxruntime with the loss of the reference output;
//! - AdamW training graphs (`--optimizer adamw --params-as-inputs
//!   --init-out`) of the torch modules in `testdata/autodiff/torch`, looped
//!   in onnxruntime, match AdamW in numpy step by step and torch.optim.AdamW
//!   after 3 steps;
//! - `graphopt grad --dropout-train`: onnxruntime's random training-mode
//!   masks, and gradients `dy·mask/(1 - ratio)` from the masks of the same
//!   run;
//! - a real training run: the untrained digits CNN of
//!   `testdata/autodiff/digits`, trained 300 steps by looping its SGD
//!   training graph in onnxruntime, follows torch's committed loss curve
//!   step by step and reaches torch's test accuracy;
//! - every real model's training graph rewritten by `graphopt remat` gives
//!   a loss and gradients bit-identical to the training graph's in
//!   onnxruntime.
//!
//! - every real model pruned by `graphopt prune --ratio 0.3` passes the
//!   full onnx checker, holds the parameters its report gives, runs in
//!   onnxruntime with the error graphopt measured, and is accepted by
//!   `optimize`, `plan` and `grad`.
//!
//! They run in the pinned Python environment of `graphopt-testutil` (a
//! venv under `target/` with `tests-py/requirements.txt` installed). Without
//! it they are skipped with a note, unless `GRAPHOPT_REQUIRE_PYTHON=1` or
//! `CI=true`: then they fail.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run_script(script: &str, args: &[&str]) {
    let Some(python) = graphopt_testutil::python_or_skip(script) else {
        return;
    };
    let out = Command::new(python)
        .arg(repo().join("tests-py").join(script))
        .arg("--graphopt")
        .arg(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Show the summary lines in the test log.
    let tail: Vec<&str> = stdout.lines().rev().take(6).collect();
    for l in tail.iter().rev() {
        eprintln!("{script}: {l}");
    }
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{stdout}\n{stderr}"
    );
}

#[test]
fn real_models_round_trip_bit_identically_in_onnxruntime() {
    run_script(
        "roundtrip_models.py",
        &["--passes", "none", "--strict-structure"],
    );
}

#[test]
fn real_models_through_default_pipeline_in_onnxruntime() {
    run_script("roundtrip_models.py", &[]);
}

#[test]
fn onnx_backend_node_conformance() {
    run_script("conformance.py", &["--jobs", "2", "--plan"]);
}

/// The kernel unit tests: every ONNX node test whose ops all have CPU
/// kernels runs in graphopt's runtime (`graphopt run --poison`) and matches
/// the case's expected outputs at its rtol/atol; the script's
/// `EXEC_KNOWN_FAILURES` must list exactly the cases that fail. About a
/// minute on two cores.
#[test]
fn onnx_backend_node_tests_run_in_graphopt_exec() {
    run_script("conformance.py", &["--jobs", "2", "--exec"]);
}

#[test]
fn real_models_lowered_to_fp16_bf16_run_in_onnxruntime() {
    run_script("precision_models.py", &["--validate"]);
}

#[test]
fn training_graphs_run_in_onnxruntime() {
    run_script("grad_models.py", &[]);
}

/// Two models here (GPT-2 with every strategy, MobileNetV3); every model with
/// `cargo test -- --ignored` (about 15 minutes on two busy cores).
#[test]
fn adamw_training_graphs_match_numpy_and_torch_in_onnxruntime() {
    run_script("grad_optim.py", &[]);
}

#[test]
fn dropout_training_graph_runs_in_onnxruntime() {
    run_script("grad_dropout.py", &[]);
}

#[test]
fn digits_cnn_trains_like_torch_in_onnxruntime() {
    run_script("grad_digits_train.py", &[]);
}

#[test]
fn rematerialized_training_graphs_are_bit_identical_in_onnxruntime() {
    run_script(
        "remat_models.py",
        &["--models", "gpt2_tiny.ts14,mobilenet_v3_small.ts14"],
    );
}

#[test]
#[ignore = "every testdata model: minutes"]
fn rematerialized_training_graphs_of_every_model_are_bit_identical_in_onnxruntime() {
    run_script("remat_models.py", &[]);
}

#[test]
fn pruned_real_models_run_in_onnxruntime() {
    run_script("prune_models.py", &[]);
}
