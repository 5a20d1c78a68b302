//! Numerical checks of every pass against the unoptimized model, on the
//! real models in `testdata/models/`, with tract as the reference executor.
//!
//! Cases: every model, and every model whose default-domain opset is below
//! 20 once more after `upgrade_opset` to 20 (`NAME@20`): the upgraded
//! TorchScript exports are where `fuse_layer_norm` (opset >= 17) and
//! `fuse_gelu` (>= 20) find their patterns. The upgrade itself is held to
//! its own `exact()` against the original.
//!
//! For each case: run each registered pass alone (except the opt-in ones),
//! and the default pipeline to a fixed point, then compare outputs on
//! seeded inputs, EACH OUTPUT SEPARATELY (a small wrong output must not
//! hide behind a large right one):
//! - passes that declare `exact()` must give the same bits (so `-0` vs
//!   `+0` is a difference; any NaN equals any NaN, as NaN payloads are not
//!   portable across executors), and the same dtypes and shapes;
//! - the others must stay within relative L2 `REL_L2` per float output and
//!   give identical non-float outputs.
//!
//! Every non-exact pass must fire (report a change) on at least one case,
//! both alone and inside the default pipeline, so that none of the bounds
//! above holds vacuously; the exceptions are listed in [`NOT_FIRING`] with
//! the reason.
//!
//! A model that cannot run is a failure unless it is in [`SKIPPED`] with
//! the reason; a model in [`SKIPPED`] that runs is a failure too (the list
//! is stale).

use graphopt_ir::Model;
use graphopt_passes::manager::{run_pipeline, ManagerOptions, PassRun};
use graphopt_passes::upgrade_opset::UpgradeOpset;
use graphopt_passes::Pass;
use graphopt_tract::compare::{compare_outputs, Tolerance};
use graphopt_tract::TractTensor;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Passes that need options or change the model's contract; their own
/// tests check them numerically (`upgrade_opset` is checked here as the
/// step that makes the `@20` cases).
/// `dequantize_constants` only changes quantized models, which tract cannot
/// run before it: `dequantize_constants_ort.rs` checks it in onnxruntime.
/// `compress` moves outputs by design (and writes uint4, which tract cannot
/// load): `tests-py/compress_models.py` bounds it in onnxruntime and in
/// graphopt's runtime.
/// `prune` removes channels by design: `prune_models.rs` checks that a
/// pruned model equals its masked original, `tests-py/prune_models.py`
/// bounds it in onnxruntime.
const OPT_IN: &[&str] = &[
    "compress",
    "dequantize_constants",
    "lower_precision",
    "prune",
    "quantize",
    "upgrade_opset",
];

/// Relative L2 bound per float output for passes that are not `exact()`.
const REL_L2: f64 = 1e-5;

/// Cases that tract cannot run, each with the reason. Matched against the
/// case label (`file.onnx` or `file.onnx@20`).
/// A skipped model's `@20` case is not tried either.
const SKIPPED: &[(&str, &str)] = &[
    (
        "custom_domain.helper17.onnx",
        "com.example.FancyOp has no kernel anywhere (tract: \"Op says 1, node says 2\"); \
         onnxruntime cannot run it either, it is a round-trip-only model",
    ),
    (
        "if_loop.helper13.onnx",
        "tract rejects its two-output Loop (\"Wrong number of outputs. Op says 1, node \
         says 2\"); onnxruntime runs it in tests-py",
    ),
    (
        "mlp_fp16.dynamo18.onnx",
        "tract fails to type the fp16 model (\"Output mismatch after rewiring expansion \
         ... expected F16 got F32\"); onnxruntime runs it in tests-py",
    ),
    (
        "mlp_fp16.ts14.onnx",
        "tract fails to type the fp16 model (\"Output mismatch after rewiring expansion \
         ... expected F16 got F32\"); onnxruntime runs it in tests-py",
    ),
    (
        "scripted_cf.ts14.onnx",
        "tract cannot type the If/Loop of TorchScript control flow (\"Operator can not \
         be made a TypedOp\"); onnxruntime runs it in tests-py",
    ),
    (
        "scripted_cf.ts9.onnx",
        "tract cannot type the If/Loop of TorchScript control flow (\"Operator can not \
         be made a TypedOp\"); onnxruntime runs it in tests-py",
    ),
];

/// Non-exact passes that fire on no committed model, alone (`"alone"`) or
/// inside the default pipeline (`"default"`), with the reason. Every other
/// non-exact pass must fire on at least one case in both settings, and a
/// listed one that fires is a failure (the entry is stale): so adding a
/// model that exercises one of these, or a fix, shows up here.
const NOT_FIRING: &[(&str, &str, &str)] = &[
    (
        "fuse_matmul_add",
        "alone",
        "no MatMul+Add in the committed models meets Gemm's rules (the transformers' \
         MatMuls are 3-D; their 2-D Linear layers are exported as Gemm already)",
    ),
    ("fuse_matmul_add", "default", "as alone"),
    (
        "fuse_gemm_update",
        "alone",
        "fires on training steps (`W - lr·dW` with dW a Gemm), which no committed \
         inference model holds; checked numerically on gpt2_tiny's SGD step in \
         crates/graphopt/tests/grad_optim.rs",
    ),
    ("fuse_gemm_update", "default", "as alone"),
    (
        "fuse_parallel_matmul",
        "default",
        "not in the default pipeline: merging q/k/v raises the planned arena (see \
         default_pipeline); it fires alone on the transformer models",
    ),
];

/// The opset the `@20` cases are upgraded to.
const UPGRADE_TO: i64 = 20;

/// A label, its passes, and how many rounds to run them.
type Pipeline = (String, Vec<Box<dyn Pass>>, usize);

fn models() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no models in {}", dir.display());
    v
}

/// Compares `got` with `reference` output by output (the shared
/// [`graphopt_tract::compare`]); the worst relative L2 over the float
/// outputs on success, a description of the first failing output otherwise.
/// `exact` passes must give the same bits (so -0 and +0 differ).
fn compare(
    names: &[String],
    reference: &[TractTensor],
    got: &[TractTensor],
    exact: bool,
) -> Result<f64, String> {
    if reference.len() != got.len() {
        return Err(format!("{} outputs vs {}", got.len(), reference.len()));
    }
    let diffs = compare_outputs(names, reference, got, &Tolerance::default());
    let mut worst = 0f64;
    for (i, d) in diffs.iter().enumerate() {
        let name = &d.name;
        if let Some(e) = &d.error {
            return Err(format!("output {i} '{name}': {e}"));
        }
        if d.identical {
            continue;
        }
        if exact || !reference[i].datum_type().is_float() {
            return Err(format!(
                "output {i} '{name}' differs (max abs {:e}, {} of {} elements; the pass is exact())",
                d.max_abs, d.mismatched, d.elements
            ));
        }
        if d.rel_l2.is_nan() || d.rel_l2 > REL_L2 {
            return Err(format!(
                "output {i} '{name}': rel L2 {:.3e} > {REL_L2:e}",
                d.rel_l2
            ));
        }
        worst = worst.max(d.rel_l2);
    }
    Ok(worst)
}

/// One model to check: its label, the model, inputs and reference outputs.
struct Case {
    label: String,
    model: Model,
    inputs: Vec<TractTensor>,
    reference: Vec<TractTensor>,
}

/// Runs `m` in tract on `inputs`.
fn run(m: &Model, inputs: &[TractTensor]) -> Result<Vec<TractTensor>, String> {
    let bytes = graphopt_tract::prepare(m).map_err(|e| format!("prepare: {e:#}"))?;
    graphopt_tract::run_bytes(&bytes, inputs).map_err(|e| format!("{}", e.root_cause()))
}

fn output_names(m: &Model) -> Vec<String> {
    let g = &m.graph;
    g.outputs.iter().map(|&v| g.name(v).to_string()).collect()
}

/// The passes that reported a change in `runs`.
fn fired(runs: &[PassRun]) -> BTreeSet<&'static str> {
    runs.iter()
        .filter(|r| r.stats.changed)
        .map(|r| r.pass)
        .collect()
}

/// Loads every model and its `@20` upgrade. Failures to run go to
/// `cannot_run` (label, reason); the upgrade's own numerics are asserted.
fn cases(cannot_run: &mut Vec<(String, String)>) -> Vec<Case> {
    let mut out = Vec::new();
    for path in models() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let loaded = graphopt_onnx::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = match graphopt_tract::sample_inputs(&loaded.model, &[], 3, 7) {
            Ok(i) => i,
            Err(e) => {
                cannot_run.push((name, format!("inputs: {e:#}")));
                continue;
            }
        };
        let reference = match run(&loaded.model, &inputs) {
            Ok(r) => r,
            Err(e) => {
                cannot_run.push((name, format!("tract: {e}")));
                continue;
            }
        };
        if loaded.model.onnx_opset().is_some_and(|o| o < UPGRADE_TO) {
            let label = format!("{name}@{UPGRADE_TO}");
            let upgrade: Box<dyn Pass> = Box::new(UpgradeOpset { target: UPGRADE_TO });
            let upgrade_exact = upgrade.exact();
            let mut m = loaded.model.clone();
            let mut opts = ManagerOptions {
                verify: true,
                max_rounds: 1,
                ..ManagerOptions::default()
            };
            run_pipeline(&mut m, &[upgrade], &mut opts)
                .unwrap_or_else(|e| panic!("{label}: upgrade_opset: {e}"));
            assert_eq!(m.onnx_opset(), Some(UPGRADE_TO), "{label}");
            match run(&m, &inputs) {
                Ok(got) => {
                    compare(&output_names(&m), &reference, &got, upgrade_exact)
                        .unwrap_or_else(|e| panic!("{label}: upgrade_opset: {e}"));
                    out.push(Case {
                        label,
                        model: m,
                        inputs: inputs.clone(),
                        reference: got,
                    });
                }
                Err(e) => cannot_run.push((label, format!("tract: {e}"))),
            }
        }
        out.push(Case {
            label: name,
            model: loaded.model,
            inputs,
            reference,
        });
    }
    out
}

#[test]
fn passes_preserve_outputs_on_real_models() {
    let mut cannot_run = Vec::new();
    let cases = cases(&mut cannot_run);

    // The skip list is exact: no unexpected failure, no stale entry.
    let failed: BTreeSet<&str> = cannot_run.iter().map(|(l, _)| l.as_str()).collect();
    let unexpected: Vec<String> = cannot_run
        .iter()
        .filter(|(l, _)| !SKIPPED.iter().any(|(s, _)| s == l))
        .map(|(l, why)| format!("{l}: {why}"))
        .collect();
    assert!(
        unexpected.is_empty(),
        "models that do not run and are not in SKIPPED:\n  {}",
        unexpected.join("\n  ")
    );
    let stale: Vec<&str> = SKIPPED
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| !failed.contains(s))
        .collect();
    assert!(
        stale.is_empty(),
        "SKIPPED lists models that now run (remove them): {stale:?}"
    );

    // Where each pass fired: alone, and inside the default pipeline.
    let mut alone: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut in_default: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut worst: BTreeMap<String, f64> = BTreeMap::new();
    for case in &cases {
        let label = &case.label;
        let names = output_names(&case.model);
        let mut pipelines: Vec<Pipeline> = graphopt_passes::registry()
            .iter()
            .filter(|p| !OPT_IN.contains(&p.name))
            .map(|p| (p.name.to_string(), vec![(p.make)()], 1))
            .collect();
        pipelines.push(("default".into(), graphopt_passes::default_pipeline(), 8));
        for (name, passes, rounds) in pipelines {
            let mut m = case.model.clone();
            let mut opts = ManagerOptions {
                verify: true,
                max_rounds: rounds,
                ..ManagerOptions::default()
            };
            let runs = run_pipeline(&mut m, &passes, &mut opts)
                .unwrap_or_else(|e| panic!("{label}: {name}: {e}"));
            let fired = fired(&runs);
            for p in &fired {
                let at = if name == "default" {
                    &mut in_default
                } else {
                    &mut alone
                };
                at.entry(p).or_default().push(label.clone());
            }
            let got =
                run(&m, &case.inputs).unwrap_or_else(|e| panic!("{label}: {name}: tract: {e:#}"));
            let exact = passes.iter().all(|p| p.exact());
            let e = compare(&names, &case.reference, &got, exact)
                .unwrap_or_else(|e| panic!("{label}: {name}: {e}"));
            if !exact {
                let w = worst.entry(name).or_default();
                *w = w.max(e);
            }
        }
    }
    eprintln!(
        "numerics: {} cases checked; skipped: {:?}",
        cases.len(),
        SKIPPED.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    eprintln!("worst rel L2 per non-exact pipeline: {worst:?}");
    for (p, at) in &alone {
        eprintln!("  {p} fired alone on {}", at.join(", "));
    }
    for (p, at) in &in_default {
        eprintln!("  {p} fired in the default pipeline on {}", at.join(", "));
    }
    let mut wrong = Vec::new();
    for p in graphopt_passes::registry() {
        if OPT_IN.contains(&p.name) || (p.make)().exact() {
            continue;
        }
        for (setting, at) in [("alone", &alone), ("default", &in_default)] {
            let listed = NOT_FIRING
                .iter()
                .any(|(n, s, _)| *n == p.name && *s == setting);
            match (at.get(p.name), listed) {
                (None, false) => wrong.push(format!(
                    "{} ({setting}) fired on no real model, so its numerics went untested",
                    p.name
                )),
                (Some(on), true) => wrong.push(format!(
                    "{} ({setting}) is in NOT_FIRING but fired on {} (remove the entry)",
                    p.name,
                    on.join(", ")
                )),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
