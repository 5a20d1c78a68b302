//! Palettized weights (issue 23): a float32 weight `W` stored as k-means
//! indices (uint8, or uint4 at opset 21) and a float32 codebook, decoded in
//! standard ONNX by `Cast` + `Gather` (per tensor) or `Cast` +
//! `GatherElements` + `Reshape` (per group of rows of axis 0), then read by
//! MatMul, Gemm (transB=1), Conv or Gather (embedding rows).
//!
//! Every fixture is written in the textual IR twice: palettized, and with
//! the decoded weights stored as a plain float initializer (the
//! reference). Both run through the whole runtime (planned arena, poison
//! on):
//! - as written (the plain Cast/Gather/GatherElements/Reshape kernels,
//!   uint4 initializers included): bitwise equal to the reference;
//! - lowered by [`graphopt_exec::lower::lower_palette`] (the fused kernels
//!   of `cpu::palette`): bitwise equal to the reference, the fused node
//!   counted in the executable's steps, and the planned arena smaller than
//!   the unfused one by at least the decoded weight's bytes.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::Model;
use graphopt_plan::{plan_model, DimValues, ModelPlan, PlanOptions};

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn ints(n: usize, below: usize, seed: u64) -> Vec<usize> {
    data(n, seed)
        .iter()
        .map(|&v| (((v + 1.0) * 0.5 * below as f32) as usize).min(below - 1))
        .collect()
}

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn dims(s: &[usize]) -> String {
    list(s)
}

/// The op reading the palettized weight.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    MatMul,
    /// Gemm with transB=1 and a bias.
    Gemm,
    /// Conv with 2 groups, a bias, stride 1 and pads 1.
    Conv,
    /// Gather of embedding rows (the weight as `data`).
    Gather,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    op: Op,
    /// Rows of axis 0 per codebook (`None`: one codebook for the tensor).
    group: Option<usize>,
    /// 8 (uint8 indices) or 4 (uint4, opset 21).
    bits: u32,
}

/// A fixture: the palettized model, the reference (decoded weights as a
/// float initializer), inputs, and the decoded weight's bytes.
struct Fixture {
    palettized: String,
    reference: String,
    inputs: Vec<HostTensor>,
    decoded_bytes: u64,
}

fn fixture(c: Case) -> Fixture {
    // Shapes cross the fused kernels' tiles: K = 300 > 256 rows per tile,
    // N = 260 > 256 columns per tile, 70 > 64 output channels per block.
    let (w_shape, x_shape, y_shape, x_type): (Vec<usize>, Vec<usize>, Vec<usize>, &str) = match c.op
    {
        Op::MatMul => (vec![300, 260], vec![2, 3, 300], vec![2, 3, 260], "float"),
        Op::Gemm => (vec![260, 300], vec![3, 300], vec![3, 260], "float"),
        Op::Conv => (
            vec![70, 4, 3, 3],
            vec![2, 8, 6, 5],
            vec![2, 70, 6, 5],
            "float",
        ),
        Op::Gather => (vec![500, 40], vec![2, 7], vec![2, 7, 40], "int64"),
    };
    let numel: usize = w_shape.iter().product();
    let k = if c.bits == 4 { 16 } else { 200 };
    let seed = (c.op as u64) * 10 + c.bits as u64 + c.group.map_or(0, |g| g as u64 * 1000);
    let idx = ints(numel, k, seed);
    let ng = c.group.map_or(1, |g| w_shape[0] / g);
    let codebook = data(ng * k, seed + 1);
    let per = numel / ng;
    let decoded: Vec<f32> = (0..numel)
        .map(|f| codebook[(f / per) * k + idx[f]])
        .collect();
    let it = if c.bits == 4 { "uint4" } else { "uint8" };
    let opset = if c.bits == 4 { 21 } else { 17 };
    let (decode, inits) = match c.group {
        None => (
            "W_palette_indices_i32 = Cast <to: int = 6> (W_palette_indices)\n\
             W = Gather <axis: int = 0> (W_palette_codebook, W_palette_indices_i32)"
                .to_string(),
            format!(
                "{it}[{}] W_palette_indices = {{{}}}, float[{k}] W_palette_codebook = {{{}}}",
                dims(&w_shape),
                list(&idx),
                list(&codebook)
            ),
        ),
        Some(_) => (
            "W_palette_indices_i32 = Cast <to: int = 6> (W_palette_indices)\n\
             W_palette_flat = GatherElements <axis: int = 1> (W_palette_codebook, W_palette_indices_i32)\n\
             W = Reshape (W_palette_flat, W_palette_shape)"
                .to_string(),
            format!(
                "{it}[{ng},{per}] W_palette_indices = {{{}}}, float[{ng},{k}] W_palette_codebook = {{{}}}, int64[{}] W_palette_shape = {{{}}}",
                list(&idx),
                list(&codebook),
                w_shape.len(),
                dims(&w_shape)
            ),
        ),
    };
    let (reader, extra_inits) = match c.op {
        Op::MatMul => ("y = MatMul (x, W)".to_string(), String::new()),
        Op::Gemm => (
            "y = Gemm <transB: int = 1, alpha: float = 0.5, beta: float = 2.0> (x, W, bias)"
                .to_string(),
            format!(", float[260] bias = {{{}}}", list(&data(260, 77))),
        ),
        Op::Conv => (
            "y = Conv <group: int = 2, pads: ints = [1, 1, 1, 1], kernel_shape: ints = [3, 3]> (x, W, bias)"
                .to_string(),
            format!(", float[70] bias = {{{}}}", list(&data(70, 78))),
        ),
        Op::Gather => ("y = Gather <axis: int = 0> (W, x)".to_string(), String::new()),
    };
    let header = format!("<ir_version: 10, opset_import: [\"\" : {opset}]>");
    let sig = format!(
        "g ({x_type}[{}] x) => (float[{}] y)",
        dims(&x_shape),
        dims(&y_shape)
    );
    let palettized = format!("{header}\n{sig}\n<{inits}{extra_inits}>\n{{\n{decode}\n{reader}\n}}");
    let reference = format!(
        "{header}\n{sig}\n<float[{}] W = {{{}}}{extra_inits}>\n{{\n{reader}\n}}",
        dims(&w_shape),
        list(&decoded)
    );
    let x = match c.op {
        Op::Gather => HostTensor::from_i64(
            &x_shape,
            &[0, 499, -1, 7, 7, 250, 3, 1, 2, 3, 4, -500, 5, 6],
        ),
        _ => HostTensor::from_f32(&x_shape, &data(x_shape.iter().product(), seed + 2)),
    };
    Fixture {
        palettized,
        reference,
        inputs: vec![x],
        decoded_bytes: numel as u64 * 4,
    }
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for op in [Op::MatMul, Op::Gemm, Op::Conv, Op::Gather] {
        let g = match op {
            Op::MatMul => 60,
            Op::Gemm => 20,
            Op::Conv => 10,
            Op::Gather => 100,
        };
        for group in [None, Some(g)] {
            for bits in [8, 4] {
                v.push(Case { op, group, bits });
            }
        }
    }
    v
}

fn parse(text: &str) -> Model {
    graphopt_text::parse_model(text).expect("fixture parses")
}

fn plan(m: &Model) -> ModelPlan {
    plan_model(m, &DimValues::default(), &PlanOptions::default()).expect("plans")
}

fn run_model(m: &Model, inputs: &[HostTensor]) -> (Vec<HostTensor>, Executable, u64) {
    let mp = plan(m);
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("binds");
    let (out, _) = exe
        .run(
            inputs,
            &RunOptions {
                threads: 2,
                poison: true,
            },
        )
        .expect("runs");
    let arena = mp.plan.arena_bytes;
    (out, exe, arena)
}

#[test]
fn the_plain_decode_chain_runs_bitwise_like_the_decoded_weights() {
    for c in cases() {
        let f = fixture(c);
        let (want, _, _) = run_model(&parse(&f.reference), &f.inputs);
        let (got, _, _) = run_model(&parse(&f.palettized), &f.inputs);
        assert_eq!(got[0].shape, want[0].shape, "{c:?}");
        assert!(got[0].data == want[0].data, "{c:?}: outputs differ");
    }
}
