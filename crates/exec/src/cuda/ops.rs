//! What the CUDA backend does for each node, as plain data: a list of
//! [`Launch`]es (NVRTC kernels from [`codegen`], cuBLAS GEMMs, device
//! copies, uploads of bytes known before the run) over the node's inputs,
//! outputs and scratch. Pure: made and tested without a GPU; the runtime
//! (`runtime.rs`) only resolves [`Arg`]s to device addresses and issues
//! the launches in order on one stream.

use super::codegen::{self, EwIn, ReduceKind, Src, BLOCK};
use crate::backend::{NodeCtx, TensorInfo};
use crate::tensor::{elem_size, numel};
use graphopt_ir::{AttrValue, DType};

/// A device address a launch reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// Input slot `k` of the node.
    In(usize),
    /// Output slot `k`.
    Out(usize),
    /// The node's scratch, at this byte offset.
    Ws(usize),
}

/// A cuBLAS `GemmStridedBatchedEx` call, already in cuBLAS's column-major
/// terms (the row-major product `Y = A·B` is issued as `Yᵀ = Bᵀ·Aᵀ`).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    pub dtype: DType,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Arg,
    pub lda: usize,
    pub stride_a: usize,
    pub b: Arg,
    pub ldb: usize,
    pub stride_b: usize,
    pub c: Arg,
    pub ldc: usize,
    pub stride_c: usize,
    pub batch: usize,
    pub alpha: f32,
    pub beta: f32,
    /// Element offsets added to `a`, `b` and `c` (one GEMM per batch
    /// element when batch dims broadcast partly).
    pub offsets: [usize; 3],
}

/// One step of a node on the device.
#[derive(Clone, Debug, PartialEq)]
pub enum Launch {
    /// An NVRTC kernel taking `args` (device pointers) in order.
    Kernel {
        func: String,
        grid: [u32; 3],
        block: u32,
        args: Vec<Arg>,
    },
    Gemm(Gemm),
    /// Device-to-device copy.
    Copy {
        src: Arg,
        dst: Arg,
        bytes: usize,
    },
    /// Bytes known when the kernel is made (Shape, Constant): kept on the
    /// device next to the weights and copied in at run time.
    Upload {
        dst: Arg,
        data: Vec<u8>,
    },
}

/// The device work of one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePlan {
    pub launches: Vec<Launch>,
    /// Kernels its launches name (deduplicated per model by the runtime).
    pub sources: Vec<Src>,
    pub workspace_bytes: usize,
    /// Elementwise kernels read element `i` before writing it, so an input
    /// may share output 0's storage.
    pub in_place: bool,
}

/// Ops the CUDA backend has kernels for (some only for some dtypes).
pub const OPS: &[&str] = &[
    "Abs",
    "Add",
    "And",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Ceil",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "Cos",
    "Div",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "Gather",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "MaxPool",
    "Min",
    "Mod",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "Pow",
    "Range",
    "Reciprocal",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Sin",
    "Slice",
    "Softmax",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "Transpose",
    "Unsqueeze",
    "Where",
    "Xor",
];

/// Grid size of a grid-stride kernel over `n` elements.
fn grid_for(n: usize, per_block: usize) -> [u32; 3] {
    let blocks = n.div_ceil(per_block.max(1)).clamp(1, 1 << 20);
    [blocks as u32, 1, 1]
}

fn one(src: Src, grid: [u32; 3], block: u32, args: Vec<Arg>) -> NodePlan {
    NodePlan {
        launches: vec![Launch::Kernel {
            func: src.name.clone(),
            grid,
            block,
            args,
        }],
        sources: vec![src],
        workspace_bytes: 0,
        in_place: false,
    }
}

fn es(d: DType) -> Result<usize, String> {
    elem_size(d).ok_or_else(|| format!("{} has no element size", d.name()))
}

fn norm_axis(a: i64, r: usize) -> Result<usize, String> {
    let a2 = if a < 0 { a + r as i64 } else { a };
    if a2 < 0 || a2 as usize >= r.max(1) {
        return Err(format!("axis {a} out of range for rank {r}"));
    }
    Ok(a2 as usize)
}

/// Integer contents of a constant input (initializer), or why not.
fn const_ints(ctx: &NodeCtx, k: usize, what: &str) -> Result<Option<Vec<i64>>, String> {
    let Some(t) = ctx.inputs.get(k).and_then(|t| t.as_ref()) else {
        return Ok(None);
    };
    let b = ctx.constants.get(k).copied().flatten().ok_or_else(|| {
        format!("{what} (input {k}) is computed at run time: the CUDA backend needs it constant (run `graphopt optimize` to fold it)")
    })?;
    Ok(Some(match t.dtype {
        DType::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        DType::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
            .collect(),
        d => return Err(format!("{what} is {}, expected int64", d.name())),
    }))
}

/// A float literal of generated code.
fn lit(x: f32) -> String {
    if x.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "GO_INF".into()
        } else {
            "(-GO_INF)".into()
        }
    } else {
        format!("{x:e}f")
    }
}

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

fn ew_in(t: &TensorInfo) -> EwIn {
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
fn elementwise(ctx: &NodeCtx) -> Result<Option<NodePlan>, String> {
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

fn reduce(ctx: &NodeCtx) -> Result<Option<NodePlan>, String> {
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

fn softmax(ctx: &NodeCtx, log: bool) -> Result<NodePlan, String> {
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

fn layer_norm(ctx: &NodeCtx) -> Result<NodePlan, String> {
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

fn gemm_dtype(d: DType) -> Result<(), String> {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        d => Err(format!(
            "MatMul/Gemm on {} is not supported on CUDA",
            d.name()
        )),
    }
}

/// Row-major `Y[b] (M×N) = A[b] (M×K) · B[b] (K×N)` as a column-major
/// cuBLAS call (`Yᵀ = Bᵀ·Aᵀ`); `stride_*` 0 broadcasts an operand.
#[allow(clippy::too_many_arguments)]
fn row_major_gemm(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    a: Arg,
    ta: bool,
    stride_a: usize,
    b: Arg,
    tb: bool,
    stride_b: usize,
    y: Arg,
    batch: usize,
    alpha: f32,
    beta: f32,
) -> Gemm {
    Gemm {
        dtype,
        trans_a: tb,
        trans_b: ta,
        m: n,
        n: m,
        k,
        a: b,
        lda: if tb { k } else { n },
        stride_a: stride_b,
        b: a,
        ldb: if ta { m } else { k },
        stride_b: stride_a,
        c: y,
        ldc: n,
        stride_c: m * n,
        batch,
        alpha,
        beta,
        offsets: [0; 3],
    }
}

fn matmul(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    let y = &ctx.outputs[0];
    gemm_dtype(a.dtype)?;
    if a.dtype != b.dtype || y.dtype != a.dtype {
        return Err("MatMul with mixed dtypes".into());
    }
    let (m, ka) = match a.shape.len() {
        0 => return Err("MatMul on a scalar".into()),
        1 => (1, a.shape[0]),
        r => (a.shape[r - 2], a.shape[r - 1]),
    };
    let (kb, n) = match b.shape.len() {
        0 => return Err("MatMul on a scalar".into()),
        1 => (b.shape[0], 1),
        r => (b.shape[r - 2], b.shape[r - 1]),
    };
    if ka != kb {
        return Err(format!("MatMul inner dims {ka} and {kb} differ"));
    }
    let batch_of = |s: &[usize]| -> usize { s.iter().rev().skip(2).product() };
    let out_batch = numel(&y.shape) / (m * n).max(1);
    let (ba, bb) = (
        if a.shape.len() > 2 {
            batch_of(&a.shape)
        } else {
            1
        },
        if b.shape.len() > 2 {
            batch_of(&b.shape)
        } else {
            1
        },
    );
    if numel(&y.shape) == 0 {
        return Ok(NodePlan::default());
    }
    let full = |bx: usize| bx == out_batch || bx == 1;
    if !full(ba) || !full(bb) {
        // Batch dims broadcast partly ([2,1,..] x [3,..]): one GEMM per
        // output batch element, each operand at its broadcast offset.
        let yb: Vec<usize> = y.shape[..y.shape.len() - 2].to_vec();
        let bst = |s: &[usize], size: usize| -> Result<Vec<i64>, String> {
            let lead = if s.len() > 2 {
                &s[..s.len() - 2]
            } else {
                &[][..]
            };
            let st = codegen::broadcast_strides(lead, &yb)?;
            Ok(st.iter().map(|&x| x * size as i64).collect())
        };
        let (sa, sb) = (bst(&a.shape, m * ka)?, bst(&b.shape, ka * n)?);
        let mut launches = Vec::new();
        for bi in 0..out_batch {
            let (mut r, mut oa, mut ob) = (bi, 0i64, 0i64);
            for d in (0..yb.len()).rev() {
                let c = (r % yb[d]) as i64;
                r /= yb[d];
                oa += c * sa[d];
                ob += c * sb[d];
            }
            let mut g = row_major_gemm(
                a.dtype,
                (m, n, ka),
                Arg::In(0),
                false,
                0,
                Arg::In(1),
                false,
                0,
                Arg::Out(0),
                1,
                1.0,
                0.0,
            );
            // Operands swap in the column-major call: cuBLAS's A is B.
            g.offsets = [ob as usize, oa as usize, bi * m * n];
            launches.push(Launch::Gemm(g));
        }
        return Ok(NodePlan {
            launches,
            ..Default::default()
        });
    }
    let sa = if ba == out_batch { m * ka } else { 0 };
    let sb = if bb == out_batch { ka * n } else { 0 };
    // A broadcast B with a batched A of contiguous rows is one plain GEMM
    // over all rows (M·batch × K) · (K × N): better for cuBLAS than batch 0-stride.
    let g = if sb == 0 && out_batch > 1 && sa == m * ka {
        row_major_gemm(
            a.dtype,
            (m * out_batch, n, ka),
            Arg::In(0),
            false,
            0,
            Arg::In(1),
            false,
            0,
            Arg::Out(0),
            1,
            1.0,
            0.0,
        )
    } else {
        row_major_gemm(
            a.dtype,
            (m, n, ka),
            Arg::In(0),
            false,
            sa,
            Arg::In(1),
            false,
            sb,
            Arg::Out(0),
            out_batch,
            1.0,
            0.0,
        )
    };
    Ok(NodePlan {
        launches: vec![Launch::Gemm(g)],
        ..Default::default()
    })
}

fn gemm(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    let y = &ctx.outputs[0];
    gemm_dtype(a.dtype)?;
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Err("Gemm needs 2-D A and B".into());
    }
    let n = ctx.node;
    let ta = n.attr_int("transA").unwrap_or(0) != 0;
    let tb = n.attr_int("transB").unwrap_or(0) != 0;
    let alpha = n.attr_float("alpha").unwrap_or(1.0);
    let beta = n.attr_float("beta").unwrap_or(1.0);
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let nn = if tb { b.shape[0] } else { b.shape[1] };
    let mut p = NodePlan::default();
    let mut beta_eff = 0.0;
    if let Some(Some(c)) = ctx.inputs.get(2) {
        if beta != 0.0 {
            // Y = C broadcast, then the GEMM accumulates onto it.
            let src = codegen::elementwise("expand", &y.shape, y.dtype, &[ew_in(c)], "v0")?;
            p.launches.push(Launch::Kernel {
                func: src.name.clone(),
                grid: grid_for(m * nn, BLOCK as usize),
                block: BLOCK,
                args: vec![Arg::In(2), Arg::Out(0)],
            });
            p.sources.push(src);
            beta_eff = beta;
        }
    }
    p.launches.push(Launch::Gemm(row_major_gemm(
        a.dtype,
        (m, nn, k),
        Arg::In(0),
        ta,
        0,
        Arg::In(1),
        tb,
        0,
        Arg::Out(0),
        1,
        alpha,
        beta_eff,
    )));
    Ok(p)
}

fn attr_pair(ctx: &NodeCtx, name: &str, default: usize) -> Result<[usize; 2], String> {
    match ctx.node.attr_ints(name) {
        None => Ok([default; 2]),
        Some([a, b]) => Ok([*a as usize, *b as usize]),
        Some(v) => Err(format!("{name} {v:?}: only 2-D is supported on CUDA")),
    }
}

/// Begin pads of a 2-D window op (`pads` is [h0, w0, h1, w1]); SAME
/// auto_pad is computed from the output size.
fn pads_2d(
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

fn conv(ctx: &NodeCtx) -> Result<NodePlan, String> {
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

fn pool(ctx: &NodeCtx, max: bool) -> Result<NodePlan, String> {
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

fn global_pool(ctx: &NodeCtx, max: bool) -> Result<NodePlan, String> {
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

fn transpose(ctx: &NodeCtx) -> Result<NodePlan, String> {
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

fn slice(ctx: &NodeCtx) -> Result<NodePlan, String> {
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
fn concat(ctx: &NodeCtx, split: bool) -> Result<NodePlan, String> {
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

fn gather(ctx: &NodeCtx) -> Result<NodePlan, String> {
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

fn gather_nd(ctx: &NodeCtx) -> Result<NodePlan, String> {
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

fn upload(data: Vec<u8>) -> NodePlan {
    NodePlan {
        launches: vec![Launch::Upload {
            dst: Arg::Out(0),
            data,
        }],
        ..Default::default()
    }
}

/// The device work of one node (its op already known to be in [`OPS`]).
pub fn plan_node(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let d = &ctx.node.domain;
    if !(d.is_empty() || d == "ai.onnx") {
        return Err("custom-domain ops have no kernels".into());
    }
    let op = ctx.node.op_type.as_str();
    let out = ctx.outputs.first().ok_or("no output")?;
    let copy = |bytes: usize| NodePlan {
        launches: vec![Launch::Copy {
            src: Arg::In(0),
            dst: Arg::Out(0),
            bytes,
        }],
        ..Default::default()
    };
    match op {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" => {
            return Ok(copy(numel(&out.shape) * es(out.dtype)?))
        }
        "Shape" => {
            let s = &ctx.input(0)?.shape;
            let r = s.len() as i64;
            let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let start = clampi(ctx.node.attr_int("start").unwrap_or(0));
            let end = clampi(ctx.node.attr_int("end").unwrap_or(r));
            return Ok(upload(
                s[start..end.max(start)]
                    .iter()
                    .flat_map(|&d| (d as i64).to_le_bytes())
                    .collect(),
            ));
        }
        "Constant" => {
            let a = ctx.node.attributes.first().ok_or("no value")?;
            let v = match &a.value {
                AttrValue::Tensor(t) => t.raw().ok_or("string value")?.to_vec(),
                AttrValue::Float(f) => f.to_le_bytes().to_vec(),
                AttrValue::Int(i) => i.to_le_bytes().to_vec(),
                AttrValue::Floats(f) => f.iter().flat_map(|x| x.to_le_bytes()).collect(),
                AttrValue::Ints(f) => f.iter().flat_map(|x| x.to_le_bytes()).collect(),
                _ => return Err(format!("Constant {} is not implemented", a.name)),
            };
            return Ok(upload(v));
        }
        "ConstantOfShape" => {
            let v = match ctx.node.attr_tensor("value") {
                Some(t) => t.raw().ok_or("string value")?.to_vec(),
                None => 0f32.to_le_bytes().to_vec(),
            };
            let n = numel(&out.shape);
            if n == 0 {
                return Ok(NodePlan::default());
            }
            let src = codegen::fill(&v, n)?;
            return Ok(one(
                src,
                grid_for(n, BLOCK as usize),
                BLOCK,
                vec![Arg::Out(0)],
            ));
        }
        "Range" => {
            let n = numel(&out.shape);
            if n == 0 {
                return Ok(NodePlan::default());
            }
            let src = codegen::range(out.dtype, n)?;
            return Ok(one(
                src,
                grid_for(n, BLOCK as usize),
                BLOCK,
                vec![Arg::In(0), Arg::In(2), Arg::Out(0)],
            ));
        }
        "Transpose" => return transpose(ctx),
        "Slice" => return slice(ctx),
        "Concat" => return concat(ctx, false),
        "Split" => return concat(ctx, true),
        "Gather" => return gather(ctx),
        "GatherND" => return gather_nd(ctx),
        "MatMul" => return matmul(ctx),
        "Gemm" => return gemm(ctx),
        "Conv" => return conv(ctx),
        "MaxPool" => return pool(ctx, true),
        "AveragePool" => return pool(ctx, false),
        "GlobalAveragePool" => return global_pool(ctx, false),
        "GlobalMaxPool" => return global_pool(ctx, true),
        "Softmax" => return softmax(ctx, false),
        "LogSoftmax" => return softmax(ctx, true),
        "LayerNormalization" => return layer_norm(ctx),
        _ => {}
    }
    if numel(&out.shape) == 0 {
        return Ok(NodePlan::default());
    }
    if let Some(p) = reduce(ctx)? {
        return Ok(p);
    }
    if let Some(p) = elementwise(ctx)? {
        return Ok(p);
    }
    Err("no CUDA kernel for this op yet".into())
}
