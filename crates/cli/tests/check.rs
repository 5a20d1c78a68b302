//! `graphopt check`, honest `--validate`, and `--opset`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models")
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .output()
        .expect("graphopt runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn fp16_copy(dir: &Path) -> (String, String) {
    let src = models().join("bert_tiny.ts14.onnx");
    let dst = dir.join("b16.onnx");
    let o = run(&[
        "optimize",
        src.to_str().unwrap(),
        "-o",
        dst.to_str().unwrap(),
        "--precision",
        "fp16",
        "-q",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    (src.display().to_string(), dst.display().to_string())
}

#[test]
fn check_passes_identical_and_fails_past_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let (src, b16) = fp16_copy(dir.path());
    // A model against itself: every output identical, exit 0.
    let o = run(&["check", &src, &src]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("identical"), "{}", text(&o));
    // fp16 against fp32 at Polygraphy's default tolerance: exit 1, one
    // error line naming the outputs.
    let o = run(&["check", &src, &b16]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("'last_hidden_state'"), "{err}");
    // At fp16's tolerance, per tensor, it passes.
    let o = run(&[
        "check",
        &src,
        &b16,
        "--rtol",
        "1e-2",
        "--atol",
        "1e-3",
        "--tensor-scale",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    let outs = v["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 2);
    for out in outs {
        let rel = out["rel_l2"].as_f64().unwrap();
        // fp16 moved it, but not far (measured 3e-4 and 6e-4).
        assert!(rel > 0.0 && rel < 2e-3, "{out}");
    }
}

#[test]
fn check_reads_npz_inputs_and_refuses_mismatched_models() {
    let src = models().join("bert_tiny.ts14.onnx");
    let npz = models().join("bert_tiny.ts14.inputs.npz");
    let o = run(&[
        "check",
        src.to_str().unwrap(),
        src.to_str().unwrap(),
        "--inputs",
        npz.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["inputs"], npz.display().to_string());
    // Another model's inputs: a clear one-line error.
    let vit = models().join("vit_tiny.ts14.onnx");
    let o = run(&["check", src.to_str().unwrap(), vit.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is not an input of"),
        "{}",
        text(&o)
    );
    // A truncated npz is an error, not a panic.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.npz");
    let bytes = std::fs::read(&npz).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    let o = run(&[
        "check",
        src.to_str().unwrap(),
        src.to_str().unwrap(),
        "--inputs",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
}

#[test]
fn validate_over_tolerance_fails_and_writes_nothing_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.onnx");
    // An fp16 graph input (vit's pixels) rounds what every node sees and
    // cannot be kept fp32, so a zero tolerance cannot be met by any fallback.
    let args = |force: bool| {
        let mut a = vec![
            "optimize".to_string(),
            models().join("vit_tiny.ts14.onnx").display().to_string(),
            "-o".into(),
            out.display().to_string(),
            "--precision".into(),
            "fp16".into(),
            "--no-keep-io-types".into(),
            "--validate".into(),
            "--rtol".into(),
            "0".into(),
            "--atol".into(),
            "0".into(),
        ];
        if force {
            a.push("--force".into());
        }
        a
    };
    let o = Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args(false))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("NOT within tolerance"),
        "{}",
        text(&o)
    );
    assert!(!out.exists(), "an invalid model was written");
    let o = Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args(true))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(out.exists(), "--force must write the model");
}

#[test]
fn validation_that_cannot_run_is_an_error_unless_best_effort() {
    let dir = tempfile::tempdir().unwrap();
    let src = models().join("bert_tiny.ts14.onnx");
    let out = dir.path().join("out.onnx");
    let base = [
        "optimize",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--precision",
        "bf16",
    ];
    let o = run(&[&base[..], &["--validate"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--validate cannot run"), "{}", text(&o));
    assert!(!out.exists());
    let o = run(&[&base[..], &["--validate=best-effort"]].concat());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("NOT validated"), "{}", text(&o));
    assert!(out.exists());
}

#[test]
fn opset_flag_upgrades_then_fuses_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    for (name, want) in [
        ("bert_tiny.ts14.onnx", &["fuse_layer_norm", "fuse_gelu"][..]),
        (
            "whisper_encoder_tiny.ts14.onnx",
            &["fuse_layer_norm", "fuse_gelu"][..],
        ),
    ] {
        let src = models().join(name);
        let out = dir.path().join(name);
        let rep = dir.path().join("r.json");
        let o = run(&[
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--opset",
            "20",
            "--report",
            rep.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
        assert_eq!(r["opset_before"], 14, "{name}");
        assert_eq!(r["opset_after"], 20, "{name}");
        for f in want {
            assert!(
                r["fusions"][f]["nodes_removed"].as_u64().unwrap_or(0) > 0,
                "{name}: {f} did not fire: {}",
                r["fusions"]
            );
        }
        assert!(text(&o).contains("fusions fired:"), "{}", text(&o));
        // Without --opset the opset-17/20 fusions cannot fire.
        let o = run(&[
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--report",
            rep.to_str().unwrap(),
        ]);
        assert!(o.status.success());
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
        assert!(r["fusions"].get("fuse_layer_norm").is_none(), "{name}");
    }
}
