//! `Session::run` on a palettized model (issue 23): a small language-model
//! stem whose embedding (uint4, one codebook) and two projections (uint8
//! and uint4, one codebook per group of rows) are stored as codebooks and
//! indices, decoded in standard ONNX. The run must
//! - give the outputs of the same model with the decoded weights stored as
//!   float initializers, bitwise;
//! - report the resident weights as the initializers as stored (packed
//!   indices + codebooks), not the decoded bytes;
//! - fuse every reader (no decoded weight, no int32 indices in the arena);
//! - on `--device cuda`, refuse in one line without a GPU (the lowering is
//!   for the CPU backend; CUDA plans the model as written).

use graphopt::HostTensor;
use graphopt::{Device, Inputs, RunOptions, Session};
use graphopt_plan::{plan_model, DimValues, PlanOptions};

use graphopt_testutil::uniform as data;

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One palettized weight: its initializers and decode nodes (palettized
/// form) or its decoded float initializer (reference form).
struct Weight {
    palettized_inits: String,
    decode: String,
    decoded_init: String,
    decoded_bytes: u64,
}

fn weight(name: &str, shape: &[usize], group: Option<usize>, bits: u32, seed: u64) -> Weight {
    let numel: usize = shape.iter().product();
    let k = if bits == 4 { 16 } else { 200 };
    let idx: Vec<usize> = data(numel, seed)
        .iter()
        .map(|&v| (((v + 1.0) * 0.5 * k as f32) as usize).min(k - 1))
        .collect();
    let ng = group.map_or(1, |g| shape[0] / g);
    let per = numel / ng;
    let cb = data(ng * k, seed + 1);
    let decoded: Vec<f32> = (0..numel).map(|f| cb[(f / per) * k + idx[f]]).collect();
    let it = if bits == 4 { "uint4" } else { "uint8" };
    let s = list(shape);
    let (palettized_inits, decode) = match group {
        None => (
            format!(
                "{it}[{s}] {name}_palette_indices = {{{}}}, float[{k}] {name}_palette_codebook = {{{}}}",
                list(&idx),
                list(&cb)
            ),
            format!(
                "{name}_palette_indices_i32 = Cast <to: int = 6> ({name}_palette_indices)\n\
                 {name} = Gather <axis: int = 0> ({name}_palette_codebook, {name}_palette_indices_i32)"
            ),
        ),
        Some(_) => (
            format!(
                "{it}[{ng},{per}] {name}_palette_indices = {{{}}}, float[{ng},{k}] {name}_palette_codebook = {{{}}}, int64[{}] {name}_palette_shape = {{{s}}}",
                list(&idx),
                list(&cb),
                shape.len()
            ),
            format!(
                "{name}_palette_indices_i32 = Cast <to: int = 6> ({name}_palette_indices)\n\
                 {name}_palette_flat = GatherElements <axis: int = 1> ({name}_palette_codebook, {name}_palette_indices_i32)\n\
                 {name} = Reshape ({name}_palette_flat, {name}_palette_shape)"
            ),
        ),
    };
    Weight {
        palettized_inits,
        decode,
        decoded_init: format!("float[{s}] {name} = {{{}}}", list(&decoded)),
        decoded_bytes: numel as u64 * 4,
    }
}

/// The palettized model, its reference, the decoded weights' bytes.
fn stem() -> (Session, Session, u64) {
    let ws = [
        weight("E", &[1000, 64], None, 4, 1),
        weight("W1", &[64, 256], Some(16), 8, 2),
        weight("W2", &[256, 64], Some(16), 4, 3),
    ];
    let header = r#"<ir_version: 10, opset_import: ["" : 21]>
g (int64[2,8] ids) => (float[2,8,64] y)"#;
    let body = "h = Gather (E, ids)\nu = MatMul (h, W1)\nr = Relu (u)\ny = MatMul (r, W2)";
    let join = |f: &dyn Fn(&Weight) -> &str| ws.iter().map(f).collect::<Vec<_>>().join(", ");
    let palettized = format!(
        "{header}\n<{}>\n{{\n{}\n{body}\n}}",
        join(&|w| &w.palettized_inits),
        ws.iter()
            .map(|w| w.decode.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let reference = format!("{header}\n<{}>\n{{\n{body}\n}}", join(&|w| &w.decoded_init));
    let session = |t: &str| Session::from_model(graphopt::text::parse_model(t).expect("parses"));
    (
        session(&palettized),
        session(&reference),
        ws.iter().map(|w| w.decoded_bytes).sum(),
    )
}

fn ids() -> Inputs {
    let ids: Vec<i64> = (0..16).map(|i| (i * 397 + 11) % 1000).collect();
    Inputs::Tensors(vec![HostTensor::from_i64(&[2, 8], &ids)])
}

#[test]
fn a_palettized_model_runs_with_packed_weights_resident_and_no_decoded_copy() {
    let (pal, reference, decoded) = stem();
    let opts = RunOptions {
        inputs: ids(),
        poison: true,
        threads: Some(
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(2),
        ),
        ..RunOptions::default()
    };
    let want = reference.run(&opts).unwrap();
    let r = pal.run(&opts).unwrap();
    r.outcome().unwrap();
    assert_eq!(r.outputs[0].shape, want.outputs[0].shape);
    assert!(r.outputs[0].data == want.outputs[0].data, "outputs differ");

    // Resident weights: the stored initializers (packed indices,
    // codebooks, shapes), not the decoded float32 weights.
    let init_bytes = pal.model().graph.initializer_bytes_deep();
    eprintln!(
        "weights {} B resident, initializers {init_bytes} B, decoded {decoded} B; arena {} B",
        r.weights_bytes, r.arena_planned_bytes
    );
    assert!(
        r.weights_bytes * 10 <= init_bytes * 11,
        "weights {} B for {init_bytes} B of initializers",
        r.weights_bytes
    );

    // Every reader fused: the arena is that of the plain float model,
    // smaller than the palettized model planned as written by at least
    // the decoded weights.
    assert_eq!(
        (
            r.palettized_weights,
            r.palette_fused_nodes,
            r.palette_decoded_bytes
        ),
        (3, 3, decoded)
    );
    assert!(r.palette_kept.is_empty(), "{:?}", r.palette_kept);
    let dims = DimValues {
        shapes: vec![("ids".into(), vec![2, 8])],
        ..DimValues::default()
    };
    let unfused = plan_model(pal.model(), &dims, &PlanOptions::default()).unwrap();
    eprintln!(
        "arena {} B fused, {} B as written, {} B with float weights",
        r.arena_planned_bytes, unfused.plan.arena_bytes, want.arena_planned_bytes
    );
    assert!(r.arena_planned_bytes + decoded <= unfused.plan.arena_bytes);
    assert!(r.arena_planned_bytes <= want.arena_planned_bytes);
}

#[test]
fn cuda_runs_the_model_as_written_or_refuses_in_one_line() {
    let (pal, _, _) = stem();
    let opts = RunOptions {
        inputs: ids(),
        device: Device::Cuda,
        ..RunOptions::default()
    };
    match graphopt::cuda_unavailable() {
        Some(_) => {
            let e = pal.run(&opts).expect_err("no GPU: refused");
            let msg = e.to_string();
            assert!(msg.contains("--device cuda"), "{msg}");
            assert_eq!(msg.lines().count(), 1, "{msg}");
        }
        // With a GPU: the plain chains, never lowered, whose uint4
        // indices no CUDA kernel reads: refused by op in one line.
        None => {
            let e = pal.run(&opts).expect_err("uint4 indices on CUDA: refused");
            assert!(e.to_string().contains("no cuda kernel"), "{e}");
        }
    }
}
