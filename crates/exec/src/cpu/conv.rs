//! Conv (1-D and 2-D, groups, strides, pads, dilations, auto_pad; three or
//! more spatial dims in [`super::window_nd`]):
//! - a 1×1 convolution with stride 1 and no padding is a plain GEMM on the
//!   input (no unfolding);
//! - a depthwise one (one output channel per input channel) runs a direct
//!   kernel: on AVX2, eight channels at once in the lanes of a register
//!   for outputs under [`C8_MAX_OW`] columns, plane by plane over padded
//!   phases above (generic loops elsewhere); blocks of eight channels
//!   split across threads;
//! - on graphopt's kernel, other shapes whose output rows are wide enough
//!   read their taps from a padded copy of the image in place, with no
//!   unfolded matrix ([`super::conv_flat`]; the same bits as the im2col
//!   tiles);
//! - the rest unfold one group of one image in tiles of output
//!   columns (im2col, at most [`TILE_BYTES`] per tile) and multiply each
//!   tile into its columns of the output; threads take whole tiles, each in
//!   its own workspace slot (an image that fits one tile is one tile, whose
//!   GEMM splits its rows across threads). The workspace is a few tiles,
//!   whatever the image or batch size. Convolutions multiply on graphopt's
//!   own kernel ([`own_kernel`]) where the CPU runs it, but for the folded
//!   path's im2col tiles, which stay on matrixmultiply.

use crate::backend::{Activation, Data, In, Kernel, KernelIo, NodeCtx};
use crate::cpu::conv_flat::Flat;
use crate::cpu::matmul::{
    own_kernel, sgemm, sgemm_bias_act_with, sgemm_into_bias_act, sgemm_into_with, sgemm_with,
    SendPtr,
};
use crate::cpu::par;
use crate::tensor::cast_mut;
use graphopt_ir::DType;

/// Geometry of a 2-D window op (1-D ops get H = 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    /// Padding at the start of each spatial dim (the end pad follows from
    /// the output size, which shape inference fixed).
    pub ph: usize,
    pub pw: usize,
}

impl Window {
    /// The window of input `[N, C, (H,) W]` over output spatial dims
    /// `out_sp`, from per-dim kernel sizes, strides, dilations and begin
    /// pads (1-D windows as 2-D ones of height 1).
    fn new(
        x: &[usize],
        out_sp: &[usize],
        kernel: &[usize],
        strides: &[usize],
        dilations: &[usize],
        begin: &[usize],
    ) -> Window {
        let one_d = x.len() == 3;
        let pick = |v: &[usize], one: usize| {
            if one_d {
                (one, v[0])
            } else {
                (v[0], v[1])
            }
        };
        let ((h, w), (oh, ow)) = (pick(&x[2..], 1), pick(out_sp, 1));
        let ((kh, kw), (sh, sw)) = (pick(kernel, 1), pick(strides, 1));
        let ((dh, dw), (ph, pw)) = (pick(dilations, 1), pick(begin, 0));
        Window {
            n: x[0],
            c: x[1],
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            ph,
            pw,
        }
    }

    /// A 1x1 window of stride 1 without padding: a convolution over it is
    /// a plain GEMM (no unfolding).
    pub(crate) fn plain_1x1(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.sh == 1
            && self.sw == 1
            && self.ph == 0
            && self.pw == 0
            && self.oh == self.h
            && self.ow == self.w
    }
}

/// Reads kernel size, strides, dilations and pads of a Conv or pooling
/// node with input `[N, C, (H,) W]` and output `[N, M, (OH,) OW]`.
pub fn window(ctx: &NodeCtx, kernel: &[usize]) -> Result<Window, String> {
    let x = ctx.input(0)?;
    let y = &ctx.outputs[0];
    let sp = x.shape.len().checked_sub(2).ok_or("input rank below 3")?;
    if !(1..=2).contains(&sp) || kernel.len() != sp || y.shape.len() != x.shape.len() {
        return Err(format!(
            "{}-D windows are not implemented (1-D and 2-D are)",
            sp
        ));
    }
    let node = ctx.node;
    // One value per spatial dim (pads: two), each at least `min`.
    let ints = |name: &str, d: usize, len: usize, min: i64| -> Result<Vec<usize>, String> {
        match node.attr_ints(name) {
            None => Ok(vec![d; len]),
            Some(v) if v.len() == len && v.iter().all(|&x| x >= min) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            Some(v) => Err(format!("{name} {v:?} for {sp} spatial dims")),
        }
    };
    let s = ints("strides", 1, sp, 1)?;
    let dl = ints("dilations", 1, sp, 1)?;
    let pads = ints("pads", 0, 2 * sp, 0)?;
    if kernel.contains(&0) {
        return Err(format!("a kernel of shape {kernel:?}"));
    }
    let in_sp = &x.shape[2..];
    let out_sp = &y.shape[2..];
    let mut begin = pads[..sp].to_vec();
    match node.attr_str("auto_pad").unwrap_or("NOTSET") {
        "SAME_UPPER" | "SAME_LOWER" => {
            let lower = node.attr_str("auto_pad") == Some("SAME_LOWER");
            for i in 0..sp {
                let need = (out_sp[i].saturating_sub(1) * s[i] + (kernel[i] - 1) * dl[i] + 1)
                    .saturating_sub(in_sp[i]);
                begin[i] = if lower { need.div_ceil(2) } else { need / 2 };
            }
        }
        "VALID" => begin = vec![0; sp],
        _ => {}
    }
    Ok(Window::new(&x.shape, out_sp, kernel, &s, &dl, &begin))
}

/// Unfolds channels `c0..c0+cg` of one image `x` ([C, H, W]) into `col`
/// ([cg·kh·kw, OH·OW]); padding reads as 0.
pub fn im2col(g: &Window, x: &[f32], c0: usize, cg: usize, col: &mut [f32]) {
    im2col_cols(g, x, c0, cg, 0, g.oh * g.ow, col);
}

/// Output columns `p0..p0+pt` (output pixels in row-major order) of the
/// unfolded matrix of [`im2col`], into `col` ([cg·kh·kw, pt]).
pub fn im2col_cols(
    g: &Window,
    x: &[f32],
    c0: usize,
    cg: usize,
    p0: usize,
    pt: usize,
    col: &mut [f32],
) {
    im2col_cols_with(g, x, c0, cg, (p0, pt), col, 0.0);
}

/// [`im2col_cols`] of any element type, padding read as `pad` (the
/// integer convolutions of [`super::qlinear`] unfold bytes, padded with
/// the zero point).
pub(crate) fn im2col_cols_with<T: Unfold>(
    g: &Window,
    x: &[T],
    c0: usize,
    cg: usize,
    (p0, pt): (usize, usize),
    col: &mut [T],
    pad: T,
) {
    for c in 0..cg {
        let plane = &x[(c0 + c) * g.h * g.w..][..g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let (lo, hi) = valid_cols(g, kj);
                let row = &mut col[((c * g.kh + ki) * g.kw + kj) * pt..][..pt];
                let mut p = p0;
                while p < p0 + pt {
                    let (oy, ox0) = (p / g.ow, p % g.ow);
                    let ox1 = g.ow.min(ox0 + (p0 + pt - p));
                    let dst = &mut row[p - p0..][..ox1 - ox0];
                    p += ox1 - ox0;
                    let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
                    if iy < 0 || iy as usize >= g.h {
                        dst.fill(pad);
                        continue;
                    }
                    let src = &plane[iy as usize * g.w..][..g.w];
                    let (a, b) = (lo.clamp(ox0, ox1), hi.clamp(ox0, ox1));
                    dst[..a - ox0].fill(pad);
                    dst[b - ox0..].fill(pad);
                    let inner = &mut dst[a - ox0..b - ox0];
                    if inner.is_empty() {
                        continue;
                    }
                    let first = a * g.sw + kj * g.dw - g.pw;
                    T::strided(&src[first..], g.sw, inner);
                }
            }
        }
    }
}

/// An element type [`im2col_cols_with`] unfolds: `strided` copies
/// `src[0], src[s], src[2s], ...` into `dst`.
pub(crate) trait Unfold: Copy {
    fn strided(src: &[Self], s: usize, dst: &mut [Self]) {
        for (i, d) in dst.iter_mut().enumerate() {
            *d = src[i * s];
        }
    }
}

impl Unfold for u8 {
    /// Stride 1 as one copy; other strides by a stepped iterator (no
    /// bounds check per element).
    fn strided(src: &[u8], s: usize, dst: &mut [u8]) {
        if s == 1 {
            dst.copy_from_slice(&src[..dst.len()]);
            return;
        }
        debug_assert!(dst.is_empty() || src.len() > (dst.len() - 1) * s);
        for (d, &v) in dst.iter_mut().zip(src.iter().step_by(s)) {
            *d = v;
        }
    }
}

impl Unfold for f32 {
    /// Stride 1 in fixed blocks of eight (no `memcpy` call per output
    /// row), stride 2 in AVX2 shuffles where the CPU has them (a stem
    /// convolution's unfolding was a third of its time, element by
    /// element).
    fn strided(src: &[f32], s: usize, dst: &mut [f32]) {
        if s == 1 {
            copy_run(dst, src);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if s == 2 && super::gemm::available() {
            // The evens of whole blocks of 16 that lie in `src`.
            let blocks = (dst.len() / 8).min(src.len() / 16);
            // SAFETY: AVX2 (checked); reads src[..16·blocks], writes
            // dst[..8·blocks] and then the odd-sink scratch.
            unsafe {
                let mut odd = [0f32; 8];
                for b in 0..blocks {
                    deinterleave2(
                        src.as_ptr().add(16 * b),
                        16,
                        dst.as_mut_ptr().add(8 * b),
                        odd.as_mut_ptr(),
                    );
                }
            }
            for (i, d) in dst.iter_mut().enumerate().skip(8 * blocks) {
                *d = src[2 * i];
            }
            return;
        }
        for (i, d) in dst.iter_mut().enumerate() {
            *d = src[i * s];
        }
    }
}

/// Rows `r0..r0 + rows` of the unfolded matrix of [`im2col`] (row
/// `r = (c·kh + ki)·kw + kj`, channels from `c0`) for images `n0..n0 + ni`
/// of the batch `x` side by side: image `j`'s `OH·OW` columns at `j·OH·OW`
/// of each row, rows at stride `rs` in `col` (the folded path's tile).
/// Rows outer: a row's window (channel, tap, valid columns) is worked out
/// once for all the images, by counters rather than divisions, and runs of
/// a few columns (a 7x7 output's rows) are copied in place rather than
/// through `memcpy`. Kernels wider than the output unfold the other way
/// ([`im2row_fold`]).
#[allow(clippy::too_many_arguments)]
fn im2col_rows_fold(
    g: &Window,
    x: &[f32],
    (n0, ni): (usize, usize),
    c0: usize,
    r0: usize,
    rows: usize,
    col: &mut [f32],
    rs: usize,
) {
    let (ohw, hw) = (g.oh * g.ow, g.h * g.w);
    let (mut c, mut ki, mut kj) = (r0 / (g.kh * g.kw), (r0 / g.kw) % g.kh, r0 % g.kw);
    for r in 0..rows {
        let (lo, hi) = valid_cols(g, kj);
        let row = &mut col[r * rs..][..ni * ohw];
        for oy in 0..g.oh {
            let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
            if iy < 0 || iy as usize >= g.h || lo >= hi {
                for j in 0..ni {
                    row[j * ohw + oy * g.ow..][..g.ow].fill(0.0);
                }
                continue;
            }
            let first = lo * g.sw + kj * g.dw - g.pw;
            let at = (c0 + c) * hw + iy as usize * g.w + first;
            for j in 0..ni {
                let d = &mut row[j * ohw + oy * g.ow..][..g.ow];
                d[..lo].fill(0.0);
                d[hi..].fill(0.0);
                let src = &x[(n0 + j) * g.c * hw + at..];
                let d = &mut d[lo..hi];
                if g.sw == 1 && d.len() > 16 {
                    d.copy_from_slice(&src[..d.len()]);
                } else {
                    for (i, v) in d.iter_mut().enumerate() {
                        *v = src[i * g.sw];
                    }
                }
            }
        }
        kj += 1;
        if kj == g.kw {
            kj = 0;
            ki += 1;
            if ki == g.kh {
                ki = 0;
                c += 1;
            }
        }
    }
}

/// The transpose of [`im2col_rows_fold`]'s tile: for each output column
/// (image `j` of `n0..n0 + ni`, output pixel `p`) in turn, its unfolded
/// rows `r0..r0 + rows` side by side, at `j·OH·OW + p` times `rows` in
/// `col`. A row's taps of one kernel row are one run along the input row,
/// so a wide kernel over a small output (a weight gradient's `dYᵀ` over a
/// 3x3 output) copies runs of the kernel's width from one image, where
/// [`im2col_rows_fold`] copies runs of the output's width from every image
/// in turn.
fn im2row_fold(
    g: &Window,
    x: &[f32],
    (n0, ni): (usize, usize),
    c0: usize,
    (r0, rows): (usize, usize),
    first: usize,
    col: &mut [f32],
) {
    let (ohw, hw) = (g.oh * g.ow, g.h * g.w);
    for (q, dst) in col.chunks_mut(rows).enumerate() {
        let q = first + q;
        let (j, p) = (q / ohw, q % ohw);
        debug_assert!(j < ni);
        let (oy, ox) = (p / g.ow, p % g.ow);
        let img = &x[(n0 + j) * g.c * hw..][..g.c * hw];
        let base = (ox * g.sw) as isize - g.pw as isize;
        let (lo, hi) = valid_taps(g, ox);
        let (mut c, mut ki, mut kj) = (r0 / (g.kh * g.kw), (r0 / g.kw) % g.kh, r0 % g.kw);
        let mut at = 0;
        while at < rows {
            let run = (g.kw - kj).min(rows - at);
            let d = &mut dst[at..at + run];
            let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
            if iy < 0 || iy as usize >= g.h {
                d.fill(0.0);
            } else {
                let src = &img[(c0 + c) * hw + iy as usize * g.w..][..g.w];
                let (a, b) = (lo.clamp(kj, kj + run) - kj, hi.clamp(kj, kj + run) - kj);
                d[..a].fill(0.0);
                d[b.max(a)..].fill(0.0);
                if a < b {
                    let from = (base + ((kj + a) * g.dw) as isize) as usize;
                    let d = &mut d[a..b];
                    if g.dw == 1 {
                        d.copy_from_slice(&src[from..from + d.len()]);
                    } else {
                        for (i, v) in d.iter_mut().enumerate() {
                            *v = src[from + i * g.dw];
                        }
                    }
                }
            }
            at += run;
            kj = 0;
            ki += 1;
            if ki == g.kh {
                ki = 0;
                c += 1;
            }
        }
    }
}

/// The column taps `lo..hi` of output column `ox` whose input column
/// `ox·sw + kj·dw - pw` lies inside the image: [`valid_cols`] the other
/// way round (a tap's valid outputs there, an output's valid taps here).
fn valid_taps(g: &Window, ox: usize) -> (usize, usize) {
    let base = (ox * g.sw) as isize - g.pw as isize;
    // kj·dw >= -base
    let lo = if base >= 0 { 0 } else { (-base) as usize }
        .div_ceil(g.dw)
        .min(g.kw);
    // kj·dw <= w - 1 - base
    let hi = if base >= g.w as isize {
        0
    } else {
        ((g.w as isize - 1 - base) as usize / g.dw + 1).min(g.kw)
    };
    (lo, hi.max(lo))
}

/// The output columns `lo..hi` whose input column `ox·sw + kj·dw - pw`
/// lies inside the image (the others read padding).
pub(crate) fn valid_cols(g: &Window, kj: usize) -> (usize, usize) {
    let shift = kj * g.dw;
    // ox·sw + shift >= pw
    let lo = g.pw.saturating_sub(shift).div_ceil(g.sw);
    // ox·sw + shift - pw <= w - 1
    let hi = if g.w + g.pw > shift {
        ((g.w + g.pw - shift - 1) / g.sw + 1).min(g.ow)
    } else {
        0
    };
    (lo.min(hi), hi)
}

/// One depthwise output plane: `out = bias + Σ w[ki,kj] · x[shifted]`,
/// each element's taps in (ki, kj) order from the bias, each a fused
/// multiply-add. The plane is first copied with its padding written out
/// as zeros ([`padded_plane`]), so every tap of every output lies inside
/// and a padded tap adds `w·0`, as the operator's definition reads; a
/// strided plane is then copied with each row's columns grouped by their
/// remainder mod the stride ([`phase_rows`]), so that every tap reads a
/// contiguous run, and the generic loops ([`depthwise_body`]) sum tap by
/// tap over each output row. On AVX2 with FMA the plane goes instead to
/// [`depthwise_poly_avx2`] (its own padded copy, sums in registers) or,
/// past 49 taps, to the generic loops compiled with FMA: the same
/// operations in the same order, so the same bits.
fn depthwise_plane(
    g: &Window,
    x: &[f32],
    w: &[f32],
    bias: f32,
    act: Option<Activation>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::gemm::available() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe {
            if g.kh * g.kw <= DW_MAX_TAPS {
                depthwise_poly_avx2(g, x, w, bias, act, out);
            } else {
                depthwise_generic_fma(g, x, w, bias, act, out);
            }
        }
        return;
    }
    depthwise_generic(g, x, w, bias, act, out);
}

/// The generic loops on the padded, phased plane ([`padded_plane`],
/// [`phased_plane`], [`depthwise_body`]): the fallback, the FMA build of
/// it past 49 taps, and the reference of the depthwise tests. Inlined, so
/// that each caller's target features apply.
#[inline(always)]
fn depthwise_generic(
    g: &Window,
    x: &[f32],
    w: &[f32],
    bias: f32,
    act: Option<Activation>,
    out: &mut [f32],
) {
    padded_plane(g, x, |g, x| {
        phased_plane(g, x, |x| depthwise_body(g, x, w, bias, act, out))
    });
}

/// The generic loops compiled with FMA (kernels over 49 taps on AVX2
/// CPUs): `mul_add` is then one instruction, not a library call.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_generic_fma(
    g: &Window,
    x: &[f32],
    w: &[f32],
    bias: f32,
    act: Option<Activation>,
    out: &mut [f32],
) {
    depthwise_generic(g, x, w, bias, act, out);
}

thread_local! {
    /// One plane with its padding written out ([`padded_plane`]).
    static PADDED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` on plane `x` ([H, W]) and its window as they are (no padding), or
/// on a copy in this thread's buffer holding exactly the rows and columns
/// the window reads, padding as zeros, with a window of no padding over
/// it: every tap of every output then lies inside.
fn padded_plane<R>(g: &Window, x: &[f32], f: impl FnOnce(&Window, &[f32]) -> R) -> R {
    let h2 = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
    let w2 = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
    if g.ph == 0 && g.pw == 0 && h2 <= g.h && w2 <= g.w {
        return f(g, x);
    }
    let g2 = Window {
        h: h2,
        w: w2,
        ph: 0,
        pw: 0,
        ..*g
    };
    PADDED.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < h2 * w2 {
            buf.resize(h2 * w2, 0.0);
        }
        let buf = &mut buf[..h2 * w2];
        // Columns c2 of the copy read x's column c2 - pw where it exists;
        // every other element is written zero (the buffer is reused).
        let c_lo = g.pw.min(w2);
        let c_hi = (g.pw + g.w).min(w2);
        for (r2, row) in buf.chunks_exact_mut(w2).enumerate() {
            let Some(r) = r2.checked_sub(g.ph).filter(|&r| r < g.h) else {
                row.fill(0.0);
                continue;
            };
            row[..c_lo].fill(0.0);
            if c_lo < c_hi {
                // (c_lo < c_hi implies c_lo = pw: the copy starts at x's column 0.)
                copy_run(&mut row[c_lo..c_hi], &x[r * g.w + c_lo - g.pw..]);
            }
            row[c_hi..].fill(0.0);
        }
        f(&g2, buf)
    })
}

/// `dst.copy_from_slice(&src[..dst.len()])` for the short runs of one
/// plane row, in fixed blocks of eight (vector moves) rather than a
/// `memcpy` call per row, whose call costs as much as a 56-float copy.
#[inline(always)]
pub(crate) fn copy_run(dst: &mut [f32], src: &[f32]) {
    let src = &src[..dst.len()];
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        let s: &[f32; 8] = s.try_into().expect("a block of 8");
        let d: &mut [f32; 8] = d.try_into().expect("a block of 8");
        *d = *s;
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = *s;
    }
}

thread_local! {
    /// One plane of a strided window op, phased ([`phase_rows`]).
    static PHASED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` on plane `x` ([H, W]) as it is (stride 1), or phased into this
/// thread's buffer ([`phase_rows`]): then each window tap of a row reads a
/// contiguous run, at the start [`tap_runs`] gives.
pub(crate) fn phased_plane<R>(g: &Window, x: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
    if g.sw == 1 {
        return f(x);
    }
    PHASED.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.resize(g.h * g.w, 0.0);
        phase_rows(g, x, &mut buf);
        f(&buf)
    })
}

/// `x`'s rows with their columns `p, p + sw, ...` for each phase `p` in
/// turn (phase `p` holds `ceil((w - p) / sw)` columns), into `buf`
/// (`h · w` long).
fn phase_rows(g: &Window, x: &[f32], buf: &mut [f32]) {
    for r in 0..g.h {
        let (dst, src) = (&mut buf[r * g.w..][..g.w], &x[r * g.w..][..g.w]);
        if g.sw == 2 {
            let (even, odd) = dst.split_at_mut(g.w.div_ceil(2));
            for i in 0..g.w / 2 {
                even[i] = src[2 * i];
                odd[i] = src[2 * i + 1];
            }
            if g.w % 2 == 1 {
                even[g.w / 2] = src[g.w - 1];
            }
            continue;
        }
        let mut at = 0;
        for p in 0..g.sw.min(g.w) {
            for v in src[p..].iter().step_by(g.sw) {
                dst[at] = *v;
                at += 1;
            }
        }
    }
}

/// Per column tap `kj`: the output columns `lo..hi` it reaches inside the
/// image ([`valid_cols`]), and where their inputs start in a row phased
/// by [`phased_plane`] (in the row itself at stride 1), into `runs`
/// (`kw` long).
#[inline(always)]
pub(crate) fn tap_runs(g: &Window, runs: &mut [(usize, usize, usize)]) {
    for (kj, c) in runs.iter_mut().enumerate() {
        let (lo, hi) = valid_cols(g, kj);
        let first = if lo < hi {
            lo * g.sw + kj * g.dw - g.pw
        } else {
            0
        };
        // Phase `first % sw` starts after the columns of the phases
        // before it (`ceil((w - q) / sw)` each).
        let (p, base) = (first % g.sw, first / g.sw);
        let start = (0..p).map(|q| (g.w - q).div_ceil(g.sw)).sum::<usize>() + base;
        *c = (lo, hi, start);
    }
}

/// Taps of a kernel [`depthwise_poly_avx2`] runs (up to 7x7; larger
/// ones go to [`depthwise_body`]).
#[cfg(target_arch = "x86_64")]
const DW_MAX_TAPS: usize = 49;

thread_local! {
    /// [`depthwise_poly_avx2`]'s scratch: the plane's phases, then the
    /// flat output grid.
    static POLY: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`depthwise_body`] on AVX2, for any stride, dilation and padding.
///
/// The plane is first copied, with its padding written out as zeros, into
/// `sh · sw` phases: phase `(a, b)` holds the padded plane's rows `a, a +
/// sh, ...` and columns `b, b + sw, ...` (`hp × wp` each). Tap `(ki, kj)`
/// of output `(oy, ox)` then lies in phase `(ki·dh mod sh, kj·dw mod sw)`
/// at row `oy + ki·dh / sh` and column `ox + kj·dw / sw`: at a fixed
/// offset from `oy·wp + ox`. So the outputs are computed on a flat grid
/// of `oh` rows of `wp` columns (the columns past `ow` are discarded),
/// 32 at a time in four registers, each tap one load and one fused
/// multiply-add, with no row edges, masks or per-row setup: a 7x7 plane
/// costs as few instructions per output as a 112x112 one. The valid
/// columns are then copied out with the fused activation applied.
///
/// Each output is `acc = fma(w, x, acc)` from the bias over all taps in
/// (ki, kj) order, padding taps included (as [`depthwise_body`] runs on a
/// padded plane): the same bits as the generic loops.
///
/// # Safety
/// The CPU has AVX2 and FMA; `g.kh · g.kw <= DW_MAX_TAPS`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_poly_avx2(
    g: &Window,
    x: &[f32],
    w: &[f32],
    bias: f32,
    act: Option<Activation>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    const LANES: usize = 8;
    const BLOCK: usize = 4 * LANES;
    let (sh, sw) = (g.sh.max(1), g.sw.max(1));
    // The padded plane's rows and columns that some output reads.
    let h2 = (g.oh - 1) * sh + (g.kh - 1) * g.dh + 1;
    let w2 = (g.ow - 1) * sw + (g.kw - 1) * g.dw + 1;
    let (hp, wp) = (h2.div_ceil(sh), w2.div_ceil(sw));
    let phase = hp * wp;
    let taps = g.kh * g.kw;
    let mut off = [0usize; DW_MAX_TAPS];
    for ki in 0..g.kh {
        for kj in 0..g.kw {
            let (r, c) = (ki * g.dh, kj * g.dw);
            let base = ((r % sh) * sw + c % sw) * phase;
            off[ki * g.kw + kj] = base + (r / sh) * wp + c / sw;
        }
    }
    let off = &off[..taps];
    let n = g.oh * wp;
    let n_pad = n.next_multiple_of(BLOCK);
    // The grid's last block reads up to `max(off) + n_pad`: zeros.
    let in_len = (sh * sw * phase).max(off.iter().max().copied().unwrap_or(0) + n_pad);
    POLY.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < in_len + n_pad {
            buf.resize(in_len + n_pad, 0.0);
        }
        let (inp, flat) = buf.split_at_mut(in_len);
        // SAFETY (all below): every index stays in `inp` (in_len),
        // `flat` (at least n_pad), `x` (h · w) or `out` (oh · ow), as
        // each loop's bounds say.
        unsafe {
            let ip = inp.as_mut_ptr();
            zero_run(ip.add(sh * sw * phase), in_len - sh * sw * phase);
            for r in 0..hp * sh {
                // Padded row r: in row phase r % sh, at row r / sh.
                let row0 = ip.add((r % sh) * sw * phase + (r / sh) * wp);
                let src = r.checked_sub(g.ph).filter(|&xr| xr < g.h && r < h2);
                let Some(xr) = src else {
                    for b in 0..sw {
                        zero_run(row0.add(b * phase), wp);
                    }
                    continue;
                };
                let xrow = x.as_ptr().add(xr * g.w);
                // x's columns j land at padded column j + pw, of which
                // the first wp · sw are kept.
                let cols = g.w.min((wp * sw).saturating_sub(g.pw));
                if sw == 1 {
                    let pw = g.pw.min(wp);
                    zero_run(row0, pw);
                    copy_run(
                        std::slice::from_raw_parts_mut(row0.add(pw), cols),
                        &x[xr * g.w..],
                    );
                    zero_run(row0.add(pw + cols), wp - pw - cols);
                    continue;
                }
                for b in 0..sw {
                    zero_run(row0.add(b * phase), wp);
                }
                if sw == 2 {
                    // x's even columns go to phase pw % 2, its odd ones
                    // to the other, each from column ceil-or-floor of pw/2.
                    let (even, odd) = if g.pw.is_multiple_of(2) {
                        (row0.add(g.pw / 2), row0.add(phase + g.pw / 2))
                    } else {
                        (row0.add(phase + g.pw / 2), row0.add(g.pw.div_ceil(2)))
                    };
                    deinterleave2(xrow, cols, even, odd);
                    continue;
                }
                for j in 0..cols {
                    let c = j + g.pw;
                    *row0.add((c % sw) * phase + c / sw) = *xrow.add(j);
                }
            }
            let mut wv = [_mm256_setzero_ps(); DW_MAX_TAPS];
            for (v, &wt) in wv.iter_mut().zip(&w[..taps]) {
                *v = _mm256_set1_ps(wt);
            }
            let wv = &wv[..taps];
            let bv = _mm256_set1_ps(bias);
            let (ip, fp) = (inp.as_ptr(), flat.as_mut_ptr());
            for v in (0..n_pad).step_by(BLOCK) {
                let mut acc = [bv; 4];
                for (&o, &wt) in off.iter().zip(wv) {
                    let p = ip.add(o + v);
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p.add(i * LANES)), *a);
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(fp.add(v + i * LANES), *a);
                }
            }
            // The valid columns of each grid row, activated, into `out`:
            // vectors of eight, the last one overlapping the one before
            // (the same values), or spilling into the next row (written
            // after it) when the row is shorter than eight.
            let op = out.as_mut_ptr();
            let fin = |v: __m256| match act {
                Some(a) => a.apply_m256(v),
                None => v,
            };
            for oy in 0..g.oh {
                let (src, dst) = (fp.add(oy * wp), op.add(oy * g.ow));
                if g.ow >= LANES {
                    let mut j = 0;
                    while j < g.ow {
                        let at = j.min(g.ow - LANES);
                        _mm256_storeu_ps(dst.add(at), fin(_mm256_loadu_ps(src.add(at))));
                        j += LANES;
                    }
                } else if (oy + 1) * g.ow + LANES <= out.len() {
                    _mm256_storeu_ps(dst, fin(_mm256_loadu_ps(src)));
                } else {
                    for j in 0..g.ow {
                        let v = *src.add(j);
                        *dst.add(j) = act.map_or(v, |a| a.apply(v));
                    }
                }
            }
        }
    })
}

thread_local! {
    /// [`depthwise_c8_avx2`]'s scratch: eight padded planes with the
    /// channels innermost, then a band of output rows likewise.
    static C8: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Output widths from which the depthwise kernel runs plane by plane
/// ([`depthwise_poly_avx2`], whose per-plane setup is then amortized)
/// rather than eight channels at once ([`depthwise_c8_avx2`], whose
/// padded buffer then outgrows L1): where the two kernels crossed over on
/// mobilenet_v2's depthwise shapes (widths 7-28 faster eight at a time,
/// 56 and 112 plane by plane), timed against each other on this
/// project's CI-sized AVX-512 machine.
#[cfg(target_arch = "x86_64")]
const C8_MAX_OW: usize = 48;

/// Output positions per band of [`depthwise_c8_avx2`] (rows of eight
/// channels written back to the planes together).
#[cfg(target_arch = "x86_64")]
const C8_BAND: usize = 256;

/// Eight depthwise planes at once on AVX2, the eight channels in the
/// lanes of one register (the layout onnxruntime's NCHWc kernels keep
/// between ops; here only inside this kernel):
/// - the planes `x[c]` (each `h × w`) are transposed eight positions at a
///   time into one padded `[H2][W2][8]` buffer, its padding zeros;
/// - each output position is then one register: from the eight biases,
///   one load and one fused multiply-add per tap, whatever the stride or
///   dilation, [`C8_RUN`] positions side by side; no row edges or masks, and
///   small planes (7x7) cost no more per output than large ones;
/// - bands of output positions, activated, are transposed back into the
///   eight output planes.
///
/// Each output is `acc = fma(w, x, acc)` from its bias over all taps in
/// (ki, kj) order, padding taps included: the bits of
/// [`depthwise_body`] on the padded plane.
///
/// # Safety
/// The CPU has AVX2 and FMA. `x[c]` holds `h · w` floats, `w8` holds the
/// eight channels' `kh · kw` taps one after the other, `out[c]` points at
/// `oh · ow` writable floats that nothing else touches during the call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_c8_avx2(
    g: &Window,
    x: [*const f32; 8],
    w8: &[f32],
    bias: [f32; 8],
    act: Option<Activation>,
    out: [*mut f32; 8],
) {
    use std::arch::x86_64::*;
    let taps = g.kh * g.kw;
    // The padded plane: every input position and every tap has a home.
    let hh = ((g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1).max(g.ph + g.h);
    let ww = ((g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1).max(g.pw + g.w);
    let hw = g.h * g.w;
    C8.with(|buf| {
        let mut buf = buf.borrow_mut();
        let need = (hh * ww + C8_BAND.max(g.ow)) * 8;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (xc, yc) = buf.split_at_mut(hh * ww * 8);
        // SAFETY (all below): indices stay inside `xc` (hh · ww · 8),
        // `yc` (C8_BAND · 8) and the callers' planes, by the loops' bounds.
        unsafe {
            let xp = xc.as_mut_ptr();
            let at = |r: usize, c: usize| xp.add((r * ww + c) * 8);
            let z = _mm256_setzero_ps();
            // The padding: rows above and below, columns left and right.
            for r in 0..hh {
                let inside = r >= g.ph && r < g.ph + g.h;
                for c in 0..ww {
                    if !inside || c < g.pw || c >= g.pw + g.w {
                        _mm256_storeu_ps(at(r, c), z);
                    }
                }
            }
            // The planes, eight flat positions at a time.
            let (mut r, mut c) = (0, 0);
            let mut q = 0;
            while q + 8 <= hw {
                let v =
                    super::gemm::transpose8(std::array::from_fn(|i| _mm256_loadu_ps(x[i].add(q))));
                for vi in v {
                    _mm256_storeu_ps(at(r + g.ph, c + g.pw), vi);
                    c += 1;
                    if c == g.w {
                        (r, c) = (r + 1, 0);
                    }
                }
                q += 8;
            }
            while q < hw {
                let p = at(r + g.ph, c + g.pw);
                for (i, xi) in x.iter().enumerate() {
                    *p.add(i) = *xi.add(q);
                }
                c += 1;
                if c == g.w {
                    (r, c) = (r + 1, 0);
                }
                q += 1;
            }
            let mut wv = [z; DW_MAX_TAPS];
            for (t, v) in wv[..taps].iter_mut().enumerate() {
                *v = _mm256_setr_ps(
                    w8[t],
                    w8[taps + t],
                    w8[2 * taps + t],
                    w8[3 * taps + t],
                    w8[4 * taps + t],
                    w8[5 * taps + t],
                    w8[6 * taps + t],
                    w8[7 * taps + t],
                );
            }
            let wv = &wv[..taps];
            let bv = _mm256_loadu_ps(bias.as_ptr());
            let fin = |v: __m256| match act {
                Some(a) => a.apply_m256(v),
                None => v,
            };
            // Tap (ki, kj) of output (oy, ox) at at(oy·sh + ki·dh, ox·sw + kj·dw).
            let strides = C8Taps {
                row: g.dh * ww * 8,
                col: g.dw * 8,
                step: g.sw * 8,
            };
            let yp = yc.as_mut_ptr();
            // Bands of whole output rows.
            let rows = (C8_BAND / g.ow).max(1);
            let mut oy0 = 0;
            while oy0 < g.oh {
                let nrows = rows.min(g.oh - oy0);
                for r in 0..nrows {
                    let oy = oy0 + r;
                    let base = at(oy * g.sh, 0) as *const f32;
                    let y = yp.add(r * g.ow * 8);
                    // The common kernel sizes with their loops unrolled
                    // (the taps' weights then stay in registers).
                    match (g.kh, g.kw) {
                        (3, 3) => c8_row(3, 3, wv, &strides, base, g.ow, bv, fin, y),
                        (5, 5) => c8_row(5, 5, wv, &strides, base, g.ow, bv, fin, y),
                        (kh, kw) => c8_row(kh, kw, wv, &strides, base, g.ow, bv, fin, y),
                    }
                }
                // The band back into the eight planes.
                let (p0, band) = (oy0 * g.ow, nrows * g.ow);
                let mut i = 0;
                while i + 8 <= band {
                    let v = super::gemm::transpose8(std::array::from_fn(|j| {
                        _mm256_loadu_ps(yp.add((i + j) * 8))
                    }));
                    for (o, vi) in out.iter().zip(v) {
                        _mm256_storeu_ps(o.add(p0 + i), vi);
                    }
                    i += 8;
                }
                for i in i..band {
                    for (ci, o) in out.iter().enumerate() {
                        *o.add(p0 + i) = *yp.add(i * 8 + ci);
                    }
                }
                oy0 += nrows;
            }
        }
    })
}

/// Outputs of a row [`c8_row`] sums side by side: six accumulators and
/// a 3x3 kernel's nine weights fill fifteen of the sixteen registers, and
/// six chains of fused multiply-adds cover most of their latency.
#[cfg(target_arch = "x86_64")]
const C8_RUN: usize = 6;

/// Strides, in floats, of [`depthwise_c8_avx2`]'s padded buffer: between
/// a tap's rows, its columns, and neighbouring outputs of a row.
#[cfg(target_arch = "x86_64")]
struct C8Taps {
    row: usize,
    col: usize,
    step: usize,
}

/// One output row of [`depthwise_c8_avx2`]: `ow` positions of eight
/// channels into `y`, [`C8_RUN`] side by side, each from the bias over the taps
/// in (ki, kj) order, then `fin` (the activation). Inlined with constant
/// `kh` and `kw` where the caller has them, so the tap loops unroll.
///
/// # Safety
/// `base` is the row's first tap in the padded buffer, which holds every
/// tap of the row; `y` holds `ow · 8` floats. The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn c8_row(
    kh: usize,
    kw: usize,
    wv: &[std::arch::x86_64::__m256],
    t: &C8Taps,
    base: *const f32,
    ow: usize,
    bv: std::arch::x86_64::__m256,
    fin: impl Fn(std::arch::x86_64::__m256) -> std::arch::x86_64::__m256,
    y: *mut f32,
) {
    use std::arch::x86_64::*;
    let wv = &wv[..kh * kw];
    let mut ox = 0;
    // SAFETY: the caller's promise; every tap of outputs 0..ow lies in
    // the buffer.
    unsafe {
        while ox + C8_RUN <= ow {
            let mut acc = [bv; C8_RUN];
            let src = base.add(ox * t.step);
            for ki in 0..kh {
                for kj in 0..kw {
                    let wt = wv[ki * kw + kj];
                    let p = src.add(ki * t.row + kj * t.col);
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p.add(i * t.step)), *a);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(y.add((ox + i) * 8), fin(*a));
            }
            ox += C8_RUN;
        }
        while ox < ow {
            let mut a = bv;
            let src = base.add(ox * t.step);
            for ki in 0..kh {
                for kj in 0..kw {
                    let v = _mm256_loadu_ps(src.add(ki * t.row + kj * t.col));
                    a = _mm256_fmadd_ps(wv[ki * kw + kj], v, a);
                }
            }
            _mm256_storeu_ps(y.add(ox * 8), fin(a));
            ox += 1;
        }
    }
}

/// `n` zeros from `p` (vector stores, no `memset` call).
///
/// # Safety
/// `p..p + n` is writable; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn zero_run(p: *mut f32, n: usize) {
    use std::arch::x86_64::*;
    let z = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: inside p..p + n.
    unsafe {
        while i + 8 <= n {
            _mm256_storeu_ps(p.add(i), z);
            i += 8;
        }
        while i < n {
            *p.add(i) = 0.0;
            i += 1;
        }
    }
}

/// `src`'s `n` floats split by parity: `src[2i]` to `even[i]`,
/// `src[2i + 1]` to `odd[i]`.
///
/// # Safety
/// The runs are valid and do not overlap; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn deinterleave2(src: *const f32, n: usize, even: *mut f32, odd: *mut f32) {
    use std::arch::x86_64::*;
    let mut i = 0;
    // SAFETY: inside the runs.
    unsafe {
        while i + 16 <= n {
            let a = _mm256_loadu_ps(src.add(i));
            let b = _mm256_loadu_ps(src.add(i + 8));
            // [a0 a2 b0 b2 | a4 a6 b4 b6], then 64-bit lanes 0 2 1 3.
            let e = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(
                _mm256_shuffle_ps::<0x88>(a, b),
            )));
            let o = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(
                _mm256_shuffle_ps::<0xDD>(a, b),
            )));
            _mm256_storeu_ps(even.add(i / 2), e);
            _mm256_storeu_ps(odd.add(i / 2), o);
            i += 16;
        }
        while i < n {
            if i % 2 == 0 {
                *even.add(i / 2) = *src.add(i);
            } else {
                *odd.add(i / 2) = *src.add(i);
            }
            i += 1;
        }
    }
}

/// One output row of [`depthwise_body`] (inlined, so that inside
/// [`depthwise_generic_fma`] `mul_add` is the FMA instruction).
#[inline(always)]
fn depthwise_row(
    g: &Window,
    x: &[f32],
    w: &[f32],
    bias: f32,
    runs: &[(usize, usize, usize)],
    oy: usize,
    row: &mut [f32],
) {
    row.fill(bias);
    row_taps(g, x, runs, oy, |ki, kj, lo, src| {
        let wv = w[ki * g.kw + kj];
        let dst = &mut row[lo..lo + src.len()];
        for i in 0..src.len() {
            dst[i] = wv.mul_add(src[i], dst[i]);
        }
    });
}

/// [`depthwise_plane`]'s loops on `x` as it is (stride 1) or phased:
/// indexed, so they compile inside the caller's target features (iterator
/// adaptors would be separate functions without them).
#[inline(always)]
fn depthwise_body(
    g: &Window,
    x: &[f32],
    w: &[f32],
    bias: f32,
    act: Option<Activation>,
    out: &mut [f32],
) {
    // Per column tap: the output columns it reaches inside the image, and
    // where their inputs start in a (phased) row.
    let mut cols = [(0usize, 0usize, 0usize); 16];
    let mut heap = Vec::new();
    let cols: &mut [(usize, usize, usize)] = if g.kw <= 16 {
        &mut cols[..g.kw]
    } else {
        heap.resize(g.kw, (0, 0, 0));
        &mut heap
    };
    tap_runs(g, cols);
    // Output row by output row (it stays in L1 across the taps), each
    // element adding its taps in (ki, kj) order.
    for oy in 0..g.oh {
        let row = &mut out[oy * g.ow..][..g.ow];
        depthwise_row(g, x, w, bias, cols, oy, row);
        if let Some(act) = act {
            act.apply_all(row);
        }
    }
}

/// Each window tap of output row `oy` over the (phased) plane `x`, in
/// (ki, kj) order: `f(ki, kj, lo, taps)` with the tap's inputs for output
/// columns `lo..lo + taps.len()` (those inside the image; `runs` from
/// [`tap_runs`]), a contiguous run. Taps whose row or columns lie wholly
/// in the padding are skipped.
#[inline(always)]
pub(crate) fn row_taps(
    g: &Window,
    x: &[f32],
    runs: &[(usize, usize, usize)],
    oy: usize,
    mut f: impl FnMut(usize, usize, usize, &[f32]),
) {
    for ki in 0..g.kh {
        let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
        if iy < 0 || iy as usize >= g.h {
            continue;
        }
        let line = &x[iy as usize * g.w..][..g.w];
        for (kj, &(lo, hi, start)) in runs.iter().enumerate() {
            if lo < hi {
                f(ki, kj, lo, &line[start..start + hi - lo]);
            }
        }
    }
}

/// Bytes of one im2col tile: the unfolded columns of a tile stay within
/// this (at least [`MIN_TILE_COLS`] columns), so the workspace is bounded
/// by a constant per thread, not by the image or the batch.
const TILE_BYTES: usize = 1 << 20;
const MIN_TILE_COLS: usize = 16;

/// Convolutions with at most this many output pixels per image, in a
/// batch, and weights of at least [`FOLD_MIN_WEIGHTS`] elements per group,
/// run "folded": the images' unfolded columns side by side in one GEMM
/// (per run of images and tile of unfolded rows), so the weights are packed
/// once per tile instead of once per image (a weight gradient
/// `Conv(Xᵀ, dYᵀ)` has a 3x3 output and K = N·H·W). Small weights cost
/// little to repack and keep the smaller workspace of the per-image path.
pub(crate) const FOLD_MAX_COLS: usize = 256;
const FOLD_MIN_WEIGHTS: usize = 1 << 16;
/// Columns a folded product aims for (images per run = this / OH·OW).
const FOLD_COLS: usize = 512;
/// Bytes of the folded product's output block (`M × images·OH·OW`).
const FOLD_OUT_BYTES: usize = 1 << 20;

/// `(images per fold, unfolded rows per tile)` of a folded convolution.
fn fold_layout(m: usize, k: usize, ohw: usize, n: usize) -> (usize, usize) {
    let ohw = ohw.max(1);
    let imgs = FOLD_COLS
        .div_ceil(ohw)
        .min(FOLD_OUT_BYTES / 4 / (m * ohw).max(1))
        .clamp(1, n.max(1));
    // Even runs: 64 images at 57 a run would leave a last run of 7.
    let imgs = n.max(1).div_ceil(n.max(1).div_ceil(imgs));
    let rows = (TILE_BYTES / 4 / (imgs * ohw)).clamp(1, k.max(1));
    (imgs, rows)
}

/// Output columns per im2col tile for `k` unfolded rows.
pub(crate) fn tile_cols(k: usize, ohw: usize) -> usize {
    let fit = TILE_BYTES / 4 / k.max(1);
    if ohw <= fit {
        // One tile: the GEMM splits its rows across threads. (Rounding
        // down to whole tiles of 16 would cut 49 columns into 48 and 1,
        // and give each thread one of those.)
        return ohw.max(1);
    }
    let cols = fit / MIN_TILE_COLS * MIN_TILE_COLS;
    cols.max(MIN_TILE_COLS).min(ohw.max(1))
}

/// Tiles of at most `tile` columns over `cols`, as `(columns per tile,
/// tiles)`, their count a multiple of `threads` where there are several:
/// 12544 columns in tiles of 9696 would give one thread three quarters of
/// the work. Where a column falls changes no sum, so no bit either.
pub(crate) fn balanced_tiles(tile: usize, cols: usize, threads: usize) -> (usize, usize) {
    let tiles = cols.div_ceil(tile.max(1));
    if tiles <= 1 || threads <= 1 {
        return (tile, tiles);
    }
    let even = tiles.next_multiple_of(threads);
    let tile = cols
        .div_ceil(even)
        .next_multiple_of(MIN_TILE_COLS)
        .min(tile);
    (tile, cols.div_ceil(tile))
}

/// Output tiles of `tile` columns (of `cols`; the last may be shorter)
/// on `t` parts of the pool of `threads`: part `p` takes consecutive tiles
/// with its own workspace slot, floats `p·slot..(p + 1)·slot` of `ws`, and
/// runs `work(slot, p0, pt)` for each of its tiles (columns `p0..p0 +
/// pt`). `work` must write only its tile's columns of the output.
pub(crate) fn tiles_in_parts(
    threads: usize,
    t: usize,
    (tile, cols): (usize, usize),
    ws: &mut [f32],
    slot: usize,
    work: impl Fn(&mut [f32], usize, usize) + Sync,
) {
    assert!(ws.len() >= t * slot, "workspace slots");
    let tiles = cols.div_ceil(tile.max(1));
    let wsp = SendPtr(ws.as_mut_ptr());
    par::for_parts(threads, t, |p| {
        // SAFETY: part p alone uses slot p, which lies in `ws` (checked
        // above); `ws` outlives the parts.
        let col = unsafe { std::slice::from_raw_parts_mut(wsp.get().add(p * slot), slot) };
        for j in par::range(tiles, t, p) {
            let p0 = j * tile;
            work(col, p0, tile.min(cols - p0));
        }
    });
}

/// Tile buffers a kernel's workspace holds: one per thread the machine
/// can run, at most 16, never more than the tiles of one image. Read once,
/// when the kernel is made (the workspace is sized then).
pub(crate) fn tile_slots(tiles: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.clamp(1, 16).min(tiles.max(1))
}

/// Bytes of a 1x1 convolution's output tile ([`Conv::direct_tiled`]).
const DIRECT_TILE_BYTES: usize = 256 << 10;
/// 1x1 convolutions with weights of at most this many elements per group
/// run in output tiles (larger weights would be repacked per tile).
const DIRECT_TILE_MAX_WEIGHTS: usize = 1 << 16;

struct Conv {
    g: Window,
    m: usize,
    group: usize,
    bias: bool,
    direct: bool,
    /// Workspace tile slots ([`tile_slots`], fixed when the kernel is made).
    slots: usize,
    /// Multiply on graphopt's kernel ([`own_kernel`]), on every path but
    /// the folded one (whose im2col tiles multiply on matrixmultiply, and
    /// whose by-rows tiles always on graphopt's kernel,
    /// [`Conv::fold_by_rows`]).
    own: bool,
    /// A Relu or Clip fused in ([`Kernel::fuse_activation`]): applied to
    /// each tile, plane or block of output once it is final.
    act: Option<Activation>,
    /// A window whose taps read a padded copy of the image in place
    /// ([`Flat`]: rows sharing one pad gap at stride 1, phase planes
    /// otherwise), on graphopt's kernel: no unfolded matrix. Ahead of the
    /// folded path, which it matched on a 3x3 of 256 channels at 14x14,
    /// batch 16 (`benches/conv_bench.py`).
    flat: Option<Flat>,
}

impl Conv {
    /// Output columns per tile of a 1x1 convolution run in tiles
    /// ([`Conv::direct_tiled`]), or None to run it whole: at least four
    /// tiles of at least 64 columns, and weights small enough to repack
    /// per tile.
    fn direct_tile_cols(&self) -> Option<usize> {
        if !self.direct {
            return None;
        }
        let (mg, k, ohw) = (self.m / self.group, self.k(), self.g.oh * self.g.ow);
        let cols = (DIRECT_TILE_BYTES / 4 / (mg + k).max(1)) / 64 * 64;
        (mg * k <= DIRECT_TILE_MAX_WEIGHTS && cols >= 64 && ohw >= 4 * cols).then_some(cols)
    }

    /// One group of a 1x1 convolution in tiles of `cols` output columns,
    /// split across threads: each tile's bias, product and fused activation
    /// while the tile is in cache, instead of three passes over the whole
    /// output (the bias fill, the product reading it back, the
    /// activation). Each element gets the arithmetic of the whole product
    /// (a column split changes no sum), so the bits of the untiled path.
    fn direct_tiled(
        &self,
        cols: usize,
        wg: &[f32],
        xg: &[f32],
        bias: Option<&[f32]>,
        yg: &mut [f32],
        threads: usize,
    ) {
        let ohw = self.g.oh * self.g.ow;
        let tiles = ohw.div_ceil(cols);
        let t = par::parts(tiles, threads, 1);
        let yp = SendPtr(yg.as_mut_ptr());
        par::for_parts(threads, t, |p| {
            for j in par::range(tiles, t, p) {
                let p0 = j * cols;
                let pt = cols.min(ohw - p0);
                // SAFETY: columns p0..p0+pt of the mg rows of `yg` (row
                // stride ohw) are this part's alone.
                unsafe { self.tile_product(wg, &xg[p0..], (ohw, 1), bias, yp, p0, pt) };
            }
        });
    }

    /// One tile of output columns `p0..p0 + pt` (the group's `mg` rows of
    /// `y`, row stride `OH·OW`): `y = bias + Wg · B` for `B` the tile's
    /// `k × pt` operand at strides `sb`, then the fused activation, both in
    /// the GEMM's tiles ([`sgemm_into_bias_act`]; `y` is not read). The
    /// 1x1 output tiles and the im2col tiles share it.
    ///
    /// # Safety
    /// Those columns of `y` are the caller's alone during the call.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_product(
        &self,
        wg: &[f32],
        b: &[f32],
        sb: (usize, usize),
        bias: Option<&[f32]>,
        y: SendPtr,
        p0: usize,
        pt: usize,
    ) {
        let (mg, k, ohw) = (self.m / self.group, self.k(), self.g.oh * self.g.ow);
        // SAFETY: the caller's promise.
        unsafe {
            sgemm_into_bias_act(
                self.own,
                mg,
                k,
                pt,
                wg,
                (k, 1),
                b,
                sb,
                bias,
                self.act,
                y.get().add(p0),
                ohw,
            )
        }
    }

    /// The depthwise kernel over every plane: blocks of eight channels of
    /// one image ([`depthwise_c8_avx2`]) where the CPU has AVX2 and the
    /// taps fit, the channels left over plane by plane
    /// ([`depthwise_plane`]); blocks split across threads.
    fn run_depthwise(
        &self,
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        y: &mut [f32],
        threads: usize,
    ) {
        let g = &self.g;
        let (taps, hw, ohw) = (g.kh * g.kw, g.h * g.w, g.oh * g.ow);
        if ohw == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        let c8 = super::gemm::available() && taps <= DW_MAX_TAPS && g.ow < C8_MAX_OW;
        #[cfg(not(target_arch = "x86_64"))]
        let c8 = false;
        // Items: (image, first channel, channels), eight at a time.
        let per = if c8 { 8 } else { 1 };
        let blocks = self.m.div_ceil(per);
        let items = g.n * blocks;
        let min_items = par::MIN_ELEMS.div_ceil((ohw * taps * per).max(1));
        let t = par::parts(items, threads, min_items);
        let yp = SendPtr(y.as_mut_ptr());
        par::for_parts(threads, t, |part| {
            for item in par::range(items, t, part) {
                let (n, c0) = (item / blocks, item % blocks * per);
                let plane = |c: usize| (n * self.m + c) * ohw;
                #[cfg(target_arch = "x86_64")]
                if c8 && c0 + 8 <= self.m {
                    let xs = std::array::from_fn(|i| x[(n * g.c + c0 + i) * hw..].as_ptr());
                    let bias = std::array::from_fn(|i| b.map_or(0.0, |b| b[c0 + i]));
                    // SAFETY: the CPU has AVX2 and FMA and the taps fit
                    // (c8); planes c0..c0 + 8 of image n are this part's
                    // alone, each ohw floats inside `y`.
                    unsafe {
                        let outs = std::array::from_fn(|i| yp.get().add(plane(c0 + i)));
                        depthwise_c8_avx2(g, xs, &w[c0 * taps..][..8 * taps], bias, self.act, outs);
                    }
                    continue;
                }
                for c in c0..(c0 + per).min(self.m) {
                    // SAFETY: plane c of image n is this part's alone.
                    let out =
                        unsafe { std::slice::from_raw_parts_mut(yp.get().add(plane(c)), ohw) };
                    depthwise_plane(
                        g,
                        &x[(n * g.c + c) * hw..][..hw],
                        &w[c * taps..][..taps],
                        b.map_or(0.0, |b| b[c]),
                        self.act,
                        out,
                    );
                }
            }
        });
    }

    /// One output channel per input channel: the direct kernel.
    fn depthwise(&self) -> bool {
        !self.direct && self.group == self.g.c && self.m == self.group
    }
    fn k(&self) -> usize {
        self.g.c / self.group * self.g.kh * self.g.kw
    }
    /// Several images with small outputs: the folded path
    /// ([`FOLD_MAX_COLS`]).
    fn folded(&self) -> bool {
        !self.depthwise()
            && self.g.n > 1
            && (1..=FOLD_MAX_COLS).contains(&(self.g.oh * self.g.ow))
            && self.m / self.group * self.k() >= FOLD_MIN_WEIGHTS
    }
    /// The folded path unfolds by output column ([`im2row_fold`]) when
    /// the kernel is wider than the output, so that its runs are the
    /// longer ones.
    fn by_rows(&self) -> bool {
        self.g.kw > self.g.ow
    }
    /// Workspace floats of the folded path: the output block, then the
    /// tile of unfolded rows.
    fn fold_floats(&self) -> (usize, usize) {
        let (ohw, mg) = (self.g.oh * self.g.ow, self.m / self.group);
        let (imgs, rows) = fold_layout(mg, self.k(), ohw, self.g.n);
        (mg * imgs * ohw, rows * imgs * ohw)
    }

    /// The folded path's product for group `gi` and images `n0..n0 + ni`
    /// unfolded by rows ([`im2row_fold`]): `Tᵀ[ni·ohw × mg] = Σ tile ·
    /// Wgᵀ` over tiles of `rows` unfolded rows, the tile read in place.
    /// Each thread owns a range of `Tᵀ`'s rows and the same rows of every
    /// tile, and unfolds and multiplies them in turn, with no barrier
    /// between tiles; each element's sum is the same for any split (its
    /// `k` in tiles of `rows`, each in blocks of the GEMM's depth).
    #[allow(clippy::too_many_arguments)]
    fn fold_by_rows(
        &self,
        x: &[f32],
        wg: &[f32],
        (gi, n0, ni): (usize, usize, usize),
        rows: usize,
        tile: &mut [f32],
        tt: &mut [f32],
        threads: usize,
    ) {
        let g = &self.g;
        let (cg, mg, k) = (g.c / self.group, self.m / self.group, self.k());
        let cols = ni * g.oh * g.ow;
        let t = par::parts(
            cols,
            threads,
            par::MIN_ELEMS.div_ceil(rows.min(k) * mg).max(1),
        );
        let (tp, tq) = (SendPtr(tile.as_mut_ptr()), SendPtr(tt.as_mut_ptr()));
        par::for_parts(threads, t, |p| {
            let q = par::range(cols, t, p);
            for r0 in (0..k).step_by(rows) {
                let rt = rows.min(k - r0);
                // SAFETY: part p alone owns floats q.start·rows ..
                // q.end·rows of `tile` (its rows of every tile, at the
                // tile's row stride rt <= rows: a fixed region, as the
                // parts move from tile to tile unsynchronized) and rows q
                // of Tᵀ; both buffers outlive the parts.
                let part = unsafe {
                    std::slice::from_raw_parts_mut(tp.get().add(q.start * rows), q.len() * rt)
                };
                im2row_fold(g, x, (n0, ni), gi * cg, (r0, rt), q.start, part);
                let beta = if r0 == 0 { 0.0 } else { 1.0 };
                // SAFETY: as above.
                unsafe {
                    sgemm_into_with(
                        true,
                        q.len(),
                        rt,
                        mg,
                        1.0,
                        part,
                        (rt, 1),
                        &wg[r0..],
                        (1, k),
                        beta,
                        tq.get().add(q.start * mg),
                        mg,
                    )
                };
            }
        });
    }

    /// The folded path: per group and run of `imgs` images, `T[mg ×
    /// imgs·ohw] = Wg · [col(img 0) | col(img 1) | ...]` accumulated over
    /// tiles of unfolded rows (each tile unfolded for all the run's images,
    /// rows split across threads), or its transpose unfolded by output
    /// column when the kernel is wider than the output
    /// ([`Conv::fold_by_rows`]), then scattered into the images' output
    /// planes with the bias.
    fn run_folded(
        &self,
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        y: &mut [f32],
        ws: &mut [f32],
        threads: usize,
    ) {
        let g = &self.g;
        let (cg, mg, k) = (g.c / self.group, self.m / self.group, self.k());
        let ohw = g.oh * g.ow;
        let (imgs, rows) = fold_layout(mg, k, ohw, g.n);
        let (t_len, _) = self.fold_floats();
        let (t, col) = ws.split_at_mut(t_len);
        for gi in 0..self.group {
            let wg = &w[gi * mg * k..][..mg * k];
            for n0 in (0..g.n).step_by(imgs) {
                let ni = imgs.min(g.n - n0);
                let cols = ni * ohw;
                let by_rows = self.by_rows();
                let tt = &mut t[..mg * cols];
                if by_rows {
                    let tile = &mut col[..rows.min(k) * cols];
                    self.fold_by_rows(x, wg, (gi, n0, ni), rows, tile, tt, threads);
                } else {
                    for r0 in (0..k).step_by(rows) {
                        let rt = rows.min(k - r0);
                        let tile = &mut col[..rt * cols];
                        let min_rows = par::MIN_ELEMS.div_ceil(cols.max(1));
                        par::for_chunks_mut(threads, tile, cols.max(1), min_rows, |first, part| {
                            let nrows = part.len() / cols.max(1);
                            let (c0, r) = (gi * cg, r0 + first);
                            im2col_rows_fold(g, x, (n0, ni), c0, r, nrows, part, cols);
                        });
                        let beta = if r0 == 0 { 0.0 } else { 1.0 };
                        let (wr, sw) = (&wg[r0..], (k, 1));
                        sgemm(
                            mg,
                            rt,
                            cols,
                            1.0,
                            wr,
                            sw,
                            tile,
                            (cols, 1),
                            beta,
                            tt,
                            cols,
                            threads,
                        );
                    }
                }
                // T's row m holds channel m of each image, ohw apiece
                // (transposed when unfolded by rows): element (m, q) at
                // m·sm + q·sq.
                let (sm, sq) = if by_rows { (1, mg) } else { (cols, 1) };
                let out = &mut y[n0 * self.m * ohw..][..ni * self.m * ohw];
                let t = &t[..mg * cols];
                par::for_chunks_mut(threads, out, self.m * ohw, 1, |first, part| {
                    for (j, img) in part.chunks_mut(self.m * ohw).enumerate() {
                        let jj = first + j;
                        for m in 0..mg {
                            let bias = b.map_or(0.0, |b| b[gi * mg + m]);
                            let dst = &mut img[(gi * mg + m) * ohw..][..ohw];
                            for (p, d) in dst.iter_mut().enumerate() {
                                *d = bias + t[m * sm + (jj * ohw + p) * sq];
                            }
                            if let Some(act) = self.act {
                                act.apply_all(dst);
                            }
                        }
                    }
                });
            }
        }
    }
}

impl Kernel for Conv {
    fn fuse_activation(&mut self, act: Activation) -> bool {
        self.act = Some(act);
        true
    }
    fn workspace_bytes(&self) -> usize {
        if let Some(f) = &self.flat {
            return (f.padded_floats(self.g.c) + self.slots * f.block_floats()) * 4;
        }
        if self.folded() {
            let (t, col) = self.fold_floats();
            return (t + col) * 4;
        }
        if self.direct || self.depthwise() {
            return 0;
        }
        let ohw = self.g.oh * self.g.ow;
        self.k() * tile_cols(self.k(), ohw) * self.slots * 4
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let g = &self.g;
        let x = io.input(0)?.f32()?;
        let w = io.input(1)?.f32()?;
        let b = if self.bias {
            Some(io.input(2)?.f32()?)
        } else {
            None
        };
        let threads = io.threads;
        let ws: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let y = io.outputs[0].f32()?;
        let (cg, mg) = (g.c / self.group, self.m / self.group);
        let k = self.k();
        let ohw = g.oh * g.ow;
        let hw = g.h * g.w;
        if self.depthwise() {
            self.run_depthwise(x, w, b, y, threads);
            return Ok(());
        }
        if let Some(f) = &self.flat {
            let (pad, blocks) = ws.split_at_mut(f.padded_floats(g.c));
            let plane = f.padded_floats(1);
            for n in 0..g.n {
                f.pad(g, &x[n * g.c * hw..][..g.c * hw], pad, threads);
                let yi = &mut y[n * self.m * ohw..][..self.m * ohw];
                for gi in 0..self.group {
                    f.run(
                        g,
                        (mg, k),
                        &w[gi * mg * k..][..mg * k],
                        &pad[gi * cg * plane..],
                        b.map(|b| &b[gi * mg..][..mg]),
                        self.act,
                        &mut yi[gi * mg * ohw..][..mg * ohw],
                        blocks,
                        threads,
                    );
                }
            }
            return Ok(());
        }
        if self.folded() {
            self.run_folded(x, w, b, y, ws, threads);
            return Ok(());
        }
        let (tile, tiles) = balanced_tiles(tile_cols(k, ohw), ohw, threads);
        let slots = (ws.len() / (k * tile).max(1)).max(1);
        for n in 0..g.n {
            let xi = &x[n * g.c * hw..][..g.c * hw];
            let yi = &mut y[n * self.m * ohw..][..self.m * ohw];
            if let Some(cols) = self.direct_tile_cols() {
                for gi in 0..self.group {
                    let bg = b.map(|b| &b[gi * mg..][..mg]);
                    let wg = &w[gi * mg * k..][..mg * k];
                    let xg = &xi[gi * cg * ohw..][..cg * ohw];
                    let yg = &mut yi[gi * mg * ohw..][..mg * ohw];
                    self.direct_tiled(cols, wg, xg, bg, yg, threads);
                }
                continue;
            }
            for gi in 0..self.group {
                let wg = &w[gi * mg * k..][..mg * k];
                let bg = b.map(|b| &b[gi * mg..][..mg]);
                let yg = &mut yi[gi * mg * ohw..][..mg * ohw];
                if self.direct {
                    let xg = &xi[gi * cg * ohw..][..cg * ohw];
                    sgemm_bias_act_with(
                        self.own,
                        mg,
                        k,
                        ohw,
                        wg,
                        (k, 1),
                        xg,
                        (ohw, 1),
                        bg,
                        self.act,
                        yg,
                        ohw,
                        threads,
                    );
                    continue;
                }
                let t = threads.min(slots).min(tiles);
                if t > 1 {
                    // Each part unfolds and multiplies its own tiles into
                    // its own columns of the output.
                    let yp = SendPtr(yg.as_mut_ptr());
                    tiles_in_parts(threads, t, (tile, ohw), ws, k * tile, |col, p0, pt| {
                        let col = &mut col[..k * pt];
                        im2col_cols(g, xi, gi * cg, cg, p0, pt, col);
                        // SAFETY: columns p0..p0+pt of the mg rows of `yg`
                        // (row stride ohw) are this part's alone.
                        unsafe { self.tile_product(wg, col, (pt, 1), bg, yp, p0, pt) };
                    });
                } else {
                    let col = &mut ws[..k * tile];
                    for j in 0..tiles {
                        let p0 = j * tile;
                        let pt = tile.min(ohw - p0);
                        im2col_cols(g, xi, gi * cg, cg, p0, pt, col);
                        sgemm_bias_act_with(
                            self.own,
                            mg,
                            k,
                            pt,
                            wg,
                            (k, 1),
                            col,
                            (pt, 1),
                            bg,
                            self.act,
                            &mut yg[p0..],
                            ohw,
                            threads,
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

pub fn conv(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    if ctx.input(0)?.shape.len() > 4 {
        return super::window_nd::conv(ctx);
    }
    let w = ctx.input(1)?;
    let (g, m, group, _) = conv_layout(ctx, &w.shape)?;
    let bias = ctx.inputs.get(2).is_some_and(|b| b.is_some());
    Ok(Box::new(Conv::new(g, m, group, bias)))
}

impl Conv {
    /// The kernel for window `g` with `m` output channels in `group`
    /// groups: the 1x1 direct path, the tile slots and the product kernel
    /// follow from the geometry.
    fn new(g: Window, m: usize, group: usize, bias: bool) -> Conv {
        let k = g.c / group * g.kh * g.kw;
        let ohw = g.oh * g.ow;
        let mut conv = Conv {
            slots: tile_slots(ohw.div_ceil(tile_cols(k, ohw))),
            own: own_kernel(),
            direct: g.plain_1x1(),
            g,
            m,
            group,
            bias,
            act: None,
            flat: None,
        };
        if conv.own && !conv.direct && !conv.depthwise() {
            conv.flat = Flat::new(&conv.g, conv.g.c / group);
            if conv.flat.is_some() {
                conv.slots = tile_slots(usize::MAX);
            }
        }
        conv
    }
}

/// A Conv's window for a weight of shape `w` (`[M, C/group, k...]`), `M`,
/// `group`, and whether it is a plain 1x1 (a GEMM without im2col). Shared
/// with the palette kernel, whose weight is not an input.
pub(crate) fn conv_layout(
    ctx: &NodeCtx,
    w: &[usize],
) -> Result<(Window, usize, usize, bool), String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 {
        return Err(format!("Conv on {} is not implemented", x.dtype.name()));
    }
    let (g, m, group) = grouped_window(ctx, w)?;
    let direct = g.plain_1x1();
    Ok((g, m, group, direct))
}

/// The window, `M` and `group` of a convolution of input 0 by a weight of
/// shape `w` (`[M, C/group, k...]`), whatever the element types (Conv, and
/// the integer convolutions of [`super::qlinear`]).
pub(crate) fn grouped_window(ctx: &NodeCtx, w: &[usize]) -> Result<(Window, usize, usize), String> {
    if w.len() < 3 {
        return Err(format!("a conv weight of shape {w:?}"));
    }
    let g = window(ctx, &w[2..])?;
    let group = ctx.node.attr_int("group").unwrap_or(1);
    let m = w[0];
    match usize::try_from(group) {
        Ok(gr) if gr > 0 && g.c.is_multiple_of(gr) && m.is_multiple_of(gr) && w[1] == g.c / gr => {
            Ok((g, m, gr))
        }
        _ => Err(format!("bad group {group} for {} channels", g.c)),
    }
}

/// ConvTranspose's geometry: input `[N, C, H, W]`, output `[N, M, OH, OW]`
/// (from shape inference), kernel `[C, M/group, kh, kw]`.
struct Transposed {
    /// Input `[N, C, H, W]`, output `[N, M, OH, OW]`; its pads are at the
    /// start of each *output* dim.
    g: Window,
    m: usize,
    group: usize,
    bias: bool,
}

impl Transposed {
    /// Input rows per tile: the tile's `Wᵀ · X` columns stay within
    /// [`TILE_BYTES`] (at least one row).
    fn tile_rows(&self) -> usize {
        let k = self.m / self.group * self.g.kh * self.g.kw;
        (tile_cols(k, self.g.h * self.g.w) / self.g.w.max(1)).clamp(1, self.g.h.max(1))
    }
}

impl Kernel for Transposed {
    fn workspace_bytes(&self) -> usize {
        (self.m / self.group) * self.g.kh * self.g.kw * self.tile_rows() * self.g.w * 4
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let w = io.input(1)?.f32()?;
        let b = if self.bias {
            Some(io.input(2)?.f32()?)
        } else {
            None
        };
        let threads = io.threads;
        let col: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let y = io.outputs[0].f32()?;
        let (cg, mg) = (self.g.c / self.group, self.m / self.group);
        let taps = self.g.kh * self.g.kw;
        let k = mg * taps;
        let hw = self.g.h * self.g.w;
        let ohw = self.g.oh * self.g.ow;
        let rows = self.tile_rows();
        for n in 0..self.g.n {
            let xi = &x[n * self.g.c * hw..][..self.g.c * hw];
            let yi = &mut y[n * self.m * ohw..][..self.m * ohw];
            match b {
                Some(b) => {
                    for (m, plane) in yi.chunks_mut(ohw.max(1)).enumerate() {
                        plane.fill(b[m]);
                    }
                }
                None => yi.fill(0.0),
            }
            for gi in 0..self.group {
                let wg = &w[gi * cg * k..][..cg * k];
                let xg = &xi[gi * cg * hw..][..cg * hw];
                let yg = &mut yi[gi * mg * ohw..][..mg * ohw];
                for iy0 in (0..self.g.h).step_by(rows) {
                    // col[k × pt] = Wgᵀ · Xg[:, input rows iy0..iy1],
                    // Wg = w[gi] as [cg × k].
                    let iy1 = (iy0 + rows).min(self.g.h);
                    let pt = (iy1 - iy0) * self.g.w;
                    let col = &mut col[..k * pt];
                    sgemm_with(
                        own_kernel(),
                        k,
                        cg,
                        pt,
                        1.0,
                        wg,
                        (1, k),
                        &xg[iy0 * self.g.w..],
                        (hw, 1),
                        0.0,
                        col,
                        pt,
                        threads,
                    );
                    // col2im: scatter-add each column into the output,
                    // output channels split across threads.
                    let min = par::MIN_ELEMS.div_ceil((taps * pt).max(1));
                    par::for_chunks_mut(threads, yg, ohw.max(1), min, |m0, planes| {
                        for (j, plane) in planes.chunks_mut(ohw.max(1)).enumerate() {
                            let m = m0 + j;
                            for t in 0..taps {
                                let (ki, kj) = (t / self.g.kw, t % self.g.kw);
                                let row = &col[(m * taps + t) * pt..][..pt];
                                self.scatter_row(row, iy0, iy1, ki, kj, plane);
                            }
                        }
                    });
                }
            }
        }
        Ok(())
    }
}

impl Transposed {
    /// Adds the columns of one tap `(ki, kj)` for input rows `iy0..iy1`
    /// into its output plane.
    fn scatter_row(
        &self,
        row: &[f32],
        iy0: usize,
        iy1: usize,
        ki: usize,
        kj: usize,
        plane: &mut [f32],
    ) {
        for iy in iy0..iy1 {
            let oy = (iy * self.g.sh + ki * self.g.dh) as isize - self.g.ph as isize;
            if oy < 0 || oy as usize >= self.g.oh {
                continue;
            }
            let dst = &mut plane[oy as usize * self.g.ow..][..self.g.ow];
            for (ix, &v) in row[(iy - iy0) * self.g.w..][..self.g.w].iter().enumerate() {
                let ox = (ix * self.g.sw + kj * self.g.dw) as isize - self.g.pw as isize;
                if ox >= 0 && (ox as usize) < self.g.ow {
                    dst[ox as usize] += v;
                }
            }
        }
    }
}

/// Strides, dilations and begin pads of a ConvTranspose, per spatial dim.
pub(crate) type TransposeWindow = (Vec<usize>, Vec<usize>, Vec<usize>);

/// A ConvTranspose's strides, dilations and begin pads (at the start of
/// each output dim) for input `x`, kernel dims `kernel` and output `y`
/// (from shape inference, which applied `output_shape` and
/// `output_padding`).
pub(crate) fn transpose_window(
    ctx: &NodeCtx,
    x: &[usize],
    kernel: &[usize],
    y: &[usize],
) -> Result<TransposeWindow, String> {
    let sp = kernel.len();
    let node = ctx.node;
    let ints = |name: &str, len: usize, d: i64| -> Result<Vec<i64>, String> {
        match node.attr_ints(name) {
            None => Ok(vec![d; len]),
            Some(v) if v.len() == len && v.iter().all(|&x| x >= 0) => Ok(v.to_vec()),
            Some(v) => Err(format!("{name} {v:?} for {sp} spatial dims")),
        }
    };
    let (s, dl, adj) = (
        ints("strides", sp, 1)?,
        ints("dilations", sp, 1)?,
        ints("output_padding", sp, 0)?,
    );
    if s.contains(&0) || dl.contains(&0) || kernel.contains(&0) {
        return Err("strides, dilations and kernel dims must be positive".into());
    }
    let pads = ints("pads", 2 * sp, 0)?;
    let auto = node.attr_str("auto_pad").unwrap_or("NOTSET");
    let mut begin = Vec::new();
    for i in 0..sp {
        let (inn, out, k) = (x[2 + i] as i64, y[2 + i] as i64, kernel[i] as i64);
        let full = s[i] * (inn - 1) + adj[i] + (k - 1) * dl[i] + 1;
        let total = (full - out).max(0);
        begin.push(match auto {
            // As the ONNX reference computes it: SAME_UPPER puts the
            // larger half at the end.
            "SAME_UPPER" => total / 2,
            "SAME_LOWER" => total - total / 2,
            "VALID" => 0,
            _ if node.attr_ints("output_shape").is_some() => total - total / 2,
            _ => pads[i],
        } as usize);
    }
    let u = |v: &[i64]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    Ok((u(&s), u(&dl), begin))
}

/// ConvTranspose (1-D and 2-D here, more spatial dims in
/// [`super::window_nd`]; groups, strides, dilations, pads,
/// output_padding, output_shape, auto_pad) as GEMM + col2im: per image,
/// group and tile of input rows, `Wᵀ · X` into the workspace (at most
/// [`TILE_BYTES`], one row at least), then scatter-added into the output,
/// output channels split across threads. Stride 1 with a weight of at most
/// [`FLIP_MAX_WEIGHT_BYTES`] runs as the Conv it equals ([`Flipped`]).
pub fn conv_transpose(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    if x.dtype != DType::F32 {
        return Err(format!(
            "ConvTranspose on {} is not implemented",
            x.dtype.name()
        ));
    }
    let y = &ctx.outputs[0];
    let sp = x.shape.len().saturating_sub(2);
    if sp == 0 || w.shape.len() != sp + 2 || y.shape.len() != sp + 2 {
        return Err(format!(
            "ConvTranspose of an input {:?}, weight {:?} and output {:?}",
            x.shape, w.shape, y.shape
        ));
    }
    let (s, dl, begin) = transpose_window(ctx, &x.shape, &w.shape[2..], &y.shape)?;
    if sp > 2 {
        return super::window_nd::conv_transpose(ctx, s, dl, begin);
    }
    let node = ctx.node;
    let group = node.attr_int("group").unwrap_or(1).max(1) as usize;
    let c = x.shape[1];
    if w.shape[0] != c || c % group != 0 {
        return Err(format!("bad group {group} for {c} channels"));
    }
    let m = w.shape[1] * group;
    if y.shape[1] != m {
        return Err(format!("output channels {} != {m}", y.shape[1]));
    }
    let g = Window::new(&x.shape, &y.shape[2..], &w.shape[2..], &s, &dl, &begin);
    let (kh, kw, sh, sw, dh, dw, ph, pw) = (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.ph, g.pw);
    let bias = ctx.inputs.get(2).is_some_and(|b| b.is_some());
    let flipped_bytes = w.shape.iter().product::<usize>() * 4;
    if (sh, sw) == (1, 1)
        && ph <= dh * (kh - 1)
        && pw <= dw * (kw - 1)
        && flipped_bytes <= FLIP_MAX_WEIGHT_BYTES
    {
        // The equal Conv's begin pads are on its input: `d·(k - 1) - p`.
        let g = Window {
            ph: dh * (kh - 1) - ph,
            pw: dw * (kw - 1) - pw,
            ..g
        };
        return Ok(Box::new(Flipped {
            wshape: [vec![m, c / group], w.shape[2..].to_vec()].concat(),
            conv: Conv::new(g, m, group, bias),
        }));
    }
    Ok(Box::new(Transposed { g, m, group, bias }))
}

/// The largest weight a stride-1 ConvTranspose flips into its workspace
/// ([`Flipped`]); larger ones run as GEMM + col2im, which needs no copy of
/// the weight (resnet18's 512-channel 3x3 weight is 9.4 MB, and the
/// workspace is held beside the arena).
const FLIP_MAX_WEIGHT_BYTES: usize = 1 << 20;

/// A ConvTranspose of stride 1 run as the Conv it equals: the same input,
/// the weight with its channel axes swapped (per group) and its taps
/// reversed, and begin pads `d·(k - 1) - p`. `W'[g·M/g + o, i, a, b] =
/// W[g·C/g + i, o, kh-1-a, kw-1-b]` is written into the workspace on each
/// run (the weight may be a runtime input, as in a training step's input
/// gradient); the product is then a Conv's (K = C/g·kh·kw, the output
/// positions as columns) instead of `Wᵀ·X` with K = C/g and a col2im
/// scatter of `M/g·kh·kw` rows.
struct Flipped {
    conv: Conv,
    /// The equivalent Conv's weight shape, `[M, C/g, kh(, kw)]`.
    wshape: Vec<usize>,
}

impl Flipped {
    fn weight_floats(&self) -> usize {
        self.wshape.iter().product()
    }
}

impl Kernel for Flipped {
    fn workspace_bytes(&self) -> usize {
        (self.weight_floats() * 4).next_multiple_of(64) + self.conv.workspace_bytes()
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let w = io.input(1)?.f32()?;
        let ws = std::mem::take(&mut io.workspace);
        let (wbuf, rest) = ws.split_at_mut((self.weight_floats() * 4).next_multiple_of(64));
        let flipped: &mut [f32] = cast_mut(&mut wbuf[..self.weight_floats() * 4]);
        let (m, cg) = (self.wshape[0], self.wshape[1]);
        let group = self.conv.group;
        let (mg, taps) = (m / group, self.conv.g.kh * self.conv.g.kw);
        for gi in 0..group {
            for i in 0..cg {
                for o in 0..mg {
                    let src = &w[((gi * cg + i) * mg + o) * taps..][..taps];
                    let dst = &mut flipped[((gi * mg + o) * cg + i) * taps..][..taps];
                    for (d, &v) in dst.iter_mut().zip(src.iter().rev()) {
                        *d = v;
                    }
                }
            }
        }
        let flipped: &[u8] = &wbuf[..self.weight_floats() * 4];
        let mut inputs = io.inputs.clone();
        inputs[1] = Some(In {
            dtype: DType::F32,
            shape: &self.wshape,
            data: Data::Bytes(flipped),
        });
        let mut inner = KernelIo {
            inputs,
            outputs: std::mem::take(&mut io.outputs),
            workspace: rest,
            threads: io.threads,
        };
        self.conv.run(&mut inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window of `n` images of `c` channels for `(h, w, kh, kw,
    /// stride, dilation, pad)`, the same in both spatial dims.
    fn square_window(
        n: usize,
        c: usize,
        (h, w, kh, kw, s, d, p): (usize, usize, usize, usize, usize, usize, usize),
    ) -> Window {
        let out = |x: usize, k: usize| (x + 2 * p - d * (k - 1) - 1) / s + 1;
        Window {
            n,
            c,
            h,
            w,
            oh: out(h, kh),
            ow: out(w, kw),
            kh,
            kw,
            sh: s,
            sw: s,
            dh: d,
            dw: d,
            ph: p,
            pw: p,
        }
    }

    const ACTS: [Option<Activation>; 3] = [
        None,
        Some(Activation::Relu),
        Some(Activation::Clip { lo: -0.1, hi: 0.2 }),
    ];

    /// The whole depthwise kernel (blocks of eight channels, the four left
    /// over plane by plane, two images, split across threads) against the
    /// generic loops plane by plane: the same bits at 1, 2 and 3 threads,
    /// on the eight-channel path (narrow outputs) and the plane path.
    #[test]
    fn depthwise_kernel_gives_the_generic_bits_at_every_thread_count() {
        let (n, c) = (2, 12);
        // Outputs 14 wide (eight channels at once) and 56 wide (plane by
        // plane).
        for case in [
            (14, 14, 3, 3, 1, 1, 1),
            (28, 27, 3, 3, 2, 1, 1),
            (56, 56, 3, 3, 1, 1, 1),
        ] {
            let g = square_window(n, c, case);
            let (hw, taps, ohw) = (g.h * g.w, g.kh * g.kw, g.oh * g.ow);
            let x = graphopt_testutil::uniform(n * c * hw, 5);
            let wt = graphopt_testutil::uniform(c * taps, 6);
            let b = graphopt_testutil::uniform(c, 7);
            let mut conv = Conv::new(g.clone(), c, c, true);
            conv.act = ACTS[2];
            let mut want = vec![f32::NAN; n * c * ohw];
            for (i, plane) in want.chunks_mut(ohw).enumerate() {
                let ci = i % c;
                let (xi, wi) = (&x[i * hw..][..hw], &wt[ci * taps..][..taps]);
                depthwise_generic(&g, xi, wi, b[ci], conv.act, plane);
            }
            for threads in 1..=3 {
                let mut got = vec![f32::NAN; n * c * ohw];
                conv.run_depthwise(&x, &wt, Some(&b), &mut got, threads);
                let same = graphopt_testutil::same_bits(&got, &want);
                assert!(same, "{case:?}: {threads} thread(s)");
            }
        }
    }

    /// The f32 unfolding's block copies and stride-2 shuffles pick the
    /// same elements as the element-by-element loop, at every length
    /// around the block sizes and with sources that end right after the
    /// last element read.
    #[test]
    fn strided_unfold_picks_the_same_elements() {
        for s in 1..=3 {
            for n in 0..40 {
                let src: Vec<f32> = (0..(n.max(1) - 1) * s + 1).map(|i| i as f32).collect();
                let src = if n == 0 { &src[..0] } else { &src[..] };
                let mut got = vec![-1.0; n];
                <f32 as Unfold>::strided(src, s, &mut got);
                let want: Vec<f32> = (0..n).map(|i| (i * s) as f32).collect();
                assert_eq!(got, want, "stride {s} length {n}");
            }
        }
    }

    /// [`depthwise_c8_avx2`] (eight channels at once) against the generic
    /// loops plane by plane: the same bits, on row tails, strides,
    /// dilations, asymmetric pads, bands of rows (outputs past
    /// `C8_BAND` positions, rows wider than a band) and every activation.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn depthwise_eight_channels_give_the_generic_bits() {
        if !super::super::gemm::available()
            && graphopt_testutil::skip_or_fail(
                "depthwise_eight_channels_give_the_generic_bits",
                "the CPU has no AVX2/FMA",
                graphopt_testutil::require_simd(),
                "GRAPHOPT_REQUIRE_SIMD=1 or CI=true",
            )
        {
            return;
        }
        // (h, w, kh, kw, stride, dilation, pad)
        let cases = [
            (7, 7, 3, 3, 1, 1, 1),
            (14, 14, 3, 3, 2, 1, 1),
            (13, 11, 5, 5, 1, 1, 2),
            (21, 30, 3, 3, 2, 2, 2),
            (9, 9, 7, 7, 1, 1, 3),
            (3, 300, 3, 3, 1, 1, 1),
            (40, 23, 1, 1, 1, 1, 0),
            (6, 5, 3, 3, 1, 1, 0),
            (10, 10, 3, 3, 3, 1, 1),
            (5, 6, 1, 1, 3, 1, 2),
            (2, 1, 3, 3, 1, 1, 2),
            (1, 9, 1, 3, 2, 1, 1),
        ];
        for (seed, case) in (11..).zip(cases) {
            let g = square_window(1, 8, case);
            let (hw, taps, ohw) = (g.h * g.w, g.kh * g.kw, g.oh * g.ow);
            let x = graphopt_testutil::uniform(8 * hw, seed);
            let wt = graphopt_testutil::uniform(8 * taps, seed + 100);
            let b = graphopt_testutil::uniform(8, seed + 200);
            let bias: [f32; 8] = std::array::from_fn(|c| b[c]);
            for act in ACTS {
                let mut got = vec![f32::NAN; 8 * ohw];
                let xs = std::array::from_fn(|c| x[c * hw..].as_ptr());
                let base = got.as_mut_ptr();
                // SAFETY: plane c starts at c·ohw inside `got`.
                let outs = std::array::from_fn(|c| unsafe { base.add(c * ohw) });
                // SAFETY: AVX2 and FMA (checked above); 8 planes of h·w in,
                // 8 of oh·ow out.
                unsafe { depthwise_c8_avx2(&g, xs, &wt, bias, act, outs) };
                for c in 0..8 {
                    let mut want = vec![f32::NAN; ohw];
                    let (xc, wc) = (&x[c * hw..][..hw], &wt[c * taps..][..taps]);
                    depthwise_generic(&g, xc, wc, bias[c], act, &mut want);
                    let same = graphopt_testutil::same_bits(&got[c * ohw..][..ohw], &want);
                    assert!(same, "{case:?} {act:?} channel {c}");
                }
            }
        }
    }

    /// [`depthwise_plane`] (AVX2 registers where the CPU has them) against
    /// the generic loops ([`depthwise_body`]) on the same padded, phased
    /// plane: the same bits, on row tails (output widths not a multiple
    /// of 8), strides, dilations, and a kernel too wide for the registers.
    #[test]
    fn depthwise_avx2_and_generic_give_the_same_bits() {
        // (h, w, kh, kw, stride, dilation, pad)
        let cases = [
            (13, 13, 3, 3, 1, 1, 1),
            (21, 30, 3, 3, 2, 1, 1),
            (17, 19, 5, 5, 2, 1, 2),
            (12, 12, 7, 7, 1, 2, 3),
            (9, 45, 1, 31, 1, 1, 15),
            (6, 5, 3, 3, 1, 1, 0),
        ];
        for (seed, case) in (7..).zip(cases) {
            let g = square_window(1, 1, case);
            let (hw, taps, ohw) = (g.h * g.w, g.kh * g.kw, g.oh * g.ow);
            let x = graphopt_testutil::uniform(hw, seed);
            let wt = graphopt_testutil::uniform(taps, seed + 100);
            let bias = graphopt_testutil::uniform(1, seed + 200)[0];
            for act in ACTS {
                let mut got = vec![0f32; ohw];
                depthwise_plane(&g, &x, &wt, bias, act, &mut got);
                let mut want = vec![f32::NAN; ohw];
                depthwise_generic(&g, &x, &wt, bias, None, &mut want);
                // The activation applied after the fact, element by element.
                if let Some(act) = act {
                    want.iter_mut().for_each(|v| *v = act.apply(*v));
                }
                let same = graphopt_testutil::same_bits(&got, &want);
                assert!(same, "{case:?} {act:?}");
            }
        }
    }

    /// Runs `conv` on `x`, `w`, `b` at `threads` through its kernel
    /// interface (workspace as it asks), into an output of NaNs.
    fn run_conv(conv: &Conv, x: &[f32], w: &[f32], b: &[f32], threads: usize) -> Vec<f32> {
        let g = &conv.g;
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
        let (xb, wb, bb) = (bytes(x), bytes(w), bytes(b));
        let xs = [g.n, g.c, g.h, g.w];
        let wsh = [conv.m, g.c / conv.group, g.kh, g.kw];
        let (bs, ys) = ([conv.m], [g.n, conv.m, g.oh, g.ow]);
        let input = |shape: &'static [usize], data| {
            Some(In {
                dtype: DType::F32,
                shape,
                data: Data::Bytes(data),
            })
        };
        // (Leaked: a test's few small shapes.)
        let leak = |v: Vec<usize>| -> &'static [usize] { Vec::leak(v) };
        let mut out = bytes(&vec![f32::NAN; ys.iter().product()]);
        // 64-aligned workspace, then a guard of 4 KiB that must stay as
        // written.
        let mut ws = vec![0xA5A5_A5A5_A5A5_A5A5u64; conv.workspace_bytes().div_ceil(8) + 8 + 512];
        // SAFETY: u64 to u8 (any alignment).
        let (pre, ws, _) = unsafe { ws.align_to_mut::<u8>() };
        assert!(pre.is_empty());
        let off = ws.as_ptr().align_offset(64);
        let mut io = KernelIo {
            inputs: vec![
                input(leak(xs.to_vec()), &xb),
                input(leak(wsh.to_vec()), &wb),
                input(leak(bs.to_vec()), &bb),
            ],
            outputs: vec![crate::backend::Out {
                dtype: DType::F32,
                shape: leak(ys.to_vec()),
                data: &mut out,
            }],
            workspace: &mut ws[off..off + conv.workspace_bytes()],
            threads,
        };
        conv.run(&mut io).unwrap();
        let end = off + conv.workspace_bytes();
        assert!(
            ws[end..end + 4096].iter().all(|&b| b == 0xA5),
            "wrote past the workspace"
        );
        out.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// `flat` at 1-3 threads gives `tiled`'s bits at one (which are not
    /// NaN: the output was filled with NaNs; any bias input is read only
    /// where the kernels have one).
    fn flat_matches(flat: &Conv, tiled: &Conv, (x, w, b): (&[f32], &[f32], &[f32]), what: &str) {
        let want = run_conv(tiled, x, w, b, 1);
        assert!(want.iter().all(|v| !v.is_nan()), "{what}");
        for threads in 1..=3 {
            let got = run_conv(flat, x, w, b, threads);
            assert!(
                graphopt_testutil::same_bits(&got, &want),
                "{what}: {threads} thread(s)"
            );
        }
    }

    /// A convolution on the padded image ([`Flat`]) against the same
    /// kernel on im2col tiles: the same bits at 1-3 threads (three
    /// workspace slots whatever the machine, nothing written past the
    /// workspace), with dilation, pads as wide as the kernel reaches,
    /// end pads wider or narrower than begin pads, other pads per axis,
    /// strides 2 and 3 (and 1 by 2), groups, 1-D, 1,536 output channels
    /// split across threads, and a fused activation; and the flat path
    /// does run on those.
    #[test]
    fn flat_convolution_gives_the_im2col_bits() {
        if !own_kernel()
            && graphopt_testutil::skip_or_fail(
                "flat_convolution_gives_the_im2col_bits",
                "the CPU has no AVX2/FMA",
                graphopt_testutil::require_simd(),
                "GRAPHOPT_REQUIRE_SIMD=1 or CI=true",
            )
        {
            return;
        }
        // (n, c, m, group, (h, w, kh, kw, stride, dilation, pad))
        let cases = [
            (2, 20, 24, 1, (14, 14, 3, 3, 1, 1, 1)),
            (1, 16, 40, 1, (29, 31, 3, 3, 1, 1, 1)),
            (1, 9, 17, 1, (40, 45, 5, 5, 1, 2, 4)),
            (2, 12, 8, 2, (17, 19, 3, 3, 1, 1, 2)),
            (1, 8, 200, 1, (20, 21, 3, 2, 1, 1, 1)),
            (2, 3, 16, 1, (64, 64, 7, 7, 2, 1, 3)),
            (1, 24, 32, 1, (56, 55, 3, 3, 2, 1, 1)),
            (1, 5, 12, 1, (61, 60, 5, 4, 3, 2, 2)),
        ];
        let mut asymmetric = 0;
        for (n, c, m, group, geom) in cases {
            let mut g = square_window(n, c, geom);
            let wlen = m * c / group * g.kh * g.kw;
            let x = graphopt_testutil::uniform(n * c * g.h * g.w, 11);
            let w = graphopt_testutil::uniform(wlen, 12);
            let b = graphopt_testutil::uniform(m, 13);
            for act in [None, ACTS[2]] {
                let mut flat = Conv::new(g.clone(), m, group, true);
                flat.act = act;
                flat.slots = 3;
                assert!(flat.flat.is_some(), "{geom:?}: the flat path applies");
                let mut tiled = Conv::new(g.clone(), m, group, true);
                tiled.act = act;
                tiled.flat = None;
                flat_matches(&flat, &tiled, (&x, &w, &b), &format!("{geom:?} {act:?}"));
            }
            // An asymmetric end pad (one less column and row at the end).
            g.oh -= 1;
            g.ow -= 1;
            let mut flat = Conv::new(g.clone(), m, group, false);
            flat.slots = 3;
            let mut tiled = Conv::new(g.clone(), m, group, false);
            tiled.flat = None;
            if flat.flat.is_none() {
                // (The 14-wide case would drop 2 of 15 columns.)
                continue;
            }
            asymmetric += 1;
            flat_matches(
                &flat,
                &tiled,
                (&x, &w, &b),
                &format!("{geom:?} one end pad less"),
            );
        }
        assert!(
            asymmetric >= 3,
            "the flat path ran {asymmetric} asymmetric cases"
        );
        // Windows square_window cannot make: (begin pads, output size,
        // strides) per axis, and 1,536 output channels of a 1-D window
        // (its channels split across threads in chunks that fit a slot).
        let win = |(n, c, h, w): (usize, usize, usize, usize),
                   (kh, kw, sh, sw): (usize, usize, usize, usize),
                   (ph, pw, oh, ow): (usize, usize, usize, usize)| Window {
            n,
            c,
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            sh,
            sw,
            dh: 1,
            dw: 1,
            ph,
            pw,
        };
        let extra = [
            // no begin pad, an end pad of 2 (OW = W)
            (win((1, 6, 30, 40), (3, 3, 1, 1), (0, 0, 30, 40)), 10, 1),
            // pads 2 down and 1 across
            (win((2, 5, 26, 33), (3, 3, 1, 1), (2, 1, 26, 33)), 7, 1),
            // strides 1 by 2, grouped
            (win((1, 8, 30, 44), (3, 3, 1, 2), (1, 1, 30, 22)), 12, 2),
            // 1-D, 1,536 output channels
            (win((1, 4, 1, 100), (1, 3, 1, 1), (0, 1, 1, 100)), 1536, 1),
            // 1-D, two images
            (win((2, 6, 1, 50), (1, 3, 1, 1), (0, 1, 1, 50)), 7, 1),
        ];
        for (g, m, group) in extra {
            let wlen = m * g.c / group * g.kh * g.kw;
            let x = graphopt_testutil::uniform(g.n * g.c * g.h * g.w, 17);
            let w = graphopt_testutil::uniform(wlen, 18);
            let b = graphopt_testutil::uniform(m, 19);
            let mut flat = Conv::new(g.clone(), m, group, true);
            flat.slots = 3;
            let mut tiled = Conv::new(g.clone(), m, group, true);
            tiled.flat = None;
            assert!(flat.flat.is_some(), "{g:?}: the flat path applies");
            flat_matches(&flat, &tiled, (&x, &w, &b), &format!("{g:?}"));
        }
        // An image whose padded copy would pass the workspace cap unfolds
        // in tiles instead.
        let big = square_window(1, 64, (300, 300, 3, 3, 1, 1, 1));
        assert!(Conv::new(big, 64, 1, false).flat.is_none());
    }
}
