//! tract as graphopt's in-Rust reference executor.
//!
//! Tests and `--validate` run the unoptimized and the optimized model on the
//! same inputs and compare. tract has no model-local functions, sparse
//! initializers or sequence ops; callers skip such models (or use
//! onnxruntime from Python).

use anyhow::{bail, Context};
use graphopt_ir::{DType, Dim, Model};
use std::path::Path;
use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::DimLike;

pub mod compare;
pub mod fp16;
pub mod npz;

pub use fp16::fp16_proxy;
pub use tract_onnx::prelude::Tensor as TractTensor;

/// An IR tensor as a tract tensor of the same type and shape (float,
/// double and int64: the types of parameters, optimizer state and feeds).
pub fn from_ir(t: &graphopt_ir::Tensor) -> anyhow::Result<Tensor> {
    let shape: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    let unreadable = || anyhow::anyhow!("unreadable {} tensor", t.dtype);
    Ok(match t.dtype {
        DType::F32 => {
            let v: Vec<f32> = t
                .to_f64_vec()
                .ok_or_else(unreadable)?
                .into_iter()
                .map(|x| x as f32)
                .collect();
            Tensor::from_shape(&shape, &v)?
        }
        DType::F64 => Tensor::from_shape(&shape, &t.to_f64_vec().ok_or_else(unreadable)?)?,
        DType::I64 => Tensor::from_shape(&shape, &t.to_i64_vec().ok_or_else(unreadable)?)?,
        other => bail!("{other} tensors are not converted yet (float, double, int64)"),
    })
}

/// A model compiled by tract for fixed input shapes.
pub struct Runner {
    plan: std::sync::Arc<TypedRunnableModel>,
}

impl Runner {
    /// Loads an ONNX file (external data resolved beside it) with the given
    /// inputs' shapes and types fixed.
    pub fn from_path(path: &Path, inputs: &[Tensor]) -> anyhow::Result<Runner> {
        let m = tract_onnx::onnx()
            .model_for_path(path)
            .with_context(|| format!("tract cannot load {}", path.display()))?;
        Runner::finish(m, inputs)
    }

    /// Loads an in-memory ONNX model (no external data).
    pub fn from_bytes(bytes: &[u8], inputs: &[Tensor]) -> anyhow::Result<Runner> {
        let m = tract_onnx::onnx()
            .model_for_read(&mut std::io::Cursor::new(bytes))
            .context("tract cannot load the model")?;
        Runner::finish(m, inputs)
    }

    fn finish(mut m: InferenceModel, inputs: &[Tensor]) -> anyhow::Result<Runner> {
        if m.inputs.len() != inputs.len() {
            bail!(
                "the model has {} inputs, {} given",
                m.inputs.len(),
                inputs.len()
            );
        }
        for (i, t) in inputs.iter().enumerate() {
            m = m.with_input_fact(i, InferenceFact::dt_shape(t.datum_type(), t.shape()))?;
        }
        let plan = m.into_optimized()?.into_runnable()?;
        Ok(Runner { plan })
    }

    pub fn run(&self, inputs: &[Tensor]) -> anyhow::Result<Vec<Tensor>> {
        let out = self
            .plan
            .run(inputs.iter().cloned().map(|t| t.into_tvalue()).collect())?;
        Ok(out.into_iter().map(|t| t.into_tensor()).collect())
    }
}

/// Encodes `model` for tract: intermediate `value_info` is dropped (tract
/// cannot unify the exporters' symbolic intermediate shapes with concrete
/// input shapes), everything else is kept. Use the same preparation for the
/// reference and the candidate.
pub fn prepare(model: &Model) -> anyhow::Result<Vec<u8>> {
    prepare_owned(model.clone())
}

/// [`prepare`] on a model the caller no longer needs (no copy of the
/// weights).
pub fn prepare_owned(mut m: Model) -> anyhow::Result<Vec<u8>> {
    // tract reads dense initializers only.
    m.graph.densify_sparse_initializers();
    strip_value_info(&mut m.graph);
    Ok(graphopt_onnx::encode(&m)?)
}

fn strip_value_info(g: &mut graphopt_ir::Graph) {
    for v in std::mem::take(&mut g.value_info) {
        if !g.is_input(v) && !g.is_output(v) {
            g.value_mut(v).ty = None;
        }
    }
    for n in g.nodes().collect::<Vec<_>>() {
        for a in &mut g.node_mut(n).attributes {
            for sub in a.graphs_mut() {
                strip_value_info(sub);
            }
        }
    }
}

/// Runs a model file once.
pub fn run_path(path: &Path, inputs: &[Tensor]) -> anyhow::Result<Vec<Tensor>> {
    guard(|| Runner::from_path(path, inputs)?.run(inputs))
}

/// Runs an in-memory model once.
pub fn run_bytes(bytes: &[u8], inputs: &[Tensor]) -> anyhow::Result<Vec<Tensor>> {
    guard(|| Runner::from_bytes(bytes, inputs)?.run(inputs))
}

/// tract panics on some inputs it does not support; make that an error.
pub fn guard<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            bail!("tract panicked: {msg}")
        }
    }
}

fn datum(d: DType) -> Option<DatumType> {
    Some(match d {
        DType::F32 => f32::datum_type(),
        DType::F64 => f64::datum_type(),
        DType::F16 => f16::datum_type(),
        DType::I64 => i64::datum_type(),
        DType::I32 => i32::datum_type(),
        DType::I16 => i16::datum_type(),
        DType::I8 => i8::datum_type(),
        DType::U8 => u8::datum_type(),
        DType::U16 => u16::datum_type(),
        DType::U32 => u32::datum_type(),
        DType::U64 => u64::datum_type(),
        DType::Bool => bool::datum_type(),
        _ => return None,
    })
}

/// Deterministic sample inputs for the model's runtime inputs (graph inputs
/// without an initializer): floats uniform in [-1, 1), integers in {0, 1} (valid token, type and position ids),
/// booleans true. Symbolic dims come from `dims`, else `default_dim`.
pub fn sample_inputs(
    model: &Model,
    dims: &[(String, i64)],
    default_dim: i64,
    seed: u64,
) -> anyhow::Result<Vec<Tensor>> {
    let g = &model.graph;
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(2685821657736338717)
    };
    let mut out = Vec::new();
    for &v in &g.inputs {
        if g.initializer(v).is_some() {
            continue;
        }
        let name = g.name(v);
        let ty = g
            .ty(v)
            .with_context(|| format!("input '{name}' has no type"))?;
        let elem = ty
            .elem()
            .with_context(|| format!("input '{name}' is not a tensor"))?;
        let dt = datum(elem)
            .with_context(|| format!("input '{name}': dtype {elem} is not supported here"))?;
        let shape: Vec<usize> = ty
            .shape()
            .with_context(|| format!("input '{name}' has unknown rank"))?
            .dims
            .iter()
            .map(|d| {
                let k = match d {
                    // Old exporters write -1 for a free dim.
                    Dim::Known(k) if *k >= 0 => *k,
                    Dim::Known(_) | Dim::Unknown => default_dim,
                    Dim::Sym(s) => dims
                        .iter()
                        .find(|(n, _)| n == s)
                        .map(|x| x.1)
                        .unwrap_or(default_dim),
                };
                usize::try_from(k).unwrap_or(0)
            })
            .collect();
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= 1 << 31)
            .with_context(|| format!("input '{name}': sample shape {shape:?} is too large"))?;
        let f: Vec<f32> = (0..n)
            .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
            .collect();
        let t = if elem.is_float() {
            tract_ndarray::ArrayD::from_shape_vec(shape.clone(), f)?
                .into_tensor()
                .cast_to_dt(dt)?
                .into_owned()
        } else if elem == DType::Bool {
            tract_ndarray::ArrayD::from_elem(shape.clone(), true).into_tensor()
        } else {
            let ints: Vec<i64> = (0..n).map(|_| (next() >> 63) as i64).collect();
            tract_ndarray::ArrayD::from_shape_vec(shape.clone(), ints)?
                .into_tensor()
                .cast_to_dt(dt)?
                .into_owned()
        };
        out.push(t);
    }
    Ok(out)
}

/// Ensures the `DimLike` import is used (symbolic facts in later versions).
#[doc(hidden)]
pub fn _dim_like_marker<D: DimLike>(_: D) {}
