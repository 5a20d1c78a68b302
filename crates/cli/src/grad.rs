//! `graphopt grad`: the training graph of a model
//! ([`graphopt::Session::grad`]); this file turns arguments into that call
//! and prints what it returns.

use crate::util::{human_bytes, json_text, print_out};
use graphopt::plan::DimValues;
use graphopt::{AutodiffOptions, GradOptions, OptimizerSpec};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model.
    input: PathBuf,
    /// Where to write the training graph (`-o`; `--output` names the
    /// model output the loss reads).
    #[arg(short = 'o', value_name = "TRAIN.onnx")]
    output: PathBuf,
    /// sum | mean | mse | l1 | cross_entropy (mse, l1 and cross_entropy add
    /// a graph input `target`).
    #[arg(long, default_value = "sum")]
    loss: String,
    /// The output the loss reads (default: the first).
    #[arg(long = "output", value_name = "NAME")]
    output_name: Option<String>,
    /// cross_entropy's class axis (1 as torch; -1 for language models).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    class_axis: i64,
    /// `all`, or comma-separated globs of trainable initializers.
    #[arg(long, value_name = "all|GLOB,...")]
    trainable: Option<String>,
    /// Comma-separated globs of initializers to keep frozen.
    #[arg(long, value_name = "GLOB,...")]
    frozen: Option<String>,
    /// Also output `<input>_grad` for every float graph input.
    #[arg(long)]
    input_grads: bool,
    /// none | sgd | adamw: also output the updated parameters
    /// `<param>_new` (adamw: and its state, `<param>_m_new`,
    /// `<param>_v_new`, `step_new`, from inputs `<param>_m`, `<param>_v`,
    /// `step`).
    #[arg(long, default_value = "none")]
    optimizer: String,
    #[command(flatten)]
    hyper: Hyperparameters,
    /// With an optimizer, also output `<param>_grad` (by default each
    /// gradient only feeds its update, and dies there).
    #[arg(long)]
    keep_grads: bool,
    /// Trainable parameters become graph inputs instead of initializers.
    #[arg(long)]
    params_as_inputs: bool,
    /// Run every Dropout in training mode (the ratio as given): the
    /// backward reads the forward's mask, dx = dy·mask/(1 - ratio). Models
    /// exported in eval mode have no Dropout left: export in train mode.
    #[arg(long)]
    dropout_train: bool,
    /// Write the inputs a runtime feeds besides the data for the first
    /// step (parameters with --params-as-inputs; adamw's zero moments and
    /// step 0) as an npz file.
    #[arg(long, value_name = "INIT.npz")]
    init_out: Option<PathBuf>,
    /// Hold every forward value the backward pass reads, instead of
    /// recomputing cheap elementwise ones from values it keeps anyway.
    #[arg(long)]
    no_recompute_pointwise: bool,
    /// Bind a symbolic dim for the memory figures (NAME=VALUE), repeatable.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Write the report as JSON.
    #[arg(long, value_name = "R.json")]
    report: Option<PathBuf>,
}

/// The optimizer's hyperparameters, as `grad` and `train` take them (the
/// library fills torch's defaults).
#[derive(clap::Args)]
pub(crate) struct Hyperparameters {
    /// Learning rate (default: sgd 0.01, adamw 0.001).
    #[arg(long)]
    lr: Option<f64>,
    /// Weight decay (sgd: added to the gradient as `wd·p`, default 0;
    /// adamw: decoupled, `p·(1 - lr·wd)`, default 0.01).
    #[arg(long)]
    weight_decay: Option<f64>,
    /// AdamW's betas, `B1,B2` (default 0.9,0.999).
    #[arg(long, value_name = "B1,B2")]
    betas: Option<String>,
    /// AdamW's epsilon (default 1e-8).
    #[arg(long)]
    eps: Option<f64>,
}

impl Hyperparameters {
    /// The optimizer `name` with these values.
    pub(crate) fn spec(&self, name: &str) -> graphopt::Result<OptimizerSpec> {
        Ok(OptimizerSpec {
            name: name.to_string(),
            lr: self.lr,
            weight_decay: self.weight_decay,
            betas: self
                .betas
                .as_deref()
                .map(graphopt::parse_betas)
                .transpose()?,
            eps: self.eps,
        })
    }
}

pub(crate) fn globs(s: &Option<String>) -> Vec<String> {
    s.as_deref()
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

pub fn run(a: Args) -> graphopt::Result<()> {
    let loss = graphopt::parse_loss(&a.loss)?;
    let optimizer = a.hyper.spec(&a.optimizer)?.build()?;
    let opts = GradOptions {
        autodiff: AutodiffOptions {
            output: a.output_name.clone(),
            loss,
            class_axis: a.class_axis,
            trainable: globs(&a.trainable),
            frozen: globs(&a.frozen),
            input_grads: a.input_grads,
            optimizer,
            params_as_inputs: a.params_as_inputs,
            dropout_train: a.dropout_train,
        },
        dims: DimValues::new(&graphopt::util::parse_dims(&a.dims)?),
        recompute_pointwise: !a.no_recompute_pointwise,
        keep_grads: a.keep_grads,
        ..GradOptions::default()
    };
    let mut session = graphopt::load(&a.input)?;
    // Symbolic input dims no --dim binds: the memory figures take them as 1.
    let unbound: Vec<String> = graphopt::plan::input_dim_names(session.model())
        .into_iter()
        .filter(|n| !opts.dims.bound.iter().any(|(b, _)| b == n))
        .collect();
    session.check_output_path(&a.output)?;
    let r = session.grad(&opts)?;
    session.save(&a.output)?;
    let mut out = format!(
        "{} -> {}\nloss: {}, {} parameter gradients{}\n",
        a.input.display(),
        a.output.display(),
        loss.name(),
        r.params.len(),
        if r.inputs.is_empty() {
            String::new()
        } else {
            format!(", {} input gradients", r.inputs.len())
        }
    );
    out += &format!(
        "nodes: {} forward (with the loss), {} backward\n",
        r.forward_nodes, r.backward_nodes
    );
    out += &format!(
        "saved for backward: {} of activations ({} values), {} of inputs\n",
        human_bytes(r.saved_activation_bytes),
        r.saved.iter().filter(|s| !s.input).count(),
        human_bytes(r.saved_input_bytes)
    );
    if r.recomputed_pointwise > 0 {
        out += &format!(
            "  ({} elementwise op(s) recomputed in the backward pass from values it keeps anyway; \
             --no-recompute-pointwise holds them instead)\n",
            r.recomputed_pointwise
        );
    }
    out += &format!(
        "plan: weights {}, activation lower bound {}, arena {}\n",
        human_bytes(r.weights_bytes),
        human_bytes(r.lower_bound_bytes),
        human_bytes(r.arena_bytes)
    );
    if !unbound.is_empty() {
        out += &format!(
            "  (memory at {}; bind dims with --dim NAME=VALUE)\n",
            unbound
                .iter()
                .map(|n| format!("{n}=1"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !r.state_inputs.is_empty() {
        out += &format!(
            "optimizer state inputs: {} (fed back from the matching _new outputs)\n",
            r.state_inputs.len()
        );
    }
    if !r.dropout_train.is_empty() {
        out += &format!(
            "dropout: {} node{} in training mode ({})\n",
            r.dropout_train.len(),
            if r.dropout_train.len() == 1 { "" } else { "s" },
            r.dropout_train.join(", ")
        );
    }
    if let Some((from, to)) = r.opset_raised {
        out += &format!("opset raised from {from} to {to} for the gradients' ops\n");
    }
    print_out(&out);
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(path) = &a.init_out {
        graphopt::util::write_atomic(path, &graphopt::initial_state_npz(&r)?)?;
    }
    if let Some(path) = &a.report {
        graphopt::util::write_atomic(path, json_text(&r)?.as_bytes())?;
    }
    Ok(())
}
