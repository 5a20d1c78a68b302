//! The CPU backend: fp32 kernels (plus the integer and bool ops that shape
//! computations use, and dynamic int8 quantization, [`quant`]), one file per
//! op family; fp16/bf16 nodes run them on widened copies ([`lowp`]).
//! Threads: one pool per thread count ([`par`]) serves every kernel, with
//! static splits, so outputs are bit-identical at any thread count. GEMMs
//! split by batch, rows or column blocks ([`matmul::sgemm`], which also
//! carries Conv, ConvTranspose and the gate products of LSTM / GRU / RNN);
//! Conv tiles split across threads, depthwise planes, elementwise rows,
//! Softmax blocks, pooling planes and single-run reductions too. The rest
//! run on one thread. The fused nodes of palettized weights
//! (domain [`crate::lower::PALETTE_DOMAIN`]) have their kernels in
//! [`palette`].

pub mod conv;
pub mod einsum;
pub mod elementwise;
#[cfg(target_arch = "x86_64")]
mod gemm;
pub mod loss;
pub mod lowp;
pub mod matmul;
pub mod norm;
pub mod palette;
pub mod par;
pub mod pool;
pub mod quant;
pub mod reduce;
pub mod resize;
pub mod rnn;
pub mod scatter;
pub mod shape;
pub mod signal;

use crate::backend::{Backend, Kernel, NodeCtx};
use crate::lower::{PALETTE_DOMAIN, PALETTE_OPS};
use crate::tensor::is_packed4;

/// Every op the CPU backend has a kernel for (some only for some dtypes:
/// the kernel says which when it refuses).
pub const OPS: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "AveragePool",
    "BatchNormalization",
    "BitShift",
    "BitwiseAnd",
    "BitwiseNot",
    "BitwiseOr",
    "BitwiseXor",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvTranspose",
    "Cos",
    "Cosh",
    "CumSum",
    "DFT",
    "DequantizeLinear",
    "Div",
    "Dropout",
    "DynamicQuantizeLinear",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "GRU",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "InstanceNormalization",
    "IsInf",
    "IsNaN",
    "LSTM",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "LpNormalization",
    "MatMul",
    "MatMulInteger",
    "Max",
    "MaxPool",
    "Mean",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "NegativeLogLikelihoodLoss",
    "Not",
    "OneHot",
    "Or",
    "PRelu",
    "Pad",
    "Pow",
    "QuantizeLinear",
    "RMSNormalization",
    "RNN",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "ReverseSequence",
    "Round",
    "STFT",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "Shape",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Size",
    "Slice",
    "Softmax",
    "SoftmaxCrossEntropyLoss",
    "Softplus",
    "Softsign",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "Tile",
    "TopK",
    "Transpose",
    "Trilu",
    "Unsqueeze",
    "Upsample",
    "Where",
    "Xor",
];

/// The CPU backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn has_op(&self, domain: &str, op_type: &str) -> bool {
        ((domain.is_empty() || domain == "ai.onnx") && OPS.contains(&op_type))
            || (domain == PALETTE_DOMAIN && PALETTE_OPS.contains(&op_type))
    }

    fn kernel(&self, ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
        let d = &ctx.node.domain;
        if d == PALETTE_DOMAIN {
            return palette::kernel(ctx);
        }
        if !(d.is_empty() || d == "ai.onnx") {
            return Err("custom-domain ops have no kernels".into());
        }
        let op = ctx.node.op_type.as_str();
        if !matches!(op, "Cast" | "CastLike" | "DequantizeLinear")
            && ctx.inputs.iter().flatten().any(|t| is_packed4(t.dtype))
        {
            return Err(
                "packed 4-bit (uint4/int4) inputs are read only by Cast, DequantizeLinear (and the palette kernels)"
                    .into(),
            );
        }
        // Data movement is byte-generic: any dtype, fp16 included.
        if let Some(k) = shape::kernel(ctx) {
            return k;
        }
        if op != "Cast" && op != "CastLike" && lowp::is_low(ctx) {
            return lowp::via_f32(ctx, |c| self.f32_kernel(c));
        }
        self.f32_kernel(ctx)
    }
}

impl CpuBackend {
    /// The kernel of a node without fp16/bf16 tensors.
    fn f32_kernel(&self, ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
        if let Some(k) = elementwise::binary(ctx)
            .or_else(|| elementwise::unary(ctx))
            .or_else(|| reduce::reduce(ctx))
        {
            return k;
        }
        match ctx.node.op_type.as_str() {
            "Where" => elementwise::where_(ctx),
            "IsNaN" | "IsInf" => elementwise::classify(ctx),
            "BitwiseNot" => elementwise::bit_not(ctx),
            "RMSNormalization" => norm::rms_norm(ctx),
            "CastLike" => elementwise::cast_kernel(ctx),
            "CumSum" => reduce::cumsum(ctx),
            "InstanceNormalization" => norm::instance_norm(ctx),
            "ArgMax" | "ArgMin" => reduce::arg(ctx),
            "TopK" => reduce::top_k(ctx),
            "Hardmax" | "LpNormalization" => reduce::along_axis(ctx),
            "Cast" => elementwise::cast_kernel(ctx),
            "MatMul" => matmul::matmul(ctx),
            "Gemm" => matmul::gemm(ctx),
            "Conv" => conv::conv(ctx),
            "MaxPool" | "AveragePool" => pool::pool(ctx),
            "GlobalAveragePool" | "GlobalMaxPool" => pool::global(ctx),
            "Softmax" | "LogSoftmax" => reduce::softmax(ctx),
            "LayerNormalization" => norm::layer_norm(ctx),
            "BatchNormalization" => norm::batch_norm(ctx),
            "DequantizeLinear" => quant::dequantize(ctx),
            "DynamicQuantizeLinear" => quant::dynamic_quantize(ctx),
            "QuantizeLinear" => quant::quantize(ctx),
            "MatMulInteger" => quant::matmul_integer(ctx),
            "ScatterElements" | "Scatter" => scatter::scatter_elements(ctx),
            "ScatterND" => scatter::scatter_nd(ctx),
            "GatherElements" => scatter::gather_elements(ctx),
            "OneHot" => scatter::one_hot(ctx),
            "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => loss::nll(ctx),
            "ConvTranspose" => conv::conv_transpose(ctx),
            "LSTM" | "GRU" | "RNN" => rnn::rnn(ctx),
            "Einsum" => einsum::einsum(ctx),
            "DFT" => signal::dft(ctx),
            "STFT" => signal::stft(ctx),
            "Resize" | "Upsample" => resize::resize(ctx),
            _ => Err("no kernel for this op yet".into()),
        }
    }
}
