//! Instance and group normalization. Neither node has outputs for its
//! statistics, so the backward pass recomputes them from `x` (which it
//! keeps, as torch does): `μ = mean(x)`, `σ⁻¹ = 1/√(mean((x - μ)²) + ε)`,
//! `x̂ = (x - μ)·σ⁻¹` over the normalized axes, and then, as for
//! LayerNormalization, with `dx̂ = dy·S`:
//!
//! `dX = σ⁻¹·(dx̂ - mean(dx̂) - x̂·mean(dx̂·x̂))`.
//!
//! `InstanceNormalization(X, S, B, ε)`: normalized over the spatial axes
//! `[2, rank)` per sample and channel; `S`, `B` per channel:
//! `dB = Σ dY`, `dS = Σ dY·x̂` over every axis but 1.
//!
//! `GroupNormalization(X, S, B, ε, num_groups = G)` (opset 18+): `X` seen as
//! `[N, G, -1]`, normalized over the last axis. From opset 21 `S` and `B`
//! are per channel (sums over every axis but 1, as above); before, per
//! group (sums of the grouped view over axes 0 and 2), as the spec of
//! opset 18 says and tract and onnxruntime read it.
//!
//! ```text
//! y = InstanceNormalization <epsilon = 1e-5> (x, s, b)
//! ==>  m = ReduceMean <axes = [2, 3]> (x), xc = Sub (x, m), ...,
//!      b_grad = ReduceSum (y_grad, [0, 2, 3]), s_grad = ReduceSum (Mul (y_grad, xhat), [0, 2, 3]),
//!      x_grad = Mul (rstd, Sub (Sub (dxh, ReduceMean (dxh)), Mul (xhat, ReduceMean (Mul (dxh, xhat)))))
//! ```

use super::dy;
use crate::cx::Cx;
use crate::Result;
use graphopt_ir::ValueId;

type Grads = Result<Vec<Option<ValueId>>>;

/// `(x̂, σ⁻¹)` of `x` over `axes` (kept as 1s).
fn stats(cx: &mut Cx, x: ValueId, axes: &[i64], eps: f64) -> Result<(ValueId, ValueId)> {
    let dt = cx.dtype(cx.x(0)?)?;
    let m = cx.reduce_mean(x, axes, true)?;
    let xc = cx.op("Sub", &[x, m], vec![])?;
    let sq = cx.op("Mul", &[xc, xc], vec![])?;
    let var = cx.reduce_mean(sq, axes, true)?;
    let e = cx.scalar(dt, eps)?;
    let ve = cx.op("Add", &[var, e], vec![])?;
    let sd = cx.op("Sqrt", &[ve], vec![])?;
    let rstd = cx.op("Reciprocal", &[sd], vec![])?;
    let xhat = cx.op("Mul", &[xc, rstd], vec![])?;
    Ok((xhat, rstd))
}

/// `σ⁻¹·(dx̂ - mean(dx̂) - x̂·mean(dx̂·x̂))` over `axes`.
fn dx_of(cx: &mut Cx, dxh: ValueId, xhat: ValueId, rstd: ValueId, axes: &[i64]) -> Result<ValueId> {
    let m1 = cx.reduce_mean(dxh, axes, true)?;
    let p = cx.op("Mul", &[dxh, xhat], vec![])?;
    let m2 = cx.reduce_mean(p, axes, true)?;
    let t = cx.op("Mul", &[xhat, m2], vec![])?;
    let a = cx.op("Sub", &[dxh, m1], vec![])?;
    let b = cx.op("Sub", &[a, t], vec![])?;
    cx.op("Mul", &[rstd, b], vec![])
}

pub fn instance_norm(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    if r < 3 {
        return Err(cx.unsupported("an input of rank below 3 has no rule"));
    }
    let eps = cx.attr_float("epsilon", 1e-5) as f64;
    let axes: Vec<i64> = (2..r).collect();
    let bc: Vec<i64> = std::iter::once(0).chain(2..r).collect();
    let (xhat, rstd) = stats(cx, x, &axes, eps)?;
    let mut out = vec![None, None, None];
    if cx.need(2) {
        out[2] = Some(cx.reduce_sum(d, &bc, false)?);
    }
    if cx.need(1) {
        let p = cx.op("Mul", &[d, xhat], vec![])?;
        out[1] = Some(cx.reduce_sum(p, &bc, false)?);
    }
    if cx.need(0) {
        let s = cx.x(1)?;
        let su = cx.unsqueeze(s, &bc)?;
        let dxh = cx.op("Mul", &[d, su], vec![])?;
        out[0] = Some(dx_of(cx, dxh, xhat, rstd, &axes)?);
    }
    Ok(out)
}

pub fn group_norm(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    if r < 2 {
        return Err(cx.unsupported("an input of rank below 2 has no rule"));
    }
    let g = cx.attr_int("num_groups", 0);
    if g <= 0 {
        return Err(cx.unsupported("num_groups is missing"));
    }
    let eps = cx.attr_float("epsilon", 1e-5) as f64;
    let per_channel = cx.opset >= 21;
    let grouped = cx.const_i64(&[0, g, -1])?;
    let xg = cx.reshape(x, grouped)?;
    let (xhat_g, rstd) = stats(cx, xg, &[2], eps)?;
    let xs = cx.shape_of(x)?;
    let mut out = vec![None, None, None];
    let dxh_g = if per_channel {
        let bc: Vec<i64> = std::iter::once(0).chain(2..r).collect();
        let xhat = cx.reshape(xhat_g, xs)?;
        if cx.need(2) {
            out[2] = Some(cx.reduce_sum(d, &bc, false)?);
        }
        if cx.need(1) {
            let p = cx.op("Mul", &[d, xhat], vec![])?;
            out[1] = Some(cx.reduce_sum(p, &bc, false)?);
        }
        if !cx.need(0) {
            return Ok(out);
        }
        let s = cx.x(1)?;
        let su = cx.unsqueeze(s, &bc)?;
        let dxh = cx.op("Mul", &[d, su], vec![])?;
        cx.reshape(dxh, grouped)?
    } else {
        let dg = cx.reshape(d, grouped)?;
        if cx.need(2) {
            out[2] = Some(cx.reduce_sum(dg, &[0, 2], false)?);
        }
        if cx.need(1) {
            let p = cx.op("Mul", &[dg, xhat_g], vec![])?;
            out[1] = Some(cx.reduce_sum(p, &[0, 2], false)?);
        }
        if !cx.need(0) {
            return Ok(out);
        }
        let s = cx.x(1)?;
        let su = cx.unsqueeze(s, &[0, 2])?;
        cx.op("Mul", &[dg, su], vec![])?
    };
    let dxg = dx_of(cx, dxh_g, xhat_g, rstd, &[2])?;
    out[0] = Some(cx.reshape(dxg, xs)?);
    Ok(out)
}
