//! Integer weights (what `--quantize` writes): `W = DequantizeLinear(q,
//! scale, zero_point?)` of constants, read by MatMul, Gemm (transB=1),
//! or Gather, lowered by [`graphopt_exec::lower::lower_coded`] into
//! `Dequant*` nodes that decode tiles of `W` in their kernels
//! (`cpu::coded`); a Conv's weight keeps its chain.
//!
//! Each fixture is written in the textual IR and run through the whole
//! runtime (planned arena, poison on) twice: as written (DequantizeLinear's
//! own kernel, then the reader) and lowered. The lowered run must give the
//! same bits, run the fused node and none of the chain, and plan an arena
//! smaller by at least the decoded weight's bytes. The cases cover int8,
//! uint8, int4 and uint4, per-tensor, per-axis and blocked scales (along
//! rows and along columns), float32 scales and float16 scales cast to
//! float32, with and without zero points, and tile edges (K = 300 > 256
//! rows per tile, N = 260 > 256 columns). MatMuls whose activations are
//! quantized too run as integer GEMMs, checked against the float path.

use graphopt_exec::lower::{lower_coded, CodedLowering};
use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::Model;
use graphopt_plan::{plan_model, DimValues, ModelPlan, PlanOptions};

use graphopt_testutil::uniform as data;

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One fixture: the reader, `q`'s type, and where its scales lie.
#[derive(Clone, Copy, Debug)]
struct Case {
    reader: Reader,
    q: &'static str,
    /// The scales' axis, `None` for one scale.
    axis: Option<usize>,
    /// Elements per scale along the axis (0: per axis, not blocked).
    block: usize,
    zero_point: bool,
    /// float16 scales, cast to float32 before DequantizeLinear.
    f16_scale: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Reader {
    MatMul,
    /// One row of `x` (the matrix-vector kernel).
    MatMulRow,
    /// A weight of one row (`K = 1`): an axis of length 1 blocked.
    MatMulDepth1,
    /// transB=1, alpha, beta and a bias.
    Gemm,
    Gather,
}

fn range(q: &str) -> (i64, i64) {
    match q {
        "int8" => (-128, 127),
        "uint8" => (0, 255),
        "int4" => (-8, 7),
        _ => (0, 15),
    }
}

fn ints(n: usize, (lo, hi): (i64, i64), seed: u64) -> Vec<i64> {
    data(n, seed)
        .iter()
        .map(|&v| (lo + ((v + 1.0) * 0.5 * (hi - lo + 1) as f32) as i64).min(hi))
        .collect()
}

/// The fixture's model text, its input, and the decoded weight's bytes.
fn fixture(c: Case, seed: u64) -> (String, HostTensor, u64) {
    let (w, x, y, line, extra, ids): (Vec<usize>, Vec<usize>, Vec<usize>, &str, String, bool) =
        match c.reader {
            Reader::MatMul => (
                vec![300, 260],
                vec![2, 3, 300],
                vec![2, 3, 260],
                "y = MatMul (x, W)",
                String::new(),
                false,
            ),
            Reader::MatMulDepth1 => (
                vec![1, 260],
                vec![2, 3, 1],
                vec![2, 3, 260],
                "y = MatMul (x, W)",
                String::new(),
                false,
            ),
            Reader::MatMulRow => (
                vec![300, 257],
                vec![1, 300],
                vec![1, 257],
                "y = MatMul (x, W)",
                String::new(),
                false,
            ),
            Reader::Gemm => (
                vec![260, 300],
                vec![3, 300],
                vec![3, 260],
                "y = Gemm <transB: int = 1, alpha: float = 0.5, beta: float = 2.0> (x, W, bias)",
                format!(", float[260] bias = {{{}}}", list(&data(260, seed + 5))),
                false,
            ),
            Reader::Gather => (
                vec![500, 40],
                vec![2, 7],
                vec![2, 7, 40],
                "y = Gather <axis: int = 0> (W, x)",
                String::new(),
                true,
            ),
        };
    let numel: usize = w.iter().product();
    let q = ints(numel, range(c.q), seed);
    let sdims: Vec<usize> = match c.axis {
        None => vec![],
        Some(a) if c.block == 0 => vec![w[a]],
        Some(a) => w
            .iter()
            .enumerate()
            .map(|(d, &n)| if d == a { n.div_ceil(c.block) } else { n })
            .collect(),
    };
    let ns: usize = sdims.iter().product();
    // Scales in [0.01, 0.03]: exact in float16 after the f16 rounding the
    // literal goes through either way.
    let scales: Vec<f32> = data(ns, seed + 1).iter().map(|v| 0.02 + 0.01 * v).collect();
    let st = if c.f16_scale { "float16" } else { "float" };
    // A scalar's type has no brackets.
    let ty = |t: &str| match sdims.len() {
        0 => t.to_string(),
        _ => format!("{t}[{}]", list(&sdims)),
    };
    let mut inits = format!(
        "{}[{}] Wq = {{{}}}, {} Ws = {{{}}}",
        c.q,
        list(&w),
        list(&q),
        ty(st),
        list(&scales)
    );
    if c.zero_point {
        let (lo, hi) = range(c.q);
        let zp = ints(ns, (lo / 2, hi / 2), seed + 2);
        inits += &format!(", {} Wz = {{{}}}", ty(c.q), list(&zp));
    }
    let mut attrs = Vec::new();
    if let Some(a) = c.axis {
        attrs.push(format!("axis: int = {a}"));
    }
    if c.block > 0 {
        attrs.push(format!("block_size: int = {}", c.block));
    }
    let attrs = if attrs.is_empty() {
        String::new()
    } else {
        format!(" <{}>", attrs.join(", "))
    };
    let (cast, s) = if c.f16_scale {
        ("Ws32 = Cast <to: int = 1> (Ws)\n", "Ws32")
    } else {
        ("", "Ws")
    };
    let zp = if c.zero_point { ", Wz" } else { "" };
    let opset = if c.block > 0 || c.q.ends_with('4') {
        21
    } else {
        17
    };
    let xt = if ids { "int64" } else { "float" };
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : {opset}]>\n\
         g ({xt}[{}] x) => (float[{}] y)\n\
         <{inits}{extra}>\n{{\n{cast}W = DequantizeLinear{attrs} (Wq, {s}{zp})\n{line}\n}}",
        list(&x),
        list(&y)
    );
    let input = if ids {
        HostTensor::from_i64(&x, &[0, 499, -1, 7, 7, 250, 3, 1, 2, 3, 4, -500, 5, 6])
    } else {
        HostTensor::from_f32(&x, &data(x.iter().product(), seed + 3))
    };
    (text, input, numel as u64 * 4)
}

fn cases() -> Vec<Case> {
    let c = |reader, q, axis, block, zero_point, f16_scale| Case {
        reader,
        q,
        axis,
        block,
        zero_point,
        f16_scale,
    };
    use Reader::*;
    vec![
        // Per column (what --quantize writes for MatMul), per tensor.
        c(MatMul, "int8", Some(1), 0, false, false),
        c(MatMul, "uint8", Some(1), 0, true, false),
        c(MatMul, "int8", None, 0, true, false),
        // Blocks down the rows (--quantize int4-weights), float16 scales.
        c(MatMul, "uint4", Some(0), 32, true, true),
        c(MatMul, "int4", Some(0), 32, false, false),
        c(MatMulRow, "int8", Some(1), 0, false, false),
        c(MatMulRow, "uint4", Some(0), 32, true, true),
        c(MatMulDepth1, "uint4", Some(0), 32, true, true),
        // Gemm's [N, K]: per row, and blocks along each row (axis 1).
        c(Gemm, "int8", Some(0), 0, false, false),
        c(Gemm, "uint4", Some(1), 32, true, true),
        c(Gemm, "uint8", Some(0), 64, true, false),
        // Gather: per row and per column.
        c(Gather, "int8", Some(0), 0, false, false),
        c(Gather, "uint8", Some(1), 0, true, false),
        c(Gather, "uint4", Some(1), 16, true, true),
    ]
}

fn parse(text: &str) -> Model {
    graphopt_text::parse_model(text).unwrap_or_else(|e| panic!("fixture parses: {e}\n{text}"))
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

fn lowered(m: &Model) -> (Model, CodedLowering) {
    let mut m = m.clone();
    let r = lower_coded(&mut m);
    graphopt_ir::verify::verify_model(&m).expect("the lowered model verifies");
    (m, r)
}

#[test]
fn fused_integer_weights_run_bitwise_like_dequantize_linear_in_a_smaller_arena() {
    for (i, c) in cases().into_iter().enumerate() {
        let (text, x, bytes) = fixture(c, 100 + 10 * i as u64);
        let m = parse(&text);
        let (want, plain, unfused_arena) = run_model(&m, std::slice::from_ref(&x));
        assert_eq!(plain.kernel_count("DequantizeLinear"), 1, "{c:?}");
        let (l, r) = lowered(&m);
        assert_eq!(
            (
                r.integer_weights,
                r.integer_fused,
                r.integer_decoded_bytes,
                r.weights
            ),
            (1, 1, bytes, 0),
            "{c:?}: {r:?}"
        );
        let (got, exe, fused_arena) = run_model(&l, &[x]);
        let reader = match c.reader {
            Reader::MatMul | Reader::MatMulRow | Reader::MatMulDepth1 => "MatMul",
            Reader::Gemm => "Gemm",
            Reader::Gather => "Gather",
        };
        assert_eq!(exe.kernel_count(&format!("Dequant{reader}")), 1, "{c:?}");
        for plain in ["DequantizeLinear", "Cast", reader] {
            assert_eq!(exe.kernel_count(plain), 0, "{c:?}: {plain} left");
        }
        assert_eq!(got[0].shape, want[0].shape, "{c:?}");
        assert!(got[0].data == want[0].data, "{c:?}: outputs differ");
        assert!(
            fused_arena + bytes <= unfused_arena,
            "{c:?}: arena {fused_arena} B fused, {unfused_arena} B unfused, weight {bytes} B"
        );
    }
}

/// A weight some other node reads, or whose scale is computed, or that a
/// Conv reads, keeps its plain chain; one read by two fusable nodes is
/// fused in both.
#[test]
fn only_whole_chains_of_constants_are_fused() {
    let head = "<ir_version: 10, opset_import: [\"\" : 17]>\n";
    let inits = "<int8[4, 3] Wq = {1, -2, 3, 4, 5, -6, 7, 8, 9, 10, 11, -12}, float[3] Ws = {0.5, 0.25, 2.0}, float[4] Ws4 = {0.5, 0.25, 2.0, 1.0}, int8[4, 3, 1, 1] Wc = {1, -2, 3, 4, 5, -6, 7, 8, 9, 10, 11, -12}>";
    let kept = [
        // Read by a Transpose as well.
        "g (float[2, 4] x) => (float[2, 3] y, float[3, 4] t) {inits} {\nW = DequantizeLinear (Wq, Ws)\ny = MatMul (x, W)\nt = Transpose (W)\n}",
        // A graph output.
        "g (float[2, 4] x) => (float[2, 3] y, float[4, 3] W) {inits} {\nW = DequantizeLinear (Wq, Ws)\ny = MatMul (x, W)\n}",
        // Its scale is not a constant.
        "g (float[2, 4] x, float[3] s) => (float[2, 3] y) {inits} {\nW = DequantizeLinear (Wq, s)\ny = MatMul (x, W)\n}",
        // A Conv's weight.
        "g (float[1, 3, 5, 5] x) => (float[1, 4, 5, 5] y) {inits} {\nW = DequantizeLinear <axis: int = 0> (Wc, Ws4)\ny = Conv (x, W)\n}",
    ];
    for (i, body) in kept.iter().enumerate() {
        let m = parse(&format!("{head}{}", body.replace("{inits}", inits)));
        let (_, r) = lowered(&m);
        assert_eq!(r.integer_weights, 0, "{body}");
        // The report says why a decode chain was kept (the first two); a
        // computed scale makes no chain, and a Conv's is kept silently.
        assert_eq!(r.kept.len(), usize::from(i < 2), "{body}: {:?}", r.kept);
    }
    let two = format!(
        "{head}g (float[2, 4] x, int64[2] ids) => (float[2, 3] y, float[2, 3] z) {inits} {{\nW = DequantizeLinear (Wq, Ws)\ny = MatMul (x, W)\nz = Gather (W, ids)\n}}"
    );
    let m = parse(&two);
    let (l, r) = lowered(&m);
    assert_eq!((r.integer_weights, r.integer_fused), (1, 2));
    let x = HostTensor::from_f32(&[2, 4], &data(8, 9));
    let ids = HostTensor::from_i64(&[2], &[3, -4]);
    let (want, _, _) = run_model(&m, &[x.clone(), ids.clone()]);
    let (got, _, _) = run_model(&l, &[x, ids]);
    for (g, w) in got.iter().zip(&want) {
        assert!(g.data == w.data);
    }
}

/// A MatMul of quantized activations (DynamicQuantizeLinear, or a
/// QuantizeLinear to uint8, then DequantizeLinear) and an integer weight
/// becomes one IntegerMatMul: exact integer sums scaled once, within
/// float32 rounding of the float path (dequantize both, multiply), with
/// neither operand dequantized in the arena. An activation another node
/// also reads keeps its DequantizeLinear for that node.
#[test]
fn quantized_activations_times_integer_weights_run_as_integer_gemms() {
    let (k, n) = (300, 260);
    let w = ints(k * n, (0, 255), 7);
    let ws: Vec<f32> = data(n, 8).iter().map(|v| 0.002 + 0.001 * v).collect();
    let wz = ints(n, (100, 150), 9);
    let wi = ints(k * n, (-128, 127), 10);
    let acts = [
        // dynamic
        "xq, xs, xz = DynamicQuantizeLinear (x)\nxd = DequantizeLinear (xq, xs, xz)",
        // static: a constant scale and zero point
        "xq = QuantizeLinear (x, s, z)\nxd = DequantizeLinear (xq, s, z)",
    ];
    let weights = [
        format!(
            "uint8[{k}, {n}] Wq = {{{}}}, float[{n}] Ws = {{{}}}, uint8[{n}] Wz = {{{}}}",
            list(&w),
            list(&ws),
            list(&wz)
        ),
        format!(
            "int8[{k}, {n}] Wq = {{{}}}, float Ws = {{0.003}}",
            list(&wi)
        ),
    ];
    for (ai, act) in acts.iter().enumerate() {
        for (wi_, weight) in weights.iter().enumerate() {
            for shared in [false, true] {
                let zp = if wi_ == 0 { ", Wz" } else { "" };
                let (outs, extra) = if shared {
                    (format!(", float[2, 3, {k}] e"), "e = Relu (xd)\n")
                } else {
                    (String::new(), "")
                };
                let text = format!(
                    "<ir_version: 10, opset_import: [\"\" : 17]>\n\
                     g (float[2, 3, {k}] x) => (float[2, 3, {n}] y{outs})\n\
                     <{weight}, float s = {{0.01}}, uint8 z = {{120}}>\n{{\n{act}\n\
                     W = DequantizeLinear <axis: int = 1> (Wq, Ws{zp})\ny = MatMul (xd, W)\n{extra}}}"
                );
                let c = format!("activations {ai}, weight {wi_}, shared {shared}");
                let m = parse(&text);
                let x = HostTensor::from_f32(&[2, 3, k], &data(6 * k, 11 + ai as u64));
                let (want, _, float_arena) = run_model(&m, std::slice::from_ref(&x));
                let (l, r) = lowered(&m);
                if !graphopt_exec::cpu::qgemm::available() {
                    // No VNNI: the float path stays (it is faster there).
                    eprintln!("{c}: no AVX-512 VNNI here, the MatMul stays a DequantMatMul");
                    assert_eq!((r.integer_weights, r.integer_matmuls), (1, 0), "{c}: {r:?}");
                    continue;
                }
                assert_eq!((r.integer_weights, r.integer_matmuls), (1, 1), "{c}: {r:?}");
                let (got, exe, arena) = run_model(&l, &[x]);
                assert_eq!(exe.kernel_count("IntegerMatMul"), 1, "{c}");
                assert_eq!(
                    exe.kernel_count("MatMul") + exe.kernel_count("DequantMatMul"),
                    0,
                    "{c}"
                );
                // The activations' DequantizeLinear stays only for the Relu.
                assert_eq!(
                    exe.kernel_count("DequantizeLinear"),
                    usize::from(shared),
                    "{c}"
                );
                let (g, w) = (got[0].to_f32().unwrap(), want[0].to_f32().unwrap());
                let rel = graphopt_testutil::rel_l2(&g, &w);
                eprintln!("{c}: rel L2 {rel:.2e} against the float path, arena {arena} B (float path {float_arena} B)");
                // Measured 2.6e-7 to 2.7e-7.
                assert!(rel < 8e-7, "{c}: rel L2 {rel}");
                if shared {
                    assert!(got[1].data == want[1].data, "{c}: the Relu's output");
                } else {
                    // W (f32) is not in the arena (and xd's DequantizeLinear
                    // is gone: the kernel count above).
                    assert!(
                        arena + (k * n * 4) as u64 <= float_arena,
                        "{c}: {arena} B vs {float_arena} B"
                    );
                }
            }
        }
    }
}

/// What the integer GEMM does not implement stays on the float path:
/// activations quantized to int8 (opset 21's output_dtype), a per-channel
/// activation scale, weight scales along the rows (K != N) and blocked
/// weight scales.
#[test]
fn other_quantized_matmuls_stay_on_the_float_path() {
    let (k, n) = (6, 4);
    let w = ints(k * n, (0, 255), 3);
    let ws6 = "float[6] Ws = {0.01, 0.02, 0.03, 0.04, 0.05, 0.06}";
    let cases = [
        (
            "xq = QuantizeLinear <output_dtype: int = 3> (x, s)\nxd = DequantizeLinear (xq, s)",
            "float[4] Ws = {0.01, 0.02, 0.03, 0.04}".to_string(),
            "axis: int = 1",
        ),
        (
            "xq = QuantizeLinear <axis: int = 2> (x, s3, z3)\nxd = DequantizeLinear <axis: int = 2> (xq, s3, z3)",
            "float[4] Ws = {0.01, 0.02, 0.03, 0.04}".to_string(),
            "axis: int = 1",
        ),
        (
            "xq, xs, xz = DynamicQuantizeLinear (x)\nxd = DequantizeLinear (xq, xs, xz)",
            ws6.to_string(),
            "axis: int = 0",
        ),
        (
            "xq, xs, xz = DynamicQuantizeLinear (x)\nxd = DequantizeLinear (xq, xs, xz)",
            "float[2, 4] Ws = {0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08}".to_string(),
            "axis: int = 0, block_size: int = 3",
        ),
    ];
    for (act, scales, attrs) in cases {
        let text = format!(
            "<ir_version: 10, opset_import: [\"\" : 21]>\n\
             g (float[2, 3, {k}] x) => (float[2, 3, {n}] y)\n\
             <uint8[{k}, {n}] Wq = {{{}}}, {scales}, float s = {{0.01}},\
             float[{k}] s3 = {{0.01, 0.02, 0.01, 0.02, 0.01, 0.02}}, uint8[{k}] z3 = {{1, 2, 3, 4, 5, 6}}>\n{{\n{act}\n\
             W = DequantizeLinear <{attrs}> (Wq, Ws)\ny = MatMul (xd, W)\n}}",
            list(&w)
        );
        let m = parse(&text);
        let (l, r) = lowered(&m);
        assert_eq!(
            (r.integer_weights, r.integer_matmuls),
            (1, 0),
            "{act} / {attrs}: {r:?}"
        );
        let x = HostTensor::from_f32(&[2, 3, k], &data(6 * k, 5));
        let (want, _, _) = run_model(&m, std::slice::from_ref(&x));
        let (got, _, _) = run_model(&l, &[x]);
        assert!(got[0].data == want[0].data, "{act} / {attrs}");
    }
}

/// Convs of quantized activations (a QuantizeLinear to uint8, then
/// DequantizeLinear) and integer weights run on exact integer sums: a 3x3
/// Conv whose output only a Relu and a QuantizeLinear with zero point 0
/// read becomes one QLinearConv (the Relu is its saturation), and the 1x1
/// Conv after it, whose float output is the graph's, an IntegerConv that
/// reads the QLinearConv's uint8 output. Where the QuantizeLinear's zero
/// point is not 0 the Relu is not a saturation, and both Convs are
/// IntegerConvs. Against the float path (dequantize, float Conv), within
/// a step of the requantized values; no Conv, Relu or DequantizeLinear is
/// left, and the arena is smaller.
#[test]
fn quantized_convolutions_run_on_integer_sums() {
    let (c, m, m2, hw) = (8, 16, 12, 12);
    let w = ints(m * c * 9, (0, 255), 21);
    let ws: Vec<f32> = data(m, 22).iter().map(|v| 0.003 + 0.001 * v).collect();
    let wz = ints(m, (100, 150), 23);
    let b = data(m, 24);
    let w2 = ints(m2 * m, (-128, 127), 25);
    let b2 = data(m2, 26);
    for relu_zero in [0, 3] {
        let text = format!(
            "<ir_version: 10, opset_import: [\"\" : 17]>\n\
             g (float[2, {c}, {hw}, {hw}] x) => (float[2, {m2}, {hw}, {hw}] y)\n\
             <uint8[{m}, {c}, 3, 3] Wq = {{{}}}, float[{m}] Ws = {{{}}}, uint8[{m}] Wz = {{{}}},\
              float[{m}] B = {{{}}}, int8[{m2}, {m}, 1, 1] W2q = {{{}}}, float W2s = {{0.004}},\
              float[{m2}] B2 = {{{}}}, float s = {{0.02}}, uint8 z = {{120}},\
              float s2 = {{0.01}}, uint8 z2 = {{{relu_zero}}}>\n{{\n\
             xq = QuantizeLinear (x, s, z)\nxd = DequantizeLinear (xq, s, z)\n\
             W = DequantizeLinear <axis: int = 0> (Wq, Ws, Wz)\n\
             h = Conv <pads = [1, 1, 1, 1]> (xd, W, B)\nr = Relu (h)\n\
             rq = QuantizeLinear (r, s2, z2)\nrd = DequantizeLinear (rq, s2, z2)\n\
             W2 = DequantizeLinear (W2q, W2s)\ny = Conv (rd, W2, B2)\n}}",
            list(&w),
            list(&ws),
            list(&wz),
            list(&b),
            list(&w2),
            list(&b2)
        );
        let model = parse(&text);
        let x = HostTensor::from_f32(&[2, c, hw, hw], &data(2 * c * hw * hw, 27));
        let (want, _, float_arena) = run_model(&model, std::slice::from_ref(&x));
        let (l, r) = lowered(&model);
        if !graphopt_exec::cpu::qgemm::available() {
            eprintln!("no AVX-512 VNNI here: the Convs stay float");
            assert_eq!((r.integer_convs, r.qlinear_convs), (0, 0), "{r:?}");
            continue;
        }
        let fused = usize::from(relu_zero == 0);
        assert_eq!(
            (r.integer_convs, r.qlinear_convs),
            (2 - fused, fused),
            "zero point {relu_zero}: {r:?}"
        );
        let (got, exe, arena) = run_model(&l, &[x]);
        assert_eq!(exe.kernel_count("QLinearConv"), fused);
        assert_eq!(exe.kernel_count("IntegerConv"), 2 - fused);
        assert_eq!(exe.kernel_count("Conv"), 0);
        assert_eq!(exe.kernel_count("Relu"), 1 - fused);
        assert_eq!(exe.kernel_count("DequantizeLinear"), 0);
        let (g, w) = (got[0].to_f32().unwrap(), want[0].to_f32().unwrap());
        let rel = graphopt_testutil::rel_l2(&g, &w);
        let worst = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "zero point {relu_zero}: rel L2 {rel:.2e}, worst {worst:.2e} against the float path, \
             arena {arena} B (float path {float_arena} B)"
        );
        // One requantized value a step off moves y by s2 · |W2| (at most
        // 0.01 · 128 · 0.004 = 5.1e-3). Measured 4.8e-3 (QLinearConv) and
        // 9.5e-7 (IntegerConvs).
        let worst_bound = if fused == 1 { 1.5e-2 } else { 3e-6 };
        assert!(
            worst <= worst_bound,
            "zero point {relu_zero}: worst {worst}"
        );
        // Measured 1.7e-4 and 7.9e-8.
        let bound = if fused == 1 { 5e-4 } else { 2.5e-7 };
        assert!(rel < bound, "zero point {relu_zero}: rel L2 {rel}");
        assert!(arena < float_arena, "{arena} B vs {float_arena} B");
    }
}

/// onnxruntime's QDQ quantizer writes a Conv's bias as
/// `DequantizeLinear(int32, xs · ws[c])`: with the Conv's QuantizeLinear
/// the integers go into the QLinearConv as they are (checked on the
/// lowered node; the output is within a step of the float path's), a bias
/// at another scale is requantized to it, and without a QuantizeLinear
/// after it the IntegerConv takes the bias dequantized. No DequantizeLinear is
/// left in any case.
#[test]
fn a_dequantized_int32_bias_is_taken_as_integers() {
    let (c, m, hw) = (6, 8, 9);
    let w = ints(m * c * 9, (-127, 127), 31);
    let ws: Vec<f32> = data(m, 32).iter().map(|v| 0.004 + 0.001 * v).collect();
    let xs = 0.02f32;
    let bq = ints(m, (-3000, 3000), 33);
    for (case, quantized_out) in [("exact", true), ("rescaled", true), ("float out", false)] {
        let bs: Vec<f32> = ws
            .iter()
            .map(|&s| {
                if case == "rescaled" {
                    1.5 * xs * s
                } else {
                    xs * s
                }
            })
            .collect();
        let tail = if quantized_out {
            "yq = QuantizeLinear (h, s2, z2)\ny = DequantizeLinear (yq, s2, z2)"
        } else {
            "y = Identity (h)"
        };
        let text = format!(
            "<ir_version: 10, opset_import: [\"\" : 17]>\n\
             g (float[1, {c}, {hw}, {hw}] x) => (float[1, {m}, {hw}, {hw}] y)\n\
             <int8[{m}, {c}, 3, 3] Wq = {{{}}}, float[{m}] Ws = {{{}}}, int8[{m}] Wz = {{{}}},\
              int32[{m}] Bq = {{{}}}, float[{m}] Bs = {{{}}}, int32[{m}] Bz = {{{}}},\
              float s = {{{xs}}}, uint8 z = {{128}}, float s2 = {{0.02}}, uint8 z2 = {{128}}>\n{{\n\
             xq = QuantizeLinear (x, s, z)\nxd = DequantizeLinear (xq, s, z)\n\
             W = DequantizeLinear <axis: int = 0> (Wq, Ws, Wz)\n\
             B = DequantizeLinear <axis: int = 0> (Bq, Bs, Bz)\n\
             h = Conv <pads = [1, 1, 1, 1]> (xd, W, B)\n{tail}\n}}",
            list(&w),
            list(&ws),
            list(&vec![0; m]),
            list(&bq),
            list(&bs),
            list(&vec![0; m]),
        );
        let model = parse(&text);
        let x = HostTensor::from_f32(&[1, c, hw, hw], &data(c * hw * hw, 34));
        let (want, _, _) = run_model(&model, std::slice::from_ref(&x));
        let (l, r) = lowered(&model);
        if !graphopt_exec::cpu::qgemm::available() {
            assert_eq!((r.integer_convs, r.qlinear_convs), (0, 0), "{case}: {r:?}");
            continue;
        }
        let fused = usize::from(quantized_out);
        assert_eq!(
            (r.integer_convs, r.qlinear_convs),
            (1 - fused, fused),
            "{case}: {r:?}"
        );
        if quantized_out {
            // The QLinearConv's int32 bias: Bq itself at its own scale,
            // else requantized (in float32, as onnxruntime divides).
            let g = &l.graph;
            let qc = g
                .nodes()
                .find(|&n| g.node(n).op_type == "QLinearConv")
                .expect("fused");
            let got = g
                .constant(g.node(qc).input(8).unwrap())
                .unwrap()
                .to_i64_vec()
                .unwrap();
            let want: Vec<i64> = (0..m)
                .map(|c| match case {
                    "exact" => bq[c],
                    _ => ((bq[c] as f32 * bs[c]) / (xs * ws[c])).round_ties_even() as i64,
                })
                .collect();
            assert_eq!(got, want, "{case}: the QLinearConv's bias");
            if case == "rescaled" {
                assert_ne!(got, bq, "rescaled: not the integers as they are");
            }
        }
        let (got, exe, _) = run_model(&l, &[x]);
        assert_eq!(
            exe.kernel_count("DequantizeLinear"),
            fused,
            "{case}: only y's"
        );
        let (g, w) = (got[0].to_f32().unwrap(), want[0].to_f32().unwrap());
        let worst = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let steps = g.iter().zip(&w).filter(|(a, b)| a != b).count();
        eprintln!("{case}: worst {worst:.2e}, {steps} of {} differ", g.len());
        if quantized_out {
            // A requantized value at most one step (0.02) off, for few
            // values (measured: none).
            assert!(worst <= 0.0201, "{case}: worst {worst}");
            assert!(steps * 50 < g.len(), "{case}: {steps} differ");
        } else {
            // Float32 rounding of the float path's sums (measured 7.2e-7).
            assert!(worst < 2.2e-6, "{case}: worst {worst}");
        }
    }
}

/// A Gemm of quantized activations and a per-column integer weight
/// (`[K, N]`, no transposes, alpha 1) with a bias row runs as one
/// IntegerGemm: the integer GEMM with the bias added after the scale. The
/// bias may be a float constant, a DequantizeLinear of int32 (onnxruntime's
/// QDQ quantizer), or of uint8 behind an Identity (a bias it quantized as
/// an activation, where the exporter shared it). Within float32 rounding
/// of the float path; a transposed weight stays on it.
#[test]
fn quantized_gemms_with_a_bias_run_as_integer_gemms() {
    let (k, n) = (40, 24);
    let w = ints(k * n, (-127, 127), 41);
    let ws: Vec<f32> = data(n, 42).iter().map(|v| 0.004 + 0.001 * v).collect();
    let biases = [
        (
            "float",
            format!("float[{n}] B = {{{}}}", list(&data(n, 43))),
            "C = Identity (B)",
        ),
        (
            "int32",
            format!(
                "int32[{n}] Bq = {{{}}}, float[{n}] Bs = {{{}}}",
                list(&ints(n, (-900, 900), 44)),
                list(&ws.iter().map(|s| 0.02 * s).collect::<Vec<_>>())
            ),
            "C = DequantizeLinear <axis: int = 0> (Bq, Bs)",
        ),
        (
            "uint8",
            format!(
                "uint8[{n}] Bq = {{{}}}, float Bs = {{0.01}}, uint8 Bz = {{128}}",
                list(&ints(n, (0, 255), 45))
            ),
            "D = DequantizeLinear (Bq, Bs, Bz)\nC = Identity (D)",
        ),
    ];
    for (case, consts, chain) in biases {
        for trans in [false, true] {
            let (wdims, attrs, wq) = if trans {
                (format!("{n}, {k}"), "<transB: int = 1>", "axis: int = 0")
            } else {
                (format!("{k}, {n}"), "", "axis: int = 1")
            };
            let text = format!(
                "<ir_version: 10, opset_import: [\"\" : 17]>\n\
                 g (float[3, {k}] x) => (float[3, {n}] y)\n\
                 <int8[{wdims}] Wq = {{{}}}, float[{n}] Ws = {{{}}}, {consts},\
                  float s = {{0.02}}, uint8 z = {{120}}>\n{{\n\
                 xq = QuantizeLinear (x, s, z)\nxd = DequantizeLinear (xq, s, z)\n\
                 W = DequantizeLinear <{wq}> (Wq, Ws)\n{chain}\n\
                 y = Gemm {attrs} (xd, W, C)\n}}",
                list(&w),
                list(&ws)
            );
            let c = format!("{case} bias, transB {trans}");
            let model = parse(&text);
            let x = HostTensor::from_f32(&[3, k], &data(3 * k, 46));
            let (want, _, _) = run_model(&model, std::slice::from_ref(&x));
            let (l, r) = lowered(&model);
            let integer = graphopt_exec::cpu::qgemm::available() && !trans;
            assert_eq!(r.integer_matmuls, usize::from(integer), "{c}: {r:?}");
            let (got, exe, _) = run_model(&l, &[x]);
            assert_eq!(exe.kernel_count("IntegerGemm"), usize::from(integer), "{c}");
            if integer {
                // Neither operand's nor the bias's DequantizeLinear is left.
                assert_eq!(exe.kernel_count("DequantizeLinear"), 0, "{c}");
                assert_eq!(exe.kernel_count("Identity"), 0, "{c}");
            }
            let (g, w) = (got[0].to_f32().unwrap(), want[0].to_f32().unwrap());
            let rel = graphopt_testutil::rel_l2(&g, &w);
            eprintln!("{c}: rel L2 {rel:.2e} against the float path");
            // Measured at most 1.1e-7.
            assert!(rel < 3.5e-7, "{c}: rel L2 {rel}");
        }
    }
}

/// A DequantizeLinear → Reshape/Transpose → QuantizeLinear pair of one
/// scale and zero point (onnxruntime's QDQ graphs put one around every
/// data-movement node) is dropped: the moves run on the uint8 values, and
/// the outputs keep the float path's bits (the pair is exact; the inputs
/// reach both ends of the uint8 range). A MatMul after the moves takes
/// their uint8 output as quantized activations (an integer GEMM on VNNI
/// CPUs, within float32 rounding of the float path there). A pair
/// whose two sides differ in scale (the Transpose's, with `s2` 0.03)
/// stays.
#[test]
fn dequantize_quantize_pairs_around_moves_are_dropped() {
    for (s2, dropped) in [("0.02", 2), ("0.03", 1)] {
        let text = format!(
            "<ir_version: 10, opset_import: [\"\" : 17]>\n\
             g (float[2, 60, 40] x) => (float[40, 60, 2] y, float[40, 60, 8] m)\n\
             <float s = {{0.02}}, uint8 z = {{120}}, float s2 = {{{s2}}}, int64[3] shape = {{2, 40, 60}},\
              int8[2, 8] Wq = {{{}}}, float Ws = {{0.01}}>\n{{\n\
             xq = QuantizeLinear (x, s, z)\nxd = DequantizeLinear (xq, s, z)\n\
             r = Reshape (xd, shape)\nrq = QuantizeLinear (r, s, z)\nrd = DequantizeLinear (rq, s, z)\n\
             t = Transpose <perm = [1, 2, 0]> (rd)\ntq = QuantizeLinear (t, s2, z)\n\
             y = DequantizeLinear (tq, s2, z)\n\
             W = DequantizeLinear (Wq, Ws)\nm = MatMul (y, W)\n}}",
            list(&ints(2 * 8, (-127, 127), 52))
        );
        let model = parse(&text);
        // Inputs in [-4, 4): quantized values saturate at both ends.
        let xs: Vec<f32> = data(4800, 51).iter().map(|v| 4.0 * v).collect();
        let x = HostTensor::from_f32(&[2, 60, 40], &xs);
        let (want, _, _) = run_model(&model, std::slice::from_ref(&x));
        let (l, r) = lowered(&model);
        assert_eq!(r.moved_pairs, dropped, "scale {s2}: {r:?}");
        let (got, exe, _) = run_model(&l, &[x]);
        assert!(got[0].data == want[0].data, "scale {s2}: the bits");
        let integer = graphopt_exec::cpu::qgemm::available();
        assert_eq!(r.integer_matmuls, usize::from(integer), "scale {s2}: {r:?}");
        let (gm, wm) = (got[1].to_f32().unwrap(), want[1].to_f32().unwrap());
        let rel = graphopt_testutil::rel_l2(&gm, &wm);
        eprintln!("scale {s2}: the MatMul at rel L2 {rel:.2e} of the float path");
        // Float32 rounding of the float path (measured 6.2e-8 and 6.5e-8).
        assert!(rel < 2e-7, "scale {s2}: the MatMul, rel L2 {rel}");
        assert_eq!(
            exe.kernel_count("QuantizeLinear"),
            3 - dropped,
            "scale {s2}"
        );
        assert_eq!(
            exe.kernel_count("DequantizeLinear"),
            3 - dropped,
            "scale {s2}"
        );
    }
}
