//! Sampling at computed coordinates: GridSample (opset 16: 4-D input,
//! `bilinear` / `nearest` / `bicubic`; opset 20 on: any number of spatial
//! dims, `linear` / `nearest` / `cubic`), with `padding_mode` zeros,
//! border or reflection and `align_corners`, as the ONNX reference
//! computes it (coordinates in f32; a coordinate outside the image is
//! clamped or reflected first, then each tap's index is padded again;
//! nearest rounds half to even; cubic is Keys' with a = -0.75).
//!
//! RoiAlign (opsets 10 and 16): each ROI's `output_height x
//! output_width` bins sampled on a `sampling_ratio` grid (adaptive when
//! 0), bilinear taps averaged (`avg`) or, in `max` mode, the largest
//! weighted tap taken, exactly as onnxruntime and the ONNX reference do
//! (f32 coordinates; a sample more than one pixel outside the image reads
//! as 0; `max` takes the maximum of `w·x` over the four taps, not of the
//! interpolated value). `coordinate_transformation_mode` is `half_pixel`
//! by default from opset 16 and `output_half_pixel` (no shift, ROIs at
//! least 1x1) before. The taps of one ROI are computed once and shared by
//! its channels (up to `MAX_CACHED_TAPS`; past that, per channel); ROIs
//! split across threads.
//!
//! AffineGrid (2-D and 3-D, `align_corners`): the normalized grid of the
//! output size mapped through each `theta`, in f64 and rounded once (the
//! reference's arithmetic), f32 or f64 out; a dim of size 1 has its one
//! coordinate at 0 (as PyTorch's `affine_grid`).

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::par;
use graphopt_ir::DType;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

struct GridSample {
    mode: Mode,
    padding: Padding,
    align: bool,
    n: usize,
    c: usize,
    /// Input spatial dims.
    dims: Vec<usize>,
    /// Output points per image.
    points: usize,
}

/// The reference's `_gs_reflect`: `x` folded into `[lo, hi]`.
fn reflect(x: f32, lo: f32, hi: f32) -> f32 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / range) as i64;
        let r = dx - n as f32 * range;
        if n % 2 == 0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / range) as i64;
        let r = dx - n as f32 * range;
        if n % 2 == 0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

/// Keys' cubic weights of the taps at -1, 0, 1, 2 for fraction `t`.
fn cubic(t: f32) -> [f32; 4] {
    let a = -0.75f32;
    let x = t.abs();
    [
        ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((a * (2.0 - x) - 5.0 * a) * (2.0 - x) + 8.0 * a) * (2.0 - x) - 4.0 * a,
    ]
}

impl GridSample {
    /// The borders `[lo, hi]` of spatial dim `d`.
    fn border(&self, d: usize) -> (f32, f32) {
        let n = self.dims[d] as f32;
        if self.align {
            (0.0, n - 1.0)
        } else {
            (-0.5, n - 0.5)
        }
    }

    /// Tap index `i` of dim `d` after padding; `None` reads as 0.
    fn tap(&self, d: usize, i: i64) -> Option<usize> {
        let n = self.dims[d] as i64;
        match self.padding {
            Padding::Zeros => (0..n).contains(&i).then_some(i as usize),
            Padding::Border => Some(i.clamp(0, n - 1) as usize),
            Padding::Reflection => {
                let (lo, hi) = self.border(d);
                let r = reflect(i as f32, lo, hi) as i64;
                Some(r.clamp(0, n - 1) as usize)
            }
        }
    }

    /// Per spatial dim, the taps (index, weight) of the point whose
    /// normalized coordinates are `g` (last dim first, as the grid has
    /// them).
    fn taps(&self, g: &[f32], out: &mut [Vec<(Option<usize>, f32)>]) {
        let r = self.dims.len();
        for d in 0..r {
            let v = g[r - 1 - d];
            let len = self.dims[d] as f32;
            let mut x = if self.align {
                (v + 1.0) / 2.0 * (len - 1.0)
            } else {
                ((v + 1.0) * len - 1.0) / 2.0
            };
            if self.mode == Mode::Nearest {
                x = x.round_ties_even();
            }
            let (lo, hi) = self.border(d);
            if x < lo || x > hi {
                match self.padding {
                    Padding::Border => x = x.clamp(0.0, len - 1.0),
                    Padding::Reflection => x = reflect(x, lo, hi),
                    Padding::Zeros => {}
                }
            }
            let t = &mut out[d];
            t.clear();
            match self.mode {
                Mode::Nearest => t.push((self.tap(d, x as i64), 1.0)),
                Mode::Linear => {
                    let x0 = x.floor();
                    let f = x - x0;
                    let x0 = x0 as i64;
                    t.push((self.tap(d, x0), 1.0 - f));
                    t.push((self.tap(d, x0.saturating_add(1)), f));
                }
                Mode::Cubic => {
                    let x0 = x.floor();
                    let w = cubic(x - x0);
                    let x0 = x0 as i64;
                    for (k, w) in w.into_iter().enumerate() {
                        t.push((self.tap(d, x0.saturating_add(k as i64 - 1)), w));
                    }
                }
            }
        }
    }
}

impl Kernel for GridSample {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let grid = io.input(1)?.f32()?;
        let y = io.outputs[0].f32()?;
        let (r, p, c) = (self.dims.len(), self.points, self.c);
        let plane: usize = self.dims.iter().product();
        let strides = crate::tensor::strides(&self.dims);
        let len = self.n * c * p;
        let per = match self.mode {
            Mode::Nearest => 1,
            Mode::Linear => 2,
            Mode::Cubic => 4,
        };
        let min = par::MIN_ELEMS.div_ceil((p * per.max(1) * r.max(1)).max(1));
        // Planes (one image's channel) split across threads.
        par::for_chunks_mut(io.threads, &mut y[..len], p.max(1), min, |first, part| {
            let mut taps = vec![Vec::with_capacity(4); r];
            let mut at = vec![0usize; r];
            for (j, ys) in part.chunks_mut(p.max(1)).enumerate() {
                let (img, ch) = ((first + j) / c, (first + j) % c);
                let xs = &x[(img * c + ch) * plane..][..plane];
                for (q, yv) in ys.iter_mut().enumerate() {
                    self.taps(&grid[(img * p + q) * r..][..r], &mut taps);
                    // Every combination of one tap per dim.
                    let combos: usize = taps.iter().map(|t| t.len()).product();
                    let mut acc = 0f32;
                    for k in 0..combos {
                        let mut rest = k;
                        for d in (0..r).rev() {
                            at[d] = rest % taps[d].len();
                            rest /= taps[d].len();
                        }
                        let (mut off, mut w) = (Some(0usize), 1f32);
                        for d in 0..r {
                            let (i, wd) = taps[d][at[d]];
                            off = off.zip(i).map(|(o, i)| o + i * strides[d]);
                            w *= wd;
                        }
                        if let Some(o) = off {
                            acc += w * xs[o];
                        }
                    }
                    *yv = acc;
                }
            }
        });
        Ok(())
    }
}

pub fn grid_sample(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (x, g) = (ctx.input(0)?, ctx.input(1)?);
    let y = &ctx.outputs[0];
    if x.dtype != DType::F32 || g.dtype != DType::F32 {
        return Err("GridSample is implemented for an f32 input and grid".into());
    }
    let rank = x.shape.len();
    if rank < 3 || (ctx.opset < 20 && rank != 4) {
        return Err(format!(
            "GridSample at opset {} of a rank-{rank} input (4-D before opset 20, 3-D on after)",
            ctx.opset
        ));
    }
    let r = rank - 2;
    let (n, c) = (x.shape[0], x.shape[1]);
    if g.shape.len() != rank || g.shape[0] != n || g.shape[rank - 1] != r {
        return Err(format!(
            "a grid of shape {:?} for an input of shape {:?}",
            g.shape, x.shape
        ));
    }
    let mut want = vec![n, c];
    want.extend_from_slice(&g.shape[1..rank - 1]);
    if y.shape != want {
        return Err(format!("GridSample gives {want:?}, not {:?}", y.shape));
    }
    let old = ctx.opset < 20;
    let mode = match ctx.node.attr_str("mode") {
        None => Mode::Linear,
        Some("nearest") => Mode::Nearest,
        Some("bilinear") if old => Mode::Linear,
        Some("bicubic") if old => Mode::Cubic,
        Some("linear") if !old => Mode::Linear,
        Some("cubic") if !old => Mode::Cubic,
        Some(m) => return Err(format!("GridSample mode {m} at opset {}", ctx.opset)),
    };
    let padding = match ctx.node.attr_str("padding_mode").unwrap_or("zeros") {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        p => return Err(format!("GridSample padding_mode {p}")),
    };
    Ok(Box::new(GridSample {
        mode,
        padding,
        align: ctx.node.attr_int("align_corners").unwrap_or(0) != 0,
        n,
        c,
        dims: x.shape[2..].to_vec(),
        points: g.shape[1..rank - 1].iter().product(),
    }))
}

/// One sample of a RoiAlign bin: its four bilinear taps (flat positions
/// in the plane) and their weights.
#[derive(Clone, Copy, Default)]
struct Tap {
    pos: [usize; 4],
    w: [f32; 4],
}

/// Where one ROI's samples lie.
struct RoiGeometry {
    start_h: f32,
    start_w: f32,
    bin_h: f32,
    bin_w: f32,
    grid_h: usize,
    grid_w: usize,
}

struct RoiAlign {
    max: bool,
    half_pixel: bool,
    scale: f32,
    ratio: usize,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    rois: usize,
}

/// Samples one ROI may take per channel before the kernel refuses it (an
/// adaptive grid over an absurdly large ROI would otherwise run for
/// hours).
const MAX_ROI_SAMPLES: usize = 1 << 28;

/// Taps of one ROI cached when there are at most this many.
const MAX_CACHED_TAPS: usize = 1 << 16;

/// `a < b ? b : a`, C++'s `std::max` (a NaN in `b` loses, one in `a`
/// stays).
#[inline]
fn cmax(a: f32, b: f32) -> f32 {
    if a < b {
        b
    } else {
        a
    }
}

impl RoiAlign {
    /// The geometry of ROI `roi` (`[x1, y1, x2, y2]`), as onnxruntime
    /// computes it in f32.
    fn geometry(&self, roi: &[f32]) -> RoiGeometry {
        let offset = if self.half_pixel { 0.5f32 } else { 0.0 };
        let start_w = roi[0] * self.scale - offset;
        let start_h = roi[1] * self.scale - offset;
        let end_w = roi[2] * self.scale - offset;
        let end_h = roi[3] * self.scale - offset;
        let (mut rw, mut rh) = (end_w - start_w, end_h - start_h);
        if !self.half_pixel {
            // Malformed ROIs are forced to 1x1.
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bin_h, bin_w) = (rh / self.oh as f32, rw / self.ow as f32);
        // A negative or NaN grid samples nothing (`as` saturates).
        let grid = |bin: f32| {
            if self.ratio > 0 {
                self.ratio
            } else {
                bin.ceil().max(0.0) as usize
            }
        };
        RoiGeometry {
            start_h,
            start_w,
            bin_h,
            bin_w,
            grid_h: grid(bin_h),
            grid_w: grid(bin_w),
        }
    }

    /// Sample `(iy, ix)` of bin `(ph, pw)`.
    fn tap(&self, g: &RoiGeometry, ph: usize, pw: usize, iy: usize, ix: usize) -> Tap {
        let mut y = g.start_h + ph as f32 * g.bin_h + (iy as f32 + 0.5) * g.bin_h / g.grid_h as f32;
        let mut x = g.start_w + pw as f32 * g.bin_w + (ix as f32 + 0.5) * g.bin_w / g.grid_w as f32;
        let (h, w) = (self.h as f32, self.w as f32);
        if y < -1.0 || y > h || x < -1.0 || x > w {
            return Tap::default();
        }
        if y <= 0.0 {
            y = 0.0;
        }
        if x <= 0.0 {
            x = 0.0;
        }
        let (mut y_low, mut x_low) = (y as usize, x as usize);
        let y_high = if y_low >= self.h - 1 {
            y_low = self.h - 1;
            y = y_low as f32;
            y_low
        } else {
            y_low + 1
        };
        let x_high = if x_low >= self.w - 1 {
            x_low = self.w - 1;
            x = x_low as f32;
            x_low
        } else {
            x_low + 1
        };
        let (ly, lx) = (y - y_low as f32, x - x_low as f32);
        let (hy, hx) = (1.0 - ly, 1.0 - lx);
        Tap {
            pos: [
                y_low * self.w + x_low,
                y_low * self.w + x_high,
                y_high * self.w + x_low,
                y_high * self.w + x_high,
            ],
            w: [hy * hx, hy * lx, ly * hx, ly * lx],
        }
    }

    /// One ROI's `[C, oh, ow]` output from its image `x` (`[C, H, W]`).
    fn roi(&self, g: &RoiGeometry, x: &[f32], out: &mut [f32], cache: &mut Vec<Tap>) {
        let (gh, gw) = (g.grid_h, g.grid_w);
        let per_bin = gh * gw;
        let count = per_bin.max(1) as f32;
        let bins = self.oh * self.ow;
        let cached = per_bin * bins <= MAX_CACHED_TAPS;
        cache.clear();
        if cached {
            for ph in 0..self.oh {
                for pw in 0..self.ow {
                    for iy in 0..gh {
                        for ix in 0..gw {
                            cache.push(self.tap(g, ph, pw, iy, ix));
                        }
                    }
                }
            }
        }
        let plane = self.h * self.w;
        for (ch, ys) in out.chunks_mut(bins.max(1)).enumerate().take(self.c) {
            let xs = &x[ch * plane..][..plane];
            for (b, yv) in ys.iter_mut().enumerate() {
                let (ph, pw) = (b / self.ow, b % self.ow);
                let mut acc = 0f32;
                let mut first = true;
                for s in 0..per_bin {
                    let t = if cached {
                        cache[b * per_bin + s]
                    } else {
                        self.tap(g, ph, pw, s / gw, s % gw)
                    };
                    let v = |k: usize| t.w[k] * xs[t.pos[k]];
                    if self.max {
                        let m = cmax(cmax(cmax(v(0), v(1)), v(2)), v(3));
                        acc = if first { m } else { cmax(acc, m) };
                        first = false;
                    } else {
                        acc += v(0) + v(1) + v(2) + v(3);
                    }
                }
                *yv = if self.max { acc } else { acc / count };
            }
        }
    }
}

impl Kernel for RoiAlign {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let rois = io.input(1)?.f32()?;
        let idx = io.input(2)?.ints()?;
        let y = io.outputs[0].f32()?;
        let mut geo = Vec::with_capacity(self.rois);
        for (r, &b) in idx.iter().enumerate().take(self.rois) {
            if b < 0 || b as usize >= self.n {
                return Err(format!(
                    "RoiAlign: batch index {b} of ROI {r} is out of range for a batch of {}",
                    self.n
                ));
            }
            let g = self.geometry(&rois[r * 4..][..4]);
            let samples = g
                .grid_h
                .saturating_mul(g.grid_w)
                .saturating_mul(self.oh * self.ow);
            if samples > MAX_ROI_SAMPLES {
                return Err(format!(
                    "RoiAlign: ROI {r} {:?} takes {}x{} samples per bin (at most {MAX_ROI_SAMPLES} per channel are run)",
                    &rois[r * 4..][..4],
                    g.grid_h,
                    g.grid_w
                ));
            }
            geo.push((b as usize, g));
        }
        let (c, bins) = (self.c, self.oh * self.ow);
        let block = c * bins;
        if block == 0 {
            return Ok(());
        }
        let image = c * self.h * self.w;
        let per_roi = geo
            .iter()
            .map(|(_, g)| g.grid_h.saturating_mul(g.grid_w).saturating_mul(block * 4))
            .max()
            .unwrap_or(0);
        let min = par::MIN_ELEMS.div_ceil(per_roi.max(1));
        par::for_chunks_mut(
            io.threads,
            &mut y[..self.rois * block],
            block,
            min,
            |first, part| {
                let mut cache = Vec::new();
                for (j, out) in part.chunks_mut(block).enumerate() {
                    let (b, g) = &geo[first + j];
                    self.roi(g, &x[b * image..][..image], out, &mut cache);
                }
            },
        );
        Ok(())
    }
}

pub fn roi_align(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (x, rois, idx) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let y = &ctx.outputs[0];
    if x.dtype != DType::F32 || rois.dtype != DType::F32 {
        return Err(format!(
            "RoiAlign is implemented for f32 images and ROIs, not {} and {}",
            x.dtype.name(),
            rois.dtype.name()
        ));
    }
    if !matches!(idx.dtype, DType::I64 | DType::I32) {
        return Err(format!(
            "RoiAlign batch_indices of {}, not int64",
            idx.dtype.name()
        ));
    }
    let [n, c, h, w] = x.shape[..] else {
        return Err(format!("RoiAlign of an input of shape {:?} (4-D)", x.shape));
    };
    let r = match rois.shape[..] {
        [r, 4] if idx.shape == [r] => r,
        _ => {
            return Err(format!(
                "RoiAlign rois of shape {:?} and batch_indices of shape {:?} (want [R, 4] and [R])",
                rois.shape, idx.shape
            ))
        }
    };
    let attr = |name: &str, d: i64| ctx.node.attr_int(name).unwrap_or(d);
    let (oh, ow, ratio) = (
        attr("output_height", 1),
        attr("output_width", 1),
        attr("sampling_ratio", 0),
    );
    if oh <= 0 || ow <= 0 || ratio < 0 {
        return Err(format!(
            "RoiAlign output_height {oh}, output_width {ow}, sampling_ratio {ratio} (sizes positive, ratio >= 0)"
        ));
    }
    let (oh, ow) = (oh as usize, ow as usize);
    if y.shape != [r, c, oh, ow] {
        return Err(format!(
            "RoiAlign gives {:?}, not {:?}",
            [r, c, oh, ow],
            y.shape
        ));
    }
    if r > 0 && c > 0 && (h == 0 || w == 0 || n == 0) {
        return Err(format!("RoiAlign over an empty image {:?}", x.shape));
    }
    let max = match ctx.node.attr_str("mode").unwrap_or("avg") {
        "avg" => false,
        "max" => true,
        m => return Err(format!("RoiAlign mode {m} (avg or max)")),
    };
    let default = if ctx.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half_pixel = match ctx
        .node
        .attr_str("coordinate_transformation_mode")
        .unwrap_or(default)
    {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => return Err(format!("RoiAlign coordinate_transformation_mode {m}")),
    };
    Ok(Box::new(RoiAlign {
        max,
        half_pixel,
        scale: ctx.node.attr_float("spatial_scale").unwrap_or(1.0),
        ratio: ratio as usize,
        n,
        c,
        h,
        w,
        oh,
        ow,
        rois: r,
    }))
}

struct AffineGrid {
    n: usize,
    /// Output spatial dims (2 or 3).
    dims: Vec<usize>,
    align: bool,
    f64_out: bool,
}

impl AffineGrid {
    /// The normalized coordinate of position `i` of a dim of `len`.
    fn coord(&self, i: usize, len: usize) -> f64 {
        if len <= 1 {
            return 0.0;
        }
        let i = i as f64;
        if self.align {
            -1.0 + i * (2.0 / (len - 1) as f64)
        } else {
            let step = 2.0 / len as f64;
            -1.0 + step / 2.0 + i * step
        }
    }
}

impl Kernel for AffineGrid {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let theta = io.input(0)?.floats()?;
        let r = self.dims.len();
        let points: usize = self.dims.iter().product();
        let mut grid = vec![0f64; self.n * points * r];
        // Per point: (x, y[, z], 1), x along the last dim.
        let mut base = vec![1f64; r + 1];
        let mut at = vec![0usize; r];
        for p in 0..points {
            let mut rest = p;
            for d in (0..r).rev() {
                at[d] = rest % self.dims[d];
                rest /= self.dims[d];
            }
            for d in 0..r {
                base[r - 1 - d] = self.coord(at[d], self.dims[d]);
            }
            for img in 0..self.n {
                let th = &theta[img * r * (r + 1)..][..r * (r + 1)];
                let out = &mut grid[(img * points + p) * r..][..r];
                for (k, o) in out.iter_mut().enumerate() {
                    *o = th[k * (r + 1)..][..r + 1]
                        .iter()
                        .zip(&base)
                        .map(|(a, b)| a * b)
                        .sum();
                }
            }
        }
        let y = &mut io.outputs[0];
        if self.f64_out {
            crate::tensor::cast_mut::<f64>(y.data).copy_from_slice(&grid);
        } else {
            let y = y.f32()?;
            for (o, v) in y.iter_mut().zip(grid) {
                *o = v as f32;
            }
        }
        Ok(())
    }
}

pub fn affine_grid(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let theta = ctx.input(0)?;
    let y = &ctx.outputs[0];
    if !matches!(theta.dtype, DType::F32 | DType::F64) || y.dtype != theta.dtype {
        return Err(format!(
            "AffineGrid on {} is not implemented",
            theta.dtype.name()
        ));
    }
    let r = match theta.shape[..] {
        [_, 2, 3] => 2,
        [_, 3, 4] => 3,
        _ => {
            return Err(format!(
                "AffineGrid theta of shape {:?} (want [N, 2, 3] or [N, 3, 4])",
                theta.shape
            ))
        }
    };
    let n = theta.shape[0];
    if y.shape.len() != r + 2 || y.shape[0] != n || y.shape[r + 1] != r {
        return Err(format!(
            "AffineGrid gives {:?} for theta of shape {:?} (want [N, H, W, 2] or [N, D, H, W, 3])",
            y.shape, theta.shape
        ));
    }
    Ok(Box::new(AffineGrid {
        n,
        dims: y.shape[1..=r].to_vec(),
        align: ctx.node.attr_int("align_corners").unwrap_or(0) != 0,
        f64_out: theta.dtype == DType::F64,
    }))
}
