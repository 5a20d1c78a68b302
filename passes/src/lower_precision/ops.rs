//! Op knowledge for lowering: which formal parameter of each op version a
//! slot is bound to (from the ONNX schemas), whether onnxruntime's CPU
//! provider loads the op with a low-precision compute type (probed, see
//! `gen_tables.py`), and the autocast-style op lists.

use super::tables::OPS;

/// One op version: the type parameter of every formal input and output
/// (`""` for a fixed type such as Resize's `scales: tensor(float)`), the
/// parameters that admit float16 / bfloat16, and the onnxruntime CPU probe
/// (`None`: the probe could not build the node).
pub(crate) struct OpRow {
    pub op: &'static str,
    pub since: i64,
    pub ins: &'static [&'static str],
    pub var_in: bool,
    pub outs: &'static [&'static str],
    pub var_out: bool,
    pub f16_params: &'static [&'static str],
    pub bf16_params: &'static [&'static str],
    pub ort_f16: Option<bool>,
    pub ort_bf16: Option<bool>,
}

impl OpRow {
    /// The parameter input `slot` is bound to (`""`: fixed type or no such slot).
    pub fn in_param(&self, slot: usize) -> &'static str {
        param(self.ins, self.var_in, slot)
    }
    pub fn out_param(&self, slot: usize) -> &'static str {
        param(self.outs, self.var_out, slot)
    }
}

fn param(list: &'static [&'static str], variadic: bool, slot: usize) -> &'static str {
    match list.get(slot) {
        Some(p) => p,
        None if variadic => list.last().copied().unwrap_or(""),
        None => "",
    }
}

/// The schema of default-domain `op` in effect at `opset`.
pub(crate) fn row(op: &str, opset: i64) -> Option<&'static OpRow> {
    let start = OPS.partition_point(|r| r.op < op);
    OPS[start..]
        .iter()
        .take_while(|r| r.op == op)
        .filter(|r| r.since <= opset)
        .last()
}

/// Quantization ops: their float inputs are scales, zero points or values
/// about to be quantized, whose exact fp32 bits the integer arithmetic is
/// defined on (rounding a scale to fp16 moves every dequantized value). They
/// never run low, and the float constants they read are never stored low.
/// Ops outside the default domain get the same treatment, wherever they are
/// checked, since their arithmetic is opaque (a com.microsoft quantized
/// LSTM reads float scales).
pub(crate) fn is_quant_op(op: &str) -> bool {
    // "uantize": QuantizeLinear, DequantizeLinear, DynamicQuantize*.
    op.starts_with("QLinear")
        || op.contains("uantize")
        || op.ends_with("Integer")
        || op.ends_with("IntegerToFloat")
}

/// A constant operand of a matrix product that looks like a
/// signal-processing basis (DFT/STFT, DCT, cosine windows): entries bounded
/// by 1 in magnitude, a reduction at least [`BASIS_MIN_K`] long, and sums
/// that reach at least this many times the input's scale (`rms(w) *
/// sqrt(K)`). A cosine basis has rms ~0.71, so with K = 512 its product is
/// ~16 times its input, where trained or initialised network weights (rms
/// ~1/sqrt(K)) stay near 1. fp16 loses those long sums' small components
/// (the high-frequency bins), so such products stay fp32.
pub const BASIS_GAIN: f64 = 4.0;

/// The shortest reduction [`basis_gain`] considers.
pub const BASIS_MIN_K: i64 = 64;

/// `rms(w) * sqrt(k)` of an fp32 tensor whose entries all lie in [-1, 1],
/// for `k >= BASIS_MIN_K` (None otherwise).
pub(crate) fn basis_gain(t: &graphopt_ir::Tensor, k: i64) -> Option<f64> {
    if t.dtype != graphopt_ir::DType::F32 || k < BASIS_MIN_K {
        return None;
    }
    let raw = t.raw()?;
    let (mut sum, mut n) = (0f64, 0u64);
    for c in raw.chunks_exact(4) {
        let x = f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64;
        if !(-1.0..=1.0).contains(&x) {
            return None;
        }
        sum += x * x;
        n += 1;
    }
    (n > 0).then(|| (sum / n as f64).sqrt() * (k as f64).sqrt())
}

/// Default fp32 keep-list, after PyTorch autocast's fp32 list: ops whose
/// result loses too much in fp16 (exponentials, big sums, normalizations)
/// or whose outputs index or size things (ranges, top-k, box ops).
pub const DEFAULT_KEEP_FP32: &[&str] = &[
    // softmax family
    "Softmax",
    "LogSoftmax",
    // normalizations
    "LayerNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "RMSNormalization",
    "MeanVarianceNormalization",
    "LpNormalization",
    // sum-like reductions
    "ReduceSum",
    "ReduceMean",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceProd",
    "CumSum",
    // signal processing: long sums of unit-magnitude terms (MatMuls against
    // a constant basis are caught by `basis_gain`)
    "DFT",
    "STFT",
    // pointwise functions with a wide output range
    "Exp",
    "Log",
    "Pow",
    "Erf",
    "Reciprocal",
    "Sqrt",
    "Softplus",
    // losses
    "SoftmaxCrossEntropyLoss",
    "NegativeLogLikelihoodLoss",
    // range- and index-sensitive ops
    "Range",
    "TopK",
    "NonMaxSuppression",
    "RoiAlign",
    "MaxRoiPool",
    "GridSample",
];

/// Ops that always run in low precision unless kept (autocast's fp16 list):
/// the matrix products, where the time and the weights are.
pub const ALWAYS_LOW: &[&str] = &["MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"];

/// Ops whose output element type comes from an attribute, not an input:
/// lowering them would need the attribute rewritten, so they keep fp32 and
/// their consumers get a Cast (Cast and Constant are handled apart).
pub const ATTR_TYPED: &[&str] = &[
    "ConstantOfShape",
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "EyeLike",
    "Multinomial",
    "Bernoulli",
    "HannWindow",
    "HammingWindow",
    "BlackmanWindow",
];

/// Ops that only move, select or copy values (no arithmetic on them): a
/// constant they produce is as exact as the constant they read.
pub(crate) fn moves_data(op: &str) -> bool {
    matches!(
        op,
        "Identity"
            | "Reshape"
            | "Transpose"
            | "Squeeze"
            | "Unsqueeze"
            | "Flatten"
            | "Concat"
            | "Split"
            | "Slice"
            | "Gather"
            | "GatherElements"
            | "GatherND"
            | "Expand"
            | "Tile"
            | "Pad"
            | "DepthToSpace"
            | "SpaceToDepth"
            | "Shape"
            | "Size"
            | "Cast"
            | "CastLike"
            | "Constant"
    )
}

/// Spectral ops: the constants they read (windows) stay fp32.
pub(crate) fn is_signal_op(op: &str) -> bool {
    matches!(op, "STFT" | "DFT" | "MelWeightMatrix")
}

/// Ops whose outputs differ from run to run: never constants.
pub(crate) fn is_random(op: &str) -> bool {
    op.starts_with("Random") || matches!(op, "Multinomial" | "Bernoulli" | "Dropout")
}

/// Input slots that accept any element type without changing the node's
/// compute type: a lowered value may flow in as it is.
pub(crate) fn flexible_slot(op: &str, slot: usize) -> bool {
    matches!((op, slot), ("Shape" | "Size", _) | ("Cast" | "CastLike", 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_ops() {
        for op in [
            "QuantizeLinear",
            "DequantizeLinear",
            "DynamicQuantizeLinear",
            "DynamicQuantizeMatMul",
            "QLinearMatMul",
            "QLinearConv",
            "MatMulInteger",
            "ConvInteger",
            "MatMulIntegerToFloat",
        ] {
            assert!(is_quant_op(op), "{op}");
        }
        for op in ["MatMul", "Gemm", "Conv", "Add", "LayerNormalization"] {
            assert!(!is_quant_op(op), "{op}");
        }
    }

    #[test]
    fn rows_follow_the_opset() {
        let r = row("Resize", 18).unwrap();
        assert_eq!(r.since, 18);
        assert_eq!(r.in_param(0), "T1");
        assert_eq!(r.in_param(2), "");
        assert_eq!(row("Resize", 12).unwrap().since, 11);
        let c = row("Concat", 13).unwrap();
        assert_eq!(c.in_param(5), c.out_param(0));
        assert!(row("NoSuchOp", 18).is_none());
        // The generated table is sorted by op name, as `row` requires.
        assert!(OPS.windows(2).all(|w| w[0].op <= w[1].op));
    }
}
