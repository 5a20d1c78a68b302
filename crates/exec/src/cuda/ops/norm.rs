//! LayerNormalization (with its optional mean and inverse std-dev
//! outputs).

use super::{grid_for, norm_axis, one, Arg, NodePlan};
use crate::backend::NodeCtx;
use crate::cuda::codegen;
use crate::tensor::numel;
use graphopt_ir::DType;

pub(super) fn layer_norm(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let x = ctx.input(0)?;
    let g = ctx.input(1)?;
    let r = x.shape.len();
    let axis = norm_axis(ctx.node.attr_int("axis").unwrap_or(-1), r)?;
    let rows: usize = x.shape[..axis].iter().product();
    let len: usize = x.shape[axis..].iter().product();
    if numel(&g.shape) != len {
        return Err(format!(
            "Scale {:?} does not cover the normalized {len} elements",
            g.shape
        ));
    }
    let bias = matches!(ctx.inputs.get(2), Some(Some(_)));
    if bias && numel(&ctx.input(2)?.shape) != len {
        return Err("B does not cover the normalized elements".into());
    }
    let stats = ctx.outputs.len() > 1 && ctx.outputs[1].shape != [0];
    if stats && ctx.outputs.iter().skip(1).any(|o| o.dtype != DType::F32) {
        return Err("Mean / InvStdDev outputs other than float are not supported".into());
    }
    let eps = ctx.node.attr_float("epsilon").unwrap_or(1e-5);
    let src = codegen::layer_norm(x.dtype, g.dtype, rows, len, eps, bias, stats)?;
    let mut args = vec![Arg::In(0), Arg::In(1)];
    if bias {
        args.push(Arg::In(2));
    }
    args.push(Arg::Out(0));
    if stats {
        args.push(Arg::Out(1));
        args.push(Arg::Out(2));
    }
    Ok(one(src, grid_for(rows, 1), 256, args))
}
