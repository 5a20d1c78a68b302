//! Fused elementwise chains (issue 20, item 3): chains of float32
//! elementwise nodes, once lowered by [`graphopt_exec::lower::lower_coded`]
//! (which calls [`graphopt_exec::fuse_chains::fuse_chains`]), run as one
//! `ElementwiseChain.<k>` node per chain.
//!
//! Each case runs through the whole runtime (planned arena, poison on) as
//! written, node by node, and lowered: the outputs must be bitwise equal,
//! the expected chains must form, and the lowered plan must not need more
//! arena than the plain one.

mod common;

use common::{f32_tensor, list, run};
use graphopt_exec::lower::lower_coded;
use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::{DType, Model};
use graphopt_plan::{plan_model, DimValues, PlanOptions};
use graphopt_testutil::uniform as data;

fn chain_nodes(m: &Model) -> usize {
    m.graph
        .nodes()
        .filter(|&n| graphopt_plan::chain_op(&m.graph.node(n).op_type))
        .count()
}

/// `m` run as written and lowered, at 1-3 threads: the same bits, `want`
/// (chains, nodes fused) formed, no more arena.
fn check(name: &str, m: &Model, inputs: &[HostTensor], want: (usize, usize)) {
    let mut lowered = m.clone();
    let r = lower_coded(&mut lowered);
    graphopt_ir::verify::verify_model(&lowered).expect("the lowered model verifies");
    assert_eq!((r.chains, r.chain_nodes), want, "{name}: {r:?}");
    assert_eq!(chain_nodes(&lowered), want.0, "{name}");
    for threads in 1..=3 {
        let (plain, plain_arena, _) = run(m, inputs, threads);
        let (fused, fused_arena, _) = run(&lowered, inputs, threads);
        assert_eq!(plain.len(), fused.len(), "{name}");
        for (p, f) in plain.iter().zip(&fused) {
            assert_eq!(p.shape, f.shape, "{name}");
            assert!(
                p.data == f.data,
                "{name} at {threads} threads: outputs differ"
            );
        }
        assert!(
            fused_arena <= plain_arena,
            "{name}: arena {fused_arena} > {plain_arena}"
        );
    }
}

/// GELU as the TorchScript exporter writes it (`h` read twice, scalar
/// constants) after a MatMul, over several tiles: one chain of five, which
/// runs over `h` in place, so the arena holds one FFN-wide tensor where
/// the nodes needed two (`h` lives until the fourth).
#[test]
fn gelu_runs_as_one_chain_with_the_nodes_bits() {
    let (r, c) = (3, 1000);
    let w: Vec<f32> = data(8 * c, 1).iter().map(|v| v * 3.0).collect();
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[{r},8] x) => (float[{r},{c}] y)\n\
         <float[8,{c}] w = {{{}}}, float c1 = {{1.4142135}}, float c2 = {{1.0}}, float c3 = {{0.5}}>\n{{\n\
         h = MatMul (x, w)\n d = Div (h, c1)\n e = Erf (d)\n a = Add (e, c2)\n m = Mul (h, a)\n y = Mul (m, c3)\n}}",
        list(&w)
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let inputs = [f32_tensor(&[r, 8], &data(r * 8, 2))];
    check("gelu", &m, &inputs, (1, 5));
    let mut lowered = m.clone();
    lower_coded(&mut lowered);
    let (_, plain_arena, _) = run(&m, &inputs, 2);
    let (_, fused_arena, _) = run(&lowered, &inputs, 2);
    assert!(
        fused_arena < plain_arena,
        "the intermediates should leave the arena: {fused_arena} vs {plain_arena}"
    );
}

/// Every op a chain takes, with a bias row `[c]`, a per-row column
/// `[r, 1]`, a scalar, a value read twice by one node (`Mul(t, t)`), NaN
/// and infinities in the data; a value also read outside the chain ends it
/// (two chains), and an intermediate that is a graph output stays.
#[test]
fn every_op_and_broadcast_gives_the_nodes_bits() {
    let (r, c) = (5, 700);
    let b = data(c, 2);
    let s: Vec<f32> = data(r, 3).iter().map(|v| v.abs() + 0.5).collect();
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[{r},{c}] x, float[{r},1] s) => (float[{r},{c}] y, float[{r},{c}] kept, float[{r},{c}] z)\n\
         <float[{c}] b = {{{}}}, float two = {{2.0}}, float k = {{0.75}}>\n{{\n\
         t0 = Add (x, b)\n t1 = Mul (t0, s)\n t2 = Tanh (t1)\n t3 = Sigmoid (t2)\n\
         t4 = Abs (t1)\n t5 = Sqrt (t4)\n t6 = Add (t3, t5)\n t7 = Pow (t6, two)\n\
         t8 = Reciprocal (t7)\n t9 = Neg (t8)\n t10 = Exp (t9)\n t11 = Log (t10)\n\
         t12 = Max (t11, k)\n t13 = Min (t12, t1)\n t14 = Sub (t13, x)\n\
         kept = Relu (t14)\n t15 = Erf (kept)\n t16 = Mul (t15, t15)\n y = Div (t16, s)\n\
         u0 = Mul (x, k)\n u1 = Add (u0, b)\n r0 = ReduceSum <keepdims: int = 1> (u1)\n\
         u2 = Sub (u1, r0)\n z = Relu (u2)\n}}",
        list(&b)
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let mut x: Vec<f32> = data(r * c, 4).iter().map(|v| v * 4.0).collect();
    x[3] = f32::NAN;
    x[10] = f32::INFINITY;
    x[11] = f32::NEG_INFINITY;
    x[12] = -0.0;
    let inputs = [f32_tensor(&[r, c], &x), f32_tensor(&[r, 1], &s)];
    // t1 is read by t2, t4 and t13: the chain t0..t1 ends there, and so on;
    // `kept` is an output, so t15.. is its own chain; u1 is read by the
    // ReduceSum too.
    // Chains: {t0, t1}, {t2 .. kept} (14 nodes), {t15, t16, y}, {u0, u1},
    // {u2, z}.
    check("every op", &m, &inputs, (5, 23));
}

/// A chain's output may overwrite its same-sized input that dies there
/// (the planner's elementwise rule for the fused op): the plan puts `y`
/// over `h`, and the bits hold.
#[test]
fn a_chain_runs_in_place_over_a_dying_input() {
    let (r, c) = (4, 3000);
    let w = data(c * 8, 5);
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[{r},8] x) => (float[{r},{c}] y)\n\
         <float[8,{c}] w = {{{}}}, float half = {{0.5}}>\n{{\n\
         h = MatMul (x, w)\n a = Tanh (h)\n y = Mul (a, half)\n}}",
        list(&w)
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let inputs = [f32_tensor(&[r, 8], &data(r * 8, 6))];
    check("in place", &m, &inputs, (1, 2));
    let mut lowered = m.clone();
    lower_coded(&mut lowered);
    let mp = plan_model(&lowered, &DimValues::default(), &PlanOptions::default()).expect("plans");
    assert!(
        !mp.plan.aliases.is_empty(),
        "the chain should run in place over h: {:?}",
        mp.plan.aliases
    );
}

/// Real models from both exporters: the chains form (GELU and the
/// LayerNorm pieces in BERT, GPT-2, T5 and ViT), the outputs keep their
/// bits, and BERT's arena shrinks. (A CNN's residual Add+Relu goes to
/// the Conv before it instead: tests/residual.rs.) Inputs: token ids below
/// 50 (a mask of ones, token types 0) at batch 1 x 8, random images at
/// batch 2.
#[test]
fn real_models_run_their_chains_with_the_same_bits() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    for name in [
        "bert_tiny.ts14",
        "bert_tiny.dynamo18",
        "gpt2_tiny.ts14",
        "gpt2_tiny.dynamo18",
        "t5_encoder_tiny.ts14",
        "vit_tiny.ts14",
    ] {
        let m = graphopt_onnx::load(&dir.join(format!("{name}.onnx")))
            .expect("loads")
            .model;
        let g = &m.graph;
        let mut shapes = Vec::new();
        let mut inputs = Vec::new();
        for v in g.runtime_inputs() {
            let n = g.name(v).to_string();
            let dtype = g.ty(v).and_then(|t| t.elem()).expect("typed input");
            let (shape, data): (Vec<usize>, Vec<u8>) = if dtype == DType::I64 {
                let ids: Vec<i64> = (0..8)
                    .map(|i| {
                        if n.contains("mask") {
                            1
                        } else if n.contains("type") {
                            0
                        } else {
                            (i * 7 + 3) % 50
                        }
                    })
                    .collect();
                (
                    vec![1, 8],
                    ids.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            } else {
                let x = data(2 * 3 * 32 * 32, 9);
                let shape = vec![2, 3, 32, 32];
                (shape, x.iter().flat_map(|x| x.to_le_bytes()).collect())
            };
            shapes.push((n, shape.iter().map(|&d| d as i64).collect()));
            inputs.push(HostTensor { dtype, shape, data });
        }
        let dims = DimValues {
            shapes,
            ..DimValues::default()
        };
        let run = |m: &Model| {
            let mp = plan_model(m, &dims, &PlanOptions::default()).expect("plans");
            let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("binds");
            let opts = RunOptions {
                threads: 2,
                poison: true,
            };
            (
                exe.run(&inputs, &opts).expect("runs").0,
                mp.plan.arena_bytes,
            )
        };
        let mut lowered = m.clone();
        let r = lower_coded(&mut lowered);
        assert!(r.chains > 0, "{name}: no chain formed: {r:?}");
        let (plain, plain_arena) = run(&m);
        let (fused, fused_arena) = run(&lowered);
        for (p, f) in plain.iter().zip(&fused) {
            assert!(p.data == f.data, "{name}: outputs differ");
        }
        assert!(
            fused_arena <= plain_arena,
            "{name}: {fused_arena} > {plain_arena}"
        );
        if name.starts_with("bert") {
            assert!(
                fused_arena < plain_arena,
                "{name}: {fused_arena} !< {plain_arena}"
            );
        }
        eprintln!(
            "{name}: {} chains of {} nodes, arena {plain_arena} -> {fused_arena} B",
            r.chains, r.chain_nodes
        );
    }
}

/// A chain of one-element values (the scale of an emulated dynamic
/// quantization: reductions to scalars, then Max, Min, Sub, Div) runs in
/// place over a dying scalar, with the nodes' bits, zeros included.
#[test]
fn a_scalar_chain_runs_in_place() {
    let text = "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[2,3] x) => (float[2,3] y)\n\
         <float z = {0.0}, float k = {255.0}>\n{\n\
         a = ReduceMax <keepdims: int = 0> (x)\n b = ReduceMin <keepdims: int = 0> (x)\n\
         c = Max (a, z)\n d = Min (b, z)\n e = Sub (c, d)\n f = Div (e, k)\n\
         q = Round (f)\n y = Mul (x, q)\n}";
    let m = graphopt_text::parse_model(text).expect("fixture parses");
    for x in [[0f32; 6], [0.5, -1.0, 2.0, 0.0, 300.0, -0.75]] {
        let inputs = [f32_tensor(&[2, 3], &x)];
        check("scalar chain", &m, &inputs, (1, 4));
    }
}

/// Large enough to split across threads: rows of a `[3, 40000]` output
/// with a bias row, and the columns of one merged row of 100,003
/// elements (parts that start inside a tile), each in place over a dying
/// MatMul output; the bits of the nodes at 1-3 threads.
#[test]
fn chains_split_across_threads_keep_the_bits() {
    for (rows, cols, bias) in [(3, 40_000, true), (1, 100_003, false)] {
        let w = data(2 * cols, 12);
        let b = data(cols, 13);
        let (decl, add) = if bias {
            (
                format!(", float[{cols}] b = {{{}}}", list(&b)),
                "a = Add (h, b)",
            )
        } else {
            (String::new(), "a = Add (h, h)")
        };
        let text = format!(
            "<ir_version: 10, opset_import: [\"\" : 17]>\n\
             g (float[{rows},2] x) => (float[{rows},{cols}] y)\n\
             <float[2,{cols}] w = {{{}}}{decl}>\n{{\n\
             h = MatMul (x, w)\n {add}\n e = Tanh (a)\n y = Mul (e, h)\n}}",
            list(&w)
        );
        let m = graphopt_text::parse_model(&text).expect("fixture parses");
        let inputs = [f32_tensor(&[rows, 2], &data(rows * 2, 14))];
        check(&format!("{rows}x{cols}"), &m, &inputs, (1, 3));
    }
}

/// A chain reading a value and a view of it (`Unsqueeze`), both dying
/// there, runs over fresh storage: writing over one would overwrite what
/// the other slot reads (the plan used to be refused at binding).
#[test]
fn a_chain_reading_a_value_and_its_view_is_not_put_over_them() {
    let c = 500;
    let w = data(2 * c, 15);
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[2] x) => (float[1,{c}] y)\n\
         <float[2,{c}] w = {{{}}}, int64[1] ax = {{0}}>\n{{\n\
         h = MatMul (x, w)\n u = Unsqueeze (h, ax)\n a = Sigmoid (u)\n y = Mul (h, a)\n}}",
        list(&w)
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let inputs = [f32_tensor(&[2], &data(2, 16))];
    check("value and view", &m, &inputs, (1, 2));
}

fn tensor(dtype: DType, shape: &[usize], data: Vec<u8>) -> HostTensor {
    HostTensor {
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// Booleans, casts and masks: a backward graph's ReLU mask
/// (`Where(Greater(y, 0), dy, 0)`: the comparison stays a node, the Where
/// joins the chain after it), an attention mask cast from int64
/// (broadcast over rows), booleans through Not, And, Or and Xor, Casts
/// from float16, float64, uint8, int32 and bool, and an int32 value that
/// dies at its chain (which then runs over it). The nodes' bits, NaN and
/// infinities included.
#[test]
fn masks_casts_and_comparisons_give_the_nodes_bits() {
    let (r, c) = (3, 600);
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[{r},{c}] y, float[{r},{c}] dy, int64[1,{c}] mask, bool[{r},{c}] keep,\n\
            float16[{r},{c}] h, double[{r},1] d, uint8[{c}] u)\n\
         => (float[{r},{c}] relu_grad, float[{r},{c}] scores, float[{r},{c}] logic,\n\
             float[{r},{c}] casts, float[{r},{c}] ints)\n\
         <float zero = {{0.0}}, float one = {{1.0}}, float big = {{-10000.0}}, float lo = {{-0.5}}>\n{{\n\
         pos = Greater (y, zero)\n g0 = Where (pos, dy, zero)\n relu_grad = Mul (g0, big)\n\
         mf = Cast <to: int = 1> (mask)\n inv = Sub (one, mf)\n neg = Mul (inv, big)\n\
         scores = Add (y, neg)\n\
         lt = Less (y, lo)\n eq = Equal (y, dy)\n ge = GreaterOrEqual (dy, y)\n le = LessOrEqual (y, one)\n\
         n0 = Not (keep)\n a0 = And (n0, lt)\n o0 = Or (a0, eq)\n x0 = Xor (o0, ge)\n a1 = And (x0, le)\n\
         logic = Where (a1, y, big)\n\
         hf = Cast <to: int = 1> (h)\n df = Cast <to: int = 1> (d)\n uf = Cast <to: int = 1> (u)\n\
         kf = Cast <to: int = 1> (keep)\n s0 = Add (hf, df)\n s1 = Mul (s0, uf)\n casts = Sub (s1, kf)\n\
         yi = Cast <to: int = 6> (dy)\n yf = Cast <to: int = 1> (yi)\n ints = Mul (yf, lo)\n}}"
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let mut y: Vec<f32> = data(r * c, 21).iter().map(|v| v * 3.0).collect();
    let mut dy: Vec<f32> = data(r * c, 22).iter().map(|v| v * 3.0e9).collect();
    y[1] = f32::NAN;
    y[2] = f32::INFINITY;
    y[3] = -0.0;
    dy[4] = f32::NEG_INFINITY;
    dy[5] = 3.0e10;
    dy[6] = y[6];
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mask: Vec<u8> = (0..c as i64)
        .map(|i| if i % 3 == 0 { 0i64 } else { 1 })
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let keep: Vec<u8> = (0..r * c).map(|i| (i % 5 < 2) as u8).collect();
    let h: Vec<u8> = data(r * c, 23)
        .iter()
        .flat_map(|&v| half::f16::from_f32(v * 100.0).to_bits().to_le_bytes())
        .collect();
    let d: Vec<u8> = [0.1f64, -1.0e40, 1.0 + 1e-12]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let u: Vec<u8> = (0..c).map(|i| (i * 37 % 256) as u8).collect();
    let inputs = [
        tensor(DType::F32, &[r, c], f32_bytes(&y)),
        tensor(DType::F32, &[r, c], f32_bytes(&dy)),
        tensor(DType::I64, &[1, c], mask),
        tensor(DType::Bool, &[r, c], keep),
        tensor(DType::F16, &[r, c], h),
        tensor(DType::F64, &[r, 1], d),
        tensor(DType::U8, &[c], u),
    ];
    // {g0, relu_grad}, {mf .. scores}, {n0 .. logic} (6 nodes), {hf ..
    // casts} (7), {yf, ints}: the comparisons stay nodes (their masks are
    // the chains' inputs), and yi is an int32 Cast outside.
    check("masks", &m, &inputs, (5, 21));
    let mut lowered = m.clone();
    lower_coded(&mut lowered);
    let mp = plan_model(&lowered, &DimValues::default(), &PlanOptions::default()).expect("plans");
    assert!(
        mp.plan
            .aliases
            .iter()
            .any(|a| mp.plan.tensors[a.input].name == "yi" && graphopt_plan::chain_op(&a.op_type)),
        "the last chain should run over its int32 input: {:?}",
        mp.plan.aliases
    );
}

/// An int64 input broadcast to a float32 output of twice its elements
/// has the output's bytes but not its elements: the plan must not put
/// the output over it (the ONNX node test
/// `test_flexattention_relative_positional_expanded_ver26` was refused at
/// run time).
#[test]
fn a_wider_input_with_the_outputs_bytes_is_not_written_over() {
    let text = "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[4] x, float[2,4] z) => (float[2,4] y)\n{\n\
         k = Cast <to: int = 7> (x)\n kf = Cast <to: int = 1> (k)\n y = Add (kf, z)\n}";
    let m = graphopt_text::parse_model(text).expect("fixture parses");
    let inputs = [
        f32_tensor(&[4], &[1.5, -2.0, 3e9, 7.0]),
        f32_tensor(&[2, 4], &data(8, 31)),
    ];
    let mut lowered = m.clone();
    let r = lower_coded(&mut lowered);
    assert_eq!((r.chains, r.chain_nodes), (1, 2));
    // (The arena may grow here: the chain's output no longer fits over k.)
    let (plain, _, _) = run(&m, &inputs, 2);
    let (fused, _, _) = run(&lowered, &inputs, 2);
    assert!(plain[0].data == fused[0].data, "outputs differ");
}

/// Casts from bfloat16, int8 and int32 inputs (not in place), and Wheres
/// whose operands are not the backward mask's (a scalar condition, a
/// scalar x beside a full y, a row-broadcast y): the nodes' bits.
#[test]
fn other_loads_and_where_layouts_give_the_nodes_bits() {
    let (r, c) = (4, 300);
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (bfloat16[{r},{c}] b, int8[{r},{c}] i, int32[{c}] n, bool s, bool[{r},{c}] m,\n\
            float[{r},{c}] x)\n\
         => (float[{r},{c}] casts, float[{r},{c}] picks)\n\
         <float k = {{0.25}}, float[{c}] row = {{{}}}>\n{{\n\
         bf = Cast <to: int = 1> (b)\n if0 = Cast <to: int = 1> (i)\n nf = Cast <to: int = 1> (n)\n\
         t0 = Add (bf, if0)\n casts = Mul (t0, nf)\n\
         w0 = Where (s, x, k)\n w1 = Where (m, k, w0)\n picks = Where (m, w1, row)\n}}",
        list(&data(c, 41))
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let bf: Vec<u8> = data(r * c, 42)
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v * 50.0).to_bits().to_le_bytes())
        .collect();
    let i8s: Vec<u8> = (0..r * c)
        .map(|j| (j as i32 * 7 - 128) as i8 as u8)
        .collect();
    let ns: Vec<u8> = (0..c as i32)
        .map(|j| j * 1_000_003 - 150_000_000)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mask: Vec<u8> = (0..r * c).map(|j| (j % 3 == 1) as u8).collect();
    let x = data(r * c, 43);
    for s in [0u8, 1] {
        let inputs = [
            tensor(DType::BF16, &[r, c], bf.clone()),
            tensor(DType::I8, &[r, c], i8s.clone()),
            tensor(DType::I32, &[c], ns.clone()),
            tensor(DType::Bool, &[], vec![s]),
            tensor(DType::Bool, &[r, c], mask.clone()),
            f32_tensor(&[r, c], &x),
        ];
        check("loads and wheres", &m, &inputs, (2, 8));
    }
}
