//! Activations. Where the derivative is a function of the output, the rule
//! reads the output so the input need not stay alive:
//!
//! - `Relu`: `dx = Where(y > 0, dy, 0)`;
//! - `Sigmoid`: `dx = dy·y·(1 - y)`; `Tanh`: `dx = dy·(1 - y²)`;
//! - `Erf`: `dx = dy·(2/√π)·exp(-x²)`;
//! - `Gelu` (`approximate="none"`): `dx = dy·(Φ(x) + x·φ(x))` with
//!   `Φ(x) = ½(1 + erf(x/√2))`, `φ(x) = exp(-x²/2)/√(2π)`;
//! - `Gelu` (`approximate="tanh"`): `y = ½x(1 + t)`, `t = tanh(u)`,
//!   `u = √(2/π)(x + 0.044715x³)`; `dx = dy·(½(1 + t) + ½x(1 - t²)·√(2/π)(1
//!   + 3·0.044715x²))` (`t` recomputed from `x`);
//! - `PRelu(x, slope)` (slope broadcast to `x`): `dx = Where(x > 0, dy,
//!   slope·dy)`, `dslope = unbroadcast(Where(x > 0, 0, dy·x))`;
//! - `HardSigmoid(α, β)`: `dx = Where(0 < αx + β < 1, α·dy, 0)`;
//! - `HardSwish`: `y = x·HardSigmoid(x; 1/6, ½)`, `dx = dy·Where(x < -3, 0,
//!   Where(x > 3, 1, (2x + 3)/6))`;
//! - `LeakyRelu(α)`: `dx = Where(x > 0, dy, α·dy)`;
//! - `Softplus`: `dx = dy·σ(x)`; `Elu(α)`: `dx = Where(x > 0, dy, dy·(y + α))`;
//! - `Softmax` on axis `k`: `dx = y·(dy - Σ_k dy·y)`;
//! - `LogSoftmax` on axis `k`: `dx = dy - exp(y)·Σ_k dy`.
//!
//! Softmax and LogSoftmax before opset 13 flatten to 2-D at `axis`; that
//! equals the opset-13 form only when `axis` is the last axis, the only
//! case accepted there.

use super::dy;
use crate::cx::Cx;
use crate::Result;
use graphopt_ir::ValueId;

type Grads = Result<Vec<Option<ValueId>>>;

pub fn relu(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let dt = cx.dtype(y)?;
    let zero = cx.scalar(dt, 0.0)?;
    let pos = cx.op("Greater", &[y, zero], vec![])?;
    Ok(vec![Some(cx.op("Where", &[pos, d, zero], vec![])?)])
}

/// `Clip(x, min, max)` (ReLU6 and hardtanh in torch exports):
/// `dx = dy` where `min < y < max`, else 0 — strictly, as torch's
/// hardtanh backward, and read from the output `y` (the same test as on
/// `x`, and `y` is what the next op saves anyway). Absent bounds are open.
/// The bounds get no gradient.
pub fn clip(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    if cx.need(1) || cx.need(2) {
        return Err(cx.unsupported("no gradient for Clip's min/max inputs"));
    }
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let dt = cx.dtype(y)?;
    let mut inside = None;
    if let Some(lo) = cx.input(1) {
        inside = Some(cx.op("Greater", &[y, lo], vec![])?);
    }
    if let Some(hi) = cx.input(2) {
        let below = cx.op("Less", &[y, hi], vec![])?;
        inside = Some(match inside {
            Some(above) => cx.op("And", &[above, below], vec![])?,
            None => below,
        });
    }
    let dx = match inside {
        Some(m) => {
            let zero = cx.scalar(dt, 0.0)?;
            cx.op("Where", &[m, d, zero], vec![])?
        }
        None => d,
    };
    Ok(vec![Some(dx)])
}

pub fn sigmoid(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let dt = cx.dtype(y)?;
    let one = cx.scalar(dt, 1.0)?;
    let om = cx.op("Sub", &[one, y], vec![])?;
    let t = cx.op("Mul", &[y, om], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[d, t], vec![])?)])
}

pub fn tanh(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let dt = cx.dtype(y)?;
    let one = cx.scalar(dt, 1.0)?;
    let y2 = cx.op("Mul", &[y, y], vec![])?;
    let om = cx.op("Sub", &[one, y2], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[d, om], vec![])?)])
}

/// `exp(-x²·s)`.
fn gauss(cx: &mut Cx, x: ValueId, s: f64) -> Result<ValueId> {
    let dt = cx.dtype(x)?;
    let x2 = cx.op("Mul", &[x, x], vec![])?;
    let e = cx.scale(x2, dt, -s)?;
    cx.op("Exp", &[e], vec![])
}

pub fn erf(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    let g = gauss(cx, x, 1.0)?;
    let s = cx.scale(g, dt, 2.0 / std::f64::consts::PI.sqrt())?;
    Ok(vec![Some(cx.op("Mul", &[d, s], vec![])?)])
}

pub fn gelu(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let approx =
        cx.g.node(cx.node)
            .attr_str("approximate")
            .unwrap_or("none")
            .to_string();
    if approx == "tanh" {
        return gelu_tanh(cx, dys);
    }
    if approx != "none" {
        return Err(cx.unsupported(format!("approximate=\"{approx}\" is not an ONNX form")));
    }
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    // Φ(x) = ½(1 + erf(x/√2))
    let xs = cx.scale(x, dt, std::f64::consts::FRAC_1_SQRT_2)?;
    let e = cx.op("Erf", &[xs], vec![])?;
    let one = cx.scalar(dt, 1.0)?;
    let e1 = cx.op("Add", &[e, one], vec![])?;
    let cdf = cx.scale(e1, dt, 0.5)?;
    // x·φ(x)
    let g = gauss(cx, x, 0.5)?;
    let pdf = cx.scale(g, dt, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
    let xpdf = cx.op("Mul", &[x, pdf], vec![])?;
    let s = cx.op("Add", &[cdf, xpdf], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[d, s], vec![])?)])
}

/// The softmax axis, normalized; before opset 13 only the last axis.
fn softmax_axis(cx: &Cx) -> Result<i64> {
    let y = cx.y(0)?;
    let r = cx.rank(y)? as i64;
    let default = if cx.opset >= 13 { -1 } else { 1 };
    let a = cx.attr_int("axis", default);
    let a = if a < 0 { a + r } else { a };
    if cx.opset < 13 && a != r - 1 {
        return Err(cx.unsupported(
            "before opset 13 softmax flattens at axis; only the last axis has a rule",
        ));
    }
    Ok(a)
}

pub fn softmax(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let a = softmax_axis(cx)?;
    let dyy = cx.op("Mul", &[d, y], vec![])?;
    let s = cx.reduce_sum(dyy, &[a], true)?;
    let diff = cx.op("Sub", &[d, s], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[y, diff], vec![])?)])
}

pub fn log_softmax(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let y = cx.y(0)?;
    let a = softmax_axis(cx)?;
    let s = cx.reduce_sum(d, &[a], true)?;
    let p = cx.op("Exp", &[y], vec![])?;
    let ps = cx.op("Mul", &[p, s], vec![])?;
    Ok(vec![Some(cx.op("Sub", &[d, ps], vec![])?)])
}

pub fn hard_sigmoid(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    let alpha = cx.attr_float("alpha", 0.2) as f64;
    let beta = cx.attr_float("beta", 0.5) as f64;
    // 0 < αx + β < 1  <=>  lo < x < hi (α > 0)
    let (lo, hi) = if alpha > 0.0 {
        (-beta / alpha, (1.0 - beta) / alpha)
    } else {
        return Err(cx.unsupported("alpha <= 0 has no rule"));
    };
    let lo = cx.scalar(dt, lo)?;
    let hi = cx.scalar(dt, hi)?;
    let a = cx.op("Greater", &[x, lo], vec![])?;
    let b = cx.op("Less", &[x, hi], vec![])?;
    let inside = cx.op("And", &[a, b], vec![])?;
    let zero = cx.scalar(dt, 0.0)?;
    let ad = cx.scale(d, dt, alpha)?;
    Ok(vec![Some(cx.op("Where", &[inside, ad, zero], vec![])?)])
}

pub fn hard_swish(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    let three = cx.scalar(dt, 3.0)?;
    let m3 = cx.scalar(dt, -3.0)?;
    let zero = cx.scalar(dt, 0.0)?;
    let one = cx.scalar(dt, 1.0)?;
    // (2x + 3) / 6 = x/3 + 1/2
    let x3 = cx.scale(x, dt, 1.0 / 3.0)?;
    let half = cx.scalar(dt, 0.5)?;
    let mid = cx.op("Add", &[x3, half], vec![])?;
    let hi = cx.op("Greater", &[x, three], vec![])?;
    let upper = cx.op("Where", &[hi, one, mid], vec![])?;
    let lo = cx.op("Less", &[x, m3], vec![])?;
    let slope = cx.op("Where", &[lo, zero, upper], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[d, slope], vec![])?)])
}

pub fn leaky_relu(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    let alpha = cx.attr_float("alpha", 0.01) as f64;
    let zero = cx.scalar(dt, 0.0)?;
    let pos = cx.op("Greater", &[x, zero], vec![])?;
    let ad = cx.scale(d, dt, alpha)?;
    Ok(vec![Some(cx.op("Where", &[pos, d, ad], vec![])?)])
}

pub fn softplus(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let s = cx.op("Sigmoid", &[x], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[d, s], vec![])?)])
}

pub fn elu(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (x, y) = (cx.x(0)?, cx.y(0)?);
    let dt = cx.dtype(x)?;
    let alpha = cx.attr_float("alpha", 1.0) as f64;
    let zero = cx.scalar(dt, 0.0)?;
    let a = cx.scalar(dt, alpha)?;
    let pos = cx.op("Greater", &[x, zero], vec![])?;
    let ya = cx.op("Add", &[y, a], vec![])?;
    let neg = cx.op("Mul", &[d, ya], vec![])?;
    Ok(vec![Some(cx.op("Where", &[pos, d, neg], vec![])?)])
}

fn gelu_tanh(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    const K: f64 = 0.044715;
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let x2 = cx.op("Mul", &[x, x], vec![])?;
    // u = c·x·(1 + K·x²)
    let kx2 = cx.scale(x2, dt, K)?;
    let one = cx.scalar(dt, 1.0)?;
    let a = cx.op("Add", &[kx2, one], vec![])?;
    let xa = cx.op("Mul", &[x, a], vec![])?;
    let u = cx.scale(xa, dt, c)?;
    let t = cx.op("Tanh", &[u], vec![])?;
    // ½(1 + t)
    let t1 = cx.op("Add", &[t, one], vec![])?;
    let left = cx.scale(t1, dt, 0.5)?;
    // ½x(1 - t²)·c(1 + 3K·x²)
    let tt = cx.op("Mul", &[t, t], vec![])?;
    let sech2 = cx.op("Sub", &[one, tt], vec![])?;
    let k3 = cx.scale(x2, dt, 3.0 * K)?;
    let du = cx.op("Add", &[k3, one], vec![])?;
    let xs = cx.op("Mul", &[x, sech2], vec![])?;
    let r = cx.op("Mul", &[xs, du], vec![])?;
    let right = cx.scale(r, dt, 0.5 * c)?;
    let s = cx.op("Add", &[left, right], vec![])?;
    Ok(vec![Some(cx.op("Mul", &[d, s], vec![])?)])
}

pub fn prelu(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (x, slope) = (cx.x(0)?, cx.x(1)?);
    let dt = cx.dtype(x)?;
    let od = super::out_dims(cx)?;
    let zero = cx.scalar(dt, 0.0)?;
    let pos = cx.op("Greater", &[x, zero], vec![])?;
    let mut out = vec![None, None];
    if cx.need(0) {
        let sd = cx.op("Mul", &[d, slope], vec![])?;
        out[0] = Some(cx.op("Where", &[pos, d, sd], vec![])?);
    }
    if cx.need(1) {
        let dx = cx.op("Mul", &[d, x], vec![])?;
        let neg = cx.op("Where", &[pos, zero, dx], vec![])?;
        out[1] = Some(cx.unbroadcast(neg, &od, slope)?);
    }
    Ok(out)
}
