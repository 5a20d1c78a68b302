//! Neural-network ops: convolutions, pooling, normalizations, Gemm/MatMul,
//! Einsum, quantization, TopK and ArgMax/ArgMin, and the spectral DFT and
//! STFT.

use super::ctx::{tensor, Cx};
use super::dims::{self, norm_axis};
use super::elementwise::{same, with_elem};
use crate::{DType, Dim, Type};

type Out = Option<Vec<Option<Type>>>;

fn unknown(r: usize) -> Vec<Dim> {
    vec![Dim::Unknown; r]
}

pub(crate) fn infer(cx: &Cx) -> Out {
    let op = cx.op();
    let e0 = cx.elem(0);
    let d0 = cx.dims(0);
    Some(match op {
        "Conv" => vec![tensor(e0, conv(cx, 0, 1, false))],
        "ConvInteger" => vec![tensor(Some(DType::I32), conv(cx, 0, 1, false))],
        "QLinearConv" => vec![tensor(cx.elem(7).or(e0), conv(cx, 0, 3, false))],
        "ConvTranspose" => vec![tensor(e0, conv(cx, 0, 1, true))],
        "MaxPool" | "AveragePool" | "LpPool" => {
            let dims = pool(cx);
            vec![tensor(e0, dims.clone()), tensor(Some(DType::I64), dims)]
        }
        "MaxUnpool" => {
            let dims = if cx.has(2) {
                cx.dim_vals(2)
            } else {
                d0.filter(|d| d.len() >= 3).map(|d| {
                    let nsp = d.len() - 2;
                    let k = cx.aints("kernel_shape").unwrap_or(&[]);
                    let s = cx.aints("strides").unwrap_or(&[]);
                    let p = cx.aints("pads").unwrap_or(&[]);
                    let mut o = d[..2].to_vec();
                    for i in 0..nsp {
                        let st = s.get(i).copied().unwrap_or(1);
                        let pad = p
                            .get(i)
                            .copied()
                            .unwrap_or(0)
                            .saturating_add(p.get(i + nsp).copied().unwrap_or(0));
                        o.push(match (&d[i + 2], k.get(i)) {
                            (Dim::Known(n), Some(&k)) => (|| {
                                n.checked_sub(1)?
                                    .checked_mul(st)?
                                    .checked_add(k)?
                                    .checked_sub(pad)
                            })()
                            .filter(|v| *v >= 0)
                            .map_or(Dim::Unknown, Dim::Known),
                            _ => Dim::Unknown,
                        });
                    }
                    o
                })
            };
            vec![tensor(e0, dims)]
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            let dims = d0.filter(|d| d.len() >= 2).map(|d| {
                let mut o = d[..2].to_vec();
                o.extend(std::iter::repeat_n(Dim::Known(1), d.len() - 2));
                o
            });
            vec![tensor(e0, dims)]
        }
        "MaxRoiPool" => {
            let n = cx
                .dims(1)
                .and_then(|d| d.first().cloned())
                .unwrap_or(Dim::Unknown);
            let c = d0.and_then(|d| d.get(1).cloned()).unwrap_or(Dim::Unknown);
            let mut o = vec![n, c];
            match cx.aints("pooled_shape") {
                Some(p) => o.extend(p.iter().map(|&x| Dim::Known(x))),
                None => o.extend(unknown(2)),
            }
            vec![tensor(e0, Some(o))]
        }
        "BatchNormalization" => {
            let c = d0.and_then(|d| d.get(1).cloned()).unwrap_or(Dim::Unknown);
            let stat = tensor(cx.elem(3).or(e0), Some(vec![c]));
            let mut v = vec![same(cx, 0)];
            v.extend(std::iter::repeat_n(stat, cx.nout().saturating_sub(1)));
            v
        }
        "InstanceNormalization" | "GroupNormalization" | "RMSNormalization" => vec![same(cx, 0)],
        "LayerNormalization" => {
            let stash = cx.adtype("stash_type").unwrap_or(DType::F32);
            let stat = d0.and_then(|d| {
                let a = norm_axis(cx.ai_or("axis", -1), d.len())?;
                let mut o = d[..a].to_vec();
                o.extend(std::iter::repeat_n(Dim::Known(1), d.len() - a));
                Some(o)
            });
            let s = tensor(Some(stash), stat.or_else(|| d0.map(|d| unknown(d.len()))));
            vec![same(cx, 0), s.clone(), s]
        }
        "Gemm" => {
            let (ta, tb) = (cx.ai_or("transA", 0) != 0, cx.ai_or("transB", 0) != 0);
            let m = cx
                .dims(0)
                .filter(|d| d.len() == 2)
                .map(|d| d[if ta { 1 } else { 0 }].clone());
            let n = cx
                .dims(1)
                .filter(|d| d.len() == 2)
                .map(|d| d[if tb { 0 } else { 1 }].clone());
            let elem = e0.or(cx.elem(1));
            vec![tensor(
                elem,
                Some(vec![m.unwrap_or(Dim::Unknown), n.unwrap_or(Dim::Unknown)]),
            )]
        }
        "MatMul" => {
            if let (Some(a), Some(b)) = (d0, cx.dims(1)) {
                let ka = a.last();
                let kb = if b.len() >= 2 {
                    b.get(b.len() - 2)
                } else {
                    b.first()
                };
                if let (Some(Dim::Known(x)), Some(Dim::Known(y))) = (ka, kb) {
                    if x != y {
                        cx.warn(format!("inner dims differ ({x} vs {y})"));
                    }
                }
            }
            vec![tensor(e0.or(cx.elem(1)), matmul_dims(d0, cx.dims(1)))]
        }
        "MatMulInteger" => vec![tensor(Some(DType::I32), matmul_dims(d0, cx.dims(1)))],
        "QLinearMatMul" => vec![tensor(cx.elem(7).or(e0), matmul_dims(d0, cx.dims(3)))],
        "Einsum" => vec![tensor(e0, einsum(cx))],
        "DFT" => vec![tensor(e0, dft(cx))],
        "STFT" => vec![tensor(e0, stft(cx))],
        "QuantizeLinear" => {
            let elem = cx.elem(2).or(cx.adtype("output_dtype")).or(Some(DType::U8));
            vec![with_elem(cx, 0, elem)]
        }
        "DequantizeLinear" => {
            let elem = cx
                .adtype("output_dtype")
                .or(cx.elem(1))
                .or(Some(DType::F32));
            vec![with_elem(cx, 0, elem)]
        }
        "DynamicQuantizeLinear" => vec![
            with_elem(cx, 0, Some(DType::U8)),
            tensor(Some(DType::F32), Some(vec![])),
            tensor(Some(DType::U8), Some(vec![])),
        ],
        "TopK" => {
            let k = if cx.opset < 10 && !cx.has(1) {
                cx.ai("k").map(Dim::Known)
            } else {
                cx.dim_vals(1)
                    .and_then(|v| (v.len() == 1).then(|| v[0].clone()))
            };
            let dims = d0.and_then(|d| {
                let a = norm_axis(cx.ai_or("axis", -1), d.len())?;
                let mut o = d.to_vec();
                o[a] = k.unwrap_or(Dim::Unknown);
                Some(o)
            });
            vec![tensor(e0, dims.clone()), tensor(Some(DType::I64), dims)]
        }
        "ArgMax" | "ArgMin" => {
            let dims = d0.and_then(|d| {
                let a = norm_axis(cx.ai_or("axis", 0), d.len())?;
                let mut o = d.to_vec();
                if cx.ai_or("keepdims", 1) != 0 {
                    o[a] = Dim::Known(1);
                } else {
                    o.remove(a);
                }
                Some(o)
            });
            vec![tensor(Some(DType::I64), dims)]
        }
        "RNN" | "GRU" | "LSTM" => {
            let layout = cx.ai_or("layout", 0);
            let dirs = Dim::Known(if cx.astr("direction") == Some("bidirectional") {
                2
            } else {
                1
            });
            let hidden = cx
                .ai("hidden_size")
                .map(Dim::Known)
                .or_else(|| cx.dims(2).and_then(|r| r.get(2).cloned()))
                .unwrap_or(Dim::Unknown);
            let (seq, batch) = match d0 {
                Some([a, b, _]) if layout == 0 => (a.clone(), b.clone()),
                Some([b, a, _]) => (a.clone(), b.clone()),
                _ => (Dim::Unknown, Dim::Unknown),
            };
            let (y, h) = if layout == 0 {
                (
                    vec![seq, dirs.clone(), batch.clone(), hidden.clone()],
                    vec![dirs, batch, hidden],
                )
            } else {
                (
                    vec![batch.clone(), seq, dirs.clone(), hidden.clone()],
                    vec![batch, dirs, hidden],
                )
            };
            vec![
                tensor(e0, Some(y)),
                tensor(e0, Some(h.clone())),
                tensor(e0, Some(h)),
            ]
        }
        "Attention" => {
            // Y: [b, q_heads, q_seq, v_head] (4-D inputs) or [b, q_seq, q_heads * v_head] (3-D).
            let y = match (d0, cx.dims(2)) {
                (Some(q), Some(v)) if q.len() == 4 && v.len() == 4 => {
                    Some(vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()])
                }
                (Some(q), Some(v)) if q.len() == 3 && v.len() == 3 => {
                    let qh = cx.ai("q_num_heads").map(Dim::Known).unwrap_or(Dim::Unknown);
                    let kvh = cx
                        .ai("kv_num_heads")
                        .map(Dim::Known)
                        .unwrap_or(Dim::Unknown);
                    let vhead = dims::div(&v[2], &kvh, true);
                    Some(vec![q[0].clone(), q[1].clone(), dims::mul(&qh, &vhead)])
                }
                (Some(q), _) => Some(unknown(q.len())),
                _ => None,
            };
            vec![tensor(e0, y)]
        }
        _ => return None,
    })
}

/// Reads a per-spatial-axis int list attribute, defaulting to `def`.
fn per_axis(cx: &Cx, name: &str, n: usize, def: i64) -> Option<Vec<i64>> {
    match cx.aints(name) {
        Some(v) if v.len() == n => Some(v.to_vec()),
        Some(_) => None,
        None => Some(vec![def; n]),
    }
}

/// Spatial output dims of a window op over `x` (N, C, spatial...).
fn window(cx: &Cx, x: &[Dim], kernel: &[i64], dilated: bool) -> Vec<Dim> {
    let nsp = kernel.len();
    let sp = &x[x.len() - nsp..];
    let (Some(strides), Some(dil), Some(pads)) = (
        per_axis(cx, "strides", nsp, 1),
        if dilated {
            per_axis(cx, "dilations", nsp, 1)
        } else {
            Some(vec![1; nsp])
        },
        per_axis(cx, "pads", 2 * nsp, 0),
    ) else {
        return unknown(nsp);
    };
    let ceil = cx.ai_or("ceil_mode", 0) != 0;
    let auto = cx.astr("auto_pad").unwrap_or("NOTSET");
    (0..nsp)
        .map(|i| match auto {
            "SAME_UPPER" | "SAME_LOWER" => match &sp[i] {
                Dim::Known(n) => dims::ceil_div(*n, strides[i])
                    .filter(|_| strides[i] > 0)
                    .map_or(Dim::Unknown, Dim::Known),
                d if strides[i] == 1 => d.clone(),
                _ => Dim::Unknown,
            },
            "VALID" => dims::window_out(&sp[i], kernel[i], strides[i], dil[i], 0, 0, ceil),
            _ => dims::window_out(
                &sp[i],
                kernel[i],
                strides[i],
                dil[i],
                pads[i],
                pads[i + nsp],
                ceil,
            ),
        })
        .collect()
}

fn conv(cx: &Cx, xi: usize, wi: usize, transpose: bool) -> Option<Vec<Dim>> {
    let x = cx.dims(xi);
    let w = cx.dims(wi);
    let r = x.map(|x| x.len()).or(w.map(|w| w.len()))?;
    if r < 3 {
        return None;
    }
    let nsp = r - 2;
    let n = x.map_or(Dim::Unknown, |x| x[0].clone());
    let group = cx.ai_or("group", 1);
    let m = match (w, transpose) {
        (Some(w), false) if w.len() == r => w[0].clone(),
        (Some(w), true) if w.len() == r => dims::mul(&w[1], &Dim::Known(group)),
        _ => Dim::Unknown,
    };
    let kernel: Option<Vec<i64>> = match cx.aints("kernel_shape") {
        Some(k) if k.len() == nsp => Some(k.to_vec()),
        Some(_) => None,
        None => w
            .filter(|w| w.len() == r)
            .and_then(|w| w[2..].iter().map(Dim::known).collect()),
    };
    let mut out = vec![n, m];
    let Some(x) = x.filter(|x| x.len() == r) else {
        out.extend(unknown(nsp));
        return Some(out);
    };
    let Some(kernel) = kernel else {
        out.extend(unknown(nsp));
        return Some(out);
    };
    if !transpose {
        out.extend(window(cx, x, &kernel, true));
        return Some(out);
    }
    if let Some(os) = cx.aints("output_shape") {
        let os = if os.len() == r { &os[2..] } else { os };
        if os.len() == nsp {
            out.extend(os.iter().map(|&v| Dim::Known(v)));
            return Some(out);
        }
    }
    let (Some(strides), Some(dil), Some(pads), Some(opad)) = (
        per_axis(cx, "strides", nsp, 1),
        per_axis(cx, "dilations", nsp, 1),
        per_axis(cx, "pads", 2 * nsp, 0),
        per_axis(cx, "output_padding", nsp, 0),
    ) else {
        out.extend(unknown(nsp));
        return Some(out);
    };
    let auto = cx.astr("auto_pad").unwrap_or("NOTSET");
    for i in 0..nsp {
        let Dim::Known(n) = x[i + 2] else {
            out.push(Dim::Unknown);
            continue;
        };
        let v = if auto == "SAME_UPPER" || auto == "SAME_LOWER" {
            n.checked_mul(strides[i])
        } else {
            let (p0, p1) = if auto == "VALID" {
                (0, 0)
            } else {
                (pads[i], pads[i + nsp])
            };
            (|| {
                let eff = kernel[i]
                    .checked_sub(1)?
                    .checked_mul(dil[i])?
                    .checked_add(1)?;
                strides[i]
                    .checked_mul(n.checked_sub(1)?)?
                    .checked_add(opad[i])?
                    .checked_add(eff)?
                    .checked_sub(p0)?
                    .checked_sub(p1)
            })()
        };
        out.push(v.filter(|v| *v >= 0).map_or(Dim::Unknown, Dim::Known));
    }
    Some(out)
}

fn pool(cx: &Cx) -> Option<Vec<Dim>> {
    let x = cx.dims(0)?;
    if x.len() < 3 {
        return None;
    }
    let nsp = x.len() - 2;
    let mut out = x[..2].to_vec();
    match cx.aints("kernel_shape") {
        Some(k) if k.len() == nsp => out.extend(window(cx, x, k, cx.op() == "MaxPool")),
        _ => out.extend(unknown(nsp)),
    }
    Some(out)
}

/// Output dims of numpy-style matmul.
pub(crate) fn matmul_dims(a: Option<&[Dim]>, b: Option<&[Dim]>) -> Option<Vec<Dim>> {
    let (a, b) = (a?, b?);
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let a2: Vec<Dim> = if a.len() == 1 {
        vec![Dim::Known(1), a[0].clone()]
    } else {
        a.to_vec()
    };
    let b2: Vec<Dim> = if b.len() == 1 {
        vec![b[0].clone(), Dim::Known(1)]
    } else {
        b.to_vec()
    };
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let mut out = dims::broadcast(ba, bb).unwrap_or_else(|_| unknown(ba.len().max(bb.len())));
    if a.len() > 1 {
        out.push(a2[a2.len() - 2].clone());
    }
    if b.len() > 1 {
        out.push(b2[b2.len() - 1].clone());
    }
    Some(out)
}

/// Input `i` as one known integer.
fn scalar_int(cx: &Cx, i: usize) -> Option<i64> {
    cx.ints(i).filter(|v| v.len() == 1).map(|v| v[0])
}

/// DFT of `[..., n, 1 or 2]` along its axis (an attribute before opset 20,
/// then input 2): `dft_length` (default n; 2(n-1) for the inverse
/// one-sided) there, `len/2 + 1` of it one-sided forward; the last dim 2,
/// or 1 for the real result of the inverse one-sided.
fn dft(cx: &Cx) -> Option<Vec<Dim>> {
    let d = cx.dims(0)?;
    let r = d.len();
    if r < 2 {
        return None;
    }
    let inverse = cx.ai_or("inverse", 0) != 0;
    let onesided = cx.ai_or("onesided", 0) != 0;
    let axis = if cx.opset < 20 {
        Some(cx.ai_or("axis", 1))
    } else if cx.has(2) {
        scalar_int(cx, 2)
    } else {
        Some(-2)
    };
    let mut o = d.to_vec();
    o[r - 1] = Dim::Known(if inverse && onesided { 1 } else { 2 });
    let Some(a) = axis.and_then(|a| norm_axis(a, r)).filter(|&a| a + 1 < r) else {
        // The axis is not known: the full transform at the signal's own
        // length keeps every dim, the others change one of them.
        if cx.has(1) || onesided {
            o[..r - 1].fill(Dim::Unknown);
        }
        return Some(o);
    };
    let len = if cx.has(1) {
        scalar_int(cx, 1)
            .filter(|&l| l > 0)
            .map_or(Dim::Unknown, Dim::Known)
    } else if inverse && onesided {
        match &d[a] {
            Dim::Known(n) => n
                .saturating_sub(1)
                .max(0)
                .checked_mul(2)
                .map_or(Dim::Unknown, Dim::Known),
            _ => Dim::Unknown,
        }
    } else {
        d[a].clone()
    };
    o[a] = match len {
        Dim::Known(l) if onesided && !inverse => Dim::Known(l / 2 + 1),
        _ if onesided && !inverse => Dim::Unknown,
        l => l,
    };
    Some(o)
}

/// STFT of `[batch, length, 1 or 2]` (or `[batch, length]`, real, as
/// onnxruntime takes it): `[batch, frames, bins, 2]` with
/// `frames = 1 + (length - frame_length) / frame_step` and `bins` the
/// frame length (`/2 + 1` one-sided); the frame length is input 3, else
/// the window's length, else the signal's.
fn stft(cx: &Cx) -> Option<Vec<Dim>> {
    let d = cx.dims(0).filter(|d| d.len() == 3 || d.len() == 2)?;
    let fl = if cx.has(3) {
        scalar_int(cx, 3)
            .filter(|&f| f > 0)
            .map_or(Dim::Unknown, Dim::Known)
    } else if cx.has(2) {
        cx.dims(2)
            .filter(|w| w.len() == 1)
            .map_or(Dim::Unknown, |w| w[0].clone())
    } else {
        d[1].clone()
    };
    let step = scalar_int(cx, 1).filter(|&s| s > 0);
    let frames = match (&d[1], &fl, step) {
        (Dim::Known(n), Dim::Known(f), Some(s)) if n >= f && *f > 0 => Dim::Known(1 + (n - f) / s),
        _ => Dim::Unknown,
    };
    let bins = match fl {
        Dim::Known(f) if cx.ai_or("onesided", 1) != 0 => Dim::Known(f / 2 + 1),
        Dim::Known(f) => Dim::Known(f),
        _ => Dim::Unknown,
    };
    Some(vec![d[0].clone(), frames, bins, Dim::Known(2)])
}

fn einsum(cx: &Cx) -> Option<Vec<Dim>> {
    let eq: String = cx
        .astr("equation")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != cx.nin() {
        return None;
    }
    let mut letters: Vec<(char, Dim, usize)> = Vec::new();
    let mut ell: Option<Vec<Dim>> = None;
    for (i, t) in terms.iter().enumerate() {
        let d = cx.dims(i)?;
        let has_ell = t.contains("...");
        let labels: Vec<char> = t.replace("...", "").chars().collect();
        if labels.iter().any(|c| !c.is_ascii_alphabetic()) {
            return None;
        }
        let ne = d.len().checked_sub(labels.len())?;
        if ne > 0 && !has_ell {
            return None;
        }
        let pos = if has_ell { t.find("...")? } else { t.len() };
        let pre = t[..pos].chars().count();
        if has_ell {
            let e = &d[pre..pre + ne];
            ell = Some(match ell {
                None => e.to_vec(),
                Some(p) => dims::broadcast(&p, e).unwrap_or_else(|_| unknown(p.len().max(e.len()))),
            });
        }
        for (j, c) in labels.iter().enumerate() {
            let k = if j < pre { j } else { j + ne };
            let dim = d.get(k)?;
            match letters.iter_mut().find(|l| l.0 == *c) {
                Some(l) => {
                    l.1 = if l.1 == Dim::Known(1) {
                        dim.clone()
                    } else if *dim == Dim::Known(1) {
                        l.1.clone()
                    } else {
                        dims::unify(&l.1, dim)
                    };
                    l.2 += 1;
                }
                None => letters.push((*c, dim.clone(), 1)),
            }
        }
    }
    let mut out = Vec::new();
    match rhs {
        Some(r) => {
            let pos = r.find("...");
            let rl: Vec<char> = r.replace("...", "").chars().collect();
            let pre = pos.map_or(rl.len(), |p| r[..p].chars().count());
            for (j, c) in rl.iter().enumerate() {
                if j == pre {
                    out.extend(ell.clone().unwrap_or_default());
                }
                out.push(letters.iter().find(|l| l.0 == *c)?.1.clone());
            }
            if pre >= rl.len() && pos.is_some() {
                out.extend(ell.unwrap_or_default());
            }
        }
        None => {
            out.extend(ell.unwrap_or_default());
            let mut once: Vec<&(char, Dim, usize)> = letters.iter().filter(|l| l.2 == 1).collect();
            once.sort_by_key(|l| l.0);
            out.extend(once.into_iter().map(|l| l.1.clone()));
        }
    }
    Some(out)
}
