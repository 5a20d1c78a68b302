//! Running a model on host inputs to calibrate it or to measure another
//! model against it, in one of two engines with the other as the fallback:
//! graphopt's own runtime (it runs If, Loop, Scan, CumSum, DFT/STFT front
//! ends ...) and tract (faster on convolutions today, and it has kernels
//! the runtime lacks, such as Resize).
//!
//! A [`Reference`] holds one model and the extra values to return after
//! its outputs, and keeps one compiled plan per input shapes, so a model
//! run on several batches of one shape is planned once. The runtime plans
//! a copy lowered by `graphopt_exec::lower::lower_coded` (palettized and
//! integer weights decoded in their readers' kernels; a weight asked for as an
//! extra value keeps its plain decode chain).

use crate::check::as_declared;
use crate::run::{to_host, to_tract};
use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::Model;
use graphopt_plan::{DimValues, PlanOptions};
use graphopt_tract::TractTensor;

/// Which executor ran a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    Runtime,
    Tract,
}

impl Engine {
    pub(crate) fn other(self) -> Engine {
        match self {
            Engine::Runtime => Engine::Tract,
            Engine::Tract => Engine::Runtime,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::Runtime => "graphopt's runtime",
            Engine::Tract => "tract",
        }
    }
}

type Shapes = Vec<Vec<usize>>;

/// One model, run on batches by one engine, the other as the fallback.
pub(crate) struct Reference {
    model: Model,
    first: Engine,
    /// Why the first engine could not run the model (then the other runs it).
    refused: Option<String>,
    /// `model` lowered for the CPU backend (palettized weights decoded in
    /// their readers' kernels), made on the first runtime run.
    lowered: Option<Model>,
    compiled: Vec<(Shapes, Executable)>,
    /// tract's form of the model (fp16 proxied, encoded) and its compiled
    /// plans per input shapes.
    tract_bytes: Option<Vec<u8>>,
    tract: Vec<(Shapes, graphopt_tract::Runner)>,
    threads: usize,
}

impl Reference {
    /// `extra`: main-graph values returned after the model's outputs
    /// (names that are not main-graph values are skipped, as in tract).
    /// `first`: the engine tried first.
    pub(crate) fn new(model: &Model, extra: &[String], first: Engine) -> Reference {
        let mut m = model.clone();
        for n in extra {
            if let Some(v) = m.graph.value_by_name(n) {
                if !m.graph.outputs.contains(&v) {
                    m.graph.outputs.push(v);
                }
            }
        }
        Reference {
            model: m,
            first,
            refused: None,
            lowered: None,
            compiled: Vec::new(),
            tract_bytes: None,
            tract: Vec::new(),
            threads: graphopt_plan::default_threads(),
        }
    }

    /// The engine that ran the last batch, and why the first one did not
    /// (if it did not).
    pub(crate) fn engine(&self) -> (Engine, Option<&str>) {
        match &self.refused {
            None => (self.first, None),
            Some(why) => (self.first.other(), Some(why)),
        }
    }

    /// The outputs, then the extra values, for one batch of runtime inputs.
    pub(crate) fn run(&mut self, inputs: &[TractTensor]) -> Result<Vec<TractTensor>, String> {
        if self.refused.is_none() {
            match self.run_on(self.first, inputs) {
                Ok(o) => return Ok(o),
                Err(e) => self.refused = Some(e),
            }
        }
        let second = self.first.other();
        self.run_on(second, inputs).map_err(|e| {
            format!(
                "{} cannot run it ({}) and neither can {}: {e}",
                self.first.name(),
                self.refused.as_deref().unwrap_or("?"),
                second.name()
            )
        })
    }

    fn run_on(&mut self, e: Engine, inputs: &[TractTensor]) -> Result<Vec<TractTensor>, String> {
        match e {
            Engine::Runtime => self.run_runtime(inputs),
            Engine::Tract => self.run_tract(inputs).map_err(|e| format!("{e:#}")),
        }
    }

    /// As `check::run_in_tract`, with the compiled plan kept per input shapes.
    fn run_tract(&mut self, inputs: &[TractTensor]) -> anyhow::Result<Vec<TractTensor>> {
        if self.tract_bytes.is_none() {
            let m = graphopt_tract::fp16_proxy(&self.model)?;
            self.tract_bytes = Some(graphopt_tract::prepare_owned(m)?);
        }
        let inputs = as_declared(&self.model, inputs)?;
        let shapes: Shapes = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let slot = match self.tract.iter().position(|(s, _)| *s == shapes) {
            Some(i) => i,
            None => {
                let bytes = self.tract_bytes.as_deref().expect("set above");
                let r =
                    graphopt_tract::guard(|| graphopt_tract::Runner::from_bytes(bytes, &inputs))?;
                self.tract.push((shapes, r));
                self.tract.len() - 1
            }
        };
        let r = &self.tract[slot].1;
        graphopt_tract::guard(|| r.run(&inputs))
    }

    fn run_runtime(&mut self, inputs: &[TractTensor]) -> Result<Vec<TractTensor>, String> {
        let g = &self.model.graph;
        let runtime: Vec<_> = g.runtime_inputs().collect();
        if runtime.len() != inputs.len() {
            return Err(format!(
                "{} inputs given, the model takes {}",
                inputs.len(),
                runtime.len()
            ));
        }
        let host: Vec<HostTensor> = as_declared(&self.model, inputs)
            .map_err(|e| format!("{e:#}"))?
            .iter()
            .map(to_host)
            .collect::<crate::Result<_>>()
            .map_err(|e| e.message().to_string())?;
        let shapes: Shapes = host.iter().map(|h| h.shape.clone()).collect();
        let slot = match self.compiled.iter().position(|(s, _)| *s == shapes) {
            Some(i) => i,
            None => {
                let dims = DimValues {
                    bound: Vec::new(),
                    shapes: runtime
                        .iter()
                        .zip(&shapes)
                        .map(|(&v, s)| {
                            (g.name(v).to_string(), s.iter().map(|&d| d as i64).collect())
                        })
                        .collect(),
                    default: None,
                };
                // Greedy placements in program order: the plan only has to
                // be valid, not small.
                let opts = PlanOptions {
                    reorder: false,
                    search: false,
                    ..PlanOptions::default()
                };
                let model = self
                    .lowered
                    .get_or_insert_with(|| graphopt_exec::lower::lowered_copy(&self.model).0);
                let mp =
                    graphopt_plan::plan_model(model, &dims, &opts).map_err(|e| e.to_string())?;
                let exe =
                    Executable::new(&mp.model, &mp.plan, &CpuBackend).map_err(|e| e.to_string())?;
                self.compiled.push((shapes, exe));
                self.compiled.len() - 1
            }
        };
        let ropts = RunOptions {
            threads: self.threads,
            poison: false,
        };
        let (out, _) = self.compiled[slot]
            .1
            .run(&host, &ropts)
            .map_err(|e| e.to_string())?;
        out.iter()
            .map(|h| to_tract(h).map_err(|e| e.message().to_string()))
            .collect()
    }
}

/// Runs `model` once on `inputs` (see [`Reference`]).
pub(crate) fn run_once(
    model: &Model,
    extra: &[String],
    inputs: &[TractTensor],
    first: Engine,
) -> Result<(Vec<TractTensor>, Engine), String> {
    let mut r = Reference::new(model, extra, first);
    let out = r.run(inputs)?;
    Ok((out, r.engine().0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runtime runs a palettized weight's reader fused (the lowered
    /// copy), tract the decode chain as written: same outputs; a weight
    /// asked for as an extra value keeps its chain and comes out decoded.
    #[test]
    fn palettized_weights_run_lowered_in_the_runtime() {
        let m = graphopt_text::parse_model(
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2,4] x) => (float[2,3] y)
            <uint8[4,3] W_palette_indices = {0, 1, 2, 3, 3, 2, 1, 0, 0, 0, 1, 1},
             float[4] W_palette_codebook = {-1.5, 0.25, 2.0, 3.5}>
            {
              W_palette_indices_i32 = Cast <to: int = 6> (W_palette_indices)
              W = Gather <axis: int = 0> (W_palette_codebook, W_palette_indices_i32)
              y = MatMul (x, W)
            }"#,
        )
        .unwrap();
        let x = [0.5f32, -1.0, 2.0, 0.0, 0.25, -0.75, 1.0, 3.0];
        let t = || TractTensor::from_shape(&[2, 4], &x).unwrap();
        let f32s = |t: &TractTensor| to_host(t).unwrap().to_f32().unwrap();
        let mut r = Reference::new(&m, &[], Engine::Runtime);
        let y = r.run(&[t()]).unwrap();
        assert_eq!(r.engine(), (Engine::Runtime, None));
        let lowered = r.lowered.as_ref().expect("planned from the lowered copy");
        assert!(lowered
            .graph
            .nodes()
            .any(|n| lowered.graph.node(n).op_type == "PaletteMatMul"));
        let (want, _) = run_once(&m, &[], &[t()], Engine::Tract).unwrap();
        assert_eq!(f32s(&y[0]), f32s(&want[0]));
        let (yw, ran) = run_once(&m, &["W".into()], &[t()], Engine::Runtime).unwrap();
        assert_eq!(ran, Engine::Runtime);
        assert_eq!(f32s(&yw[0]), f32s(&want[0]));
        assert_eq!(
            f32s(&yw[1]),
            [-1.5, 0.25, 2.0, 3.5, 3.5, 2.0, 0.25, -1.5, -1.5, -1.5, 0.25, 0.25]
        );
    }
}
