//! Reverse-mode automatic differentiation on graphopt's IR.
//!
//! [`build_training_graph`] turns an inference [`Model`] into a training
//! graph in standard ONNX (default domain only):
//!
//! 1. the forward graph, unchanged;
//! 2. the loss ([`Loss`]) on one float output, as graph output `loss`;
//! 3. the backward graph: for each forward node on a path from a trainable
//!    value to the loss, in reverse program order, the op's gradient rule
//!    (one per op, in the table in [`rules`]) emits nodes that compute the
//!    gradients of its inputs from the gradients of its outputs;
//! 4. graph outputs `<param>_grad` for every trainable float initializer
//!    (and `<input>_grad` for float graph inputs with
//!    [`GradOptions::input_grads`]);
//! 5. with [`GradOptions::optimizer`], the updated parameters
//!    `<param>_new` (SGD, AdamW) and the optimizer state (AdamW's
//!    `<param>_m_new`, `<param>_v_new`, `step_new`, fed back as the graph
//!    inputs `<param>_m`, `<param>_v`, `step`), so that a runtime can loop
//!    the step by feeding them back;
//! 6. with [`GradOptions::params_as_inputs`], the trainable parameters are
//!    graph inputs rather than initializers;
//! 7. with [`GradOptions::dropout_train`], every Dropout runs in training
//!    mode and its gradient reads the forward's mask.
//!
//! Invariants the builder keeps:
//! 1. integer, bool and shape computations get no gradient: only values of
//!    float type carry one;
//! 2. a gradient is reduced back to its operand's shape where the op
//!    broadcast (ReduceSum over the broadcast axes, Reshape to the operand's
//!    shape), with shapes read from the `Shape` of the value, computed right
//!    after the value is, so symbolic dims stay symbolic and the value itself
//!    is not kept alive for its shape;
//! 3. a rule that only needs an op's output (Relu, Sigmoid, Tanh, Exp,
//!    Softmax, LogSoftmax, Sqrt) reads the output, not the input;
//! 4. an op with no rule on a path from a trainable value to the loss is an
//!    error naming the op and the node;
//! 5. the sum and mean losses seed a uniform gradient, a scalar broadcast
//!    to the output's shape (`Expand(s, Shape(y))`), not a tensor of ones:
//!    rules that can read the scalar do (`Cx::uniform`: MatMul sums
//!    rows and columns instead of multiplying by ones; Add, Sub, Neg, Cast,
//!    the reshapes, Transpose and Expand pass it on), and an `Add`, `Sub`,
//!    `Mul`, `Div` or `Where` whose other operand already has the whole
//!    shape reads the scalar instead of the `Expand`. Elsewhere the
//!    `Expand` is materialized where it is read, as the ones were.
//!
//! The emitted ops need default-domain opset 13 or later; a model at 13..15
//! is raised to 16 when a rule needs `ScatterND` with `reduction="add"`
//! (embedding gradients): the ops' semantics do not change between 13 and 16
//! apart from added types.

mod builder;
mod cx;
mod glob;
pub mod rules;

pub use builder::{build_training_graph, forward_cone, trainable};
pub use glob::glob_match;

use graphopt_ir::Model;

/// The loss computed from the differentiated output `y`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Loss {
    /// `loss = sum(y)`.
    #[default]
    Sum,
    /// `loss = mean(y)`.
    Mean,
    /// `loss = mean((y - target)^2)`; adds a graph input `target` shaped like `y`.
    Mse,
    /// `loss = mean(|y - target|)`; adds a graph input `target` shaped like `y`.
    L1,
    /// `torch.nn.CrossEntropyLoss` (mean reduction, no ignore index): `y`
    /// holds logits with classes on [`GradOptions::class_axis`]; adds an
    /// int64 graph input `target` shaped like `y` without that axis.
    CrossEntropy,
}

impl Loss {
    pub fn parse(s: &str) -> Option<Loss> {
        Some(match s {
            "sum" => Loss::Sum,
            "mean" => Loss::Mean,
            "mse" => Loss::Mse,
            "l1" => Loss::L1,
            "cross_entropy" | "cross-entropy" => Loss::CrossEntropy,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Loss::Sum => "sum",
            Loss::Mean => "mean",
            Loss::Mse => "mse",
            Loss::L1 => "l1",
            Loss::CrossEntropy => "cross_entropy",
        }
    }
}

/// The parameter update the training graph computes after the gradients.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Optimizer {
    /// Gradients only.
    #[default]
    None,
    /// `p_new = p - lr·(grad + weight_decay·p)`, as outputs `<param>_new`.
    Sgd { lr: f32, weight_decay: f32 },
    /// `torch.optim.AdamW` (no amsgrad): graph inputs `<param>_m`,
    /// `<param>_v` (the moments, zeros at the start) and an int64 scalar
    /// `step` (steps taken so far, 0 at the start: torch's `state["step"]`
    /// before the update); outputs `<param>_new`, `<param>_m_new`,
    /// `<param>_v_new` and `step_new = step + 1`. With `t = step + 1`:
    ///
    /// ```text
    /// m' = β1·m + (1 - β1)·g
    /// v' = β2·v + (1 - β2)·g²
    /// p' = p·(1 - lr·wd) - lr/(1 - β1^t) · m' / (√v' / √(1 - β2^t) + ε)
    /// ```
    ///
    /// The hyperparameters are doubles, as torch's Python floats are: the
    /// bias corrections are computed in double in the graph (`1 - β2^t`
    /// cancels badly in float) and cast to the parameter's type.
    AdamW {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

impl Optimizer {
    /// AdamW with torch's defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
    /// weight decay 1e-2).
    pub fn adamw_default() -> Optimizer {
        Optimizer::AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

/// What to differentiate and how.
#[derive(Clone, Debug, PartialEq)]
pub struct GradOptions {
    /// The output the loss reads (default: the first graph output).
    pub output: Option<String>,
    pub loss: Loss,
    /// The class axis of [`Loss::CrossEntropy`] (default 1, as torch; -1
    /// for language models' `[batch, seq, vocab]` logits).
    pub class_axis: i64,
    /// Globs (`*`, `?`) naming the trainable initializers. Empty (or
    /// `all`): every float initializer of more than one element (single
    /// numbers are the constants exporters write: scales, epsilons,
    /// exponents) except BatchNormalization's running mean and variance; a
    /// glob list selects among all float initializers.
    pub trainable: Vec<String>,
    /// Globs naming initializers to keep frozen (applied after `trainable`).
    pub frozen: Vec<String>,
    /// Also output `<input>_grad` for every float graph input.
    pub input_grads: bool,
    /// Also compute the updated parameters.
    pub optimizer: Optimizer,
    /// Trainable parameters become graph inputs (without initializers)
    /// instead of initializers, so that a runtime feeds them; their
    /// initial values are in [`TrainingGraph::initial_params`].
    pub params_as_inputs: bool,
    /// Run every `Dropout` in training mode (`training_mode` a constant
    /// true, the ratio as given, default 0.5; the mask output added where
    /// missing): the backward reads the forward's mask, `dx = dy · mask /
    /// (1 - ratio)`. Without it a Dropout in inference (no or a constant
    /// false `training_mode`) is the identity, and one exported in training
    /// mode is differentiated as such anyway. Exporters in eval mode remove
    /// Dropout altogether: then there is nothing to switch (see
    /// [`TrainingGraph::dropout_train`]).
    pub dropout_train: bool,
}

impl Default for GradOptions {
    fn default() -> GradOptions {
        GradOptions {
            output: None,
            loss: Loss::Sum,
            class_axis: 1,
            trainable: Vec::new(),
            frozen: Vec::new(),
            input_grads: false,
            optimizer: Optimizer::None,
            params_as_inputs: false,
            dropout_train: false,
        }
    }
}

/// The training graph and what went into it.
#[derive(Clone, Debug)]
pub struct TrainingGraph {
    pub model: Model,
    /// Nodes of the forward graph that the loss needs, and the loss's nodes.
    pub forward_nodes: usize,
    /// Nodes added for the backward pass.
    pub backward_nodes: usize,
    /// Trainable parameters, in output order (`<name>_grad` follows `loss`).
    pub params: Vec<String>,
    /// Graph inputs differentiated (with `input_grads`).
    pub inputs: Vec<String>,
    /// Opset raised from, to (when a rule needed a newer op).
    pub opset_raised: Option<(i64, i64)>,
    /// With [`GradOptions::params_as_inputs`], the parameters' values
    /// taken out of the graph (in `params` order); empty otherwise.
    pub initial_params: Vec<(String, graphopt_ir::Tensor)>,
    /// Graph inputs the optimizer added (state: `<param>_m`, `<param>_v`,
    /// `step`), in graph-input order.
    pub state_inputs: Vec<String>,
    /// The Dropout nodes [`GradOptions::dropout_train`] switched to
    /// training mode (empty without it, or when the model has none).
    pub dropout_train: Vec<String>,
}

/// Why a training graph could not be built: one line naming the op and node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GradError {
    #[error("no gradient rule for op {op} (node '{node}') on the path from a trainable value to the loss")]
    NoRule { op: String, node: String },
    #[error("gradient of {op} (node '{node}'): {msg}")]
    Unsupported {
        op: String,
        node: String,
        msg: String,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Ir(#[from] graphopt_ir::IrError),
}

pub type Result<T> = std::result::Result<T, GradError>;
