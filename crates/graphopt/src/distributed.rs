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
//!   - `zero2`: as `zero1`, and each micro-batch's gradients are
//!     reduce-scattered, so a rank accumulates its slice only (ZeRO
//!     stage 2).
//! - [`per_rank_bytes`]: the per-rank memory arithmetic of each scheme
//!   (what `graphopt plan --distributed` prints).

use crate::error::{Error, Result};
pub use graphopt_exec::collective::{
    launched_by_mpi, Collective, CommError, Solo, DEFAULT_TIMEOUT,
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
    comm: Box<dyn Collective>,
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

/// A rank's bytes under `scheme` for `params` parameter bytes and `state`
/// optimizer-state bytes (whole), `ranks` ranks and an arena of `arena`
/// bytes: the ZeRO arithmetic with graphopt's plan in place of the
/// activations. The slices are padded to equal length, so a rank may
/// hold up to one element per tensor more than `1/ranks`.
pub fn per_rank_bytes(
    scheme: Scheme,
    params: u64,
    state: u64,
    ranks: usize,
    arena: u64,
) -> RankBytes {
    let n = ranks.max(1) as u64;
    let slice = |b: u64| b.div_ceil(n);
    RankBytes {
        rank: 0,
        weights_bytes: params,
        optimizer_state_bytes: if scheme.shards_state() {
            slice(state)
        } else {
            state
        },
        gradient_bytes: if scheme == Scheme::Zero2 {
            slice(params)
        } else {
            params
        },
        arena_bytes: arena,
    }
}

/// The launch a `--distributed` run needs, checked before anything loads:
/// a process `mpirun` started, in a graphopt built with MPI.
pub fn require_launch(scheme: Scheme) -> Result<()> {
    if !HAS_MPI {
        return Err(Error::unsupported(format!(
            "--distributed {}: this graphopt was built without MPI: build it with `cargo build --release --features mpi` (README, \"Multiple devices\")",
            scheme.name()
        )));
    }
    if !launched_by_mpi() {
        return Err(Error::new(format!(
            "--distributed {}: this process was not started by an MPI launcher (run it as: mpirun -np N graphopt train ...)",
            scheme.name()
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
    fn schemes_parse_and_slice_the_state() {
        assert_eq!(Scheme::parse("ZeRO2").unwrap(), Scheme::Zero2);
        assert_eq!(
            Scheme::parse("zero3").unwrap_err().to_string(),
            "--distributed zero3: expected dp, zero1 or zero2"
        );
        // AdamW: 4Ψ parameters, 8Ψ state, 4Ψ gradients (fp32 throughout).
        let (p, s) = (4_000, 8_000);
        let dp = per_rank_bytes(Scheme::Dp, p, s, 4, 0);
        assert_eq!(dp.total(), 16_000);
        let z1 = per_rank_bytes(Scheme::Zero1, p, s, 4, 0);
        assert_eq!(
            (z1.optimizer_state_bytes, z1.gradient_bytes),
            (2_000, 4_000)
        );
        let z2 = per_rank_bytes(Scheme::Zero2, p, s, 4, 0);
        assert_eq!(
            (z2.optimizer_state_bytes, z2.gradient_bytes),
            (2_000, 1_000)
        );
    }

    #[test]
    fn a_launch_is_required() {
        if launched_by_mpi() {
            return;
        }
        let e = require_launch(Scheme::Dp).unwrap_err().to_string();
        if HAS_MPI {
            assert!(e.contains("not started by an MPI launcher"), "{e}");
        } else {
            assert!(e.contains("built without MPI"), "{e}");
        }
    }
}
