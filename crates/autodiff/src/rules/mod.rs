//! The gradient rules: one per op, in one table ([`RULES`]), a file per op
//! family.
//!
//! A rule gets the rule context (the forward node, which inputs need a
//! gradient, IR builders) and the gradients of the node's outputs (`None`
//! where no gradient flows back), and returns one gradient per input
//! (`None` where none is needed). Rules read only what they need: the
//! output where the derivative is a function of it, shapes through
//! [`Cx::shape_of`](crate::cx::Cx::shape_of).

use crate::cx::Cx;
use crate::Result;
use graphopt_ir::ValueId;

mod activations;
mod einsum;
mod elementwise;
mod matmul;
mod nn;
mod norm;
mod reduce;
mod shape;

/// A gradient rule: output gradients in, input gradients out.
pub type Rule = fn(&mut Cx, &[Option<ValueId>]) -> Result<Vec<Option<ValueId>>>;

/// Every op with a gradient rule (default domain).
pub const RULES: &[(&str, Rule)] = &[
    ("Add", elementwise::add),
    ("Sub", elementwise::sub),
    ("Mul", elementwise::mul),
    ("Div", elementwise::div),
    ("Neg", elementwise::neg),
    ("Identity", elementwise::identity),
    ("Dropout", elementwise::dropout),
    ("Cast", elementwise::cast),
    ("CastLike", elementwise::cast_like),
    ("Where", elementwise::where_),
    ("Pow", elementwise::pow),
    ("Sqrt", elementwise::sqrt),
    ("Exp", elementwise::exp),
    ("Log", elementwise::log),
    ("Reciprocal", elementwise::reciprocal),
    ("Relu", activations::relu),
    ("Clip", activations::clip),
    ("Sigmoid", activations::sigmoid),
    ("Tanh", activations::tanh),
    ("Erf", activations::erf),
    ("Gelu", activations::gelu),
    ("HardSigmoid", activations::hard_sigmoid),
    ("HardSwish", activations::hard_swish),
    ("LeakyRelu", activations::leaky_relu),
    ("Softplus", activations::softplus),
    ("Elu", activations::elu),
    ("Softmax", activations::softmax),
    ("LogSoftmax", activations::log_softmax),
    ("MatMul", matmul::matmul),
    ("Gemm", matmul::gemm),
    ("ReduceSum", reduce::reduce_sum),
    ("ReduceMean", reduce::reduce_mean),
    ("ReduceMax", reduce::reduce_max),
    ("ReduceMin", reduce::reduce_max),
    ("CumSum", reduce::cum_sum),
    ("PRelu", activations::prelu),
    ("GlobalAveragePool", reduce::global_average_pool),
    ("Reshape", shape::reshape_like),
    ("Flatten", shape::reshape_like),
    ("Squeeze", shape::reshape_like),
    ("Unsqueeze", shape::reshape_like),
    ("Transpose", shape::transpose),
    ("Expand", shape::expand),
    ("Concat", shape::concat),
    ("Split", shape::split),
    ("Slice", shape::slice),
    ("Pad", shape::pad),
    ("Gather", shape::gather),
    ("LayerNormalization", nn::layer_norm),
    ("Conv", nn::conv),
    ("BatchNormalization", nn::batch_norm),
    ("MaxPool", nn::max_pool),
    ("AveragePool", nn::average_pool),
    ("InstanceNormalization", norm::instance_norm),
    ("GroupNormalization", norm::group_norm),
    ("Einsum", einsum::einsum),
];

/// The rule for a default-domain op.
pub fn lookup(op: &str) -> Option<Rule> {
    RULES.iter().find(|(o, _)| *o == op).map(|(_, r)| *r)
}

/// The gradient of the single output.
pub(crate) fn dy(cx: &Cx, dys: &[Option<ValueId>]) -> Result<ValueId> {
    dys.first()
        .copied()
        .flatten()
        .ok_or_else(|| cx.unsupported("no gradient reaches output 0"))
}

/// The result's dims, needed to undo broadcasting.
pub(crate) fn out_dims(cx: &Cx) -> Result<Vec<graphopt_ir::Dim>> {
    let y = cx.y(0)?;
    cx.dims(y)
        .ok_or_else(|| cx.unsupported(format!("the rank of '{}' is unknown", cx.g.name(y))))
}
