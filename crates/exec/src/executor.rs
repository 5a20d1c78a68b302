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

use crate::backend::{Backend, Data, In, Kernel, KernelIo, NodeCtx, Out, TensorInfo};
use crate::control::{self, nbytes, OutSlot, Special};
use crate::tensor::{elem_size, numel, HostTensor};
use bytes::Bytes;
use graphopt_ir::{DType, Graph, Model, TensorData, ValueId};
use graphopt_plan::{inplace_rule, InPlace, Plan};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

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
    /// Threads kernels may use.
    pub threads: usize,
    /// Overwrite each region with poison after its last reader.
    pub poison: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
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
}

/// A 64-byte aligned, zeroed byte buffer.
pub(crate) struct Aligned {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain owned memory.
unsafe impl Send for Aligned {}
unsafe impl Sync for Aligned {}

pub(crate) const ALIGN: usize = 64;

impl Aligned {
    fn new(len: usize) -> Aligned {
        if len == 0 {
            // A dangling, aligned pointer is valid for zero-length slices.
            return Aligned {
                ptr: NonNull::new(ALIGN as *mut u8).expect("non-null"),
                len,
            };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("arena size fits a layout");
        // SAFETY: non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        Aligned {
            ptr: NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout)),
            len,
        }
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this layout.
            unsafe {
                dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align(self.len, ALIGN).expect("same layout"),
                )
            }
        }
    }
}

/// Tells the kernel that the whole pages inside `b` (a weight just copied
/// into aligned memory) will not be read again soon: `MADV_PAGEOUT`
/// reclaims them, so a memory-mapped model file does not stay resident
/// twice (file and copy). Only a hint: the bytes stay valid (file pages
/// are read back on access; anonymous memory is left alone without swap).
fn release_pages(b: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = if page > 0 { page as usize } else { 4096 };
        let p = b.as_ptr() as usize;
        let start = p.div_ceil(page) * page;
        let end = (p + b.len()) / page * page;
        if end > start {
            // SAFETY: [start, end) lies inside `b`, which is borrowed (so
            // mapped) for the call; MADV_PAGEOUT never changes contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = b;
}

/// A weight: in place in the model's bytes, or copied when misaligned.
pub(crate) enum Weight {
    Shared(Bytes),
    Copied(Aligned),
}

impl Weight {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Weight::Shared(b) => b,
            Weight::Copied(a) => a.bytes(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Arena {
        offset: usize,
        len: usize,
    },
    Weight(usize),
    /// A value of data-dependent size: slot of the dynamic store (host
    /// executables only; device backends refuse such plans).
    Dynamic(usize),
}

pub(crate) struct Step<K> {
    pub(crate) name: String,
    pub(crate) op: String,
    pub(crate) kernel: K,
    pub(crate) inputs: Vec<Option<(Loc, TensorInfo)>>,
    /// Arena offset, length and type of each output (`None`: omitted).
    pub(crate) outputs: Vec<Option<(usize, usize, TensorInfo)>>,
    /// Input slots living in output 0's storage.
    pub(crate) in_place: Vec<usize>,
    /// An aliased view: the bytes are already there.
    pub(crate) skip: bool,
    /// If/Loop, or a node touching a dynamic value: run as a nested
    /// program (`kernel` is then a placeholder and `outputs` empty).
    pub(crate) special: Option<Box<Special>>,
}

pub(crate) struct Region {
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) float: bool,
}

/// What makes kernels for [`bind`]: a host [`Backend`] (kernels on byte
/// slices) or a device backend (kernels on device addresses, see
/// `crate::cuda`). Both share every plan check below.
pub(crate) trait KernelMaker {
    type K;
    fn name(&self) -> &str;
    fn has_op(&self, domain: &str, op_type: &str) -> bool;
    fn make(&self, ctx: &NodeCtx) -> Result<Self::K, String>;
    fn workspace_bytes(k: &Self::K) -> usize;
    fn in_place(k: &Self::K) -> bool;
    /// A placeholder kernel for steps run as nested programs (If, Loop,
    /// nodes touching dynamic values); `None` (the default) refuses them.
    fn nop(&self) -> Option<Self::K> {
        None
    }
}

/// The placeholder kernel of a special step (never run).
struct Nop;

impl Kernel for Nop {
    fn run(&self, _: &mut KernelIo) -> Result<(), String> {
        Err("a special step has no kernel".into())
    }
}

struct HostMaker<'a>(&'a dyn Backend);

impl KernelMaker for HostMaker<'_> {
    type K = Box<dyn Kernel>;
    fn name(&self) -> &str {
        self.0.name()
    }
    fn has_op(&self, domain: &str, op_type: &str) -> bool {
        self.0.has_op(domain, op_type)
    }
    fn make(&self, ctx: &NodeCtx) -> Result<Self::K, String> {
        self.0.kernel(ctx)
    }
    fn workspace_bytes(k: &Self::K) -> usize {
        k.workspace_bytes()
    }
    fn in_place(k: &Self::K) -> bool {
        k.in_place()
    }
    fn nop(&self) -> Option<Self::K> {
        Some(Box::new(Nop))
    }
}

/// A model bound to a plan: every check of [`Executable::new`] done, every
/// kernel made, nothing allocated but misaligned weights.
pub(crate) struct Bound<K> {
    pub(crate) steps: Vec<Step<K>>,
    pub(crate) arena_bytes: u64,
    /// Largest kernel scratch.
    pub(crate) max_workspace: usize,
    /// In-place staging bytes (64-aligned), placed before the scratch.
    pub(crate) staging_bytes: usize,
    pub(crate) weights: Vec<Weight>,
    pub(crate) weights_bytes: u64,
    pub(crate) weights_copied: u64,
    pub(crate) inputs: Vec<(String, usize, TensorInfo)>,
    pub(crate) defaults: Vec<(usize, Bytes)>,
    pub(crate) outputs: Vec<(String, Loc, TensorInfo)>,
    pub(crate) poison_after: Vec<Vec<Region>>,
    /// Names of the dynamic values, by store slot.
    pub(crate) dyn_names: Vec<String>,
    /// Dynamic values to free after each step.
    pub(crate) dyn_free_after: Vec<Vec<usize>>,
}

/// A model bound to a plan and a backend, ready to run.
pub struct Executable {
    steps: Vec<Step<Box<dyn Kernel>>>,
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
}

fn info(g: &Graph, v: ValueId) -> Result<TensorInfo, ExecError> {
    let t = g.ty(v).and_then(|t| t.as_tensor()).ok_or_else(|| {
        ExecError::Unsupported(format!("value '{}' is not a typed tensor", g.name(v)))
    })?;
    let dims = t.shape.as_ref().and_then(|s| s.as_known()).ok_or_else(|| {
        ExecError::Unsupported(format!(
            "value '{}' has no concrete shape (bind its dims)",
            g.name(v)
        ))
    })?;
    if elem_size(t.elem).is_none() {
        return Err(ExecError::Unsupported(format!(
            "value '{}' has element type {}, which the runtime does not handle",
            g.name(v),
            t.elem.name()
        )));
    }
    Ok(TensorInfo {
        dtype: t.elem,
        shape: dims.iter().map(|&d| d as usize).collect(),
    })
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 && b.0 < a.0 + a.1
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
        let b = bind(model, plan, &HostMaker(backend))?;
        Ok(Executable {
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

    /// Runs once on `inputs` (the runtime inputs in graph order, with the
    /// planned dtypes and shapes).
    pub fn run(
        &mut self,
        inputs: &[HostTensor],
        opts: &RunOptions,
    ) -> Result<(Vec<HostTensor>, RunStats), ExecError> {
        if inputs.len() != self.inputs.len() {
            return Err(ExecError::Input(format!(
                "the model has {} inputs, {} given",
                self.inputs.len(),
                inputs.len()
            )));
        }
        let arena = self.arena.bytes_mut();
        for ((name, off, ti), t) in self.inputs.iter().zip(inputs) {
            if t.dtype != ti.dtype || t.shape != ti.shape || t.data.len() != nbytes(t) {
                return Err(ExecError::Input(format!(
                    "input '{name}' is {} {:?}, the plan is for {} {:?}",
                    t.dtype.name(),
                    t.shape,
                    ti.dtype.name(),
                    ti.shape
                )));
            }
            arena[*off..*off + t.data.len()].copy_from_slice(&t.data);
        }
        for (off, b) in &self.defaults {
            arena[*off..*off + b.len()].copy_from_slice(b);
        }
        let mut stats = RunStats::default();
        let base = self.arena.ptr.as_ptr();
        let ws_all = self.workspace.bytes_mut();
        let (staging, ws) = ws_all.split_at_mut(self.staging_bytes);
        let weights = &self.weights;
        let dyn_store = &mut self.dyn_store;
        dyn_store.iter_mut().for_each(|d| *d = None);
        let mut dyn_live = 0u64;
        for (si, step) in self.steps.iter_mut().enumerate() {
            if let Some(sp) = step.special.as_mut() {
                let kerr = |msg: String| ExecError::Kernel {
                    op: step.op.clone(),
                    node: step.name.clone(),
                    msg,
                };
                let mut ins = Vec::with_capacity(step.inputs.len());
                for i in &step.inputs {
                    let Some((l, ti)) = i else {
                        ins.push(None);
                        continue;
                    };
                    let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                    let data = match *l {
                        // SAFETY: inside the arena (checked in `new`); no
                        // other reference into the arena is alive here.
                        Loc::Arena { offset, .. } => {
                            unsafe { std::slice::from_raw_parts(base.add(offset), n) }.to_vec()
                        }
                        Loc::Weight(w) => weights[w].bytes()[..n].to_vec(),
                        Loc::Dynamic(k) => {
                            let t = dyn_store[k].clone().ok_or_else(|| {
                                kerr(format!(
                                    "dynamic value '{}' is read after it was freed",
                                    self.dyn_names[k]
                                ))
                            })?;
                            ins.push(Some(t));
                            continue;
                        }
                    };
                    ins.push(Some(HostTensor {
                        dtype: ti.dtype,
                        shape: ti.shape.clone(),
                        data,
                    }));
                }
                let mut sub = RunStats::default();
                let outs = sp.run(ins, opts, &mut sub).map_err(kerr)?;
                stats.poisoned_regions += sub.poisoned_regions;
                stats.kernels_run += sub.kernels_run;
                stats.subgraph_runs += sub.subgraph_runs;
                stats.dynamic_peak_bytes = stats
                    .dynamic_peak_bytes
                    .max(dyn_live + sub.dynamic_peak_bytes);
                for (t, slot) in outs.into_iter().zip(sp.outputs.iter().flatten()) {
                    match slot {
                        OutSlot::Arena {
                            name,
                            offset,
                            len,
                            shape,
                        } => {
                            if t.shape != *shape || t.data.len() != *len {
                                return Err(kerr(format!(
                                    "output '{name}' is {:?} at run time, the plan has {shape:?} ({len} B)",
                                    t.shape
                                )));
                            }
                            // SAFETY: inside the arena; no reference is alive.
                            unsafe { std::slice::from_raw_parts_mut(base.add(*offset), *len) }
                                .copy_from_slice(&t.data);
                        }
                        OutSlot::Dynamic { index } => {
                            dyn_live += t.data.len() as u64;
                            if let Some(old) = dyn_store[*index].replace(t) {
                                dyn_live -= old.data.len() as u64;
                            }
                        }
                    }
                }
                stats.dynamic_peak_bytes = stats.dynamic_peak_bytes.max(dyn_live);
            } else if !step.skip {
                let stage = !step.in_place.is_empty() && !step.kernel.in_place();
                if stage {
                    let (off, len, _) = step.outputs[0].as_ref().expect("in-place output");
                    // SAFETY: inside the arena (checked in `new`); no other
                    // reference into the arena is alive here.
                    let src = unsafe { std::slice::from_raw_parts(base.add(*off), *len) };
                    staging[..*len].copy_from_slice(src);
                }
                let mut ins = Vec::with_capacity(step.inputs.len());
                for (k, i) in step.inputs.iter().enumerate() {
                    ins.push(i.as_ref().map(|(l, ti)| {
                        let data = if step.in_place.contains(&k) {
                            if stage {
                                Data::Bytes(
                                    &staging[..numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1)],
                                )
                            } else {
                                Data::Output0
                            }
                        } else {
                            match *l {
                                // SAFETY: inside the arena, and disjoint from
                                // every output of this node (checked in `new`).
                                Loc::Arena { offset, len } => Data::Bytes(unsafe {
                                    std::slice::from_raw_parts(base.add(offset), len)
                                }),
                                Loc::Weight(w) => Data::Bytes(weights[w].bytes()),
                                // Steps reading a dynamic value are special.
                                Loc::Dynamic(_) => Data::Bytes(&[]),
                            }
                        };
                        In {
                            dtype: ti.dtype,
                            shape: &ti.shape,
                            data,
                        }
                    }));
                }
                let mut outs = Vec::with_capacity(step.outputs.len());
                // Omitted outputs are trailing (checked in `new`).
                for (off, len, ti) in step.outputs.iter().flatten() {
                    // SAFETY: inside the arena; outputs are pairwise
                    // disjoint and disjoint from the inputs handed out as
                    // slices (checked in `new`).
                    outs.push(Out {
                        dtype: ti.dtype,
                        shape: &ti.shape,
                        data: unsafe { std::slice::from_raw_parts_mut(base.add(*off), *len) },
                    });
                }
                let mut io = KernelIo {
                    inputs: ins,
                    outputs: outs,
                    workspace: &mut ws[..],
                    threads: opts.threads.max(1),
                };
                step.kernel.run(&mut io).map_err(|msg| ExecError::Kernel {
                    op: step.op.clone(),
                    node: step.name.clone(),
                    msg,
                })?;
                stats.kernels_run += 1;
            }
            for &k in &self.dyn_free_after[si] {
                if let Some(t) = dyn_store[k].take() {
                    dyn_live -= t.data.len() as u64;
                }
            }
            if opts.poison {
                for r in &self.poison_after[si] {
                    // SAFETY: inside the arena; no reference is alive.
                    let b = unsafe { std::slice::from_raw_parts_mut(base.add(r.offset), r.len) };
                    if r.float && r.len % 4 == 0 {
                        for c in b.chunks_exact_mut(4) {
                            c.copy_from_slice(&POISON_F32.to_le_bytes());
                        }
                    } else {
                        b.fill(0xA5);
                    }
                    stats.poisoned_regions += 1;
                }
            }
        }
        let arena = self.arena.bytes();
        let mut outputs = Vec::with_capacity(self.outputs.len());
        for (name, l, ti) in &self.outputs {
            let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
            let data = match *l {
                Loc::Arena { offset, .. } => arena[offset..offset + n].to_vec(),
                Loc::Weight(w) => self.weights[w].bytes()[..n].to_vec(),
                Loc::Dynamic(k) => {
                    let t = self.dyn_store[k].clone().ok_or_else(|| {
                        ExecError::BadPlan(format!("output '{name}' was freed before the end"))
                    })?;
                    outputs.push(t);
                    continue;
                }
            };
            outputs.push(HostTensor {
                dtype: ti.dtype,
                shape: ti.shape.clone(),
                data,
            });
        }
        self.dyn_store.iter_mut().for_each(|d| *d = None);
        Ok((outputs, stats))
    }
}

/// The f32 poison: a NaN with a recognisable payload.
pub const POISON_F32: u32 = 0x7FA5_A5A5;

/// Binds `model` to `plan`, asking `maker` for every kernel: the checks
/// and layout of [`Executable::new`], shared with device backends.
pub(crate) fn bind<M: KernelMaker>(
    model: &Model,
    plan: &Plan,
    backend: &M,
) -> Result<Bound<M::K>, ExecError> {
    let g = &model.graph;

    // Invariant 1 first by name: an op without any kernel, or a
    // subgraph, is named before anything else is checked.
    let specials = backend.nop().is_some();
    for &n in &plan.schedule {
        let d = g.node(n);
        let why: String = if d.has_subgraphs() {
            if !specials {
                "subgraphs (If/Loop/Scan) are not supported yet on this backend".into()
            } else if let Err(e) = control::supported_control(d) {
                e
            } else {
                continue;
            }
        } else if !backend.has_op(&d.domain, &d.op_type) {
            "no kernel for this op yet".into()
        } else {
            continue;
        };
        return Err(ExecError::NoKernel {
            backend: backend.name().to_string(),
            op: d.qualified_op(),
            node: if d.name.is_empty() {
                n.to_string()
            } else {
                d.name.clone()
            },
            why,
        });
    }
    if !plan.dynamic_values.is_empty() && !specials {
        return Err(ExecError::Unsupported(format!(
            "{} value(s) of data-dependent size ({}): dynamic allocation is not implemented yet",
            plan.dynamic_values.len(),
            plan.dynamic_values.join(", ")
        )));
    }
    let opset = model
        .opset_imports
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(1, |o| o.version);
    let nvals = g.values().map(|v| v.index() + 1).max().unwrap_or(0);
    let mut tensor_of: Vec<Option<usize>> = vec![None; nvals];
    // Values of data-dependent size: the dynamic store's slots.
    let mut dyn_of: Vec<Option<usize>> = vec![None; nvals];
    for (i, name) in plan.dynamic_values.iter().enumerate() {
        let v = g.value_by_name(name).ok_or_else(|| {
            ExecError::BadPlan(format!("dynamic value '{name}' is not in the graph"))
        })?;
        dyn_of[v.index()] = Some(i);
    }
    for (i, t) in plan.tensors.iter().enumerate() {
        tensor_of[t.value.index()] = Some(i);
        if t.offset + t.size > plan.arena_bytes {
            return Err(ExecError::BadPlan(format!(
                "tensor '{}' at [{}, +{}) lies outside the arena of {} bytes",
                t.name, t.offset, t.size, plan.arena_bytes
            )));
        }
    }
    // Weights: initializers that are not graph inputs, read in place.
    let mut weights = Vec::new();
    let mut weight_of: Vec<Option<usize>> = vec![None; nvals];
    let (mut weights_bytes, mut weights_copied) = (0u64, 0u64);
    for &w in g.initializers() {
        if g.is_input(w) {
            continue;
        }
        let t = g.initializer(w).expect("listed initializer");
        let TensorData::Raw(b) = &t.data else {
            return Err(ExecError::Unsupported(format!(
                "initializer '{}' holds strings",
                g.name(w)
            )));
        };
        weights_bytes += b.len() as u64;
        let es = elem_size(t.dtype).unwrap_or(1);
        let wt = if b.as_ptr().align_offset(es.max(1)) == 0 {
            Weight::Shared(b.clone())
        } else {
            weights_copied += b.len() as u64;
            let mut a = Aligned::new(b.len());
            a.bytes_mut().copy_from_slice(b);
            release_pages(b);
            Weight::Copied(a)
        };
        weight_of[w.index()] = Some(weights.len());
        weights.push(wt);
    }
    let loc = |v: ValueId| -> Result<Loc, ExecError> {
        if let Some(i) = weight_of[v.index()] {
            return Ok(Loc::Weight(i));
        }
        if let Some(i) = dyn_of[v.index()] {
            return Ok(Loc::Dynamic(i));
        }
        match tensor_of[v.index()] {
            Some(t) => Ok(Loc::Arena {
                offset: plan.tensors[t].offset as usize,
                len: plan.tensors[t].size as usize,
            }),
            None => Err(ExecError::Unsupported(format!(
                "value '{}' is neither a weight nor a planned tensor (outer-scope values are not supported)",
                g.name(v)
            ))),
        }
    };
    // Declared aliases: output value -> input value.
    let mut alias_in: Vec<Option<ValueId>> = vec![None; nvals];
    for a in &plan.aliases {
        alias_in[plan.tensors[a.output].value.index()] = Some(plan.tensors[a.input].value);
    }
    let mut steps = Vec::new();
    let mut max_ws = 0usize;
    let mut max_stage = 0usize;
    for &n in &plan.schedule {
        let d = g.node(n);
        let name = if d.name.is_empty() {
            n.to_string()
        } else {
            d.name.clone()
        };
        let refuse = |why: String| ExecError::NoKernel {
            backend: backend.name().to_string(),
            op: d.qualified_op(),
            node: name.clone(),
            why,
        };
        let touches_dynamic = d
            .inputs()
            .iter()
            .chain(d.outputs())
            .flatten()
            .any(|v| dyn_of[v.index()].is_some());
        if d.has_subgraphs() || touches_dynamic {
            let kernel = backend.nop().ok_or_else(|| {
                refuse("subgraphs (If/Loop/Scan) are not supported yet on this backend".into())
            })?;
            // Inputs: the node's, then its non-weight captures (If/Loop),
            // or the distinct non-weight inputs (a node run alone).
            let (kind, fed, node_inputs, capture_names) = if d.has_subgraphs() {
                let kind = control::control_kind(d, g, model).map_err(&refuse)?;
                let mut fed: Vec<Option<ValueId>> = d.inputs().to_vec();
                let mut names = Vec::new();
                for &c in d.captures() {
                    if weight_of[c.index()].is_none() {
                        fed.push(Some(c));
                        names.push(g.name(c).to_string());
                    }
                }
                (kind, fed, d.inputs().len(), names)
            } else {
                let (kind, fed) = control::node_kind(g, d, model).map_err(&refuse)?;
                let n = fed.len();
                (kind, fed.into_iter().map(Some).collect(), n, Vec::new())
            };
            let mut inputs = Vec::new();
            for v in fed {
                inputs.push(match v {
                    None => None,
                    Some(v) => Some((loc(v)?, info_or_dynamic(g, v, &dyn_of)?)),
                });
            }
            let mut outs = Vec::new();
            for &o in d.outputs() {
                let Some(v) = o else {
                    outs.push(None);
                    continue;
                };
                outs.push(Some(match loc(v)? {
                    Loc::Arena { offset, len } => {
                        let ti = info(g, v)?;
                        let want = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                        if len != want {
                            return Err(ExecError::BadPlan(format!(
                                "tensor '{}' is planned at {len} bytes but holds {want}",
                                g.name(v)
                            )));
                        }
                        OutSlot::Arena {
                            name: g.name(v).to_string(),
                            offset,
                            len,
                            shape: ti.shape,
                        }
                    }
                    Loc::Dynamic(index) => OutSlot::Dynamic { index },
                    Loc::Weight(_) => {
                        return Err(ExecError::BadPlan(format!(
                            "output '{}' of node '{name}' is an initializer",
                            g.name(v)
                        )))
                    }
                }));
            }
            steps.push(Step {
                name,
                op: d.op_type.clone(),
                kernel,
                inputs,
                outputs: Vec::new(),
                in_place: Vec::new(),
                skip: false,
                special: Some(Box::new(Special {
                    kind,
                    node_inputs,
                    capture_names,
                    outputs: outs,
                })),
            });
            continue;
        }
        let mut inputs = Vec::new();
        let mut infos = Vec::new();
        let mut constants = Vec::new();
        for &i in d.inputs() {
            match i {
                None => {
                    inputs.push(None);
                    infos.push(None);
                    constants.push(None);
                }
                Some(v) => {
                    let ti = info(g, v)?;
                    let l = loc(v)?;
                    constants.push(match l {
                        Loc::Weight(w) => Some(weights[w].bytes()),
                        _ => None,
                    });
                    inputs.push(Some((l, ti.clone())));
                    infos.push(Some(ti));
                }
            }
        }
        let mut outputs = Vec::new();
        let mut out_infos = Vec::new();
        for &o in d.outputs() {
            match o {
                None => {
                    outputs.push(None);
                    out_infos.push(TensorInfo {
                        dtype: DType::F32,
                        shape: vec![0],
                    });
                }
                Some(v) => {
                    let ti = info(g, v)?;
                    let Loc::Arena { offset, len } = loc(v)? else {
                        return Err(ExecError::BadPlan(format!(
                            "output '{}' of node '{name}' is an initializer",
                            g.name(v)
                        )));
                    };
                    let want = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                    if len != want {
                        return Err(ExecError::BadPlan(format!(
                            "tensor '{}' is planned at {len} bytes but holds {want}",
                            g.name(v)
                        )));
                    }
                    outputs.push(Some((offset, len, ti.clone())));
                    out_infos.push(ti);
                }
            }
        }
        if let Some(k) = d.outputs().iter().position(|o| o.is_none()) {
            if d.outputs()[k..].iter().any(|o| o.is_some()) {
                return Err(refuse(format!(
                    "output {k} is omitted but a later one is not (not supported yet)"
                )));
            }
        }
        let ctx = NodeCtx {
            node: d,
            opset,
            inputs: infos,
            outputs: out_infos,
            constants,
        };
        let kernel = backend.make(&ctx).map_err(refuse)?;
        // In-place slots and aliased views.
        let host = d.output(0).and_then(|o| alias_in[o.index()]);
        let rule = if d.domain.is_empty() || d.domain == "ai.onnx" {
            inplace_rule(&d.op_type)
        } else {
            InPlace::None
        };
        let mut in_place = Vec::new();
        let mut skip = false;
        if let Some(h) = host {
            match rule {
                InPlace::View if d.input(0) == Some(h) => skip = true,
                InPlace::Elementwise => {
                    in_place = (0..d.inputs().len())
                        .filter(|&k| d.input(k) == Some(h))
                        .collect();
                }
                _ => {
                    return Err(ExecError::BadPlan(format!(
                        "node '{name}' ({}) has an in-place pair its rule does not allow",
                        d.op_type
                    )))
                }
            }
        }
        // Invariant 3: no overlap but the declared pair.
        let outs: Vec<(usize, usize)> = outputs.iter().flatten().map(|o| (o.0, o.1)).collect();
        for (a, x) in outs.iter().enumerate() {
            for y in &outs[a + 1..] {
                if overlaps(*x, *y) {
                    return Err(ExecError::BadPlan(format!(
                        "two outputs of node '{name}' overlap"
                    )));
                }
            }
        }
        if !skip {
            for (k, i) in inputs.iter().enumerate() {
                if in_place.contains(&k) {
                    continue;
                }
                if let Some((Loc::Arena { offset, len }, _)) = i {
                    if outs.iter().any(|o| overlaps(*o, (*offset, *len))) {
                        return Err(ExecError::BadPlan(format!(
                            "node '{name}' writes over its input {k}, which the plan does not declare in place"
                        )));
                    }
                }
            }
        }
        if !skip {
            max_ws = max_ws.max(M::workspace_bytes(&kernel));
            if !in_place.is_empty() && !M::in_place(&kernel) {
                max_stage = max_stage.max(outputs[0].as_ref().map_or(0, |o| o.1));
            }
        }
        steps.push(Step {
            name,
            op: d.op_type.clone(),
            kernel,
            inputs,
            outputs,
            in_place,
            skip,
            special: None,
        });
    }
    // Graph inputs and outputs.
    let mut inputs = Vec::new();
    let mut defaults = Vec::new();
    for &v in &g.inputs {
        let Loc::Arena { offset, .. } = loc(v)? else {
            continue;
        };
        match g.initializer(v) {
            Some(t) => {
                let Some(b) = t.raw() else {
                    return Err(ExecError::Unsupported(format!(
                        "input '{}' has a string default",
                        g.name(v)
                    )));
                };
                defaults.push((offset, b.clone()));
            }
            None => inputs.push((g.name(v).to_string(), offset, info(g, v)?)),
        }
    }
    let mut outputs = Vec::new();
    for &v in &g.outputs {
        outputs.push((
            g.name(v).to_string(),
            loc(v)?,
            info_or_dynamic(g, v, &dyn_of)?,
        ));
    }
    // Dynamic values are freed after their last reader (graph outputs
    // live to the end).
    let mut dyn_last: Vec<Option<usize>> = vec![None; plan.dynamic_values.len()];
    for (si, s) in steps.iter().enumerate() {
        for (l, _) in s.inputs.iter().flatten() {
            if let Loc::Dynamic(k) = *l {
                dyn_last[k] = Some(si);
            }
        }
        if let Some(sp) = &s.special {
            for o in sp.outputs.iter().flatten() {
                if let OutSlot::Dynamic { index } = o {
                    dyn_last[*index] = Some(dyn_last[*index].map_or(si, |x| x.max(si)));
                }
            }
        }
    }
    for (_, l, _) in &outputs {
        if let Loc::Dynamic(k) = *l {
            dyn_last[k] = None;
        }
    }
    let mut dyn_free_after: Vec<Vec<usize>> = (0..steps.len()).map(|_| Vec::new()).collect();
    for (k, l) in dyn_last.iter().enumerate() {
        if let Some(si) = l {
            dyn_free_after[*si].push(k);
        }
    }
    // Poison regions: alias groups end together.
    let mut parent: Vec<usize> = (0..plan.tensors.len()).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    for a in &plan.aliases {
        let (x, y) = (find(&mut parent, a.input), find(&mut parent, a.output));
        parent[x] = y;
    }
    let steps_n = plan.schedule.len();
    let mut groups: Vec<Option<(usize, usize, usize, bool)>> = vec![None; plan.tensors.len()];
    for (i, t) in plan.tensors.iter().enumerate() {
        let r = find(&mut parent, i);
        let float = g.ty(t.value).and_then(|t| t.elem()) == Some(DType::F32);
        let e = groups[r].get_or_insert((t.offset as usize, 0, 0, float));
        e.1 = e.1.max(t.size as usize);
        e.2 = e.2.max(t.last);
        e.3 &= float;
    }
    let mut poison_after: Vec<Vec<Region>> = (0..steps_n).map(|_| Vec::new()).collect();
    for (offset, len, last, float) in groups.into_iter().flatten() {
        if len > 0 && last + 1 < steps_n {
            poison_after[last].push(Region { offset, len, float });
        }
    }
    Ok(Bound {
        steps,
        arena_bytes: plan.arena_bytes,
        max_workspace: max_ws,
        staging_bytes: max_stage.next_multiple_of(ALIGN),
        weights,
        weights_bytes,
        weights_copied,
        inputs,
        defaults,
        outputs,
        poison_after,
        dyn_names: plan.dynamic_values.clone(),
        dyn_free_after,
    })
}

/// [`info`], or for a value of data-dependent size its element type with
/// an empty placeholder shape (the run-time shape travels with the value).
fn info_or_dynamic(
    g: &Graph,
    v: ValueId,
    dyn_of: &[Option<usize>],
) -> Result<TensorInfo, ExecError> {
    if dyn_of[v.index()].is_none() {
        return info(g, v);
    }
    Ok(TensorInfo {
        dtype: g.ty(v).and_then(|t| t.elem()).unwrap_or(DType::F32),
        shape: Vec::new(),
    })
}
