//! Elementwise nodes as one broadcasting kernel each: unary math,
//! binary arithmetic, comparisons and logic, variadic Sum/Max/Min, Mod,
//! Where, Cast, Expand, Clip, and BatchNormalization (inference) as an
//! expression over its constant statistics.

use super::{grid_for, lit, one, Arg, NodePlan};
use crate::backend::{NodeCtx, TensorInfo};
use crate::cuda::codegen::{self, EwIn, Src, BLOCK};
use crate::tensor::numel;
use graphopt_ir::DType;

/// The expression of a unary op over `v0` (compute type `ct`).
fn unary_expr(ctx: &NodeCtx, op: &str, ct: &str, d: DType) -> Result<Option<String>, String> {
    let f = |n: &str| codegen::math(n, ct);
    let float = codegen::is_float(d);
    let need_float = |e: String| -> Result<Option<String>, String> {
        if float {
            Ok(Some(e))
        } else {
            Err(format!("{op} on {} is not supported on CUDA", d.name()))
        }
    };
    let n = ctx.node;
    Ok(match op {
        "Relu" => Some(if float {
            format!("{}(v0, 0)", f("fmax"))
        } else {
            "(v0 > 0 ? v0 : 0)".into()
        }),
        "Neg" => Some("-v0".into()),
        "Abs" => Some(if float {
            format!("{}(v0)", f("fabs"))
        } else {
            "(v0 < 0 ? -v0 : v0)".into()
        }),
        "Not" => Some("!v0".into()),
        "Sqrt" => need_float(format!("{}(v0)", f("sqrt")))?,
        "Exp" => need_float(format!("{}(v0)", f("exp")))?,
        "Log" => need_float(format!("{}(v0)", f("log")))?,
        "Reciprocal" => need_float("1 / v0".into())?,
        "Floor" => need_float(format!("{}(v0)", f("floor")))?,
        "Ceil" => need_float(format!("{}(v0)", f("ceil")))?,
        "Erf" => need_float(format!("{}(v0)", f("erf")))?,
        "Tanh" => need_float(format!("{}(v0)", f("tanh")))?,
        "Sin" => need_float(format!("{}(v0)", f("sin")))?,
        "Cos" => need_float(format!("{}(v0)", f("cos")))?,
        "Sigmoid" => need_float(format!("1 / (1 + {}(-v0))", f("exp")))?,
        "LeakyRelu" => {
            let a = n.attr_float("alpha").unwrap_or(0.01);
            need_float(format!("(v0 >= 0 ? v0 : v0 * {})", lit(a)))?
        }
        "HardSigmoid" => {
            let a = n.attr_float("alpha").unwrap_or(0.2);
            let b = n.attr_float("beta").unwrap_or(0.5);
            need_float(format!(
                "{fmax}(0, {fmin}(1, v0 * {} + {}))",
                lit(a),
                lit(b),
                fmax = f("fmax"),
                fmin = f("fmin")
            ))?
        }
        "HardSwish" => need_float(format!(
            "v0 * {fmax}(0, {fmin}(1, v0 / 6 + 0.5f))",
            fmax = f("fmax"),
            fmin = f("fmin")
        ))?,
        "Gelu" => match n.attr_str("approximate").unwrap_or("none") {
            "tanh" => need_float(format!(
                "0.5f * v0 * (1 + {}(0.7978845608f * (v0 + 0.044715f * v0 * v0 * v0)))",
                f("tanh")
            ))?,
            _ => need_float(format!(
                "0.5f * v0 * (1 + {}(v0 * 0.7071067812f))",
                f("erf")
            ))?,
        },
        _ => None,
    })
}

fn binary_expr(op: &str, ct: &str, d: DType) -> Result<Option<(String, bool)>, String> {
    let float = codegen::is_float(d);
    let f = |n: &str| codegen::math(n, ct);
    // (expression, output is bool)
    Ok(Some(match op {
        "Add" => ("v0 + v1".into(), false),
        "Sub" => ("v0 - v1".into(), false),
        "Mul" => ("v0 * v1".into(), false),
        "Div" => ("v0 / v1".into(), false),
        "Pow" => {
            if !float {
                return Err(format!("Pow on {} is not supported on CUDA", d.name()));
            }
            (format!("{}(v0, v1)", f("pow")), false)
        }
        "Max" => (
            if float {
                format!("{}(v0, v1)", f("fmax"))
            } else {
                "(v0 > v1 ? v0 : v1)".into()
            },
            false,
        ),
        "Min" => (
            if float {
                format!("{}(v0, v1)", f("fmin"))
            } else {
                "(v0 < v1 ? v0 : v1)".into()
            },
            false,
        ),
        "Equal" => ("v0 == v1".into(), true),
        "Less" => ("v0 < v1".into(), true),
        "Greater" => ("v0 > v1".into(), true),
        "LessOrEqual" => ("v0 <= v1".into(), true),
        "GreaterOrEqual" => ("v0 >= v1".into(), true),
        "And" => ("v0 && v1".into(), true),
        "Or" => ("v0 || v1".into(), true),
        "Xor" => ("v0 != v1".into(), true),
        _ => return Ok(None),
    }))
}

pub(super) fn ew_in(t: &TensorInfo) -> EwIn {
    EwIn {
        shape: t.shape.clone(),
        dtype: t.dtype,
    }
}

fn ew_plan(src: Src, n_in: usize, out_numel: usize, in_place: bool) -> NodePlan {
    let mut args: Vec<Arg> = (0..n_in).map(Arg::In).collect();
    args.push(Arg::Out(0));
    let mut p = one(src, grid_for(out_numel, BLOCK as usize), BLOCK, args);
    p.in_place = in_place;
    p
}

/// Elementwise ops: unary, binary (broadcasting), variadic Sum/Max/Min,
/// Where, Cast, Clip, BatchNormalization (inference), Expand.
pub(super) fn elementwise(ctx: &NodeCtx) -> Result<Option<NodePlan>, String> {
    let op = ctx.node.op_type.as_str();
    let out = &ctx.outputs[0];
    let on = numel(&out.shape);
    let x = ctx.input(0)?;
    let ct = codegen::compute(x.dtype)?;
    if let Some(e) = unary_expr(ctx, op, ct, x.dtype)? {
        let src = codegen::elementwise(&op.to_lowercase(), &out.shape, out.dtype, &[ew_in(x)], &e)?;
        return Ok(Some(ew_plan(src, 1, on, true)));
    }
    let present: Vec<&TensorInfo> = ctx.inputs.iter().flatten().collect();
    if let Some((e, _)) = binary_expr(op, ct, x.dtype)? {
        if ctx.inputs.len() == 2 || (matches!(op, "Max" | "Min" | "Add") && ctx.inputs.len() >= 2) {
            let n = ctx.inputs.len();
            if present.len() != n {
                return Err("an input is missing".into());
            }
            let mut expr = e.clone();
            // Variadic Max/Min fold left: op(op(v0, v1), v2) ...
            for k in 2..n {
                expr = e
                    .replace("v0", &format!("({expr})"))
                    .replace("v1", &format!("v{k}"));
            }
            let ins: Vec<EwIn> = present.iter().map(|t| ew_in(t)).collect();
            let src = codegen::elementwise(&op.to_lowercase(), &out.shape, out.dtype, &ins, &expr)?;
            return Ok(Some(ew_plan(src, n, on, true)));
        }
    }
    let ins: Vec<EwIn> = present.iter().map(|t| ew_in(t)).collect();
    let (family, expr, n_in): (&str, String, usize) = match op {
        "Sum" => {
            let e = (0..ins.len())
                .map(|k| format!("v{k}"))
                .collect::<Vec<_>>()
                .join(" + ");
            ("sum", e, ins.len())
        }
        "Mod" => {
            let e = if codegen::is_float(x.dtype) {
                if ctx.node.attr_int("fmod") != Some(1) {
                    return Err("Mod with fmod=0 on floats is invalid".into());
                }
                format!("{}(v0, v1)", codegen::math("fmod", ct))
            } else if ctx.node.attr_int("fmod") == Some(1) {
                "v0 % v1".into()
            } else {
                // Sign of the divisor, as Python's %.
                "(v1 == 0 ? 0 : ((v0 % v1 != 0 && ((v0 % v1 < 0) != (v1 < 0))) ? v0 % v1 + v1 : v0 % v1))".into()
            };
            ("mod", e, 2)
        }
        "Where" => ("where", "v0 ? v1 : v2".into(), 3),
        "Cast" => ("cast", "v0".into(), 1),
        "Expand" => ("expand", "v0".into(), 1),
        "Clip" => {
            // Min/max as attributes (opset < 11) or optional scalar inputs.
            let mut ins1 = vec![ew_in(x)];
            let mut e = "v0".to_string();
            let fmax = codegen::math("fmax", ct);
            let fmin = codegen::math("fmin", ct);
            if ctx.opset < 11 {
                if let Some(lo) = ctx.node.attr_float("min") {
                    e = format!("{fmax}({e}, {})", lit(lo));
                }
                if let Some(hi) = ctx.node.attr_float("max") {
                    e = format!("{fmin}({e}, {})", lit(hi));
                }
            } else {
                for (k, fun) in [(1usize, &fmax), (2, &fmin)] {
                    if let Some(Some(t)) = ctx.inputs.get(k) {
                        e = format!("{fun}({e}, v{})", ins1.len());
                        ins1.push(ew_in(t));
                    }
                }
            }
            if !codegen::is_float(x.dtype) {
                return Err(format!(
                    "Clip on {} is not supported on CUDA",
                    x.dtype.name()
                ));
            }
            // Missing optional inputs leave holes in the slots: map them.
            let slots: Vec<usize> = (0..ctx.inputs.len())
                .filter(|&k| ctx.inputs[k].is_some() && (k == 0 || ctx.opset >= 11))
                .collect();
            let src = codegen::elementwise("clip", &out.shape, out.dtype, &ins1, &e)?;
            let mut args: Vec<Arg> = slots.into_iter().map(Arg::In).collect();
            args.push(Arg::Out(0));
            let mut p = one(src, grid_for(on, BLOCK as usize), BLOCK, args);
            p.in_place = true;
            return Ok(Some(p));
        }
        "BatchNormalization" => {
            if ctx.outputs.len() > 1 || ctx.node.attr_int("training_mode") == Some(1) {
                return Err("training-mode BatchNormalization is not supported".into());
            }
            if x.shape.len() < 2 {
                return Err("BatchNormalization needs rank >= 2".into());
            }
            let eps = ctx.node.attr_float("epsilon").unwrap_or(1e-5);
            // Per-channel vectors [C] broadcast along axis 1: [C, 1, ...].
            let mut chan = vec![x.shape[1]];
            chan.extend(std::iter::repeat_n(1, x.shape.len() - 2));
            let mut ins2 = vec![ew_in(x)];
            for k in 1..5 {
                let t = ctx.input(k)?;
                ins2.push(EwIn {
                    shape: chan.clone(),
                    dtype: t.dtype,
                });
            }
            let e = format!("(v0 - v3) * rsqrtf((float)v4 + {}) * v1 + v2", lit(eps));
            let src = codegen::elementwise("batchnorm", &out.shape, out.dtype, &ins2, &e)?;
            return Ok(Some(ew_plan(src, 5, on, true)));
        }
        _ => return Ok(None),
    };
    let ins = &ins[..n_in.min(ins.len())];
    if ins.len() != n_in {
        return Err(format!("{op} needs {n_in} inputs"));
    }
    let src = codegen::elementwise(family, &out.shape, out.dtype, ins, &expr)?;
    // Expand and Cast change sizes or types: not in place.
    let in_place = !matches!(op, "Expand" | "Cast");
    Ok(Some(ew_plan(src, n_in, on, in_place)))
}
