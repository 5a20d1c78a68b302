//! Reductions: ReduceMean / Sum / Max / Min / Prod / L1 / L2 / LogSum /
//! LogSumExp / SumSquare on f32 and f64 (one generic kernel over
//! [`Real`]; the integer ones on i64 and i32 too, Max and Min on bool),
//! axes as an attribute or, from opsets 13/18, an input; Softmax /
//! LogSoftmax on f32 and f64 (per-axis since opset 13, over the flattened
//! tail before);
//! CumSum and CumProd; ArgMax / ArgMin, TopK (also on uint64), Hardmax
//! and LpNormalization.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::elementwise::{exp_slice, for_each_bcast};
use crate::cpu::par;
use crate::tensor::{cast, cast_mut, Elem};
use graphopt_ir::DType;

/// The float types the float reductions and Softmax run on (f32 and
/// f64): one generic kernel each, the f32 instance unchanged.
pub(crate) trait Real:
    Elem
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const INF: Self;
    const NEG_INF: Self;
    fn abs(self) -> Self;
    fn sqrt(self) -> Self;
    fn ln(self) -> Self;
    fn exp(self) -> Self;
    fn is_nan(self) -> bool;
    fn is_finite(self) -> bool;
    fn of_usize(n: usize) -> Self;
    /// `y = e^y` for every element (f32: [`exp_slice`]'s vector loop).
    fn exp_all(y: &mut [Self]);
}

macro_rules! real {
    ($t:ty, $exp_all:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const INF: Self = <$t>::INFINITY;
            const NEG_INF: Self = <$t>::NEG_INFINITY;
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            fn of_usize(n: usize) -> Self {
                n as $t
            }
            fn exp_all(y: &mut [Self]) {
                ($exp_all)(y)
            }
        }
    };
}
real!(f32, |y: &mut [f32]| exp_slice(None, y));
real!(f64, |y: &mut [f64]| y.iter_mut().for_each(|v| *v = v.exp()));

#[derive(Clone, Copy, PartialEq, Eq)]
enum Red {
    Mean,
    Sum,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

struct Reduce {
    op: Red,
    dtype: DType,
    attr_axes: Option<Vec<i64>>,
    noop_empty: bool,
    shape: Vec<usize>,
}

impl Reduce {
    /// The kept-dims output shape and the number of elements reduced into
    /// each output, or `None` for a no-op (empty axes with
    /// `noop_with_empty_axes`).
    fn kept(&self, io: &KernelIo) -> Result<Option<(Vec<usize>, usize)>, String> {
        let rank = self.shape.len() as i64;
        let axes: Vec<i64> = match (&self.attr_axes, io.inputs.get(1).copied().flatten()) {
            (Some(a), _) => a.clone(),
            (None, Some(t)) => t.ints()?,
            (None, None) => Vec::new(),
        };
        if axes.is_empty() && self.noop_empty {
            return Ok(None);
        }
        for &a in &axes {
            if a < -rank || a >= rank.max(1) {
                return Err(format!("axis {a} is out of range for rank {rank}"));
            }
        }
        let mut kd = self.shape.clone();
        let mut count = 1usize;
        for (d, k) in kd.iter_mut().enumerate() {
            let reduced = axes.is_empty()
                || axes
                    .iter()
                    .any(|&a| (if a < 0 { a + rank } else { a }) == d as i64);
            if reduced {
                count *= *k;
                *k = 1;
            }
        }
        Ok(Some((kd, count)))
    }

    fn run_float<T: Real>(&self, io: &mut KernelIo) -> Result<(), String> {
        let x: &[T] = cast(io.input(0)?.bytes()?);
        let kept = self.kept(io)?;
        let o: &mut [T] = cast_mut(io.outputs[0].data);
        let Some((kd, count)) = kept else {
            // No-op: the identity, except for the elementwise part of the
            // op (ReduceL1 of x is |x|, ...), as onnxruntime computes it.
            for (o, &v) in o.iter_mut().zip(x) {
                *o = match self.op {
                    Red::L1 | Red::L2 => v.abs(),
                    Red::SumSquare => v * v,
                    Red::LogSum => v.ln(),
                    _ => v,
                };
            }
            return Ok(());
        };
        let op = self.op;
        // LogSumExp subtracts the max first (no overflow for large x).
        let shift: Vec<T> = if op == Red::LogSumExp {
            let mut m = vec![T::NEG_INF; o.len()];
            for_each_bcast(&self.shape, [kd.as_slice()], |i, [j]| {
                m[j] = max_of(m[j], x[i])
            });
            m.iter()
                .map(|&v| if v.is_finite() { v } else { T::ZERO })
                .collect()
        } else {
            Vec::new()
        };
        let init = match op {
            Red::Max => T::NEG_INF,
            Red::Min => T::INF,
            Red::Prod => T::ONE,
            _ => T::ZERO,
        };
        o.fill(init);
        // One closure per op (not a match per element), so that each op's
        // loops vectorize.
        let threads = io.threads;
        let sh = self.shape.as_slice();
        let min = |a: T, v: T| if v < a || v.is_nan() { v } else { a };
        let mul = |a: T, b: T| a * b;
        let (max, add) = (nan_max, add);
        let f = (sh, kd.as_slice(), x, &mut *o, threads);
        match op {
            Red::Max => accumulate(f, move |a, v, _| max(a, v), max),
            Red::Min => accumulate(f, move |a, v, _| min(a, v), min),
            Red::Prod => accumulate(f, |a, v, _| a * v, mul),
            Red::L1 => accumulate(f, |a, v, _| a + v.abs(), add),
            Red::L2 | Red::SumSquare => accumulate(f, |a, v, _| a + v * v, add),
            Red::LogSumExp => {
                let shift = &shift;
                accumulate(f, |a, v, j| a + (v - shift[j]).exp(), add)
            }
            Red::Mean | Red::Sum | Red::LogSum => accumulate(f, |a, v, _| a + v, add),
        }
        match op {
            Red::Mean => {
                let c = T::of_usize(count.max(1));
                o.iter_mut().for_each(|v| *v = *v / c);
            }
            Red::L2 => o.iter_mut().for_each(|v| *v = v.sqrt()),
            Red::LogSum => o.iter_mut().for_each(|v| *v = v.ln()),
            Red::LogSumExp => o.iter_mut().zip(&shift).for_each(|(v, &s)| *v = v.ln() + s),
            _ => {}
        }
        Ok(())
    }

    /// Integer reductions (shape arithmetic: ReduceProd of a `Shape`).
    /// `lo..=hi`: the type's values (the identities of Max and Min);
    /// bool runs as u8 in `0..=1`.
    fn run_int<T: Elem + Into<i64> + TryFrom<i64>>(
        &self,
        io: &mut KernelIo,
        (lo, hi): (i64, i64),
    ) -> Result<(), String> {
        let xb = io.input(0)?.bytes()?;
        let x: &[T] = cast(xb);
        let kept = self.kept(io)?;
        let o: &mut [T] = cast_mut(io.outputs[0].data);
        let Some((kd, count)) = kept else {
            o.copy_from_slice(x);
            return Ok(());
        };
        let op = self.op;
        let mut acc: Vec<i64> = vec![
            match op {
                Red::Max => lo,
                Red::Min => hi,
                Red::Prod => 1,
                _ => 0,
            };
            o.len()
        ];
        for_each_bcast(&self.shape, [kd.as_slice()], |i, [j]| {
            let v: i64 = x[i].into();
            let a = acc[j];
            acc[j] = match op {
                Red::Max => a.max(v),
                Red::Min => a.min(v),
                Red::Prod => a.wrapping_mul(v),
                Red::L1 => a.wrapping_add(v.wrapping_abs()),
                Red::SumSquare => a.wrapping_add(v.wrapping_mul(v)),
                _ => a.wrapping_add(v),
            };
        });
        for (o, a) in o.iter_mut().zip(acc) {
            let a = if op == Red::Mean {
                a / count.max(1) as i64
            } else {
                a
            };
            *o = T::try_from(a).map_err(|_| format!("{a} overflows the output type"))?;
        }
        Ok(())
    }
}

impl Kernel for Reduce {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        match self.dtype {
            DType::F32 => self.run_float::<f32>(io),
            DType::F64 => self.run_float::<f64>(io),
            DType::I64 => self.run_int::<i64>(io, (i64::MIN, i64::MAX)),
            DType::I32 => self.run_int::<i32>(io, (i32::MIN.into(), i32::MAX.into())),
            DType::Bool => self.run_int::<u8>(io, (0, 1)),
            d => Err(format!("reduction on {}", d.name())),
        }
    }
}

pub fn reduce(ctx: &NodeCtx) -> Option<Result<Box<dyn Kernel>, String>> {
    let op = match ctx.node.op_type.as_str() {
        "ReduceMean" => Red::Mean,
        "ReduceSum" => Red::Sum,
        "ReduceMax" => Red::Max,
        "ReduceMin" => Red::Min,
        "ReduceProd" => Red::Prod,
        "ReduceL1" => Red::L1,
        "ReduceL2" => Red::L2,
        "ReduceLogSum" => Red::LogSum,
        "ReduceLogSumExp" => Red::LogSumExp,
        "ReduceSumSquare" => Red::SumSquare,
        _ => return None,
    };
    Some((|| {
        let x = ctx.input(0)?;
        let int_ok = matches!(
            op,
            Red::Mean | Red::Sum | Red::Max | Red::Min | Red::Prod | Red::L1 | Red::SumSquare
        );
        let float = matches!(x.dtype, DType::F32 | DType::F64);
        let ints = int_ok && matches!(x.dtype, DType::I64 | DType::I32);
        let bools = matches!(op, Red::Max | Red::Min) && x.dtype == DType::Bool;
        if !(float || ints || bools) {
            return Err(format!(
                "{} on {} is not implemented",
                ctx.node.op_type,
                x.dtype.name()
            ));
        }
        Ok(Box::new(Reduce {
            op,
            dtype: x.dtype,
            attr_axes: ctx.node.attr_ints("axes").map(|a| a.to_vec()),
            noop_empty: ctx.node.attr_int("noop_with_empty_axes") == Some(1),
            shape: x.shape.clone(),
        }) as Box<dyn Kernel>)
    })())
}

struct Softmax {
    f64: bool,
    outer: usize,
    len: usize,
    inner: usize,
    log: bool,
}

impl Kernel for Softmax {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        if self.f64 {
            self.go::<f64>(io)
        } else {
            self.go::<f32>(io)
        }
    }
}

impl Softmax {
    fn go<T: Real>(&self, io: &mut KernelIo) -> Result<(), String> {
        let x: &[T] = cast(io.input(0)?.bytes()?);
        let threads = io.threads;
        let y: &mut [T] = cast_mut(io.outputs[0].data);
        let (len, inner) = (self.len, self.inner);
        let block = (len * inner).max(1);
        // Outer blocks split across threads; each row (one `i`) is summed
        // by one thread in a fixed order.
        let min_blocks = par::MIN_ELEMS.div_ceil(block);
        par::for_chunks_mut(
            threads,
            &mut y[..self.outer * len * inner],
            block,
            min_blocks,
            |first, part| {
                for (j, y) in part.chunks_mut(block).enumerate() {
                    let x = &x[(first + j) * len * inner..][..len * inner];
                    if inner == 1 {
                        softmax_row(x, y, self.log);
                        continue;
                    }
                    for i in 0..inner {
                        let at = |k: usize| k * inner + i;
                        let mut m = T::NEG_INF;
                        for k in 0..len {
                            m = max_of(m, x[at(k)]);
                        }
                        let mut s = T::ZERO;
                        for k in 0..len {
                            let e = (x[at(k)] - m).exp();
                            y[at(k)] = e;
                            s = s + e;
                        }
                        for k in 0..len {
                            y[at(k)] = if self.log {
                                x[at(k)] - m - s.ln()
                            } else {
                                y[at(k)] / s
                            };
                        }
                    }
                }
            },
        );
        Ok(())
    }
}

/// Softmax (or LogSoftmax) of one contiguous row `x` into `y`: the max
/// and the sum in [`fold_row`]'s lanes, eˣ by [`exp_slice`], so every
/// pass vectorizes.
fn softmax_row<T: Real>(x: &[T], y: &mut [T], log: bool) {
    let m = fold_row(T::NEG_INF, x, nan_max, nan_max);
    let y = &mut y[..x.len()];
    for (y, &v) in y.iter_mut().zip(x) {
        *y = v - m;
    }
    T::exp_all(y);
    let s = fold_row(T::ZERO, y, add, add);
    if log {
        // log softmax = x - m - ln Σ e^(x - m).
        let ls = s.ln();
        for (y, &v) in y.iter_mut().zip(x) {
            *y = v - m - ls;
        }
    } else {
        y.iter_mut().for_each(|v| *v = *v / s);
    }
}

/// What [`accumulate`] folds: `x`'s shape, the kept-dims shape, `x`, the
/// output, threads.
type Fold<'a, T> = (&'a [usize], &'a [usize], &'a [T], &'a mut [T], usize);

/// Folds `x` into `o` (filled with the op's identity) with `step(acc, v,
/// j)` for output `j`; `merge` joins two partial folds. Every output's
/// fold is the same whatever the thread count:
/// - reduced axes last (`inner = 1`, a row per output): [`fold_row`]'s
///   fixed lanes;
/// - otherwise each output folds its inputs in increasing index order.
fn accumulate<T: Real>(
    (shape, kd, x, o, threads): Fold<T>,
    step: impl Fn(T, T, usize) -> T + Sync + Copy,
    merge: impl Fn(T, T) -> T + Sync + Copy,
) {
    if let Some((outer, len, inner)) = one_block(shape, kd) {
        // The reduced axes are one contiguous run: x is [outer, len,
        // inner] and o [outer, inner]. Outputs split across threads.
        let min = par::MIN_ELEMS.div_ceil((len * inner).max(1));
        if inner == 1 {
            par::for_chunks_mut(threads, o, 1, min, |first, part| {
                for (a, acc) in part.iter_mut().enumerate() {
                    let j = first + a;
                    *acc = fold_row(*acc, &x[j * len..][..len], |a, v| step(a, v, j), merge);
                }
            });
        } else if outer >= threads || inner < 64 {
            par::for_chunks_mut(threads, o, inner.max(1), min, |first, part| {
                for (a, orow) in part.chunks_mut(inner.max(1)).enumerate() {
                    let xa = &x[(first + a) * len * inner..][..len * inner];
                    for b in 0..len {
                        let xr = &xa[b * inner..][..inner];
                        for (c, (acc, &v)) in orow.iter_mut().zip(xr).enumerate() {
                            *acc = step(*acc, v, (first + a) * inner + c);
                        }
                    }
                }
            });
        } else {
            for a in 0..outer {
                let xa = &x[a * len * inner..][..len * inner];
                let orow = &mut o[a * inner..][..inner];
                let min_cols = par::MIN_ELEMS.div_ceil(len.max(1));
                par::for_chunks_mut(threads, orow, 1, min_cols, |c0, part| {
                    for b in 0..len {
                        let xr = &xa[b * inner + c0..][..part.len()];
                        for (c, (acc, &v)) in part.iter_mut().zip(xr).enumerate() {
                            *acc = step(*acc, v, a * inner + c0 + c);
                        }
                    }
                });
            }
        }
    } else if let Some((outer, mid, inner)) = kept_block(shape, kd) {
        // The kept axes are one contiguous run between reduced ones (a
        // convolution's bias gradient: [N, C, H, W] over 0, 2, 3): x is
        // [outer, mid, inner] and o [mid]. Outputs split across threads.
        let min = par::MIN_ELEMS.div_ceil((outer * inner).max(1));
        par::for_chunks_mut(threads, o, 1, min, |first, part| {
            for (c, acc) in part.iter_mut().enumerate() {
                let j = first + c;
                for a in 0..outer {
                    for &v in &x[(a * mid + j) * inner..][..inner] {
                        *acc = step(*acc, v, j);
                    }
                }
            }
        });
    } else {
        for_each_bcast(shape, [kd], |i, [j]| {
            o[j] = step(o[j], x[i], j);
        });
    }
}

/// `a + b`, a fold step of sums.
#[inline(always)]
pub(crate) fn add<T: Real>(a: T, b: T) -> T {
    a + b
}

/// The larger of `a` and `v`, a NaN in `v` winning (and kept once in `a`):
/// ReduceMax's fold step.
#[inline(always)]
fn nan_max<T: Real>(a: T, v: T) -> T {
    if v > a || v.is_nan() {
        v
    } else {
        a
    }
}

/// The larger of `a` and `v`, a NaN losing (`f32::max`).
#[inline(always)]
fn max_of<T: Real>(a: T, v: T) -> T {
    if a.is_nan() || v > a {
        v
    } else {
        a
    }
}

/// Lanes of [`fold_row`].
const LANES: usize = 16;

/// `init` folded with every element of the row `x` by `step`: element `i`
/// into lane `i % 16` while whole groups of 16 remain (lanes start at
/// `init`, the identity), the lanes then merged into one in order, then
/// the rest folded in. Sixteen independent folds vectorize where one
/// serial fold cannot; the order depends on the row's length only.
#[inline(always)]
pub(crate) fn fold_row<T: Real>(
    init: T,
    x: &[T],
    step: impl Fn(T, T) -> T,
    merge: impl Fn(T, T) -> T,
) -> T {
    let mut lanes = [init; LANES];
    let groups = x.chunks_exact(LANES);
    let rest = groups.remainder();
    for g in groups {
        for i in 0..LANES {
            lanes[i] = step(lanes[i], g[i]);
        }
    }
    let mut acc = init;
    for l in lanes {
        acc = merge(acc, l);
    }
    for &v in rest {
        acc = step(acc, v);
    }
    acc
}

/// `(outer, len, inner)` when the axes `x` (shape `shape`) loses to `kept`
/// (the shape with 1 on reduced axes) are one contiguous run, so that
/// `x` is `[outer, len, inner]` and the output `[outer, inner]`.
fn one_block(shape: &[usize], kept: &[usize]) -> Option<(usize, usize, usize)> {
    contiguous(shape, kept, true)
}

/// `(outer, mid, inner)` when the axes `x` keeps are one contiguous run
/// with every other axis reduced, so that `x` is `[outer, mid, inner]` and
/// the output `[mid]`.
fn kept_block(shape: &[usize], kept: &[usize]) -> Option<(usize, usize, usize)> {
    contiguous(shape, kept, false)
}

/// `shape` as `[outer, run, inner]`, where `run` spans the axes that are
/// reduced (`reduced`) or kept (`!reduced`), when those are contiguous.
fn contiguous(shape: &[usize], kept: &[usize], reduced: bool) -> Option<(usize, usize, usize)> {
    if shape.len() != kept.len() {
        return None;
    }
    // Axes of extent 1 belong to either side.
    let inside: Vec<bool> = shape
        .iter()
        .zip(kept)
        .map(|(&s, &k)| s != 1 && (k == 1) == reduced)
        .collect();
    let first = inside.iter().position(|&r| r)?;
    let last = inside.iter().rposition(|&r| r)?;
    if (first..=last).any(|d| !inside[d] && shape[d] != 1) {
        return None;
    }
    let p = |r: &[usize]| r.iter().product::<usize>();
    Some((
        p(&shape[..first]),
        p(&shape[first..=last]),
        p(&shape[last + 1..]),
    ))
}

pub fn softmax(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if !matches!(x.dtype, DType::F32 | DType::F64) {
        return Err(format!("Softmax on {} is not implemented", x.dtype.name()));
    }
    let r = x.shape.len() as i64;
    let new = ctx.opset >= 13;
    let mut axis = ctx
        .node
        .attr_int("axis")
        .unwrap_or(if new { -1 } else { 1 });
    if axis < 0 {
        axis += r;
    }
    let axis = axis.clamp(0, r.max(1) - 1) as usize;
    let s = &x.shape;
    let outer: usize = s[..axis].iter().product();
    let (len, inner) = if new {
        (
            s.get(axis).copied().unwrap_or(1),
            s[axis + 1..].iter().product(),
        )
    } else {
        (s[axis..].iter().product(), 1)
    };
    Ok(Box::new(Softmax {
        f64: x.dtype == DType::F64,
        outer,
        len,
        inner,
        log: ctx.node.op_type == "LogSoftmax",
    }))
}

/// ArgMax / ArgMin along `axis` (keepdims, select_last_index) on f32,
/// i64 and i32; int64 indices out. The first (or, with
/// select_last_index, the last) extremum on ties; a NaN is never picked
/// over a number after it (comparisons with NaN are false).
struct Arg {
    max: bool,
    last: bool,
    dtype: DType,
    outer: usize,
    len: usize,
    inner: usize,
}

impl Arg {
    fn go<T: Elem + PartialOrd>(&self, x: &[T], o: &mut [i64]) {
        for a in 0..self.outer {
            for b in 0..self.inner {
                let at = |k: usize| x[(a * self.len + k) * self.inner + b];
                let mut best = 0usize;
                for k in 1..self.len {
                    let (v, w) = (at(k), at(best));
                    let better = if self.max { v > w } else { v < w };
                    if better || (self.last && v == w) {
                        best = k;
                    }
                }
                o[a * self.inner + b] = best as i64;
            }
        }
    }
}

impl Kernel for Arg {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let o: &mut [i64] = cast_mut(io.outputs[0].data);
        match self.dtype {
            DType::F32 => self.go::<f32>(cast(x), o),
            DType::I64 => self.go::<i64>(cast(x), o),
            _ => self.go::<i32>(cast(x), o),
        }
        Ok(())
    }
}

pub fn arg(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if !matches!(x.dtype, DType::F32 | DType::I64 | DType::I32) {
        return Err(format!(
            "{} on {} is not implemented",
            ctx.node.op_type,
            x.dtype.name()
        ));
    }
    let r = x.shape.len() as i64;
    let a = ctx.node.attr_int("axis").unwrap_or(0);
    if a < -r || a >= r.max(1) {
        return Err(format!("axis {a} is out of range for rank {r}"));
    }
    let a = (if a < 0 { a + r } else { a }) as usize;
    let s = &x.shape;
    if s.get(a) == Some(&0) {
        return Err("an empty axis has no extremum".into());
    }
    Ok(Box::new(Arg {
        max: ctx.node.op_type == "ArgMax",
        last: ctx.node.attr_int("select_last_index") == Some(1),
        dtype: x.dtype,
        outer: s[..a].iter().product(),
        len: s.get(a).copied().unwrap_or(1),
        inner: s.get(a + 1..).map_or(1, |t| t.iter().product()),
    }))
}

/// CumSum and CumProd along the axis (input 1, read at run time), with
/// `exclusive` and `reverse`, on f32, f64, i64 and i32: one running fold
/// per line along the axis, from the identity (0 or 1).
struct Cumulative {
    prod: bool,
    dtype: DType,
    shape: Vec<usize>,
    exclusive: bool,
    reverse: bool,
}

/// The arithmetic of a [`Cumulative`] element type (integers wrap, as
/// onnxruntime's do).
trait Running: Elem {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, b: Self) -> Self;
    fn mul(self, b: Self) -> Self;
}

macro_rules! running_float {
    ($($t:ty),*) => {$(
        impl Running for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn add(self, b: Self) -> Self { self + b }
            fn mul(self, b: Self) -> Self { self * b }
        }
    )*};
}

macro_rules! running_int {
    ($($t:ty),*) => {$(
        impl Running for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            fn add(self, b: Self) -> Self { self.wrapping_add(b) }
            fn mul(self, b: Self) -> Self { self.wrapping_mul(b) }
        }
    )*};
}

running_float!(f32, f64);
running_int!(i64, i32);

impl Cumulative {
    fn go<T: Running>(&self, x: &[T], o: &mut [T], axis: usize) {
        let s = &self.shape;
        let outer: usize = s[..axis].iter().product();
        let len = s[axis];
        let inner: usize = s[axis + 1..].iter().product();
        let (init, step): (T, fn(T, T) -> T) = if self.prod {
            (T::ONE, T::mul)
        } else {
            (T::ZERO, T::add)
        };
        for a in 0..outer {
            for b in 0..inner {
                let at = |k: usize| (a * len + k) * inner + b;
                let mut acc = init;
                for i in 0..len {
                    let k = if self.reverse { len - 1 - i } else { i };
                    if self.exclusive {
                        o[at(k)] = acc;
                        acc = step(acc, x[at(k)]);
                    } else {
                        acc = step(acc, x[at(k)]);
                        o[at(k)] = acc;
                    }
                }
            }
        }
    }
}

impl Kernel for Cumulative {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let r = self.shape.len() as i64;
        let a = match io.input(1)?.ints()?.as_slice() {
            [a] => *a,
            v => {
                return Err(format!(
                    "the axis must be one integer, got {} values",
                    v.len()
                ))
            }
        };
        if a < -r || a >= r {
            return Err(format!("axis {a} is out of range for rank {r}"));
        }
        let axis = (if a < 0 { a + r } else { a }) as usize;
        let o = &mut *io.outputs[0].data;
        match self.dtype {
            DType::F32 => self.go::<f32>(cast(x), cast_mut(o), axis),
            DType::F64 => self.go::<f64>(cast(x), cast_mut(o), axis),
            DType::I64 => self.go::<i64>(cast(x), cast_mut(o), axis),
            _ => self.go::<i32>(cast(x), cast_mut(o), axis),
        }
        Ok(())
    }
}

/// CumSum or CumProd (by the node's op).
pub fn cumulative(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let op = &ctx.node.op_type;
    if !matches!(x.dtype, DType::F32 | DType::F64 | DType::I64 | DType::I32) {
        return Err(format!("{op} on {} is not implemented", x.dtype.name()));
    }
    Ok(Box::new(Cumulative {
        prod: op == "CumProd",
        dtype: x.dtype,
        shape: x.shape.clone(),
        exclusive: ctx.node.attr_int("exclusive") == Some(1),
        reverse: ctx.node.attr_int("reverse") == Some(1),
    }))
}

/// `(outer, len, inner)` around a normalized axis of `shape`.
fn around(shape: &[usize], axis: i64) -> Result<(usize, usize, usize), String> {
    let r = shape.len() as i64;
    if axis < -r || axis >= r.max(1) {
        return Err(format!("axis {axis} is out of range for rank {r}"));
    }
    let a = (if axis < 0 { axis + r } else { axis }) as usize;
    Ok((
        shape[..a].iter().product(),
        shape.get(a).copied().unwrap_or(1),
        shape.get(a + 1..).map_or(1, |t| t.iter().product()),
    ))
}

/// TopK on f32, f64, i64 and i32 along `axis`: the k largest (or
/// smallest) values, sorted, ties to the lower index; k from the output
/// shape.
struct TopK {
    dtype: DType,
    outer: usize,
    len: usize,
    inner: usize,
    k: usize,
    largest: bool,
}

impl TopK {
    fn go<T: Elem + PartialOrd>(&self, x: &[T], v: &mut [T], idx: &mut [i64]) {
        let (len, inner, k) = (self.len, self.inner, self.k);
        let mut order: Vec<usize> = Vec::with_capacity(len);
        for a in 0..self.outer {
            for b in 0..inner {
                let at = |j: usize| x[(a * len + j) * inner + b];
                order.clear();
                order.extend(0..len);
                // Stable: equal values keep the lower index first.
                order.sort_by(|&p, &q| {
                    let (u, w) = (at(p), at(q));
                    let o = u.partial_cmp(&w).unwrap_or(std::cmp::Ordering::Equal);
                    if self.largest {
                        o.reverse()
                    } else {
                        o
                    }
                });
                for (j, &p) in order.iter().take(k).enumerate() {
                    v[(a * k + j) * inner + b] = at(p);
                    idx[(a * k + j) * inner + b] = p as i64;
                }
            }
        }
    }
}

impl Kernel for TopK {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        let (vals, rest) = io.outputs.split_at_mut(1);
        let v = &mut vals[0].data;
        let idx: &mut [i64] = cast_mut(rest.first_mut().ok_or("no indices output")?.data);
        match self.dtype {
            DType::F32 => self.go::<f32>(cast(x), cast_mut(v), idx),
            DType::F64 => self.go::<f64>(cast(x), cast_mut(v), idx),
            DType::I64 => self.go::<i64>(cast(x), cast_mut(v), idx),
            DType::I32 => self.go::<i32>(cast(x), cast_mut(v), idx),
            DType::U64 => self.go::<u64>(cast(x), cast_mut(v), idx),
            d => return Err(format!("TopK on {}", d.name())),
        }
        Ok(())
    }
}

pub fn top_k(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    if !matches!(
        x.dtype,
        DType::F32 | DType::F64 | DType::I64 | DType::I32 | DType::U64
    ) || ctx.outputs.len() < 2
    {
        return Err(format!("TopK on {} is not implemented", x.dtype.name()));
    }
    let axis = ctx.node.attr_int("axis").unwrap_or(-1);
    let (outer, len, inner) = around(&x.shape, axis)?;
    let (_, k, _) = around(&ctx.outputs[0].shape, axis)?;
    if k > len {
        return Err(format!("k {k} exceeds the axis length {len}"));
    }
    Ok(Box::new(TopK {
        dtype: x.dtype,
        outer,
        len,
        inner,
        k,
        largest: ctx.node.attr_int("largest") != Some(0),
    }))
}

/// Hardmax (1 at the first maximum along the axis, 0 elsewhere) and
/// LpNormalization (p = 1 or 2 along the axis) on f32.
struct AlongAxis {
    outer: usize,
    len: usize,
    inner: usize,
    /// `None`: Hardmax; `Some(p)`: LpNormalization.
    p: Option<i64>,
}

impl Kernel for AlongAxis {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        let y = io.outputs[0].f32()?;
        let (len, inner) = (self.len, self.inner);
        for a in 0..self.outer {
            for b in 0..inner {
                let at = |j: usize| (a * len + j) * inner + b;
                match self.p {
                    None => {
                        let mut best = 0;
                        for j in 1..len {
                            if x[at(j)] > x[at(best)] {
                                best = j;
                            }
                        }
                        for j in 0..len {
                            y[at(j)] = (j == best) as u8 as f32;
                        }
                    }
                    Some(p) => {
                        let norm = if p == 1 {
                            (0..len).map(|j| x[at(j)].abs()).sum::<f32>()
                        } else {
                            (0..len).map(|j| x[at(j)] * x[at(j)]).sum::<f32>().sqrt()
                        };
                        for j in 0..len {
                            y[at(j)] = if norm == 0.0 { 0.0 } else { x[at(j)] / norm };
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

pub fn along_axis(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let x = ctx.input(0)?;
    let op = ctx.node.op_type.as_str();
    if x.dtype != DType::F32 {
        return Err(format!("{op} on {} is not implemented", x.dtype.name()));
    }
    let hard = op == "Hardmax";
    let p = ctx.node.attr_int("p").unwrap_or(2);
    if !hard && p != 1 && p != 2 {
        return Err(format!("p = {p} (1 and 2 are implemented)"));
    }
    let axis = ctx
        .node
        .attr_int("axis")
        .unwrap_or(if hard && ctx.opset < 13 { 1 } else { -1 });
    let (outer, len, inner) = if hard && ctx.opset < 13 {
        // Before opset 13: the input as 2-D, split at `axis`.
        let r = x.shape.len() as i64;
        let a = (if axis < 0 { axis + r } else { axis }).clamp(0, r) as usize;
        (
            x.shape[..a].iter().product(),
            x.shape[a..].iter().product(),
            1,
        )
    } else {
        around(&x.shape, axis)?
    };
    Ok(Box::new(AlongAxis {
        outer,
        len,
        inner,
        p: (!hard).then_some(p),
    }))
}
