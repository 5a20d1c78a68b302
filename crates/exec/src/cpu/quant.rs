//! Integer quantization (what onnxruntime's quantizers emit):
//! QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and MatMulInteger.
//! QuantizeLinear writes uint8, int8, uint16 and int16; DequantizeLinear
//! reads those, int32 and packed 4-bit inputs (uint4/int4, low nibble
//! first). Both take per-tensor, per-axis and blocked scales (opset 21's
//! `block_size`: one scale per `block_size` elements along `axis`, as
//! `--quantize int4-weights` writes).
//!
//! Rounding is half to even, as ONNX specifies and onnxruntime does.

use crate::backend::{In, Kernel, KernelIo, NodeCtx};
use crate::cpu::matmul::{batches, Batches};
use crate::cpu::par;
use crate::tensor::{cast, cast_mut, nibble, numel, sign4, strides};
use graphopt_ir::DType;

/// Integer elements widened to i32 (u8, i8, u16, i16, i32).
pub(crate) fn ints(x: &In) -> Result<Vec<i32>, String> {
    let b = x.bytes()?;
    Ok(match x.dtype {
        DType::U8 => b.iter().map(|&v| v as i32).collect(),
        DType::I8 => cast::<i8>(b).iter().map(|&v| v as i32).collect(),
        DType::I32 => cast::<i32>(b).to_vec(),
        DType::U16 => cast::<u16>(b).iter().map(|&v| v as i32).collect(),
        DType::I16 => cast::<u16>(b).iter().map(|&v| v as i16 as i32).collect(),
        DType::U4 => (0..x.shape.iter().product())
            .map(|i| nibble(b, i) as i32)
            .collect(),
        DType::I4 => (0..x.shape.iter().product())
            .map(|i| sign4(nibble(b, i)) as i32)
            .collect(),
        d => {
            return Err(format!(
                "expected an 8-, 16- or 32-bit integer, got {}",
                d.name()
            ))
        }
    })
}

struct Dequantize {
    /// Elements per index of `axis` and the axis length (1 for per-tensor).
    inner: usize,
    len: usize,
    /// Blocked scales: elements per scale along `axis` (0: not blocked).
    block: usize,
}

impl Kernel for Dequantize {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let xin = io.input(0)?;
        if self.block == 0 && matches!(xin.dtype, DType::U8 | DType::I8) {
            return self.run_8bit(io);
        }
        let x = ints(&xin)?;
        let scale = io.input(1)?.f32()?;
        let zp = match io.inputs.get(2).copied().flatten() {
            Some(z) => ints(&z)?,
            None => vec![0; scale.len()],
        };
        let y = io.outputs[0].f32()?;
        let inner = self.inner;
        scale_runs(x.len(), self.len, inner, self.block, |at, base, step| {
            for (k, (out, &v)) in y[at..at + inner]
                .iter_mut()
                .zip(&x[at..at + inner])
                .enumerate()
            {
                let c = base + step * k;
                *out = (v - zp[c]) as f32 * scale[c];
            }
        });
        Ok(())
    }
}

/// A tensor of `total` elements as `[outer, len, inner]` (the scale axis
/// in the middle), run by run: `f(at, base, step)` for the `inner`
/// elements from `at`, the `k`-th of which has scale `base + step·k` (one
/// scale row per outer and axis index, so the inner loop does no
/// division). `block`: elements per scale along the axis (0: per tensor or
/// per axis, as [`scale_axis`] reads them).
fn scale_runs(
    total: usize,
    len: usize,
    inner: usize,
    block: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let outer = total / (len * inner).max(1);
    let blocks = if block > 0 { len.div_ceil(block) } else { 0 };
    for o in 0..outer {
        for a in 0..len {
            let (base, step) = match block {
                0 if len == 1 => (0, 0),
                0 => (a, 0),
                block => ((o * blocks + a / block) * inner, 1),
            };
            f((o * len + a) * inner, base, step);
        }
    }
}

impl Dequantize {
    /// uint8/int8 without blocks, the common case: read in place (no
    /// widened copy), rows of `inner` split across threads.
    fn run_8bit(&self, io: &mut KernelIo) -> Result<(), String> {
        let xin = io.input(0)?;
        let signed = xin.dtype == DType::I8;
        let xb = xin.bytes()?;
        let scale = io.input(1)?.f32()?;
        let zp = match io.inputs.get(2).copied().flatten() {
            Some(z) => ints(&z)?,
            None => vec![0; scale.len()],
        };
        let threads = io.threads;
        let y = io.outputs[0].f32()?;
        let deq = |v: u8, c: usize| {
            let q = if signed { v as i8 as i32 } else { v as i32 };
            (q - zp[c]) as f32 * scale[c]
        };
        per_scale(threads, y, self.len, self.inner, |first, part, chan| {
            map_scaled(part, &xb[first..first + part.len()], chan, deq)
        });
        Ok(())
    }
}

/// The scale indices of a run of elements: one for the whole run, or
/// `k % len` for its `k`-th element (per-column scales, `inner` = 1).
#[derive(Clone, Copy)]
enum Chan {
    One(usize),
    Cycle(usize),
}

/// `part[k] = f(src[k], c)` with `c` the scale index `chan` gives each
/// element (the match outside the loops).
#[inline]
fn map_scaled<S: Copy, T>(part: &mut [T], src: &[S], chan: Chan, f: impl Fn(S, usize) -> T) {
    match chan {
        Chan::One(c) => {
            for (o, &v) in part.iter_mut().zip(src) {
                *o = f(v, c);
            }
        }
        Chan::Cycle(len) => {
            for (k, (o, &v)) in part.iter_mut().zip(src).enumerate() {
                *o = f(v, k % len);
            }
        }
    }
}

/// Splits `y` (`[outer, len, inner]`, one scale per index of the middle
/// axis) across threads and calls `f(first, part, chan)` on runs of it.
fn per_scale<T: Send>(
    threads: usize,
    y: &mut [T],
    len: usize,
    inner: usize,
    f: impl Fn(usize, &mut [T], Chan) + Sync,
) {
    if len <= 1 {
        par::for_chunks_mut(threads, y, 1, par::MIN_ELEMS, |first, part| {
            f(first, part, Chan::One(0))
        });
    } else if inner <= 1 {
        let min = par::MIN_ELEMS.div_ceil(len);
        par::for_chunks_mut(threads, y, len, min, |first, part| {
            f(first * len, part, Chan::Cycle(len))
        });
    } else {
        let min = par::MIN_ELEMS.div_ceil(inner);
        par::for_chunks_mut(threads, y, inner, min, |first, part| {
            for (j, row) in part.chunks_mut(inner).enumerate() {
                f((first + j) * inner, row, Chan::One((first + j) % len));
            }
        });
    }
}

/// A zero point, when given, has the scale's shape (one per scale): a
/// shorter one would be read past its end.
fn zero_point_matches_scale(ctx: &NodeCtx, op: &str) -> Result<(), String> {
    let s = ctx.input(1)?;
    match ctx.inputs.get(2).cloned().flatten() {
        Some(z) if numel(&z.shape) != numel(&s.shape) => Err(format!(
            "{op}: a zero point of shape {:?} for scales of shape {:?}",
            z.shape, s.shape
        )),
        _ => Ok(()),
    }
}

pub fn dequantize(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    zero_point_matches_scale(ctx, "DequantizeLinear")?;
    let (inner, len, block) = scale_layout(ctx, "DequantizeLinear")?;
    Ok(Box::new(Dequantize { inner, len, block }))
}

/// Where the scales of a tensor of shape `x` lie, as DequantizeLinear reads
/// them (`op` names the reader in errors): elements per index of `axis`
/// and its length, `(1, 1)` for one scale. Per axis, the scales are 1-D
/// with `axis`'s length; blocked (`block > 0`, opset 21), they have `x`'s
/// rank and shape except `ceil(len / block)` along `axis`.
pub(crate) fn scale_axis(
    x: &[usize],
    s: &[usize],
    axis: i64,
    block: usize,
    op: &str,
) -> Result<(usize, usize), String> {
    let r = x.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if block > 0 {
        let ok = (0..r).contains(&a)
            && s.len() == x.len()
            && x.iter().zip(s).enumerate().all(|(d, (&xd, &sd))| {
                if d == a as usize {
                    sd == xd.div_ceil(block)
                } else {
                    sd == xd
                }
            });
        if !ok {
            return Err(format!(
                "{op}: scales of shape {s:?} are not blocks of {block} along axis {axis} of {x:?}"
            ));
        }
        return Ok((strides(x)[a as usize], x[a as usize]));
    }
    let len: usize = s.iter().product();
    if len <= 1 {
        return Ok((1, 1));
    }
    if s.len() != 1 {
        return Err(format!(
            "{op}: only per-tensor and per-axis scales are implemented"
        ));
    }
    if !(0..r).contains(&a) || x[a as usize] != len {
        return Err(format!(
            "{op}: {len} scales do not match axis {a} of shape {x:?}"
        ));
    }
    Ok((strides(x)[a as usize], len))
}

/// Where the scales of a QuantizeLinear or DequantizeLinear node lie
/// ([`scale_axis`], from `axis`, default 1, and `block_size`): elements
/// per index of the axis, its length, and the block size (0: per tensor
/// or per axis).
fn scale_layout(ctx: &NodeCtx, op: &str) -> Result<(usize, usize, usize), String> {
    let block = ctx.node.attr_int("block_size").unwrap_or(0);
    let block = usize::try_from(block).map_err(|_| format!("{op}: block_size {block}"))?;
    let axis = ctx.node.attr_int("axis").unwrap_or(1);
    let (x, s) = (ctx.input(0)?, ctx.input(1)?);
    let (inner, len) = scale_axis(&x.shape, &s.shape, axis, block, op)?;
    Ok((inner, len, block))
}

struct Quantize {
    inner: usize,
    len: usize,
    /// Blocked scales: elements per scale along the axis (0: not blocked).
    block: usize,
    /// The output's range (uint8, int8, uint16 or int16), and whether its
    /// elements are 16-bit.
    lo: f32,
    hi: f32,
    wide: bool,
}

impl Kernel for Quantize {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let scale = io.input(1)?.f32()?;
        let zp = match io.inputs.get(2).copied().flatten() {
            Some(z) => ints(&z)?,
            None => vec![0; scale.len()],
        };
        let (lo, hi) = (self.lo, self.hi);
        let threads = io.threads;
        // The value in the output's range, as an i32 whose low bits are
        // the output element (NaN gives 0).
        let quant =
            |v: f32, c: usize| (round_even(v / scale[c]) + zp[c] as f32).clamp(lo, hi) as i32;
        let (len, inner, block) = (self.len, self.inner, self.block);
        if self.wide {
            let y: &mut [u16] = cast_mut(&mut io.outputs[0].data[..2 * x.len()]);
            quantize_into(threads, x, y, (len, inner, block), |v, c| {
                quant(v, c) as u16
            });
        } else if block == 0 {
            // Bytes, per tensor or per axis: runs of one scale in vectors
            // where the CPU has AVX2 (the same arithmetic).
            let y = &mut io.outputs[0].data[..x.len()];
            per_scale(threads, y, len, inner, |first, part, chan| {
                let src = &x[first..first + part.len()];
                if let Chan::One(c) = chan {
                    quantize_run(src, part, scale[c], zp[c] as f32, (lo, hi));
                } else {
                    map_scaled(part, src, chan, |v, c| quant(v, c) as u8);
                }
            });
        } else {
            let y = &mut io.outputs[0].data[..x.len()];
            quantize_into(threads, x, y, (len, inner, block), |v, c| quant(v, c) as u8);
        }
        Ok(())
    }
}

/// `y[i]`, the low byte of `clamp(round_even(x[i] / scale) + zp, lo, hi)`
/// as an integer (NaN gives 0): [`Quantize`]'s arithmetic for one run of
/// one scale, eight at a time on AVX2 (it took 1.8 ns an element one by
/// one, 58% of a statically quantized mobilenet_v2's time).
fn quantize_run(x: &[f32], y: &mut [u8], scale: f32, zp: f32, (lo, hi): (f32, f32)) {
    let one = |v: f32| (round_even(v / scale) + zp).clamp(lo, hi) as i32 as u8;
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::gemm::available() {
        // SAFETY: the CPU has AVX2 (checked just above).
        done = unsafe { quantize_run_avx2(x, y, scale, zp, (lo, hi)) };
    }
    for (o, &v) in y[done..].iter_mut().zip(&x[done..]) {
        *o = one(v);
    }
}

/// [`quantize_run`] on the whole blocks of eight; returns how many
/// elements it wrote.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_run_avx2(
    x: &[f32],
    y: &mut [u8],
    scale: f32,
    zp: f32,
    (lo, hi): (f32, f32),
) -> usize {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len()) / 8 * 8;
    let (sv, zv, lov, hiv) = (
        _mm256_set1_ps(scale),
        _mm256_set1_ps(zp),
        _mm256_set1_ps(lo),
        _mm256_set1_ps(hi),
    );
    let two23 = _mm256_set1_ps(8_388_608.0);
    let sign = _mm256_set1_ps(-0.0);
    // Bytes 0, 4, 8 and 12 of each 128-bit lane, then the two lanes'
    // words side by side.
    let pick = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let join = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    let mut i = 0;
    // SAFETY: i + 8 <= n <= both lengths.
    unsafe {
        while i < n {
            let v = _mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(i)), sv);
            // round_even: |v| + 2^23 - 2^23 with v's sign, below 2^23.
            let a = _mm256_andnot_ps(sign, v);
            let r = _mm256_or_ps(
                _mm256_sub_ps(_mm256_add_ps(a, two23), two23),
                _mm256_and_ps(sign, v),
            );
            let r = _mm256_blendv_ps(v, r, _mm256_cmp_ps::<_CMP_LT_OQ>(a, two23));
            let q = _mm256_add_ps(r, zv);
            // clamp (NaN passes), then NaN to 0 as `as i32` makes it.
            let c = _mm256_min_ps(_mm256_max_ps(q, lov), hiv);
            let c = _mm256_and_ps(c, _mm256_cmp_ps::<_CMP_ORD_Q>(q, q));
            let w = _mm256_cvttps_epi32(c);
            let b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(w, pick), join);
            _mm_storel_epi64(
                y.as_mut_ptr().add(i) as *mut __m128i,
                _mm256_castsi256_si128(b),
            );
            i += 8;
        }
    }
    n
}

/// `y[i] = q(x[i], c)` with `c` the scale index of element `i`: per tensor
/// or per axis split across threads ([`per_scale`]), blocked on one thread.
fn quantize_into<T: Send>(
    threads: usize,
    x: &[f32],
    y: &mut [T],
    (len, inner, block): (usize, usize, usize),
    q: impl Fn(f32, usize) -> T + Sync,
) {
    if block == 0 {
        per_scale(threads, y, len, inner, |first, part, chan| {
            map_scaled(part, &x[first..first + part.len()], chan, &q)
        });
        return;
    }
    scale_runs(x.len(), len, inner, block, |at, base, step| {
        for (k, (o, &v)) in y[at..at + inner]
            .iter_mut()
            .zip(&x[at..at + inner])
            .enumerate()
        {
            *o = q(v, base + step * k);
        }
    });
}

/// Round half to even without a libm call (so the loop vectorizes): for
/// |v| < 2²³, adding and subtracting 2²³ leaves the nearest integer, ties
/// to even (the sum's spacing is 1); from 2²³ on every float is an integer
/// already (NaN stays NaN).
#[inline(always)]
pub(crate) fn round_even(v: f32) -> f32 {
    const TWO23: f32 = 8_388_608.0;
    let a = v.abs();
    let r = ((a + TWO23) - TWO23).copysign(v);
    if a < TWO23 {
        r
    } else {
        v
    }
}

/// The least and greatest of `x` and 0 (NaNs skipped, as `f32::min` and
/// `f32::max` skip them), in 16 lanes so the loop vectorizes; min and max
/// are exact, so the lanes give the same pair as one fold.
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut lo = [0.0f32; 16];
    let mut hi = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for i in 0..16 {
            lo[i] = if c[i] < lo[i] { c[i] } else { lo[i] };
            hi[i] = if c[i] > hi[i] { c[i] } else { hi[i] };
        }
    }
    let tail = chunks.remainder();
    let lo = lo.iter().chain(tail).copied().fold(0.0f32, f32::min);
    let hi = hi.iter().chain(tail).copied().fold(0.0f32, f32::max);
    (lo, hi)
}

/// QuantizeLinear to uint8, int8, uint16 or int16 (the type of the zero
/// point or `output_dtype`; uint8 without either):
/// `saturate(round_half_even(x / scale) + zero_point)`.
pub fn quantize(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    if ctx.input(0)?.dtype != DType::F32 {
        return Err("QuantizeLinear: only float input is implemented".into());
    }
    let y = ctx.outputs.first().ok_or("no output")?.dtype;
    let (lo, hi) = match y {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        d => {
            return Err(format!(
                "QuantizeLinear to {} is not implemented (uint8, int8, uint16 and int16 are)",
                d.name()
            ))
        }
    };
    if let Some(z) = ctx.inputs.get(2).cloned().flatten() {
        if z.dtype != y {
            return Err(format!(
                "QuantizeLinear: a {} zero point for a {} output",
                z.dtype.name(),
                y.name()
            ));
        }
    }
    zero_point_matches_scale(ctx, "QuantizeLinear")?;
    let (inner, len, block) = scale_layout(ctx, "QuantizeLinear")?;
    Ok(Box::new(Quantize {
        inner,
        len,
        block,
        lo,
        hi,
        wide: matches!(y, DType::U16 | DType::I16),
    }))
}

struct DynamicQuantize;

impl Kernel for DynamicQuantize {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let threads = io.threads;
        // The range over parts split across threads, then combined: min
        // and max are exact, so the result does not depend on the split.
        let k = par::parts(x.len(), threads, par::MIN_ELEMS);
        let mut ranges = vec![(0.0f32, 0.0f32); k];
        par::for_chunks_mut(threads, &mut ranges, 1, 1, |first, slots| {
            for (j, slot) in slots.iter_mut().enumerate() {
                *slot = min_max(&x[par::range(x.len(), k, first + j)]);
            }
        });
        let lo = ranges.iter().map(|r| r.0).fold(0.0f32, f32::min);
        let hi = ranges.iter().map(|r| r.1).fold(0.0f32, f32::max);
        let scale = (hi - lo) / 255.0;
        let zp = if scale == 0.0 {
            0.0
        } else {
            (-lo / scale).round_ties_even().clamp(0.0, 255.0)
        };
        {
            let y = &mut io.outputs[0].data[..x.len()];
            par::for_chunks_mut(threads, y, 1, par::MIN_ELEMS, |first, part| {
                let x = &x[first..first + part.len()];
                if scale == 0.0 {
                    // zp is 0 then.
                    part.fill(0);
                    return;
                }
                quantize_run(x, part, scale, zp, (0.0, 255.0));
            });
        }
        if let Some(s) = io.outputs.get_mut(1) {
            cast_mut::<f32>(s.data)[0] = scale;
        }
        if let Some(z) = io.outputs.get_mut(2) {
            z.data[0] = zp as u8;
        }
        Ok(())
    }
}

pub fn dynamic_quantize(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    if ctx.input(0)?.dtype != DType::F32 {
        return Err("DynamicQuantizeLinear takes float".into());
    }
    Ok(Box::new(DynamicQuantize))
}

struct MatMulInteger {
    a: Vec<usize>,
    b: Vec<usize>,
}

impl Kernel for MatMulInteger {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let a = ints(&io.input(0)?)?;
        let b = ints(&io.input(1)?)?;
        let za = match io.inputs.get(2).copied().flatten() {
            Some(z) => ints(&z)?,
            None => vec![0],
        };
        let zb = match io.inputs.get(3).copied().flatten() {
            Some(z) => ints(&z)?,
            None => vec![0],
        };
        let Batches { m, k, n, oa, ob } = batches(&self.a, &self.b)?;
        let y: &mut [i32] = cast_mut(io.outputs[0].data);
        for (bi, c) in y.chunks_mut(m * n).enumerate() {
            let (ab, bb) = (&a[oa[bi]..], &b[ob[bi]..]);
            for i in 0..m {
                let zai = za[if za.len() == 1 { 0 } else { i }];
                for j in 0..n {
                    let zbj = zb[if zb.len() == 1 { 0 } else { j }];
                    let mut s = 0i32;
                    for p in 0..k {
                        s += (ab[i * k + p] - zai) * (bb[p * n + j] - zbj);
                    }
                    c[i * n + j] = s;
                }
            }
        }
        Ok(())
    }
}

pub fn matmul_integer(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    if let Some(k) = crate::cpu::qgemm::matmul_integer(ctx) {
        return Ok(k);
    }
    Ok(Box::new(MatMulInteger {
        a: ctx.input(0)?.shape.clone(),
        b: ctx.input(1)?.shape.clone(),
    }))
}

#[cfg(test)]
mod round_tests {
    use super::round_even;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_quantization_gives_the_scalar_bytes() {
        // Without AVX2 both sides are the scalar formula.
        if !crate::cpu::gemm::available()
            && graphopt_testutil::skip_or_fail(
                "vector_quantization_gives_the_scalar_bytes",
                "the CPU has no AVX2/FMA",
                graphopt_testutil::require_simd(),
                "GRAPHOPT_REQUIRE_SIMD=1 or CI=true",
            )
        {
            return;
        }
        // Ties, signed zeros, NaN, infinities, values past 2^23 and past
        // the range, at lengths around the vector width.
        let mut xs = vec![
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e9,
            -1e9,
            8_388_609.0,
            127.5,
            -128.5,
            255.5,
        ];
        let mut seed = 3u32;
        for _ in 0..300 {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            xs.push((seed >> 8) as f32 / (1u32 << 24) as f32 * 600.0 - 300.0);
        }
        for (scale, zp, lo, hi) in [
            (1.0, 0.0, 0.0, 255.0),
            (0.37, 128.0, 0.0, 255.0),
            (1.0, 0.0, -128.0, 127.0),
            (2.3, -5.0, -128.0, 127.0),
        ] {
            for n in [0, 7, 8, 9, 31, xs.len()] {
                let mut got = vec![7u8; n];
                super::quantize_run(&xs[..n], &mut got, scale, zp, (lo, hi));
                let want: Vec<u8> = xs[..n]
                    .iter()
                    .map(|&v| (round_even(v / scale) + zp).clamp(lo, hi) as i32 as u8)
                    .collect();
                assert_eq!(
                    got, want,
                    "scale {scale} zp {zp} range {lo}..{hi} length {n}"
                );
            }
        }
    }

    #[test]
    fn round_even_is_round_ties_even() {
        let mut vals = vec![
            0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 4194303.5, 4194304.5, -4194303.5, 1e9,
            -1e9, 0.0, -0.0,
        ];
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            vals.push(f32::from_bits(s as u32) % 1e7);
        }
        for v in vals {
            let (got, want) = (round_even(v), v.round_ties_even());
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{v}: {got} vs {want}"
            );
        }
        assert!(round_even(f32::NAN).is_nan());
    }
}
