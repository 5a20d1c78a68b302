//! Helpers the runtime's integration tests share (each test file that
//! uses them says `mod common;`).
#![allow(dead_code)]

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_ir::{DType, Model};
use graphopt_plan::{plan_model, DimValues, PlanOptions};

/// `v` as the text format's list of floats.
pub fn list(v: &[f32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `v` as a float32 tensor of `shape`.
pub fn f32_tensor(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor {
        dtype: DType::F32,
        shape: shape.to_vec(),
        data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Outputs, planned arena bytes and in-place pairs of `m` run at
/// `threads` (input shapes from `inputs`; planned arena, poison on).
pub fn run(m: &Model, inputs: &[HostTensor], threads: usize) -> (Vec<HostTensor>, u64, usize) {
    let dims = DimValues {
        shapes: inputs
            .iter()
            .zip(m.graph.runtime_inputs())
            .map(|(t, v)| {
                let s = t.shape.iter().map(|&d| d as i64).collect();
                (m.graph.name(v).to_string(), s)
            })
            .collect(),
        ..DimValues::default()
    };
    let mp = plan_model(m, &dims, &PlanOptions::default()).expect("plans");
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).expect("binds");
    let opts = RunOptions {
        threads,
        poison: true,
    };
    let (out, _) = exe.run(inputs, &opts).expect("runs");
    (out, mp.plan.arena_bytes, mp.plan.aliases.len())
}
