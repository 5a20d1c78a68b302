//! Conversions between Python and the facade: serde reports as Python
//! objects, numpy arrays as runtime tensors and back (one copy in, none out).

use crate::gmsg;
use graphopt::ir::DType;
use graphopt::HostTensor;
use numpy::ndarray::ArrayView1;
use numpy::{PyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString, PyTuple};
use serde_json::Value;

/// A serde value (a facade report) as Python objects: objects become
/// dicts, arrays lists, numbers int or float.
pub(crate) fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
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

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> graphopt::Result<Value> {
    serde_json::to_value(v).map_err(|e| graphopt::Error::new(format!("cannot report: {e}")))
}

pub(crate) fn dtype_of_numpy(name: &str) -> Option<DType> {
    Some(match name {
        "float32" => DType::F32,
        "float64" => DType::F64,
        "float16" => DType::F16,
        "int8" => DType::I8,
        "int16" => DType::I16,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "bool" => DType::Bool,
        _ => return None,
    })
}

pub(crate) fn numpy_of_dtype(dt: DType) -> Option<&'static str> {
    Some(match dt {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        _ => return None,
    })
}

/// A numpy array as a host tensor: one copy from numpy's buffer.
pub(crate) fn array_to_tensor(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<HostTensor> {
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
    let (dt, size) = dtype_of_numpy(&dname)
        .and_then(|d| Some((d, graphopt::exec::tensor::elem_size(d)?)))
        .ok_or_else(|| {
            gmsg(format!(
                "input '{name}': dtype {dname} is not supported (float16/32/64, int8-64, uint8-64, bool)"
            ))
        })?;
    let shape: Vec<usize> = arr.shape().to_vec();
    let nbytes = arr.len() * size;
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
    let data = if dt == DType::Bool {
        // Only 0 and 1 are valid bools.
        bytes.iter().map(|&b| u8::from(b != 0)).collect()
    } else {
        bytes.to_vec()
    };
    Ok(HostTensor {
        dtype: dt,
        shape,
        data,
    })
}

/// Keeps a runtime output alive for the numpy arrays that view it.
#[pyclass(frozen, module = "graphopt._graphopt")]
pub(crate) struct TensorBuffer {
    tensor: HostTensor,
}

/// A runtime output as a numpy array viewing its bytes (no copy).
pub(crate) fn tensor_to_array<'py>(py: Python<'py>, t: HostTensor) -> PyResult<Bound<'py, PyAny>> {
    let dname = numpy_of_dtype(t.dtype)
        .ok_or_else(|| gmsg(format!("output type {:?} has no numpy dtype here", t.dtype)))?;
    let shape: Vec<usize> = t.shape.clone();
    if t.data.is_empty() {
        let np = py.import("numpy")?;
        return np.call_method1("empty", (PyTuple::new(py, shape)?, dname));
    }
    let owner = Bound::new(py, TensorBuffer { tensor: t })?;
    let (ptr, len) = {
        let b = &owner.get().tensor.data;
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
