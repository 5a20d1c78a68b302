//! The CUDA backend (issue 14): runs a plan on one NVIDIA GPU through
//! cudarc, with the same plan checks as the CPU executor
//! (`executor::bind`).
//!
//! - [`codegen`]: CUDA C source per op, shape and dtype (pure; snapshot
//!   tested on the CPU);
//! - [`ops`]: each node as a list of launches (NVRTC kernels, cuBLAS
//!   GEMMs, device copies) over its inputs and outputs (pure);
//! - `runtime` (feature `cuda`): [`CudaExecutable`], one weights buffer
//!   and one arena + workspace buffer on the device, pinned host staging,
//!   CUDA graph replay for repeated runs.
//!
//! The host kernels' [`crate::Backend`] hands kernels byte slices, which
//! device memory cannot be; the CUDA backend therefore makes [`ops::NodePlan`]s
//! through the same binding code instead of `Box<dyn Kernel>`s.
//!
//! cudarc loads libcuda, libnvrtc and libcublas at run time, so all of
//! this builds and its pure parts test without CUDA; without a driver,
//! [`unavailable`] says so in one line before anything is created.
//! Status: compiled and CPU-tested only, not yet run on a GPU.

pub mod codegen;
pub mod ops;
#[cfg(feature = "cuda")]
mod runtime;

#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(test)]
mod emulate;

#[cfg(feature = "cuda")]
pub use runtime::{unavailable, CudaExecutable, DeviceMemory};
#[cfg(not(feature = "cuda"))]
pub use stub::{unavailable, CudaExecutable, DeviceMemory};

use crate::backend::NodeCtx;
use crate::executor::{bind, ExecError, KernelMaker};
use graphopt_ir::Model;
use graphopt_plan::Plan;
use ops::NodePlan;

/// The CUDA backend: which ops it has, and each node's [`NodePlan`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaBackend;

impl KernelMaker for CudaBackend {
    type K = NodePlan;
    fn name(&self) -> &str {
        "cuda"
    }
    fn has_op(&self, domain: &str, op_type: &str) -> bool {
        ops::has_op(domain, op_type)
    }
    fn make(&self, ctx: &NodeCtx) -> Result<NodePlan, String> {
        if let Some(t) = ctx
            .inputs
            .iter()
            .flatten()
            .find(|t| crate::tensor::is_packed4(t.dtype))
        {
            return Err(format!("{} inputs have no CUDA kernels", t.dtype.name()));
        }
        ops::plan_node(ctx)
    }
    fn workspace_bytes(k: &NodePlan) -> usize {
        k.workspace_bytes
    }
    fn in_place(k: &NodePlan) -> bool {
        k.in_place
    }
}

/// Binds a model to a plan with the CUDA backend's kernels, without a GPU
/// (every plan check and every kernel's source): what
/// [`CudaExecutable::new`] does before touching the device.
pub fn plan_kernels(model: &Model, plan: &Plan) -> Result<Vec<(String, NodePlan)>, ExecError> {
    let b = bind(model, plan, &CudaBackend)?;
    Ok(b.steps.into_iter().map(|s| (s.name, s.kernel)).collect())
}

/// A node ready to issue: its launch plan and the addresses of its
/// inputs, outputs and constant bytes (device addresses on the GPU, host
/// addresses in the CPU emulation used by the tests).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the runtime and the tests
pub(crate) struct DevStep {
    pub(crate) name: String,
    pub(crate) op: String,
    pub(crate) plan: NodePlan,
    /// Input addresses (0: omitted), output addresses (0: omitted).
    pub(crate) ins: Vec<u64>,
    pub(crate) outs: Vec<u64>,
    /// Output 0's bytes to copy to the staging area before the launches
    /// (an in-place pair whose kernel is not in-place safe); the in-place
    /// inputs then read the staging copy.
    pub(crate) stage: Option<usize>,
    /// Where each `Launch::Upload`'s bytes were put, in order.
    pub(crate) uploads: Vec<u64>,
}

/// Turns bound steps into [`DevStep`]s: `arena` and `staging` are base
/// addresses, `weight(i)` the address of weight `i`, `uploads[s]` those of
/// step `s`'s constant bytes. Aliased views (nothing to run) are dropped.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the runtime and the tests
pub(crate) fn dev_steps(
    steps: Vec<crate::executor::Step<NodePlan>>,
    arena: u64,
    staging: u64,
    weight: &dyn Fn(usize) -> u64,
    uploads: Vec<Vec<u64>>,
) -> Vec<DevStep> {
    use crate::executor::Loc;
    let mut out = Vec::new();
    for (s, up) in steps.into_iter().zip(uploads) {
        if s.skip {
            continue;
        }
        let outs: Vec<u64> = s
            .outputs
            .iter()
            .map(|o| o.as_ref().map_or(0, |(off, _, _)| arena + *off as u64))
            .collect();
        let stage = (!s.in_place.is_empty() && !s.kernel.in_place)
            .then(|| s.outputs[0].as_ref().map_or(0, |o| o.1));
        let ins: Vec<u64> = s
            .inputs
            .iter()
            .enumerate()
            .map(|(k, i)| match i {
                None => 0,
                Some(_) if s.in_place.contains(&k) => {
                    if stage.is_some() {
                        staging
                    } else {
                        outs[0]
                    }
                }
                Some((Loc::Arena { offset, .. }, _)) => arena + *offset as u64,
                Some((Loc::Weight(w), _)) => weight(*w),
                Some((Loc::Dynamic(_), _)) => {
                    unreachable!("device backends refuse dynamic values in bind")
                }
            })
            .collect();
        out.push(DevStep {
            name: s.name,
            op: s.op,
            plan: s.kernel,
            ins,
            outs,
            stage,
            uploads: up,
        });
    }
    out
}

/// What issuing a [`DevStep`] needs from a device.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the runtime and the tests
pub(crate) trait Issue {
    /// Launches NVRTC kernel `func`; every argument is an address.
    fn kernel(
        &self,
        func: &str,
        grid: [u32; 3],
        block: u32,
        args: &mut [u64],
    ) -> Result<(), String>;
    /// A GEMM with its operands at `a`, `b`, `c`.
    fn gemm(&self, g: &ops::Gemm, a: u64, b: u64, c: u64) -> Result<(), String>;
    /// Copies `bytes` bytes from `src` to `dst` (never overlapping unless equal).
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), String>;
}

/// Issues one step's launches in order (`scratch`: the kernel scratch base).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // used by the runtime and the tests
pub(crate) fn issue_step(
    dev: &impl Issue,
    s: &DevStep,
    staging: u64,
    scratch: u64,
) -> Result<(), ExecError> {
    use ops::{Arg, Launch};
    let err = |msg: String| ExecError::Kernel {
        op: s.op.clone(),
        node: s.name.clone(),
        msg,
    };
    let resolve = |a: Arg| -> Result<u64, ExecError> {
        match a {
            Arg::In(k) => match s.ins.get(k) {
                Some(&p) if p != 0 => Ok(p),
                _ => Err(err(format!("input {k} is missing"))),
            },
            Arg::Out(k) => match s.outs.get(k) {
                Some(&p) if p != 0 => Ok(p),
                _ => Err(err(format!("output {k} is missing"))),
            },
            Arg::Ws(o) => Ok(scratch + o as u64),
        }
    };
    if let Some(n) = s.stage {
        if n > 0 {
            dev.copy(staging, s.outs[0], n)
                .map_err(|e| err(format!("staging copy: {e}")))?;
        }
    }
    let mut up = 0;
    for l in &s.plan.launches {
        match l {
            Launch::Kernel {
                func,
                grid,
                block,
                args,
            } => {
                let mut vals = args
                    .iter()
                    .map(|a| resolve(*a))
                    .collect::<Result<Vec<u64>, _>>()?;
                dev.kernel(func, *grid, *block, &mut vals)
                    .map_err(|e| err(format!("kernel {func}: {e}")))?;
            }
            Launch::Gemm(g) => {
                let es = crate::tensor::elem_size(g.dtype).unwrap_or(4) as u64;
                let at = |a: Arg, k: usize| -> Result<u64, ExecError> {
                    Ok(resolve(a)? + g.offsets[k] as u64 * es)
                };
                dev.gemm(g, at(g.a, 0)?, at(g.b, 1)?, at(g.c, 2)?)
                    .map_err(err)?;
            }
            Launch::Copy { src, dst, bytes } => {
                let (a, b) = (resolve(*src)?, resolve(*dst)?);
                if *bytes > 0 && a != b {
                    dev.copy(b, a, *bytes)
                        .map_err(|e| err(format!("copy: {e}")))?;
                }
            }
            Launch::Upload { dst, data } => {
                let to = resolve(*dst)?;
                let from = *s
                    .uploads
                    .get(up)
                    .ok_or_else(|| err("constant bytes were not placed".into()))?;
                if !data.is_empty() {
                    dev.copy(to, from, data.len())
                        .map_err(|e| err(format!("constant copy: {e}")))?;
                }
                up += 1;
            }
        }
    }
    Ok(())
}
