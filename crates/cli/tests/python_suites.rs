//! The Python-side suites, run against the `graphopt` binary cargo built:
//! - every real model in `testdata/models` round-trips with `--passes none`
//!   to bit-identical onnxruntime outputs, and through the default pipeline
//!   within tolerance;
//! - the ONNX backend node tests (generated from the installed `onnx`
//!   wheel) round-trip to outputs bit-identical to the original's;
//! - every real model lowered with `--precision fp16|bf16|fp16-weights
//!   --validate` passes the full onnx checker and runs in onnxruntime
//!   within tolerance of the reference outputs;
//! - every real model's training graph (`graphopt grad --loss mse`) passes
//!   the full onnx checker, uses only the default domain, and runs in plain
//!   onnxruntime with the loss of the reference output.
//!
//! They need python3 with the packages in `tests-py/requirements.txt`; this
//! test installs them with pip when they are missing. Without Python they
//! are skipped with a note, unless `GRAPHOPT_REQUIRE_PYTHON=1` (CI sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn required() -> bool {
    std::env::var("GRAPHOPT_REQUIRE_PYTHON").is_ok_and(|v| v == "1")
}

/// Makes sure python3 has the pinned packages; false when they cannot be had.
fn python_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let req = repo().join("tests-py/requirements.txt");
        let check = "import onnx, onnxruntime, numpy; assert onnx.__version__ == '1.23.2' and onnxruntime.__version__ == '1.32.0'";
        let ok = |c: &str| Command::new("python3").args(["-c", c]).output().is_ok_and(|o| o.status.success());
        if ok(check) {
            return true;
        }
        eprintln!("installing {} with pip", req.display());
        let installed = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "-r"])
            .arg(&req)
            .status()
            .is_ok_and(|s| s.success());
        installed && ok(check)
    })
}

fn run_script(script: &str, args: &[&str]) {
    if !python_ready() {
        assert!(
            !required(),
            "python3 with onnx/onnxruntime is required but could not be set up"
        );
        eprintln!(
            "SKIPPED {script}: python3 with onnx 1.23.2 / onnxruntime 1.32.0 is not available"
        );
        return;
    }
    let out = Command::new("python3")
        .arg(repo().join("tests-py").join(script))
        .arg("--graphopt")
        .arg(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("python3 runs");
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
    run_script("conformance.py", &["--jobs", "2"]);
}

#[test]
fn real_models_lowered_to_fp16_bf16_run_in_onnxruntime() {
    run_script("precision_models.py", &["--validate"]);
}

#[test]
fn training_graphs_run_in_onnxruntime() {
    run_script("grad_models.py", &[]);
}
