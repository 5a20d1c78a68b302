//! Data-movement ops on element bits (dtype-agnostic, hence exact) and the
//! ops that build shapes and index ranges.

use super::arith::broadcast_shapes;
use super::{invalid, Cx, EvalError, EvalResult, Val};
use graphopt_ir::{DType, NodeData};
use ndarray::{ArrayD, Axis, Dimension, IxDyn};

/// `axis` in `[-rank, rank)` as an index.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> EvalResult<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        invalid(format!("axis {axis} out of range for rank {rank}"))
    }
}

fn i64_vec(dtype: DType, v: Vec<i64>) -> EvalResult<Val> {
    Val::from_vec(dtype, &[v.len()], v.into_iter().map(|x| x as u64).collect())
}

fn usizes(v: &[i64], what: &str) -> EvalResult<Vec<usize>> {
    v.iter()
        .map(|&d| usize::try_from(d).map_err(|_| EvalError::Invalid(format!("negative {what} {d}"))))
        .collect()
}

/// Copies `a` into a new logical shape (same element count).
fn reshaped(a: &Val, shape: &[usize]) -> EvalResult<Val> {
    Val::from_vec(a.dtype, shape, a.a.iter().copied().collect())
}

/// `Shape` (with `start`/`end`) and `Size`, from dims alone.
pub(super) fn shape_or_size(node: &NodeData, dims: &[i64]) -> EvalResult<Val> {
    if node.op_type == "Size" {
        let n: Option<i64> = dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
        let n = n.ok_or(EvalError::Skip)?;
        return Val::from_vec(DType::I64, &[], vec![n as u64]);
    }
    let r = dims.len() as i64;
    let clamp = |v: i64| {
        if v < 0 {
            (v.saturating_add(r)).max(0)
        } else {
            v.min(r)
        }
    };
    let s = clamp(node.attr_int("start").unwrap_or(0)) as usize;
    let e = node.attr_int("end").map_or(r, clamp) as usize;
    let v = if s < e { dims[s..e].to_vec() } else { vec![] };
    i64_vec(DType::I64, v)
}

pub(super) fn eval(cx: &Cx) -> EvalResult<Val> {
    match cx.node.op_type.as_str() {
        "Reshape" => {
            if cx.opset < 5 {
                return Err(EvalError::Skip);
            }
            let (a, s) = (cx.input(0)?, cx.input(1)?.to_i64s()?);
            let allow_zero = cx.ai("allowzero").unwrap_or(0) != 0;
            let total = a.a.len();
            let mut out = Vec::with_capacity(s.len());
            let mut infer = None;
            for (i, &d) in s.iter().enumerate() {
                match d {
                    0 if !allow_zero => out.push(
                        *a.shape()
                            .get(i)
                            .ok_or(EvalError::Invalid(format!("Reshape: 0 at {i} beyond rank")))?,
                    ),
                    -1 if infer.is_none() => {
                        infer = Some(i);
                        out.push(1);
                    }
                    d if d >= 0 => out.push(d as usize),
                    _ => return invalid(format!("Reshape: bad target {s:?}")),
                }
            }
            let known = out
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .ok_or(EvalError::Invalid(format!("Reshape: target {s:?} overflows")))?;
            if let Some(i) = infer {
                if known == 0 || total % known != 0 {
                    return invalid(format!("Reshape: cannot infer -1 in {s:?} from {total} elements"));
                }
                out[i] = total / known;
            }
            if out.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) != Some(total) {
                return invalid(format!(
                    "Reshape: {total} elements cannot take shape {s:?}"
                ));
            }
            reshaped(a, &out)
        }
        "Flatten" => {
            let a = cx.input(0)?;
            let r = a.rank();
            let axis = cx.ai("axis").unwrap_or(1);
            let axis = if axis < 0 { axis + r as i64 } else { axis };
            if axis < 0 || axis > r as i64 {
                return invalid(format!("Flatten: axis out of range for rank {r}"));
            }
            let (x, y) = a.shape().split_at(axis as usize);
            reshaped(a, &[x.iter().product(), y.iter().product()])
        }
        "Transpose" => {
            let a = cx.input(0)?;
            let r = a.rank();
            let perm: Vec<usize> = match cx.ints_attr("perm") {
                Some(p) => usizes(&p, "perm entry")?,
                None => (0..r).rev().collect(),
            };
            let mut seen = vec![false; r];
            if perm.len() != r
                || perm
                    .iter()
                    .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
            {
                return invalid(format!("Transpose: perm {perm:?} for rank {r}"));
            }
            let t = a.a.clone().permuted_axes(IxDyn(&perm));
            let shape = t.shape().to_vec();
            Val::from_vec(a.dtype, &shape, t.iter().copied().collect())
        }
        "Unsqueeze" => {
            let a = cx.input(0)?;
            let axes = if cx.opset >= 13 {
                cx.input(1)?.to_i64s()?
            } else {
                cx.ints_attr("axes")
                    .ok_or(EvalError::Invalid("Unsqueeze without axes".into()))?
            };
            let r = a.rank() + axes.len();
            let mut norm = Vec::new();
            for &x in &axes {
                let ax = norm_axis(x, r)?;
                if norm.contains(&ax) {
                    return invalid(format!("Unsqueeze: axis {x} repeated"));
                }
                norm.push(ax);
            }
            let mut src = a.shape().iter();
            let shape: Vec<usize> = (0..r)
                .map(|i| {
                    if norm.contains(&i) {
                        1
                    } else {
                        *src.next().expect("counts agree")
                    }
                })
                .collect();
            reshaped(a, &shape)
        }
        "Squeeze" => {
            let a = cx.input(0)?;
            let axes = if cx.opset >= 13 {
                match cx.opt_checked(1)? {
                    Some(v) => Some(v.to_i64s()?),
                    None => None,
                }
            } else {
                cx.ints_attr("axes")
            };
            let r = a.rank();
            let drop: Vec<usize> = match axes {
                Some(ax) => {
                    let mut v = Vec::new();
                    for x in ax {
                        let i = norm_axis(x, r)?;
                        if a.shape()[i] != 1 {
                            return invalid(format!("Squeeze: dim {i} is {}, not 1", a.shape()[i]));
                        }
                        v.push(i);
                    }
                    v
                }
                None => (0..r).filter(|&i| a.shape()[i] == 1).collect(),
            };
            let shape: Vec<usize> = (0..r)
                .filter(|i| !drop.contains(i))
                .map(|i| a.shape()[i])
                .collect();
            reshaped(a, &shape)
        }
        "Concat" => {
            let n = cx.node.inputs().len();
            let mut vals = Vec::new();
            for i in 0..n {
                if cx.has(i) {
                    vals.push(cx.input(i)?);
                }
            }
            let first = vals.first().ok_or(EvalError::Invalid("Concat of nothing".into()))?;
            let axis = cx
                .ai("axis")
                .ok_or(EvalError::Invalid("Concat without axis".into()))?;
            let ax = norm_axis(axis, first.rank())?;
            for v in &vals {
                if v.dtype != first.dtype || v.rank() != first.rank() {
                    return invalid("Concat: inputs differ in type or rank");
                }
            }
            let views: Vec<_> = vals.iter().map(|v| v.a.view()).collect();
            let r = ndarray::concatenate(Axis(ax), &views)
                .map_err(|e| EvalError::Invalid(format!("Concat: {e}")))?;
            Ok(Val::new(first.dtype, r))
        }
        "Gather" => {
            let (a, idx) = (cx.input(0)?, cx.input(1)?);
            if !matches!(idx.dtype, DType::I32 | DType::I64) {
                return invalid("Gather: indices must be int32 or int64");
            }
            let ax = norm_axis(cx.ai("axis").unwrap_or(0), a.rank())?;
            let n = a.shape()[ax] as i64;
            let ids: Vec<usize> = idx
                .to_i64s()?
                .into_iter()
                .map(|i| {
                    let j = if i < 0 { i + n } else { i };
                    if (0..n).contains(&j) {
                        Ok(j as usize)
                    } else {
                        invalid(format!("Gather: index {i} out of range for dim {n}"))
                    }
                })
                .collect::<EvalResult<_>>()?;
            let mut shape = a.shape()[..ax].to_vec();
            shape.extend_from_slice(idx.shape());
            shape.extend_from_slice(&a.shape()[ax + 1..]);
            cx.check(&shape, a.dtype)?;
            let picked = a.a.select(Axis(ax), &ids);
            Val::from_vec(a.dtype, &shape, picked.iter().copied().collect())
        }
        "Slice" => slice(cx),
        "GatherElements" => {
            let (a, idx) = (cx.input(0)?, cx.input(1)?);
            if !matches!(idx.dtype, DType::I32 | DType::I64) || idx.rank() != a.rank() {
                return invalid("GatherElements: indices must be int32/int64 of the data's rank");
            }
            let ax = norm_axis(cx.ai("axis").unwrap_or(0), a.rank())?;
            let n = a.shape()[ax] as i64;
            for (k, (&d, &i)) in a.shape().iter().zip(idx.shape()).enumerate() {
                if k != ax && i > d {
                    return invalid("GatherElements: indices larger than data");
                }
            }
            let vals = idx.to_i64s()?;
            let mut out = Vec::with_capacity(vals.len());
            for ((pos, _), &i) in idx.a.indexed_iter().zip(&vals) {
                let j = if i < 0 { i + n } else { i };
                if !(0..n).contains(&j) {
                    return invalid(format!("GatherElements: index {i} out of range for dim {n}"));
                }
                let mut at = pos.as_array_view().to_vec();
                at[ax] = j as usize;
                out.push(a.a[IxDyn(&at)]);
            }
            Val::from_vec(a.dtype, idx.shape(), out)
        }
        "Expand" => {
            let (a, s) = (cx.input(0)?, cx.input(1)?.to_i64s()?);
            let s = usizes(&s, "Expand dim")?;
            let shape = broadcast_shapes(&[a.shape(), &s])?;
            cx.check(&shape, a.dtype)?;
            let v = a.a.broadcast(IxDyn(&shape)).ok_or(EvalError::Skip)?;
            Val::from_vec(a.dtype, &shape, v.iter().copied().collect())
        }
        "Tile" => {
            let (a, reps) = (cx.input(0)?, cx.input(1)?.to_i64s()?);
            let reps = usizes(&reps, "Tile repeat")?;
            if reps.len() != a.rank() {
                return invalid("Tile: repeats length differs from rank");
            }
            let shape: Vec<usize> = a
                .shape()
                .iter()
                .zip(&reps)
                .map(|(d, r)| d.checked_mul(*r).ok_or(EvalError::Skip))
                .collect::<EvalResult<_>>()?;
            cx.check(&shape, a.dtype)?;
            let mut r = a.a.clone();
            for (ax, (&d, &k)) in a.shape().iter().zip(&reps).enumerate() {
                let ids: Vec<usize> = (0..d * k).map(|i| i % d.max(1)).collect();
                r = if d == 0 { r } else { r.select(Axis(ax), &ids) };
            }
            Ok(Val::new(a.dtype, r))
        }
        "ConstantOfShape" => {
            let s = usizes(&cx.input(0)?.to_i64s()?, "ConstantOfShape dim")?;
            let fill = match cx.node.attr_tensor("value") {
                Some(t) => {
                    let v = super::decode(t)?;
                    if v.a.len() != 1 {
                        return invalid("ConstantOfShape: value must hold one element");
                    }
                    v
                }
                None => Val::from_vec(DType::F32, &[1], vec![0])?,
            };
            cx.check(&s, fill.dtype)?;
            let bits = *fill.a.iter().next().expect("one element");
            Ok(Val::new(fill.dtype, ArrayD::from_elem(IxDyn(&s), bits)))
        }
        "Range" => {
            let (s, l, d) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
            // Float ranges accumulate differently across implementations.
            if !(s.dtype.is_int() && s.dtype == l.dtype && s.dtype == d.dtype) {
                return Err(EvalError::Skip);
            }
            let (s0, l0, d0) = (
                s.scalar_i64()? as i128,
                l.scalar_i64()? as i128,
                d.scalar_i64()? as i128,
            );
            if d0 == 0 {
                return invalid("Range: delta is 0");
            }
            let span = l0 - s0;
            let n = (span / d0 + i128::from(span % d0 != 0 && ((span < 0) == (d0 < 0)))).max(0);
            let n = usize::try_from(n).map_err(|_| EvalError::Skip)?;
            cx.check(&[n], s.dtype)?;
            let bits = (0..n as i128)
                .map(|i| (s0 + i * d0) as u64 & mask(s.dtype))
                .collect();
            Val::from_vec(s.dtype, &[n], bits)
        }
        "Where" => {
            let (c, x, y) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
            if c.dtype != DType::Bool || x.dtype != y.dtype {
                return invalid("Where: condition must be bool and branches of one type");
            }
            let shape = broadcast_shapes(&[c.shape(), x.shape(), y.shape()])?;
            cx.check(&shape, x.dtype)?;
            let b = |v: &Val| v.a.broadcast(IxDyn(&shape)).ok_or(EvalError::Skip).map(|v| v.to_owned());
            let (cb, xb, yb) = (b(c)?, b(x)?, b(y)?);
            let r = ndarray::Zip::from(&cb)
                .and(&xb)
                .and(&yb)
                .map_collect(|&c, &x, &y| if c != 0 { x } else { y });
            Ok(Val::new(x.dtype, r))
        }
        _ => Err(EvalError::Skip),
    }
}

fn mask(d: DType) -> u64 {
    match d.bits() {
        Some(b) if b < 64 => (1u64 << b) - 1,
        _ => u64::MAX,
    }
}

/// ONNX `Slice` (inputs from opset 10, attributes before).
fn slice(cx: &Cx) -> EvalResult<Val> {
    let a = cx.input(0)?;
    let r = a.rank();
    let (starts, ends, axes, steps) = if cx.opset < 10 {
        (
            cx.ints_attr("starts")
                .ok_or(EvalError::Invalid("Slice without starts".into()))?,
            cx.ints_attr("ends")
                .ok_or(EvalError::Invalid("Slice without ends".into()))?,
            cx.ints_attr("axes"),
            None,
        )
    } else {
        let opt = |i| -> EvalResult<Option<Vec<i64>>> {
            cx.opt_checked(i)?.map(|v| v.to_i64s()).transpose()
        };
        (
            cx.input(1)?.to_i64s()?,
            cx.input(2)?.to_i64s()?,
            opt(3)?,
            opt(4)?,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return invalid("Slice: starts, ends, axes and steps differ in length");
    }
    let mut out = a.a.clone();
    let mut seen = Vec::new();
    for k in 0..starts.len() {
        let ax = norm_axis(axes[k], r)?;
        if seen.contains(&ax) {
            return invalid(format!("Slice: axis {} repeated", axes[k]));
        }
        seen.push(ax);
        let n = a.shape()[ax] as i64;
        let step = steps[k];
        if step == 0 {
            return invalid("Slice: step is 0");
        }
        let adj = |x: i64| if x < 0 { x.saturating_add(n) } else { x };
        let (mut s, mut e) = (adj(starts[k]), adj(ends[k]));
        let mut ids = Vec::new();
        if step > 0 {
            s = s.clamp(0, n);
            e = e.clamp(0, n);
            let mut i = s;
            while i < e {
                ids.push(i as usize);
                i = i.saturating_add(step);
            }
        } else {
            s = s.clamp(-1, n - 1);
            e = e.clamp(-1, n - 1);
            let mut i = s;
            while i > e {
                ids.push(i as usize);
                i = i.saturating_add(step);
            }
        }
        out = out.select(Axis(ax), &ids);
    }
    Ok(Val::new(a.dtype, out))
}
