//! Elementwise arithmetic, comparisons, casts and integer reductions on
//! element bits. Integers are computed in `i128` and wrapped to their
//! width (ORT's C++ wraps in practice); floats in their own precision.

use super::{invalid, Cx, EvalError, EvalResult, Val};
use graphopt_ir::DType;
use half::{bf16, f16};
use ndarray::{ArrayD, Axis, IxDyn, Zip};

/// An integer dtype's element as i128 (bool as 0/1).
pub(crate) fn int_of(b: u64, d: DType) -> i128 {
    match d {
        DType::I8 => b as u8 as i8 as i128,
        DType::I16 => b as u16 as i16 as i128,
        DType::I32 => b as u32 as i32 as i128,
        DType::I64 => b as i64 as i128,
        DType::Bool => (b != 0) as i128,
        _ => b as i128,
    }
}

/// `x` wrapped to integer dtype `d`'s width, as element bits.
fn bits_of_int(x: i128, d: DType) -> u64 {
    let w = d.bits().unwrap_or(64);
    if d == DType::Bool {
        return (x != 0) as u64;
    }
    let m = if w >= 64 { u64::MAX } else { (1u64 << w) - 1 };
    (x as u64) & m
}

/// Whether `x` fits integer dtype `d` without wrapping.
fn fits(x: i128, d: DType) -> bool {
    let w = d.bits().unwrap_or(64) as u32;
    let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
    if signed {
        x >= -(1i128 << (w - 1)) && x < (1i128 << (w - 1))
    } else {
        x >= 0 && x < (1i128 << w)
    }
}

fn is_int(d: DType) -> bool {
    d.is_int() && d.bits().is_some_and(|b| b >= 8)
}

fn is_f(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64)
}

/// A float element widened to f64 (exact for f16/bf16/f32).
fn f64_of(b: u64, d: DType) -> Option<f64> {
    Some(match d {
        DType::F32 => f32::from_bits(b as u32) as f64,
        DType::F64 => f64::from_bits(b),
        DType::F16 => f16::from_bits(b as u16).to_f64(),
        DType::BF16 => bf16::from_bits(b as u16).to_f64(),
        _ => return None,
    })
}

/// Applies `$f` to one or two float elements in the dtype's own width;
/// NaN results are refused (their payload is implementation-defined).
macro_rules! fop {
    ($d:expr, |$x:ident| $e:expr, $a:expr) => {
        match $d {
            DType::F32 => {
                let $x = f32::from_bits($a as u32);
                let r: f32 = $e;
                (!r.is_nan()).then_some(r.to_bits() as u64)
            }
            DType::F64 => {
                let $x = f64::from_bits($a);
                let r: f64 = $e;
                (!r.is_nan()).then_some(r.to_bits())
            }
            _ => None,
        }
    };
    ($d:expr, |$x:ident, $y:ident| $e:expr, $a:expr, $b:expr) => {
        match $d {
            DType::F32 => {
                let ($x, $y) = (f32::from_bits($a as u32), f32::from_bits($b as u32));
                if $x.is_nan() || $y.is_nan() {
                    None
                } else {
                    let r: f32 = $e;
                    (!r.is_nan()).then_some(r.to_bits() as u64)
                }
            }
            DType::F64 => {
                let ($x, $y) = (f64::from_bits($a), f64::from_bits($b));
                if $x.is_nan() || $y.is_nan() {
                    None
                } else {
                    let r: f64 = $e;
                    (!r.is_nan()).then_some(r.to_bits())
                }
            }
            _ => None,
        }
    };
}

/// Numpy-style broadcast of shapes.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> EvalResult<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return invalid(format!("shapes {shapes:?} do not broadcast"));
            }
        }
    }
    Ok(out)
}

/// `f` over broadcast `a`, `b`; `None` from `f` means "do not fold".
fn zip2(
    cx: &Cx,
    a: &Val,
    b: &Val,
    out: DType,
    f: impl Fn(u64, u64) -> Option<u64>,
) -> EvalResult<Val> {
    let shape = broadcast_shapes(&[a.shape(), b.shape()])?;
    cx.check(&shape, out)?;
    let av = a.a.broadcast(IxDyn(&shape)).ok_or(EvalError::Skip)?;
    let bv = b.a.broadcast(IxDyn(&shape)).ok_or(EvalError::Skip)?;
    let r: ArrayD<Option<u64>> = Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y));
    collect(out, r)
}

fn map1(a: &Val, out: DType, f: impl Fn(u64) -> Option<u64>) -> EvalResult<Val> {
    collect(out, a.a.map(|&x| f(x)))
}

fn collect(out: DType, r: ArrayD<Option<u64>>) -> EvalResult<Val> {
    let shape = r.shape().to_vec();
    let bits = r.iter().copied().collect::<Option<Vec<u64>>>();
    Val::from_vec(out, &shape, bits.ok_or(EvalError::Skip)?)
}

fn same_dtype(a: &Val, b: &Val) -> EvalResult<DType> {
    if a.dtype != b.dtype {
        return invalid(format!("input types differ: {} and {}", a.dtype, b.dtype));
    }
    Ok(a.dtype)
}

/// `Min`/`Max` of two floats when unambiguous: not NaN, and not `-0`
/// against `+0` (which ORT's `cwiseMin` may return either of).
fn fminmax(d: DType, x: u64, y: u64, max: bool) -> Option<u64> {
    let (p, q) = (f64_of(x, d)?, f64_of(y, d)?);
    if p.is_nan() || q.is_nan() || (p == q && x != y) {
        return None;
    }
    Some(if (p < q) == max { y } else { x })
}

fn minmax(d: DType, x: u64, y: u64, max: bool) -> Option<u64> {
    if is_int(d) {
        let (p, q) = (int_of(x, d), int_of(y, d));
        Some(if (p < q) == max { y } else { x })
    } else if is_f(d) {
        fminmax(d, x, y, max)
    } else {
        None
    }
}

pub(super) fn eval(cx: &Cx) -> EvalResult<Val> {
    let op = cx.node.op_type.as_str();
    match op {
        "Add" | "Sub" | "Mul" | "Div" | "Mod" => {
            let (a, b) = (cx.input(0)?, cx.input(1)?);
            let d = same_dtype(a, b)?;
            let fmod = cx.ai("fmod").unwrap_or(0) != 0;
            if is_int(d) {
                zip2(cx, a, b, d, |x, y| {
                    let (p, q) = (int_of(x, d), int_of(y, d));
                    let r = match op {
                        "Add" => p.wrapping_add(q),
                        "Sub" => p.wrapping_sub(q),
                        "Mul" => p.wrapping_mul(q),
                        // Division by zero and MIN / -1 are undefined in C++.
                        "Div" => {
                            let r = p.checked_div(q)?;
                            fits(r, d).then_some(r)?
                        }
                        _ => {
                            let r = p.checked_rem(q)?;
                            if !fmod && r != 0 && ((r < 0) != (q < 0)) {
                                r + q
                            } else {
                                r
                            }
                        }
                    };
                    Some(bits_of_int(r, d))
                })
            } else if is_f(d) {
                if op == "Mod" && !fmod {
                    return invalid("Mod on floats requires fmod=1");
                }
                zip2(cx, a, b, d, |x, y| match op {
                    "Add" => fop!(d, |p, q| p + q, x, y),
                    "Sub" => fop!(d, |p, q| p - q, x, y),
                    "Mul" => fop!(d, |p, q| p * q, x, y),
                    "Div" => fop!(d, |p, q| p / q, x, y),
                    // Rust's float `%` is C's fmod, which is exact.
                    _ => fop!(d, |p, q| p % q, x, y),
                })
            } else {
                Err(EvalError::Skip)
            }
        }
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
            let (a, b) = (cx.input(0)?, cx.input(1)?);
            let d = same_dtype(a, b)?;
            let cmp = |o: std::cmp::Ordering| match op {
                "Equal" => o.is_eq(),
                "Less" => o.is_lt(),
                "Greater" => o.is_gt(),
                "LessOrEqual" => o.is_le(),
                _ => o.is_ge(),
            };
            if is_int(d) || d == DType::Bool {
                zip2(cx, a, b, DType::Bool, |x, y| {
                    Some(cmp(int_of(x, d).cmp(&int_of(y, d))) as u64)
                })
            } else if is_f(d) {
                // IEEE comparisons: NaN compares false to everything.
                zip2(cx, a, b, DType::Bool, |x, y| {
                    let (p, q) = (f64_of(x, d)?, f64_of(y, d)?);
                    Some(p.partial_cmp(&q).is_some_and(cmp) as u64)
                })
            } else {
                Err(EvalError::Skip)
            }
        }
        "And" | "Or" | "Xor" => {
            let (a, b) = (cx.input(0)?, cx.input(1)?);
            if a.dtype != DType::Bool || b.dtype != DType::Bool {
                return invalid(format!("{op} needs bool inputs"));
            }
            zip2(cx, a, b, DType::Bool, |x, y| {
                let (p, q) = (x != 0, y != 0);
                Some(match op {
                    "And" => p && q,
                    "Or" => p || q,
                    _ => p != q,
                } as u64)
            })
        }
        "Not" => {
            let a = cx.input(0)?;
            if a.dtype != DType::Bool {
                return invalid("Not needs a bool input");
            }
            map1(a, DType::Bool, |x| Some((x == 0) as u64))
        }
        "Neg" | "Abs" => {
            let a = cx.input(0)?;
            let d = a.dtype;
            let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
            if is_int(d) {
                map1(a, d, |x| {
                    let p = int_of(x, d);
                    let r = if op == "Neg" { -p } else { p.abs() };
                    // -MIN overflows (undefined in C++); Neg of unsigned
                    // is not an ONNX op.
                    (signed || op == "Abs")
                        .then_some(())
                        .and_then(|_| fits(r, d).then_some(bits_of_int(r, d)))
                })
            } else if d.is_float() && matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
            {
                // Sign-bit operations: exact in every float format.
                let w = d.bits().unwrap_or(32);
                let sign = 1u64 << (w - 1);
                map1(a, d, |x| {
                    f64_of(x, d)
                        .filter(|v| !v.is_nan())
                        .map(|_| if op == "Neg" { x ^ sign } else { x & !sign })
                })
            } else {
                Err(EvalError::Skip)
            }
        }
        "Floor" | "Ceil" | "Sqrt" | "Reciprocal" => {
            let a = cx.input(0)?;
            let d = a.dtype;
            if !is_f(d) {
                return Err(EvalError::Skip);
            }
            map1(a, d, |x| match op {
                "Floor" => fop!(d, |p| p.floor(), x),
                "Ceil" => fop!(d, |p| p.ceil(), x),
                // Correctly rounded in IEEE 754, so in every implementation.
                "Sqrt" => fop!(d, |p| p.sqrt(), x),
                _ => fop!(d, |p| 1.0 / p, x),
            })
        }
        "Pow" => {
            // Only the exponents whose result is one correctly rounded op:
            // x^1 = x and x^2 = x*x (ORT special-cases 2 as X*X).
            let (a, e) = (cx.input(0)?, cx.input(1)?);
            let d = a.dtype;
            if !is_f(d) {
                return Err(EvalError::Skip);
            }
            let ed = e.dtype;
            zip2(cx, a, e, d, |x, y| {
                let k = if is_int(ed) {
                    int_of(y, ed) as f64
                } else {
                    f64_of(y, ed)?
                };
                if k == 1.0 {
                    fop!(d, |p| p, x)
                } else if k == 2.0 {
                    fop!(d, |p| p * p, x)
                } else {
                    None
                }
            })
        }
        "Min" | "Max" => {
            let first = cx.input(0)?;
            let d = first.dtype;
            let mut acc = first.clone();
            for i in 1..cx.node.inputs().len() {
                let b = cx.input(i)?;
                same_dtype(&acc, b)?;
                acc = zip2(cx, &acc, b, d, |x, y| minmax(d, x, y, op == "Max"))?;
            }
            if cx.node.inputs().len() == 1 {
                // Still refuse NaN, as for the n-ary case.
                acc = map1(&acc, d, |x| minmax(d, x, x, false))?;
            }
            Ok(acc)
        }
        "Clip" => clip(cx),
        "Cast" | "CastLike" => {
            let a = cx.input(0)?;
            let to = if op == "Cast" {
                let c = cx.ai("to").ok_or(EvalError::Invalid("Cast without 'to'".into()))?;
                DType::from_onnx(i32::try_from(c).map_err(|_| EvalError::Skip)?)
            } else {
                cx.input(1)?.dtype
            };
            let from = a.dtype;
            map1(a, to, |x| cast(x, from, to))
        }
        "ReduceSum" | "ReduceProd" | "ReduceMax" | "ReduceMin" => reduce(cx),
        _ => Err(EvalError::Skip),
    }
}

/// One element cast, when bit-identical to onnxruntime.
fn cast(x: u64, from: DType, to: DType) -> Option<u64> {
    if from == to {
        return Some(x);
    }
    let src_int = is_int(from) || from == DType::Bool;
    let src_f = matches!(from, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    if to == DType::Bool {
        return if src_int {
            Some((int_of(x, from) != 0) as u64)
        } else if src_f {
            // static_cast<bool>: NaN is true.
            f64_of(x, from).map(|v| (v != 0.0) as u64)
        } else {
            None
        };
    }
    if is_int(to) {
        if src_int {
            return Some(bits_of_int(int_of(x, from), to));
        }
        if src_f {
            // Truncation toward zero; out of range is undefined in C++.
            let v = f64_of(x, from)?.trunc();
            if !v.is_finite() || v.abs() >= 1.8e19 {
                return None;
            }
            let i = v as i128;
            return fits(i, to).then(|| bits_of_int(i, to));
        }
        return None;
    }
    // To a float.
    let v: f64 = if src_int {
        let i = int_of(x, from);
        return match to {
            // Both round to nearest (even) once, as static_cast does.
            DType::F32 => Some((i as f32).to_bits() as u64),
            DType::F64 => Some((i as f64).to_bits()),
            // ORT goes through float: int -> float -> half.
            DType::F16 => Some(f16::from_f32(i as f32).to_bits() as u64),
            _ => None,
        };
    } else if src_f {
        f64_of(x, from)?
    } else {
        return None;
    };
    if v.is_nan() {
        return None;
    }
    match (from, to) {
        (_, DType::F64) => Some(v.to_bits()),
        // From f64, one rounding; from f16/bf16, exact.
        (_, DType::F32) => Some((v as f32).to_bits() as u64),
        // From f32 (or exact from bf16 via f32): one round-to-nearest-even.
        (DType::F32 | DType::BF16, DType::F16) => Some(f16::from_f32(v as f32).to_bits() as u64),
        // f64 -> f16 and anything -> bf16: rounding paths differ between
        // ORT versions; do not fold.
        _ => None,
    }
}

fn clip(cx: &Cx) -> EvalResult<Val> {
    let a = cx.input(0)?;
    let d = a.dtype;
    let (lo, hi): (Option<Val>, Option<Val>) = if cx.opset < 11 {
        let f = |n: &str, def: f32| {
            let v = cx.node.attr_float(n).unwrap_or(def);
            Val::from_vec(DType::F32, &[], vec![v.to_bits() as u64])
        };
        if d != DType::F32 {
            return Err(EvalError::Skip);
        }
        (Some(f("min", f32::MIN)?), Some(f("max", f32::MAX)?))
    } else {
        (cx.opt_checked(1)?.cloned(), cx.opt_checked(2)?.cloned())
    };
    for b in [&lo, &hi].into_iter().flatten() {
        if b.a.len() != 1 {
            return invalid("Clip bounds must be scalars");
        }
        same_dtype(a, b)?;
    }
    // min(max(x, lo), hi), as ORT computes it.
    let mut r = a.clone();
    if let Some(lo) = &lo {
        r = zip2(cx, &r, lo, d, |x, y| minmax(d, x, y, true))?;
    }
    if let Some(hi) = &hi {
        r = zip2(cx, &r, hi, d, |x, y| minmax(d, x, y, false))?;
    }
    if lo.is_none() && hi.is_none() {
        r = map1(&r, d, |x| minmax(d, x, x, false))?;
    }
    Ok(r)
}

/// Integer reductions only: wrapping sums and products are independent of
/// summation order; float ones are not.
fn reduce(cx: &Cx) -> EvalResult<Val> {
    let op = cx.node.op_type.as_str();
    let a = cx.input(0)?;
    let d = a.dtype;
    if !is_int(d) {
        return Err(EvalError::Skip);
    }
    let from_input = if op == "ReduceSum" {
        cx.opset >= 13
    } else {
        cx.opset >= 18
    };
    let axes: Option<Vec<i64>> = if from_input {
        match cx.opt_checked(1)? {
            Some(v) => Some(v.to_i64s()?),
            None => None,
        }
    } else {
        cx.ints_attr("axes")
    };
    let keep = cx.ai("keepdims").unwrap_or(1) != 0;
    let noop = cx.ai("noop_with_empty_axes").unwrap_or(0) != 0;
    let rank = a.rank();
    let axes: Vec<usize> = match axes {
        Some(v) if !v.is_empty() => {
            let mut out = Vec::new();
            for x in v {
                let ax = super::layout::norm_axis(x, rank)?;
                if out.contains(&ax) {
                    return invalid(format!("axis {x} repeated"));
                }
                out.push(ax);
            }
            out.sort_unstable();
            out
        }
        _ if noop => return Ok(a.clone()),
        _ => (0..rank).collect(),
    };
    let mut r = a.a.clone();
    for &ax in axes.iter().rev() {
        if r.shape()[ax] == 0 && matches!(op, "ReduceMax" | "ReduceMin") {
            return Err(EvalError::Skip);
        }
        let init: i128 = match op {
            "ReduceSum" => 0,
            "ReduceProd" => 1,
            "ReduceMax" => i128::MIN,
            _ => i128::MAX,
        };
        let folded = r.map(|&x| int_of(x, d)).fold_axis(Axis(ax), init, |&acc, &x| match op {
            "ReduceSum" => acc.wrapping_add(x),
            "ReduceProd" => acc.wrapping_mul(x),
            "ReduceMax" => acc.max(x),
            _ => acc.min(x),
        });
        let mut next = folded.map(|&x| bits_of_int(x, d));
        if keep {
            next.insert_axis_inplace(Axis(ax));
        }
        r = next;
    }
    Ok(Val::new(d, r))
}
