//! Where the inputs of a numerical comparison come from.

use crate::error::{Error, Result};
use graphopt_ir::Model;
use graphopt_tract::TractTensor;
use std::path::PathBuf;

/// Inputs for [`crate::Session::check`] and precision validation.
#[derive(Clone, Debug)]
pub enum Inputs {
    /// Seeded random inputs: floats uniform in [-1, 1), integers in {0, 1}
    /// (valid token, type and position ids), booleans true. Symbolic dims
    /// come from `dims`, else `default_dim`.
    Random {
        seed: u64,
        dims: Vec<(String, i64)>,
        default_dim: i64,
    },
    /// Arrays named like the model's inputs in a numpy `.npz` (`np.savez`).
    Npz(PathBuf),
    /// Tensors in the order of the model's runtime inputs.
    Tensors(Vec<TractTensor>),
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs::Random {
            seed: 7,
            dims: Vec::new(),
            default_dim: 4,
        }
    }
}

impl Inputs {
    /// Seeded random inputs with these dims bound (others 4).
    pub fn random(dims: &[(String, i64)]) -> Inputs {
        Inputs::Random {
            seed: 7,
            dims: dims.to_vec(),
            default_dim: 4,
        }
    }

    /// The tensors for `model`'s runtime inputs, and a label for reports.
    /// Given data (an npz, tensors) holding NaN or Inf is an error naming
    /// the array ([`crate::util::ensure_finite`]).
    pub fn materialize(&self, model: &Model) -> Result<(Vec<TractTensor>, String)> {
        let (t, label) = self.read(model)?;
        if !matches!(self, Inputs::Random { .. }) {
            crate::validate::ensure_finite(&label, named(model, &t))?;
        }
        Ok((t, label))
    }

    fn read(&self, model: &Model) -> Result<(Vec<TractTensor>, String)> {
        match self {
            Inputs::Random {
                seed,
                dims,
                default_dim,
            } => Ok((
                graphopt_tract::sample_inputs(model, dims, *default_dim, *seed)?,
                format!("seeded random (seed {seed})"),
            )),
            Inputs::Npz(p) => Ok((
                graphopt_tract::npz::read_inputs(p, model).map_err(Error::from)?,
                p.display().to_string(),
            )),
            Inputs::Tensors(t) => Ok((t.clone(), "given tensors".into())),
        }
    }
}

/// `tensors` (in the order of `model`'s runtime inputs) by input name.
pub(crate) fn named<'a>(
    model: &'a Model,
    tensors: &'a [TractTensor],
) -> impl Iterator<Item = (&'a str, &'a TractTensor)> {
    let g = &model.graph;
    g.runtime_inputs().map(|v| g.name(v)).zip(tensors)
}
