//! The CUDA backend on a real GPU (cudarc, NVRTC, cuBLAS, CUDA graphs),
//! against the CPU backend on the same plan and inputs: the fixture models
//! of the kernel emulation (`src/cuda/emulate.rs`, which checks everything
//! but the cudarc calls without a GPU) plus a few textual fixtures.
//!
//! Not `#[ignore]`d: where [`graphopt_exec::cuda::unavailable`] finds the
//! driver (cudarc's `is_culib_present`), NVRTC, cuBLAS and a device, these
//! run on the GPU; elsewhere they only run the CPU side and bind each case
//! with the CUDA backend, print `SKIPPED ... (GPU part)` and pass, unless
//! `GRAPHOPT_REQUIRE_GPU=1` (set by `benches/device/cuda_check.sh` on the
//! GPU machine), where a missing GPU is a failure.
//!
//! Each case runs three times on the device: op by op (the first run, which
//! captures a CUDA graph) and twice replaying the graph; every run must
//! match the CPU backend, and the replays must equal the first run bit for
//! bit (same kernels, same order). Built with the `cuda` feature (the
//! default) only.

#![cfg(feature = "cuda")]

use graphopt_exec::cuda::{unavailable, CudaExecutable};
use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::{DType, Model};
use graphopt_plan::{plan_model, DimValues, ModelPlan, PlanOptions};
use std::path::PathBuf;

/// True when the GPU is there; otherwise prints that the GPU part is
/// skipped (or fails under `GRAPHOPT_REQUIRE_GPU=1`).
fn gpu(test: &str) -> bool {
    match unavailable() {
        None => true,
        Some(why) => !graphopt_testutil::skip_or_fail(
            &format!("{test} (GPU part)"),
            &format!("no usable CUDA GPU ({why})"),
            graphopt_testutil::require_gpu(),
            "GRAPHOPT_REQUIRE_GPU=1",
        ),
    }
}

fn model(name: &str) -> Model {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../testdata/models/{name}"));
    graphopt_onnx::load(&p).expect("testdata model loads").model
}

use graphopt_testutil::uniform;

/// Seeded inputs for `infos`: floats in [-1, 1), integers 0/1 (valid token
/// ids, masks and positions in every testdata model), bools true.
fn inputs(infos: &[(String, graphopt_exec::TensorInfo)], seed: u64) -> Vec<HostTensor> {
    infos
        .iter()
        .enumerate()
        .map(|(k, (name, ti))| {
            let n: usize = ti.shape.iter().product();
            let v = uniform(n, seed + k as u64);
            let data: Vec<u8> = match ti.dtype {
                DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                DType::F16 => v
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect(),
                DType::BF16 => v
                    .iter()
                    .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                    .collect(),
                DType::I64 => v
                    .iter()
                    .flat_map(|x| i64::from(*x >= 0.0).to_le_bytes())
                    .collect(),
                DType::I32 => v
                    .iter()
                    .flat_map(|x| i32::from(*x >= 0.0).to_le_bytes())
                    .collect(),
                DType::Bool => vec![1u8; n],
                d => panic!("no test input for '{name}' of type {}", d.name()),
            };
            HostTensor {
                dtype: ti.dtype,
                shape: ti.shape.clone(),
                data,
            }
        })
        .collect()
}

fn as_f32(t: &HostTensor) -> Vec<f32> {
    match t.dtype {
        DType::F32 => t.to_f32().unwrap(),
        DType::F16 => t
            .data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::BF16 => t
            .data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::I64 => t
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        DType::I32 => t
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        DType::Bool => t.data.iter().map(|&b| b as f32).collect(),
        d => panic!("no comparison for {}", d.name()),
    }
}

/// Max |a - b| / max(1, max |b|) over every output; NaN counts as infinite.
fn max_rel(label: &str, got: &[HostTensor], want: &[HostTensor]) -> f32 {
    assert_eq!(got.len(), want.len(), "{label}: output count");
    let mut worst = 0f32;
    for (k, (x, y)) in got.iter().zip(want).enumerate() {
        assert_eq!(x.dtype, y.dtype, "{label}: output {k} dtype");
        assert_eq!(x.shape, y.shape, "{label}: output {k} shape");
        let (x, y) = (as_f32(x), as_f32(y));
        let scale = y.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (p, q) in x.iter().zip(&y) {
            let e = if p.is_nan() {
                f32::INFINITY
            } else {
                (p - q).abs() / scale
            };
            worst = worst.max(e);
        }
    }
    worst
}

/// Plans `m` (free dims 2), runs it on the CPU backend and binds it with
/// the CUDA backend's kernels (no GPU needed: a case the backend refuses
/// fails here too); then, with `gpu`, runs it on the GPU (once op by op,
/// twice replaying the captured graph) and checks each device run within
/// `bound` of the CPU outputs.
fn check(label: &str, m: &Model, bound: f32, gpu: bool) {
    let dv = DimValues {
        bound: Vec::new(),
        shapes: Vec::new(),
        default: Some(2),
    };
    let mp: ModelPlan = plan_model(m, &dv, &PlanOptions::default()).expect("plans");
    let mut cpu = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("cpu binds");
    let ins = inputs(&cpu.input_infos(), 7);
    let (want, _) = cpu
        .run(
            &ins,
            &RunOptions {
                threads: 2,
                poison: false,
            },
        )
        .expect("cpu runs");
    graphopt_exec::cuda::plan_kernels(&mp.model, &mp.plan)
        .unwrap_or_else(|e| panic!("{label}: the CUDA backend refuses it: {e}"));
    if !gpu {
        return;
    }
    let mut dev = CudaExecutable::new(&mp.model, &mp.plan)
        .unwrap_or_else(|e| panic!("{label}: the CUDA backend does not start: {e}"));
    assert_eq!(dev.output_names(), cpu.output_names(), "{label}");
    let first = dev
        .run(&ins, true)
        .unwrap_or_else(|e| panic!("{label}: CUDA run 1: {e}"));
    let err = max_rel(label, &first, &want);
    for r in 2..=3 {
        let again = dev
            .run(&ins, true)
            .unwrap_or_else(|e| panic!("{label}: CUDA run {r}: {e}"));
        assert!(
            again == first,
            "{label}: CUDA run {r} differs from run 1 (graph replay {:?})",
            dev.graph_state()
        );
    }
    eprintln!(
        "{label} on {}: max relative error {err:.2e} against the CPU backend (bound {bound:e}); {} launches, {} kernels, graph replay {:?}",
        dev.device_name(),
        dev.launches(),
        dev.compiled_kernels(),
        dev.graph_state()
    );
    assert!(
        err <= bound,
        "{label}: CUDA outputs differ from the CPU backend's by {err:e} (bound {bound:e})"
    );
}

/// The emulation's fixture models on the GPU. Bounds: the emulation
/// measured 3.0e-8 (resnet), 1.7e-7 (bert), 1.2e-7 (gpt2) and 0 (fp16
/// MLP); on the GPU cuBLAS (fp32 compute, no TF32) sums in another order
/// and the device's expf/erff/tanhf differ from the host's by an ulp or
/// two, so the fp32 bounds allow ~10x the emulation's error; the fp16
/// bound is one fp16 rounding step. NOT yet measured on a GPU: tighten to
/// ~3x the printed errors after the first device run.
#[test]
fn cuda_backend_on_a_gpu_matches_cpu_on_testdata_models() {
    let gpu = gpu("cuda_backend_on_a_gpu_matches_cpu_on_testdata_models");
    for (name, bound) in [
        ("resnet_tiny.ts14.onnx", 1e-6),
        ("bert_tiny.ts14.onnx", 2e-6),
        ("gpt2_tiny.ts14.onnx", 2e-6),
        ("mlp_fp16.ts14.onnx", 1e-3),
    ] {
        check(name, &model(name), bound, gpu);
    }
}

/// Launch-plan edge cases on the GPU: broadcasting with in-place chains,
/// partly broadcast batched MatMul and a vector operand, Gemm's transposes
/// and scalars, a grouped strided dilated padded Conv, data movement with
/// negative steps and indices, pooling with pads. Bounds as above (data
/// movement and elementwise are exact).
#[test]
fn cuda_backend_on_a_gpu_matches_cpu_on_fixtures() {
    let gpu = gpu("cuda_backend_on_a_gpu_matches_cpu_on_fixtures");
    let cases = [
        (
            r#"<ir_version: 8, opset_import: ["" : 17]>
            elementwise (float[2,3,1] a, float[4] b) => (float[2,3,4] y, float[2,3,4] z) {
              s = Add (a, b)
              r = Relu (s)
              m = Mul (r, r)
              c = Greater (a, b)
              y = Where (c, m, b)
              z = Sub (b, a)
            }"#,
            0.0,
        ),
        (
            r#"<ir_version: 8, opset_import: ["" : 17]>
            matmul (float[2,1,3,4] a, float[3,4,5] b, float[4] v, float[4,3] p, float[5,4] q, float[5] c) => (float[2,3,3,5] y, float[3,5] w, float[3,5] g) {
              y = MatMul (a, b)
              w = MatMul (v, b)
              g = Gemm <transA = 1, transB = 1, alpha = 0.5, beta = 2.0> (p, q, c)
            }"#,
            1e-6,
        ),
        (
            r#"<ir_version: 8, opset_import: ["" : 17]>
            conv (float[2,4,7,6] x, float[6,2,3,3] w, float[6] b, float[2,3,7,7] u) => (float[2,6,3,8] y, float[2,3,4,4] m, float[2,3,4,4] a, float[2,3,1,1] g) {
              y = Conv <group = 2, strides = [2, 1], pads = [1, 2, 1, 2], dilations = [2, 1]> (x, w, b)
              m = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (u)
              a = AveragePool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (u)
              g = GlobalAveragePool (u)
            }"#,
            1e-6,
        ),
        (
            r#"<ir_version: 8, opset_import: ["" : 17]>
            movement (float[3,4] x) => (float[3,2] s, float[4,3] tr, float[2,4] ga, float[3,8] c, float[3,1] p, float[3,3] q) {
              st = Constant <value = int64[1] {-1}> ()
              en = Constant <value = int64[1] {-5}> ()
              ax = Constant <value = int64[1] {1}> ()
              sp = Constant <value = int64[1] {-2}> ()
              s = Slice (x, st, en, ax, sp)
              tr = Transpose <perm = [1, 0]> (x)
              ix = Constant <value = int64[2] {-1, 0}> ()
              ga = Gather <axis = 0> (x, ix)
              c = Concat <axis = 1> (x, x)
              p, q = Split <axis = 1, num_outputs = 2> (x, sz)
              sz = Constant <value = int64[2] {1, 3}> ()
            }"#,
            0.0,
        ),
    ];
    for (text, bound) in cases {
        let m = graphopt_text::parse_model(text).expect("fixture parses");
        let label = text.lines().nth(1).unwrap_or("").trim().to_string();
        check(&label, &m, bound, gpu);
    }
}

/// Where the GPU is missing, the backend says so in one line before
/// touching anything (the other side of the tests above).
#[test]
fn without_a_gpu_the_cuda_backend_refuses_in_one_line() {
    let Some(why) = unavailable() else {
        eprintln!("note: a CUDA GPU is present; the refusal is exercised where there is none");
        return;
    };
    let m = model("resnet_tiny.ts14.onnx");
    let mp = plan_model(
        &m,
        &DimValues {
            bound: Vec::new(),
            shapes: Vec::new(),
            default: Some(1),
        },
        &PlanOptions::default(),
    )
    .unwrap();
    let e = CudaExecutable::new(&mp.model, &mp.plan)
        .err()
        .expect("refused")
        .to_string();
    assert_eq!(e, why);
    assert!(!e.contains('\n'), "{e}");
}
