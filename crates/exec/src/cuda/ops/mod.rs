//! What the CUDA backend does for each node, as plain data: a list of
//! [`Launch`]es (NVRTC kernels from [`codegen`], cuBLAS GEMMs, device
//! copies, uploads of bytes known before the run) over the node's inputs,
//! outputs and scratch. Pure: made and tested without a GPU; the runtime
//! (`runtime.rs`) only resolves [`Arg`]s to device addresses and issues
//! the launches in order on one stream.
//!
//! Layout: this file holds the plan types ([`NodePlan`], [`Launch`],
//! [`Gemm`], [`Arg`]), the op table [`KERNELS`] (the supported-op check
//! and [`plan_node`]'s dispatch both read it), the helpers every family
//! uses, and the planners of the small ops. Each
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
use graphopt_ir::DType;
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

/// Makes the device work of one node, or says in one line why not.
pub type Maker = fn(&NodeCtx) -> Result<NodePlan, String>;

/// One op of the CUDA backend: its name, the default-domain opsets it is
/// registered for (`since..=until`, `None` open) and its planner. The
/// planners check element types themselves (the generated kernels take
/// what [`codegen::compute`] maps).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub op: &'static str,
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub make: Maker,
}

const fn k(op: &'static str, make: Maker) -> Entry {
    Entry {
        op,
        since: None,
        until: None,
        make,
    }
}

impl Entry {
    fn serves(&self, v: i64) -> bool {
        self.since.is_none_or(|s| v >= s) && self.until.is_none_or(|u| v <= u)
    }
}

fn copy_op(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let out = ctx.outputs.first().ok_or("no output")?;
    Ok(NodePlan {
        launches: vec![Launch::Copy {
            src: Arg::In(0),
            dst: Arg::Out(0),
            bytes: numel(&out.shape) * es(out.dtype)?,
        }],
        ..Default::default()
    })
}

fn shape_op(ctx: &NodeCtx) -> Result<NodePlan, String> {
    Ok(upload(crate::values::shape(ctx)?))
}

fn constant(ctx: &NodeCtx) -> Result<NodePlan, String> {
    Ok(upload(crate::values::constant(ctx)?))
}

fn constant_of_shape(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let out = ctx.outputs.first().ok_or("no output")?;
    let v = crate::values::fill_value(ctx)?;
    let n = numel(&out.shape);
    if n == 0 {
        return Ok(NodePlan::default());
    }
    let src = codegen::fill(&v, n)?;
    Ok(one(
        src,
        grid_for(n, BLOCK as usize),
        BLOCK,
        vec![Arg::Out(0)],
    ))
}

fn range(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let out = ctx.outputs.first().ok_or("no output")?;
    let n = numel(&out.shape);
    if n == 0 {
        return Ok(NodePlan::default());
    }
    let src = codegen::range(out.dtype, n)?;
    Ok(one(
        src,
        grid_for(n, BLOCK as usize),
        BLOCK,
        vec![Arg::In(0), Arg::In(2), Arg::Out(0)],
    ))
}

fn split(ctx: &NodeCtx) -> Result<NodePlan, String> {
    concat(ctx, true)
}

fn concat_op(ctx: &NodeCtx) -> Result<NodePlan, String> {
    concat(ctx, false)
}

fn max_pool(ctx: &NodeCtx) -> Result<NodePlan, String> {
    pool(ctx, true)
}

fn average_pool(ctx: &NodeCtx) -> Result<NodePlan, String> {
    pool(ctx, false)
}

fn global_average_pool(ctx: &NodeCtx) -> Result<NodePlan, String> {
    global_pool(ctx, false)
}

fn global_max_pool(ctx: &NodeCtx) -> Result<NodePlan, String> {
    global_pool(ctx, true)
}

fn softmax_op(ctx: &NodeCtx) -> Result<NodePlan, String> {
    softmax(ctx, false)
}

fn log_softmax(ctx: &NodeCtx) -> Result<NodePlan, String> {
    softmax(ctx, true)
}

/// A family planner that reads the op name (an empty output needs no
/// launch). The family answers `None` for an input count it has no kernel
/// for (And with 3 inputs), or for an op it does not know (which the
/// table tests rule out).
fn family(
    ctx: &NodeCtx,
    plan: fn(&NodeCtx) -> Result<Option<NodePlan>, String>,
) -> Result<NodePlan, String> {
    let out = ctx.outputs.first().ok_or("no output")?;
    if numel(&out.shape) == 0 {
        return Ok(NodePlan::default());
    }
    plan(ctx)?.ok_or_else(|| {
        format!(
            "{} with {} inputs has no CUDA kernel",
            ctx.node.op_type,
            ctx.inputs.len()
        )
    })
}

fn reduction(ctx: &NodeCtx) -> Result<NodePlan, String> {
    family(ctx, reduce)
}

fn ew(ctx: &NodeCtx) -> Result<NodePlan, String> {
    family(ctx, elementwise)
}

/// Every op of the CUDA backend: [`super::CudaBackend`]'s supported-op
/// check and [`plan_node`]'s dispatch both read this table (and nothing
/// else). To add an op: its planner in the family's file, one line here.
pub const KERNELS: &[Entry] = &[
    k("Abs", ew),
    k("Add", ew),
    k("And", ew),
    k("AveragePool", average_pool),
    k("BatchNormalization", ew),
    k("Cast", ew),
    k("Ceil", ew),
    k("Clip", ew),
    k("Concat", concat_op),
    k("Constant", constant),
    k("ConstantOfShape", constant_of_shape),
    k("Conv", conv),
    k("Cos", ew),
    k("Div", ew),
    k("Equal", ew),
    k("Erf", ew),
    k("Exp", ew),
    k("Expand", ew),
    k("Flatten", copy_op),
    k("Floor", ew),
    k("Gather", gather),
    k("GatherND", gather_nd),
    k("Gelu", ew),
    k("Gemm", gemm),
    k("GlobalAveragePool", global_average_pool),
    k("GlobalMaxPool", global_max_pool),
    k("Greater", ew),
    k("GreaterOrEqual", ew),
    k("HardSigmoid", ew),
    k("HardSwish", ew),
    k("Identity", copy_op),
    k("LayerNormalization", layer_norm),
    k("LeakyRelu", ew),
    k("Less", ew),
    k("LessOrEqual", ew),
    k("Log", ew),
    k("LogSoftmax", log_softmax),
    k("MatMul", matmul),
    k("Max", ew),
    k("MaxPool", max_pool),
    k("Min", ew),
    k("Mod", ew),
    k("Mul", ew),
    k("Neg", ew),
    k("Not", ew),
    k("Or", ew),
    k("Pow", ew),
    k("Range", range),
    k("Reciprocal", ew),
    k("ReduceMax", reduction),
    k("ReduceMean", reduction),
    k("ReduceMin", reduction),
    k("ReduceSum", reduction),
    k("Relu", ew),
    k("Reshape", copy_op),
    k("Shape", shape_op),
    k("Sigmoid", ew),
    k("Sin", ew),
    k("Slice", slice),
    k("Softmax", softmax_op),
    k("Split", split),
    k("Sqrt", ew),
    k("Squeeze", copy_op),
    k("Sub", ew),
    k("Sum", ew),
    k("Tanh", ew),
    k("Transpose", transpose),
    k("Unsqueeze", copy_op),
    k("Where", ew),
    k("Xor", ew),
];

/// Whether [`KERNELS`] has the op.
pub fn has_op(domain: &str, op_type: &str) -> bool {
    (domain.is_empty() || domain == "ai.onnx") && KERNELS.iter().any(|e| e.op == op_type)
}

/// The device work of one node: its [`KERNELS`] entry's planner.
pub fn plan_node(ctx: &NodeCtx) -> Result<NodePlan, String> {
    let d = &ctx.node.domain;
    if !(d.is_empty() || d == "ai.onnx") {
        return Err("custom-domain ops have no kernels".into());
    }
    let op = ctx.node.op_type.as_str();
    ctx.outputs.first().ok_or("no output")?;
    let mut of_op = KERNELS.iter().filter(|e| e.op == op).peekable();
    if of_op.peek().is_none() {
        return Err("no CUDA kernel for this op yet".into());
    }
    let all: Vec<&Entry> = of_op.collect();
    let e = all
        .iter()
        .find(|e| e.serves(ctx.opset))
        .ok_or_else(|| format!("{op} at opset {} has no CUDA kernel", ctx.opset))?;
    (e.make)(ctx)
}

#[cfg(test)]
mod table_tests {
    use super::*;
    use crate::backend::TensorInfo;
    use graphopt_ir::{Graph, NewNode, NodeData};

    fn node(op: &str) -> NodeData {
        let mut g = Graph::new("g");
        let n = g.add_node(NewNode::new(op)).expect("a node without inputs");
        g.node(n).clone()
    }

    fn ctx(n: &NodeData) -> NodeCtx<'_> {
        let t = TensorInfo {
            dtype: DType::F32,
            shape: vec![2, 2],
        };
        NodeCtx {
            node: n,
            opset: 17,
            inputs: vec![Some(t.clone()); 2],
            outputs: vec![t.clone(), t],
            constants: vec![None; 2],
        }
    }

    #[test]
    fn one_entry_per_op_and_dispatch_reaches_every_planner() {
        for (i, e) in KERNELS.iter().enumerate() {
            assert!(
                KERNELS[i + 1..].iter().all(|o| o.op != e.op),
                "{} twice",
                e.op
            );
            assert!(has_op("", e.op) && has_op("ai.onnx", e.op), "{}", e.op);
            let n = node(e.op);
            let c = ctx(&n);
            // The planner may refuse the made-up node (or panic on it),
            // but its family takes every op of the table with 2 inputs.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plan_node(&c)));
            if let Ok(Err(why)) = r {
                assert!(
                    !why.contains("inputs has no CUDA kernel"),
                    "{}: {why}",
                    e.op
                );
            }
        }
        assert!(
            KERNELS.windows(2).all(|w| w[0].op < w[1].op),
            "not in name order"
        );
    }

    #[test]
    fn an_op_outside_the_table_has_no_cuda_kernel() {
        assert!(!has_op("", "NoSuchOp"));
        assert!(!has_op("com.example", "Relu"));
        let n = node("NoSuchOp");
        assert_eq!(
            plan_node(&ctx(&n)).unwrap_err(),
            "no CUDA kernel for this op yet"
        );
    }
}
