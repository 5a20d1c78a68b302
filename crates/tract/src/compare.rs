//! The one output comparison: each output judged alone (a large right
//! output must not hide a small wrong one), bits compared for identity (so
//! -0 and +0 differ), and a tolerance per element or per tensor. `graphopt
//! check`, precision validation and the numerical tests all use it.

use crate::TractTensor;
use serde::Serialize;

/// What an element's error is measured against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// `|got - ref| <= atol + rtol * |ref|`, element by element (Polygraphy,
    /// numpy's `allclose`).
    #[default]
    Element,
    /// `|got - ref| <= atol + rtol * max|ref|` over the output tensor: low
    /// precision errs in proportion to the operands, so an element near
    /// zero in a tensor of large values carries the tensor's absolute error.
    Tensor,
}

/// When two outputs agree.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
    pub scale: Scale,
}

impl Default for Tolerance {
    /// Polygraphy's defaults: rtol = atol = 1e-5, element by element.
    fn default() -> Self {
        Tolerance {
            rtol: 1e-5,
            atol: 1e-5,
            scale: Scale::Element,
        }
    }
}

/// One output's comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputDiff {
    pub name: String,
    pub shape: Vec<usize>,
    /// Same dtype, shape and bits (so -0 and +0 differ).
    pub identical: bool,
    pub max_abs: f64,
    /// The largest `|got - ref| / |ref|` over elements with `ref != 0`.
    pub max_rel: f64,
    /// `‖got − ref‖₂ / ‖ref‖₂` (the absolute norm when `ref` is all zero).
    pub rel_l2: f64,
    /// Elements outside the tolerance.
    pub mismatched: u64,
    pub elements: u64,
    /// Within the tolerance (non-float outputs: identical).
    pub ok: bool,
    /// Why it could not be compared (shape or dtype mismatch).
    pub error: Option<String>,
}

/// Compares outputs pairwise; `names` labels them.
pub fn compare_outputs(
    names: &[String],
    reference: &[TractTensor],
    got: &[TractTensor],
    tol: &Tolerance,
) -> Vec<OutputDiff> {
    reference
        .iter()
        .zip(got)
        .enumerate()
        .map(|(i, (x, y))| {
            let name = names.get(i).cloned().unwrap_or_else(|| format!("#{i}"));
            compare_one(name, x, y, tol)
        })
        .collect()
}

fn compare_one(name: String, x: &TractTensor, y: &TractTensor, tol: &Tolerance) -> OutputDiff {
    let mut d = OutputDiff {
        name,
        shape: x.shape().to_vec(),
        identical: same_bits(x, y),
        max_abs: 0.0,
        max_rel: 0.0,
        rel_l2: 0.0,
        mismatched: 0,
        elements: x.len() as u64,
        ok: true,
        error: None,
    };
    if x.shape() != y.shape() {
        d.ok = false;
        d.error = Some(format!("shape {:?} vs {:?}", x.shape(), y.shape()));
        return d;
    }
    let float = |t: &TractTensor| t.datum_type().is_float();
    if !(float(x) && float(y)) {
        // Integers, booleans, strings: exact or wrong.
        d.ok = d.identical;
        if x.datum_type() != y.datum_type() {
            d.error = Some(format!(
                "dtype {:?} vs {:?}",
                x.datum_type(),
                y.datum_type()
            ));
        } else if !d.ok {
            d.mismatched = x
                .cast_to::<i64>()
                .ok()
                .zip(y.cast_to::<i64>().ok())
                .and_then(|(a, b)| {
                    let (a, b) = (
                        a.to_plain_array_view::<i64>().ok()?,
                        b.to_plain_array_view::<i64>().ok()?,
                    );
                    Some(a.iter().zip(b.iter()).filter(|(p, q)| p != q).count() as u64)
                })
                .unwrap_or(d.elements);
        }
        return d;
    }
    let (Ok(xf), Ok(yf)) = (x.cast_to::<f64>(), y.cast_to::<f64>()) else {
        d.ok = d.identical;
        return d;
    };
    let (Ok(xs), Ok(ys)) = (
        xf.to_plain_array_view::<f64>(),
        yf.to_plain_array_view::<f64>(),
    ) else {
        d.ok = d.identical;
        return d;
    };
    let tensor_scale = xs
        .iter()
        .filter(|p| p.is_finite())
        .fold(0f64, |m, p| m.max(p.abs()));
    let (mut num, mut den) = (0f64, 0f64);
    for (&p, &q) in xs.iter().zip(ys.iter()) {
        den += if p.is_finite() { p * p } else { 0.0 };
        if p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()) || p == q {
            continue;
        }
        let diff = (p - q).abs();
        let diff = if diff.is_nan() { f64::INFINITY } else { diff };
        let scale = match tol.scale {
            Scale::Element => p.abs(),
            Scale::Tensor => tensor_scale,
        };
        if diff > tol.atol + tol.rtol * scale {
            d.mismatched += 1;
        }
        d.max_abs = d.max_abs.max(diff);
        if p != 0.0 {
            d.max_rel = d.max_rel.max(diff / p.abs());
        }
        num += if diff.is_finite() {
            diff * diff
        } else {
            f64::INFINITY
        };
    }
    d.rel_l2 = if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    };
    d.ok = d.mismatched == 0;
    d
}

/// Same dtype, shape and bits: `-0.0` and `+0.0` differ, and so do NaNs
/// with different payloads (tract's `==` compares values).
pub fn same_bits(x: &TractTensor, y: &TractTensor) -> bool {
    x.datum_type() == y.datum_type()
        && x.shape() == y.shape()
        && if x.datum_type().is_copy() {
            x.as_bytes() == y.as_bytes()
        } else {
            x == y
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::prelude::tract_ndarray::arr1;

    fn t(v: &[f32]) -> TractTensor {
        arr1(v).into()
    }

    #[test]
    fn each_output_is_judged_alone() {
        // A large right output must not hide a small wrong one.
        let r = [t(&[1000.0, -1000.0]), t(&[1e-3, 2e-3])];
        let g = [t(&[1000.0, -1000.0]), t(&[1e-3, 9e-3])];
        let names = ["big".to_string(), "small".to_string()];
        let d = compare_outputs(&names, &r, &g, &Tolerance::default());
        assert!(d[0].ok && d[0].identical);
        assert!(!d[1].ok);
        assert_eq!(d[1].mismatched, 1);
        assert!((d[1].max_abs - 7e-3).abs() < 1e-9);
    }

    #[test]
    fn signed_zero_is_not_identical_but_within_tolerance() {
        let d = compare_outputs(&[], &[t(&[0.0])], &[t(&[-0.0])], &Tolerance::default());
        assert!(!d[0].identical);
        assert!(d[0].ok);
    }

    #[test]
    fn tensor_scale_forgives_small_elements_of_large_tensors() {
        let r = [t(&[100.0, 0.001])];
        let g = [t(&[100.0, 0.002])];
        let el = Tolerance {
            rtol: 1e-3,
            atol: 0.0,
            scale: Scale::Element,
        };
        let ts = Tolerance {
            scale: Scale::Tensor,
            ..el
        };
        assert!(!compare_outputs(&[], &r, &g, &el)[0].ok);
        assert!(compare_outputs(&[], &r, &g, &ts)[0].ok);
    }

    #[test]
    fn nan_matches_nan_and_inf_is_a_mismatch() {
        let d = compare_outputs(
            &[],
            &[t(&[f32::NAN, 1.0])],
            &[t(&[f32::NAN, f32::INFINITY])],
            &Tolerance::default(),
        );
        assert!(!d[0].ok);
        assert_eq!(d[0].mismatched, 1);
        assert!(d[0].max_abs.is_infinite());
    }
}
