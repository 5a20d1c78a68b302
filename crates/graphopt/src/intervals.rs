//! [`plan_intervals_file`]: the offset search on a MiniMalloc interval file
//! (`id,lower,upper,size`), as `graphopt plan --intervals` runs it, with its
//! report. The planner itself is `graphopt_plan::plan_intervals`.

use crate::error::{Error, ErrorKind, Result};
use crate::session::PlanSettings;
use graphopt_plan::{check_plan, default_node_budget, plan_intervals, read_minimalloc_csv, Buffer};
use serde::Serialize;
use std::path::Path;

/// How to plan an interval file.
#[derive(Clone, Debug, Default)]
pub struct IntervalRequest {
    /// Alignment (default 1), node budget (default
    /// [`default_node_budget`] of the buffer count), threads, time limit.
    pub settings: PlanSettings,
    /// A capacity to try first (the one in a MiniMalloc file name); the
    /// search still tries lower.
    pub capacity: Option<u64>,
    /// Re-check the placement with the independent checker.
    pub verify: bool,
}

/// One placed buffer, as `--json` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct PlacedBuffer {
    pub name: String,
    pub size: u64,
    pub offset: u64,
    pub first: i64,
    pub last: i64,
}

/// What [`plan_intervals_file`] found: `graphopt plan --intervals --json`.
#[derive(Clone, Debug, Serialize)]
pub struct IntervalsReport {
    /// Every live buffer at its own aligned offset, no reuse.
    pub naive_bytes: u64,
    pub lower_bound_bytes: u64,
    pub arena_bytes: u64,
    pub alignment: u64,
    /// The best of the greedy strategies, before the search.
    pub greedy_bytes: u64,
    pub strategy: String,
    /// The search proved the arena optimal (it equals the lower bound or
    /// the search space was exhausted).
    pub optimal: bool,
    /// Search nodes visited.
    pub nodes: u64,
    pub verified: bool,
    pub tensors: Vec<PlacedBuffer>,
    /// The buffers as read (for pictures).
    #[serde(skip)]
    pub buffers: Vec<Buffer>,
    #[serde(skip)]
    pub offsets: Vec<u64>,
}

/// Reads a MiniMalloc CSV and plans it.
pub fn plan_intervals_file(csv: &Path, req: &IntervalRequest) -> Result<IntervalsReport> {
    let place = csv.display().to_string();
    let text = std::fs::read_to_string(csv).map_err(|e| Error::io(csv, "cannot read", e))?;
    let bufs = read_minimalloc_csv(&text)
        .map_err(|e| Error::with_kind(ErrorKind::Parse, e.to_string()).within(&place))?;
    let align = req.settings.alignment_or(1)?;
    let opts = graphopt_plan::IntervalOptions {
        alignment: align,
        search: true,
        node_budget: req
            .settings
            .node_budget_or(default_node_budget(bufs.len()))?,
        time_limit: req.settings.time_limit()?,
        target: req.capacity,
        threads: req.settings.threads()?,
    };
    crate::validate::validate_interval_options(&opts)?;
    let plan = plan_intervals(&bufs, &opts);
    if req.verify {
        check_plan(&bufs, &plan.offsets, plan.arena, align, &[]).map_err(|errs| {
            Error::verify(format!(
                "{place}: plan check failed: {}",
                errs.iter()
                    .map(|e| e.0.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        })?;
    }
    let naive = bufs
        .iter()
        .filter(|b| b.is_live())
        .map(|b| graphopt_plan::align_up(b.size, align))
        .sum();
    let tensors = bufs
        .iter()
        .zip(&plan.offsets)
        .map(|(b, &o)| PlacedBuffer {
            name: b.id.to_string(),
            size: b.size,
            offset: o,
            first: b.lower,
            last: b.upper - 1,
        })
        .collect();
    Ok(IntervalsReport {
        naive_bytes: naive,
        lower_bound_bytes: plan.lower_bound,
        arena_bytes: plan.arena,
        alignment: align,
        greedy_bytes: plan.greedy_arena,
        strategy: plan.strategy.to_string(),
        optimal: plan.optimal,
        nodes: plan.nodes,
        verified: req.verify,
        tensors,
        buffers: bufs,
        offsets: plan.offsets,
    })
}
