//! Reductions. With `y = ReduceSum(x, axes)`, `dx = Expand(dy', Shape(x))`
//! where `dy'` is `dy` with the reduced axes put back (Unsqueeze when
//! `keepdims=0`); `ReduceMean` divides by the number of elements reduced,
//! `numel(x) / numel(y)`; `GlobalAveragePool` is a ReduceMean over the
//! spatial axes with `keepdims=1`. Only `Shape(x)` is read, never `x`.
//!
//! `ReduceMax` and `ReduceMin` (the exceptions: they keep `x` and `y`):
//! the gradient goes to the extrema, split evenly among ties as
//! `torch.amax`/`torch.amin` do: `dx = dy'·m / Σm` with `m = (x == y')`.
//!
//! `CumSum(x, axis)` (`exclusive`, `reverse`): `dx = CumSum(dy, axis)` with
//! the same `exclusive` and the opposite `reverse`; it reads no forward
//! value.

use super::dy;
use crate::cx::Cx;
use crate::Result;
use graphopt_ir::ValueId;

type Grads = Result<Vec<Option<ValueId>>>;

/// `dy` broadcast back to `x`'s shape.
fn spread(cx: &mut Cx, dys: &[Option<ValueId>]) -> Result<ValueId> {
    let d = dy(cx, dys)?;
    let (d, _) = keep_dims(cx, d)?;
    let x = cx.x(0)?;
    let s = cx.shape_of(x)?;
    cx.op("Expand", &[d, s], vec![])
}

/// `v` (shaped like the reduction's output) with the reduced axes put
/// back as 1s, and the normalized axes (`None`: a no-op reduction).
fn keep_dims(cx: &mut Cx, v: ValueId) -> Result<(ValueId, Option<Vec<i64>>)> {
    let d = v;
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    let keep = cx.attr_int("keepdims", 1) != 0;
    let axes_input = cx.input(1);
    let axes = match (cx.attr_ints("axes"), axes_input) {
        (Some(a), _) => Some(a),
        (None, Some(v)) => Some(
            cx.const_ints(v)
                .ok_or_else(|| cx.unsupported("axes computed at run time have no rule yet"))?,
        ),
        (None, None) => None,
    };
    let axes = match axes {
        Some(a) if !a.is_empty() => a,
        _ if cx.attr_int("noop_with_empty_axes", 0) != 0 => return Ok((d, None)),
        _ => (0..r).collect(),
    };
    let mut axes: Vec<i64> = axes
        .iter()
        .map(|&a| if a < 0 { a + r } else { a })
        .collect();
    axes.sort_unstable();
    let d = if keep { d } else { cx.unsqueeze(d, &axes)? };
    Ok((d, Some(axes)))
}

pub fn reduce_max(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (x, y) = (cx.x(0)?, cx.y(0)?);
    let dt = cx.dtype(x)?;
    let (dk, axes) = keep_dims(cx, d)?;
    let Some(axes) = axes else {
        return Ok(vec![Some(d), None]);
    };
    let (yk, _) = keep_dims(cx, y)?;
    let eq = cx.op("Equal", &[x, yk], vec![])?;
    let m = cx.op(
        "Cast",
        &[eq],
        vec![crate::cx::int_attr("to", dt.to_onnx() as i64)],
    )?;
    let n = cx.reduce_sum(m, &axes, true)?;
    let share = cx.op("Div", &[m, n], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[dk, share], vec![])?), None])
}

pub fn reduce_sum(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    Ok(vec![Some(spread(cx, dys)?), None])
}

pub fn reduce_mean(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let e = spread(cx, dys)?;
    let (x, y) = (cx.x(0)?, cx.y(0)?);
    let dt = cx.dtype(y)?;
    let nx = cx.numel_f(x, dt)?;
    let ny = cx.numel_f(y, dt)?;
    let n = cx.op("Div", &[nx, ny], vec![])?;
    Ok(vec![Some(cx.op("Div", &[e, n], vec![])?), None])
}

pub fn global_average_pool(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (x, y) = (cx.x(0)?, cx.y(0)?);
    let dt = cx.dtype(y)?;
    let s = cx.shape_of(x)?;
    let e = cx.op("Expand", &[d, s], vec![])?;
    let nx = cx.numel_f(x, dt)?;
    let ny = cx.numel_f(y, dt)?;
    let n = cx.op("Div", &[nx, ny], vec![])?;
    Ok(vec![Some(cx.op("Div", &[e, n], vec![])?)])
}

pub fn cum_sum(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let axis = cx.x(1)?;
    let excl = cx.attr_int("exclusive", 0);
    let rev = cx.attr_int("reverse", 0);
    let dx = cx.op(
        "CumSum",
        &[d, axis],
        vec![
            crate::cx::int_attr("exclusive", excl),
            crate::cx::int_attr("reverse", 1 - (rev != 0) as i64),
        ],
    )?;
    Ok(vec![Some(dx), None])
}
