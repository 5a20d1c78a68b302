//! `graphopt.Session`: the facade's [`graphopt::Session`] behind a lock,
//! with one Python method per facade method.

use crate::args::*;
use crate::convert::*;
use crate::{gerr, gmsg};
use graphopt::onnx::ExternalData;
use graphopt::plan::DimValues;
use graphopt::{
    AutodiffOptions, Calibration, CheckOptions, DataSource, Device, GradOptions, Inputs, Metric,
    OptimizeOptions, OptimizerSpec, PipelineOptions, PlanGraph, PlanRequest, PlanSettings,
    Precision, PrecisionOptions, RunOptions, SaveOptions, Scale, Session, Tolerance, TrainLength,
    TrainOptions, ValidateOptions,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyTuple};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// One ONNX model and what graphopt did to it (a copy of the facade's
/// `Session`). `optimize`, `lower_precision` and `grad` return a new
/// Session and leave this one unchanged.
#[pyclass(name = "Session", module = "graphopt", frozen)]
pub(crate) struct PySession {
    inner: Mutex<Session>,
    /// What made this session: one `{"step", "report"}` per transform.
    steps: Vec<Value>,
}

impl PySession {
    pub(crate) fn new(s: Session, steps: Vec<Value>) -> PySession {
        PySession {
            inner: Mutex::new(s),
            steps,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Session> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the session with the GIL released (the lock may be held by a
    /// long call on another thread, which must be able to finish).
    pub(crate) fn peek<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&Session) -> R + Send) -> R {
        py.detach(|| f(&self.lock()))
    }

    /// Runs `f` on the session with the GIL released.
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Session) -> graphopt::Result<R> + Send,
    ) -> PyResult<R> {
        py.detach(|| f(&self.lock())).map_err(gerr)
    }

    /// A copy of the session changed by `f` (GIL released); its report
    /// gains step `name` with what `f` returned.
    fn transform(
        &self,
        py: Python<'_>,
        name: &str,
        f: impl FnOnce(&mut Session) -> graphopt::Result<Value> + Send,
    ) -> PyResult<PySession> {
        let (s, report) = py
            .detach(|| {
                let mut s = self.lock().clone();
                let r = f(&mut s)?;
                Ok((s, r))
            })
            .map_err(gerr)?;
        let mut steps = self.steps.clone();
        steps.push(json!({"step": name, "report": report}));
        Ok(PySession::new(s, steps))
    }

    /// `lower_precision`'s arguments (and `optimize(precision=...)`'s) as
    /// the facade's options.
    #[allow(clippy::too_many_arguments)]
    fn precision_options(
        &self,
        precision: &str,
        keep_fp32: Option<&Bound<'_, PyAny>>,
        keep_io_types: bool,
        any_runtime: bool,
        validate: Option<&Bound<'_, PyAny>>,
        inputs: Option<&Bound<'_, PyAny>>,
        (rtol, atol): (f64, f64),
        force: bool,
        dims: Option<&Bound<'_, PyDict>>,
        shapes: Option<&Bound<'_, PyDict>>,
        seed: u64,
        range_check: bool,
    ) -> PyResult<PrecisionOptions> {
        let precision = Precision::parse(precision).map_err(|e| gerr(e.into()))?;
        let best_effort = match validate {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) if v.is_instance_of::<PyBool>() => v.extract::<bool>()?.then_some(false),
            Some(v) => Some(graphopt::parse_validate_mode(&v.extract::<String>()?).map_err(gerr)?),
        };
        let dims = dims_arg(dims)?;
        let mut shapes = shapes_arg(shapes)?;
        shapes.extend(input_shapes(inputs)?);
        let range_check = if range_check {
            Some(inputs_arg(inputs, seed, &dims)?)
        } else {
            None
        };
        let validate = match best_effort {
            None => None,
            Some(best_effort) => Some(ValidateOptions {
                inputs: inputs_arg(inputs, seed, &dims)?,
                rtol,
                atol,
                best_effort,
                force,
            }),
        };
        Ok(PrecisionOptions {
            precision,
            keep_fp32: list_arg(keep_fp32)?,
            keep_io_types,
            any_runtime,
            validate,
            memory: Some(DimValues {
                bound: dims,
                shapes,
                default: None,
            }),
            range_check,
            pipeline: PipelineOptions::default(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_request(
        &self,
        dims: Option<&Bound<'_, PyDict>>,
        inputs: Option<&Bound<'_, PyAny>>,
        shapes: Option<&Bound<'_, PyDict>>,
        default_dim: i64,
        alignment: Option<u64>,
        reorder: bool,
        strict: bool,
        verify: bool,
        as_written: bool,
        threads: Option<usize>,
        node_budget: Option<u64>,
        time_limit: Option<f64>,
    ) -> PyResult<PlanRequest> {
        if default_dim < 0 {
            return Err(gmsg("default_dim cannot be negative"));
        }
        let mut all_shapes = shapes_arg(shapes)?;
        all_shapes.extend(input_shapes(inputs)?);
        let settings = PlanSettings {
            alignment,
            node_budget,
            threads,
            time_limit,
            no_reorder: !reorder,
            strict,
            ..PlanSettings::default()
        };
        Ok(PlanRequest {
            dims: DimValues {
                bound: dims_arg(dims)?,
                shapes: all_shapes,
                default: Some(default_dim),
            },
            options: settings.options().map_err(gerr)?,
            verify,
            graph: plan_graph(as_written),
        })
    }
}

#[pymethods]
impl PySession {
    fn __repr__(&self, py: Python<'_>) -> String {
        let (label, nodes) = self.peek(py, |s| (s.label(), s.model().graph.node_count_deep()));
        format!(
            "<graphopt.Session {label} ({nodes} nodes, {} steps)>",
            self.steps.len()
        )
    }

    /// The file the model was loaded from, or None.
    #[getter]
    fn source(&self, py: Python<'_>) -> Option<String> {
        self.peek(py, |s| s.source().map(|p| p.display().to_string()))
    }

    /// Names of the inputs a caller feeds (graph inputs without an initializer).
    #[getter]
    fn input_names(&self, py: Python<'_>) -> Vec<String> {
        self.peek(py, |s| {
            let g = &s.model().graph;
            g.runtime_inputs().map(|v| g.name(v).to_string()).collect()
        })
    }

    /// Names of the graph outputs.
    #[getter]
    fn output_names(&self, py: Python<'_>) -> Vec<String> {
        self.peek(py, |s| {
            let g = &s.model().graph;
            g.outputs.iter().map(|&v| g.name(v).to_string()).collect()
        })
    }

    /// The default simplify/fuse pipeline to a fixed point, or the named
    /// passes (`"none"` for none); `opset` raises the default-domain opset
    /// first; `skip` leaves passes out (None: the library's policy, which
    /// leaves out `fuse_conv_bn` when `precision` is given; `[]` keeps
    /// every pass); `verify=True` verifies after every pass (else once at
    /// the end). `precision` ("fp16" | "bf16" | "fp16-weights") lowers
    /// after the pipeline with the `lower_precision` arguments, as
    /// `graphopt optimize --precision` does. Returns a new Session.
    #[pyo3(signature = (passes=None, opset=None, max_rounds=None, verify=false, stop_after=None,
                        skip=None, precision=None, keep_fp32=None, keep_io_types=true,
                        any_runtime=false, validate=None, inputs=None, rtol=1e-2, atol=1e-3,
                        force=false, dims=None, shapes=None, seed=7, range_check=true))]
    #[allow(clippy::too_many_arguments)]
    fn optimize(
        &self,
        py: Python<'_>,
        passes: Option<&Bound<'_, PyAny>>,
        opset: Option<i64>,
        max_rounds: Option<usize>,
        verify: bool,
        stop_after: Option<usize>,
        skip: Option<&Bound<'_, PyAny>>,
        precision: Option<&str>,
        keep_fp32: Option<&Bound<'_, PyAny>>,
        keep_io_types: bool,
        any_runtime: bool,
        validate: Option<&Bound<'_, PyAny>>,
        inputs: Option<&Bound<'_, PyAny>>,
        rtol: f64,
        atol: f64,
        force: bool,
        dims: Option<&Bound<'_, PyDict>>,
        shapes: Option<&Bound<'_, PyDict>>,
        seed: u64,
        range_check: bool,
    ) -> PyResult<PySession> {
        let passes = match passes {
            None => None,
            Some(p) => Some(list_arg(Some(p))?.join(",")),
        };
        let pipeline = PipelineOptions {
            verify,
            dump_ir: None,
            stop_after,
        };
        let precision = match precision {
            None => None,
            Some(p) => Some(PrecisionOptions {
                pipeline: pipeline.clone(),
                ..self.precision_options(
                    p,
                    keep_fp32,
                    keep_io_types,
                    any_runtime,
                    validate,
                    inputs,
                    (rtol, atol),
                    force,
                    dims,
                    shapes,
                    seed,
                    range_check,
                )?
            }),
        };
        let opts = OptimizeOptions {
            passes,
            opset,
            max_rounds,
            skip: match skip {
                None => None,
                Some(s) if s.is_none() => None,
                Some(s) => Some(list_arg(Some(s))?),
            },
            compress: None,
            precision,
            quantize: None,
            pipeline,
        };
        self.transform(py, "optimize", move |s| to_json(&s.optimize(&opts)?))
    }

    /// Lowers to "fp16" | "bf16" compute or "fp16-weights" storage.
    /// `validate=True` (or "best-effort") runs the original and the lowered
    /// model in tract on `inputs` and keeps the nodes that break
    /// `rtol`/`atol` fp32; ending over tolerance raises GraphoptError
    /// unless `force`. Returns a new Session.
    #[pyo3(signature = (precision, keep_fp32=None, keep_io_types=true, any_runtime=false,
                        validate=None, inputs=None, rtol=1e-2, atol=1e-3, force=false,
                        dims=None, shapes=None, seed=7, range_check=true))]
    #[allow(clippy::too_many_arguments)]
    fn lower_precision(
        &self,
        py: Python<'_>,
        precision: &str,
        keep_fp32: Option<&Bound<'_, PyAny>>,
        keep_io_types: bool,
        any_runtime: bool,
        validate: Option<&Bound<'_, PyAny>>,
        inputs: Option<&Bound<'_, PyAny>>,
        rtol: f64,
        atol: f64,
        force: bool,
        dims: Option<&Bound<'_, PyDict>>,
        shapes: Option<&Bound<'_, PyDict>>,
        seed: u64,
        range_check: bool,
    ) -> PyResult<PySession> {
        let opts = self.precision_options(
            precision,
            keep_fp32,
            keep_io_types,
            any_runtime,
            validate,
            inputs,
            (rtol, atol),
            force,
            dims,
            shapes,
            seed,
            range_check,
        )?;
        self.transform(py, "lower_precision", move |s| {
            to_json(&s.lower_precision(&opts)?)
        })
    }

    /// The training graph: forward, `loss`, and `<param>_grad` for every
    /// trainable initializer (`optimizer="sgd"` adds `<param>_new`).
    /// Returns a new Session; its `report()` has the saved-for-backward
    /// bytes and the plan of the step at `dims`. `dropout_train=True` runs
    /// every Dropout in training mode (the report's `dropout_train` lists
    /// them; a model without one gets a warning).
    #[pyo3(signature = (loss="sum", output=None, class_axis=1, trainable=None, frozen=None,
                        input_grads=false, optimizer="none", lr=None, weight_decay=None,
                        betas=None, eps=None, params_as_inputs=false,
                        dims=None, simplify=true, recompute_pointwise=true,
                        dropout_train=false, keep_grads=false))]
    #[allow(clippy::too_many_arguments)]
    fn grad(
        &self,
        py: Python<'_>,
        loss: &str,
        output: Option<String>,
        class_axis: i64,
        trainable: Option<&Bound<'_, PyAny>>,
        frozen: Option<&Bound<'_, PyAny>>,
        input_grads: bool,
        optimizer: &str,
        lr: Option<f64>,
        weight_decay: Option<f64>,
        betas: Option<(f64, f64)>,
        eps: Option<f64>,
        params_as_inputs: bool,
        dims: Option<&Bound<'_, PyDict>>,
        simplify: bool,
        recompute_pointwise: bool,
        dropout_train: bool,
        keep_grads: bool,
    ) -> PyResult<PySession> {
        let loss_kind = graphopt::parse_loss(loss).map_err(gerr)?;
        let optimizer = OptimizerSpec {
            name: optimizer.to_string(),
            lr,
            weight_decay,
            betas,
            eps,
        }
        .build()
        .map_err(gerr)?;
        let opts = GradOptions {
            autodiff: AutodiffOptions {
                output,
                loss: loss_kind,
                class_axis,
                trainable: list_arg(trainable)?,
                frozen: list_arg(frozen)?,
                input_grads,
                optimizer,
                params_as_inputs,
                dropout_train,
            },
            dims: DimValues::new(&dims_arg(dims)?),
            simplify,
            recompute_pointwise,
            keep_grads,
            ..GradOptions::default()
        };
        self.transform(py, "grad", move |s| to_json(&s.grad(&opts)?))
    }

    /// The model's initializers (weights) as numpy arrays, by name; `names`
    /// picks some (a name that is not an initializer raises).
    #[pyo3(signature = (names=None))]
    fn weights<'py>(
        &self,
        py: Python<'py>,
        names: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let names = list_arg(names)?;
        let tensors = self.peek(py, move |s| s.weights(&names)).map_err(gerr)?;
        let d = PyDict::new(py);
        for (n, t) in tensors {
            d.set_item(n, tensor_to_array(py, t)?)?;
        }
        Ok(d)
    }

    /// Trains the model with graphopt's training step, in graphopt's
    /// runtime (as `graphopt train`); returns a new Session holding the
    /// trained inference model (its `report()` has the step log, evals and
    /// memory). `data` and `eval`: an .npz path or a directory of shards, a
    /// dict of numpy arrays with a leading example axis (named like the
    /// model's inputs, plus the target), or an iterable of such dicts
    /// (concatenated). `target` names the target array.
    /// Options left None take the library's defaults (`TrainOptions::new`).
    #[pyo3(signature = (data, batch, epochs=None, steps=None, loss=None, output=None,
                        target=None, class_axis=None, optimizer=None, lr=None,
                        weight_decay=None, betas=None, eps=None, trainable=None, frozen=None,
                        seed=None, shuffle=true, dropout_train=true, eval=None, metric=None,
                        micro_batches=None, budget=None, remat=None, checkpoint=None,
                        every=None, resume=None, threads=None, distributed=None,
                        bucket_size=None, pipeline=None, comm_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn train(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        batch: usize,
        epochs: Option<usize>,
        steps: Option<usize>,
        loss: Option<&str>,
        output: Option<String>,
        target: Option<String>,
        class_axis: Option<i64>,
        optimizer: Option<String>,
        lr: Option<f64>,
        weight_decay: Option<f64>,
        betas: Option<(f64, f64)>,
        eps: Option<f64>,
        trainable: Option<&Bound<'_, PyAny>>,
        frozen: Option<&Bound<'_, PyAny>>,
        seed: Option<u64>,
        shuffle: bool,
        dropout_train: bool,
        eval: Option<&Bound<'_, PyAny>>,
        metric: Option<&str>,
        micro_batches: Option<usize>,
        budget: Option<&Bound<'_, PyAny>>,
        remat: Option<&str>,
        checkpoint: Option<PathBuf>,
        every: Option<usize>,
        resume: Option<PathBuf>,
        threads: Option<usize>,
        distributed: Option<&str>,
        bucket_size: Option<&Bound<'_, PyAny>>,
        pipeline: Option<PathBuf>,
        comm_timeout: Option<f64>,
    ) -> PyResult<PySession> {
        if epochs.is_some() && steps.is_some() {
            return Err(gmsg("give epochs or steps, not both"));
        }
        let mut opts = TrainOptions::new(batch);
        if let Some(l) = loss {
            opts.loss = graphopt::parse_loss(l).map_err(gerr)?;
        }
        opts.output = output;
        opts.target = target.unwrap_or(opts.target);
        opts.class_axis = class_axis.unwrap_or(opts.class_axis);
        opts.optimizer = OptimizerSpec {
            name: optimizer.unwrap_or(opts.optimizer.name),
            lr,
            weight_decay,
            betas,
            eps,
        };
        opts.trainable = list_arg(trainable)?;
        opts.frozen = list_arg(frozen)?;
        opts.seed = seed.unwrap_or(opts.seed);
        opts.shuffle = shuffle;
        opts.dropout_train = dropout_train;
        match (epochs, steps) {
            (_, Some(s)) => opts.length = TrainLength::Steps(s),
            (Some(e), None) => opts.length = TrainLength::Epochs(e),
            (None, None) => {}
        }
        if let Some(m) = metric {
            opts.metric = Metric::parse(m).map_err(gerr)?;
        }
        opts.micro_batches = micro_batches;
        opts.budget = budget
            .filter(|b| !b.is_none())
            .map(parse_budget)
            .transpose()?;
        if let Some(r) = remat {
            opts.remat = graphopt::parse_train_remat(r).map_err(gerr)?;
        }
        opts.checkpoint = checkpoint;
        opts.every = every.unwrap_or(opts.every);
        opts.resume = resume;
        opts.threads = threads;
        opts.distributed = distributed
            .map(graphopt::distributed::Scheme::parse)
            .transpose()
            .map_err(gerr)?;
        if let Some(b) = bucket_size.filter(|b| !b.is_none()) {
            opts.bucket_bytes = parse_budget(b)?;
        }
        let data = array_data(data, "data")?;
        let eval = eval
            .filter(|e| !e.is_none())
            .map(|e| array_data(e, "eval"))
            .transpose()?;
        // A distributed run joins the other ranks first (MPI starts here
        // unless graphopt.distributed.init() started it).
        let world = match (&opts.distributed, &pipeline) {
            (Some(s), _) => Some(format!("train(distributed={:?})", s.name())),
            (None, Some(_)) => Some("train(pipeline=...)".to_string()),
            (None, None) => None,
        }
        .map(|what| crate::distributed::joined(py, &what, comm_timeout))
        .transpose()?;
        self.transform(py, "train", move |s| {
            let eval: Option<&dyn DataSource> = eval.as_deref().map(|e| e as &dyn DataSource);
            let r = match (&world, &pipeline) {
                (None, _) => s.train(data.as_ref(), eval, &opts),
                (Some(w), Some(dir)) => {
                    s.train_pipeline(w.comm(), dir, data.as_ref(), eval, &opts, &mut |_| {})
                }
                (Some(w), None) => s.train_on(w.comm(), data.as_ref(), eval, &opts, &mut |_| {}),
            };
            let r = match &world {
                Some(w) => r.map_err(|e| w.rank_error(e))?,
                None => r?,
            };
            to_json(&r)
        })
    }

    /// Cuts the model into `stages` pipeline stages (`graphopt partition`):
    /// returns `{"manifest": ..., "planned": ...}` as `partition --json`,
    /// and writes the stage files and `manifest.json` into `output` when
    /// given. With `data` and `batch`, each stage's training step is
    /// planned (with `target`, `loss`, `class_axis`, `optimizer` as in
    /// `train`), and `budget` (bytes or a size; one for every stage, or a
    /// list, one per stage) picks the cuts whose slowest stage is least
    /// among those whose every stage fits.
    #[pyo3(signature = (stages, output=None, micro_batches=None, schedule=None, dims=None,
                        data=None, batch=None, target=None, loss=None, class_axis=None,
                        optimizer=None, budget=None))]
    #[allow(clippy::too_many_arguments)]
    fn partition<'py>(
        &self,
        py: Python<'py>,
        stages: usize,
        output: Option<PathBuf>,
        micro_batches: Option<usize>,
        schedule: Option<&str>,
        dims: Option<&Bound<'py, PyDict>>,
        data: Option<&Bound<'py, PyAny>>,
        batch: Option<usize>,
        target: Option<String>,
        loss: Option<&str>,
        class_axis: Option<i64>,
        optimizer: Option<String>,
        budget: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut opts = graphopt::partition::PartitionOptions::new(stages);
        if let Some(m) = micro_batches {
            opts.micro_batches = m;
        }
        if let Some(s) = schedule {
            opts.schedule = graphopt::partition::Schedule::parse(s).map_err(gerr)?;
        }
        opts.dims = dims_arg(dims)?;
        let budgets: Vec<u64> = match budget.filter(|b| !b.is_none()) {
            None => Vec::new(),
            Some(b)
                if b.is_instance_of::<pyo3::types::PyList>() || b.is_instance_of::<PyTuple>() =>
            {
                b.try_iter()?
                    .map(|x| parse_budget(&x?))
                    .collect::<PyResult<_>>()?
            }
            Some(b) => vec![parse_budget(b)?],
        };
        let plan = match (data.filter(|d| !d.is_none()), batch) {
            (Some(d), Some(b)) => {
                let mut t = TrainOptions::new(b);
                t.target = target.unwrap_or(t.target);
                if let Some(l) = loss {
                    t.loss = graphopt::parse_loss(l).map_err(gerr)?;
                }
                t.class_axis = class_axis.unwrap_or(t.class_axis);
                if let Some(o) = optimizer {
                    t.optimizer = OptimizerSpec::named(&o);
                }
                Some((array_data(d, "data")?, t))
            }
            (None, None) => None,
            _ => return Err(gmsg("partition: give data and batch together")),
        };
        if plan.is_none() && !budgets.is_empty() {
            return Err(gmsg(
                "partition: budget needs data and batch (the stages' plans)",
            ));
        }
        let v = self.with(py, move |s| {
            let (p, planned) = match &plan {
                Some((data, t)) => {
                    let (p, r) = s.partition_within(&opts, data.as_ref(), t, &budgets)?;
                    (p, Some(r))
                }
                None => (s.partition(&opts)?, None),
            };
            if let Some(dir) = &output {
                graphopt::partition::write_partition(&p, dir)?;
            }
            to_json(&json!({ "manifest": p.manifest, "planned": planned }))
        })?;
        to_py(py, &v)
    }

    /// Quantizes after the pipeline, in standard ONNX ops only:
    /// `mode` is "dynamic" | "static" | "int8-weights" | "int4-weights"
    /// (as `graphopt optimize --quantize`). `calibration`: an iterable of
    /// dicts of numpy arrays (one batch of graph inputs each), an .npz
    /// path or a directory of them, or None (seeded random inputs, with a
    /// warning in the report). `max_error` bounds the relative L2 error of
    /// every output (None: the library's default, 0.05; a number; or
    /// "none" for no bound); layers go back to float until it holds, or
    /// GraphoptError. `measure=False` skips measuring, and so the bound.
    /// Options left None take the library's defaults (minmax, per channel,
    /// asymmetric, block 32, measured).
    /// Returns a new Session.
    #[pyo3(signature = (mode, calibration=None, calibrate=None, per_channel=None,
                        symmetric=None, block_size=None, exclude=None, max_error=None,
                        measure=None, dims=None))]
    #[allow(clippy::too_many_arguments)]
    fn quantize(
        &self,
        py: Python<'_>,
        mode: &str,
        calibration: Option<&Bound<'_, PyAny>>,
        calibrate: Option<&str>,
        per_channel: Option<bool>,
        symmetric: Option<bool>,
        block_size: Option<i64>,
        exclude: Option<&Bound<'_, PyAny>>,
        max_error: Option<&Bound<'_, PyAny>>,
        measure: Option<bool>,
        dims: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PySession> {
        let mode = graphopt::QuantizeMode::parse(mode).map_err(|e| gerr(e.into()))?;
        let defaults = graphopt::QuantizeOptions::new(mode);
        let max_error = max_error_arg(max_error, defaults.max_error)?;
        let dims = dims_arg(dims)?;
        let calibration = calibration_arg(calibration)?;
        let opts = graphopt::QuantizeOptions {
            calibration,
            dims: dims.clone(),
            calibrate: match calibrate {
                Some(c) => graphopt::Calibrate::parse(c).map_err(|e| gerr(e.into()))?,
                None => defaults.calibrate,
            },
            per_channel: per_channel.unwrap_or(defaults.per_channel),
            symmetric: symmetric.unwrap_or(defaults.symmetric),
            block_size: block_size.unwrap_or(defaults.block_size),
            exclude: list_arg(exclude)?,
            max_error,
            measure: measure.unwrap_or(defaults.measure),
            memory: Some(DimValues::new(&dims)),
            pipeline: PipelineOptions::default(),
            ..defaults
        };
        self.transform(py, "quantize", move |s| to_json(&s.quantize(&opts)?))
    }

    /// Compresses weights: "cluster:BITS[:per-channel-groups=G]" (k-means
    /// palettes, uint4/uint8 indices + codebook), "lowrank[:ENERGY|:RANK|
    /// :params=F]" (two thin factors; activation-aware with calibration)
    /// or "share[:TOL]" (near-equal weights read as one). The error against
    /// the uncompressed model is measured on `calibration` (or random
    /// inputs) and bounded by `max_error` (default 0.05; "none" for no
    /// bound): the most sensitive layers stay uncompressed until it holds,
    /// else GraphoptError. Returns a new Session.
    #[pyo3(signature = (method, calibration=None, exclude=None, max_error=None,
                        measure=None, dims=None, min_weight_elems=None))]
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        py: Python<'_>,
        method: &str,
        calibration: Option<&Bound<'_, PyAny>>,
        exclude: Option<&Bound<'_, PyAny>>,
        max_error: Option<&Bound<'_, PyAny>>,
        measure: Option<bool>,
        dims: Option<&Bound<'_, PyDict>>,
        min_weight_elems: Option<u64>,
    ) -> PyResult<PySession> {
        let max_error = max_error_arg(max_error, Some(graphopt::DEFAULT_MAX_ERROR))?;
        let defaults = graphopt::CompressOptions::parse(method, max_error).map_err(gerr)?;
        let dims = dims_arg(dims)?;
        let opts = graphopt::CompressOptions {
            calibration: calibration_arg(calibration)?,
            dims: dims.clone(),
            exclude: list_arg(exclude)?,
            measure: measure.unwrap_or(defaults.measure),
            min_weight_elems: min_weight_elems.unwrap_or(defaults.min_weight_elems),
            memory: Some(DimValues::new(&dims)),
            ..defaults
        };
        self.transform(py, "compress", move |s| to_json(&s.compress(&opts)?))
    }

    /// Structured pruning (as `graphopt prune`): give one of `ratio` (the
    /// fraction of each dependency group's channels, hidden units or
    /// attention heads removed), `target_params` or `target_flops` (a
    /// fraction <= 1 or a count to keep; the ratio is searched), or
    /// `sparsity` (unstructured: that fraction of every weight's elements
    /// set to zero, stored sparse where the file gets smaller).
    /// `criterion` is "l1" | "l2" | "taylor" (|w·dL/dw| on `calibration`,
    /// the loss `loss` with its target in the array `target`) | "random",
    /// `granularity` "channel" |
    /// "head" | "all"; `protect` lists tensors whose dims stay. The error
    /// against the unpruned model is measured on `calibration` (or random
    /// inputs) and reported, not bounded. Returns a new Session; its report
    /// has the `graphopt prune --json` fields.
    #[pyo3(signature = (ratio=None, target_params=None, target_flops=None, sparsity=None, criterion=None,
                        granularity=None, global_ranking=None, round_to=None, protect=None,
                        dims=None, calibration=None, measure=None, loss=None, target=None))]
    #[allow(clippy::too_many_arguments)]
    fn prune(
        &self,
        py: Python<'_>,
        ratio: Option<f64>,
        target_params: Option<f64>,
        target_flops: Option<f64>,
        sparsity: Option<f64>,
        criterion: Option<&str>,
        granularity: Option<&str>,
        global_ranking: Option<bool>,
        round_to: Option<usize>,
        protect: Option<&Bound<'_, PyAny>>,
        dims: Option<&Bound<'_, PyDict>>,
        calibration: Option<&Bound<'_, PyAny>>,
        measure: Option<bool>,
        loss: Option<&str>,
        target: Option<&str>,
    ) -> PyResult<PySession> {
        let amount =
            graphopt::prune_amount(ratio, target_params, target_flops, sparsity).map_err(gerr)?;
        let defaults = graphopt::PruneOptions::new(amount);
        let d = &defaults.pass;
        let pass = graphopt::passes::prune::Prune {
            criterion: criterion
                .map(graphopt::prune_criterion)
                .transpose()
                .map_err(gerr)?
                .unwrap_or(d.criterion),
            granularity: granularity
                .map(graphopt::prune_granularity)
                .transpose()
                .map_err(gerr)?
                .unwrap_or(d.granularity),
            global: global_ranking.unwrap_or(d.global),
            round_to: round_to.unwrap_or(d.round_to),
            protect: list_arg(protect)?,
            dims: dims_arg(dims)?,
            ..d.clone()
        };
        let opts = graphopt::PruneOptions {
            pass,
            calibration: calibration_arg(calibration)?,
            measure: measure.unwrap_or(defaults.measure),
            loss: match loss {
                Some(l) => graphopt::parse_loss(l).map_err(gerr)?,
                None => defaults.loss,
            },
            target: target
                .map(str::to_string)
                .unwrap_or(defaults.target.clone()),
            ..defaults
        };
        self.transform(py, "prune", move |s| to_json(&s.prune(&opts)?))
    }

    /// Recomputation under a memory budget, on a training graph (from
    /// `grad`): `budget` is bytes (int), a size ("2GiB") or a percent of
    /// the store-everything activation bound ("40%"); `strategy` is
    /// "auto" | "optimal" | "fast" | "sqrt" | "per-block". A budget below
    /// the least reachable peak raises GraphoptError naming that minimum.
    /// Returns a new Session; its report has the `graphopt remat --json`
    /// fields.
    #[pyo3(signature = (budget, dims=None, strategy="auto", time_limit=graphopt::REMAT_TIME_LIMIT_S,
                        donate=None))]
    fn remat(
        &self,
        py: Python<'_>,
        budget: &Bound<'_, PyAny>,
        dims: Option<&Bound<'_, PyDict>>,
        strategy: &str,
        time_limit: f64,
        donate: Option<bool>,
    ) -> PyResult<PySession> {
        let budget = parse_remat_budget(budget)?;
        let strategy = graphopt::parse_strategy(strategy).map_err(gerr)?;
        let time_limit = graphopt::util::seconds("time_limit", time_limit).map_err(gerr)?;
        let opts = graphopt::RematOptions {
            budget,
            dims: DimValues::new(&dims_arg(dims)?),
            strategy,
            time_limit,
            donate: donate.unwrap_or(graphopt::RematOptions::default().donate),
        };
        self.transform(py, "remat", move |s| to_json(&s.remat(&opts)?))
    }

    /// The Pareto frontier of peak memory against extra FLOPs on a
    /// training graph, per strategy (as `graphopt remat --sweep --json`):
    /// a dict with `lower_bound_store_all_bytes`, `outputs_bytes`, `flops`
    /// and `frontiers` (each `{strategy, points: [{peak_bytes,
    /// peak_fraction, extra_flops_pct, ...}]}`). With `budget` (as
    /// `remat`'s), `chosen` is the point of the first frontier it picks
    /// (the fewest extra FLOPs within it), else the knee. The session is
    /// unchanged.
    #[pyo3(signature = (dims=None, strategies=None, points=graphopt::SWEEP_POINTS, time_limit=graphopt::REMAT_TIME_LIMIT_S, budget=None))]
    fn remat_sweep<'py>(
        &self,
        py: Python<'py>,
        dims: Option<&Bound<'py, PyDict>>,
        strategies: Option<&Bound<'py, PyAny>>,
        points: usize,
        time_limit: f64,
        budget: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let budget = budget.map(parse_remat_budget).transpose()?;
        // None: the library's sweep set (graphopt.SWEEP_STRATEGIES), as the CLI's.
        let strategies = list_arg(strategies)?
            .iter()
            .map(|n| graphopt::parse_strategy(n))
            .collect::<graphopt::Result<Vec<_>>>()
            .map_err(gerr)?;
        let time_limit = graphopt::util::seconds("time_limit", time_limit).map_err(gerr)?;
        let dims = DimValues::new(&dims_arg(dims)?);
        let v = py
            .detach(|| {
                let mut s = self.lock().clone();
                to_json(&s.remat_sweep_with_budget(
                    &dims,
                    &strategies,
                    points,
                    time_limit,
                    budget,
                )?)
            })
            .map_err(gerr)?;
        to_py(py, &v)
    }

    /// The memory plan at `dims` (unbound input dims: `default_dim`), as
    /// `graphopt plan --json` prints it: `weights_bytes`,
    /// `lower_bound_bytes`, `arena_bytes`, `naive_bytes`, `schedule`,
    /// `tensors`, `peak_tensors`, `dims`, ... `inputs` (a dict of arrays or
    /// an .npz) and `shapes` give whole input shapes. The graph planned is
    /// the one `run()` executes on the CPU (its fused kernels), so the
    /// arena is the one `run()` allocates; `as_written=True` plans the
    /// model as written (what onnxruntime or the CUDA backend runs).
    #[pyo3(signature = (dims=None, inputs=None, shapes=None, default_dim=1, alignment=None,
                        reorder=true, strict=false, verify=false, threads=None,
                        node_budget=None, time_limit=None, as_written=false))]
    #[allow(clippy::too_many_arguments)]
    fn plan<'py>(
        &self,
        py: Python<'py>,
        dims: Option<&Bound<'py, PyDict>>,
        inputs: Option<&Bound<'py, PyAny>>,
        shapes: Option<&Bound<'py, PyDict>>,
        default_dim: i64,
        alignment: Option<u64>,
        reorder: bool,
        strict: bool,
        verify: bool,
        threads: Option<usize>,
        node_budget: Option<u64>,
        time_limit: Option<f64>,
        as_written: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = self.plan_request(
            dims,
            inputs,
            shapes,
            default_dim,
            alignment,
            reorder,
            strict,
            verify,
            as_written,
            threads,
            node_budget,
            time_limit,
        )?;
        let v = self.with(py, move |s| {
            graphopt::plan_json(&s.plan(&req)?, default_dim, req.verify)
        })?;
        to_py(py, &v)
    }

    /// The largest batch (dim `batch_dim`, default the first symbolic
    /// input dim) whose weights + arena fit `budget` (bytes, or a size
    /// such as "8GiB"): `plan()`'s dict at that batch plus `batch_dim`,
    /// `max_batch` and `budget_bytes`, as `plan --max-batch --json`.
    #[pyo3(signature = (budget, dims=None, batch_dim=None, inputs=None, shapes=None,
                        default_dim=1, alignment=None, reorder=true, strict=false,
                        verify=false, threads=None, node_budget=None, time_limit=None, as_written=false))]
    #[allow(clippy::too_many_arguments)]
    fn max_batch<'py>(
        &self,
        py: Python<'py>,
        budget: &Bound<'py, PyAny>,
        dims: Option<&Bound<'py, PyDict>>,
        batch_dim: Option<String>,
        inputs: Option<&Bound<'py, PyAny>>,
        shapes: Option<&Bound<'py, PyDict>>,
        default_dim: i64,
        alignment: Option<u64>,
        reorder: bool,
        strict: bool,
        verify: bool,
        threads: Option<usize>,
        node_budget: Option<u64>,
        time_limit: Option<f64>,
        as_written: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let budget = parse_budget(budget)?;
        let req = self.plan_request(
            dims,
            inputs,
            shapes,
            default_dim,
            alignment,
            reorder,
            strict,
            verify,
            as_written,
            threads,
            node_budget,
            time_limit,
        )?;
        let v = self.with(py, move |s| {
            let mb = s.max_batch(&req, batch_dim.as_deref(), budget)?;
            graphopt::max_batch_json(&mb, default_dim, req.verify)
        })?;
        to_py(py, &v)
    }

    /// One rank's bytes for this training graph (`graphopt grad` with an
    /// optimizer) under `scheme` ("dp" | "zero1" | "zero2") on `ranks`
    /// ranks, as `plan --distributed S --ranks N --json`: at the global
    /// batch `dims` binds, or, with `budget` (bytes or a size per device),
    /// at the largest global batch whose per-rank bytes fit it.
    #[pyo3(signature = (scheme, ranks, dims=None, batch_dim=None, budget=None, inputs=None,
                        shapes=None, default_dim=1, alignment=None, reorder=true, strict=false,
                        verify=false, threads=None, node_budget=None, time_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn plan_distributed<'py>(
        &self,
        py: Python<'py>,
        scheme: &str,
        ranks: usize,
        dims: Option<&Bound<'py, PyDict>>,
        batch_dim: Option<String>,
        budget: Option<&Bound<'py, PyAny>>,
        inputs: Option<&Bound<'py, PyAny>>,
        shapes: Option<&Bound<'py, PyDict>>,
        default_dim: i64,
        alignment: Option<u64>,
        reorder: bool,
        strict: bool,
        verify: bool,
        threads: Option<usize>,
        node_budget: Option<u64>,
        time_limit: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let scheme = graphopt::distributed::Scheme::parse(scheme).map_err(gerr)?;
        let budget = budget
            .filter(|b| !b.is_none())
            .map(parse_budget)
            .transpose()?;
        let req = self.plan_request(
            dims,
            inputs,
            shapes,
            default_dim,
            alignment,
            reorder,
            strict,
            verify,
            // (Distributed plans are of the model as written.)
            true,
            threads,
            node_budget,
            time_limit,
        )?;
        let v = self.with(py, move |s| {
            to_json(&s.plan_distributed(&req, scheme, ranks, batch_dim.as_deref(), budget)?)
        })?;
        to_py(py, &v)
    }

    /// The largest batch (dim `batch_dim`, default the first symbolic
    /// input dim) whose weights + arena fit `budget` (bytes, or a size such
    /// as "8GiB") once the training graph is rematerialized to the least
    /// peak the solvers reach, as `plan --max-batch --remat`: a dict with
    /// `batch_dim`, `max_batch` and `bytes` (weights + arena there). A
    /// budget too small for batch 1 raises GraphoptError of kind "budget".
    /// `as_written=True` counts the arena of the rewritten model as written
    /// rather than of the graph `run()` executes (as `plan()`).
    #[pyo3(signature = (budget, dims=None, batch_dim=None, time_limit=graphopt::REMAT_TIME_LIMIT_S,
                        as_written=false))]
    fn max_batch_remat<'py>(
        &self,
        py: Python<'py>,
        budget: &Bound<'py, PyAny>,
        dims: Option<&Bound<'py, PyDict>>,
        batch_dim: Option<String>,
        time_limit: f64,
        as_written: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let budget = parse_budget(budget)?;
        let dims = DimValues::new(&dims_arg(dims)?);
        let time_limit = graphopt::util::seconds("time_limit", time_limit).map_err(gerr)?;
        let v = self.with(py, move |s| {
            let (name, batch, bytes) = s.max_batch_remat(
                &dims,
                batch_dim.as_deref(),
                budget,
                time_limit,
                plan_graph(as_written),
            )?;
            Ok(json!({"batch_dim": name, "max_batch": batch, "bytes": bytes}))
        })?;
        to_py(py, &v)
    }

    /// Runs the model in graphopt's runtime (one arena of exactly the
    /// planned size) on `inputs` (dict of arrays by input name, an .npz
    /// path, or None for seeded random inputs) and returns the outputs by
    /// name as numpy arrays that view the runtime's memory. With
    /// `return_report=True`, returns `(outputs, report)`, the report being
    /// `graphopt run --json`'s (with `profile=True`, its `profile`: time
    /// per op type and the slowest nodes). `device="cuda"` runs on the CUDA backend
    /// (built, not yet run on a GPU); without a GPU it raises GraphoptError
    /// with the CLI's message.
    #[pyo3(signature = (inputs=None, device="cpu", dims=None, repeat=1, poison=false,
                        threads=None, seed=7, return_report=false, allow_non_finite=false,
                        donate=None, profile=false))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyAny>>,
        device: &str,
        dims: Option<&Bound<'py, PyDict>>,
        repeat: usize,
        poison: bool,
        threads: Option<usize>,
        seed: u64,
        return_report: bool,
        allow_non_finite: bool,
        donate: Option<bool>,
        profile: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let device = Device::parse(device).map_err(gerr)?;
        let dims = dims_arg(dims)?;
        let opts = RunOptions {
            inputs: inputs_arg(inputs, seed, &dims)?,
            dims,
            device,
            repeat,
            poison,
            threads,
            allow_non_finite,
            donate: donate.unwrap_or(RunOptions::default().donate),
            profile,
            tamper: None,
        };
        let mut r = self.with(py, move |s| {
            let r = s.run(&opts)?;
            r.outcome()?;
            Ok(r)
        })?;
        let report = if return_report {
            Some(to_json(&r).map_err(gerr)?)
        } else {
            None
        };
        let outputs = PyDict::new(py);
        for (n, t) in r.output_names.iter().zip(std::mem::take(&mut r.outputs)) {
            outputs.set_item(n, tensor_to_array(py, t)?)?;
        }
        match report {
            Some(rep) => Ok(PyTuple::new(py, [outputs.into_any(), to_py(py, &rep)?])?.into_any()),
            None => Ok(outputs.into_any()),
        }
    }

    /// Runs this model (the reference) and `other` on the same inputs in
    /// tract and compares every output by name, as `graphopt check --json`:
    /// a dict with `outputs` (max abs, max rel, rel L2, mismatched per
    /// output) and `ok`. Being out of tolerance is a result (`ok` False),
    /// not an exception.
    #[pyo3(signature = (other, inputs=None, rtol=1e-5, atol=1e-5, tensor_scale=false, seed=7, dims=None))]
    #[allow(clippy::too_many_arguments)]
    fn check<'py>(
        &self,
        py: Python<'py>,
        other: &Bound<'py, PySession>,
        inputs: Option<&Bound<'py, PyAny>>,
        rtol: f64,
        atol: f64,
        tensor_scale: bool,
        seed: u64,
        dims: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dims = dims_arg(dims)?;
        let opts = CheckOptions {
            inputs: inputs_arg(inputs, seed, &dims)?,
            tolerance: Tolerance {
                rtol,
                atol,
                scale: if tensor_scale {
                    Scale::Tensor
                } else {
                    Scale::Element
                },
            },
        };
        // One lock at a time (two threads checking a against b and b
        // against a must not deadlock): a copy of `other` (its tensors
        // are shared, not copied), then this session.
        let other = other.get().peek(py, Session::clone);
        let v = self.with(py, move |s| to_json(&s.check(&other, &opts)?))?;
        to_py(py, &v)
    }

    /// What the model is, as `graphopt inspect --json`: inputs and outputs
    /// with dtypes and (symbolic) shapes, ops, parameters by dtype, opsets.
    #[pyo3(signature = (dims=None))]
    fn inspect<'py>(
        &self,
        py: Python<'py>,
        dims: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dims = dims_arg(dims)?;
        let v = self.with(py, move |s| to_json(&s.inspect(&dims)))?;
        to_py(py, &v)
    }

    /// Saves atomically (never over the file the session was loaded from).
    /// `external_data`: None (as the input had it, or past 2 GiB), False
    /// (all inline), True (tensors of at least 1 KiB out), or a threshold
    /// in bytes. Returns `{model_bytes, external_bytes, external_file}`.
    #[pyo3(signature = (path, external_data=None, location=None))]
    fn save<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        external_data: Option<&Bound<'py, PyAny>>,
        location: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let external = match external_data {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) if v.is_instance_of::<PyBool>() => Some(if v.extract::<bool>()? {
                ExternalData::Always { threshold: 1024 }
            } else {
                ExternalData::Never
            }),
            Some(v) => Some(ExternalData::Always {
                threshold: v.extract::<u64>()?,
            }),
        };
        let opts = SaveOptions { external, location };
        let v = self.with(py, move |s| {
            let r = s.save_with(&path, &opts)?;
            Ok(json!({
                "model_bytes": r.model_bytes,
                "external_bytes": r.external_bytes,
                "external_file": r.external_file.map(|p| p.display().to_string()),
            }))
        })?;
        to_py(py, &v)
    }

    /// The model as ONNX bytes (everything inline).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.with(py, |s| s.to_bytes())?;
        Ok(PyBytes::new(py, &b))
    }

    /// The model in the ONNX textual syntax (`graphopt print`); tensors of
    /// more than 16 elements elided unless `full`.
    #[pyo3(signature = (full=false))]
    fn text(&self, py: Python<'_>, full: bool) -> PyResult<String> {
        self.with(py, move |s| {
            let opts = graphopt::text::PrintOptions {
                elide_above: if full {
                    None
                } else {
                    graphopt::text::PrintOptions::default().elide_above
                },
            };
            Ok(graphopt::text::print_model(s.model(), &opts))
        })
    }

    /// What made this session: `source`, `steps` (one `{"step", "report"}`
    /// per optimize / lower_precision / grad, each the facade's report, as
    /// the CLI's `--report` writes it) and `passes` (every pass run).
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (source, passes) = self.peek(py, |s| {
            (
                s.source().map(|p| p.display().to_string()),
                to_json(&s.pass_runs()),
            )
        });
        let v = json!({
            "source": source,
            "steps": self.steps,
            "passes": passes.map_err(gerr)?,
        });
        to_py(py, &v)
    }
}

/// `max_error` as Python gives it: a number, "none", or None (`default`).
/// The graph a plan is for: the model as written, or (by default) the one
/// `run()` executes on the CPU.
fn plan_graph(as_written: bool) -> PlanGraph {
    if as_written {
        PlanGraph::AsWritten
    } else {
        PlanGraph::CpuRuntime
    }
}

fn max_error_arg(e: Option<&Bound<'_, PyAny>>, default: Option<f64>) -> PyResult<Option<f64>> {
    match e.filter(|e| !e.is_none()) {
        None => Ok(default),
        Some(e) => {
            let spelled = match e.extract::<f64>() {
                Ok(v) => v.to_string(),
                Err(_) => e.extract::<String>().map_err(|_| {
                    PyTypeError::new_err("max_error: expected a number, \"none\" or None")
                })?,
            };
            graphopt::QuantizeOptions::parse_max_error(&spelled).map_err(gerr)
        }
    }
}

/// Calibration as Python gives it: an .npz path or a directory, or an
/// iterable of dicts of arrays (kept in memory, one copy each, as run's
/// inputs; the library checks their names against the model's).
fn calibration_arg(c: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Calibration>> {
    let Some(c) = c.filter(|c| !c.is_none()) else {
        return Ok(None);
    };
    if let Some(p) = path_arg(c)? {
        return Ok(Some(Calibration::Files(p)));
    }
    let mut batches = Vec::new();
    for batch in c.try_iter()? {
        let batch = batch?;
        let d = batch.cast::<PyDict>().map_err(|_| {
            PyTypeError::new_err(
                "calibration: expected an iterable of dicts of numpy arrays, an .npz path or a directory",
            )
        })?;
        batches.push(Inputs::Named(named_arrays(d)?));
    }
    Ok(Some(Calibration::Batches(batches)))
}
