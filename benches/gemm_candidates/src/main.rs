//! f32 GEMM candidates on the shapes graphopt's CPU runtime multiplies
//! (issue 20): matrixmultiply on one thread, split by rows on 2 std
//! threads (the runtime's split), with its own `threading` feature
//! (`MATMUL_NUM_THREADS`), and the `gemm` crate on one thread and on a
//! 2-thread rayon pool. GFLOP/s, best of 5, row-major operands.
//! `GEMV=1`: the one-row products instead ([`gemv_rows`]).
//! Results and how to read them: benches/README.md.

use std::time::Instant;

#[allow(dead_code)]
#[path = "../../../crates/exec/src/activation.rs"]
mod activation;
/// The runtime's own kernel (crates/exec/src/cpu/gemm.rs), compiled here as is,
/// with the activations its epilogue applies.
#[allow(dead_code)]
#[path = "../../../crates/exec/src/cpu/gemm.rs"]
mod ours;

/// `run(c0, cols)` on one thread per block of `per` columns of `n`.
fn split_cols(n: usize, per: usize, run: impl Fn(usize, usize) + Sync) {
    std::thread::scope(|s| {
        let mut c0 = 0;
        while c0 < n {
            let w = per.min(n - c0);
            let run = &run;
            s.spawn(move || run(c0, w));
            c0 += w;
        }
    });
}

fn ours_cols(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    let blocks = n.div_ceil(64);
    let t = threads.clamp(1, blocks);
    let per = blocks.div_ceil(t) * 64;
    let cp = c.as_mut_ptr() as usize;
    let run = |c0: usize, cols: usize| unsafe {
        ours::sgemm(
            m,
            k,
            cols,
            1.0,
            a.as_ptr(),
            (k, 1),
            b.as_ptr().add(c0),
            (n, 1),
            0.0,
            (cp as *mut f32).add(c0),
            n,
        )
    };
    split_cols(n, per, run);
}

fn ours_rows(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    let t = threads.clamp(1, m.div_ceil(64));
    let rows = m.div_ceil(t).div_ceil(64) * 64;
    let run = |r0: usize, rows: usize, c: &mut [f32]| unsafe {
        ours::sgemm(
            rows,
            k,
            n,
            1.0,
            a.as_ptr().add(r0 * k),
            (k, 1),
            b.as_ptr(),
            (n, 1),
            0.0,
            c.as_mut_ptr(),
            n,
        )
    };
    if t == 1 {
        run(0, m, c);
        return;
    }
    std::thread::scope(|s| {
        let mut rest = c;
        let mut r0 = 0;
        while r0 < m {
            let r = rows.min(m - r0);
            let (mine, tail) = rest.split_at_mut(r * n);
            rest = tail;
            let run = &run;
            s.spawn(move || run(r0, r, mine));
            r0 += r;
        }
    });
}

fn mm_rows(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    let t = threads.clamp(1, m);
    let rows = m.div_ceil(t);
    let run = |r0: usize, rows: usize, c: &mut [f32]| unsafe {
        matrixmultiply::sgemm(
            rows,
            k,
            n,
            1.0,
            a.as_ptr().add(r0 * k),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    };
    if t == 1 {
        run(0, m, c);
        return;
    }
    std::thread::scope(|s| {
        let mut rest = c;
        let mut r0 = 0;
        while r0 < m {
            let r = rows.min(m - r0);
            let (mine, tail) = rest.split_at_mut(r * n);
            rest = tail;
            let run = &run;
            s.spawn(move || run(r0, r, mine));
            r0 += r;
        }
    });
}

fn mm_single(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

fn gemm_crate(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    par: gemm::Parallelism,
) {
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

fn time<F: FnMut()>(mut f: F, flops: f64) -> f64 {
    f();
    let mut best = f64::MAX;
    let reps = ((2e8 / flops).ceil() as usize).clamp(3, 200);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

/// `GEMV=1`: one-row products (a batch-1 classifier, a decoding step) with
/// `b` row-major (`[k, n]`, MatMul) and transposed (`[n, k]`, Gemm with
/// transB = 1): matrixmultiply and `gemm` on one thread against
/// graphopt's matrix-vector kernel on one thread and split into two
/// column halves on two std threads, best of 6 x 5, interleaved.
fn gemv_rows() {
    let shapes: &[(&str, usize, usize)] = &[
        ("r50 fc b1", 2048, 1000),
        ("mobilenet_v2 fc b1", 1280, 1000),
        ("decode m=1", 768, 3072),
        ("gpt2 decode lm head", 768, 50257),
    ];
    println!(
        "| shape | K N | b | mm 1t | gemm 1t | graphopt 1t | graphopt 2t | graphopt 2t / mm 1t |"
    );
    for &(name, k, n) in shapes {
        let a: Vec<f32> = (0..k).map(|i| ((i * 7 % 13) as f32) * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) * 0.1).collect();
        let mut c = vec![0f32; n];
        let fl = 2.0 * (k * n) as f64;
        let g = |t: f64| fl / t / 1e9;
        for (layout, (rsb, csb)) in [("[k,n]", (n, 1)), ("[n,k]", (1, k))] {
            let mm = |c: &mut [f32]| unsafe {
                matrixmultiply::sgemm(
                    1,
                    k,
                    n,
                    1.0,
                    a.as_ptr(),
                    k as isize,
                    1,
                    b.as_ptr(),
                    rsb as isize,
                    csb as isize,
                    0.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                )
            };
            let gm = |c: &mut [f32]| unsafe {
                gemm::gemm(
                    1,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    csb as isize,
                    rsb as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
            let ours = |c: &mut [f32], threads: usize| {
                let half = if threads > 1 { n.div_ceil(128) * 64 } else { n };
                let cp = c.as_mut_ptr() as usize;
                let run = |j0: usize, cols: usize| unsafe {
                    ours::gemv(
                        k,
                        cols,
                        1.0,
                        a.as_ptr(),
                        b.as_ptr().add(j0 * csb),
                        (rsb, csb),
                        0.0,
                        (cp as *mut f32).add(j0),
                    )
                };
                if threads == 1 {
                    run(0, n);
                    return;
                }
                std::thread::scope(|s| {
                    let run = &run;
                    s.spawn(move || run(half, n - half));
                    run(0, half);
                });
            };
            let mut want = vec![0f32; n];
            mm(&mut want);
            ours(&mut c, 2);
            let err = want
                .iter()
                .zip(&c)
                .map(|(x, y)| ((x - y) / x.abs().max(1.0)).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-4, "{name}: graphopt's gemv is off by {err}");
            let mut t = [f64::MAX; 4];
            for _ in 0..6 {
                t[0] = t[0].min(time(|| mm(&mut c), fl));
                t[1] = t[1].min(time(|| gm(&mut c), fl));
                t[2] = t[2].min(time(|| ours(&mut c, 1), fl));
                t[3] = t[3].min(time(|| ours(&mut c, 2), fl));
            }
            println!(
                "| {name} | {k} {n} | {layout} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x |",
                g(t[0]),
                g(t[1]),
                g(t[2]),
                g(t[3]),
                t[0] / t[3]
            );
        }
    }
}

/// `COLD=1`: the runtime's case, where each product's weight comes from
/// memory (a transformer's weights are far larger than the L3): the
/// right operand rotates through copies totalling over 200 MB. Prints
/// GFLOP/s of matrixmultiply and graphopt's kernel, 2 threads split by
/// columns, best of 5 passes over the copies.
fn cold() {
    let shapes: &[(&str, usize, usize, usize)] = &[
        ("bert b1 qkv", 128, 768, 768),
        ("bert b1 ffn1", 128, 768, 3072),
        ("bert b1 ffn2", 128, 3072, 768),
        ("gpt2 b1 c_attn", 128, 768, 2304),
    ];
    for &(name, m, k, n) in shapes {
        let copies = (200 << 20) / (4 * k * n) + 1;
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) * 0.1).collect();
        let bs: Vec<Vec<f32>> = (0..copies)
            .map(|c| {
                (0..k * n)
                    .map(|i| (((i + c) * 5 % 11) as f32) * 0.1)
                    .collect()
            })
            .collect();
        let mut c = vec![0f32; m * n];
        let fl = 2.0 * (m * k * n) as f64 * copies as f64;
        let pass = |f: &mut dyn FnMut(&[f32], &mut [f32]), c: &mut [f32]| {
            let t = Instant::now();
            for b in &bs {
                f(b, c);
            }
            t.elapsed().as_secs_f64()
        };
        let (mut x, mut y) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            x = x.min(pass(&mut |b, c| mm_cols(m, k, n, &a, b, c, 2), &mut c));
            y = y.min(pass(&mut |b, c| ours_cols(m, k, n, &a, b, c, 2), &mut c));
        }
        println!(
            "| {name} cold | {m} {k} {n} | mm cols 2t {:.1} | ours cols 2t {:.1} | {:.2}x |",
            fl / x / 1e9,
            fl / y / 1e9,
            x / y
        );
    }
}
fn mm_cols(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], threads: usize) {
    let blocks = n.div_ceil(64);
    let t = threads.clamp(1, blocks);
    let per = blocks.div_ceil(t) * 64;
    let cp = c.as_mut_ptr() as usize;
    let run = |c0: usize, cols: usize| unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            cols,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr().add(c0),
            n as isize,
            1,
            0.0,
            (cp as *mut f32).add(c0),
            n as isize,
            1,
        )
    };
    split_cols(n, per, run);
}
fn main() {
    if std::env::var_os("COLD").is_some() {
        cold();
        return;
    }
    if std::env::var_os("GEMV").is_some() {
        gemv_rows();
        return;
    }
    let shapes: &[(&str, usize, usize, usize)] = &[
        ("r50 3x3 l1 w*col", 64, 576, 3136),
        ("r50 1x1 l1", 256, 64, 3136),
        ("r50 3x3 l4", 512, 4608, 49),
        ("r50 1x1 l4", 2048, 512, 49),
        ("r50 3x3 l3", 256, 2304, 196),
        ("r50 1x1 l3 up", 1024, 256, 196),
        ("r50 1x1 l3 down", 256, 1024, 196),
        ("r50 3x3 l2", 128, 1152, 784),
        ("r50 fc b1", 1, 2048, 1000),
        ("bert b1 qkv", 128, 768, 768),
        ("bert b1 ffn1", 128, 768, 3072),
        ("bert b1 ffn2", 128, 3072, 768),
        ("bert b8 ffn1", 1024, 768, 3072),
        ("attn qk", 128, 64, 128),
        ("gpt2 b1 lm head", 128, 768, 50257),
        ("decode m=1", 1, 768, 3072),
        ("r18 bwd dW 3x3", 64, 12544 * 16 / 16, 576),
    ];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let only_ours = std::env::var_os("ONLY_OURS").is_some();
    println!("| shape | M K N | mm 1t GF/s | mm rows 2t | mm threading-feat 2t | gemm 1t | gemm rayon 2t | graphopt 1t | graphopt rows 2t |");
    for &(name, m, k, n) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) * 0.1).collect();
        let mut c = vec![0f32; m * n];
        let fl = 2.0 * (m * k * n) as f64;
        let mut want = vec![0f32; m * n];
        mm_single(m, k, n, &a, &b, &mut want);
        ours_rows(m, k, n, &a, &b, &mut c, 2);
        let err = want
            .iter()
            .zip(&c)
            .map(|(x, y)| ((x - y) / x.abs().max(1.0)).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-4, "{name}: graphopt's gemm is off by {err}");
        let t6 = time(|| ours_rows(m, k, n, &a, &b, &mut c, 1), fl);
        let t7 = time(|| ours_rows(m, k, n, &a, &b, &mut c, 2), fl);
        let g = |t: f64| fl / t / 1e9;
        if std::env::var_os("AB").is_some() {
            let (mut x, mut y) = (f64::MAX, f64::MAX);
            for _ in 0..6 {
                x = x.min(time(|| mm_single(m, k, n, &a, &b, &mut c), fl));
                y = y.min(time(|| ours_rows(m, k, n, &a, &b, &mut c, 1), fl));
            }
            let (mut x2, mut y2) = (f64::MAX, f64::MAX);
            for _ in 0..6 {
                x2 = x2.min(time(|| mm_rows(m, k, n, &a, &b, &mut c, 2), fl));
                y2 = y2.min(time(
                    || {
                        if n >= 128 {
                            ours_cols(m, k, n, &a, &b, &mut c, 2)
                        } else {
                            ours_rows(m, k, n, &a, &b, &mut c, 2)
                        }
                    },
                    fl,
                ));
            }
            println!("| {name} | {m} {k} {n} | mm {:.1} | ours {:.1} | {:.2}x | mm rows 2t {:.1} | ours 2t {:.1} | {:.2}x |", g(x), g(y), x / y, g(x2), g(y2), x2 / y2);
            continue;
        }
        if only_ours {
            let t8 = time(|| ours_cols(m, k, n, &a, &b, &mut c, 2), fl);
            println!(
                "| {name} | {m} {k} {n} | {:.1} | {:.1} | {:.1} |",
                g(t6),
                g(t7),
                g(t8)
            );
            continue;
        }
        let t1 = time(|| mm_single(m, k, n, &a, &b, &mut c), fl);
        let t2 = time(|| mm_rows(m, k, n, &a, &b, &mut c, 2), fl);
        let t3 = time(|| mm_single(m, k, n, &a, &b, &mut c), fl);
        let t4 = time(
            || gemm_crate(m, k, n, &a, &b, &mut c, gemm::Parallelism::None),
            fl,
        );
        let t5 = pool.install(|| {
            time(
                || gemm_crate(m, k, n, &a, &b, &mut c, gemm::Parallelism::Rayon(2)),
                fl,
            )
        });
        println!(
            "| {name} | {m} {k} {n} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            g(t1),
            g(t2),
            g(t3),
            g(t4),
            g(t5),
            g(t6),
            g(t7)
        );
    }
}
