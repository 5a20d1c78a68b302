//! [`Session`]: one model, where it came from, and what was done to it.

use crate::error::{Error, Result};
use crate::optimize::PassRunReport;
use graphopt_ir::Model;
use graphopt_onnx::{ExternalData, SaveReport};
use graphopt_passes::manager::PassRun;
use graphopt_plan::{DimValues, MaxBatch, ModelPlan, PlanOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Loads an ONNX file (external data resolved beside it, never outside
/// its folder) into a [`Session`].
pub fn load(path: impl AsRef<Path>) -> Result<Session> {
    Session::load(path)
}

/// A model and what graphopt did to it.
pub struct Session {
    pub(crate) model: Model,
    pub(crate) source: Option<PathBuf>,
    /// Some tensor data came from external files.
    pub(crate) used_external_data: bool,
    /// The input's nodes were not in topological order and were sorted.
    pub(crate) reordered: bool,
    /// Every pass run so far (optimize and lower_precision), in order.
    pub(crate) runs: Vec<PassRun>,
    /// Where `--dump-ir` text goes (stderr unless set).
    pub(crate) dump_sink: Option<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("source", &self.source)
            .field("nodes", &self.model.graph.node_count_deep())
            .field("pass_runs", &self.runs.len())
            .finish()
    }
}

/// Where and how to save.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaveOptions {
    /// `None`: external data when the input used it or the model would pass
    /// protobuf's 2 GiB limit. `Some(ExternalData::...)` to choose.
    pub external: Option<ExternalData>,
    /// File name of the external data beside the model (default: the
    /// model's file name plus `.data`).
    pub location: Option<String>,
}

/// What to plan at.
#[derive(Clone, Debug, Default)]
pub struct PlanRequest {
    pub dims: DimValues,
    pub options: PlanOptions,
    /// Re-check the plan with the independent checker
    /// (`graphopt_plan::check_graph_plan`); a rejected plan is an
    /// [`crate::ErrorKind::Verify`] error.
    pub verify: bool,
    /// Which graph is planned (default: the one `run` executes on the CPU).
    pub graph: PlanGraph,
}

/// The graph a plan is made for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlanGraph {
    /// The graph graphopt's CPU runtime executes: the model lowered for its
    /// kernels (fused elementwise chains, a Conv with its residual Add,
    /// compressed weights decoded where they are read;
    /// [`graphopt_exec::lower::lowered_copy`]). Its arena is the one
    /// [`Session::run`] allocates on the CPU.
    #[default]
    CpuRuntime,
    /// The model as written: what onnxruntime or the CUDA backend runs,
    /// and what `save` writes.
    AsWritten,
}

/// The planner's settings as the front ends take them, each optional;
/// [`PlanSettings::options`] fills the defaults and range-checks them.
#[derive(Clone, Debug, Default)]
pub struct PlanSettings {
    /// Offset alignment in bytes (default 256 for models, 1 for
    /// intervals): a power of two.
    pub alignment: Option<u64>,
    /// Node budget of the offset search (default 200,000; for intervals
    /// `graphopt_plan::default_node_budget`). At least 1.
    pub node_budget: Option<u64>,
    /// Search threads (default: the machine's); at least 1.
    pub threads: Option<usize>,
    /// Wall-clock limit of the offset search in seconds (opt-in); > 0.
    pub time_limit: Option<f64>,
    /// Keep the model's node order.
    pub no_reorder: bool,
    /// Unknown sizes are an error rather than dynamic allocations.
    pub strict: bool,
    /// Ignore the model's donation table (outputs planned apart from the
    /// inputs they would overwrite).
    pub no_donate: bool,
}

impl PlanSettings {
    /// The planner's options for a model.
    pub fn options(&self) -> Result<PlanOptions> {
        let d = PlanOptions::default();
        Ok(PlanOptions {
            alignment: self.alignment_or(d.alignment)?,
            reorder: !self.no_reorder,
            search: true,
            time_limit: self.time_limit()?,
            node_budget: self.node_budget_or(d.node_budget)?,
            threads: self.threads()?,
            strict: self.strict,
            donate: !self.no_donate,
        })
    }

    pub(crate) fn alignment_or(&self, default: u64) -> Result<u64> {
        match self.alignment {
            None => Ok(default),
            Some(a) if a >= 1 && a.is_power_of_two() => Ok(a),
            Some(a) => Err(Error::new(format!(
                "--alignment {a}: expected a power of two (1, 2, 4, ..., 256, ...)"
            ))),
        }
    }

    pub(crate) fn node_budget_or(&self, default: u64) -> Result<u64> {
        match self.node_budget {
            Some(0) => Err(Error::new("--nodes 0: expected at least 1")),
            n => Ok(n.unwrap_or(default)),
        }
    }

    pub(crate) fn threads(&self) -> Result<usize> {
        match self.threads {
            Some(0) => Err(Error::new("--threads 0: expected at least 1 thread")),
            n => Ok(n.unwrap_or_else(graphopt_plan::default_threads)),
        }
    }

    pub(crate) fn time_limit(&self) -> Result<Option<std::time::Duration>> {
        self.time_limit
            .map(|t| crate::util::seconds("--time-limit", t))
            .transpose()
    }
}

impl PlanRequest {
    /// Plan with these dims bound (others 1), default options.
    pub fn at(dims: &[(&str, i64)]) -> PlanRequest {
        PlanRequest {
            dims: DimValues::new(
                &dims
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect::<Vec<_>>(),
            ),
            ..PlanRequest::default()
        }
    }
}

impl Session {
    /// Loads an ONNX file. See [`load`].
    pub fn load(path: impl AsRef<Path>) -> Result<Session> {
        let path = path.as_ref();
        let loaded = graphopt_onnx::load(path)?;
        Ok(Session {
            model: loaded.model,
            source: Some(path.to_path_buf()),
            used_external_data: loaded.info.used_external_data,
            reordered: loaded.info.reordered,
            runs: Vec::new(),
            dump_sink: None,
        })
    }

    /// A session over an ONNX model in memory (no external data).
    pub fn from_bytes(bytes: &[u8]) -> Result<Session> {
        let loaded = graphopt_onnx::decode(bytes.to_vec().into(), None)?;
        let mut s = Session::from_model(loaded.model);
        s.reordered = loaded.info.reordered;
        Ok(s)
    }

    /// A session over a model built in memory.
    pub fn from_model(model: Model) -> Session {
        Session {
            model,
            source: None,
            used_external_data: false,
            reordered: false,
            runs: Vec::new(),
            dump_sink: None,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    pub fn into_model(self) -> Model {
        self.model
    }

    /// The file the model came from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// The input's tensor data came (partly) from external files.
    pub fn used_external_data(&self) -> bool {
        self.used_external_data
    }

    /// The input's nodes were out of topological order and were sorted.
    pub fn reordered(&self) -> bool {
        self.reordered
    }

    /// Every pass run so far, in order.
    pub fn pass_runs(&self) -> Vec<PassRunReport> {
        self.runs.iter().map(PassRunReport::from).collect()
    }

    /// Sends `--dump-ir` text here instead of stderr.
    pub fn set_dump_sink(&mut self, sink: Box<dyn Write + Send>) {
        self.dump_sink = Some(sink);
    }

    /// The file name for messages (`<memory>` for in-memory models).
    pub fn label(&self) -> String {
        self.source
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "<memory>".into())
    }

    /// Prefixes an error with the model's file.
    pub(crate) fn err(&self, e: impl Into<Error>) -> Error {
        e.into().within(&self.label())
    }

    /// Runs one step whole or not at all: when `f` fails, the model, its
    /// pass history and the flags are restored as they were before it
    /// (tensor data is shared between the copies, so the snapshot costs
    /// the graph's structure, not its weights).
    pub(crate) fn transact<R>(&mut self, f: impl FnOnce(&mut Session) -> Result<R>) -> Result<R> {
        let model = self.model.clone();
        let runs = self.runs.len();
        let flags = (self.used_external_data, self.reordered);
        match f(self) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.model = model;
                self.runs.truncate(runs);
                (self.used_external_data, self.reordered) = flags;
                Err(e)
            }
        }
    }

    /// Plans the model's memory at the request's dims (and checks the plan
    /// independently when `req.verify`).
    pub fn plan(&self, req: &PlanRequest) -> Result<ModelPlan> {
        req.validate()?;
        let planned = graphopt_plan::plan_model(&self.planned_graph(req), &req.dims, &req.options)
            .map_err(|e| self.err(e))?;
        if req.verify {
            self.verify_plan(&planned)?;
        }
        Ok(planned)
    }

    /// The model `req` plans: this session's, lowered for the CPU runtime
    /// or as written ([`PlanGraph`]).
    fn planned_graph(&self, req: &PlanRequest) -> std::borrow::Cow<'_, Model> {
        match req.graph {
            PlanGraph::CpuRuntime => {
                std::borrow::Cow::Owned(graphopt_exec::lower::lowered_copy(&self.model).0)
            }
            PlanGraph::AsWritten => std::borrow::Cow::Borrowed(&self.model),
        }
    }

    /// The independent checker on a plan of this session's model.
    pub fn verify_plan(&self, planned: &ModelPlan) -> Result<()> {
        graphopt_plan::check_graph_plan(&planned.model.graph, &planned.plan).map_err(|errs| {
            self.err(Error::verify(format!(
                "plan check failed: {}",
                errs.iter()
                    .map(|e| e.0.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            )))
        })
    }

    /// The largest batch (dim `batch_dim`, default the first symbolic input
    /// dim) whose weights + arena fit `budget` bytes.
    pub fn max_batch(
        &self,
        req: &PlanRequest,
        batch_dim: Option<&str>,
        budget: u64,
    ) -> Result<MaxBatch> {
        req.validate()?;
        let model = self.planned_graph(req);
        let mb = graphopt_plan::max_batch(&model, &req.dims, batch_dim, budget, &req.options)
            .map_err(|e| self.err(e))?;
        if req.verify {
            self.verify_plan(&mb.at)?;
        }
        Ok(mb)
    }

    /// Saves the model atomically (a temporary file beside the target, then
    /// a rename). Refuses to overwrite the file the session was loaded from.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<SaveReport> {
        self.save_with(path, &SaveOptions::default())
    }

    /// An error when `path` names the file the session was loaded from
    /// (callers check it before any work; [`Session::save_with`] checks it
    /// again).
    pub fn check_output_path(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if let Some(src) = &self.source {
            if let (Ok(i), Ok(o)) = (src.canonicalize(), path.canonicalize()) {
                if i == o {
                    return Err(Error::new(format!(
                        "{}: the output would overwrite the input; choose another output path",
                        path.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// [`Session::save`] with options.
    pub fn save_with(&self, path: impl AsRef<Path>, opts: &SaveOptions) -> Result<SaveReport> {
        let path = path.as_ref();
        self.check_output_path(path)?;
        let save = graphopt_onnx::SaveOptions {
            external: opts.external.clone().unwrap_or(ExternalData::Auto {
                input_used_external: self.used_external_data,
            }),
            location: opts.location.clone(),
        };
        Ok(graphopt_onnx::save(&self.model, path, &save)?)
    }

    /// The model as ONNX bytes (everything inline).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(graphopt_onnx::encode(&self.model)?)
    }
}

impl Clone for Session {
    /// A copy of the model and its history; the dump sink is not copied.
    fn clone(&self) -> Session {
        Session {
            model: self.model.clone(),
            source: self.source.clone(),
            used_external_data: self.used_external_data,
            reordered: self.reordered,
            runs: self.runs.clone(),
            dump_sink: None,
        }
    }
}
