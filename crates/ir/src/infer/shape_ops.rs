//! Shape-manipulating ops: Reshape, Flatten, Transpose, Squeeze/Unsqueeze,
//! Concat, Split, Slice, Gather*, Scatter*, Expand, Tile, Pad, Shape, Size,
//! ConstantOfShape, Constant, Range, NonZero, OneHot, Resize/Upsample,
//! DepthToSpace/SpaceToDepth and other data-movement ops.

use super::ctx::{constant_tensor, tensor, Cx};
use super::dims::{self, norm_axes, norm_axis};
use super::elementwise::same;
use crate::{DType, Dim, Type};

type Out = Option<Vec<Option<Type>>>;

fn unknown(r: usize) -> Vec<Dim> {
    vec![Dim::Unknown; r]
}

fn known(v: &[i64]) -> Vec<Dim> {
    v.iter().map(|&x| Dim::Known(x)).collect()
}

/// Length of a rank-1 input, from its shape.
fn len1(cx: &Cx, i: usize) -> Option<usize> {
    match cx.dims(i)? {
        [Dim::Known(k)] if *k >= 0 && *k <= 1 << 20 => Some(*k as usize),
        _ => None,
    }
}

/// A sentinel end meaning "to the end" (INT_MAX / INT64_MAX as exporters write it).
fn is_big(v: i64) -> bool {
    v >= i32::MAX as i64
}

pub(crate) fn infer(cx: &Cx) -> Out {
    let op = cx.op();
    let e0 = cx.elem(0);
    let d0 = cx.dims(0);
    Some(match op {
        "Reshape" => {
            let target = if cx.opset < 5 && !cx.has(1) {
                cx.aints("shape").map(known)
            } else {
                cx.dim_vals(1)
            };
            let allowzero = cx.ai_or("allowzero", 0) != 0;
            let dims = match target {
                Some(t) => {
                    let out = reshape_dims(d0, &t, allowzero);
                    if let (Some(a), Some(b)) = (
                        d0.and_then(dims::product),
                        out.as_deref().and_then(dims::product),
                    ) {
                        if a.syms.is_empty() && b.syms.is_empty() && a.known != b.known {
                            cx.warn(format!(
                                "cannot reshape {} elements into {}",
                                a.known, b.known
                            ));
                        }
                    }
                    out
                }
                None => len1(cx, 1).map(unknown),
            };
            vec![tensor(e0, dims)]
        }
        "Flatten" => {
            let dims = d0.and_then(|d| {
                let r = d.len() as i64;
                let a = cx.ai_or("axis", 1);
                let a = if a < 0 { a.checked_add(r)? } else { a };
                if !(0..=r).contains(&a) {
                    return None;
                }
                let a = a as usize;
                Some(vec![dims::product_dim(&d[..a]), dims::product_dim(&d[a..])])
            });
            vec![tensor(e0, dims.or(Some(unknown(2))))]
        }
        "Transpose" => {
            let dims = d0.and_then(|d| {
                let r = d.len();
                let perm: Vec<usize> = match cx.aints("perm") {
                    Some(p) => norm_axes(p, r).filter(|p| p.len() == r)?,
                    None => (0..r).rev().collect(),
                };
                Some(perm.iter().map(|&p| d[p].clone()).collect())
            });
            vec![tensor(e0, dims)]
        }
        "Squeeze" => {
            let axes = if cx.has(1) {
                cx.ints(1).map(Some)
            } else {
                Some(cx.aints("axes").map(|a| a.to_vec()))
            };
            let dims = d0.and_then(|d| match axes? {
                Some(a) => {
                    let a = norm_axes(&a, d.len())?;
                    Some(
                        d.iter()
                            .enumerate()
                            .filter(|(i, _)| !a.contains(i))
                            .map(|(_, x)| x.clone())
                            .collect(),
                    )
                }
                None => {
                    if d.iter().all(|x| matches!(x, Dim::Known(_))) {
                        Some(d.iter().filter(|x| **x != Dim::Known(1)).cloned().collect())
                    } else {
                        None
                    }
                }
            });
            vec![tensor(e0, dims)]
        }
        "Unsqueeze" => {
            let axes = if cx.has(1) {
                cx.ints(1)
            } else {
                cx.aints("axes").map(|a| a.to_vec())
            };
            let dims = d0.and_then(|d| {
                let axes = axes?;
                let r = d.len().checked_add(axes.len())?;
                let a = norm_axes(&axes, r)?;
                let mut it = d.iter();
                (0..r)
                    .map(|j| {
                        if a.contains(&j) {
                            Some(Dim::Known(1))
                        } else {
                            it.next().cloned()
                        }
                    })
                    .collect()
            });
            let dims = dims.or_else(|| {
                let n = match (d0, cx.has(1)) {
                    (Some(d), true) => d.len().checked_add(len1(cx, 1)?)?,
                    (Some(d), false) => d.len().checked_add(cx.aints("axes")?.len())?,
                    _ => return None,
                };
                Some(unknown(n))
            });
            vec![tensor(e0, dims)]
        }
        "Concat" => {
            let elem = (0..cx.nin()).find_map(|i| cx.elem(i));
            let shapes: Vec<Option<&[Dim]>> = (0..cx.nin())
                .filter(|&i| cx.has(i))
                .map(|i| cx.dims(i))
                .collect();
            let r = shapes.iter().flatten().map(|s| s.len()).next();
            let dims = r.and_then(|r| {
                let ax = norm_axis(cx.ai_or("axis", 0), r)?;
                let mut out = unknown(r);
                let mut sum = Dim::Known(0);
                for s in &shapes {
                    match s {
                        Some(s) if s.len() == r => {
                            for (k, d) in s.iter().enumerate() {
                                if k != ax {
                                    out[k] = dims::unify(&out[k], d);
                                }
                            }
                            sum = dims::add(&sum, &s[ax]);
                        }
                        Some(_) => {
                            cx.warn("inputs of different ranks");
                            return Some(unknown(r));
                        }
                        None => sum = Dim::Unknown,
                    }
                }
                out[ax] = sum;
                Some(out)
            });
            vec![tensor(elem, dims)]
        }
        "Split" => {
            let n = cx.nout();
            let dims = d0.map(|d| {
                let Some(ax) = norm_axis(cx.ai_or("axis", 0), d.len()) else {
                    return vec![None; n];
                };
                let splits: Option<Vec<i64>> = if cx.has(1) {
                    cx.ints(1)
                } else {
                    cx.aints("split").map(|s| s.to_vec())
                };
                let sizes: Vec<Dim> = match splits {
                    Some(s) if s.len() == n => known(&s),
                    Some(_) => unknown(n),
                    None if cx.has(1) => unknown(n),
                    None => match &d[ax] {
                        Dim::Known(t) if n > 0 && *t >= 0 => {
                            let nn = n as i64;
                            if cx.ai("num_outputs").is_some() {
                                let c = dims::ceil_div(*t, nn).unwrap_or(0);
                                (0..nn)
                                    .map(|i| {
                                        Dim::Known(
                                            t.saturating_sub(c.saturating_mul(i)).clamp(0, c),
                                        )
                                    })
                                    .collect()
                            } else if t % nn == 0 {
                                vec![Dim::Known(t / nn); n]
                            } else {
                                unknown(n)
                            }
                        }
                        _ => unknown(n),
                    },
                };
                sizes
                    .into_iter()
                    .map(|s| {
                        let mut o = d.to_vec();
                        o[ax] = s;
                        Some(o)
                    })
                    .collect()
            });
            (0..n)
                .map(|i| tensor(e0, dims.as_ref().and_then(|v| v.get(i).cloned().flatten())))
                .collect()
        }
        "Slice" => vec![tensor(e0, slice(cx))],
        "Gather" => {
            let dims = match (d0, cx.dims(1)) {
                (Some(d), Some(ix)) => norm_axis(cx.ai_or("axis", 0), d.len()).map(|a| {
                    let mut o = d[..a].to_vec();
                    o.extend_from_slice(ix);
                    o.extend_from_slice(&d[a + 1..]);
                    o
                }),
                _ => None,
            };
            vec![tensor(e0, dims)]
        }
        "GatherElements" => vec![tensor(e0, cx.dims(1).map(|d| d.to_vec()))],
        "GatherND" => {
            let b = cx.ai_or("batch_dims", 0);
            let dims = match (d0, cx.dims(1)) {
                (Some(d), Some(ix)) if !ix.is_empty() => match ix.last() {
                    Some(Dim::Known(k)) => {
                        let start = usize::try_from(b.checked_add(*k).unwrap_or(-1)).ok();
                        start.filter(|&s| s <= d.len()).map(|s| {
                            let mut o = ix[..ix.len() - 1].to_vec();
                            o.extend_from_slice(&d[s..]);
                            o
                        })
                    }
                    _ => None,
                },
                _ => None,
            };
            vec![tensor(e0, dims)]
        }
        "ScatterND" | "ScatterElements" | "Scatter" | "TensorScatter" => vec![same(cx, 0)],
        "Expand" => {
            let target = cx.dim_vals(1).or_else(|| len1(cx, 1).map(unknown));
            let dims = match (d0, target) {
                (Some(d), Some(t)) => Some(dims::broadcast(d, &t).unwrap_or_else(|e| {
                    cx.warn(e);
                    unknown(d.len().max(t.len()))
                })),
                _ => None,
            };
            vec![tensor(e0, dims)]
        }
        "Tile" => {
            let dims = d0.map(|d| match cx.dim_vals(1) {
                Some(r) if r.len() == d.len() => {
                    d.iter().zip(&r).map(|(a, b)| dims::mul(a, b)).collect()
                }
                _ => unknown(d.len()),
            });
            vec![tensor(e0, dims)]
        }
        "Pad" => vec![tensor(e0, pad(cx))],
        "Shape" => {
            let len = d0.map(|d| {
                let r = d.len() as i64;
                let clamp = |v: i64| {
                    if v < 0 {
                        (v.saturating_add(r)).max(0)
                    } else {
                        v.min(r)
                    }
                };
                let s = clamp(cx.ai_or("start", 0));
                let e = cx.ai("end").map_or(r, clamp);
                Dim::Known((e - s).max(0))
            });
            vec![tensor(
                Some(DType::I64),
                Some(vec![len.unwrap_or(Dim::Unknown)]),
            )]
        }
        "Size" => vec![tensor(Some(DType::I64), Some(vec![]))],
        "ConstantOfShape" => {
            let elem = cx
                .node
                .attr_tensor("value")
                .map(|t| t.dtype)
                .unwrap_or(DType::F32);
            let dims = cx.dim_vals(0).or_else(|| len1(cx, 0).map(unknown));
            vec![tensor(Some(elem), dims)]
        }
        "Constant" => {
            if let Some(t) = constant_tensor(cx.node) {
                vec![Some(Type::known(t.dtype, &t.dims))]
            } else if cx.node.attr("value_string").is_some() {
                vec![Some(Type::known(DType::String, &[]))]
            } else if let Some(a) = cx.node.attr("value_strings") {
                match &a.value {
                    crate::AttrValue::Strings(s) => {
                        vec![Some(Type::known(DType::String, &[s.len() as i64]))]
                    }
                    _ => vec![None],
                }
            } else if let Some(a) = cx.node.attr("sparse_value") {
                match &a.value {
                    crate::AttrValue::SparseTensor(s) => {
                        vec![Some(Type::known(s.values.dtype, &s.dims))]
                    }
                    _ => vec![None],
                }
            } else {
                vec![None]
            }
        }
        "Range" => {
            let elem = cx.elem(0).or(cx.elem(1)).or(cx.elem(2));
            vec![tensor(elem, Some(vec![range_len(cx)]))]
        }
        "NonZero" => {
            // A scalar counts as rank 1 (onnxruntime's `[1, n]`).
            let r = d0.map_or(Dim::Unknown, |d| Dim::Known(d.len().max(1) as i64));
            vec![tensor(Some(DType::I64), Some(vec![r, Dim::Unknown]))]
        }
        "OneHot" => {
            let depth = cx
                .floats(1)
                .filter(|v| v.len() == 1 && v[0].is_finite() && v[0] >= 0.0 && v[0] < 1e15)
                .map_or(Dim::Unknown, |v| Dim::Known(v[0] as i64));
            let dims = d0.and_then(|d| {
                let a = norm_axis(cx.ai_or("axis", -1), d.len() + 1)?;
                let mut o = d.to_vec();
                o.insert(a, depth);
                Some(o)
            });
            vec![tensor(cx.elem(2), dims)]
        }
        "Resize" | "Upsample" => vec![tensor(e0, resize(cx))],
        "DepthToSpace" | "SpaceToDepth" => {
            let b = cx.ai_or("blocksize", 0);
            let dims = d0.filter(|d| d.len() == 4 && b > 0).map(|d| {
                let bb = Dim::Known(b.saturating_mul(b));
                let bd = Dim::Known(b);
                if op == "DepthToSpace" {
                    vec![
                        d[0].clone(),
                        dims::div(&d[1], &bb, true),
                        dims::mul(&d[2], &bd),
                        dims::mul(&d[3], &bd),
                    ]
                } else {
                    vec![
                        d[0].clone(),
                        dims::mul(&d[1], &bb),
                        dims::div(&d[2], &bd, true),
                        dims::div(&d[3], &bd, true),
                    ]
                }
            });
            vec![tensor(e0, dims.or(Some(unknown(4))))]
        }
        "Compress" => {
            let dims = match cx.ai("axis") {
                Some(a) => d0.and_then(|d| {
                    let a = norm_axis(a, d.len())?;
                    let mut o = d.to_vec();
                    o[a] = Dim::Unknown;
                    Some(o)
                }),
                None => Some(unknown(1)),
            };
            vec![tensor(e0, dims)]
        }
        "Unique" => {
            let y = match cx.ai("axis") {
                Some(a) => d0.and_then(|d| {
                    let a = norm_axis(a, d.len())?;
                    let mut o = d.to_vec();
                    o[a] = Dim::Unknown;
                    Some(o)
                }),
                None => Some(unknown(1)),
            };
            let i = tensor(Some(DType::I64), Some(unknown(1)));
            vec![tensor(e0, y), i.clone(), i.clone(), i]
        }
        "NonMaxSuppression" => vec![tensor(
            Some(DType::I64),
            Some(vec![Dim::Unknown, Dim::Known(3)]),
        )],
        "Det" => vec![tensor(
            e0,
            d0.filter(|d| d.len() >= 2)
                .map(|d| d[..d.len() - 2].to_vec()),
        )],
        "GridSample" => {
            let dims = match (d0, cx.dims(1)) {
                (Some(x), Some(g)) if x.len() >= 3 && g.len() == x.len() => {
                    let mut o = vec![x[0].clone(), x[1].clone()];
                    o.extend_from_slice(&g[1..g.len() - 1]);
                    Some(o)
                }
                _ => d0.map(|d| unknown(d.len())),
            };
            vec![tensor(e0, dims)]
        }
        "RoiAlign" => {
            let n = cx
                .dims(1)
                .and_then(|d| d.first().cloned())
                .unwrap_or(Dim::Unknown);
            let c = d0.and_then(|d| d.get(1).cloned()).unwrap_or(Dim::Unknown);
            let oh = Dim::Known(cx.ai_or("output_height", 1));
            let ow = Dim::Known(cx.ai_or("output_width", 1));
            vec![tensor(e0, Some(vec![n, c, oh, ow]))]
        }
        "Col2Im" => {
            let image = cx.ints(1);
            let r = image.as_ref().map(|v| v.len()).or_else(|| len1(cx, 1));
            let dims =
                r.map(|r| {
                    let n = d0.and_then(|d| d.first().cloned()).unwrap_or(Dim::Unknown);
                    let block = cx.ints(2).and_then(|b| {
                        b.iter()
                            .try_fold(1i64, |a, &k| if k > 0 { a.checked_mul(k) } else { None })
                    });
                    let c = match (d0.and_then(|d| d.get(1)), block) {
                        (Some(Dim::Known(k)), Some(p)) if k % p == 0 => Dim::Known(k / p),
                        _ => Dim::Unknown,
                    };
                    let mut o = vec![n, c];
                    match &image {
                        Some(v) => o.extend(v.iter().map(|&x| {
                            if x >= 0 {
                                Dim::Known(x)
                            } else {
                                Dim::Unknown
                            }
                        })),
                        None => o.extend(unknown(r)),
                    }
                    o
                });
            vec![tensor(e0, dims)]
        }
        "AffineGrid" => {
            // size [N, C, H, W] gives [N, H, W, 2]; [N, C, D, H, W] gives
            // [N, D, H, W, 3].
            let dims = match cx.dim_vals(1) {
                Some(s) if s.len() == 4 || s.len() == 5 => {
                    let mut o: Vec<Dim> = std::iter::once(&s[0])
                        .chain(&s[2..])
                        .map(|d| match d {
                            Dim::Known(k) if *k < 0 => Dim::Unknown,
                            d => d.clone(),
                        })
                        .collect();
                    o.push(Dim::Known(s.len() as i64 - 2));
                    Some(o)
                }
                _ => len1(cx, 1).filter(|&l| l == 4 || l == 5).map(|l| {
                    let mut o = unknown(l);
                    o[l - 1] = Dim::Known(l as i64 - 2);
                    o
                }),
            };
            vec![tensor(e0, dims)]
        }
        "CenterCropPad" => {
            let dims = d0.map(|d| {
                let mut o = d.to_vec();
                let axes: Vec<i64> = cx
                    .aints("axes")
                    .map(|a| a.to_vec())
                    .unwrap_or_else(|| (0..d.len() as i64).collect());
                match (norm_axes(&axes, d.len()), cx.dim_vals(1)) {
                    (Some(a), Some(s)) if s.len() == a.len() => {
                        for (ax, v) in a.iter().zip(s) {
                            o[*ax] = v;
                        }
                    }
                    (Some(a), _) => {
                        for ax in a {
                            o[ax] = Dim::Unknown;
                        }
                    }
                    _ => o = unknown(d.len()),
                }
                o
            });
            vec![tensor(e0, dims)]
        }
        "RandomNormal" | "RandomUniform" => {
            let elem = cx.adtype("dtype").unwrap_or(DType::F32);
            vec![tensor(Some(elem), cx.aints("shape").map(known))]
        }
        "Multinomial" => {
            let b = d0.and_then(|d| d.first().cloned()).unwrap_or(Dim::Unknown);
            let elem = cx.adtype("dtype").unwrap_or(DType::I32);
            vec![tensor(
                Some(elem),
                Some(vec![b, Dim::Known(cx.ai_or("sample_size", 1))]),
            )]
        }
        _ => return None,
    })
}

/// Output dims of a Reshape of `input` to `target`.
pub(crate) fn reshape_dims(
    input: Option<&[Dim]>,
    target: &[Dim],
    allowzero: bool,
) -> Option<Vec<Dim>> {
    let mut out = Vec::with_capacity(target.len());
    let mut neg = None;
    for (i, d) in target.iter().enumerate() {
        match d {
            Dim::Known(0) if !allowzero => out.push(
                input
                    .and_then(|x| x.get(i).cloned())
                    .unwrap_or(Dim::Unknown),
            ),
            Dim::Known(-1) => {
                if neg.is_some() {
                    return Some(unknown(target.len()));
                }
                neg = Some(i);
                out.push(Dim::Unknown);
            }
            Dim::Known(v) if *v < 0 => return Some(unknown(target.len())),
            d => out.push(d.clone()),
        }
    }
    if let (Some(k), Some(inp)) = (neg, input) {
        let others: Vec<Dim> = out
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != k)
            .map(|(_, d)| d.clone())
            .collect();
        out[k] = dims::quotient(inp, &others);
    }
    Some(out)
}

/// The length of one sliced axis.
fn slice_len(d: &Dim, start: &Dim, end: &Dim, step: i64) -> Dim {
    if step == 0 {
        return Dim::Unknown;
    }
    if let (Dim::Known(n), Dim::Known(s), Dim::Known(e)) = (d, start, end) {
        let n = *n;
        if n < 0 {
            return Dim::Unknown;
        }
        let f = || -> Option<i64> {
            let adj = |v: i64| if v < 0 { v.saturating_add(n) } else { v };
            let (s, e) = (adj(*s), adj(*e));
            let len = if step > 0 {
                let s = s.clamp(0, n);
                let e = e.clamp(0, n);
                dims::ceil_div(e.checked_sub(s)?, step)?
            } else {
                let s = s.clamp(0, n.checked_sub(1)?.max(0));
                let e = e.clamp(-1, n.checked_sub(1)?);
                if n == 0 {
                    0
                } else {
                    dims::ceil_div(s.checked_sub(e)?, step.checked_neg()?)?
                }
            };
            Some(len.max(0))
        };
        return f().map_or(Dim::Unknown, Dim::Known);
    }
    if step == 1 && *start == Dim::Known(0) {
        match end {
            Dim::Known(e) if is_big(*e) => return d.clone(),
            // `x[:n]` with a symbolic bound: assume the bound is in range.
            Dim::Sym(_) if matches!(d, Dim::Known(_)) || d == end => return end.clone(),
            _ => {}
        }
    }
    Dim::Unknown
}

fn slice(cx: &Cx) -> Option<Vec<Dim>> {
    let d = cx.dims(0)?;
    let r = d.len();
    let attr_form = cx.opset < 10 && !cx.has(1);
    let (starts, ends, axes, steps) = if attr_form {
        (
            cx.aints("starts").map(known),
            cx.aints("ends").map(known),
            Some(cx.aints("axes").map(|a| a.to_vec())),
            Some(None),
        )
    } else {
        (
            cx.dim_vals(1),
            cx.dim_vals(2),
            if cx.has(3) {
                cx.ints(3).map(Some)
            } else {
                Some(None)
            },
            if cx.has(4) {
                cx.ints(4).map(Some)
            } else {
                Some(None)
            },
        )
    };
    let Some(axes) = axes else {
        return Some(unknown(r));
    };
    let n = starts
        .as_ref()
        .map(|s| s.len())
        .or(ends.as_ref().map(|e| e.len()));
    let n = n
        .or(axes.as_ref().map(|a| a.len()))
        .or_else(|| len1(cx, 1))?;
    let axes: Vec<i64> = axes.unwrap_or_else(|| (0..n as i64).collect());
    let Some(ax) = norm_axes(&axes, r) else {
        return Some(unknown(r));
    };
    let mut out = d.to_vec();
    for (k, &a) in ax.iter().enumerate() {
        let step = match &steps {
            Some(Some(s)) => s.get(k).copied(),
            Some(None) => Some(1),
            None => None,
        };
        let (Some(s), Some(e), Some(step)) = (
            starts.as_ref().and_then(|s| s.get(k)),
            ends.as_ref().and_then(|e| e.get(k)),
            step,
        ) else {
            out[a] = Dim::Unknown;
            continue;
        };
        out[a] = slice_len(&d[a], s, e, step);
    }
    Some(out)
}

fn pad(cx: &Cx) -> Option<Vec<Dim>> {
    let d = cx.dims(0)?;
    let r = d.len();
    let pads = if cx.opset < 11 && !cx.has(1) {
        cx.aints("pads")
            .or(cx.aints("paddings"))
            .map(|p| p.to_vec())
    } else {
        cx.ints(1)
    };
    let axes: Vec<usize> = if cx.has(3) {
        match cx.ints(3).and_then(|a| norm_axes(&a, r)) {
            Some(a) => a,
            None => return Some(unknown(r)),
        }
    } else {
        (0..r).collect()
    };
    let Some(p) = pads.filter(|p| p.len() == 2 * axes.len()) else {
        let mut o = d.to_vec();
        for a in axes {
            o[a] = Dim::Unknown;
        }
        return Some(o);
    };
    let mut o = d.to_vec();
    let n = axes.len();
    for (k, &a) in axes.iter().enumerate() {
        let total = p[k].checked_add(p[k + n]);
        o[a] = match (total, &d[a]) {
            (Some(t), x) => {
                let v = dims::add(x, &Dim::Known(t));
                match v {
                    Dim::Known(v) if v < 0 => Dim::Unknown,
                    v => v,
                }
            }
            _ => Dim::Unknown,
        };
    }
    Some(o)
}

fn range_len(cx: &Cx) -> Dim {
    if let (Some(s), Some(l), Some(d)) = (cx.floats(0), cx.floats(1), cx.floats(2)) {
        if let ([s], [l], [d]) = (&s[..], &l[..], &d[..]) {
            if *d == 0.0 {
                return Dim::Unknown;
            }
            let n = ((l - s) / d).ceil().max(0.0);
            if n.is_finite() && n < 1e15 {
                return Dim::Known(n as i64);
            }
        }
        return Dim::Unknown;
    }
    // range(0, n, 1) with symbolic n.
    if let (Some(s), Some(l), Some(d)) = (cx.dim_vals(0), cx.dim_vals(1), cx.dim_vals(2)) {
        if let ([Dim::Known(0)], [Dim::Sym(n)], [Dim::Known(1)]) = (&s[..], &l[..], &d[..]) {
            return Dim::Sym(n.clone());
        }
    }
    Dim::Unknown
}

fn resize(cx: &Cx) -> Option<Vec<Dim>> {
    let d = cx.dims(0)?;
    let r = d.len();
    let axes: Vec<usize> = match cx.aints("axes") {
        Some(a) => norm_axes(a, r)?,
        None => (0..r).collect(),
    };
    let upsample = cx.op() == "Upsample";
    let (scales_in, sizes_in) = if upsample {
        (if cx.has(1) { Some(1) } else { None }, None)
    } else if cx.opset < 11 {
        (Some(1), None)
    } else {
        (Some(2), Some(3))
    };
    let policy = cx.astr("keep_aspect_ratio_policy").unwrap_or("stretch");
    let mut o = d.to_vec();
    if let Some(si) = sizes_in.filter(|&i| cx.has(i)) {
        match cx.dim_vals(si) {
            Some(s) if s.len() == axes.len() && policy == "stretch" => {
                for (a, v) in axes.iter().zip(s) {
                    o[*a] = v;
                }
            }
            Some(s) if s.len() == axes.len() => {
                // not_larger / not_smaller: one scale, the min / max of
                // sizes / input over the axes, and each resized length
                // round_half_up(scale * input) (as the CPU kernel).
                let known: Option<Vec<(i64, i64)>> = axes
                    .iter()
                    .zip(&s)
                    .map(|(&a, v)| match (&d[a], v) {
                        (Dim::Known(n), Dim::Known(v)) if *n > 0 && *v >= 0 => Some((*n, *v)),
                        _ => None,
                    })
                    .collect();
                let ratios = known.iter().flatten().map(|&(n, v)| v as f64 / n as f64);
                let k = match policy {
                    "not_larger" => ratios.fold(f64::INFINITY, f64::min),
                    _ => ratios.fold(f64::NEG_INFINITY, f64::max),
                };
                for (i, &a) in axes.iter().enumerate() {
                    o[a] = match &known {
                        Some(kn) if k.is_finite() => {
                            Dim::Known((k * kn[i].0 as f64 + 0.5).floor() as i64)
                        }
                        _ => Dim::Unknown,
                    };
                }
            }
            _ => {
                for &a in &axes {
                    o[a] = Dim::Unknown;
                }
            }
        }
        return Some(o);
    }
    let scales: Option<Vec<f64>> = match scales_in {
        Some(i) if cx.has(i) => cx.floats(i),
        _ if upsample => cx
            .afloats("scales")
            .map(|s| s.iter().map(|&x| x as f64).collect()),
        _ => None,
    };
    match scales {
        Some(s) if s.len() == axes.len() => {
            for (a, sc) in axes.iter().zip(s) {
                o[*a] = match &d[*a] {
                    Dim::Known(n) => {
                        let v = (*n as f64 * sc).floor();
                        if v.is_finite() && (0.0..1e15).contains(&v) {
                            Dim::Known(v as i64)
                        } else {
                            Dim::Unknown
                        }
                    }
                    x if sc == 1.0 => x.clone(),
                    _ => Dim::Unknown,
                };
            }
        }
        _ => {
            for &a in &axes {
                o[a] = Dim::Unknown;
            }
        }
    }
    Some(o)
}
