//! Property tests of the convolution kernels (`cpu/conv.rs`: direct 1x1,
//! depthwise, tiled im2col, grouped; ConvTranspose in row tiles) on random
//! shapes and attributes that shape inference accepts: asymmetric pads,
//! strides, dilations, groups, output_padding, 1-D and 2-D. Each case must
//! run without a panic, agree with a naive loop written here, and give the
//! same bits on 1 and 3 threads.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_plan::{plan_model, DimValues, PlanOptions};
use proptest::prelude::*;

use graphopt_testutil::uniform as data;

fn dims(v: &[usize]) -> String {
    v.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs a one-node model at 1 and 3 threads (planning must accept it: the
/// generated attributes are valid).
fn run(text: &str, inputs: &[HostTensor]) -> Vec<f32> {
    let m = graphopt_text::parse_model(text).expect("generated model parses");
    let mp = match plan_model(&m, &DimValues::default(), &PlanOptions::default()) {
        Ok(p) => p,
        Err(e) => panic!("{e}\n{text}"),
    };
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("kernel made");
    let mut outs = [1, 3].map(|threads| {
        let (o, _) = exe
            .run(
                inputs,
                &RunOptions {
                    threads,
                    poison: true,
                },
            )
            .expect("runs");
        o[0].data.to_vec()
    });
    assert!(outs[0] == outs[1], "1 and 3 threads differ");
    let b = std::mem::take(&mut outs[0]);
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn close(got: &[f32], want: &[f64]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "element {}: {} vs {}",
            i,
            g,
            w
        );
    }
    Ok(())
}

/// Position `o·s + k·d - p` of a window tap (output `o`, tap `k`, stride
/// `s`, dilation `d`, begin pad `p`) when it lies in `0..n`.
fn tap(o: usize, k: usize, s: usize, d: usize, p: usize, n: usize) -> Option<usize> {
    (o * s + k * d).checked_sub(p).filter(|&i| i < n)
}

#[derive(Debug, Clone)]
struct Geom {
    n: usize,
    group: usize,
    cg: usize,
    mg: usize,
    sp: Vec<usize>,
    k: Vec<usize>,
    s: Vec<usize>,
    d: Vec<usize>,
    pads: Vec<usize>,
}

fn geom() -> impl Strategy<Value = Geom> {
    (1usize..=2, 1usize..=2)
        .prop_flat_map(|(rank, n)| {
            (
                Just(n),
                prop_oneof![Just((1usize, 0usize)), Just((2, 0)), Just((0, 1))],
                1usize..=3,
                1usize..=3,
                // Sizes up to 9, and 33-45 (the depthwise kernel's
                // blocks of 32 and 8 columns).
                proptest::collection::vec(prop_oneof![1usize..=9, 33usize..=45], rank),
                proptest::collection::vec(1usize..=3, rank),
                proptest::collection::vec(1usize..=3, rank),
                proptest::collection::vec(1usize..=2, rank),
                proptest::collection::vec(0usize..=2, 2 * rank),
            )
        })
        .prop_map(|(n, (group, depthwise), cg, mg, sp, k, s, d, pads)| {
            // depthwise: group = channels, one in and one out per group.
            let (group, cg, mg) = if depthwise == 1 {
                (cg + 1, 1, 1)
            } else {
                (group, cg, mg)
            };
            Geom {
                n,
                group,
                cg,
                mg,
                sp,
                k,
                s,
                d,
                pads,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn conv_matches_a_naive_loop(g in geom(), seed in 0u64..1000) {
        let r = g.sp.len();
        let (c, m) = (g.group * g.cg, g.group * g.mg);
        let out_sp: Vec<isize> = (0..r)
            .map(|i| {
                let span = g.d[i] * (g.k[i] - 1) + 1;
                (g.sp[i] + g.pads[i] + g.pads[r + i]) as isize - span as isize
            })
            .map(|x| if x < 0 { -1 } else { x })
            .collect();
        prop_assume!(out_sp.iter().all(|&x| x >= 0));
        let out_sp: Vec<usize> = (0..r).map(|i| out_sp[i] as usize / g.s[i] + 1).collect();
        let xs: Vec<usize> = [vec![g.n, c], g.sp.clone()].concat();
        let ws: Vec<usize> = [vec![m, g.cg], g.k.clone()].concat();
        let ys: Vec<usize> = [vec![g.n, m], out_sp.clone()].concat();
        let text = format!(
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[{}] x, float[{}] w, float[{m}] b) => (float[{}] y) {{
              y = Conv <pads = [{}], strides = [{}], dilations = [{}], group = {}> (x, w, b)
            }}"#,
            dims(&xs), dims(&ws), dims(&ys), dims(&g.pads), dims(&g.s), dims(&g.d), g.group
        );
        let (xv, wv, bv) = (data(xs.iter().product(), seed), data(ws.iter().product(), seed + 1), data(m, seed + 2));
        let inputs = [HostTensor::from_f32(&xs, &xv), HostTensor::from_f32(&ws, &wv), HostTensor::from_f32(&[m], &bv)];
        let got = run(&text, &inputs);
        // 1-D as 2-D with height 1.
        let p = |v: &[usize], one: usize| if r == 1 { (one, v[0]) } else { (v[0], v[1]) };
        let ((h, w), (kh, kw), (sh, sw), (dh, dw)) = (p(&g.sp, 1), p(&g.k, 1), p(&g.s, 1), p(&g.d, 1));
        let (ph, pw) = if r == 1 { (0, g.pads[0]) } else { (g.pads[0], g.pads[1]) };
        let (oh, ow) = p(&out_sp, 1);
        let mut want = vec![0f64; g.n * m * oh * ow];
        // Depthwise planes sum in f32 in (ki, kj) order after the bias, one
        // fused multiply-add per tap, padded taps adding w·0, as the kernel
        // does (stride 2 included, through its phased rows): the same bits.
        let mut want32 = vec![0f32; g.n * m * oh * ow];
        for ni in 0..g.n {
            for mi in 0..m {
                let gi = mi / g.mg;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = bv[mi] as f64;
                        let mut acc32 = bv[mi];
                        for ci in 0..g.cg {
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let wval = wv[((mi * g.cg + ci) * kh + ki) * kw + kj];
                                    let (Some(iy), Some(ix)) = (tap(oy, ki, sh, dh, ph, h), tap(ox, kj, sw, dw, pw, w)) else {
                                        // A padded tap adds w·0 to the f32 sum.
                                        acc32 = wval.mul_add(0.0, acc32);
                                        continue;
                                    };
                                    let xval = xv[((ni * c + gi * g.cg + ci) * h + iy) * w + ix];
                                    acc += xval as f64 * wval as f64;
                                    acc32 = wval.mul_add(xval, acc32);
                                }
                            }
                        }
                        want[((ni * m + mi) * oh + oy) * ow + ox] = acc;
                        want32[((ni * m + mi) * oh + oy) * ow + ox] = acc32;
                    }
                }
            }
        }
        close(&got, &want)?;
        // (A 1x1 window of stride 1 without padding multiplies through
        // the GEMM instead: a product, then the bias added.)
        let plain = g.k.iter().all(|&k| k == 1) && g.s.iter().all(|&s| s == 1) && g.pads.iter().all(|&p| p == 0);
        if g.cg == 1 && g.mg == 1 && g.group > 1 && !plain {
            prop_assert!(got.iter().zip(&want32).all(|(a, b)| a.to_bits() == b.to_bits()), "depthwise bits");
        }
    }

    #[test]
    fn conv_transpose_matches_a_naive_loop(g in geom(), adj in proptest::collection::vec(0usize..=2, 2), seed in 0u64..1000) {
        let r = g.sp.len();
        let (c, m) = (g.group * g.cg, g.group * g.mg);
        // output_padding must be below the stride or the dilation.
        let adj: Vec<usize> = (0..r).map(|i| adj[i] % g.s[i].max(g.d[i])).collect();
        let out_sp: Vec<isize> = (0..r)
            .map(|i| {
                (g.s[i] * (g.sp[i] - 1) + adj[i] + (g.k[i] - 1) * g.d[i] + 1) as isize
                    - (g.pads[i] + g.pads[r + i]) as isize
            })
            .collect();
        prop_assume!(out_sp.iter().all(|&x| x >= 1));
        let out_sp: Vec<usize> = out_sp.iter().map(|&x| x as usize).collect();
        let xs: Vec<usize> = [vec![g.n, c], g.sp.clone()].concat();
        let ws: Vec<usize> = [vec![c, g.mg], g.k.clone()].concat();
        let ys: Vec<usize> = [vec![g.n, m], out_sp.clone()].concat();
        let text = format!(
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[{}] x, float[{}] w) => (float[{}] y) {{
              y = ConvTranspose <pads = [{}], strides = [{}], dilations = [{}], group = {}, output_padding = [{}]> (x, w)
            }}"#,
            dims(&xs), dims(&ws), dims(&ys), dims(&g.pads), dims(&g.s), dims(&g.d), g.group, dims(&adj)
        );
        let (xv, wv) = (data(xs.iter().product(), seed), data(ws.iter().product(), seed + 1));
        let inputs = [HostTensor::from_f32(&xs, &xv), HostTensor::from_f32(&ws, &wv)];
        let got = run(&text, &inputs);
        let p = |v: &[usize], one: usize| if r == 1 { (one, v[0]) } else { (v[0], v[1]) };
        let ((h, w), (kh, kw), (sh, sw), (dh, dw)) = (p(&g.sp, 1), p(&g.k, 1), p(&g.s, 1), p(&g.d, 1));
        let (ph, pw) = if r == 1 { (0, g.pads[0]) } else { (g.pads[0], g.pads[1]) };
        let (oh, ow) = p(&out_sp, 1);
        let mut want = vec![0f64; g.n * m * oh * ow];
        for ni in 0..g.n {
            for ci in 0..c {
                let gi = ci / g.cg;
                for iy in 0..h {
                    for ix in 0..w {
                        let xval = xv[((ni * c + ci) * h + iy) * w + ix] as f64;
                        for mj in 0..g.mg {
                            let mi = gi * g.mg + mj;
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let (Some(oy), Some(ox)) = (tap(iy, ki, sh, dh, ph, oh), tap(ix, kj, sw, dw, pw, ow)) else {
                                        continue;
                                    };
                                    let wval = wv[((ci * g.mg + mj) * kh + ki) * kw + kj] as f64;
                                    want[((ni * m + mi) * oh + oy) * ow + ox] += xval * wval;
                                }
                            }
                        }
                    }
                }
            }
        }
        close(&got, &want)?;
    }
}

/// MaxPool's values and Indices (both storage orders) against the naive
/// loop of its definition: taps in row-major window order, the first
/// strict maximum wins, a NaN wins over numbers, a window wholly in the
/// padding gives -inf at index `p·H·W`. Values are coarse (ties are
/// common) with -inf and NaN now and then, so the tap passes' fallback
/// and their first-maximum rule are both exercised; bits must match.
fn maxpool_case(g: &Geom, order: usize, special: usize, seed: u64) -> Result<(), TestCaseError> {
    let r = g.sp.len();
    let c = g.group * g.cg;
    let out_sp: Vec<isize> = (0..r)
        .map(|i| {
            let span = g.d[i] * (g.k[i] - 1) + 1;
            (g.sp[i] + g.pads[i] + g.pads[r + i]) as isize - span as isize
        })
        .collect();
    prop_assume!(out_sp.iter().all(|&x| x >= 0));
    // Pads smaller than the kernel, as ONNX requires.
    prop_assume!((0..r).all(|i| g.pads[i] < g.k[i] && g.pads[r + i] < g.k[i]));
    let out_sp: Vec<usize> = (0..r).map(|i| out_sp[i] as usize / g.s[i] + 1).collect();
    let xs: Vec<usize> = [vec![g.n, c], g.sp.clone()].concat();
    let ys: Vec<usize> = [vec![g.n, c], out_sp.clone()].concat();
    let text = format!(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[{}] x) => (float[{}] y, int64[{}] i) {{
          y, i = MaxPool <kernel_shape = [{}], pads = [{}], strides = [{}], dilations = [{}], storage_order = {order}> (x)
        }}"#,
        dims(&xs),
        dims(&ys),
        dims(&ys),
        dims(&g.k),
        dims(&g.pads),
        dims(&g.s),
        dims(&g.d)
    );
    let mut xv: Vec<f32> = data(xs.iter().product(), seed)
        .iter()
        .map(|v| (v * 4.0).round() / 4.0)
        .collect();
    if special > 0 {
        let at = (seed as usize * 7919) % xv.len();
        xv[at] = if special == 1 {
            f32::NEG_INFINITY
        } else {
            f32::NAN
        };
    }
    let m = graphopt_text::parse_model(&text).expect("generated model parses");
    let mp = match plan_model(&m, &DimValues::default(), &PlanOptions::default()) {
        Ok(p) => p,
        Err(e) => panic!("{e}\n{text}"),
    };
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("kernel made");
    let x = HostTensor::from_f32(&xs, &xv);
    let p = |v: &[usize], one: usize| if r == 1 { (one, v[0]) } else { (v[0], v[1]) };
    let ((h, w), (kh, kw), (sh, sw), (dh, dw)) = (p(&g.sp, 1), p(&g.k, 1), p(&g.s, 1), p(&g.d, 1));
    let (ph, pw) = if r == 1 {
        (0, g.pads[0])
    } else {
        (g.pads[0], g.pads[1])
    };
    let (oh, ow) = p(&out_sp, 1);
    let (mut wy, mut wi) = (Vec::new(), Vec::new());
    for plane in 0..g.n * c {
        for oy in 0..oh {
            for ox in 0..ow {
                let (mut acc, mut arg, mut cnt) = (f32::NEG_INFINITY, 0usize, 0);
                for ki in 0..kh {
                    for kj in 0..kw {
                        let (Some(iy), Some(ix)) =
                            (tap(oy, ki, sh, dh, ph, h), tap(ox, kj, sw, dw, pw, w))
                        else {
                            continue;
                        };
                        let v = xv[plane * h * w + iy * w + ix];
                        if v > acc || (v.is_nan() && !acc.is_nan()) || cnt == 0 {
                            acc = v;
                            arg = if order == 1 { ix * h + iy } else { iy * w + ix };
                        }
                        cnt += 1;
                    }
                }
                wy.push(acc.to_bits());
                wi.push((plane * h * w + arg) as i64);
            }
        }
    }
    for threads in [1, 3] {
        let (o, _) = exe
            .run(
                std::slice::from_ref(&x),
                &RunOptions {
                    threads,
                    poison: true,
                },
            )
            .expect("runs");
        let gy: Vec<u32> = o[0]
            .data
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let gi: Vec<i64> = o[1]
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        prop_assert_eq!(&gy, &wy, "values, {} threads\n{}", threads, text);
        prop_assert_eq!(&gi, &wi, "indices, {} threads\n{}", threads, text);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn maxpool_and_its_indices_match_a_naive_loop(g in geom(), order in 0usize..=1, special in 0usize..=3, seed in 0u64..1000) {
        // special: 0 or 3 plain, 1 one -inf, 2 one NaN.
        maxpool_case(&g, order, special % 3, seed)?;
    }
}
