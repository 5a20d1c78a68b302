//! Where the inputs of a numerical comparison come from.

use crate::error::{Error, Result};
use crate::run::{to_host, to_tract};
use graphopt_exec::HostTensor;
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
    /// Tensors in the order of the model's runtime inputs (graph inputs
    /// without an initializer).
    Tensors(Vec<HostTensor>),
    /// Tensors by input name: every runtime input, and no other name.
    Named(Vec<(String, HostTensor)>),
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

    /// The host tensors for `model`'s runtime inputs, and a label for
    /// reports; given tensors are taken as they are (no copy through tract).
    pub fn host(&self, model: &Model) -> Result<(Vec<HostTensor>, String)> {
        self.host_with(model, true)
    }

    /// [`Inputs::host`], refusing NaN and Inf in given data only when
    /// `check_finite`.
    pub fn host_with(
        &self,
        model: &Model,
        check_finite: bool,
    ) -> Result<(Vec<HostTensor>, String)> {
        let (t, label) = match self {
            Inputs::Tensors(t) => (t.clone(), "given tensors".to_string()),
            Inputs::Named(named) => (by_name(model, named)?, "given tensors".to_string()),
            _ => {
                let (t, label) = self.read(model)?;
                (t.iter().map(to_host).collect::<Result<_>>()?, label)
            }
        };
        if check_finite && !matches!(self, Inputs::Random { .. }) {
            let names = runtime_input_names(model);
            crate::validate::ensure_finite_host(&label, names.into_iter().zip(&t))?;
        }
        Ok((t, label))
    }

    /// The tensors for `model`'s runtime inputs as tract's, for the
    /// reference executor, and a label for reports. Given data (an npz,
    /// tensors) holding NaN or Inf is an error naming the array
    /// ([`crate::util::ensure_finite`]).
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
            Inputs::Tensors(t) => Ok((
                t.iter().map(to_tract).collect::<Result<_>>()?,
                "given tensors".into(),
            )),
            Inputs::Named(named) => Ok((
                by_name(model, named)?
                    .iter()
                    .map(to_tract)
                    .collect::<Result<_>>()?,
                "given tensors".into(),
            )),
        }
    }
}

/// `named` in the order of `model`'s runtime inputs: each exactly once, no
/// name the model lacks.
fn by_name(model: &Model, named: &[(String, HostTensor)]) -> Result<Vec<HostTensor>> {
    let g = &model.graph;
    let names: Vec<&str> = g.runtime_inputs().map(|v| g.name(v)).collect();
    if let Some((k, _)) = named.iter().find(|(k, _)| !names.contains(&k.as_str())) {
        return Err(Error::new(format!(
            "'{k}' is not an input of the model (inputs: {})",
            names.join(", ")
        )));
    }
    names
        .iter()
        .map(|n| {
            named
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, t)| t.clone())
                .ok_or_else(|| {
                    Error::new(format!(
                        "input '{n}' is missing (inputs: {})",
                        names.join(", ")
                    ))
                })
        })
        .collect()
}

fn runtime_input_names(model: &Model) -> Vec<&str> {
    let g = &model.graph;
    g.runtime_inputs().map(|v| g.name(v)).collect()
}

/// `tensors` (in the order of `model`'s runtime inputs) by input name.
pub(crate) fn named<'a>(
    model: &'a Model,
    tensors: &'a [TractTensor],
) -> impl Iterator<Item = (&'a str, &'a TractTensor)> {
    let g = &model.graph;
    g.runtime_inputs().map(|v| g.name(v)).zip(tensors)
}
