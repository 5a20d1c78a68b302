//! ReduceSum / Mean / Max / Min (axes from the attribute or a constant
//! input) and Softmax / LogSoftmax.

use super::{const_ints, es, grid_for, norm_axis, one, Arg, Launch, NodePlan};
use crate::backend::NodeCtx;
use crate::cuda::codegen::{self, ReduceKind};
use crate::tensor::numel;

pub(super) fn reduce(ctx: &NodeCtx) -> Result<Option<NodePlan>, String> {
    let kind = match ctx.node.op_type.as_str() {
        "ReduceSum" => ReduceKind::Sum,
        "ReduceMean" => ReduceKind::Mean,
        "ReduceMax" => ReduceKind::Max,
        "ReduceMin" => ReduceKind::Min,
        _ => return Ok(None),
    };
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let axes = match ctx.node.attr_ints("axes") {
        Some(a) => Some(a.to_vec()),
        None => const_ints(ctx, 1, "axes")?,
    };
    let mut axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|&a| norm_axis(a, r))
            .collect::<Result<_, _>>()?,
        _ => {
            if ctx.node.attr_int("noop_with_empty_axes") == Some(1) {
                let bytes = numel(&x.shape) * es(x.dtype)?;
                return Ok(Some(NodePlan {
                    launches: vec![Launch::Copy {
                        src: Arg::In(0),
                        dst: Arg::Out(0),
                        bytes,
                    }],
                    ..Default::default()
                }));
            }
            (0..r).collect()
        }
    };
    axes.sort_unstable();
    axes.dedup();
    let src = codegen::reduce(&x.shape, x.dtype, &axes, kind)?;
    let n_out = numel(&ctx.outputs[0].shape);
    Ok(Some(one(
        src,
        grid_for(n_out, 8),
        256,
        vec![Arg::In(0), Arg::Out(0)],
    )))
}

pub(super) fn softmax(ctx: &NodeCtx, log: bool) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    let s = &x.shape;
    let r = s.len() as i64;
    let new = ctx.opset >= 13;
    let mut axis = ctx
        .node
        .attr_int("axis")
        .unwrap_or(if new { -1 } else { 1 });
    if axis < 0 {
        axis += r;
    }
    let axis = axis.clamp(0, r.max(1) - 1) as usize;
    let outer: usize = s[..axis].iter().product();
    let (len, inner) = if new {
        (
            s.get(axis).copied().unwrap_or(1),
            s[axis + 1..].iter().product(),
        )
    } else {
        (s[axis..].iter().product(), 1)
    };
    let src = codegen::softmax(x.dtype, outer, len, inner, log)?;
    Ok(one(
        src,
        grid_for(outer * inner, 1),
        256,
        vec![Arg::In(0), Arg::Out(0)],
    ))
}
