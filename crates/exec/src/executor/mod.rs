//! The runtime core: one arena at the planner's offsets, nodes in the
//! plan's schedule.
//!
//! Invariants checked by [`Executable::new`] before anything runs (each
//! one a refusal with one line, never a wrong run):
//! 1. every node has a kernel from the backend;
//! 2. every value has a concrete type, and every activation a planned
//!    tensor inside the arena;
//! 3. at every node, output bytes overlap neither each other nor the
//!    inputs', except the in-place pairs the plan declares (this is also
//!    what makes handing out `&[u8]` and `&mut [u8]` into one arena sound).
//!
//! Poison ([`RunOptions::poison`]): after the last step of each storage
//! region (a tensor with the tensors aliased to it), its bytes are
//! overwritten with NaN (f32 regions) or `0xA5` (others). A plan that ends
//! a lifetime too early then feeds poison to a later reader, and outputs
//! change.
//!
//! Layout:
//! - `bind`: the plan checks and the binding of every node's inputs and
//!   outputs to arena offsets, weights or dynamic slots ([`bind`], shared
//!   with the CUDA backend through [`KernelMaker`]);
//! - `run`: [`Executable::run`], the node loop: inputs in, kernels (or
//!   nested programs) in schedule order, poison, outputs out;
//! - `memory`: the aligned buffers (arena, workspace, copied weights),
//!   where a value lives ([`Loc`]), when dynamic values are freed and
//!   which regions are poisoned after each step;
//! - this file: the errors, options and figures, and [`Executable`] itself.

mod bind;
mod fuse;
mod memory;
mod run;
pub use run::{ReadOutput, StepObserver};

#[cfg(feature = "cuda")]
pub(crate) use bind::Bound;
pub(crate) use bind::{bind, KernelMaker, Step};
pub(crate) use memory::Loc;

use crate::backend::{Backend, Kernel, TensorInfo};
use crate::tensor::HostTensor;
use bind::HostMaker;
use bytes::Bytes;
use graphopt_ir::Model;
use graphopt_plan::Plan;
use memory::{Aligned, Region, Weight};

/// Why a model cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// An op without a kernel (refused before anything runs).
    #[error("no {backend} kernel for {op} (node '{node}'): {why}")]
    NoKernel {
        backend: String,
        op: String,
        node: String,
        why: String,
    },
    #[error("{0}")]
    Unsupported(String),
    /// The plan breaks an invariant the executor relies on.
    #[error("bad plan: {0}")]
    BadPlan(String),
    #[error("bad input: {0}")]
    Input(String),
    #[error("node '{node}' ({op}): {msg}")]
    Kernel {
        op: String,
        node: String,
        msg: String,
    },
}

/// Options of [`Executable::run`].
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Threads kernels use (the calling thread plus a pool, [`crate::cpu::par`]).
    pub threads: usize,
    /// Overwrite each region with poison after its last reader.
    pub poison: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: crate::cpu::par::default_threads(),
            poison: false,
        }
    }
}

/// What one run did besides computing outputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Regions overwritten with poison (nested arenas included).
    pub poisoned_regions: usize,
    /// Nodes whose kernel ran (aliased views do not run; kernels of
    /// subgraph bodies count).
    pub kernels_run: usize,
    /// Runs of nested programs (If branches, Loop iterations, nodes run
    /// alone because they touch a dynamic value).
    pub subgraph_runs: usize,
    /// Peak bytes of the values of data-dependent size live at once,
    /// outside the arena (a nested run's peak is added to what was live
    /// around it).
    pub dynamic_peak_bytes: u64,
    /// Wall time of each step of the schedule, in nanoseconds ([`Executable::step_ops`]
    /// names them; an aliased view takes next to none, an If or Loop
    /// counts its nested runs). Only when [`Executable::set_profile`] is on;
    /// empty otherwise (no clock is read).
    pub step_nanos: Vec<u64>,
}

/// A model bound to a plan and a backend, ready to run.
pub struct Executable {
    steps: Vec<Step<Box<dyn Kernel>>>,
    /// Relu/Clip steps applied by their producer ([`fuse`]).
    fused_activations: usize,
    /// Time each step ([`RunStats::step_nanos`]).
    profile: bool,
    arena: Aligned,
    planned_arena: u64,
    workspace: Aligned,
    staging_bytes: usize,
    weights: Vec<Weight>,
    weights_bytes: u64,
    weights_copied: u64,
    /// Runtime inputs: name, arena offset, type.
    inputs: Vec<(String, usize, TensorInfo)>,
    /// Overridable inputs fed from their initializer: arena offset, bytes.
    defaults: Vec<(usize, Bytes)>,
    outputs: Vec<(String, Loc, TensorInfo)>,
    /// Regions to poison after each step.
    poison_after: Vec<Vec<Region>>,
    dyn_names: Vec<String>,
    dyn_free_after: Vec<Vec<usize>>,
    /// Values of data-dependent size during a run (emptied after it).
    dyn_store: Vec<Option<HostTensor>>,
    /// Donations the plan honoured: (input index, output index), the output
    /// at the input's offset.
    donated: Vec<(usize, usize)>,
    /// Per input: its bytes in the arena hold a value (it was given, or a
    /// donated output was written there), so a run may keep it.
    primed: Vec<bool>,
    /// The last run left its outputs in the arena for
    /// [`Executable::take_outputs`].
    outputs_held: bool,
}

impl Executable {
    /// Binds `model` (shapes inferred at the plan's dims: the
    /// [`graphopt_plan::ModelPlan::model`]) to `plan` and asks `backend` for
    /// every kernel. Refuses, with one line, an op without a kernel, a
    /// value of unknown size the plan did not list as dynamic, a Scan, or
    /// a plan with overlapping live bytes at a node. If/Loop and nodes
    /// touching the plan's `dynamic_values` become nested programs
    /// (`crate::control`).
    pub fn new(model: &Model, plan: &Plan, backend: &dyn Backend) -> Result<Executable, ExecError> {
        let mut b = bind(model, plan, &HostMaker(backend))?;
        let fused_activations = fuse::fuse_activations(&mut b.steps, &b.weights);
        let mut donated = Vec::new();
        for (i, o) in &plan.donated {
            let ii = b.inputs.iter().position(|x| &x.0 == i);
            let oi = b.outputs.iter().position(|x| &x.0 == o);
            let (Some(ii), Some(oi)) = (ii, oi) else {
                return Err(ExecError::BadPlan(format!(
                    "donation {i}:{o} names no runtime input or no output"
                )));
            };
            match b.outputs[oi].1 {
                Loc::Arena { offset, .. } if offset == b.inputs[ii].1 => {}
                _ => {
                    return Err(ExecError::BadPlan(format!(
                        "donated output '{o}' is not at input '{i}''s offset"
                    )))
                }
            }
            donated.push((ii, oi));
        }
        let primed = vec![false; b.inputs.len()];
        Ok(Executable {
            donated,
            primed,
            outputs_held: false,
            steps: b.steps,
            arena: Aligned::new(b.arena_bytes as usize),
            planned_arena: b.arena_bytes,
            workspace: Aligned::new(b.staging_bytes + b.max_workspace),
            staging_bytes: b.staging_bytes,
            weights: b.weights,
            weights_bytes: b.weights_bytes,
            weights_copied: b.weights_copied,
            inputs: b.inputs,
            defaults: b.defaults,
            outputs: b.outputs,
            poison_after: b.poison_after,
            dyn_store: vec![None; b.dyn_names.len()],
            dyn_names: b.dyn_names,
            dyn_free_after: b.dyn_free_after,
            fused_activations,
            profile: false,
        })
    }

    /// Bytes of the nested programs' arenas and workspaces (If branches,
    /// Loop bodies, nodes run alone), one per input shapes seen so far,
    /// recursively: allocated beside the main arena.
    pub fn subgraph_arena_bytes(&self) -> u64 {
        self.steps
            .iter()
            .filter_map(|s| s.special.as_ref())
            .map(|s| s.arena_bytes())
            .sum()
    }
    /// Values of data-dependent size, allocated outside the arena during
    /// a run (the plan's `dynamic_values`).
    pub fn dynamic_values(&self) -> &[String] {
        &self.dyn_names
    }

    /// Nodes of op type `op` whose kernel runs on every run (aliased views,
    /// which do not run, and nested programs excluded).
    pub fn kernel_count(&self, op: &str) -> usize {
        self.steps
            .iter()
            .filter(|s| !s.skip && s.special.is_none() && s.op == op)
            .count()
    }

    /// Relu and Clip nodes applied by the Conv that produces their input,
    /// their own steps skipped (the plan unchanged).
    pub fn fused_activations(&self) -> usize {
        self.fused_activations
    }

    /// Whether runs time each step into [`RunStats::step_nanos`] (off by
    /// default: a run then reads no clock per step).
    pub fn set_profile(&mut self, on: bool) {
        self.profile = on;
    }

    /// `(op type, node name)` of each step of the schedule, in the order
    /// of [`RunStats::step_nanos`].
    pub fn step_ops(&self) -> Vec<(String, String)> {
        self.steps
            .iter()
            .map(|s| (s.op.clone(), s.name.clone()))
            .collect()
    }

    /// Arena bytes as the plan sized it.
    pub fn arena_planned_bytes(&self) -> u64 {
        self.planned_arena
    }
    /// Arena bytes actually allocated (one buffer).
    pub fn arena_allocated_bytes(&self) -> u64 {
        self.arena.len as u64
    }
    /// Kernel scratch and in-place staging: one buffer.
    pub fn workspace_bytes(&self) -> u64 {
        self.workspace.len as u64
    }
    /// Bytes of weights (read in place).
    pub fn weights_bytes(&self) -> u64 {
        self.weights_bytes
    }
    /// Bytes of weights copied because the file left them misaligned.
    pub fn weights_copied_bytes(&self) -> u64 {
        self.weights_copied
    }
    /// Names and types of the runtime inputs, in graph order.
    pub fn input_infos(&self) -> Vec<(String, TensorInfo)> {
        self.inputs
            .iter()
            .map(|(n, _, t)| (n.clone(), t.clone()))
            .collect()
    }
    /// Names of the outputs, in graph order.
    pub fn output_names(&self) -> Vec<String> {
        self.outputs.iter().map(|o| o.0.clone()).collect()
    }
    /// The donations the plan honoured, (input, output) names: after
    /// [`Executable::run_donated`] the output is in the input's bytes.
    pub fn donated_pairs(&self) -> Vec<(String, String)> {
        self.donated
            .iter()
            .map(|&(i, o)| (self.inputs[i].0.clone(), self.outputs[o].0.clone()))
            .collect()
    }
    /// Bytes of the inputs that donated outputs overwrite.
    pub fn donated_bytes(&self) -> u64 {
        self.donated
            .iter()
            .map(|&(i, _)| self.input_bytes(i) as u64)
            .sum()
    }
    /// Bytes of runtime input `k` (the plan's inputs, in order).
    fn input_bytes(&self, k: usize) -> usize {
        let t = &self.inputs[k].2;
        crate::tensor::numel(&t.shape) * crate::tensor::elem_size(t.dtype).unwrap_or(1)
    }
    /// Runtime input `name`'s place in the plan's inputs.
    fn input_index(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|x| x.0 == name)
    }

    /// Copies `t` into input `name`'s bytes in the arena, where a later
    /// [`Executable::run_donated`] given `None` for it reads it: a caller
    /// can hand its parameters over one at a time and free each host copy
    /// at once, rather than hold them all beside the arena for one run.
    pub fn write_input(&mut self, name: &str, t: &HostTensor) -> Result<(), ExecError> {
        let k = self
            .input_index(name)
            .ok_or_else(|| ExecError::Input(format!("the model has no input '{name}'")))?;
        let (_, off, ti) = &self.inputs[k];
        check_input(name, t, ti)?;
        let off = *off;
        self.arena.bytes_mut()[off..off + t.data.len()].copy_from_slice(&t.data);
        self.primed[k] = true;
        // The bytes may be an output's (a donated one): no longer the run's.
        self.outputs_held = false;
        Ok(())
    }

    /// Hands back the arena's pages that hold no given input: the last
    /// run's intermediates and outputs. A training loop calls it before it
    /// takes its parameters out ([`Executable::take_input`]), so that no
    /// copy is ever held beside the step's scratch. The next run writes
    /// them again.
    pub fn release_scratch(&mut self) {
        self.outputs_held = false;
        let mut keep: Vec<(usize, usize)> = (0..self.inputs.len())
            .filter(|&k| self.primed[k])
            .map(|k| (self.inputs[k].1, self.inputs[k].1 + self.input_bytes(k)))
            .collect();
        keep.sort_unstable();
        let mut at = 0;
        for (start, end) in keep {
            if start > at {
                self.arena.discard(at..start);
            }
            at = at.max(end);
        }
        let len = self.arena.bytes().len();
        if at < len {
            self.arena.discard(at..len);
        }
    }

    /// [`Executable::read_input`], then its bytes in the arena are given
    /// up (zeroed, their pages handed back): a training loop taking its
    /// trained parameters out at the end holds each once, in the arena or
    /// in the copy. The input must be given again before the next run.
    pub fn take_input(&mut self, name: &str) -> Option<HostTensor> {
        let t = self.read_input(name)?;
        let k = self.input_index(name)?;
        let off = self.inputs[k].1;
        self.arena.discard(off..off + t.data.len());
        self.primed[k] = false;
        self.outputs_held = false;
        Some(t)
    }

    /// The current bytes of runtime input `name` in the arena: what was
    /// given, or, after a run, the donated output written there.
    pub fn read_input(&self, name: &str) -> Option<HostTensor> {
        let k = self.input_index(name)?;
        if !self.primed[k] {
            return None;
        }
        let (_, off, ti) = &self.inputs[k];
        let n = self.input_bytes(k);
        Some(HostTensor {
            dtype: ti.dtype,
            shape: ti.shape.clone(),
            data: self.arena.bytes()[*off..*off + n].to_vec(),
        })
    }
}

/// `t` has the type and shape the plan has for input `name`, and the bytes
/// they take.
pub(crate) fn check_input(name: &str, t: &HostTensor, ti: &TensorInfo) -> Result<(), ExecError> {
    if t.dtype != ti.dtype || t.shape != ti.shape {
        return Err(ExecError::Input(format!(
            "input '{name}' is {} {:?}, the plan is for {} {:?}",
            t.dtype.name(),
            t.shape,
            ti.dtype.name(),
            ti.shape
        )));
    }
    let want = crate::control::nbytes(t);
    if t.data.len() != want {
        return Err(ExecError::Input(format!(
            "input '{name}' holds {} bytes; {} {:?} takes {want}",
            t.data.len(),
            t.dtype.name(),
            t.shape
        )));
    }
    Ok(())
}
