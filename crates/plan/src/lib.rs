//! Memory planning: liveness, memory-aware scheduling, in-place reuse and
//! arena offset assignment (issue 3).
//!
//! Two entry points:
//! - [`plan_graph`]: a graph with concrete value types → a [`Plan`]
//!   (schedule, tensor offsets, arena size, lower bounds);
//! - [`plan_intervals`]: buffers with lifetimes → offsets
//!   ([`IntervalPlan`]), the core used by `plan_graph` and benchmarked on
//!   the MiniMalloc instances (`examples/minimalloc_bench.rs`).
//!
//! [`check_plan`] and [`check_graph_plan`] verify plans without trusting
//! the planner; [`inplace_rule`] is the one in-place table that planners and
//! executors share.

pub mod buffer;
pub mod check;
pub mod donation;
pub mod greedy;
pub mod inplace;
pub mod intervals;
pub mod liveness;
pub mod model;
mod plan;
pub mod schedule;
pub mod search;
pub mod svg;

pub use buffer::{
    align_up, aligned_lower_bound, lower_bound, read_minimalloc_csv, Buffer, CsvError,
};
pub use check::{check_plan, Alias, CheckError};
pub use donation::{declared_donations, set_donations, DONATE_KEY};
pub use inplace::{
    chain_op, inplace_rule, inplace_rule_in, InPlace, CHAIN_OP, CONV_ADD, EXEC_DOMAIN,
};
pub use intervals::{
    arena_of, default_node_budget, plan_intervals, Improvement, IntervalOptions, IntervalPlan,
};
pub use liveness::TensorKind;
pub use model::{
    bind_model, human_bytes, input_dim_names, max_batch, parse_size, plan_model, DimBinding,
    DimValues, MaxBatch, ModelPlan, ModelPlanError,
};
pub use plan::{
    check_graph_plan, default_threads, plan_graph, plan_graph_donating, PeakTensor, Plan,
    PlanError, PlanOptions, PlannedTensor,
};
