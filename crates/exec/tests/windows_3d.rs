//! Conv, ConvTranspose and pooling over three spatial dims (video and
//! volumetric models) against naive reference loops written here: groups,
//! strides, dilations and asymmetric pads; stride-2 ConvTranspose with
//! output_padding; MaxPool's Indices; and property tests of Conv and the
//! three pools on random windows (no panic, the loops' values, the same
//! bits on 1 and 3 threads). Each model runs through the whole runtime
//! (planned arena, poison on). The ONNX node tests cover the 3-D
//! pools and one ConvTranspose; none has a 3-D Conv.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_plan::{plan_model, DimValues, PlanOptions};
use graphopt_testutil::uniform as data;

fn run(text: &str, inputs: &[HostTensor]) -> Vec<HostTensor> {
    let m = graphopt_text::parse_model(text).expect("fixture parses");
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let opts = RunOptions {
        threads: 2,
        poison: true,
    };
    exe.run(inputs, &opts).unwrap().0
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

/// Flat index of `c` in `dims` (row-major).
fn flat(c: &[usize], dims: &[usize]) -> usize {
    c.iter().zip(dims).fold(0, |a, (&i, &d)| a * d + i)
}

/// Every coordinate of `dims`, row-major.
fn coords(dims: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = dims.iter().product();
    (0..n)
        .map(|mut f| {
            let mut c = vec![0; dims.len()];
            for d in (0..dims.len()).rev() {
                c[d] = f % dims[d];
                f /= dims[d];
            }
            c
        })
        .collect()
}

struct Geo {
    x: Vec<usize>,
    w: Vec<usize>,
    y: Vec<usize>,
    group: usize,
    s: Vec<usize>,
    d: Vec<usize>,
    begin: Vec<usize>,
}

/// The convolution in f64, and each output's sum of absolute terms (the
/// scale of its f32 rounding).
fn conv_ref(x: &[f32], w: &[f32], b: &[f32], g: &Geo) -> (Vec<f32>, Vec<f64>) {
    let (cg, m) = (g.w[1], g.w[0]);
    let mg = m / g.group;
    let mut y = vec![0.0; g.y.iter().product()];
    let mut scale = vec![0.0; y.len()];
    for n in 0..g.x[0] {
        for mi in 0..m {
            let gi = mi / mg;
            for oc in coords(&g.y[2..]) {
                let mut acc = b[mi] as f64;
                let mut abs = acc.abs();
                for ci in 0..cg {
                    for kc in coords(&g.w[2..]) {
                        let ic: Vec<isize> = (0..3)
                            .map(|d| {
                                (oc[d] * g.s[d] + kc[d] * g.d[d]) as isize - g.begin[d] as isize
                            })
                            .collect();
                        if (0..3).any(|d| ic[d] < 0 || ic[d] as usize >= g.x[2 + d]) {
                            continue;
                        }
                        let ic: Vec<usize> = ic.iter().map(|&i| i as usize).collect();
                        let xv = x[flat(&[&[n, gi * cg + ci][..], &ic].concat(), &g.x)] as f64;
                        let t = xv * w[flat(&[&[mi, ci][..], &kc].concat(), &g.w)] as f64;
                        acc += t;
                        abs += t.abs();
                    }
                }
                let f = flat(&[&[n, mi][..], &oc].concat(), &g.y);
                y[f] = acc as f32;
                scale[f] = abs;
            }
        }
    }
    (y, scale)
}

/// Within f32 rounding of sums of `scale` in absolute terms.
fn close_sums(got: &[f32], (want, scale): &(Vec<f32>, Vec<f64>)) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-6 + 4e-6 * scale[i];
        assert!(
            ((g - w).abs() as f64) <= tol,
            "element {i}: got {g}, want {w} (tolerance {tol:e})"
        );
    }
}

/// One Conv of geometry `g` (its attributes written as `attrs`) on data
/// from `seed`, run at 1 and 3 threads, against [`conv_ref`].
fn check_conv(g: &Geo, attrs: &str, seed: u64) {
    let m = g.w[0];
    let text = format!(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[{}] x, float[{}] w, float[{m}] b) => (float[{}] y) {{
          y = Conv <{attrs}> (x, w, b)
        }}"#,
        dims(&g.x),
        dims(&g.w),
        dims(&g.y)
    );
    let (x, w, b) = (t(&g.x, seed), t(&g.w, seed + 1), t(&[m], seed + 2));
    let got = run_threads(&text, &[x.clone(), w.clone(), b.clone()]);
    assert_eq!(got[0].shape, g.y);
    let want = conv_ref(
        &x.to_f32().unwrap(),
        &w.to_f32().unwrap(),
        &b.to_f32().unwrap(),
        g,
    );
    close_sums(&got[0].to_f32().unwrap(), &want);
}

#[test]
fn conv_3d_groups_strides_dilations_asymmetric_pads() {
    let g = Geo {
        x: vec![2, 4, 5, 6, 7],
        w: vec![6, 2, 2, 3, 2],
        // D: (5 + 1 + 0 - 2) / 1 + 1 = 5; H: (6 + 1 + 2 - 5) / 2 + 1 = 3;
        // W: (7 + 0 + 1 - 2) / 3 + 1 = 3.
        y: vec![2, 6, 5, 3, 3],
        group: 2,
        s: vec![1, 2, 3],
        d: vec![1, 2, 1],
        begin: vec![1, 1, 0],
    };
    let attrs = "group = 2, strides = [1, 2, 3], dilations = [1, 2, 1], pads = [1, 1, 0, 0, 2, 1]";
    check_conv(&g, attrs, 1);
}

#[test]
fn conv_3d_same_upper_with_a_large_volume_spans_several_tiles() {
    // 32 input channels x 27 taps = 864 rows; 4 x 25 x 25 = 2500
    // positions: a 1 MiB tile holds 288 of them, so 9 tiles, taken by
    // the threads in turns (check_conv runs it at 1 and 3 threads).
    let g = Geo {
        x: vec![1, 32, 4, 25, 25],
        w: vec![2, 32, 3, 3, 3],
        y: vec![1, 2, 4, 25, 25],
        group: 1,
        s: vec![1, 1, 1],
        d: vec![1, 1, 1],
        begin: vec![1, 1, 1],
    };
    check_conv(&g, r#"auto_pad = "SAME_UPPER""#, 4);
}

/// The property test's first find: a last dim of 1 with a begin pad of 2
/// leaves some unfold runs with no tap inside the row (their start index
/// was computed outside it and panicked).
#[test]
fn conv_3d_whose_taps_miss_a_padded_one_wide_row() {
    let g = Geo {
        x: vec![1, 1, 5, 1, 1],
        w: vec![1, 1, 1, 2, 3],
        // H: 1 + 1 + 0 - 2 + 1 = 1; W: 1 + 2 + 0 - 3 + 1 = 1.
        y: vec![1, 1, 5, 1, 1],
        group: 1,
        s: vec![1, 1, 1],
        d: vec![1, 1, 1],
        begin: vec![0, 1, 2],
    };
    check_conv(&g, "pads = [0, 1, 2, 0, 0, 0]", 11);
}

#[test]
fn conv_transpose_3d_stride_two_with_output_padding_and_groups() {
    let (x, w, b) = (t(&[1, 4, 3, 4, 2], 7), t(&[4, 3, 3, 2, 3], 8), t(&[6], 9));
    // Out per dim: s·(in - 1) + out_pad + (k - 1)·d + 1 - pads.
    // D: 2·2 + 1 + 2 + 1 - 1 - 1 = 6; H: 2·3 + 0 + 1 + 1 - 0 - 1 = 7;
    // W: 1·1 + 0 + 2·2 + 1 - 0 - 0 = 6.
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,3,4,2] x, float[4,3,3,2,3] w, float[6] b) => (float[1,6,6,7,6] y) {
          y = ConvTranspose <group = 2, strides = [2, 2, 1], dilations = [1, 1, 2], output_padding = [1, 0, 0], pads = [1, 0, 0, 1, 1, 0]> (x, w, b)
        }"#,
        &[x.clone(), w.clone(), b.clone()],
    );
    assert_eq!(got[0].shape, [1, 6, 6, 7, 6]);
    let (xv, wv, bv) = (
        x.to_f32().unwrap(),
        w.to_f32().unwrap(),
        b.to_f32().unwrap(),
    );
    let (s, d, begin) = ([2, 2, 1], [1, 1, 2], [1usize, 0, 0]);
    let ydims = [1, 6, 6, 7, 6];
    let mut want = vec![0.0f32; ydims.iter().product()];
    for mi in 0..6 {
        for oc in coords(&ydims[2..]) {
            want[flat(&[&[0, mi][..], &oc].concat(), &ydims)] = bv[mi];
        }
    }
    let (cg, mg) = (2, 3);
    for ci in 0..4 {
        let gi = ci / cg;
        for ic in coords(&[3, 4, 2]) {
            let xv = xv[flat(&[&[0, ci][..], &ic].concat(), &[1, 4, 3, 4, 2])];
            for mj in 0..mg {
                for kc in coords(&[3, 2, 3]) {
                    let oc: Vec<isize> = (0..3)
                        .map(|k| (ic[k] * s[k] + kc[k] * d[k]) as isize - begin[k] as isize)
                        .collect();
                    if (0..3).any(|k| oc[k] < 0 || oc[k] as usize >= ydims[2 + k]) {
                        continue;
                    }
                    let oc: Vec<usize> = oc.iter().map(|&o| o as usize).collect();
                    let wv = wv[flat(&[&[ci, mj][..], &kc].concat(), &[4, 3, 3, 2, 3])];
                    want[flat(&[&[0, gi * mg + mj][..], &oc].concat(), &ydims)] += xv * wv;
                }
            }
        }
    }
    close(&got[0].to_f32().unwrap(), &want);
}

#[test]
fn max_pool_3d_indices_and_average_pool_3d_pads() {
    let x = t(&[1, 2, 4, 5, 6], 10);
    let got = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,2,4,5,6] x) => (float[1,2,2,2,3] y, int64[1,2,2,2,3] i, float[1,2,4,5,6] a) {
          y, i = MaxPool <kernel_shape = [2, 3, 2], strides = [2, 2, 2]> (x)
          a = AveragePool <kernel_shape = [3, 3, 3], pads = [1, 1, 1, 1, 1, 1], count_include_pad = 0> (x)
        }"#,
        std::slice::from_ref(&x),
    );
    let xv = x.to_f32().unwrap();
    let dims = [1, 2, 4, 5, 6];
    let (mut y, mut idx, mut a) = (Vec::new(), Vec::new(), Vec::new());
    for c in 0..2 {
        for oc in coords(&[2, 2, 3]) {
            let mut best = (f32::NEG_INFINITY, 0usize);
            for kc in coords(&[2, 3, 2]) {
                let ic = [oc[0] * 2 + kc[0], oc[1] * 2 + kc[1], oc[2] * 2 + kc[2]];
                let f = flat(&[&[0, c][..], &ic].concat(), &dims);
                if xv[f] > best.0 {
                    best = (xv[f], f);
                }
            }
            y.push(best.0);
            idx.push(best.1 as i64);
        }
        for oc in coords(&[4, 5, 6]) {
            let (mut s, mut n) = (0.0, 0);
            for kc in coords(&[3, 3, 3]) {
                let ic: Vec<isize> = (0..3).map(|k| (oc[k] + kc[k]) as isize - 1).collect();
                if (0..3).any(|k| ic[k] < 0 || ic[k] as usize >= dims[2 + k]) {
                    continue;
                }
                let ic: Vec<usize> = ic.iter().map(|&i| i as usize).collect();
                s += xv[flat(&[&[0, c][..], &ic].concat(), &dims)];
                n += 1;
            }
            a.push(s / n as f32);
        }
    }
    close(&got[0].to_f32().unwrap(), &y);
    let gi: Vec<i64> = got[1]
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(gi, idx);
    close(&got[2].to_f32().unwrap(), &a);
}

/// Random 3-D geometries that shape inference accepts.
#[derive(Debug, Clone)]
struct Rand3 {
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

fn rand3() -> impl proptest::strategy::Strategy<Value = Rand3> {
    use proptest::prelude::*;
    (
        1usize..=2,
        1usize..=2,
        1usize..=3,
        1usize..=3,
        proptest::collection::vec(1usize..=6, 3),
        proptest::collection::vec(1usize..=3, 3),
        proptest::collection::vec(1usize..=3, 3),
        proptest::collection::vec(1usize..=2, 3),
        proptest::collection::vec(0usize..=2, 6),
    )
        .prop_map(|(n, group, cg, mg, sp, k, s, d, pads)| Rand3 {
            n,
            group,
            cg,
            mg,
            sp,
            k,
            s,
            d,
            pads,
        })
}

fn dims(v: &[usize]) -> String {
    v.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs at 1 and 3 threads; both must give the same bits.
fn run_threads(text: &str, inputs: &[HostTensor]) -> Vec<HostTensor> {
    let m = graphopt_text::parse_model(text).expect("generated model parses");
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("kernel made");
    let [a, b] = [1, 3].map(|threads| {
        exe.run(
            inputs,
            &RunOptions {
                threads,
                poison: true,
            },
        )
        .expect("runs")
        .0
    });
    assert_eq!(a, b, "1 and 3 threads differ\n{text}");
    a
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, .. proptest::prelude::ProptestConfig::default() })]

    /// Conv over random 3-D windows: no panic, the naive loop's sums, the
    /// same bits on any thread count.
    #[test]
    fn conv_3d_matches_a_naive_loop_on_random_windows(g in rand3(), seed in 0u64..1000) {
        let (c, m) = (g.group * g.cg, g.group * g.mg);
        let mut out = Vec::new();
        for i in 0..3 {
            let span = g.d[i] * (g.k[i] - 1) + 1;
            let room = g.sp[i] + g.pads[i] + g.pads[3 + i];
            proptest::prop_assume!(room >= span);
            out.push((room - span) / g.s[i] + 1);
        }
        let geo = Geo {
            x: [vec![g.n, c], g.sp.clone()].concat(),
            w: [vec![m, g.cg], g.k.clone()].concat(),
            y: [vec![g.n, m], out].concat(),
            group: g.group,
            s: g.s.clone(),
            d: g.d.clone(),
            begin: g.pads[..3].to_vec(),
        };
        let attrs = format!(
            "pads = [{}], strides = [{}], dilations = [{}], group = {}",
            dims(&g.pads), dims(&g.s), dims(&g.d), g.group
        );
        check_conv(&geo, &attrs, seed);
    }

    /// MaxPool, AveragePool (both count_include_pad settings) and LpPool
    /// over random 3-D windows against loops written here.
    #[test]
    fn pools_3d_match_naive_loops_on_random_windows(g in rand3(), include in 0usize..=1, p in 1usize..=3, seed in 0u64..1000) {
        let c = g.group * g.cg;
        // Pads below the kernel, as ONNX requires of pooling.
        let g = Rand3 { pads: (0..6).map(|i| g.pads[i] % g.k[i % 3]).collect(), ..g };
        let mut out = Vec::new();
        for i in 0..3 {
            let span = g.d[i] * (g.k[i] - 1) + 1;
            let room = g.sp[i] + g.pads[i] + g.pads[3 + i];
            proptest::prop_assume!(room >= span);
            out.push((room - span) / g.s[i] + 1);
        }
        let xs = [vec![g.n, c], g.sp.clone()].concat();
        let ys = [vec![g.n, c], out.clone()].concat();
        let attrs = format!(
            "kernel_shape = [{}], pads = [{}], strides = [{}], dilations = [{}]",
            dims(&g.k), dims(&g.pads), dims(&g.s), dims(&g.d)
        );
        let text = format!(
            r#"<ir_version: 8, opset_import: ["" : 19]>
            g (float[{x}] x) => (float[{y}] mx, float[{y}] av, float[{y}] lp) {{
              mx = MaxPool <{attrs}> (x)
              av = AveragePool <{attrs}, count_include_pad = {include}> (x)
              lp = LpPool <{attrs}, p = {p}> (x)
            }}"#,
            x = dims(&xs), y = dims(&ys)
        );
        let x = t(&xs, seed);
        let got = run_threads(&text, std::slice::from_ref(&x));
        let xv = x.to_f32().unwrap();
        let (mut mx, mut av, mut lp) = (Vec::new(), Vec::new(), Vec::new());
        for plane in 0..g.n * c {
            for oc in coords(&out) {
                let (mut best, mut sum, mut cnt, mut padded, mut pow) = (f32::NEG_INFINITY, 0f64, 0usize, 0usize, 0f64);
                for kc in coords(&g.k) {
                    let ic: Vec<isize> = (0..3)
                        .map(|i| (oc[i] * g.s[i] + kc[i] * g.d[i]) as isize - g.pads[i] as isize)
                        .collect();
                    if (0..3).any(|i| ic[i] < 0 || ic[i] as usize >= g.sp[i]) {
                        padded += 1;
                        continue;
                    }
                    let v = xv[plane * g.sp.iter().product::<usize>() + flat(&ic.iter().map(|&i| i as usize).collect::<Vec<_>>(), &g.sp)];
                    best = best.max(v);
                    sum += v as f64;
                    pow += (v.abs() as f64).powi(p as i32);
                    cnt += 1;
                }
                mx.push(best);
                let div = if include == 1 { cnt + padded } else { cnt };
                av.push((sum / div.max(1) as f64) as f32);
                lp.push(pow.powf(1.0 / p as f64) as f32);
            }
        }
        proptest::prop_assert_eq!(got[0].to_f32().unwrap(), mx);
        close(&got[1].to_f32().unwrap(), &av);
        close(&got[2].to_f32().unwrap(), &lp);
    }
}
