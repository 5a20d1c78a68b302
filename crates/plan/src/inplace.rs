//! The in-place table: which ops may put an output in an input's storage.
//! The planner, the checker and every executor read this one function, so
//! a plan never asks an executor for an alias it will not honour.
//!
//! Rules:
//! 1. `View` ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity) produce
//!    output 0 as a view of input 0: same bytes, no copy. The planner always
//!    merges the pair, whether or not the input lives on.
//! 2. `Elementwise` ops may write output 0 over an input that dies at the
//!    node and has exactly the output's size (in ONNX default domain ops
//!    each output element depends only on the same element of the inputs,
//!    so overwriting while reading is safe).
//! 3. `Over(k)` ops may write output 0 over input `k` when it dies at the
//!    node, has exactly the output's size and no other input slot reads
//!    the same value:
//!    - ScatterElements and ScatterND over input 0 (`data`): the output is
//!      `data` with some positions updated, and the updates and indices are
//!      other buffers, so the kernel need not copy `data` at all;
//!    - Gemm over input 2 (`C`): `Y = alpha·A·B + beta·C` reads each
//!      element of C once, for the same element of Y, and A and B are
//!      other buffers; an accumulation `C += A·B` (a training step's
//!      `W_new = W - lr·Aᵀ·dY`, see `fuse_gemm_update`) then needs no
//!      second C-sized buffer.
//! 4. A fused elementwise chain of graphopt's CPU runtime (domain
//!    [`EXEC_DOMAIN`], op `ElementwiseChain.<k>`, made by
//!    `graphopt_exec::fuse_chains`) is `Elementwise`: each output element
//!    depends only on the same element of its full-sized inputs.
//!    A Conv fused with its residual Add there ([`CONV_ADD`]) is
//!    `Over(2)`: each output element is the convolution's plus the same
//!    element of `R`, which is read before it is written.
//! 5. Everything else gets fresh storage.

/// How an op's output may share an input's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InPlace {
    /// Output 0 is a view of input 0.
    View,
    /// Output 0 may overwrite a same-sized input that dies here.
    Elementwise,
    /// Output 0 may overwrite input `k` (only) when it is same-sized, dies
    /// here and is read by no other input slot of the node.
    Over(usize),
    /// Output gets its own buffer.
    None,
}

/// Ops whose output 0 is input 0 reinterpreted.
const VIEW_OPS: &[&str] = &["Flatten", "Identity", "Reshape", "Squeeze", "Unsqueeze"];

/// Ops computing each output element from the same element of each input
/// (with broadcasting; the size check keeps broadcast inputs out).
const ELEMENTWISE_OPS: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "And",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "BitwiseAnd",
    "BitwiseNot",
    "BitwiseOr",
    "BitwiseXor",
    "Ceil",
    "Celu",
    "Clip",
    "Cos",
    "Cosh",
    "Div",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "IsInf",
    "IsNaN",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "Max",
    "Mean",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "PRelu",
    "Pow",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Sub",
    "Sum",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "Where",
    "Xor",
];

/// Ops whose output 0 is input 0 with some positions updated.
const UPDATE_OPS: &[&str] = &["ScatterElements", "ScatterND"];

/// Ops whose output 0 accumulates onto input 2 element by element.
const ACCUMULATE_OPS: &[&str] = &["Gemm"];

/// The domain of graphopt's CPU runtime's fused ops.
pub const EXEC_DOMAIN: &str = "graphopt.exec";
/// A Conv fused with the Add of a residual of its output's shape
/// (`graphopt_exec::fuse_residual`): `ConvAdd(X, W, R, B?)`, whose output
/// may overwrite `R` (input 2) as a Gemm's may overwrite `C`.
pub const CONV_ADD: &str = "ConvAdd";
/// The op of a fused elementwise chain; each chain's own op is this,
/// a dot and a number (`ElementwiseChain.3`).
pub const CHAIN_OP: &str = "ElementwiseChain";

/// Whether `op_type` names a fused elementwise chain ([`CHAIN_OP`] and a
/// numbered suffix).
pub fn chain_op(op_type: &str) -> bool {
    op_type
        .strip_prefix(CHAIN_OP)
        .and_then(|r| r.strip_prefix('.'))
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// The in-place rule of a node's op in its domain: the default domain's
/// table, the fused chains of [`EXEC_DOMAIN`], none for other domains.
pub fn inplace_rule_in(domain: &str, op_type: &str) -> InPlace {
    if domain.is_empty() || domain == "ai.onnx" {
        inplace_rule(op_type)
    } else if domain == EXEC_DOMAIN && chain_op(op_type) {
        InPlace::Elementwise
    } else if domain == EXEC_DOMAIN && op_type == CONV_ADD {
        InPlace::Over(2)
    } else {
        InPlace::None
    }
}

/// The in-place rule of an op (default ONNX domain spelling; a fused
/// chain's op name, which no default-domain op has, is `Elementwise`).
pub fn inplace_rule(op_type: &str) -> InPlace {
    if chain_op(op_type) {
        InPlace::Elementwise
    } else if op_type == CONV_ADD {
        InPlace::Over(2)
    } else if VIEW_OPS.contains(&op_type) {
        InPlace::View
    } else if ELEMENTWISE_OPS.contains(&op_type) {
        InPlace::Elementwise
    } else if UPDATE_OPS.contains(&op_type) {
        InPlace::Over(0)
    } else if ACCUMULATE_OPS.contains(&op_type) {
        InPlace::Over(2)
    } else {
        InPlace::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        assert_eq!(inplace_rule("Reshape"), InPlace::View);
        assert_eq!(inplace_rule("Relu"), InPlace::Elementwise);
        assert_eq!(inplace_rule("Conv"), InPlace::None);
        assert_eq!(inplace_rule("ScatterND"), InPlace::Over(0));
        assert_eq!(inplace_rule("ScatterElements"), InPlace::Over(0));
        assert_eq!(inplace_rule("Gemm"), InPlace::Over(2));
        assert_eq!(inplace_rule("Scatter"), InPlace::None);
        assert_eq!(
            inplace_rule_in(EXEC_DOMAIN, "ElementwiseChain.12"),
            InPlace::Elementwise
        );
        assert_eq!(
            inplace_rule_in("", "ElementwiseChain.12"),
            InPlace::Elementwise
        );
        assert_eq!(
            inplace_rule_in("com.example", "ElementwiseChain.1"),
            InPlace::None
        );
        assert_eq!(
            inplace_rule_in(EXEC_DOMAIN, "ElementwiseChain"),
            InPlace::None
        );
        assert_eq!(
            inplace_rule_in(EXEC_DOMAIN, "ElementwiseChain.x"),
            InPlace::None
        );
        assert_eq!(inplace_rule_in(EXEC_DOMAIN, "HalfMatMul"), InPlace::None);
        assert_eq!(inplace_rule_in(EXEC_DOMAIN, CONV_ADD), InPlace::Over(2));
        assert_eq!(inplace_rule_in("com.example", CONV_ADD), InPlace::None);
        assert!(
            ELEMENTWISE_OPS.windows(2).all(|w| w[0] < w[1]),
            "keep the list sorted"
        );
    }
}
