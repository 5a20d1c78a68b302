//! Conv (1-D and 2-D, groups, strides, pads, dilations, auto_pad) as
//! im2col + GEMM. A 1×1 convolution with stride 1 and no padding is a plain
//! GEMM on the input; other shapes unfold one group of one image at a time
//! into the workspace (`K × OH·OW` floats, K = C/group · kh · kw), the
//! largest scratch a node needs, which the executor sizes once.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::matmul::sgemm;
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
    let ints = |name: &str, d: usize| -> Vec<usize> {
        node.attr_ints(name)
            .map(|v| v.iter().map(|&x| x as usize).collect())
            .unwrap_or_else(|| vec![d; sp])
    };
    let s = ints("strides", 1);
    let dl = ints("dilations", 1);
    let pads = node
        .attr_ints("pads")
        .map(|v| v.iter().map(|&x| x as usize).collect())
        .unwrap_or_else(|| vec![0; 2 * sp]);
    let in_sp = &x.shape[2..];
    let out_sp = &y.shape[2..];
    let mut begin = pads[..sp].to_vec();
    match node.attr_str("auto_pad").unwrap_or("NOTSET") {
        "SAME_UPPER" | "SAME_LOWER" => {
            let lower = node.attr_str("auto_pad") == Some("SAME_LOWER");
            for i in 0..sp {
                let need =
                    ((out_sp[i] - 1) * s[i] + (kernel[i] - 1) * dl[i] + 1).saturating_sub(in_sp[i]);
                begin[i] = if lower { need.div_ceil(2) } else { need / 2 };
            }
        }
        "VALID" => begin = vec![0; sp],
        _ => {}
    }
    let pick = |v: &[usize], one: usize| if sp == 1 { (one, v[0]) } else { (v[0], v[1]) };
    let (h, w) = pick(in_sp, 1);
    let (oh, ow) = pick(out_sp, 1);
    let (kh, kw) = pick(kernel, 1);
    let (sh, sw) = pick(&s, 1);
    let (dh, dw) = pick(&dl, 1);
    let (ph, pw) = pick(&begin, 0);
    Ok(Window {
        n: x.shape[0],
        c: x.shape[1],
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
    })
}

/// Unfolds channels `c0..c0+cg` of one image `x` ([C, H, W]) into `col`
/// ([cg·kh·kw, OH·OW]); padding reads as 0.
pub fn im2col(g: &Window, x: &[f32], c0: usize, cg: usize, col: &mut [f32]) {
    let ohw = g.oh * g.ow;
    for c in 0..cg {
        let plane = &x[(c0 + c) * g.h * g.w..][..g.h * g.w];
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let row = &mut col[((c * g.kh + ki) * g.kw + kj) * ohw..][..ohw];
                for oy in 0..g.oh {
                    let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
                    let dst = &mut row[oy * g.ow..][..g.ow];
                    if iy < 0 || iy as usize >= g.h {
                        dst.fill(0.0);
                        continue;
                    }
                    let src = &plane[iy as usize * g.w..][..g.w];
                    for (ox, d) in dst.iter_mut().enumerate() {
                        let ix = (ox * g.sw + kj * g.dw) as isize - g.pw as isize;
                        *d = if ix < 0 || ix as usize >= g.w {
                            0.0
                        } else {
                            src[ix as usize]
                        };
                    }
                }
            }
        }
    }
}

struct Conv {
    g: Window,
    m: usize,
    group: usize,
    bias: bool,
    direct: bool,
}

impl Kernel for Conv {
    fn workspace_bytes(&self) -> usize {
        if self.direct {
            0
        } else {
            let cg = self.g.c / self.group;
            cg * self.g.kh * self.g.kw * self.g.oh * self.g.ow * 4
        }
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
        let col: &mut [f32] = cast_mut(&mut io.workspace[..self.workspace_bytes()]);
        let y = io.outputs[0].f32()?;
        let (cg, mg) = (g.c / self.group, self.m / self.group);
        let k = cg * g.kh * g.kw;
        let ohw = g.oh * g.ow;
        for n in 0..g.n {
            let xi = &x[n * g.c * g.h * g.w..][..g.c * g.h * g.w];
            let yi = &mut y[n * self.m * ohw..][..self.m * ohw];
            match b {
                Some(b) => {
                    for (m, plane) in yi.chunks_mut(ohw).enumerate() {
                        plane.fill(b[m]);
                    }
                }
                None => yi.fill(0.0),
            }
            for gi in 0..self.group {
                let wg = &w[gi * mg * k..][..mg * k];
                let yg = &mut yi[gi * mg * ohw..][..mg * ohw];
                if self.direct {
                    let xg = &xi[gi * cg * ohw..][..cg * ohw];
                    sgemm(
                        mg,
                        k,
                        ohw,
                        1.0,
                        wg,
                        (k, 1),
                        xg,
                        (ohw, 1),
                        1.0,
                        yg,
                        ohw,
                        threads,
                    );
                } else {
                    im2col(g, xi, gi * cg, cg, col);
                    sgemm(
                        mg,
                        k,
                        ohw,
                        1.0,
                        wg,
                        (k, 1),
                        col,
                        (ohw, 1),
                        1.0,
                        yg,
                        ohw,
                        threads,
                    );
                }
            }
        }
        Ok(())
    }
}

pub fn conv(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let w = ctx.input(1)?;
    let (g, m, group, direct) = conv_layout(ctx, &w.shape)?;
    Ok(Box::new(Conv {
        g,
        m,
        group,
        bias: ctx.inputs.get(2).is_some_and(|b| b.is_some()),
        direct,
    }))
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
    if w.len() < 3 {
        return Err(format!("a conv weight of shape {w:?}"));
    }
    let g = window(ctx, &w[2..])?;
    let group = ctx.node.attr_int("group").unwrap_or(1) as usize;
    let m = w[0];
    if group == 0 || !g.c.is_multiple_of(group) || !m.is_multiple_of(group) || w[1] * group != g.c {
        return Err(format!("bad group {group} for {} channels", g.c));
    }
    let direct = g.kh == 1
        && g.kw == 1
        && g.sh == 1
        && g.sw == 1
        && g.ph == 0
        && g.pw == 0
        && g.oh == g.h
        && g.ow == g.w;
    Ok((g, m, group, direct))
}

/// ConvTranspose's geometry: input `[N, C, H, W]`, output `[N, M, OH, OW]`
/// (from shape inference), kernel `[C, M/group, kh, kw]`.
struct Transposed {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    m: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    /// Padding at the start of each output dim.
    ph: usize,
    pw: usize,
    group: usize,
    bias: bool,
}

impl Kernel for Transposed {
    fn workspace_bytes(&self) -> usize {
        (self.m / self.group) * self.kh * self.kw * self.h * self.w * 4
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
        let (cg, mg) = (self.c / self.group, self.m / self.group);
        let k = mg * self.kh * self.kw;
        let hw = self.h * self.w;
        let ohw = self.oh * self.ow;
        for n in 0..self.n {
            let xi = &x[n * self.c * hw..][..self.c * hw];
            let yi = &mut y[n * self.m * ohw..][..self.m * ohw];
            match b {
                Some(b) => {
                    for (m, plane) in yi.chunks_mut(ohw).enumerate() {
                        plane.fill(b[m]);
                    }
                }
                None => yi.fill(0.0),
            }
            for gi in 0..self.group {
                // col[k × hw] = Wgᵀ · Xg, Wg = w[gi] as [cg × k].
                let wg = &w[gi * cg * k..][..cg * k];
                let xg = &xi[gi * cg * hw..][..cg * hw];
                sgemm(
                    k,
                    cg,
                    hw,
                    1.0,
                    wg,
                    (1, k),
                    xg,
                    (hw, 1),
                    0.0,
                    col,
                    hw,
                    threads,
                );
                // col2im: scatter-add each column into the output.
                let yg = &mut yi[gi * mg * ohw..][..mg * ohw];
                for (r, row) in col.chunks(hw).enumerate().take(k) {
                    let (m, ki, kj) = (
                        r / (self.kh * self.kw),
                        (r / self.kw) % self.kh,
                        r % self.kw,
                    );
                    let plane = &mut yg[m * ohw..][..ohw];
                    for iy in 0..self.h {
                        let oy = (iy * self.sh + ki * self.dh) as isize - self.ph as isize;
                        if oy < 0 || oy as usize >= self.oh {
                            continue;
                        }
                        let dst = &mut plane[oy as usize * self.ow..][..self.ow];
                        for (ix, &v) in row[iy * self.w..][..self.w].iter().enumerate() {
                            let ox = (ix * self.sw + kj * self.dw) as isize - self.pw as isize;
                            if ox >= 0 && (ox as usize) < self.ow {
                                dst[ox as usize] += v;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// ConvTranspose (1-D and 2-D, groups, strides, dilations, pads,
/// output_padding, output_shape, auto_pad) as GEMM + col2im: per image and
/// group, `Wᵀ · X` into the workspace (`M/group · kh · kw × H·W` floats),
/// then scatter-added into the output.
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
    if !(1..=2).contains(&sp) || w.shape.len() != sp + 2 || y.shape.len() != sp + 2 {
        return Err(format!(
            "{sp}-D ConvTranspose is not implemented (1-D and 2-D are)"
        ));
    }
    let node = ctx.node;
    let ints = |name: &str, d: i64| -> Vec<i64> {
        node.attr_ints(name)
            .map(|v| v.to_vec())
            .unwrap_or_else(|| vec![d; sp])
    };
    let (s, dl, adj) = (
        ints("strides", 1),
        ints("dilations", 1),
        ints("output_padding", 0),
    );
    let kernel: Vec<i64> = w.shape[2..].iter().map(|&k| k as i64).collect();
    let pads = node
        .attr_ints("pads")
        .map(|v| v.to_vec())
        .unwrap_or_else(|| vec![0; 2 * sp]);
    let auto = node.attr_str("auto_pad").unwrap_or("NOTSET");
    let mut begin = Vec::new();
    for i in 0..sp {
        let (inn, out) = (x.shape[2 + i] as i64, y.shape[2 + i] as i64);
        let full = s[i] * (inn - 1) + adj[i] + (kernel[i] - 1) * dl[i] + 1;
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
    let group = node.attr_int("group").unwrap_or(1).max(1) as usize;
    let c = x.shape[1];
    if w.shape[0] != c || c % group != 0 {
        return Err(format!("bad group {group} for {c} channels"));
    }
    let m = w.shape[1] * group;
    if y.shape[1] != m {
        return Err(format!("output channels {} != {m}", y.shape[1]));
    }
    let pick = |v: &[usize], one: usize| if sp == 1 { (one, v[0]) } else { (v[0], v[1]) };
    let u = |v: &[i64]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
    let (h, wd) = pick(&x.shape[2..], 1);
    let (oh, ow) = pick(&y.shape[2..], 1);
    let (kh, kw) = pick(&w.shape[2..], 1);
    let (sh, sw) = pick(&u(&s), 1);
    let (dh, dw) = pick(&u(&dl), 1);
    let (ph, pw) = pick(&begin, 0);
    Ok(Box::new(Transposed {
        n: x.shape[0],
        c,
        h,
        w: wd,
        m,
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
        group,
        bias: ctx.inputs.get(2).is_some_and(|b| b.is_some()),
    }))
}
