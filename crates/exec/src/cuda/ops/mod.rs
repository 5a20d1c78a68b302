//! What the CUDA backend does for each node, as plain data: a list of
//! [`Launch`]es (NVRTC kernels from [`codegen`], cuBLAS GEMMs, device
//! copies, uploads of bytes known before the run) over the node's inputs,
//! outputs and scratch. Pure: made and tested without a GPU; the runtime
//! (`runtime.rs`) only resolves [`Arg`]s to device addresses and issues
//! the launches in order on one stream.
//!
//! Layout: this file holds the plan types ([`NodePlan`], [`Launch`],
//! [`Gemm`], [`Arg`]), the op list [`OPS`], the helpers every family
//! uses, and [`plan_node`], the one dispatch from op type to family. Each
//! family has its own file, named as in `crate::cpu` and in
//! `super::codegen` (whose kernels it launches): `elementwise`, `reduce`
//! (with Softmax), `norm`, `matmul` (MatMul, Gemm), `conv`, `pool`,
//! `shape` (data movement). Launch planning and source generation stay in
//! two folders rather than one file per family because they are two
//! layers with different tests: the sources are snapshot-tested and
//! compiled by g++ on their own, while a launch plan is only meaningful
//! with the sources it names (the emulation tests run both together).

mod conv;
mod elementwise;
mod matmul;
mod norm;
mod pool;
mod reduce;
mod shape;

use super::codegen::{self, Src, BLOCK};
use crate::backend::NodeCtx;
use crate::tensor::{elem_size, numel};
use conv::conv;
use elementwise::elementwise;
use graphopt_ir::{AttrValue, DType};
use matmul::{gemm, matmul};
use norm::layer_norm;
use pool::{global_pool, pool};
use reduce::{reduce, softmax};
use shape::{concat, gather, gather_nd, slice, transpose};

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
