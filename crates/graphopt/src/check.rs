//! Numerical comparison of two models on the same inputs, output by output
//! (`graphopt check A B`, in the style of Polygraphy's `run`). The output
//! comparison itself is [`graphopt_tract::compare`], which precision
//! validation and the tests use too.
//!
//! Models run in tract. A node computing in fp16 runs in fp32 between
//! Casts ([`graphopt_tract::fp16_proxy`]), as onnxruntime's CPU provider runs
//! it; values stay rounded to fp16 between nodes.

use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::session::Session;
use graphopt_ir::{DType, Model};
pub use graphopt_tract::compare::{compare_outputs, same_bits, OutputDiff, Scale, Tolerance};
use graphopt_tract::TractTensor;
use serde::Serialize;
use tract_onnx::prelude::DatumType;

/// How [`Session::check`] compares.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    pub inputs: Inputs,
    pub tolerance: Tolerance,
}

/// What [`Session::check`] found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub reference: String,
    pub candidate: String,
    /// Where the inputs came from.
    pub inputs: String,
    pub tolerance: Tolerance,
    pub outputs: Vec<OutputDiff>,
    /// Every output within tolerance.
    pub ok: bool,
}

impl CheckReport {
    /// An error naming the outputs out of tolerance, if any.
    pub fn require_ok(&self) -> Result<()> {
        if self.ok {
            return Ok(());
        }
        let bad: Vec<String> = self
            .outputs
            .iter()
            .filter(|o| !o.ok)
            .map(|o| match &o.error {
                Some(e) => format!("'{}' ({e})", o.name),
                None => format!(
                    "'{}' ({} of {} elements off, max abs {:.3e}, rel L2 {:.3e})",
                    o.name, o.mismatched, o.elements, o.max_abs, o.rel_l2
                ),
            })
            .collect();
        Err(Error::new(format!(
            "{}: outputs differ from {} beyond rtol {} atol {}: {}",
            self.candidate,
            self.reference,
            self.tolerance.rtol,
            self.tolerance.atol,
            bad.join(", ")
        )))
    }
}

impl Session {
    /// Runs this model (the reference) and `other` on the same inputs in
    /// tract and compares every output by name.
    pub fn check(&self, other: &Session, opts: &CheckOptions) -> Result<CheckReport> {
        opts.validate()?;
        let (inputs, label) = opts
            .inputs
            .materialize(&self.model)
            .map_err(|e| self.err(e))?;
        let reference = run_in_tract(&self.model, &[], &inputs)
            .map_err(|e| self.err(Error::runtime(format!("tract cannot run it: {e}"))))?;
        // The candidate's inputs by name (it may order them differently).
        let names_a = runtime_input_names(&self.model);
        let names_b = runtime_input_names(&other.model);
        let mut inputs_b = Vec::new();
        for n in &names_b {
            let i = names_a.iter().position(|a| a == n).ok_or_else(|| {
                other.err(Error::new(format!(
                    "input '{n}' is not an input of {}",
                    self.label()
                )))
            })?;
            inputs_b.push(inputs[i].clone());
        }
        let got = run_in_tract(&other.model, &[], &inputs_b)
            .map_err(|e| other.err(Error::runtime(format!("tract cannot run it: {e}"))))?;
        // Outputs matched by name.
        let out_a = output_names(&self.model);
        let out_b = output_names(&other.model);
        let mut names = Vec::new();
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        for (i, n) in out_a.iter().enumerate() {
            let j = out_b
                .iter()
                .position(|b| b == n)
                .ok_or_else(|| other.err(Error::new(format!("it has no output named '{n}'"))))?;
            names.push(n.clone());
            ra.push(reference[i].clone());
            rb.push(got[j].clone());
        }
        let outputs = compare_outputs(&names, &ra, &rb, &opts.tolerance);
        Ok(CheckReport {
            reference: self.label(),
            candidate: other.label(),
            inputs: label,
            tolerance: opts.tolerance,
            ok: outputs.iter().all(|o| o.ok),
            outputs,
        })
    }
}

/// Names of the graph inputs without an initializer, in order.
pub(crate) fn runtime_input_names(m: &Model) -> Vec<String> {
    let g = &m.graph;
    g.runtime_inputs().map(|v| g.name(v).to_string()).collect()
}

pub(crate) fn output_names(m: &Model) -> Vec<String> {
    m.graph
        .outputs
        .iter()
        .map(|&v| m.graph.name(v).to_string())
        .collect()
}

/// Runs `m` in tract (fp16 nodes through [`graphopt_tract::fp16_proxy`])
/// with the values `extra` as outputs after the model's own. Float inputs
/// are cast to the dtype the model declares (fp16 inputs after
/// `--no-keep-io-types`).
pub(crate) fn run_in_tract(
    m: &Model,
    extra: &[String],
    inputs: &[TractTensor],
) -> anyhow::Result<Vec<TractTensor>> {
    let mut m = graphopt_tract::fp16_proxy(m)?;
    for n in extra {
        if let Some(v) = m.graph.value_by_name(n) {
            m.graph.outputs.push(v);
        }
    }
    let inputs = as_declared(&m, inputs)?;
    let bytes = graphopt_tract::prepare(&m)?;
    graphopt_tract::run_bytes(&bytes, &inputs)
}

/// The runtime inputs with float ones cast to the float type the model
/// declares for them (fp16 inputs after `--no-keep-io-types`).
pub(crate) fn as_declared(m: &Model, inputs: &[TractTensor]) -> anyhow::Result<Vec<TractTensor>> {
    let g = &m.graph;
    let mut inputs = inputs.to_vec();
    for (t, v) in inputs.iter_mut().zip(g.runtime_inputs()) {
        let want = match g.ty(v).and_then(|ty| ty.elem()) {
            Some(DType::F16) => DatumType::F16,
            Some(DType::F32) => DatumType::F32,
            Some(DType::F64) => DatumType::F64,
            _ => continue,
        };
        if t.datum_type().is_float() && t.datum_type() != want {
            *t = t.cast_to_dt(want)?.into_owned();
        }
    }
    Ok(inputs)
}
