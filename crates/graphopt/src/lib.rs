//! graphopt as a library: everything the `graphopt` command does, in a few
//! lines of Rust.
//!
//! A [`Session`] holds one model (and where it came from); its methods are
//! the capabilities, and the command only turns arguments into these calls
//! and prints what they return:
//!
//! ```no_run
//! # fn main() -> graphopt::Result<()> {
//! let mut session = graphopt::load("model.onnx")?;
//! // The default simplify/fuse pipeline, as `graphopt optimize` runs it:
//! // to a fixed point, verified after every pass.
//! let report = session.optimize(&graphopt::OptimizeOptions::default())?;
//! println!("{} -> {} nodes", report.before.nodes, report.after.nodes);
//! // fp16 compute with an fp32 keep-list, validated against the fp32 model.
//! let lowered = session.lower_precision(&graphopt::PrecisionOptions {
//!     validate: Some(graphopt::ValidateOptions::default()),
//!     ..graphopt::PrecisionOptions::new(graphopt::Precision::F16)
//! })?;
//! println!("weights {} -> {} bytes", lowered.weights_bytes_before, lowered.weights_bytes_after);
//! // How much memory it needs at batch 8.
//! let plan = session.plan(&graphopt::PlanRequest::at(&[("batch", 8)]))?;
//! println!("arena {} bytes", plan.plan.arena_bytes);
//! // External data is carried through as the input had it.
//! session.save("model.opt.onnx")?;
//! # Ok(())
//! # }
//! ```
//!
//! Every policy and default is here, and the command and the Python package
//! take them as they are: the default pipeline runs to a fixed point (at
//! most [`DEFAULT_MAX_ROUNDS`] rounds); the verifier runs after every pass
//! in debug builds and with [`PipelineOptions::verify`], else once after
//! the last pass; [`OptimizeOptions::skip`] `None` leaves
//! [`PRECISION_SKIP`] out before precision lowering; [`Session::save`]
//! writes external data when the input used it or the model would pass
//! protobuf's 2 GiB limit.
//!
//! A step that fails leaves the session as it was. Errors carry an
//! [`ErrorKind`] and their cause ([`Error`]).
//!
//! The crates below the facade stay usable on their own and are re-exported
//! here: [`ir`] (the IR), [`onnx`] (import/export), [`text`] (ONNX text),
//! [`passes`] (the passes, registry and manager), [`plan`] (the memory
//! planner), [`exec`] (the runtime) and [`tract`] (the reference executor).

mod check;
mod compress;
pub mod distributed;
mod error;
mod grad;
mod inputs;
mod inspect;
mod intervals;
mod optimize;
pub mod partition;
mod plan_json;
mod precision;
mod prune;
mod quantize;
mod reference;
mod remat;
mod remat_svg;
mod run;
mod session;
mod torch_policy;
mod train;
pub mod util;
mod validate;

pub use check::{
    compare_outputs, same_bits, CheckOptions, CheckReport, OutputDiff, Scale, Tolerance,
};
pub use compress::{
    CompressMethod, CompressOptions, CompressRank, CompressReport, CompressedLayer,
};
pub use error::{Error, ErrorKind, Result};
pub use grad::{
    grad_check, initial_state_npz, parse_betas, parse_loss, tensor_f64s, AutodiffOptions,
    GradCheck, GradOptions, GradReport, Loss, Optimizer, OptimizerSpec, SavedValue,
};
pub use graphopt_exec::HostTensor;
pub use graphopt_passes::remat::Strategy as RematStrategy;
pub use inputs::Inputs;
pub use inspect::{Inspection, IoInfo};
pub use intervals::{plan_intervals_file, IntervalRequest, IntervalsReport, PlacedBuffer};
pub use optimize::{
    optimize_file, MemoryBeforeAfter, OptimizeFileOptions, OptimizeFileReport, OptimizeOptions,
    OptimizeReport, PassRunReport, PipelineOptions, Summary, DEFAULT_MAX_ROUNDS, PRECISION_SKIP,
};
pub use plan_json::{max_batch_json, plan_json};
pub use precision::{
    parse_validate_mode, Clamped, KeptSensitive, KeptWeight, MemoryFigures, PrecisionOptions,
    PrecisionReport, ValidateOptions, Validation, ValidationCheck,
};
pub use prune::{
    prune_amount, prune_criterion, prune_granularity, PruneAmount, PruneCriterion,
    PruneGranularity, PruneOptions, PruneReport, PrunedGroup, SparsityReport,
};
pub use quantize::{
    dequantize_constants, entropy_threshold, AlreadyQuantized, Calibrate, Calibration, KeptFloat,
    KeptOp, QuantError, QuantizeMode, QuantizeOptions, QuantizeReport, QuantizedWeight, SoloError,
    DEFAULT_MAX_ERROR,
};
pub use remat::{
    parse_strategy, Budget, ChoiceReason, FrontierPoint, RematOptions, RematReport, RematSweep,
    StrategyFrontier, SweepChoice, REMAT_TIME_LIMIT_S, SWEEP_POINTS, SWEEP_STRATEGIES,
};
pub use remat_svg::{remat_svg, remat_sweep_svg};
pub use run::{
    cuda_unavailable, peak_rss_bytes, to_host, to_tract, CudaReport, Device, NodeTime, OpTime,
    PoisonReport, Profile, RunOptions, RunReport, Runner,
};
pub use session::{load, PlanGraph, PlanRequest, PlanSettings, SaveOptions, Session};
pub use torch_policy::{
    has_fx_nodes, parse_fx_node, torch_policy, FxDecision, FxPolicy, FxReason, TorchPolicy,
    FX_NODE_KEY, TORCH_POLICY_FORMAT,
};
pub use train::{
    epoch_permutation, parse_train_remat, train_svg, ArrayData, DataSource, DistRecord, EvalRecord,
    MappedData, Metric, PipelineRecord, RecomputeRecord, StageRecord, StepRecord, TrainLength,
    TrainOptions, TrainReport,
};

pub use graphopt_autodiff as autodiff;
pub use graphopt_exec as exec;
pub use graphopt_ir as ir;
pub use graphopt_onnx as onnx;
pub use graphopt_passes as passes;
pub use graphopt_passes::lower_precision::Precision;
pub use graphopt_plan as plan;
pub use graphopt_text as text;
pub use graphopt_tract as tract;

/// The README's library example runs as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
