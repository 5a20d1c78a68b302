//! Python arguments as the facade's options: dims, shapes, paths, name
//! lists, budgets and inputs.

use crate::convert::array_to_tensor;
use crate::{gerr, gmsg};
use graphopt::{HostTensor, Inputs};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::path::PathBuf;

/// `dims={"batch": 8}` as `NAME=VALUE` bindings, in the dict's order.
pub(crate) fn dims_arg(dims: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, i64)>> {
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
pub(crate) fn shapes_arg(shapes: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, Vec<i64>)>> {
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
pub(crate) fn path_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<PathBuf>> {
    if obj.is_instance_of::<PyString>() || obj.hasattr("__fspath__")? {
        return Ok(Some(obj.extract::<PathBuf>()?));
    }
    Ok(None)
}

/// Pass names: `"a,b"` or `["a", "b"]`.
pub(crate) fn list_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
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
pub(crate) fn parse_budget(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(b) = obj.extract::<u64>() {
        return Ok(b);
    }
    let s: String = obj
        .extract()
        .map_err(|_| PyTypeError::new_err("budget: expected bytes (int) or a size like '8GiB'"))?;
    graphopt::util::parse_size(&s).map_err(|e| gmsg(format!("budget {e}")))
}

/// `inputs=`: `None` (seeded random inputs), an `.npz` path, or a dict of
/// arrays by input name (the library checks the names against the model's
/// runtime inputs).
pub(crate) fn inputs_arg(
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
    Ok(Inputs::Named(named_arrays(d)?))
}

/// A dict of numpy arrays as named host tensors, in the dict's order.
pub(crate) fn named_arrays(d: &Bound<'_, PyDict>) -> PyResult<Vec<(String, HostTensor)>> {
    d.iter()
        .map(|(k, v)| {
            let name: String = k.extract()?;
            let t = array_to_tensor(&name, &v)?;
            Ok((name, t))
        })
        .collect()
}

/// Input shapes for a plan: from an `.npz` path or a dict of arrays.
pub(crate) fn input_shapes(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, Vec<i64>)>> {
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

/// Training data: an .npz path or a directory of shards, a dict of arrays,
/// or an iterable of dicts (concatenated along the example axis).
pub(crate) fn array_data(
    obj: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<Box<dyn graphopt::DataSource + Send>> {
    if let Some(p) = path_arg(obj)? {
        let d = graphopt::MappedData::open(&p).map_err(crate::gerr)?;
        return Ok(Box::new(d));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let d = graphopt::ArrayData::new(named_arrays(d)?, what).map_err(crate::gerr)?;
        return Ok(Box::new(d));
    }
    let mut shards = Vec::new();
    for (i, item) in obj
        .try_iter()
        .map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{what}: expected an .npz path, a directory, a dict of numpy arrays or an iterable of dicts"
            ))
        })?
        .enumerate()
    {
        let item = item?;
        let d = item.cast::<PyDict>().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{what}: item {i} is not a dict of numpy arrays"
            ))
        })?;
        shards.push((format!("{what}[{i}]"), named_arrays(d)?));
    }
    let d = graphopt::ArrayData::concat(shards, what).map_err(crate::gerr)?;
    Ok(Box::new(d))
}

/// A memory budget: bytes (int), a size ("2GiB") or a percent ("40%").
pub(crate) fn parse_remat_budget(budget: &Bound<'_, PyAny>) -> PyResult<graphopt::Budget> {
    match budget.extract::<u64>() {
        Ok(b) => Ok(graphopt::Budget::Bytes(b)),
        Err(_) => {
            let s: String = budget.extract().map_err(|_| {
                PyTypeError::new_err("budget: expected bytes (int), a size like '2GiB' or 'PCT%'")
            })?;
            graphopt::Budget::parse(&s).map_err(gerr)
        }
    }
}
