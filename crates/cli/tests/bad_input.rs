//! Bad data and out-of-range options, tried as a new user would (issue 25,
//! item 7): each is one line on stderr naming what was wrong and where,
//! exit status 1, nothing written, and no panic.
//!
//! - NaN or Inf in a calibration npz, a `--inputs` npz of `run`, `check`
//!   and `optimize --precision` (its range check and `--validate`);
//! - `run --threads 0` (and more threads than the machine runs), `run --repeat 0`;
//! - `remat` and `remat --sweep` on an inference model;
//! - numeric options out of range (`plan --time-limit -1` used to panic in
//!   `Duration::from_secs_f64`).

use graphopt::tract::npz;
use std::path::{Path, PathBuf};
use std::process::Command;

fn model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../testdata/models/{name}"))
}

/// `graphopt ARGS`: (exit code, stderr).
fn graphopt(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

/// Exit 1 with one line on stderr holding every `must`.
fn refused(args: &[&str], must: &[&str]) -> String {
    let (code, err) = graphopt(args);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(code, 1, "{args:?}: exit {code}, stderr: {err}");
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for m in must {
        assert!(lines[0].contains(m), "{args:?}: '{m}' missing in: {err}");
    }
    lines[0].to_string()
}

/// `model`'s inputs npz with element `at` of its first float array set to
/// `value`, written to `dir/name`; returns the path and that array's name.
fn poisoned(
    model_inputs: &Path,
    dir: &Path,
    name: &str,
    at: usize,
    value: f32,
) -> (String, String) {
    let arrays = npz::read(&std::fs::read(model_inputs).unwrap()).unwrap();
    let mut out = Vec::new();
    let mut hit = None;
    for (k, mut t) in arrays {
        if hit.is_none() {
            if let Ok(mut v) = t.to_plain_array_view_mut::<f32>() {
                *v.iter_mut().nth(at).unwrap() = value;
                hit = Some(k.clone());
            }
        }
        out.push((k, t));
    }
    let p = dir.join(name);
    std::fs::write(&p, npz::write(&out).unwrap()).unwrap();
    (p.display().to_string(), hit.expect("a float array"))
}

const RESNET: &str = "resnet_tiny.ts14";

fn resnet() -> String {
    model(&format!("{RESNET}.onnx")).display().to_string()
}

fn resnet_inputs() -> PathBuf {
    model(&format!("{RESNET}.inputs.npz"))
}

#[test]
fn nan_calibration_is_refused_naming_the_array_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (nan, array) = poisoned(&resnet_inputs(), dir.path(), "nan.npz", 5, f32::NAN);
    let out = dir.path().join("q.onnx");
    let out_s = out.display().to_string();
    let line = refused(
        &[
            "optimize",
            &resnet(),
            "-o",
            &out_s,
            "--quantize",
            "static",
            "--calibration",
            &nan,
        ],
        &[&nan, &format!("array '{array}'"), "NaN", "non-finite"],
    );
    assert!(!out.exists(), "{line}");
    // A directory of batches: the message names the file and the batch.
    let batches = dir.path().join("calib");
    std::fs::create_dir(&batches).unwrap();
    std::fs::copy(resnet_inputs(), batches.join("b1.npz")).unwrap();
    let (bad, _) = poisoned(&resnet_inputs(), &batches, "b2.npz", 0, f32::INFINITY);
    refused(
        &[
            "optimize",
            &resnet(),
            "-o",
            &out_s,
            "--quantize",
            "dynamic",
            "--calibration",
            &batches.display().to_string(),
        ],
        &[
            &bad,
            "calibration batch 2 of 2",
            "holds inf at [0, 0, 0, 0]",
        ],
    );
    assert!(!out.exists());
}

#[test]
fn nan_inputs_are_refused_by_run_check_and_precision() {
    let dir = tempfile::tempdir().unwrap();
    let (nan, array) = poisoned(&resnet_inputs(), dir.path(), "nan.npz", 3, f32::NAN);
    let named = format!("array '{array}' holds NaN");
    refused(&["run", &resnet(), "--inputs", &nan], &[&nan, &named]);
    refused(
        &["check", &resnet(), &resnet(), "--inputs", &nan],
        &[&nan, &named],
    );
    // The fp16 range check used to skip itself with a note; --validate=
    // best-effort would have lowered without validating.
    let out = dir.path().join("h.onnx").display().to_string();
    refused(
        &[
            "optimize",
            &resnet(),
            "-o",
            &out,
            "--precision",
            "fp16",
            "--inputs",
            &nan,
        ],
        &[&nan, &named],
    );
    refused(
        &[
            "optimize",
            &resnet(),
            "-o",
            &out,
            "--precision",
            "fp16",
            "--no-range-check",
            "--validate=best-effort",
            "--inputs",
            &nan,
        ],
        &[&nan, &named],
    );
    // The same file, finite, runs.
    let (ok, _) = poisoned(&resnet_inputs(), dir.path(), "ok.npz", 3, 0.5);
    let (code, err) = graphopt(&["run", &resnet(), "--inputs", &ok]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn run_threads_and_repeat_zero_are_refused() {
    refused(
        &["run", &resnet(), "--threads", "0"],
        &[&resnet(), "--threads 0: expected at least 1 thread"],
    );
    refused(
        &["run", &resnet(), "--repeat", "0"],
        &["--repeat 0: expected at least 1 run"],
    );
    // More threads than the machine can run at once.
    let over = (std::thread::available_parallelism().map_or(1, |n| n.get()) + 1).to_string();
    refused(
        &["run", &resnet(), "--threads", &over],
        &[&format!("--threads {over}: this machine runs at most")],
    );
}

#[test]
fn remat_on_an_inference_model_says_there_is_no_backward_pass() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.onnx").display().to_string();
    let want = [
        resnet(),
        "no backward pass: remat recomputes forward values for a training graph; \
         build one with `graphopt grad`"
            .to_string(),
    ];
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    refused(&["remat", &resnet(), "-o", &out, "--budget", "50%"], &want);
    refused(&["remat", &resnet(), "--sweep"], &want);
    // Two outputs, the second reading the first's cone (a head beside
    // the logits): still no loss.
    let two = dir.path().join("two.onnx");
    let m = graphopt::text::parse_model(
        "<ir_version: 8, opset_import: [\"\" : 17]>\n\
         two (float[4,8] x) => (float[4,8] y, float[4,8] z) {\n\
           a = Tanh (x)\n  y = Relu (a)\n  z = Sigmoid (a)\n}\n",
    )
    .unwrap();
    graphopt::Session::from_model(m).save(&two).unwrap();
    refused(
        &["remat", &two.display().to_string(), "--sweep"],
        &["no backward pass", "output 'y', has 32 elements"],
    );
}

#[test]
fn numeric_options_out_of_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.onnx").display().to_string();
    let m = resnet();
    let cases: &[(&[&str], &str)] = &[
        (
            &["plan", &m, "--time-limit=-1"],
            "--time-limit -1: expected a positive number of seconds",
        ),
        (&["plan", &m, "--time-limit", "nan"], "--time-limit NaN"),
        (
            &["plan", &m, "--alignment", "0"],
            "--alignment 0: expected a power of two",
        ),
        (&["plan", &m, "--alignment", "48"], "--alignment 48"),
        (&["plan", &m, "--threads", "0"], "--threads 0"),
        (&["plan", &m, "--default-dim=-2"], "--default-dim -2"),
        (
            &["remat", &m, "--sweep", "--time-limit", "0"],
            "--time-limit 0",
        ),
        (
            &["remat", &m, "--sweep", "--points", "1"],
            "--points 1: expected at least 2",
        ),
        (
            &["check", &m, &m, "--rtol=-1"],
            "--rtol -1: expected a number at least 0",
        ),
        (&["check", &m, &m, "--atol", "inf"], "--atol inf"),
        (
            &[
                "grad",
                &m,
                "-o",
                &out,
                "--optimizer",
                "adamw",
                "--betas",
                "0.9,1.0",
            ],
            "--betas 0.9,1: each beta must be in [0, 1)",
        ),
        (
            &["grad", &m, "-o", &out, "--optimizer", "sgd", "--lr", "0"],
            "--lr 0: expected a positive number",
        ),
        (
            &["grad", &m, "-o", &out, "--optimizer", "adamw", "--eps=-1"],
            "--eps -1",
        ),
        (
            &[
                "grad",
                &m,
                "-o",
                &out,
                "--optimizer",
                "adamw",
                "--weight-decay=-0.5",
            ],
            "--weight-decay -0.5",
        ),
        (
            &[
                "optimize",
                &m,
                "-o",
                &out,
                "--precision",
                "fp16",
                "--validate",
                "--rtol=-0.1",
            ],
            "--rtol -0.1",
        ),
        (
            &[
                "optimize",
                &m,
                "-o",
                &out,
                "--quantize",
                "int4-weights",
                "--block-size",
                "48",
            ],
            "--block-size 48",
        ),
        (
            &[
                "optimize",
                &m,
                "-o",
                &out,
                "--quantize",
                "dynamic",
                "--max-error",
                "0",
            ],
            "--max-error 0",
        ),
        (
            &[
                "optimize",
                &m,
                "-o",
                &out,
                "--quantize",
                "static",
                "--calibrate",
                "percentile:0",
            ],
            "the percentile must be a number in (0, 100]",
        ),
    ];
    for (args, want) in cases {
        refused(args, &[want]);
    }
    assert!(!Path::new(&out).exists());
}
