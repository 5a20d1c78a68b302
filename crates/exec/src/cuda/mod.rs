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

#[cfg(feature = "cuda")]
pub use runtime::{plan_kernels, unavailable, CudaBackend, CudaExecutable, DeviceMemory};
#[cfg(not(feature = "cuda"))]
pub use stub::{unavailable, CudaExecutable, DeviceMemory};
