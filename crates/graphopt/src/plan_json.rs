//! The JSON form of a memory plan, as `graphopt plan --json` prints it and
//! the Python package's `Session.plan()` returns it: one definition, so the
//! two cannot drift apart.

use crate::error::{Error, Result};
use graphopt_plan::{MaxBatch, ModelPlan};
use serde_json::json;

/// `plan --json`: the plan's fields (`weights_bytes`, `naive_bytes`,
/// `lower_bound_bytes`, `arena_bytes`, `schedule`, `tensors`, ...) plus the
/// dims it was made at (`dims`, `default_dim`, `defaulted_dims`), the
/// tensors live at the peak, how it was found, and `verified` when the
/// independent checker ran. `default_dim` is what unbound input dims were
/// set to.
pub fn plan_json(
    planned: &ModelPlan,
    default_dim: i64,
    verified: bool,
) -> Result<serde_json::Value> {
    let (plan, dims) = (&planned.plan, &planned.dims);
    let mut v = serde_json::to_value(plan).map_err(|e| Error::new(e.to_string()))?;
    let o = v
        .as_object_mut()
        .ok_or_else(|| Error::new("a plan serializes to an object"))?;
    let defaulted: Vec<&str> = dims
        .iter()
        .filter(|d| d.defaulted)
        .map(|d| d.name.as_str())
        .collect();
    o.insert(
        "dims".into(),
        json!(dims
            .iter()
            .map(|d| (d.name.clone(), json!(d.value)))
            .collect::<serde_json::Map<_, _>>()),
    );
    o.insert("default_dim".into(), json!(default_dim));
    o.insert("defaulted_dims".into(), json!(defaulted));
    o.insert("peak_tensors".into(), json!(plan.peak_tensors));
    o.insert("schedule_heuristic".into(), json!(plan.heuristic));
    o.insert("strategy".into(), json!(plan.strategy));
    o.insert("optimal".into(), json!(plan.optimal));
    if verified {
        o.insert("verified".into(), json!(true));
    }
    Ok(v)
}

/// `plan --json --max-batch`: [`plan_json`] of the plan at the largest
/// batch, plus `batch_dim`, `max_batch` and `budget_bytes`.
pub fn max_batch_json(
    mb: &MaxBatch,
    default_dim: i64,
    verified: bool,
) -> Result<serde_json::Value> {
    let mut v = plan_json(&mb.at, default_dim, verified)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("batch_dim".into(), json!(mb.dim));
        o.insert("max_batch".into(), json!(mb.batch));
        o.insert("budget_bytes".into(), json!(mb.budget));
    }
    Ok(v)
}
