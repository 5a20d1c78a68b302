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
//! - lowered by [`graphopt_exec::lower::lower_coded`] (the fused kernels
//!   of `cpu::coded`): bitwise equal to the reference, the fused node
//!   counted in the executable's steps, and the planned arena smaller than
//!   the unfused one by at least the decoded weight's bytes.

use graphopt_exec::lower::{lower_coded, CodedLowering};
use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::Model;
use graphopt_plan::{plan_model, DimValues, ModelPlan, PlanOptions};

use graphopt_testutil::uniform as data;

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
    /// MatMul and Gemm: `x` is one row (the matrix-vector kernel).
    one_row: bool,
}

/// A fixture: the palettized model, the reference (decoded weights as a
/// float initializer), inputs, and the decoded weight's bytes.
struct Fixture {
    palettized: String,
    reference: String,
    inputs: Vec<HostTensor>,
    decoded_bytes: u64,
}

/// A model reading the palettized weight `W`: shapes, the reader's line
/// (inputs `x` and `W`, output `y`) and its other initializers.
struct Spec {
    w: Vec<usize>,
    x: Vec<usize>,
    y: Vec<usize>,
    reader: String,
    /// `, float[N] bias = {...}` or empty.
    extra: String,
    /// `x` holds int64 ids (a Gather reader), else random floats.
    ids: Option<Vec<i64>>,
}

fn build(spec: &Spec, group: Option<usize>, bits: u32, seed: u64) -> Fixture {
    let numel: usize = spec.w.iter().product();
    let k = if bits == 4 { 16 } else { 200 };
    let idx = ints(numel, k, seed);
    let ng = group.map_or(1, |g| spec.w[0] / g);
    let codebook = data(ng * k, seed + 1);
    let per = numel / ng;
    let decoded: Vec<f32> = (0..numel)
        .map(|f| codebook[(f / per) * k + idx[f]])
        .collect();
    let it = if bits == 4 { "uint4" } else { "uint8" };
    let opset = if bits == 4 { 21 } else { 17 };
    let (decode, inits) = match group {
        None => (
            "W_palette_indices_i32 = Cast <to: int = 6> (W_palette_indices)\n\
             W = Gather <axis: int = 0> (W_palette_codebook, W_palette_indices_i32)"
                .to_string(),
            format!(
                "{it}[{}] W_palette_indices = {{{}}}, float[{k}] W_palette_codebook = {{{}}}",
                dims(&spec.w),
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
                spec.w.len(),
                dims(&spec.w)
            ),
        ),
    };
    let (reader, extra) = (&spec.reader, &spec.extra);
    let header = format!("<ir_version: 10, opset_import: [\"\" : {opset}]>");
    let x_type = if spec.ids.is_some() { "int64" } else { "float" };
    let sig = format!(
        "g ({x_type}[{}] x) => (float[{}] y)",
        dims(&spec.x),
        dims(&spec.y)
    );
    let palettized = format!("{header}\n{sig}\n<{inits}{extra}>\n{{\n{decode}\n{reader}\n}}");
    let reference = format!(
        "{header}\n{sig}\n<float[{}] W = {{{}}}{extra}>\n{{\n{reader}\n}}",
        dims(&spec.w),
        list(&decoded)
    );
    let x = match &spec.ids {
        Some(ids) => HostTensor::from_i64(&spec.x, ids),
        None => HostTensor::from_f32(&spec.x, &data(spec.x.iter().product(), seed + 2)),
    };
    Fixture {
        palettized,
        reference,
        inputs: vec![x],
        decoded_bytes: numel as u64 * 4,
    }
}

fn bias(n: usize, seed: u64) -> String {
    format!(", float[{n}] bias = {{{}}}", list(&data(n, seed)))
}

fn fixture(c: Case) -> Fixture {
    // Shapes cross the fused kernels' tiles: K = 300 > 256 rows per tile,
    // N = 260 > 256 columns per tile, 70 > 64 output channels per block.
    let spec = match c.op {
        // One row: N = 257 leaves a last column tile one column wide
        // (its tile strides look transposed, the layout must not change).
        Op::MatMul if c.one_row => Spec {
            w: vec![300, 257],
            x: vec![1, 300],
            y: vec![1, 257],
            reader: "y = MatMul (x, W)".into(),
            extra: String::new(),
            ids: None,
        },
        Op::MatMul => Spec {
            w: vec![300, 260],
            x: vec![2, 3, 300],
            y: vec![2, 3, 260],
            reader: "y = MatMul (x, W)".into(),
            extra: String::new(),
            ids: None,
        },
        Op::Gemm if c.one_row => Spec {
            w: vec![257, 300],
            x: vec![1, 300],
            y: vec![1, 257],
            reader: "y = Gemm <transB: int = 1, alpha: float = 0.5, beta: float = 2.0> (x, W, bias)"
                .into(),
            extra: bias(257, 77),
            ids: None,
        },
        Op::Gemm => Spec {
            w: vec![260, 300],
            x: vec![3, 300],
            y: vec![3, 260],
            reader: "y = Gemm <transB: int = 1, alpha: float = 0.5, beta: float = 2.0> (x, W, bias)"
                .into(),
            extra: bias(260, 77),
            ids: None,
        },
        Op::Conv => Spec {
            w: vec![70, 4, 3, 3],
            x: vec![2, 8, 6, 5],
            y: vec![2, 70, 6, 5],
            reader: "y = Conv <group: int = 2, pads: ints = [1, 1, 1, 1], kernel_shape: ints = [3, 3]> (x, W, bias)".into(),
            extra: bias(70, 78),
            ids: None,
        },
        Op::Gather => Spec {
            w: vec![500, 40],
            x: vec![2, 7],
            y: vec![2, 7, 40],
            reader: "y = Gather <axis: int = 0> (W, x)".into(),
            extra: String::new(),
            ids: Some(vec![0, 499, -1, 7, 7, 250, 3, 1, 2, 3, 4, -500, 5, 6]),
        },
    };
    let seed = (c.op as u64) * 10
        + c.bits as u64
        + c.group.map_or(0, |g| g as u64 * 1000)
        + c.one_row as u64 * 100;
    build(&spec, c.group, c.bits, seed)
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
                v.push(Case {
                    op,
                    group,
                    bits,
                    one_row: false,
                });
            }
            if matches!(op, Op::MatMul | Op::Gemm) {
                v.push(Case {
                    op,
                    group,
                    bits: 8,
                    one_row: true,
                });
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

fn fused_op(op: Op) -> &'static str {
    match op {
        Op::MatMul => "PaletteMatMul",
        Op::Gemm => "PaletteGemm",
        Op::Conv => "PaletteConv",
        Op::Gather => "PaletteGather",
    }
}

fn lowered(m: &Model) -> (Model, CodedLowering) {
    let mut m = m.clone();
    let r = lower_coded(&mut m);
    graphopt_ir::verify::verify_model(&m).expect("the lowered model verifies");
    (m, r)
}

#[test]
fn fused_kernels_run_bitwise_like_the_decoded_weights_in_a_smaller_arena() {
    for c in cases() {
        let f = fixture(c);
        let (want, _, _) = run_model(&parse(&f.reference), &f.inputs);
        let palettized = parse(&f.palettized);
        let (_, _, unfused_arena) = run_model(&palettized, &f.inputs);
        let (m, r) = lowered(&palettized);
        assert_eq!(
            (r.weights, r.fused, r.decoded_bytes),
            (1, 1, f.decoded_bytes),
            "{c:?}: {r:?}"
        );
        let (got, exe, fused_arena) = run_model(&m, &f.inputs);
        let op = fused_op(c.op);
        assert_eq!(exe.kernel_count(op), 1, "{c:?}: the fused node runs");
        for plain in [
            "Cast",
            "Gather",
            "GatherElements",
            "Reshape",
            "MatMul",
            "Gemm",
            "Conv",
        ] {
            assert_eq!(exe.kernel_count(plain), 0, "{c:?}: {plain} left");
        }
        assert_eq!(got[0].shape, want[0].shape, "{c:?}");
        assert!(got[0].data == want[0].data, "{c:?}: outputs differ");
        eprintln!(
            "{c:?}: arena {unfused_arena} B unfused, {fused_arena} B fused, decoded weight {} B, workspace {} B",
            f.decoded_bytes,
            exe.workspace_bytes()
        );
        assert!(
            fused_arena + f.decoded_bytes <= unfused_arena,
            "{c:?}: arena {fused_arena} B fused, {unfused_arena} B unfused, weight {} B",
            f.decoded_bytes
        );
    }
}

/// A per-tensor uint8 palette of a `[4, 3]` weight and `body` reading it.
fn small(outputs: &str, body: &str) -> Model {
    parse(&format!(
        r#"<ir_version: 10, opset_import: ["" : 17]>
        g (float[2,4] x) => ({outputs})
        <uint8[4,3] W_palette_indices = {{0, 1, 2, 3, 3, 2, 1, 0, 0, 0, 1, 1}}, float[4] W_palette_codebook = {{-1.5, 0.25, 2.0, 3.5}}>
        {{
          W_palette_indices_i32 = Cast <to: int = 6> (W_palette_indices)
          W = Gather <axis: int = 0> (W_palette_codebook, W_palette_indices_i32)
          {body}
        }}"#
    ))
}

#[test]
fn a_weight_read_by_anything_else_keeps_its_plain_chain() {
    let x = HostTensor::from_f32(&[2, 4], &data(8, 5));
    let cases = [
        (
            "float[2,3] y, float[3,4] t",
            "y = MatMul (x, W)\nt = Transpose (W)",
            "read by Transpose",
        ),
        ("float[2,3] y, float[4,3] W", "y = MatMul (x, W)", "a graph output"),
        (
            "float[2,3] y, float[4,3] o",
            "c = Constant <value: tensor = bool {1}> ()\n\
             y = MatMul (x, W)\n\
             o = If (c) <then_branch = t () => (float[4,3] a) { a = Identity (W) }, else_branch = e () => (float[4,3] b) { b = Neg (W) }>",
            "read inside a subgraph of If",
        ),
        (
            "float[4,3] y",
            "s = Constant <value: tensor = int64[3] {2, 1, 0}> ()\ny = Gather <axis: int = 1> (W, s)",
            "read by Gather",
        ),
        (
            "float[4,3] y",
            "e = Constant <value: tensor = float[3,3] {1,0,0,0,1,0,0,0,1}> ()\ny = MatMul (W, e)",
            "read by MatMul",
        ),
    ];
    for (outs, body, why) in cases {
        let m = small(outs, body);
        let (lm, r) = lowered(&m);
        assert_eq!((r.weights, r.fused), (0, 0), "{body}");
        assert_eq!(r.kept.len(), 1, "{body}");
        assert!(r.kept[0].1.contains(why), "{body}: {:?}", r.kept);
        assert_eq!(lm.graph.node_count(), m.graph.node_count(), "{body}");
        assert!(lm.functions.is_empty());
        let (want, _, _) = run_model(&m, std::slice::from_ref(&x));
        let (got, exe, _) = run_model(&lm, std::slice::from_ref(&x));
        assert_eq!(
            exe.kernel_count("Gather") + exe.kernel_count("Cast"),
            2 + body.matches("Gather").count()
        );
        assert_eq!(got, want, "{body}");
    }
}

#[test]
fn every_reader_of_one_weight_is_fused() {
    let m = small(
        "float[2,3] y, float[5,3] z",
        "ids = Constant <value: tensor = int64[5] {3, 0, -1, 2, 2}> ()\ny = MatMul (x, W)\nz = Gather (W, ids)",
    );
    let x = HostTensor::from_f32(&[2, 4], &data(8, 6));
    let (lm, r) = lowered(&m);
    assert_eq!((r.weights, r.fused, r.decoded_bytes), (1, 2, 48), "{r:?}");
    assert_eq!(lm.functions.len(), 2);
    let (want, _, _) = run_model(&m, std::slice::from_ref(&x));
    let (got, exe, _) = run_model(&lm, std::slice::from_ref(&x));
    assert_eq!(exe.kernel_count("PaletteMatMul"), 1);
    assert_eq!(exe.kernel_count("PaletteGather"), 1);
    assert_eq!(exe.kernel_count("Cast"), 0);
    assert_eq!(got, want);
}

#[test]
fn out_of_range_indices_are_refused_when_the_kernel_is_made() {
    let m = parse(
        r#"<ir_version: 10, opset_import: ["" : 17]>
        g (float[2,2] x) => (float[2,2] y)
        <uint8[2,2] W_palette_indices = {0, 1, 2, 4}, float[4] W_palette_codebook = {1.0, 2.0, 3.0, 4.0}>
        {
          W_palette_indices_i32 = Cast <to: int = 6> (W_palette_indices)
          W = Gather <axis: int = 0> (W_palette_codebook, W_palette_indices_i32)
          y = MatMul (x, W)
        }"#,
    );
    let (lm, r) = lowered(&m);
    assert_eq!(r.fused, 1);
    let mp = plan(&lm);
    let e = Executable::new(&mp.model, &mp.plan, &CpuBackend)
        .err()
        .unwrap();
    assert!(e.to_string().contains("index 4 out of range"), "{e}");
}

/// The CUDA backend has no palette kernels: the lowering is for the CPU
/// backend only (the facade's CUDA path plans the model as written). Its
/// plan checks (no GPU needed) refuse a lowered node in one line, and run
/// or refuse the plain chains, never panic.
#[test]
fn the_cuda_backend_refuses_fused_nodes_and_packed_indices_in_one_line() {
    use graphopt_exec::ExecError;
    for c in cases() {
        let f = fixture(c);
        let m = parse(&f.palettized);
        let (lm, _) = lowered(&m);
        let mp = plan(&lm);
        match graphopt_exec::cuda::plan_kernels(&mp.model, &mp.plan) {
            Err(ExecError::NoKernel { op, .. }) => {
                assert_eq!(op, format!("graphopt.exec::{}", fused_op(c.op)), "{c:?}")
            }
            other => panic!("{c:?}: {:?}", other.map(|k| k.len())),
        }
        let mp = plan(&m);
        let r = graphopt_exec::cuda::plan_kernels(&mp.model, &mp.plan);
        // uint4 indices are refused (GatherElements, which CUDA lacks,
        // may be named first); uint8 chains run or are refused by op.
        match r {
            Ok(_) => assert_eq!(c.bits, 8, "{c:?}: uint4 indices planned on CUDA"),
            Err(e) => {
                let s = e.to_string();
                assert!(matches!(e, ExecError::NoKernel { .. }), "{c:?}: {s}");
                if c.bits == 4 {
                    assert!(
                        s.contains("uint4") || s.contains("GatherElements"),
                        "{c:?}: {s}"
                    );
                }
            }
        }
    }
}

/// The other paths of the fused kernels: Gemm without transB (and with
/// transA, a row-broadcast bias, no bias), a 1-D MatMul operand, a 1×1 Conv
/// on the direct path (130 channels: blocks of 64, 64, 2), a strided 1-D
/// Conv without bias, a Gather of rank-3 rows.
#[test]
fn fused_kernel_variants_run_bitwise_like_the_decoded_weights() {
    let spec = |w: &[usize], x: &[usize], y: &[usize], reader: &str, extra: String| Spec {
        w: w.to_vec(),
        x: x.to_vec(),
        y: y.to_vec(),
        reader: reader.into(),
        extra,
        ids: None,
    };
    let variants = [
        (
            spec(
                &[300, 20],
                &[5, 300],
                &[5, 20],
                "y = Gemm (x, W)",
                String::new(),
            ),
            Some(30),
            "PaletteGemm",
        ),
        (
            spec(
                &[20, 300],
                &[300, 5],
                &[5, 20],
                "y = Gemm <transA: int = 1, transB: int = 1> (x, W, bias)",
                bias(20, 9),
            ),
            None,
            "PaletteGemm",
        ),
        (
            spec(
                &[300, 20],
                &[5, 300],
                &[5, 20],
                "y = Gemm <beta: float = 0.0> (x, W, bias)",
                bias(20, 9),
            ),
            None,
            "PaletteGemm",
        ),
        (
            spec(&[300, 7], &[300], &[7], "y = MatMul (x, W)", String::new()),
            Some(100),
            "PaletteMatMul",
        ),
        (
            spec(
                &[130, 16, 1, 1],
                &[1, 16, 4, 4],
                &[1, 130, 4, 4],
                "y = Conv (x, W, bias)",
                bias(130, 10),
            ),
            Some(13),
            "PaletteConv",
        ),
        (
            spec(
                &[5, 3, 3],
                &[2, 3, 11],
                &[2, 5, 5],
                "y = Conv <strides: ints = [2]> (x, W)",
                String::new(),
            ),
            None,
            "PaletteConv",
        ),
        (
            Spec {
                ids: Some(vec![49, 0, -3]),
                ..spec(
                    &[50, 4, 3],
                    &[3],
                    &[3, 4, 3],
                    "y = Gather (W, x)",
                    String::new(),
                )
            },
            Some(5),
            "PaletteGather",
        ),
    ];
    for (i, (s, group, op)) in variants.iter().enumerate() {
        for bits in [8, 4] {
            let f = build(s, *group, bits, 100 + i as u64);
            let (want, _, _) = run_model(&parse(&f.reference), &f.inputs);
            let (m, r) = lowered(&parse(&f.palettized));
            assert_eq!(r.fused, 1, "{}: {r:?}", s.reader);
            let (got, exe, _) = run_model(&m, &f.inputs);
            assert_eq!(exe.kernel_count(op), 1, "{}", s.reader);
            assert_eq!(got[0].shape, want[0].shape, "{}", s.reader);
            assert!(
                got[0].data == want[0].data,
                "{} ({bits} bits): outputs differ",
                s.reader
            );
        }
    }
}
