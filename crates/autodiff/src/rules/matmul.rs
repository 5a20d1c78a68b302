//! Matrix products.
//!
//! - `MatMul` (both operands of rank ≥ 2, batch dims broadcast):
//!   `dA = dY·Bᵀ`, `dB = Aᵀ·dY` (transposing the last two axes), each
//!   reduced back over the batch axes it was broadcast on. When `B` is a
//!   2-D weight of known width, `dB = reshape(A, [-1, K])ᵀ · reshape(dY, [-1, N])`
//!   sums the batch inside one product instead of materializing a
//!   per-batch `[.., K, N]` tensor. In float32, both products with a 2-D
//!   weight are Gemms whose transposes are attributes (`dA =
//!   Gemm(dY, B, transB=1)`, `dB = Gemm(A, dY, transA=1)`, over rows
//!   flattened by views), so neither the weight nor the activation is
//!   copied transposed: `Transpose(A)` was an activation-sized copy on every
//!   step, `Transpose(B)` a weight-sized one (154 MB for GPT-2's LM head).
//!
//!   When `dY` is uniform, the scalar `s` everywhere ([`Cx::uniform`]: the
//!   sum and mean losses on a language model's logits), the products
//!   collapse to sums and `dY` is never materialized: `dY·Bᵀ` is
//!   `s·Σₙ B[.., k, n]` on every row, `dA = Expand(s·Unsqueeze(ReduceSum(B,
//!   -1), -2), Shape(A))` when `A` was not broadcast over the batch; and
//!   `Aᵀ·dY` is `s·Σₘ A[.., m, k]` in every column, `dB = Expand(s·
//!   Unsqueeze(ReduceSum(A, axes), -1), Shape(B))` summing the batch axes
//!   too when `B` is 2-D (else when `B` has the result's batch dims). Other
//!   broadcasts take the general products.
//! - `Gemm` (`Y = α·A'·B' + β·C`, `A' = transA ? Aᵀ : A`, same for B):
//!   `dA' = α·dY·B'ᵀ`, `dB' = α·A'ᵀ·dY`, written as Gemms with the
//!   transposes folded into `transA`/`transB`; `dC = β·dY` reduced to C's
//!   shape.

use super::{dy, out_dims};
use crate::cx::{float_attr, int_attr, Cx};
use crate::Result;
use graphopt_ir::{DType, Dim, ValueId};

type Grads = Result<Vec<Option<ValueId>>>;

/// The permutation swapping the last two of `r` axes.
fn swap_last(r: usize) -> Vec<i64> {
    let mut p: Vec<i64> = (0..r as i64).collect();
    p.swap(r - 2, r - 1);
    p
}

pub fn matmul(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (a, b) = (cx.x(0)?, cx.x(1)?);
    let (ra, rb) = (cx.rank(a)?, cx.rank(b)?);
    if ra < 2 || rb < 2 {
        return Err(cx.unsupported("a 1-D operand has no rule yet"));
    }
    let yd = out_dims(cx)?;
    let ry = yd.len();
    let (ad, bd) = (
        cx.dims(a).unwrap_or_default(),
        cx.dims(b).unwrap_or_default(),
    );
    let mut out = vec![None, None];
    // Gemm (2-D, transposes as attributes) where every runtime has it:
    // float32. Other types transpose and multiply.
    // (An operand of unknown type keeps the general products: this rule
    // needs no types otherwise.)
    let f32 = [a, b]
        .iter()
        .all(|&v| cx.dtype(v).is_ok_and(|t| t == DType::F32));
    let uniform = cx.uniform(d);
    // dY's rows flattened to [-1, N] (a view), made once for both products.
    let n = yd[ry - 1].known();
    let mut flat = None;
    let mut flat_d = |cx: &mut Cx, n: i64| -> Result<ValueId> {
        if let Some(v) = flat {
            return Ok(v);
        }
        let sn = cx.const_i64(&[-1, n])?;
        let v = cx.reshape(d, sn)?;
        flat = Some(v);
        Ok(v)
    };
    // Dims equal and known (static or the same symbol).
    let same = |x: &[Dim], y: &[Dim]| x == y && !x.contains(&Dim::Unknown);
    if let Some(s) =
        uniform.filter(|_| cx.need(0) && ra == ry && same(&ad[..ra - 2], &yd[..ry - 2]))
    {
        let r = cx.reduce_sum(b, &[rb as i64 - 1], false)?;
        let u = cx.unsqueeze(r, &[-2])?;
        let g = cx.op("Mul", &[u, s], vec![])?;
        out[0] = Some(cx.expand_like(g, a)?);
    } else if cx.need(0) {
        out[0] = Some(match (rb, n) {
            // A 2-D weight: one Gemm reads it transposed (transB), with no
            // transposed copy, over dY's rows flattened (views).
            (2, _) if f32 && ra == 2 => gemm_t(cx, d, b, false, true, None)?,
            (2, Some(n)) if f32 => {
                let d2 = flat_d(cx, n)?;
                let g = gemm_t(cx, d2, b, false, true, None)?;
                let sa = cx.shape_of(a)?;
                cx.reshape(g, sa)?
            }
            _ => {
                let bt = cx.transpose(b, &swap_last(rb))?;
                let g = cx.op("MatMul", &[d, bt], vec![])?;
                let mut gd = yd[..ry - 2].to_vec();
                gd.extend_from_slice(&ad[ra - 2..]);
                cx.unbroadcast(g, &gd, a)?
            }
        });
    }
    let b_axes: Option<Vec<i64>> = if rb == 2 {
        Some((0..ra as i64 - 1).collect())
    } else if rb == ry && same(&bd[..rb - 2], &yd[..ry - 2]) {
        Some(vec![ra as i64 - 2])
    } else {
        None
    };
    if let (Some(s), Some(axes), true) = (uniform, &b_axes, cx.need(1)) {
        let r = cx.reduce_sum(a, axes, false)?;
        let u = cx.unsqueeze(r, &[-1])?;
        let g = cx.op("Mul", &[u, s], vec![])?;
        out[1] = Some(cx.expand_like(g, b)?);
    } else if cx.need(1) {
        let k = ad[ra - 1].known();
        out[1] = Some(match (rb, k, n) {
            (2, _, _) if ra == 2 && f32 => gemm_t(cx, a, d, true, false, None)?,
            (2, Some(k), Some(n)) if ra > 2 => {
                let sk = cx.const_i64(&[-1, k])?;
                let a2 = cx.reshape(a, sk)?;
                let d2 = flat_d(cx, n)?;
                if f32 {
                    gemm_t(cx, a2, d2, true, false, None)?
                } else {
                    let at = cx.transpose(a2, &[1, 0])?;
                    cx.op("MatMul", &[at, d2], vec![])?
                }
            }
            _ => {
                let at = cx.transpose(a, &swap_last(ra))?;
                let g = cx.op("MatMul", &[at, d], vec![])?;
                let mut gd = yd[..ry - 2].to_vec();
                gd.extend_from_slice(&bd[rb - 2..]);
                cx.unbroadcast(g, &gd, b)?
            }
        });
    }
    Ok(out)
}

/// `Gemm(x, y)` with `transA`/`transB` (and `alpha` when given): the
/// transposed operand is read in place, never copied.
fn gemm_t(
    cx: &mut Cx,
    x: ValueId,
    y: ValueId,
    ta: bool,
    tb: bool,
    alpha: Option<f32>,
) -> Result<ValueId> {
    let mut attrs: Vec<_> = alpha.map(|a| float_attr("alpha", a)).into_iter().collect();
    attrs.extend([int_attr("transA", ta as i64), int_attr("transB", tb as i64)]);
    cx.op("Gemm", &[x, y], attrs)
}

pub fn gemm(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (a, b) = (cx.x(0)?, cx.x(1)?);
    let ta = cx.attr_int("transA", 0) != 0;
    let tb = cx.attr_int("transB", 0) != 0;
    let alpha = cx.attr_float("alpha", 1.0);
    let beta = cx.attr_float("beta", 1.0);
    let gemm = |cx: &mut Cx, x: ValueId, y: ValueId, t1: bool, t2: bool| {
        gemm_t(cx, x, y, t1, t2, Some(alpha))
    };
    let mut out = vec![None, None, None];
    if cx.need(0) {
        // A' = A: dA = α·dY·B'ᵀ; A' = Aᵀ: dA = α·B'·dYᵀ.
        out[0] = Some(if ta {
            gemm(cx, b, d, tb, true)?
        } else {
            gemm(cx, d, b, false, !tb)?
        });
    }
    if cx.need(1) {
        // B' = B: dB = α·A'ᵀ·dY; B' = Bᵀ: dB = α·dYᵀ·A'.
        out[1] = Some(if tb {
            gemm(cx, d, a, true, ta)?
        } else {
            gemm(cx, a, d, !ta, false)?
        });
    }
    if cx.need(2) {
        let c = cx.x(2)?;
        let dt = cx.dtype(c)?;
        let yd = out_dims(cx).unwrap_or(vec![Dim::Unknown, Dim::Unknown]);
        let s = cx.scale(d, dt, beta as f64)?;
        out[2] = Some(cx.unbroadcast(s, &yd, c)?);
    }
    Ok(out)
}
