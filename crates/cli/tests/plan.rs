//! `graphopt plan`: JSON fields, the checker on every real model, interval
//! files, max batch, SVG, and one-line errors for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_graphopt"))
}

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models")
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run graphopt")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn one_line_error(out: &Output) -> String {
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

#[test]
fn json_has_the_issue_fields() {
    let m = models().join("resnet_tiny.ts14.onnx");
    let v = json(&run(&[
        "plan",
        m.to_str().unwrap(),
        "--json",
        "--verify",
        "--dim",
        "batch=2",
    ]));
    for k in [
        "weights_bytes",
        "naive_bytes",
        "lower_bound_bytes",
        "lower_bound_original_order_bytes",
        "arena_bytes",
        "alignment",
        "schedule",
        "tensors",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["alignment"], 256);
    assert_eq!(v["dims"]["batch"], 2);
    assert!(v["arena_bytes"].as_u64() >= v["lower_bound_bytes"].as_u64());
    assert!(v["lower_bound_bytes"].as_u64() <= v["lower_bound_original_order_bytes"].as_u64());
    let steps = v["schedule"].as_array().unwrap().len() as u64;
    for t in v["tensors"].as_array().unwrap() {
        for k in ["name", "size", "offset", "first", "last"] {
            assert!(t.get(k).is_some(), "tensor lacks {k}: {t}");
        }
        assert!(t["first"].as_u64() <= t["last"].as_u64());
        assert!(t["last"].as_u64().unwrap() < steps);
        assert_eq!(t["offset"].as_u64().unwrap() % 256, 0);
    }
}

#[test]
fn text_output_states_the_default_dim() {
    let m = models().join("resnet_tiny.ts14.onnx");
    let out = run(&["plan", m.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "weights:",
        "original order:",
        "chosen order:",
        "arena:",
        "naive (no reuse):",
        "live at the peak",
        "batch=1 (default)",
        "unbound dims are set to 1",
    ] {
        assert!(text.contains(want), "missing '{want}' in:\n{text}");
    }
}

/// The checker passes on every model of testdata (both exporters), and
/// the arena stays within 1% of the aligned bound of the chosen schedule
/// where the search reaches it (the ratios are in benches/README.md).
#[test]
fn every_real_model_plans_and_checks() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(models())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "expected the testdata models");
    for f in files {
        // Models with a value of data-dependent size (If/Loop, custom
        // ops) are planned without it.
        let out = run(&[
            "plan",
            f.to_str().unwrap(),
            "--json",
            "--verify",
            "--nodes",
            "20000",
        ]);
        let v = json(&out);
        assert_eq!(v["verified"], true, "{}", f.display());
        let arena = v["arena_bytes"].as_u64().unwrap();
        let bound = v["arena_lower_bound_bytes"].as_u64().unwrap();
        assert!(arena >= bound, "{}", f.display());
        assert!(
            arena <= v["naive_bytes"].as_u64().unwrap(),
            "{}",
            f.display()
        );
    }
}

#[test]
fn unknown_sizes_are_dynamic_unless_strict() {
    let m = models().join("if_loop.helper13.onnx");
    let err = one_line_error(&run(&["plan", m.to_str().unwrap(), "--strict"]));
    assert!(err.contains("unknown size"), "{err}");
    assert!(err.contains("--shape"), "{err}");
    let v = json(&run(&["plan", m.to_str().unwrap(), "--json", "--verify"]));
    let dynamic = v["dynamic_values"].as_array().unwrap();
    assert!(!dynamic.is_empty(), "{v}");
    let names: Vec<&str> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for d in dynamic {
        assert!(!names.contains(&d.as_str().unwrap()), "{d} is in the arena");
    }
}

#[test]
fn shapes_bind_inputs_by_hand_or_from_npz() {
    let m = models().join("bert_tiny.ts14.onnx");
    let npz = models().join("bert_tiny.ts14.inputs.npz");
    let by_npz = json(&run(&[
        "plan",
        m.to_str().unwrap(),
        "--inputs",
        npz.to_str().unwrap(),
        "--json",
    ]));
    // The npz holds [2, 8] token ids: the plan sees batch 2, sequence 8.
    let dims = &by_npz["dims"];
    let vals: Vec<i64> = dims
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(vals, [2, 8], "{dims}");
    assert!(
        by_npz["defaulted_dims"].as_array().unwrap().is_empty(),
        "{by_npz}"
    );
    let names: Vec<String> = dims.as_object().unwrap().keys().cloned().collect();
    let by_dim = json(&run(&[
        "plan",
        m.to_str().unwrap(),
        "--dim",
        &format!("{}=2", names[0]),
        "--dim",
        &format!("{}=8", names[1]),
        "--json",
    ]));
    assert_eq!(by_npz["arena_bytes"], by_dim["arena_bytes"]);
    let by_shape = json(&run(&[
        "plan",
        m.to_str().unwrap(),
        "--shape",
        "input_ids=2,8",
        "--shape",
        "attention_mask=2,8",
        "--shape",
        "token_type_ids=2,8",
        "--json",
    ]));
    assert_eq!(by_npz["arena_bytes"], by_shape["arena_bytes"]);
    // Wrong rank, wrong name, conflicting binding: one clear line each.
    for args in [
        &["--shape", "input_ids=2,16,3"][..],
        &["--shape", "nope=2"][..],
        &[
            "--shape",
            "input_ids=2,8",
            "--dim",
            &format!("{}=3", names[0]),
        ][..],
    ] {
        let err = one_line_error(&run(&[&["plan", m.to_str().unwrap()][..], args].concat()));
        assert!(err.contains("--shape"), "{args:?}: {err}");
    }
}

#[test]
fn intervals_mode() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    std::fs::write(
        &csv,
        "id,lower,upper,size\n0,0,2,4\n1,1,3,4\n2,2,4,4\n3,0,4,2\n",
    )
    .unwrap();
    let v = json(&run(&[
        "plan",
        "--intervals",
        csv.to_str().unwrap(),
        "--json",
        "--verify",
    ]));
    assert_eq!(v["lower_bound_bytes"], 10);
    assert_eq!(v["arena_bytes"], 10);
    assert_eq!(v["alignment"], 1);
    assert_eq!(v["tensors"].as_array().unwrap().len(), 4);
    assert_eq!(v["tensors"][3]["first"], 0);
    assert_eq!(v["tensors"][3]["last"], 3);
    let out = run(&["plan", "--intervals", csv.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("arena:"));
    // A hard MiniMalloc instance (vendored in testdata/minimalloc).
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/minimalloc/C.1048576.csv");
    assert!(c.exists(), "{} is missing", c.display());
    {
        let v = json(&run(&[
            "plan",
            "--intervals",
            c.to_str().unwrap(),
            "--json",
            "--verify",
        ]));
        assert_eq!(v["arena_bytes"], 1_039_360);
    }
}

#[test]
fn bad_csv_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("bad.csv");
    std::fs::write(&csv, "id,lower,upper,size\n0,0,x,4\n").unwrap();
    let err = one_line_error(&run(&["plan", "--intervals", csv.to_str().unwrap()]));
    assert!(err.contains("line 2"), "{err}");
    one_line_error(&run(&["plan", "--intervals", "/nonexistent/x.csv"]));
    one_line_error(&run(&["plan", "/nonexistent/model.onnx"]));
    let out = run(&["plan"]);
    assert!(!out.status.success());
}

#[test]
fn max_batch_under_a_budget() {
    let m = models().join("resnet_tiny.ts14.onnx");
    let v = json(&run(&[
        "plan",
        m.to_str().unwrap(),
        "--budget",
        "2MB",
        "--max-batch",
        "--json",
        "--verify",
    ]));
    assert_eq!(v["batch_dim"], "batch");
    let b = v["max_batch"].as_i64().unwrap();
    assert!(b >= 1);
    let total = v["weights_bytes"].as_u64().unwrap() + v["arena_bytes"].as_u64().unwrap();
    assert!(total <= 2_000_000);
    // One more does not fit.
    let more = json(&run(&[
        "plan",
        m.to_str().unwrap(),
        "--dim",
        &format!("batch={}", b + 1),
        "--json",
    ]));
    let t2 = more["weights_bytes"].as_u64().unwrap() + more["arena_bytes"].as_u64().unwrap();
    assert!(t2 > 2_000_000, "batch {} also fits: {t2}", b + 1);
    let err = one_line_error(&run(&[
        "plan",
        m.to_str().unwrap(),
        "--budget",
        "100KB",
        "--max-batch",
    ]));
    assert!(err.contains("too small"), "{err}");
}

#[test]
fn svg_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("p.svg");
    let m = models().join("gpt2_tiny.ts14.onnx");
    let out = run(&["plan", m.to_str().unwrap(), "--svg", svg.to_str().unwrap()]);
    assert!(out.status.success());
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    assert!(text.contains("original order") && text.contains("chosen order"));
    assert!(text.contains("Arena layout"));
    assert!(text.trim_end().ends_with("</svg>"));
}
