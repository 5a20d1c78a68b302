//! Data movement: Transpose, Slice (constant or run-time starts), Concat
//! and Split as strided copies, Gather and GatherND. (Views, Shape,
//! Constant, ConstantOfShape and Range are a copy, an upload or one small
//! kernel each, planned by their own functions in [`super`]'s table.)

use super::{const_ints, es, grid_for, norm_axis, one, Arg, Launch, NodePlan};
use crate::backend::{NodeCtx, TensorInfo};
use crate::cuda::codegen::{self, Src, BLOCK};
use crate::tensor::numel;

fn copy_plan(src: Src, n: usize, input: Arg, output: Arg) -> (Launch, Src) {
    (
        Launch::Kernel {
            func: src.name.clone(),
            grid: grid_for(n, BLOCK as usize),
            block: BLOCK,
            args: vec![input, output],
        },
        src,
    )
}

pub(super) fn transpose(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let perm: Vec<usize> = match ctx.node.attr_ints("perm") {
        Some(p) => p
            .iter()
            .map(|&a| norm_axis(a, r))
            .collect::<Result<_, _>>()?,
        None => (0..r).rev().collect(),
    };
    let own = codegen::strides_of(&x.shape);
    let out: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let src_st: Vec<i64> = perm.iter().map(|&p| own[p]).collect();
    let src = codegen::strided_copy(
        "transpose",
        es(x.dtype)?,
        &out,
        &src_st,
        0,
        &codegen::strides_of(&out),
        0,
    )?;
    Ok(one(
        src,
        grid_for(numel(&out), BLOCK as usize),
        BLOCK,
        vec![Arg::In(0), Arg::Out(0)],
    ))
}

pub(super) fn slice(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    let y = &ctx.outputs[0];
    let n = ctx.node;
    let constant = |k: usize| {
        ctx.inputs.get(k).is_none_or(|t| t.is_none())
            || ctx.constants.get(k).copied().flatten().is_some()
    };
    if ctx.opset >= 10 && !(constant(1) && constant(3) && constant(4)) {
        // Starts (axes, steps) computed at run time: read on the device.
        if numel(&y.shape) == 0 {
            return Ok(NodePlan::default());
        }
        let dt = |k: usize| ctx.inputs.get(k).and_then(|t| t.as_ref()).map(|t| t.dtype);
        let starts = ctx.input(1)?;
        let src = codegen::slice_dynamic(
            es(x.dtype)?,
            &x.shape,
            &y.shape,
            numel(&starts.shape),
            starts.dtype,
            dt(3),
            dt(4),
        )?;
        let mut args = vec![Arg::In(0), Arg::In(1)];
        for k in [3, 4] {
            if dt(k).is_some() {
                args.push(Arg::In(k));
            }
        }
        args.push(Arg::Out(0));
        return Ok(one(
            src,
            grid_for(numel(&y.shape), BLOCK as usize),
            BLOCK,
            args,
        ));
    }
    let (starts, axes, steps) = if ctx.opset < 10 {
        (
            n.attr_ints("starts").ok_or("no starts")?.to_vec(),
            n.attr_ints("axes").map(|a| a.to_vec()),
            None,
        )
    } else {
        (
            const_ints(ctx, 1, "starts")?.ok_or("no starts")?,
            const_ints(ctx, 3, "axes")?,
            const_ints(ctx, 4, "steps")?,
        )
    };
    let r = x.shape.len();
    let own = codegen::strides_of(&x.shape);
    let mut st = own.clone();
    let mut base = 0i64;
    for (i, &s0) in starts.iter().enumerate() {
        let a = norm_axis(axes.as_ref().map_or(i as i64, |a| a[i]), r)?;
        let dim = x.shape[a] as i64;
        let step = steps.as_ref().map_or(1, |s| s[i]);
        let mut s = if s0 < 0 { s0 + dim } else { s0 };
        s = if step > 0 {
            s.clamp(0, dim)
        } else {
            s.clamp(0, dim - 1)
        };
        base += s * own[a];
        st[a] = step * own[a];
    }
    if numel(&y.shape) == 0 {
        return Ok(NodePlan::default());
    }
    let src = codegen::strided_copy(
        "slice",
        es(x.dtype)?,
        &y.shape,
        &st,
        base,
        &codegen::strides_of(&y.shape),
        0,
    )?;
    Ok(one(
        src,
        grid_for(numel(&y.shape), BLOCK as usize),
        BLOCK,
        vec![Arg::In(0), Arg::Out(0)],
    ))
}

/// Concat (one copy per input into its place) and Split (one per output).
pub(super) fn concat(ctx: &NodeCtx, split: bool) -> Result<NodePlan, String> {
    let whole = if split {
        ctx.input(0)?
    } else {
        &ctx.outputs[0]
    };
    let r = whole.shape.len();
    let axis = norm_axis(
        ctx.node
            .attr_int("axis")
            .unwrap_or(if split { 0 } else { 1 }),
        r,
    )?;
    let e = es(whole.dtype)?;
    let wst = codegen::strides_of(&whole.shape);
    let parts: Vec<(usize, &TensorInfo)> = if split {
        ctx.outputs
            .iter()
            .enumerate()
            .filter(|(_, t)| t.shape != [0] || r == 1)
            .collect()
    } else {
        ctx.inputs
            .iter()
            .enumerate()
            .filter_map(|(k, t)| t.as_ref().map(|t| (k, t)))
            .collect()
    };
    let mut p = NodePlan::default();
    let mut off = 0i64;
    for (k, t) in parts {
        let n = numel(&t.shape);
        if n > 0 {
            let pst = codegen::strides_of(&t.shape);
            let (launch, src) = if split {
                let src =
                    codegen::strided_copy("split", e, &t.shape, &wst, off * wst[axis], &pst, 0)?;
                copy_plan(src, n, Arg::In(0), Arg::Out(k))
            } else {
                let src =
                    codegen::strided_copy("concat", e, &t.shape, &pst, 0, &wst, off * wst[axis])?;
                copy_plan(src, n, Arg::In(k), Arg::Out(0))
            };
            p.launches.push(launch);
            p.sources.push(src);
        }
        off += t.shape.get(axis).copied().unwrap_or(0) as i64;
    }
    Ok(p)
}

pub(super) fn gather(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    let idx = ctx.input(1)?;
    let r = x.shape.len();
    let axis = norm_axis(ctx.node.attr_int("axis").unwrap_or(0), r)?;
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let n_idx = numel(&idx.shape);
    if outer * inner * n_idx == 0 {
        return Ok(NodePlan::default());
    }
    let src = codegen::gather(es(x.dtype)?, idx.dtype, outer, x.shape[axis], n_idx, inner)?;
    Ok(one(
        src,
        grid_for(outer * n_idx * inner, BLOCK as usize),
        BLOCK,
        vec![Arg::In(0), Arg::In(1), Arg::Out(0)],
    ))
}

pub(super) fn gather_nd(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let (x, i) = (ctx.input(0)?, ctx.input(1)?);
    let b = ctx.node.attr_int("batch_dims").unwrap_or(0) as usize;
    let last = *i.shape.last().ok_or("GatherND with scalar indices")?;
    let q = i.shape.len();
    if b + last > x.shape.len() || b >= q {
        return Err("GatherND indices do not fit the data".into());
    }
    let tuples: usize = i.shape[b..q - 1].iter().product();
    let n = numel(&ctx.outputs[0].shape);
    if n == 0 {
        return Ok(NodePlan::default());
    }
    let src = codegen::gather_nd(es(x.dtype)?, i.dtype, &x.shape, b, tuples, last)?;
    Ok(one(
        src,
        grid_for(n, BLOCK as usize),
        BLOCK,
        vec![Arg::In(0), Arg::In(1), Arg::Out(0)],
    ))
}
