//! `Session::run`: runs the model with graphopt's own runtime
//! (`graphopt-exec`) in one arena laid out by the memory planner, and
//! measures it: latency (best and median of N), weights, arena as planned
//! and as allocated, workspace, peak RSS. With `poison`, one more run
//! overwrites every region after its last reader and checks that the
//! outputs did not change: a plan that frees a tensor too early fails it.
//! A [`Runner`] keeps the plan and kernels made for each set of input
//! shapes, so repeated calls plan once per shape.
//!
//! If, Loop and Scan run as nested programs planned per shape in their own
//! arenas (`subgraph_arena_bytes`); values of data-dependent size are heap
//! allocations outside the arena (`dynamic_values`, `dynamic_bytes`).
//!
//! Palettized weights (a float32 codebook and uint8/uint4 indices decoded
//! by Cast + Gather, or Cast + GatherElements + Reshape per group; issue
//! 23) stay packed: on the CPU the [`Runner`] plans a copy of the model
//! lowered by [`graphopt_exec::lower::lower_coded`], whose MatMul, Gemm,
//! Conv and Gather readers decode tiles in their kernels, so the arena
//! holds neither the decoded weights nor their int32 indices
//! (`palettized_weights`, `palette_fused_nodes`, `palette_decoded_bytes`).
//! So do integer weights (`DequantizeLinear` of constant int8/uint8/int4/
//! uint4 weights, what `--quantize` writes): the readers decode tiles of
//! the weight as DequantizeLinear would, and the arena never holds it in
//! float32 (`quantized_weights`, `quantized_fused_nodes`,
//! `quantized_decoded_bytes`); where such a MatMul's activations are
//! quantized too (DynamicQuantizeLinear or QuantizeLinear, then
//! DequantizeLinear), it runs as an integer GEMM (`integer_matmuls`), and
//! so does such a Conv (`integer_convs`; with the QuantizeLinear of its
//! output, and a Relu or Clip between, as one QLinearConv, `qlinear_convs`).
//! float16/bfloat16 weights of MatMuls and Gemms are widened tile by tile
//! in their kernels, not whole (`half_fused_nodes`, `half_widened_bytes`).
//! `weights_bytes` is the resident weights: the initializers as stored
//! (packed indices and codebooks), read in place.
//!
//! `Device::Cuda` runs the same plan with graphopt-exec's CUDA backend
//! (one weights buffer and one arena + workspace buffer on the GPU; later
//! runs of `repeat` replay a CUDA graph). It is planned afresh on each
//! call, and refused in one line where no driver or GPU is found
//! ([`cuda_unavailable`]). Not yet run on a GPU: see the README. The CUDA
//! backend has no palette kernels: it plans the model as written.

use crate::error::{Error, Result};
use crate::inputs::Inputs;
use crate::session::Session;
use graphopt_exec::lower::{lowered_copy, CodedLowering};
use graphopt_exec::{CpuBackend, Executable, HostTensor};
use graphopt_ir::{DType, Model};
use graphopt_plan::{DimBinding, DimValues, Plan, PlanOptions};
use graphopt_tract::TractTensor;
use serde::Serialize;
use std::time::{Duration, Instant};
use tract_onnx::prelude::{DatumType, Tensor};

/// Where to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
}

impl Device {
    /// `cpu` or `cuda`.
    pub fn parse(s: &str) -> Result<Device> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(Error::new(format!(
                "device '{other}': expected cpu or cuda"
            ))),
        }
    }
}

/// Options of [`Session::run`].
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Inputs (default: seeded random). Their shapes bind the input dims.
    pub inputs: Inputs,
    /// `NAME=VALUE` bindings of symbolic dims.
    pub dims: Vec<(String, i64)>,
    pub device: Device,
    /// Timed runs (at least 1).
    pub repeat: usize,
    /// One more run with poison after each region's last reader; its
    /// outputs must equal the clean run's.
    pub poison: bool,
    /// Kernel threads (default: one per physical core; at most what the
    /// machine runs at once).
    pub threads: Option<usize>,
    /// Feed given inputs holding NaN or Inf as they are (models that test
    /// for them, the ONNX node tests). By default such data is refused,
    /// naming the array.
    pub allow_non_finite: bool,
    /// Honour the model's donation table (`graphopt grad` declares
    /// `<p>_new` over `<p>`): each such output is written over its input
    /// in the arena, so parameters and optimizer state are held once.
    /// Default true; false plans the outputs apart.
    pub donate: bool,
    /// Time every node (CPU): [`RunReport::profile`] says where the timed
    /// runs' time went, per op type and for the slowest nodes.
    pub profile: bool,
    /// Test hook: edits the plan before it runs, to plant a planner bug
    /// and show that the poison check fails. Not for production use.
    #[doc(hidden)]
    pub tamper: Option<fn(&mut Plan)>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            inputs: Inputs::default(),
            dims: Vec::new(),
            device: Device::Cpu,
            repeat: 1,
            poison: false,
            threads: None,
            allow_non_finite: false,
            donate: true,
            profile: false,
            tamper: None,
        }
    }
}

impl RunOptions {
    /// The planner's options for this run.
    fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            donate: self.donate,
            ..PlanOptions::default()
        }
    }
}

/// What the poison run found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoisonReport {
    /// Regions overwritten.
    pub regions: usize,
    /// Outputs whose bytes differ from the clean run (poison reached them).
    pub poisoned_outputs: Vec<String>,
    pub ok: bool,
}

/// What [`Session::run`] returns.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub device: Device,
    pub inputs: String,
    pub dims: Vec<DimBinding>,
    /// False when the plan came from a [`Runner`]'s cache.
    pub planned_now: bool,
    /// Output names, in graph order, and their values (of the last clean run).
    pub output_names: Vec<String>,
    #[serde(skip)]
    pub outputs: Vec<HostTensor>,
    /// The model's file, for messages.
    #[serde(skip)]
    pub model: String,
    pub repeat: usize,
    pub threads: usize,
    /// Per run: copying the inputs in, running every node and copying the
    /// outputs out.
    pub latency_best_ms: f64,
    pub latency_median_ms: f64,
    /// Resident weights: the initializers as the model stores them, read
    /// in place (a palettized weight counts its packed indices and its
    /// codebook, not the float32 weight they decode to).
    pub weights_bytes: u64,
    /// Weights copied because the file left them misaligned (else read in place).
    pub weights_copied_bytes: u64,
    pub arena_planned_bytes: u64,
    /// Inputs written over by their donated outputs (parameters and
    /// optimizer state of a training step): held once, inside the arena.
    pub donated_bytes: u64,
    pub arena_allocated_bytes: u64,
    pub workspace_bytes: u64,
    /// Peak bytes allocated outside the arena, in the last clean run, for
    /// values of data-dependent size (`dynamic_values`: Loop scan
    /// outputs, If outputs whose branches differ, what follows them).
    pub dynamic_bytes: u64,
    /// The values of data-dependent size the plan left outside the arena.
    pub dynamic_values: Vec<String>,
    /// Arenas and workspaces of the nested programs (If branches, Loop
    /// bodies, nodes run alone on dynamic values), one per input shapes
    /// seen, allocated beside the main arena.
    pub subgraph_arena_bytes: u64,
    /// Palettized weights whose every reader decodes tiles in its kernel
    /// (CPU only): neither their float32 values nor their int32 indices
    /// are in the arena.
    pub palettized_weights: usize,
    /// The fused nodes doing it (one per reader of those weights).
    pub palette_fused_nodes: usize,
    /// Bytes those weights would take decoded to float32 (not allocated).
    pub palette_decoded_bytes: u64,
    /// Integer weights (DequantizeLinear of constants) whose every reader
    /// decodes tiles in its kernel (CPU only): never whole in float32.
    pub quantized_weights: usize,
    /// The fused nodes doing it.
    pub quantized_fused_nodes: usize,
    /// Bytes those weights would take decoded to float32 (not allocated).
    pub quantized_decoded_bytes: u64,
    /// MatMuls (and Gemms with a bias row) of quantized activations and
    /// integer weights run as integer GEMMs (exact i32 sums, one scale; CPU
    /// only).
    pub integer_matmuls: usize,
    /// Convs of quantized activations and integer weights run on exact
    /// integer sums with a float32 output, and those run with the
    /// QuantizeLinear of their output as one QLinearConv (CPU only).
    pub integer_convs: usize,
    pub qlinear_convs: usize,
    /// DequantizeLinear/QuantizeLinear pairs around a Reshape, Transpose or
    /// other data-movement node, dropped: the move runs on 8-bit values.
    pub moved_pairs: usize,
    /// MatMuls and Gemms of float16/bfloat16 weights that widen them tile
    /// by tile (CPU only), and the float32 bytes those weights would take
    /// widened whole, which the plain nodes' workspace held.
    pub half_fused_nodes: usize,
    pub half_widened_bytes: u64,
    /// Chains of elementwise nodes (float32 results) run as one node each, one loop
    /// over tiles with no planned intermediates (CPU only), and the nodes
    /// they replaced.
    pub elementwise_chains: usize,
    pub elementwise_chain_nodes: usize,
    /// Convs run with the Add of a residual (image by image, the sum over
    /// the residual), whose whole output is never planned (CPU only).
    pub residual_convs: usize,
    /// Palettized or integer weights left to the plain decode nodes (the
    /// field keeps its first name), and
    /// why (a reader the kernels do not cover).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub palette_kept: Vec<(String, String)>,
    /// Relu/Clip nodes applied by the Conv that produces their input (CPU;
    /// their own steps skipped, the plan unchanged).
    pub fused_activations: usize,
    /// Peak resident set of this process (Linux `VmHWM`), if known.
    pub peak_rss_bytes: Option<u64>,
    pub poison: Option<PoisonReport>,
    /// Device figures of a `Device::Cuda` run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda: Option<CudaReport>,
    /// Where the time went, when [`RunOptions::profile`] asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
}

/// Where a run's time went: the mean over the timed runs of each node's
/// wall time, summed per op type ([`RunOptions::profile`]).
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// Per op type, slowest first.
    pub ops: Vec<OpTime>,
    /// Every node, slowest first (equal times in program order); the CLI's
    /// text prints the first [`Profile::NODES`], `--json` all of them.
    pub nodes: Vec<NodeTime>,
    /// Sum of all the nodes' times (ms); the rest of the latency is the
    /// runtime's own (copying inputs in and outputs out).
    pub nodes_ms: f64,
}

/// One op type's time in a [`Profile`].
#[derive(Clone, Debug, Serialize)]
pub struct OpTime {
    pub op: String,
    /// Nodes of this type.
    pub nodes: usize,
    pub ms: f64,
    /// Of [`Profile::nodes_ms`].
    pub share: f64,
}

/// One node's time in a [`Profile`].
#[derive(Clone, Debug, Serialize)]
pub struct NodeTime {
    pub node: String,
    pub op: String,
    pub ms: f64,
    /// Of [`Profile::nodes_ms`].
    pub share: f64,
}

impl Profile {
    /// Slowest nodes a text printout lists.
    pub const NODES: usize = 15;

    /// From the steps' `(op, node)` and their nanoseconds summed over
    /// `runs` runs.
    fn new(steps: &[(String, String)], nanos: &[u64], runs: usize) -> Profile {
        let ms = |ns: u64| ns as f64 / 1e6 / runs.max(1) as f64;
        let total: u64 = nanos.iter().sum();
        let share = |ns: u64| {
            if total == 0 {
                0.0
            } else {
                ns as f64 / total as f64
            }
        };
        let mut by_op: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
        for ((op, _), &ns) in steps.iter().zip(nanos) {
            // Each fused chain has an op of its own (`ElementwiseChain.<k>`):
            // one row for them all (the node rows keep their own).
            let op = if graphopt_plan::chain_op(op) {
                graphopt_plan::CHAIN_OP
            } else {
                op.as_str()
            };
            let e = by_op.entry(op).or_default();
            e.0 += 1;
            e.1 += ns;
        }
        let mut ops: Vec<OpTime> = by_op
            .into_iter()
            .map(|(op, (n, ns))| OpTime {
                op: op.to_string(),
                nodes: n,
                ms: ms(ns),
                share: share(ns),
            })
            .collect();
        // Stable: equal times keep the op types' alphabetical order.
        ops.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        let mut order: Vec<usize> = (0..steps.len().min(nanos.len())).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(nanos[i]));
        let nodes = order
            .into_iter()
            .map(|i| NodeTime {
                node: steps[i].1.clone(),
                op: steps[i].0.clone(),
                ms: ms(nanos[i]),
                share: share(nanos[i]),
            })
            .collect();
        Profile {
            ops,
            nodes,
            nodes_ms: ms(total),
        }
    }
}

impl RunReport {
    /// The run's verdict: an [`crate::ErrorKind::Verify`] error when the
    /// poison run changed an output (the plan freed or overlapped a tensor
    /// still read). Front ends print the report first, then fail with it.
    pub fn outcome(&self) -> Result<()> {
        match &self.poison {
            Some(p) if !p.ok => Err(Error::verify(format!(
                "poison reached output(s) {}: the plan frees or overlaps a tensor that is still read",
                p.poisoned_outputs.join(", ")
            ))
            .within(&self.model)),
            _ => Ok(()),
        }
    }

    /// The outputs by name, in graph order.
    pub fn named_outputs(&self) -> impl Iterator<Item = (&str, &HostTensor)> {
        self.output_names
            .iter()
            .map(String::as_str)
            .zip(&self.outputs)
    }
}

/// What a CUDA run adds to [`RunReport`]: graphopt's whole device
/// footprint is `weights + arena + workspace`, allocated once, and
/// `measured_bytes` is what `cuMemGetInfo` saw those allocations take.
#[derive(Clone, Debug, Serialize)]
pub struct CudaReport {
    pub gpu: String,
    /// Weights plus Shape/Constant bytes, each 256-aligned.
    pub weights_device_bytes: u64,
    pub arena_device_bytes: u64,
    /// In-place staging, kernel scratch and cuBLAS's workspace.
    pub workspace_device_bytes: u64,
    /// `weights + arena + workspace`.
    pub expected_device_bytes: u64,
    /// Free device memory before the two allocations minus after.
    pub measured_device_bytes: u64,
    /// True when the runs after the first replayed a CUDA graph.
    pub graph_replay: bool,
    /// Why graph capture failed, if it did (runs were then op by op).
    pub graph_error: Option<String>,
    pub launches_per_run: usize,
    pub compiled_kernels: usize,
    /// Binding, NVRTC compile, allocation and weight upload.
    pub setup_ms: f64,
}

/// Why `Device::Cuda` cannot run on this machine (no driver, no GPU, no
/// NVRTC/cuBLAS library, or a build without the `cuda` feature), or
/// `None` when it can.
pub fn cuda_unavailable() -> Option<String> {
    graphopt_exec::cuda::unavailable()
}

fn datum(d: DType) -> Option<DatumType> {
    Some(match d {
        DType::F32 => DatumType::F32,
        DType::F64 => DatumType::F64,
        DType::F16 => DatumType::F16,
        DType::I64 => DatumType::I64,
        DType::I32 => DatumType::I32,
        DType::I16 => DatumType::I16,
        DType::I8 => DatumType::I8,
        DType::U8 => DatumType::U8,
        DType::U16 => DatumType::U16,
        DType::U32 => DatumType::U32,
        DType::U64 => DatumType::U64,
        DType::Bool => DatumType::Bool,
        _ => return None,
    })
}

fn dtype(d: DatumType) -> Option<DType> {
    DType::all().find(|&x| datum(x) == Some(d))
}

/// A tract tensor as the runtime's host tensor.
pub fn to_host(t: &TractTensor) -> Result<HostTensor> {
    let d = dtype(t.datum_type())
        .ok_or_else(|| Error::new(format!("input type {:?} is not supported", t.datum_type())))?;
    Ok(HostTensor {
        dtype: d,
        shape: t.shape().to_vec(),
        data: t.as_bytes().to_vec(),
    })
}

/// A host tensor as a tract tensor.
pub fn to_tract(t: &HostTensor) -> Result<TractTensor> {
    let dt = datum(t.dtype)
        .ok_or_else(|| Error::new(format!("output type {} is not supported", t.dtype.name())))?;
    let mut out = Tensor::zero_dt(dt, &t.shape).map_err(|e| Error::new(e.to_string()))?;
    out.as_bytes_mut().copy_from_slice(&t.data);
    Ok(out)
}

/// The CPU runtime's options for `threads` threads (default: the
/// runtime's default count), without poisoning.
pub(crate) fn cpu_run_options(threads: Option<usize>) -> graphopt_exec::RunOptions {
    graphopt_exec::RunOptions {
        threads: threads.unwrap_or_else(graphopt_exec::cpu::par::default_threads),
        poison: false,
    }
}

/// Peak resident set size of this process (Linux), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Session {
    /// Runs the model in graphopt's runtime on `opts.device` (a fresh
    /// [`Runner`]: plans once for these inputs).
    pub fn run(&self, opts: &RunOptions) -> Result<RunReport> {
        self.runner().run(opts)
    }

    /// A runner that caches a plan and its kernels per input shapes.
    pub fn runner(&self) -> Runner<'_> {
        Runner {
            session: self,
            lowered: None,
            cache: Vec::new(),
        }
    }
}

/// The dims and input shapes a plan was made for.
type PlanKey = (Vec<(String, i64)>, Vec<(String, Vec<i64>)>, bool);

/// Runs one session's model again and again: symbolic dims are bound from
/// each call's inputs, and the plan and kernels made for those shapes are
/// cached, so a later call with the same shapes plans nothing.
pub struct Runner<'s> {
    session: &'s Session,
    /// The model lowered for the CPU backend (palettized and integer
    /// weights decoded in their readers' kernels, integer GEMMs), made on
    /// the first CPU run.
    lowered: Option<(Model, CodedLowering)>,
    cache: Vec<(PlanKey, Executable, Vec<DimBinding>)>,
}

impl Runner<'_> {
    /// Plans made so far (one per distinct set of input shapes and dims).
    pub fn cached_plans(&self) -> usize {
        self.cache.len()
    }

    /// Runs the model; see [`RunOptions`].
    pub fn run(&mut self, opts: &RunOptions) -> Result<RunReport> {
        let session = self.session;
        opts.validate().map_err(|e| session.err(e))?;
        if opts.device == Device::Cuda {
            if opts.poison {
                return Err(session.err(Error::unsupported(
                    "--poison runs on the CPU backend only (not yet with --device cuda)",
                )));
            }
            if let Some(why) = cuda_unavailable() {
                return Err(session.err(Error::unsupported(format!("--device cuda: {why}"))));
            }
        }
        let inputs = match &opts.inputs {
            Inputs::Random {
                seed, default_dim, ..
            } => Inputs::Random {
                seed: *seed,
                dims: opts.dims.clone(),
                default_dim: *default_dim,
            },
            other => other.clone(),
        };
        let (host, label) = inputs
            .host_with(&session.model, !opts.allow_non_finite)
            .map_err(|e| session.err(e))?;
        let g = &session.model.graph;
        let names: Vec<String> = g
            .inputs
            .iter()
            .filter(|&&v| g.initializer(v).is_none())
            .map(|&v| g.name(v).to_string())
            .collect();
        let dims = DimValues {
            bound: opts.dims.clone(),
            shapes: names
                .iter()
                .zip(&host)
                .map(|(n, t)| (n.clone(), t.shape.iter().map(|&d| d as i64).collect()))
                .collect(),
            default: None,
        };
        if opts.device == Device::Cuda {
            return run_cuda(session, opts, &host, label, &dims);
        }
        let key: PlanKey = (dims.bound.clone(), dims.shapes.clone(), opts.donate);
        let hit = match opts.tamper {
            // A tampered plan is never cached (nor taken from the cache).
            Some(_) => None,
            None => self.cache.iter().position(|c| c.0 == key),
        };
        let planned_now = hit.is_none();
        let (model, lowering) = self
            .lowered
            .get_or_insert_with(|| lowered_copy(&session.model));
        let lowering = lowering.clone();
        let mut fresh: Option<(Executable, Vec<DimBinding>)> = None;
        let slot = match hit {
            Some(i) => i,
            None => {
                let mut mp = graphopt_plan::plan_model(model, &dims, &opts.plan_options())
                    .map_err(|e| session.err(e))?;
                if let Some(f) = opts.tamper {
                    f(&mut mp.plan);
                }
                let exe = Executable::new(&mp.model, &mp.plan, &CpuBackend)
                    .map_err(|e| session.err(Error::runtime(e.to_string())))?;
                if opts.tamper.is_some() {
                    fresh = Some((exe, mp.dims));
                    usize::MAX
                } else {
                    self.cache.push((key, exe, mp.dims));
                    self.cache.len() - 1
                }
            }
        };
        let (exe, bound_dims) = match &mut fresh {
            Some((e, d)) => (e, d.clone()),
            None => {
                let c = &mut self.cache[slot];
                (&mut c.1, c.2.clone())
            }
        };
        let ropts = cpu_run_options(opts.threads);
        let threads = ropts.threads;
        let mut times: Vec<Duration> = Vec::new();
        let mut dynamic_bytes = 0;
        let mut step_nanos: Vec<u64> = Vec::new();
        exe.set_profile(opts.profile);
        // Each run's outputs are copied out of the arena as its pages are
        // handed back (`take_outputs`), and the run before's are dropped
        // first: the process never holds an output twice. The copy is
        // timed, as onnxruntime's fresh output arrays are.
        let given: Vec<&HostTensor> = host.iter().collect();
        let mut outputs = Vec::new();
        for _ in 0..opts.repeat {
            drop(std::mem::take(&mut outputs));
            let t0 = Instant::now();
            let st = exe
                .run_in_place(&given, &ropts)
                .map_err(|e| session.err(Error::runtime(e.to_string())))?;
            outputs = exe
                .take_outputs()
                .map_err(|e| session.err(Error::runtime(e.to_string())))?;
            times.push(t0.elapsed());
            dynamic_bytes = st.dynamic_peak_bytes;
            step_nanos.resize(st.step_nanos.len(), 0);
            for (sum, ns) in step_nanos.iter_mut().zip(&st.step_nanos) {
                *sum += ns;
            }
        }
        let profile = opts
            .profile
            .then(|| Profile::new(&exe.step_ops(), &step_nanos, times.len()));
        exe.set_profile(false);
        let output_names = exe.output_names();
        let poison = if opts.poison {
            let (o, stats) = exe
                .run(
                    &host,
                    &graphopt_exec::RunOptions {
                        threads,
                        poison: true,
                    },
                )
                .map_err(|e| session.err(Error::runtime(e.to_string())))?;
            let poisoned_outputs: Vec<String> = output_names
                .iter()
                .zip(o.iter().zip(&outputs))
                .filter(|(_, (a, b))| a.data != b.data)
                .map(|(n, _)| n.clone())
                .collect();
            Some(PoisonReport {
                regions: stats.poisoned_regions,
                ok: poisoned_outputs.is_empty(),
                poisoned_outputs,
            })
        } else {
            None
        };
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Ok(RunReport {
            device: opts.device,
            inputs: label,
            dims: bound_dims,
            planned_now,
            output_names,
            outputs,
            model: session.label(),
            repeat: times.len(),
            threads,
            latency_best_ms: ms(times[0]),
            latency_median_ms: ms(times[times.len() / 2]),
            weights_bytes: exe.weights_bytes(),
            weights_copied_bytes: exe.weights_copied_bytes(),
            arena_planned_bytes: exe.arena_planned_bytes(),
            donated_bytes: exe.donated_bytes(),
            arena_allocated_bytes: exe.arena_allocated_bytes(),
            workspace_bytes: exe.workspace_bytes(),
            dynamic_bytes,
            dynamic_values: exe.dynamic_values().to_vec(),
            subgraph_arena_bytes: exe.subgraph_arena_bytes(),
            palettized_weights: lowering.weights,
            palette_fused_nodes: lowering.fused,
            palette_decoded_bytes: lowering.decoded_bytes,
            quantized_weights: lowering.integer_weights,
            quantized_fused_nodes: lowering.integer_fused,
            quantized_decoded_bytes: lowering.integer_decoded_bytes,
            integer_matmuls: lowering.integer_matmuls,
            integer_convs: lowering.integer_convs,
            qlinear_convs: lowering.qlinear_convs,
            moved_pairs: lowering.moved_pairs,
            half_fused_nodes: lowering.half_fused,
            half_widened_bytes: lowering.half_widened_bytes,
            elementwise_chains: lowering.chains,
            elementwise_chain_nodes: lowering.chain_nodes,
            residual_convs: lowering.residual_convs,
            palette_kept: lowering.kept,
            fused_activations: exe.fused_activations(),
            peak_rss_bytes: peak_rss_bytes(),
            poison,
            cuda: None,
            profile,
        })
    }
}

/// [`Runner::run`] on the CUDA backend: plan, bind and compile, run
/// `repeat` times (graph replay after the first), report. The model as
/// written: `lower_coded` is for the CPU backend's kernels only.
fn run_cuda(
    session: &Session,
    opts: &RunOptions,
    host: &[HostTensor],
    label: String,
    dims: &DimValues,
) -> Result<RunReport> {
    let t0 = Instant::now();
    let mut mp = graphopt_plan::plan_model(&session.model, dims, &opts.plan_options())
        .map_err(|e| session.err(e))?;
    if let Some(f) = opts.tamper {
        f(&mut mp.plan);
    }
    let mut exe = graphopt_exec::cuda::CudaExecutable::new(&mp.model, &mp.plan)
        .map_err(|e| session.err(Error::runtime(e.to_string())))?;
    let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
    let repeat = opts.repeat;
    let run = |exe: &mut graphopt_exec::cuda::CudaExecutable| {
        exe.run(host, repeat > 1)
            .map_err(|e| session.err(Error::runtime(e.to_string())))
    };
    let mut outputs = Vec::new();
    if repeat > 1 {
        // Untimed: the first run op by op, the second captures the CUDA
        // graph that the timed runs replay.
        run(&mut exe)?;
        run(&mut exe)?;
    }
    let mut times: Vec<Duration> = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        outputs = run(&mut exe)?;
        times.push(t.elapsed());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mem = exe.memory();
    let (graph_replay, graph_error) = exe.graph_state();
    let cuda = CudaReport {
        gpu: exe.device_name(),
        weights_device_bytes: mem.weights_bytes,
        arena_device_bytes: mem.arena_bytes,
        workspace_device_bytes: mem.workspace_bytes,
        expected_device_bytes: mem.weights_bytes + mem.arena_bytes + mem.workspace_bytes,
        measured_device_bytes: mem.measured_bytes,
        graph_replay,
        graph_error: graph_error.map(str::to_string),
        launches_per_run: exe.launches(),
        compiled_kernels: exe.compiled_kernels(),
        setup_ms,
    };
    Ok(RunReport {
        device: Device::Cuda,
        inputs: label,
        dims: mp.dims.clone(),
        planned_now: true,
        output_names: exe.output_names(),
        outputs,
        model: session.label(),
        repeat: times.len(),
        threads: 1,
        latency_best_ms: ms(times[0]),
        latency_median_ms: ms(times[times.len() / 2]),
        weights_bytes: exe.weights_bytes(),
        weights_copied_bytes: 0,
        arena_planned_bytes: mp.plan.arena_bytes,
        donated_bytes: mp.plan.donated_bytes,
        arena_allocated_bytes: mem.arena_bytes,
        workspace_bytes: mem.workspace_bytes,
        dynamic_bytes: 0,
        dynamic_values: Vec::new(),
        subgraph_arena_bytes: 0,
        palettized_weights: 0,
        palette_fused_nodes: 0,
        palette_decoded_bytes: 0,
        quantized_weights: 0,
        quantized_fused_nodes: 0,
        quantized_decoded_bytes: 0,
        integer_matmuls: 0,
        integer_convs: 0,
        qlinear_convs: 0,
        moved_pairs: 0,
        half_fused_nodes: 0,
        half_widened_bytes: 0,
        elementwise_chains: 0,
        elementwise_chain_nodes: 0,
        residual_convs: 0,
        palette_kept: Vec::new(),
        fused_activations: 0,
        peak_rss_bytes: peak_rss_bytes(),
        poison: None,
        cuda: Some(cuda),
        profile: None,
    })
}

#[cfg(test)]
mod tests {
    use super::Profile;

    /// The fused chains' ops (one per chain) share one row of the per-op
    /// table; their nodes keep their own names.
    #[test]
    fn chains_share_one_profile_row() {
        let steps: Vec<(String, String)> = [
            ("ElementwiseChain.0", "a"),
            ("Conv", "b"),
            ("ElementwiseChain.12", "c"),
        ]
        .iter()
        .map(|(o, n)| (o.to_string(), n.to_string()))
        .collect();
        let p = Profile::new(&steps, &[2_000_000, 5_000_000, 1_000_000], 1);
        let ops: Vec<(&str, usize)> = p.ops.iter().map(|o| (o.op.as_str(), o.nodes)).collect();
        assert_eq!(ops, [("Conv", 1), ("ElementwiseChain", 2)]);
        assert_eq!(p.nodes[2].op, "ElementwiseChain.12");
    }
}
