//! Elementwise arithmetic. With `y = f(a, b)` broadcast, each operand's
//! gradient is the pointwise product reduced back to its shape
//! ([`Cx::unbroadcast`]):
//!
//! - `Add`: `da = dy`, `db = dy`; `Sub`: `da = dy`, `db = -dy`;
//! - `Mul`: `da = dy·b`, `db = dy·a`;
//! - `Div`: `da = dy / b`, `db = -dy·y / b` (reads the output, not `a`);
//! - `Pow`: `da = dy·p·a^(p-1)`, `dp = dy·y·ln a`;
//! - `Neg`: `-dy`; `Identity`: `dy`;
//! - `Dropout`: in inference (no `training_mode`, or a constant false one)
//!   `dy`; in training, `dy · mask / (1 - ratio)`, reading the forward's
//!   own mask output (added when the node lacks it), so the backward drops
//!   exactly what the forward dropped;
//! - `Cast` (float to float): `dy` cast back to the input's type;
//!   `CastLike(x, like)` likewise for `x`; `like` gives only a type and gets
//!   no gradient;
//! - `Where(c, a, b)`: `da = Where(c, dy, 0)`, `db = Where(c, 0, dy)`;
//! - `Sqrt`: `dx = dy / (2y)`; `Exp`: `dx = dy·y`; `Log`: `dx = dy / x`;
//! - `Reciprocal`: `dx = -dy·y²`.
//!
//! A uniform `dy` (the scalar `s` everywhere, [`Cx::uniform`]: the sum and
//! mean losses' seed) stays uniform through `Add`, `Sub`, `Neg`, `Cast`
//! and `Identity`: `da = Expand(s·k, Shape(a))` with `k` the times `a` was
//! repeated by broadcasting ([`Cx::uniform_unbroadcast`]), so that the
//! rules further on can still use the scalar.

use super::{dy, out_dims};
use crate::cx::{int_attr, Cx};
use crate::Result;
use graphopt_ir::ValueId;

type Grads = Result<Vec<Option<ValueId>>>;

/// `Add` and `Sub` of a uniform `dy`: `s` (and `-s` for `Sub`'s `b`).
fn add_sub_uniform(cx: &mut Cx, s: ValueId, sub: bool) -> Grads {
    let y = cx.y(0)?;
    let mut out = vec![None, None];
    for (i, slot) in out.iter_mut().enumerate() {
        if cx.need(i) {
            let x = cx.x(i)?;
            let si = if sub && i == 1 {
                let dt = cx.dtype(x)?;
                cx.scalar_op("Neg", &[s], dt)?
            } else {
                s
            };
            *slot = Some(cx.uniform_unbroadcast(si, y, x)?);
        }
    }
    Ok(out)
}

pub fn add(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    if let Some(s) = cx.uniform(d) {
        return add_sub_uniform(cx, s, false);
    }
    let od = out_dims(cx)?;
    let mut out = vec![None, None];
    for (i, slot) in out.iter_mut().enumerate() {
        if cx.need(i) {
            let x = cx.x(i)?;
            *slot = Some(cx.unbroadcast(d, &od, x)?);
        }
    }
    Ok(out)
}

pub fn sub(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    if let Some(s) = cx.uniform(d) {
        return add_sub_uniform(cx, s, true);
    }
    let od = out_dims(cx)?;
    let mut out = vec![None, None];
    if cx.need(0) {
        let a = cx.x(0)?;
        out[0] = Some(cx.unbroadcast(d, &od, a)?);
    }
    if cx.need(1) {
        let b = cx.x(1)?;
        let r = cx.unbroadcast(d, &od, b)?;
        out[1] = Some(cx.op("Neg", &[r], vec![])?);
    }
    Ok(out)
}

pub fn mul(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let od = out_dims(cx)?;
    let (a, b) = (cx.x(0)?, cx.x(1)?);
    let mut out = vec![None, None];
    if cx.need(0) {
        let p = cx.op("Mul", &[d, b], vec![])?;
        out[0] = Some(cx.unbroadcast(p, &od, a)?);
    }
    if cx.need(1) {
        let p = cx.op("Mul", &[d, a], vec![])?;
        out[1] = Some(cx.unbroadcast(p, &od, b)?);
    }
    Ok(out)
}

pub fn div(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let od = out_dims(cx)?;
    let (a, b) = (cx.x(0)?, cx.x(1)?);
    let mut out = vec![None, None];
    let q = cx.op("Div", &[d, b], vec![])?;
    if cx.need(0) {
        out[0] = Some(cx.unbroadcast(q, &od, a)?);
    }
    if cx.need(1) {
        let y = cx.y(0)?;
        let p = cx.op("Mul", &[q, y], vec![])?;
        let r = cx.unbroadcast(p, &od, b)?;
        out[1] = Some(cx.op("Neg", &[r], vec![])?);
    }
    Ok(out)
}

pub fn neg(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    if let Some(s) = cx.uniform(d) {
        let x = cx.x(0)?;
        let dt = cx.dtype(x)?;
        let n = cx.scalar_op("Neg", &[s], dt)?;
        return Ok(vec![Some(cx.expand_like(n, x)?)]);
    }
    Ok(vec![Some(cx.op("Neg", &[d], vec![])?)])
}

pub fn identity(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    Ok(vec![Some(d)])
}

pub fn dropout(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let training = match cx.input(2) {
        None => false,
        Some(t) => match cx.const_ints(t).as_deref() {
            Some([v]) => *v != 0,
            _ => {
                return Err(cx.unsupported(format!(
                    "training_mode '{}' is not a constant (--dropout-train sets it to true)",
                    cx.g.name(t)
                )))
            }
        },
    };
    if !training {
        return Ok(vec![Some(d)]);
    }
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    let mask = match cx.g.node(cx.node).output(1) {
        Some(m) => m,
        None => {
            let shape = cx.g.ty(x).and_then(|t| t.shape()).cloned();
            let hint = format!("{}_mask", cx.node_name().replace(['/', ':', '.'], "_"));
            let m = cx.g.fresh_value(
                hint.trim_start_matches('_'),
                Some(graphopt_ir::Type::tensor(graphopt_ir::DType::Bool, shape)),
            );
            let node = cx.node;
            cx.g.set_output(node, 1, Some(m));
            m
        }
    };
    let mf = cx.op("Cast", &[mask], vec![int_attr("to", dt.to_onnx() as i64)])?;
    let kept = cx.op("Mul", &[d, mf], vec![])?;
    let dx = match cx.input(1) {
        // The default ratio.
        None => cx.scale(kept, dt, 2.0)?,
        Some(r) => match cx.const_floats(r).as_deref() {
            Some([r]) if (0.0..1.0).contains(r) => cx.scale(kept, dt, 1.0 / (1.0 - r))?,
            Some([r]) => {
                return Err(cx.unsupported(format!(
                    "ratio {r} is outside [0, 1): training-mode Dropout scales by 1/(1 - ratio)"
                )))
            }
            Some(_) => return Err(cx.unsupported("ratio is not a scalar")),
            None => {
                // A runtime ratio: 1/(1 - ratio) in the graph.
                let rc = cx.op("Cast", &[r], vec![int_attr("to", dt.to_onnx() as i64)])?;
                let one = cx.scalar(dt, 1.0)?;
                let keep = cx.op("Sub", &[one, rc], vec![])?;
                cx.op("Div", &[kept, keep], vec![])?
            }
        },
    };
    Ok(vec![Some(dx), None, None])
}

pub fn cast(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    if !dt.is_float() {
        return Err(cx.unsupported("a cast from a non-float type carries no gradient"));
    }
    let y = cx.y(0)?;
    if cx.dtype(y)? == dt {
        return Ok(vec![Some(d)]);
    }
    if let Some(s) = cx.uniform(d) {
        let c = cx.op("Cast", &[s], vec![int_attr("to", dt.to_onnx() as i64)])?;
        cx.set_type(
            c,
            Some(graphopt_ir::Type::tensor(
                dt,
                Some(graphopt_ir::Shape::known(&[])),
            )),
        );
        return Ok(vec![Some(cx.expand_like(c, x)?)]);
    }
    Ok(vec![Some(cx.op(
        "Cast",
        &[d],
        vec![int_attr("to", dt.to_onnx() as i64)],
    )?)])
}

pub fn cast_like(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    if !cx.need(0) {
        return Ok(vec![None, None]);
    }
    let mut g = cast(cx, dys)?;
    g.push(None);
    Ok(g)
}

pub fn where_(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let od = out_dims(cx)?;
    let c = cx.x(0)?;
    let dt = cx.dtype(cx.y(0)?)?;
    let zero = cx.scalar(dt, 0.0)?;
    let mut out = vec![None, None, None];
    if cx.need(1) {
        let a = cx.x(1)?;
        let w = cx.op("Where", &[c, d, zero], vec![])?;
        out[1] = Some(cx.unbroadcast(w, &od, a)?);
    }
    if cx.need(2) {
        let b = cx.x(2)?;
        let w = cx.op("Where", &[c, zero, d], vec![])?;
        out[2] = Some(cx.unbroadcast(w, &od, b)?);
    }
    Ok(out)
}

pub fn pow(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let od = out_dims(cx)?;
    let (a, p) = (cx.x(0)?, cx.x(1)?);
    let dt = cx.dtype(a)?;
    let mut out = vec![None, None];
    if cx.need(0) {
        // dy · p · a^(p-1); a constant scalar exponent folds to numbers.
        let g = match cx.const_floats(p).as_deref() {
            Some([e]) if *e == 2.0 => {
                let two_a = cx.scale(a, dt, 2.0)?;
                cx.op("Mul", &[d, two_a], vec![])?
            }
            Some([e]) if *e == 1.0 => d,
            Some([e]) => {
                let e1 = cx.scalar(dt, e - 1.0)?;
                let pw = cx.op("Pow", &[a, e1], vec![])?;
                let s = cx.scale(pw, dt, *e)?;
                cx.op("Mul", &[d, s], vec![])?
            }
            _ => {
                let pdt = cx.dtype(p)?;
                let pf = if pdt == dt {
                    p
                } else {
                    cx.op("Cast", &[p], vec![int_attr("to", dt.to_onnx() as i64)])?
                };
                let one = cx.scalar(dt, 1.0)?;
                let e1 = cx.op("Sub", &[pf, one], vec![])?;
                let pw = cx.op("Pow", &[a, e1], vec![])?;
                let s = cx.op("Mul", &[pw, pf], vec![])?;
                cx.op("Mul", &[d, s], vec![])?
            }
        };
        out[0] = Some(cx.unbroadcast(g, &od, a)?);
    }
    if cx.need(1) {
        let y = cx.y(0)?;
        let ln = cx.op("Log", &[a], vec![])?;
        let t = cx.op("Mul", &[y, ln], vec![])?;
        let g = cx.op("Mul", &[d, t], vec![])?;
        out[1] = Some(cx.unbroadcast(g, &od, p)?);
    }
    Ok(out)
}

pub fn sqrt(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let dt = cx.dtype(y)?;
    let q = cx.op("Div", &[d, y], vec![])?;
    Ok(vec![Some(cx.scale(q, dt, 0.5)?)])
}

pub fn exp(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    Ok(vec![Some(cx.op("Mul", &[d, y], vec![])?)])
}

pub fn log(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    Ok(vec![Some(cx.op("Div", &[d, x], vec![])?)])
}

pub fn reciprocal(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let y2 = cx.op("Mul", &[y, y], vec![])?;
    let p = cx.op("Mul", &[d, y2], vec![])?;
    Ok(vec![Some(cx.op("Neg", &[p], vec![])?)])
}
