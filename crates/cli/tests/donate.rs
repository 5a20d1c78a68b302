//! `--no-donate` on `run` and `remat`: a training step from `grad` carries
//! a donation table (`<p>_new` written over `<p>`); both commands honour it
//! by default and plan the outputs apart with `--no-donate`, with the same
//! outputs either way.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn graphopt(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

fn ok(args: &[&str]) -> String {
    let (code, out, err) = graphopt(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn run_and_remat_honour_the_table_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/train/digits_mlp.onnx");
    let step = dir.path().join("step.onnx");
    ok(&[
        "grad",
        &s(&model),
        "-o",
        &s(&step),
        "--optimizer",
        "adamw",
        "--params-as-inputs",
    ]);
    let mut outputs = Vec::new();
    for (flag, donated) in [(None, true), (Some("--no-donate"), false)] {
        let out = dir.path().join(format!("out-{donated}.npz"));
        let mut args = vec!["run", step.to_str().unwrap(), "--dim", "batch=16", "--json"];
        args.extend(["-o", out.to_str().unwrap()]);
        args.extend(flag);
        let r: Value = serde_json::from_str(&ok(&args)).unwrap();
        // The MLP's 19 parameters and moments: 609,920 bytes held once.
        assert_eq!(r["donated_bytes"].as_u64().unwrap() > 0, donated, "{r}");
        outputs.push(std::fs::read(&out).unwrap());

        let rm = dir.path().join(format!("remat-{donated}.onnx"));
        let mut args = vec!["remat", step.to_str().unwrap(), "-o", rm.to_str().unwrap()];
        args.extend(["--dim", "batch=16", "--budget", "100%", "--json"]);
        args.extend(flag);
        let r: Value = serde_json::from_str(&ok(&args)).unwrap();
        assert_eq!(r["donated_bytes"].as_u64().unwrap() > 0, donated, "{r}");
    }
    assert_eq!(
        outputs[0], outputs[1],
        "donation changed the step's outputs"
    );
}

#[test]
fn torch_parameter_names_with_colons_are_donated() {
    // torch's exporter names folded weights `onnx::Conv_117`: every one of
    // resnet_tiny's 26 parameters is donated (the table escapes the `:`).
    let dir = tempfile::tempdir().unwrap();
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models/resnet_tiny.ts14.onnx");
    let step = dir.path().join("step.onnx");
    ok(&[
        "grad",
        &s(&model),
        "-o",
        &s(&step),
        "--optimizer",
        "sgd",
        "--params-as-inputs",
        "--loss",
        "cross_entropy",
    ]);
    let r: Value =
        serde_json::from_str(&ok(&["plan", &s(&step), "--dim", "batch=2", "--json"])).unwrap();
    let donated = r["donated"].as_array().unwrap();
    assert_eq!(donated.len(), 26, "{}", r["donations_refused"]);
    assert!(
        donated.iter().any(|d| d.to_string().contains("onnx::Conv")),
        "{r}"
    );
    assert_eq!(r["donations_refused"], serde_json::json!([]));
}
