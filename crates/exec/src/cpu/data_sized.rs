//! Ops whose output size depends on the input values, not only on their
//! shapes: NonZero, Compress, Unique and NonMaxSuppression.
//!
//! The planner cannot give their outputs a place in the arena, so it lists
//! them among the plan's `dynamic_values`, and the executor runs such a
//! node as a special step (`crate::control`): its inputs are copied out of
//! the arena, [`run`] computes the outputs as [`HostTensor`]s of whatever
//! size they come out, and the readers downstream run as one-node programs
//! planned at the sizes seen. The kernels here are plain loops on one
//! thread: these ops sit on index paths (masks, detections), not in the
//! hot loops of a model.
//!
//! Before (refused: "no cpu kernel for NonZero"):
//! ```text
//! %idx = NonZero(%mask)            // int64 [2, ?]
//! %y   = Transpose(%idx)           // int64 [?, 2]
//! ```
//! After: `%idx` is computed at run time as `[2, n]` (n = the nonzero
//! count of this run's mask) and `%y` is planned at `[n, 2]`.
//!
//! Semantics follow the ONNX specification and its reference
//! implementation: NonZero in row-major order, a float -0.0 counting as
//! zero and NaN as nonzero; Compress like `numpy.compress` (a condition
//! shorter than the axis selects nothing past its end); Unique like
//! `numpy.unique` (sorted, or in order of first occurrence with
//! `sorted=0`, per element or per slice along `axis`; floats compare by
//! value, NaNs equal to each other and last); NonMaxSuppression as
//! onnxruntime's (per batch and class, candidates above `score_threshold`
//! by descending score, ties by box index, NaN scores last, a box dropped
//! when its IoU with a kept one exceeds `iou_threshold`).

use crate::tensor::{elem_size, numel, HostTensor};
use graphopt_ir::{AttrValue, Attribute, DType};
use std::cmp::Ordering;

/// The ops of this file.
pub const OPS: &[&str] = &["Compress", "NonMaxSuppression", "NonZero", "Unique"];

/// Whether the op is one of [`OPS`] (default domain).
pub fn is_data_sized(domain: &str, op: &str) -> bool {
    (domain.is_empty() || domain == "ai.onnx") && OPS.contains(&op)
}

/// An int attribute by name.
fn attr_int(attrs: &[Attribute], name: &str) -> Option<i64> {
    attrs
        .iter()
        .find(|a| a.name == name)
        .and_then(|a| match a.value {
            AttrValue::Int(v) => Some(v),
            _ => None,
        })
}

/// Computes the outputs of a node of `op` (every output the op defines,
/// in order) from its attributes and inputs (`None` for an omitted
/// optional input).
pub fn run(
    op: &str,
    attrs: &[Attribute],
    inputs: &[Option<&HostTensor>],
) -> Result<Vec<HostTensor>, String> {
    let input = |i: usize| -> Result<&HostTensor, String> {
        inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| format!("input {i} is missing"))
    };
    let int = |name: &str| attr_int(attrs, name);
    match op {
        "NonZero" => Ok(vec![non_zero(input(0)?)?]),
        "Compress" => Ok(vec![compress(input(0)?, input(1)?, int("axis"))?]),
        "Unique" => unique(input(0)?, int("axis"), int("sorted").unwrap_or(1)),
        "NonMaxSuppression" => {
            let opt = |i: usize| inputs.get(i).copied().flatten();
            Ok(vec![nms(
                input(0)?,
                input(1)?,
                opt(2),
                opt(3),
                opt(4),
                int("center_point_box").unwrap_or(0),
            )?])
        }
        op => Err(format!("{op} is not an op of data-dependent output size")),
    }
}

/// Element size of a byte-stored type, or a one-line refusal.
fn size_of(t: &HostTensor, what: &str) -> Result<usize, String> {
    elem_size(t.dtype)
        .filter(|_| t.dtype != DType::String)
        .ok_or_else(|| format!("{what} of type {} is not supported", t.dtype.name()))
}

/// Checks that `t.data` holds exactly its shape's elements.
fn whole(t: &HostTensor, what: &str) -> Result<usize, String> {
    let es = size_of(t, what)?;
    let n = numel(&t.shape);
    if t.data.len() != n * es {
        return Err(format!(
            "{what} holds {} bytes for shape {:?}",
            t.data.len(),
            t.shape
        ));
    }
    Ok(es)
}

/// Whether element `i` of `t` is nonzero (floats by value).
fn nonzero_at(t: &HostTensor, es: usize, i: usize) -> bool {
    let b = &t.data[i * es..(i + 1) * es];
    match t.dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) != 0.0,
        DType::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")) != 0.0,
        DType::F16 | DType::BF16 => u16::from_le_bytes([b[0], b[1]]) & 0x7fff != 0,
        _ => b.iter().any(|&x| x != 0),
    }
}

fn non_zero(x: &HostTensor) -> Result<HostTensor, String> {
    let es = whole(x, "NonZero's input")?;
    let n = numel(&x.shape);
    let r = x.shape.len();
    let hits: Vec<usize> = (0..n).filter(|&i| nonzero_at(x, es, i)).collect();
    // A scalar counts as one element of rank 1 (`[1, n]`), as onnxruntime
    // gives it.
    let (rows, dims) = if r == 0 {
        (1, vec![1usize])
    } else {
        (r, x.shape.clone())
    };
    let mut out = vec![0i64; rows * hits.len()];
    let m = hits.len();
    for (j, &flat) in hits.iter().enumerate() {
        let mut rest = flat;
        for a in (0..rows).rev() {
            out[a * m + j] = (rest % dims[a]) as i64;
            rest /= dims[a];
        }
    }
    Ok(HostTensor::from_i64(&[rows, m], &out))
}

/// `axis` normalized against rank `r`.
fn axis_of(axis: i64, r: usize, op: &str) -> Result<usize, String> {
    let a = if axis < 0 { axis + r as i64 } else { axis };
    if a < 0 || a >= r as i64 {
        return Err(format!("{op}: axis {axis} is out of range for rank {r}"));
    }
    Ok(a as usize)
}

fn compress(x: &HostTensor, cond: &HostTensor, axis: Option<i64>) -> Result<HostTensor, String> {
    let es = whole(x, "Compress's input")?;
    if cond.dtype != DType::Bool || cond.shape.len() != 1 {
        return Err(format!(
            "Compress: the condition must be a 1-D bool tensor, got {} {:?}",
            cond.dtype.name(),
            cond.shape
        ));
    }
    whole(cond, "Compress's condition")?;
    // Without an axis the input is flattened first.
    let shape = match axis {
        None => vec![numel(&x.shape)],
        Some(_) => x.shape.clone(),
    };
    let a = match axis {
        None => 0,
        Some(v) => axis_of(v, shape.len(), "Compress")?,
    };
    let len = shape[a];
    if cond.data.len() > len && cond.data[len..].iter().any(|&c| c != 0) {
        return Err(format!(
            "Compress: the condition selects index {} and beyond of an axis of length {len}",
            len
        ));
    }
    let keep: Vec<usize> = (0..len.min(cond.data.len()))
        .filter(|&i| cond.data[i] != 0)
        .collect();
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a + 1..].iter().product::<usize>() * es;
    let mut data = Vec::with_capacity(outer * keep.len() * inner);
    for o in 0..outer {
        for &k in &keep {
            let at = (o * len + k) * inner;
            data.extend_from_slice(&x.data[at..at + inner]);
        }
    }
    let mut out_shape = shape;
    out_shape[a] = keep.len();
    Ok(HostTensor {
        dtype: x.dtype,
        shape: out_shape,
        data,
    })
}

/// Reads element `i` of a numeric tensor as f64 for ordering (ints up to
/// 2^53 exactly; i64/u64 compared as integers by [`cmp_elem`]).
fn as_f64(t: &HostTensor, es: usize, i: usize) -> f64 {
    let b = &t.data[i * es..(i + 1) * es];
    match t.dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
        DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::I8 => b[0] as i8 as f64,
        DType::U8 | DType::Bool => b[0] as f64,
        DType::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
        DType::U16 => u16::from_le_bytes([b[0], b[1]]) as f64,
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        _ => 0.0,
    }
}

/// Orders elements `i` and `j` of `t` by value: NaNs equal and last.
fn cmp_elem(t: &HostTensor, es: usize, i: usize, j: usize) -> Ordering {
    let b = |k: usize| &t.data[k * es..(k + 1) * es];
    match t.dtype {
        DType::I64 => i64::from_le_bytes(b(i).try_into().expect("8"))
            .cmp(&i64::from_le_bytes(b(j).try_into().expect("8"))),
        DType::U64 => u64::from_le_bytes(b(i).try_into().expect("8"))
            .cmp(&u64::from_le_bytes(b(j).try_into().expect("8"))),
        _ => {
            let (x, y) = (as_f64(t, es, i), as_f64(t, es, j));
            match (x.is_nan(), y.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            }
        }
    }
}

fn unique(x: &HostTensor, axis: Option<i64>, sorted: i64) -> Result<Vec<HostTensor>, String> {
    let es = whole(x, "Unique's input")?;
    match x.dtype {
        DType::F32
        | DType::F64
        | DType::F16
        | DType::BF16
        | DType::I8
        | DType::U8
        | DType::I16
        | DType::U16
        | DType::I32
        | DType::U32
        | DType::I64
        | DType::U64
        | DType::Bool => {}
        d => return Err(format!("Unique on {} is not implemented", d.name())),
    }
    // Items: elements (no axis; flattened) or slices along the axis, each
    // `width` elements long, item `k` element `e` at `at(k, e)`.
    let (shape, a) = match axis {
        None => (vec![numel(&x.shape)], 0),
        Some(v) => (x.shape.clone(), axis_of(v, x.shape.len(), "Unique")?),
    };
    let len = shape[a];
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a + 1..].iter().product();
    let width = outer * inner;
    let at = |k: usize, e: usize| (e / inner * len + k) * inner + e % inner;
    let cmp_items = |p: usize, q: usize| -> Ordering {
        for e in 0..width {
            match cmp_elem(x, es, at(p, e), at(q, e)) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        Ordering::Equal
    };
    // Items sorted (stably: equal items keep their order of occurrence).
    let mut order: Vec<usize> = (0..len).collect();
    order.sort_by(|&p, &q| cmp_items(p, q));
    // Groups of equal items: first occurrence, members.
    let mut group_of = vec![0usize; len];
    let mut firsts: Vec<usize> = Vec::new();
    let mut counts: Vec<i64> = Vec::new();
    for (r, &k) in order.iter().enumerate() {
        if r > 0 && cmp_items(order[r - 1], k) == Ordering::Equal {
            *counts.last_mut().expect("a group") += 1;
        } else {
            firsts.push(k);
            counts.push(1);
        }
        group_of[k] = firsts.len() - 1;
    }
    // Output order of the groups: sorted, or by first occurrence.
    let mut groups: Vec<usize> = (0..firsts.len()).collect();
    if sorted == 0 {
        groups.sort_by_key(|&g| firsts[g]);
    }
    let mut rank = vec![0usize; groups.len()];
    for (r, &g) in groups.iter().enumerate() {
        rank[g] = r;
    }
    let u = groups.len();
    let mut data = Vec::with_capacity(u * width * es);
    let mut y_shape = shape.clone();
    y_shape[a] = u;
    for o in 0..outer {
        for &g in &groups {
            let k = firsts[g];
            for i in 0..inner {
                let src = at(k, o * inner + i) * es;
                data.extend_from_slice(&x.data[src..src + es]);
            }
        }
    }
    let y = HostTensor {
        dtype: x.dtype,
        shape: y_shape,
        data,
    };
    let indices: Vec<i64> = groups.iter().map(|&g| firsts[g] as i64).collect();
    let inverse: Vec<i64> = (0..len).map(|k| rank[group_of[k]] as i64).collect();
    let count: Vec<i64> = groups.iter().map(|&g| counts[g]).collect();
    Ok(vec![
        y,
        HostTensor::from_i64(&[u], &indices),
        HostTensor::from_i64(&[len], &inverse),
        HostTensor::from_i64(&[u], &count),
    ])
}

/// A float tensor's elements as f32 (f32, f64, f16, bf16).
fn floats(t: &HostTensor, what: &str) -> Result<Vec<f32>, String> {
    let es = whole(t, what)?;
    match t.dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok((0..numel(&t.shape))
            .map(|i| as_f64(t, es, i) as f32)
            .collect()),
        d => Err(format!("{what} must be float, got {}", d.name())),
    }
}

/// The one value of a scalar (or one-element) input.
fn one<T>(
    t: &HostTensor,
    what: &str,
    get: impl Fn(&HostTensor) -> Result<Vec<T>, String>,
) -> Result<T, String> {
    let mut v = get(t)?;
    if v.len() != 1 {
        return Err(format!(
            "{what} must hold one value, got shape {:?}",
            t.shape
        ));
    }
    Ok(v.remove(0))
}

fn nms(
    boxes: &HostTensor,
    scores: &HostTensor,
    max_out: Option<&HostTensor>,
    iou: Option<&HostTensor>,
    score_min: Option<&HostTensor>,
    center: i64,
) -> Result<HostTensor, String> {
    let (b, n) = match boxes.shape[..] {
        [b, n, 4] => (b, n),
        _ => {
            return Err(format!(
                "NonMaxSuppression: boxes must be [batches, boxes, 4], got {:?}",
                boxes.shape
            ))
        }
    };
    let c = match scores.shape[..] {
        [sb, c, sn] if sb == b && sn == n => c,
        _ => {
            return Err(format!(
                "NonMaxSuppression: scores must be [{b}, classes, {n}] for boxes {:?}, got {:?}",
                boxes.shape, scores.shape
            ))
        }
    };
    if center != 0 && center != 1 {
        return Err(format!(
            "NonMaxSuppression: center_point_box must be 0 or 1, got {center}"
        ));
    }
    let bx = floats(boxes, "NonMaxSuppression's boxes")?;
    let sc = floats(scores, "NonMaxSuppression's scores")?;
    let ints = |t: &HostTensor| -> Result<Vec<i64>, String> {
        match t.dtype {
            DType::I64 => {
                whole(t, "max_output_boxes_per_class")?;
                Ok(t.data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8")))
                    .collect())
            }
            d => Err(format!(
                "NonMaxSuppression: max_output_boxes_per_class must be int64, got {}",
                d.name()
            )),
        }
    };
    let max_out = match max_out {
        Some(t) if numel(&t.shape) > 0 => {
            one(t, "max_output_boxes_per_class", ints)?.max(0) as usize
        }
        _ => 0,
    };
    let iou_max = match iou {
        Some(t) if numel(&t.shape) > 0 => one(t, "iou_threshold", |t| floats(t, "iou_threshold"))?,
        _ => 0.0,
    };
    let score_min = match score_min {
        Some(t) if numel(&t.shape) > 0 => {
            Some(one(t, "score_threshold", |t| floats(t, "score_threshold"))?)
        }
        _ => None,
    };
    // Corners (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2.
    let corners = |bi: usize, k: usize| -> [f32; 4] {
        let v = &bx[(bi * n + k) * 4..][..4];
        if center == 1 {
            let (xc, yc, w, h) = (v[0], v[1], v[2], v[3]);
            [yc - h / 2.0, xc - w / 2.0, yc + h / 2.0, xc + w / 2.0]
        } else {
            [
                v[0].min(v[2]),
                v[1].min(v[3]),
                v[0].max(v[2]),
                v[1].max(v[3]),
            ]
        }
    };
    let suppressed = |p: [f32; 4], q: [f32; 4]| -> bool {
        let ih = p[2].min(q[2]) - p[0].max(q[0]);
        let iw = p[3].min(q[3]) - p[1].max(q[1]);
        if ih <= 0.0 || iw <= 0.0 {
            return false;
        }
        let inter = ih * iw;
        let (ap, aq) = ((p[2] - p[0]) * (p[3] - p[1]), (q[2] - q[0]) * (q[3] - q[1]));
        let union = ap + aq - inter;
        if ap <= 0.0 || aq <= 0.0 || union <= 0.0 {
            return false;
        }
        inter / union > iou_max
    };
    let mut out: Vec<i64> = Vec::new();
    for bi in 0..b {
        for ci in 0..c {
            if max_out == 0 {
                break;
            }
            let s = &sc[(bi * c + ci) * n..][..n];
            let mut cand: Vec<usize> = (0..n)
                .filter(|&k| score_min.is_none_or(|m| s[k] > m))
                .collect();
            // Descending score, ties by index (a stable sort of the
            // ascending indices); NaN scores last, so the order is total.
            cand.sort_by(|&p, &q| match (s[p].is_nan(), s[q].is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => s[q].partial_cmp(&s[p]).unwrap_or(Ordering::Equal),
            });
            let mut kept: Vec<usize> = Vec::new();
            for k in cand {
                if kept.len() >= max_out {
                    break;
                }
                let bk = corners(bi, k);
                if kept.iter().all(|&j| !suppressed(corners(bi, j), bk)) {
                    kept.push(k);
                }
            }
            for k in kept {
                out.extend([bi as i64, ci as i64, k as i64]);
            }
        }
    }
    Ok(HostTensor::from_i64(&[out.len() / 3, 3], &out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(a: &[(&str, i64)]) -> Vec<Attribute> {
        a.iter()
            .map(|(k, v)| Attribute::new(*k, AttrValue::Int(*v)))
            .collect()
    }

    fn i64s(t: &HostTensor) -> Vec<i64> {
        t.data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn non_zero_counts_negative_zero_as_zero_and_nan_as_nonzero() {
        let x = HostTensor::from_f32(&[2, 3], &[0.0, -0.0, 1.0, f32::NAN, 0.0, 2.0]);
        let y = run("NonZero", &attrs(&[]), &[Some(&x)]).unwrap();
        assert_eq!(y[0].shape, vec![2, 3]);
        assert_eq!(i64s(&y[0]), vec![0, 1, 1, 2, 0, 2]);
    }

    #[test]
    fn unique_matches_numpy_with_first_occurrence_order() {
        let x = HostTensor::from_f32(&[6], &[2.0, 1.0, 1.0, 3.0, 4.0, 3.0]);
        let out = run("Unique", &attrs(&[("sorted", 0)]), &[Some(&x)]).unwrap();
        assert_eq!(out[0].to_f32().unwrap(), vec![2.0, 1.0, 3.0, 4.0]);
        assert_eq!(i64s(&out[1]), vec![0, 1, 3, 4]);
        assert_eq!(i64s(&out[2]), vec![0, 1, 1, 2, 3, 2]);
        assert_eq!(i64s(&out[3]), vec![1, 2, 2, 1]);
    }

    #[test]
    fn nms_keeps_the_best_box_of_each_overlapping_pair() {
        // Two overlapping boxes (IoU 0.81) and one apart.
        let boxes = HostTensor::from_f32(
            &[1, 3, 4],
            &[0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.0, 5.0, 5.0, 6.0, 6.0],
        );
        let scores = HostTensor::from_f32(&[1, 1, 3], &[0.8, 0.9, 0.7]);
        let ins = [
            Some(boxes),
            Some(scores),
            Some(HostTensor::from_i64(&[1], &[10])),
            Some(HostTensor::from_f32(&[1], &[0.5])),
            None,
        ];
        let ins: Vec<Option<&HostTensor>> = ins.iter().map(|t| t.as_ref()).collect();
        let y = run("NonMaxSuppression", &attrs(&[]), &ins).unwrap();
        assert_eq!(y[0].shape, vec![2, 3]);
        assert_eq!(i64s(&y[0]), vec![0, 0, 1, 0, 0, 2]);
    }

    #[test]
    fn nms_orders_nan_scores_last_without_panicking() {
        // 40 boxes apart from each other, every third score NaN (more than
        // the sort's small-slice cutoff, where an inconsistent order can
        // panic).
        let n = 40;
        let boxes: Vec<f32> = (0..n)
            .flat_map(|k| {
                let o = 10.0 * k as f32;
                [o, o, o + 1.0, o + 1.0]
            })
            .collect();
        let scores: Vec<f32> = (0..n)
            .map(|k| if k % 3 == 0 { f32::NAN } else { k as f32 })
            .collect();
        let ins = [
            Some(HostTensor::from_f32(&[1, n, 4], &boxes)),
            Some(HostTensor::from_f32(&[1, 1, n], &scores)),
            Some(HostTensor::from_i64(&[1], &[n as i64])),
            None,
            None,
        ];
        let ins: Vec<Option<&HostTensor>> = ins.iter().map(|t| t.as_ref()).collect();
        let y = run("NonMaxSuppression", &attrs(&[]), &ins).unwrap();
        let picked: Vec<i64> = i64s(&y[0]).chunks(3).map(|r| r[2]).collect();
        let mut want: Vec<i64> = (0..n as i64).rev().filter(|k| k % 3 != 0).collect();
        want.extend((0..n as i64).filter(|k| k % 3 == 0));
        assert_eq!(picked, want);
    }

    #[test]
    fn bad_inputs_are_one_line_errors() {
        let x = HostTensor::from_f32(&[2, 2], &[1.0; 4]);
        let cond = HostTensor::from_f32(&[2], &[1.0; 2]);
        let e = run("Compress", &attrs(&[("axis", 0)]), &[Some(&x), Some(&cond)]);
        assert!(e.unwrap_err().contains("1-D bool"));
        let e = run("Unique", &attrs(&[("axis", 5)]), &[Some(&x)]);
        assert!(e.unwrap_err().contains("out of range"));
        let e = run("NonMaxSuppression", &attrs(&[]), &[Some(&x), Some(&x)]);
        assert!(e.unwrap_err().contains("[batches, boxes, 4]"));
    }
}
