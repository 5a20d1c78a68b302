//! Stand-ins for the runtime when graphopt-exec is built without the
//! `cuda` feature: the same names, and [`CudaExecutable::new`] refuses in
//! one line, so callers need no `cfg` of their own.

use crate::backend::TensorInfo;
use crate::executor::ExecError;
use crate::tensor::HostTensor;
use graphopt_ir::Model;
use graphopt_plan::Plan;

/// Why the CUDA backend cannot run here.
pub fn unavailable() -> Option<String> {
    Some("this graphopt was built without the `cuda` feature of graphopt-exec".into())
}

/// Device memory figures (see the `cuda` build).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    pub weights_bytes: u64,
    pub arena_bytes: u64,
    pub workspace_bytes: u64,
    pub measured_bytes: u64,
}

/// Never constructed in this build.
pub enum CudaExecutable {}

impl CudaExecutable {
    pub fn new(_model: &Model, _plan: &Plan) -> Result<CudaExecutable, ExecError> {
        Err(ExecError::Unsupported(unavailable().unwrap_or_default()))
    }
    pub fn memory(&self) -> DeviceMemory {
        match *self {}
    }
    pub fn weights_bytes(&self) -> u64 {
        match *self {}
    }
    pub fn launches(&self) -> usize {
        match *self {}
    }
    pub fn compiled_kernels(&self) -> usize {
        match *self {}
    }
    pub fn module_source_bytes(&self) -> usize {
        match *self {}
    }
    pub fn graph_state(&self) -> (bool, Option<&str>) {
        match *self {}
    }
    pub fn device_name(&self) -> String {
        match *self {}
    }
    pub fn output_names(&self) -> Vec<String> {
        match *self {}
    }
    pub fn input_infos(&self) -> Vec<(String, TensorInfo)> {
        match *self {}
    }
    pub fn run(
        &mut self,
        _inputs: &[HostTensor],
        _graph: bool,
    ) -> Result<Vec<HostTensor>, ExecError> {
        match *self {}
    }
}
