//! MaxPool, AveragePool (2-D windows) and GlobalAveragePool /
//! GlobalMaxPool.

use super::conv::{attr_pair, pads_2d};
use super::{grid_for, one, Arg, NodePlan};
use crate::backend::NodeCtx;
use crate::cuda::codegen::{self, BLOCK};
use crate::tensor::numel;

pub(super) fn pool(ctx: &NodeCtx, max: bool) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    let y = &ctx.outputs[0];
    if x.shape.len() != 4 {
        return Err("only 2-D pooling (NCHW) is supported on CUDA".into());
    }
    if ctx.outputs.len() > 1 && ctx.outputs[1].shape != [0] {
        return Err("MaxPool's Indices output is not supported on CUDA".into());
    }
    let k = attr_pair(ctx, "kernel_shape", 1)?;
    let s = attr_pair(ctx, "strides", 1)?;
    let d = attr_pair(ctx, "dilations", 1)?;
    let out = [y.shape[2], y.shape[3]];
    let pad = pads_2d(ctx, [x.shape[2], x.shape[3]], out, k, s, d)?;
    let shape = codegen::PoolShape {
        nc: x.shape[0] * x.shape[1],
        h: x.shape[2],
        w: x.shape[3],
        oh: out[0],
        ow: out[1],
        k,
        stride: s,
        pad,
        dilation: d,
        count_include_pad: ctx.node.attr_int("count_include_pad") == Some(1),
    };
    let src = codegen::pool2d(x.dtype, &shape, max)?;
    Ok(one(
        src,
        grid_for(numel(&y.shape), BLOCK as usize),
        BLOCK,
        vec![Arg::In(0), Arg::Out(0)],
    ))
}

pub(super) fn global_pool(ctx: &NodeCtx, max: bool) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    if x.shape.len() < 3 {
        return Err("global pooling needs rank >= 3".into());
    }
    let nc = x.shape[0] * x.shape[1];
    let hw: usize = x.shape[2..].iter().product();
    let src = codegen::global_pool(x.dtype, nc, hw, max)?;
    Ok(one(
        src,
        grid_for(nc, 8),
        256,
        vec![Arg::In(0), Arg::Out(0)],
    ))
}
