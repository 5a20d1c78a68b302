//! Normalizations: LayerNormalization (graphopt's own fusion target: the
//! mean, variance, scale and shift of the tail dims from `axis`),
//! BatchNormalization in inference mode, InstanceNormalization,
//! RMSNormalization, GroupNormalization (opsets 18 and 21) and LRN.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::par;
use crate::cpu::reduce::{add, fold_row};
use crate::tensor::cast_mut;
use graphopt_ir::DType;

struct LayerNorm {
    rows: usize,
    cols: usize,
    eps: f32,
}

impl Kernel for LayerNorm {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let scale = io.input(1)?.f32()?;
        let bias = match io.inputs.get(2).copied().flatten() {
            Some(b) => Some(b.f32()?),
            None => None,
        };
        let (rows, cols) = (self.rows, self.cols);
        let threads = io.threads;
        // Rows split across threads; each row's mean and variance fold in
        // `fold_row`'s fixed lanes, so its bits do not depend on the split.
        let mut stats = vec![(0f32, 0f32); rows];
        let min_rows = par::MIN_ELEMS.div_ceil(cols.max(1));
        par::for_chunks_mut(threads, &mut stats, 1, min_rows, |first, part| {
            for (j, st) in part.iter_mut().enumerate() {
                let xr = &x[(first + j) * cols..][..cols];
                let mean = fold_row(0.0, xr, add, add) / cols as f32;
                let sq = |a: f32, v: f32| a + (v - mean) * (v - mean);
                let var = fold_row(0.0, xr, sq, add) / cols as f32;
                *st = (mean, 1.0 / (var + self.eps).sqrt());
            }
        });
        // Scale and bias as whole rows, so the last pass is one plain loop.
        let full = |v: &[f32]| -> Vec<f32> {
            if v.len() == 1 {
                vec![v[0]; cols]
            } else {
                v[..cols].to_vec()
            }
        };
        let (scale, bias) = (full(scale), bias.map_or_else(|| vec![0.0; cols], full));
        let y = io.outputs[0].f32()?;
        par::for_chunks_mut(
            threads,
            &mut y[..rows * cols],
            cols.max(1),
            min_rows,
            |first, part| {
                for (j, yr) in part.chunks_mut(cols.max(1)).enumerate() {
                    let r = first + j;
                    let (mean, inv) = stats[r];
                    let xr = &x[r * cols..][..cols];
                    for c in 0..yr.len() {
                        yr[c] = (xr[c] - mean) * inv * scale[c] + bias[c];
                    }
                }
            },
        );
        for (k, out) in io.outputs.iter_mut().enumerate().skip(1) {
            let o: &mut [f32] = cast_mut(out.data);
            for (r, v) in o.iter_mut().enumerate() {
                *v = if k == 1 { stats[r].0 } else { stats[r].1 };
            }
        }
        Ok(())
    }
}

pub fn layer_norm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 {
        return Err(format!(
            "LayerNormalization on {} is not implemented",
            x.dtype.name()
        ));
    }
    let r = x.shape.len() as i64;
    let mut axis = ctx.node.attr_int("axis").unwrap_or(-1);
    if axis < 0 {
        axis += r;
    }
    let axis = axis.clamp(0, r) as usize;
    let cols: usize = x.shape[axis..].iter().product();
    let s = ctx.input(1)?;
    let sn: usize = s.shape.iter().product();
    if sn != cols && sn != 1 {
        return Err("a scale that is not the normalized shape is not implemented".into());
    }
    if let Some(Some(b)) = ctx.inputs.get(2) {
        let bn: usize = b.shape.iter().product();
        if bn != cols && bn != 1 {
            return Err("a bias that is not the normalized shape is not implemented".into());
        }
    }
    Ok(Box::new(LayerNorm {
        rows: x.shape[..axis].iter().product(),
        cols,
        eps: ctx.node.attr_float("epsilon").unwrap_or(1e-5),
    }))
}

struct BatchNorm {
    n: usize,
    c: usize,
    plane: usize,
    eps: f32,
}

impl Kernel for BatchNorm {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let (s, b, m, v) = (
            io.input(1)?.f32()?,
            io.input(2)?.f32()?,
            io.input(3)?.f32()?,
            io.input(4)?.f32()?,
        );
        let y = io.outputs[0].f32()?;
        for n in 0..self.n {
            for c in 0..self.c {
                let k = s[c] / (v[c] + self.eps).sqrt();
                let at = (n * self.c + c) * self.plane;
                for i in at..at + self.plane {
                    y[i] = (x[i] - m[c]) * k + b[c];
                }
            }
        }
        Ok(())
    }
}

pub fn batch_norm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 || x.shape.len() < 2 {
        return Err("BatchNormalization is implemented for f32 [N, C, ...] only".into());
    }
    if ctx.outputs.len() > 1 || ctx.node.attr_int("training_mode") == Some(1) {
        return Err("training mode is not implemented".into());
    }
    Ok(Box::new(BatchNorm {
        n: x.shape[0],
        c: x.shape[1],
        plane: x.shape[2..].iter().product(),
        eps: ctx.node.attr_float("epsilon").unwrap_or(1e-5),
    }))
}

/// InstanceNormalization: per image and channel, the spatial mean and
/// variance, then `scale[c]` and `bias[c]`.
struct InstanceNorm {
    nc: usize,
    c: usize,
    plane: usize,
    eps: f32,
}

impl Kernel for InstanceNorm {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let (scale, bias) = (io.input(1)?.f32()?, io.input(2)?.f32()?);
        let y = io.outputs[0].f32()?;
        let p = self.plane;
        for i in 0..self.nc {
            let xr = &x[i * p..][..p];
            let mean = xr.iter().sum::<f32>() / p as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / p as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            let c = i % self.c;
            for (o, &v) in y[i * p..][..p].iter_mut().zip(xr) {
                *o = (v - mean) * inv * scale[c] + bias[c];
            }
        }
        Ok(())
    }
}

pub fn instance_norm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 || x.shape.len() < 2 {
        return Err("InstanceNormalization is implemented for f32 [N, C, ...] only".into());
    }
    Ok(Box::new(InstanceNorm {
        nc: x.shape[0] * x.shape[1],
        c: x.shape[1],
        plane: x.shape[2..].iter().product(),
        eps: ctx.node.attr_float("epsilon").unwrap_or(1e-5),
    }))
}

/// RMSNormalization: `x / sqrt(mean(x²) + ε) · scale` over the tail dims
/// from `axis` (scale of the normalized shape, or one element).
struct RmsNorm {
    rows: usize,
    cols: usize,
    eps: f32,
}

impl Kernel for RmsNorm {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let scale = io.input(1)?.f32()?;
        let y = io.outputs[0].f32()?;
        let cols = self.cols;
        for r in 0..self.rows {
            let xr = &x[r * cols..][..cols];
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / cols as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            for (c, (o, &v)) in y[r * cols..][..cols].iter_mut().zip(xr).enumerate() {
                *o = v * inv * scale[if scale.len() == 1 { 0 } else { c }];
            }
        }
        Ok(())
    }
}

pub fn rms_norm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 {
        return Err(format!(
            "RMSNormalization on {} is not implemented",
            x.dtype.name()
        ));
    }
    let r = x.shape.len() as i64;
    let a = ctx.node.attr_int("axis").unwrap_or(-1);
    if a < -r || a >= r.max(1) {
        return Err(format!("axis {a} is out of range for rank {r}"));
    }
    let axis = (if a < 0 { a + r } else { a }) as usize;
    let cols: usize = x.shape[axis..].iter().product();
    let sn: usize = ctx.input(1)?.shape.iter().product();
    if sn != cols && sn != 1 {
        return Err("a scale that is not the normalized shape is not implemented".into());
    }
    Ok(Box::new(RmsNorm {
        rows: x.shape[..axis].iter().product(),
        cols,
        eps: ctx.node.attr_float("epsilon").unwrap_or(1e-5),
    }))
}

/// LRN over `[N, C, ...]`: `y = x / (bias + alpha / size · Σ x²)^beta`,
/// the sum over channels `c - ⌊(size-1)/2⌋ ..= c + ⌈(size-1)/2⌉` clipped to
/// `0..C` (the ONNX formula), at every spatial position.
struct Lrn {
    n: usize,
    c: usize,
    plane: usize,
    /// Channels before and after `c` in its window.
    before: usize,
    after: usize,
    alpha_over_size: f32,
    beta: f32,
    bias: f32,
}

impl Kernel for Lrn {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let y = io.outputs[0].f32()?;
        let (c_n, p) = (self.c, self.plane);
        let len = self.n * c_n * p;
        let min = par::MIN_ELEMS.div_ceil((p * (self.before + self.after + 1)).max(1));
        // Planes (one image's channel) split across threads; each plane's
        // sums go channel by channel of its window in a fixed order.
        par::for_chunks_mut(io.threads, &mut y[..len], p.max(1), min, |first, part| {
            let mut acc = vec![0f32; p];
            for (j, yp) in part.chunks_mut(p.max(1)).enumerate() {
                let (img, c) = ((first + j) / c_n, (first + j) % c_n);
                let lo = c.saturating_sub(self.before);
                let hi = (c + self.after).min(c_n - 1);
                acc.fill(0.0);
                for k in lo..=hi {
                    let xk = &x[(img * c_n + k) * p..][..p];
                    for (a, &v) in acc.iter_mut().zip(xk) {
                        *a += v * v;
                    }
                }
                let xc = &x[(img * c_n + c) * p..][..p];
                for ((o, &v), &s) in yp.iter_mut().zip(xc).zip(&acc) {
                    *o = v / (self.bias + self.alpha_over_size * s).powf(self.beta);
                }
            }
        });
        Ok(())
    }
}

pub fn lrn(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 || x.shape.len() < 2 {
        return Err("LRN is implemented for f32 [N, C, ...] only".into());
    }
    let size = ctx
        .node
        .attr_int("size")
        .ok_or("LRN needs its size attribute")?;
    if size < 1 {
        return Err(format!("LRN size {size} is below 1"));
    }
    let size = size as usize;
    Ok(Box::new(Lrn {
        n: x.shape[0],
        c: x.shape[1],
        plane: x.shape[2..].iter().product(),
        before: (size - 1) / 2,
        after: size / 2,
        alpha_over_size: ctx.node.attr_float("alpha").unwrap_or(1e-4) / size as f32,
        beta: ctx.node.attr_float("beta").unwrap_or(0.75),
        bias: ctx.node.attr_float("bias").unwrap_or(1.0),
    }))
}

/// GroupNormalization over `[N, C, ...]`: per image and group of `C / G`
/// channels, the mean and variance of the group's elements (in f32, which
/// is `stash_type` 1, the default), then a scale and bias per group
/// (opsets 18 to 20) or per channel (opset 21 on).
struct GroupNorm {
    n: usize,
    c: usize,
    groups: usize,
    plane: usize,
    per_channel: bool,
    eps: f32,
}

impl Kernel for GroupNorm {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let (scale, bias) = (io.input(1)?.f32()?, io.input(2)?.f32()?);
        let y = io.outputs[0].f32()?;
        let cg = self.c / self.groups;
        let (p, block) = (self.plane, cg * self.plane);
        let len = self.n * self.c * p;
        let min = par::MIN_ELEMS.div_ceil(block.max(1));
        // Whole groups split across threads; each group's mean and
        // variance fold in `fold_row`'s fixed lanes.
        par::for_chunks_mut(
            io.threads,
            &mut y[..len],
            block.max(1),
            min,
            |first, part| {
                for (j, yb) in part.chunks_mut(block.max(1)).enumerate() {
                    let b = first + j;
                    let g = b % self.groups;
                    let xb = &x[b * block..][..block];
                    let mean = fold_row(0.0, xb, add, add) / block as f32;
                    let sq = |a: f32, v: f32| a + (v - mean) * (v - mean);
                    let var = fold_row(0.0, xb, sq, add) / block as f32;
                    let inv = 1.0 / (var + self.eps).sqrt();
                    for k in 0..cg {
                        let at = if self.per_channel { g * cg + k } else { g };
                        let (s, t) = (scale[at], bias[at]);
                        let xs = &xb[k * p..][..p];
                        for (o, &v) in yb[k * p..][..p].iter_mut().zip(xs) {
                            *o = (v - mean) * inv * s + t;
                        }
                    }
                }
            },
        );
        Ok(())
    }
}

pub fn group_norm(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 || x.shape.len() < 2 {
        return Err("GroupNormalization is implemented for f32 [N, C, ...] only".into());
    }
    let c = x.shape[1];
    let g = ctx
        .node
        .attr_int("num_groups")
        .ok_or("GroupNormalization needs its num_groups attribute")?;
    if g < 1 || c % g as usize != 0 {
        return Err(format!("num_groups {g} does not divide the {c} channels"));
    }
    let g = g as usize;
    match ctx.node.attr_int("stash_type").unwrap_or(1) {
        1 => {}
        s => return Err(format!("stash_type {s} is not implemented (1, float, is)")),
    }
    // Opset 18 (deprecated in 21) scales and shifts per group, 21 per channel.
    let per_channel = ctx.opset >= 21;
    let want = if per_channel { c } else { g };
    for (i, what) in [(1, "scale"), (2, "bias")] {
        let t = ctx.input(i)?;
        if t.dtype != DType::F32 || t.shape != [want] {
            return Err(format!(
                "the {what} must be float[{want}] (one per {} at opset {}), got {}{:?}",
                if per_channel { "channel" } else { "group" },
                ctx.opset,
                t.dtype.name(),
                t.shape
            ));
        }
    }
    Ok(Box::new(GroupNorm {
        n: x.shape[0],
        c,
        groups: g,
        plane: x.shape[2..].iter().product(),
        per_channel,
        eps: ctx.node.attr_float("epsilon").unwrap_or(1e-5),
    }))
}
