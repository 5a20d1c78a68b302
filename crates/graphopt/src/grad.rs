//! [`Session::grad`]: the training graph of the session's model, and what
//! it keeps alive for the backward pass; [`grad_check`]: its gradients
//! against central finite differences, run in tract.

use crate::error::{Error, Result};
use crate::optimize::{OptimizeOptions, OptimizeReport};
use crate::session::Session;
use graphopt_autodiff::build_training_graph;
pub use graphopt_autodiff::{forward_cone, GradOptions as AutodiffOptions, Loss, Optimizer};
use graphopt_ir::{Model, Tensor};
use graphopt_plan::{DimValues, PlanOptions};
use graphopt_tract::TractTensor;
use serde::Serialize;
use std::collections::HashSet;

/// An optimizer as the front ends name it: a name and the hyperparameters
/// given, the rest taken from torch's defaults ([`OptimizerSpec::build`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerSpec {
    /// `none`, `sgd` or `adamw`.
    pub name: String,
    /// Default: sgd 0.01, adamw 0.001.
    pub lr: Option<f64>,
    /// Default: sgd 0 (added to the gradient as `wd·p`), adamw 0.01
    /// (decoupled, `p·(1 - lr·wd)`), as torch.optim's.
    pub weight_decay: Option<f64>,
    /// AdamW's (β1, β2); default (0.9, 0.999).
    pub betas: Option<(f64, f64)>,
    /// AdamW's ε; default 1e-8.
    pub eps: Option<f64>,
}

impl OptimizerSpec {
    pub fn named(name: &str) -> OptimizerSpec {
        OptimizerSpec {
            name: name.to_string(),
            ..OptimizerSpec::default()
        }
    }

    /// The optimizer, torch's defaults filled in (the values are
    /// range-checked by [`GradOptions`]' validation when `Session::grad`
    /// runs).
    pub fn build(&self) -> Result<Optimizer> {
        let name = self.name.trim().to_ascii_lowercase();
        if name != "adamw" && (self.betas.is_some() || self.eps.is_some()) {
            return Err(Error::new(format!(
                "betas and eps are AdamW's; optimizer '{name}' takes lr and weight decay"
            )));
        }
        Ok(match name.as_str() {
            "none" | "" => {
                if self.lr.is_some() || self.weight_decay.is_some() {
                    return Err(Error::new(
                        "lr and weight decay need an optimizer (sgd or adamw)",
                    ));
                }
                Optimizer::None
            }
            "sgd" => Optimizer::Sgd {
                lr: self.lr.unwrap_or(0.01) as f32,
                weight_decay: self.weight_decay.unwrap_or(0.0) as f32,
            },
            "adamw" => {
                let (beta1, beta2) = self.betas.unwrap_or((0.9, 0.999));
                Optimizer::AdamW {
                    lr: self.lr.unwrap_or(1e-3),
                    beta1,
                    beta2,
                    eps: self.eps.unwrap_or(1e-8),
                    weight_decay: self.weight_decay.unwrap_or(1e-2),
                }
            }
            other => {
                return Err(Error::new(format!(
                    "unknown optimizer '{other}' (none, sgd, adamw)"
                )))
            }
        })
    }
}

/// `B1,B2` (the CLI's `--betas`) as a pair.
pub fn parse_betas(s: &str) -> Result<(f64, f64)> {
    let bad = || Error::new(format!("--betas wants two numbers B1,B2, got '{s}'"));
    let v: Vec<f64> = s
        .split(',')
        .map(|b| b.trim().parse::<f64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| bad())?;
    match v[..] {
        [a, b] => Ok((a, b)),
        _ => Err(bad()),
    }
}

/// A loss by name, or an error listing the names.
pub fn parse_loss(s: &str) -> Result<Loss> {
    Loss::parse(s).ok_or_else(|| {
        Error::new(format!(
            "unknown loss '{s}' (sum, mean, mse, l1, cross_entropy)"
        ))
    })
}

/// What [`Session::grad`] builds.
#[derive(Clone, Debug)]
pub struct GradOptions {
    /// Loss, output, trainable selection, input gradients.
    pub autodiff: AutodiffOptions,
    /// Dims at which saved bytes and the plan are measured (others 1).
    pub dims: DimValues,
    /// Run the default simplify pipeline on the training graph (default).
    pub simplify: bool,
    /// Recompute, in the backward pass, elementwise forward values that
    /// come cheaply from values it keeps anyway, instead of holding them
    /// (default; see `graphopt_passes::remat::solve::pointwise_from_saved`).
    pub recompute_pointwise: bool,
    /// The planner's options for the report's memory figures (they do not
    /// change the training graph). By default without the offset search:
    /// the report's arena is the best greedy placement, and
    /// `graphopt plan TRAIN.onnx` searches.
    pub plan: PlanOptions,
    /// With an optimizer, keep `<param>_grad` as graph outputs. By default
    /// they are not: each gradient feeds its parameter's update only, and
    /// dies there instead of living to the end of the step.
    pub keep_grads: bool,
}

impl Default for GradOptions {
    fn default() -> GradOptions {
        GradOptions {
            autodiff: AutodiffOptions::default(),
            dims: DimValues::default(),
            simplify: true,
            recompute_pointwise: true,
            plan: PlanOptions {
                search: false,
                ..PlanOptions::default()
            },
            keep_grads: false,
        }
    }
}

/// A forward value read by the backward pass.
#[derive(Clone, Debug, Serialize)]
pub struct SavedValue {
    pub name: String,
    /// Bytes at the report's dims; `None` when its shape is unknown there.
    pub bytes: Option<u64>,
    /// A graph input rather than a value the forward pass computed.
    pub input: bool,
}

/// What [`Session::grad`] did.
#[derive(Clone, Debug, Serialize)]
pub struct GradReport {
    pub loss: String,
    pub params: Vec<String>,
    pub inputs: Vec<String>,
    /// Nodes the loss depends on (forward pass and loss), after simplifying.
    pub forward_nodes: usize,
    /// The other nodes: the backward pass.
    pub backward_nodes: usize,
    /// Forward activations (values computed by forward nodes) that
    /// backward nodes other than `Shape` read, at the report's dims.
    pub saved_activation_bytes: u64,
    /// Graph inputs that backward nodes read (their bytes at the dims).
    pub saved_input_bytes: u64,
    /// Every saved value, largest first.
    pub saved: Vec<SavedValue>,
    /// Elementwise forward nodes recomputed in the backward pass from
    /// values it keeps anyway ([`GradOptions::recompute_pointwise`]).
    pub recomputed_pointwise: usize,
    /// The planner's figures for the training step at the dims.
    pub weights_bytes: u64,
    pub lower_bound_bytes: u64,
    pub arena_bytes: u64,
    /// The opset was raised (from, to): to 13 for models older than the
    /// rules' ops, to 16 for ScatterND/ScatterElements with reduction.
    pub opset_raised: Option<(i64, i64)>,
    pub optimize: Option<OptimizeReport>,
    /// Graph inputs that carry the optimizer's state (AdamW: `step`,
    /// `<param>_m`, `<param>_v`), fed back from the `_new` outputs.
    pub state_inputs: Vec<String>,
    /// The donation table written into the model's metadata (input,
    /// output): each `_new` output over the input it replaces, so that a
    /// planner holds them once (`graphopt_plan::donation`).
    pub donations: Vec<(String, String)>,
    /// The state inputs' and parameters' bytes the plan holds once thanks
    /// to donation.
    pub donated_bytes: u64,
    /// The Dropout nodes `dropout_train` switched to training mode.
    pub dropout_train: Vec<String>,
    /// What the caller should know (an option that changed nothing).
    pub warnings: Vec<String>,
    /// The values of the graph inputs that a runtime feeds besides the
    /// data for the first step: the parameters (with `params_as_inputs`),
    /// zero moments and `step = 0` (AdamW). Write them with
    /// [`initial_state_npz`].
    #[serde(skip)]
    pub initial_state: Vec<(String, Tensor)>,
}

/// [`GradReport::initial_state`] as an npz file (name → array).
pub fn initial_state_npz(report: &GradReport) -> Result<Vec<u8>> {
    let mut arrays = Vec::new();
    for (name, t) in &report.initial_state {
        let tt = graphopt_tract::from_ir(t)
            .map_err(|e| Error::new(format!("initial state '{name}': {e}")))?;
        arrays.push((name.clone(), tt));
    }
    Ok(graphopt_tract::npz::write(&arrays)?)
}

impl Session {
    /// Replaces the model by its training graph (see `graphopt-autodiff`),
    /// simplifies it with the default pipeline, and reports its forward and
    /// backward sizes, what the backward pass keeps alive, and its plan.
    /// Whole or not at all: on an error the session is as it was.
    pub fn grad(&mut self, opts: &GradOptions) -> Result<GradReport> {
        opts.validate()?;
        self.transact(|s| s.grad_step(opts))
    }

    fn grad_step(&mut self, opts: &GradOptions) -> Result<GradReport> {
        // The rules emit opset-13 ops (ReduceSum's axes as an input, ...):
        // older models are raised first with `upgrade_opset`.
        let mut opset_upgraded = None;
        if let Some(v) = self.model.onnx_opset().filter(|&v| v < 13) {
            self.optimize(&OptimizeOptions {
                opset: Some(13),
                passes: Some("none".into()),
                ..OptimizeOptions::default()
            })?;
            opset_upgraded = Some((v, 13));
        }
        let autodiff = self.prefold(&opts.autodiff)?;
        let train = build_training_graph(&self.model, &autodiff)
            .map_err(|e| self.err(Error::new(e.to_string())))?;
        let split_ties = transposed_copies(&self.model.graph, &train.params);
        let before = std::mem::replace(&mut self.model, train.model);
        if opts.autodiff.optimizer != graphopt_autodiff::Optimizer::None && !opts.keep_grads {
            // The gradients feed the updates only: not outputs, so each
            // dies once its update has read it.
            let g = &mut self.model.graph;
            let grads: HashSet<String> = train.params.iter().map(|p| format!("{p}_grad")).collect();
            let keep: Vec<_> = g
                .outputs
                .iter()
                .copied()
                .filter(|&v| !grads.contains(g.name(v)))
                .collect();
            g.outputs = keep;
        }
        // While simplifying, the parameters are graph inputs (with their
        // initializers as defaults), so that no pass treats them as
        // constants: folding `Transpose(W)` into a new initializer, merging
        // parallel MatMuls' weights or deduplicating equal weights would cut
        // the tie between a parameter and its gradient.
        let g = &mut self.model.graph;
        let n_inputs = g.inputs.len();
        // (With `params_as_inputs` they are graph inputs already.)
        let params: Vec<_> = train
            .params
            .iter()
            .filter_map(|p| g.value_by_name(p))
            .filter(|v| !g.inputs.contains(v))
            .collect();
        g.inputs.extend(params.iter().copied());
        let optimize = if opts.simplify {
            match self.optimize(&OptimizeOptions::default()) {
                Ok(r) => Some(r),
                Err(e) => {
                    self.model = before;
                    return Err(e);
                }
            }
        } else {
            None
        };
        let g = &mut self.model.graph;
        let (kept, added): (Vec<_>, Vec<_>) = g
            .inputs
            .iter()
            .copied()
            .enumerate()
            .partition(|&(i, v)| i < n_inputs || !params.contains(&v));
        if added.len() != params.len() {
            self.model = before;
            return Err(self.err(Error::new(
                "simplifying the training graph removed a parameter input",
            )));
        }
        g.inputs = kept.into_iter().map(|(_, v)| v).collect();
        let recomputed_pointwise = if opts.recompute_pointwise {
            match self.recompute_pointwise(&opts.dims) {
                Ok(n) => n,
                Err(e) => {
                    self.model = before;
                    return Err(e);
                }
            }
        } else {
            0
        };
        // The donation table: each updated parameter and state output over
        // the input it replaces, where that input is a runtime input.
        let donations: Vec<(String, String)> = {
            let g = &self.model.graph;
            train
                .params
                .iter()
                .chain(&train.state_inputs)
                .filter(|p| {
                    g.value_by_name(p)
                        .is_some_and(|v| g.is_input(v) && g.initializer(v).is_none())
                })
                .filter(|p| {
                    g.value_by_name(&format!("{p}_new"))
                        .is_some_and(|v| g.is_output(v))
                })
                .map(|p| (p.clone(), format!("{p}_new")))
                .collect()
        };
        graphopt_plan::set_donations(&mut self.model, &donations);
        let planned = graphopt_plan::plan_model(&self.model, &opts.dims, &opts.plan)
            .map_err(|e| self.err(e))?;
        let g = &planned.model.graph;
        let cone = forward_cone(g);
        let mut saved = Vec::new();
        let mut seen = HashSet::new();
        let not_saved: HashSet<&str> = train
            .params
            .iter()
            .chain(&train.state_inputs)
            .map(String::as_str)
            .collect();
        // A backward `Shape` reads only metadata, right where the value is
        // computed: it keeps nothing alive.
        for n in g
            .nodes()
            .filter(|n| !cone.contains(n) && g.node(*n).op_type != "Shape")
        {
            for &v in g.node(n).inputs().iter().flatten() {
                let computed = g.producer(v).is_some_and(|(p, _)| cone.contains(&p));
                // Parameters fed as inputs and the optimizer's state are
                // weights and state, not saved activations.
                let input =
                    g.is_input(v) && g.initializer(v).is_none() && !not_saved.contains(g.name(v));
                if (computed || input) && seen.insert(v) {
                    let bytes = g.ty(v).and_then(|t| {
                        let tt = t.as_tensor()?;
                        tt.elem.storage_bytes(tt.shape.as_ref()?.numel()?)
                    });
                    saved.push(SavedValue {
                        name: g.name(v).to_string(),
                        bytes,
                        input,
                    });
                }
            }
        }
        saved.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.name.cmp(&b.name)));
        let sum = |inp: bool| -> u64 {
            saved
                .iter()
                .filter(|s| s.input == inp)
                .filter_map(|s| s.bytes)
                .sum()
        };
        let forward_nodes = cone.len();
        let mut initial_state = train.initial_params;
        for name in &train.state_inputs {
            let v = g
                .value_by_name(name)
                .ok_or_else(|| Error::new(format!("state input '{name}' vanished")))?;
            let t = g.ty(v).and_then(|t| t.as_tensor());
            let (dt, dims) = match t.and_then(|t| Some((t.elem, t.shape.as_ref()?))) {
                Some((dt, s)) => (
                    dt,
                    s.dims
                        .iter()
                        .map(|d| d.known())
                        .collect::<Option<Vec<i64>>>()
                        .ok_or_else(|| {
                            Error::new(format!("state input '{name}' has symbolic dims"))
                        })?,
                ),
                None => {
                    return Err(Error::new(format!(
                        "state input '{name}' has no known type"
                    )))
                }
            };
            let n: i64 = dims.iter().product();
            let bytes = dt
                .storage_bytes(n as u64)
                .ok_or_else(|| Error::new(format!("state input '{name}': no zero of type {dt}")))?;
            initial_state.push((
                name.clone(),
                Tensor::from_raw(dt, dims, vec![0u8; bytes as usize].into())?,
            ));
        }
        let mut warnings = Vec::new();
        if opts.autodiff.dropout_train && train.dropout_train.is_empty() {
            warnings.push(
                "dropout_train: the model has no Dropout node, nothing changed (exporters in \
                 eval mode remove them: export with torch.onnx.export(..., \
                 training=torch.onnx.TrainingMode.TRAINING) or from a module in train mode)"
                    .into(),
            );
        }
        for (a, b) in split_ties {
            warnings.push(format!(
                "parameters '{a}' and '{b}' hold the same values transposed: a weight torch \
                 ties (an LM head and its embedding) that the exporter's constant folding \
                 wrote twice; they train as two parameters here, where torch trains one \
                 (export with do_constant_folding=False to keep the Transpose, and the tie)"
            ));
        }
        Ok(GradReport {
            dropout_train: train.dropout_train,
            warnings,
            state_inputs: train.state_inputs,
            donations,
            donated_bytes: planned.plan.donated_bytes,
            initial_state,
            loss: "loss".into(),
            params: train.params,
            inputs: train.inputs,
            forward_nodes,
            backward_nodes: g.node_count() - forward_nodes,
            saved_activation_bytes: sum(false),
            saved_input_bytes: sum(true),
            saved,
            recomputed_pointwise,
            weights_bytes: planned.plan.weights_bytes,
            lower_bound_bytes: planned.plan.lower_bound_bytes,
            arena_bytes: planned.plan.arena_bytes,
            opset_raised: match (opset_upgraded, train.opset_raised) {
                (Some((from, _)), Some((_, to))) => Some((from, to)),
                (a, b) => b.or(a),
            },
            optimize,
        })
    }
}

impl Session {
    /// Folds constant subgraphs (axes, shapes and bounds that exporters
    /// compute from Constant nodes) so that the rules read them as
    /// constants: `fold_constants` and `fold_shapes`, with every float
    /// initializer held as a graph input meanwhile so that no weight is
    /// folded into a new tensor. Float tensors the fold creates (a Constant
    /// node become an initializer) were not parameters before and are
    /// frozen in the returned options.
    fn prefold(&mut self, opts: &AutodiffOptions) -> Result<AutodiffOptions> {
        let g = &mut self.model.graph;
        let floats = |g: &graphopt_ir::Graph| -> Vec<graphopt_ir::ValueId> {
            g.initializers()
                .iter()
                .copied()
                .filter(|&v| g.initializer(v).is_some_and(|t| t.dtype.is_float()))
                .collect()
        };
        let held: Vec<_> = floats(g)
            .into_iter()
            .filter(|v| !g.inputs.contains(v))
            .collect();
        let before: HashSet<String> = floats(g).iter().map(|&v| g.name(v).to_string()).collect();
        let n_inputs = g.inputs.len();
        g.inputs.extend(held.iter().copied());
        let r = self.optimize(&OptimizeOptions {
            passes: Some("fold_constants,fold_shapes".into()),
            ..OptimizeOptions::default()
        });
        let g = &mut self.model.graph;
        let inputs: Vec<_> = g
            .inputs
            .iter()
            .copied()
            .enumerate()
            .filter(|&(i, v)| i < n_inputs || !held.contains(&v))
            .map(|(_, v)| v)
            .collect();
        g.inputs = inputs;
        r?;
        let mut out = opts.clone();
        let g = &self.model.graph;
        out.frozen.extend(
            floats(g)
                .iter()
                .map(|&v| g.name(v).to_string())
                .filter(|n| !before.contains(n)),
        );
        Ok(out)
    }
}

/// One gradient checked against finite differences.
#[derive(Clone, Debug, Serialize)]
pub struct GradCheck {
    /// The parameter or input.
    pub name: String,
    /// Elements checked.
    pub elements: usize,
    /// `‖g - fd‖₂ / max(‖fd‖₂, 1e-6)` over the checked elements.
    pub rel_l2: f64,
    pub max_abs: f64,
}

/// A tensor's elements as `f64`, in row-major order.
pub fn tensor_f64s(t: &TractTensor) -> Result<Vec<f64>> {
    let c = t.cast_to::<f64>().map_err(|e| Error::new(e.to_string()))?;
    let a = c
        .to_plain_array_view::<f64>()
        .map_err(|e| Error::new(e.to_string()))?;
    Ok(a.iter().copied().collect())
}

fn run(model: &Model, inputs: &[TractTensor]) -> Result<Vec<TractTensor>> {
    let bytes = graphopt_tract::prepare(model)?;
    Ok(graphopt_tract::run_bytes(&bytes, inputs)?)
}

/// Checks a training graph's gradients (outputs `1..`, named
/// `<name>_grad`) of `names` against central differences
/// `(loss(θ + h) - loss(θ - h)) / 2h` of its own `loss` (output 0), for the
/// `max_elements` entries of each with the largest analytic gradient
/// (embedding gradients are mostly zeros; ties go to the first). `names` are float
/// initializers or runtime graph inputs (`inputs` in graph-input order).
/// Float and double tensors keep their type: a double model is checked in
/// double (as `torch.autograd.gradcheck` does, with a small `h`).
/// Returns the loss and one [`GradCheck`] per name.
pub fn grad_check(
    train: &Model,
    names: &[String],
    inputs: &[TractTensor],
    h: f64,
    max_elements: usize,
) -> Result<(f64, Vec<GradCheck>)> {
    let g = &train.graph;
    let outs = run(train, inputs)?;
    let loss = tensor_f64s(&outs[0])?[0];
    let runtime: Vec<_> = g.runtime_inputs().collect();
    let mut checks = Vec::new();
    for name in names {
        let gi = g
            .outputs
            .iter()
            .position(|&o| g.name(o) == format!("{name}_grad"))
            .ok_or_else(|| Error::new(format!("no output {name}_grad")))?;
        let analytic = tensor_f64s(&outs[gi])?;
        let v = g
            .value_by_name(name)
            .ok_or_else(|| Error::new(format!("no value {name}")))?;
        let mut order: Vec<usize> = (0..analytic.len()).collect();
        order.sort_by(|&a, &b| {
            analytic[b]
                .abs()
                .total_cmp(&analytic[a].abs())
                .then(a.cmp(&b))
        });
        order.truncate(max_elements);
        let (mut num, mut den, mut max_abs, mut count) = (0f64, 0f64, 0f64, 0);
        for j in order {
            let mut f = [0f64; 2];
            for (k, sign) in [1f64, -1.0].into_iter().enumerate() {
                let mut m = train.clone();
                let mut ins = inputs.to_vec();
                if let Some(t) = g.initializer(v) {
                    let mut vals = t
                        .to_f64_vec()
                        .ok_or_else(|| Error::new(format!("{name} is not numeric")))?;
                    let dims = t.dims.clone();
                    let t = if t.dtype == graphopt_ir::DType::F64 {
                        vals[j] += sign * h;
                        let raw: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
                        Tensor::from_raw(graphopt_ir::DType::F64, dims, raw.into())?
                    } else {
                        let mut v32: Vec<f32> = vals.into_iter().map(|x| x as f32).collect();
                        v32[j] += (sign * h) as f32;
                        Tensor::from_f32(dims, &v32)?
                    };
                    m.graph.set_initializer(v, t);
                } else {
                    let i = runtime
                        .iter()
                        .position(|&r| r == v)
                        .ok_or_else(|| Error::new(format!("{name} is not an input")))?;
                    let mut vals = tensor_f64s(&ins[i])?;
                    vals[j] += sign * h;
                    let shape = ins[i].shape().to_vec();
                    ins[i] = if ins[i].datum_type() == tract_onnx::prelude::DatumType::F64 {
                        TractTensor::from_shape(&shape, &vals)
                    } else {
                        let v32: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
                        TractTensor::from_shape(&shape, &v32)
                    }
                    .map_err(|e| Error::new(e.to_string()))?;
                }
                f[k] = tensor_f64s(&run(&m, &ins)?[0])?[0];
            }
            let fd = (f[0] - f[1]) / (2.0 * h);
            let d = analytic[j] as f64 - fd;
            num += d * d;
            den += fd * fd;
            max_abs = max_abs.max(d.abs());
            count += 1;
        }
        checks.push(GradCheck {
            name: name.clone(),
            elements: count,
            rel_l2: num.sqrt() / den.sqrt().max(1e-6),
            max_abs,
        });
    }
    Ok((loss, checks))
}

/// Pairs of trainable 2-D float parameters where one holds exactly the
/// other's values transposed (bit for bit, and not one value throughout):
/// a tie that the TorchScript exporter's constant folding split, writing
/// `Transpose(E)` (GPT-2's and BERT's LM heads, over their embeddings) as
/// a second initializer. Compared from the first element on, so unequal
/// pairs cost one comparison.
fn transposed_copies(g: &graphopt_ir::Graph, params: &[String]) -> Vec<(String, String)> {
    let mats: Vec<(&String, &Tensor)> = params
        .iter()
        .filter_map(|p| {
            let t = g.initializer(g.value_by_name(p)?)?;
            (t.dims.len() == 2 && t.dtype.is_float() && t.raw().is_some()).then_some((p, t))
        })
        .collect();
    let mut out = Vec::new();
    for (i, &(pa, a)) in mats.iter().enumerate() {
        for &(pb, b) in &mats[i + 1..] {
            if a.dtype == b.dtype
                && a.dims[0] == b.dims[1]
                && a.dims[1] == b.dims[0]
                && transposed(a, b)
            {
                out.push((pa.clone(), pb.clone()));
            }
        }
    }
    out
}

/// Whether 2-D `b` is `a` transposed, bit for bit, with `a` not one value
/// throughout (zeros and ones are equal to their transposes by chance).
fn transposed(a: &Tensor, b: &Tensor) -> bool {
    let (Some(ab), Some(bb)) = (a.raw(), b.raw()) else {
        return false;
    };
    let (r, c) = (a.dims[0] as usize, a.dims[1] as usize);
    let es = ab.len() / (r * c).max(1);
    if es == 0 || ab.len() != bb.len() || ab.chunks(es).all(|x| x == &ab[..es]) {
        return false;
    }
    (0..r).all(|i| (0..c).all(|j| ab[(i * c + j) * es..][..es] == bb[(j * r + i) * es..][..es]))
}
