//! graphopt's own f32 GEMM for x86-64 with AVX2 and FMA: a 6×16
//! register-blocked micro-kernel (12×32 where the CPU has AVX-512F, the
//! same sums per element) that reads the left operand where it lies and
//! packs only the right one.
//!
//! `c[m×n] = alpha · a[m×k] · b[k×n] + beta · c`, one thread (the caller
//! splits the product, [`super::matmul::sgemm_with`]).
//!
//! Why not only `matrixmultiply`: it packs both operands on every call.
//! In an NCHW convolution the left operand is the weight (`Cout × Cin·k²`)
//! and the right one the unfolded image; deep in a network the image is
//! small (7×7) and the weight large (512 × 4608), so repacking the weight
//! costs as much as multiplying. Here `a` is read in place by broadcasts,
//! at any strides: a column-major `a` (a Gemm with `transA`, a weight
//! gradient `Xᵀ · dY`) gives a micro-tile's rows at one step from one
//! contiguous run, a row-major one from one line per row. `b` is packed
//! per 256-row panel into 16-column slivers, zero-padded at the edge.
//!
//! The loops (BLIS's order): column panels of `NC`, depth blocks of
//! [`KC`] (`b`'s panel packed once per block), row blocks of `MC`, then
//! 16-column slivers (one stays in L1 while the rows stream past it; two
//! side by side on AVX-512) and 6-row micro-tiles (12 on AVX-512).
//!
//! Every element is summed the same way whatever the split: its `k`
//! products in order, in blocks of [`KC`], each block's sum scaled by
//! `alpha` and added to `c` (the first block to `beta · c`). Splitting
//! rows or columns across threads, or a caller walking `k` in tiles of
//! [`KC`] with `beta = 1` after the first, gives the same bits.
//!
//! Before:
//! ```text
//! matrixmultiply::sgemm(512, 4608, 49, ..)   // packs 9.4 MB of weight per call
//! ```
//! After:
//! ```text
//! gemm::sgemm(512, 4608, 49, ..)             // packs 0.9 MB of image
//! ```

#![allow(clippy::too_many_arguments)]

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

use crate::activation::Activation;
use std::cell::RefCell;

/// Rows of a micro-tile.
const MR: usize = 6;
/// Columns of a micro-tile (two AVX vectors).
const NR: usize = 16;
/// Depth of a packed block: every element's sum is split at multiples of
/// it (the fused palette kernels tile `k` by the same 256).
pub(crate) const KC: usize = 256;
/// Rows of a micro-tile of the AVX-512 kernel ([`micro_wide`]), whose
/// tiles are 32 columns wide (two slivers).
const MR_WIDE: usize = 12;
/// Rows of `a` per block (a multiple of [`MR`] and [`MR_WIDE`]): 132, so
/// that a transformer's 128 tokens at batch 1 are one block and each
/// packed panel of `b` is read once from L2.
const MC: usize = 132;
/// Longest row stride (floats) of a `b` read in place: rows further apart
/// (GPT-2's 50257-wide LM head) touch a new page per row, which the packed
/// copy reads once, as a stream.
const IN_PLACE_MAX_RSB: usize = 4096;
/// Columns of `b` per packed panel (a multiple of [`NR`]).
const NC: usize = 256;

thread_local! {
    /// `b`'s packed panel (at most `KC × NC` floats), one per thread,
    /// reused across calls.
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Whether this CPU has AVX-512F, for [`micro_wide`]: the same products
/// and sums as [`micro`], per element, so the same bits, with twice the
/// registers (12 × 32 tiles instead of 6 × 16). (Also what the quantized
/// convolutions' vector requantization asks.)
pub(crate) fn wide() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}

/// Whether this CPU runs [`sgemm`].
pub(crate) fn available() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// One-thread `c = alpha · a · b + beta · c` (`beta = 0`: `c` is not
/// read). `k` must be at least 1.
///
/// # Safety
/// [`available`] must be true. `a` holds `m × k` elements at element
/// strides `(rsa, csa)`, `b` holds `k × n` at `(rsb, csb)`, and `c` holds `m`
/// rows of `n` at row stride `rsc`, which nothing else touches during the
/// call.
pub(crate) unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    (rsa, csa): (usize, usize),
    b: *const f32,
    (rsb, csb): (usize, usize),
    beta: f32,
    c: *mut f32,
    rsc: usize,
) {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        sgemm_on(
            wide(),
            m,
            k,
            n,
            alpha,
            a,
            (rsa, csa),
            Right::strided(b, (rsb, csb)),
            beta,
            c,
            rsc,
            Epilogue::NONE,
        )
    }
}

/// A product's right operand `b`: element `(p, j)` at `ptr + p·rsb +
/// j·csb`, or, where `rows` is set, at `ptr + rows[p] + j` (each row
/// contiguous, anywhere: a convolution's taps over a padded image,
/// [`sgemm_rows_bias_act`]).
#[derive(Clone, Copy)]
struct Right {
    ptr: *const f32,
    rsb: usize,
    csb: usize,
    /// Row offsets (null: the strides).
    rows: *const usize,
}

impl Right {
    fn strided(ptr: *const f32, (rsb, csb): (usize, usize)) -> Right {
        Right {
            ptr,
            rsb,
            csb,
            rows: std::ptr::null(),
        }
    }

    /// The block from row `p0` and column `j0` on.
    ///
    /// # Safety
    /// The block lies in the operand.
    unsafe fn at(self, p0: usize, j0: usize) -> Right {
        // SAFETY: the caller's promise.
        unsafe {
            if self.rows.is_null() {
                Right {
                    ptr: self.ptr.add(p0 * self.rsb + j0 * self.csb),
                    ..self
                }
            } else {
                Right {
                    ptr: self.ptr.add(j0),
                    rows: self.rows.add(p0),
                    ..self
                }
            }
        }
    }

    /// Row `p`'s first element.
    ///
    /// # Safety
    /// Row `p` lies in the operand.
    unsafe fn row(self, p: usize) -> *const f32 {
        // SAFETY: the caller's promise.
        unsafe {
            if self.rows.is_null() {
                self.ptr.add(p * self.rsb)
            } else {
                self.ptr.add(*self.rows.add(p))
            }
        }
    }
}

/// What a product's last step adds to each result before it is stored
/// ([`sgemm_bias_act`]).
#[derive(Clone, Copy)]
pub(crate) struct Epilogue {
    /// One value per row of `c`, added to the first depth block's sums
    /// in place of `beta · c` (null: none).
    pub bias: *const f32,
    /// Applied to the last depth block's results.
    pub act: Option<Activation>,
}

impl Epilogue {
    const NONE: Epilogue = Epilogue {
        bias: std::ptr::null(),
        act: None,
    };

    /// `bias` (at least `m` values, one per row) and `act`.
    fn new(bias: Option<&[f32]>, act: Option<Activation>, m: usize) -> Epilogue {
        Epilogue {
            bias: bias.map_or(std::ptr::null(), |b| {
                assert!(b.len() >= m, "bias too short");
                b.as_ptr()
            }),
            act,
        }
    }
}

/// One-thread `c = bias + a · b`, then `act`: the bias (one value per
/// row) enters where a first block's `beta · c` would, and the
/// activation is applied in the registers of the last block, so the
/// output is written once. Per element: `acc + bias` (then `acc + c` per
/// further block, as [`sgemm`]), then the activation: the bits of a bias
/// fill, [`sgemm`] with `beta = 1` and the activation's own pass (but for
/// a sum of exactly -0.0 without a bias, which stays -0.0 where the fill's
/// +0.0 would have made it +0.0).
///
/// # Safety
/// As [`sgemm`]'s; `bias` (when given) holds `m` floats.
pub(crate) unsafe fn sgemm_bias_act(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    (rsa, csa): (usize, usize),
    b: *const f32,
    (rsb, csb): (usize, usize),
    bias: Option<&[f32]>,
    act: Option<Activation>,
    c: *mut f32,
    rsc: usize,
) {
    let ep = Epilogue::new(bias, act, m);
    // SAFETY: the caller's promise, passed on.
    unsafe {
        sgemm_on(
            wide(),
            m,
            k,
            n,
            1.0,
            a,
            (rsa, csa),
            Right::strided(b, (rsb, csb)),
            0.0,
            c,
            rsc,
            ep,
        )
    }
}

/// [`sgemm_bias_act`] with a right operand given by its rows: element
/// `(p, j)` of `b` is `b[rows[p] + j]`, each row `n` contiguous elements
/// anywhere in `b` (a convolution's taps over a padded image, where an
/// unfolded matrix would repeat each element once per tap). The rows are
/// packed as a strided `b`'s are, so each element is summed as
/// [`sgemm_bias_act`] sums it over the matrix those rows make: the same
/// bits.
///
/// # Safety
/// As [`sgemm_bias_act`]'s; `rows` holds `k` offsets, each `rows[p] + n`
/// within `b`.
pub(crate) unsafe fn sgemm_rows_bias_act(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    (rsa, csa): (usize, usize),
    (b, rows): (*const f32, &[usize]),
    bias: Option<&[f32]>,
    act: Option<Activation>,
    c: *mut f32,
    rsc: usize,
) {
    assert!(rows.len() >= k, "row offsets too short");
    let ep = Epilogue::new(bias, act, m);
    let b = Right {
        ptr: b,
        rsb: 0,
        csb: 1,
        rows: rows.as_ptr(),
    };
    // SAFETY: the caller's promise, passed on.
    unsafe { sgemm_on(wide(), m, k, n, 1.0, a, (rsa, csa), b, 0.0, c, rsc, ep) }
}

/// [`sgemm`] on the AVX-512 kernel ([`micro_wide`]) where `wide`, else on
/// the AVX2 one ([`micro`]): the same bits either way.
///
/// # Safety
/// As [`sgemm`]'s, and `wide` only where the CPU has AVX-512F.
unsafe fn sgemm_on(
    wide: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    (rsa, csa): (usize, usize),
    b: Right,
    beta: f32,
    c: *mut f32,
    rsc: usize,
    ep: Epilogue,
) {
    debug_assert!(available() && k > 0);
    let (mr, step) = if wide { (MR_WIDE, 2 * NR) } else { (MR, NR) };
    PANEL.with(|bp| {
        let bp = &mut *bp.borrow_mut();
        let panel = KC * n.min(NC).div_ceil(NR) * NR;
        if bp.len() < panel {
            bp.resize(panel, 0.0);
        }
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                // SAFETY (all below): offsets stay inside the operands the
                // caller vouched for; the buffers were sized above.
                let bblk = unsafe { b.at(pc, jc) };
                // A product of one micro-tile of rows reads each sliver
                // once, so a packed copy would never be reused: it reads a
                // row-major `b` in place (full slivers), unless its rows
                // lie far apart ([`IN_PLACE_MAX_RSB`]). Taller products
                // pack: a sliver read in place has its rows a weight's row
                // apart, a multiple of 1 KiB for every transformer width,
                // so its rows fall into a handful of L1 sets and every
                // micro-tile after the first reads it from L2 again.
                // Reading in place up to 132 rows (one `MC` block) cost
                // BERT-base at batch 1 11% and GPT-2 24% on a 2-core Xeon
                // with AVX-512 (`benches/README.md`, s51), where the
                // machine of the session before had measured a gain.
                let in_place =
                    b.csb == 1 && m <= mr && (!b.rows.is_null() || b.rsb <= IN_PLACE_MAX_RSB);
                unsafe { pack_b(kc, nc, bblk, bp, in_place) };
                let (al, be) = if pc == 0 { (alpha, beta) } else { (alpha, 1.0) };
                let first = pc == 0 && !ep.bias.is_null();
                let act = if pc + kc == k { ep.act } else { None };
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    let ablk = unsafe { a.add(ic * rsa + pc * csa) };
                    // Sliver `jr`'s 16 columns: `b` itself (row stride rsb,
                    // or with row offsets, its rows where they lie) or the
                    // packed panel (stride NR).
                    let sliver = |jr: usize| {
                        if in_place && nc - jr >= NR {
                            (unsafe { bblk.ptr.add(jr) }, b.rsb, bblk.rows)
                        } else {
                            (unsafe { bp.as_ptr().add(jr * kc) }, NR, std::ptr::null())
                        }
                    };
                    // The micro-tiles of columns jr..jr + nr (at most two
                    // slivers, read alike: both by row offsets or neither).
                    let run = |jr: usize, nr: usize| {
                        let (b, ldb, rows) = sliver(jr);
                        let (b1, ldb1) = if nr > NR {
                            let (b1, ldb1, _) = sliver(jr + NR);
                            (b1, ldb1)
                        } else {
                            (b, ldb)
                        };
                        for ir in (0..mc).step_by(mr) {
                            let t = Tile {
                                kc,
                                a: unsafe { ablk.add(ir * rsa) },
                                rsa,
                                csa,
                                b,
                                ldb,
                                b1,
                                ldb1,
                                rows,
                                c: unsafe { c.add((ic + ir) * rsc + jc + jr) },
                                rsc,
                                nr,
                                alpha: al,
                                beta: be,
                                bias: if first {
                                    unsafe { ep.bias.add(ic + ir) }
                                } else {
                                    std::ptr::null()
                                },
                                act,
                            };
                            unsafe { tile(&t, mr.min(mc - ir), wide) }
                        }
                    };
                    for jr in (0..nc).step_by(step) {
                        let nr = step.min(nc - jr);
                        if nr > NR && sliver(jr).2 != sliver(jr + NR).2 {
                            // A full sliver read by its rows beside a
                            // packed edge: one at a time.
                            run(jr, NR);
                            run(jr + NR, nr - NR);
                        } else {
                            run(jr, nr);
                        }
                    }
                }
            }
        }
    })
}

/// One-thread `c[n] = alpha · a[k] · b[k×n] + beta · c`: one row of `a`
/// (contiguous) times `b`, read where it lies (`beta = 0`: `c` is not
/// read). `k` must be at least 1.
///
/// With a unit row stride and a longer column stride (`rsb = 1 < csb`:
/// column `j` of `b` is contiguous, as in a Gemm with `transB = 1`, a
/// classifier's weight) each element is a dot product ([`dots`]);
/// otherwise (`csb = 1`, one column or not) the rows of `b` are
/// streamed and scaled into accumulators ([`axpys`]), the sums [`sgemm`]
/// makes for one row, bit for bit. Both sum each element in blocks of
/// [`KC`] with [`sgemm`]'s epilogue, so a caller walking `k` in tiles of
/// [`KC`] with `beta = 1` after the first, or splitting the columns, gets
/// the same bits.
///
/// # Safety
/// [`available`] must be true; `rsb == 1 || csb == 1`. `a` holds `k`
/// elements, `b` holds `k × n` at `(rsb, csb)`, and `c` holds `n`
/// elements that nothing else touches during the call.
pub(crate) unsafe fn gemv(
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    (rsb, csb): (usize, usize),
    beta: f32,
    c: *mut f32,
) {
    debug_assert!(available() && k > 0 && (rsb == 1 || csb == 1));
    // SAFETY: the caller's promise, passed on.
    unsafe {
        if rsb == 1 && csb != 1 {
            dots(k, n, alpha, a, b, csb, beta, c)
        } else {
            axpys(k, n, alpha, a, b, rsb, beta, c)
        }
    }
}

/// Columns per accumulator block of [`axpys`] (8 KiB, in L1).
const AXPY_COLS: usize = 2048;

/// `c = alpha · a · b + beta · c` for a row-major `b` (row stride `rsb`):
/// per block of [`AXPY_COLS`] columns and [`KC`] rows, each row of `b` is
/// read once, contiguously, and `a[p] · b[p, j]` added to accumulator `j`
/// by a fused multiply-add, in row order: the arithmetic of [`micro`] for
/// one row (each element's products in order from zero, then the same
/// epilogue), with the accumulators in L1 instead of registers, so long
/// rows stream instead of being read as 16-column slivers a page apart.
#[target_feature(enable = "avx2,fma")]
unsafe fn axpys(
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    rsb: usize,
    beta: f32,
    c: *mut f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [0f32; AXPY_COLS];
    for j0 in (0..n).step_by(AXPY_COLS) {
        let w = AXPY_COLS.min(n - j0);
        let vw = w / 8 * 8;
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let be = if pc == 0 { beta } else { 1.0 };
            let acc = &mut acc[..w];
            acc.fill(0.0);
            // SAFETY: rows pc..pc+kc, columns j0..j0+w of b and elements
            // j0..j0+w of c (the caller's bounds); `acc` holds w.
            unsafe {
                for p in pc..pc + kc {
                    let ap = *a.add(p);
                    let av = _mm256_set1_ps(ap);
                    let row = b.add(p * rsb + j0);
                    let accp = acc.as_mut_ptr();
                    let mut j = 0;
                    while j < vw {
                        let v = _mm256_fmadd_ps(
                            av,
                            _mm256_loadu_ps(row.add(j)),
                            _mm256_loadu_ps(accp.add(j)),
                        );
                        _mm256_storeu_ps(accp.add(j), v);
                        j += 8;
                    }
                    for j in vw..w {
                        *accp.add(j) = ap.mul_add(*row.add(j), *accp.add(j));
                    }
                }
                for (j, &v) in acc.iter().enumerate() {
                    let v = if alpha != 1.0 { v * alpha } else { v };
                    finish(v, be, &mut *c.add(j0 + j));
                }
            }
        }
    }
}

/// `c[j] = alpha · (a · b[j·csb ..][..k]) + beta · c[j]` for `j < n`, four
/// columns at a time (each column's arithmetic is the same in a group of
/// four as alone): per block of [`KC`], 16 products at a time into two
/// vectors, their lanes summed in a fixed order, the block's last `kc % 16`
/// products added one by one, then the epilogue of [`micro`]'s edge
/// columns.
#[target_feature(enable = "avx2,fma")]
unsafe fn dots(
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    csb: usize,
    beta: f32,
    c: *mut f32,
) {
    let mut j = 0;
    // SAFETY (both): columns j.. of b and elements j.. of c, inside what
    // the caller vouched for.
    while j + 4 <= n {
        unsafe { dot_cols::<4>(k, alpha, a, b.add(j * csb), csb, beta, c.add(j)) };
        j += 4;
    }
    while j < n {
        unsafe { dot_cols::<1>(k, alpha, a, b.add(j * csb), csb, beta, c.add(j)) };
        j += 1;
    }
}

/// [`dots`] for `C` adjacent columns.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_cols<const C: usize>(
    k: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    csb: usize,
    beta: f32,
    c: *mut f32,
) {
    use std::arch::x86_64::*;
    for pc in (0..k).step_by(KC) {
        let kc = KC.min(k - pc);
        let be = if pc == 0 { beta } else { 1.0 };
        // SAFETY: elements pc..pc+kc of a and of each column (the
        // caller's bounds), c[0..C].
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; C];
            let mut p = 0;
            while p + 16 <= kc {
                let a0 = _mm256_loadu_ps(a.add(pc + p));
                let a1 = _mm256_loadu_ps(a.add(pc + p + 8));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let col = b.add(i * csb + pc + p);
                    acc[0] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(col), acc[0]);
                    acc[1] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(col.add(8)), acc[1]);
                }
                p += 16;
            }
            for (i, acc) in acc.iter().enumerate() {
                let v = _mm256_add_ps(acc[0], acc[1]);
                let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
                let mut s = _mm_cvtss_f32(h);
                let col = b.add(i * csb + pc);
                for q in p..kc {
                    s = (*a.add(pc + q)).mul_add(*col.add(q), s);
                }
                if alpha != 1.0 {
                    s *= alpha;
                }
                finish(s, be, &mut *c.add(i));
            }
        }
    }
}

/// Rows ahead of the one being packed that [`pack_b`] prefetches: on
/// BERT-base at batch 1, 2, 4 and 8 rows took 141.1, 140.3 and 138.1 ms
/// against 148.8 without; on GPT-2, 8 and 16 took 204.8 and 202.5 against
/// 211.0 (within this machine's noise of each other; benches/README.md,
/// "Prefetching the weight").
const PREFETCH_ROWS: usize = 8;
/// `f32`s per 64-byte cache line.
const LINE: usize = 16;

/// The 8×8 transpose of eight registers: lane `j` of result `i` is lane
/// `i` of input `j`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
pub(crate) fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Packs `kc × nc` of `b` into slivers of [`NR`] columns: sliver `s`
/// holds row `p`'s 16 columns at `s·NR·kc + p·NR`, zeros past `nc`
/// (`edge_only`: only the last, partial sliver).
///
/// A row-major `b` is read row by row (each row's `nc` columns in one
/// contiguous run, which the hardware prefetcher streams from memory: a
/// weight read sliver by sliver touches a new page per row and waited on
/// memory for a third of a batch-1 BERT product's time), with the row
/// [`PREFETCH_ROWS`] ahead asked for while one is copied: a weight comes
/// from memory, and each row's run is a new stream the hardware
/// prefetcher has not yet seen; other strides sliver by sliver.
unsafe fn pack_b(kc: usize, nc: usize, b: Right, out: &mut [f32], edge_only: bool) {
    let full = nc / NR;
    if b.csb == 1 {
        let first = if edge_only { full } else { 0 };
        for p in 0..kc {
            // SAFETY: row p, columns ..nc of b (the caller's bounds).
            let src = unsafe { b.row(p) };
            if p + PREFETCH_ROWS < kc {
                // SAFETY: row p + PREFETCH_ROWS < kc lies in b.
                let ahead = unsafe { b.row(p + PREFETCH_ROWS) };
                for j in (first * NR..nc).step_by(LINE) {
                    // SAFETY: a prefetch reads nothing and never faults
                    // (the address lies in row p + PREFETCH_ROWS of b).
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(j) as *const i8) };
                }
            }
            for s in first..full {
                let row = &mut out[s * NR * kc + p * NR..][..NR];
                // A fixed-size copy (two vector moves), not a memcpy call.
                // SAFETY: columns s·NR..(s+1)·NR < nc of row p.
                row.copy_from_slice(unsafe { &*(src.add(s * NR) as *const [f32; NR]) });
            }
            let w = nc - full * NR;
            if w > 0 {
                let row = &mut out[full * NR * kc + p * NR..][..NR];
                // SAFETY: the last w columns of row p.
                unsafe { std::ptr::copy_nonoverlapping(src.add(full * NR), row.as_mut_ptr(), w) };
                row[w..].fill(0.0);
            }
        }
        return;
    }
    if b.rsb == 1 && b.rows.is_null() {
        // SAFETY: the caller's bounds, passed on.
        unsafe { pack_columns(kc, nc, b.ptr, b.csb, out) };
        return;
    }
    for (s, j0) in (0..nc).step_by(NR).enumerate() {
        let w = NR.min(nc - j0);
        if edge_only && w == NR {
            continue;
        }
        let dst = &mut out[s * NR * kc..(s + 1) * NR * kc];
        for p in 0..kc {
            let row = &mut dst[p * NR..p * NR + NR];
            // SAFETY: row p, columns j0..j0+w of b (the caller's bounds).
            unsafe {
                let src = b.row(p).add(j0 * b.csb);
                for (j, r) in row[..w].iter_mut().enumerate() {
                    *r = *src.add(j * b.csb);
                }
            }
            row[w..].fill(0.0);
        }
    }
}

/// [`pack_b`] for a column-major `b` (row stride 1, column `j` the `kc`
/// contiguous elements at `b + j·csb`: a Gemm with `transB`, a folded
/// convolution's weight): each 8 × 8 block read as eight column runs and
/// written as eight row runs through [`transpose8`] (instead of reading,
/// for every row, 16 elements a column apart one at a time), the ragged
/// edges element
/// by element; zeros past `nc`.
///
/// # Safety
/// Columns `..nc`, rows `..kc` of `b` are readable; the CPU has AVX.
#[target_feature(enable = "avx")]
unsafe fn pack_columns(kc: usize, nc: usize, b: *const f32, csb: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    for (s, j0) in (0..nc).step_by(NR).enumerate() {
        let w = NR.min(nc - j0);
        let dst = &mut out[s * NR * kc..(s + 1) * NR * kc];
        // SAFETY (all reads): column j0 + j < nc, rows < kc.
        let col = |j: usize| unsafe { b.add((j0 + j) * csb) };
        let full8 = kc / 8 * 8;
        for h in 0..w / 8 {
            for p0 in (0..full8).step_by(8) {
                // SAFETY: eight columns h·8.., rows p0..p0 + 8; the stores
                // land in rows p0..p0 + 8 of the sliver.
                unsafe {
                    let v = transpose8(std::array::from_fn(|j| {
                        _mm256_loadu_ps(col(h * 8 + j).add(p0))
                    }));
                    for (i, v) in v.into_iter().enumerate() {
                        _mm256_storeu_ps(dst.as_mut_ptr().add((p0 + i) * NR + h * 8), v);
                    }
                }
            }
        }
        let done = w / 8 * 8;
        for p in 0..kc {
            let row = &mut dst[p * NR..p * NR + NR];
            let from = if p < full8 { done } else { 0 };
            for (j, r) in row.iter_mut().enumerate().take(w).skip(from) {
                // SAFETY: column j < w, row p < kc.
                *r = unsafe { *col(j).add(p) };
            }
            row[w..].fill(0.0);
        }
    }
}

/// One micro-tile's operands: `R` rows of `a` (`kc` elements each, at
/// element strides `(rsa, csa)`), `kc` rows of 16 elements of `b` (row stride
/// `ldb`: a packed sliver, or `b` itself), and where the `R × nr` results
/// go.
struct Tile {
    kc: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    ldb: usize,
    /// The next sliver (columns 16..32 of a wide tile), at row stride
    /// `ldb1`; [`micro`] does not read it.
    b1: *const f32,
    ldb1: usize,
    /// Where set, step `p` reads `b + rows[p]` (and `b1 + rows[p]`)
    /// instead of striding by `ldb` ([`Right`]'s row offsets, in place).
    rows: *const usize,
    c: *mut f32,
    rsc: usize,
    nr: usize,
    alpha: f32,
    beta: f32,
    /// The tile's rows' biases, added after `beta · c` (null: none).
    bias: *const f32,
    /// Applied last, before the store.
    act: Option<Activation>,
}

/// One element's epilogue, `out = v + beta · out` for a block sum `v`
/// already scaled by alpha: `v + out` when `beta = 1`, one fused
/// multiply-add otherwise, `v` (out unread) when `beta = 0`. [`micro`]'s
/// full-width columns do the same in vectors; the one-row kernels
/// ([`axpys`], [`dot_cols`]) and the edge columns call this, so every path
/// ends a block alike (what keeps the palette tiles bitwise equal).
#[inline(always)]
fn finish(v: f32, beta: f32, out: &mut f32) {
    *out = if beta == 1.0 {
        v + *out
    } else if beta != 0.0 {
        beta.mul_add(*out, v)
    } else {
        v
    };
}

/// The micro-tile of `rows` rows at `t`: [`micro_wide`] (one sliver or
/// two) where `wide`, else [`micro`].
#[inline(always)]
unsafe fn tile(t: &Tile, rows: usize, wide: bool) {
    // `rows` (at most the kernel's tile height) as the const parameter.
    macro_rules! by_rows {
        ($f:ident, $o:literal; $($r:literal)*) => {
            match rows {
                $($r => $f::<$r, $o>(t),)*
                _ => $f::<1, $o>(t),
            }
        };
        ($f:ident, $w:literal, $o:literal; $($r:literal)*) => {
            match rows {
                $($r => $f::<$r, $w, $o, 0>(t),)*
                _ => $f::<1, $w, $o, 0>(t),
            }
        };
    }
    // A full AVX-512 tile with an epilogue: in registers, stored once.
    let ep = epilogue(t);
    if wide && rows == MR_WIDE && matches!(ep, 1..=5 | 9..=13) {
        macro_rules! by_ep {
            ($w:literal, $o:literal) => {
                match ep {
                    1 => micro_wide::<MR_WIDE, $w, $o, 1>(t),
                    2 => micro_wide::<MR_WIDE, $w, $o, 2>(t),
                    3 => micro_wide::<MR_WIDE, $w, $o, 3>(t),
                    4 => micro_wide::<MR_WIDE, $w, $o, 4>(t),
                    5 => micro_wide::<MR_WIDE, $w, $o, 5>(t),
                    9 => micro_wide::<MR_WIDE, $w, $o, 9>(t),
                    10 => micro_wide::<MR_WIDE, $w, $o, 10>(t),
                    11 => micro_wide::<MR_WIDE, $w, $o, 11>(t),
                    12 => micro_wide::<MR_WIDE, $w, $o, 12>(t),
                    _ => micro_wide::<MR_WIDE, $w, $o, 13>(t),
                }
            };
        }
        // SAFETY: the caller's promise, passed on.
        unsafe {
            match (t.nr > NR, !t.rows.is_null()) {
                (true, false) => by_ep!(2, false),
                (false, false) => by_ep!(1, false),
                (true, true) => by_ep!(2, true),
                (false, true) => by_ep!(1, true),
            }
        }
        return;
    }
    // SAFETY: the caller's promise, passed on.
    unsafe {
        match (wide, t.nr > NR, !t.rows.is_null()) {
            (true, true, false) => by_rows!(micro_wide, 2, false; 12 11 10 9 8 7 6 5 4 3 2),
            (true, false, false) => by_rows!(micro_wide, 1, false; 12 11 10 9 8 7 6 5 4 3 2),
            (true, true, true) => by_rows!(micro_wide, 2, true; 12 11 10 9 8 7 6 5 4 3 2),
            (true, false, true) => by_rows!(micro_wide, 1, true; 12 11 10 9 8 7 6 5 4 3 2),
            (false, _, false) => by_rows!(micro, false; 6 5 4 3 2),
            (false, _, true) => by_rows!(micro, true; 6 5 4 3 2),
        }
        if !t.bias.is_null() || t.act.is_some() {
            finish_tile(t, rows);
        }
    }
}

/// [`micro_wide`]'s `EP`, an epilogue it applies in registers: the bias
/// ([`EP_BIAS`]), the activation ([`EP_ACT`]'s bits), and `beta = 1`
/// ([`EP_ACCUMULATE`], else 0); `alpha` is 1. 0: the general store, then
/// [`finish_tile`].
const EP_BIAS: u8 = 1;
const EP_ACT: u8 = 6;
const EP_RELU: u8 = 2;
const EP_CLIP: u8 = 4;
const EP_ACCUMULATE: u8 = 8;

/// The tile's [`micro_wide`] `EP`, or 0 where it has no bias or
/// activation, or an `alpha` or `beta` the registers' epilogue does not
/// take.
fn epilogue(t: &Tile) -> u8 {
    if t.alpha != 1.0 || (t.beta != 0.0 && t.beta != 1.0) {
        return 0;
    }
    let bias = if t.bias.is_null() { 0 } else { EP_BIAS };
    let act = match t.act {
        None => 0,
        Some(Activation::Relu) => EP_RELU,
        Some(Activation::Clip { .. }) => EP_CLIP,
    };
    if bias | act == 0 {
        return 0;
    }
    let acc = if t.beta == 1.0 { EP_ACCUMULATE } else { 0 };
    bias | act | acc
}

/// The [`Epilogue`] of a micro-tile just stored (still in L1): `c +=
/// bias` per row, then the activation. Kept out of the micro-kernels,
/// whose accumulators then stay in registers.
///
/// # Safety
/// As [`tile`]'s; the CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn finish_tile(t: &Tile, rows: usize) {
    use std::arch::x86_64::*;
    // One loop per activation and bias, so none tests either per vector.
    // SAFETY (all arms): the caller's promise, passed on.
    unsafe {
        match (t.act, t.bias.is_null()) {
            (None, true) => {}
            (None, false) => finish_rows::<true>(t, rows, |v| v),
            (Some(Activation::Relu), false) => {
                finish_rows::<true>(t, rows, |v| _mm256_max_ps(v, _mm256_setzero_ps()))
            }
            (Some(Activation::Relu), true) => {
                finish_rows::<false>(t, rows, |v| _mm256_max_ps(v, _mm256_setzero_ps()))
            }
            (Some(Activation::Clip { lo, hi }), no_bias) => {
                let (l, h) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
                let clip = |v| _mm256_min_ps(h, _mm256_max_ps(l, v));
                if no_bias {
                    finish_rows::<false>(t, rows, clip)
                } else {
                    finish_rows::<true>(t, rows, clip)
                }
            }
        }
    }
}

/// [`finish_tile`]'s loops: `c = f(c + bias)` (`BIAS`) or `f(c)`, eight
/// at a time, the tail one by one through [`Activation::apply`] (the same
/// arithmetic).
///
/// # Safety
/// As [`finish_tile`]'s.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn finish_rows<const BIAS: bool>(
    t: &Tile,
    rows: usize,
    f: impl Fn(std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
) {
    use std::arch::x86_64::*;
    // SAFETY: the tile's rows and columns lie in `c` (the caller's
    // promise); `bias`, when set, holds the tile's rows.
    unsafe {
        for i in 0..rows {
            let c = t.c.add(i * t.rsc);
            let b = if BIAS { *t.bias.add(i) } else { 0.0 };
            let bv = _mm256_set1_ps(b);
            let mut j = 0;
            while j + 8 <= t.nr {
                let mut v = _mm256_loadu_ps(c.add(j));
                if BIAS {
                    v = _mm256_add_ps(v, bv);
                }
                _mm256_storeu_ps(c.add(j), f(v));
                j += 8;
            }
            while j < t.nr {
                let out = &mut *c.add(j);
                if BIAS {
                    *out += b;
                }
                if let Some(act) = t.act {
                    *out = act.apply(*out);
                }
                j += 1;
            }
        }
    }
}

/// [`micro`] on AVX-512: `R × 16W` results (`W` slivers, `t.b` then
/// `t.b1`) in `RW` registers of 16 lanes. Each element is the same chain
/// of fused multiply-adds from zero and the same epilogue as in
/// [`micro`] (the edge columns masked instead of finished one by one, the
/// same arithmetic), so the two kernels give the same bits.
#[target_feature(enable = "avx512f")]
unsafe fn micro_wide<const R: usize, const W: usize, const ROWS: bool, const EP: u8>(t: &Tile) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    // SAFETY: `a` has R rows of kc at strides (rsa, csa); `b` (and `b1` when W
    // is 2) kc rows of NR at strides ldb (ldb1), or at `rows` (ROWS).
    unsafe {
        let (mut bp0, mut bp1) = (t.b, t.b1);
        for p in 0..t.kc {
            if ROWS {
                let o = *t.rows.add(p);
                (bp0, bp1) = (t.b.add(o), t.b1.add(o));
            }
            let mut bv = [_mm512_setzero_ps(); W];
            bv[0] = _mm512_loadu_ps(bp0);
            if W == 2 {
                bv[W - 1] = _mm512_loadu_ps(bp1);
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*t.a.add(i * t.rsa + p * t.csa));
                for (r, b) in row.iter_mut().zip(&bv) {
                    *r = _mm512_fmadd_ps(av, *b, *r);
                }
            }
            // (Past the last row after the last step: never read.)
            bp0 = bp0.wrapping_add(t.ldb);
            bp1 = bp1.wrapping_add(t.ldb1);
        }
        if EP != 0 {
            // A full tile's epilogue, every step known here (alpha 1, beta
            // 0 or 1, the bias, the activation), so the loops unroll and
            // the accumulators stay in registers.
            let (lo, hi) = match t.act {
                Some(Activation::Clip { lo, hi }) => (_mm512_set1_ps(lo), _mm512_set1_ps(hi)),
                _ => (_mm512_setzero_ps(), _mm512_setzero_ps()),
            };
            let masks: [__mmask16; W] = std::array::from_fn(|h| {
                let lanes = t.nr.saturating_sub(NR * h).min(NR);
                if lanes == NR {
                    !0
                } else {
                    (1u16 << lanes) - 1
                }
            });
            for (i, row) in acc.iter().enumerate() {
                let c = t.c.add(i * t.rsc);
                for (h, v) in row.iter().enumerate() {
                    let out = c.add(NR * h);
                    let mut v = *v;
                    if EP & EP_ACCUMULATE != 0 {
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(masks[h], out));
                    }
                    if EP & EP_BIAS != 0 {
                        v = _mm512_add_ps(v, _mm512_set1_ps(*t.bias.add(i)));
                    }
                    if EP & EP_ACT == EP_RELU {
                        v = _mm512_max_ps(v, _mm512_setzero_ps());
                    } else if EP & EP_ACT == EP_CLIP {
                        v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
                    }
                    _mm512_mask_storeu_ps(out, masks[h], v);
                }
            }
            return;
        }
        let alpha = _mm512_set1_ps(t.alpha);
        let beta = _mm512_set1_ps(t.beta);
        for (i, row) in acc.iter().enumerate() {
            let c = t.c.add(i * t.rsc);
            for (h, v) in row.iter().enumerate() {
                let lanes = t.nr.saturating_sub(NR * h).min(NR);
                let mask: __mmask16 = if lanes == NR { !0 } else { (1u16 << lanes) - 1 };
                let out = c.add(NR * h);
                let mut v = *v;
                if t.alpha != 1.0 {
                    v = _mm512_mul_ps(v, alpha);
                }
                if t.beta == 1.0 {
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, out));
                } else if t.beta != 0.0 {
                    v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, out), v);
                }
                _mm512_mask_storeu_ps(out, mask, v);
            }
        }
    }
}

/// `R × 16` results of `kc` rank-1 updates, kept in `2R` registers, then
/// `c = alpha · acc + beta · c` (the same arithmetic on every column,
/// edge columns included).
#[target_feature(enable = "avx2,fma")]
unsafe fn micro<const R: usize, const ROWS: bool>(t: &Tile) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // SAFETY: `a` has R rows of kc at strides (rsa, csa), `b` kc rows of NR at
    // stride ldb, or at `rows` (ROWS).
    unsafe {
        let mut bp = t.b;
        for p in 0..t.kc {
            if ROWS {
                bp = t.b.add(*t.rows.add(p));
            }
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*t.a.add(i * t.rsa + p * t.csa));
                row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                row[1] = _mm256_fmadd_ps(av, b1, row[1]);
            }
            // (Past the last row after the last step: never read.)
            bp = bp.wrapping_add(t.ldb);
        }
        let alpha = _mm256_set1_ps(t.alpha);
        let beta = _mm256_set1_ps(t.beta);
        for (i, row) in acc.iter().enumerate() {
            let c = t.c.add(i * t.rsc);
            let mut vals = [0f32; NR];
            for (h, v) in row.iter().enumerate() {
                let mut v = *v;
                if t.alpha != 1.0 {
                    v = _mm256_mul_ps(v, alpha);
                }
                if t.nr == NR {
                    let out = c.add(8 * h);
                    if t.beta == 1.0 {
                        v = _mm256_add_ps(v, _mm256_loadu_ps(out));
                    } else if t.beta != 0.0 {
                        v = _mm256_fmadd_ps(beta, _mm256_loadu_ps(out), v);
                    }
                    _mm256_storeu_ps(out, v);
                } else {
                    _mm256_storeu_ps(vals.as_mut_ptr().add(8 * h), v);
                }
            }
            if t.nr < NR {
                for (j, &v) in vals[..t.nr].iter().enumerate() {
                    finish(v, t.beta, &mut *c.add(j));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True (the test then returns) where the CPU lacks AVX2/FMA and the
    /// run does not require them; under `CI=true` or
    /// `GRAPHOPT_REQUIRE_SIMD=1` the test fails instead.
    fn skip_without_simd(test: &str) -> bool {
        !available()
            && graphopt_testutil::skip_or_fail(
                test,
                "the CPU has no AVX2/FMA",
                graphopt_testutil::require_simd(),
                "GRAPHOPT_REQUIRE_SIMD=1 or CI=true",
            )
    }

    use graphopt_testutil::uniform as fill;

    /// The epilogue's cases: alpha 1 or not, beta 0, 1 or other.
    const ALPHA_BETA: [(f32, f32); 4] = [(1.0, 0.0), (1.0, 1.0), (0.3, 0.0), (0.7, -1.5)];

    /// Each shape `(m, k, n)` with each of [`ALPHA_BETA`].
    fn cases(shapes: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize, f32, f32)> {
        let each =
            |&(m, k, n): &(usize, usize, usize)| ALPHA_BETA.map(|(al, be)| (m, k, n, al, be));
        shapes.iter().flat_map(each).collect()
    }

    /// `alpha · a · b + beta · c` in f64, `a` at strides `sa`.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: &[f32],
        sa: (usize, usize),
        b: &[f32],
        beta: f32,
        c: &[f32],
    ) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for p in 0..k {
                    s += a[i * sa.0 + p * sa.1] as f64 * b[p * n + j] as f64;
                }
                let old = if beta == 0.0 {
                    0.0
                } else {
                    beta as f64 * c[i * n + j] as f64
                };
                out[i * n + j] = (alpha as f64 * s + old) as f32;
            }
        }
        out
    }

    /// `got` within the f32 rounding of sums of `k` products of `want`.
    fn close(got: &[f32], want: &[f32], k: usize, what: impl Fn() -> String) {
        for (x, y) in got.iter().zip(want) {
            assert!(
                (x - y).abs() <= 2e-6 * (k as f32).sqrt() * 4.0,
                "{}: {x} vs {y}",
                what()
            );
        }
    }

    fn run(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: &[f32],
        sa: (usize, usize),
        b: &[f32],
        beta: f32,
        c: &mut [f32],
    ) {
        // SAFETY: the operands hold what the strides say; `c` is m × n.
        unsafe {
            sgemm(
                m,
                k,
                n,
                alpha,
                a.as_ptr(),
                sa,
                b.as_ptr(),
                (n, 1),
                beta,
                c.as_mut_ptr(),
                n,
            )
        }
    }

    /// Edge sizes (partial micro-tiles, several depth blocks, several row
    /// blocks and column panels), `a`'s rows contiguous or at a longer
    /// stride, and every alpha/beta case, against an f64 product.
    #[test]
    fn matches_a_naive_product() {
        if skip_without_simd("matches_a_naive_product") {
            return;
        }
        let shapes = [
            (1, 1, 1),
            (7, 3, 17),
            (13, 300, 49),
            (75, 513, 530),
            (200, 300, 20),
            (6, 256, 16),
            (2, 700, 5),
            // Rows of b 4200 floats apart: packed although m is one
            // micro-tile.
            (5, 40, 4200),
        ];
        for (m, k, n, alpha, beta) in cases(&shapes) {
            let a = fill(m * (k + 3), 1);
            let b = fill(k * n, 2);
            let c0 = fill(m * n, 3);
            for sa in [(k, 1), (k + 3, 1)] {
                let want = naive(m, k, n, alpha, &a, sa, &b, beta, &c0);
                let mut c = c0.clone();
                if beta == 0.0 {
                    // beta = 0 never reads c.
                    c.fill(f32::NAN);
                }
                run(m, k, n, alpha, &a, sa, &b, beta, &mut c);
                close(&c, &want, k, || {
                    format!("{m}x{k}x{n} alpha {alpha} beta {beta} {sa:?}")
                });
            }
        }
    }

    /// A column-major `a` (`transA`: strides `(1, m)`) read in place
    /// gives the bits of a row-major copy of it, on both kernels, edge
    /// tiles, several row blocks and depth blocks.
    #[test]
    fn column_major_a_gives_the_bits_of_a_row_major_copy() {
        if skip_without_simd("column_major_a_gives_the_bits_of_a_row_major_copy") {
            return;
        }
        for (m, k, n, alpha, beta) in cases(&[(7, 3, 17), (100, 300, 49), (13, 513, 70)]) {
            let at = fill(k * m, 21); // [k × m]: a = atᵀ
            let a: Vec<f32> = (0..m * k).map(|i| at[(i % k) * m + i / k]).collect();
            let b = fill(k * n, 22);
            let c0 = fill(m * n, 23);
            for wide in [false, true].into_iter().filter(|&w| !w || super::wide()) {
                let mut got = [c0.clone(), c0.clone()];
                for (src, sa, c) in [(&at, (1, m)), (&a, (k, 1))]
                    .into_iter()
                    .zip(&mut got)
                    .map(|((s, sa), c)| (s, sa, c))
                {
                    // SAFETY: the operands hold what the strides say.
                    unsafe {
                        sgemm_on(
                            wide,
                            m,
                            k,
                            n,
                            alpha,
                            src.as_ptr(),
                            sa,
                            Right::strided(b.as_ptr(), (n, 1)),
                            beta,
                            c.as_mut_ptr(),
                            n,
                            Epilogue::NONE,
                        )
                    }
                }
                assert!(
                    graphopt_testutil::same_bits(&got[0], &got[1]),
                    "{m}x{k}x{n} alpha {alpha} beta {beta} wide {wide}"
                );
            }
        }
    }

    /// A column-major `b` (`transB`: strides `(1, k)`), packed through
    /// 8 × 8 transposes with ragged edges, gives the bits of a row-major
    /// copy of it: depths and widths around multiples of 8 and 16.
    #[test]
    fn column_major_b_gives_the_bits_of_a_row_major_copy() {
        if skip_without_simd("column_major_b_gives_the_bits_of_a_row_major_copy") {
            return;
        }
        for (m, k, n) in [
            (100, 300, 49),
            (97, 7, 9),
            (130, 257, 24),
            (5, 16, 300),
            (98, 600, 15),
        ] {
            let bt = fill(n * k, 41); // [n × k]: b = btᵀ
            let b: Vec<f32> = (0..k * n).map(|i| bt[(i % n) * k + i / n]).collect();
            let a = fill(m * k, 42);
            let mut got = [vec![f32::NAN; m * n], vec![f32::NAN; m * n]];
            for ((src, sb), c) in [(&bt, (1, k)), (&b, (n, 1))].into_iter().zip(&mut got) {
                // SAFETY: the operands hold what the strides say.
                unsafe {
                    sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        (k, 1),
                        src.as_ptr(),
                        sb,
                        0.0,
                        c.as_mut_ptr(),
                        n,
                    )
                }
            }
            assert!(
                graphopt_testutil::same_bits(&got[0], &got[1]),
                "{m}x{k}x{n}"
            );
        }
    }

    /// A right operand given by row offsets ([`sgemm_rows_bias_act`]:
    /// rows overlapping and out of order in one buffer) gives the bits of
    /// the same rows copied into a matrix: read in place (m within one
    /// micro-tile, full slivers, with a partial edge beside them) and
    /// packed (taller), with bias and activation.
    #[test]
    fn row_offsets_give_the_bits_of_the_matrix_they_make() {
        if skip_without_simd("row_offsets_give_the_bits_of_the_matrix_they_make") {
            return;
        }
        let buf = fill(4000, 31);
        for (m, k, n) in [
            (12, 40, 53),
            (5, 40, 53),
            (50, 300, 53),
            (200, 270, 100),
            (5, 9, 7),
        ] {
            let rows: Vec<usize> = (0..k).map(|p| (p * 37 + p * p) % (4000 - n)).collect();
            let b: Vec<f32> = rows.iter().flat_map(|&r| buf[r..r + n].to_vec()).collect();
            let a = fill(m * k, 32);
            let bias = fill(m, 33);
            let act = Some(Activation::Clip { lo: -0.2, hi: 0.3 });
            let mut want = vec![f32::NAN; m * n];
            // SAFETY: the operands hold what the strides and offsets say.
            unsafe {
                sgemm_bias_act(
                    m,
                    k,
                    n,
                    a.as_ptr(),
                    (k, 1),
                    b.as_ptr(),
                    (n, 1),
                    Some(&bias),
                    act,
                    want.as_mut_ptr(),
                    n,
                );
            }
            let mut got = vec![f32::NAN; m * n];
            // SAFETY: as above.
            unsafe {
                sgemm_rows_bias_act(
                    m,
                    k,
                    n,
                    a.as_ptr(),
                    (k, 1),
                    (buf.as_ptr(), &rows),
                    Some(&bias),
                    act,
                    got.as_mut_ptr(),
                    n,
                )
            };
            let same = |got: &[f32]| graphopt_testutil::same_bits(got, &want);
            assert!(same(&got), "{m}x{k}x{n}");
            // Both kernels (the AVX-512 one where the CPU has it).
            for wide in [false, true].into_iter().filter(|&w| !w || super::wide()) {
                got.fill(f32::NAN);
                let b = Right {
                    ptr: buf.as_ptr(),
                    rsb: 0,
                    csb: 1,
                    rows: rows.as_ptr(),
                };
                let ep = Epilogue {
                    bias: bias.as_ptr(),
                    act,
                };
                // SAFETY: as above.
                unsafe {
                    sgemm_on(
                        wide,
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        (k, 1),
                        b,
                        0.0,
                        got.as_mut_ptr(),
                        n,
                        ep,
                    )
                };
                assert!(same(&got), "{m}x{k}x{n} wide {wide}");
            }
        }
    }

    /// The AVX-512 kernel gives the AVX2 kernel's bits, on edge tiles
    /// (rows under 12 and 6, a last sliver of 1-31 columns, one or two
    /// slivers wide), `b` read in place (m within one micro-tile) or
    /// packed, both strides
    /// of `b`, and every alpha/beta case. (Where the CPU lacks AVX-512 only
    /// the AVX2 kernel runs, and this has nothing to compare.)
    #[test]
    fn wide_kernel_gives_the_avx2_bits() {
        if skip_without_simd("wide_kernel_gives_the_avx2_bits") || !wide() {
            eprintln!(
                "wide_kernel_gives_the_avx2_bits: no AVX-512F on this CPU, nothing to compare"
            );
            return;
        }
        let shapes = [
            (1, 5, 1),
            (13, 300, 49),
            (25, 70, 17),
            (100, 513, 530),
            (12, 256, 32),
            (96, 40, 47),
            (7, 600, 33),
            (200, 64, 70),
            (20, 40, 4200),
        ];
        for (m, k, n, alpha, beta) in cases(&shapes) {
            let a = fill(m * k, 6);
            let b = fill(k * n, 7);
            let c0 = fill(m * n, 8);
            for sb in [(n, 1), (1, k)] {
                let mut got = [c0.clone(), c0.clone()];
                for (wide, c) in [false, true].into_iter().zip(&mut got) {
                    // SAFETY: the operands hold what the strides say; the
                    // CPU has AVX-512F (checked above).
                    unsafe {
                        sgemm_on(
                            wide,
                            m,
                            k,
                            n,
                            alpha,
                            a.as_ptr(),
                            (k, 1),
                            Right::strided(b.as_ptr(), sb),
                            beta,
                            c.as_mut_ptr(),
                            n,
                            Epilogue::NONE,
                        )
                    }
                }
                let same = graphopt_testutil::same_bits(&got[0], &got[1]);
                assert!(
                    same,
                    "{m}x{k}x{n} alpha {alpha} beta {beta} b strides {sb:?}"
                );
            }
        }
    }

    /// [`sgemm_bias_act`] against a bias fill, [`sgemm`] with beta = 1 and
    /// the activation applied element by element: the same bits, on edge
    /// rows and columns, several depth blocks, and each activation.
    #[test]
    fn bias_and_activation_epilogue_gives_the_bits_of_three_passes() {
        if skip_without_simd("bias_and_activation_epilogue_gives_the_bits_of_three_passes") {
            return;
        }
        let acts = [
            None,
            Some(Activation::Relu),
            Some(Activation::Clip { lo: -0.3, hi: 0.4 }),
        ];
        for (m, k, n) in [(13, 7, 37), (25, 600, 50), (1, 3, 5), (12, 256, 32)] {
            let a = fill(m * k, 1);
            let b = fill(k * n, 2);
            let bias = fill(m, 3);
            for act in acts {
                for with_bias in [false, true] {
                    let bias = with_bias.then_some(&bias[..]);
                    let mut got = vec![f32::NAN; m * n];
                    let mut want: Vec<f32> =
                        (0..m * n).map(|i| bias.map_or(0.0, |b| b[i / n])).collect();
                    // SAFETY: the operands hold what the strides say.
                    unsafe {
                        sgemm_bias_act(
                            m,
                            k,
                            n,
                            a.as_ptr(),
                            (k, 1),
                            b.as_ptr(),
                            (n, 1),
                            bias,
                            act,
                            got.as_mut_ptr(),
                            n,
                        );
                        sgemm(
                            m,
                            k,
                            n,
                            1.0,
                            a.as_ptr(),
                            (k, 1),
                            b.as_ptr(),
                            (n, 1),
                            1.0,
                            want.as_mut_ptr(),
                            n,
                        );
                    }
                    if let Some(act) = act {
                        want.iter_mut().for_each(|v| *v = act.apply(*v));
                    }
                    let same = graphopt_testutil::same_bits(&got, &want);
                    assert!(same, "{m}x{k}x{n} bias {with_bias} {act:?}");
                }
            }
        }
    }

    /// Rows and columns computed in separate calls (as the thread split
    /// does), and `k` walked in tiles of KC with beta = 1 (as the palette
    /// kernels do), give the bits of one call.
    #[test]
    fn splits_give_the_same_bits() {
        if skip_without_simd("splits_give_the_same_bits") {
            return;
        }
        let (m, k, n) = (70, 600, 45);
        let (a, b) = (fill(m * k, 4), fill(k * n, 5));
        let mut whole = vec![0f32; m * n];
        run(m, k, n, 1.0, &a, (k, 1), &b, 0.0, &mut whole);
        let mut parts = vec![0f32; m * n];
        for (r0, r1) in [(0, 13), (13, 64), (64, 70)] {
            for (c0, c1) in [(0, 16), (16, 45)] {
                // SAFETY: rows r0..r1, columns c0..c1 of the operands.
                unsafe {
                    sgemm(
                        r1 - r0,
                        k,
                        c1 - c0,
                        1.0,
                        a.as_ptr().add(r0 * k),
                        (k, 1),
                        b.as_ptr().add(c0),
                        (n, 1),
                        0.0,
                        parts.as_mut_ptr().add(r0 * n + c0),
                        n,
                    )
                }
            }
        }
        assert_eq!(whole, parts);
        let mut tiled = vec![0f32; m * n];
        for k0 in (0..k).step_by(KC) {
            let kt = KC.min(k - k0);
            // SAFETY: columns k0..k0+kt of a, rows k0..k0+kt of b.
            unsafe {
                sgemm(
                    m,
                    kt,
                    n,
                    1.0,
                    a.as_ptr().add(k0),
                    (k, 1),
                    b.as_ptr().add(k0 * n),
                    (n, 1),
                    if k0 == 0 { 0.0 } else { 1.0 },
                    tiled.as_mut_ptr(),
                    n,
                )
            }
        }
        assert_eq!(whole, tiled);
    }

    /// `gemv` on `b` `[k × n]` stored row-major (`transposed`: as `[n × k]`,
    /// a Gemm with transB = 1).
    fn run_gemv(
        k: usize,
        n: usize,
        alpha: f32,
        a: &[f32],
        b: &[f32],
        transposed: bool,
        beta: f32,
        c: &mut [f32],
    ) {
        let sb = if transposed { (1, k) } else { (n, 1) };
        // SAFETY: `a` holds k, `b` k × n at `sb`, `c` n.
        unsafe {
            gemv(
                k,
                n,
                alpha,
                a.as_ptr(),
                b.as_ptr(),
                sb,
                beta,
                c.as_mut_ptr(),
            )
        }
    }

    /// Both layouts of `b`, sizes around the 16-wide and 4-column blocks
    /// and several depth blocks, every alpha/beta case, against an f64
    /// product.
    #[test]
    fn gemv_matches_a_naive_product() {
        if skip_without_simd("gemv_matches_a_naive_product") {
            return;
        }
        for &(k, n) in &[
            (1, 1),
            (15, 3),
            (16, 4),
            (17, 5),
            (300, 37),
            (600, 130),
            (2048, 9),
            (300, AXPY_COLS + 52),
        ] {
            for &(alpha, beta) in &ALPHA_BETA {
                let a = fill(k, 11);
                let b = fill(k * n, 12);
                let c0 = fill(n, 13);
                let want = naive(1, k, n, alpha, &a, (k, 1), &b, beta, &c0);
                // The same matrix as [n × k].
                let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
                for (bm, transposed) in [(&b, false), (&bt, true)] {
                    let mut c = c0.clone();
                    if beta == 0.0 {
                        c.fill(f32::NAN);
                    }
                    run_gemv(k, n, alpha, &a, bm, transposed, beta, &mut c);
                    close(&c, &want, k, || {
                        format!("{k}x{n} transposed {transposed} alpha {alpha} beta {beta}")
                    });
                }
            }
        }
    }

    /// Columns computed in separate calls, and `k` walked in tiles of KC
    /// with beta = 1 (as the palette kernels do), give the bits of one call,
    /// in both layouts.
    #[test]
    fn gemv_splits_give_the_same_bits() {
        if skip_without_simd("gemv_splits_give_the_same_bits") {
            return;
        }
        for (k, n, transposed) in [
            (700, 45, false),
            (700, 45, true),
            (300, AXPY_COLS + 52, false),
        ] {
            let a = fill(k, 14);
            let b = fill(k * n, 15);
            let sb = if transposed { (1, k) } else { (n, 1) };
            let mut whole = vec![0f32; n];
            run_gemv(k, n, 1.0, &a, &b, transposed, 0.0, &mut whole);
            let mut parts = vec![0f32; n];
            for (c0, c1) in [(0, 5), (5, 21), (21, n)] {
                // SAFETY: columns c0..c1 of b and c.
                unsafe {
                    gemv(
                        k,
                        c1 - c0,
                        1.0,
                        a.as_ptr(),
                        b.as_ptr().add(c0 * sb.1),
                        sb,
                        0.0,
                        parts.as_mut_ptr().add(c0),
                    )
                }
            }
            assert!(
                whole == parts,
                "{k}x{n} transposed {transposed}: column parts"
            );
            let mut tiled = vec![0f32; n];
            for k0 in (0..k).step_by(KC) {
                let kt = KC.min(k - k0);
                // SAFETY: elements k0..k0+kt of a and of each column.
                unsafe {
                    gemv(
                        kt,
                        n,
                        1.0,
                        a.as_ptr().add(k0),
                        b.as_ptr().add(k0 * sb.0),
                        sb,
                        if k0 == 0 { 0.0 } else { 1.0 },
                        tiled.as_mut_ptr(),
                    )
                }
            }
            assert!(whole == tiled, "{k}x{n} transposed {transposed}: k tiles");
            if !transposed {
                // A row-major b: the sums of a one-row sgemm.
                let mut one = vec![0f32; n];
                run(1, k, n, 1.0, &a, (k, 1), &b, 0.0, &mut one);
                assert!(whole == one, "{k}x{n}: one-row sgemm");
            }
        }
    }
}
