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
//! 3. `Update` ops (ScatterElements, ScatterND) may write output 0 over
//!    input 0 (`data`) when it dies at the node, has exactly the output's
//!    size (the output is `data`'s shape and type) and no other input slot
//!    reads the same value: the output is `data` with some positions
//!    updated, and the updates and indices are other buffers, so the
//!    kernel need not copy `data` at all.
//! 4. Everything else gets fresh storage.

/// How an op's output may share an input's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InPlace {
    /// Output 0 is a view of input 0.
    View,
    /// Output 0 may overwrite a same-sized input that dies here.
    Elementwise,
    /// Output 0 may overwrite input 0 (only) when it is same-sized, dies
    /// here and is read by no other input slot of the node.
    Update,
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

/// The in-place rule of an op (default ONNX domain spelling).
pub fn inplace_rule(op_type: &str) -> InPlace {
    if VIEW_OPS.contains(&op_type) {
        InPlace::View
    } else if ELEMENTWISE_OPS.contains(&op_type) {
        InPlace::Elementwise
    } else if UPDATE_OPS.contains(&op_type) {
        InPlace::Update
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
        assert_eq!(inplace_rule("ScatterND"), InPlace::Update);
        assert_eq!(inplace_rule("ScatterElements"), InPlace::Update);
        assert_eq!(inplace_rule("Scatter"), InPlace::None);
        assert!(
            ELEMENTWISE_OPS.windows(2).all(|w| w[0] < w[1]),
            "keep the list sorted"
        );
    }
}
