//! Elementwise ops: unary math and activations, broadcasting binary and
//! variadic ops, comparisons and logic, `Where`, casts.

use super::ctx::{tensor, Cx};
use super::dims;
use crate::{DType, Dim, Type};

type Out = Option<Vec<Option<Type>>>;

/// Ops whose output has the type of input 0.
const SAME_AS_INPUT: &[&str] = &[
    "Abs",
    "Neg",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Erf",
    "Gelu",
    "Softplus",
    "Softsign",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "ThresholdedRelu",
    "Mish",
    "Softmax",
    "LogSoftmax",
    "Hardmax",
    "Clip",
    "Identity",
    "BitwiseNot",
    "Shrink",
    "LRN",
    "MeanVarianceNormalization",
    "LpNormalization",
    "Trilu",
    "CumSum",
    "CumProd",
    "ReverseSequence",
    "Not",
    "Swish",
    "Affine",
    "ScaledTanh",
    "ParametricSoftplus",
    "ImageScaler",
    "Crop2",
];

/// Broadcasting binary/variadic ops whose output has input 0's element type.
const BROADCAST_SAME: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "And",
    "Or",
    "Xor",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "PRelu",
];

/// Broadcasting comparisons (bool output).
const COMPARE: &[&str] = &["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"];

pub(crate) fn infer(cx: &Cx) -> Out {
    let op = cx.op();
    if op == "Identity" {
        return Some(vec![cx.ty(0).cloned()]);
    }
    if SAME_AS_INPUT.contains(&op) {
        return Some(vec![same(cx, 0)]);
    }
    if BROADCAST_SAME.contains(&op) {
        let elem = (0..cx.nin()).find_map(|i| cx.elem(i));
        let elem = if op == "Pow" { cx.elem(0) } else { elem };
        return Some(vec![bcast(cx, elem, 0..cx.nin())]);
    }
    if COMPARE.contains(&op) {
        return Some(vec![bcast(cx, Some(DType::Bool), 0..cx.nin())]);
    }
    Some(match op {
        "IsNaN" | "IsInf" => vec![with_elem(cx, 0, Some(DType::Bool))],
        "Where" => {
            let elem = cx.elem(1).or_else(|| cx.elem(2));
            vec![bcast(cx, elem, 0..3)]
        }
        "Cast" => vec![with_elem(cx, 0, cx.adtype("to"))],
        "CastLike" => vec![with_elem(cx, 0, cx.elem(1))],
        "Dropout" => {
            let mask = if cx.opset < 10 {
                cx.elem(0)
            } else {
                Some(DType::Bool)
            };
            vec![same(cx, 0), with_elem(cx, 0, mask)]
        }
        "EyeLike" => vec![with_elem(cx, 0, cx.adtype("dtype").or(cx.elem(0)))],
        "RandomNormalLike" | "RandomUniformLike" | "BernoulliLike" => {
            vec![with_elem(cx, 0, cx.adtype("dtype").or(cx.elem(0)))]
        }
        "Bernoulli" => vec![with_elem(cx, 0, cx.adtype("dtype").or(cx.elem(0)))],
        "BlackmanWindow" | "HannWindow" | "HammingWindow" => {
            let n = cx
                .dim_vals(0)
                .and_then(|v| (v.len() == 1).then(|| v[0].clone()));
            vec![tensor(
                Some(cx.adtype("output_datatype").unwrap_or(DType::F32)),
                Some(vec![n.unwrap_or(Dim::Unknown)]),
            )]
        }
        _ => return None,
    })
}

/// Input `i`'s tensor type, unchanged.
pub(crate) fn same(cx: &Cx, i: usize) -> Option<Type> {
    let t = cx.tt(i)?;
    Some(Type::tensor(t.elem, t.shape.clone()))
}

/// Input `i`'s shape with element type `elem`.
pub(crate) fn with_elem(cx: &Cx, i: usize, elem: Option<DType>) -> Option<Type> {
    let dims = cx.dims(i).map(|d| d.to_vec());
    if elem.is_none() && dims.is_none() {
        return None;
    }
    tensor(elem, dims)
}

/// The broadcast of inputs `range` with element type `elem`.
fn bcast(cx: &Cx, elem: Option<DType>, range: std::ops::Range<usize>) -> Option<Type> {
    let shapes: Vec<Option<&[Dim]>> = range
        .clone()
        .filter(|&i| cx.has(i))
        .map(|i| cx.dims(i))
        .collect();
    if shapes.is_empty() {
        return None;
    }
    match dims::broadcast_all(&shapes) {
        Ok(d) => tensor(elem, d),
        Err(e) => {
            cx.warn(e);
            // Incompatible shapes: known rank at most.
            let r = shapes
                .iter()
                .map(|s| s.map(|s| s.len()))
                .collect::<Option<Vec<_>>>();
            tensor(
                elem,
                r.and_then(|r| r.into_iter().max())
                    .map(|r| vec![Dim::Unknown; r]),
            )
        }
    }
}
