//! Integer GEMM for quantized MatMuls: uint8 activations times int8 or
//! uint8 weights, summed exactly in 32-bit integers, scaled once (the
//! fused `IntegerMatMul` of `--quantize` models) or not at all (ONNX's
//! `MatMulInteger` with a constant weight; the quantized convolutions and
//! QLinearMatMul of [`super::qlinear`] also pack unfolded image tiles and
//! fed operands as the "weight", once per tile or batch and run).
//!
//! What it computes, for `x` `[m × k]` (uint8, one scale `xs` and zero
//! point `xz`) and `w` `[k × n]` (int8 or uint8, per-tensor or per-column
//! scales `ws` and zero points `wz`):
//!
//! ```text
//! y[i, j] = (xs · ws[j]) · Σ_p (x[i, p] − xz) · (w[p, j] − wz[j])
//! ```
//!
//! The sum is exact (integers), so the result is the exact product rounded
//! three times (the sum to f32, `xs · ws[j]`, their product), where `DequantizeLinear` then a
//! float MatMul rounds every product and partial sum: the same value up to
//! float32 rounding, not the same bits. It is the same for every thread
//! count and on every CPU: the AVX-512 VNNI kernel and the portable loop
//! make the same integers and the same epilogue.
//!
//! How: `Σ (x − xz)(w − wz) = Σ x·w' + rx·(s − wz) + xz·(k·wz − cw)`, with
//! `w' = w − s` as int8 (`s` = 128 for uint8 weights, 0 for int8), `rx` the
//! row sums of `x` and `cw` the column sums of `w` (made once, the weight is
//! a constant). `Σ x·w'` is `vpdpbusd` (uint8 × int8, four products a
//! lane): `w'` is packed per thread and panel of columns into slivers of
//! 16 columns × 4 rows (64 bytes, one register), and 8 rows of `x` × 2
//! slivers accumulate in 16 registers over the whole depth. i32 sums are
//! exact while `|Σ (x − xz)(w − wz)| < 2³¹`, that is `k ≤ 33025`
//! ([`MAX_K`]); wrapping arithmetic keeps intermediate overflow harmless.

use crate::backend::{In, Kernel, KernelIo, NodeCtx};
use crate::cpu::par;
use crate::tensor::{cast_mut, numel};
use graphopt_ir::DType;

/// Deepest product whose sums fit in i32 (`k · 255 · 255 < 2³¹`).
pub const MAX_K: usize = 33025;
/// Columns per sliver (one 512-bit register of i32).
const NR: usize = 16;
/// Rows per micro-tile.
const MR: usize = 8;
/// Columns of `w` per packed panel.
const NC: usize = 256;

/// A constant weight's layout and column sums.
#[derive(Clone, Debug)]
pub struct QWeight {
    pub k: usize,
    pub n: usize,
    /// Bytes from one row of `w` to the next (`n` unless strided).
    pub ld: usize,
    /// int8 (else uint8).
    pub signed: bool,
    /// `Σ_p w[p, j]`.
    colsum: Vec<i32>,
}

impl QWeight {
    /// Reads the weight's bytes (`k × n`, row-major) once.
    pub fn new(k: usize, n: usize, signed: bool, w: &[u8]) -> QWeight {
        QWeight::strided(k, n, n, signed, w)
    }

    /// [`QWeight::new`] of `k` rows of `n` bytes, `ld` bytes apart.
    pub fn strided(k: usize, n: usize, ld: usize, signed: bool, w: &[u8]) -> QWeight {
        let mut colsum = vec![0i32; n];
        if n > 0 {
            for p in 0..k {
                let row = &w[p * ld..][..n];
                if signed {
                    for (c, &v) in colsum.iter_mut().zip(row) {
                        *c += v as i8 as i32;
                    }
                } else {
                    for (c, &v) in colsum.iter_mut().zip(row) {
                        *c += v as i32;
                    }
                }
            }
        }
        QWeight {
            k,
            n,
            ld,
            signed,
            colsum,
        }
    }

    /// `Σ_p w[p, j]` for each column `j`.
    pub fn colsums(&self) -> &[i32] {
        &self.colsum
    }

    /// What `w'` subtracts from `w`: 128 for uint8, 0 for int8.
    fn shift(&self) -> i32 {
        if self.signed {
            0
        } else {
            128
        }
    }
}

/// The per-column epilogue terms of one run.
struct Epilogue {
    /// `s − wz[j]`.
    a: Vec<i32>,
    /// `xz · (k·wz[j] − cw[j])`.
    b: Vec<i32>,
    /// `xs · ws[j]`; `None`: the i32 sums are the output.
    scale: Option<Vec<f32>>,
    /// Added after the scale (IntegerGemm's bias), `n` floats.
    bias: Option<Vec<f32>>,
}

/// The scales of a float output: `xs`, `ws` (one or `n`), and a bias
/// added after them (`n`, or none).
#[derive(Clone, Copy)]
pub struct Scales<'a> {
    pub xs: f32,
    pub ws: &'a [f32],
    pub bias: Option<&'a [f32]>,
}

/// `y[m × n] = (xs·ws) · (x − xz)(w − wz) (+ bias)` (see the module docs),
/// as f32 bits; without `scales`, the exact sums as i32 bits
/// (MatMulInteger). `ws` and `wz` hold one value or `n`; `x` holds `m` rows
/// of `k`, `y` `m × n`.
#[allow(clippy::too_many_arguments)]
pub fn qmatmul(
    q: &QWeight,
    m: usize,
    x: &[u8],
    xz: i32,
    w: &[u8],
    wz: &[i32],
    scales: Option<Scales>,
    y: &mut [u32],
    threads: usize,
) {
    let (k, n) = (q.k, q.n);
    assert!(
        k <= MAX_K
            && x.len() >= m * k
            && (k == 0 || n == 0 || w.len() >= (k - 1) * q.ld + n)
            && y.len() >= m * n,
        "qmatmul operands"
    );
    let at = |v: &[i32], j: usize| if v.len() == 1 { v[0] } else { v[j] };
    let ep = Epilogue {
        a: (0..n).map(|j| q.shift().wrapping_sub(at(wz, j))).collect(),
        b: (0..n)
            .map(|j| xz.wrapping_mul((k as i32).wrapping_mul(at(wz, j)).wrapping_sub(q.colsum[j])))
            .collect(),
        scale: scales.map(|s| {
            (0..n)
                .map(|j| s.xs * if s.ws.len() == 1 { s.ws[0] } else { s.ws[j] })
                .collect()
        }),
        bias: scales.and_then(|s| s.bias).map(|b| b[..n].to_vec()),
    };
    // Row sums, and the rows padded to a multiple of 4 bytes.
    let k4 = k.next_multiple_of(4);
    let rx: Vec<i32> = x[..m * k]
        .chunks_exact(k.max(1))
        .map(|r| r.iter().map(|&v| v as i32).sum())
        .collect();
    let padded: Vec<u8>;
    let xa: &[u8] = if k4 == k {
        &x[..m * k]
    } else {
        let mut p = vec![0u8; m * k4];
        for (d, s) in p.chunks_exact_mut(k4).zip(x.chunks_exact(k)) {
            d[..k].copy_from_slice(s);
        }
        padded = p;
        &padded
    };
    let slivers = n.div_ceil(NR);
    let parts = par::parts(slivers, threads, 1);
    let yp = SendPtr(y.as_mut_ptr());
    let vnni = vnni();
    par::for_parts(threads, parts, |p| {
        let r = par::range(slivers, parts, p);
        let (j0, j1) = (r.start * NR, (r.end * NR).min(n));
        // Part p writes columns j0..j1 of y's m rows only, through y.
        let y = yp.get();
        if vnni {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has AVX-512F and VNNI (checked); operands
            // sized above; no other part touches columns j0..j1.
            unsafe {
                part_vnni(q, m, xa, k4, &rx, w, &ep, y, j0, j1)
            };
        } else {
            // SAFETY: as above.
            unsafe { part_plain(q, m, xa, k4, &rx, w, &ep, y, j0, j1) };
        }
    });
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u32);
// SAFETY: each part writes its own columns (see `qmatmul`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut u32 {
        self.0
    }
}

/// Whether the integer GEMM runs its VNNI kernel on this CPU (AVX-512F and
/// AVX-512 VNNI); elsewhere it takes the portable loop, exact but slower
/// than a float GEMM.
pub fn available() -> bool {
    vnni()
}

fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `w'[p, j]` as the i8 the kernels multiply.
#[inline(always)]
fn wprime(w: u8, signed: bool) -> i8 {
    if signed {
        w as i8
    } else {
        (w ^ 0x80) as i8
    }
}

/// One element's epilogue, as the output's bits: the exact sum, then one
/// rounding to f32 and one product (or the sum itself).
#[inline(always)]
fn finish(acc: i32, rx: i32, j: usize, ep: &Epilogue) -> u32 {
    let t = acc
        .wrapping_add(rx.wrapping_mul(ep.a[j]))
        .wrapping_add(ep.b[j]);
    match (&ep.scale, &ep.bias) {
        (Some(s), None) => (t as f32 * s[j]).to_bits(),
        (Some(s), Some(b)) => (t as f32 * s[j] + b[j]).to_bits(),
        (None, _) => t as u32,
    }
}

/// Columns `j0..j1` of `y` with plain loops (any CPU): the same integer
/// sums and epilogue as [`part_vnni`].
///
/// # Safety
/// `y` holds `m × q.n` elements, and nothing else touches columns
/// `j0..j1` of them during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn part_plain(
    q: &QWeight,
    m: usize,
    xa: &[u8],
    k4: usize,
    rx: &[i32],
    w: &[u8],
    ep: &Epilogue,
    y: *mut u32,
    j0: usize,
    j1: usize,
) {
    let (k, ld) = (q.k, q.ld);
    let n = q.n;
    let mut acc = vec![0i32; j1 - j0];
    for i in 0..m {
        acc.fill(0);
        let row = &xa[i * k4..i * k4 + k];
        for (p, &xv) in row.iter().enumerate() {
            let xv = xv as i32;
            for (a, &wv) in acc.iter_mut().zip(&w[p * ld + j0..p * ld + j1]) {
                *a = a.wrapping_add(xv * wprime(wv, q.signed) as i32);
            }
        }
        for (c, &a) in acc.iter().enumerate() {
            // SAFETY: row i, column j0 + c < j1 (the caller's promise).
            unsafe { *y.add(i * n + j0 + c) = finish(a, rx[i], j0 + c, ep) };
        }
    }
}

/// Columns `j0..j1` of `y` on AVX-512 VNNI: panels of [`NC`] columns packed
/// as `w'` slivers, then micro-tiles of up to [`MR`] rows × 2 slivers.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 VNNI; `xa` holds `m` rows of `k4`
/// bytes (zero past `q.k`), `w` `q.k × q.n`, `y` `m × q.n`, of which
/// nothing else touches columns `j0..j1` during the call.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn part_vnni(
    q: &QWeight,
    m: usize,
    xa: &[u8],
    k4: usize,
    rx: &[i32],
    w: &[u8],
    ep: &Epilogue,
    y: *mut u32,
    j0: usize,
    j1: usize,
) {
    let groups = k4 / 4;
    PANEL.with(|panel| {
        let mut panel = panel.borrow_mut();
        let len = NC.div_ceil(NR) * groups * NR * 4;
        if panel.len() < len {
            panel.resize(len, 0);
        }
        // SAFETY: the caller's promise, passed on.
        unsafe { panels_vnni(q, m, xa, k4, rx, w, ep, y, (j0, j1), &mut panel[..len]) };
    });
}

thread_local! {
    /// A thread's packed panel of `w'` ([`part_vnni`]), reused across calls
    /// (every byte of it is written before it is read).
    static PANEL: std::cell::RefCell<Vec<i8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`part_vnni`] with its panel.
///
/// # Safety
/// As [`part_vnni`]'s.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn panels_vnni(
    q: &QWeight,
    m: usize,
    xa: &[u8],
    k4: usize,
    rx: &[i32],
    w: &[u8],
    ep: &Epilogue,
    y: *mut u32,
    (j0, j1): (usize, usize),
    panel: &mut [i8],
) {
    let n = q.n;
    let groups = k4 / 4;
    for pc in (j0..j1).step_by(NC) {
        let nc = NC.min(j1 - pc);
        let slivers = nc.div_ceil(NR);
        pack(q, w, pc, nc, groups, panel);
        for i0 in (0..m).step_by(MR) {
            let rows = MR.min(m - i0);
            for s in (0..slivers).step_by(2) {
                let two = s + 1 < slivers;
                let t = Micro {
                    x: xa.as_ptr().wrapping_add(i0 * k4),
                    k4,
                    b: panel.as_ptr().wrapping_add(s * groups * NR * 4),
                    groups,
                    rx: &rx[i0..i0 + rows],
                    ep,
                    y: y.wrapping_add(i0 * n),
                    n,
                    j: pc + s * NR,
                    cols: (nc - s * NR).min(if two { 2 * NR } else { NR }),
                };
                // SAFETY: the caller's promise; the tile lies inside the
                // operands.
                unsafe {
                    match (rows, two) {
                        (8, true) => micro::<8, 2>(&t),
                        (8, false) => micro::<8, 1>(&t),
                        (r, true) => by_rows::<2>(r, &t),
                        (r, false) => by_rows::<1>(r, &t),
                    }
                }
            }
        }
    }
}

/// [`micro`] with `rows` (< 8) as its const parameter.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn by_rows<const W: usize>(rows: usize, t: &Micro) {
    // SAFETY: the caller's promise, passed on.
    unsafe {
        match rows {
            7 => micro::<7, W>(t),
            6 => micro::<6, W>(t),
            5 => micro::<5, W>(t),
            4 => micro::<4, W>(t),
            3 => micro::<3, W>(t),
            2 => micro::<2, W>(t),
            _ => micro::<1, W>(t),
        }
    }
}

/// Packs columns `pc..pc + nc` of `w` as `w'`: sliver `s`, group `g` (rows
/// `4g..4g+4`) at `(s·groups + g)·64`, column `c` of the sliver at `4c`,
/// zeros past the weight's rows and columns. Whole groups of 16 columns
/// interleave their four rows by SSE2 unpacks.
fn pack(q: &QWeight, w: &[u8], pc: usize, nc: usize, groups: usize, out: &mut [i8]) {
    let (k, ld) = (q.k, q.ld);
    for s in 0..nc.div_ceil(NR) {
        let c0 = pc + s * NR;
        let cols = NR.min(pc + nc - c0);
        for g in 0..groups {
            let dst = &mut out[(s * groups + g) * NR * 4..][..NR * 4];
            #[cfg(target_arch = "x86_64")]
            if cols == NR && 4 * g + 4 <= k {
                let rows: [&[u8]; 4] = std::array::from_fn(|r| &w[(4 * g + r) * ld + c0..][..NR]);
                interleave4(rows, q.signed, dst);
                continue;
            }
            for r in 0..4 {
                let p = 4 * g + r;
                if p >= k {
                    for c in 0..NR {
                        dst[4 * c + r] = 0;
                    }
                    continue;
                }
                let src = &w[p * ld + c0..p * ld + c0 + cols];
                for (c, &v) in src.iter().enumerate() {
                    dst[4 * c + r] = wprime(v, q.signed);
                }
                for c in cols..NR {
                    dst[4 * c + r] = 0;
                }
            }
        }
    }
}

/// `dst[4c + r] = w'(rows[r][c])` for 16 columns: four rows interleaved
/// bytewise, then as 16-bit pairs (SSE2, every x86-64 CPU has it).
#[cfg(target_arch = "x86_64")]
#[inline]
fn interleave4(rows: [&[u8]; 4], signed: bool, dst: &mut [i8]) {
    use std::arch::x86_64::*;
    assert!(rows.iter().all(|r| r.len() >= NR) && dst.len() >= 4 * NR);
    // SAFETY: SSE2 is part of x86-64; 16 bytes read from each row and 64
    // written to dst (checked above).
    unsafe {
        let flip = _mm_set1_epi8(if signed { 0 } else { -128 });
        let ld = |r: &[u8]| _mm_xor_si128(_mm_loadu_si128(r.as_ptr() as *const __m128i), flip);
        let (r0, r1, r2, r3) = (ld(rows[0]), ld(rows[1]), ld(rows[2]), ld(rows[3]));
        let (a, b) = (_mm_unpacklo_epi8(r0, r1), _mm_unpackhi_epi8(r0, r1));
        let (c, d) = (_mm_unpacklo_epi8(r2, r3), _mm_unpackhi_epi8(r2, r3));
        let o = dst.as_mut_ptr() as *mut __m128i;
        _mm_storeu_si128(o, _mm_unpacklo_epi16(a, c));
        _mm_storeu_si128(o.add(1), _mm_unpackhi_epi16(a, c));
        _mm_storeu_si128(o.add(2), _mm_unpacklo_epi16(b, d));
        _mm_storeu_si128(o.add(3), _mm_unpackhi_epi16(b, d));
    }
}

/// One micro-tile: `R` rows of `x` (row stride `k4`), `W` packed slivers
/// from `b` (sliver stride `groups · 64`), into columns `j..j + cols` of
/// `R` rows of `y`.
#[cfg(target_arch = "x86_64")]
struct Micro<'a> {
    x: *const u8,
    k4: usize,
    b: *const i8,
    groups: usize,
    rx: &'a [i32],
    ep: &'a Epilogue,
    y: *mut u32,
    n: usize,
    j: usize,
    cols: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn micro<const R: usize, const W: usize>(t: &Micro) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_si512(); W]; R];
    for g in 0..t.groups {
        let mut b = [_mm512_setzero_si512(); W];
        for (s, bv) in b.iter_mut().enumerate() {
            // SAFETY: sliver s, group g of the packed panel.
            *bv = unsafe {
                _mm512_loadu_si512(t.b.add((s * t.groups + g) * NR * 4) as *const __m512i)
            };
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: bytes 4g..4g+4 of row i (rows are k4 long).
            let a = unsafe {
                _mm512_set1_epi32(std::ptr::read_unaligned(
                    t.x.add(i * t.k4 + 4 * g) as *const i32
                ))
            };
            for (s, r) in row.iter_mut().enumerate() {
                *r = _mm512_dpbusd_epi32(*r, a, b[s]);
            }
        }
    }
    // The epilogue in vectors: `finish`'s wrapping i32 arithmetic, its
    // round-to-nearest conversion and its product, lane by lane (the same
    // bits), on the columns that exist (masked).
    for (i, row) in acc.iter().enumerate() {
        let rx = _mm512_set1_epi32(t.rx[i]);
        for (s, r) in row.iter().enumerate() {
            let c0 = s * NR;
            if c0 >= t.cols {
                break;
            }
            let cnt = (t.cols - c0).min(NR);
            let mask: __mmask16 = if cnt == NR { 0xFFFF } else { (1u16 << cnt) - 1 };
            let j = t.j + c0;
            // SAFETY: columns j..j + cnt < n of the epilogue's vectors and
            // of row i of y (masked loads and stores touch only those).
            unsafe {
                let a = _mm512_maskz_loadu_epi32(mask, t.ep.a.as_ptr().add(j));
                let b = _mm512_maskz_loadu_epi32(mask, t.ep.b.as_ptr().add(j));
                let tot = _mm512_add_epi32(_mm512_add_epi32(*r, _mm512_mullo_epi32(rx, a)), b);
                let y = t.y.add(i * t.n + j);
                match &t.ep.scale {
                    Some(sc) => {
                        let sv = _mm512_maskz_loadu_ps(mask, sc.as_ptr().add(j));
                        let mut f = _mm512_mul_ps(_mm512_cvtepi32_ps(tot), sv);
                        if let Some(b) = &t.ep.bias {
                            f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(mask, b.as_ptr().add(j)));
                        }
                        _mm512_mask_storeu_ps(y as *mut f32, mask, f);
                    }
                    None => _mm512_mask_storeu_epi32(y as *mut i32, mask, tot),
                }
            }
        }
    }
}

/// The kernel of `IntegerMatMul(xq, xs, xz?, q, scale, zero_point?)` and
/// `IntegerGemm(xq, xs, xz?, q, scale, zero_point?, B)` ([`crate::lower`]):
/// `xq` uint8 `[…, k]` with one scale and zero point (what
/// DynamicQuantizeLinear or a per-tensor QuantizeLinear makes), `q` a
/// constant int8/uint8 `[k, n]` with per-tensor or per-column float32
/// scales, `B` float32 `[n]` added to every row; the output float32
/// `[…, n]`.
pub fn kernel(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let xs = ctx.input(1)?;
    let w = ctx.input(3)?;
    let ws = ctx.input(4)?;
    let (&[k, n], Some(k2)) = (w.shape.as_slice(), x.shape.last().copied()) else {
        return Err(format!(
            "IntegerMatMul of {:?} and a weight {:?}",
            x.shape, w.shape
        ));
    };
    if x.dtype != DType::U8 || xs.dtype != DType::F32 || numel(&xs.shape) != 1 || k2 != k {
        return Err(format!(
            "IntegerMatMul of {} {:?} (scale {:?}) and a weight [{k}, {n}]",
            x.dtype.name(),
            x.shape,
            xs.shape
        ));
    }
    if let Some(z) = ctx.inputs.get(2).cloned().flatten() {
        if z.dtype != DType::U8 || numel(&z.shape) != 1 {
            return Err(format!(
                "an activation zero point of {} {:?}",
                z.dtype.name(),
                z.shape
            ));
        }
    }
    let signed = match w.dtype {
        DType::I8 => true,
        DType::U8 => false,
        d => return Err(format!("an integer weight of {}", d.name())),
    };
    let nw = numel(&ws.shape);
    if ws.dtype != DType::F32 || (nw != 1 && ws.shape != [n]) {
        return Err(format!("weight scales {:?} for [{k}, {n}]", ws.shape));
    }
    if let Some(z) = ctx.inputs.get(5).cloned().flatten() {
        if z.dtype != w.dtype || numel(&z.shape) != nw {
            return Err(format!(
                "weight zero points {} {:?}",
                z.dtype.name(),
                z.shape
            ));
        }
    }
    if k > MAX_K {
        return Err(format!(
            "a depth of {k} (at most {MAX_K} sums exactly in i32)"
        ));
    }
    let bytes = ctx
        .constants
        .get(3)
        .copied()
        .flatten()
        .ok_or("the integer weight is not a constant")?;
    if let Some(b) = ctx.inputs.get(6).cloned().flatten() {
        if b.dtype != DType::F32 || b.shape != [n] {
            return Err(format!(
                "a bias of {} {:?} for {n} columns (float [{n}])",
                b.dtype.name(),
                b.shape
            ));
        }
    }
    let rows = numel(&x.shape) / k.max(1);
    if numel(&ctx.outputs[0].shape) != rows * n {
        return Err(format!(
            "output {:?} for {rows} x {n}",
            ctx.outputs[0].shape
        ));
    }
    Ok(Box::new(IntegerMatMul {
        q: QWeight::new(k, n, signed, bytes),
        rows,
    }))
}

struct IntegerMatMul {
    q: QWeight,
    rows: usize,
}

/// A zero point's values (int8 or uint8), or `[0]` when absent.
fn zero_points(x: Option<In>) -> Result<Vec<i32>, String> {
    x.map_or(Ok(vec![0]), |z| crate::cpu::quant::ints(&z))
}

impl Kernel for IntegerMatMul {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let xs = io.input(1)?.f32()?[0];
        let xz = zero_points(io.inputs.get(2).copied().flatten())?[0];
        let w = io.input(3)?.bytes()?;
        let ws = io.input(4)?.f32()?;
        let wz = zero_points(io.inputs.get(5).copied().flatten())?;
        let bias = match io.inputs.get(6).copied().flatten() {
            Some(b) => Some(b.f32()?),
            None => None,
        };
        let threads = io.threads;
        let y = cast_mut::<u32>(io.outputs[0].data);
        let scales = Scales { xs, ws, bias };
        qmatmul(&self.q, self.rows, x, xz, w, &wz, Some(scales), y, threads);
        Ok(())
    }
}

/// The integer GEMM's kernel for ONNX `MatMulInteger(A, B, a_zero_point?,
/// b_zero_point?)` (what onnxruntime's dynamic quantizer writes) where it
/// applies: `A` uint8 `[…, k]` with one zero point, `B` a constant int8 or
/// uint8 `[k, n]` with one zero point or one per column. The output is the
/// exact i32 sums, as the plain kernel's. `None` for other nodes (the
/// plain kernel takes them).
pub fn matmul_integer(ctx: &NodeCtx) -> Option<Box<dyn Kernel>> {
    let a = ctx.inputs.first()?.as_ref()?;
    let b = ctx.inputs.get(1)?.as_ref()?;
    let (&[k, n], Some(&k2)) = (b.shape.as_slice(), a.shape.last()) else {
        return None;
    };
    let signed = match b.dtype {
        DType::I8 => true,
        DType::U8 => false,
        _ => return None,
    };
    let za = ctx.inputs.get(2).cloned().flatten();
    let zb = ctx.inputs.get(3).cloned().flatten();
    let ok = a.dtype == DType::U8
        && k2 == k
        && (1..=MAX_K).contains(&k)
        && za.is_none_or(|z| z.dtype == DType::U8 && numel(&z.shape) == 1)
        && zb.is_none_or(|z| z.dtype == b.dtype && (numel(&z.shape) == 1 || z.shape == [n]))
        && ctx.outputs.first()?.dtype == DType::I32;
    let bytes = ctx.constants.get(1).copied().flatten()?;
    if !ok || bytes.len() < k * n {
        return None;
    }
    Some(Box::new(MatMulIntegerQ {
        q: QWeight::new(k, n, signed, bytes),
        rows: numel(&a.shape) / k.max(1),
    }))
}

struct MatMulIntegerQ {
    q: QWeight,
    rows: usize,
}

impl Kernel for MatMulIntegerQ {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let w = io.input(1)?.bytes()?;
        let xz = zero_points(io.inputs.get(2).copied().flatten())?[0];
        let wz = zero_points(io.inputs.get(3).copied().flatten())?;
        let threads = io.threads;
        let y = cast_mut::<u32>(io.outputs[0].data);
        qmatmul(&self.q, self.rows, x, xz, w, &wz, None, y, threads);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Σ_p (x[i, p] − xz)(w[p, j] − wz[j])` in i64.
    #[allow(clippy::too_many_arguments)]
    fn sums(
        m: usize,
        k: usize,
        n: usize,
        x: &[u8],
        xz: i32,
        w: &[u8],
        signed: bool,
        wz: &[i32],
    ) -> Vec<i64> {
        let mut y = vec![0i64; m * n];
        for i in 0..m {
            for j in 0..n {
                let z = if wz.len() == 1 { wz[0] } else { wz[j] } as i64;
                for p in 0..k {
                    let wv = if signed {
                        w[p * n + j] as i8 as i64
                    } else {
                        w[p * n + j] as i64
                    };
                    y[i * n + j] += (x[i * k + p] as i64 - xz as i64) * (wv - z);
                }
            }
        }
        y
    }

    /// The exact integer sums (unscaled, MatMulInteger's output) and the
    /// scaled floats of a naive i64 loop, bit for bit, on the VNNI kernel
    /// (where the CPU has it) and the plain loops, at 1 to 3 threads;
    /// shapes cross every edge: rows past a micro-tile, columns past
    /// slivers and panels, depths not a multiple of 4, extreme values;
    /// with a bias row after the scale, and with the weight's rows apart
    /// in a wider buffer ([`QWeight::strided`]).
    #[test]
    fn integer_sums_are_exact_on_every_path() {
        if !vnni() {
            eprintln!("no AVX-512 VNNI here: only the plain loops are checked");
        }
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 5, 17),
            (9, 67, 33),
            (17, 300, 300),
            (8, 8, 16),
            (2, 1024, 520),
            (20, 1536, 300),
        ] {
            for signed in [false, true] {
                for (case, seed) in [(0, 1u64), (1, 2)] {
                    let mut x = graphopt_testutil::bytes(m * k, seed);
                    let mut w = graphopt_testutil::bytes(k * n, seed + 10);
                    if case == 1 {
                        // Extremes: x at 255, w at its most negative.
                        x.fill(255);
                        w.fill(if signed { 0x80 } else { 0 });
                    }
                    let ws: Vec<f32> = (0..n).map(|j| 0.01 + j as f32 * 1e-4).collect();
                    let wz: Vec<i32> = if signed {
                        vec![0]
                    } else {
                        (0..n).map(|j| (j * 37 % 256) as i32).collect()
                    };
                    let (xs, xz) = (0.02f32, if case == 1 { 0 } else { 131 });
                    let exact = sums(m, k, n, &x, xz, &w, signed, &wz);
                    let want: Vec<u32> = exact
                        .iter()
                        .enumerate()
                        .map(|(e, &t)| (t as i32 as f32 * (xs * ws[e % n])).to_bits())
                        .collect();
                    let bias = graphopt_testutil::uniform(n, seed + 20);
                    let want_bias: Vec<u32> = exact
                        .iter()
                        .enumerate()
                        .map(|(e, &t)| {
                            let j = e % n;
                            (t as i32 as f32 * (xs * ws[j]) + bias[j]).to_bits()
                        })
                        .collect();
                    let exact: Vec<u32> = exact.iter().map(|&t| t as i32 as u32).collect();
                    let ld = n + 7;
                    let mut wide = vec![0x5Au8; k * ld];
                    for (d, r) in wide.chunks_exact_mut(ld).zip(w.chunks_exact(n)) {
                        d[..n].copy_from_slice(r);
                    }
                    let q = QWeight::new(k, n, signed, &w);
                    let mut y = vec![0u32; m * n];
                    for threads in 1..=3 {
                        let c =
                            format!("{m}x{k}x{n} signed {signed} case {case} threads {threads}");
                        let sc = Scales {
                            xs,
                            ws: &ws,
                            bias: None,
                        };
                        qmatmul(&q, m, &x, xz, &w, &wz, Some(sc), &mut y, threads);
                        assert!(y == want, "{c}: scaled");
                        qmatmul(&q, m, &x, xz, &w, &wz, None, &mut y, threads);
                        assert!(y == exact, "{c}: sums");
                        // A bias row added after the scale (IntegerGemm).
                        let sc = Scales {
                            bias: Some(&bias),
                            ..sc
                        };
                        qmatmul(&q, m, &x, xz, &w, &wz, Some(sc), &mut y, threads);
                        assert!(y == want_bias, "{c}: scaled, with a bias");
                        // The same weight as rows `ld` bytes apart in a
                        // wider buffer (a 1x1 convolution's image in place).
                        let qs = QWeight::strided(k, n, ld, signed, &wide);
                        qmatmul(&qs, m, &x, xz, &wide, &wz, None, &mut y, threads);
                        assert!(y == exact, "{c}: sums, rows {ld} bytes apart");
                    }
                    // The plain loops alone.
                    let ep = Epilogue {
                        a: (0..n)
                            .map(|j| q.shift() - wz[if wz.len() == 1 { 0 } else { j }])
                            .collect(),
                        b: (0..n)
                            .map(|j| {
                                let z = wz[if wz.len() == 1 { 0 } else { j }];
                                xz.wrapping_mul(
                                    (k as i32).wrapping_mul(z).wrapping_sub(q.colsum[j]),
                                )
                            })
                            .collect(),
                        scale: Some(ws.iter().map(|s| xs * s).collect()),
                        bias: None,
                    };
                    let k4 = k.next_multiple_of(4);
                    let mut xa = vec![0u8; m * k4];
                    for i in 0..m {
                        xa[i * k4..i * k4 + k].copy_from_slice(&x[i * k..(i + 1) * k]);
                    }
                    let rx: Vec<i32> = (0..m)
                        .map(|i| x[i * k..(i + 1) * k].iter().map(|&v| v as i32).sum())
                        .collect();
                    // SAFETY: y holds m × n; one caller.
                    unsafe { part_plain(&q, m, &xa, k4, &rx, &w, &ep, y.as_mut_ptr(), 0, n) };
                    assert!(y == want, "plain {m}x{k}x{n}");
                    let ep = Epilogue {
                        bias: Some(bias.clone()),
                        ..ep
                    };
                    // SAFETY: as above.
                    unsafe { part_plain(&q, m, &xa, k4, &rx, &w, &ep, y.as_mut_ptr(), 0, n) };
                    assert!(y == want_bias, "plain {m}x{k}x{n}, with a bias");
                }
            }
        }
    }

    /// The deepest product [`MAX_K`] allows, at its largest sum magnitude,
    /// is still exact (the i32 sums wrap in between).
    #[test]
    fn the_deepest_allowed_product_sums_exactly() {
        let (m, k, n) = (1, MAX_K, 16);
        let x = vec![255u8; k];
        let w = vec![0u8; k * n];
        let q = QWeight::new(k, n, false, &w);
        let mut y = vec![0u32; n];
        for threads in [1, 2] {
            qmatmul(&q, m, &x, 0, &w, &[255], None, &mut y, threads);
            let want = -(k as i64 * 255 * 255);
            assert!(y.iter().all(|&v| v as i32 as i64 == want), "{:?}", &y[..2]);
        }
    }
}
