//! Dim arithmetic, broadcasting and symbolic products.

use crate::Dim;

/// `axis` (possibly negative) normalized against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if axis < 0 { axis.checked_add(r)? } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Normalizes a list of axes; `None` if any is out of range or repeated.
pub fn norm_axes(axes: &[i64], rank: usize) -> Option<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = norm_axis(a, rank)?;
        if out.contains(&a) {
            return None;
        }
        out.push(a);
    }
    Some(out)
}

/// The broadcast of two dims (multidirectional), or `Err` when both are
/// known and incompatible.
pub fn bcast_dim(a: &Dim, b: &Dim) -> Result<Dim, String> {
    Ok(match (a, b) {
        (Dim::Known(1), x) | (x, Dim::Known(1)) => x.clone(),
        (Dim::Known(x), Dim::Known(y)) => {
            if x == y {
                Dim::Known(*x)
            } else {
                return Err(format!("cannot broadcast {x} with {y}"));
            }
        }
        // The other side must be 1 or equal to the known size.
        (Dim::Known(x), _) | (_, Dim::Known(x)) => Dim::Known(*x),
        (Dim::Sym(x), Dim::Sym(y)) if x == y => Dim::Sym(x.clone()),
        _ => Dim::Unknown,
    })
}

/// Multidirectional (numpy) broadcasting of shapes.
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let r = a.len().max(b.len());
    let one = Dim::Known(1);
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let x = if i + a.len() >= r {
            &a[i + a.len() - r]
        } else {
            &one
        };
        let y = if i + b.len() >= r {
            &b[i + b.len() - r]
        } else {
            &one
        };
        out.push(bcast_dim(x, y)?);
    }
    Ok(out)
}

/// Broadcasts many shapes (`None` entries: unknown rank ⇒ result `None`).
pub fn broadcast_all(shapes: &[Option<&[Dim]>]) -> Result<Option<Vec<Dim>>, String> {
    let mut acc: Vec<Dim> = Vec::new();
    for s in shapes {
        match s {
            Some(s) => acc = broadcast(&acc, s)?,
            None => return Ok(None),
        }
    }
    Ok(Some(acc))
}

/// Merges two descriptions of the same dim (from two inputs that must agree),
/// preferring the more precise one.
pub fn unify(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Known(_), _) => a.clone(),
        (_, Dim::Known(_)) => b.clone(),
        (Dim::Sym(_), _) => a.clone(),
        _ => b.clone(),
    }
}

/// The join of two descriptions of a dim that may differ (If branches):
/// equal ⇒ kept, otherwise unknown.
pub fn join(a: &Dim, b: &Dim) -> Dim {
    if a == b {
        a.clone()
    } else {
        Dim::Unknown
    }
}

pub fn add(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => x.checked_add(*y).map_or(Dim::Unknown, Dim::Known),
        (x, Dim::Known(0)) | (Dim::Known(0), x) => x.clone(),
        _ => Dim::Unknown,
    }
}

pub fn sub(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => x.checked_sub(*y).map_or(Dim::Unknown, Dim::Known),
        (x, Dim::Known(0)) => x.clone(),
        (Dim::Sym(x), Dim::Sym(y)) if x == y => Dim::Known(0),
        _ => Dim::Unknown,
    }
}

pub fn mul(a: &Dim, b: &Dim) -> Dim {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => x.checked_mul(*y).map_or(Dim::Unknown, Dim::Known),
        (x, Dim::Known(1)) | (Dim::Known(1), x) => x.clone(),
        (_, Dim::Known(0)) | (Dim::Known(0), _) => Dim::Known(0),
        _ => Dim::Unknown,
    }
}

/// Integer division. `exact`: only when it divides (float semantics);
/// otherwise truncating (ONNX integer `Div`).
pub fn div(a: &Dim, b: &Dim, exact: bool) -> Dim {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => {
            if *y == 0 || (exact && x.checked_rem(*y) != Some(0)) {
                Dim::Unknown
            } else {
                x.checked_div(*y).map_or(Dim::Unknown, Dim::Known)
            }
        }
        (x, Dim::Known(1)) => x.clone(),
        (Dim::Sym(x), Dim::Sym(y)) if x == y => Dim::Known(1),
        _ => Dim::Unknown,
    }
}

/// Floor division for dims (sizes are non-negative), used by conv/pool arithmetic.
pub fn floor_div(x: i64, y: i64) -> Option<i64> {
    if y == 0 {
        return None;
    }
    let q = x.checked_div(y)?;
    if (x % y != 0) && ((x < 0) != (y < 0)) {
        q.checked_sub(1)
    } else {
        Some(q)
    }
}

pub fn ceil_div(x: i64, y: i64) -> Option<i64> {
    let q = floor_div(x, y)?;
    if x.checked_rem(y)? != 0 {
        q.checked_add(1)
    } else {
        Some(q)
    }
}

/// A product of dims: known factor and symbolic factors, or `None` when a
/// factor is unknown or it overflows.
#[derive(Clone, Debug, PartialEq)]
pub struct Product {
    pub known: i64,
    pub syms: Vec<String>,
}

pub fn product(ds: &[Dim]) -> Option<Product> {
    let mut p = Product {
        known: 1,
        syms: Vec::new(),
    };
    for d in ds {
        match d {
            Dim::Known(v) => {
                if *v < 0 {
                    return None;
                }
                p.known = p.known.checked_mul(*v)?;
            }
            Dim::Sym(s) => p.syms.push(s.clone()),
            Dim::Unknown => return None,
        }
    }
    p.syms.sort();
    Some(p)
}

/// The product of dims as one dim: known, a single symbol (times 1), or unknown.
pub fn product_dim(ds: &[Dim]) -> Dim {
    match product(ds) {
        Some(p) if p.syms.is_empty() => Dim::Known(p.known),
        Some(p) if p.known == 0 => Dim::Known(0),
        Some(p) if p.syms.len() == 1 && p.known == 1 => Dim::Sym(p.syms[0].clone()),
        _ => Dim::Unknown,
    }
}

/// `num / den` for products: cancels common symbols; the quotient must be a
/// known integer or a single symbol.
pub fn quotient(num: &[Dim], den: &[Dim]) -> Dim {
    let (Some(mut n), Some(d)) = (product(num), product(den)) else {
        return Dim::Unknown;
    };
    let mut rest_den = Vec::new();
    for s in d.syms {
        if let Some(pos) = n.syms.iter().position(|x| *x == s) {
            n.syms.remove(pos);
        } else {
            rest_den.push(s);
        }
    }
    if !rest_den.is_empty() || d.known == 0 {
        return Dim::Unknown;
    }
    if n.known % d.known != 0 {
        return Dim::Unknown;
    }
    let q = n.known / d.known;
    match n.syms.len() {
        0 => Dim::Known(q),
        1 if q == 1 => Dim::Sym(n.syms[0].clone()),
        _ if q == 0 => Dim::Known(0),
        _ => Dim::Unknown,
    }
}

/// Output size of a sliding window (conv/pool) along one axis.
#[allow(clippy::too_many_arguments)]
pub fn window_out(
    input: &Dim,
    kernel: i64,
    stride: i64,
    dilation: i64,
    pad_begin: i64,
    pad_end: i64,
    ceil: bool,
) -> Dim {
    let Dim::Known(n) = input else {
        return Dim::Unknown;
    };
    let f = || -> Option<i64> {
        if stride <= 0 || dilation <= 0 || kernel <= 0 {
            return None;
        }
        let eff = kernel
            .checked_sub(1)?
            .checked_mul(dilation)?
            .checked_add(1)?;
        let span = n
            .checked_add(pad_begin)?
            .checked_add(pad_end)?
            .checked_sub(eff)?;
        if span < 0 {
            return None;
        }
        let q = if ceil {
            ceil_div(span, stride)?
        } else {
            floor_div(span, stride)?
        };
        let mut out = q.checked_add(1)?;
        // With ceil_mode the last window must start inside the (left-padded) input.
        if ceil && out.checked_sub(1)?.checked_mul(stride)? >= n.checked_add(pad_begin)? {
            out -= 1;
        }
        Some(out)
    };
    f().map_or(Dim::Unknown, Dim::Known)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn s(x: &str) -> Dim {
        Dim::Sym(x.into())
    }
    use Dim::Known as K;

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast(&[K(1), K(3)], &[K(2), K(1)]).unwrap(),
            vec![K(2), K(3)]
        );
        assert_eq!(
            broadcast(&[s("b"), K(3)], &[K(3)]).unwrap(),
            vec![s("b"), K(3)]
        );
        assert_eq!(broadcast(&[s("b")], &[s("b")]).unwrap(), vec![s("b")]);
        assert_eq!(broadcast(&[s("a")], &[s("b")]).unwrap(), vec![Dim::Unknown]);
        assert_eq!(broadcast(&[s("a")], &[K(4)]).unwrap(), vec![K(4)]);
        assert_eq!(broadcast(&[s("a")], &[K(1)]).unwrap(), vec![s("a")]);
        assert_eq!(
            broadcast(&[Dim::Unknown], &[K(1)]).unwrap(),
            vec![Dim::Unknown]
        );
        assert!(broadcast(&[K(2)], &[K(3)]).is_err());
    }

    #[test]
    fn quotients() {
        assert_eq!(
            quotient(&[s("b"), K(12), s("s"), K(64)], &[s("s"), K(64)]),
            Dim::Unknown
        );
        assert_eq!(
            quotient(&[s("b"), K(12), s("s"), K(64)], &[K(12), s("s"), K(64)]),
            s("b")
        );
        assert_eq!(quotient(&[K(2), K(6)], &[K(4)]), K(3));
        assert_eq!(quotient(&[K(2), K(6)], &[K(5)]), Dim::Unknown);
        assert_eq!(quotient(&[K(2)], &[K(0)]), Dim::Unknown);
    }

    #[test]
    fn windows() {
        assert_eq!(window_out(&K(224), 7, 2, 1, 3, 3, false), K(112));
        assert_eq!(window_out(&K(112), 3, 2, 1, 1, 1, false), K(56));
        // Inception-style ceil mode.
        assert_eq!(window_out(&K(147), 3, 2, 1, 0, 0, true), K(73));
        assert_eq!(window_out(&K(6), 3, 2, 1, 0, 0, true), K(3));
        assert_eq!(window_out(&K(2), 7, 1, 1, 0, 0, false), Dim::Unknown);
        assert_eq!(window_out(&K(5), 3, 0, 1, 0, 0, false), Dim::Unknown);
        assert_eq!(norm_axis(-1, 3), Some(2));
        assert_eq!(norm_axis(i64::MIN, 3), None);
        assert_eq!(norm_axis(3, 3), None);
    }
}
