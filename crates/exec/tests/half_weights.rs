//! float16/bfloat16 weights widened per tile (issue 20): a MatMul or Gemm
//! whose `B` is a half-precision initializer runs, once lowered by
//! [`graphopt_exec::lower::lower_coded`], as `HalfMatMul`/`HalfGemm`, whose
//! kernel widens tiles of the weight as it multiplies instead of widening
//! the whole weight into the workspace on every run.
//!
//! Each case runs twice through the whole runtime (planned arena, poison
//! on): as written (the plain node, every input widened whole) and
//! lowered. The outputs must be bitwise equal, the fused node must run
//! and the plain one not, and the workspace must hold tile buffers in
//! place of the widened weight.

mod common;

use common::list;
use graphopt_exec::cpu::coded::{MAX_TILE_THREADS, TILE_K, TILE_N};
use graphopt_exec::lower::lower_coded;
use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::{DType, Model};
use graphopt_plan::{plan_model, DimValues, PlanOptions};
use graphopt_testutil::uniform as data;
use half::{bf16, f16};

/// `v` as a tensor of `dtype` (float16 or bfloat16, rounded to nearest).
fn half_tensor(dtype: DType, shape: &[usize], v: &[f32]) -> HostTensor {
    let bits = |x: f32| match dtype {
        DType::F16 => f16::from_f32(x).to_bits(),
        _ => bf16::from_f32(x).to_bits(),
    };
    HostTensor {
        dtype,
        shape: shape.to_vec(),
        data: v.iter().flat_map(|&x| bits(x).to_le_bytes()).collect(),
    }
}

fn run(m: &Model, inputs: &[HostTensor]) -> (Vec<HostTensor>, Executable) {
    run_on(m, inputs, 2)
}

fn run_on(m: &Model, inputs: &[HostTensor], threads: usize) -> (Vec<HostTensor>, Executable) {
    let mp = plan_model(m, &DimValues::default(), &PlanOptions::default()).expect("plans");
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("binds");
    let (out, _) = exe
        .run(
            inputs,
            &RunOptions {
                threads,
                poison: true,
            },
        )
        .expect("runs");
    (out, exe)
}

#[derive(Clone, Copy, Debug)]
enum Op {
    MatMul,
    /// Gemm with alpha 0.5 and a bias (`[N]`; `[1, N]` and beta 0.5 when
    /// `trans_a`), `B` stored `[N, K]` when `trans_b`, `A` `[K, M]` when
    /// `trans_a`.
    Gemm {
        trans_a: bool,
        trans_b: bool,
    },
}

#[derive(Clone, Copy, Debug)]
struct Case {
    op: Op,
    dtype: DType,
    /// Rows of `x` (1: the matrix-vector kernel).
    m: usize,
}

/// The model of `c`: `y = op(x, W[, bias])`, `x` `[m, K]` (or `[K, m]`),
/// K spanning three depth tiles and N five column blocks.
fn model(c: Case) -> (Model, Vec<HostTensor>, u64) {
    let (k, n) = (600, 1100);
    let t = if c.dtype == DType::F16 {
        "float16"
    } else {
        "bfloat16"
    };
    let w = data(k * n, 7);
    let bias = data(n, 8);
    let trans_a = matches!(c.op, Op::Gemm { trans_a: true, .. });
    let (reader, w_dims, extra) = match c.op {
        Op::MatMul => (
            "y = MatMul (x, W)".to_string(),
            format!("{k},{n}"),
            String::new(),
        ),
        Op::Gemm { trans_a, trans_b } => (
            format!(
                "y = Gemm <transA: int = {}, transB: int = {}, alpha: float = 0.5, beta: float = {}> (x, W, bias)",
                trans_a as i64,
                trans_b as i64,
                if trans_a { 0.5 } else { 1.0 }
            ),
            if trans_b {
                format!("{n},{k}")
            } else {
                format!("{k},{n}")
            },
            format!(
                ", {t}[{}] bias = {{{}}}",
                if trans_a {
                    format!("1,{n}")
                } else {
                    n.to_string()
                },
                list(&bias)
            ),
        ),
    };
    let x_shape = if trans_a { [k, c.m] } else { [c.m, k] };
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g ({t}[{},{}] x) => ({t}[{},{n}] y)\n\
         <{t}[{w_dims}] W = {{{}}}{extra}>\n{{\n{reader}\n}}",
        x_shape[0],
        x_shape[1],
        c.m,
        list(&w),
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let x = half_tensor(c.dtype, &x_shape, &data(c.m * k, 9));
    (m, vec![x], (k * n * 4) as u64)
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for m in [1, 5] {
            for (trans_a, trans_b) in [(false, false), (false, true), (true, false)] {
                v.push(Case {
                    op: Op::Gemm { trans_a, trans_b },
                    dtype,
                    m,
                });
            }
            v.push(Case {
                op: Op::MatMul,
                dtype,
                m,
            });
        }
    }
    v
}

#[test]
fn half_weights_widen_per_tile_with_the_plain_nodes_bits_in_less_workspace() {
    for c in cases() {
        let (m, inputs, widened) = model(c);
        let (want, plain) = run(&m, &inputs);
        let mut lowered = m.clone();
        let r = lower_coded(&mut lowered);
        graphopt_ir::verify::verify_model(&lowered).expect("the lowered model verifies");
        assert_eq!((r.half_fused, r.half_widened_bytes), (1, widened), "{c:?}");
        let (got, fused) = run(&lowered, &inputs);
        let (op, plain_op) = match c.op {
            Op::MatMul => ("HalfMatMul", "MatMul"),
            Op::Gemm { .. } => ("HalfGemm", "Gemm"),
        };
        assert_eq!(fused.kernel_count(op), 1, "{c:?}: the fused node runs");
        assert_eq!(fused.kernel_count(plain_op), 0, "{c:?}");
        assert_eq!(
            (got[0].dtype, &got[0].shape),
            (want[0].dtype, &want[0].shape)
        );
        assert!(got[0].data == want[0].data, "{c:?}: outputs differ");
        eprintln!(
            "{c:?}: workspace {} B plain, {} B fused",
            plain.workspace_bytes(),
            fused.workspace_bytes()
        );
        // The kernel's tile buffers: one per thread, as many as the
        // machine runs at once (at most MAX_TILE_THREADS).
        let slots = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_TILE_THREADS);
        let tiles = (slots * TILE_K * TILE_N * 4) as u64;
        assert!(
            fused.workspace_bytes() + widened <= plain.workspace_bytes() + tiles,
            "{c:?}: workspace {} B fused, {} B plain, weight {widened} B, tiles {tiles} B",
            fused.workspace_bytes(),
            plain.workspace_bytes()
        );
    }
}

#[test]
fn a_float32_weight_or_a_computed_one_stays_plain() {
    let mut m = graphopt_text::parse_model(
        r#"<ir_version: 10, opset_import: ["" : 17]>
        g (float16[2,3] x, float16[3,2] v) => (float16[2,2] y, float[2,2] z)
        <float[3,2] W = {1, 2, 3, 4, 5, 6}> {
          y = MatMul (x, v)
          a = Cast <to: int = 1> (x)
          z = MatMul (a, W)
        }
        "#,
    )
    .expect("parses");
    let r = lower_coded(&mut m);
    assert_eq!(r.half_fused, 0, "{r:?}");
}

/// A real export: testdata's fp16 MLP (a Conv, then two Gemms of float16
/// weights), from both exporters.
#[test]
fn the_fp16_mlp_runs_its_gemms_on_half_weights_with_the_same_bits() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    for name in ["mlp_fp16.ts14", "mlp_fp16.dynamo18"] {
        let m = graphopt_onnx::load(&dir.join(format!("{name}.onnx")))
            .expect("loads")
            .model;
        let inputs = [half_tensor(DType::F16, &[1, 3, 16, 16], &data(768, 3))];
        let (want, _) = run(&m, &inputs);
        let mut lowered = m.clone();
        let r = lower_coded(&mut lowered);
        assert_eq!(r.half_fused, 2, "{name}: {r:?}");
        let (got, fused) = run(&lowered, &inputs);
        assert_eq!(fused.kernel_count("HalfGemm"), 2, "{name}");
        assert_eq!(fused.kernel_count("Gemm"), 0, "{name}");
        for (g, w) in got.iter().zip(&want) {
            assert!(g.data == w.data, "{name}: outputs differ");
        }
    }
}

/// A one-image fp16/bf16 Conv whose weight would widen to more than
/// `CONV_BLOCK_BYTES` runs block of output channels by block: its output
/// must be the bits of the f32 Conv of the widened input, weight and bias,
/// rounded once (what the whole-weight path computes), and its workspace
/// must be below the whole copies of weight, input and output. The cases take each Conv path
/// the blocks meet: im2col at 6x6 (a 448-channel block and a 192-channel
/// tail, with a bias), the padded-image path at 14x14 (two 592-channel
/// blocks and a 116-channel tail, no bias), and a 1x1 (a 1024-channel block and a
/// 76-channel tail); at one thread and at two.
#[test]
fn one_image_convs_widen_their_weights_block_by_block_with_the_same_bits() {
    use graphopt_exec::cpu::lowp::CONV_BLOCK_BYTES;
    // (output channels, input channels, kernel, image side, bias)
    let cases = [
        (640, 128, 3, 6, true),
        (1300, 96, 3, 14, false),
        (1100, 512, 1, 7, true),
    ];
    for (m, c, k, hw, with_bias) in cases {
        let wn = m * c * k * k;
        assert!(wn * 4 > CONV_BLOCK_BYTES);
        for dtype in [DType::F16, DType::BF16] {
            let t = if dtype == DType::F16 {
                "float16"
            } else {
                "bfloat16"
            };
            let round = |x: f32| match dtype {
                DType::F16 => f16::from_f32(x).to_f32(),
                _ => bf16::from_f32(x).to_f32(),
            };
            let (w, b, x) = (data(wn, 41), data(m, 42), data(c * hw * hw, 43));
            let pad = k / 2;
            let text = |ty: &str, w: &[f32], b: &[f32]| {
                let (bias_init, bias_in) = if with_bias {
                    (format!(", {ty}[{m}] B = {{{}}}", list(b)), ", B")
                } else {
                    (String::new(), "")
                };
                format!(
                    "<ir_version: 10, opset_import: [\"\" : 17]>\n\
                     g ({ty}[1,{c},{hw},{hw}] x) => ({ty}[1,{m},{hw},{hw}] y)\n\
                     <{ty}[{m},{c},{k},{k}] W = {{{}}}{bias_init}>\n{{\n\
                     y = Conv <pads: ints = [{pad}, {pad}, {pad}, {pad}], kernel_shape: ints = [{k}, {k}]> (x, W{bias_in})\n}}",
                    list(w)
                )
            };
            let low = graphopt_text::parse_model(&text(t, &w, &b)).expect("parses");
            // The reference: everything widened, an f32 Conv, one rounding.
            let wide = |v: &[f32]| v.iter().map(|&x| round(x)).collect::<Vec<f32>>();
            let f32_model =
                graphopt_text::parse_model(&text("float", &wide(&w), &wide(&b))).unwrap();
            let x32 = HostTensor {
                dtype: DType::F32,
                shape: vec![1, c, hw, hw],
                data: wide(&x).iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            let (want, _) = run(&f32_model, &[x32]);
            let want: Vec<u16> = want[0]
                .to_f32()
                .unwrap()
                .iter()
                .map(|&v| match dtype {
                    DType::F16 => f16::from_f32(v).to_bits(),
                    _ => bf16::from_f32(v).to_bits(),
                })
                .collect();
            for threads in [1, 2] {
                let (got, exe) = run_on(&low, &[half_tensor(dtype, &[1, c, hw, hw], &x)], threads);
                let got: Vec<u16> = got[0]
                    .data
                    .chunks_exact(2)
                    .map(|p| u16::from_le_bytes([p[0], p[1]]))
                    .collect();
                assert!(
                    got == want,
                    "{t} {m}x{c}x{k}x{k} at {threads} thread(s): outputs differ"
                );
                // The whole-weight path holds at least the widened weight,
                // input and output at once.
                let whole = ((wn + c * hw * hw + m * hw * hw) * 4) as u64;
                assert!(
                    exe.workspace_bytes() < whole,
                    "{t}: workspace {} B, whole copies {whole} B",
                    exe.workspace_bytes(),
                );
            }
        }
    }
}

/// `--precision fp16-weights` and `bf16` store a weight in half precision
/// and Cast it to float32 before a float32 MatMul or Gemm: the reader then
/// reads the stored weight per tile (`half_compute_type` float32) and the
/// Cast goes, so the arena no longer holds the widened weight. Same bits.
#[test]
fn a_half_weight_cast_to_float32_is_read_per_tile_and_the_cast_goes() {
    let (k, n, m) = (300, 520, 4);
    for (t, reader) in [
        ("float16", "y = MatMul (x, Wf)"),
        ("bfloat16", "y = Gemm <transB: int = 1> (x, Wf, bias)"),
    ] {
        let gemm = reader.contains("Gemm");
        let w_dims = if gemm {
            format!("{n},{k}")
        } else {
            format!("{k},{n}")
        };
        let text = format!(
            "<ir_version: 10, opset_import: [\"\" : 17]>\n\
             g (float[{m},{k}] x) => (float[{m},{n}] y)\n\
             <{t}[{w_dims}] W = {{{}}}, float[{n}] bias = {{{}}}>\n{{\n\
             Wf = Cast <to: int = 1> (W)\n{reader}\n}}",
            list(&data(k * n, 51)),
            list(&data(n, 52))
        );
        let model = graphopt_text::parse_model(&text).expect("parses");
        let x = HostTensor {
            dtype: DType::F32,
            shape: vec![m, k],
            data: data(m * k, 53)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        };
        let plan_of = |m: &Model| {
            plan_model(m, &DimValues::default(), &PlanOptions::default())
                .expect("plans")
                .plan
                .arena_bytes
        };
        let (want, _) = run(&model, std::slice::from_ref(&x));
        let mut lowered = model.clone();
        let r = lower_coded(&mut lowered);
        graphopt_ir::verify::verify_model(&lowered).expect("the lowered model verifies");
        assert_eq!(r.half_fused, 1, "{t}: {r:?}");
        let (got, exe) = run(&lowered, std::slice::from_ref(&x));
        assert_eq!(exe.kernel_count("Cast"), 0, "{t}: the Cast goes");
        assert!(got[0].data == want[0].data, "{t}: outputs differ");
        let (before, after) = (plan_of(&model), plan_of(&lowered));
        assert!(
            after + (k * n * 4) as u64 <= before,
            "{t}: arena {after} B lowered, {before} B as written"
        );
    }
}

/// A Cast of a half weight that something besides the products reads (a
/// Transpose here, as a tied embedding would) keeps its f32 copy, so the
/// products keep reading it: nothing is fused, nothing is counted.
#[test]
fn a_cast_read_by_more_than_products_stays_with_its_readers() {
    let mut m = graphopt_text::parse_model(
        r#"<ir_version: 10, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,2] y, float[2,3] z)
        <float16[3,2] W = {1, 2, 3, 4, 5, 6}> {
          Wf = Cast <to: int = 1> (W)
          y = MatMul (x, Wf)
          z = Transpose (Wf)
        }
        "#,
    )
    .expect("parses");
    let r = lower_coded(&mut m);
    assert_eq!((r.half_fused, r.half_widened_bytes), (0, 0), "{r:?}");
}
