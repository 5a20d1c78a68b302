//! `dequantize_constants` on real quantized models, checked in
//! onnxruntime (Python) against the quantized model it came from.
//!
//! Each model in [`MODELS`] is quantized by the `quantize` pass in the
//! three modes that need no calibration (`int8-weights`, `int4-weights`
//! with blocked int4 scales stored float16 and cast, `dynamic`), then
//! dequantized (the Cast of the scales folds too). Both files run
//! in onnxruntime (optimizations off, one thread) on the model's saved
//! inputs:
//! - models without convolutions must give the quantized model's outputs
//!   bit for bit, in every mode: the folded weights are `(q - z) * s` in
//!   f32 as the kernel computes them, and the float spelling of
//!   `DynamicQuantizeLinear` rounds as the kernel does on these models;
//! - models with convolutions within [`REL_L2`] per output: onnxruntime
//!   prepacks a Conv's initializer weight but not a computed one, and the
//!   two kernels sum in different orders (measured 1.4e-7 to 1.5e-7 on
//!   mobilenet_v3_small in int8-weights and dynamic, 1.9e-7 in
//!   int4-weights, whose Conv weights are int4 blocks with float16 scales
//!   since issue 27).
//!
//! Every case must fold something (and `dynamic` emulate something), so
//! that none passes by leaving the model as it was.
//!
//! Runs in the pinned Python environment of `graphopt-testutil`; skips
//! with a note when it cannot be had, and fails then under
//! `GRAPHOPT_REQUIRE_PYTHON=1` or `CI=true`.

use graphopt_passes::dequantize_constants::DequantizeConstants;
use graphopt_passes::quantize::{QuantMode, Quantize};
use graphopt_passes::Pass;
use std::path::Path;
use std::process::Command;

/// A transformer, a CNN with depthwise convolutions, and a decoder with a
/// tied embedding (a Gather and a MatMul reading one weight); whether the
/// outputs must be bit-identical (no Conv).
const MODELS: &[(&str, bool)] = &[
    ("bert_tiny.ts14", true),
    ("mobilenet_v3_small.ts14", false),
    ("gpt2_tiny.dynamo18", true),
];

/// Relative L2 per output where bits may differ (Conv models; measured
/// 1.9e-7 at most).
const REL_L2: f64 = 5e-7;

const CHECK_PY: &str = r#"
import json, sys
import numpy as np
import onnxruntime as ort

jobs = json.load(open(sys.argv[1]))
bound = float(sys.argv[2])
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.intra_op_num_threads = 1
so.log_severity_level = 3
failed = 0
for job in jobs:
    inputs = dict(np.load(job["inputs"]))
    outs = []
    for path in (job["quantized"], job["dequantized"]):
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = {i.name for i in s.get_inputs()}
        outs.append(s.run(None, {k: v for k, v in inputs.items() if k in names}))
    worst, same = 0.0, True
    for a, b in zip(*outs):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            worst, same = float("inf"), False
            continue
        if np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            continue
        same = False
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        den = np.linalg.norm(a64)
        worst = max(worst, float(np.linalg.norm(a64 - b64) / den) if den > 0 else float("inf"))
    ok = same if job["exact"] else worst <= bound
    print(f"{'ok  ' if ok else 'FAIL'} {job['case']}: {'bit-identical' if same else f'rel_l2 {worst:.3g}'}")
    failed += 0 if ok else 1
sys.exit(1 if failed else 0)
"#;

#[test]
fn dequantized_models_match_the_quantized_ones_in_onnxruntime() {
    let Some(python) = graphopt_testutil::python_or_skip(
        "dequantized_models_match_the_quantized_ones_in_onnxruntime",
    ) else {
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let tmp = std::env::temp_dir().join(format!("graphopt-dequantize-ort-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut jobs = Vec::new();
    for &(name, exact) in MODELS {
        let loaded = graphopt_onnx::load(&dir.join(format!("{name}.onnx"))).unwrap();
        for mode in [
            QuantMode::Int8Weights,
            QuantMode::Int4Weights,
            QuantMode::Dynamic,
        ] {
            let case = format!("{name} {}", mode.name());
            let mut q = loaded.model.clone();
            Quantize { mode, ..Quantize }
                .run(&mut q)
                .unwrap_or_else(|e| panic!("{case}: quantize: {e}"));
            let mut d = q.clone();
            let stats = DequantizeConstants
                .run(&mut d)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            graphopt_ir::verify::verify_model(&d).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert!(stats.get("folded") > 0, "{case}: nothing folded");
            assert_eq!(
                stats.get("emulated") > 0,
                mode == QuantMode::Dynamic,
                "{case}: {:?}",
                stats.counters
            );
            let stem = case.replace(' ', ".");
            let (qp, dp) = (
                tmp.join(format!("{stem}.q.onnx")),
                tmp.join(format!("{stem}.d.onnx")),
            );
            std::fs::write(&qp, graphopt_onnx::encode(&q).unwrap()).unwrap();
            std::fs::write(&dp, graphopt_onnx::encode(&d).unwrap()).unwrap();
            jobs.push(serde_json::json!({
                "case": case,
                "quantized": qp.to_string_lossy(),
                "dequantized": dp.to_string_lossy(),
                "inputs": dir.join(format!("{name}.inputs.npz")).to_string_lossy(),
                "exact": exact,
            }));
        }
    }
    let jobs_path = tmp.join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_string(&jobs).unwrap()).unwrap();
    let script = tmp.join("check.py");
    std::fs::write(&script, CHECK_PY).unwrap();
    let out = Command::new(&python)
        .arg(&script)
        .arg(&jobs_path)
        .arg(REL_L2.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(out.status.success(), "dequantized models differ:\n{stdout}");
}
