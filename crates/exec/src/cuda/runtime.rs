//! The CUDA runtime: a model bound to a plan on one GPU.
//!
//! Memory, allocated once in [`CudaExecutable::new`] with plain
//! `cuMemAlloc` (no pool, no caching allocator):
//! - one buffer for the weights (initializers, each 256-aligned) and the
//!   bytes of Shape/Constant nodes;
//! - one buffer for the arena at the planner's offsets, followed by the
//!   in-place staging, the largest kernel scratch and cuBLAS's workspace.
//!
//! Tensors are raw device addresses (`base + offset`): cudarc's borrow
//! rules on `CudaSlice` views cannot express many live views of one arena,
//! and its event tracking would serialise them as a whole.
//!
//! Inputs and outputs go through pinned host buffers with async copies on
//! the executable's stream. After the first run, [`CudaExecutable::run`]
//! with `graph = true` captures the whole step (input copies, kernels,
//! GEMMs, output copies) as a CUDA graph and replays it afterwards.
//!
//! Every call into the driver, NVRTC or cuBLAS is checked, and the first
//! failure is returned as one line. Nothing here has run on a GPU yet
//! (see the README): it is compiled and its inputs ([`super::ops`],
//! [`super::codegen`]) are tested on the CPU.

use super::codegen;
use super::ops::{self, Launch, NodePlan};
use super::{dev_steps, issue_step, CudaBackend, DevStep, Issue};
use crate::backend::TensorInfo;
use crate::executor::{bind, Bound, ExecError, Loc};
use crate::tensor::{elem_size, numel, HostTensor};
use cudarc::cublas::sys as blas;
use cudarc::driver::sys as drv;
use cudarc::driver::{result, CudaContext, CudaFunction, CudaGraph, CudaStream, PinnedHostSlice};
use graphopt_ir::{DType, Model};
use graphopt_plan::Plan;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// Device allocations are aligned to this (cuBLAS and vector loads).
const DEV_ALIGN: usize = 256;
/// cuBLAS workspace (its documented recommendation for Hopper).
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// Why the CUDA backend cannot start here, or `None` when the driver,
/// NVRTC and cuBLAS libraries load and a device is visible.
pub fn unavailable() -> Option<String> {
    // SAFETY: these only try to dlopen the libraries.
    let (cuda, nvrtc, cublas) = unsafe {
        (
            drv::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            blas::is_culib_present(),
        )
    };
    if !cuda {
        return Some("no CUDA driver found (libcuda could not be loaded): --device cuda needs an NVIDIA GPU and its driver".into());
    }
    if !nvrtc {
        return Some("libnvrtc could not be loaded (CUDA 13 runtime compiler; put its directory on LD_LIBRARY_PATH)".into());
    }
    if !cublas {
        return Some(
            "libcublas could not be loaded (CUDA 13 cuBLAS; put its directory on LD_LIBRARY_PATH)"
                .into(),
        );
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => None,
        Ok(_) => Some("the CUDA driver sees no GPU".into()),
        Err(e) => Some(format!("the CUDA driver failed to start: {e}")),
    }
}

/// A raw device allocation (`cuMemAlloc`), freed on drop.
struct DevBuf {
    ptr: drv::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<DevBuf, String> {
        ctx.bind_to_thread()
            .map_err(|e| format!("cuCtxSetCurrent: {e}"))?;
        // A zero-size cuMemAlloc fails: keep one byte.
        // SAFETY: plain allocation; the memory is only written before read.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }
            .map_err(|e| format!("cuMemAlloc of {len} bytes: {e}"))?;
        Ok(DevBuf {
            ptr,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync, freed once; the stream is
        // synchronised by CudaExecutable's drop before this runs.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

fn align(x: usize) -> usize {
    x.next_multiple_of(DEV_ALIGN)
}

fn d(e: impl std::fmt::Display, what: &str) -> ExecError {
    ExecError::Unsupported(format!("CUDA: {what}: {e}"))
}

/// Device memory figures of one executable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Weights plus Shape/Constant bytes, as allocated (aligned).
    pub weights_bytes: u64,
    /// The arena at the plan's size.
    pub arena_bytes: u64,
    /// Staging + kernel scratch + cuBLAS workspace.
    pub workspace_bytes: u64,
    /// Free device memory (cuMemGetInfo) before the two allocations minus
    /// after them: what they really took, page rounding included.
    pub measured_bytes: u64,
}

/// A model bound to a plan on the GPU, ready to run.
pub struct CudaExecutable {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: cudarc::cublas::CudaBlas,
    functions: HashMap<String, CudaFunction>,
    steps: Vec<DevStep>,
    /// Owned: the weights live here until the executable is dropped.
    _weights: DevBuf,
    arena: DevBuf,
    /// Offsets in `arena`'s allocation.
    staging_off: usize,
    scratch_off: usize,
    memory: DeviceMemory,
    host_weights_bytes: u64,
    inputs: Vec<(String, usize, TensorInfo)>,
    defaults: Vec<(usize, usize)>,
    outputs: Vec<(String, drv::CUdeviceptr, TensorInfo)>,
    pin_in: PinnedHostSlice<u8>,
    pin_out: PinnedHostSlice<u8>,
    pin_in_addr: usize,
    pin_out_addr: usize,
    /// (offset in pin_in, length) per runtime input then per default.
    in_slots: Vec<(usize, usize)>,
    out_slots: Vec<(usize, usize)>,
    graph: Option<CudaGraph>,
    /// Why graph replay is off, once a capture failed.
    graph_error: Option<String>,
    runs: usize,
    kernels: usize,
    module_bytes: usize,
}

/// NVRTC's target: the device's virtual architecture, so that NVRTC
/// returns PTX (what cudarc's `compile_ptx` fetches) and the driver
/// compiles it for the exact chip at module load.
fn arch(cc: (i32, i32)) -> Option<&'static str> {
    Some(match cc {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

impl CudaExecutable {
    /// Binds `model` to `plan` (the checks of [`crate::Executable::new`]),
    /// compiles every distinct kernel in one NVRTC module, allocates the
    /// two device buffers and uploads the weights.
    pub fn new(model: &Model, plan: &Plan) -> Result<CudaExecutable, ExecError> {
        if let Some(why) = unavailable() {
            return Err(ExecError::Unsupported(why));
        }
        let b: Bound<NodePlan> = bind(model, plan, &CudaBackend)?;
        let ctx = CudaContext::new(0).map_err(|e| d(e, "cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(|e| d(e, "cuStreamCreate"))?;
        let blas =
            cudarc::cublas::CudaBlas::new(stream.clone()).map_err(|e| d(e, "cublasCreate"))?;
        // One module with every distinct kernel.
        let mut seen = HashMap::new();
        let mut srcs = Vec::new();
        for s in &b.steps {
            for k in &s.kernel.sources {
                if seen.insert(k.name.clone(), ()).is_none() {
                    srcs.push(k.clone());
                }
            }
        }
        let mut functions = HashMap::new();
        let text = codegen::module(&srcs);
        if !srcs.is_empty() {
            let cc = ctx
                .compute_capability()
                .map_err(|e| d(e, "compute capability"))?;
            let opts = cudarc::nvrtc::CompileOptions {
                arch: arch(cc),
                options: vec!["--std=c++17".into()],
                ..Default::default()
            };
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(&text, opts).map_err(|e| {
                let msg = format!("{e:?}");
                ExecError::Unsupported(format!(
                    "CUDA: NVRTC failed on the generated kernels: {}",
                    msg.chars()
                        .take(2000)
                        .collect::<String>()
                        .replace('\n', " | ")
                ))
            })?;
            let module = ctx.load_module(ptx).map_err(|e| d(e, "cuModuleLoadData"))?;
            for k in &srcs {
                let f = module
                    .load_function(&k.name)
                    .map_err(|e| d(e, &format!("kernel {}", k.name)))?;
                functions.insert(k.name.clone(), f);
            }
        }
        // Weights buffer: initializers, then Upload bytes.
        let mut w_off = Vec::new();
        let mut w_total = 0usize;
        for w in &b.weights {
            w_off.push(w_total);
            w_total = align(w_total + w.bytes().len());
        }
        let mut up_off: Vec<Vec<usize>> = Vec::new();
        for s in &b.steps {
            let mut v = Vec::new();
            for l in &s.kernel.launches {
                if let Launch::Upload { data, .. } = l {
                    v.push(w_total);
                    w_total = align(w_total + data.len());
                }
            }
            up_off.push(v);
        }
        let arena_len = align(b.arena_bytes as usize);
        let staging_off = arena_len;
        let scratch_off = staging_off + align(b.staging_bytes);
        let blas_off = scratch_off + align(b.max_workspace);
        let total = blas_off + CUBLAS_WORKSPACE;
        ctx.synchronize().map_err(|e| d(e, "cuCtxSynchronize"))?;
        let (free0, _) = ctx.mem_get_info().map_err(|e| d(e, "cuMemGetInfo"))?;
        let weights = DevBuf::new(&ctx, w_total).map_err(ExecError::Unsupported)?;
        let arena = DevBuf::new(&ctx, total).map_err(ExecError::Unsupported)?;
        let (free1, _) = ctx.mem_get_info().map_err(|e| d(e, "cuMemGetInfo"))?;
        let memory = DeviceMemory {
            weights_bytes: w_total as u64,
            arena_bytes: b.arena_bytes,
            workspace_bytes: (total - arena_len) as u64,
            measured_bytes: free0.saturating_sub(free1) as u64,
        };
        // SAFETY: the workspace lies inside `arena`, which outlives `blas`
        // (field order: blas is dropped first).
        unsafe {
            blas::cublasSetWorkspace_v2(
                *blas.handle(),
                (arena.ptr + blas_off as u64) as *mut c_void,
                CUBLAS_WORKSPACE,
            )
            .result()
            .map_err(|e| d(e, "cublasSetWorkspace"))?;
            // Tensor cores for fp16/bf16; fp32 stays true fp32 (as torch's
            // default for matmul).
            blas::cublasSetMathMode(*blas.handle(), blas::cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .map_err(|e| d(e, "cublasSetMathMode"))?;
        }
        // Upload weights and constants (synchronous, once).
        for (w, off) in b.weights.iter().zip(&w_off) {
            let bytes = w.bytes();
            if !bytes.is_empty() {
                // SAFETY: inside `weights` (sized above).
                unsafe { result::memcpy_htod_sync(weights.ptr + *off as u64, bytes) }
                    .map_err(|e| d(e, "weight upload"))?;
            }
        }
        for (s, offs) in b.steps.iter().zip(&up_off) {
            let mut i = 0;
            for l in &s.kernel.launches {
                if let Launch::Upload { data, .. } = l {
                    if !data.is_empty() {
                        // SAFETY: inside `weights`.
                        unsafe { result::memcpy_htod_sync(weights.ptr + offs[i] as u64, data) }
                            .map_err(|e| d(e, "constant upload"))?;
                    }
                    i += 1;
                }
            }
        }
        let addr = |l: &Loc| -> drv::CUdeviceptr {
            match *l {
                Loc::Arena { offset, .. } => arena.ptr + offset as u64,
                Loc::Weight(w) => weights.ptr + w_off[w] as u64,
                Loc::Dynamic(_) => unreachable!("device backends refuse dynamic values in bind"),
            }
        };
        let uploads: Vec<Vec<u64>> = up_off
            .iter()
            .map(|v| v.iter().map(|&o| weights.ptr + o as u64).collect())
            .collect();
        let kernels = b
            .steps
            .iter()
            .filter(|s| !s.skip)
            .map(|s| s.kernel.launches.len())
            .sum();
        let steps = dev_steps(
            b.steps,
            arena.ptr,
            arena.ptr + staging_off as u64,
            &|w| weights.ptr + w_off[w] as u64,
            uploads,
        );
        // Pinned staging for inputs (and overridable defaults) and outputs.
        let mut in_slots = Vec::new();
        let mut pin_len = 0usize;
        for (_, _, ti) in &b.inputs {
            let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
            in_slots.push((pin_len, n));
            pin_len = (pin_len + n).next_multiple_of(64);
        }
        let defaults: Vec<(usize, usize)> = b
            .defaults
            .iter()
            .map(|(off, bytes)| {
                in_slots.push((pin_len, bytes.len()));
                pin_len = (pin_len + bytes.len()).next_multiple_of(64);
                (*off, bytes.len())
            })
            .collect();
        let mut out_slots = Vec::new();
        let mut pout_len = 0usize;
        let outputs: Vec<(String, drv::CUdeviceptr, TensorInfo)> = b
            .outputs
            .iter()
            .map(|(n, l, ti)| {
                let len = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                out_slots.push((pout_len, len));
                pout_len = (pout_len + len).next_multiple_of(64);
                (n.clone(), addr(l), ti.clone())
            })
            .collect();
        // SAFETY: pinned host memory, written before it is read.
        let mut pin_in = unsafe { ctx.alloc_pinned_with_flags::<u8>(pin_len.max(1), 0) }
            .map_err(|e| d(e, "cuMemHostAlloc"))?;
        let pin_out = unsafe { ctx.alloc_pinned_with_flags::<u8>(pout_len.max(1), 0) }
            .map_err(|e| d(e, "cuMemHostAlloc"))?;
        {
            let host = pin_in.as_mut_slice().map_err(|e| d(e, "pinned buffer"))?;
            let first = b.inputs.len();
            for (k, (_, bytes)) in b.defaults.iter().enumerate() {
                let (o, n) = in_slots[first + k];
                host[o..o + n].copy_from_slice(bytes);
            }
        }
        let pin_in_addr = pin_in.as_ptr().map_err(|e| d(e, "pinned buffer"))? as usize;
        let pin_out_addr = pin_out.as_ptr().map_err(|e| d(e, "pinned buffer"))? as usize;
        Ok(CudaExecutable {
            ctx,
            stream,
            blas,
            functions,
            steps,
            _weights: weights,
            arena,
            staging_off,
            scratch_off,
            memory,
            host_weights_bytes: b.weights_bytes,
            inputs: b.inputs,
            defaults,
            outputs,
            pin_in,
            pin_out,
            pin_in_addr,
            pin_out_addr,
            in_slots,
            out_slots,
            graph: None,
            graph_error: None,
            runs: 0,
            kernels,
            module_bytes: text.len(),
        })
    }

    /// Device memory as allocated and as measured.
    pub fn memory(&self) -> DeviceMemory {
        self.memory
    }
    /// Weight bytes in the model (before alignment).
    pub fn weights_bytes(&self) -> u64 {
        self.host_weights_bytes
    }
    /// Launches per run (kernels, GEMMs, copies).
    pub fn launches(&self) -> usize {
        self.kernels
    }
    /// Distinct NVRTC kernels compiled.
    pub fn compiled_kernels(&self) -> usize {
        self.functions.len()
    }
    /// Size of the generated CUDA C module.
    pub fn module_source_bytes(&self) -> usize {
        self.module_bytes
    }
    /// Whether runs replay a captured CUDA graph, and why not if a capture failed.
    pub fn graph_state(&self) -> (bool, Option<&str>) {
        (self.graph.is_some(), self.graph_error.as_deref())
    }
    pub fn device_name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }
    /// Names of the outputs, in graph order.
    pub fn output_names(&self) -> Vec<String> {
        self.outputs.iter().map(|o| o.0.clone()).collect()
    }
    /// Names and types of the runtime inputs, in graph order.
    pub fn input_infos(&self) -> Vec<(String, TensorInfo)> {
        self.inputs
            .iter()
            .map(|(n, _, t)| (n.clone(), t.clone()))
            .collect()
    }

    /// Issues every step's work on the stream (no synchronisation).
    fn issue_steps(&self) -> Result<(), ExecError> {
        let staging = self.arena.ptr + self.staging_off as u64;
        let scratch = self.arena.ptr + self.scratch_off as u64;
        for s in &self.steps {
            issue_step(self, s, staging, scratch)?;
        }
        Ok(())
    }

    /// Input copies, every step, output copies: the whole run on the stream.
    fn issue_all(&self) -> Result<(), ExecError> {
        let cu = self.stream.cu_stream();
        let pin_in = self.pin_in_ptr();
        let n_in = self.inputs.len();
        for (k, (_, off, _)) in self.inputs.iter().enumerate() {
            let (o, n) = self.in_slots[k];
            if n > 0 {
                // SAFETY: pinned source of n bytes; arena destination.
                unsafe {
                    drv::cuMemcpyHtoDAsync_v2(
                        self.arena.ptr + *off as u64,
                        pin_in.add(o) as *const c_void,
                        n,
                        cu,
                    )
                }
                .result()
                .map_err(|e| d(e, "input copy"))?;
            }
        }
        for (k, (off, n)) in self.defaults.iter().enumerate() {
            let (o, _) = self.in_slots[n_in + k];
            if *n > 0 {
                // SAFETY: as above.
                unsafe {
                    drv::cuMemcpyHtoDAsync_v2(
                        self.arena.ptr + *off as u64,
                        pin_in.add(o) as *const c_void,
                        *n,
                        cu,
                    )
                }
                .result()
                .map_err(|e| d(e, "input copy"))?;
            }
        }
        self.issue_steps()?;
        let pin_out = self.pin_out_ptr();
        for (k, (_, src, _)) in self.outputs.iter().enumerate() {
            let (o, n) = self.out_slots[k];
            if n > 0 {
                // SAFETY: pinned destination of n bytes.
                unsafe { drv::cuMemcpyDtoHAsync_v2(pin_out.add(o) as *mut c_void, *src, n, cu) }
                    .result()
                    .map_err(|e| d(e, "output copy"))?;
            }
        }
        Ok(())
    }

    // The pinned buffers' addresses, taken once (reading them through
    // `PinnedHostSlice::as_ptr` synchronises an event, which a stream
    // capture forbids). Only this executable touches the buffers, between
    // stream synchronisations.
    fn pin_in_ptr(&self) -> *mut u8 {
        self.pin_in_addr as *mut u8
    }
    fn pin_out_ptr(&self) -> *mut u8 {
        self.pin_out_addr as *mut u8
    }

    /// Runs once. With `graph`, the first run is issued op by op and
    /// captured into a CUDA graph for the next ones (when capture fails,
    /// runs stay op by op and [`CudaExecutable::graph_state`] says why).
    pub fn run(
        &mut self,
        inputs: &[HostTensor],
        graph: bool,
    ) -> Result<Vec<HostTensor>, ExecError> {
        if inputs.len() != self.inputs.len() {
            return Err(ExecError::Input(format!(
                "the model has {} inputs, {} given",
                self.inputs.len(),
                inputs.len()
            )));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| d(e, "cuCtxSetCurrent"))?;
        {
            let host = self
                .pin_in
                .as_mut_slice()
                .map_err(|e| d(e, "pinned buffer"))?;
            for (k, ((name, _, ti), t)) in self.inputs.iter().zip(inputs).enumerate() {
                crate::executor::check_input(name, t, ti)?;
                let (o, n) = self.in_slots[k];
                host[o..o + n].copy_from_slice(&t.data[..n]);
            }
        }
        if let Some(g) = &self.graph {
            g.launch().map_err(|e| d(e, "cuGraphLaunch"))?;
        } else if graph && self.runs > 0 && self.graph_error.is_none() {
            match self.capture() {
                Ok(g) => {
                    g.launch().map_err(|e| d(e, "cuGraphLaunch"))?;
                    self.graph = Some(g);
                }
                Err(e) => {
                    self.graph_error = Some(e);
                    self.issue_all()?;
                }
            }
        } else {
            self.issue_all()?;
        }
        self.stream
            .synchronize()
            .map_err(|e| d(e, "cuStreamSynchronize (a kernel failed)"))?;
        self.runs += 1;
        let host = self.pin_out.as_slice().map_err(|e| d(e, "pinned buffer"))?;
        Ok(self
            .outputs
            .iter()
            .zip(&self.out_slots)
            .map(|((_, _, ti), &(o, n))| HostTensor {
                dtype: ti.dtype,
                shape: ti.shape.clone(),
                data: host[o..o + n].to_vec(),
            })
            .collect())
    }

    fn capture(&self) -> Result<CudaGraph, String> {
        self.stream
            .begin_capture(drv::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| format!("cuStreamBeginCapture: {e}"))?;
        let issued = self.issue_all();
        let g = self
            .stream
            .end_capture(drv::CUgraphInstantiate_flags(0))
            .map_err(|e| format!("cuStreamEndCapture: {e}"))?;
        issued.map_err(|e| e.to_string())?;
        g.ok_or_else(|| "stream capture produced no graph".to_string())
    }
}

impl Issue for CudaExecutable {
    fn kernel(
        &self,
        func: &str,
        grid: [u32; 3],
        block: u32,
        args: &mut [u64],
    ) -> Result<(), String> {
        let f = self
            .functions
            .get(func)
            .ok_or_else(|| format!("kernel {func} was not compiled"))?;
        let mut params: Vec<*mut c_void> = args
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: every parameter of a generated kernel is one device
        // pointer (a u64), and `args` outlives the call (cuLaunchKernel
        // copies the parameter values before returning).
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (grid[0], grid[1], grid[2]),
                (block, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| format!("cuLaunchKernel: {e}"))
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), String> {
        // SAFETY: both are planned device ranges of `bytes` bytes.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| format!("cuMemcpyDtoDAsync: {e}"))
    }

    fn gemm(&self, g: &ops::Gemm, a: u64, b: u64, c: u64) -> Result<(), String> {
        let ty = match g.dtype {
            DType::F32 => blas::cudaDataType::CUDA_R_32F,
            DType::F16 => blas::cudaDataType::CUDA_R_16F,
            DType::BF16 => blas::cudaDataType::CUDA_R_16BF,
            d => return Err(format!("no cuBLAS GEMM for {}", d.name())),
        };
        let op = |t: bool| {
            if t {
                blas::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let i = |x: usize| -> Result<i32, String> {
            i32::try_from(x).map_err(|_| format!("GEMM size {x} exceeds cuBLAS's 32-bit sizes"))
        };
        let (alpha, beta) = (g.alpha, g.beta);
        // SAFETY: the addresses are planned tensors of the sizes the GEMM
        // reads and writes (checked by `ops::matmul`/`ops::gemm` against
        // the node's shapes); alpha/beta are host floats (pointer mode host)
        // matching the 32F compute type.
        unsafe {
            blas::cublasGemmStridedBatchedEx(
                *self.blas.handle(),
                op(g.trans_a),
                op(g.trans_b),
                i(g.m)?,
                i(g.n)?,
                i(g.k)?,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                ty,
                i(g.lda)?,
                g.stride_a as i64,
                b as *const c_void,
                ty,
                i(g.ldb)?,
                g.stride_b as i64,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                ty,
                i(g.ldc)?,
                g.stride_c as i64,
                i(g.batch)?,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| format!("cublasGemmStridedBatchedEx: {e:?}"))
    }
}

impl Drop for CudaExecutable {
    fn drop(&mut self) {
        // Nothing may still read or write the buffers being freed.
        let _ = self.stream.synchronize();
    }
}
