//! Quantized convolution and matrix product on integers: QLinearConv,
//! ConvInteger and QLinearMatMul (what onnxruntime's static quantizer
//! writes, and the ONNX model zoo's int8 models run on).
//!
//! What they compute: the integer sums `Σ (x − xz)(w − wz)`, wrapped to
//! int32 as ONNX's int32 accumulation (and its reference) wraps them, which
//! for any real depth means exact. ConvInteger outputs the sums;
//! QLinearConv (after adding its int32 bias, wrapping too) and
//! QLinearMatMul requantize each one as onnxruntime does,
//! `saturate(round_half_even(f32(sum) · (xs · ws / ys)) + yz)`: the
//! multiplier in the scales' own precision (float32; float16 or bfloat16
//! for QLinearMatMul-21), its product with the sum in f32 ([`requant`]).
//! The ONNX reference multiplies in f64 and adds the zero point before
//! rounding; the two differ on a few outputs in a million (a product
//! that f32 rounds across a half, or a tie with an odd zero point), and
//! those differences grow through a network's layers: on onnxruntime's
//! QLinearConv quantization of mobilenet_v2, following the reference left
//! 71% of the last layer's outputs up to 7 steps from onnxruntime's, and
//! following onnxruntime leaves every layer's output equal to its own.
//!
//! How: the GEMM's row operand is read as uint8, int8 shifted by 128
//! (`x ^ 0x80`) and its zero point with it, so `x − xz` is unchanged, and
//! the sums run on the integer GEMM of [`super::qgemm`] (AVX-512 VNNI where
//! the CPU has it, an exact portable loop elsewhere; a plain loop past its
//! depth [`qgemm::MAX_K`], [`isums`]).
//! - Convolutions (1-D and 2-D, [`super::conv::grouped_window`]: groups,
//!   strides, pads, dilations, auto_pad) multiply each group's weight
//!   `[M/group, k]` (the GEMM's rows, as uint8) by one image's unfolded
//!   columns `[k, pixels]` (`k = C/group · kh · kw`; padding read as the
//!   zero point, [`super::conv::im2col_cols_with`]; a plain 1x1 reads the
//!   image in place) in tiles of output pixels (a tile, its sums and its
//!   column sums within [`CONV_TILE_BYTES`], at least [`MIN_TILE`]
//!   pixels), so the sums come out in the output's layout. Per-channel
//!   weight zero points that differ are taken out afterwards, and the sums
//!   requantized 16 at a time on AVX-512 ([`requant_row`]). Threads take
//!   items of (image and group, tile of pixels, run of output channels),
//!   each tile whole on one thread with its own workspace slot: the pixels
//!   are tiled so that the items divide among the threads, and the output
//!   channels split (in runs of the GEMM's 8 rows) only where the tiles
//!   would be smaller than [`MIN_TILE`]. With one input channel per group
//!   (depthwise) the taps are summed directly, one output row at a time,
//!   threads taking whole (image, group) blocks.
//! - QLinearMatMul broadcasts batches as MatMul does ([`batches`]) and
//!   multiplies each in blocks of rows (as tiles are sized). `a`'s scale
//!   and zero point are per tensor or per row (`[M]` for a 2-D `a`, else
//!   `[…, M, 1]`), `b`'s per tensor or per column (`[…, 1, N]`), as the
//!   operator's spec has them; `y`'s per tensor.

use crate::backend::{In, Kernel, KernelIo, NodeCtx, TensorInfo};
use crate::cpu::conv::{grouped_window, im2col_cols_with, valid_cols, Window};
use crate::cpu::matmul::{batches, Batches};
use crate::cpu::par;
use crate::cpu::qgemm::{self, QWeight, MAX_K};
use crate::cpu::quant::{ints, round_even};
use crate::tensor::{cast, cast_mut, numel, strides};
use graphopt_ir::DType;
use half::{bf16, f16};

/// Bytes of one block of QLinearMatMul's rows with their i32 sums, unless
/// that is fewer than [`MIN_ROWS`] rows.
const TILE_BYTES: usize = 1 << 20;
/// Bytes of one convolution tile's unfolded pixels, sums and column sums
/// (a workspace slot; one slot per thread), unless that is fewer than
/// [`MIN_TILE`] pixels.
const CONV_TILE_BYTES: usize = 1 << 19;
/// Output pixels a tile has at least (four of the GEMM's slivers).
const MIN_TILE: usize = 64;
/// Rows of `a` a QLinearMatMul block has at least: the GEMM packs `b` once
/// per call, which fewer rows would not amortize.
const MIN_ROWS: usize = 256;

fn align64(b: usize) -> usize {
    b.next_multiple_of(64)
}

/// Whether an 8-bit operand is int8 (else uint8).
fn signed8(t: &TensorInfo, op: &str, what: &str) -> Result<bool, String> {
    match t.dtype {
        DType::U8 => Ok(false),
        DType::I8 => Ok(true),
        d => Err(format!(
            "{op}: {what} of {} is not implemented (uint8 and int8 are)",
            d.name()
        )),
    }
}

/// What `x ^ shift` adds to an 8-bit value read as uint8: 128 for int8.
fn shift(signed: bool) -> i32 {
    if signed {
        128
    } else {
        0
    }
}

/// An optional zero point (input `i`): `ty`'s element type, one value or
/// `n` (shape `[n]`).
fn check_zero_point(
    ctx: &NodeCtx,
    i: usize,
    ty: DType,
    n: usize,
    op: &str,
    what: &str,
) -> Result<(), String> {
    match ctx.inputs.get(i).cloned().flatten() {
        Some(z) if z.dtype != ty || (numel(&z.shape) != 1 && z.shape != [n]) => Err(format!(
            "{op}: {what} zero point {} {:?} for a {} operand ({})",
            z.dtype.name(),
            z.shape,
            ty.name(),
            if n == 1 {
                "one value".to_string()
            } else {
                format!("one value or {n}")
            }
        )),
        _ => Ok(()),
    }
}

/// The element type of the scales (inputs `at`): one float type for all.
fn scale_type(ctx: &NodeCtx, at: &[usize], op: &str) -> Result<DType, String> {
    let d = ctx.input(at[0])?.dtype;
    for &i in at {
        let s = ctx.input(i)?;
        if !matches!(s.dtype, DType::F32 | DType::F16 | DType::BF16) || s.dtype != d {
            return Err(format!(
                "{op}: scales of {} and {} (one of float, float16, bfloat16)",
                d.name(),
                s.dtype.name()
            ));
        }
    }
    Ok(d)
}

/// A scale tensor's values as f32 (float, float16 or bfloat16).
fn scale_values(x: &In) -> Result<Vec<f32>, String> {
    let b = x.bytes()?;
    Ok(match x.dtype {
        DType::F32 => cast::<f32>(b).to_vec(),
        DType::F16 => cast::<u16>(b)
            .iter()
            .map(|&v| f16::from_bits(v).to_f32())
            .collect(),
        DType::BF16 => cast::<u16>(b)
            .iter()
            .map(|&v| bf16::from_bits(v).to_f32())
            .collect(),
        d => return Err(format!("a scale of {}", d.name())),
    })
}

/// A zero point's values (one 0 when it is omitted).
fn zero_points(io: &KernelIo, i: usize) -> Result<Vec<i32>, String> {
    match io.inputs.get(i).copied().flatten() {
        Some(z) => ints(&z),
        None => Ok(vec![0]),
    }
}

/// `a · b / c` as numpy computes it on scales of type `d`: in f32, each
/// operation rounded to float16 or bfloat16 for those (f32 holds their
/// product exactly and rounds their quotient finely enough, 24 ≥ 2·11 + 2
/// bits, that rounding it again gives the correctly rounded one).
#[inline]
fn multiplier(d: DType, a: f32, b: f32, c: f32) -> f32 {
    match d {
        DType::F16 => {
            let r = |v: f32| f16::from_f32(v).to_f32();
            r(r(a * b) / c)
        }
        DType::BF16 => {
            let r = |v: f32| bf16::from_f32(v).to_f32();
            r(r(a * b) / c)
        }
        _ => a * b / c,
    }
}

/// `saturate(round_half_even(f32(acc) · mult) + zp)` as onnxruntime's
/// `MlasRequantizeOutput` computes it: the f32 product clamped to
/// `lo - zp..=hi - zp` (integers, so clamping first rounds alike), rounded
/// half to even (without a libm call, [`round_even`]), NaN giving `zp`.
#[inline(always)]
fn requant(acc: i32, mult: f32, zp: i32, (lo, hi): (f64, f64)) -> i32 {
    // `quant::round_even`, not `round_ties_even`: that is a libm call
    // (`rintf`), which took a third of a quantized mobilenet_v2's time.
    let v = (acc as f32 * mult).clamp(lo as f32 - zp as f32, hi as f32 - zp as f32);
    round_even(v) as i32 + zp
}

/// `y[i] = requant(acc[i] + b, mult, zp, range)` as bytes, 16 at a time
/// on AVX-512 where the CPU has it (the same bits: one f32 product,
/// clamped, rounded half to even, NaN giving `zp`).
fn requant_row(acc: &[i32], b: i32, mult: f32, zp: i32, range: (f64, f64), y: &mut [u8]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::gemm::wide() {
        // SAFETY: the CPU has AVX-512F (checked); y holds acc.len() bytes.
        done = unsafe { requant_avx512(acc, b, mult, zp, range, y) };
    }
    for (o, &s) in y[done..acc.len()].iter_mut().zip(&acc[done..]) {
        *o = requant(s.wrapping_add(b), mult, zp, range) as u8;
    }
}

/// [`requant_row`]'s whole vectors of 16; returns how many it wrote.
///
/// # Safety
/// The CPU has AVX-512F; `y` holds at least `acc.len()` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn requant_avx512(
    acc: &[i32],
    b: i32,
    mult: f32,
    zp: i32,
    (lo, hi): (f64, f64),
    y: &mut [u8],
) -> usize {
    use std::arch::x86_64::*;
    assert!(y.len() >= acc.len());
    let whole = acc.len() / 16 * 16;
    let (bv, mv, zv) = (
        _mm512_set1_epi32(b),
        _mm512_set1_ps(mult),
        _mm512_set1_epi32(zp),
    );
    let (lov, hiv) = (
        _mm512_set1_ps(lo as f32 - zp as f32),
        _mm512_set1_ps(hi as f32 - zp as f32),
    );
    for i in (0..whole).step_by(16) {
        // SAFETY: elements i..i + 16 of acc and y (checked above).
        unsafe {
            let a = _mm512_loadu_si512(acc.as_ptr().add(i) as *const __m512i);
            let p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a, bv)), mv);
            // NaN (from a NaN or infinite multiplier) gives the zero point,
            // as `requant`'s saturating cast does.
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(p, p);
            let p = _mm512_mask_mov_ps(p, nan, _mm512_setzero_ps());
            let v = _mm512_max_ps(_mm512_min_ps(p, hiv), lov);
            let r =
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            let q = _mm512_cvtepi32_epi8(_mm512_add_epi32(r, zv));
            _mm_storeu_si128(y.as_mut_ptr().add(i) as *mut __m128i, q);
        }
    }
    whole
}

/// The range of a uint8 or int8 output.
fn range8(t: &TensorInfo, op: &str) -> Result<(f64, f64), String> {
    match t.dtype {
        DType::U8 => Ok((0.0, 255.0)),
        DType::I8 => Ok((-128.0, 127.0)),
        d => Err(format!(
            "{op}: an output of {} (uint8 and int8 are implemented)",
            d.name()
        )),
    }
}

/// `y[i·n + j] = Σ_p (x[i·k + p] − xz)(w[p·n + j] − wz[j])` for `m` rows,
/// wrapped to i32 (the bits in `y`): `x` uint8, `w` int8 or uint8 as `q`
/// says, `wz` one value or `n`. On the integer GEMM ([`qgemm::qmatmul`],
/// exact, the columns split across `threads`) up to its depth
/// [`MAX_K`], on [`sums_plain`] deeper (where both wrap alike).
#[allow(clippy::too_many_arguments)]
fn isums(
    q: &QWeight,
    m: usize,
    x: &[u8],
    xz: i32,
    w: &[u8],
    wz: &[i32],
    y: &mut [u32],
    threads: usize,
) {
    if (1..=MAX_K).contains(&q.k) {
        qgemm::qmatmul(q, m, x, xz, w, wz, None, y, threads);
    } else {
        sums_plain(q, m, x, xz, w, wz, y);
    }
}

/// [`isums`] in plain wrapping i32 loops (one thread).
fn sums_plain(q: &QWeight, m: usize, x: &[u8], xz: i32, w: &[u8], wz: &[i32], y: &mut [u32]) {
    let (k, n, ld) = (q.k, q.n, q.ld);
    let wv = |v: u8| if q.signed { v as i8 as i32 } else { v as i32 };
    let zw: Vec<i32> = (0..n)
        .map(|j| if wz.len() == 1 { wz[0] } else { wz[j] })
        .collect();
    let mut acc = vec![0i32; n];
    for (i, out) in y[..m * n].chunks_exact_mut(n.max(1)).enumerate() {
        acc.fill(0);
        for (p, &xv) in x[i * k..(i + 1) * k].iter().enumerate() {
            let xv = xv as i32 - xz;
            for ((a, &v), &z) in acc.iter_mut().zip(&w[p * ld..p * ld + n]).zip(&zw) {
                *a = a.wrapping_add(xv.wrapping_mul(wv(v) - z));
            }
        }
        for (o, &a) in out.iter_mut().zip(&acc) {
            *o = a as u32;
        }
    }
}

/// How a convolution's sums become its output elements.
enum Epilogue<'a> {
    /// ConvInteger: the sums, as int32.
    Sums,
    /// QLinearConv: the sum plus the bias, requantized with the multiplier
    /// of its output channel.
    Requant {
        mult: Vec<f32>,
        bias: Option<&'a [i32]>,
        zp: i32,
        range: (f64, f64),
    },
    /// IntegerConv: float32, the sum times the product of its scales plus
    /// the float bias, `f32(sum) · (xs · ws[c]) + B[c]`.
    Float {
        mult: Vec<f32>,
        bias: Option<&'a [f32]>,
    },
}

impl Epilogue<'_> {
    /// Bytes per output element.
    fn size(&self) -> usize {
        match self {
            Epilogue::Sums | Epilogue::Float { .. } => 4,
            Epilogue::Requant { .. } => 1,
        }
    }

    /// Output elements `y` (bytes, `acc.len()` elements) of output channel
    /// `c` from their sums `acc`.
    #[inline]
    fn put(&self, y: &mut [u8], c: usize, acc: &[i32]) {
        match self {
            // Byte by byte: an output need not be 4-byte aligned.
            Epilogue::Sums => {
                for (o, s) in y[..4 * acc.len()].chunks_exact_mut(4).zip(acc) {
                    o.copy_from_slice(&s.to_le_bytes());
                }
            }
            Epilogue::Requant {
                mult,
                bias,
                zp,
                range,
            } => {
                let (m, b) = (mult[c], bias.map_or(0, |b| b[c]));
                requant_row(acc, b, m, *zp, *range, &mut y[..acc.len()]);
            }
            Epilogue::Float { mult, bias } => {
                let (m, b) = (mult[c], bias.map_or(0.0, |b| b[c]));
                for (o, &s) in y[..4 * acc.len()].chunks_exact_mut(4).zip(acc) {
                    o.copy_from_slice(&(s as f32 * m + b).to_le_bytes());
                }
            }
        }
    }
}

/// Which operator a [`QConv`] runs; the slots of its inputs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ConvOp {
    /// `QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B?)`, B int32.
    Linear,
    /// `ConvInteger(x, w, xz?, wz?)`.
    Integer,
    /// graphopt's fused `IntegerConv(x, xs, xz?, w, ws, wz?, B?)`, B
    /// float32: a Conv of dequantized activations and weights.
    Float,
}

impl ConvOp {
    fn name(self) -> &'static str {
        match self {
            ConvOp::Linear => "QLinearConv",
            ConvOp::Integer => "ConvInteger",
            ConvOp::Float => "IntegerConv",
        }
    }

    /// The slots of the weight, `x`'s zero point and the weight's.
    fn slots(self) -> (usize, usize, usize) {
        match self {
            ConvOp::Integer => (1, 2, 3),
            ConvOp::Linear | ConvOp::Float => (3, 2, 5),
        }
    }
}

/// QLinearConv, ConvInteger or IntegerConv.
struct QConv {
    g: Window,
    m: usize,
    group: usize,
    op: ConvOp,
    /// Its output range (QLinearConv) and whether it has a bias.
    range: (f64, f64),
    bias: bool,
    scales: DType,
    x_signed: bool,
    w_signed: bool,
    /// Output pixels per tile at most (a run may take smaller tiles so
    /// that they divide among its threads), and workspace slots.
    tile: usize,
    slots: usize,
    /// A constant int8 weight as uint8 (`w ^ 0x80`).
    shifted: Option<Vec<u8>>,
}

/// What one run reads, shared by its blocks.
struct ConvRun<'a> {
    x: &'a [u8],
    /// The weight as stored, and as uint8 (int8 shifted).
    w: &'a [u8],
    wu: &'a [u8],
    /// `x`'s zero point as stored.
    xz: i32,
    /// The weight's zero points as stored, and as uint8.
    wz: &'a [i32],
    wzu: &'a [i32],
    epi: &'a Epilogue<'a>,
}

impl QConv {
    fn w_at(&self) -> usize {
        self.op.slots().0
    }

    fn zero_point_at(&self) -> (usize, usize) {
        let (_, xz, wz) = self.op.slots();
        (xz, wz)
    }

    fn cg(&self) -> usize {
        self.g.c / self.group
    }

    fn mg(&self) -> usize {
        self.m / self.group
    }

    /// Unfolded rows per output pixel.
    fn k(&self) -> usize {
        self.cg() * self.g.kh * self.g.kw
    }

    fn depthwise(&self) -> bool {
        self.cg() == 1
    }

    /// A 1x1 window of stride 1 without padding: the image is its own
    /// unfolded matrix, each tile read in place at the image's row stride.
    fn plain(&self) -> bool {
        self.g.plain_1x1()
    }

    /// Workspace bytes of one slot: the sums of a tile (`M/group` rows),
    /// the input's column sums over it, and the tile unfolded.
    fn slot_bytes(&self) -> usize {
        if self.depthwise() {
            return align64(4 * self.g.ow);
        }
        let col = if self.plain() { 0 } else { self.k() };
        align64(4 * self.tile * self.mg()) + align64(4 * self.tile) + align64(col * self.tile)
    }

    /// Output tile `(n, gi, p0)`: output channels `gi·M/group + rows` of
    /// image `n`, pixels `p0..p0 + tile` (or to the end), into the unit's
    /// output `y` (bytes, `M/group × OH·OW` elements, of which only those
    /// are written), with workspace slot `ws`. The GEMM's rows are the
    /// group's weight `[M/group, k]` (as uint8), its `[k, pixels]` operand
    /// the tile of the image unfolded (as stored, padded with the zero
    /// point; a plain 1x1 reads the image in place), so the sums come out
    /// in the output's layout. Per-channel weight zero points that differ
    /// are subtracted afterwards, times the tile's column sums of `x − xz`.
    ///
    /// # Safety
    /// `y` points to the unit's output; no other thread writes these
    /// elements during the call; `tile` is at most `self.tile`.
    unsafe fn tile(
        &self,
        r: &ConvRun,
        (n, gi, p0, tile): (usize, usize, usize, usize),
        rows: std::ops::Range<usize>,
        y: *mut u8,
        ws: &mut [u8],
    ) {
        let g = &self.g;
        let (cg, mg, k, ohw) = (self.cg(), self.mg(), self.k(), g.oh * g.ow);
        let nr = rows.len();
        let wu = &r.wu[(gi * mg + rows.start) * k..][..nr * k];
        let wzu = if r.wzu.len() == 1 {
            r.wzu
        } else {
            &r.wzu[gi * mg..][..mg]
        };
        // One zero point for the rows (the GEMM's), or 0 and each row's
        // subtracted afterwards.
        let per_row = wzu.iter().any(|&z| z != wzu[0]);
        let wz0 = if per_row { 0 } else { wzu[0] };
        let (sums, rest) = ws.split_at_mut(align64(4 * self.tile * mg));
        let (cx, col) = rest.split_at_mut(align64(4 * self.tile));
        let img = &r.x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
        let pt = tile.min(ohw - p0);
        let sums = &mut sums[..4 * nr * pt];
        // The [k, pt] operand and its row stride: the image in place (a
        // plain 1x1), else the tile unfolded into the slot.
        let (unfolded, ld): (&[u8], usize) = if k == 0 {
            (&[], pt)
        } else if self.plain() {
            let at = gi * cg * ohw + p0;
            (&img[at..at + (k - 1) * ohw + pt], ohw)
        } else {
            let col = &mut col[..k * pt];
            im2col_cols_with(g, img, gi * cg, cg, (p0, pt), col, r.xz as u8);
            (col, pt)
        };
        let q = QWeight::strided(k, pt, ld, self.x_signed, unfolded);
        isums(&q, nr, wu, wz0, unfolded, &[r.xz], cast_mut(sums), 1);
        let sums: &mut [i32] = cast_mut(sums);
        let cx: &mut [i32] = cast_mut(&mut cx[..4 * pt]);
        if per_row {
            // Σ_p (x − xz) per column: the GEMM's column sums, less k·xz.
            for (c, &s) in cx.iter_mut().zip(q.colsums()) {
                *c = s.wrapping_sub((k as i32).wrapping_mul(r.xz));
            }
        }
        let size = r.epi.size();
        for (j, row) in rows.zip(sums.chunks_exact_mut(pt)) {
            if per_row {
                let z = wzu[j];
                for (s, &c) in row.iter_mut().zip(cx.iter()) {
                    *s = s.wrapping_sub(z.wrapping_mul(c));
                }
            }
            // SAFETY: elements j·OH·OW + p0.. of the unit's output, which
            // only this tile writes (the caller's promise).
            let out =
                unsafe { std::slice::from_raw_parts_mut(y.add((j * ohw + p0) * size), pt * size) };
            r.epi.put(out, gi * mg + j, row);
        }
    }

    /// [`QConv::block`] of a depthwise convolution (one input channel,
    /// `gi`, per group): each output row's taps summed in `ws` (`OW` i32).
    fn depthwise_block(&self, r: &ConvRun, (n, gi): (usize, usize), y: &mut [u8], ws: &mut [u8]) {
        let g = &self.g;
        let (mg, hw, taps) = (self.mg(), g.h * g.w, g.kh * g.kw);
        let plane = &r.x[(n * g.c + gi) * hw..][..hw];
        let acc: &mut [i32] = cast_mut(&mut ws[..4 * g.ow]);
        let wv = |v: u8| {
            if self.w_signed {
                v as i8 as i32
            } else {
                v as i32
            }
        };
        // One input row as `x − xz` in i32, converted once per (output
        // row, kernel row) so the tap loops are plain multiply-adds.
        let mut xr = vec![0i32; g.w];
        for j in 0..mg {
            let c = gi * mg + j;
            let z = if r.wz.len() == 1 { r.wz[0] } else { r.wz[c] };
            let w: Vec<i32> = r.w[c * taps..][..taps].iter().map(|&v| wv(v) - z).collect();
            for oy in 0..g.oh {
                acc.fill(0);
                for ki in 0..g.kh {
                    let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
                    if iy < 0 || iy as usize >= g.h {
                        continue;
                    }
                    let src = &plane[iy as usize * g.w..][..g.w];
                    if self.x_signed {
                        for (d, &v) in xr.iter_mut().zip(src) {
                            *d = v as i8 as i32 - r.xz;
                        }
                    } else {
                        for (d, &v) in xr.iter_mut().zip(src) {
                            *d = v as i32 - r.xz;
                        }
                    }
                    let row = &xr[..];
                    for kj in 0..g.kw {
                        let t = w[ki * g.kw + kj];
                        let (lo, hi) = valid_cols(g, kj);
                        if t == 0 || lo >= hi {
                            continue;
                        }
                        let first = lo * g.sw + kj * g.dw - g.pw;
                        let acc = &mut acc[lo..hi];
                        if g.sw == 1 {
                            for (a, &v) in acc.iter_mut().zip(&row[first..]) {
                                *a = a.wrapping_add(v.wrapping_mul(t));
                            }
                        } else {
                            for (a, &v) in acc.iter_mut().zip(row[first..].iter().step_by(g.sw)) {
                                *a = a.wrapping_add(v.wrapping_mul(t));
                            }
                        }
                    }
                }
                r.epi
                    .put(&mut y[(j * g.oh + oy) * g.ow * r.epi.size()..], c, acc);
            }
        }
    }
}

impl Kernel for QConv {
    fn workspace_bytes(&self) -> usize {
        self.slots * self.slot_bytes()
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let g = &self.g;
        let x = io.input(0)?.bytes()?;
        let w = io.input(self.w_at())?.bytes()?;
        let (xz_at, wz_at) = self.zero_point_at();
        let xz = zero_points(io, xz_at)?[0];
        let wz = zero_points(io, wz_at)?;
        let wzu: Vec<i32> = wz.iter().map(|&z| z + shift(self.w_signed)).collect();
        let (ibias, fbias);
        let epi = match self.op {
            ConvOp::Linear => {
                let xs = scale_values(&io.input(1)?)?[0];
                let ws = scale_values(&io.input(4)?)?;
                let ys = scale_values(&io.input(6)?)?[0];
                let mult = (0..self.m)
                    .map(|c| multiplier(self.scales, xs, ws[if ws.len() == 1 { 0 } else { c }], ys))
                    .collect();
                ibias = match self.bias {
                    true => Some(cast::<i32>(io.input(8)?.bytes()?)),
                    false => None,
                };
                Epilogue::Requant {
                    mult,
                    bias: ibias,
                    zp: zero_points(io, 7)?[0],
                    range: self.range,
                }
            }
            ConvOp::Integer => Epilogue::Sums,
            ConvOp::Float => {
                let xs = scale_values(&io.input(1)?)?[0];
                let ws = scale_values(&io.input(4)?)?;
                let mult = (0..self.m)
                    .map(|c| xs * ws[if ws.len() == 1 { 0 } else { c }])
                    .collect();
                fbias = match self.bias {
                    true => Some(cast::<f32>(io.input(6)?.bytes()?)),
                    false => None,
                };
                Epilogue::Float { mult, bias: fbias }
            }
        };
        let built;
        let wu = match &self.shifted {
            Some(s) => s.as_slice(),
            None if self.w_signed && !self.depthwise() => {
                built = shifted(w);
                built.as_slice()
            }
            None => w,
        };
        let run = ConvRun {
            x,
            w,
            wu,
            xz,
            wz: &wz,
            wzu: &wzu,
            epi: &epi,
        };
        let units = g.n * self.group;
        let unit = self.mg() * g.oh * g.ow * epi.size();
        let y = &mut io.outputs[0].data[..units * unit];
        if y.is_empty() {
            return Ok(());
        }
        let threads = io.threads;
        let slot = self.slot_bytes();
        if self.depthwise() {
            // Whole blocks per part, each with its workspace slot.
            let work = (unit * self.k()).max(1);
            let parts = par::parts(units, threads, par::MIN_ELEMS.div_ceil(work)).min(self.slots);
            let mut pieces = Vec::with_capacity(parts);
            let (mut ys, mut wss) = (y, &mut io.workspace[..parts * slot]);
            for p in 0..parts {
                let r = par::range(units, parts, p);
                let (yp, yrest) = ys.split_at_mut(r.len() * unit);
                let (wp, wrest) = wss.split_at_mut(slot);
                pieces.push((r, yp, wp));
                (ys, wss) = (yrest, wrest);
            }
            par::for_each_owned(threads, pieces, |(r, yp, wp)| {
                for (u, yu) in r.zip(yp.chunks_mut(unit)) {
                    self.depthwise_block(&run, (u / self.group, u % self.group), yu, wp);
                }
            });
            return Ok(());
        }
        // Items: (unit, tile of pixels, part of the group's output
        // channels). Pixels are tiled so that the items divide among the
        // threads; the channels are split (in runs of the GEMM's 8-row
        // micro-tiles) only when the tiles would be smaller than
        // MIN_TILE. Each item writes its own elements and sums exactly, so
        // any split gives the same bits.
        let (mg, ohw) = (self.mg(), g.oh * g.ow);
        let mut tiles = ohw.div_ceil(self.tile);
        if !units.is_multiple_of(threads) && ohw / tiles.next_multiple_of(threads) >= MIN_TILE {
            tiles = tiles.next_multiple_of(threads);
        }
        let tile = ohw.div_ceil(tiles);
        let tiles = ohw.div_ceil(tile);
        let row_parts = if units * tiles >= threads {
            1
        } else {
            threads.div_ceil(units * tiles).min(mg.div_ceil(8)).max(1)
        };
        let items = units * tiles * row_parts;
        let small = units * ohw * mg * self.k() < par::MIN_ELEMS;
        assert!(
            tile <= self.tile && io.workspace.len() >= self.slots * slot,
            "quantized convolution workspace"
        );
        let parts = if small {
            1
        } else {
            threads.min(items).min(self.slots).max(1)
        };
        let yp = SendPtr(y.as_mut_ptr());
        let wsp = SendPtr(io.workspace.as_mut_ptr());
        par::for_parts(threads, parts, |p| {
            // SAFETY: slot p of the workspace is this part's alone.
            let ws = unsafe { std::slice::from_raw_parts_mut(wsp.get().add(p * slot), slot) };
            for it in par::range(items, parts, p) {
                let (u, rest) = (it / (tiles * row_parts), it % (tiles * row_parts));
                let (t, rp) = (rest / row_parts, rest % row_parts);
                let rows = par::range(mg.div_ceil(8), row_parts, rp);
                let rows = 8 * rows.start..(8 * rows.end).min(mg);
                // SAFETY: item `it` writes channels `rows` × pixels of
                // tile t of unit u, which no other item writes.
                unsafe {
                    self.tile(
                        &run,
                        (u / self.group, u % self.group, t * tile, tile),
                        rows,
                        yp.get().add(u * unit),
                        ws,
                    )
                };
            }
        });
        Ok(())
    }
}

/// The output's or workspace's bytes, shared by parts that write disjoint
/// elements of them.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: the parts write disjoint elements (see `QConv::run`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point,
/// y_scale, y_zero_point, B?).
pub fn qlinear_conv(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    conv_kernel(ctx, ConvOp::Linear)
}

/// ConvInteger(x, w, x_zero_point?, w_zero_point?).
pub fn conv_integer(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    conv_kernel(ctx, ConvOp::Integer)
}

/// graphopt's `IntegerConv(xq, xs, xz?, q, scale, zero_point?, B?)`
/// ([`crate::lower`]): `Conv(DequantizeLinear(xq, xs, xz),
/// DequantizeLinear(q, scale, zero_point), B)` with one activation scale
/// and per-tensor or per-output-channel float32 weight scales, as exact
/// integer sums scaled once.
pub fn integer_conv(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    conv_kernel(ctx, ConvOp::Float)
}

fn conv_kernel(ctx: &NodeCtx, kind: ConvOp) -> Result<Box<dyn Kernel>, String> {
    let op = kind.name();
    let (w_at, xz_at, wz_at) = kind.slots();
    let x = ctx.input(0)?;
    let w = ctx.input(w_at)?;
    let y = ctx.outputs.first().ok_or("no output")?;
    let x_signed = signed8(x, op, "x")?;
    let w_signed = signed8(w, op, "a weight")?;
    if let Some(ks) = ctx.node.attr_ints("kernel_shape") {
        if w.shape.len() < 2
            || !ks
                .iter()
                .copied()
                .eq(w.shape[2..].iter().map(|&d| d as i64))
        {
            return Err(format!(
                "{op}: kernel_shape {ks:?} for a weight {:?}",
                w.shape
            ));
        }
    }
    let (g, m, group) = grouped_window(ctx, &w.shape)?;
    check_zero_point(ctx, xz_at, x.dtype, 1, op, "x")?;
    check_zero_point(ctx, wz_at, w.dtype, m, op, "the weight's")?;
    if numel(&y.shape) != g.n * m * g.oh * g.ow {
        return Err(format!("{op}: an output of shape {:?}", y.shape));
    }
    let (mut range, mut bias, mut scales) = ((0.0, 0.0), false, DType::F32);
    match kind {
        ConvOp::Linear | ConvOp::Float => {
            let at: &[usize] = if kind == ConvOp::Linear {
                &[1, 4, 6]
            } else {
                &[1, 4]
            };
            scales = scale_type(ctx, at, op)?;
            for (i, n, what) in [(1, 1, "x"), (4, m, "w"), (6, 1, "y")] {
                if !at.contains(&i) {
                    continue;
                }
                let s = ctx.input(i)?;
                if numel(&s.shape) != 1 && s.shape != [n] {
                    return Err(format!("{op}: a {what} scale of shape {:?}", s.shape));
                }
            }
            let (b_at, b_type) = if kind == ConvOp::Linear {
                range = range8(y, op)?;
                check_zero_point(ctx, 7, y.dtype, 1, op, "y")?;
                (8, DType::I32)
            } else {
                if y.dtype != DType::F32 || scales != DType::F32 {
                    return Err(format!(
                        "{op}: an output of {} with scales of {} (float32 both)",
                        y.dtype.name(),
                        scales.name()
                    ));
                }
                (6, DType::F32)
            };
            if let Some(b) = ctx.inputs.get(b_at).cloned().flatten() {
                if b.dtype != b_type || b.shape != [m] {
                    return Err(format!(
                        "{op}: a bias of {} {:?} for {m} output channels ({} [{m}])",
                        b.dtype.name(),
                        b.shape,
                        b_type.name()
                    ));
                }
                bias = true;
            }
        }
        ConvOp::Integer if y.dtype != DType::I32 => {
            return Err(format!("{op}: an output of {}", y.dtype.name()));
        }
        ConvOp::Integer => {}
    }
    let mut k = QConv {
        m,
        group,
        op: kind,
        range,
        bias,
        scales,
        x_signed,
        w_signed,
        tile: 0,
        slots: 0,
        shifted: None,
        g,
    };
    let (ohw, units) = (k.g.oh * k.g.ow, k.g.n * group);
    k.tile = (CONV_TILE_BYTES / (k.k() + 4 * k.mg() + 4))
        .max(MIN_TILE)
        .min(ohw.max(1));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    k.slots = if k.depthwise() {
        cores.clamp(1, 16).min(units.max(1))
    } else {
        cores.clamp(1, 16)
    };
    if w_signed && !k.depthwise() {
        let wb = ctx.constants.get(w_at).copied().flatten();
        k.shifted = wb.filter(|b| b.len() == m * k.k()).map(shifted);
    }
    Ok(Box::new(k))
}

/// int8 bytes as uint8 (`v ^ 0x80`, that is `v + 128`).
fn shifted(w: &[u8]) -> Vec<u8> {
    w.iter().map(|&v| v ^ 0x80).collect()
}

/// Where a scale or zero point of a matrix operand lies for batch `b` of
/// the product and row `i` of `a` (or column `j` of `b`): `boff[b] + i·step`.
struct Param {
    boff: Vec<usize>,
    step: usize,
}

impl Param {
    #[inline]
    fn at(&self, b: usize, i: usize) -> usize {
        self.boff[b] + i * self.step
    }
}

/// The [`Param`] of a scale or zero point of shape `s` of an operand of
/// shape `op` (2-D at least: `[…, M, K]` for `a`, `[…, K, N]` for `b`),
/// which may vary along dim `along` (`a`'s rows, `b`'s columns) and the
/// batch dims, for the product's batch dims `batch`.
fn param(s: &[usize], op: &[usize], along: usize, batch: &[usize]) -> Result<Param, String> {
    let nb = numel(batch);
    if numel(s) == 1 {
        return Ok(Param {
            boff: vec![0; nb],
            step: 0,
        });
    }
    let r = op.len();
    if s.len() > r {
        return Err(format!("of shape {s:?} for an operand {op:?}"));
    }
    let mut s2 = vec![1; r - s.len()];
    s2.extend_from_slice(s);
    let ok = s2
        .iter()
        .zip(op)
        .enumerate()
        .all(|(d, (&sd, &od))| sd == 1 || (sd == od && (d < r - 2 || d == along)));
    if !ok {
        return Err(format!("of shape {s:?} for an operand {op:?}"));
    }
    let st = strides(&s2);
    let step = if s2[along] == 1 { 0 } else { st[along] };
    // The operand's batch dims, right-aligned with the product's.
    let (rb, ob) = (batch.len(), r - 2);
    let mut boff = Vec::with_capacity(nb);
    let mut idx = vec![0usize; rb];
    for _ in 0..nb {
        let off = (0..ob)
            .filter(|&d| s2[d] != 1)
            .map(|d| idx[d + rb - ob] * st[d])
            .sum();
        boff.push(off);
        for d in (0..rb).rev() {
            idx[d] += 1;
            if idx[d] < batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(Param { boff, step })
}

/// The batch dims of `a @ b` (shapes promoted to 2-D at least), numpy's
/// broadcast of theirs.
fn batch_dims(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let (ba, bb) = (&a[..a.len() - 2], &b[..b.len() - 2]);
    let rank = ba.len().max(bb.len());
    (0..rank)
        .map(|d| {
            let x = if d + ba.len() >= rank {
                ba[d + ba.len() - rank]
            } else {
                1
            };
            let y = if d + bb.len() >= rank {
                bb[d + bb.len() - rank]
            } else {
                1
            };
            match (x, y) {
                (x, y) if x == y || y == 1 => Ok(x),
                (1, y) => Ok(y),
                _ => Err(format!("batch dims of {a:?} and {b:?} do not broadcast")),
            }
        })
        .collect()
}

struct QMatMul {
    bt: Batches,
    a_signed: bool,
    b_signed: bool,
    /// Scales and zero points: `a`'s per (batch, row), `b`'s per (batch,
    /// column).
    a_scale: Param,
    a_zp: Param,
    b_scale: Param,
    b_zp: Param,
    scales: DType,
    range: (f64, f64),
    /// Rows of `a` per block.
    rows: usize,
    /// A constant `b`: the column sums of each of its matrices.
    packed: Option<Vec<QWeight>>,
}

impl QMatMul {
    fn ws_split(&self) -> usize {
        align64(4 * self.rows * self.bt.n)
    }
}

impl Kernel for QMatMul {
    fn workspace_bytes(&self) -> usize {
        self.ws_split() + align64(self.rows * self.bt.k)
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let Batches { m, k, n, .. } = self.bt;
        let (oa, ob) = (&self.bt.oa, &self.bt.ob);
        let a = io.input(0)?.bytes()?;
        let b = io.input(3)?.bytes()?;
        let a_s = scale_values(&io.input(1)?)?;
        let a_z = zero_points(io, 2)?;
        let b_s = scale_values(&io.input(4)?)?;
        let b_z = zero_points(io, 5)?;
        let ys = scale_values(&io.input(6)?)?[0];
        let yz = zero_points(io, 7)?[0];
        let threads = io.threads;
        let (sa, sb) = (shift(self.a_signed), if self.a_signed { 0x80 } else { 0 });
        let y = &mut io.outputs[0].data[..oa.len() * m * n];
        if y.is_empty() {
            return Ok(());
        }
        let (sums, xa) = io.workspace.split_at_mut(self.ws_split());
        let sums: &mut [u32] = cast_mut(&mut sums[..4 * self.rows * n]);
        for (bi, yb) in y.chunks_mut(m * n).enumerate() {
            let bm = &b[ob[bi]..][..k * n];
            let built;
            let q = match &self.packed {
                Some(p) => &p[ob[bi] / (k * n)],
                None => {
                    built = QWeight::new(k, n, self.b_signed, bm);
                    &built
                }
            };
            let bz = match self.b_zp.step {
                0 => &b_z[self.b_zp.at(bi, 0)..][..1],
                _ => &b_z[self.b_zp.at(bi, 0)..][..n],
            };
            // Per-row zero points of `a`: the sums with zero, less
            // `az[i] · Σ_p (b[p, j] − bz[j])`.
            let per_row = self.a_zp.step != 0;
            let cb: Vec<i32> = if per_row {
                let mut c = vec![0u32; n];
                sums_plain(q, 1, &vec![1; k], 0, bm, bz, &mut c);
                c.iter().map(|&v| v as i32).collect()
            } else {
                Vec::new()
            };
            let xz = if per_row {
                0
            } else {
                a_z[self.a_zp.at(bi, 0)] + sa
            };
            for r0 in (0..m).step_by(self.rows) {
                let rt = self.rows.min(m - r0);
                let x = &mut xa[..rt * k];
                for (d, &v) in x.iter_mut().zip(&a[oa[bi] + r0 * k..][..rt * k]) {
                    *d = v ^ sb;
                }
                let s = &mut sums[..rt * n];
                isums(q, rt, x, xz, bm, bz, s, threads);
                for (i, (out, row)) in yb[r0 * n..][..rt * n]
                    .chunks_exact_mut(n)
                    .zip(s.chunks_exact(n))
                    .enumerate()
                {
                    let (r, sc) = (r0 + i, a_s[self.a_scale.at(bi, r0 + i)]);
                    let z = if per_row {
                        a_z[self.a_zp.at(bi, r)] + sa
                    } else {
                        0
                    };
                    for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
                        let mut acc = v as i32;
                        if per_row {
                            acc = acc.wrapping_sub(z.wrapping_mul(cb[j]));
                        }
                        let mult = multiplier(self.scales, sc, b_s[self.b_scale.at(bi, j)], ys);
                        *o = requant(acc, mult, yz, self.range) as u8;
                    }
                }
            }
        }
        Ok(())
    }
}

/// QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point,
/// y_scale, y_zero_point).
pub fn qlinear_matmul(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let op = "QLinearMatMul";
    let (a, b) = (ctx.input(0)?, ctx.input(3)?);
    let y = ctx.outputs.first().ok_or("no output")?;
    let a_signed = signed8(a, op, "a")?;
    let b_signed = signed8(b, op, "b")?;
    let range = range8(y, op)?;
    let scales = scale_type(ctx, &[1, 4, 6], op)?;
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err(format!("{op} of {:?} and {:?}", a.shape, b.shape));
    }
    let pa = if a.shape.len() == 1 {
        vec![1, a.shape[0]]
    } else {
        a.shape.clone()
    };
    let pb = if b.shape.len() == 1 {
        vec![b.shape[0], 1]
    } else {
        b.shape.clone()
    };
    let batch = batch_dims(&pa, &pb)?;
    let bt = batches(&a.shape, &b.shape)?;
    let (m, k, n) = (bt.m, bt.k, bt.n);
    if numel(&y.shape) != bt.oa.len() * m * n {
        return Err(format!(
            "{op}: an output of shape {:?} for {:?} x {:?}",
            y.shape, a.shape, b.shape
        ));
    }
    // `a`'s per-row scales may be `[M]` (the spec's 2-D wording).
    let of_a = |i: usize| -> Result<Param, String> {
        let s = &ctx.input(i)?.shape;
        let s = if s.len() == 1 && s[0] == m && m > 1 && a.shape.len() >= 2 {
            vec![m, 1]
        } else {
            s.clone()
        };
        param(&s, &pa, pa.len() - 2, &batch)
            .map_err(|e| format!("{op}: a's scale or zero point {e}"))
    };
    let of_b = |i: usize| -> Result<Param, String> {
        param(&ctx.input(i)?.shape, &pb, pb.len() - 1, &batch)
            .map_err(|e| format!("{op}: b's scale or zero point {e}"))
    };
    for (i, ty) in [(2, a.dtype), (5, b.dtype), (7, y.dtype)] {
        if let Some(z) = ctx.inputs.get(i).cloned().flatten() {
            if z.dtype != ty {
                return Err(format!(
                    "{op}: a zero point of {} for a {} operand",
                    z.dtype.name(),
                    ty.name()
                ));
            }
        }
    }
    let zp = |i: usize, f: &dyn Fn(usize) -> Result<Param, String>| match ctx.inputs.get(i) {
        Some(Some(_)) => f(i),
        _ => Ok(Param {
            boff: vec![0; numel(&batch)],
            step: 0,
        }),
    };
    let (a_scale, a_zp) = (of_a(1)?, zp(2, &of_a)?);
    let (b_scale, b_zp) = (of_b(4)?, zp(5, &of_b)?);
    for i in [6, 7] {
        if let Some(Some(t)) = ctx.inputs.get(i) {
            if numel(&t.shape) != 1 {
                return Err(format!(
                    "{op}: a y scale or zero point of shape {:?} (per tensor is implemented)",
                    t.shape
                ));
            }
        }
    }
    let rows = (TILE_BYTES / (k + 4 * n).max(1))
        .max(MIN_ROWS)
        .min(m.max(1));
    let packed = match ctx.constants.get(3).copied().flatten() {
        Some(w) if k * n > 0 && w.len() == numel(&b.shape) => Some(
            w.chunks_exact(k * n)
                .map(|bm| QWeight::new(k, n, b_signed, bm))
                .collect(),
        ),
        _ => None,
    };
    Ok(Box::new(QMatMul {
        bt,
        a_signed,
        b_signed,
        a_scale,
        a_zp,
        b_scale,
        b_zp,
        scales,
        range,
        rows,
        packed,
    }))
}
