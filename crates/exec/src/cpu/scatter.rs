//! ScatterElements, ScatterND (reduction none / add / mul / max / min),
//! GatherElements, OneHot and MaxUnpool: the forms the gradients of Gather, GatherND
//! and MaxPool, and the cross-entropy loss, take. The output starts as a
//! copy of `data`, or is `data` already when the plan puts it in place
//! (the update rule of `graphopt_plan::inplace_rule`: `data` dies here and
//! indices and updates lie elsewhere, so the kernel only writes the
//! updated positions); with no reduction
//! the kernels move bytes (any element type), reductions are on f32, i64
//! and i32. Indices are checked against their dim (negative ones count
//! from the end); a bad one is an error naming it.
//!
//! MaxUnpool puts each element of `X` at its flat MaxPool index into a
//! zero tensor of the unpooled shape (`(in - 1)·stride - pads + kernel`
//! per spatial dim; a later duplicate index wins), which an `output_shape`
//! input may enlarge: the unpooled tensor then sits at the start of each
//! dim, as the ONNX reference and its node tests have it. Bytes move, so
//! every float type runs as it is.

use crate::backend::{Data, Kernel, KernelIo, NodeCtx};
use crate::tensor::{cast, cast_mut, elem_size, strides};
use graphopt_ir::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduction(ctx: &NodeCtx) -> Result<Reduction, String> {
    Ok(match ctx.node.attr_str("reduction").unwrap_or("none") {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        r => return Err(format!("reduction '{r}' is not implemented")),
    })
}

fn check_dtype(ctx: &NodeCtx, r: Reduction) -> Result<usize, String> {
    let d = ctx.input(0)?.dtype;
    if r != Reduction::None && !matches!(d, DType::F32 | DType::I64 | DType::I32) {
        return Err(format!(
            "reduction {r:?} on {} is not implemented",
            d.name()
        ));
    }
    elem_size(d).ok_or_else(|| format!("element type {}", d.name()))
}

fn index(i: i64, dim: usize) -> Result<usize, String> {
    let j = if i < 0 { i + dim as i64 } else { i };
    if j < 0 || j >= dim as i64 {
        return Err(format!("index {i} out of range for a dim of {dim}"));
    }
    Ok(j as usize)
}

/// `out[dst..dst+n] (op)= upd[src..src+n]`, in elements.
#[allow(clippy::too_many_arguments)]
fn combine(
    dtype: DType,
    r: Reduction,
    es: usize,
    out: &mut [u8],
    dst: usize,
    upd: &[u8],
    src: usize,
    n: usize,
) {
    fn go<
        T: crate::tensor::Elem + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
    >(
        r: Reduction,
        out: &mut [u8],
        dst: usize,
        upd: &[u8],
        src: usize,
        n: usize,
    ) {
        let o: &mut [T] = cast_mut(out);
        let u: &[T] = cast(upd);
        for k in 0..n {
            let (a, b) = (o[dst + k], u[src + k]);
            o[dst + k] = match r {
                Reduction::Add => a + b,
                Reduction::Mul => a * b,
                Reduction::Max => {
                    if b > a {
                        b
                    } else {
                        a
                    }
                }
                Reduction::Min => {
                    if b < a {
                        b
                    } else {
                        a
                    }
                }
                Reduction::None => b,
            };
        }
    }
    match (r, dtype) {
        (Reduction::None, _) => {
            out[dst * es..(dst + n) * es].copy_from_slice(&upd[src * es..(src + n) * es])
        }
        (_, DType::F32) => go::<f32>(r, out, dst, upd, src, n),
        (_, DType::I64) => go::<i64>(r, out, dst, upd, src, n),
        (_, _) => go::<i32>(r, out, dst, upd, src, n),
    }
}

struct ScatterElements {
    dtype: DType,
    es: usize,
    r: Reduction,
    data: Vec<usize>,
    upd: Vec<usize>,
    axis: usize,
}

/// Output 0 starts as `data`: copied, unless it is `data` (in place).
fn start_from_data(io: &mut KernelIo) -> Result<(), String> {
    let x = io.input(0)?;
    let o = &mut io.outputs[0].data;
    match x.data {
        Data::Output0 => Ok(()),
        Data::Bytes(b) if b.len() == o.len() => {
            o.copy_from_slice(b);
            Ok(())
        }
        Data::Bytes(b) => Err(format!(
            "data holds {} bytes, the output {}",
            b.len(),
            o.len()
        )),
    }
}

impl Kernel for ScatterElements {
    fn in_place(&self) -> bool {
        true
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        start_from_data(io)?;
        let idx = io.input(1)?.ints_ref()?;
        let u = io.input(2)?.bytes()?;
        let o = &mut io.outputs[0].data;
        if self.upd.len() == 1 && self.dtype == DType::F32 && self.r == Reduction::Add {
            // A flat f32 scatter-add (MaxPool's gradient through its
            // Indices): one typed loop, no per-element dispatch.
            let (o, u): (&mut [f32], &[f32]) = (cast_mut(o), cast(u));
            for (&i, &v) in idx.iter().zip(u) {
                o[index(i, self.data[0])?] += v;
            }
            return Ok(());
        }
        let ds = strides(&self.data);
        let rank = self.upd.len();
        let mut pos = vec![0usize; rank];
        for (k, &i) in idx.iter().enumerate() {
            let mut off = 0;
            for d in 0..rank {
                let p = if d == self.axis {
                    index(i, self.data[d])?
                } else {
                    pos[d]
                };
                off += p * ds[d];
            }
            combine(self.dtype, self.r, self.es, o, off, u, k, 1);
            // Next index of `updates` (row-major).
            for d in (0..rank).rev() {
                pos[d] += 1;
                if pos[d] < self.upd[d] {
                    break;
                }
                pos[d] = 0;
            }
        }
        Ok(())
    }
}

pub fn scatter_elements(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let r = reduction(ctx)?;
    let es = check_dtype(ctx, r)?;
    let (x, i, u) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    if i.shape != u.shape || i.shape.len() != x.shape.len() {
        return Err("indices and updates must have one shape, of the data's rank".into());
    }
    let r0 = x.shape.len() as i64;
    let a = ctx.node.attr_int("axis").unwrap_or(0);
    if a < -r0 || a >= r0 {
        return Err(format!("axis {a} is out of range for rank {r0}"));
    }
    Ok(Box::new(ScatterElements {
        dtype: x.dtype,
        es,
        r,
        data: x.shape.clone(),
        upd: u.shape.clone(),
        axis: (if a < 0 { a + r0 } else { a }) as usize,
    }))
}

struct ScatterNd {
    dtype: DType,
    es: usize,
    r: Reduction,
    data: Vec<usize>,
    /// Index tuple length.
    last: usize,
    /// Index tuples.
    tuples: usize,
}

impl Kernel for ScatterNd {
    fn in_place(&self) -> bool {
        true
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        start_from_data(io)?;
        let idx = io.input(1)?.ints_ref()?;
        let u = io.input(2)?.bytes()?;
        let o = &mut io.outputs[0].data;
        let st = strides(&self.data);
        let slice: usize = self.data[self.last..].iter().product();
        for t in 0..self.tuples {
            let mut off = 0;
            for (k, &i) in idx[t * self.last..(t + 1) * self.last].iter().enumerate() {
                off += index(i, self.data[k])? * st[k];
            }
            combine(self.dtype, self.r, self.es, o, off, u, t * slice, slice);
        }
        Ok(())
    }
}

pub fn scatter_nd(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let r = reduction(ctx)?;
    let es = check_dtype(ctx, r)?;
    let (x, i) = (ctx.input(0)?, ctx.input(1)?);
    let last = *i.shape.last().ok_or("scalar indices")?;
    if last > x.shape.len() || (last == 0 && !i.shape.is_empty()) {
        return Err(format!(
            "index tuples of length {last} for data of rank {}",
            x.shape.len()
        ));
    }
    Ok(Box::new(ScatterNd {
        dtype: x.dtype,
        es,
        r,
        data: x.shape.clone(),
        last,
        tuples: i.shape[..i.shape.len() - 1].iter().product(),
    }))
}

struct GatherElements {
    es: usize,
    data: Vec<usize>,
    out: Vec<usize>,
    axis: usize,
}

impl Kernel for GatherElements {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let idx = io.input(1)?.ints_ref()?;
        let o = &mut io.outputs[0].data;
        let ds = strides(&self.data);
        let rank = self.out.len();
        let es = self.es;
        let mut pos = vec![0usize; rank];
        for (k, &i) in idx.iter().enumerate() {
            let mut off = 0;
            for d in 0..rank {
                let p = if d == self.axis {
                    index(i, self.data[d])?
                } else {
                    pos[d]
                };
                off += p * ds[d];
            }
            o[k * es..(k + 1) * es].copy_from_slice(&x[off * es..(off + 1) * es]);
            for d in (0..rank).rev() {
                pos[d] += 1;
                if pos[d] < self.out[d] {
                    break;
                }
                pos[d] = 0;
            }
        }
        Ok(())
    }
}

pub fn gather_elements(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let r0 = x.shape.len() as i64;
    let a = ctx.node.attr_int("axis").unwrap_or(0);
    if a < -r0 || a >= r0 {
        return Err(format!("axis {a} is out of range for rank {r0}"));
    }
    Ok(Box::new(GatherElements {
        es: elem_size(x.dtype).ok_or_else(|| format!("element type {}", x.dtype.name()))?,
        data: x.shape.clone(),
        out: ctx.outputs[0].shape.clone(),
        axis: (if a < 0 { a + r0 } else { a }) as usize,
    }))
}

/// OneHot: `values[1]` where the index (negative ones count from the
/// end) equals the position along `axis`, `values[0]` elsewhere; indices
/// of an integer or float type, values of any type. The depth comes from
/// the output shape (shape inference read the depth input).
struct OneHot {
    es: usize,
    outer: usize,
    depth: usize,
    inner: usize,
}

impl Kernel for OneHot {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let i = io.input(0)?;
        let idx: Vec<i64> = match i.dtype {
            DType::F32 => cast::<f32>(i.bytes()?).iter().map(|&v| v as i64).collect(),
            DType::F64 => cast::<f64>(i.bytes()?).iter().map(|&v| v as i64).collect(),
            _ => i.ints()?,
        };
        let v = io.input(2)?.bytes()?;
        let es = self.es;
        if v.len() < 2 * es {
            return Err("values must hold [off, on]".into());
        }
        let (off, on) = (&v[..es], &v[es..2 * es]);
        let y = &mut io.outputs[0].data;
        let d = self.depth as i64;
        for a in 0..self.outer {
            for b in 0..self.inner {
                let mut k = idx[a * self.inner + b];
                if k < 0 {
                    k += d;
                }
                for p in 0..self.depth {
                    let at = ((a * self.depth + p) * self.inner + b) * es;
                    y[at..at + es].copy_from_slice(if k == p as i64 { on } else { off });
                }
            }
        }
        Ok(())
    }
}

pub fn one_hot(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (i, o) = (ctx.input(0)?, &ctx.outputs[0]);
    if !matches!(i.dtype, DType::F32 | DType::F64 | DType::I64 | DType::I32) {
        return Err(format!("OneHot indices of {}", i.dtype.name()));
    }
    let r = o.shape.len() as i64;
    let a = ctx.node.attr_int("axis").unwrap_or(-1);
    if a < -r || a >= r {
        return Err(format!("axis {a} is out of range for rank {r}"));
    }
    let a = (if a < 0 { a + r } else { a }) as usize;
    Ok(Box::new(OneHot {
        es: elem_size(o.dtype).ok_or_else(|| format!("element type {}", o.dtype.name()))?,
        outer: o.shape[..a].iter().product(),
        depth: o.shape[a],
        inner: o.shape[a + 1..].iter().product(),
    }))
}

struct MaxUnpool {
    es: usize,
    /// The unpooled shape the indices address.
    unpooled: Vec<usize>,
    out: Vec<usize>,
}

impl Kernel for MaxUnpool {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let idx = io.input(1)?.ints_ref()?;
        let o = &mut io.outputs[0].data;
        o.fill(0);
        let es = self.es;
        let total: usize = self.unpooled.iter().product();
        let (us, os) = (strides(&self.unpooled), strides(&self.out));
        for (k, &i) in idx.iter().enumerate().take(x.len() / es.max(1)) {
            if i < 0 || i as usize >= total {
                return Err(format!(
                    "MaxUnpool index {i} is out of range for the unpooled shape {:?}",
                    self.unpooled
                ));
            }
            // The position in the output (the same when no output_shape
            // enlarges it).
            let (mut rest, mut off) = (i as usize, 0);
            for (u, s) in us.iter().zip(&os) {
                off += rest / u * s;
                rest %= u;
            }
            o[off * es..(off + 1) * es].copy_from_slice(&x[k * es..(k + 1) * es]);
        }
        Ok(())
    }
}

pub fn max_unpool(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (x, i) = (ctx.input(0)?, ctx.input(1)?);
    let y = &ctx.outputs[0];
    let es = elem_size(x.dtype).ok_or_else(|| format!("element type {}", x.dtype.name()))?;
    if y.dtype != x.dtype || !matches!(i.dtype, DType::I64 | DType::I32) {
        return Err(format!(
            "MaxUnpool of {} with {} indices to {}",
            x.dtype.name(),
            i.dtype.name(),
            y.dtype.name()
        ));
    }
    let rank = x.shape.len();
    if rank < 3 || i.shape != x.shape {
        return Err(format!(
            "MaxUnpool of X {:?} with indices {:?} (the same shape, rank 3 or more)",
            x.shape, i.shape
        ));
    }
    let sp = rank - 2;
    let ints = |name: &str, len: usize, d: i64| -> Result<Vec<i64>, String> {
        match ctx.node.attr_ints(name) {
            None if name != "kernel_shape" => Ok(vec![d; len]),
            Some(v) if v.len() == len && v.iter().all(|&x| x >= 0) => Ok(v.to_vec()),
            v => Err(format!("MaxUnpool {name} {v:?} for {sp} spatial dims")),
        }
    };
    let kernel = ints("kernel_shape", sp, 1)?;
    let strides_ = ints("strides", sp, 1)?;
    let pads = ints("pads", 2 * sp, 0)?;
    let mut unpooled = x.shape[..2].to_vec();
    for d in 0..sp {
        let v = (x.shape[d + 2] as i64 - 1)
            .checked_mul(strides_[d])
            .and_then(|v| v.checked_add(kernel[d]))
            .and_then(|v| v.checked_sub(pads[d].checked_add(pads[d + sp])?))
            .filter(|&v| v >= 0)
            .ok_or_else(|| format!("MaxUnpool of {:?}: a negative unpooled dim", x.shape))?;
        unpooled.push(v as usize);
    }
    if let (Some(t), Some(b)) = (
        ctx.inputs.get(2).and_then(|t| t.as_ref()),
        ctx.constants.get(2).copied().flatten(),
    ) {
        let want: Vec<i64> = match t.dtype {
            DType::I64 => cast::<i64>(b).to_vec(),
            d => return Err(format!("MaxUnpool output_shape of {}", d.name())),
        };
        if want.len() != rank || want.iter().zip(&y.shape).any(|(&a, &b)| a != b as i64) {
            return Err(format!(
                "MaxUnpool output_shape {want:?} but an output of shape {:?}",
                y.shape
            ));
        }
    }
    if y.shape.len() != rank || y.shape.iter().zip(&unpooled).any(|(o, u)| o < u) {
        return Err(format!(
            "MaxUnpool output shape {:?} is smaller than the unpooled shape {unpooled:?}",
            y.shape
        ));
    }
    Ok(Box::new(MaxUnpool {
        es,
        unpooled,
        out: y.shape.clone(),
    }))
}
