//! `graphopt._graphopt`: the pyo3 extension module behind the `graphopt`
//! Python package. It mirrors the library facade ([`graphopt::Session`])
//! and adds nothing of its own: every method turns Python arguments into
//! the facade's options, calls it with the GIL released, and turns the
//! facade's report (the same serde structs the CLI prints with `--json` or
//! `--report`) into Python dicts.
//!
//! Sessions are immutable from Python: `optimize`, `lower_precision` and
//! `grad` copy the model, change the copy and return it as a new
//! `Session`, whose `report()` lists every step that made it.
//!
//! Arrays: inputs are read from numpy's buffer straight into the
//! runtime's tensors (one copy, made once; a non-contiguous or
//! non-native-byte-order array is made contiguous first). Outputs are not
//! copied: each numpy array views the runtime's tensor, which the array
//! keeps alive.
//!
//! Errors: [`graphopt::Error`] becomes `graphopt.GraphoptError` with the
//! one-line message the CLI prints after `error: `.

use graphopt::onnx::ExternalData;
use graphopt::plan::{DimValues, PlanOptions};
use graphopt::tract::TractTensor;
use graphopt::{
    AutodiffOptions, CheckOptions, Device, GradOptions, Inputs, Loss, OptimizeOptions, Optimizer,
    PipelineOptions, PlanRequest, Precision, PrecisionOptions, RunOptions, SaveOptions, Scale,
    Session, Tolerance, ValidateOptions,
};
use numpy::ndarray::ArrayView1;
use numpy::{PyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyList, PyMemoryView, PyString, PyTuple};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use tract_onnx::prelude::{DatumType, Tensor};

create_exception!(
    graphopt,
    GraphoptError,
    PyException,
    "A graphopt error: one line naming the file and the node or tensor, as the CLI prints it."
);

fn gerr(e: graphopt::Error) -> PyErr {
    GraphoptError::new_err(e.message().to_string())
}

fn gmsg(msg: impl Into<String>) -> PyErr {
    GraphoptError::new_err(msg.into())
}

/// A private folder under the system's temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> PyResult<TempDir> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("graphopt-calibration-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)
            .map_err(|e| gmsg(format!("calibration: cannot create {}: {e}", p.display())))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A serde value (a facade report) as Python objects: objects become
/// dicts, arrays lists, numbers int or float.
fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let items = a
                .iter()
                .map(|x| to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

fn to_json<T: serde::Serialize>(v: &T) -> graphopt::Result<Value> {
    serde_json::to_value(v).map_err(|e| graphopt::Error::new(format!("cannot report: {e}")))
}

/// `dims={"batch": 8}` as `NAME=VALUE` bindings, in the dict's order.
fn dims_arg(dims: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, i64)>> {
    let mut out = Vec::new();
    if let Some(d) = dims {
        for (k, v) in d.iter() {
            let name: String = k.extract()?;
            let value: i64 = v.extract()?;
            if value < 0 {
                return Err(gmsg(format!(
                    "dims: '{name}' = {value}: a dim cannot be negative"
                )));
            }
            out.push((name, value));
        }
    }
    Ok(out)
}

/// `shapes={"x": (1, 3, 224, 224)}` as whole input shapes.
fn shapes_arg(shapes: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, Vec<i64>)>> {
    let mut out = Vec::new();
    if let Some(d) = shapes {
        for (k, v) in d.iter() {
            let name: String = k.extract()?;
            let dims: Vec<i64> = v.extract()?;
            if dims.iter().any(|&x| x < 0) {
                return Err(gmsg(format!(
                    "shapes: '{name}' = {dims:?}: a dim cannot be negative"
                )));
            }
            out.push((name, dims));
        }
    }
    Ok(out)
}

/// A path from `str` or `os.PathLike`.
fn path_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<PathBuf>> {
    if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
        return Ok(Some(obj.extract::<PathBuf>()?));
    }
    Ok(None)
}

/// Pass names: `"a,b"` or `["a", "b"]`.
fn list_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(o) = obj else { return Ok(Vec::new()) };
    if let Ok(s) = o.extract::<String>() {
        return Ok(s
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect());
    }
    o.extract::<Vec<String>>()
        .map_err(|_| PyTypeError::new_err("expected a string or a sequence of strings"))
}

/// A budget in bytes: an int, or a size string (`"8GiB"`, `"512MB"`).
fn parse_budget(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(b) = obj.extract::<u64>() {
        return Ok(b);
    }
    let s: String = obj
        .extract()
        .map_err(|_| PyTypeError::new_err("budget: expected bytes (int) or a size like '8GiB'"))?;
    graphopt::util::parse_size(&s).map_err(|e| gmsg(format!("budget {e}")))
}

// ---- numpy <-> tensors -------------------------------------------------

fn datum_of_numpy(name: &str) -> Option<DatumType> {
    Some(match name {
        "float32" => DatumType::F32,
        "float64" => DatumType::F64,
        "float16" => DatumType::F16,
        "int8" => DatumType::I8,
        "int16" => DatumType::I16,
        "int32" => DatumType::I32,
        "int64" => DatumType::I64,
        "uint8" => DatumType::U8,
        "uint16" => DatumType::U16,
        "uint32" => DatumType::U32,
        "uint64" => DatumType::U64,
        "bool" => DatumType::Bool,
        _ => return None,
    })
}

fn numpy_of_datum(dt: DatumType) -> Option<&'static str> {
    Some(match dt {
        DatumType::F32 => "float32",
        DatumType::F64 => "float64",
        DatumType::F16 => "float16",
        DatumType::I8 => "int8",
        DatumType::I16 => "int16",
        DatumType::I32 => "int32",
        DatumType::I64 => "int64",
        DatumType::U8 => "uint8",
        DatumType::U16 => "uint16",
        DatumType::U32 => "uint32",
        DatumType::U64 => "uint64",
        DatumType::Bool => "bool",
        _ => return None,
    })
}

/// A numpy array as a runtime tensor: one copy from numpy's buffer.
fn array_to_tensor(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<TractTensor> {
    let py = obj.py();
    let np = py.import("numpy")?;
    // Same object when already a C-contiguous ndarray in native byte order.
    let mut arr = np.call_method1("ascontiguousarray", (obj,))?;
    let dtype = arr.getattr("dtype")?;
    if !dtype.getattr("isnative")?.extract::<bool>()? {
        arr = arr.call_method1("astype", (dtype.call_method1("newbyteorder", ("=",))?,))?;
        arr = np.call_method1("ascontiguousarray", (arr,))?;
    }
    let arr = arr
        .cast_into::<PyUntypedArray>()
        .map_err(|_| PyTypeError::new_err(format!("input '{name}': expected a numpy array")))?;
    let dname: String = arr.dtype().getattr("name")?.extract()?;
    let dt = datum_of_numpy(&dname).ok_or_else(|| {
        gmsg(format!(
            "input '{name}': dtype {dname} is not supported (float16/32/64, int8-64, uint8-64, bool)"
        ))
    })?;
    let shape: Vec<usize> = arr.shape().to_vec();
    let nbytes = arr.len() * dt.size_of();
    // SAFETY: the array is C-contiguous (ascontiguousarray) and holds
    // `len` elements of `dt`'s size; it stays alive (and, under the GIL,
    // unchanged by Python code) while the bytes are copied.
    let bytes: &[u8] = unsafe {
        let data = (*arr.as_array_ptr()).fields.data as *const u8;
        if nbytes == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(data, nbytes)
        }
    };
    let mut t = Tensor::zero_dt(dt, &shape).map_err(|e| gmsg(format!("input '{name}': {e}")))?;
    let dst = t.as_bytes_mut();
    if dt == DatumType::Bool {
        // Only 0 and 1 are valid bools.
        for (d, &b) in dst.iter_mut().zip(bytes) {
            *d = u8::from(b != 0);
        }
    } else {
        dst.copy_from_slice(bytes);
    }
    Ok(t)
}

/// Keeps a runtime output alive for the numpy arrays that view it.
#[pyclass(frozen, module = "graphopt._graphopt")]
struct TensorBuffer {
    tensor: TractTensor,
}

/// A runtime output as a numpy array viewing its bytes (no copy).
fn tensor_to_array<'py>(py: Python<'py>, t: TractTensor) -> PyResult<Bound<'py, PyAny>> {
    let dt = t.datum_type();
    let dname = numpy_of_datum(dt)
        .ok_or_else(|| gmsg(format!("output type {dt:?} has no numpy dtype here")))?;
    let shape: Vec<usize> = t.shape().to_vec();
    if t.len() == 0 {
        let np = py.import("numpy")?;
        return np.call_method1("empty", (PyTuple::new(py, shape)?, dname));
    }
    let owner = Bound::new(py, TensorBuffer { tensor: t })?;
    let (ptr, len) = {
        let b = owner.get().tensor.as_bytes();
        (b.as_ptr(), b.len())
    };
    // SAFETY: `ptr` points at `len` bytes owned by the tensor inside
    // `owner`, which numpy keeps as the array's base object; the tensor
    // is never touched from Rust again, so the memory stays put.
    let flat = unsafe {
        let view = ArrayView1::from_shape_ptr(len, ptr);
        PyArray1::<u8>::borrow_from_array(&view, owner.into_any())
    };
    let typed = flat.call_method1("view", (dname,))?;
    typed.call_method1("reshape", (PyTuple::new(py, shape)?,))
}

/// What the input conversion needs to know of a session (read without
/// the GIL, so that no thread waits for a session's lock holding it).
struct SessionInfo {
    label: String,
    inputs: Vec<String>,
}

impl SessionInfo {
    fn of(s: &Session) -> SessionInfo {
        let g = &s.model().graph;
        SessionInfo {
            label: s.label(),
            inputs: g.runtime_inputs().map(|v| g.name(v).to_string()).collect(),
        }
    }
}

/// `inputs=`: `None` (seeded random inputs), an `.npz` path, or a dict of
/// arrays by input name (every runtime input of `session`'s model, no more).
fn inputs_arg(
    session: &SessionInfo,
    obj: Option<&Bound<'_, PyAny>>,
    seed: u64,
    dims: &[(String, i64)],
) -> PyResult<Inputs> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Inputs::Random {
            seed,
            dims: dims.to_vec(),
            default_dim: 4,
        });
    };
    if let Some(p) = path_arg(obj)? {
        return Ok(Inputs::Npz(p));
    }
    let d = obj.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err("inputs: expected a dict of numpy arrays, an .npz path or None")
    })?;
    Ok(Inputs::Tensors(inputs_from_dict(session, d)?))
}

/// The runtime inputs of `session`'s model, in order, from a dict.
fn inputs_from_dict(session: &SessionInfo, d: &Bound<'_, PyDict>) -> PyResult<Vec<TractTensor>> {
    let names = &session.inputs;
    for k in d.keys() {
        let k: String = k.extract()?;
        if !names.contains(&k) {
            return Err(gmsg(format!(
                "{}: '{k}' is not an input of the model (inputs: {})",
                session.label,
                names.join(", ")
            )));
        }
    }
    names
        .iter()
        .map(|n| match d.get_item(n)? {
            Some(a) => array_to_tensor(n, &a),
            None => Err(gmsg(format!(
                "{}: input '{n}' is missing (inputs: {})",
                session.label,
                names.join(", ")
            ))),
        })
        .collect()
}

/// Input shapes for a plan: from an `.npz` path or a dict of arrays.
fn input_shapes(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, Vec<i64>)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    if let Some(p) = path_arg(obj)? {
        return graphopt::util::npz_shapes(&p).map_err(gerr);
    }
    let d = obj.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err("inputs: expected a dict of numpy arrays or an .npz path")
    })?;
    let mut out = Vec::new();
    for (k, v) in d.iter() {
        let shape: Vec<i64> = v.getattr("shape")?.extract()?;
        out.push((k.extract::<String>()?, shape));
    }
    Ok(out)
}

// ---- Session -------------------------------------------------------------

/// One ONNX model and what graphopt did to it (a copy of the facade's
/// `Session`). `optimize`, `lower_precision` and `grad` return a new
/// Session and leave this one unchanged.
#[pyclass(name = "Session", module = "graphopt", frozen)]
struct PySession {
    inner: Mutex<Session>,
    /// What made this session: one `{"step", "report"}` per transform.
    steps: Vec<Value>,
}

impl PySession {
    fn new(s: Session, steps: Vec<Value>) -> PySession {
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
    fn peek<R: Send>(&self, py: Python<'_>, f: impl FnOnce(&Session) -> R + Send) -> R {
        py.detach(|| f(&self.lock()))
    }

    fn info(&self, py: Python<'_>) -> SessionInfo {
        self.peek(py, SessionInfo::of)
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

    #[allow(clippy::too_many_arguments)]
    fn plan_request(
        &self,
        dims: Option<&Bound<'_, PyDict>>,
        inputs: Option<&Bound<'_, PyAny>>,
        shapes: Option<&Bound<'_, PyDict>>,
        default_dim: i64,
        alignment: u64,
        reorder: bool,
        strict: bool,
        threads: Option<usize>,
        node_budget: u64,
        time_limit: Option<f64>,
    ) -> PyResult<PlanRequest> {
        let mut all_shapes = shapes_arg(shapes)?;
        all_shapes.extend(input_shapes(inputs)?);
        Ok(PlanRequest {
            dims: DimValues {
                bound: dims_arg(dims)?,
                shapes: all_shapes,
                default: Some(default_dim),
            },
            options: PlanOptions {
                alignment,
                reorder,
                search: true,
                time_limit: time_limit
                    .map(|s| graphopt::util::seconds("--time-limit", s))
                    .transpose()
                    .map_err(gerr)?,
                node_budget,
                threads: threads.unwrap_or_else(graphopt::plan::default_threads),
                strict,
            },
        })
    }
}

/// `plan --verify`: the independent checker on a plan.
fn verify_plan(label: &str, planned: &graphopt::plan::ModelPlan) -> graphopt::Result<()> {
    graphopt::plan::check_graph_plan(&planned.model.graph, &planned.plan).map_err(|errs| {
        graphopt::Error::new(format!(
            "{label}: plan check failed: {}",
            errs.iter()
                .map(|e| e.0.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        ))
    })
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
        self.info(py).inputs
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
    /// passes (`"none"` for none), verified after every pass; `opset`
    /// raises the default-domain opset first; `skip` leaves passes out
    /// (`skip="fuse_conv_bn"` before `lower_precision`, as the CLI does
    /// with --precision). Returns a new Session.
    #[pyo3(signature = (passes=None, opset=None, max_rounds=None, verify=true, stop_after=None,
                        skip=None))]
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
    ) -> PyResult<PySession> {
        let passes = match passes {
            None => None,
            Some(p) => Some(list_arg(Some(p))?.join(",")),
        };
        let opts = OptimizeOptions {
            passes,
            opset,
            max_rounds,
            skip: list_arg(skip)?,
            pipeline: PipelineOptions {
                verify,
                dump_ir: None,
                stop_after,
            },
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
        let precision = Precision::parse(precision).map_err(|e| gerr(e.into()))?;
        let best_effort = match validate {
            None => None,
            Some(v) if v.is_instance_of::<PyBool>() => v.extract::<bool>()?.then_some(false),
            Some(v) => match v.extract::<String>()?.as_str() {
                "strict" => Some(false),
                "best-effort" | "best_effort" => Some(true),
                other => {
                    return Err(gmsg(format!(
                        "validate={other}: expected True, False or \"best-effort\""
                    )))
                }
            },
        };
        let dims = dims_arg(dims)?;
        let mut shapes = shapes_arg(shapes)?;
        shapes.extend(input_shapes(inputs)?);
        let range_check = if range_check {
            Some(inputs_arg(&self.info(py), inputs, seed, &dims)?)
        } else {
            None
        };
        let validate = match best_effort {
            None => None,
            Some(best_effort) => Some(ValidateOptions {
                inputs: inputs_arg(&self.info(py), inputs, seed, &dims)?,
                rtol,
                atol,
                best_effort,
                force,
            }),
        };
        let opts = PrecisionOptions {
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
        };
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
                        betas=(0.9, 0.999), eps=1e-8, params_as_inputs=false,
                        dims=None, simplify=true, recompute_pointwise=true,
                        dropout_train=false))]
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
        betas: (f64, f64),
        eps: f64,
        params_as_inputs: bool,
        dims: Option<&Bound<'_, PyDict>>,
        simplify: bool,
        recompute_pointwise: bool,
        dropout_train: bool,
    ) -> PyResult<PySession> {
        let loss_kind = Loss::parse(loss).ok_or_else(|| {
            gmsg(format!(
                "unknown loss '{loss}' (sum, mean, mse, l1, cross_entropy)"
            ))
        })?;
        let optimizer = match optimizer {
            "none" => Optimizer::None,
            "sgd" => Optimizer::Sgd {
                lr: lr.unwrap_or(0.01) as f32,
                weight_decay: weight_decay.unwrap_or(0.0) as f32,
            },
            // torch.optim.AdamW's defaults.
            "adamw" => Optimizer::AdamW {
                lr: lr.unwrap_or(1e-3),
                beta1: betas.0,
                beta2: betas.1,
                eps,
                weight_decay: weight_decay.unwrap_or(1e-2),
            },
            other => {
                return Err(gmsg(format!(
                    "unknown optimizer '{other}' (none, sgd, adamw)"
                )))
            }
        };
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
            ..GradOptions::default()
        };
        self.transform(py, "grad", move |s| to_json(&s.grad(&opts)?))
    }

    /// Quantizes after the pipeline, in standard ONNX ops only:
    /// `mode` is "dynamic" | "static" | "int8-weights" | "int4-weights"
    /// (as `graphopt optimize --quantize`). `calibration`: an iterable of
    /// dicts of numpy arrays (one batch of graph inputs each), an .npz
    /// path or a directory of them, or None (seeded random inputs, with a
    /// warning in the report). `max_error` bounds the relative L2 error of
    /// every output; layers go back to float until it holds, or
    /// GraphoptError. Returns a new Session.
    #[pyo3(signature = (mode, calibration=None, calibrate="minmax", per_channel=true,
                        symmetric=false, block_size=32, exclude=None, max_error=None,
                        measure=true, dims=None))]
    #[allow(clippy::too_many_arguments)]
    fn quantize(
        &self,
        py: Python<'_>,
        mode: &str,
        calibration: Option<&Bound<'_, PyAny>>,
        calibrate: &str,
        per_channel: bool,
        symmetric: bool,
        block_size: i64,
        exclude: Option<&Bound<'_, PyAny>>,
        max_error: Option<f64>,
        measure: bool,
        dims: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PySession> {
        let mode = graphopt::QuantizeMode::parse(mode).map_err(|e| gmsg(e.0))?;
        let dims = dims_arg(dims)?;
        // Batches given as dicts are written as npz files into a private
        // folder that the quantizer reads like `--calibration DIR`.
        let mut batches_dir: Option<TempDir> = None;
        let calibration = match calibration.filter(|c| !c.is_none()) {
            None => None,
            Some(c) => match path_arg(c)? {
                Some(p) => Some(p),
                None => {
                    let info = self.info(py);
                    let dir = TempDir::new()?;
                    let mut n = 0usize;
                    for batch in c.try_iter()? {
                        let batch = batch?;
                        let d = batch.cast::<PyDict>().map_err(|_| {
                            PyTypeError::new_err(
                                "calibration: expected an iterable of dicts of numpy arrays, an .npz path or a directory",
                            )
                        })?;
                        let tensors = inputs_from_dict(&info, d)?;
                        let named: Vec<(String, Tensor)> =
                            info.inputs.iter().cloned().zip(tensors).collect();
                        let bytes = graphopt::tract::npz::write(&named)
                            .map_err(|e| gmsg(format!("calibration batch {n}: {e:#}")))?;
                        std::fs::write(dir.0.join(format!("batch{n:06}.npz")), bytes)
                            .map_err(|e| gmsg(format!("calibration: cannot write a batch: {e}")))?;
                        n += 1;
                    }
                    if n == 0 {
                        return Err(gmsg("calibration: the iterable gave no batch"));
                    }
                    let p = dir.0.clone();
                    batches_dir = Some(dir);
                    Some(p)
                }
            },
        };
        let opts = graphopt::QuantizeOptions {
            calibration,
            dims: dims.clone(),
            calibrate: graphopt::Calibrate::parse(calibrate).map_err(gerr)?,
            per_channel,
            symmetric,
            block_size,
            exclude: list_arg(exclude)?,
            max_error,
            measure,
            memory: Some(DimValues::new(&dims)),
            pipeline: PipelineOptions::default(),
            ..graphopt::QuantizeOptions::new(mode)
        };
        let out = self.transform(py, "quantize", move |s| to_json(&s.quantize(&opts)?));
        drop(batches_dir);
        out
    }

    /// Recomputation under a memory budget, on a training graph (from
    /// `grad`): `budget` is bytes (int), a size ("2GiB") or a percent of
    /// the store-everything activation bound ("40%"); `strategy` is
    /// "auto" | "optimal" | "fast" | "sqrt" | "per-block". A budget below
    /// the least reachable peak raises GraphoptError naming that minimum.
    /// Returns a new Session; its report has the `graphopt remat --json`
    /// fields.
    #[pyo3(signature = (budget, dims=None, strategy="auto", time_limit=10.0))]
    fn remat(
        &self,
        py: Python<'_>,
        budget: &Bound<'_, PyAny>,
        dims: Option<&Bound<'_, PyDict>>,
        strategy: &str,
        time_limit: f64,
    ) -> PyResult<PySession> {
        let budget = match budget.extract::<u64>() {
            Ok(b) => graphopt::Budget::Bytes(b),
            Err(_) => {
                let s: String = budget.extract().map_err(|_| {
                    PyTypeError::new_err(
                        "budget: expected bytes (int), a size like '2GiB' or 'PCT%'",
                    )
                })?;
                graphopt::Budget::parse(&s).map_err(gerr)?
            }
        };
        let strategy = graphopt::RematStrategy::parse(strategy).ok_or_else(|| {
            gmsg(format!(
                "unknown strategy '{strategy}' (auto, optimal, fast, sqrt, per-block)"
            ))
        })?;
        let opts = graphopt::RematOptions {
            budget,
            dims: DimValues::new(&dims_arg(dims)?),
            strategy,
            time_limit: graphopt::util::seconds("--time-limit", time_limit).map_err(gerr)?,
        };
        self.transform(py, "remat", move |s| to_json(&s.remat(&opts)?))
    }

    /// The Pareto frontier of peak memory against extra FLOPs on a
    /// training graph, per strategy (as `graphopt remat --sweep --json`):
    /// a dict with `lower_bound_store_all_bytes`, `outputs_bytes`, `flops`
    /// and `frontiers` (each `{strategy, points: [{peak_bytes,
    /// peak_fraction, extra_flops_pct, ...}]}`). The session is unchanged.
    #[pyo3(signature = (dims=None, strategies=None, points=8, time_limit=10.0))]
    fn remat_sweep<'py>(
        &self,
        py: Python<'py>,
        dims: Option<&Bound<'py, PyDict>>,
        strategies: Option<&Bound<'py, PyAny>>,
        points: usize,
        time_limit: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let names = match strategies {
            None => vec!["auto".to_string()],
            Some(s) => list_arg(Some(s))?,
        };
        let strategies = names
            .iter()
            .map(|n| {
                graphopt::RematStrategy::parse(n).ok_or_else(|| {
                    gmsg(format!(
                        "unknown strategy '{n}' (auto, optimal, fast, sqrt, per-block)"
                    ))
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let time_limit = graphopt::util::seconds("--time-limit", time_limit).map_err(gerr)?;
        let dims = DimValues::new(&dims_arg(dims)?);
        let v = py
            .detach(|| {
                let mut s = self.lock().clone();
                to_json(&s.remat_sweep(&dims, &strategies, points, time_limit)?)
            })
            .map_err(gerr)?;
        to_py(py, &v)
    }

    /// The memory plan at `dims` (unbound input dims: `default_dim`), as
    /// `graphopt plan --json` prints it: `weights_bytes`,
    /// `lower_bound_bytes`, `arena_bytes`, `naive_bytes`, `schedule`,
    /// `tensors`, `peak_tensors`, `dims`, ... `inputs` (a dict of arrays or
    /// an .npz) and `shapes` give whole input shapes.
    #[pyo3(signature = (dims=None, inputs=None, shapes=None, default_dim=1, alignment=256,
                        reorder=true, strict=false, verify=false, threads=None,
                        node_budget=200_000, time_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn plan<'py>(
        &self,
        py: Python<'py>,
        dims: Option<&Bound<'py, PyDict>>,
        inputs: Option<&Bound<'py, PyAny>>,
        shapes: Option<&Bound<'py, PyDict>>,
        default_dim: i64,
        alignment: u64,
        reorder: bool,
        strict: bool,
        verify: bool,
        threads: Option<usize>,
        node_budget: u64,
        time_limit: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let req = self.plan_request(
            dims,
            inputs,
            shapes,
            default_dim,
            alignment,
            reorder,
            strict,
            threads,
            node_budget,
            time_limit,
        )?;
        let v = self.with(py, move |s| {
            let planned = s.plan(&req)?;
            if verify {
                verify_plan(&s.label(), &planned)?;
            }
            graphopt::plan_json(&planned, default_dim, verify)
        })?;
        to_py(py, &v)
    }

    /// The largest batch (dim `batch_dim`, default the first symbolic
    /// input dim) whose weights + arena fit `budget` (bytes, or a size
    /// such as "8GiB"): `plan()`'s dict at that batch plus `batch_dim`,
    /// `max_batch` and `budget_bytes`, as `plan --max-batch --json`.
    #[pyo3(signature = (budget, dims=None, batch_dim=None, inputs=None, shapes=None,
                        default_dim=1, alignment=256, reorder=true, strict=false,
                        threads=None, node_budget=200_000, time_limit=None))]
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
        alignment: u64,
        reorder: bool,
        strict: bool,
        threads: Option<usize>,
        node_budget: u64,
        time_limit: Option<f64>,
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
            threads,
            node_budget,
            time_limit,
        )?;
        let v = self.with(py, move |s| {
            let mb = s.max_batch(&req, batch_dim.as_deref(), budget)?;
            graphopt::max_batch_json(&mb, default_dim, false)
        })?;
        to_py(py, &v)
    }

    /// Runs the model in graphopt's runtime (one arena of exactly the
    /// planned size) on `inputs` (dict of arrays by input name, an .npz
    /// path, or None for seeded random inputs) and returns the outputs by
    /// name as numpy arrays that view the runtime's memory. With
    /// `return_report=True`, returns `(outputs, report)`, the report being
    /// `graphopt run --json`'s. `device="cuda"` runs on the CUDA backend
    /// (built, not yet run on a GPU); without a GPU it raises GraphoptError
    /// with the CLI's message.
    #[pyo3(signature = (inputs=None, device="cpu", dims=None, repeat=1, poison=false,
                        threads=None, seed=7, return_report=false))]
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
    ) -> PyResult<Bound<'py, PyAny>> {
        let device = match device {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda,
            other => {
                return Err(gmsg(format!(
                    "device '{other}': expected \"cpu\" or \"cuda\""
                )))
            }
        };
        let dims = dims_arg(dims)?;
        let opts = RunOptions {
            inputs: inputs_arg(&self.info(py), inputs, seed, &dims)?,
            dims,
            device,
            repeat,
            poison,
            threads,
            tamper: None,
        };
        let mut r = self.with(py, move |s| {
            let r = s.run(&opts)?;
            match &r.poison {
                Some(p) if !p.ok => Err(graphopt::Error::new(format!(
                    "{}: poison reached output(s) {}: the plan frees or overlaps a tensor that is still read",
                    s.label(),
                    p.poisoned_outputs.join(", ")
                ))),
                _ => Ok(r),
            }
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
            inputs: inputs_arg(&self.info(py), inputs, seed, &dims)?,
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

// ---- module functions --------------------------------------------------------

/// Loads a model: a path (str or os.PathLike; external data beside it is
/// resolved), ONNX bytes (bytes, bytearray, memoryview), or an object with
/// `SerializeToString()` such as `onnx.ModelProto`.
#[pyfunction]
fn load(py: Python<'_>, model: &Bound<'_, PyAny>) -> PyResult<PySession> {
    if let Some(p) = path_arg(model)? {
        let s = py.detach(|| Session::load(&p)).map_err(gerr)?;
        return Ok(PySession::new(s, Vec::new()));
    }
    let bytes_obj = if model.hasattr("SerializeToString")? {
        model.call_method0("SerializeToString")?
    } else {
        model.clone()
    };
    // bytes without a copy; bytearray and memoryview through one copy.
    let owned: Vec<u8>;
    let bytes: &[u8] = if let Ok(b) = bytes_obj.cast::<PyBytes>() {
        b.as_bytes()
    } else if bytes_obj.is_instance_of::<PyByteArray>()
        || bytes_obj.is_instance_of::<PyMemoryView>()
    {
        owned = py
            .import("builtins")?
            .getattr("bytes")?
            .call1((&bytes_obj,))?
            .cast::<PyBytes>()?
            .as_bytes()
            .to_vec();
        &owned
    } else {
        return Err(PyTypeError::new_err(format!(
            "load: expected a path, ONNX bytes, or an object with SerializeToString(), not {}",
            bytes_obj.get_type().name()?
        )));
    };
    let s = py.detach(|| Session::from_bytes(bytes)).map_err(gerr)?;
    Ok(PySession::new(s, Vec::new()))
}

/// Every pass: `(name, one-line doc)`, as `graphopt passes` lists them.
#[pyfunction]
fn passes() -> Vec<(String, String)> {
    graphopt::passes::registry()
        .iter()
        .map(|p| (p.name.to_string(), p.doc.to_string()))
        .collect()
}

/// Runs the `graphopt` command with `argv` (argv[0] is the program name)
/// and returns its exit status: the same code as the Rust binary
/// (`graphopt_cli::main_with_args`). Prints to the process's stdout and
/// stderr.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| graphopt_cli::main_with_args(argv))
}

#[pymodule]
fn _graphopt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("GraphoptError", m.py().get_type::<GraphoptError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PySession>()?;
    m.add_class::<TensorBuffer>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(passes, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    Ok(())
}
