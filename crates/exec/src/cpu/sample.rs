//! Sampling at computed coordinates: GridSample (opset 16: 4-D input,
//! `bilinear` / `nearest` / `bicubic`; opset 20 on: any number of spatial
//! dims, `linear` / `nearest` / `cubic`), with `padding_mode` zeros,
//! border or reflection and `align_corners`, as the ONNX reference
//! computes it (coordinates in f32; a coordinate outside the image is
//! clamped or reflected first, then each tap's index is padded again;
//! nearest rounds half to even; cubic is Keys' with a = -0.75).

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
