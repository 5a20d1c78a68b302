//! Runs a planned model (issue 13): every activation lives in ONE arena at
//! the offset the memory planner gave it, so a run both computes outputs
//! and proves the plan right (a wrong lifetime or alias changes outputs,
//! and [`RunOptions::poison`] makes that loud).
//!
//! - [`Executable::new`] takes a model with inferred shapes and its
//!   [`graphopt_plan::Plan`], asks a [`Backend`] for a kernel per node and
//!   refuses, before anything runs, an op without one;
//! - [`Executable::run`] copies the inputs into the arena, runs the nodes in
//!   the plan's schedule and copies the outputs out;
//! - weights (initializers) are read in place from the model's
//!   [`bytes::Bytes`] (no copy unless misaligned; the copy is reported);
//! - kernel scratch (im2col, in-place staging) is one workspace sized to the
//!   largest need, reported apart from the arena.
//!
//! - If, Loop and Scan (axis 0) run as nested programs (`control`): each branch or body
//!   is planned by graphopt-plan at the shapes seen at run time and bound
//!   to a nested [`Executable`] with its own arena, cached per shapes
//!   ([`Executable::subgraph_arena_bytes`]);
//! - values of data-dependent size (`Plan::dynamic_values`: Loop scan
//!   outputs, If outputs whose branches differ, what follows them) are
//!   heap allocations outside the arena, freed after their last reader
//!   ([`RunStats::dynamic_peak_bytes`]); nodes touching them run alone as
//!   one-node nested programs; ops whose output size depends on the
//!   values (NonZero, Compress, Unique, NonMaxSuppression) are computed on
//!   the host ([`cpu::data_sized`]).
//!
//! Not yet: Scan along other axes; subgraphs and dynamic values on the
//! CUDA backend. The CUDA backend ([`cuda`],
//! feature `cuda`, on by default) is compiled and CPU-tested but has not
//! run on a GPU yet.
//! fp16/bf16 nodes run the fp32 kernels on widened copies
//! ([`cpu::lowp`]).
//!
//! Coded weights (a palette: codebook + uint8/uint4 indices, issue 23; or
//! an integer weight: DequantizeLinear of constant int8/uint8/int4/uint4,
//! as `--quantize` writes): run as written, the decode chain materializes
//! the weight in the arena in float32; [`lower::lower_coded`], applied to a
//! copy of the model before it is planned for the CPU backend, fuses each
//! reader (MatMul, Gemm, Conv, Gather) into a node that decodes tiles in
//! its kernel ([`cpu::coded`]).

mod activation;
pub mod backend;
pub mod collective;
mod control;
pub mod cpu;
pub mod cuda;
mod executor;
pub mod fuse_chains;
pub mod fuse_residual;
pub mod lower;
pub mod tensor;
mod values;

pub use backend::{Activation, Backend, Data, In, Kernel, KernelIo, NodeCtx, Out, TensorInfo};
pub use cpu::CpuBackend;
pub use executor::{ExecError, Executable, ReadOutput, RunOptions, RunStats, StepObserver};
pub use tensor::HostTensor;
