//! Normalization layers.
//!
//! `LayerNormalization(X, S, B, axis, ε)` normalizes over the axes
//! `[axis, rank)`. The forward node's optional outputs `Mean` (`μ`) and
//! `InvStdDev` (`σ⁻¹ = 1/√(var + ε)`) are switched on and kept for the
//! backward pass, as torch keeps `X`, `μ` and `σ⁻¹`; with
//! `x̂ = (x - μ)·σ⁻¹`:
//!
//! - `dB = Σ dy`, `dS = Σ dy·x̂` over the non-normalized axes;
//! - `dx̂ = dy·S`;
//! - `dX = σ⁻¹·(dx̂ - mean(dx̂) - x̂·mean(dx̂·x̂))`, means over the normalized axes.
//!
//! `Conv(X, W, B)` (explicit pads), `Y[n,m,o] = Σ_{c,k}
//! W[m,c,k]·X[n,c,o·s + k·d - p] + B[m]`:
//!
//! - `dB = Σ dY` over the batch and spatial axes;
//! - `dX = ConvTranspose(dY, W)` with the same strides, dilations and
//!   pads, and `output_padding` making its size `X`'s (static dims, or unit
//!   strides);
//! - `dW = Transpose(Slice(Conv(Xᵀ, dYᵀ), :k), [1, 0, ...])` where `ᵀ`
//!   swaps the batch and channel axes: a convolution over the batch, with
//!   the forward dilations as strides and the forward strides as
//!   dilations, cut to the kernel (the last rows are extra when the
//!   forward stride did not divide the padded input). With `group = g`
//!   (depthwise included), `ConvTranspose` takes `group = g` as is, and the
//!   weight gradient is one grouped Conv: `X` as `[C/g, g·N, H, W]` (group
//!   j's channels are its N samples) against `dY` as `[M, N, Ho, Wo]`,
//!   so each output channel contracts only with its own group's inputs;
//!   this needs static channel and spatial dims.
//!
//! `MaxPool` (unit dilations, no ceil mode): the node's `Indices` output
//! is switched on and kept; `dX = Reshape(ScatterElements(zeros(numel X),
//! flat(Indices), flat(dY), reduction="add"), Shape(X))`. The zeros die at
//! the ScatterElements, which the planner puts in place over them (its
//! update rule), and the Reshape is a view: the gradient holds one
//! input-sized buffer, as torch's `max_pool2d_with_indices_backward` does
//! (saving the indices, int64, as torch does too).
//!
//! `AveragePool` (unit dilations, no ceil mode, static channel and spatial
//! dims): a depthwise convolution with a kernel of ones, divided by the
//! number of elements each window averages, `dX = ConvTranspose(dY / cnt,
//! ones[C, 1, k...], group = C)` with the forward strides and pads.
//! `cnt` is `prod(kernel)`, or with `count_include_pad = 0` and pads the
//! count of window elements inside the input, a constant per output
//! position (the product over axes of the in-bounds counts). It reads no
//! forward value.
//!
//! `BatchNormalization` in inference form (`training_mode = 0`: running
//! mean `μ` and variance `v` are inputs), per channel (axis 1), with
//! `r = 1/√(v + ε)` and sums over every axis but 1:
//! `dX = dY·S·r`, `dB = Σ dY`, `dS = r·Σ dY·(X - μ)`, `dμ = -S·r·Σ dY`,
//! `dv = -½·S·r³·Σ dY·(X - μ)`.
//!
//! The decomposed form torch exports before opset 17 (ReduceMean, Sub,
//! Pow, Sqrt, Div, ...) is differentiated op by op.

use super::{dy, out_dims};
use crate::cx::{float_scalar, int_attr, ints_attr, Cx};
use crate::Result;
use graphopt_ir::ValueId;
use graphopt_ir::{AttrValue, Attribute};

type Grads = Result<Vec<Option<ValueId>>>;

pub fn layer_norm(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    if dys.iter().skip(1).any(|d| d.is_some()) {
        return Err(cx.unsupported("gradients through the Mean and InvStdDev outputs have no rule"));
    }
    let d = dy(cx, dys)?;
    let od = out_dims(cx)?;
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    let axis = cx.attr_int("axis", -1);
    let axis = if axis < 0 { axis + r } else { axis };
    let axes: Vec<i64> = (axis..r).collect();
    let mut out = vec![None, None, None];
    // μ and σ⁻¹ from the forward node (its optional outputs, added if off).
    let node = cx.node;
    let yname = cx.g.name(cx.y(0)?).to_string();
    let mut saved = |k: usize, hint: &str| match cx.g.node(node).output(k) {
        Some(v) => v,
        None => {
            let v = cx.g.fresh_value(&format!("{yname}_{hint}"), None);
            cx.g.set_output(node, k, Some(v));
            v
        }
    };
    let (mean, rstd) = (saved(1, "mean"), saved(2, "inv_std_dev"));
    let xc = cx.op("Sub", &[x, mean], vec![])?;
    let xhat = cx.op("Mul", &[xc, rstd], vec![])?;
    if cx.need(2) {
        let b = cx.x(2)?;
        out[2] = Some(cx.unbroadcast(d, &od, b)?);
    }
    if cx.need(1) {
        let s = cx.x(1)?;
        let p = cx.op("Mul", &[d, xhat], vec![])?;
        out[1] = Some(cx.unbroadcast(p, &od, s)?);
    }
    if cx.need(0) {
        let s = cx.x(1)?;
        let dxh = cx.op("Mul", &[d, s], vec![])?;
        let m1 = cx.reduce_mean(dxh, &axes, true)?;
        let p = cx.op("Mul", &[dxh, xhat], vec![])?;
        let m2 = cx.reduce_mean(p, &axes, true)?;
        let t = cx.op("Mul", &[xhat, m2], vec![])?;
        let a = cx.op("Sub", &[dxh, m1], vec![])?;
        let b = cx.op("Sub", &[a, t], vec![])?;
        out[0] = Some(cx.op("Mul", &[rstd, b], vec![])?);
    }
    Ok(out)
}

pub fn conv(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let (x, w) = (cx.x(0)?, cx.x(1)?);
    let group = cx.attr_int("group", 1);
    let ap =
        cx.g.node(cx.node)
            .attr_str("auto_pad")
            .unwrap_or("NOTSET")
            .to_string();
    if ap != "NOTSET" && ap != "VALID" {
        return Err(cx.unsupported(format!("auto_pad={ap} has no rule yet")));
    }
    let wd = cx.dims(w).unwrap_or_default();
    let kernel: Vec<i64> = wd
        .iter()
        .skip(2)
        .map(|d| d.known())
        .collect::<Option<_>>()
        .ok_or_else(|| cx.unsupported("the kernel's shape is unknown"))?;
    let sp = kernel.len();
    if sp == 0 {
        return Err(cx.unsupported("the kernel's rank is unknown"));
    }
    let strides = cx.attr_ints("strides").unwrap_or(vec![1; sp]);
    let dil = cx.attr_ints("dilations").unwrap_or(vec![1; sp]);
    let pads = cx.attr_ints("pads").unwrap_or(vec![0; 2 * sp]);
    let xd = cx.dims(x).unwrap_or_default();
    let yd = out_dims(cx)?;
    let mut out = vec![None, None, None];
    if cx.need(2) {
        let axes: Vec<i64> = std::iter::once(0).chain(2..2 + sp as i64).collect();
        out[2] = Some(cx.reduce_sum(d, &axes, false)?);
    }
    if cx.need(0) {
        let mut opad = Vec::new();
        for i in 0..sp {
            let (h, ho) = (
                xd.get(2 + i).and_then(|d| d.known()),
                yd.get(2 + i).and_then(|d| d.known()),
            );
            opad.push(match (h, ho) {
                (Some(h), Some(ho)) => {
                    h - (strides[i] * (ho - 1) + (kernel[i] - 1) * dil[i] + 1
                        - pads[i]
                        - pads[i + sp])
                }
                _ if strides[i] == 1 => 0,
                _ => {
                    return Err(cx.unsupported(
                        "a strided convolution over dims unknown before run time has no rule yet",
                    ))
                }
            });
        }
        out[0] = Some(cx.op(
            "ConvTranspose",
            &[d, w],
            vec![
                ints_attr("strides", &strides),
                ints_attr("dilations", &dil),
                ints_attr("pads", &pads),
                ints_attr("output_padding", &opad),
                int_attr("group", group),
            ],
        )?);
    }
    if cx.need(1) && group != 1 {
        out[1] = Some(grouped_weight_grad(
            cx, x, d, group, &kernel, &strides, &dil, &pads,
        )?);
    } else if cx.need(1) {
        let mut perm: Vec<i64> = (0..2 + sp as i64).collect();
        perm.swap(0, 1);
        let xt = cx.transpose(x, &perm)?;
        let dt = cx.transpose(d, &perm)?;
        let c = cx.op(
            "Conv",
            &[xt, dt],
            vec![
                ints_attr("strides", &dil),
                ints_attr("dilations", &strides),
                ints_attr("pads", &pads),
            ],
        )?;
        let starts = cx.const_i64(&vec![0; sp])?;
        let ends = cx.const_i64(&kernel)?;
        let axes = cx.const_i64(&(2..2 + sp as i64).collect::<Vec<_>>())?;
        let cut = cx.op("Slice", &[c, starts, ends, axes], vec![])?;
        out[1] = Some(cx.transpose(cut, &perm)?);
    }
    Ok(out)
}

/// The weight gradient of a grouped Conv (see the module docs).
#[allow(clippy::too_many_arguments)]
fn grouped_weight_grad(
    cx: &mut Cx,
    x: ValueId,
    d: ValueId,
    g: i64,
    kernel: &[i64],
    strides: &[i64],
    dil: &[i64],
    pads: &[i64],
) -> Result<ValueId> {
    let sp = kernel.len();
    let known = |cx: &Cx, v: ValueId| -> Result<Vec<i64>> {
        let dims = cx.dims(v).unwrap_or_default();
        dims.iter()
            .skip(1)
            .map(|d| d.known())
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| cx.unsupported("grouped Conv needs static channel and spatial dims"))
    };
    let xd = known(cx, x)?; // [C, H, W...]
    let y = cx.y(0)?; // dy has y's shape, and y's type is known
    let yd = known(cx, y)?; // [M, Ho, Wo...]
    let (c, m) = (xd[0], yd[0]);
    // X: [N, C, S...] -> [N, g, C/g, S...] -> [C/g, g, N, S...] -> [C/g, g·N, S...]
    let mut s1 = vec![-1, g, c / g];
    s1.extend_from_slice(&xd[1..]);
    let s1 = cx.const_i64(&s1)?;
    let x1 = cx.reshape(x, s1)?;
    let mut p1 = vec![2, 1, 0];
    p1.extend(3..3 + sp as i64);
    let x2 = cx.transpose(x1, &p1)?;
    let mut s2 = vec![c / g, -1];
    s2.extend_from_slice(&xd[1..]);
    let s2 = cx.const_i64(&s2)?;
    let xg = cx.reshape(x2, s2)?;
    // dY: [N, M, O...] -> [N, g, M/g, O...] -> [g, M/g, N, O...] -> [M, N, O...]
    let mut t1 = vec![-1, g, m / g];
    t1.extend_from_slice(&yd[1..]);
    let t1 = cx.const_i64(&t1)?;
    let d1 = cx.reshape(d, t1)?;
    let mut q1 = vec![1, 2, 0];
    q1.extend(3..3 + sp as i64);
    let d2 = cx.transpose(d1, &q1)?;
    let mut t2 = vec![m, -1];
    t2.extend_from_slice(&yd[1..]);
    let t2 = cx.const_i64(&t2)?;
    let dg = cx.reshape(d2, t2)?;
    let conv = cx.op(
        "Conv",
        &[xg, dg],
        vec![
            ints_attr("strides", dil),
            ints_attr("dilations", strides),
            ints_attr("pads", pads),
            int_attr("group", g),
        ],
    )?;
    let starts = cx.const_i64(&vec![0; sp])?;
    let ends = cx.const_i64(kernel)?;
    let axes = cx.const_i64(&(2..2 + sp as i64).collect::<Vec<_>>())?;
    let cut = cx.op("Slice", &[conv, starts, ends, axes], vec![])?;
    let mut perm: Vec<i64> = (0..2 + sp as i64).collect();
    perm.swap(0, 1);
    cx.transpose(cut, &perm)
}

pub fn max_pool(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    if cx.attr_int("ceil_mode", 0) != 0
        || cx
            .attr_ints("dilations")
            .is_some_and(|d| d.iter().any(|&v| v != 1))
        || cx.attr_int("storage_order", 0) != 0
    {
        return Err(cx.unsupported("ceil_mode, dilations or storage_order have no rule yet"));
    }
    let node = cx.node;
    let idx = match cx.g.node(node).output(1) {
        Some(v) => v,
        None => {
            let yname = cx.g.name(cx.y(0)?).to_string();
            let v = cx.g.fresh_value(&format!("{yname}_indices"), None);
            cx.g.set_output(node, 1, Some(v));
            v
        }
    };
    let dt = cx.dtype(x)?;
    let flat = cx.const_i64(&[-1])?;
    let fi = cx.reshape(idx, flat)?;
    let fd = cx.reshape(d, flat)?;
    let s = cx.shape_of(x)?;
    let n = cx.op("ReduceProd", &[s], vec![int_attr("keepdims", 1)])?;
    let zero = float_scalar(dt, 0.0, vec![1])?;
    let z = cx.op(
        "ConstantOfShape",
        &[n],
        vec![Attribute::new("value", AttrValue::Tensor(zero))],
    )?;
    *cx.wants_opset16 = true;
    let sc = cx.op(
        "ScatterElements",
        &[z, fi, fd],
        vec![
            int_attr("axis", 0),
            Attribute::new("reduction", AttrValue::String(b"add".to_vec())),
        ],
    )?;
    Ok(vec![Some(cx.reshape(sc, s)?)])
}

pub fn batch_norm(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    if cx.attr_int("training_mode", 0) != 0 {
        return Err(cx.unsupported("training_mode=1 has no rule yet (inference form only)"));
    }
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let r = cx.rank(x)? as i64;
    let dt = cx.dtype(x)?;
    let eps = cx.attr_float("epsilon", 1e-5) as f64;
    let (s, mean, var) = (cx.x(1)?, cx.x(3)?, cx.x(4)?);
    let bc: Vec<i64> = std::iter::once(0).chain(2..r).collect();
    let e = cx.scalar(dt, eps)?;
    let ve = cx.op("Add", &[var, e], vec![])?;
    let sd = cx.op("Sqrt", &[ve], vec![])?;
    let rs = cx.op("Reciprocal", &[sd], vec![])?;
    let sr = cx.op("Mul", &[s, rs], vec![])?;
    let mut out = vec![None; 5];
    let need_xc = cx.need(1) || cx.need(4);
    let sum_dy = if cx.need(2) || cx.need(3) {
        Some(cx.reduce_sum(d, &bc, false)?)
    } else {
        None
    };
    if cx.need(0) {
        let sru = cx.unsqueeze(sr, &bc)?;
        out[0] = Some(cx.op("Mul", &[d, sru], vec![])?);
    }
    if cx.need(2) {
        out[2] = sum_dy;
    }
    if cx.need(3) {
        let n = cx.op("Neg", &[sr], vec![])?;
        out[3] = Some(cx.op("Mul", &[n, sum_dy.unwrap()], vec![])?);
    }
    if need_xc {
        let mu = cx.unsqueeze(mean, &bc)?;
        let xc = cx.op("Sub", &[x, mu], vec![])?;
        let p = cx.op("Mul", &[d, xc], vec![])?;
        let raw = cx.reduce_sum(p, &bc, false)?;
        if cx.need(1) {
            out[1] = Some(cx.op("Mul", &[raw, rs], vec![])?);
        }
        if cx.need(4) {
            let r2 = cx.op("Mul", &[rs, rs], vec![])?;
            let r3 = cx.op("Mul", &[r2, sr], vec![])?;
            let h = cx.scale(r3, dt, -0.5)?;
            out[4] = Some(cx.op("Mul", &[raw, h], vec![])?);
        }
    }
    Ok(out)
}

pub fn average_pool(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let x = cx.x(0)?;
    let dt = cx.dtype(x)?;
    if cx.attr_int("ceil_mode", 0) != 0
        || cx
            .attr_ints("dilations")
            .is_some_and(|d| d.iter().any(|&v| v != 1))
    {
        return Err(cx.unsupported("ceil_mode or dilations have no rule yet"));
    }
    let ap =
        cx.g.node(cx.node)
            .attr_str("auto_pad")
            .unwrap_or("NOTSET")
            .to_string();
    if ap != "NOTSET" && ap != "VALID" {
        return Err(cx.unsupported(format!("auto_pad={ap} has no rule yet")));
    }
    let kernel = cx
        .attr_ints("kernel_shape")
        .ok_or_else(|| cx.unsupported("kernel_shape is missing"))?;
    let sp = kernel.len();
    let strides = cx.attr_ints("strides").unwrap_or(vec![1; sp]);
    let pads = if ap == "VALID" {
        vec![0; 2 * sp]
    } else {
        cx.attr_ints("pads").unwrap_or(vec![0; 2 * sp])
    };
    let static_dims = |cx: &Cx, v: ValueId| -> Option<Vec<i64>> {
        cx.dims(v)?.iter().skip(1).map(|d| d.known()).collect()
    };
    let (Some(xd), Some(yd)) = (static_dims(cx, x), static_dims(cx, cx.y(0)?)) else {
        return Err(cx.unsupported("AveragePool needs static channel and spatial dims"));
    };
    if xd.len() != sp + 1 || yd.len() != sp + 1 || strides.len() != sp || pads.len() != 2 * sp {
        return Err(cx.unsupported("the kernel's rank does not match the input's"));
    }
    let c = xd[0];
    let k: i64 = kernel.iter().product();
    let include = cx.attr_int("count_include_pad", 0) != 0;
    let scaled = if include || pads.iter().all(|&p| p == 0) {
        cx.scale(d, dt, 1.0 / k as f64)?
    } else {
        // 1/cnt per output position: the product over axes of
        // 1/#{j < k_i : 0 <= o·s_i - p_i + j < H_i}.
        let mut inv = vec![1f64];
        for i in 0..sp {
            let per: Vec<f64> = (0..yd[1 + i])
                .map(|o| {
                    let start = o * strides[i] - pads[i];
                    let n = (0..kernel[i])
                        .filter(|j| (0..xd[1 + i]).contains(&(start + j)))
                        .count();
                    1.0 / n.max(1) as f64
                })
                .collect();
            inv = inv
                .iter()
                .flat_map(|a| per.iter().map(move |b| a * b))
                .collect();
        }
        let mut dims = vec![1, 1];
        dims.extend_from_slice(&yd[1..]);
        let t = match dt {
            graphopt_ir::DType::F64 => {
                let raw: Vec<u8> = inv.iter().flat_map(|v| v.to_le_bytes()).collect();
                graphopt_ir::Tensor::from_raw(dt, dims, raw.into())?
            }
            _ => {
                let v: Vec<f32> = inv.iter().map(|&v| v as f32).collect();
                graphopt_ir::Tensor::from_f32(dims, &v)?
            }
        };
        let w = cx.constant("inv_count", t);
        cx.op("Mul", &[d, w], vec![])?
    };
    let mut wdims = vec![c, 1];
    wdims.extend_from_slice(&kernel);
    let n = (c * k) as usize;
    let ones = match dt {
        graphopt_ir::DType::F64 => {
            let raw: Vec<u8> = std::iter::repeat_n(1f64.to_le_bytes(), n)
                .flatten()
                .collect();
            graphopt_ir::Tensor::from_raw(dt, wdims, raw.into())?
        }
        _ => graphopt_ir::Tensor::from_f32(wdims, &vec![1f32; n])?,
    };
    let w = cx.constant("ones", ones);
    let opad: Vec<i64> = (0..sp)
        .map(|i| xd[1 + i] - (strides[i] * (yd[1 + i] - 1) + kernel[i] - pads[i] - pads[i + sp]))
        .collect();
    Ok(vec![Some(cx.op(
        "ConvTranspose",
        &[scaled, w],
        vec![
            ints_attr("strides", &strides),
            ints_attr("pads", &pads),
            ints_attr("output_padding", &opad),
            int_attr("group", c),
        ],
    )?)])
}
