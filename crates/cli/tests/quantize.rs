//! `graphopt optimize --quantize` and `Session::quantize`:
//! - every real model in every mode passes the full onnx checker, adds no
//!   node outside the default domain, and runs in onnxruntime within its
//!   bound (`tests-py/quantize_models.py`, in the pinned venv);
//! - `--max-error` puts layers back to float until the error fits, and a
//!   bound it cannot reach is an error that writes nothing and leaves the
//!   session unchanged;
//! - models onnxruntime quantized keep their quantization, and no error
//!   on top (`tests-py/quantize_prequantized.py`);
//! - the digits MLP and CNN keep their test accuracy within issue 12's
//!   drops (`tests-py/quantize_digits.py`);
//! - the output is byte-identical run to run and the input is not touched;
//! - calibration by percentile and entropy gives ranges inside min/max.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model(name: &str) -> PathBuf {
    repo().join("testdata/models").join(name)
}

fn graphopt(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("graphopt runs")
}

fn run_script(script: &str) {
    let Some(python) = graphopt_testutil::python_or_skip(script) else {
        return;
    };
    let out = Command::new(python)
        .arg(repo().join("tests-py").join(script))
        .arg("--graphopt")
        .arg(env!("CARGO_BIN_EXE_graphopt"))
        .current_dir(repo())
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tail: Vec<&str> = stdout.lines().rev().take(6).collect();
    for l in tail.iter().rev() {
        eprintln!("{script}: {l}");
    }
    assert!(
        out.status.success(),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn real_models_quantized_run_in_onnxruntime() {
    run_script("quantize_models.py");
}

/// onnxruntime's QDQ quantization of the testdata CNNs runs in graphopt's
/// runtime on integer convolutions (every Conv of dequantized activations
/// and weights but the depthwise ones, on CPUs with AVX-512 VNNI), with
/// onnxruntime's outputs (`tests-py/ort_quantized_run.py`).
#[test]
fn onnxruntime_qdq_models_run_on_integer_convolutions() {
    run_script("ort_quantized_run.py");
}

/// Models onnxruntime quantized already (dynamic, QDQ) keep every
/// integer op and Q/DQ node as it was under `--quantize dynamic`, nothing
/// they dequantized is quantized again, and the error stays within 1.05x
/// of theirs (`tests-py/quantize_prequantized.py`).
#[test]
fn prequantized_models_keep_their_quantization() {
    run_script("quantize_prequantized.py");
}

/// The default 5% bound (issue 27): every mode on every testdata model
/// (testdata/models and testdata/pypi) meets it, in graphopt's measure and
/// in onnxruntime's, or refuses with one line and writes nothing.
#[test]
fn default_bound_is_met_or_refused_on_every_testdata_model() {
    run_script("quantize_bound.py");
}

/// The digits MLP and CNN (testdata/quant/make_digits.py) lose at most
/// issue 12's points of test accuracy in onnxruntime: static 1, dynamic and
/// int8-weights 0.5, int4-weights 2.
#[test]
fn digits_accuracy_survives_quantization() {
    run_script("quantize_digits.py");
}

#[test]
fn max_error_falls_back_to_float_and_refuses_what_it_cannot_reach() {
    let path = model("bert_tiny.ts14.onnx");
    let calib = model("bert_tiny.ts14.inputs.npz");
    let opts = |e: f64| graphopt::QuantizeOptions {
        calibration: Some(calib.clone().into()),
        max_error: Some(e),
        ..graphopt::QuantizeOptions::new(graphopt::QuantizeMode::Int4Weights)
    };
    // Unbounded: int4 on this model errs ~0.1 (tolerances.json).
    let mut s = graphopt::load(&path).unwrap();
    let free = s
        .quantize(&graphopt::QuantizeOptions {
            calibration: Some(calib.clone().into()),
            max_error: None,
            ..graphopt::QuantizeOptions::new(graphopt::QuantizeMode::Int4Weights)
        })
        .unwrap();
    let e0 = free.error.as_ref().expect("measured").rel_l2;
    assert!(e0 > 0.05, "int4 error {e0}");
    assert!(free.fallback.is_empty());
    assert!(free.max_error.is_none());
    assert_eq!(free.bound_off.as_deref(), Some("--max-error none"));
    // The default bound (5%): layers go back until it holds.
    let mut s = graphopt::load(&path).unwrap();
    let d = s
        .quantize(&graphopt::QuantizeOptions {
            calibration: Some(calib.clone().into()),
            ..graphopt::QuantizeOptions::new(graphopt::QuantizeMode::Int4Weights)
        })
        .unwrap();
    assert_eq!(d.max_error, Some(graphopt::DEFAULT_MAX_ERROR));
    let ed = d.error.as_ref().unwrap().rel_l2;
    assert!(
        ed <= 0.05 && !d.fallback.is_empty(),
        "{ed} {:?}",
        d.fallback
    );
    // The sensitive layers' weights go to int8 first, not to float: every
    // weight stays quantized (int4 or int8), under 0.3x of fp32.
    assert!(
        d.fallback.iter().all(|f| f.ends_with("(int8 weights)")),
        "{:?}",
        d.fallback
    );
    assert!(!d.kept_float.iter().any(|k| k.why.contains("error bound")));
    assert!(d.weights_ratio < 0.3, "{}", d.weights_ratio);
    assert!(d.weights_ratio > free.weights_ratio);
    // A bound between: fewer layers go back, the error fits, and the
    // weights are smaller than at the default bound.
    let mut s = graphopt::load(&path).unwrap();
    let r = s.quantize(&opts(0.08)).unwrap();
    let e = r.error.as_ref().unwrap().rel_l2;
    assert!(e <= 0.08, "{e}");
    assert!(!r.fallback.is_empty() && r.runs > 1, "{:?}", r.fallback);
    assert!(r.fallback.len() <= d.fallback.len(), "{:?}", r.fallback);
    assert!(r.weights_bytes_after <= d.weights_bytes_after);
    assert!(r.weights_bytes_after < r.weights_bytes_before);
    // The error is measured on the calibration batches and on two
    // jittered copies of the first.
    assert_eq!(r.error.as_ref().unwrap().jittered, 2);
    // Unreachable: an error naming the bound; the session is unchanged.
    let mut s = graphopt::load(&path).unwrap();
    let before = s.to_bytes().unwrap();
    let err = s.quantize(&opts(1e-9)).unwrap_err().to_string();
    assert!(
        err.contains("--max-error") && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(s.to_bytes().unwrap(), before);
}

#[test]
fn cli_max_error_miss_exits_nonzero_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.onnx");
    let o = graphopt(&[
        "optimize",
        model("resnet_tiny.ts14.onnx").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--quantize",
        "static",
        "--calibration",
        model("resnet_tiny.ts14.inputs.npz").to_str().unwrap(),
        "--max-error",
        "1e-9",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--max-error"), "{err}");
    assert!(!out.exists());
}

#[test]
fn output_is_deterministic_and_input_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let src = model("vit_tiny.ts14.onnx");
    let before = std::fs::read(&src).unwrap();
    let mut outs = Vec::new();
    for i in 0..2 {
        let out = dir.path().join(format!("q{i}.onnx"));
        let report = dir.path().join(format!("r{i}.json"));
        let o = graphopt(&[
            "optimize",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--quantize",
            "dynamic",
            "--report",
            report.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // No --calibration: random inputs, said as a warning.
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no --calibration"), "{err}");
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains("quantize dynamic: weights"), "{stdout}");
        let rep: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        let q = &rep["quantize"];
        assert!(q["nodes_quantized"]["MatMul"].as_u64().unwrap() > 0, "{q}");
        assert!(q["memory_before"]["weights_bytes"].as_u64().unwrap() > 0);
        outs.push(std::fs::read(&out).unwrap());
    }
    assert!(outs[0] == outs[1], "two runs differ");
    assert_eq!(std::fs::read(&src).unwrap(), before);
}

#[test]
fn percentile_and_entropy_ranges_sit_inside_minmax() {
    let path = model("bert_tiny.ts14.onnx");
    let calib = model("bert_tiny.ts14.inputs.npz");
    let mut errs = Vec::new();
    for c in ["minmax", "percentile:99.9", "entropy"] {
        let mut s = graphopt::load(&path).unwrap();
        let r = s
            .quantize(&graphopt::QuantizeOptions {
                calibration: Some(calib.clone().into()),
                calibrate: graphopt::Calibrate::parse(c).unwrap(),
                ..graphopt::QuantizeOptions::new(graphopt::QuantizeMode::Static)
            })
            .unwrap();
        assert!(r.activations_calibrated > 0, "{c}");
        errs.push(r.error.unwrap().rel_l2);
    }
    // Clipping outliers of a 1-batch calibration set moves the error, but
    // stays in the same range as minmax.
    for e in &errs {
        assert!(e.is_finite() && *e < 0.1, "{errs:?}");
    }
    assert!(graphopt::Calibrate::parse("percentile:101").is_err());
    assert!(graphopt::Calibrate::parse("kl").is_err());
    // entropy_threshold itself: passes/src/quantize/calibrate.rs.
}

/// Static calibration and the error run in graphopt's runtime where tract
/// cannot run the model (a Loop, issue 27 item 4):
/// the activation ranges are calibrated, the quantized model is measured,
/// and the report says which engine ran.
#[test]
fn static_calibration_runs_in_the_runtime_where_tract_cannot() {
    let w: Vec<String> = (0..32 * 32)
        .map(|i| format!("{:.4}", ((i * 37 % 101) as f32 - 50.0) / 200.0))
        .collect();
    let text = format!(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[8,32] x) => (float[8,32] y) {{
          w = Constant <value = float[32,32] {{{}}}> ()
          h = MatMul (x, w)
          n = Constant <value = int64 {{2}}> ()
          t = Constant <value = bool {{1}}> ()
          y = Loop (n, t, h) <body = body (int64 i, bool c, float[8,32] acc) => (bool co, float[8,32] out) {{
            co = Identity (c)
            out = Relu (acc)
          }}>
        }}"#,
        w.join(", ")
    );
    let model = graphopt_text::parse_model(&text).unwrap();
    let batch = |seed: u32| {
        let v: Vec<f32> = (0..8 * 32)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed * 97) >> 8) % 1000) as f32
                    / 500.0
                    - 1.0
            })
            .collect();
        graphopt::Inputs::Named(vec![(
            "x".into(),
            graphopt::HostTensor::from_f32(&[8, 32], &v),
        )])
    };
    let mut s = graphopt::Session::from_model(model);
    let r = s
        .quantize(&graphopt::QuantizeOptions {
            calibration: Some(graphopt::Calibration::Batches(vec![batch(1), batch(2)])),
            ..graphopt::QuantizeOptions::new(graphopt::QuantizeMode::Static)
        })
        .unwrap();
    assert!(
        r.activations_calibrated >= 1 && r.activations_quantized >= 1,
        "{r:?}"
    );
    let cal = r.calibrated_in.as_deref().unwrap();
    assert_eq!(cal, "graphopt's runtime", "{cal}");
    let measured = r.measured_in.as_deref().unwrap();
    assert!(
        measured.starts_with("graphopt's runtime (tract:"),
        "{measured}"
    );
    let e = r.error.as_ref().unwrap().rel_l2;
    assert!(e > 0.0 && e <= 0.05, "{e}");
}

/// graphopt's runtime runs its own `int4-weights` output (blocked uint4
/// `DequantizeLinear` with zero points, or int4 without them when
/// symmetric; float16 scales cast to float32; Conv weights in
/// 4-D blocks along their input channels): the outputs are bitwise those
/// of the same model with every `DequantizeLinear` folded to a float
/// weight (`dequantize_constants`, which computes `(q - zero_point) *
/// scale` in f32 as the kernel does).
#[test]
fn int4_weights_run_in_graphopt_runtime_as_their_folded_weights() {
    for (name, blocked_conv, symmetric) in [
        ("bert_tiny.ts14", false, false),
        ("bert_tiny.ts14", false, true),
        ("mobilenet_v3_small.ts14", true, false),
    ] {
        let mut s = graphopt::load(model(&format!("{name}.onnx"))).unwrap();
        s.quantize(&graphopt::QuantizeOptions {
            max_error: None,
            measure: false,
            symmetric,
            ..graphopt::QuantizeOptions::new(graphopt::QuantizeMode::Int4Weights)
        })
        .unwrap();
        let signed = s
            .model()
            .graph
            .initializers()
            .iter()
            .any(|&v| s.model().graph.initializer(v).unwrap().dtype == graphopt::ir::DType::I4);
        assert_eq!(signed, symmetric, "{name}");
        // Blocked DequantizeLinear nodes, and the ranks of their weights.
        let g = &s.model().graph;
        let ranks: Vec<usize> = g
            .nodes()
            .map(|n| g.node(n))
            .filter(|d| d.op_type == "DequantizeLinear" && d.attr_int("block_size").is_some())
            .filter_map(|d| g.initializer(d.input(0)?).map(|t| t.dims.len()))
            .collect();
        assert!(!ranks.is_empty(), "{name}: no blocked DequantizeLinear");
        assert_eq!(ranks.contains(&4), blocked_conv, "{name}: {ranks:?}");
        let folded =
            graphopt::Session::from_model(graphopt::dequantize_constants(s.model()).unwrap());
        let opts = graphopt::RunOptions {
            inputs: graphopt::Inputs::Npz(model(&format!("{name}.inputs.npz"))),
            ..Default::default()
        };
        let a = s.run(&opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let b = folded.run(&opts).unwrap();
        assert!(!a.outputs.is_empty());
        // Every blocked 2-D (MatMul, Gemm) weight decoded per tile in its
        // reader's kernel (a Conv's keeps its DequantizeLinear).
        let matrices = ranks.iter().filter(|&&r| r == 2).count();
        assert!(
            matrices > 0
                && a.quantized_weights == matrices
                && a.quantized_fused_nodes >= a.quantized_weights,
            "{name}: {} of {matrices} weights fused",
            a.quantized_weights,
        );
        for ((n, x), (_, y)) in a.named_outputs().zip(b.named_outputs()) {
            assert!(x.data == y.data, "{name}: output {n} differs");
        }
    }
}

/// The int8 modes' weights (`DequantizeLinear` of int8 or uint8 constants,
/// per channel) run fused into their MatMul, Gemm and Gather readers in
/// graphopt's runtime (decoded per tile, never whole in the arena) with the
/// bits of the same model with every weight folded to float32; where the
/// activations are quantized too (dynamic, static), as integer GEMMs within
/// float32 rounding of it.
#[test]
fn int8_weights_run_fused_as_their_folded_weights() {
    use graphopt::QuantizeMode as M;
    for (name, mode) in [
        ("bert_tiny.ts14", M::Int8Weights),
        ("bert_tiny.ts14", M::Dynamic),
        ("bert_tiny.ts14", M::Static),
        ("mobilenet_v3_small.ts14", M::Int8Weights),
        ("mobilenet_v3_small.ts14", M::Static),
    ] {
        let mut s = graphopt::load(model(&format!("{name}.onnx"))).unwrap();
        s.quantize(&graphopt::QuantizeOptions {
            max_error: None,
            measure: false,
            ..graphopt::QuantizeOptions::new(mode)
        })
        .unwrap();
        let g = &s.model().graph;
        // Integer weights, but those read by a Conv (which the first pass
        // of `graphopt_exec::lower` leaves to their DequantizeLinear; its
        // integer Convs come after it and are counted apart).
        let weights = g
            .nodes()
            .map(|n| g.node(n))
            .filter(|d| d.op_type == "DequantizeLinear" && g.initializer(d.input(0).unwrap()).is_some())
            .filter(|d| !g.uses(d.output(0).unwrap()).iter().any(|u| matches!(u, graphopt::ir::Use::Input { node, .. } if g.node(*node).op_type == "Conv")))
            .count();
        assert!(weights > 0, "{name} {mode:?}: no integer weight");
        let folded =
            graphopt::Session::from_model(graphopt::dequantize_constants(s.model()).unwrap());
        let opts = graphopt::RunOptions {
            inputs: graphopt::Inputs::Npz(model(&format!("{name}.inputs.npz"))),
            ..Default::default()
        };
        let a = s.run(&opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let b = folded.run(&opts).unwrap();
        assert_eq!(
            a.quantized_weights, weights,
            "{name} {mode:?}: fused weights (kept: {:?})",
            a.palette_kept
        );
        // Weights outside the arena, as the folded model's initializers.
        assert!(
            a.arena_planned_bytes <= b.arena_planned_bytes,
            "{name} {mode:?}: arena {} B fused, {} B folded",
            a.arena_planned_bytes,
            b.arena_planned_bytes
        );
        // dynamic and static quantize the activations of the weights'
        // MatMuls too: those run as integer GEMMs (exact integer sums, one
        // scale), the same value up to float32 rounding, not the same bits.
        // On CPUs with AVX-512 VNNI only (elsewhere the float path stays).
        // mobilenet_v3_small static's logits measured equal bits, bert_tiny's
        // outputs 4.7e-8 to 6.6e-8.
        let integer =
            matches!(mode, M::Dynamic | M::Static) && graphopt::exec::cpu::qgemm::available();
        assert_eq!(
            a.integer_matmuls > 0,
            integer && name.starts_with("bert"),
            "{name} {mode:?}: {}",
            a.integer_matmuls
        );
        // So do its Convs (a QuantizeLinear of the output, and a Relu
        // between, taken into a QLinearConv).
        assert_eq!(
            a.integer_convs + a.qlinear_convs > 0,
            integer && name.starts_with("mobilenet"),
            "{name} {mode:?}: {} and {}",
            a.integer_convs,
            a.qlinear_convs
        );
        for ((n, x), (_, y)) in a.named_outputs().zip(b.named_outputs()) {
            if !integer {
                assert!(x.data == y.data, "{name} {mode:?}: output {n} differs");
                continue;
            }
            let (x, y) = (x.to_f32().unwrap(), y.to_f32().unwrap());
            let d: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            let r: f64 = y.iter().map(|b| (*b as f64).powi(2)).sum();
            let rel = (d / r).sqrt();
            eprintln!("{name} {mode:?}: output {n} rel L2 {rel:.2e} against the float path");
            assert!(rel < 2e-7, "{name} {mode:?}: output {n} rel L2 {rel}");
        }
    }
}
