//! Reductions. With `y = ReduceSum(x, axes)`, `dx = Expand(dy', Shape(x))`
//! where `dy'` is `dy` with the reduced axes put back (Unsqueeze when
//! `keepdims=0`); `ReduceMean` divides by the number of elements reduced,
//! `numel(x) / numel(y)`; `GlobalAveragePool` is a ReduceMean over the
//! spatial axes with `keepdims=1`. Only `Shape(x)` is read, never `x`.

use super::dy;
use crate::cx::Cx;
use crate::Result;
use graphopt_ir::ValueId;

type Grads = Result<Vec<Option<ValueId>>>;

/// `dy` broadcast back to `x`'s shape.
fn spread(cx: &mut Cx, dys: &[Option<ValueId>]) -> Result<ValueId> {
    let d = dy(cx, dys)?;
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
        _ if cx.attr_int("noop_with_empty_axes", 0) != 0 => return Ok(d),
        _ => (0..r).collect(),
    };
    let mut axes: Vec<i64> = axes
        .iter()
        .map(|&a| if a < 0 { a + r } else { a })
        .collect();
    axes.sort_unstable();
    let d = if keep { d } else { cx.unsqueeze(d, &axes)? };
    let s = cx.shape_of(x)?;
    cx.op("Expand", &[d, s], vec![])
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
