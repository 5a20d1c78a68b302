//! Shape and data movement. Their gradients move `dy` back:
//!
//! - `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`: `dx = Reshape(dy, Shape(x))`;
//! - `Transpose(perm)`: `dx = Transpose(dy, perm⁻¹)`;
//! - `Expand`: `dy` reduced back over the broadcast axes;
//! - `Concat(axis)`: `dxᵢ = Slice(dy, offᵢ, offᵢ + sizeᵢ, axis)`;
//! - `Split(axis)`: `dx = Concat(dy₀, dy₁, ..., axis)`, zeros for outputs
//!   no gradient reaches;
//! - `Slice` (unit steps, constant bounds, static sliced dims):
//!   `dx = Pad(dy, begin = start, end = dim - end)` with zeros;
//! - `Gather(data, idx, axis)`: `ddata = ScatterND(zeros(Shape(data)),
//!   Unsqueeze(idx, -1), dy, reduction="add")` with `axis` moved to the
//!   front by Transposes when it is not 0 (repeated indices accumulate, as
//!   an embedding's gradient must). Needs opset 16.
//!
//! None of them keeps `x` alive: they read `Shape(x)`, taken right after
//! `x` is computed, or static dims.

use super::{dy, out_dims};
use crate::cx::{int_attr, Cx};
use crate::Result;
use graphopt_ir::{AttrValue, Attribute, Dim, ValueId};

type Grads = Result<Vec<Option<ValueId>>>;

fn norm(a: i64, r: i64) -> i64 {
    if a < 0 {
        a + r
    } else {
        a
    }
}

pub fn reshape_like(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let s = cx.shape_of(x)?;
    Ok(vec![Some(cx.reshape(d, s)?), None])
}

pub fn transpose(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let r = cx.rank(x)?;
    let perm = cx
        .attr_ints("perm")
        .unwrap_or_else(|| (0..r as i64).rev().collect());
    let mut inv = vec![0i64; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p as usize] = i as i64;
    }
    Ok(vec![Some(cx.transpose(d, &inv)?)])
}

pub fn expand(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let od = out_dims(cx)?;
    let x = cx.x(0)?;
    Ok(vec![Some(cx.unbroadcast(d, &od, x)?), None])
}

/// An offset along an axis: known, or an int64 `[1]` value.
#[derive(Clone, Copy)]
enum Off {
    Known(i64),
    Dyn(ValueId),
}

impl Off {
    fn value(self, cx: &mut Cx) -> Result<ValueId> {
        match self {
            Off::Known(k) => cx.const_i64(&[k]),
            Off::Dyn(v) => Ok(v),
        }
    }
}

pub fn concat(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let r = cx.rank(y)? as i64;
    let axis = norm(cx.attr_int("axis", 0), r);
    let n = cx.g.node(cx.node).inputs().len();
    let mut out = vec![None; n];
    let mut off = Off::Known(0);
    let axes = cx.const_i64(&[axis])?;
    for (i, slot) in out.iter_mut().enumerate() {
        let x = cx.x(i)?;
        let size = match cx.dims(x).and_then(|d| d.get(axis as usize).cloned()) {
            Some(Dim::Known(k)) => Off::Known(k),
            _ => {
                let s = cx.shape_of(x)?;
                Off::Dyn(cx.op("Gather", &[s, axes], vec![int_attr("axis", 0)])?)
            }
        };
        let end = match (off, size) {
            (Off::Known(a), Off::Known(b)) => Off::Known(a + b),
            _ => {
                let (a, b) = (off.value(cx)?, size.value(cx)?);
                Off::Dyn(cx.op("Add", &[a, b], vec![])?)
            }
        };
        if cx.need(i) {
            let (s, e) = (off.value(cx)?, end.value(cx)?);
            *slot = Some(cx.op("Slice", &[d, s, e, axes], vec![])?);
        }
        off = end;
    }
    Ok(out)
}

pub fn split(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    let axis = norm(cx.attr_int("axis", 0), r);
    let dt = cx.dtype(x)?;
    let mut parts = Vec::new();
    for (i, d) in dys.iter().enumerate() {
        parts.push(match d {
            Some(d) => *d,
            None => {
                let y = cx.y(i)?;
                cx.zeros_like(y, dt)?
            }
        });
    }
    let n = cx.g.node(cx.node).inputs().len();
    let mut out = vec![None; n];
    out[0] = Some(cx.op("Concat", &parts, vec![int_attr("axis", axis)])?);
    Ok(out)
}

pub fn slice(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let xd = cx
        .dims(x)
        .ok_or_else(|| cx.unsupported("the input's rank is unknown"))?;
    let r = xd.len() as i64;
    let get = |cx: &Cx, i: usize| -> Result<Option<Vec<i64>>> {
        match cx.input(i) {
            None => Ok(None),
            Some(v) => cx
                .const_ints(v)
                .map(Some)
                .ok_or_else(|| cx.unsupported("bounds computed at run time have no rule yet")),
        }
    };
    if cx.opset < 10 {
        return Err(cx.unsupported("Slice before opset 10 has no rule"));
    }
    let starts = get(cx, 1)?.unwrap_or_default();
    let ends = get(cx, 2)?.unwrap_or_default();
    let axes = get(cx, 3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = get(cx, 4)?.unwrap_or_else(|| vec![1; starts.len()]);
    if steps.iter().any(|&s| s != 1) {
        return Err(cx.unsupported("steps other than 1 have no rule yet"));
    }
    let mut pads = vec![0i64; 2 * r as usize];
    for (k, &a) in axes.iter().enumerate() {
        let a = norm(a, r) as usize;
        let dim = xd[a].known().ok_or_else(|| {
            cx.unsupported(format!("sliced axis {a} has a dim unknown before run time"))
        })?;
        let clamp = |v: i64| norm(v, dim).clamp(0, dim);
        let (s, e) = (clamp(starts[k]), clamp(ends[k]).max(clamp(starts[k])));
        pads[a] = s;
        pads[a + r as usize] = dim - e;
    }
    let p = cx.const_i64(&pads)?;
    Ok(vec![Some(cx.op("Pad", &[d, p], vec![])?)])
}

pub fn gather(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (data, idx) = (cx.x(0)?, cx.x(1)?);
    let r = cx.rank(data)? as i64;
    let q = cx.rank(idx)? as i64;
    let axis = norm(cx.attr_int("axis", 0), r);
    let dt = cx.dtype(data)?;
    *cx.wants_opset16 = true;
    let iu = cx.unsqueeze(idx, &[-1])?;
    let s = cx.shape_of(data)?;
    // Data with `axis` moved to the front, and dy to match.
    let perm_d: Vec<i64> = std::iter::once(axis)
        .chain((0..r).filter(|&a| a != axis))
        .collect();
    let (zshape, upd) = if axis == 0 {
        (s, d)
    } else {
        let pi = cx.const_i64(&perm_d)?;
        let zs = cx.op("Gather", &[s, pi], vec![int_attr("axis", 0)])?;
        let perm_y: Vec<i64> = (axis..axis + q)
            .chain(0..axis)
            .chain(axis + q..r - 1 + q)
            .collect();
        (zs, cx.transpose(d, &perm_y)?)
    };
    let zero = crate::cx::float_scalar(dt, 0.0, vec![1])?;
    let z = cx.op(
        "ConstantOfShape",
        &[zshape],
        vec![Attribute::new("value", AttrValue::Tensor(zero))],
    )?;
    let sc = cx.op(
        "ScatterND",
        &[z, iu, upd],
        vec![Attribute::new(
            "reduction",
            AttrValue::String(b"add".to_vec()),
        )],
    )?;
    let g = if axis == 0 {
        sc
    } else {
        let mut inv = vec![0i64; perm_d.len()];
        for (i, &p) in perm_d.iter().enumerate() {
            inv[p as usize] = i as i64;
        }
        cx.transpose(sc, &inv)?
    };
    Ok(vec![Some(g), None])
}
