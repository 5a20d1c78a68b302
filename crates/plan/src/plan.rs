//! Planning a graph: schedule, liveness with in-place merging, offsets.
//!
//! Steps (each one checked by an independent function in tests):
//! 1. [`crate::schedule::memory_aware_schedule`] picks the node order;
//! 2. [`crate::liveness::liveness`] sizes tensors and merges in-place pairs
//!    into storage slots;
//! 3. [`crate::plan_intervals`] places the slots in one arena;
//! 4. [`check_graph_plan`] re-verifies the result at tensor level.

use crate::buffer::{align_up, Buffer};
use crate::check::{check_plan, Alias, CheckError};
use crate::intervals::{plan_intervals, IntervalOptions};
use crate::liveness::{liveness_donating, peak, TensorKind};
use crate::schedule::memory_aware_schedule_donating;
use graphopt_ir::{Graph, NodeId, ValueId};
use serde::Serialize;
use std::time::Duration;

/// Why a graph cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Values whose byte size is unknown (bind symbolic dims first).
    #[error("unknown size for {} value(s): {}", .0.len(), .0.join(", "))]
    UnknownSizes(Vec<String>),
    #[error("bad schedule: {0}")]
    BadSchedule(String),
    #[error("{0}")]
    Graph(String),
}

/// Options of [`plan_graph`].
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Offsets are multiples of this many bytes (default 256).
    pub alignment: u64,
    /// Try memory-aware schedules (never worse than the original order).
    pub reorder: bool,
    /// Search beyond the greedy placements.
    pub search: bool,
    /// Optional wall-clock limit of the offset search (opt-in: without it
    /// the node budget alone ends the search and plans are identical run
    /// to run).
    pub time_limit: Option<Duration>,
    /// Node budget of the offset search (it stops earlier at the bound).
    pub node_budget: u64,
    /// Threads of the offset search (does not change the result; default:
    /// [`default_threads`]).
    pub threads: usize,
    /// Fail with [`PlanError::UnknownSizes`] when a value's size is still
    /// unknown. Otherwise (the default) such values (data-dependent shapes,
    /// loop-carried state) are dynamic allocations outside the arena,
    /// listed in [`Plan::dynamic_values`].
    pub strict: bool,
    /// Honour the model's donation table ([`crate::donation`]; read by
    /// [`crate::plan_model`]). Default true.
    pub donate: bool,
}

impl Default for PlanOptions {
    fn default() -> PlanOptions {
        PlanOptions {
            alignment: 256,
            reorder: true,
            search: true,
            time_limit: None,
            node_budget: 200_000,
            threads: default_threads(),
            strict: false,
            donate: true,
        }
    }
}

/// The machine's parallelism (at least 1): the default thread count of the
/// offset search, which never changes its result.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One tensor of the arena.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedTensor {
    pub name: String,
    pub size: u64,
    pub offset: u64,
    /// First and last schedule step at which it is live (inclusive).
    pub first: usize,
    pub last: usize,
    #[serde(skip)]
    pub value: ValueId,
    #[serde(skip)]
    pub kind: TensorKind,
}

/// A tensor live at the peak, with the node that produced it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PeakTensor {
    pub name: String,
    pub size: u64,
    /// Producer node name; `None` for graph inputs.
    pub producer: Option<String>,
}

/// A memory plan for one graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Bytes of initializers (outside the arena).
    pub weights_bytes: u64,
    /// Arena bytes if no two tensors shared memory (sizes aligned).
    pub naive_bytes: u64,
    /// The peak of live bytes under the chosen schedule.
    pub lower_bound_bytes: u64,
    /// The peak of live bytes under the graph's own order.
    pub lower_bound_original_order_bytes: u64,
    pub arena_bytes: u64,
    /// The least arena any placement at this alignment can have under the
    /// chosen schedule: the peak with sizes rounded up to the alignment
    /// (see [`crate::aligned_lower_bound`]). `arena_bytes / this` is the
    /// placement's quality; `lower_bound_bytes` ignores alignment.
    pub arena_lower_bound_bytes: u64,
    pub alignment: u64,
    /// Node names in schedule order (node id when a node has no name).
    #[serde(rename = "schedule")]
    pub schedule_names: Vec<String>,
    pub tensors: Vec<PlannedTensor>,
    #[serde(skip)]
    pub schedule: Vec<NodeId>,
    /// Tensors live at the step of the peak, largest first.
    #[serde(skip)]
    pub peak_tensors: Vec<PeakTensor>,
    /// The step of the peak.
    #[serde(skip)]
    pub peak_step: usize,
    /// In-place pairs (indices into `tensors`).
    #[serde(skip)]
    pub aliases: Vec<Alias>,
    /// Which scheduling heuristic and placement strategy won.
    #[serde(skip)]
    pub heuristic: String,
    #[serde(skip)]
    pub strategy: String,
    /// True when the arena is proven the least possible for this schedule
    /// and these in-place merges (it reached the lower bound, or the search
    /// proved every smaller capacity infeasible).
    #[serde(skip)]
    pub optimal: bool,
    /// Values of unknown size: allocated dynamically, outside the arena
    /// (empty with [`PlanOptions::strict`], which fails instead).
    pub dynamic_values: Vec<String>,
    /// Donations honoured: (input, output) names, the output written where
    /// the input was ([`crate::donation`]).
    pub donated: Vec<(String, String)>,
    /// Bytes of the donated inputs (a training step's parameters and
    /// optimizer state, when it has them as inputs): held once.
    pub donated_bytes: u64,
    /// Declared donations not honoured, with why.
    pub donations_refused: Vec<String>,
}

impl Plan {
    /// The arena offset of value `v`, if it is an arena tensor.
    pub fn offset_of(&self, v: ValueId) -> Option<u64> {
        self.tensors.iter().find(|t| t.value == v).map(|t| t.offset)
    }

    /// The schedule position of node `n`.
    pub fn position_of(&self, n: NodeId) -> Option<usize> {
        self.schedule.iter().position(|&m| m == n)
    }
}

fn node_label(g: &Graph, n: NodeId) -> String {
    let name = &g.node(n).name;
    if name.is_empty() {
        n.to_string()
    } else {
        name.clone()
    }
}

/// Plans `g`: value types must already be concrete (tensor types with
/// known dims), program order must be acyclic.
pub fn plan_graph(g: &Graph, opts: &PlanOptions) -> Result<Plan, PlanError> {
    plan_graph_donating(g, opts, &[])
}

/// [`plan_graph`] with outputs donated to inputs (name pairs; see
/// [`crate::donation`]). Declared pairs that do not name a runtime input
/// and an output of one type and size are refused, as are pairs the
/// schedule does not allow; [`Plan::donations_refused`] says why.
pub fn plan_graph_donating(
    g: &Graph,
    opts: &PlanOptions,
    donations: &[(String, String)],
) -> Result<Plan, PlanError> {
    let topo = graphopt_ir::stable_topo_order(g).map_err(|e| PlanError::Graph(e.to_string()))?;
    let mut g2;
    let g = if topo.as_slice() != g.order() {
        g2 = g.clone();
        g2.set_order(topo)
            .map_err(|e| PlanError::Graph(e.to_string()))?;
        &g2
    } else {
        g
    };
    let (pairs, mut refused) = crate::donation::resolve(g, donations);
    let sched = memory_aware_schedule_donating(g, opts.reorder, !opts.strict, &pairs)?;
    let live = liveness_donating(g, &sched.order, !opts.strict, &pairs)?;
    refused.extend(live.donations_refused.iter().cloned());
    let align = opts.alignment.max(1);
    let bufs: Vec<Buffer> = live
        .storages
        .iter()
        .enumerate()
        .map(|(i, s)| Buffer::new(i as u64, s.first as i64, s.last as i64 + 1, s.size))
        .collect();
    let iopts = IntervalOptions {
        alignment: align,
        time_limit: opts.time_limit,
        search: opts.search,
        node_budget: opts.node_budget,
        target: None,
        threads: opts.threads,
    };
    let ip = plan_intervals(&bufs, &iopts);
    let tensors: Vec<PlannedTensor> = live
        .tensors
        .iter()
        .map(|t| PlannedTensor {
            name: g.name(t.value).to_string(),
            size: t.size,
            offset: if t.size == 0 {
                0
            } else {
                ip.offsets[t.storage]
            },
            first: t.first,
            last: t.last,
            value: t.value,
            kind: t.kind,
        })
        .collect();
    let (lb, step) = peak(&live.storages, sched.order.len());
    let mut peak_tensors: Vec<PeakTensor> = live
        .tensors
        .iter()
        .filter(|t| t.first <= step && step <= t.last && t.size > 0)
        .map(|t| PeakTensor {
            name: g.name(t.value).to_string(),
            size: t.size,
            producer: g.producer(t.value).map(|(n, _)| node_label(g, n)),
        })
        .collect();
    peak_tensors.sort_by(|a, b| b.size.cmp(&a.size).then(a.name.cmp(&b.name)));
    let naive_bytes = live
        .tensors
        .iter()
        .fold(0u64, |acc, t| acc.saturating_add(align_up(t.size, align)));
    Ok(Plan {
        weights_bytes: live.weights_bytes,
        naive_bytes,
        lower_bound_bytes: lb,
        lower_bound_original_order_bytes: sched.original_peak,
        arena_bytes: ip.arena,
        arena_lower_bound_bytes: ip.lower_bound,
        alignment: align,
        schedule_names: sched.order.iter().map(|&n| node_label(g, n)).collect(),
        tensors,
        schedule: sched.order,
        peak_tensors,
        peak_step: step,
        aliases: live.aliases,
        heuristic: sched.heuristic.to_string(),
        strategy: ip.strategy,
        optimal: ip.optimal,
        donated_bytes: live
            .donated
            .iter()
            .filter_map(|&(i, _)| crate::liveness::value_size(g, i))
            .sum(),
        donated: live
            .donated
            .iter()
            .map(|&(i, o)| (g.name(i).to_string(), g.name(o).to_string()))
            .collect(),
        donations_refused: refused,
        dynamic_values: live.unknown,
    })
}

/// Checks a graph plan at tensor level, independently of how it was made:
/// the schedule is a topological order of `g`, each tensor's lifetime
/// covers its producer and readers, and [`check_plan`] holds for the
/// tensors and declared in-place pairs.
pub fn check_graph_plan(g: &Graph, plan: &Plan) -> Result<(), Vec<CheckError>> {
    let mut errs = Vec::new();
    if let Err(e) = crate::schedule::check_schedule(g, &plan.schedule) {
        errs.push(CheckError(e.to_string()));
        return Err(errs);
    }
    let mut pos = vec![usize::MAX; g.order().iter().map(|n| n.index() + 1).max().unwrap_or(0)];
    for (i, n) in plan.schedule.iter().enumerate() {
        pos[n.index()] = i;
    }
    for t in &plan.tensors {
        if let Some((p, _)) = g.producer(t.value) {
            if pos.get(p.index()).copied() != Some(t.first) {
                errs.push(CheckError(format!(
                    "tensor '{}' starts at {} but is produced at another step",
                    t.name, t.first
                )));
            }
        }
        for u in g.uses(t.value) {
            let at = pos.get(u.node().index()).copied().unwrap_or(usize::MAX);
            if at != usize::MAX && at > t.last {
                errs.push(CheckError(format!(
                    "tensor '{}' is read at step {at} after its last step {}",
                    t.name, t.last
                )));
            }
        }
        if g.is_output(t.value) && t.last + 1 < plan.schedule.len() {
            errs.push(CheckError(format!(
                "graph output '{}' dies before the end",
                t.name
            )));
        }
    }
    let bufs: Vec<Buffer> = plan
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| Buffer::new(i as u64, t.first as i64, t.last as i64 + 1, t.size))
        .collect();
    let offsets: Vec<u64> = plan.tensors.iter().map(|t| t.offset).collect();
    if let Err(e) = check_plan(
        &bufs,
        &offsets,
        plan.arena_bytes,
        plan.alignment,
        &plan.aliases,
    ) {
        errs.extend(e);
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}
