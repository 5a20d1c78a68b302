//! The CPU backend's kernel registry: one table, [`KERNELS`], with an
//! [`Entry`] per op the backend runs. An entry says which node it takes
//! (domain, op type, the default-domain opsets it is registered for),
//! which element types its input 0 may have ([`Types`]), how fp16/bf16
//! nodes reach it ([`Low`]), whether packed 4-bit inputs may come in, and
//! the function that makes the kernel ([`Maker`]).
//!
//! Both questions the executor asks read this table and nothing else:
//! [`CpuBackend::has_op`](super::CpuBackend) (the supported-op check made
//! for every node before shapes are looked at) is "does any entry have
//! this domain and op", and [`CpuBackend::kernel`](super::CpuBackend)
//! finds the entry for the node's domain, op and opset ([`find`]), refuses
//! in one line what the entry does not take ([`Entry::check`]: packed
//! inputs, input 0's element type), and calls the maker: directly, or on
//! f32 copies of the fp16/bf16 tensors through [`super::lowp::via_f32`]
//! ([`Low::Widen`]). The maker may still refuse a node for what the table
//! does not describe (an attribute, a rank, another input's type).
//!
//! Families share one maker that reads the op name from the node
//! (elementwise binary and unary ops, reductions, data movement); each
//! op name still appears once here. `tests-py/conformance.py --exec`
//! reads the op names of the default-domain entries from this file (the
//! first string of each `widen(` / `as_is(` entry) and fails when one of
//! them has no passing ONNX node test and no stated exemption there.
//!
//! To add a kernel: write its maker (`fn(&NodeCtx) -> Result<Box<dyn
//! Kernel>, String>`) in the family's file, add one line below in op-name
//! order ([`widen`] for an f32 kernel that fp16/bf16 nodes reach widened,
//! [`as_is`] for a maker that takes every element type itself), list the
//! input-0 element types the maker really accepts, and limit the opsets
//! with [`Entry::opsets`] only where a version the kernel does not handle
//! changed the op's meaning. Then run the conformance suite with `--exec`:
//! the new op needs a passing node case (or an exemption with a reason).

use super::{
    chain, coded, conv, conv_add, einsum, elementwise, loss, matmul, norm, pool, qgemm, qlinear,
    quant, reduce, resize, rnn, sample, scatter, shape, signal, window_nd,
};
use crate::backend::{Kernel, NodeCtx};
use crate::lower::CODED_DOMAIN;
use crate::tensor::is_packed4;
use graphopt_ir::DType;
use graphopt_plan::{chain_op, CHAIN_OP, CONV_ADD};

/// Makes the kernel of a node, or says in one line why not.
pub type Maker = fn(&NodeCtx) -> Result<Box<dyn Kernel>, String>;

/// The element types input 0 of a node may have (other inputs are the
/// maker's to check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Types {
    /// Any: byte copies, or ops that read only input 0's shape (or have no
    /// input), or Cast, which copies any type to itself.
    Any,
    /// One of these.
    Of(&'static [DType]),
}

/// How a node with fp16/bf16 tensors reaches the maker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Low {
    /// The maker makes an f32 kernel; a node touching fp16/bf16 tensors
    /// runs it on f32 copies, its outputs rounded back once
    /// ([`super::lowp::via_f32`]).
    Widen,
    /// As `Widen`, except input slot `k`, which reaches the maker as it is
    /// (a float16/bfloat16 weight the kernel widens tile by tile).
    WidenBut(usize),
    /// The maker gets the node as it is (byte-generic data movement,
    /// Cast, the palette and integer coded-weight kernels).
    AsIs,
}

/// One registered kernel.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// `""` for the default ONNX domain, else e.g. [`CODED_DOMAIN`].
    pub domain: &'static str,
    pub op: &'static str,
    /// Default-domain opsets the entry serves, `since..=until`; `None`
    /// leaves that end open.
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub types: Types,
    pub low: Low,
    /// Whether packed 4-bit (uint4/int4) inputs may come in.
    pub packed4: bool,
    pub make: Maker,
}

/// An f32 kernel (fp16/bf16 widened) for a default-domain op.
pub const fn widen(op: &'static str, types: &'static [DType], make: Maker) -> Entry {
    Entry {
        domain: "",
        op,
        since: None,
        until: None,
        types: Types::Of(types),
        low: Low::Widen,
        packed4: false,
        make,
    }
}

/// A maker that takes every element type itself, for a default-domain op.
pub const fn as_is(op: &'static str, types: Types, make: Maker) -> Entry {
    Entry {
        domain: "",
        op,
        since: None,
        until: None,
        types,
        low: Low::AsIs,
        packed4: false,
        make,
    }
}

/// A fused node of a coded weight ([`coded`]): f32 activations or
/// codebook as input 0 (`types`), packed 4-bit indices or integers
/// allowed.
const fn coded_op(op: &'static str, types: Types) -> Entry {
    Entry {
        domain: CODED_DOMAIN,
        op,
        since: None,
        until: None,
        types,
        low: Low::AsIs,
        packed4: true,
        make: coded::kernel,
    }
}

impl Entry {
    /// The entry for `since..=until` only.
    pub const fn opsets(mut self, since: Option<i64>, until: Option<i64>) -> Entry {
        self.since = since;
        self.until = until;
        self
    }

    /// The entry's kernel made by `make` instead.
    pub const fn maker(mut self, make: Maker) -> Entry {
        self.make = make;
        self
    }

    /// The entry's fp16/bf16 nodes reach the maker as `low` says.
    pub const fn low(mut self, low: Low) -> Entry {
        self.low = low;
        self
    }

    /// The entry reads packed 4-bit inputs too.
    pub const fn packed4(mut self) -> Entry {
        self.packed4 = true;
        self
    }

    /// Whether the entry serves opset `v`.
    pub fn serves(&self, v: i64) -> bool {
        self.since.is_none_or(|s| v >= s) && self.until.is_none_or(|u| v <= u)
    }

    /// `since..=until` as text (`1..`, `7..=13`, ...).
    pub fn range(&self) -> String {
        match (self.since, self.until) {
            (None, None) => "any".into(),
            (s, None) => format!("{}..", s.unwrap_or(1)),
            (s, Some(u)) => format!("{}..={u}", s.unwrap_or(1)),
        }
    }

    /// Refuses, in one line, a node whose inputs the entry does not take.
    pub fn check(&self, ctx: &NodeCtx) -> Result<(), String> {
        if !self.packed4 && ctx.inputs.iter().flatten().any(|t| is_packed4(t.dtype)) {
            let readers: Vec<&str> = KERNELS
                .iter()
                .filter(|e| e.packed4 && e.domain.is_empty())
                .map(|e| e.op)
                .collect();
            return Err(format!(
                "packed 4-bit (uint4/int4) inputs are read only by {} (and the coded-weight kernels)",
                readers.join(", ")
            ));
        }
        if let (Types::Of(ok), Some(Some(x))) = (self.types, ctx.inputs.first()) {
            if !ok.contains(&x.dtype) {
                let names: Vec<&str> = ok.iter().map(|d| d.name()).collect();
                return Err(format!(
                    "{} on {} is not implemented (input 0 may be {})",
                    self.op,
                    x.dtype.name(),
                    names.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// `""` for the default domain under either of its names.
fn default_domain(d: &str) -> &str {
    if d == "ai.onnx" {
        ""
    } else {
        d
    }
}

/// The table's name for an op: each fused elementwise chain has an op of
/// its own (`ElementwiseChain.3`, typed by its own function), all run by
/// the one [`CHAIN_OP`] entry.
fn table_op<'o>(domain: &str, op: &'o str) -> &'o str {
    if domain == CODED_DOMAIN && chain_op(op) {
        CHAIN_OP
    } else {
        op
    }
}

/// Whether `table` has any entry for the op.
pub fn has(table: &[Entry], domain: &str, op: &str) -> bool {
    let domain = default_domain(domain);
    let op = table_op(domain, op);
    table.iter().any(|e| e.domain == domain && e.op == op)
}

/// The entry of `table` for a node, or one line saying why there is none.
pub fn find<'t>(
    table: &'t [Entry],
    domain: &str,
    op: &str,
    opset: i64,
) -> Result<&'t Entry, String> {
    let domain = default_domain(domain);
    let op = table_op(domain, op);
    let mut of_op = table
        .iter()
        .filter(|e| e.domain == domain && e.op == op)
        .peekable();
    if of_op.peek().is_none() {
        return Err(if table.iter().any(|e| e.domain == domain) {
            "no kernel for this op yet".into()
        } else {
            "custom-domain ops have no kernels".into()
        });
    }
    let all: Vec<&Entry> = of_op.collect();
    all.iter()
        .copied()
        .find(|e| e.serves(opset))
        .ok_or_else(|| {
            let ranges: Vec<String> = all.iter().map(|e| e.range()).collect();
            format!(
                "{op} at opset {opset} has no kernel (kernels for opsets {})",
                ranges.join(", ")
            )
        })
}

/// Default-domain op names of [`KERNELS`], in table order.
pub fn ops() -> impl Iterator<Item = &'static str> {
    KERNELS.iter().filter(|e| e.domain.is_empty()).map(|e| e.op)
}

fn family(
    ctx: &NodeCtx,
    name: &str,
    k: Option<Result<Box<dyn Kernel>, String>>,
) -> Result<Box<dyn Kernel>, String> {
    k.unwrap_or_else(|| {
        Err(format!(
            "{} is not an op of the {name} family (the registry and the family disagree)",
            ctx.node.op_type
        ))
    })
}

fn binary(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    family(ctx, "elementwise binary", elementwise::binary(ctx))
}

fn unary(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    family(ctx, "elementwise unary", elementwise::unary(ctx))
}

fn reduction(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    family(ctx, "reduction", reduce::reduce(ctx))
}

fn data(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    family(ctx, "data movement", shape::kernel(ctx))
}

// Input-0 element types. Where fp16 and bf16 are listed with `widen`,
// they reach the f32 kernel widened.
const F32: DType = DType::F32;
const F64: DType = DType::F64;
const F16: DType = DType::F16;
const BF16: DType = DType::BF16;
const I8: DType = DType::I8;
const I16: DType = DType::I16;
const I32: DType = DType::I32;
const I64: DType = DType::I64;
const U8: DType = DType::U8;
const U16: DType = DType::U16;
const U32: DType = DType::U32;
const U64: DType = DType::U64;
const BOOL: DType = DType::Bool;

/// f32 kernels.
const FLOAT: &[DType] = &[F32, F16, BF16];
/// f32 and f64 kernels.
const FLOAT64: &[DType] = &[F32, F64, F16, BF16];
/// Neg and Abs: f32, f64, int64.
const SIGNED: &[DType] = &[F32, F64, I64, F16, BF16];
/// f32, int64 and int32 kernels.
const FLOAT_INT: &[DType] = &[F32, I64, I32, F16, BF16];
/// f32, f64, int64 and int32 kernels.
const NUMBER: &[DType] = &[F32, F64, I64, I32, F16, BF16];
/// Arithmetic and ordering: floats and every integer type.
const ARITH: &[DType] = &[F32, F64, I64, I32, I16, I8, U64, U32, U16, U8, F16, BF16];
/// Equal: arithmetic types and bool.
const EQUAL: &[DType] = &[
    F32, F64, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F16, BF16,
];
const INTS: &[DType] = &[I64, I32, I16, I8, U64, U32, U16, U8];
const UNSIGNED: &[DType] = &[U64, U32, U16, U8];
const BOOLS: &[DType] = &[BOOL];
/// Every type stored whole bytes per element (`crate::tensor::elem_size`):
/// element copies by size.
const BYTES: &[DType] = &[
    F32, F64, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL,
];
/// MatMulInteger: integers up to 32 bits.
const QINTS: &[DType] = &[U8, I8, U16, I16, I32];
/// QLinearConv, QLinearMatMul and ConvInteger: 8-bit integers.
const Q8: &[DType] = &[U8, I8];
/// DequantizeLinear: integers up to 32 bits, packed 4-bit too.
const QINTS4: &[DType] = &[U8, I8, U16, I16, I32, DType::U4, DType::I4];
/// The windows' size input (their output type is an attribute).
const SIZE: &[DType] = &[I64, I32];
/// Range: the output's type (its inputs have it too).
const RANGE: &[DType] = &[F32, I64, I32, F16, BF16];
/// ReduceMax / ReduceMin: numbers and bool.
const REDUCE_ORDER: &[DType] = &[F32, F64, I64, I32, BOOL, F16, BF16];
/// TopK: numbers and uint64.
const TOPK: &[DType] = &[F32, F64, I64, I32, U64, F16, BF16];

/// Every kernel of the CPU backend, default-domain ops by name, then the
/// coded-weight domain's fused ops.
pub const KERNELS: &[Entry] = &[
    widen("Abs", SIGNED, unary),
    widen("Acos", FLOAT, unary),
    widen("Acosh", FLOAT, unary),
    widen("Add", ARITH, binary),
    widen("AffineGrid", FLOAT64, sample::affine_grid),
    widen("And", BOOLS, binary),
    widen("ArgMax", FLOAT_INT, reduce::arg),
    widen("ArgMin", FLOAT_INT, reduce::arg),
    widen("Asin", FLOAT, unary),
    widen("Asinh", FLOAT, unary),
    widen("Atan", FLOAT, unary),
    widen("Atanh", FLOAT, unary),
    widen("AveragePool", FLOAT, pool::pool),
    widen("BatchNormalization", FLOAT, norm::batch_norm),
    widen("BitShift", UNSIGNED, binary),
    widen("BitwiseAnd", INTS, binary),
    widen("BitwiseNot", INTS, elementwise::bit_not),
    widen("BitwiseOr", INTS, binary),
    widen("BitwiseXor", INTS, binary),
    as_is("BlackmanWindow", Types::Of(SIZE), signal::window),
    as_is("Cast", Types::Any, elementwise::cast_kernel).packed4(),
    as_is("CastLike", Types::Any, elementwise::cast_kernel).packed4(),
    widen("Ceil", FLOAT64, unary),
    widen("Celu", FLOAT, unary),
    as_is("CenterCropPad", Types::Of(BYTES), data),
    widen("Clip", FLOAT, unary),
    widen("Col2Im", FLOAT, window_nd::col2im),
    as_is("Concat", Types::Of(BYTES), data),
    as_is("Constant", Types::Any, data),
    as_is("ConstantOfShape", Types::Any, data),
    widen("Conv", FLOAT, conv::conv),
    as_is("ConvInteger", Types::Of(Q8), qlinear::conv_integer),
    widen("ConvTranspose", FLOAT, conv::conv_transpose),
    widen("Cos", FLOAT, unary),
    widen("Cosh", FLOAT, unary),
    widen("CumProd", NUMBER, reduce::cumulative),
    widen("CumSum", NUMBER, reduce::cumulative),
    widen("DFT", FLOAT64, signal::dft),
    as_is("DepthToSpace", Types::Of(BYTES), data),
    widen("DequantizeLinear", QINTS4, quant::dequantize).packed4(),
    widen("Det", FLOAT64, matmul::det_kernel),
    widen("Div", ARITH, binary),
    as_is("Dropout", Types::Any, data),
    widen("DynamicQuantizeLinear", FLOAT, quant::dynamic_quantize),
    widen("Einsum", NUMBER, einsum::einsum),
    widen("Elu", FLOAT, unary),
    widen("Equal", EQUAL, binary),
    widen("Erf", FLOAT, unary),
    widen("Exp", FLOAT64, unary),
    as_is("Expand", Types::Of(BYTES), data),
    // Reads only input 0's shape; the output type is its own.
    as_is("EyeLike", Types::Any, data),
    as_is("Flatten", Types::Any, data),
    widen("Floor", FLOAT64, unary),
    widen("GRU", FLOAT, rnn::rnn),
    as_is("Gather", Types::Of(BYTES), data),
    widen("GatherElements", BYTES, scatter::gather_elements),
    as_is("GatherND", Types::Of(BYTES), data),
    widen("Gelu", FLOAT, unary),
    widen("Gemm", FLOAT, matmul::gemm),
    widen("GlobalAveragePool", FLOAT, pool::global),
    widen("GlobalMaxPool", FLOAT, pool::global),
    widen("Greater", ARITH, binary),
    widen("GreaterOrEqual", ARITH, binary),
    widen("GridSample", FLOAT, sample::grid_sample),
    widen("GroupNormalization", FLOAT, norm::group_norm),
    as_is("HammingWindow", Types::Of(SIZE), signal::window),
    as_is("HannWindow", Types::Of(SIZE), signal::window),
    widen("HardSigmoid", FLOAT, unary),
    widen("HardSwish", FLOAT, unary),
    widen("Hardmax", FLOAT, reduce::along_axis),
    as_is("Identity", Types::Any, data),
    widen("InstanceNormalization", FLOAT, norm::instance_norm),
    widen("IsInf", FLOAT, elementwise::classify),
    widen("IsNaN", FLOAT, elementwise::classify),
    widen("LRN", FLOAT, norm::lrn),
    widen("LSTM", FLOAT, rnn::rnn),
    widen("LayerNormalization", FLOAT, norm::layer_norm),
    widen("LeakyRelu", FLOAT, unary),
    widen("Less", ARITH, binary),
    widen("LessOrEqual", ARITH, binary),
    widen("Log", FLOAT64, unary),
    widen("LogSoftmax", FLOAT64, reduce::softmax),
    widen("LpNormalization", FLOAT, reduce::along_axis),
    // LpPool-1 took p as a float.
    widen("LpPool", FLOAT, window_nd::pool).opsets(Some(2), None),
    widen("MatMul", FLOAT, matmul::matmul),
    widen("MatMulInteger", QINTS, quant::matmul_integer),
    widen("Max", ARITH, binary),
    widen("MaxPool", FLOAT, pool::pool),
    // Moves bytes: every float type as it is.
    as_is("MaxUnpool", Types::Of(FLOAT64), scatter::max_unpool),
    widen("Mean", FLOAT, binary),
    widen("Min", ARITH, binary),
    widen("Mish", FLOAT, unary),
    widen("Mod", ARITH, binary),
    widen("Mul", ARITH, binary),
    widen("Neg", SIGNED, unary),
    widen("NegativeLogLikelihoodLoss", FLOAT, loss::nll),
    widen("Not", BOOLS, unary),
    widen("OneHot", NUMBER, scatter::one_hot),
    widen("Or", BOOLS, binary),
    widen("PRelu", FLOAT, binary),
    as_is("Pad", Types::Of(BYTES), data),
    widen("Pow", NUMBER, binary),
    as_is("QLinearConv", Types::Of(Q8), qlinear::qlinear_conv),
    as_is("QLinearMatMul", Types::Of(Q8), qlinear::qlinear_matmul),
    widen("QuantizeLinear", FLOAT, quant::quantize),
    widen("RMSNormalization", FLOAT, norm::rms_norm),
    widen("RNN", FLOAT, rnn::rnn),
    as_is("Range", Types::Of(RANGE), data),
    widen("Reciprocal", FLOAT64, unary),
    widen("ReduceL1", NUMBER, reduction),
    widen("ReduceL2", FLOAT64, reduction),
    widen("ReduceLogSum", FLOAT64, reduction),
    widen("ReduceLogSumExp", FLOAT64, reduction),
    widen("ReduceMax", REDUCE_ORDER, reduction),
    widen("ReduceMean", NUMBER, reduction),
    widen("ReduceMin", REDUCE_ORDER, reduction),
    widen("ReduceProd", NUMBER, reduction),
    widen("ReduceSum", NUMBER, reduction),
    widen("ReduceSumSquare", NUMBER, reduction),
    widen("Relu", FLOAT, unary),
    as_is("Reshape", Types::Any, data),
    widen("Resize", FLOAT64, resize::resize),
    as_is("ReverseSequence", Types::Of(BYTES), data),
    widen("RoiAlign", FLOAT, sample::roi_align),
    widen("Round", FLOAT, unary),
    widen("STFT", FLOAT64, signal::stft),
    widen("Scatter", BYTES, scatter::scatter_elements),
    widen("ScatterElements", BYTES, scatter::scatter_elements),
    widen("ScatterND", BYTES, scatter::scatter_nd),
    widen("Selu", FLOAT, unary),
    as_is("Shape", Types::Any, data),
    widen("Shrink", FLOAT, unary),
    widen("Sigmoid", FLOAT, unary),
    widen("Sign", FLOAT, unary),
    widen("Sin", FLOAT, unary),
    widen("Sinh", FLOAT, unary),
    as_is("Size", Types::Any, data),
    as_is("Slice", Types::Of(BYTES), data),
    widen("Softmax", FLOAT64, reduce::softmax),
    widen("SoftmaxCrossEntropyLoss", FLOAT, loss::nll),
    widen("Softplus", FLOAT, unary),
    widen("Softsign", FLOAT, unary),
    as_is("SpaceToDepth", Types::Of(BYTES), data),
    as_is("Split", Types::Of(BYTES), data),
    widen("Sqrt", FLOAT64, unary),
    as_is("Squeeze", Types::Any, data),
    widen("Sub", ARITH, binary),
    widen("Sum", ARITH, binary),
    widen("Swish", FLOAT, unary),
    widen("Tan", FLOAT, unary),
    widen("Tanh", FLOAT, unary),
    widen("ThresholdedRelu", FLOAT, unary),
    as_is("Tile", Types::Of(BYTES), data),
    widen("TopK", TOPK, reduce::top_k),
    as_is("Transpose", Types::Of(BYTES), data),
    as_is("Trilu", Types::Of(BYTES), data),
    as_is("Unsqueeze", Types::Any, data),
    // Upsample-1 took height_scale / width_scale attributes, which the
    // kernel does not read (it takes Upsample-7's scales attribute and
    // the scales input of Upsample-9 and -10).
    widen("Upsample", FLOAT64, resize::resize).opsets(Some(7), None),
    widen("Where", BOOLS, elementwise::where_),
    widen("Xor", BOOLS, binary),
    // Input 0 is the integer weight (its maker checks it).
    coded_op(CONV_ADD, Types::Of(&[F32])).maker(conv_add::kernel),
    coded_op("DequantGather", Types::Any),
    coded_op("DequantGemm", Types::Of(&[F32])),
    coded_op("DequantMatMul", Types::Of(&[F32])),
    coded_op(CHAIN_OP, Types::Of(elementwise::TO_F32)).maker(chain::kernel),
    coded_op("HalfGemm", Types::Of(&[F32, F16, BF16])).low(Low::WidenBut(1)),
    coded_op("HalfMatMul", Types::Of(&[F32, F16, BF16])).low(Low::WidenBut(1)),
    coded_op("IntegerConv", Types::Of(&[U8])).maker(qlinear::integer_conv),
    coded_op("IntegerGemm", Types::Of(&[U8])).maker(qgemm::kernel),
    coded_op("IntegerMatMul", Types::Of(&[U8])).maker(qgemm::kernel),
    coded_op("PaletteConv", Types::Of(&[F32])),
    coded_op("PaletteGather", Types::Of(&[F32])),
    coded_op("PaletteGemm", Types::Of(&[F32])),
    coded_op("PaletteMatMul", Types::Of(&[F32])),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, TensorInfo};
    use crate::cpu::CpuBackend;
    use crate::lower::CODED_OPS;
    use graphopt_ir::{Graph, NewNode, NodeData};

    /// `tests-py/conformance.py` reads the default-domain ops from this
    /// file's source: the op name of each line of [`KERNELS`] that starts
    /// with `widen("` or `as_is("`. That rule must find every such entry,
    /// in order (an entry written another way would escape the node-test
    /// check).
    #[test]
    fn the_conformance_script_reads_every_default_domain_op() {
        let src = include_str!("registry.rs");
        let start = src
            .find("pub const KERNELS: &[Entry] = &[")
            .expect("the table");
        let table = &src[start..];
        let table = &table[..table.find("\n];").expect("its end")];
        let read: Vec<&str> = table
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l
                    .strip_prefix("widen(\"")
                    .or_else(|| l.strip_prefix("as_is(\""))?;
                rest.split('"').next()
            })
            .collect();
        let want: Vec<&str> = KERNELS
            .iter()
            .filter(|e| e.domain.is_empty())
            .map(|e| e.op)
            .collect();
        assert_eq!(read, want);
    }

    fn node(domain: &str, op: &str) -> NodeData {
        let mut g = Graph::new("g");
        let n = g
            .add_node(NewNode::new(op).domain(domain))
            .expect("a node without inputs");
        g.node(n).clone()
    }

    fn ctx<'a>(n: &'a NodeData, opset: i64, d: DType, inputs: usize) -> NodeCtx<'a> {
        let t = TensorInfo {
            dtype: d,
            shape: vec![2, 2],
        };
        NodeCtx {
            node: n,
            opset,
            inputs: vec![Some(t.clone()); inputs],
            outputs: vec![t.clone(), t],
            constants: vec![None; inputs],
        }
    }

    /// A kernel's error, or `None` when it was made.
    fn made(r: Result<Box<dyn Kernel>, String>) -> Option<String> {
        r.err()
    }

    #[test]
    fn no_two_entries_serve_one_node() {
        for (i, a) in KERNELS.iter().enumerate() {
            for b in &KERNELS[i + 1..] {
                if a.domain != b.domain || a.op != b.op {
                    continue;
                }
                let lo = a.since.unwrap_or(1).max(b.since.unwrap_or(1));
                let hi = a.until.unwrap_or(i64::MAX).min(b.until.unwrap_or(i64::MAX));
                assert!(
                    lo > hi,
                    "{}::{} is registered twice for opsets {} and {}",
                    a.domain,
                    a.op,
                    a.range(),
                    b.range()
                );
            }
            if let (Some(s), Some(u)) = (a.since, a.until) {
                assert!(s <= u, "{}: empty range {}", a.op, a.range());
            }
        }
    }

    #[test]
    fn dispatch_finds_every_entry_and_has_op_agrees() {
        for e in KERNELS {
            assert!(CpuBackend.has_op(e.domain, e.op), "{}", e.op);
            if e.domain.is_empty() {
                assert!(CpuBackend.has_op("ai.onnx", e.op), "{}", e.op);
            }
            for v in 1..=30 {
                if e.serves(v) {
                    let f = find(KERNELS, e.domain, e.op, v).unwrap();
                    assert!(std::ptr::eq(f, e), "{} at opset {v}", e.op);
                }
            }
        }
        let coded: Vec<&str> = KERNELS
            .iter()
            .filter(|e| e.domain == CODED_DOMAIN)
            .map(|e| e.op)
            .collect();
        let mut want = CODED_OPS.to_vec();
        want.sort_unstable();
        assert_eq!(coded, want);
        let names: Vec<&str> = ops().collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "not in name order");
    }

    #[test]
    fn an_op_outside_the_table_has_no_kernel() {
        assert!(!CpuBackend.has_op("", "NoSuchOp"));
        let n = node("", "NoSuchOp");
        let e = made(CpuBackend.kernel(&ctx(&n, 17, DType::F32, 1))).unwrap();
        assert_eq!(e, "no kernel for this op yet");
        let n = node("com.example", "Relu");
        assert!(!CpuBackend.has_op("com.example", "Relu"));
        let e = made(CpuBackend.kernel(&ctx(&n, 17, DType::F32, 1))).unwrap();
        assert_eq!(e, "custom-domain ops have no kernels");
        let n = node(CODED_DOMAIN, "Relu");
        let e = made(CpuBackend.kernel(&ctx(&n, 17, DType::F32, 1))).unwrap();
        assert_eq!(e, "no kernel for this op yet");
        // Each fused chain's own op runs on the one chain entry; a
        // malformed name has no kernel.
        assert!(CpuBackend.has_op(CODED_DOMAIN, "ElementwiseChain.7"));
        assert!(!CpuBackend.has_op(CODED_DOMAIN, "ElementwiseChain.x"));
        assert!(!CpuBackend.has_op("", "ElementwiseChain.7"));
    }

    /// Every maker knows its op: the shared makers of a family answer for
    /// every op the table gives them (they may refuse the made-up node, or
    /// panic on it, but not as "not an op of the family").
    #[test]
    fn every_maker_takes_its_op() {
        for e in KERNELS {
            let n = node(e.domain, e.op);
            let d = match e.types {
                Types::Any => DType::F32,
                Types::Of(ok) => ok[0],
            };
            let c = ctx(&n, 17, d, 3);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| made((e.make)(&c))));
            if let Ok(Some(why)) = r {
                assert!(!why.contains("not an op of the"), "{}: {why}", e.op);
            }
        }
    }

    #[test]
    fn the_table_refuses_input_types_in_one_line() {
        let n = node("", "Relu");
        let e = made(CpuBackend.kernel(&ctx(&n, 17, DType::I32, 1))).unwrap();
        assert_eq!(
            e,
            "Relu on int32 is not implemented (input 0 may be float, float16, bfloat16)"
        );
        let n = node("", "Reshape");
        let e = made(CpuBackend.kernel(&ctx(&n, 17, DType::U4, 2))).unwrap();
        assert!(
            e.starts_with("packed 4-bit (uint4/int4) inputs are read only by Cast, CastLike, DequantizeLinear"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    fn refuse(_: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
        Err("old".into())
    }

    #[test]
    fn opset_ranges_pick_the_entry_or_refuse_in_one_line() {
        const T: &[Entry] = &[
            widen("Op", &[DType::F32], refuse).opsets(Some(7), Some(12)),
            widen("Op", &[DType::F32], super::unary).opsets(Some(13), None),
        ];
        assert_eq!(find(T, "", "Op", 9).unwrap().until, Some(12));
        assert_eq!(find(T, "ai.onnx", "Op", 13).unwrap().since, Some(13));
        assert_eq!(
            find(T, "", "Op", 6).unwrap_err(),
            "Op at opset 6 has no kernel (kernels for opsets 7..=12, 13..)"
        );
        assert_eq!(
            find(T, "", "Other", 13).unwrap_err(),
            "no kernel for this op yet"
        );
        let n = node("", "Upsample");
        let e = made(CpuBackend.kernel(&ctx(&n, 6, DType::F32, 2))).unwrap();
        assert_eq!(
            e,
            "Upsample at opset 6 has no kernel (kernels for opsets 7..)"
        );
    }
}
