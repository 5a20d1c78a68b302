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

mod args;
mod convert;
mod distributed;
mod session;

use args::path_arg;
use convert::TensorBuffer;
use graphopt::Session;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};
use session::PySession;

create_exception!(
    graphopt,
    GraphoptError,
    PyException,
    "A graphopt error: one line naming the file and the node or tensor, as the CLI prints it; `kind` says what went wrong (io, parse, invalid, unsupported, tolerance, budget, verify, runtime)."
);

/// A facade error as `GraphoptError`, with its kind (`"io"`, `"parse"`,
/// `"invalid"`, `"unsupported"`, `"tolerance"`, `"budget"`, `"verify"`,
/// `"runtime"`) as the exception's `kind` attribute.
pub(crate) fn gerr(e: graphopt::Error) -> PyErr {
    with_kind(e.message().to_string(), e.kind().name())
}

/// An argument error of the binding itself (kind `"invalid"`).
pub(crate) fn gmsg(msg: impl Into<String>) -> PyErr {
    with_kind(msg.into(), graphopt::ErrorKind::Invalid.name())
}

fn with_kind(msg: String, kind: &'static str) -> PyErr {
    Python::attach(|py| {
        let err = GraphoptError::new_err(msg);
        // Setting an attribute on a fresh exception object cannot fail in
        // practice; if it did, the error would still carry its message.
        let _ = err.value(py).setattr("kind", kind);
        err
    })
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
    distributed::register(m)?;
    Ok(())
}
