//! Resize (opsets 10 to 19) and the deprecated Upsample (7, 9) on f32 and
//! f64: nearest (round_prefer_floor, round_prefer_ceil, floor, ceil),
//! n-linear and cubic (cubic_coeff_a, exclude_outside) on any resized axes,
//! every coordinate_transformation_mode (tf_crop_and_resize with roi and
//! extrapolation_value), opset 18's `axes` and `keep_aspect_ratio_policy`.
//! `antialias` (opset 18: linear and cubic filters widened by 1 / scale
//! when downsampling, as the ONNX reference).
//!
//! Scales, sizes and roi are read at run time; the output shape comes from
//! shape inference and must agree with them. The interpolation is separable:
//! one pass per resized axis, each output position a few (index, weight)
//! taps, computed in f64 and rounded once at the end.
//!
//! Resize before opset 11 and Upsample take asymmetric coordinates, and
//! their nearest rounds as onnxruntime's: down when upsampling an axis, up
//! when downsampling it.
//!
//! The resized length in the coordinate formulas is `scale * input` as in
//! the ONNX reference (and its backend tests), fractional when scales are
//! given and do not divide evenly; onnxruntime uses the integer output
//! length there, so align_corners, pytorch_half_pixel and
//! tf_crop_and_resize with such scales differ from it (align_corners on
//! 9 -> 4 with scale 0.5: by up to 4 on random data). With sizes (what
//! PyTorch exports) both agree. keep_aspect_ratio_policy's one scale is
//! the coordinates' scale on every resized axis, as both.

use crate::backend::{In, Kernel, KernelIo, NodeCtx};
use crate::tensor::{cast_mut, numel};
use graphopt_ir::{AttrValue, DType};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Round {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
    /// Resize-10 / Upsample (onnxruntime): truncate when upsampling, ceil
    /// when downsampling.
    Simple,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Ctm {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
    TfCropAndResize,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Policy {
    Stretch,
    NotLarger,
    NotSmaller,
}

struct Resize {
    f64: bool,
    shape: Vec<usize>,
    mode: Mode,
    round: Round,
    ctm: Ctm,
    cubic_a: f64,
    antialias: bool,
    exclude_outside: bool,
    extrapolation: f64,
    policy: Policy,
    /// Opset 18's `axes`, normalized (`None`: all axes).
    axes: Option<Vec<usize>>,
    /// Input slots of roi, scales and sizes in this form of the op.
    roi_in: Option<usize>,
    scales_in: Option<usize>,
    sizes_in: Option<usize>,
    /// Upsample-7's `scales` attribute.
    attr_scales: Option<Vec<f64>>,
}

/// An optional input, absent when omitted or empty.
fn present<'a>(io: &KernelIo<'a>, k: Option<usize>) -> Option<In<'a>> {
    io.inputs
        .get(k?)
        .copied()
        .flatten()
        .filter(|t| numel(t.shape) > 0)
}

/// The (index, weight) taps of one output position, or `None` for the
/// extrapolation value.
type Taps = Option<Vec<(usize, f64)>>;

/// Per axis: scales, output lengths, roi (start, end).
type Geometry = (Vec<f64>, Vec<usize>, Vec<(f64, f64)>);

impl Resize {
    /// The input coordinate of output position `j` along an axis. As the
    /// ONNX reference, the resized length in the formulas is `scale * li`
    /// (fractional when scales are given), except half_pixel_symmetric's
    /// adjustment, which uses the integer `lo`.
    fn coord(&self, j: usize, scale: f64, li: usize, lo: usize, roi: (f64, f64)) -> f64 {
        let x = j as f64;
        let fi = li as f64;
        let fo = scale * fi;
        match self.ctm {
            Ctm::HalfPixel => (x + 0.5) / scale - 0.5,
            Ctm::HalfPixelSymmetric => {
                let adj = lo as f64 / fo;
                let off = fi / 2.0 * (1.0 - adj);
                off + (x + 0.5) / scale - 0.5
            }
            Ctm::PytorchHalfPixel => {
                if fo > 1.0 {
                    (x + 0.5) / scale - 0.5
                } else {
                    0.0
                }
            }
            Ctm::AlignCorners => {
                if fo == 1.0 {
                    0.0
                } else {
                    x * (fi - 1.0) / (fo - 1.0)
                }
            }
            Ctm::Asymmetric => x / scale,
            Ctm::TfHalfPixelForNn => (x + 0.5) / scale,
            Ctm::TfCropAndResize => {
                let (s, e) = roi;
                if fo > 1.0 {
                    s * (fi - 1.0) + x * (e - s) * (fi - 1.0) / (fo - 1.0)
                } else {
                    0.5 * (s + e) * (fi - 1.0)
                }
            }
        }
    }

    fn taps(&self, xo: f64, scale: f64, li: usize) -> Taps {
        let last = li as i64 - 1;
        if self.ctm == Ctm::TfCropAndResize && (xo < 0.0 || xo > last as f64) {
            return None;
        }
        let clamp = |i: i64| i.clamp(0, last) as usize;
        let x0 = xo.floor();
        let r = xo - x0;
        let x0 = x0 as i64;
        if self.antialias && self.mode != Mode::Nearest {
            return Some(self.antialiased(x0, r, scale, li));
        }
        Some(match self.mode {
            Mode::Nearest => {
                let i = match self.round {
                    Round::PreferFloor if r == 0.5 => x0,
                    Round::PreferCeil if r == 0.5 => x0 + 1,
                    Round::PreferFloor | Round::PreferCeil => xo.round() as i64,
                    Round::Floor => x0,
                    Round::Ceil => xo.ceil() as i64,
                    Round::Simple if scale < 1.0 => xo.ceil() as i64,
                    Round::Simple => xo.trunc() as i64,
                };
                vec![(clamp(i), 1.0)]
            }
            Mode::Linear => self.weigh(x0, &[1.0 - r, r], li),
            Mode::Cubic => {
                let a = self.cubic_a;
                let (p, q) = (r + 1.0, 2.0 - r);
                let s = 1.0 - r;
                let c = [
                    ((a * p - 5.0 * a) * p + 8.0 * a) * p - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
                    ((a * q - 5.0 * a) * q + 8.0 * a) * q - 4.0 * a,
                ];
                self.weigh(x0 - 1, &c, li)
            }
        })
    }

    /// The ONNX reference's antialiased linear / cubic taps: the kernel
    /// stretched by 1 / scale (scale capped at 1), at offsets around
    /// `x0 + r` (an integer coordinate counts as `x0 - 1` with `r` = 1),
    /// normalized to sum 1.
    fn antialiased(&self, x0: i64, r: f64, scale: f64, li: usize) -> Vec<(usize, f64)> {
        let (x0, r) = if r == 0.0 { (x0 - 1, 1.0) } else { (x0, r) };
        let s = scale.min(1.0);
        let a = self.cubic_a;
        let (start, end) = if self.mode == Mode::Linear {
            let st = (-1.0 / s).floor() as i64 + 1;
            (st, 2 - st)
        } else {
            let st = (-2.0 / s).floor() as i64 + 1;
            (st, 2 - st)
        };
        let mut c: Vec<f64> = (start..end)
            .map(|i| {
                let x = ((i as f64 - r) * s).abs();
                if self.mode == Mode::Linear {
                    (1.0 - x).clamp(0.0, 1.0)
                } else if x <= 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
                } else {
                    0.0
                }
            })
            .collect();
        let sum: f64 = c.iter().sum();
        if sum != 0.0 {
            for w in &mut c {
                *w /= sum;
            }
        }
        self.weigh(x0 + start, &c, li)
    }

    /// Taps at `first`, `first + 1`, ... with weights `c`: indices clamped
    /// to the axis (edge padding), or with exclude_outside the outside ones
    /// dropped and the rest renormalized.
    fn weigh(&self, first: i64, c: &[f64], li: usize) -> Vec<(usize, f64)> {
        let last = li as i64 - 1;
        let mut t: Vec<(usize, f64)> = Vec::with_capacity(c.len());
        for (k, &w) in c.iter().enumerate() {
            let i = first + k as i64;
            if self.exclude_outside && (i < 0 || i > last) {
                continue;
            }
            t.push((i.clamp(0, last) as usize, w));
        }
        if self.exclude_outside {
            let s: f64 = t.iter().map(|p| p.1).sum();
            if s != 0.0 {
                for p in &mut t {
                    p.1 /= s;
                }
            }
        }
        t
    }

    /// Per axis: the scale, the output length and the roi (start, end).
    fn plan(&self, io: &KernelIo) -> Result<Geometry, String> {
        let r = self.shape.len();
        let axes: Vec<usize> = self.axes.clone().unwrap_or_else(|| (0..r).collect());
        let mut scale = vec![1.0f64; r];
        let mut out = self.shape.clone();
        if let Some(sz) = present(io, self.sizes_in) {
            let s = sz.ints()?;
            if s.len() != axes.len() {
                return Err(format!(
                    "sizes has {} values for {} axes",
                    s.len(),
                    axes.len()
                ));
            }
            if s.iter().any(|&v| v < 0) {
                return Err(format!("negative sizes {s:?}"));
            }
            match self.policy {
                Policy::Stretch => {
                    for (&a, &v) in axes.iter().zip(&s) {
                        out[a] = v as usize;
                        scale[a] = v as f64 / self.shape[a] as f64;
                    }
                }
                p => {
                    let ratios = axes
                        .iter()
                        .zip(&s)
                        .map(|(&a, &v)| v as f64 / self.shape[a] as f64);
                    let k = if p == Policy::NotLarger {
                        ratios.fold(f64::INFINITY, f64::min)
                    } else {
                        ratios.fold(f64::NEG_INFINITY, f64::max)
                    };
                    // The one scale is the coordinates' scale on every axis.
                    for &a in &axes {
                        out[a] = (k * self.shape[a] as f64 + 0.5).floor() as usize;
                        scale[a] = k;
                    }
                }
            }
        } else {
            let s = match present(io, self.scales_in) {
                Some(t) => t.floats()?,
                None => self
                    .attr_scales
                    .clone()
                    .ok_or("neither scales nor sizes is given")?,
            };
            if s.len() != axes.len() {
                return Err(format!(
                    "scales has {} values for {} axes",
                    s.len(),
                    axes.len()
                ));
            }
            for (&a, &v) in axes.iter().zip(&s) {
                if !v.is_finite() || v <= 0.0 {
                    return Err(format!("scale {v} is not positive"));
                }
                scale[a] = v;
                out[a] = (self.shape[a] as f64 * v).floor() as usize;
            }
        }
        let mut roi = vec![(0.0, 1.0); r];
        if self.ctm == Ctm::TfCropAndResize {
            let v = present(io, self.roi_in)
                .ok_or("tf_crop_and_resize needs roi")?
                .floats()?;
            if v.len() == 2 * r {
                for (a, p) in roi.iter_mut().enumerate() {
                    *p = (v[a], v[r + a]);
                }
            } else if v.len() == 2 * axes.len() {
                let n = axes.len();
                for (i, &a) in axes.iter().enumerate() {
                    roi[a] = (v[i], v[n + i]);
                }
            } else {
                return Err(format!("roi has {} values for rank {r}", v.len()));
            }
        }
        Ok((scale, out, roi))
    }
}

/// One pass along `axis`: `src` of shape `cur` to `cur` with `cur[axis] = lo`.
fn pass(src: &[f64], cur: &[usize], axis: usize, lo: usize, taps: &[Taps], e: f64) -> Vec<f64> {
    let outer: usize = cur[..axis].iter().product();
    let li = cur[axis];
    let inner: usize = cur[axis + 1..].iter().product();
    let mut dst = vec![0.0f64; outer * lo * inner];
    for o in 0..outer {
        let s = &src[o * li * inner..][..li * inner];
        for (j, t) in taps.iter().enumerate() {
            let d = &mut dst[(o * lo + j) * inner..][..inner];
            match t {
                None => d.fill(e),
                Some(t) => {
                    for &(i, w) in t {
                        let row = &s[i * inner..][..inner];
                        for (y, &x) in d.iter_mut().zip(row) {
                            *y += w * x;
                        }
                    }
                }
            }
        }
    }
    dst
}

impl Kernel for Resize {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let (scale, out, roi) = self.plan(io)?;
        if out != io.outputs[0].shape {
            return Err(format!(
                "scales/sizes give output shape {out:?}, planned {:?}",
                io.outputs[0].shape
            ));
        }
        let x = io.input(0)?;
        let mut cur = self.shape.clone();
        let mut v: Vec<f64> = x.floats()?;
        if numel(&out) > 0 && numel(&cur) == 0 {
            return Err("cannot resize an empty tensor to a non-empty one".into());
        }
        for a in 0..cur.len() {
            let (li, lo) = (cur[a], out[a]);
            if li == lo && scale[a] == 1.0 && self.ctm != Ctm::TfCropAndResize {
                continue;
            }
            if numel(&cur) == 0 {
                cur[a] = lo;
                continue;
            }
            let taps: Vec<Taps> = (0..lo)
                .map(|j| self.taps(self.coord(j, scale[a], li, lo, roi[a]), scale[a], li))
                .collect();
            v = pass(&v, &cur, a, lo, &taps, self.extrapolation);
            cur[a] = lo;
        }
        let o = &mut io.outputs[0];
        if self.f64 {
            cast_mut::<f64>(o.data).copy_from_slice(&v);
        } else {
            for (y, &x) in cast_mut::<f32>(o.data).iter_mut().zip(&v) {
                *y = x as f32;
            }
        }
        Ok(())
    }
}

pub fn resize(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let f64 = match x.dtype {
        DType::F32 => false,
        DType::F64 => true,
        d => return Err(format!("Resize on {} is not implemented", d.name())),
    };
    let n = ctx.node;
    let upsample = n.op_type == "Upsample";
    let old = upsample || ctx.opset < 11;
    let mode = match n.attr_str("mode").unwrap_or("nearest") {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" => Mode::Linear,
        "cubic" if !upsample => Mode::Cubic,
        m => return Err(format!("mode '{m}' is not supported")),
    };
    let round = if old {
        Round::Simple
    } else {
        match n.attr_str("nearest_mode").unwrap_or("round_prefer_floor") {
            "round_prefer_floor" => Round::PreferFloor,
            "round_prefer_ceil" => Round::PreferCeil,
            "floor" => Round::Floor,
            "ceil" => Round::Ceil,
            m => return Err(format!("nearest_mode '{m}' is not supported")),
        }
    };
    let ctm = if old {
        Ctm::Asymmetric
    } else {
        match n
            .attr_str("coordinate_transformation_mode")
            .unwrap_or("half_pixel")
        {
            "half_pixel" => Ctm::HalfPixel,
            "half_pixel_symmetric" => Ctm::HalfPixelSymmetric,
            "pytorch_half_pixel" => Ctm::PytorchHalfPixel,
            "align_corners" => Ctm::AlignCorners,
            "asymmetric" => Ctm::Asymmetric,
            "tf_half_pixel_for_nn" => Ctm::TfHalfPixelForNn,
            "tf_crop_and_resize" => Ctm::TfCropAndResize,
            m => {
                return Err(format!(
                    "coordinate_transformation_mode '{m}' is not supported"
                ))
            }
        }
    };
    let policy = match n.attr_str("keep_aspect_ratio_policy").unwrap_or("stretch") {
        "stretch" => Policy::Stretch,
        "not_larger" => Policy::NotLarger,
        "not_smaller" => Policy::NotSmaller,
        p => return Err(format!("keep_aspect_ratio_policy '{p}' is not supported")),
    };
    let r = x.shape.len() as i64;
    let axes = match n.attr_ints("axes") {
        Some(a) => {
            let mut v = Vec::with_capacity(a.len());
            for &ax in a {
                let ax = if ax < 0 { ax + r } else { ax };
                if !(0..r).contains(&ax) || v.contains(&(ax as usize)) {
                    return Err(format!("bad axes {a:?} for rank {r}"));
                }
                v.push(ax as usize);
            }
            Some(v)
        }
        None => None,
    };
    let (roi_in, scales_in, sizes_in) = if old {
        (None, Some(1), None)
    } else {
        (Some(1), Some(2), Some(3))
    };
    let attr_scales = match n.attr("scales").map(|a| &a.value) {
        Some(AttrValue::Floats(s)) if upsample => Some(s.iter().map(|&v| v as f64).collect()),
        _ => None,
    };
    Ok(Box::new(Resize {
        f64,
        shape: x.shape.clone(),
        mode,
        round,
        ctm,
        cubic_a: n.attr_float("cubic_coeff_a").unwrap_or(-0.75) as f64,
        exclude_outside: n.attr_int("exclude_outside").unwrap_or(0) != 0,
        antialias: n.attr_int("antialias").unwrap_or(0) != 0,
        extrapolation: n.attr_float("extrapolation_value").unwrap_or(0.0) as f64,
        policy,
        axes,
        roi_in,
        scales_in,
        sizes_in,
        attr_scales,
    }))
}
