//! Shape values: small integer tensors (rank 0 or 1) known as a vector of
//! dims, propagated through the ops exporters use to compute shapes at run
//! time (`Shape`, `Gather`, `Concat`, `Unsqueeze`, arithmetic, ...).

use super::ctx::{constant_tensor, Cx};
use super::dims::{self, norm_axis};
use super::SVal;
use crate::{DType, Dim, Tensor};

/// Longest vector tracked as a shape value.
pub const MAX_TRACKED: usize = 256;

/// A constant tensor as a shape value, when it is small, of rank 0 or 1,
/// and integral.
pub(crate) fn from_tensor(t: &Tensor) -> Option<SVal> {
    if t.dims.len() > 1 || t.numel().ok()? > MAX_TRACKED as u64 {
        return None;
    }
    let v: Vec<i64> = if t.dtype.is_int() || t.dtype == DType::Bool {
        t.to_i64_vec()?
    } else if matches!(t.dtype, DType::F32 | DType::F64) {
        t.to_f64_vec()?
            .into_iter()
            .map(|f| (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64))
            .collect::<Option<Vec<_>>>()?
    } else {
        return None;
    };
    let elems: Vec<Dim> = v.into_iter().map(Dim::Known).collect();
    if t.dims.is_empty() {
        (elems.len() == 1).then(|| SVal::scalar(elems[0].clone()))
    } else {
        Some(SVal::vec(elems))
    }
}

fn bool_dim(b: Option<bool>) -> Dim {
    match b {
        Some(true) => Dim::Known(1),
        Some(false) => Dim::Known(0),
        None => Dim::Unknown,
    }
}

/// Elementwise binary op on shape values with scalar/length-1 broadcasting.
fn binary(a: &SVal, b: &SVal, f: impl Fn(&Dim, &Dim) -> Dim) -> Option<SVal> {
    let (n, m) = (a.elems.len(), b.elems.len());
    let len = if n == m {
        n
    } else if n == 1 {
        m
    } else if m == 1 {
        n
    } else {
        return None;
    };
    let elems = (0..len)
        .map(|i| {
            f(
                &a.elems[if n == 1 { 0 } else { i }],
                &b.elems[if m == 1 { 0 } else { i }],
            )
        })
        .collect();
    Some(SVal {
        elems,
        scalar: a.scalar && b.scalar,
    })
}

fn equal(a: &Dim, b: &Dim) -> Dim {
    bool_dim(match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => Some(x == y),
        (Dim::Sym(x), Dim::Sym(y)) if x == y => Some(true),
        // Dims are never negative.
        (Dim::Sym(_), Dim::Known(k)) | (Dim::Known(k), Dim::Sym(_)) if *k < 0 => Some(false),
        _ => None,
    })
}

fn cmp_known(a: &Dim, b: &Dim, f: impl Fn(i64, i64) -> bool) -> Dim {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => bool_dim(Some(f(*x, *y))),
        _ => Dim::Unknown,
    }
}

fn known_op(a: &Dim, b: &Dim, f: impl Fn(i64, i64) -> Option<i64>) -> Dim {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => f(*x, *y).map_or(Dim::Unknown, Dim::Known),
        _ => Dim::Unknown,
    }
}

/// Shape values of the node's outputs.
pub(crate) fn propagate(cx: &Cx) -> Vec<Option<SVal>> {
    let r = compute(cx).filter(|v| v.elems.len() <= MAX_TRACKED);
    let elem = cx
        .node
        .output(0)
        .and_then(|o| cx.g.ty(o))
        .and_then(|t| t.elem());
    let r = r.and_then(|v| representable(v, elem));
    // Never contradict a known output rank above 1.
    let r = r.filter(|v| {
        let rank = cx
            .node
            .output(0)
            .and_then(|o| cx.g.ty(o))
            .and_then(|t| t.shape())
            .map(|s| s.rank());
        match rank {
            Some(0) => v.scalar,
            Some(1) => !v.scalar,
            Some(_) => false,
            None => true,
        }
    });
    vec![r]
}

/// Drops values the output's element type cannot hold exactly.
fn representable(mut v: SVal, elem: Option<DType>) -> Option<SVal> {
    let limit: i64 = match elem {
        None | Some(DType::I64) | Some(DType::U64) | Some(DType::Bool) => return Some(v),
        Some(DType::I32) => i32::MAX as i64,
        Some(DType::U32) => u32::MAX as i64,
        Some(DType::I16) => i16::MAX as i64,
        Some(DType::U16) => u16::MAX as i64,
        Some(DType::I8) => i8::MAX as i64,
        Some(DType::U8) => u8::MAX as i64,
        Some(DType::F32) => 1 << 24,
        Some(DType::F64) => 1 << 53,
        _ => return None,
    };
    for d in &mut v.elems {
        if let Dim::Known(x) = d {
            if x.unsigned_abs() > limit as u64 {
                *d = Dim::Unknown;
            }
        }
    }
    Some(v)
}

fn compute(cx: &Cx) -> Option<SVal> {
    let op = cx.op();
    match op {
        "Shape" => {
            let d = cx.dims(0)?;
            let r = d.len() as i64;
            let clamp = |v: i64| {
                if v < 0 {
                    v.saturating_add(r).max(0)
                } else {
                    v.min(r)
                }
            };
            let s = clamp(cx.ai_or("start", 0)) as usize;
            let e = cx.ai("end").map_or(r, clamp) as usize;
            Some(SVal::vec(if s < e { d[s..e].to_vec() } else { vec![] }))
        }
        "Size" => Some(SVal::scalar(dims::product_dim(cx.dims(0)?))),
        "Constant" => from_tensor(&constant_tensor(cx.node)?),
        "Identity" | "Floor" | "Ceil" | "Round" | "CastLike" => cx.val(0).cloned(),
        "Cast" => {
            let v = cx.val(0)?;
            match cx.adtype("to")? {
                DType::Bool => Some(SVal {
                    elems: v
                        .elems
                        .iter()
                        .map(|d| bool_dim(d.known().map(|x| x != 0)))
                        .collect(),
                    scalar: v.scalar,
                }),
                t if t.is_int() || t.is_float() => Some(v.clone()),
                _ => None,
            }
        }
        "Neg" => {
            let v = cx.val(0)?;
            Some(SVal {
                elems: v
                    .elems
                    .iter()
                    .map(|d| {
                        d.known()
                            .and_then(|x| x.checked_neg())
                            .map_or(Dim::Unknown, Dim::Known)
                    })
                    .collect(),
                scalar: v.scalar,
            })
        }
        "Abs" => {
            let v = cx.val(0)?;
            Some(SVal {
                elems: v
                    .elems
                    .iter()
                    .map(|d| match d {
                        Dim::Known(x) => x.checked_abs().map_or(Dim::Unknown, Dim::Known),
                        d => d.clone(),
                    })
                    .collect(),
                scalar: v.scalar,
            })
        }
        "Not" => {
            let v = cx.val(0)?;
            Some(SVal {
                elems: v
                    .elems
                    .iter()
                    .map(|d| bool_dim(d.known().map(|x| x == 0)))
                    .collect(),
                scalar: v.scalar,
            })
        }
        "Gather" => {
            let data = cx.val(0)?;
            if data.scalar || norm_axis(cx.ai_or("axis", 0), 1) != Some(0) {
                return None;
            }
            let idx = cx.ints(1)?;
            let n = data.elems.len() as i64;
            let pick = |i: i64| -> Option<Dim> {
                let i = if i < 0 { i.checked_add(n)? } else { i };
                data.elems.get(usize::try_from(i).ok()?).cloned()
            };
            let elems = idx.iter().map(|&i| pick(i)).collect::<Option<Vec<_>>>()?;
            if cx.rank(1) == Some(0)
                || (cx.rank(1).is_none() && cx.val(1).is_some_and(|v| v.scalar))
            {
                Some(SVal::scalar(elems.into_iter().next()?))
            } else if cx.rank(1).is_some_and(|r| r > 1) {
                None
            } else {
                Some(SVal::vec(elems))
            }
        }
        "Unsqueeze" => {
            let v = cx.val(0)?;
            v.scalar.then(|| SVal::vec(v.elems.clone()))
        }
        "Squeeze" => {
            let v = cx.val(0)?;
            (!v.scalar && v.elems.len() == 1).then(|| SVal::scalar(v.elems[0].clone()))
        }
        "Concat" => {
            let mut elems = Vec::new();
            for i in 0..cx.nin() {
                if !cx.has(i) {
                    continue;
                }
                let v = cx.val(i)?;
                if v.scalar {
                    return None;
                }
                elems.extend(v.elems.iter().cloned());
            }
            Some(SVal::vec(elems))
        }
        "Slice" => {
            let v = cx.val(0)?;
            if v.scalar {
                return None;
            }
            let (starts, ends, axes, steps) = if cx.opset < 10 && !cx.has(1) {
                (
                    cx.aints("starts")?.to_vec(),
                    cx.aints("ends")?.to_vec(),
                    cx.aints("axes").map(|a| a.to_vec()),
                    None,
                )
            } else {
                (
                    cx.ints(1)?,
                    cx.ints(2)?,
                    if cx.has(3) { Some(cx.ints(3)?) } else { None },
                    if cx.has(4) { Some(cx.ints(4)?) } else { None },
                )
            };
            if starts.len() != 1 || ends.len() != 1 {
                return None;
            }
            if let Some(a) = axes {
                if a.len() != 1 || norm_axis(a[0], 1) != Some(0) {
                    return None;
                }
            }
            let step = steps.map_or(Some(1), |s| s.first().copied())?;
            let n = v.elems.len() as i64;
            if step == 0 {
                return None;
            }
            let adj = |x: i64| if x < 0 { x.saturating_add(n) } else { x };
            let (mut s, mut e) = (adj(starts[0]), adj(ends[0]));
            let mut out = Vec::new();
            if step > 0 {
                s = s.clamp(0, n);
                e = e.clamp(0, n);
                let mut i = s;
                while i < e {
                    out.push(v.elems[i as usize].clone());
                    i = i.saturating_add(step);
                }
            } else {
                s = s.clamp(-1, n - 1);
                e = e.clamp(-1, n - 1);
                let mut i = s;
                while i > e && i >= 0 {
                    out.push(v.elems[i as usize].clone());
                    i = i.saturating_add(step);
                }
            }
            Some(SVal::vec(out))
        }
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Mod" | "Equal" | "Less" | "Greater"
        | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" => {
            if cx.nin() != 2 {
                return None;
            }
            let (a, b) = (cx.val(0)?, cx.val(1)?);
            let exact = cx.elem(0).is_some_and(|e| e.is_float());
            match op {
                "Add" => binary(a, b, dims::add),
                "Sub" => binary(a, b, dims::sub),
                "Mul" => binary(a, b, dims::mul),
                "Div" => binary(a, b, |x, y| dims::div(x, y, exact)),
                "Max" => binary(a, b, |x, y| known_op(x, y, |p, q| Some(p.max(q)))),
                "Min" => binary(a, b, |x, y| known_op(x, y, |p, q| Some(p.min(q)))),
                "Mod" => binary(a, b, |x, y| {
                    known_op(x, y, |p, q| {
                        if q == 0 {
                            None
                        } else if cx.ai_or("fmod", 0) != 0 {
                            p.checked_rem(q)
                        } else {
                            let r = p.checked_rem(q)?;
                            Some(if r != 0 && ((r < 0) != (q < 0)) {
                                r + q
                            } else {
                                r
                            })
                        }
                    })
                }),
                "Equal" => binary(a, b, equal),
                "Less" => binary(a, b, |x, y| cmp_known(x, y, |p, q| p < q)),
                "Greater" => binary(a, b, |x, y| cmp_known(x, y, |p, q| p > q)),
                "LessOrEqual" => binary(a, b, |x, y| cmp_known(x, y, |p, q| p <= q)),
                "GreaterOrEqual" => binary(a, b, |x, y| cmp_known(x, y, |p, q| p >= q)),
                "And" => binary(a, b, |x, y| cmp_known(x, y, |p, q| p != 0 && q != 0)),
                _ => binary(a, b, |x, y| cmp_known(x, y, |p, q| p != 0 || q != 0)),
            }
        }
        "Where" => {
            let (c, x, y) = (cx.val(0)?, cx.val(1)?, cx.val(2)?);
            let xy = binary(x, y, |p, _| p.clone())?;
            let len = c.elems.len().max(xy.elems.len());
            let get = |v: &SVal, i: usize| -> Option<Dim> {
                if v.elems.len() == 1 {
                    Some(v.elems[0].clone())
                } else {
                    v.elems.get(i).cloned()
                }
            };
            let elems = (0..len)
                .map(|i| {
                    Some(match get(c, i)? {
                        Dim::Known(0) => get(y, i)?,
                        Dim::Known(_) => get(x, i)?,
                        _ => {
                            let (p, q) = (get(x, i)?, get(y, i)?);
                            dims::join(&p, &q)
                        }
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            Some(SVal {
                elems,
                scalar: c.scalar && x.scalar && y.scalar,
            })
        }
        "Range" => {
            let (s, l, d) = (cx.ints(0)?, cx.ints(1)?, cx.ints(2)?);
            let ([s], [l], [d]) = (&s[..], &l[..], &d[..]) else {
                return None;
            };
            if *d == 0 {
                return None;
            }
            let n = dims::ceil_div(l.checked_sub(*s)?, *d)?.max(0);
            if n > MAX_TRACKED as i64 {
                return None;
            }
            let elems = (0..n)
                .map(|i| s.checked_add(i.checked_mul(*d)?).map(Dim::Known))
                .collect::<Option<Vec<_>>>()?;
            Some(SVal::vec(elems))
        }
        "ConstantOfShape" => {
            let shape = cx.ints(0)?;
            let [n] = shape[..] else {
                return None;
            };
            if !(0..=MAX_TRACKED as i64).contains(&n) {
                return None;
            }
            let fill = match cx.node.attr_tensor("value") {
                Some(t) => from_tensor(t)?.elems.first()?.clone(),
                None => Dim::Known(0),
            };
            Some(SVal::vec(vec![fill; n as usize]))
        }
        "Reshape" => {
            let v = cx.val(0)?;
            let t = cx.dim_vals(1)?;
            match t.len() {
                0 if v.elems.len() == 1 => Some(SVal::scalar(v.elems[0].clone())),
                1 => Some(SVal::vec(v.elems.clone())),
                _ => None,
            }
        }
        "Expand" => {
            let v = cx.val(0)?;
            let t = cx.ints(1)?;
            match t[..] {
                [n] if v.elems.len() == 1 && (0..=MAX_TRACKED as i64).contains(&n) => {
                    Some(SVal::vec(vec![v.elems[0].clone(); n as usize]))
                }
                [n] if n == 1 || n == v.elems.len() as i64 => Some(SVal::vec(v.elems.clone())),
                _ => None,
            }
        }
        "ReduceProd" | "ReduceSum" | "ReduceMax" | "ReduceMin" => {
            let v = cx.val(0)?;
            let keep = cx.ai_or("keepdims", 1) != 0;
            let d = match op {
                "ReduceProd" => dims::product_dim(&v.elems),
                "ReduceSum" => v.elems.iter().fold(Dim::Known(0), |a, b| dims::add(&a, b)),
                "ReduceMax" => v
                    .known()
                    .and_then(|k| k.into_iter().max())
                    .map_or(Dim::Unknown, Dim::Known),
                _ => v
                    .known()
                    .and_then(|k| k.into_iter().min())
                    .map_or(Dim::Unknown, Dim::Known),
            };
            Some(if keep && !v.scalar {
                SVal::vec(vec![d])
            } else {
                SVal::scalar(d)
            })
        }
        _ => None,
    }
}
