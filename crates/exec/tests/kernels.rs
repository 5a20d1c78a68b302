//! Kernel edge cases against naive reference loops written here: numpy
//! broadcasting, batched and 1-D MatMul, Gemm's transposes and bias, Conv
//! with groups, strides, pads and dilations (im2col and the direct 1×1
//! path, 1-D and 2-D), ConvTranspose (groups, strides, pads, dilations,
//! output_padding), Scatter with add on duplicate indices, MaxPool's
//! Indices, pooling pads, Slice with negative steps; LSTM, GRU and Einsum
//! against onnxruntime / numpy numbers pasted below, ReverseSequence, STFT
//! and DFT; Resize (linear half_pixel, nearest asymmetric with sizes)
//! against onnxruntime.
//! Each model
//! runs through the whole runtime (planned arena, poison on), so the
//! executor is exercised too; and a plan that overlaps a node's input and
//! output is refused.

use graphopt_exec::{CpuBackend, ExecError, Executable, HostTensor, RunOptions};
use graphopt_plan::{plan_model, DimValues, PlanOptions};

use graphopt_testutil::uniform as data;

fn run(text: &str, inputs: &[HostTensor]) -> Vec<Vec<f32>> {
    let m = graphopt_text::parse_model(text).expect("fixture parses");
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let opts = RunOptions {
        threads: 2,
        poison: true,
    };
    let (out, _) = exe.run(inputs, &opts).unwrap();
    out.iter().map(|t| t.to_f32().unwrap()).collect()
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}"
        );
    }
}

fn t(shape: &[usize], seed: u64) -> HostTensor {
    HostTensor::from_f32(shape, &data(shape.iter().product(), seed))
}

#[test]
fn broadcasting_add_where_and_an_in_place_chain() {
    let a = t(&[2, 3, 1], 1);
    let b = t(&[4], 2);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,1] a, float[4] b) => (float[2,3,4] y, float[2,3,4] z) {
          s = Add (a, b)
          r = Relu (s)
          m = Mul (r, r)
          c = Greater (a, b)
          y = Where (c, m, b)
          z = Sub (b, a)
        }"#,
        &[a.clone(), b.clone()],
    );
    let (av, bv) = (a.to_f32().unwrap(), b.to_f32().unwrap());
    let mut y = Vec::new();
    let mut z = Vec::new();
    for &ai in &av {
        for &bj in &bv {
            let s = (ai + bj).max(0.0);
            y.push(if ai > bj { s * s } else { bj });
            z.push(bj - ai);
        }
    }
    close(&got[0], &y);
    close(&got[1], &z);
}

fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

#[test]
fn matmul_broadcasts_batches_and_promotes_vectors() {
    let a = t(&[2, 1, 3, 4], 3);
    let b = t(&[3, 4, 5], 4);
    let v = t(&[4], 5);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,1,3,4] a, float[3,4,5] b, float[4] v) => (float[2,3,3,5] y, float[3,5] w) {
          y = MatMul (a, b)
          w = MatMul (v, b)
        }"#,
        &[a.clone(), b.clone(), v.clone()],
    );
    let (av, bv, vv) = (
        a.to_f32().unwrap(),
        b.to_f32().unwrap(),
        v.to_f32().unwrap(),
    );
    let mut y = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            y.extend(matmul_ref(
                &av[i * 12..][..12],
                &bv[j * 20..][..20],
                3,
                4,
                5,
            ));
        }
    }
    close(&got[0], &y);
    let mut w = Vec::new();
    for j in 0..3 {
        w.extend(matmul_ref(&vv, &bv[j * 20..][..20], 1, 4, 5));
    }
    close(&got[1], &w);
}

#[test]
fn large_matmul_splits_rows_across_threads() {
    let (m, k, n) = (67, 33, 65);
    let a = t(&[m, k], 6);
    let b = t(&[k, n], 7);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[67,33] a, float[33,65] b) => (float[67,65] y) { y = MatMul (a, b) }"#,
        &[a.clone(), b.clone()],
    );
    close(
        &got[0],
        &matmul_ref(&a.to_f32().unwrap(), &b.to_f32().unwrap(), m, k, n),
    );
}

#[test]
fn gemm_transposes_alpha_beta_and_bias() {
    let a = t(&[4, 3], 8); // transA: m = 3, k = 4
    let b = t(&[5, 4], 9); // transB: k = 4, n = 5
    let c = t(&[5], 10);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[4,3] a, float[5,4] b, float[5] c) => (float[3,5] y) {
          y = Gemm <transA = 1, transB = 1, alpha = 0.5, beta = 2.0> (a, b, c)
        }"#,
        &[a.clone(), b.clone(), c.clone()],
    );
    let (av, bv, cv) = (
        a.to_f32().unwrap(),
        b.to_f32().unwrap(),
        c.to_f32().unwrap(),
    );
    let mut y = Vec::new();
    for i in 0..3 {
        for j in 0..5 {
            let s: f32 = (0..4).map(|p| av[p * 3 + i] * bv[j * 4 + p]).sum();
            y.push(0.5 * s + 2.0 * cv[j]);
        }
    }
    close(&got[0], &y);
}

/// Geometry of [`conv_ref`]: input, kernel, group, stride, pad, dilation,
/// output.
struct Geo {
    x: (usize, usize, usize, usize),
    k: (usize, usize, usize),
    group: usize,
    s: (usize, usize),
    p: (usize, usize),
    d: (usize, usize),
    o: (usize, usize),
}

/// Direct convolution, the reference for im2col + GEMM.
fn conv_ref(x: &[f32], w: &[f32], b: &[f32], g: &Geo) -> Vec<f32> {
    let (n, c, h, wd) = g.x;
    let (m, kh, kw) = g.k;
    let (oh, ow) = g.o;
    let (cg, mg) = (c / g.group, m / g.group);
    let mut y = vec![0.0; n * m * oh * ow];
    for ni in 0..n {
        for mi in 0..m {
            let gi = mi / mg;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = b[mi];
                    for ci in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let iy = (oy * g.s.0 + ki * g.d.0) as isize - g.p.0 as isize;
                                let ix = (ox * g.s.1 + kj * g.d.1) as isize - g.p.1 as isize;
                                if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd {
                                    continue;
                                }
                                let xc = gi * cg + ci;
                                s += x[((ni * c + xc) * h + iy as usize) * wd + ix as usize]
                                    * w[((mi * cg + ci) * kh + ki) * kw + kj];
                            }
                        }
                    }
                    y[((ni * m + mi) * oh + oy) * ow + ox] = s;
                }
            }
        }
    }
    y
}

#[test]
fn conv_groups_strides_pads_dilations() {
    // x [2,4,7,6], w [6,2,3,3] (group 2), stride 2x1, pads 1/2, dilation 2x1:
    // oh = (7 + 2 - 5) / 2 + 1 = 3, ow = (6 + 4 - 3) / 1 + 1 = 8.
    let x = t(&[2, 4, 7, 6], 11);
    let w = t(&[6, 2, 3, 3], 12);
    let b = t(&[6], 13);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,4,7,6] x, float[6,2,3,3] w, float[6] b) => (float[2,6,3,8] y) {
          y = Conv <group = 2, strides = [2, 1], pads = [1, 2, 1, 2], dilations = [2, 1]> (x, w, b)
        }"#,
        &[x.clone(), w.clone(), b.clone()],
    );
    let geo = Geo {
        x: (2, 4, 7, 6),
        k: (6, 3, 3),
        group: 2,
        s: (2, 1),
        p: (1, 2),
        d: (2, 1),
        o: (3, 8),
    };
    let want = conv_ref(
        &x.to_f32().unwrap(),
        &w.to_f32().unwrap(),
        &b.to_f32().unwrap(),
        &geo,
    );
    close(&got[0], &want);
}

#[test]
fn conv_depthwise_pointwise_and_1d() {
    let x = t(&[1, 3, 5, 5], 14);
    let dw = t(&[3, 1, 3, 3], 15);
    let pw = t(&[4, 3, 1, 1], 16);
    let x1 = t(&[1, 2, 9], 17);
    let w1 = t(&[3, 2, 3], 18);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,5,5] x, float[3,1,3,3] dw, float[4,3,1,1] pw, float[1,2,9] x1, float[3,2,3] w1)
          => (float[1,3,5,5] d, float[1,4,5,5] p, float[1,3,5] q) {
          d = Conv <group = 3, pads = [1, 1, 1, 1]> (x, dw)
          p = Conv (d, pw)
          q = Conv <strides = [2], pads = [1, 1]> (x1, w1)
        }"#,
        &[x.clone(), dw.clone(), pw.clone(), x1.clone(), w1.clone()],
    );
    let zeros = vec![0.0; 4];
    let one = (1, 1);
    let d = conv_ref(
        &x.to_f32().unwrap(),
        &dw.to_f32().unwrap(),
        &zeros,
        &Geo {
            x: (1, 3, 5, 5),
            k: (3, 3, 3),
            group: 3,
            s: one,
            p: one,
            d: one,
            o: (5, 5),
        },
    );
    close(&got[0], &d);
    let p = conv_ref(
        &d,
        &pw.to_f32().unwrap(),
        &zeros,
        &Geo {
            x: (1, 3, 5, 5),
            k: (4, 1, 1),
            group: 1,
            s: one,
            p: (0, 0),
            d: one,
            o: (5, 5),
        },
    );
    close(&got[1], &p);
    let q = conv_ref(
        &x1.to_f32().unwrap(),
        &w1.to_f32().unwrap(),
        &zeros,
        &Geo {
            x: (1, 2, 1, 9),
            k: (3, 1, 3),
            group: 1,
            s: (1, 2),
            p: (0, 1),
            d: one,
            o: (1, 5),
        },
    );
    close(&got[2], &q);
}

#[test]
fn pooling_with_pads() {
    let x = t(&[1, 1, 4, 4], 19);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,1,4,4] x) => (float[1,1,2,2] mx, float[1,1,2,2] av, float[1,1,2,2] avp) {
          mx = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 0, 0]> (x)
          av = AveragePool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 0, 0]> (x)
          avp = AveragePool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 0, 0], count_include_pad = 1> (x)
        }"#,
        std::slice::from_ref(&x),
    );
    let xv = x.to_f32().unwrap();
    let (mut mx, mut av, mut avp) = (vec![], vec![], vec![]);
    for oy in 0..2 {
        for ox in 0..2 {
            let mut vals = vec![];
            for ki in 0..3 {
                for kj in 0..3 {
                    let (iy, ix) = ((oy * 2 + ki) as isize - 1, (ox * 2 + kj) as isize - 1);
                    if iy >= 0 && ix >= 0 && iy < 4 && ix < 4 {
                        vals.push(xv[iy as usize * 4 + ix as usize]);
                    }
                }
            }
            mx.push(vals.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            av.push(vals.iter().sum::<f32>() / vals.len() as f32);
            avp.push(vals.iter().sum::<f32>() / 9.0);
        }
    }
    close(&got[0], &mx);
    close(&got[1], &av);
    close(&got[2], &avp);
}

#[test]
fn slice_transpose_gather_concat_split() {
    let x = t(&[3, 4], 20);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[3,4] x) => (float[3,2] s, float[4,3] tr, float[2,4] ga, float[3,8] c, float[3,1] p) {
          st = Constant <value = int64[1] {-1}> ()
          en = Constant <value = int64[1] {-5}> ()
          ax = Constant <value = int64[1] {1}> ()
          sp = Constant <value = int64[1] {-2}> ()
          s = Slice (x, st, en, ax, sp)
          tr = Transpose <perm = [1, 0]> (x)
          ix = Constant <value = int64[2] {-1, 0}> ()
          ga = Gather <axis = 0> (x, ix)
          c = Concat <axis = 1> (x, x)
          lens = Constant <value = int64[2] {3, 1}> ()
          q, p = Split <axis = 1> (x, lens)
        }"#,
        std::slice::from_ref(&x),
    );
    let xv = x.to_f32().unwrap();
    let at = |i: usize, j: usize| xv[i * 4 + j];
    let s: Vec<f32> = (0..3).flat_map(|i| [at(i, 3), at(i, 1)]).collect();
    close(&got[0], &s);
    let tr: Vec<f32> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (i, j)))
        .map(|(i, j)| at(i, j))
        .collect();
    close(&got[1], &tr);
    close(&got[2], &[&xv[8..12], &xv[0..4]].concat());
    let c: Vec<f32> = (0..3)
        .flat_map(|i| [&xv[i * 4..i * 4 + 4], &xv[i * 4..i * 4 + 4]].concat())
        .collect();
    close(&got[3], &c);
    close(&got[4], &(0..3).map(|i| at(i, 3)).collect::<Vec<_>>());
}

#[test]
fn a_plan_overlapping_a_nodes_input_and_output_is_refused() {
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[8,8] a, float[8,8] b) => (float[8,8] y) {
          t = MatMul (a, b)
          y = Relu (t)
        }"#,
    )
    .unwrap();
    let mut mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let off_a = mp
        .plan
        .tensors
        .iter()
        .find(|t| t.name == "a")
        .unwrap()
        .offset;
    let t = mp.plan.tensors.iter_mut().find(|t| t.name == "t").unwrap();
    t.offset = off_a;
    let e = Executable::new(&mp.model, &mp.plan, &CpuBackend)
        .err()
        .unwrap();
    assert!(matches!(e, ExecError::BadPlan(_)), "{e}");
}

#[test]
fn the_in_place_chain_is_really_in_place() {
    // The first test's chain: Relu and Mul must write over their input, so
    // that test checks the in-place reads (Mul reads both operands from its
    // own output).
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,1] a, float[4] b) => (float[2,3,4] y) {
          s = Add (a, b)
          r = Relu (s)
          m = Mul (r, r)
          y = Sub (m, b)
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let ops: Vec<&str> = mp.plan.aliases.iter().map(|a| a.op_type.as_str()).collect();
    assert!(ops.contains(&"Relu") && ops.contains(&"Mul"), "{ops:?}");
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let (a, b) = (t(&[2, 3, 1], 1), t(&[4], 2));
    let (out, _) = exe
        .run(&[a.clone(), b.clone()], &RunOptions::default())
        .unwrap();
    let (av, bv) = (a.to_f32().unwrap(), b.to_f32().unwrap());
    let want: Vec<f32> = (0..24)
        .map(|i| {
            let r = (av[i / 4] + bv[i % 4]).max(0.0);
            r * r - bv[i % 4]
        })
        .collect();
    close(&out[0].to_f32().unwrap(), &want);
}

#[test]
fn fp16_nodes_compute_in_f32_and_round_once() {
    use half::f16;
    let a = data(12, 21);
    let b = data(8, 22);
    let h = |shape: &[usize], v: &[f32]| HostTensor {
        dtype: graphopt_ir::DType::F16,
        shape: shape.to_vec(),
        data: v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes())
            .collect(),
    };
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float16[3,4] a, float16[4,2] b) => (float16[3,2] y, float[3,2] z) {
          p = MatMul (a, b)
          y = Relu (p)
          z = Cast <to = 1> (y)
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let (out, _) = exe
        .run(&[h(&[3, 4], &a), h(&[4, 2], &b)], &RunOptions::default())
        .unwrap();
    // The reference: f16 inputs widened, f32 product, one rounding.
    let wa: Vec<f32> = a.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    let wb: Vec<f32> = b.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    let want: Vec<f32> = matmul_ref(&wa, &wb, 3, 4, 2)
        .iter()
        .map(|&x| f16::from_f32(f16::from_f32(x).to_f32().max(0.0)).to_f32())
        .collect();
    let y: Vec<f32> = out[0]
        .data
        .chunks_exact(2)
        .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect();
    assert_eq!(y, want);
    assert_eq!(out[1].to_f32().unwrap(), want);
}

/// Elementwise fp16/bf16 nodes longer than one chunk run chunk by chunk
/// (`cpu::lowp`'s `Chunked`): each element is still widened, computed in
/// f32 and rounded once, so the outputs are the reference's bits, with a
/// workspace of a few chunks per thread instead of whole f32 copies. Twelve
/// chunks and a tail; one-element inputs of shape `[]` and `[1, 1]`; a
/// bool input cut like the output; a Relu the plan may put in place; both
/// low types.
#[test]
fn long_fp16_elementwise_nodes_run_in_chunks_with_the_same_bits() {
    use graphopt_exec::cpu::lowp::CHUNK;
    use graphopt_ir::DType;
    use half::{bf16, f16};
    let n = 12 * CHUNK + 123;
    for (dtype, name) in [(DType::F16, "float16"), (DType::BF16, "bfloat16")] {
        let round = |x: f32| match dtype {
            DType::F16 => f16::from_f32(x).to_f32(),
            _ => bf16::from_f32(x).to_f32(),
        };
        let bits = |x: f32| match dtype {
            DType::F16 => f16::from_f32(x).to_bits(),
            _ => bf16::from_f32(x).to_bits(),
        };
        let low = |v: &[f32]| HostTensor {
            dtype,
            shape: vec![2, n / 2 + 1],
            data: v.iter().flat_map(|&x| bits(x).to_le_bytes()).collect(),
        };
        let m = n / 2 + 1;
        let len = 2 * m;
        let (a, b) = (data(len, 31), data(len, 32));
        let cond: Vec<u8> = data(len, 33).iter().map(|&x| u8::from(x > 0.0)).collect();
        let text = format!(
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g ({name}[2,{m}] a, {name}[2,{m}] b, bool[2,{m}] c) => ({name}[2,{m}] y, {name}[2,{m}] z) <{name} s = {{0.75}}, {name}[1,1] u = {{0.75}}> {{
              p = Mul (a, u)
              q = Add (p, b)
              r = Relu (q)
              y = Where (c, r, a)
              z = Clip (b, s, s)
            }}"#
        );
        let model = graphopt_text::parse_model(&text).unwrap();
        let mp = plan_model(&model, &DimValues::default(), &PlanOptions::default()).unwrap();
        let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
        let c = HostTensor {
            dtype: DType::Bool,
            shape: vec![2, m],
            data: cond.clone(),
        };
        let (out, _) = exe
            .run(
                &[low(&a), low(&b), c],
                &RunOptions {
                    threads: 2,
                    poison: true,
                },
            )
            .unwrap();
        let s = round(0.75);
        let (wa, wb): (Vec<f32>, Vec<f32>) = (
            a.iter().map(|&x| round(x)).collect(),
            b.iter().map(|&x| round(x)).collect(),
        );
        let want_y: Vec<f32> = (0..len)
            .map(|i| {
                let p = round(wa[i] * s);
                let q = round(p + wb[i]);
                let r = round(q.max(0.0));
                if cond[i] == 1 {
                    r
                } else {
                    wa[i]
                }
            })
            .collect();
        let want_z: Vec<f32> = wb.iter().map(|&x| round(x.max(s).min(s))).collect();
        let read = |t: &HostTensor| -> Vec<f32> {
            t.data
                .chunks_exact(2)
                .map(|c| {
                    let u = u16::from_le_bytes([c[0], c[1]]);
                    match dtype {
                        DType::F16 => f16::from_bits(u).to_f32(),
                        _ => bf16::from_bits(u).to_f32(),
                    }
                })
                .collect()
        };
        assert!(read(&out[0]) == want_y, "{name}: y differs");
        assert!(read(&out[1]) == want_z, "{name}: z differs");
        // Whole f32 copies of one binary node alone would take 3 · 4 · len
        // (4.7 MB); chunks take at most three buffers of 4 · CHUNK per
        // slot, one slot per CPU up to 8 (384 KiB each), and the plan's
        // staging and alignment a little more.
        let slots = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 8);
        let chunked = (slots * 3 * 4 * CHUNK + (64 << 10)) as u64;
        assert!(
            exe.workspace_bytes() <= chunked && exe.workspace_bytes() < (3 * 4 * len) as u64,
            "{name}: workspace {} B for {len} elements, {slots} slots",
            exe.workspace_bytes()
        );
    }
}

/// Cast between float32 and float16/bfloat16 (the conversions split
/// across threads) gives `half`'s round-to-nearest-even values, element by
/// element: ties, subnormals, overflow to infinity, infinities, signed
/// zeros and NaN, in a tensor long enough to be split.
#[test]
fn casts_between_f32_and_f16_or_bf16_round_to_nearest_even() {
    use half::{bf16, f16};
    let special = [
        0.0f32,
        -0.0,
        1.0 + 1.0 / 2048.0, // an f16 tie, to even
        1.0 + 3.0 / 2048.0, // an f16 tie, to even (up)
        1.0 + 1.0 / 256.0,  // a bf16 tie
        65504.0,
        65520.0, // rounds to f16 infinity
        1e-7,    // an f16 subnormal
        -3e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ];
    let n = 200_000;
    let mut x: Vec<f32> = data(n, 31).iter().map(|v| v * 70000.0).collect();
    x[..special.len()].copy_from_slice(&special);
    x[n - special.len()..].copy_from_slice(&special);
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[200000] x) => (float16[200000] h, bfloat16[200000] b, float[200000] hw, float[200000] bw) {
          h = Cast <to = 10> (x)
          b = Cast <to = 16> (x)
          hw = Cast <to = 1> (h)
          bw = Cast <to = 1> (b)
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let opts = RunOptions {
        threads: 2,
        poison: true,
    };
    let (out, _) = exe.run(&[HostTensor::from_f32(&[n], &x)], &opts).unwrap();
    let bits = |t: &HostTensor| -> Vec<u16> {
        t.data
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    };
    let (h, b) = (bits(&out[0]), bits(&out[1]));
    for (i, &v) in x.iter().enumerate() {
        let (wh, wb) = (f16::from_f32(v), bf16::from_f32(v));
        if v.is_nan() {
            assert!(f16::from_bits(h[i]).is_nan() && bf16::from_bits(b[i]).is_nan());
            continue;
        }
        assert_eq!(h[i], wh.to_bits(), "f16 of {v} (element {i})");
        assert_eq!(b[i], wb.to_bits(), "bf16 of {v} (element {i})");
    }
    let (hw, bw) = (out[2].to_f32().unwrap(), out[3].to_f32().unwrap());
    for i in 0..n {
        let (wh, wb) = (
            f16::from_bits(h[i]).to_f32(),
            bf16::from_bits(b[i]).to_f32(),
        );
        assert!(hw[i].to_bits() == wh.to_bits() || (wh.is_nan() && hw[i].is_nan()));
        assert!(bw[i].to_bits() == wb.to_bits() || (wb.is_nan() && bw[i].is_nan()));
    }
}

#[test]
fn dynamic_quantize_and_matmul_integer_follow_the_onnx_examples() {
    // DynamicQuantizeLinear's example in the ONNX operator docs.
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[6] x, uint8[2,3] a, int8[3,2] b) => (uint8[6] y, float s, uint8 z, int32[2,2] p, float[2,2] d) {
          y, s, z = DynamicQuantizeLinear (x)
          za = Constant <value = uint8 {1}> ()
          p = MatMulInteger (a, b, za)
          sc = Constant <value = float {0.5}> ()
          d = DequantizeLinear (p, sc)
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let x = HostTensor::from_f32(&[6], &[0.0, 2.0, -3.0, -2.5, 1.34, 0.5]);
    let a = HostTensor {
        dtype: graphopt_ir::DType::U8,
        shape: vec![2, 3],
        data: vec![1, 2, 3, 4, 5, 6],
    };
    let b = HostTensor {
        dtype: graphopt_ir::DType::I8,
        shape: vec![3, 2],
        data: [1i8, -1, 2, 0, -3, 4].iter().map(|&v| v as u8).collect(),
    };
    let (out, _) = exe.run(&[x, a, b], &RunOptions::default()).unwrap();
    assert_eq!(out[0].data, vec![153, 255, 0, 26, 221, 179]);
    assert!((out[1].to_f32().unwrap()[0] - 0.019_607_844).abs() < 1e-9);
    assert_eq!(out[2].data, vec![153]);
    // (a - 1) @ b = [[0,1,2],[3,4,5]] @ [[1,-1],[2,0],[-3,4]].
    let p: Vec<i32> = out[3]
        .data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(p, vec![-4, 8, -4, 17]);
    assert_eq!(out[4].to_f32().unwrap(), vec![-2.0, 4.0, -2.0, 8.5]);
}

#[test]
fn quantize_linear_follows_the_onnx_examples() {
    // QuantizeLinear's examples in the ONNX operator docs: uint8 per
    // tensor (saturating, half to even), int8 per tensor, and uint8 per
    // axis 1 with per-channel zero points; then DequantizeLinear per axis.
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 13]>
        g (float[6] x, float[1,3,3,2] xa) => (uint8[6] u, int8[6] i, uint8[1,3,3,2] a, float[1,3,3,2] d) {
          s = Constant <value = float {2.0}> ()
          zu = Constant <value = uint8 {128}> ()
          u = QuantizeLinear (x, s, zu)
          zi = Constant <value = int8 {-1}> ()
          i = QuantizeLinear (x, s, zi)
          sa = Constant <value = float[3] {2.0, 4.0, 3.0}> ()
          za = Constant <value = uint8[3] {84, 24, 196}> ()
          a = QuantizeLinear <axis: int = 1> (xa, sa, za)
          d = DequantizeLinear <axis: int = 1> (a, sa, za)
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let x = HostTensor::from_f32(&[6], &[0.0, 2.0, 3.0, 1000.0, -254.0, -1000.0]);
    let xa = HostTensor::from_f32(
        &[1, 3, 3, 2],
        &[
            -162.0, 10.0, -100.0, 232.0, -20.0, -50.0, -76.0, 0.0, 0.0, 252.0, 32.0, -44.0, 245.0,
            485.0, -960.0, -270.0, -375.0, -470.0,
        ],
    );
    let (out, _) = exe.run(&[x, xa], &RunOptions::default()).unwrap();
    assert_eq!(out[0].data, vec![128, 129, 130, 255, 1, 0]);
    let i: Vec<i8> = out[1].data.iter().map(|&v| v as i8).collect();
    assert_eq!(i, vec![-1, 0, 1, 127, -128, -128]);
    assert_eq!(
        out[2].data,
        vec![3, 89, 34, 200, 74, 59, 5, 24, 24, 87, 32, 13, 255, 255, 0, 106, 71, 39]
    );
    let d = out[3].to_f32().unwrap();
    assert_eq!(&d[..6], &[-162.0, 10.0, -100.0, 232.0, -20.0, -50.0]);
}

/// ConvTranspose as the adjoint of a convolution: every input element
/// times every kernel tap, added where the tap lands.
#[test]
fn conv_transpose_groups_strides_pads_dilations_output_padding() {
    // x [2,4,3,4], w [4,3,3,2] (group 2: 6 output channels), strides 2x3,
    // pads 1,0 (begin) 0,1 (end), dilations 2x1, output_padding 1x2:
    // OH = 2·2 + 1 + 4 + 1 - 1 = 9, OW = 3·3 + 2 + 1 + 1 - 1 = 12.
    let (n, c, h, w) = (2, 4, 3, 4);
    let (mg, kh, kw, group) = (3, 3, 2, 2);
    let (sh, sw, dh, dw, ph, pw) = (2, 3, 2, 1, 1, 0);
    let (oh, ow) = (9, 12);
    let x = t(&[n, c, h, w], 41);
    let wt = t(&[c, mg, kh, kw], 42);
    let b = t(&[mg * group], 43);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,4,3,4] x, float[4,3,3,2] w, float[6] b) => (float[2,6,9,12] y) {
          y = ConvTranspose <group = 2, strides = [2, 3], dilations = [2, 1], pads = [1, 0, 0, 1], output_padding = [1, 2]> (x, w, b)
        }"#,
        &[x.clone(), wt.clone(), b.clone()],
    );
    let (xv, wv, bv) = (
        x.to_f32().unwrap(),
        wt.to_f32().unwrap(),
        b.to_f32().unwrap(),
    );
    let m = mg * group;
    let cg = c / group;
    let mut y = vec![0.0f32; n * m * oh * ow];
    for ni in 0..n {
        for mi in 0..m {
            for p in 0..oh * ow {
                y[(ni * m + mi) * oh * ow + p] = bv[mi];
            }
        }
        for ci in 0..c {
            let gi = ci / cg;
            for mj in 0..mg {
                let mi = gi * mg + mj;
                for iy in 0..h {
                    for ix in 0..w {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let oy = (iy * sh + ki * dh) as isize - ph as isize;
                                let ox = (ix * sw + kj * dw) as isize - pw as isize;
                                if oy < 0 || ox < 0 || oy as usize >= oh || ox as usize >= ow {
                                    continue;
                                }
                                y[((ni * m + mi) * oh + oy as usize) * ow + ox as usize] += xv
                                    [((ni * c + ci) * h + iy) * w + ix]
                                    * wv[((ci * mg + mj) * kh + ki) * kw + kj];
                            }
                        }
                    }
                }
            }
        }
    }
    close(&got[0], &y);
}

/// ScatterND and ScatterElements with `add` sum duplicate indices (the
/// gradients of Gather and GatherND rely on it); MaxPool's Indices are
/// flat positions in the input, the first maximum on ties.
#[test]
fn scatter_adds_duplicates_and_maxpool_returns_indices() {
    let data = t(&[4, 3], 51);
    let upd = t(&[3, 3], 52);
    let upd_e = t(&[2, 3], 53);
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 18]>
        g (float[4,3] d, float[3,3] u, float[2,3] ue, float[1,1,4,4] x) => (float[4,3] nd, float[4,3] el, float[1,1,2,2] p, int64[1,1,2,2] i) {
          idx = Constant <value = int64[3,1] {2, 0, 2}> ()
          nd = ScatterND <reduction = "add"> (d, idx, u)
          eidx = Constant <value = int64[2,3] {1, 0, 3, 1, 1, 3}> ()
          el = ScatterElements <axis = 0, reduction = "add"> (d, eidx, ue)
          p, i = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x)
        }"#,
    )
    .unwrap();
    let x = HostTensor::from_f32(
        &[1, 1, 4, 4],
        &[
            1., 5., 2., 2., 3., 0., 2., 1., 9., 9., 9., 9., 0., 9., 1., 9.,
        ],
    );
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let (out, _) = exe
        .run(
            &[data.clone(), upd.clone(), upd_e.clone(), x],
            &RunOptions {
                threads: 1,
                poison: true,
            },
        )
        .unwrap();
    let (d, u, ue) = (
        data.to_f32().unwrap(),
        upd.to_f32().unwrap(),
        upd_e.to_f32().unwrap(),
    );
    let mut nd = d.clone();
    for (k, &row) in [2usize, 0, 2].iter().enumerate() {
        for j in 0..3 {
            nd[row * 3 + j] += u[k * 3 + j];
        }
    }
    close(&out[0].to_f32().unwrap(), &nd);
    let mut el = d.clone();
    for (k, &row) in [1usize, 0, 3, 1, 1, 3].iter().enumerate() {
        el[row * 3 + k % 3] += ue[k];
    }
    close(&out[1].to_f32().unwrap(), &el);
    close(&out[2].to_f32().unwrap(), &[5., 2., 9., 9.]);
    let idx: Vec<i64> = out[3]
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(idx, vec![1, 2, 8, 10]);
}

/// When `data` is computed and dies at the Scatter, the plan puts the
/// output in its storage (the update rule) and the kernels start from it
/// instead of copying: the same results, poison on. A plan that declares
/// the pair on another input (the updates) is refused.
#[test]
fn scatter_writes_over_data_in_place() {
    let data = t(&[4, 3], 61);
    let upd = t(&[3, 3], 62);
    let upd_e = t(&[2, 3], 63);
    let text = r#"<ir_version: 8, opset_import: ["" : 18]>
        g (float[4,3] d, float[3,3] u, float[2,3] ue) => (float[4,3] nd, float[4,3] el) {
          a = Neg (d)
          b = Exp (d)
          idx = Constant <value = int64[3,1] {2, 0, 2}> ()
          nd = ScatterND <reduction = "add"> (a, idx, u)
          eidx = Constant <value = int64[2,3] {1, 0, 3, 1, 1, 3}> ()
          el = ScatterElements <axis = 0> (b, eidx, ue)
        }"#;
    let m = graphopt_text::parse_model(text).unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let ops: Vec<&str> = mp.plan.aliases.iter().map(|a| a.op_type.as_str()).collect();
    assert!(
        ops.contains(&"ScatterND") && ops.contains(&"ScatterElements"),
        "{ops:?}"
    );
    let got = run(text, &[data.clone(), upd.clone(), upd_e.clone()]);
    let (d, u, ue) = (
        data.to_f32().unwrap(),
        upd.to_f32().unwrap(),
        upd_e.to_f32().unwrap(),
    );
    let mut nd: Vec<f32> = d.iter().map(|x| -x).collect();
    for (k, &row) in [2usize, 0, 2].iter().enumerate() {
        for j in 0..3 {
            nd[row * 3 + j] += u[k * 3 + j];
        }
    }
    close(&got[0], &nd);
    // No reduction: the last write wins (rows 1 and 3 of column 2 twice).
    let mut el: Vec<f32> = d.iter().map(|x| x.exp()).collect();
    for (k, &row) in [1usize, 0, 3, 1, 1, 3].iter().enumerate() {
        el[row * 3 + k % 3] = ue[k];
    }
    close(&got[1], &el);

    // The same pair declared over the updates instead of the data.
    let text2 = r#"<ir_version: 8, opset_import: ["" : 18]>
        g (float[4,3] d, float[4,3] v) => (float[4,3] y) {
          a = Neg (d)
          w = Exp (v)
          idx = Constant <value = int64[4,1] {3, 2, 1, 0}> ()
          y = ScatterND (a, idx, w)
        }"#;
    let m2 = graphopt_text::parse_model(text2).unwrap();
    let mut mp2 = plan_model(&m2, &DimValues::default(), &PlanOptions::default()).unwrap();
    let find = |mp: &graphopt_plan::ModelPlan, n: &str| {
        mp.plan.tensors.iter().position(|t| t.name == n).unwrap()
    };
    let (a, w, y) = (find(&mp2, "a"), find(&mp2, "w"), find(&mp2, "y"));
    let pair = mp2
        .plan
        .aliases
        .iter_mut()
        .find(|x| x.op_type == "ScatterND")
        .expect("planned in place over a");
    assert_eq!((pair.input, pair.output), (a, y));
    pair.input = w;
    let off = mp2.plan.tensors[w].offset;
    mp2.plan.tensors[y].offset = off;
    let e = Executable::new(&mp2.model, &mp2.plan, &CpuBackend)
        .err()
        .unwrap();
    assert!(matches!(e, ExecError::BadPlan(_)), "{e}");
}

/// Expected values computed by onnxruntime 1.x (LSTM, GRU) and numpy's
/// einsum in f64 on the same `data` inputs (seeds below), pasted as text.
fn nums(s: &str) -> Vec<f32> {
    s.split_whitespace().map(|v| v.parse().unwrap()).collect()
}

fn lens_i32(v: &[i32]) -> HostTensor {
    HostTensor {
        dtype: graphopt_ir::DType::I32,
        shape: vec![v.len()],
        data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

#[test]
fn bidirectional_lstm_with_sequence_lens_peepholes_clip_and_an_omitted_y() {
    // seq 4, batch 3, input 2, hidden 3; batch entries run 4, 2 and 3
    // steps (the reverse direction reversed within each length).
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 14]>
        g (float[4,3,2] x, float[2,12,2] w, float[2,12,3] r, float[2,24] b, int32[3] lens,
           float[2,3,3] h0, float[2,3,3] c0, float[2,9] p)
          => (float[4,2,3,3] y, float[2,3,3] yh, float[2,3,3] yc, float[2,3,3] yh2) {
          y, yh, yc = LSTM <direction = "bidirectional", hidden_size = 3> (x, w, r, b, lens, h0, c0, p)
          , yh2 = LSTM <direction = "bidirectional", hidden_size = 3, clip = 0.5> (x, w, r, b, lens, h0, c0)
        }"#,
        &[
            t(&[4, 3, 2], 11),
            t(&[2, 12, 2], 12),
            t(&[2, 12, 3], 13),
            t(&[2, 24], 14),
            lens_i32(&[4, 2, 3]),
            t(&[2, 3, 3], 15),
            t(&[2, 3, 3], 16),
            t(&[2, 9], 17),
        ],
    );
    close(&got[0], &nums(LSTM_Y));
    close(&got[1], &nums(LSTM_YH));
    close(&got[2], &nums(LSTM_YC));
    close(&got[3], &nums(LSTM_YH2));
}

#[test]
fn bidirectional_gru_without_linear_before_reset() {
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 14]>
        g (float[4,3,2] x, float[2,9,2] w, float[2,9,3] r, float[2,18] b, int32[3] lens,
           float[2,3,3] h0) => (float[4,2,3,3] y, float[2,3,3] yh) {
          y, yh = GRU <direction = "bidirectional", hidden_size = 3, linear_before_reset = 0> (x, w, r, b, lens, h0)
        }"#,
        &[
            t(&[4, 3, 2], 21),
            t(&[2, 9, 2], 22),
            t(&[2, 9, 3], 23),
            t(&[2, 18], 24),
            lens_i32(&[3, 4, 1]),
            t(&[2, 3, 3], 25),
        ],
    );
    close(&got[0], &nums(GRU_Y));
    close(&got[1], &nums(GRU_YH));
}

#[test]
fn einsum_ellipsis_diagonal_trace_and_implicit_output() {
    let a = t(&[2, 3, 4, 4], 31);
    let b = t(&[3, 4, 5], 32);
    let c = t(&[5, 5], 33);
    // a[0] and b[0] as inputs of their own.
    let (av, bv) = (a.to_f32().unwrap(), b.to_f32().unwrap());
    let a0 = HostTensor::from_f32(&[3, 4, 4], &av[..48]);
    let b0 = HostTensor::from_f32(&[4, 5], &bv[..20]);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 14]>
        g (float[2,3,4,4] a, float[3,4,5] b, float[5,5] c, float[3,4,4] a0, float[4,5] b0)
          => (float[2,3,4] e1, float[2,3,4,5] e2, float e3, float[3,3,4,5] e4) {
          e1 = Einsum <equation = "...ii->...i"> (a)
          e2 = Einsum <equation = "...ij,jk->...ik"> (a, b0)
          e3 = Einsum <equation = "ii"> (c)
          e4 = Einsum <equation = "bij,...jk"> (a0, b)
        }"#,
        &[a, b, c, a0, b0],
    );
    close(&got[0], &nums(EINSUM_E1));
    close(&got[1], &nums(EINSUM_E2));
    close(&got[2], &nums(EINSUM_E3));
    close(&got[3], &nums(EINSUM_E4));
}

#[test]
fn reverse_sequence_reverses_each_batch_entry_within_its_length() {
    // [time 4, batch 3, 2]: batch entry b reversed over its first lens[b] steps.
    let x = t(&[4, 3, 2], 41);
    let xv = x.to_f32().unwrap();
    let lens = [4i64, 1, 3];
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 14]>
        g (float[4,3,2] x, int64[3] lens) => (float[4,3,2] y) {
          y = ReverseSequence <batch_axis = 1, time_axis = 0> (x, lens)
        }"#,
        &[x, HostTensor::from_i64(&[3], &lens)],
    );
    let mut want = vec![0.0; 24];
    for t in 0..4 {
        for b in 0..3 {
            let l = lens[b] as usize;
            let s = if t < l { l - 1 - t } else { t };
            for k in 0..2 {
                want[(t * 3 + b) * 2 + k] = xv[(s * 3 + b) * 2 + k];
            }
        }
    }
    close(&got[0], &want);
}

const LSTM_Y: &str = "-6.77989004e-03 6.54837489e-02 1.31283998e-01 7.47240782e-02 -2.63311476e-01 1.41343430e-01 -4.65378910e-02 -1.79015666e-01 1.11567765e-01 -2.17547975e-02 -3.08677536e-02 -3.45966399e-01 3.47853974e-02 -5.52006476e-02 -2.07038388e-01 7.69221829e-03 -8.41345172e-03 -3.37743551e-01 -7.33346790e-02 -9.92178991e-02 1.84637144e-01 7.02035800e-02 -2.12104589e-01 8.74312520e-02 1.48538444e-02 -4.55434531e-01 1.86912134e-01 7.44605809e-02 -4.56483662e-02 -3.97527158e-01 -8.22873861e-02 -1.69196557e-02 -1.34561867e-01 -1.59541517e-01 4.79960255e-02 -2.21417561e-01 -2.81567834e-02 -3.49335939e-01 1.55189514e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 1.03745930e-01 -6.20164990e-01 1.26600102e-01 -5.63593879e-02 -1.56459976e-02 -2.75930196e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 -2.00409651e-01 5.03674801e-03 -1.06009245e-01 1.46222543e-02 -4.78992373e-01 1.02869101e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 -1.25802690e-02 -4.77087460e-02 -2.32310697e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00";
const LSTM_YH: &str = "1.46222543e-02 -4.78992373e-01 1.02869101e-01 7.02035800e-02 -2.12104589e-01 8.74312520e-02 1.03745930e-01 -6.20164990e-01 1.26600102e-01 -2.17547975e-02 -3.08677536e-02 -3.45966399e-01 3.47853974e-02 -5.52006476e-02 -2.07038388e-01 7.69221829e-03 -8.41345172e-03 -3.37743551e-01";
const LSTM_YC: &str = "5.53622469e-02 -6.74595594e-01 8.87208045e-01 2.63053119e-01 -2.63430387e-01 7.90609479e-01 3.21559817e-01 -1.01133573e+00 1.09630263e+00 -3.46269384e-02 -6.99432045e-02 -1.22614288e+00 5.32845221e-02 -1.35966748e-01 -4.74123597e-01 1.33259222e-02 -1.87177025e-02 -8.67105544e-01";
const LSTM_YH2: &str = "1.49192875e-02 -2.70601630e-01 1.78673834e-01 4.04676385e-02 -4.84312177e-02 1.13806635e-01 5.77418208e-02 -2.85345703e-01 2.27827653e-01 -4.27928604e-02 -6.16445169e-02 -2.08328918e-01 4.64452729e-02 -1.01795904e-01 -1.60999566e-01 9.38784156e-04 -4.40734066e-02 -2.59901494e-01";
const GRU_Y: &str = "2.25748286e-01 -1.41712412e-01 -1.19952261e-02 3.34399164e-01 -1.84283450e-01 -5.13253152e-01 -3.64297420e-01 4.08017516e-01 4.51068223e-01 1.60305485e-01 4.92479086e-01 -4.61688846e-01 5.07405162e-01 2.62371302e-01 -2.78605938e-01 4.27193820e-01 1.07480772e-02 -5.69665372e-01 2.68452674e-01 -1.21837348e-01 -4.67185318e-01 3.80652517e-01 -1.78606048e-01 -7.06544101e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 2.53404260e-01 4.66589153e-01 -4.36971426e-01 4.31866467e-01 2.49641687e-01 -5.39139271e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 4.17721689e-01 -1.59975544e-01 -7.35739231e-01 5.74964046e-01 -2.47559816e-01 -8.43723118e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 2.37221062e-01 4.94684845e-01 -3.69266897e-01 6.65024161e-01 2.02480033e-01 -3.41837347e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 4.48130459e-01 -2.51313746e-01 -9.29659069e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 0.00000000e+00 7.04045415e-01 5.19132853e-01 -2.38892943e-01 0.00000000e+00 0.00000000e+00 0.00000000e+00";
const GRU_YH: &str = "4.17721689e-01 -1.59975544e-01 -7.35739231e-01 4.48130459e-01 -2.51313746e-01 -9.29659069e-01 -3.64297420e-01 4.08017516e-01 4.51068223e-01 1.60305485e-01 4.92479086e-01 -4.61688846e-01 5.07405162e-01 2.62371302e-01 -2.78605938e-01 4.27193820e-01 1.07480772e-02 -5.69665372e-01";
const EINSUM_E1: &str = "-2.88755894e-01 -1.16607428e-01 -7.37263680e-01 7.38918185e-01 1.43693566e-01 2.37883925e-01 2.14700460e-01 -3.15503478e-01 -2.01839566e-01 -1.53486133e-01 -5.12083530e-01 -7.83647060e-01 5.30137777e-01 8.82202625e-01 -8.66382957e-01 1.35277152e-01 -2.46499896e-01 8.85931492e-01 1.50798559e-02 -3.00479293e-01 6.56244397e-01 -6.59025073e-01 -3.74773026e-01 -3.27523947e-01";
const EINSUM_E2: &str = "2.26301521e-01 -4.96951103e-01 -8.63741279e-01 -5.43262005e-01 3.38499159e-01 -6.08030856e-01 7.23873556e-01 1.43623042e+00 -1.57638460e-01 -5.96846163e-01 3.78993064e-01 -2.77585328e-01 2.03736797e-01 8.74428213e-01 3.15961009e-03 -3.50406200e-01 4.67795938e-01 -3.24217826e-01 -1.19784427e+00 1.92012742e-01 -5.50679922e-01 -2.95584947e-01 5.01854345e-02 -5.42922795e-01 -5.10806799e-01 -1.68063268e-01 4.94645238e-01 4.26230609e-01 -7.44521320e-01 8.27604681e-02 1.17904767e-01 9.34580803e-01 1.02629709e+00 -2.31657267e-01 2.53187388e-01 -8.24261725e-01 2.02465206e-01 8.74289334e-01 -5.22980452e-01 -7.75990188e-01 3.61444533e-01 -1.20546324e-02 -6.19741559e-01 -3.87315333e-01 5.54207087e-01 -2.72654388e-02 1.51236102e-01 4.47585225e-01 4.59452718e-02 -8.90621543e-02 5.18170118e-01 1.63085580e-01 -6.72419369e-03 6.81291044e-01 3.91371936e-01 5.37170947e-01 -1.15201108e-01 -2.43617550e-01 1.66332352e+00 1.63569152e-01 3.27995867e-01 3.24653834e-01 -2.03269035e-01 -1.12901473e+00 6.97739184e-01 6.33485988e-02 2.26432085e-02 -1.77726746e-01 1.24778759e+00 -1.39588192e-01 5.82669973e-01 -6.75619364e-01 -4.40970242e-01 6.95151091e-01 2.30944172e-01 -7.11013079e-01 1.78878576e-01 6.03293896e-01 -9.87571716e-01 -5.21559834e-01 -3.68494481e-01 -5.03350914e-01 -7.33239412e-01 -9.65819597e-01 -1.43922463e-01 8.31551850e-01 2.99371332e-01 2.46300027e-01 9.90162134e-01 5.97759426e-01 1.10020198e-01 5.05112946e-01 7.69226432e-01 -6.28369004e-02 1.10900305e-01 3.77642721e-01 -6.01458013e-01 -6.53961003e-01 1.10716367e+00 4.83295806e-02 6.95441544e-01 -3.89549299e-03 7.17097819e-01 8.19439471e-01 2.72251248e-01 2.40165204e-01 -8.90109122e-01 -1.10481381e+00 1.10724367e-01 1.28326088e-01 7.05173090e-02 2.63417304e-01 5.43759644e-01 9.81850326e-01 -1.70430273e-01 -2.37828359e-01 2.50135213e-01 8.74825895e-01 -1.57589316e-01 -3.06982249e-01";
const EINSUM_E3: &str = "-3.18536878e-01";
const EINSUM_E4: &str = "2.26301521e-01 -4.96951103e-01 -8.63741279e-01 -5.43262005e-01 3.38499159e-01 -6.08030856e-01 7.23873556e-01 1.43623042e+00 -1.57638460e-01 -5.96846163e-01 3.78993064e-01 -2.77585328e-01 2.03736797e-01 8.74428213e-01 3.15961009e-03 -3.50406200e-01 4.67795938e-01 -3.24217826e-01 -1.19784427e+00 1.92012742e-01 -5.50679922e-01 -2.95584947e-01 5.01854345e-02 -5.42922795e-01 -5.10806799e-01 -1.68063268e-01 4.94645238e-01 4.26230609e-01 -7.44521320e-01 8.27604681e-02 1.17904767e-01 9.34580803e-01 1.02629709e+00 -2.31657267e-01 2.53187388e-01 -8.24261725e-01 2.02465206e-01 8.74289334e-01 -5.22980452e-01 -7.75990188e-01 3.61444533e-01 -1.20546324e-02 -6.19741559e-01 -3.87315333e-01 5.54207087e-01 -2.72654388e-02 1.51236102e-01 4.47585225e-01 4.59452718e-02 -8.90621543e-02 5.18170118e-01 1.63085580e-01 -6.72419369e-03 6.81291044e-01 3.91371936e-01 5.37170947e-01 -1.15201108e-01 -2.43617550e-01 1.66332352e+00 1.63569152e-01 4.64558788e-02 1.16561091e+00 -5.24367809e-01 -6.66167319e-01 2.53230065e-01 2.08646432e-01 -1.20770657e+00 1.31522012e+00 1.15796745e+00 -5.22442341e-01 -7.01958597e-01 4.92116570e-01 1.03569187e-01 -2.65843123e-01 -2.81510144e-01 9.71724212e-01 -7.59690523e-01 -2.29542881e-01 3.41302514e-01 2.78151423e-01 1.36421233e-01 5.98079562e-01 3.83608818e-01 5.05261049e-02 2.71461666e-01 4.42689002e-01 -5.29554486e-01 5.00289798e-01 5.31139255e-01 -3.31959546e-01 2.43059665e-01 -1.27666211e+00 8.01630616e-01 8.86417806e-01 -8.57845068e-01 2.58393824e-01 -2.92056173e-01 1.05613112e+00 7.35540688e-01 -5.59257604e-02 2.07279921e-01 2.17564017e-01 -5.53899169e-01 -3.37847143e-01 4.10255417e-02 -9.20747668e-02 -1.35763511e-01 4.31374907e-01 2.52826333e-01 -2.90002614e-01 -2.78268516e-01 -3.89077514e-01 -3.12307149e-01 -1.09726705e-01 -2.51159549e-01 -6.29461765e-01 -5.17572999e-01 -8.13880563e-01 -3.95117700e-01 1.59734279e-01 -5.90707004e-01 4.42229420e-01 5.16237676e-01 -1.17749125e-01 7.39395380e-01 1.00367403e+00 -5.53872466e-01 -1.04632854e+00 1.10089827e+00 -2.52516679e-02 1.08501601e+00 -1.92510709e-01 -7.15100646e-01 -4.55525994e-01 1.66412834e-02 -1.57814646e+00 1.82101086e-01 1.15758944e+00 5.15248179e-01 -1.00187764e-01 1.56676292e-01 3.34463418e-01 -4.80703562e-01 6.96302593e-01 7.77780473e-01 -1.17535256e-01 -2.28309259e-01 6.10017069e-02 7.36446083e-01 2.88817972e-01 4.81776446e-01 -7.59844720e-01 -2.02907011e-01 5.85730493e-01 -2.11324602e-01 6.54515743e-01 -4.74224165e-02 -9.60879326e-01 1.19200397e+00 5.48037112e-01 -8.22335005e-01 1.20332964e-01 8.57500315e-01 -2.77414322e-01 6.28594235e-02 5.55558681e-01 -2.21133888e-01 -4.50396985e-01 2.71161288e-01 1.40550777e-01 1.05808347e-01 -3.01436603e-01 2.30307505e-01 -7.01965094e-01 -6.74775541e-01 9.83108878e-02 -1.68941930e-01 2.34797478e-01 -1.53146505e+00 -1.52645671e+00";

/// The DFT of `x` (`n` complex values) by its definition, in f64.
fn dft_ref(x: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let n = x.len();
    (0..n)
        .map(|k| {
            x.iter().enumerate().fold((0.0, 0.0), |s, (j, v)| {
                let a = -2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                (
                    s.0 + v.0 * a.cos() - v.1 * a.sin(),
                    s.1 + v.0 * a.sin() + v.1 * a.cos(),
                )
            })
        })
        .collect()
}

/// STFT against the DFT by definition: a real signal with a Hann window,
/// one-sided (radix-2 frames), and a complex one with `frame_length` as
/// an input, full spectra (a length of 6: the direct DFT).
#[test]
fn stft_with_a_window_one_sided_and_a_complex_signal_full() {
    let (b, n, fl, step) = (2, 20, 8, 4);
    let x = t(&[b, n, 1], 21);
    let w: Vec<f32> = (0..fl)
        .map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / fl as f64).cos()) as f32)
        .collect();
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,20,1] x, float[8] w) => (float[2,4,5,2] y) <int64 step = {4}> {
          y = STFT (x, step, w)
        }"#,
        &[x.clone(), HostTensor::from_f32(&[fl], &w)],
    );
    let xs = x.to_f32().unwrap();
    let mut want = Vec::new();
    for bi in 0..b {
        for f in 0..4 {
            let frame: Vec<(f64, f64)> = (0..fl)
                .map(|j| ((xs[bi * n + f * step + j] * w[j]) as f64, 0.0))
                .collect();
            for v in dft_ref(&frame).into_iter().take(fl / 2 + 1) {
                want.extend([v.0 as f32, v.1 as f32]);
            }
        }
    }
    close(&got[0], &want);

    let x = t(&[1, 10, 2], 22);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,10,2] x) => (float[1,2,6,2] y) <int64 step = {3}, int64 len = {6}> {
          y = STFT <onesided = 0> (x, step, , len)
        }"#,
        std::slice::from_ref(&x),
    );
    let xs = x.to_f32().unwrap();
    let mut want = Vec::new();
    for f in 0..2 {
        let frame: Vec<(f64, f64)> = (0..6)
            .map(|j| {
                let p = 2 * (f * 3 + j);
                (xs[p] as f64, xs[p + 1] as f64)
            })
            .collect();
        for v in dft_ref(&frame) {
            want.extend([v.0 as f32, v.1 as f32]);
        }
    }
    close(&got[0], &want);
}

/// DFT inverse (opset 20, the axis an input) along axis 1 of a complex
/// [2,6,2] (the direct DFT), and the inverse one-sided (a real result of
/// the default length 8, radix-2): expected values from numpy's
/// `ifft(axis=1)` and `irfft(n=8, axis=1)`.
#[test]
fn dft_inverse_and_inverse_one_sided_match_numpy() {
    let x = HostTensor::from_f32(
        &[2, 6, 2],
        &[
            -0.6, -0.23, 0.14, 0.51, -0.42, -0.05, 0.32, 0.69, -0.24, 0.13, 0.5, -0.43, -0.5, 0.11,
            -0.38, 0.23, -0.26, 0.35, -0.14, 0.47, -0.02, 0.59, 0.1, -0.39,
        ],
    );
    let got = run(
        r#"<ir_version: 10, opset_import: ["" : 20]>
        g (float[2,6,2] x) => (float[2,6,2] y) <int64 axis = {1}> {
          y = DFT <inverse = 1> (x, , axis)
        }"#,
        &[x],
    );
    close(
        &got[0],
        &[
            -0.05, 0.1033333, -0.1546966, -0.2312756, -0.2066581, 0.0373526, -0.37, -0.1533333,
            0.1166581, 0.0893141, 0.0646965, -0.0753911, -0.2, 0.2266667, -0.1148483, -0.2555897,
            -0.1841303, -0.0029744, -0.06, 0.1233333, 0.0641303, 0.0663077, -0.0051517, -0.0477436,
        ],
    );
    let z = HostTensor::from_f32(
        &[1, 5, 2],
        &[1.0, 0.5, -0.25, 2.0, -1.5, 0.75, 0.3, -0.2, 1.1, 0.0],
    );
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,5,2] z) => (float[1,8,1] y) {
          y = DFT <inverse = 1, onesided = 1, axis = -2> (z)
        }"#,
        &[z],
    );
    close(
        &got[0],
        &[
            -0.1, -0.6154252, 0.0875, -0.0459708, -0.125, 0.2154252, 1.1875, 0.3959708,
        ],
    );
}

/// DFT lengths that are not powers of two above 32 (Bluestein's chirp-z):
/// 97 (a prime) and 100 with `dft_length` zero-padding 90 samples, forward
/// full and one-sided, against the DFT by definition.
#[test]
fn dft_of_other_lengths_matches_the_definition() {
    for (n, len, onesided) in [(97, 97, 0), (90, 100, 1), (90, 100, 0)] {
        let x = t(&[2, n, 2], n as u64);
        let bins = if onesided == 1 { len / 2 + 1 } else { len };
        let got = run(
            &format!(
                r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,{n},2] x) => (float[2,{bins},2] y) <int64 len = {{{len}}}> {{
          y = DFT <onesided = {onesided}> (x, len)
        }}"#
            ),
            std::slice::from_ref(&x),
        );
        let xs = x.to_f32().unwrap();
        let mut want = Vec::new();
        for b in 0..2 {
            let sig: Vec<(f64, f64)> = (0..len)
                .map(|j| match j < n {
                    true => (xs[2 * (b * n + j)] as f64, xs[2 * (b * n + j) + 1] as f64),
                    false => (0.0, 0.0),
                })
                .collect();
            for v in dft_ref(&sig).into_iter().take(bins) {
                want.extend([v.0 as f32, v.1 as f32]);
            }
        }
        close(&got[0], &want);
    }
}

/// Resize against onnxruntime 1.32 (opset 19) on x = [[1, 2, 3], [4, 5, 6]]:
/// linear half_pixel scales [1, 1, 2, 2]; nearest asymmetric (round_prefer_floor)
/// sizes [1, 1, 3, 7], the sizes computed at run time from x's shape;
/// linear with axes [3, 2], sizes [4, 4] and keep_aspect_ratio_policy
/// not_larger (one scale 4/3: output [1, 1, 3, 4]).
#[test]
fn resize_linear_half_pixel_and_nearest_asymmetric_sizes() {
    let x = HostTensor::from_f32(&[1, 1, 2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 19]>
        g (float[1,1,2,3] x) => (float[1,1,4,6] a, float[1,1,3,7] b, float[1,1,3,4] c) {
          sc = Constant <value = float[4] {1, 1, 2, 2}> ()
          a = Resize <mode = "linear"> (x, "", sc)
          sh = Shape (x)
          add = Constant <value = int64[4] {0, 0, 1, 4}> ()
          sz = Add (sh, add)
          b = Resize <mode = "nearest", coordinate_transformation_mode = "asymmetric"> (x, "", "", sz)
          sz2 = Constant <value = int64[2] {4, 4}> ()
          c = Resize <mode = "linear", axes = [3, 2], keep_aspect_ratio_policy = "not_larger"> (x, "", "", sz2)
        }"#,
        std::slice::from_ref(&x),
    );
    #[rustfmt::skip]
    let a = [
        1.0, 1.25, 1.75, 2.25, 2.75, 3.0,
        1.75, 2.0, 2.5, 3.0, 3.5, 3.75,
        3.25, 3.5, 4.0, 4.5, 5.0, 5.25,
        4.0, 4.25, 4.75, 5.25, 5.75, 6.0,
    ];
    close(&got[0], &a);
    #[rustfmt::skip]
    let b = [
        1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 3.0,
        4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 6.0,
        4.0, 4.0, 5.0, 5.0, 6.0, 6.0, 6.0,
    ];
    close(&got[1], &b);
    #[rustfmt::skip]
    let c = [
        1.0, 1.625, 2.375, 3.0,
        2.875, 3.5, 4.25, 4.875,
        4.0, 4.625, 5.375, 6.0,
    ];
    close(&got[2], &c);
}

#[test]
fn pow_with_an_exponent_of_another_dtype() {
    // float ^ int64 (a resampling window's Pow), int64 ^ float (truncated,
    // as onnxruntime casts std::pow), float ^ double, with broadcasting.
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x, int64 e, int64[3] k, float[3] f, double[3] d) => (float[2,3] a, int64[3] b, float[2,3] c) {
          a = Pow (x, e)
          b = Pow (k, f)
          c = Pow (x, d)
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let x = [0.5f32, -2.0, 3.0, 1.5, 0.0, -0.25];
    let d = [2.0f64, 0.5, 3.0];
    let d_bytes: Vec<u8> = d.iter().flat_map(|v| v.to_le_bytes()).collect();
    let inputs = [
        HostTensor::from_f32(&[2, 3], &x),
        HostTensor::from_i64(&[], &[3]),
        HostTensor::from_i64(&[3], &[2, 3, 10]),
        HostTensor::from_f32(&[3], &[0.5, 2.0, 1.5]),
        HostTensor {
            dtype: graphopt_ir::DType::F64,
            shape: vec![3],
            data: d_bytes,
        },
    ];
    let opts = RunOptions {
        threads: 2,
        poison: true,
    };
    let (out, _) = exe.run(&inputs, &opts).unwrap();
    let a = out[0].to_f32().unwrap();
    let want: Vec<f32> = x.iter().map(|v| v * v * v).collect();
    assert_eq!(a, want);
    let b: Vec<i64> = out[1]
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // 2^0.5 = 1.41 -> 1, 3^2 = 9, 10^1.5 = 31.6 -> 31
    assert_eq!(b, vec![1, 9, 31]);
    let c = out[2].to_f32().unwrap();
    for (i, (&g, &v)) in c.iter().zip(&x).enumerate() {
        let w = (v as f64).powf(d[i % 3]) as f32;
        assert!(
            g == w || (g.is_nan() && w.is_nan()),
            "element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn a_zero_point_shorter_than_its_scales_is_refused_before_running() {
    // Per-axis scales (4) with 2 zero points, blocked scales (2 blocks of
    // 2 along axis 1, per row) with 1 zero point: one-line refusals at
    // kernel creation, not an index past the zero point at run time.
    for (ty, body) in [
        (
            "float[3,4] y",
            r#"y = DequantizeLinear <axis = 1> (x, s, z)"#,
        ),
        (
            "float[3,4] y",
            r#"y = DequantizeLinear <axis = 1, block_size = 2> (x, sb, z1)"#,
        ),
    ] {
        let text = format!(
            r#"<ir_version: 10, opset_import: ["" : 21]>
            g (int8[3,4] x) => ({ty}) {{
              s = Constant <value = float[4] {{0.1, 0.2, 0.3, 0.4}}> ()
              sb = Constant <value = float[3,2] {{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}}> ()
              z = Constant <value = int8[2] {{1, 2}}> ()
              z1 = Constant <value = int8[1] {{1}}> ()
              {body}
            }}"#
        );
        let m = graphopt_text::parse_model(&text).unwrap();
        let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
        let e = match Executable::new(&mp.model, &mp.plan, &CpuBackend) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted: {body}"),
        };
        assert!(
            e.contains("zero point of shape") && !e.contains('\n'),
            "{e}"
        );
    }
}

/// ConstantOfShape fills its whole output with the value's bytes: zeros
/// (one memset), and a non-zero value over a size that is no power of two
/// (the doubled copies' last, partial round). Run twice: after the first
/// run the dead fills hold poison, which the second must overwrite.
#[test]
fn constant_of_shape_fills_every_element() {
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[3,1000,7] x) => (float[3,1000,7] z, float[3,1000,7] o) {
          s = Shape (x)
          z0 = ConstantOfShape (s)
          z = Add (z0, x)
          o0 = ConstantOfShape <value = float[1] {2.5}> (s)
          o = Add (o0, x)
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let opts = RunOptions {
        threads: 2,
        poison: true,
    };
    let x = HostTensor::from_f32(&[3, 1000, 7], &[1.0; 21000]);
    for run in 0..2 {
        let (out, _) = exe.run(std::slice::from_ref(&x), &opts).unwrap();
        assert!(
            out[0].to_f32().unwrap().iter().all(|&v| v == 1.0),
            "run {run}"
        );
        assert!(
            out[1].to_f32().unwrap().iter().all(|&v| v == 3.5),
            "run {run}"
        );
    }
}

/// MatMulInteger with a constant weight runs on the integer GEMM
/// (`cpu::qgemm`); the same product with the weight fed as an input runs
/// on the plain loop. Both are exact, so the outputs are equal: uint8 and
/// int8 weights, one zero point or one per column, batched activations.
#[test]
fn matmul_integer_with_a_constant_weight_gives_the_plain_sums() {
    let (k, n) = (70, 37);
    let a: Vec<i64> = (0..2 * 3 * k)
        .map(|i| ((i * 97 + 13) % 256) as i64)
        .collect();
    for (ty, zb) in [("uint8", "uint8[37] zb = {ZB}"), ("int8", "int8 zb = {-3}")] {
        let w: Vec<i64> = (0..k * n)
            .map(|i| {
                let v = ((i * 61 + 7) % 256) as i64;
                if ty == "int8" {
                    v - 128
                } else {
                    v
                }
            })
            .collect();
        let zbs: Vec<String> = (0..n).map(|j| ((j * 29) % 256).to_string()).collect();
        let zb = zb.replace("ZB", &zbs.join(", "));
        let list = |v: &[i64]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let body = "y = MatMulInteger (a, b, za, zb)";
        let constant = format!(
            "<ir_version: 8, opset_import: [\"\" : 17]>\n\
             g (uint8[2, 3, {k}] a) => (int32[2, 3, {n}] y)\n\
             <{ty}[{k}, {n}] b = {{{}}}, uint8 za = {{7}}, {zb}> {{\n{body}\n}}",
            list(&w)
        );
        let fed = format!(
            "<ir_version: 8, opset_import: [\"\" : 17]>\n\
             g (uint8[2, 3, {k}] a, {ty}[{k}, {n}] b) => (int32[2, 3, {n}] y)\n\
             <uint8 za = {{7}}, {zb}> {{\n{body}\n}}"
        );
        let at = HostTensor {
            dtype: graphopt_ir::DType::U8,
            shape: vec![2, 3, k],
            data: a.iter().map(|&v| v as u8).collect(),
        };
        let bt = HostTensor {
            dtype: if ty == "int8" {
                graphopt_ir::DType::I8
            } else {
                graphopt_ir::DType::U8
            },
            shape: vec![k, n],
            data: w.iter().map(|&v| v as u8).collect(),
        };
        let go = |text: &str, inputs: &[HostTensor]| {
            let m = graphopt_text::parse_model(text).expect("fixture parses");
            let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
            let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
            exe.run(
                inputs,
                &RunOptions {
                    threads: 2,
                    poison: true,
                },
            )
            .unwrap()
            .0
        };
        let want = go(&fed, &[at.clone(), bt]);
        let got = go(&constant, &[at]);
        assert_eq!(got[0].dtype, graphopt_ir::DType::I32);
        assert!(got[0].data == want[0].data, "{ty}: sums differ");
    }
}

/// LRN over 37 channels (windows clipped at both ends, an odd and an even
/// size: the spec's window is `c - ⌊(size-1)/2⌋ ..= c + ⌈(size-1)/2⌉`)
/// against the ONNX formula looped naively, on planes split across
/// threads.
#[test]
fn lrn_over_many_channels_matches_the_formula() {
    let (n, c, p) = (2, 37, 3 * 5);
    let x = t(&[n, c, 3, 5], 41);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 13]>
        g (float[2,37,3,5] x) => (float[2,37,3,5] a, float[2,37,3,5] b) {
          a = LRN <size = 5, alpha = 0.02, beta = 0.75, bias = 2.0> (x)
          b = LRN <size = 4, alpha = 0.5, beta = 1.5> (x)
        }"#,
        std::slice::from_ref(&x),
    );
    let xv = x.to_f32().unwrap();
    for (k, (size, alpha, beta, bias)) in [(5usize, 0.02f64, 0.75f64, 2.0f64), (4, 0.5, 1.5, 1.0)]
        .into_iter()
        .enumerate()
    {
        let mut want = vec![0f32; xv.len()];
        for i in 0..n {
            for ch in 0..c {
                let lo = ch.saturating_sub((size - 1) / 2);
                let hi = (ch + (size - 1).div_ceil(2) + 1).min(c);
                for q in 0..p {
                    let sq: f64 = (lo..hi)
                        .map(|j| (xv[(i * c + j) * p + q] as f64).powi(2))
                        .sum();
                    let v = xv[(i * c + ch) * p + q] as f64;
                    want[(i * c + ch) * p + q] =
                        (v / (bias + alpha / size as f64 * sq).powf(beta)) as f32;
                }
            }
        }
        close(&got[k], &want);
    }
}

/// GroupNormalization scales and shifts per group at opset 18 and per
/// channel at opset 21 (4 channels in 2 groups), against the definition.
#[test]
fn group_normalization_scale_is_per_group_at_18_and_per_channel_at_21() {
    let x = t(&[2, 4, 3, 3], 42);
    let xv = x.to_f32().unwrap();
    let norm = |s: &[f32], b: &[f32], per_channel: bool| -> Vec<f32> {
        let mut y = vec![0f32; xv.len()];
        for blk in 0..4 {
            let v = &xv[blk * 18..][..18];
            let mean = v.iter().map(|&a| a as f64).sum::<f64>() / 18.0;
            let var = v.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / 18.0;
            for (e, &a) in v.iter().enumerate() {
                let ch = (blk % 2) * 2 + e / 9;
                let at = if per_channel { ch } else { blk % 2 };
                let z = (a as f64 - mean) / (var + 1e-3).sqrt();
                y[blk * 18 + e] = (z * s[at] as f64 + b[at] as f64) as f32;
            }
        }
        y
    };
    let got18 = run(
        r#"<ir_version: 8, opset_import: ["" : 18]>
        g (float[2,4,3,3] x) => (float[2,4,3,3] y) {
          s = Constant <value = float[2] {0.5, -2.0}> ()
          b = Constant <value = float[2] {1.0, 0.25}> ()
          y = GroupNormalization <num_groups = 2, epsilon = 0.001> (x, s, b)
        }"#,
        std::slice::from_ref(&x),
    );
    close(&got18[0], &norm(&[0.5, -2.0], &[1.0, 0.25], false));
    let got21 = run(
        r#"<ir_version: 10, opset_import: ["" : 21]>
        g (float[2,4,3,3] x) => (float[2,4,3,3] y) {
          s = Constant <value = float[4] {0.5, -2.0, 3.0, 1.5}> ()
          b = Constant <value = float[4] {1.0, 0.25, -1.0, 0.0}> ()
          y = GroupNormalization <num_groups = 2, epsilon = 0.001> (x, s, b)
        }"#,
        std::slice::from_ref(&x),
    );
    close(
        &got21[0],
        &norm(&[0.5, -2.0, 3.0, 1.5], &[1.0, 0.25, -1.0, 0.0], true),
    );
}

/// Nodes the new kernels cannot take are refused in one line when the
/// executable is made (no panic): groups that do not divide the channels,
/// a per-channel scale at opset 18, a blocksize that does not divide the
/// channels, an LRN without its size, Det of a non-square matrix.
#[test]
fn bad_shapes_and_attributes_are_refused_in_one_line() {
    for (opset, decl, body, why) in [
        (
            18,
            "float[1,4,2] y",
            "s = Constant <value = float[3] {1.0, 1.0, 1.0}> ()\n y = GroupNormalization <num_groups = 3> (x, s, s)",
            "does not divide",
        ),
        (
            18,
            "float[1,4,2] y",
            "s = Constant <value = float[4] {1.0, 1.0, 1.0, 1.0}> ()\n y = GroupNormalization <num_groups = 2> (x, s, s)",
            "one per group",
        ),
        (
            13,
            "float[1,1,4,4] y",
            "x4 = Reshape (x, sh)\n y = DepthToSpace <blocksize = 4> (x4)",
            "not a multiple",
        ),
        (13, "float[1,4,2] y", "y = LRN (x)", "size"),
        (13, "float[1] y", "y = Det (x)", "square"),
    ] {
        let text = format!(
            r#"<ir_version: 10, opset_import: ["" : {opset}]>
            g (float[1,4,2] x) => ({decl}) {{
              sh = Constant <value = int64[4] {{1, 4, 2, 1}}> ()
              {body}
            }}"#
        );
        let m = graphopt_text::parse_model(&text).unwrap();
        let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
        let e = match Executable::new(&mp.model, &mp.plan, &CpuBackend) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted: {body}"),
        };
        assert!(e.contains(why) && !e.contains('\n'), "{body}: {e}");
    }
}

/// Det of a batch of 5×5 matrices (row swaps needed: a zero leading
/// entry) against the Leibniz sum over permutations, and CumProd
/// exclusive and reversed along axis 1.
#[test]
fn det_by_pivoted_lu_and_cumprod_exclusive_reverse() {
    let mut x = t(&[3, 5, 5], 43);
    let mut xv = x.to_f32().unwrap();
    xv[0] = 0.0;
    x = HostTensor::from_f32(&[3, 5, 5], &xv);
    let got = run(
        r#"<ir_version: 10, opset_import: ["" : 26]>
        g (float[3,5,5] x) => (float[3] d, float[3,5,5] c) {
          ax = Constant <value = int64 {1}> ()
          d = Det (x)
          c = CumProd <exclusive = 1, reverse = 1> (x, ax)
        }"#,
        std::slice::from_ref(&x),
    );
    let mut perm: Vec<usize> = (0..5).collect();
    let mut perms = vec![];
    fn heap(k: usize, p: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if k == 1 {
            out.push(p.clone());
            return;
        }
        for i in 0..k {
            heap(k - 1, p, out);
            let j = if k.is_multiple_of(2) { i } else { 0 };
            p.swap(j, k - 1);
        }
    }
    heap(5, &mut perm, &mut perms);
    let det: Vec<f32> = (0..3)
        .map(|b| {
            perms
                .iter()
                .map(|p| {
                    let inv = (0..5)
                        .flat_map(|i| (i + 1..5).map(move |j| (i, j)))
                        .filter(|&(i, j)| p[i] > p[j])
                        .count();
                    let sign = if inv.is_multiple_of(2) { 1.0 } else { -1.0 };
                    sign * (0..5)
                        .map(|i| xv[b * 25 + i * 5 + p[i]] as f64)
                        .product::<f64>()
                })
                .sum::<f64>() as f32
        })
        .collect();
    close(&got[0], &det);
    let mut want = vec![0f32; 75];
    for b in 0..3 {
        for col in 0..5 {
            let mut acc = 1f32;
            for row in (0..5).rev() {
                want[b * 25 + row * 5 + col] = acc;
                acc *= xv[b * 25 + row * 5 + col];
            }
        }
    }
    close(&got[1], &want);
    // A NaN below a zero diagonal entry is the pivot: the determinant is
    // NaN, as numpy's, not the 0 of a singular column.
    let nan = HostTensor::from_f32(&[2, 2], &[0.0, 1.0, f32::NAN, 1.0]);
    let got = run(
        r#"<ir_version: 10, opset_import: ["" : 26]>
        g (float[2,2] x) => (float d) {
          d = Det (x)
        }"#,
        std::slice::from_ref(&nan),
    );
    assert!(got[0][0].is_nan(), "{:?}", got[0]);
}

/// An 8-bit element as its integer: `ty` is "int8" or "uint8".
fn qval(ty: &str, b: u8) -> i32 {
    if ty == "int8" {
        b as i8 as i32
    } else {
        b as i32
    }
}

fn qtype(ty: &str) -> graphopt_ir::DType {
    match ty {
        "int8" => graphopt_ir::DType::I8,
        "uint8" => graphopt_ir::DType::U8,
        _ => graphopt_ir::DType::I32,
    }
}

fn qlist<T: ToString>(v: impl IntoIterator<Item = T>) -> String {
    v.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `Σ (x − xz)(w − wz[c])` over the taps inside the image (direct loops,
/// in i64), the reference of QLinearConv and ConvInteger.
fn qconv_sums(x: &[i32], xz: i32, w: &[i32], wz: &[i32], g: &Geo) -> Vec<i64> {
    let (n, c, h, wd) = g.x;
    let (m, kh, kw) = g.k;
    let (oh, ow) = g.o;
    let (cg, mg) = (c / g.group, m / g.group);
    let mut y = vec![0i64; n * m * oh * ow];
    for ni in 0..n {
        for mi in 0..m {
            let gi = mi / mg;
            let z = wz[if wz.len() == 1 { 0 } else { mi }] as i64;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = 0i64;
                    for ci in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let iy = (oy * g.s.0 + ki * g.d.0) as isize - g.p.0 as isize;
                                let ix = (ox * g.s.1 + kj * g.d.1) as isize - g.p.1 as isize;
                                if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd {
                                    continue;
                                }
                                let xv = x
                                    [((ni * c + gi * cg + ci) * h + iy as usize) * wd + ix as usize]
                                    as i64;
                                let wv = w[((mi * cg + ci) * kh + ki) * kw + kj] as i64;
                                s += (xv - xz as i64) * (wv - z);
                            }
                        }
                    }
                    y[((ni * m + mi) * oh + oy) * ow + ox] = s;
                }
            }
        }
    }
    y
}

/// The requantization as onnxruntime computes it: the int32 sum as f32
/// times `xs · ws / ys` (f32), rounded half to even, plus the zero point,
/// saturated to `ty`.
fn qrequant(acc: i64, mult: f32, zp: i32, ty: &str) -> i32 {
    let (lo, hi) = if ty == "int8" { (-128, 127) } else { (0, 255) };
    (((acc as i32) as f32 * mult).round_ties_even() as i64 + zp as i64).clamp(lo, hi) as i32
}

/// Runs a one-node model, its inputs fed in order; `Err` when it is refused.
fn qrun(text: &str, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, String> {
    let m = graphopt_text::parse_model(text).map_err(|e| format!("{e:?}"))?;
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default())
        .map_err(|e| format!("{e:?}"))?;
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).map_err(|e| e.to_string())?;
    let opts = RunOptions {
        threads: 2,
        poison: true,
    };
    Ok(exe.run(inputs, &opts).map_err(|e| e.to_string())?.0)
}

/// One QLinearConv (and the ConvInteger of the same operands) against
/// [`qconv_sums`]: the weight as a constant and fed as an input.
#[allow(clippy::too_many_arguments)]
fn check_qconv(
    (xt, wt, yt): (&str, &str, &str),
    g: &Geo,
    attrs: &str,
    per_channel: bool,
    bias: bool,
    seed: u64,
) {
    let (n, c, h, wd) = g.x;
    let (m, kh, kw) = g.k;
    let cg = c / g.group;
    let one_d = h == 1 && kh == 1 && attrs.contains("1d");
    let attrs = attrs.replace("1d", "");
    let xs_ = if one_d {
        format!("{n},{c},{wd}")
    } else {
        format!("{n},{c},{h},{wd}")
    };
    let ws_ = if one_d {
        format!("{m},{cg},{kw}")
    } else {
        format!("{m},{cg},{kh},{kw}")
    };
    let ys_ = if one_d {
        format!("{n},{m},{}", g.o.1)
    } else {
        format!("{n},{m},{},{}", g.o.0, g.o.1)
    };
    let xb = graphopt_testutil::bytes(n * c * h * wd, seed);
    let wb = graphopt_testutil::bytes(m * cg * kh * kw, seed + 1);
    let xv: Vec<i32> = xb.iter().map(|&b| qval(xt, b)).collect();
    let wv: Vec<i32> = wb.iter().map(|&b| qval(wt, b)).collect();
    // Zero points near the middle of the data (whose sums then center on
    // about 0).
    let mid = |ty: &str, b: u8| (b % 16) as i32 + if ty == "int8" { -8 } else { 120 };
    let xz = mid(xt, graphopt_testutil::bytes(1, seed + 2)[0]);
    let mc = if per_channel { m } else { 1 };
    let wz: Vec<i32> = graphopt_testutil::bytes(mc, seed + 3)
        .iter()
        .map(|&b| mid(wt, b))
        .collect();
    let w_scale: Vec<f32> = (0..mc).map(|i| 0.01 + 0.003 * i as f32).collect();
    let b: Vec<i32> = (0..m).map(|i| (i as i32 - 2) * 1234).collect();
    let (xs, yz) = (0.05f32, if yt == "int8" { 2 } else { 130 });
    let sums = qconv_sums(&xv, xz, &wv, &wz, g);
    // y's scale spreads the outputs over about ±40 steps (few saturate).
    let rms = (sums.iter().map(|&s| (s as f64).powi(2)).sum::<f64>() / sums.len() as f64).sqrt();
    let ys = (xs as f64 * 0.012 * rms / 40.0) as f32;
    let ch = |c: usize| if per_channel { c } else { 0 };
    let plane = g.o.0 * g.o.1;
    let want: Vec<u8> = sums
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let c = i / plane % m;
            let s = s + if bias { b[c] as i64 } else { 0 };
            qrequant(s, xs * w_scale[ch(c)] / ys, yz, yt) as u8
        })
        .collect();
    let wshape = if per_channel {
        format!("[{m}]")
    } else {
        String::new()
    };
    let consts = format!(
        "float xs = {{{xs}}}, {xt} xz = {{{xz}}}, float{wshape} wsc = {{{}}}, {wt}{wshape} wz = {{{}}}, \
         float ys = {{{ys}}}, {yt} yz = {{{yz}}}, int32[{m}] b = {{{}}}",
        qlist(&w_scale),
        qlist(&wz),
        qlist(&b)
    );
    let bias_in = if bias { ", b" } else { "" };
    let node = format!("y = QLinearConv {attrs} (x, xs, xz, w, wsc, wz, ys, yz{bias_in})");
    let ci = format!("ci = ConvInteger {attrs} (x, w, xz, wz)");
    let (x_t, w_t) = (
        HostTensor {
            dtype: qtype(xt),
            shape: xs_.split(',').map(|d| d.parse().unwrap()).collect(),
            data: xb.clone(),
        },
        HostTensor {
            dtype: qtype(wt),
            shape: ws_.split(',').map(|d| d.parse().unwrap()).collect(),
            data: wb.clone(),
        },
    );
    let head = r#"<ir_version: 8, opset_import: ["" : 13]>"#;
    let outs = format!("({yt}[{ys_}] y, int32[{ys_}] ci)");
    let constant = format!(
        "{head}\ng ({xt}[{xs_}] x) => {outs}\n<{wt}[{ws_}] w = {{{}}}, {consts}> {{\n{node}\n{ci}\n}}",
        qlist(&wv)
    );
    let fed = format!(
        "{head}\ng ({xt}[{xs_}] x, {wt}[{ws_}] w) => {outs}\n<{consts}> {{\n{node}\n{ci}\n}}"
    );
    let sums_i32: Vec<u8> = sums
        .iter()
        .flat_map(|&s| (s as i32).to_le_bytes())
        .collect();
    for (text, inputs) in [
        (&constant, vec![x_t.clone()]),
        (&fed, vec![x_t.clone(), w_t.clone()]),
    ] {
        let out = qrun(text, &inputs).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(out[0].dtype, qtype(yt));
        let bad = out[0]
            .data
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            bad,
            0,
            "{bad} of {} QLinearConv outputs differ: {attrs}",
            want.len()
        );
        assert!(out[1].data == sums_i32, "ConvInteger sums differ: {attrs}");
        // Not all saturated: the scales keep most outputs inside the range.
        let edge = want
            .iter()
            .filter(|&&v| v == 0 || v == 255 || v == 127 || v == 128)
            .count();
        assert!(
            edge < want.len() / 2,
            "{edge} of {} at the edges",
            want.len()
        );
    }
}

#[test]
fn qlinear_conv_per_channel_groups_strides_pads_dilations_against_loops() {
    // x [2,4,7,6], w [6,2,3,2] (group 2), stride 2x1, pads 1,0 / 1,1,
    // dilation 1x2: oh = (7 + 2 - 3) / 2 + 1 = 4, ow = (6 + 1 - 3) / 1 + 1 = 5.
    check_qconv(
        ("uint8", "int8", "uint8"),
        &Geo {
            x: (2, 4, 7, 6),
            k: (6, 3, 2),
            group: 2,
            s: (2, 1),
            p: (1, 0),
            d: (1, 2),
            o: (4, 5),
        },
        "<group = 2, strides = [2, 1], pads = [1, 0, 1, 1], dilations = [1, 2]>",
        true,
        true,
        21,
    );
    // int8 activations, uint8 weights with one zero point, no bias, int8
    // out; SAME_UPPER with stride 2 over 9x9: out 5x5, pads 1 / 1.
    check_qconv(
        ("int8", "uint8", "int8"),
        &Geo {
            x: (1, 5, 9, 9),
            k: (20, 3, 3),
            group: 1,
            s: (2, 2),
            p: (1, 1),
            d: (1, 1),
            o: (5, 5),
        },
        "<auto_pad = \"SAME_UPPER\", strides = [2, 2]>",
        false,
        false,
        22,
    );
    // A 1-D convolution with a long output.
    check_qconv(
        ("uint8", "uint8", "uint8"),
        &Geo {
            x: (1, 3, 1, 9000),
            k: (4, 1, 5),
            group: 1,
            s: (1, 3),
            p: (0, 2),
            d: (1, 1),
            o: (1, 3000),
        },
        "1d<strides = [3], pads = [2, 1]>",
        true,
        true,
        23,
    );
    // Deep rows (512·3·3) over 24x24 pixels: several unfolded tiles.
    check_qconv(
        ("int8", "int8", "int8"),
        &Geo {
            x: (1, 512, 24, 24),
            k: (4, 3, 3),
            group: 1,
            s: (1, 1),
            p: (1, 1),
            d: (1, 1),
            o: (24, 24),
        },
        "<pads = [1, 1, 1, 1]>",
        true,
        true,
        26,
    );
    // 1x1 convolutions: an image its own unfolded matrix, read in place,
    // in one tile and in several.
    for (hw, seed) in [((5, 7), 27), ((150, 150), 28)] {
        check_qconv(
            ("uint8", "int8", "uint8"),
            &Geo {
                x: (2, 16, hw.0, hw.1),
                k: (8, 1, 1),
                group: 1,
                s: (1, 1),
                p: (0, 0),
                d: (1, 1),
                o: hw,
            },
            "",
            true,
            true,
            seed,
        );
    }
    // Enough work for blocks of the output split across the 2 threads.
    check_qconv(
        ("uint8", "int8", "uint8"),
        &Geo {
            x: (4, 8, 16, 16),
            k: (16, 3, 3),
            group: 2,
            s: (1, 1),
            p: (1, 1),
            d: (1, 1),
            o: (16, 16),
        },
        "<group = 2, pads = [1, 1, 1, 1]>",
        true,
        true,
        24,
    );
    // A 7x7 image: one tile, its 36 output channels split across the
    // threads in runs of 8 (the last run 4).
    check_qconv(
        ("uint8", "int8", "uint8"),
        &Geo {
            x: (1, 64, 7, 7),
            k: (36, 3, 3),
            group: 1,
            s: (1, 1),
            p: (1, 1),
            d: (1, 1),
            o: (7, 7),
        },
        "<pads = [1, 1, 1, 1]>",
        false,
        false,
        29,
    );
    // Deeper than the integer GEMM sums exactly in i32 (3700·3·3 =
    // 33300 > 33025): the plain loop, wrapping as int32 does.
    check_qconv(
        ("uint8", "int8", "uint8"),
        &Geo {
            x: (1, 3700, 3, 3),
            k: (2, 3, 3),
            group: 1,
            s: (1, 1),
            p: (1, 1),
            d: (1, 1),
            o: (3, 3),
        },
        "<pads = [1, 1, 1, 1]>",
        true,
        true,
        25,
    );
}

#[test]
fn qlinear_conv_depthwise_with_a_channel_multiplier_against_loops() {
    // x [2,3,8,8] int8, w [6,1,3,3] (group 3: two output channels per
    // input channel), stride 2, pads 1: out 4x4; and a plain depthwise 5x5
    // with dilation 2 (pads 4: out 8x8).
    check_qconv(
        ("int8", "int8", "uint8"),
        &Geo {
            x: (2, 3, 8, 8),
            k: (6, 3, 3),
            group: 3,
            s: (2, 2),
            p: (1, 1),
            d: (1, 1),
            o: (4, 4),
        },
        "<group = 3, strides = [2, 2], pads = [1, 1, 1, 1]>",
        true,
        true,
        31,
    );
    check_qconv(
        ("uint8", "int8", "int8"),
        &Geo {
            x: (1, 4, 8, 8),
            k: (4, 5, 5),
            group: 4,
            s: (1, 1),
            p: (4, 4),
            d: (2, 2),
            o: (8, 8),
        },
        "<group = 4, pads = [4, 4, 4, 4], dilations = [2, 2]>",
        true,
        false,
        32,
    );
    // Planes split across the 2 threads.
    check_qconv(
        ("uint8", "uint8", "uint8"),
        &Geo {
            x: (2, 16, 32, 32),
            k: (16, 3, 3),
            group: 16,
            s: (1, 1),
            p: (1, 1),
            d: (1, 1),
            o: (32, 32),
        },
        "<group = 16, pads = [1, 1, 1, 1]>",
        false,
        true,
        33,
    );
}

/// QLinearMatMul with broadcast batches: `a` `[2,1,3,5]` with per-row
/// scales and zero points (`[3,1]`), `b` `[3,5,4]` with per-column ones
/// (`[4]`); and a 2-D int8 `a` with the spec's `[M]` per-row scales times a
/// constant uint8 `b`.
#[test]
fn qlinear_matmul_broadcasts_batches_with_per_row_and_per_column_scales() {
    let head = r#"<ir_version: 8, opset_import: ["" : 13]>"#;
    // Case 1.
    let (ab, bb) = (
        graphopt_testutil::bytes(30, 41),
        graphopt_testutil::bytes(60, 42),
    );
    let av: Vec<i32> = ab.iter().map(|&b| qval("uint8", b)).collect();
    let bv: Vec<i32> = bb.iter().map(|&b| qval("int8", b)).collect();
    let (a_s, a_z) = ([0.02f32, 0.03, 0.025], [120, 130, 7]);
    let (b_s, b_z) = ([0.01f32, 0.015, 0.02, 0.012], [-3, 0, 5, 100]);
    let (ys, yz) = (0.6f32, 128);
    let text = format!(
        "{head}\ng (uint8[2,1,3,5] a, int8[3,5,4] b) => (uint8[2,3,3,4] y)\n\
         <float[3,1] as = {{{}}}, uint8[3,1] az = {{{}}}, float[4] bs = {{{}}}, int8[4] bz = {{{}}}, \
         float ys = {{{ys}}}, uint8 yz = {{{yz}}}> {{\ny = QLinearMatMul (a, as, az, b, bs, bz, ys, yz)\n}}",
        qlist(a_s),
        qlist(a_z),
        qlist(b_s),
        qlist(b_z)
    );
    let mut want = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            for r in 0..3 {
                for c in 0..4 {
                    let s: i64 = (0..5)
                        .map(|p| {
                            (av[i * 15 + r * 5 + p] - a_z[r]) as i64
                                * (bv[j * 20 + p * 4 + c] - b_z[c]) as i64
                        })
                        .sum();
                    want.push(qrequant(s, a_s[r] * b_s[c] / ys, yz, "uint8") as u8);
                }
            }
        }
    }
    let inputs = [
        HostTensor {
            dtype: qtype("uint8"),
            shape: vec![2, 1, 3, 5],
            data: ab,
        },
        HostTensor {
            dtype: qtype("int8"),
            shape: vec![3, 5, 4],
            data: bb,
        },
    ];
    let out = qrun(&text, &inputs).unwrap();
    assert_eq!(out[0].shape, vec![2, 3, 3, 4]);
    assert_eq!(out[0].data, want);
    assert!(want.iter().filter(|&&v| v == 0 || v == 255).count() < want.len() / 4);

    // Case 2: a int8 [7, 40] with [7] per-row scales and zero points, b a
    // constant uint8 [40, 33] with one zero point, int8 out.
    let (m, k, n) = (7, 40, 33);
    let (ab, bb) = (
        graphopt_testutil::bytes(m * k, 43),
        graphopt_testutil::bytes(k * n, 44),
    );
    let av: Vec<i32> = ab.iter().map(|&b| qval("int8", b)).collect();
    let bv: Vec<i32> = bb.iter().map(|&b| qval("uint8", b)).collect();
    let a_s: Vec<f32> = (0..m).map(|i| 0.01 + 0.001 * i as f32).collect();
    let a_z: Vec<i32> = (0..m as i32).map(|i| i * 30 - 100).collect();
    let (b_s, b_z, ys, yz) = (0.02f32, 131, 3.0f32, -5);
    let text = format!(
        "{head}\ng (int8[{m},{k}] a) => (int8[{m},{n}] y)\n\
         <uint8[{k},{n}] b = {{{}}}, float[{m}] as = {{{}}}, int8[{m}] az = {{{}}}, float bs = {{{b_s}}}, \
         uint8 bz = {{{b_z}}}, float ys = {{{ys}}}, int8 yz = {{{yz}}}> \
         {{\ny = QLinearMatMul (a, as, az, b, bs, bz, ys, yz)\n}}",
        qlist(&bv),
        qlist(&a_s),
        qlist(&a_z)
    );
    let mut want = Vec::new();
    for r in 0..m {
        for c in 0..n {
            let s: i64 = (0..k)
                .map(|p| (av[r * k + p] - a_z[r]) as i64 * (bv[p * n + c] - b_z) as i64)
                .sum();
            want.push(qrequant(s, a_s[r] * b_s / ys, yz, "int8") as u8);
        }
    }
    let a = HostTensor {
        dtype: qtype("int8"),
        shape: vec![m, k],
        data: ab,
    };
    let out = qrun(&text, &[a]).unwrap();
    assert_eq!(out[0].data, want);
    assert!(want.iter().filter(|&&v| v == 127 || v == 128).count() < want.len() / 4);
}

/// Operands the quantized kernels do not take are refused in one line
/// when the model is loaded (no panic, nothing run): a zero point of the
/// other 8-bit type, per-channel scales of the wrong length, a stride of
/// 0, batch dims that do not broadcast.
#[test]
fn quantized_kernels_refuse_bad_operands_in_one_line() {
    let head = r#"<ir_version: 8, opset_import: ["" : 13]>"#;
    let conv = |w_zp: &str, w_scale: &str, attrs: &str| {
        format!(
            "{head}\ng (uint8[1,2,5,5] x) => (uint8[1,3,3,3] y)\n\
             <int8[3,2,3,3] w = {{{}}}, float xs = {{0.1}}, uint8 xz = {{3}}, {w_scale}, {w_zp}, \
             float ys = {{0.2}}, uint8 yz = {{1}}> {{\ny = QLinearConv {attrs} (x, xs, xz, w, ws, wz, ys, yz)\n}}",
            qlist(vec![1; 54])
        )
    };
    let cases = [
        (conv("uint8 wz = {2}", "float ws = {0.1}", ""), "zero point"),
        (
            conv("int8 wz = {2}", "float[2] ws = {0.1, 0.2}", ""),
            "scale of shape",
        ),
        (
            conv("int8 wz = {2}", "float ws = {0.1}", "<strides = [0, 1]>"),
            "strides",
        ),
        (
            format!(
                "{head}\ng (uint8[2,3,4] a, uint8[4,5] b) => (uint8[2,3,5] y)\n\
                 <float s = {{0.1}}, int8 az = {{1}}, uint8 z = {{1}}> \
                 {{\ny = QLinearMatMul (a, s, az, b, s, z, s, z)\n}}"
            ),
            "zero point",
        ),
        (
            format!(
                "{head}\ng (uint8[2,3,4] a, uint8[4,5] b) => (uint8[2,3,5] y)\n\
                 <float s = {{0.1}}, float[3] bs = {{0.1, 0.2, 0.3}}, uint8 z = {{1}}> \
                 {{\ny = QLinearMatMul (a, s, z, b, bs, z, s, z)\n}}"
            ),
            "b's scale",
        ),
    ];
    for (text, want) in cases {
        let x = HostTensor {
            dtype: graphopt_ir::DType::U8,
            shape: vec![1, 2, 5, 5],
            data: vec![0; 50],
        };
        let r = std::panic::catch_unwind(|| qrun(&text, &[x]));
        let e = match r {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => panic!("accepted:\n{text}"),
            Err(_) => panic!("panicked:\n{text}"),
        };
        assert!(e.contains(want) && !e.contains('\n'), "{e}");
    }
}

/// RoiAlign of a plane that is linear in (y, x): bilinear sampling is
/// exact there, so each avg bin is the plane at its center. Two images,
/// the ROIs on image 1 and 0, half_pixel with 2x2 samples per bin and
/// spatial_scale 0.5 (the node tests have one image and one mode per
/// case).
#[test]
fn roi_align_averages_a_linear_plane_at_the_bin_centers() {
    let (h, w) = (12usize, 16usize);
    let plane =
        |img: usize, c: usize, y: f32, x: f32| (img as f32 + 1.0) * (0.5 * y + 0.25 * x) + c as f32;
    let mut xv = vec![0f32; 2 * 3 * h * w];
    for img in 0..2 {
        for c in 0..3 {
            for y in 0..h {
                for x in 0..w {
                    xv[((img * 3 + c) * h + y) * w + x] = plane(img, c, y as f32, x as f32);
                }
            }
        }
    }
    let x = HostTensor::from_f32(&[2, 3, h, w], &xv);
    let rois = [[4.0f32, 2.0, 20.0, 14.0], [6.0, 8.0, 18.0, 20.0]];
    let r = HostTensor::from_f32(&[2, 4], &rois.concat());
    let b = HostTensor::from_i64(&[2], &[1, 0]);
    let got = run(
        r#"<ir_version: 10, opset_import: ["" : 16]>
        g (float[2,3,12,16] x, float[2,4] r, int64[2] b) => (float[2,3,3,4] y) {
          y = RoiAlign <output_height = 3, output_width = 4, sampling_ratio = 2, spatial_scale = 0.5> (x, r, b)
        }"#,
        &[x, r, b],
    );
    let mut want = vec![];
    for (k, roi) in rois.iter().enumerate() {
        let img = [1, 0][k];
        let (sx, sy) = (roi[0] * 0.5 - 0.5, roi[1] * 0.5 - 0.5);
        let (bw, bh) = ((roi[2] - roi[0]) * 0.5 / 4.0, (roi[3] - roi[1]) * 0.5 / 3.0);
        for c in 0..3 {
            for ph in 0..3 {
                for pw in 0..4 {
                    let cy = sy + (ph as f32 + 0.5) * bh;
                    let cx = sx + (pw as f32 + 0.5) * bw;
                    want.push(plane(img, c, cy, cx));
                }
            }
        }
    }
    close(&got[0], &want);
}

/// The error of planning, making or running a model, or `None` when it
/// runs.
fn refusal(text: &str, inputs: &[HostTensor]) -> Option<String> {
    let m = graphopt_text::parse_model(text).unwrap();
    let mp = match plan_model(&m, &DimValues::default(), &PlanOptions::default()) {
        Ok(mp) => mp,
        Err(e) => return Some(e.to_string()),
    };
    let mut exe = match Executable::new(&mp.model, &mp.plan, &CpuBackend) {
        Ok(exe) => exe,
        Err(e) => return Some(e.to_string()),
    };
    let opts = RunOptions {
        threads: 2,
        poison: true,
    };
    exe.run(inputs, &opts).err().map(|e| e.to_string())
}

/// The new kernels refuse what they cannot take in one line, when the
/// executable is made (bad attributes and shapes) or when it runs (a
/// batch index or an unpooling index out of range, a block_shape computed
/// at run time), never by a panic.
#[test]
fn roi_align_max_unpool_col2im_affine_grid_refuse_bad_inputs() {
    for (decl, body, why) in [
        (
            "float[1,2,2,2] y",
            r#"r = Constant <value = float[1,4] {0.0, 0.0, 1.0, 1.0}> ()
             b = Constant <value = int64[1] {0}> ()
             y0 = RoiAlign <output_height = 2, output_width = 2, mode = "median"> (x, r, b)
             y = Identity (y0)"#,
            "mode median",
        ),
        (
            "float[1,2,2,2] y",
            r#"r = Constant <value = float[1,3] {0.0, 0.0, 1.0}> ()
             b = Constant <value = int64[1] {0}> ()
             y = RoiAlign <output_height = 2, output_width = 2> (x, r, b)"#,
            "want [R, 4]",
        ),
        (
            "float[1,2,2,2] y",
            r#"r = Constant <value = float[1,4] {0.0, 0.0, 1.0, 1.0}> ()
             b = Constant <value = int64[1] {3}> ()
             y = RoiAlign <output_height = 2, output_width = 2> (x, r, b)"#,
            "batch index 3",
        ),
        (
            "float[1,2,3,3] y",
            r#"i = Constant <value = int64[1,2,2,2] {0, 1, 2, 3, 4, 5, 6, 7}> ()
             s = Constant <value = int64[4] {1, 2, 3, 3}> ()
             y = MaxUnpool <kernel_shape = [2, 2], strides = [2, 2]> (x, i, s)"#,
            "smaller than the unpooled shape",
        ),
        (
            "float[1,2,2,2] y",
            r#"i = Constant <value = int64[1,2,2,2] {0, 1, 2, 3, 4, 5, 6, 99}> ()
             y = MaxUnpool <kernel_shape = [1, 1]> (x, i)"#,
            "index 99",
        ),
        (
            "float[1,1,3,3] y",
            r#"c = Reshape (x, cs)
             img = Constant <value = int64[2] {3, 3}> ()
             blk = Constant <value = int64[2] {2, 2}> ()
             y = Col2Im (c, img, blk)"#,
            "blocks",
        ),
        (
            "float[1,2,2,2] y",
            r#"th = Constant <value = float[1,2,4] {1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0}> ()
             sz = Constant <value = int64[4] {1, 1, 2, 2}> ()
             y = AffineGrid (th, sz)"#,
            "theta",
        ),
    ] {
        let text = format!(
            r#"<ir_version: 10, opset_import: ["" : 20]>
            g (float[1,2,2,2] x) => ({decl}) {{
              cs = Constant <value = int64[3] {{1, 4, 2}}> ()
              {body}
            }}"#
        );
        let e = refusal(&text, &[t(&[1, 2, 2, 2], 7)]).unwrap_or_else(|| panic!("ran: {body}"));
        assert!(e.contains(why) && !e.contains('\n'), "{body}: {e}");
    }
}
