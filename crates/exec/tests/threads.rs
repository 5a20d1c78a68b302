//! The kernels that split work across threads (`cpu::par`), on tensors
//! large enough that they do split (above `par::MIN_ELEMS`, several im2col
//! tiles): every output is bit-for-bit the same at 1, 2, 3 and 4 threads
//! and from run to run, and the tiled and direct convolutions agree with a
//! naive loop written here.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_plan::{plan_model, DimValues, PlanOptions};

use graphopt_testutil::uniform as data;

fn t(shape: &[usize], seed: u64) -> HostTensor {
    HostTensor::from_f32(shape, &data(shape.iter().product(), seed))
}

/// The outputs' bytes at each thread count (twice at 2 threads).
fn runs(text: &str, inputs: &[HostTensor], threads: &[usize]) -> Vec<Vec<Vec<u8>>> {
    let m = graphopt_text::parse_model(text).expect("fixture parses");
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    threads
        .iter()
        .map(|&threads| {
            let opts = RunOptions {
                threads,
                poison: true,
            };
            let (out, _) = exe.run(inputs, &opts).unwrap();
            out.into_iter().map(|t| t.data.to_vec()).collect()
        })
        .collect()
}

fn same_bits_at_every_thread_count(text: &str, inputs: &[HostTensor]) -> Vec<Vec<f32>> {
    let all = runs(text, inputs, &[1, 2, 2, 3, 4]);
    for (k, r) in all.iter().enumerate().skip(1) {
        for (o, (a, b)) in all[0].iter().zip(r).enumerate() {
            assert!(
                a == b,
                "output {o} differs between run 0 (1 thread) and run {k}"
            );
        }
    }
    all[0]
        .iter()
        .map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .collect()
}

/// Naive 2-D convolution, NCHW, symmetric pads.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f32],
    xs: (usize, usize, usize, usize),
    wt: &[f32],
    ws: (usize, usize, usize),
    b: &[f32],
    group: usize,
    stride: usize,
    pad: usize,
) -> Vec<f32> {
    conv_ref_dilated(x, xs, wt, ws, b, group, stride, 1, pad)
}

/// [`conv_ref`] with dilation `dil`.
#[allow(clippy::too_many_arguments)]
fn conv_ref_dilated(
    x: &[f32],
    (n, c, h, w): (usize, usize, usize, usize),
    wt: &[f32],
    (m, kh, kw): (usize, usize, usize),
    b: &[f32],
    group: usize,
    stride: usize,
    dil: usize,
    pad: usize,
) -> Vec<f32> {
    let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
    let ow = (w + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
    let (cg, mg) = (c / group, m / group);
    let mut y = vec![0f32; n * m * oh * ow];
    for ni in 0..n {
        for mi in 0..m {
            let g = mi / mg;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0f64;
                    for ci in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let iy = (oy * stride + ki * dil) as isize - pad as isize;
                                let ix = (ox * stride + kj * dil) as isize - pad as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xv =
                                    x[((ni * c + g * cg + ci) * h + iy as usize) * w + ix as usize];
                                let wv = wt[((mi * cg + ci) * kh + ki) * kw + kj];
                                acc += (xv * wv) as f64;
                            }
                        }
                    }
                    y[((ni * m + mi) * oh + oy) * ow + ox] = acc as f32 + b[mi];
                }
            }
        }
    }
    y
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 2e-5 * (1.0 + w.abs()),
            "{what} element {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn convolutions_tiled_depthwise_grouped_and_1x1() {
    // 3x3 pad 1 on 4 channels at 130x130: k = 36, tiles of 7,280 columns,
    // 3 tiles per image; stride 2; depthwise stride 1 and 2; groups of 4
    // channels; and a 1x1 (plain GEMM, in output tiles), also with a Relu.
    let x = t(&[2, 8, 130, 130], 1);
    let w3 = t(&[16, 8, 3, 3], 2);
    let w3s = t(&[8, 8, 3, 3], 3);
    let wd = t(&[8, 1, 3, 3], 4);
    let wg = t(&[8, 4, 3, 3], 5);
    let w1 = t(&[16, 8, 1, 1], 6);
    let (b16, b8) = (t(&[16], 7), t(&[8], 8));
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,8,130,130] x, float[16,8,3,3] w3, float[8,8,3,3] w3s, float[8,1,3,3] wd,
           float[8,4,3,3] wg, float[16,8,1,1] w1, float[16] b16, float[8] b8)
          => (float[2,16,130,130] a, float[2,8,65,65] s, float[2,8,130,130] d,
              float[2,8,65,65] ds, float[2,8,130,130] gr, float[2,16,130,130] p,
              float[2,16,130,130] pr) {
          a = Conv <pads = [1,1,1,1]> (x, w3, b16)
          s = Conv <pads = [1,1,1,1], strides = [2,2]> (x, w3s, b8)
          d = Conv <pads = [1,1,1,1], group = 8> (x, wd, b8)
          ds = Conv <pads = [1,1,1,1], strides = [2,2], group = 8> (x, wd, b8)
          gr = Conv <pads = [1,1,1,1], group = 2> (x, wg, b8)
          p = Conv (x, w1, b16)
          q = Conv (x, w1, b16)
          pr = Relu (q)
        }"#,
        &[
            x.clone(),
            w3.clone(),
            w3s.clone(),
            wd.clone(),
            wg.clone(),
            w1.clone(),
            b16.clone(),
            b8.clone(),
        ],
    );
    let f = |t: &HostTensor| t.to_f32().unwrap();
    let xs = (2, 8, 130, 130);
    let xv = f(&x);
    close(
        &outs[0],
        &conv_ref(&xv, xs, &f(&w3), (16, 3, 3), &f(&b16), 1, 1, 1),
        "3x3",
    );
    close(
        &outs[1],
        &conv_ref(&xv, xs, &f(&w3s), (8, 3, 3), &f(&b8), 1, 2, 1),
        "3x3 stride 2",
    );
    close(
        &outs[2],
        &conv_ref(&xv, xs, &f(&wd), (8, 3, 3), &f(&b8), 8, 1, 1),
        "depthwise",
    );
    close(
        &outs[3],
        &conv_ref(&xv, xs, &f(&wd), (8, 3, 3), &f(&b8), 8, 2, 1),
        "depthwise stride 2",
    );
    close(
        &outs[4],
        &conv_ref(&xv, xs, &f(&wg), (8, 3, 3), &f(&b8), 2, 1, 1),
        "grouped",
    );
    close(
        &outs[5],
        &conv_ref(&xv, xs, &f(&w1), (16, 1, 1), &f(&b16), 1, 1, 0),
        "1x1",
    );
    // The 1x1 runs in output tiles (16 + 8 channels: 2,688 columns, 7
    // tiles), the Relu fused into each.
    let relu: Vec<f32> = outs[5].iter().map(|&v| v.max(0.0)).collect();
    assert!(outs[6] == relu, "1x1 with a fused Relu");
}

#[test]
fn products_elementwise_reductions_softmax_and_pooling() {
    let a = t(&[4, 96, 160], 11);
    let w = t(&[160, 200], 12);
    let bm = t(&[4, 160, 96], 13);
    let bias = t(&[1, 96, 1], 14);
    let row = t(&[160], 15);
    let img = t(&[2, 16, 64, 64], 16);
    let ch = t(&[1, 16, 1, 1], 17);
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[4,96,160] a, float[160,200] w, float[4,160,96] bm, float[1,96,1] bias,
           float[160] row, float[2,16,64,64] img, float[1,16,1,1] ch)
          => (float[4,96,200] mm, float[4,96,96] bmm, float[4,96,160] e, float[4,96,160] sm,
              float[4,1,160] r0, float[4,96,1] r2, float[1,96,1] r02, float[2,16,64,64] bc,
              float[2,16,32,32] mp, int64[2,16,32,32] mi, float[2,16,64,64] ln, float[16] rb) {
          mm = MatMul (a, w)
          bmm = MatMul (a, bm)
          s = Add (a, bias)
          r = Mul (s, row)
          e = Erf (r)
          sm = Softmax <axis = -1> (e)
          r0 = ReduceSum <axes = [1]> (e)
          r2 = ReduceMean <axes = [2]> (e)
          r02 = ReduceMax <axes = [0, 2]> (e)
          bc = Mul (img, ch)
          mp, mi = MaxPool <kernel_shape = [3,3], pads = [1,1,1,1], strides = [2,2]> (bc)
          ln = Sqrt (bc)
          rb = ReduceSum <axes = [0, 2, 3], keepdims = 0> (bc)
        }"#,
        &[a, w, bm, bias, row, img, ch],
    );
    assert_eq!(outs.len(), 12);
    // A bias gradient's reduction (kept axes between reduced ones): each
    // channel's sum in index order, the serial loop's bits.
    let bc = &outs[7];
    let want: Vec<f32> = (0..16)
        .map(|c| {
            let mut acc = 0f32;
            for n in 0..2 {
                for &v in &bc[(n * 16 + c) * 4096..][..4096] {
                    acc += v;
                }
            }
            acc
        })
        .collect();
    assert_eq!(outs[11], want);
}

#[test]
fn conv_transpose_in_row_tiles() {
    // k = 32 · 9 = 288 unfolded rows: tiles of 14 input rows of 64, 5 per
    // image; stride 2, pads 1, output_padding 1.
    let (n, c, h, w, m) = (2, 8, 64, 64, 32);
    let x = t(&[n, c, h, w], 21);
    let wt = t(&[c, m, 3, 3], 22);
    let b = t(&[m], 23);
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,8,64,64] x, float[8,32,3,3] w, float[32] b) => (float[2,32,128,128] y) {
          y = ConvTranspose <strides = [2,2], pads = [1,1,1,1], output_padding = [1,1]> (x, w, b)
        }"#,
        &[x.clone(), wt.clone(), b.clone()],
    );
    let (xv, wv, bv) = (
        x.to_f32().unwrap(),
        wt.to_f32().unwrap(),
        b.to_f32().unwrap(),
    );
    let (oh, ow) = (128, 128);
    let mut y = vec![0f64; n * m * oh * ow];
    for ni in 0..n {
        for ci in 0..c {
            for iy in 0..h {
                for ix in 0..w {
                    let xv = xv[((ni * c + ci) * h + iy) * w + ix] as f64;
                    for mi in 0..m {
                        for ki in 0..3 {
                            for kj in 0..3 {
                                let oy = (iy * 2 + ki) as isize - 1;
                                let ox = (ix * 2 + kj) as isize - 1;
                                if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                    continue;
                                }
                                let wv = wv[((ci * m + mi) * 3 + ki) * 3 + kj] as f64;
                                y[((ni * m + mi) * oh + oy as usize) * ow + ox as usize] += xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    let want: Vec<f32> = y
        .iter()
        .enumerate()
        .map(|(i, &v)| (v + bv[(i / (oh * ow)) % m] as f64) as f32)
        .collect();
    close(&outs[0], &want, "ConvTranspose");
}

#[test]
fn folded_convolutions_of_small_outputs_in_a_batch() {
    // Weights of at least 65,536 elements and small outputs in a batch:
    // 14x14 outputs of 4 images in runs of 3 and 1 (unfolded rows in 3
    // tiles), a 1x1 at 7x7 (4 images in one run), weight-gradient
    // shapes: a 26x26 kernel over 28x28 images (3x3 outputs, K = 5,408
    // unfolded rows in 3 tiles) and a 10x10 one over 12x12 images padded
    // by 1 (5x5 outputs), and 6x20 outputs (rows of more than 16 columns,
    // copied whole).
    let x = t(&[4, 128, 14, 14], 31);
    let w = t(&[64, 128, 3, 3], 32);
    let x7 = t(&[4, 256, 7, 7], 33);
    let w1 = t(&[256, 256, 1, 1], 34);
    let xg = t(&[16, 8, 28, 28], 35);
    let wg = t(&[32, 8, 26, 26], 36);
    let (b64, b256) = (t(&[64], 37), t(&[256], 38));
    let xw = t(&[2, 128, 6, 20], 39);
    let (xp, wp) = (t(&[8, 16, 12, 12], 40), t(&[64, 16, 10, 10], 41));
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[4,128,14,14] x, float[64,128,3,3] w, float[4,256,7,7] x7, float[256,256,1,1] w1,
           float[16,8,28,28] xg, float[32,8,26,26] wg, float[64] b64, float[256] b256,
           float[2,128,6,20] xw, float[8,16,12,12] xp, float[64,16,10,10] wp)
          => (float[4,64,14,14] a, float[4,256,7,7] p, float[16,32,3,3] d, float[2,64,6,20] e,
              float[8,64,5,5] dp) {
          a = Conv <pads = [1,1,1,1]> (x, w, b64)
          p = Conv (x7, w1, b256)
          d = Conv (xg, wg)
          e = Conv <pads = [1,1,1,1]> (xw, w, b64)
          dp = Conv <pads = [1,1,1,1]> (xp, wp)
        }"#,
        &[
            x.clone(),
            w.clone(),
            x7.clone(),
            w1.clone(),
            xg.clone(),
            wg.clone(),
            b64.clone(),
            b256.clone(),
            xw.clone(),
            xp.clone(),
            wp.clone(),
        ],
    );
    let f = |t: &HostTensor| t.to_f32().unwrap();
    close(
        &outs[0],
        &conv_ref(
            &f(&x),
            (4, 128, 14, 14),
            &f(&w),
            (64, 3, 3),
            &f(&b64),
            1,
            1,
            1,
        ),
        "folded 3x3",
    );
    close(
        &outs[1],
        &conv_ref(
            &f(&x7),
            (4, 256, 7, 7),
            &f(&w1),
            (256, 1, 1),
            &f(&b256),
            1,
            1,
            0,
        ),
        "folded 1x1",
    );
    let zeros = vec![0f32; 32];
    close(
        &outs[2],
        &conv_ref(
            &f(&xg),
            (16, 8, 28, 28),
            &f(&wg),
            (32, 26, 26),
            &zeros,
            1,
            1,
            0,
        ),
        "weight-gradient shape",
    );
    close(
        &outs[4],
        &conv_ref(
            &f(&xp),
            (8, 16, 12, 12),
            &f(&wp),
            (64, 10, 10),
            &[0f32; 64],
            1,
            1,
            1,
        ),
        "padded weight-gradient shape",
    );
    close(
        &outs[3],
        &conv_ref(
            &f(&xw),
            (2, 128, 6, 20),
            &f(&w),
            (64, 3, 3),
            &f(&b64),
            1,
            1,
            1,
        ),
        "folded 6x20",
    );
}

#[test]
fn wide_kernels_over_small_outputs_unfold_by_output_column() {
    // Kernels wider than the output (weight gradients: Conv(Xᵀ, dYᵀ)) on
    // the folded path unfold by output column: one dilated as resnet's
    // first conv's gradient (a 10x10 output of a 14x14 kernel, K = 1,568
    // unfolded rows in 3 tiles), a strided one padded by 1, and two
    // groups.
    let x1 = t(&[5, 8, 30, 30], 51);
    let w1 = t(&[64, 8, 14, 14], 52);
    let x2 = t(&[4, 8, 30, 30], 53);
    let w2 = t(&[64, 8, 12, 12], 54);
    let x3 = t(&[3, 16, 20, 20], 55);
    let w3 = t(&[128, 8, 18, 18], 56);
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[5,8,30,30] x1, float[64,8,14,14] w1, float[4,8,30,30] x2,
           float[64,8,12,12] w2, float[3,16,20,20] x3, float[128,8,18,18] w3)
          => (float[5,64,10,10] a, float[4,64,11,11] b, float[3,128,3,3] c) {
          a = Conv <dilations = [2,2], pads = [3,3,3,3]> (x1, w1)
          b = Conv <strides = [2,2], pads = [1,1,1,1]> (x2, w2)
          c = Conv <group = 2> (x3, w3)
        }"#,
        &[
            x1.clone(),
            w1.clone(),
            x2.clone(),
            w2.clone(),
            x3.clone(),
            w3.clone(),
        ],
    );
    let f = |t: &HostTensor| t.to_f32().unwrap();
    let want = conv_ref_dilated(
        &f(&x1),
        (5, 8, 30, 30),
        &f(&w1),
        (64, 14, 14),
        &[0.0; 64],
        1,
        1,
        2,
        3,
    );
    close(&outs[0], &want, "dilated");
    let want = conv_ref(
        &f(&x2),
        (4, 8, 30, 30),
        &f(&w2),
        (64, 12, 12),
        &[0.0; 64],
        1,
        2,
        1,
    );
    close(&outs[1], &want, "strided");
    let want = conv_ref(
        &f(&x3),
        (3, 16, 20, 20),
        &f(&w3),
        (128, 18, 18),
        &[0.0; 128],
        2,
        1,
        0,
    );
    close(&outs[2], &want, "grouped");
}

#[test]
fn transposes_masks_and_where() {
    let a = t(&[8, 64, 96], 41);
    let z = HostTensor::from_f32(&[], &[0.0]);
    let outs = runs(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[8,64,96] a, float z) => (float[64,8,96] tr, float[96,64,8] tt, bool[8,64,96] gt, float[8,64,96] wh) {
          tr = Transpose <perm = [1,0,2]> (a)
          tt = Transpose <perm = [2,1,0]> (a)
          gt = Greater (a, z)
          wh = Where (gt, a, z)
        }"#,
        &[a.clone(), z],
        &[1, 2, 3],
    );
    for r in &outs[1..] {
        assert!(r == &outs[0], "outputs differ between thread counts");
    }
    let av = a.to_f32().unwrap();
    let f = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let (tr, tt, wh) = (f(&outs[0][0]), f(&outs[0][1]), f(&outs[0][3]));
    for i in 0..8 {
        for j in 0..64 {
            for k in 0..96 {
                let v = av[(i * 64 + j) * 96 + k];
                assert_eq!(tr[(j * 8 + i) * 96 + k], v);
                assert_eq!(tt[(k * 64 + j) * 8 + i], v);
                assert_eq!(outs[0][2][(i * 64 + j) * 96 + k], (v > 0.0) as u8);
                assert_eq!(wh[(i * 64 + j) * 96 + k], if v > 0.0 { v } else { 0.0 });
            }
        }
    }
}

#[test]
fn dynamic_quantize_and_qdq_split_across_threads() {
    // DynamicQuantizeLinear's range is combined from per-part ranges;
    // QuantizeLinear / DequantizeLinear per tensor and per channel.
    let x = t(&[8, 64, 256], 51);
    let outs = runs(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[8,64,256] x) => (uint8[8,64,256] y, float s, uint8 z, float[8,64,256] dq, float[8,64,256] dc) {
          y, s, z = DynamicQuantizeLinear (x)
          dq = DequantizeLinear (y, s, z)
          sc = Constant <value = float[64] {0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04,0.01,0.02,0.03,0.04}> ()
          zc = Constant <value = int8[64] {0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2,0,1,-1,2}> ()
          qc = QuantizeLinear <axis = 1> (x, sc, zc)
          dc = DequantizeLinear <axis = 1> (qc, sc, zc)
        }"#,
        std::slice::from_ref(&x),
        &[1, 2, 3],
    );
    for r in &outs[1..] {
        assert!(r == &outs[0], "outputs differ between thread counts");
    }
    let xv = x.to_f32().unwrap();
    let lo = xv.iter().copied().fold(0.0f32, f32::min);
    let hi = xv.iter().copied().fold(0.0f32, f32::max);
    let s = f32::from_le_bytes(outs[0][1][..4].try_into().unwrap());
    assert_eq!(s, (hi - lo) / 255.0);
    let (y, z) = (&outs[0][0], outs[0][2][0] as f32);
    for (i, &v) in xv.iter().enumerate() {
        let q = ((v / s).round_ties_even() + z).clamp(0.0, 255.0) as u8;
        assert_eq!(y[i], q, "element {i}");
    }
}

#[test]
fn gemm_alpha_empty_k_and_empty_conv_outputs() {
    // alpha not 1 with a bias: rows split on 64-row boundaries, so the
    // micro-kernel's edge tiles (rounded differently) are the same rows at
    // every thread count. K = 0: c = beta·C with no operand read. A
    // folded-size Conv whose output is empty.
    let a = t(&[300, 300], 61);
    let b = t(&[300, 200], 62);
    let c = t(&[200], 63);
    let e = HostTensor::from_f32(&[64, 0], &[]);
    let f = HostTensor::from_f32(&[0, 2048], &[]);
    let x = t(&[2, 64, 2, 2], 64);
    let w = t(&[64, 64, 3, 3], 65);
    let bias = t(&[64], 66);
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[300,300] a, float[300,200] b, float[200] c, float[64,0] e, float[0,2048] f,
           float[2,64,2,2] x, float[64,64,3,3] w, float[64] bias)
          => (float[300,200] y, float[64,2048] z, float[2,64,0,0] v) {
          y = Gemm <alpha = 0.3, beta = 0.7> (a, b, c)
          z = MatMul (e, f)
          v = Conv (x, w, bias)
        }"#,
        &[a.clone(), b.clone(), c.clone(), e, f, x, w, bias],
    );
    assert!(outs[1].iter().all(|&v| v == 0.0) && outs[1].len() == 64 * 2048);
    assert!(outs[2].is_empty());
    let (av, bv, cv) = (
        a.to_f32().unwrap(),
        b.to_f32().unwrap(),
        c.to_f32().unwrap(),
    );
    for i in (0..300).step_by(37) {
        for j in (0..200).step_by(13) {
            let dot: f64 = (0..300)
                .map(|k| av[i * 300 + k] as f64 * bv[k * 200 + j] as f64)
                .sum();
            let want = 0.3 * dot + 0.7 * cv[j] as f64;
            let got = outs[0][i * 200 + j] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "({i}, {j}): {got} vs {want}"
            );
        }
    }
}

#[test]
fn small_output_convolutions_and_max_pooling_without_indices() {
    // 7x7 outputs (49 columns) on graphopt's own GEMM: a 3x3 whose
    // unfolded image is one tile (K = 4,608 fits 56 columns: the old
    // 16-column rounding cut 49 columns into 48 and 1, one tile per
    // thread), a strided one, and a 1x1 whose 200 rows split across
    // threads. MaxPool without indices takes the
    // branch-free path; with indices the general one, which must agree.
    let x = t(&[1, 512, 7, 7], 21);
    let w3 = t(&[200, 512, 3, 3], 22);
    let w1 = t(&[200, 512, 1, 1], 23);
    let b = t(&[200], 24);
    let xs = t(&[1, 512, 14, 14], 25);
    let mut img = data(2 * 8 * 29 * 29, 26);
    img[100] = f32::NAN;
    let img = HostTensor::from_f32(&[2, 8, 29, 29], &img);
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,512,7,7] x, float[200,512,3,3] w3, float[200,512,1,1] w1, float[200] b,
           float[1,512,14,14] xs, float[2,8,29,29] img)
          => (float[1,200,7,7] a, float[1,200,7,7] p, float[1,200,7,7] s,
              float[2,8,15,15] mp, float[2,8,15,15] mpi, int64[2,8,15,15] mi) {
          a = Conv <pads = [1,1,1,1]> (x, w3, b)
          p = Conv (x, w1, b)
          s = Conv <pads = [1,1,1,1], strides = [2,2]> (xs, w3, b)
          mp = MaxPool <kernel_shape = [3,3], pads = [1,1,1,1], strides = [2,2]> (img)
          mpi, mi = MaxPool <kernel_shape = [3,3], pads = [1,1,1,1], strides = [2,2]> (img)
        }"#,
        &[
            x.clone(),
            w3.clone(),
            w1.clone(),
            b.clone(),
            xs.clone(),
            img.clone(),
        ],
    );
    let f = |t: &HostTensor| t.to_f32().unwrap();
    let (xv, bv) = (f(&x), f(&b));
    close(
        &outs[0],
        &conv_ref(&xv, (1, 512, 7, 7), &f(&w3), (200, 3, 3), &bv, 1, 1, 1),
        "7x7 3x3",
    );
    close(
        &outs[1],
        &conv_ref(&xv, (1, 512, 7, 7), &f(&w1), (200, 1, 1), &bv, 1, 1, 0),
        "7x7 1x1",
    );
    close(
        &outs[2],
        &conv_ref(
            &f(&xs),
            (1, 512, 14, 14),
            &f(&w3),
            (200, 3, 3),
            &bv,
            1,
            2,
            1,
        ),
        "3x3 stride 2",
    );
    // Same values, NaN in the same places (the plane with the NaN goes
    // the general way, and its NaN wins its windows).
    let bits = |v: &[f32]| {
        v.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&outs[3]), bits(&outs[4]));
    assert!(outs[3].iter().any(|v| v.is_nan()) && outs[3][15 * 15..].iter().all(|v| !v.is_nan()));
}

#[test]
fn one_row_products_on_the_matrix_vector_kernel() {
    // M = 1: a classifier's Gemm (transB = 1, the weight [N, K], alpha and
    // a bias), a decoding MatMul ([K, N] row-major) and a batched MatMul
    // of one-row matrices; K crosses the 256-deep blocks, N several
    // 64-column parts.
    let x = t(&[1, 700], 71);
    let w = t(&[300, 700], 72);
    let bias = t(&[300], 73);
    let wm = t(&[700, 300], 74);
    let xb = t(&[4, 1, 700], 75);
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,700] x, float[300,700] w, float[300] bias, float[700,300] wm, float[4,1,700] xb)
          => (float[1,300] y, float[1,300] z, float[4,1,300] v) {
          y = Gemm <transB = 1, alpha = 0.5> (x, w, bias)
          z = MatMul (x, wm)
          v = MatMul (xb, wm)
        }"#,
        &[x.clone(), w.clone(), bias.clone(), wm.clone(), xb.clone()],
    );
    let (xv, wv, bv, wmv, xbv) = (
        x.to_f32().unwrap(),
        w.to_f32().unwrap(),
        bias.to_f32().unwrap(),
        wm.to_f32().unwrap(),
        xb.to_f32().unwrap(),
    );
    let dot = |a: &[f32], b: &dyn Fn(usize) -> f32| -> f64 {
        (0..700).map(|k| a[k] as f64 * b(k) as f64).sum()
    };
    let mut worst = 0f64;
    for j in 0..300 {
        let want = [
            0.5 * dot(&xv, &|k| wv[j * 700 + k]) + bv[j] as f64,
            dot(&xv, &|k| wmv[k * 300 + j]),
        ];
        for (o, want) in want.into_iter().enumerate() {
            worst = worst.max((outs[o][j] as f64 - want).abs() / (1.0 + want.abs()));
        }
        for i in 0..4 {
            let want = dot(&xbv[i * 700..], &|k| wmv[k * 300 + j]);
            worst = worst.max((outs[2][i * 300 + j] as f64 - want).abs() / (1.0 + want.abs()));
        }
    }
    // Measured 4.6e-6 (f32 sums of 700 products against f64).
    assert!(worst <= 1.5e-5, "worst relative error {worst:e}");
}

/// ConvTranspose by its definition (stride 1, pads `p`), f64 sums.
#[allow(clippy::too_many_arguments)]
fn conv_transpose_ref(
    x: &[f32],
    (n, c, h, w): (usize, usize, usize, usize),
    wt: &[f32],
    (mg, k): (usize, usize),
    b: &[f32],
    group: usize,
    p: usize,
) -> Vec<f32> {
    let (oh, ow) = (h + k - 1 - 2 * p, w + k - 1 - 2 * p);
    let (cg, m) = (c / group, mg * group);
    let mut y = vec![0f64; n * m * oh * ow];
    for ni in 0..n {
        for ci in 0..c {
            let g = ci / cg;
            for iy in 0..h {
                for ix in 0..w {
                    let xv = x[((ni * c + ci) * h + iy) * w + ix] as f64;
                    for mo in 0..mg {
                        for ki in 0..k {
                            for kj in 0..k {
                                let (oy, ox) = (
                                    (iy + ki) as isize - p as isize,
                                    (ix + kj) as isize - p as isize,
                                );
                                if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                    continue;
                                }
                                let wv = wt[((ci * mg + mo) * k + ki) * k + kj] as f64;
                                y[((ni * m + g * mg + mo) * oh + oy as usize) * ow
                                    + ox as usize] += xv * wv;
                            }
                        }
                    }
                }
            }
        }
    }
    y.iter()
        .enumerate()
        .map(|(i, &v)| (v + b[(i / (oh * ow)) % m] as f64) as f32)
        .collect()
}

#[test]
fn stride_one_conv_transpose_runs_as_a_flipped_conv() {
    // Stride 1 with a weight under 1 MB runs as a Conv on the flipped
    // weight: with a bias, on the folded path (4 images of 10x10 outputs,
    // 64 x 1,152 weights), and in 2 groups.
    let x = t(&[4, 128, 10, 10], 51);
    let w = t(&[128, 64, 3, 3], 52);
    let w2 = t(&[128, 32, 3, 3], 53);
    let b = t(&[64], 54);
    let outs = same_bits_at_every_thread_count(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[4,128,10,10] x, float[128,64,3,3] w, float[128,32,3,3] w2, float[64] b)
          => (float[4,64,10,10] y, float[4,64,10,10] y2) {
          y = ConvTranspose <pads = [1,1,1,1]> (x, w, b)
          y2 = ConvTranspose <pads = [1,1,1,1], group = 2> (x, w2, b)
        }"#,
        &[x.clone(), w.clone(), w2.clone(), b.clone()],
    );
    let f = |t: &HostTensor| t.to_f32().unwrap();
    let dims = (4, 128, 10, 10);
    close(
        &outs[0],
        &conv_transpose_ref(&f(&x), dims, &f(&w), (64, 3), &f(&b), 1, 1),
        "flipped",
    );
    close(
        &outs[1],
        &conv_transpose_ref(&f(&x), dims, &f(&w2), (32, 3), &f(&b), 2, 1),
        "flipped, 2 groups",
    );
}
