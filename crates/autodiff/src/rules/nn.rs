//! Normalization layers.
//!
//! `LayerNormalization(X, S, B, axis, ε)` normalizes over the axes
//! `[axis, rank)`. The forward node's optional outputs `Mean` (`μ`) and
//! `InvStdDev` (`σ⁻¹ = 1/√(var + ε)`) are switched on and kept for the
//! backward pass, as torch keeps `X`, `μ` and `σ⁻¹`; with
//! `x̂ = (x - μ)·σ⁻¹`:
//!
//! - `dB = Σ dy`, `dS = Σ dy·x̂` over the non-normalized axes;
//! - `dx̂ = dy·S`;
//! - `dX = σ⁻¹·(dx̂ - mean(dx̂) - x̂·mean(dx̂·x̂))`, means over the normalized axes.
//!
//! The decomposed form torch exports before opset 17 (ReduceMean, Sub,
//! Pow, Sqrt, Div, ...) is differentiated op by op.

use super::{dy, out_dims};
use crate::cx::Cx;
use crate::Result;
use graphopt_ir::ValueId;

type Grads = Result<Vec<Option<ValueId>>>;

pub fn layer_norm(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    if dys.iter().skip(1).any(|d| d.is_some()) {
        return Err(cx.unsupported("gradients through the Mean and InvStdDev outputs have no rule"));
    }
    let d = dy(cx, dys)?;
    let od = out_dims(cx)?;
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    let axis = cx.attr_int("axis", -1);
    let axis = if axis < 0 { axis + r } else { axis };
    let axes: Vec<i64> = (axis..r).collect();
    let mut out = vec![None, None, None];
    // μ and σ⁻¹ from the forward node (its optional outputs, added if off).
    let node = cx.node;
    let yname = cx.g.name(cx.y(0)?).to_string();
    let mut saved = [None, None];
    for (k, slot) in saved.iter_mut().enumerate() {
        *slot = Some(match cx.g.node(node).output(k + 1) {
            Some(v) => v,
            None => {
                let hint = if k == 0 { "mean" } else { "inv_std_dev" };
                let v = cx.g.fresh_value(&format!("{yname}_{hint}"), None);
                cx.g.set_output(node, k + 1, Some(v));
                v
            }
        });
    }
    let (mean, rstd) = (saved[0].unwrap(), saved[1].unwrap());
    let xc = cx.op("Sub", &[x, mean], vec![])?;
    let xhat = cx.op("Mul", &[xc, rstd], vec![])?;
    if cx.need(2) {
        let b = cx.x(2)?;
        out[2] = Some(cx.unbroadcast(d, &od, b)?);
    }
    if cx.need(1) {
        let s = cx.x(1)?;
        let p = cx.op("Mul", &[d, xhat], vec![])?;
        out[1] = Some(cx.unbroadcast(p, &od, s)?);
    }
    if cx.need(0) {
        let s = cx.x(1)?;
        let dxh = cx.op("Mul", &[d, s], vec![])?;
        let m1 = cx.reduce_mean(dxh, &axes, true)?;
        let p = cx.op("Mul", &[dxh, xhat], vec![])?;
        let m2 = cx.reduce_mean(p, &axes, true)?;
        let t = cx.op("Mul", &[xhat, m2], vec![])?;
        let a = cx.op("Sub", &[dxh, m1], vec![])?;
        let b = cx.op("Sub", &[a, t], vec![])?;
        out[0] = Some(cx.op("Mul", &[rstd, b], vec![])?);
    }
    Ok(out)
}
