//! The training step: its graphs (fused, or gradients and update for
//! micro-batches), planned and bound to the runtime.

use super::data::{batch_dims, slice_rows, DataSource};
use super::dist::{Layout, SHARD};
use super::{State, TrainOptions};
use crate::distributed::{Collective, Scheme};
use crate::error::{Error, Result};
use crate::grad::{GradOptions, Loss};
use crate::remat::{Budget, RematOptions, RematReport};
use crate::session::Session;
use graphopt_autodiff::{GradOptions as AutodiffOptions, Optimizer};
use graphopt_exec::{CpuBackend, Executable, HostTensor};
use graphopt_ir::{DType, Model, Tensor};
use graphopt_plan::{human_bytes, DimValues, PlanOptions};
use std::ops::Range;
use std::time::Instant;

/// A reduction in flight: the range of the flat gradient vector it sums.
type Reduction = (Range<usize>, Box<dyn crate::distributed::Pending>);

/// What starts a bucket's reductions: the bucket's range and its values.
type StartReductions<'a> = &'a dyn Fn(Range<usize>, &[f32]) -> Vec<Reduction>;

pub(super) fn has_dropout(g: &graphopt_ir::Graph) -> bool {
    g.nodes().any(|n| {
        let d = g.node(n);
        d.op_type == "Dropout" || d.attributes.iter().any(|a| a.graphs().any(has_dropout))
    })
}

pub(super) fn host_of(t: &Tensor, name: &str) -> Result<HostTensor> {
    let data = t.raw().ok_or_else(|| {
        Error::new(format!(
            "initializer '{name}': its data is not loaded (external data?)"
        ))
    })?;
    Ok(HostTensor {
        dtype: t.dtype,
        shape: t.dims.iter().map(|&d| d as usize).collect(),
        data: data.to_vec(),
    })
}

/// The training graphs a run may need, each built once: the fused step
/// (gradients and the update in one graph), the gradients alone, and the
/// update alone (micro-batches).
pub(super) struct StepGraphs {
    pub(super) opts: AutodiffOptions,
    pub(super) fused: Option<(Model, Vec<String>, State)>,
    pub(super) grads: Option<(Model, Vec<String>, State)>,
    pub(super) update: Option<(Model, State)>,
    pub(super) warnings: Vec<String>,
    /// The ranks' scheme, this rank and how many ranks (`Dp, 0, 1` for one
    /// process).
    pub(super) ranks: (Scheme, usize, usize),
    /// Gradients and update as two graphs even without micro-batches (a
    /// distributed run sums the gradients between them).
    pub(super) split: bool,
    /// Bytes of a gradient bucket (see [`TrainOptions::bucket_bytes`]).
    pub(super) bucket_bytes: u64,
}

impl StepGraphs {
    pub(super) fn new(session: &Session, opts: &TrainOptions, optimizer: Optimizer) -> StepGraphs {
        StepGraphs {
            opts: AutodiffOptions {
                output: opts.output.clone(),
                loss: opts.loss,
                class_axis: opts.class_axis,
                trainable: opts.trainable.clone(),
                frozen: opts.frozen.clone(),
                optimizer,
                params_as_inputs: true,
                // Only where there is a Dropout to switch (else grad warns
                // that the option changed nothing).
                dropout_train: opts.dropout_train && has_dropout(&session.model.graph),
                ..AutodiffOptions::default()
            },
            fused: None,
            grads: None,
            update: None,
            warnings: Vec::new(),
            ranks: (Scheme::Dp, 0, 1),
            split: false,
            bucket_bytes: opts.bucket_bytes,
        }
    }

    /// [`grad_graph`], keeping its warnings.
    pub(super) fn build(
        &mut self,
        model: &Model,
        opts: AutodiffOptions,
        dims: &DimValues,
    ) -> Result<(Model, Vec<String>, State)> {
        let (m, params, state, warnings) = grad_graph(model, opts, dims)?;
        self.warn(warnings);
        Ok((m, params, state))
    }

    fn warn(&mut self, warnings: Vec<String>) {
        for w in warnings {
            if !self.warnings.contains(&w) {
                self.warnings.push(w);
            }
        }
    }

    /// The step for `micro` micro-batches, planned for `first`'s shapes.
    /// With `recompute`, the graph that holds the batch (the fused step,
    /// or the gradients') is first rewritten by [`Session::remat`] so that
    /// the planner's lower bound of its peak is at most that many bytes.
    pub(super) fn stepper(
        &mut self,
        session: &Session,
        first: &State,
        micro: usize,
        data: &dyn DataSource,
        recompute: Option<u64>,
    ) -> Result<Stepper> {
        let batch = first.values().next().map_or(0, |t| t.shape[0]);
        if micro == 0 || !batch.is_multiple_of(micro) {
            return Err(Error::new(format!(
                "--micro-batches {micro}: the batch of {batch} does not split into {micro} equal micro-batches"
            )));
        }
        let rows = batch / micro;
        let dims = batch_dims(first, rows);
        if micro == 1 && !self.split {
            if self.fused.is_none() {
                let built = self.build(&session.model, self.opts.clone(), &dims)?;
                self.fused = Some(built);
            }
            let (m, params, state) = self.fused.as_ref().expect("built");
            let (rewritten, remat) = recomputed(session, m, &dims, recompute)?;
            let fused = Bound::new(session, rewritten.as_ref().unwrap_or(m), &dims, first, data)?;
            return Ok(Stepper {
                remat,
                micro,
                fused: Some(fused),
                grads: None,
                update: None,
                params: params.clone(),
                held_bytes: state_bytes(state),
                layout: None,
                mean: self.opts.loss != Loss::Sum,
                restore: None,
                comm_s: 0.0,
                bucket_bytes: self.bucket_bytes,
                buckets: (0, 0),
            });
        }
        if self.grads.is_none() {
            let opts = AutodiffOptions {
                optimizer: Optimizer::None,
                ..self.opts.clone()
            };
            let built = self.build(&session.model, opts, &dims)?;
            self.grads = Some(built);
        }
        let (_, params, gstate) = self.grads.as_ref().expect("built");
        let params = params.clone();
        let (scheme, rank, ranks) = self.ranks;
        let layout = Layout::new(scheme, rank, ranks, &params, gstate)?;
        if self.update.is_none() {
            // Under zero1/zero2 the update steps this rank's slice of the
            // flat parameters, as one parameter.
            let built = if layout.sharded() {
                let mut slice = State::new();
                slice.insert(
                    SHARD.to_string(),
                    HostTensor::from_f32(&[layout.shard], &vec![0.0; layout.shard]),
                );
                update_graph(&[SHARD.to_string()], &slice, &self.opts)?
            } else {
                update_graph(&params, gstate, &self.opts)?
            };
            self.warn(built.2);
            self.update = Some((built.0, built.1));
        }
        let (gm, _, gstate) = self.grads.as_ref().expect("built");
        let (um, ustate) = self.update.as_ref().expect("built");
        let (rewritten, remat) = recomputed(session, gm, &dims, recompute)?;
        let grads = Bound::new(
            session,
            rewritten.as_ref().unwrap_or(gm),
            &dims,
            first,
            data,
        )?;
        let update = Bound::new(session, um, &DimValues::default(), &State::new(), data)?;
        Ok(Stepper {
            micro,
            fused: None,
            grads: Some(grads),
            update: Some(update),
            held_bytes: state_bytes(gstate) + state_bytes(ustate),
            layout: Some(layout),
            params,
            mean: self.opts.loss != Loss::Sum,
            restore: None,
            comm_s: 0.0,
            bucket_bytes: self.bucket_bytes,
            buckets: (0, 0),
            remat,
        })
    }

    /// The step for `opts`: `opts.micro_batches` of them, or under
    /// `opts.budget` the largest micro-batch whose planned bytes fit,
    /// where each count that does not fit as it is first gets
    /// recomputation (with `opts.remat`), aimed at the bytes missing and
    /// tightened by what the real plan still misses, at most
    /// [`REMAT_TRIES`] plans; or the whole batch. The error of a budget
    /// nothing meets lists what each count needed.
    pub(super) fn fit(
        &mut self,
        session: &Session,
        first: &State,
        data: &dyn DataSource,
        opts: &TrainOptions,
    ) -> Result<Stepper> {
        let counts: Vec<usize> = match (opts.micro_batches, opts.budget) {
            (Some(m), _) => vec![m],
            (None, None) => vec![1],
            (None, Some(_)) => (1..=opts.batch)
                .filter(|m| opts.batch.is_multiple_of(*m))
                .collect(),
        };
        let mut chosen: Option<Stepper> = None;
        let mut tried: Vec<String> = Vec::new();
        for m in counts {
            let s = self.stepper(session, first, m, data, None)?;
            let need = s.planned_bytes();
            let Some(budget) = opts.budget.filter(|&b| need > b) else {
                chosen = Some(s);
                break;
            };
            let shape = format!("{} x {}", m, opts.batch / m);
            tried.push(format!("{shape}: {}", human_bytes(need)));
            if !opts.remat {
                continue;
            }
            // Recomputation lowers the arena of the graph holding the
            // batch: aim its lower bound at the excess below today's,
            // then tighten by what the real plan still misses.
            let mut lower_bound = s.batch_lower_bound().saturating_sub(need - budget);
            drop(s);
            let mut planned = None;
            for _ in 0..REMAT_TRIES {
                if lower_bound == 0 {
                    tried.push(format!(
                        "{shape} with recomputation: the step's other bytes alone exceed the budget"
                    ));
                    break;
                }
                match self.stepper(session, first, m, data, Some(lower_bound)) {
                    Ok(r) if r.planned_bytes() <= budget => {
                        chosen = Some(r);
                        break;
                    }
                    Ok(r) => {
                        let miss = r.planned_bytes() - budget;
                        lower_bound = r.batch_lower_bound().saturating_sub(miss);
                        planned = Some(r.planned_bytes());
                    }
                    // Recomputation that cannot reach the budget, or fails
                    // here, leaves the next micro-batch count to try.
                    Err(e) => {
                        tried.push(format!("{shape} with recomputation: {e}"));
                        planned = None;
                        break;
                    }
                }
            }
            if let (None, Some(p)) = (&chosen, planned) {
                tried.push(format!(
                    "{shape} with recomputation: {} after {REMAT_TRIES} plans",
                    human_bytes(p)
                ));
            }
            if chosen.is_some() {
                break;
            }
        }
        chosen.ok_or_else(|| {
            Error::budget(format!(
                "--budget {}: no micro-batch fits (micro-batches x examples: {})",
                human_bytes(opts.budget.unwrap_or(0)),
                tried.join(", ")
            ))
        })
    }

    /// The parameters and optimizer state before the first step, for the
    /// step of `micro` micro-batches, moved out (held once). The graphs of
    /// the other kind, built while a budget was tried, go with their state.
    pub(super) fn take_state(&mut self, micro: usize) -> State {
        if micro == 1 && !self.split {
            self.grads = None;
            self.update = None;
            return self
                .fused
                .as_mut()
                .map(|f| std::mem::take(&mut f.2))
                .unwrap_or_default();
        }
        self.fused = None;
        let mut state = self
            .grads
            .as_mut()
            .map(|g| std::mem::take(&mut g.2))
            .unwrap_or_default();
        if let Some(u) = self.update.as_mut() {
            state.append(&mut u.1);
        }
        state
    }
}

/// Plans tried per micro-batch count when recomputation aims at a budget.
pub(super) const REMAT_TRIES: usize = 3;

/// `model` rewritten by [`Session::remat`] to a planner lower bound of at
/// most `budget` bytes at `dims` (`None, None` without a budget).
fn recomputed(
    session: &Session,
    model: &Model,
    dims: &DimValues,
    budget: Option<u64>,
) -> Result<(Option<Model>, Option<RematReport>)> {
    let Some(budget) = budget else {
        return Ok((None, None));
    };
    let mut s = Session::from_model(model.clone());
    s.source = session.source.clone();
    let r = s.remat(&RematOptions {
        budget: Budget::Bytes(budget),
        dims: dims.clone(),
        ..RematOptions::default()
    })?;
    Ok((Some(s.into_model()), Some(r)))
}

/// Bytes of `state`.
pub(super) fn state_bytes(state: &State) -> u64 {
    state.values().map(|t| t.data.len() as u64).sum()
}

/// `Session::grad` of `model` with `opts` at `dims`: the graph (the
/// gradients are outputs only without an optimizer), its trainable
/// parameters, their values with the optimizer's initial state, and
/// `grad`'s warnings. Each value is copied out of the model once, and the
/// model file's pages under it, read to make the copy, go back (see
/// `graphopt_onnx::release_resident`; a value not from a file is left
/// alone).
pub(super) fn grad_graph(
    model: &Model,
    opts: AutodiffOptions,
    dims: &DimValues,
) -> Result<(Model, Vec<String>, State, Vec<String>)> {
    let mut s = Session::from_model(model.clone());
    let r = s.grad(&GradOptions {
        autodiff: opts,
        dims: dims.clone(),
        ..GradOptions::default()
    })?;
    let mut state = State::new();
    for (name, t) in &r.initial_state {
        state.insert(name.clone(), host_of(t, name)?);
        if let Some(b) = t.raw() {
            graphopt_onnx::release_resident(b);
        }
    }
    Ok((s.into_model(), r.params, state, r.warnings))
}

/// The optimizer of `base` stepping `params` (their values in `values`)
/// as a graph of its own ([`update_model`] through [`grad_graph`]): the
/// graph, the optimizer's initial state (the parameters' values left out:
/// they are the gradient graph's) and `grad`'s warnings.
pub(super) fn update_graph(
    params: &[String],
    values: &State,
    base: &AutodiffOptions,
) -> Result<(Model, State, Vec<String>)> {
    let um = update_model(params, values)?;
    let opts = AutodiffOptions {
        output: None,
        loss: Loss::Sum,
        trainable: params.to_vec(),
        frozen: Vec::new(),
        dropout_train: false,
        input_grads: false,
        params_as_inputs: true,
        ..base.clone()
    };
    let (m, _, mut state, warnings) = grad_graph(&um, opts, &DimValues::default())?;
    state.retain(|k, _| !params.contains(k));
    Ok((m, state, warnings))
}

/// The optimizer's update alone, as a model the gradient builder turns into
/// a training step: for each parameter `p` a graph input `p__grad` (the
/// accumulated gradient), and `y = Σ ReduceSum(p · p__grad)`, whose gradient
/// with respect to `p` is exactly `p__grad`. The update the builder then
/// emits is the one the fused step has, applied to the given gradient.
pub(super) fn update_model(params: &[String], state: &State) -> Result<Model> {
    use graphopt_ir::{Graph, Shape, Type};
    let mut g = Graph::new("update");
    let mut pairs = Vec::new();
    for p in params {
        let t = state
            .get(p)
            .ok_or_else(|| Error::new(format!("parameter '{p}' has no value")))?;
        let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        let ty = Type::tensor(t.dtype, Some(Shape::known(&dims)));
        let pv = g.fresh_value(p, Some(ty.clone()));
        let tensor = Tensor::from_raw(t.dtype, dims, t.data.clone().into())
            .map_err(|e| Error::new(format!("parameter '{p}': {e}")))?;
        g.set_initializer(pv, tensor);
        let gv = g.fresh_value(&grad_input(p), Some(ty));
        g.inputs.push(gv);
        pairs.push((pv, gv, p.clone()));
    }
    let sum = dot_sum(&mut g, &pairs, "update__total")?;
    let y = sum.ok_or_else(|| Error::new("no trainable parameters"))?;
    g.outputs.push(y);
    Ok(Model::new(g, 17))
}

/// `Σ ReduceSum(a · b)` over `pairs` (`(a, b, hint)`: the nodes' values are
/// named `<hint>__prod` and `<hint>__sum`), one scalar whose gradient with
/// respect to each `a` is its `b`; `None` without pairs.
pub(super) fn dot_sum(
    g: &mut graphopt_ir::Graph,
    pairs: &[(graphopt_ir::ValueId, graphopt_ir::ValueId, String)],
    total: &str,
) -> Result<Option<graphopt_ir::ValueId>> {
    use graphopt_ir::NewNode;
    let mut sum = None;
    for (a, b, hint) in pairs {
        let prod = g.fresh_value(&format!("{hint}__prod"), None);
        g.add_node(NewNode::new("Mul").inputs(&[*a, *b]).outputs(&[prod]))?;
        let r = g.fresh_value(&format!("{hint}__sum"), None);
        g.add_node(
            NewNode::new("ReduceSum")
                .inputs(&[prod])
                .outputs(&[r])
                .attr(graphopt_ir::Attribute::new(
                    "keepdims",
                    graphopt_ir::AttrValue::Int(0),
                )),
        )?;
        sum = Some(match sum {
            None => r,
            Some(s) => {
                let t = g.fresh_value(total, None);
                g.add_node(NewNode::new("Add").inputs(&[s, r]).outputs(&[t]))?;
                t
            }
        });
    }
    Ok(sum)
}

/// The update graph's input for parameter `p`'s accumulated gradient.
pub(super) fn grad_input(p: &str) -> String {
    format!("{p}__grad")
}

/// A graph planned for one batch size and bound to the CPU runtime.
pub(super) struct Bound {
    pub(super) exe: Executable,
    pub(super) inputs: Vec<(String, graphopt_exec::TensorInfo)>,
    pub(super) outputs: Vec<String>,
    /// Inputs that a donated output overwrites (the plan's donations).
    pub(super) donated: Vec<String>,
    /// The donated inputs' values live in the arena (after a kept run);
    /// the host's copies are gone.
    pub(super) kept: bool,
    /// The planner's lower bound of the arena (the peak of live bytes).
    pub(super) lower_bound: u64,
}

impl Bound {
    /// Plans `model` at `dims`; checks that `first` (a batch of the size
    /// planned for, or nothing) has each data input's type and shape.
    pub(super) fn new(
        session: &Session,
        model: &Model,
        dims: &DimValues,
        first: &State,
        data: &dyn DataSource,
    ) -> Result<Bound> {
        let planned = graphopt_plan::plan_model(model, dims, &PlanOptions::default())
            .map_err(|e| session.err(e))?;
        let exe = Executable::new(&planned.model, &planned.plan, &CpuBackend)
            .map_err(|e| Error::runtime(e.to_string()))?;
        let inputs = exe.input_infos();
        let rows = dims.shapes.first().and_then(|s| s.1.first().copied());
        for (name, info) in &inputs {
            let Some(t) = first.get(name) else { continue };
            let mut shape = t.shape.clone();
            if let Some(r) = rows {
                shape[0] = r as usize;
            }
            if t.dtype != info.dtype || shape != info.shape {
                return Err(Error::new(format!(
                    "{}: array '{name}' is {}{:?} per batch, the model's input '{name}' wants {}{:?}",
                    data.label(),
                    t.dtype.name(),
                    shape,
                    info.dtype.name(),
                    info.shape
                )));
            }
        }
        let outputs = exe.output_names();
        let donated = exe.donated_pairs().into_iter().map(|(i, _)| i).collect();
        Ok(Bound {
            lower_bound: planned.plan.lower_bound_bytes,
            exe,
            inputs,
            outputs,
            donated,
            kept: false,
        })
    }

    /// A training step that keeps the donated state in the arena: the
    /// first run takes it from `state` (whose copies of it are then
    /// dropped), later runs leave it where the previous run wrote it. The
    /// other outputs come back (`None` for the donated ones).
    pub(super) fn run_kept(
        &mut self,
        state: &mut State,
        batch: &State,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<Vec<Option<HostTensor>>> {
        if !self.kept {
            // Hand the donated state to the arena one tensor at a time,
            // dropping each host copy at once: the state is never held
            // twice, not even for the first step.
            for name in &self.donated {
                if let Some(t) = state.remove(name) {
                    self.exe
                        .write_input(name, &t)
                        .map_err(|e| Error::runtime(e.to_string()))?;
                }
            }
            self.kept = true;
        }
        let feed = self
            .inputs
            .iter()
            .map(|(name, _)| {
                if self.kept && self.donated.contains(name) {
                    return Ok(None);
                }
                state
                    .get(name)
                    .or_else(|| batch.get(name))
                    .map(Some)
                    .ok_or_else(|| Error::new(format!("no value for the step's input '{name}'")))
            })
            .collect::<Result<Vec<_>>>()?;
        let (outs, _) = self
            .exe
            .run_donated(&feed, ropts)
            .map_err(|e| Error::runtime(e.to_string()))?;
        Ok(outs)
    }

    /// `state` with the values the arena holds for it.
    pub(super) fn snapshot(&self, state: &State) -> State {
        let mut all = state.clone();
        if self.kept {
            for name in &self.donated {
                if let Some(t) = self.exe.read_input(name) {
                    all.insert(name.clone(), t);
                }
            }
        }
        all
    }

    /// [`Bound::snapshot`] for the last time: each value is taken out of
    /// the arena as it is copied (its pages handed back), so the state is
    /// not held twice.
    pub(super) fn take(&mut self, mut state: State) -> State {
        if self.kept {
            self.exe.release_scratch();
            for name in &self.donated {
                if let Some(t) = self.exe.take_input(name) {
                    state.insert(name.clone(), t);
                }
            }
            self.kept = false;
        }
        state
    }

    pub(super) fn at(&self, name: &str) -> Result<usize> {
        self.outputs
            .iter()
            .position(|o| o == name)
            .ok_or_else(|| Error::new(format!("the training graph has no '{name}' output")))
    }

    /// The inputs, in order, looked up in `state`, then in `batch`.
    fn feed<'a>(&self, state: &'a State, batch: &'a State) -> Result<Vec<&'a HostTensor>> {
        self.inputs
            .iter()
            .map(|(name, _)| {
                state
                    .get(name)
                    .or_else(|| batch.get(name))
                    .ok_or_else(|| Error::new(format!("no value for the step's input '{name}'")))
            })
            .collect()
    }

    /// Runs on `state` and `batch` (looked up by input name).
    pub(super) fn run(
        &mut self,
        state: &State,
        batch: &State,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<Vec<HostTensor>> {
        let feed = self.feed(state, batch)?;
        let (outs, _) = self
            .exe
            .run_borrowed(&feed, ropts)
            .map_err(|e| Error::runtime(e.to_string()))?;
        Ok(outs)
    }

    /// [`Bound::run`], calling `after` after each step of the schedule
    /// (see [`Executable::run_observed`]).
    pub(super) fn run_observed(
        &mut self,
        state: &State,
        batch: &State,
        ropts: &graphopt_exec::RunOptions,
        after: &mut graphopt_exec::StepObserver,
    ) -> Result<Vec<HostTensor>> {
        let feed = self.feed(state, batch)?;
        let (outs, _) = self
            .exe
            .run_observed(&feed, ropts, after)
            .map_err(|e| Error::runtime(e.to_string()))?;
        Ok(outs)
    }

    /// The `<name>_new` outputs into `state`.
    pub(super) fn feed_back(&self, outs: Vec<HostTensor>, state: &mut State) {
        for (o, t) in self.outputs.iter().zip(outs) {
            if let Some(s) = o.strip_suffix("_new") {
                if state.contains_key(s) {
                    state.insert(s.to_string(), t);
                }
            }
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        self.exe.arena_planned_bytes() + self.exe.workspace_bytes()
    }
}

pub(super) fn scalar_of(t: &HostTensor) -> f64 {
    t.to_f32()
        .and_then(|v| v.first().copied())
        .map(f64::from)
        .unwrap_or(f64::NAN)
}

/// One training step: the fused graph, or `micro` gradient runs summed and
/// one update.
pub(super) struct Stepper {
    pub(super) micro: usize,
    pub(super) fused: Option<Bound>,
    pub(super) grads: Option<Bound>,
    pub(super) update: Option<Bound>,
    pub(super) params: Vec<String>,
    /// Bytes of the parameters and optimizer state.
    pub(super) held_bytes: u64,
    /// Where the gradients of a split step sum (`None` for the fused one).
    pub(super) layout: Option<Layout>,
    /// The loss is a mean over the batch (the micro-batches' gradients are
    /// averaged), not a sum.
    pub(super) mean: bool,
    /// Kept state an eval overwrote, to give back before the next step.
    pub(super) restore: Option<State>,
    /// What recomputation did to the graph holding the batch, if it ran.
    pub(super) remat: Option<RematReport>,
    /// Seconds spent in collectives.
    pub(super) comm_s: f64,
    /// Gradient buckets of the all-reduce (dp, zero1 on several ranks).
    pub(super) bucket_bytes: u64,
    /// Buckets of the last step, and how many of them started before the
    /// gradients' graph finished.
    pub(super) buckets: (usize, usize),
}

impl Stepper {
    /// The parameters and optimizer state as they are now: `state` with
    /// what the fused step keeps in its arena.
    pub(super) fn snapshot(&self, state: &State) -> State {
        let mut all = match &self.fused {
            Some(f) => f.snapshot(state),
            None => state.clone(),
        };
        if let Some(r) = &self.restore {
            all.extend(r.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        all
    }

    /// [`Stepper::snapshot`] with the optimizer state per parameter, as
    /// one process holds it (gathered from the ranks under zero1/zero2):
    /// what a checkpoint stores. Every rank must call it.
    pub(super) fn whole_state(&self, state: &State, comm: &dyn Collective) -> Result<State> {
        match self.layout.as_ref().filter(|l| l.sharded()) {
            Some(l) => l.gather_state(comm, state),
            None => Ok(self.snapshot(state)),
        }
    }

    /// [`Stepper::snapshot`] at the end of a run, taking the kept state out
    /// of the arena rather than copying it.
    pub(super) fn take_state(&mut self, state: State) -> State {
        let mut all = match &mut self.fused {
            Some(f) => f.take(state),
            None => state,
        };
        if let Some(r) = self.restore.take() {
            all.extend(r);
        }
        all
    }

    /// Donated bytes: parameters and state held once, in the arena.
    pub(super) fn donated_bytes(&self) -> u64 {
        self.fused.as_ref().map_or(0, |f| f.exe.donated_bytes())
    }
}

impl Stepper {
    /// Parameters, optimizer state, gradient accumulators (micro-batches)
    /// and every graph's arena and workspace.
    pub(super) fn planned_bytes(&self) -> u64 {
        let held = self.held_bytes;
        let acc = self.gradient_bytes();
        // Donated state lives in the arena: counted there, not twice.
        held.saturating_sub(self.donated_bytes())
            + acc
            + self.arena_bytes()
            + self.workspace_bytes()
    }

    /// Bytes of the gradient accumulator of a split step: the flat
    /// vector, or this rank's slice of it (zero2).
    pub(super) fn gradient_bytes(&self) -> u64 {
        self.layout
            .as_ref()
            .map_or(0, |l| l.accumulator_len() as u64 * 4)
    }

    /// The planner's lower bound of the graph that holds the batch.
    pub(super) fn batch_lower_bound(&self) -> u64 {
        self.fused
            .as_ref()
            .or(self.grads.as_ref())
            .map_or(0, |b| b.lower_bound)
    }

    pub(super) fn bounds(&self) -> impl Iterator<Item = &Bound> {
        self.fused.iter().chain(&self.grads).chain(&self.update)
    }

    pub(super) fn arena_bytes(&self) -> u64 {
        self.bounds().map(|b| b.exe.arena_planned_bytes()).sum()
    }

    pub(super) fn workspace_bytes(&self) -> u64 {
        self.bounds()
            .map(|b| b.bytes() - b.exe.arena_planned_bytes())
            .sum()
    }

    /// One step on `batch` (this rank's rows of it); returns the loss of
    /// the whole batch (every rank's).
    pub(super) fn step(
        &mut self,
        batch: &State,
        state: &mut State,
        ropts: &graphopt_exec::RunOptions,
        comm: &dyn Collective,
    ) -> Result<f64> {
        if let Some(f) = &mut self.fused {
            if let Some(back) = self.restore.take() {
                // An eval ran the step's graph over the kept state: give
                // it back before stepping on.
                state.extend(back);
                f.kept = false;
            }
            let outs = f.run_kept(state, batch, ropts)?;
            let loss = outs[f.at("loss")?].as_ref().map_or(f64::NAN, scalar_of);
            let outs: Vec<HostTensor> = outs
                .into_iter()
                .map(|o| {
                    o.unwrap_or(HostTensor {
                        dtype: DType::F32,
                        shape: Vec::new(),
                        data: Vec::new(),
                    })
                })
                .collect();
            let donated = f.donated.clone();
            for (o, t) in f.outputs.iter().zip(outs) {
                if let Some(name) = o.strip_suffix("_new") {
                    if state.contains_key(name) && !donated.iter().any(|d| d == name) {
                        state.insert(name.to_string(), t);
                    }
                }
            }
            return Ok(loss);
        }
        let (Some(g), Some(u), Some(l)) = (&mut self.grads, &mut self.update, &self.layout) else {
            return Err(Error::new("no step graph"));
        };
        let rows = batch.values().next().map_or(0, |t| t.shape[0]) / self.micro;
        let comm_err = |e: crate::distributed::CommError| Error::runtime(e.0);
        // 1. The micro-batches' gradients summed into the flat vector (or,
        //    under zero2, each micro-batch's reduce-scattered into this
        //    rank's slice). Gradients are reduced bucket by bucket as the
        //    backward pass completes each (on MPI's thread, while the pass
        //    goes on): zero2 reduces each micro-batch's, every piece of a
        //    bucket to the rank whose slice holds it; dp and zero1, on
        //    several ranks, all-reduce the last micro-batch's (one process
        //    accumulating micro-batches has nothing to reduce).
        let mut acc = vec![0f32; l.accumulator_len()];
        let mut whole = if l.scheme == Scheme::Zero2 {
            vec![0f32; l.padded()]
        } else {
            Vec::new()
        };
        let mut losses = Vec::with_capacity(self.micro);
        let overlap = l.ranks > 1;
        let all_reduce = |range: Range<usize>, v: &[f32]| -> Vec<Reduction> {
            vec![(range, comm.all_reduce_sum_start(v.to_vec()))]
        };
        let to_owners = |range: Range<usize>, v: &[f32]| -> Vec<Reduction> {
            if l.shard == 0 {
                return Vec::new(); // no parameter elements (on every rank)
            }
            (range.start / l.shard..range.end.div_ceil(l.shard))
                .map(|owner| {
                    let piece =
                        range.start.max(owner * l.shard)..range.end.min((owner + 1) * l.shard);
                    let at = piece.start - range.start..piece.end - range.start;
                    (piece, comm.reduce_sum_start(v[at].to_vec(), owner))
                })
                .collect()
        };
        let mut pending: Vec<Reduction> = Vec::new();
        for k in 0..self.micro {
            let micro = slice_rows(batch, k, rows);
            if l.scheme == Scheme::Zero2 {
                whole.iter_mut().for_each(|x| *x = 0.0);
                let (loss, buckets) = reduce_while_running(
                    g,
                    l,
                    self.bucket_bytes,
                    state,
                    &micro,
                    ropts,
                    &to_owners,
                    &mut whole,
                    &mut pending,
                )?;
                losses.push(loss);
                self.buckets = buckets;
                // This rank's pieces, summed over the ranks, into its slice.
                let t0 = Instant::now();
                let mine = l.mine();
                for (piece, p) in pending.drain(..) {
                    let sum = p.wait().map_err(comm_err)?;
                    if mine.contains(&piece.start) {
                        acc[piece.start - mine.start..piece.end - mine.start]
                            .iter_mut()
                            .zip(&sum)
                            .for_each(|(a, b)| *a += b);
                    }
                }
                self.comm_s += t0.elapsed().as_secs_f64();
                continue;
            }
            if overlap && k + 1 == self.micro {
                let (loss, buckets) = reduce_while_running(
                    g,
                    l,
                    self.bucket_bytes,
                    state,
                    &micro,
                    ropts,
                    &all_reduce,
                    &mut acc,
                    &mut pending,
                )?;
                losses.push(loss);
                self.buckets = buckets;
                continue;
            }
            let mut outs = g.run(state, &micro, ropts)?;
            losses.push(scalar_of(&outs[g.at("loss")?]) as f32);
            l.add_grads(&mut acc, &mut |p| {
                let i = g.at(&format!("{p}_grad"))?;
                Ok(std::mem::replace(
                    &mut outs[i],
                    HostTensor::from_f32(&[], &[0.0]),
                ))
            })?;
        }
        drop(whole);
        let t0 = Instant::now();
        // dp and zero1's all-reduces (zero2's are in already).
        for (range, p) in pending {
            let sum = p.wait().map_err(comm_err)?;
            acc[range].copy_from_slice(&sum);
        }
        // Every rank's losses, in rank order: the loss is summed as one
        // process would sum its micro-batches'.
        let mut all_losses = vec![0f32; losses.len() * l.ranks];
        comm.all_gather(&losses, &mut all_losses)
            .map_err(comm_err)?;
        self.comm_s += t0.elapsed().as_secs_f64();
        let loss: f64 = all_losses.iter().map(|&x| x as f64).sum();
        // A mean loss over the batch is the mean of the micro-batches'.
        let parts = self.micro * l.ranks;
        let scale = if self.mean { 1.0 / parts as f32 } else { 1.0 };
        acc.iter_mut().for_each(|x| *x *= scale);
        // 2. The update: of every parameter (dp, one process), or of this
        //    rank's slice, then the slices all-gathered.
        if !l.sharded() {
            let mut grads = State::new();
            for (p, off, shape) in &l.params {
                let n: usize = shape.iter().product();
                grads.insert(
                    grad_input(p),
                    HostTensor::from_f32(shape, &acc[*off..off + n]),
                );
            }
            drop(acc);
            let outs = u.run(state, &grads, ropts)?;
            u.feed_back(outs, state);
        } else {
            let mine = if l.scheme == Scheme::Zero2 {
                acc
            } else {
                acc[l.mine()].to_vec()
            };
            let mut slice = State::new();
            slice.insert(
                SHARD.to_string(),
                HostTensor::from_f32(&[l.shard], &l.flatten(state, "", l.mine())?),
            );
            slice.insert(grad_input(SHARD), HostTensor::from_f32(&[l.shard], &mine));
            drop(mine);
            let mut outs = u.run(state, &slice, ropts)?;
            let i = u.at(&format!("{SHARD}_new"))?;
            let new = std::mem::replace(&mut outs[i], HostTensor::from_f32(&[], &[0.0]))
                .to_f32()
                .ok_or_else(|| Error::new("the updated slice is not float32"))?;
            u.feed_back(outs, state);
            let t0 = Instant::now();
            let mut flat = vec![0f32; l.padded()];
            comm.all_gather(&new, &mut flat).map_err(comm_err)?;
            self.comm_s += t0.elapsed().as_secs_f64();
            l.unflatten(&flat, "", state);
        }
        Ok(if self.mean { loss / parts as f64 } else { loss })
    }

    /// The loss of `batch` (the size the loss graph was planned for), no
    /// update.
    pub(super) fn loss_only(
        &mut self,
        batch: &State,
        state: &State,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<f64> {
        if let Some(f) = &mut self.fused {
            // The step's graph writes its updates over the kept state:
            // run it on a copy, and give the state back before the next
            // step.
            // After the first eval batch the arena holds that batch's
            // update, not the state: what an earlier eval kept is laid
            // over it.
            let mut all = f.snapshot(state);
            if let Some(r) = &self.restore {
                all.extend(r.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            let outs = f.run(&all, batch, ropts)?;
            if f.kept && self.restore.is_none() {
                self.restore = Some(
                    f.donated
                        .iter()
                        .filter_map(|n| all.get(n).map(|t| (n.clone(), t.clone())))
                        .collect(),
                );
            }
            return Ok(scalar_of(&outs[f.at("loss")?]));
        }
        let b = self
            .grads
            .as_mut()
            .ok_or_else(|| Error::new("no step graph"))?;
        let outs = b.run(state, batch, ropts)?;
        Ok(scalar_of(&outs[b.at("loss")?]))
    }

    /// Examples per run of the loss graph.
    pub(super) fn loss_rows(&self, batch: usize) -> usize {
        batch / self.micro
    }
}

/// Runs the gradients' graph on a micro-batch, adding each parameter's
/// gradient into `acc` as soon as the step that makes it is done, and
/// starting the reductions `start` gives for each bucket of `acc` (see
/// [`Layout::buckets`]; an all-reduce of the bucket, or zero2's reduction
/// of each piece to its owner) once all its gradients are in: they go on
/// while the rest of the backward pass runs. Buckets whose gradients are
/// only complete at the end start then, in bucket order (the same calls in
/// the same order on every rank: the schedule is the same). Returns the
/// micro-batch's loss, and the buckets and how many of them started before
/// the graph finished.
#[allow(clippy::too_many_arguments)]
fn reduce_while_running(
    g: &mut Bound,
    l: &Layout,
    bucket_bytes: u64,
    state: &State,
    micro: &State,
    ropts: &graphopt_exec::RunOptions,
    start: StartReductions,
    acc: &mut [f32],
    pending: &mut Vec<Reduction>,
) -> Result<(f32, (usize, usize))> {
    let buckets = l.buckets(bucket_bytes);
    let ready = g.exe.output_ready_steps();
    // Per parameter: its gradient's output, and its bucket.
    let mut out_of = Vec::with_capacity(l.params.len());
    let mut bucket_of = vec![0usize; l.params.len()];
    for (b, (_, ps)) in buckets.iter().enumerate() {
        for &p in ps {
            bucket_of[p] = b;
        }
    }
    let mut at_step: std::collections::HashMap<usize, Vec<usize>> = Default::default();
    for (pi, (p, _, _)) in l.params.iter().enumerate() {
        let o = g.at(&format!("{p}_grad"))?;
        out_of.push(o);
        if let Some(si) = ready[o] {
            at_step.entry(si).or_default().push(pi);
        }
    }
    let mut left: Vec<usize> = buckets.iter().map(|b| b.1.len()).collect();
    let mut started = vec![false; buckets.len()];
    let mut done = vec![false; l.params.len()];
    let mut failed: Option<Error> = None;
    let add = |pi: usize, t: &HostTensor, acc: &mut [f32]| -> Result<()> {
        let (p, off, shape) = &l.params[pi];
        let v = t
            .to_f32()
            .ok_or_else(|| Error::unsupported(format!("the gradient of '{p}' is not float32")))?;
        let n: usize = shape.iter().product();
        if v.len() != n {
            return Err(Error::new(format!(
                "the gradient of '{p}' has {} elements, the parameter {n}",
                v.len()
            )));
        }
        acc[*off..off + n]
            .iter_mut()
            .zip(&v)
            .for_each(|(a, b)| *a += b);
        Ok(())
    };
    let outs = g.run_observed(state, micro, ropts, &mut |si, read| {
        let Some(ps) = at_step.get(&si) else { return };
        for &pi in ps {
            if failed.is_some() {
                return;
            }
            let r = read(out_of[pi])
                .ok_or_else(|| Error::new("a gradient is not readable during the run"))
                .and_then(|t| add(pi, &t, acc));
            if let Err(e) = r {
                failed = Some(e);
                return;
            }
            done[pi] = true;
            let b = bucket_of[pi];
            left[b] -= 1;
            if left[b] == 0 {
                let range = buckets[b].0.clone();
                pending.extend(start(range.clone(), &acc[range]));
                started[b] = true;
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let early = started.iter().filter(|&&x| x).count();
    // Gradients final only at the end (a weight, an input, a value of
    // data-dependent size), then the buckets they complete, in order.
    for pi in 0..l.params.len() {
        if !done[pi] {
            add(pi, &outs[out_of[pi]], acc)?;
            left[bucket_of[pi]] -= 1;
        }
    }
    for (b, (range, _)) in buckets.iter().enumerate() {
        if !started[b] {
            pending.extend(start(range.clone(), &acc[range.clone()]));
        }
    }
    Ok((
        scalar_of(&outs[g.at("loss")?]) as f32,
        (buckets.len(), early),
    ))
}
