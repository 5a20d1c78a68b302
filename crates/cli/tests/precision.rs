//! `--precision`: numerical checks of the lowering on the real models in
//! `testdata/models/` with tract as the reference executor, Cast hygiene
//! on every output, and the CLI's validation/fallback contract.
//!
//! tract has no bfloat16 and lacks some fp16 kernels: such runs are skipped
//! with the reason printed (onnxruntime covers them in
//! `tests-py/precision_models.py`).

use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{DType, Graph, Model};
use graphopt_passes::lower_precision::{LowerPrecision, Precision};
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_graphopt"))
}

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models")
}

fn models() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(models_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    v
}

/// (Cast chains, same-type Casts) over `g` and its subgraphs, with types
/// from graphopt's inference.
fn cast_hygiene(m: &Model) -> (usize, usize) {
    let mut m = m.clone();
    infer_model(&mut m, &InferOptions::default());
    fn walk(g: &Graph, acc: &mut (usize, usize)) {
        for n in g.nodes() {
            let d = g.node(n);
            if d.op_type == "Cast" && d.domain.is_empty() {
                let x = d.input(0).unwrap();
                if g.producer_node(x).is_some_and(|p| p.op_type == "Cast") {
                    acc.0 += 1;
                }
                let to = d.attr_int("to").map(|c| DType::from_onnx(c as i32));
                if to.is_some() && g.ty(x).and_then(|t| t.elem()) == to {
                    acc.1 += 1;
                }
            }
        }
        for (_, s) in g.subgraphs() {
            walk(s, acc);
        }
    }
    let mut acc = (0, 0);
    walk(&m.graph, &mut acc);
    acc
}

fn io_types(m: &Model) -> Vec<(String, Option<DType>)> {
    let g = &m.graph;
    g.inputs
        .iter()
        .chain(&g.outputs)
        .map(|&v| (g.name(v).to_string(), g.ty(v).and_then(|t| t.elem())))
        .collect()
}

#[test]
fn lowered_models_match_fp32_in_tract() {
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    for path in models() {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let loaded = graphopt_onnx::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let original = loaded.model;
        let (mut f32_bytes, mut all_bytes) = (0, 0);
        for &v in original.graph.initializers() {
            let t = original.graph.initializer(v).unwrap();
            all_bytes += t.nbytes();
            if t.dtype == DType::F32 {
                f32_bytes += t.nbytes();
            }
        }
        let f32_model = f32_bytes * 10 > all_bytes * 9;
        // The model's saved inputs (what testdata/tolerances.json was
        // measured on), else seeded random ones.
        let saved = models_dir().join(format!("{name}.inputs.npz"));
        let inputs = if saved.exists() {
            graphopt_tract::npz::read_inputs(&saved, &original)
        } else {
            graphopt_tract::sample_inputs(&original, &[], 3, 7)
        };
        let reference = inputs.and_then(|inputs| {
            let r = graphopt_tract::run_bytes(&graphopt_tract::prepare(&original)?, &inputs)?;
            Ok((inputs, r))
        });
        for precision in [Precision::F16, Precision::F16Weights, Precision::BF16] {
            let label = format!("{name} [{}]", precision.name());
            let mut m = original.clone();
            let pass = LowerPrecision {
                precision,
                ..LowerPrecision
            };
            let r = pass
                .lower(&mut m)
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            graphopt_ir::verify::verify_model(&m).unwrap_or_else(|e| panic!("{label}: {e}"));
            // Rules that hold whatever runs the model.
            assert_eq!(
                io_types(&m),
                io_types(&original),
                "{label}: io types changed"
            );
            let (c0, s0) = cast_hygiene(&original);
            let (c1, s1) = cast_hygiene(&m);
            assert!(
                c1 <= c0 && s1 <= s0,
                "{label}: Cast chains {c0}->{c1}, same-type {s0}->{s1}"
            );
            if f32_model && r.weight_bytes_before > 4096 {
                let ratio = r.weight_bytes_after as f64 / r.weight_bytes_before as f64;
                assert!(ratio <= 0.51, "{label}: weights {ratio:.3}x");
            }
            // Numbers, where tract can run both.
            let Ok((inputs, reference)) = &reference else {
                assert!(
                    TRACT_CANNOT_RUN.contains(&name.as_str()),
                    "{name}: tract cannot run the fp32 model, and it is not in TRACT_CANNOT_RUN"
                );
                skipped.push(format!("{label}: tract cannot run the fp32 model"));
                continue;
            };
            assert!(
                !TRACT_CANNOT_RUN.contains(&name.as_str()),
                "{name} runs in tract now: take it off TRACT_CANNOT_RUN"
            );
            if precision == Precision::BF16 {
                skipped.push(format!("{label}: tract has no bfloat16"));
                continue;
            }
            let bytes = graphopt_tract::prepare(&graphopt_tract::fp16_proxy(&m).unwrap()).unwrap();
            // The fp16 emulation runs every low node in fp32 between
            // Casts, so a model tract runs in fp32 runs lowered too.
            let got = graphopt_tract::run_bytes(&bytes, inputs)
                .unwrap_or_else(|e| panic!("{label}: tract cannot run the lowered model: {e:#}"));
            let bound = bound(&name, precision.name());
            let diffs = graphopt_tract::compare::compare_outputs(
                &[],
                reference,
                &got,
                &graphopt_tract::compare::Tolerance::default(),
            );
            assert_eq!(diffs.len(), reference.len(), "{label}: output count");
            for d in &diffs {
                assert!(
                    d.rel_l2 <= bound,
                    "{label}: output {}: rel L2 {} > {bound}",
                    d.name,
                    d.rel_l2
                );
            }
            let worst = diffs.iter().fold(0f64, |a, d| a.max(d.rel_l2));
            ran.push(format!("{label}: worst output rel L2 {worst:.2e}"));
        }
    }
    eprintln!("precision numerics, checked:\n  {}", ran.join("\n  "));
    eprintln!("skipped:\n  {}", skipped.join("\n  "));
}

/// Models whose fp32 original tract cannot run (custom domain, If/Loop,
/// fp16 Gemm), so their lowering is checked in onnxruntime only
/// (tests-py/precision_models.py). Every other model is checked here; a
/// listed model that runs fails the test, so the list cannot go stale.
const TRACT_CANNOT_RUN: &[&str] = &[
    "custom_domain.helper17",
    "if_loop.helper13",
    "mlp_fp16.dynamo18",
    "mlp_fp16.ts14",
    "scripted_cf.ts14",
    "scripted_cf.ts9",
];

/// The bound of `testdata/tolerances.json` for `model` in `mode`; a missing
/// entry is an error, not a default.
fn bound(model: &str, mode: &str) -> f64 {
    static TABLE: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let p = models_dir().join("../tolerances.json");
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
    });
    t["bounds"][model][mode]
        .as_f64()
        .unwrap_or_else(|| panic!("testdata/tolerances.json has no bound for {model} {mode}"))
}

fn write_model(dir: &Path, name: &str, text: &str) -> PathBuf {
    let m = graphopt_text::parse_model(text).unwrap();
    let p = dir.join(name);
    graphopt_onnx::save(&m, &p, &graphopt_onnx::SaveOptions::default()).unwrap();
    p
}

/// `graphopt optimize SRC -o OUT ARGS...`, which must succeed.
fn optimize_ok(src: &Path, out: &Path, args: &[&str]) {
    let o = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn report(path: &Path) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["precision"].clone()
}

/// An fp16 MatMul whose products exceed ±65504: validation must find it
/// and keep it fp32, and then be within tolerance.
const OVERFLOW: &str = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y) <float[4,4] w = {60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0}, float[4,4] v = {4.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 4.0}> {
  [first] a = MatMul (x, v)
  [big] m = MatMul (a, w)
  y = Neg (m)
}
"#;

#[test]
fn validate_keeps_overflowing_nodes_fp32() {
    let dir = tempfile::tempdir().unwrap();
    let src = write_model(dir.path(), "overflow.onnx", OVERFLOW);
    let out = dir.path().join("out.onnx");
    let rep = dir.path().join("r.json");
    // Without validation the fp16 model overflows (checked in tract).
    let st = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--precision",
            "fp16",
            "-q",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let o = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args([
            "--precision",
            "fp16",
            "--validate",
            // The range check would keep `big` before validation runs.
            "--no-range-check",
            "--report",
            rep.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("kept fp32 by validation: big"), "{stdout}");
    let p = report(&rep);
    let v = &p["validation"];
    assert_eq!(v["ok"], true, "{p}");
    assert_eq!(v["first"]["ok"], false, "{p}");
    assert_eq!(v["kept_nodes"], serde_json::json!(["big"]), "{p}");
    assert!(
        v["max_abs"].as_f64().unwrap() <= 1e-3 + 1e-2 * 960000.0,
        "{p}"
    );
    // `first` stays low: only the culprit is kept.
    assert!(p["nodes_lowered"].as_u64().unwrap() >= 1, "{p}");
}

/// A product whose values are far below fp16's normal range (weights of
/// 1e-7: most results would be subnormal or zero in fp16).
const UNDERFLOW: &str = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y) <float[4,4] w = {1e-7, 2e-7, 1e-7, 3e-7, 2e-7, 1e-7, 1e-7, 1e-7, 1e-7, 1e-7, 2e-7, 1e-7, 3e-7, 1e-7, 1e-7, 2e-7}, float[4,4] v = {4.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 4.0}> {
  [first] a = MatMul (x, v)
  [tiny] m = MatMul (a, w)
  [scale] y = Mul (m, m)
}
"#;

/// The fp16 range check: one fp32 run in tract finds the activations fp16
/// cannot hold and keeps their producers and readers fp32, without
/// --validate; `first` stays low. On bert_tiny it finds the attention
/// mask (finfo.min, -3.4e38) and keeps its Where and Adds fp32.
#[test]
fn range_check_keeps_out_of_range_activations_fp32() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.onnx");
    let rep = dir.path().join("r.json");
    let run = |src: &Path, extra: &[&str]| -> serde_json::Value {
        let args = [
            &["--precision", "fp16", "--report", rep.to_str().unwrap()],
            extra,
        ]
        .concat();
        optimize_ok(src, &out, &args);
        report(&rep)
    };
    // The graph output is checked too (first), then the intermediates.
    for (name, text, values_out, kept) in [
        (
            "overflow.onnx",
            OVERFLOW,
            vec!["y", "m"],
            vec!["big", "Neg#2"],
        ),
        (
            "underflow.onnx",
            UNDERFLOW,
            vec!["y", "m"],
            vec!["tiny", "scale"],
        ),
    ] {
        let src = write_model(dir.path(), name, text);
        let p = run(&src, &[]);
        let rc = &p["range_check"];
        assert!(rc["skipped"].is_null(), "{p}");
        let values: Vec<&str> = rc["out_of_range"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["value"].as_str().unwrap())
            .collect();
        assert_eq!(values, values_out, "{name}: {p}");
        assert_eq!(rc["kept_nodes"], serde_json::json!(kept), "{name}: {p}");
        assert_eq!(
            p["nodes_lowered"], 1,
            "{name}: only `first` computes low: {p}"
        );
        // Off, both products run low.
        let p = run(&src, &["--no-range-check"]);
        assert!(p["range_check"].is_null(), "{p}");
        assert!(p["nodes_lowered"].as_u64().unwrap() >= 2, "{name}: {p}");
    }
    let p = run(&models_dir().join("bert_tiny.ts14.onnx"), &[]);
    let rc = &p["range_check"];
    let found = rc["out_of_range"].as_array().unwrap();
    assert!(
        !found.is_empty() && found.iter().all(|o| o["max_abs"].as_f64().unwrap() > 1e38),
        "{p}"
    );
    assert!(!rc["kept_nodes"].as_array().unwrap().is_empty(), "{p}");
}

/// With --precision the pipeline leaves out `fuse_conv_bn` (folded
/// BatchNorm weights lost more in fp16 on PaddleOCR models); `--skip ''`
/// keeps it, and without --precision it runs.
#[test]
fn precision_leaves_batchnorm_unfolded_unless_asked() {
    let text = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,2,4,4] x) => (float[1,2,4,4] y) <float[2,2,1,1] w = {1.0, 0.5, 0.25, 2.0}, float[2] s = {1.5, 0.5}, float[2] b = {0.1, -0.2}, float[2] m = {0.3, 0.1}, float[2] v = {2.0, 0.5}> {
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
"#;
    let dir = tempfile::tempdir().unwrap();
    let src = write_model(dir.path(), "bn.onnx", text);
    let out = dir.path().join("out.onnx");
    let bn_left = |extra: &[&str]| -> bool {
        optimize_ok(&src, &out, &[&["-q"], extra].concat());
        let m = graphopt_onnx::load(&out).unwrap().model;
        let g = &m.graph;
        let found = g.nodes().any(|n| g.node(n).op_type == "BatchNormalization");
        found
    };
    assert!(!bn_left(&[]));
    assert!(bn_left(&["--precision", "fp16"]));
    assert!(!bn_left(&["--precision", "fp16", "--skip", ""]));
    assert!(bn_left(&["--skip", "fuse_conv_bn"]));
}

/// Weights only fp32 nodes read are stored low with a Cast back, unless
/// that raises weights + arena: bf16 on the wespeaker front end (whose one
/// MatMul stays fp32 on the CPU) would hold the mel matrix twice, once as
/// a bf16 weight and once as its fp32 copy in the arena. It stays fp32 and
/// the report says why; fp16-weights, asked for by name, still stores it.
#[test]
fn fp32_read_weights_stay_fp32_when_storing_them_low_costs_memory() {
    let dir = tempfile::tempdir().unwrap();
    let src = models_dir().join("../pypi/wespeaker.onnx");
    let rep = dir.path().join("r.json");
    let out = dir.path().join("out.onnx");
    let run = |p: &str| {
        optimize_ok(
            &src,
            &out,
            &["-q", "--precision", p, "--report", rep.to_str().unwrap()],
        );
        report(&rep)
    };
    let p = run("bf16");
    let warned = p["warnings"].as_array().unwrap().iter().any(|w| {
        w.as_str()
            .unwrap()
            .starts_with("weights only fp32 nodes read stay fp32")
    });
    assert!(warned, "{p}");
    assert_eq!(p["weights_ratio"], 1.0, "{p}");
    let p = run("fp16-weights");
    assert!(p["weights_ratio"].as_f64().unwrap() < 0.52, "{p}");
}

#[test]
fn report_counts_weights_and_casts() {
    let dir = tempfile::tempdir().unwrap();
    let src = models_dir().join("bert_tiny.ts14.onnx");
    let out = dir.path().join("out.onnx");
    let rep = dir.path().join("r.json");
    let o = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args([
            "--precision",
            "fp16-weights",
            "--report",
            rep.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = report(&rep);
    assert_eq!(p["mode"], "fp16-weights");
    assert_eq!(p["nodes_lowered"], 0);
    assert!(p["weights_ratio"].as_f64().unwrap() <= 0.51, "{p}");
    assert!(p["casts_after"].as_u64().unwrap() > p["casts_before"].as_u64().unwrap());
    assert!(String::from_utf8_lossy(&o.stdout).contains("precision fp16-weights:"));
    // The planner's view: weights halve; activations now include the fp32
    // copy a weight Cast produces, so the bound may grow by the largest one.
    let full: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
    let (b, a) = (&full["memory"]["before"], &full["memory"]["after"]);
    assert!(
        a["weights_bytes"].as_f64().unwrap() <= 0.51 * b["weights_bytes"].as_f64().unwrap(),
        "{full}"
    );
    assert!(
        a["arena_bytes"].as_u64().unwrap() >= a["lower_bound_bytes"].as_u64().unwrap(),
        "{full}"
    );
    assert!(b["lower_bound_bytes"].as_u64().unwrap() > 0, "{full}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("activations lower bound"));
}

#[test]
fn validate_on_saved_inputs_with_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let src = models_dir().join("bert_tiny.ts14.onnx");
    let inputs = models_dir().join("bert_tiny.ts14.inputs.npz");
    let out = dir.path().join("out.onnx");
    let rep = dir.path().join("r.json");
    let o = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args([
            "--precision",
            "fp16",
            "--validate",
            "--inputs",
            inputs.to_str().unwrap(),
        ])
        .args(["--report", rep.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = report(&rep)["validation"].clone();
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["inputs"].as_str().unwrap().ends_with("inputs.npz"));
    assert!(v["rel_l2"].as_f64().unwrap() < 1e-2, "{v}");
}

#[test]
fn keep_fp32_flag_adds_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let src = write_model(dir.path(), "m.onnx", OVERFLOW);
    let out = dir.path().join("out.onnx");
    let rep = dir.path().join("r.json");
    let run = |extra: &[&str]| {
        let o = bin()
            .args([
                "optimize",
                src.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "-q",
            ])
            // The range check would keep the overflowing `big` on its own.
            .args(["--precision", "fp16", "--no-range-check"])
            .args(["--report", rep.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        report(&rep)
    };
    assert_eq!(run(&[])["nodes_lowered"], 3);
    assert_eq!(run(&["--keep-fp32", "big"])["nodes_lowered"], 1);
    assert_eq!(run(&["--keep-fp32", "MatMul"])["nodes_lowered"], 0);
    assert_eq!(run(&["--keep-fp32", "-Softmax,first"])["nodes_lowered"], 2);
    let p = run(&["--no-keep-io-types"]);
    assert_eq!(p["casts_after"], 0, "{p}");
}

#[test]
fn bad_precision_flags_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let src = write_model(dir.path(), "m.onnx", OVERFLOW);
    let out = dir.path().join("out.onnx");
    let o = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args(["--precision", "int4"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("valid: fp16, bf16, fp16-weights"));
    let o = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .args(["--precision", "bf16", "--validate"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no bfloat16"));
    assert!(!out.exists());
}

#[test]
fn validate_with_fp16_io() {
    let dir = tempfile::tempdir().unwrap();
    let src = models_dir().join("resnet_tiny.ts14.onnx");
    let out = dir.path().join("out.onnx");
    let rep = dir.path().join("r.json");
    let o = bin()
        .args([
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "-q",
        ])
        .args(["--precision", "fp16", "--no-keep-io-types", "--validate"])
        .args(["--report", rep.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = report(&rep);
    assert_eq!(p["validation"]["ok"], true, "{p}");
    assert_eq!(p["casts_after"], 0, "{p}");
}
