//! Conv (2-D, groups, strides, pads, dilations, auto_pad) on the
//! implicit-GEMM kernel, and the window attributes pooling shares.

use super::{one, Arg, NodePlan};
use crate::backend::NodeCtx;
use crate::cuda::codegen;

pub(super) fn attr_pair(ctx: &NodeCtx, name: &str, default: usize) -> Result<[usize; 2], String> {
    match ctx.node.attr_ints(name) {
        None => Ok([default; 2]),
        Some([a, b]) => Ok([*a as usize, *b as usize]),
        Some(v) => Err(format!("{name} {v:?}: only 2-D is supported on CUDA")),
    }
}

/// Begin pads of a 2-D window op (`pads` is [h0, w0, h1, w1]); SAME
/// auto_pad is computed from the output size.
pub(super) fn pads_2d(
    ctx: &NodeCtx,
    inp: [usize; 2],
    out: [usize; 2],
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
) -> Result<[usize; 2], String> {
    match ctx.node.attr_str("auto_pad").unwrap_or("NOTSET") {
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut p = [0; 2];
            for i in 0..2 {
                let need = ((out[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1).saturating_sub(inp[i]);
                p[i] = if ctx.node.attr_str("auto_pad") == Some("SAME_UPPER") {
                    need / 2
                } else {
                    need.div_ceil(2)
                };
            }
            Ok(p)
        }
        "VALID" => Ok([0, 0]),
        _ => match ctx.node.attr_ints("pads") {
            None => Ok([0, 0]),
            Some([a, b, _, _]) => Ok([*a as usize, *b as usize]),
            Some(v) => Err(format!("pads {v:?}: only 2-D is supported on CUDA")),
        },
    }
}

pub(super) fn conv(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    let w = ctx.input(1)?;
    let y = &ctx.outputs[0];
    if x.shape.len() != 4 || w.shape.len() != 4 {
        return Err("only 2-D Conv (NCHW) is supported on CUDA".into());
    }
    let group = ctx.node.attr_int("group").unwrap_or(1).max(1) as usize;
    let k = [w.shape[2], w.shape[3]];
    let s = attr_pair(ctx, "strides", 1)?;
    let d = attr_pair(ctx, "dilations", 1)?;
    let out = [y.shape[2], y.shape[3]];
    let pad = pads_2d(ctx, [x.shape[2], x.shape[3]], out, k, s, d)?;
    let shape = codegen::ConvShape {
        n: x.shape[0],
        c: x.shape[1],
        h: x.shape[2],
        w: x.shape[3],
        oc: w.shape[0],
        kh: k[0],
        kw: k[1],
        oh: out[0],
        ow: out[1],
        stride: s,
        pad,
        dilation: d,
        group,
    };
    if !shape.c.is_multiple_of(group)
        || !shape.oc.is_multiple_of(group)
        || w.shape[1] != shape.c / group
    {
        return Err("Conv channels do not match the group count".into());
    }
    let bias = matches!(ctx.inputs.get(2), Some(Some(_)));
    let src = codegen::conv2d(x.dtype, &shape, bias)?;
    let p = shape.n * shape.oh * shape.ow;
    let grid = [
        p.div_ceil(64) as u32,
        (shape.oc / group).div_ceil(64) as u32,
        group as u32,
    ];
    let mut args = vec![Arg::In(0), Arg::In(1)];
    if bias {
        args.push(Arg::In(2));
    }
    args.push(Arg::Out(0));
    Ok(one(src, grid, 256, args))
}
