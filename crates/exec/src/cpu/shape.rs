//! Data movement, byte-generic (any element size): views (Reshape,
//! Flatten, Squeeze, Unsqueeze, Identity: a copy, run only when the plan
//! did not alias the output to the input), Transpose, DepthToSpace,
//! SpaceToDepth, CenterCropPad, EyeLike, Expand, Slice,
//! Concat, Split, Gather, GatherND, Tile, Pad, Trilu, ReverseSequence,
//! Dropout (inference),
//! and the shape-makers Shape,
//! ConstantOfShape, Range and Constant. Output shapes come from shape
//! inference, so kernels only place bytes.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::par;
use crate::tensor::{cast, cast_mut, elem_size, numel, strides};
use graphopt_ir::DType;

/// `dst[i] = src[base + Σ idx_d · st_d]` over every index of `out`, in
/// elements of `es` bytes.
pub fn strided(es: usize, out: &[usize], src: &[u8], base: isize, st: &[isize], dst: &mut [u8]) {
    strided_par(1, es, out, src, base, st, dst);
}

/// [`strided`] on `threads` threads: dims that stay contiguous in the
/// source are merged first (so a Transpose that keeps the last dim copies
/// whole runs), then rows of the last merged dim split across threads.
pub fn strided_par(
    threads: usize,
    es: usize,
    out: &[usize],
    src: &[u8],
    base: isize,
    st: &[isize],
    dst: &mut [u8],
) {
    let n = numel(out);
    if n == 0 {
        return;
    }
    // Merge dim d into the previous one where stepping through d and then
    // its predecessor is one stride; drop dims of extent 1.
    let (mut dims, mut sts): (Vec<usize>, Vec<isize>) = (Vec::new(), Vec::new());
    for (&d, &t) in out.iter().zip(st) {
        if d == 1 {
            continue;
        }
        match (dims.last_mut(), sts.last_mut()) {
            (Some(pd), Some(pt)) if *pt == t * d as isize => {
                *pd *= d;
                *pt = t;
            }
            _ => {
                dims.push(d);
                sts.push(t);
            }
        }
    }
    if dims.is_empty() {
        let b = base as usize * es;
        dst[..es].copy_from_slice(&src[b..b + es]);
        return;
    }
    let last = dims.len() - 1;
    let (inner, ist) = (dims[last], sts[last]);
    let row_bytes = inner * es;
    let min_rows = (par::MIN_ELEMS / 4).div_ceil(inner);
    par::for_chunks_mut(
        threads,
        &mut dst[..n * es],
        row_bytes,
        min_rows,
        |first, part| {
            for (j, row) in part.chunks_exact_mut(row_bytes).enumerate() {
                // The source offset of this row's first element.
                let (mut rest, mut pos) = (first + j, base);
                for d in (0..last).rev() {
                    pos += (rest % dims[d]) as isize * sts[d];
                    rest /= dims[d];
                }
                if ist == 1 {
                    let s = pos as usize * es;
                    row.copy_from_slice(&src[s..s + row_bytes]);
                    continue;
                }
                macro_rules! gather {
                    ($t:ty) => {{
                        let (sv, dv): (&[$t], &mut [$t]) = (cast(src), cast_mut(row));
                        for (k, d) in dv.iter_mut().enumerate() {
                            *d = sv[(pos + k as isize * ist) as usize];
                        }
                    }};
                }
                match es {
                    8 => gather!(i64),
                    4 => gather!(i32),
                    2 => gather!(u16),
                    1 => gather!(u8),
                    _ => {
                        for k in 0..inner {
                            let s = (pos + k as isize * ist) as usize * es;
                            row[k * es..(k + 1) * es].copy_from_slice(&src[s..s + es]);
                        }
                    }
                }
            }
        },
    );
}

struct Copy;

impl Kernel for Copy {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let o = &mut io.outputs[0];
        let n = o.data.len();
        o.data.copy_from_slice(&x[..n]);
        Ok(())
    }
}

struct Strided {
    es: usize,
    out: Vec<usize>,
    st: Vec<isize>,
    base: isize,
}

impl Kernel for Strided {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        strided_par(
            io.threads,
            self.es,
            &self.out,
            x,
            self.base,
            &self.st,
            io.outputs[0].data,
        );
        Ok(())
    }
}

fn es_of(d: DType) -> Result<usize, String> {
    elem_size(d).ok_or_else(|| format!("element type {}", d.name()))
}

fn transpose(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let perm: Vec<usize> = ctx
        .node
        .attr_ints("perm")
        .map(|p| p.iter().map(|&v| v as usize).collect())
        .unwrap_or_else(|| (0..r).rev().collect());
    let own = strides(&x.shape);
    Ok(Box::new(Strided {
        es: es_of(x.dtype)?,
        out: ctx.outputs[0].shape.clone(),
        st: perm.iter().map(|&p| own[p] as isize).collect(),
        base: 0,
    }))
}

/// DepthToSpace and SpaceToDepth (DCR or CRD) on `[N, C, H, W]`: a
/// transpose of a 6-D view, written as a strided copy. The output is viewed
/// as `[N, C', H, b, W, b]` (DepthToSpace) or `[N, b, b, C, H', W']`
/// (SpaceToDepth DCR; CRD `[N, C, b, b, H', W']`) and each of its dims
/// steps through the input by one stride.
fn depth_space(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let op = ctx.node.op_type.as_str();
    let &[n, c, h, w] = x.shape.as_slice() else {
        return Err(format!(
            "{op} takes a 4-D input, got rank {}",
            x.shape.len()
        ));
    };
    let b = ctx.node.attr_int("blocksize").ok_or("no blocksize")?;
    if b < 1 {
        return Err(format!("blocksize {b} is below 1"));
    }
    let b = b as usize;
    let big = || format!("blocksize {b} is too large");
    let bb = b.checked_mul(b).ok_or_else(big)?;
    let (chw, hw) = (c * h * w, h * w);
    let to_space = op == "DepthToSpace";
    let mode = ctx.node.attr_str("mode").unwrap_or("DCR");
    let (out, st): ([usize; 4], Vec<usize>) = if to_space {
        if c % bb != 0 {
            return Err(format!(
                "{c} channels are not a multiple of blocksize² {bb}"
            ));
        }
        let co = c / bb;
        // Input channel of (block row i, block column j, channel k):
        // DCR (i·b + j)·C' + k, CRD (k·b + i)·b + j.
        let (sk, si, sj) = match mode {
            "DCR" => (hw, b.saturating_mul(co * hw), co * hw),
            "CRD" => (bb.saturating_mul(hw), b.saturating_mul(hw), hw),
            m => return Err(format!("DepthToSpace mode {m} (DCR and CRD are)")),
        };
        let (ho, wo) = (h.checked_mul(b), w.checked_mul(b));
        let (ho, wo) = ho.zip(wo).ok_or_else(big)?;
        ([n, co, ho, wo], vec![chw, sk, w, si, 1, sj])
    } else {
        if h % b != 0 || w % b != 0 {
            return Err(format!("{h}×{w} is not a multiple of blocksize {b}"));
        }
        // Output channel DCR (i·b + j)·C + k, CRD (k·b + i)·b + j, takes
        // input (k, y·b + i, x·b + j) (the mode came with opset 28).
        let co = c.checked_mul(bb).ok_or_else(big)?;
        let (yx, sy) = ([h / b, w / b], b.saturating_mul(w));
        match mode {
            "DCR" => ([n, co, yx[0], yx[1]], vec![chw, w, 1, hw, sy, b]),
            "CRD" => ([n, co, yx[0], yx[1]], vec![chw, hw, w, 1, sy, b]),
            m => return Err(format!("{op} mode {m} (DCR and CRD are)")),
        }
    };
    if ctx.outputs[0].shape != out {
        return Err(format!(
            "{op} of {:?} gives {out:?}, not the output shape {:?}",
            x.shape, ctx.outputs[0].shape
        ));
    }
    let view = match (to_space, mode) {
        (true, _) => vec![n, c / bb, h, b, w, b],
        (false, "DCR") => vec![n, b, b, c, h / b, w / b],
        (false, _) => vec![n, c, b, b, h / b, w / b],
    };
    Ok(Box::new(Strided {
        es: es_of(x.dtype)?,
        out: view,
        st: st.into_iter().map(|s| s as isize).collect(),
        base: 0,
    }))
}

/// The bytes of the value 1 in element type `d`.
fn one_of(d: DType) -> Result<Vec<u8>, String> {
    Ok(match d {
        DType::F32 => 1f32.to_le_bytes().to_vec(),
        DType::F64 => 1f64.to_le_bytes().to_vec(),
        DType::F16 => 0x3C00u16.to_le_bytes().to_vec(),
        DType::BF16 => 0x3F80u16.to_le_bytes().to_vec(),
        d => {
            // Integers and bool: 1 in the low byte.
            let mut v = vec![0; es_of(d)?];
            v[0] = 1;
            v
        }
    })
}

/// EyeLike: zeros of input 0's 2-D shape in the output's element type,
/// ones on diagonal `k` (only the input's shape is read).
struct EyeLike {
    one: Vec<u8>,
    rows: usize,
    cols: usize,
    k: i64,
}

impl Kernel for EyeLike {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let o = &mut *io.outputs[0].data;
        o.fill(0);
        let es = self.one.len();
        for r in 0..self.rows {
            let c = (r as i64).saturating_add(self.k);
            if c >= 0 && (c as usize) < self.cols {
                let at = (r * self.cols + c as usize) * es;
                o[at..at + es].copy_from_slice(&self.one);
            }
        }
        Ok(())
    }
}

fn eye_like(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let y = &ctx.outputs[0];
    let &[rows, cols] = x.shape.as_slice() else {
        return Err(format!(
            "EyeLike takes a 2-D input, got rank {}",
            x.shape.len()
        ));
    };
    if y.shape != x.shape {
        return Err(format!(
            "EyeLike output shape {:?} is not the input's {:?}",
            y.shape, x.shape
        ));
    }
    Ok(Box::new(EyeLike {
        one: one_of(y.dtype)?,
        rows,
        cols,
        k: ctx.node.attr_int("k").unwrap_or(0),
    }))
}

/// CenterCropPad: along each listed axis the input is cropped (its
/// centre kept, the odd element dropped from the end) or zero-padded (the
/// odd element added at the end) to the target length of input 1, read at
/// run time and checked against the output shape.
struct CenterCropPad {
    es: usize,
    shape: Vec<usize>,
    out: Vec<usize>,
    axes: Option<Vec<i64>>,
}

impl Kernel for CenterCropPad {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let target = io.input(1)?.ints()?;
        let r = self.shape.len();
        let axes: Vec<usize> = match &self.axes {
            Some(a) => a
                .iter()
                .map(|&a| {
                    let n = if a < 0 { a + r as i64 } else { a };
                    (0..r as i64)
                        .contains(&n)
                        .then_some(n as usize)
                        .ok_or_else(|| format!("axis {a} is out of range for rank {r}"))
                })
                .collect::<Result<_, _>>()?,
            None => (0..r).collect(),
        };
        if target.len() != axes.len() {
            return Err(format!(
                "{} target lengths for {} axes",
                target.len(),
                axes.len()
            ));
        }
        let mut want = self.shape.clone();
        // Per dim: first input element kept, where it goes, how many.
        let mut src0 = vec![0usize; r];
        let mut dst0 = vec![0usize; r];
        let mut len = self.shape.clone();
        for (&a, &t) in axes.iter().zip(&target) {
            if t < 0 {
                return Err(format!("target length {t} is negative"));
            }
            let (t, d) = (t as usize, self.shape[a]);
            want[a] = t;
            len[a] = t.min(d);
            if t < d {
                src0[a] = (d - t) / 2;
            } else {
                dst0[a] = (t - d) / 2;
            }
        }
        if want != self.out {
            return Err(format!(
                "CenterCropPad of {:?} to {target:?} gives {want:?}, not the output shape {:?}",
                self.shape, self.out
            ));
        }
        let o = &mut *io.outputs[0].data;
        o.fill(0);
        if numel(&len) == 0 {
            return Ok(());
        }
        let (ist, ost) = (strides(&self.shape), strides(&self.out));
        let es = self.es;
        let run = len[r - 1] * es;
        let rows = numel(&len[..r - 1]);
        for row in 0..rows {
            let (mut rest, mut si, mut di) = (row, src0[r - 1], dst0[r - 1]);
            for d in (0..r - 1).rev() {
                let i = rest % len[d];
                rest /= len[d];
                si += (src0[d] + i) * ist[d];
                di += (dst0[d] + i) * ost[d];
            }
            o[di * es..di * es + run].copy_from_slice(&x[si * es..si * es + run]);
        }
        Ok(())
    }
}

fn center_crop_pad(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if x.shape.is_empty() {
        return Err("CenterCropPad of a scalar".into());
    }
    Ok(Box::new(CenterCropPad {
        es: es_of(x.dtype)?,
        shape: x.shape.clone(),
        out: ctx.outputs[0].shape.clone(),
        axes: ctx.node.attr_ints("axes").map(|a| a.to_vec()),
    }))
}

fn bcast_strides(inp: &[usize], out: &[usize]) -> Vec<isize> {
    let own = strides(inp);
    let off = out.len() - inp.len();
    (0..out.len())
        .map(|d| {
            if d < off || inp[d - off] == 1 {
                0
            } else {
                own[d - off] as isize
            }
        })
        .collect()
}

fn expand(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let out = ctx.outputs[0].shape.clone();
    Ok(Box::new(Strided {
        es: es_of(x.dtype)?,
        st: bcast_strides(&x.shape, &out),
        out,
        base: 0,
    }))
}

/// Opset < 10: starts, ends and optional axes as attributes.
type SliceAttrs = (Vec<i64>, Vec<i64>, Option<Vec<i64>>);

/// Slice: starts/ends/axes/steps from inputs (opset ≥ 10) or attributes,
/// read at run time.
struct Slice {
    es: usize,
    shape: Vec<usize>,
    out: Vec<usize>,
    attrs: Option<SliceAttrs>,
}

impl Kernel for Slice {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let opt = |k: usize| -> Result<Option<Vec<i64>>, String> {
            match io.inputs.get(k).copied().flatten() {
                Some(t) => Ok(Some(t.ints()?)),
                None => Ok(None),
            }
        };
        let (starts, _ends, axes, steps) = match &self.attrs {
            Some((s, e, a)) => (s.clone(), e.clone(), a.clone(), None),
            None => (
                opt(1)?.ok_or("no starts")?,
                opt(2)?.ok_or("no ends")?,
                opt(3)?,
                opt(4)?,
            ),
        };
        let r = self.shape.len() as i64;
        let own = strides(&self.shape);
        let mut st: Vec<isize> = own.iter().map(|&s| s as isize).collect();
        let mut base = 0isize;
        for (i, &s0) in starts.iter().enumerate() {
            let mut a = axes.as_ref().map_or(i as i64, |a| a[i]);
            if a < 0 {
                a += r;
            }
            let a = a as usize;
            let dim = self.shape[a] as i64;
            let step = steps.as_ref().map_or(1, |s| s[i]);
            let mut s = if s0 < 0 { s0 + dim } else { s0 };
            s = if step > 0 {
                s.clamp(0, dim)
            } else {
                s.clamp(0, dim - 1)
            };
            base += s as isize * own[a] as isize;
            st[a] = step as isize * own[a] as isize;
        }
        strided(self.es, &self.out, x, base, &st, io.outputs[0].data);
        Ok(())
    }
}

fn slice(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let n = ctx.node;
    let attrs = if ctx.opset < 10 {
        Some((
            n.attr_ints("starts").ok_or("no starts")?.to_vec(),
            n.attr_ints("ends").ok_or("no ends")?.to_vec(),
            n.attr_ints("axes").map(|a| a.to_vec()),
        ))
    } else {
        None
    };
    Ok(Box::new(Slice {
        es: es_of(x.dtype)?,
        shape: x.shape.clone(),
        out: ctx.outputs[0].shape.clone(),
        attrs,
    }))
}

fn norm_axis(a: i64, r: usize) -> usize {
    (if a < 0 { a + r as i64 } else { a }) as usize
}

/// Concat; Split is the same walk with inputs and outputs swapped.
struct Concat {
    outer: usize,
    /// Bytes each part contributes per outer index.
    parts: Vec<usize>,
    split: bool,
}

impl Kernel for Concat {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let total: usize = self.parts.iter().sum();
        let what = if self.split { "Split" } else { "Concat" };
        let bad = |got: usize, want: usize| {
            format!("{what}: a part holds {got} bytes where its shape needs {want}")
        };
        if self.split {
            let x = io.input(0)?.bytes()?;
            if x.len() < self.outer * total {
                return Err(bad(x.len(), self.outer * total));
            }
            for (k, &p) in self.parts.iter().enumerate() {
                let l = io.outputs[k].data.len();
                if l < self.outer * p {
                    return Err(bad(l, self.outer * p));
                }
            }
            // Each output's rows split across threads.
            let threads = io.threads;
            let mut at = 0;
            for (k, &p) in self.parts.iter().enumerate() {
                let min_rows = (par::MIN_ELEMS * 4).div_ceil(p.max(1));
                let out = &mut io.outputs[k].data[..self.outer * p];
                par::for_chunks_mut(threads, out, p.max(1), min_rows, |first, part| {
                    for (j, row) in part.chunks_exact_mut(p.max(1)).enumerate() {
                        let from = (first + j) * total + at;
                        row.copy_from_slice(&x[from..from + p]);
                    }
                });
                at += p;
            }
        } else {
            let ins: Vec<&[u8]> = (0..self.parts.len())
                .map(|k| io.input(k).and_then(|i| i.bytes()))
                .collect::<Result<_, _>>()?;
            for (k, &p) in self.parts.iter().enumerate() {
                if ins[k].len() < self.outer * p {
                    return Err(bad(ins[k].len(), self.outer * p));
                }
            }
            let y = &mut io.outputs[0].data;
            if y.len() < self.outer * total {
                return Err(bad(y.len(), self.outer * total));
            }
            // Output rows split across threads.
            let min_rows = (par::MIN_ELEMS * 4).div_ceil(total.max(1));
            let y = &mut y[..self.outer * total];
            par::for_chunks_mut(io.threads, y, total.max(1), min_rows, |first, part| {
                for (j, row) in part.chunks_exact_mut(total.max(1)).enumerate() {
                    let o = first + j;
                    let mut at = 0;
                    for (k, &p) in self.parts.iter().enumerate() {
                        row[at..at + p].copy_from_slice(&ins[k][o * p..(o + 1) * p]);
                        at += p;
                    }
                }
            });
        }
        Ok(())
    }
}

fn concat(ctx: &NodeCtx, split: bool) -> Result<Box<dyn Kernel>, String> {
    let whole = if split {
        ctx.input(0)?.clone()
    } else {
        ctx.outputs[0].clone()
    };
    let es = es_of(whole.dtype)?;
    let axis = norm_axis(
        ctx.node
            .attr_int("axis")
            .unwrap_or(if split { 0 } else { 1 }),
        whole.shape.len(),
    );
    let outer: usize = whole.shape[..axis].iter().product();
    let inner: usize = whole.shape[axis + 1..].iter().product();
    let parts: Vec<usize> = if split {
        ctx.outputs
            .iter()
            .map(|o| o.shape[axis] * inner * es)
            .collect()
    } else {
        ctx.inputs
            .iter()
            .map(|i| i.as_ref().map_or(0, |i| i.shape[axis] * inner * es))
            .collect()
    };
    if !split && ctx.inputs.iter().any(|i| i.is_none()) {
        return Err("an omitted Concat input".into());
    }
    Ok(Box::new(Concat {
        outer,
        parts,
        split,
    }))
}

struct Gather {
    es: usize,
    outer: usize,
    dim: usize,
    inner: usize,
}

impl Kernel for Gather {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let idx = io.input(1)?.ints_ref()?;
        let y = &mut io.outputs[0].data;
        let row = self.inner * self.es;
        for o in 0..self.outer {
            for (j, &i) in idx.iter().enumerate() {
                let i = if i < 0 { i + self.dim as i64 } else { i };
                if i < 0 || i as usize >= self.dim {
                    return Err(format!("index {i} out of range for a dim of {}", self.dim));
                }
                let src = (o * self.dim + i as usize) * row;
                let dst = (o * idx.len() + j) * row;
                y[dst..dst + row].copy_from_slice(&x[src..src + row]);
            }
        }
        Ok(())
    }
}

fn gather(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let axis = norm_axis(ctx.node.attr_int("axis").unwrap_or(0), x.shape.len());
    Ok(Box::new(Gather {
        es: es_of(x.dtype)?,
        outer: x.shape[..axis].iter().product(),
        dim: x.shape[axis],
        inner: x.shape[axis + 1..].iter().product(),
    }))
}

struct GatherNd {
    es: usize,
    data: Vec<usize>,
    batch: usize,
    /// Index tuples per batch, tuple length.
    tuples: usize,
    last: usize,
}

impl Kernel for GatherNd {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let idx = io.input(1)?.ints_ref()?;
        let y = &mut io.outputs[0].data;
        let b = self.batch;
        let nb: usize = self.data[..b].iter().product();
        let st = strides(&self.data);
        let slice: usize = self.data[b + self.last..].iter().product::<usize>() * self.es;
        let per_batch: usize = self.data[b..].iter().product();
        let mut out = 0;
        for bi in 0..nb {
            for t in 0..self.tuples {
                let tup = &idx[(bi * self.tuples + t) * self.last..][..self.last];
                let mut off = bi * per_batch;
                for (k, &i) in tup.iter().enumerate() {
                    let dim = self.data[b + k] as i64;
                    let i = if i < 0 { i + dim } else { i };
                    if i < 0 || i >= dim {
                        return Err(format!("index {i} out of range for a dim of {dim}"));
                    }
                    off += i as usize * st[b + k];
                }
                let s = off * self.es;
                y[out..out + slice].copy_from_slice(&x[s..s + slice]);
                out += slice;
            }
        }
        Ok(())
    }
}

fn gather_nd(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let (x, i) = (ctx.input(0)?, ctx.input(1)?);
    let b = ctx.node.attr_int("batch_dims").unwrap_or(0) as usize;
    let last = *i.shape.last().ok_or("scalar indices")?;
    let q = i.shape.len();
    Ok(Box::new(GatherNd {
        es: es_of(x.dtype)?,
        data: x.shape.clone(),
        batch: b,
        tuples: i.shape[b..q - 1].iter().product(),
        last,
    }))
}

/// Writes fixed bytes (Shape, ConstantOfShape, Constant: known when the
/// kernel is made).
struct Fill(Vec<u8>);

impl Kernel for Fill {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let o = &mut io.outputs[0].data;
        if self.0.len() == o.len() {
            o.copy_from_slice(&self.0);
        } else if self.0.iter().all(|&b| b == 0) {
            // Zeros (a gradient's ConstantOfShape, 51 MB in resnet18's
            // MaxPool backward): one memset, not a copy per element.
            o.fill(0);
        } else if !self.0.is_empty() {
            // Double the filled prefix: a few large copies.
            let n = self.0.len().min(o.len());
            o[..n].copy_from_slice(&self.0[..n]);
            let mut done = n;
            while done < o.len() {
                let k = done.min(o.len() - done);
                o.copy_within(..k, done);
                done += k;
            }
        }
        Ok(())
    }
}

fn shape_op(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    Ok(Box::new(Fill(crate::values::shape(ctx)?)))
}

fn constant_of_shape(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    Ok(Box::new(Fill(crate::values::fill_value(ctx)?)))
}

fn constant(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    Ok(Box::new(Fill(crate::values::constant(ctx)?)))
}

struct Range(DType);

impl Kernel for Range {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let (s, d) = (io.input(0)?.bytes()?, io.input(2)?.bytes()?);
        match self.0 {
            DType::F32 => {
                let (s, d) = (cast::<f32>(s)[0], cast::<f32>(d)[0]);
                for (i, o) in io.outputs[0].f32()?.iter_mut().enumerate() {
                    *o = s + i as f32 * d;
                }
            }
            DType::I64 => {
                let (s, d) = (cast::<i64>(s)[0], cast::<i64>(d)[0]);
                for (i, o) in cast_mut::<i64>(io.outputs[0].data).iter_mut().enumerate() {
                    *o = s + i as i64 * d;
                }
            }
            DType::I32 => {
                let (s, d) = (cast::<i32>(s)[0], cast::<i32>(d)[0]);
                for (i, o) in cast_mut::<i32>(io.outputs[0].data).iter_mut().enumerate() {
                    *o = s + i as i32 * d;
                }
            }
            // fp16 / bf16: in f32, each element rounded once.
            DType::F16 | DType::BF16 => {
                let f16 = self.0 == DType::F16;
                let widen = |b: &[u8]| {
                    let v = cast::<u16>(b)[0];
                    if f16 {
                        half::f16::from_bits(v).to_f32()
                    } else {
                        half::bf16::from_bits(v).to_f32()
                    }
                };
                let (s, d) = (widen(s), widen(d));
                for (i, o) in cast_mut::<u16>(io.outputs[0].data).iter_mut().enumerate() {
                    let v = s + i as f32 * d;
                    *o = if f16 {
                        half::f16::from_f32(v).to_bits()
                    } else {
                        half::bf16::from_f32(v).to_bits()
                    };
                }
            }
            t => return Err(format!("Range on {}", t.name())),
        }
        Ok(())
    }
}

/// The kernel for a data-movement op, if it is one.
pub fn kernel(ctx: &NodeCtx) -> Option<Result<Box<dyn Kernel>, String>> {
    Some(match ctx.node.op_type.as_str() {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" => Ok(Box::new(Copy)),
        "Transpose" => transpose(ctx),
        "DepthToSpace" | "SpaceToDepth" => depth_space(ctx),
        "EyeLike" => eye_like(ctx),
        "CenterCropPad" => center_crop_pad(ctx),
        "Expand" => expand(ctx),
        "Slice" => slice(ctx),
        "Concat" => concat(ctx, false),
        "Split" => concat(ctx, true),
        "Gather" => gather(ctx),
        "GatherND" => gather_nd(ctx),
        "Shape" => shape_op(ctx),
        "Size" => ctx.input(0).map(|x| {
            Box::new(Fill((numel(&x.shape) as i64).to_le_bytes().to_vec())) as Box<dyn Kernel>
        }),
        "ConstantOfShape" => constant_of_shape(ctx),
        "Constant" => constant(ctx),
        "Tile" => (|| {
            let x = ctx.input(0)?;
            Ok(Box::new(Tile {
                es: es_of(x.dtype)?,
                inp: x.shape.clone(),
                out: ctx.outputs[0].shape.clone(),
            }) as Box<dyn Kernel>)
        })(),
        "Pad" => pad(ctx),
        "Trilu" => (|| {
            let x = ctx.input(0)?;
            Ok(Box::new(Trilu {
                es: es_of(x.dtype)?,
                shape: x.shape.clone(),
                upper: ctx.node.attr_int("upper").unwrap_or(1) != 0,
            }) as Box<dyn Kernel>)
        })(),
        "Dropout" => Ok(Box::new(Dropout)),
        "ReverseSequence" => reverse_sequence(ctx),
        "Range" => match ctx.outputs[0].dtype {
            d @ (DType::F32 | DType::I64 | DType::I32 | DType::F16 | DType::BF16) => {
                Ok(Box::new(Range(d)))
            }
            d => Err(format!("Range on {} is not implemented", d.name())),
        },
        _ => return None,
    })
}

/// Index of each output element's source, per dim, for Tile and Pad:
/// calls `f(out_index, Some(src_index))`, or `None` where Pad's constant
/// goes. `src_of(d, o)` maps an output coordinate to an input one.
fn for_each_src(
    out: &[usize],
    inp: &[usize],
    src_of: impl Fn(usize, i64) -> Option<i64>,
    mut f: impl FnMut(usize, Option<usize>),
) {
    let n = numel(out);
    let st = strides(inp);
    let mut idx = vec![0usize; out.len()];
    for i in 0..n {
        let mut off = Some(0usize);
        for (d, &o) in idx.iter().enumerate() {
            off = match (off, src_of(d, o as i64)) {
                (Some(a), Some(s)) if s >= 0 && (s as usize) < inp[d] => {
                    Some(a + s as usize * st[d])
                }
                _ => None,
            };
        }
        f(i, off);
        for d in (0..out.len()).rev() {
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Tile: output coordinate modulo the input dim.
struct Tile {
    es: usize,
    inp: Vec<usize>,
    out: Vec<usize>,
}

impl Kernel for Tile {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let es = self.es;
        let y = &mut io.outputs[0].data;
        let inp = &self.inp;
        for_each_src(
            &self.out,
            inp,
            |d, o| Some(o % inp[d].max(1) as i64),
            |i, s| {
                if let Some(s) = s {
                    y[i * es..(i + 1) * es].copy_from_slice(&x[s * es..(s + 1) * es]);
                }
            },
        );
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

/// Pad (constant, reflect, edge, wrap; negative pads crop): pads, the
/// constant and the axes from inputs (opset ≥ 11) or attributes.
struct Pad {
    es: usize,
    dtype: DType,
    mode: PadMode,
    inp: Vec<usize>,
    out: Vec<usize>,
    /// Opset < 11: pads and value as attributes.
    attrs: Option<(Vec<i64>, f32)>,
}

impl Kernel for Pad {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let r = self.inp.len();
        let (pads, value): (Vec<i64>, Vec<u8>) = match &self.attrs {
            Some((p, v)) => (p.clone(), {
                let f = *v;
                match self.dtype {
                    DType::F32 => f.to_le_bytes().to_vec(),
                    _ => vec![0; self.es],
                }
            }),
            None => {
                let p = io.input(1)?.ints()?;
                let v = match io.inputs.get(2).copied().flatten() {
                    Some(t) => t.bytes()?.get(..self.es).map(|b| b.to_vec()),
                    None => None,
                }
                .unwrap_or_else(|| vec![0; self.es]);
                let axes = match io.inputs.get(3).copied().flatten() {
                    Some(t) => Some(t.ints()?),
                    None => None,
                };
                let p = match axes {
                    None => p,
                    Some(a) => {
                        let mut full = vec![0i64; 2 * r];
                        for (k, &ax) in a.iter().enumerate() {
                            let ax = norm_axis(ax, r);
                            full[ax] = p[k];
                            full[r + ax] = p[a.len() + k];
                        }
                        full
                    }
                };
                (p, v)
            }
        };
        if pads.len() != 2 * r {
            return Err(format!("{} pads for rank {r}", pads.len()));
        }
        let (inp, mode, es) = (&self.inp, self.mode, self.es);
        let y = &mut io.outputs[0].data;
        for_each_src(
            &self.out,
            inp,
            |d, o| {
                let n = inp[d] as i64;
                let i = o - pads[d];
                if (0..n).contains(&i) {
                    return Some(i);
                }
                match mode {
                    PadMode::Constant => None,
                    PadMode::Edge => Some(i.clamp(0, n - 1)),
                    PadMode::Wrap => Some(i.rem_euclid(n.max(1))),
                    PadMode::Reflect => {
                        if n == 1 {
                            return Some(0);
                        }
                        let p = 2 * (n - 1);
                        let m = i.rem_euclid(p);
                        Some(if m < n { m } else { p - m })
                    }
                }
            },
            |i, s| {
                let dst = &mut y[i * es..(i + 1) * es];
                match s {
                    Some(s) => dst.copy_from_slice(&x[s * es..(s + 1) * es]),
                    None => dst.copy_from_slice(&value),
                }
            },
        );
        Ok(())
    }
}

fn pad(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let mode = match ctx.node.attr_str("mode").unwrap_or("constant") {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => return Err(format!("mode '{m}' is not implemented")),
    };
    let attrs = if ctx.opset < 11 {
        Some((
            ctx.node.attr_ints("pads").ok_or("no pads")?.to_vec(),
            ctx.node.attr_float("value").unwrap_or(0.0),
        ))
    } else {
        None
    };
    if mode != PadMode::Constant && x.shape.contains(&0) {
        return Err("non-constant padding of an empty tensor".into());
    }
    Ok(Box::new(Pad {
        es: es_of(x.dtype)?,
        dtype: x.dtype,
        mode,
        inp: x.shape.clone(),
        out: ctx.outputs[0].shape.clone(),
        attrs,
    }))
}

/// Trilu: keeps the upper (or lower) triangle of the last two dims from
/// diagonal `k` (input 1, default 0), zeroes the rest.
struct Trilu {
    es: usize,
    shape: Vec<usize>,
    upper: bool,
}

impl Kernel for Trilu {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let k = match io.inputs.get(1).copied().flatten() {
            Some(t) => *t.ints()?.first().ok_or("empty k")?,
            None => 0,
        };
        let y = &mut io.outputs[0].data;
        let r = self.shape.len();
        if r < 2 {
            return Err("rank below 2".into());
        }
        let (h, w) = (self.shape[r - 2], self.shape[r - 1]);
        let es = self.es;
        for (e, (dst, src)) in y.chunks_mut(es).zip(x.chunks(es)).enumerate() {
            let (i, j) = (((e / w) % h.max(1)) as i64, (e % w) as i64);
            let keep = if self.upper { j - i >= k } else { j - i <= k };
            if keep {
                dst.copy_from_slice(src);
            } else {
                dst.fill(0);
            }
        }
        Ok(())
    }
}

/// Dropout at inference (or with ratio 0): the input, and an all-true
/// mask. `training_mode` true with a ratio above 0 is an error (it would
/// need random masks).
struct Dropout;

impl Kernel for Dropout {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        if let Some(t) = io.inputs.get(2).copied().flatten() {
            let ratio = match io.inputs.get(1).copied().flatten() {
                Some(r) if r.dtype == DType::F32 => cast::<f32>(r.bytes()?)[0],
                Some(r) => return Err(format!("ratio of type {}", r.dtype.name())),
                None => 0.5,
            };
            if t.bytes()?.iter().any(|&b| b != 0) && ratio != 0.0 {
                return Err(
                    "training_mode with a ratio above 0 (random masks) is not implemented".into(),
                );
            }
        }
        let x = io.input(0)?.bytes()?;
        io.outputs[0].data.copy_from_slice(x);
        if let Some(m) = io.outputs.get_mut(1) {
            m.data.fill(1);
        }
        Ok(())
    }
}

/// ReverseSequence: along `time_axis`, the first `sequence_lens[b]`
/// elements of each batch entry `b` (along `batch_axis`) reversed, the rest
/// copied.
struct ReverseSequence {
    es: usize,
    shape: Vec<usize>,
    batch_axis: usize,
    time_axis: usize,
}

impl Kernel for ReverseSequence {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let lens = io.input(1)?.ints()?;
        let (ba, ta) = (self.batch_axis, self.time_axis);
        let (nb, nt) = (self.shape[ba], self.shape[ta]);
        if lens.len() != nb {
            return Err(format!("{} sequence lengths for batch {nb}", lens.len()));
        }
        if let Some(l) = lens.iter().find(|&&l| l < 0 || l as usize > nt) {
            return Err(format!("sequence length {l} outside 0..={nt}"));
        }
        let y = &mut io.outputs[0].data;
        // Whole blocks below both axes move together.
        let last = ba.max(ta);
        let block = self.es * numel(&self.shape[last + 1..]);
        let outer = &self.shape[..=last];
        let st = strides(outer);
        let mut idx = vec![0usize; outer.len()];
        for o in 0..numel(outer) {
            let (b, t) = (idx[ba], idx[ta]);
            let l = lens[b] as usize;
            let src = if t < l {
                o - t * st[ta] + (l - 1 - t) * st[ta]
            } else {
                o
            };
            y[o * block..(o + 1) * block].copy_from_slice(&x[src * block..(src + 1) * block]);
            for d in (0..outer.len()).rev() {
                idx[d] += 1;
                if idx[d] < outer[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(())
    }
}

fn reverse_sequence(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let axis = |name: &str, def: i64| -> Result<usize, String> {
        let a = ctx.node.attr_int(name).unwrap_or(def);
        let n = if a < 0 { a + r as i64 } else { a };
        if n < 0 || n >= r as i64 {
            return Err(format!("{name} {a} is out of range for rank {r}"));
        }
        Ok(n as usize)
    };
    let (batch_axis, time_axis) = (axis("batch_axis", 1)?, axis("time_axis", 0)?);
    if batch_axis == time_axis {
        return Err("batch_axis and time_axis are the same".into());
    }
    Ok(Box::new(ReverseSequence {
        es: es_of(x.dtype)?,
        shape: x.shape.clone(),
        batch_axis,
        time_axis,
    }))
}
