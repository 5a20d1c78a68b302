//! Shape and data movement. Their gradients move `dy` back:
//!
//! - `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`: `dx = Reshape(dy, Shape(x))`;
//! - `Transpose(perm)`: `dx = Transpose(dy, perm⁻¹)`;
//! - `Expand`: `dy` reduced back over the broadcast axes;
//! - `Concat(axis)`: `dxᵢ = Slice(dy, offᵢ, offᵢ + sizeᵢ, axis)`;
//! - `Split(axis)`: `dx = Concat(dy₀, dy₁, ..., axis)`, zeros for outputs
//!   no gradient reaches;
//! - `Slice` (unit steps, constant axes): `dx = Pad(dy, begin = start,
//!   end = dim - end)` with zeros; the pads are constants when the bounds
//!   and sliced dims are, else computed at run time from `Shape(x)` and the
//!   bounds (normalized and clamped as Slice does: `s < 0 → s + dim`, then
//!   into `[0, dim]`, `end ≥ start`) and scattered into the `2·rank` pads;
//! - `Pad` (constant mode, constant non-negative pads): `dx = Slice(dy,
//!   begin, begin + Shape(x))` over every axis (the pad value gets no
//!   gradient);
//! - `Gather(data, idx, axis)`: `ddata = ScatterND(zeros(Shape(data)),
//!   Unsqueeze(idx, -1), dy, reduction="add")` with `axis` moved to the
//!   front by Transposes when it is not 0 (repeated indices accumulate, as
//!   an embedding's gradient must). Needs opset 16.
//!
//! None of them keeps `x` alive: they read `Shape(x)`, taken right after
//! `x` is computed, or static dims.
//!
//! A uniform `dy` (the scalar `s` everywhere, [`Cx::uniform`]) stays
//! uniform through the reshapes, `Transpose` and `Expand` (times the
//! repeats, [`Cx::uniform_unbroadcast`]): `dx = Expand(s, Shape(x))`.

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
    if let Some(s) = cx.uniform(d) {
        return Ok(vec![Some(cx.expand_like(s, x)?), None]);
    }
    let s = cx.shape_of(x)?;
    Ok(vec![Some(cx.reshape(d, s)?), None])
}

pub fn transpose(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    if let Some(s) = cx.uniform(d) {
        return Ok(vec![Some(cx.expand_like(s, x)?)]);
    }
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
    let x = cx.x(0)?;
    if let Some(s) = cx.uniform(d) {
        let y = cx.y(0)?;
        return Ok(vec![Some(cx.uniform_unbroadcast(s, y, x)?), None]);
    }
    let od = out_dims(cx)?;
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
    let get = |cx: &Cx, i: usize, what: &str| -> Result<Option<Vec<i64>>> {
        match cx.input(i) {
            None => Ok(None),
            Some(v) => cx.const_ints(v).map(Some).ok_or_else(|| {
                cx.unsupported(format!("{what} computed at run time have no rule yet"))
            }),
        }
    };
    if cx.opset < 10 {
        return Err(cx.unsupported("Slice before opset 10 has no rule"));
    }
    let bounds = (
        cx.input(1).and_then(|v| cx.const_ints(v)),
        cx.input(2).and_then(|v| cx.const_ints(v)),
    );
    let n = match (&bounds.0, cx.input(1)) {
        (Some(s), _) => s.len(),
        (None, Some(v)) => cx
            .dims(v)
            .and_then(|d| d.first().and_then(|d| d.known()))
            .ok_or_else(|| cx.unsupported("the number of sliced axes is unknown"))?
            as usize,
        (None, None) => return Err(cx.unsupported("starts are missing")),
    };
    let axes = get(cx, 3, "axes")?.unwrap_or_else(|| (0..n as i64).collect());
    let steps = get(cx, 4, "steps")?.unwrap_or_else(|| vec![1; n]);
    if steps.iter().any(|&s| s != 1) {
        return Err(cx.unsupported("steps other than 1 have no rule yet"));
    }
    let axes: Vec<i64> = axes.iter().map(|&a| norm(a, r)).collect();
    let static_dims = axes.iter().all(|&a| xd[a as usize].known().is_some());
    let (Some(starts), Some(ends), true) = (bounds.0, bounds.1, static_dims) else {
        return Ok(vec![Some(slice_dynamic(cx, d, x, r, &axes)?)]);
    };
    let mut pads = vec![0i64; 2 * r as usize];
    for (k, &a) in axes.iter().enumerate() {
        let a = a as usize;
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

pub fn pad(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    let mode =
        cx.g.node(cx.node)
            .attr_str("mode")
            .unwrap_or("constant")
            .to_string();
    if mode != "constant" {
        return Err(cx.unsupported(format!("mode={mode} has no rule yet")));
    }
    let pads = match cx.attr_ints("pads") {
        Some(p) => p,
        None => {
            let v = cx.x(1)?;
            cx.const_ints(v)
                .ok_or_else(|| cx.unsupported("pads computed at run time have no rule yet"))?
        }
    };
    let axes: Vec<i64> = match cx.input(3) {
        Some(v) => cx
            .const_ints(v)
            .ok_or_else(|| cx.unsupported("axes computed at run time have no rule yet"))?
            .iter()
            .map(|&a| norm(a, r))
            .collect(),
        None => (0..r).collect(),
    };
    let k = axes.len();
    if pads.len() != 2 * k {
        return Err(cx.unsupported("pads do not match the padded axes"));
    }
    if pads.iter().any(|&p| p < 0) {
        return Err(cx.unsupported("negative pads (cropping) have no rule yet"));
    }
    let mut begin = vec![0i64; r as usize];
    for (i, &a) in axes.iter().enumerate() {
        begin[a as usize] = pads[i];
    }
    let starts = cx.const_i64(&begin)?;
    let s = cx.shape_of(x)?;
    let ends = cx.op("Add", &[s, starts], vec![])?;
    let ax = cx.const_i64(&(0..r).collect::<Vec<_>>())?;
    Ok(vec![Some(cx.op(
        "Slice",
        &[d, starts, ends, ax],
        vec![],
    )?)])
}

/// Slice's gradient with bounds or sliced dims known only at run time.
fn slice_dynamic(cx: &mut Cx, d: ValueId, x: ValueId, r: i64, axes: &[i64]) -> Result<ValueId> {
    let xs = cx.shape_of(x)?;
    let ax = cx.const_i64(axes)?;
    let dims = cx.op("Gather", &[xs, ax], vec![int_attr("axis", 0)])?;
    let zero = cx.const_i64(&[0])?;
    let clamp = |cx: &mut Cx, v: ValueId| -> Result<ValueId> {
        let v = if cx.dtype(v)? == graphopt_ir::DType::I64 {
            v
        } else {
            cx.op("Cast", &[v], vec![int_attr("to", 7)])?
        };
        let neg = cx.op("Less", &[v, zero], vec![])?;
        let wrapped = cx.op("Add", &[v, dims], vec![])?;
        let n = cx.op("Where", &[neg, wrapped, v], vec![])?;
        let lo = cx.op("Min", &[n, dims], vec![])?;
        cx.op("Max", &[lo, zero], vec![])
    };
    let (sv, ev) = (cx.x(1)?, cx.x(2)?);
    let s = clamp(cx, sv)?;
    let e0 = clamp(cx, ev)?;
    let e = cx.op("Max", &[e0, s], vec![])?;
    let tail = cx.op("Sub", &[dims, e], vec![])?;
    let upd = cx.op("Concat", &[s, tail], vec![int_attr("axis", 0)])?;
    let idx: Vec<i64> = axes
        .iter()
        .copied()
        .chain(axes.iter().map(|a| a + r))
        .collect();
    let idx = cx.const_i64(&idx)?;
    let zeros = cx.const_i64(&vec![0; 2 * r as usize])?;
    let pads = cx.op(
        "ScatterElements",
        &[zeros, idx, upd],
        vec![int_attr("axis", 0)],
    )?;
    cx.op("Pad", &[d, pads], vec![])
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
