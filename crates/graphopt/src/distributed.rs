//! Several processes, one training run (issue 24): the communicator and
//! the data-parallel schemes.
//!
//! ```text
//! mpirun -np 4 graphopt train model.onnx --data d.npz --batch 64 --distributed zero1
//! ```
//!
//! - [`World`]: the communicator of an `mpirun` launch (cargo feature
//!   `mpi`), or of one process alone ([`World::solo`]).
//! - [`Scheme`]: how the ranks split the work. Every scheme gives each rank
//!   `batch / ranks` examples of every batch (rank r the r-th slice of the
//!   batch's order) and sums the gradients over the ranks, so that the
//!   update equals one process's on the whole batch (gradient
//!   accumulation over the same examples, within float rounding).
//!   - `dp`: gradients all-reduced, every rank updates every parameter
//!     (DDP).
//!   - `zero1`: gradients all-reduced; the parameters are laid end to end
//!     and cut into `ranks` equal slices, each rank holds the optimizer
//!     state of its slice only, updates it, and the slices are
//!     all-gathered (ZeRO stage 1).
//!   - `zero2`: as `zero1`, and each micro-batch's gradients are reduced
//!     to the slices' owners (bucket by bucket during the backward pass,
//!     each piece of a bucket to the rank whose slice holds it: a
//!     reduce-scatter in buckets), so a rank accumulates its slice only
//!     (ZeRO stage 2).
//! - [`crate::Session::plan_distributed`]: one rank's bytes under a
//!   scheme (what `graphopt plan --distributed` prints).

use crate::error::{Error, Result};
pub use graphopt_exec::collective::{
    launched_by_mpi, Collective, CommError, Pending, Solo, DEFAULT_TIMEOUT,
};
use serde::Serialize;
use std::time::Duration;

/// How the ranks of a data-parallel run share the work (see the module
/// doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    Dp,
    Zero1,
    Zero2,
}

impl Scheme {
    pub fn parse(s: &str) -> Result<Scheme> {
        match s.trim().to_ascii_lowercase().as_str() {
            "dp" | "ddp" => Ok(Scheme::Dp),
            "zero1" => Ok(Scheme::Zero1),
            "zero2" => Ok(Scheme::Zero2),
            _ => Err(Error::new(format!(
                "--distributed {s}: expected dp, zero1 or zero2"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scheme::Dp => "dp",
            Scheme::Zero1 => "zero1",
            Scheme::Zero2 => "zero2",
        }
    }

    /// Whether the optimizer state is cut into slices.
    pub fn shards_state(self) -> bool {
        self != Scheme::Dp
    }
}

/// The communicator of this process's run.
pub struct World {
    comm: Box<dyn Collective + Send + Sync>,
}

impl World {
    /// Joins the processes `mpirun` started (MPI is initialized here and
    /// finalized when the `World` drops). Refuses in one line a process
    /// no MPI launcher started, and a graphopt built without MPI.
    pub fn init(timeout: Duration) -> Result<World> {
        #[cfg(feature = "mpi")]
        {
            let comm =
                graphopt_exec::collective::mpi::Mpi::init(timeout).map_err(|e| Error::new(e.0))?;
            Ok(World {
                comm: Box::new(comm),
            })
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = timeout;
            Err(Error::unsupported(
                "this graphopt was built without MPI: build it with `cargo build --release --features mpi` (README, \"Multiple devices\")",
            ))
        }
    }

    /// One process alone (rank 0 of 1).
    pub fn solo() -> World {
        World {
            comm: Box::new(Solo),
        }
    }

    /// `e` naming this rank when there are several (`rank 1: ...`), as
    /// every front end reports a rank's error.
    pub fn rank_error(&self, e: Error) -> Error {
        if self.ranks() > 1 {
            Error::with_kind(e.kind(), format!("rank {}: {e}", self.rank()))
        } else {
            e
        }
    }

    pub fn comm(&self) -> &dyn Collective {
        self.comm.as_ref()
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn ranks(&self) -> usize {
        self.comm.ranks()
    }
}

/// The collectives' timeout from seconds (`--comm-timeout`; `None`:
/// [`DEFAULT_TIMEOUT`]); `what` names the option in the error.
pub fn comm_timeout(seconds: Option<f64>, what: &str) -> Result<Duration> {
    match seconds {
        None => Ok(DEFAULT_TIMEOUT),
        Some(t) if t.is_finite() && t > 0.0 => Ok(Duration::from_secs_f64(t)),
        Some(t) => Err(Error::new(format!(
            "{what} {t}: expected a positive number of seconds"
        ))),
    }
}

/// Whether this graphopt was built with MPI (cargo feature `mpi`).
pub const HAS_MPI: bool = cfg!(feature = "mpi");

/// One rank's bytes in a data-parallel scheme.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankBytes {
    pub rank: usize,
    /// Parameters (every scheme holds them whole).
    pub weights_bytes: u64,
    /// Optimizer state held by this rank (its slice under zero1/zero2).
    pub optimizer_state_bytes: u64,
    /// Gradients accumulated over the micro-batches of a step: the whole
    /// gradient (dp, zero1) or this rank's slice (zero2).
    pub gradient_bytes: u64,
    /// The step's arenas and workspaces.
    pub arena_bytes: u64,
}

impl RankBytes {
    pub fn total(&self) -> u64 {
        self.weights_bytes + self.optimizer_state_bytes + self.gradient_bytes + self.arena_bytes
    }
}

/// What `graphopt plan --distributed` gives: one rank's bytes for a
/// training graph (`graphopt grad` with an optimizer) under a scheme, at a
/// global batch or at the largest global batch a per-device budget allows.
#[derive(Clone, Debug, Serialize)]
pub struct RankPlan {
    pub scheme: Scheme,
    pub ranks: usize,
    /// The batch dim, the global batch and each rank's share of it.
    pub batch_dim: String,
    pub batch: i64,
    pub rank_batch: i64,
    /// The per-device budget, when the batch was searched for.
    pub budget_bytes: Option<u64>,
    /// Trainable parameter elements (Ψ), and the optimizer state's bytes
    /// on one process.
    pub param_elements: u64,
    pub state_bytes: u64,
    /// The step's arena at the rank's batch without the parameters and the
    /// optimizer state it holds: activations, gradients in flight,
    /// workspace of the plan.
    pub activation_bytes: u64,
    /// One rank's bytes (every rank's are the same: the slices are padded
    /// to equal length).
    pub per_rank: RankBytes,
}

impl RankPlan {
    pub fn total(&self) -> u64 {
        self.per_rank.total()
    }
}

/// The trainable parameters and the optimizer state of a training graph:
/// the inputs and initializers `X` with an output `X_new`; the state is
/// `step` and the `<p>_m`, `<p>_v` of a parameter `p`. Bytes from the
/// model's types (as planned: every dim bound), and whether each is a
/// graph input (held in the arena) or an initializer.
struct StepValues {
    /// (elements, bytes, is an input) per parameter.
    params: Vec<(u64, u64, bool)>,
    state_bytes: u64,
}

fn step_values(m: &graphopt_ir::Model) -> Result<StepValues> {
    let g = &m.graph;
    let outs: std::collections::HashSet<&str> = g.outputs.iter().map(|&v| g.name(v)).collect();
    let updated: Vec<(String, graphopt_ir::ValueId, bool)> = g
        .inputs
        .iter()
        .map(|&v| (v, true))
        .chain(g.initializers().iter().map(|&v| (v, false)))
        .filter(|(v, _)| outs.contains(format!("{}_new", g.name(*v)).as_str()))
        .map(|(v, input)| (g.name(v).to_string(), v, input))
        .collect();
    let names: std::collections::HashSet<&str> = updated.iter().map(|u| u.0.as_str()).collect();
    let is_state = |n: &str| {
        n == "step"
            || [("_m"), ("_v")]
                .iter()
                .any(|s| n.strip_suffix(s).is_some_and(|p| names.contains(p)))
    };
    let bytes = |v: graphopt_ir::ValueId| -> Result<(u64, u64)> {
        let n = g.name(v);
        let ty = g.ty(v);
        let numel = ty.and_then(|t| t.shape()).and_then(|s| s.numel());
        let dt = ty.and_then(|t| t.elem());
        match (numel, dt) {
            (Some(e), Some(d)) => Ok((e, d.storage_bytes(e).unwrap_or(0))),
            _ => Err(Error::new(format!(
                "'{n}': its shape is not known at these dims"
            ))),
        }
    };
    let mut params = Vec::new();
    let mut state_bytes = 0;
    for (n, v, input) in &updated {
        let (e, b) = bytes(*v)?;
        if is_state(n) {
            state_bytes += b;
        } else {
            params.push((e, b, *input));
        }
    }
    if params.is_empty() {
        return Err(Error::new(
            "not a training step with an optimizer (no parameter P with an output P_new): make one with graphopt grad --optimizer sgd|adamw",
        ));
    }
    Ok(StepValues {
        params,
        state_bytes,
    })
}

impl crate::Session {
    /// One rank's bytes when `ranks` ranks train this training graph
    /// under `scheme` (see [`RankPlan`]). The batch dim (`batch_dim`, else
    /// the first symbolic input dim) bound in `req` is the global batch,
    /// planned at its `1/ranks` share; with `budget`, the largest global
    /// batch (a multiple of `ranks`) whose per-rank bytes fit it instead.
    ///
    /// The bytes are the ZeRO arithmetic on graphopt's plan of this step:
    /// the parameters (all ranks), the optimizer state and the gradient
    /// accumulator as `train --distributed` slices them (padded slices of
    /// the parameters laid end to end), and this step's arena at the
    /// rank's batch less the parameters and state it holds. (`train
    /// --distributed` runs the gradients and the update as two graphs,
    /// whose arenas hold more: on the digits CNN at 16 examples per rank,
    /// 1.00 MB against this step's 474 KB of activations.) The step is
    /// planned as written, as a device's backend runs it (`req.graph` is
    /// not read).
    pub fn plan_distributed(
        &self,
        req: &crate::PlanRequest,
        scheme: Scheme,
        ranks: usize,
        batch_dim: Option<&str>,
        budget: Option<u64>,
    ) -> Result<RankPlan> {
        if ranks == 0 {
            return Err(Error::new("--ranks 0: expected at least 1"));
        }
        let req = &crate::PlanRequest {
            graph: crate::PlanGraph::AsWritten,
            ..req.clone()
        };
        let dim = match batch_dim {
            Some(d) => d.to_string(),
            None => graphopt_plan::input_dim_names(&self.model)
                .into_iter()
                .next()
                .ok_or_else(|| Error::new("the model has no symbolic input dim to share between the ranks (name one with --batch-dim)"))?,
        };
        let n = ranks as u64;
        // Bytes of one rank's slice of `elems` f32 elements, padded as
        // `train --distributed` pads it.
        let slice =
            |elems: u64| graphopt_exec::collective::shard_len(elems as usize, ranks) as u64 * 4;
        // The state and the gradients as train --distributed lays them: the
        // parameters end to end, cut into `ranks` padded slices.
        let per_rank = |sv: &StepValues, weights: u64, arena: u64| -> (u64, RankBytes) {
            let elems: u64 = sv.params.iter().map(|p| p.0).sum();
            let in_arena: u64 =
                sv.params.iter().filter(|p| p.2).map(|p| p.1).sum::<u64>() + sv.state_bytes;
            let param_inputs: u64 = sv.params.iter().filter(|p| p.2).map(|p| p.1).sum();
            // AdamW's state is two moments per parameter and a step.
            let moments = sv.state_bytes.saturating_sub(8) / (4 * elems.max(1));
            let state = match scheme {
                Scheme::Dp => sv.state_bytes,
                _ if sv.state_bytes == 0 => 0,
                _ => moments * slice(elems) + 8,
            };
            let grads = match scheme {
                Scheme::Zero2 => slice(elems),
                _ => slice(elems) * n,
            };
            let act = arena.saturating_sub(in_arena);
            (
                act,
                RankBytes {
                    rank: 0,
                    weights_bytes: weights + param_inputs,
                    optimizer_state_bytes: state,
                    gradient_bytes: grads,
                    arena_bytes: act,
                },
            )
        };
        let (planned, batch) = match budget {
            None => {
                let b = req
                    .dims
                    .bound
                    .iter()
                    .find(|(k, _)| *k == dim)
                    .map(|(_, v)| *v)
                    .ok_or_else(|| Error::new(format!("--ranks {ranks}: bind the global batch with --dim {dim}=B (or give --budget and --max-batch)")))?;
                if b <= 0 || b % ranks as i64 != 0 {
                    return Err(Error::new(format!(
                        "--dim {dim}={b}: does not split into {ranks} ranks' equal shares"
                    )));
                }
                let mut r = req.clone();
                for (k, v) in &mut r.dims.bound {
                    if *k == dim {
                        *v = b / ranks as i64;
                    }
                }
                (self.plan(&r)?, b)
            }
            Some(budget) => {
                // Per rank: weights + arena + sliced state + gradients -
                // the state the arena already holds must fit the budget.
                let probe = self.plan(&{
                    let mut r = req.clone();
                    r.dims.bound.push((dim.clone(), 1));
                    r
                })?;
                let sv = step_values(&probe.model).map_err(|e| self.err(e))?;
                let (_, at1) = per_rank(&sv, probe.plan.weights_bytes, probe.plan.arena_bytes);
                let fixed = at1.optimizer_state_bytes + at1.gradient_bytes;
                let room = (budget + sv.state_bytes)
                    .checked_sub(fixed)
                    .ok_or_else(|| {
                        Error::budget(format!(
                            "--budget {}: each rank's optimizer state and gradients alone need {}",
                            graphopt_plan::human_bytes(budget),
                            graphopt_plan::human_bytes(fixed)
                        ))
                    })?;
                let mb = self.max_batch(req, Some(&dim), room)?;
                (mb.at, mb.batch * ranks as i64)
            }
        };
        let sv = step_values(&planned.model).map_err(|e| self.err(e))?;
        let (act, bytes) = per_rank(&sv, planned.plan.weights_bytes, planned.plan.arena_bytes);
        Ok(RankPlan {
            scheme,
            ranks,
            batch_dim: dim,
            batch,
            rank_batch: batch / ranks as i64,
            budget_bytes: budget,
            param_elements: sv.params.iter().map(|p| p.0).sum(),
            state_bytes: sv.state_bytes,
            activation_bytes: act,
            per_rank: bytes,
        })
    }
}

/// The launch a distributed run (`what`: `--distributed dp`,
/// `--pipeline`) needs, checked before anything loads: a process `mpirun`
/// started, in a graphopt built with MPI.
pub fn require_launch(what: &str) -> Result<()> {
    if !HAS_MPI {
        return Err(Error::unsupported(format!(
            "{what}: this graphopt was built without MPI: build it with `cargo build --release --features mpi` (README, \"Multiple devices\")"
        )));
    }
    if !launched_by_mpi() {
        return Err(Error::new(format!(
            "{what}: this process was not started by an MPI launcher (run it as: mpirun -np N graphopt train ...)"
        )));
    }
    Ok(())
}

/// FNV-1a, 64 bits: the fingerprint ranks compare to agree on a model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Fnv {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }
    pub(crate) fn str(&mut self, s: &str) -> &mut Fnv {
        self.bytes(s.as_bytes()).bytes(&[0xff])
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Fnv {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// A fingerprint of the model's graph (nodes, names, initializers' types,
/// shapes and bytes).
pub(crate) fn model_fingerprint(m: &graphopt_ir::Model) -> u64 {
    let mut h = Fnv::new();
    hash_graph(&m.graph, &mut h);
    h.finish()
}

fn hash_graph(g: &graphopt_ir::Graph, h: &mut Fnv) {
    for &v in g.inputs.iter().chain(&g.outputs) {
        h.str(g.name(v));
    }
    for n in g.nodes() {
        let d = g.node(n);
        h.str(&d.op_type).str(&d.domain);
        for &v in d.inputs().iter().chain(d.outputs()).flatten() {
            h.str(g.name(v));
        }
        for a in &d.attributes {
            h.str(&a.name);
            match &a.value {
                graphopt_ir::AttrValue::Float(f) => {
                    h.bytes(&f.to_le_bytes());
                }
                graphopt_ir::AttrValue::Int(i) => {
                    h.u64(*i as u64);
                }
                graphopt_ir::AttrValue::String(s) => {
                    h.bytes(s);
                }
                graphopt_ir::AttrValue::Floats(v) => v.iter().for_each(|f| {
                    h.bytes(&f.to_le_bytes());
                }),
                graphopt_ir::AttrValue::Ints(v) => v.iter().for_each(|&i| {
                    h.u64(i as u64);
                }),
                _ => {}
            }
            for sub in a.graphs() {
                hash_graph(sub, h);
            }
        }
    }
    for &v in g.initializers() {
        h.str(g.name(v));
        if let Some(t) = g.initializer(v) {
            h.str(t.dtype.name());
            for &d in &t.dims {
                h.u64(d as u64);
            }
            if let Some(b) = t.raw() {
                h.bytes(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_parse() {
        assert_eq!(Scheme::parse("ZeRO2").unwrap(), Scheme::Zero2);
        assert_eq!(
            Scheme::parse("zero3").unwrap_err().to_string(),
            "--distributed zero3: expected dp, zero1 or zero2"
        );
        assert!(!Scheme::Dp.shards_state() && Scheme::Zero1.shards_state());
    }

    #[test]
    fn a_launch_is_required() {
        if launched_by_mpi() {
            return;
        }
        let e = require_launch("--distributed dp").unwrap_err().to_string();
        if HAS_MPI {
            assert!(e.contains("not started by an MPI launcher"), "{e}");
        } else {
            assert!(e.contains("built without MPI"), "{e}");
        }
    }
}
