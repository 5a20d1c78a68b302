//! `graphopt grad` against torch autograd, on the small torch modules of
//! `testdata/autodiff/make_torch_refs.py` (an MLP with cross-entropy, a CNN
//! with BatchNorm in eval mode and pooling with mse, a transformer block
//! whose attention is two Einsums with the mean), each exported by both
//! exporters. The script commits torch's loss, parameter and input
//! gradients, and the parameters after 3 AdamW steps (keyed by the ONNX
//! initializer holding each parameter), so this test needs no torch.
//!
//! 1. The training graph (default trainable set, `--input-grads`) runs in
//!    tract on the committed inputs; the loss and every gradient match
//!    torch's within relative L2 [`GRAD_BOUND`].
//! 2. `--optimizer adamw` with torch's hyperparameters, looped 3 times in
//!    tract (`--params-as-inputs`, the parameters fed back; the CNN keeps
//!    its parameters as initializers, rewritten each step, because tract
//!    runs BatchNormalization only with constant parameters), gives torch's
//!    parameters within [`ADAMW_BOUND`].
//! 3. On the architectures of `testdata/models` themselves (same script,
//!    `testdata/autodiff/torch/models/`), both exporters, the loss and every
//!    gradient match torch's within [`MODEL_BOUND`]: see
//!    `models_match_torch_autograd`.

use graphopt::ir::Tensor;
use graphopt::plan::PlanOptions;
use graphopt::tract::TractTensor;
use graphopt::{AutodiffOptions, GradOptions, Loss, Optimizer, Session};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/autodiff/torch")
}

/// Worst relative L2 error of a gradient against torch's, measured over the
/// six exports: 4.8e-7 (f32 summation order; the loss itself: 4.2e-7);
/// the bound is about 3x.
const GRAD_BOUND: f64 = 1.5e-6;

/// Worst relative L2 error of the parameters after 3 AdamW steps, measured:
/// 2.9e-7; the bound is about 3x.
const ADAMW_BOUND: f64 = 9e-7;

fn tract_f64s(t: &TractTensor) -> Vec<f64> {
    graphopt::tensor_f64s(t).unwrap()
}

fn to_tract(t: &Tensor) -> TractTensor {
    graphopt::tract::from_ir(t).unwrap()
}

fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    num.sqrt() / den.sqrt().max(1e-12)
}

struct Case {
    stem: String,
    loss: Loss,
    refs: BTreeMap<String, TractTensor>,
}

fn cases() -> Vec<Case> {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("MANIFEST.json")).unwrap())
            .unwrap();
    let mut out = Vec::new();
    for (stem, v) in manifest.as_object().unwrap() {
        if stem.starts_with('_') {
            continue;
        }
        let loss = Loss::parse(v["loss"].as_str().unwrap()).unwrap();
        let bytes = std::fs::read(dir().join(format!("{stem}.refs.npz"))).unwrap();
        let refs = graphopt::tract::npz::read(&bytes).unwrap();
        out.push(Case {
            stem: stem.clone(),
            loss,
            refs,
        });
    }
    assert_eq!(out.len(), 6, "expected 3 modules x 2 exporters");
    out
}

fn by_prefix<'a>(
    refs: &'a BTreeMap<String, TractTensor>,
    p: &str,
) -> Vec<(&'a str, &'a TractTensor)> {
    refs.iter()
        .filter_map(|(k, v)| k.strip_prefix(p).map(|n| (n, v)))
        .collect()
}

/// Runs `s`'s model with inputs by name; outputs by name.
fn run(s: &Session, feeds: &BTreeMap<String, TractTensor>) -> BTreeMap<String, TractTensor> {
    let g = &s.model().graph;
    let ins: Vec<TractTensor> = g
        .runtime_inputs()
        .map(|v| {
            feeds
                .get(g.name(v))
                .unwrap_or_else(|| panic!("no feed for input {}", g.name(v)))
                .clone()
        })
        .collect();
    let outs =
        graphopt::tract::run_bytes(&graphopt::tract::prepare(s.model()).unwrap(), &ins).unwrap();
    g.outputs
        .iter()
        .zip(outs)
        .map(|(&o, t)| (g.name(o).to_string(), t))
        .collect()
}

fn feeds(c: &Case) -> BTreeMap<String, TractTensor> {
    by_prefix(&c.refs, "in/")
        .into_iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect()
}

#[test]
fn gradients_match_torch_autograd() {
    let mut worst = 0f64;
    let mut failures = Vec::new();
    for c in cases() {
        let mut s = graphopt::load(dir().join(format!("{}.onnx", c.stem))).unwrap();
        let r = s
            .grad(&GradOptions {
                autodiff: AutodiffOptions {
                    loss: c.loss,
                    input_grads: true,
                    ..AutodiffOptions::default()
                },
                ..GradOptions::default()
            })
            .unwrap_or_else(|e| panic!("{}: {e}", c.stem));
        let outs = run(&s, &feeds(&c));
        let loss = tract_f64s(&outs["loss"])[0];
        let want = tract_f64s(&c.refs["loss"])[0];
        let e = (loss - want).abs() / want.abs().max(1e-6);
        eprintln!("{}: loss {loss:.7} torch {want:.7} (rel {e:.2e})", c.stem);
        if e > GRAD_BOUND {
            failures.push(format!("{}: loss {loss} != {want}", c.stem));
        }
        let grads = by_prefix(&c.refs, "grad/");
        let input_grads = by_prefix(&c.refs, "input_grad/");
        for (name, t) in grads.iter().chain(&input_grads) {
            assert!(
                r.params.iter().chain(&r.inputs).any(|p| p == name),
                "{}: '{name}' is not differentiated (params {:?})",
                c.stem,
                r.params
            );
            let got = tract_f64s(&outs[&format!("{name}_grad")]);
            let e = rel_l2(&got, &tract_f64s(t));
            worst = worst.max(e);
            if e > GRAD_BOUND || !e.is_finite() {
                failures.push(format!("{}: {name}_grad rel_l2 {e:.3e}", c.stem));
            }
        }
        eprintln!(
            "{}: {} parameter and {} input gradients checked",
            c.stem,
            grads.len(),
            input_grads.len()
        );
    }
    eprintln!("worst gradient rel_l2 {worst:.3e}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn adamw_matches_torch_optim() {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("MANIFEST.json")).unwrap())
            .unwrap();
    let h = &manifest["_meta"]["adamw"];
    let opt = Optimizer::AdamW {
        lr: h["lr"].as_f64().unwrap(),
        beta1: h["betas"][0].as_f64().unwrap(),
        beta2: h["betas"][1].as_f64().unwrap(),
        eps: h["eps"].as_f64().unwrap(),
        weight_decay: h["weight_decay"].as_f64().unwrap(),
    };
    let steps = manifest["_meta"]["adamw_steps"].as_u64().unwrap();
    let mut worst = 0f64;
    for c in cases() {
        let want = by_prefix(&c.refs, "adamw/");
        // tract runs BatchNormalization only with constant parameters: the
        // CNN keeps its parameters as initializers, rewritten each step.
        let as_inputs = !c.stem.starts_with("cnn");
        let mut s = graphopt::load(dir().join(format!("{}.onnx", c.stem))).unwrap();
        let r = s
            .grad(&GradOptions {
                autodiff: AutodiffOptions {
                    loss: c.loss,
                    // Exactly torch's parameters.
                    trainable: want.iter().map(|(n, _)| n.to_string()).collect(),
                    optimizer: opt,
                    params_as_inputs: as_inputs,
                    ..AutodiffOptions::default()
                },
                ..GradOptions::default()
            })
            .unwrap_or_else(|e| panic!("{}: {e}", c.stem));
        assert_eq!(r.params.len(), want.len(), "{}", c.stem);
        let mut f = feeds(&c);
        for (n, t) in &r.initial_state {
            f.insert(n.clone(), to_tract(t));
        }
        for _ in 0..steps {
            let outs = run(&s, &f);
            for n in r.params.iter().chain(&r.state_inputs) {
                f.insert(n.clone(), outs[&format!("{n}_new")].clone());
            }
            if !as_inputs {
                // Write the parameters back into the initializers.
                let g = &mut s.model_mut().graph;
                for p in &r.params {
                    let v = g.value_by_name(p).unwrap();
                    let dims = g.initializer(v).unwrap().dims.clone();
                    let new: Vec<f32> = tract_f64s(&f[p]).iter().map(|&x| x as f32).collect();
                    g.set_initializer(v, Tensor::from_f32(dims, &new).unwrap());
                }
            }
        }
        for (name, t) in &want {
            // AdamW divides by the gradient's own magnitude, so an entry
            // whose gradient is rounding noise (the key bias of attention:
            // softmax ignores a shift of every score of a row, so its exact
            // gradient is 0) takes a full step of the noise's sign, which
            // differs between any two implementations. Those entries
            // (0 < |grad| ≤ 1e-5·max|grad| in torch) are left out and counted.
            let g = tract_f64s(&c.refs[&format!("grad/{name}")]);
            let gmax = g.iter().fold(0f64, |m, v| m.max(v.abs()));
            let keep: Vec<bool> = g
                .iter()
                .map(|v| *v == 0.0 || v.abs() > 1e-5 * gmax)
                .collect();
            let pick = |v: Vec<f64>| -> Vec<f64> {
                v.into_iter()
                    .zip(&keep)
                    .filter(|(_, &k)| k)
                    .map(|(v, _)| v)
                    .collect()
            };
            let skipped = keep.iter().filter(|k| !**k).count();
            if skipped > 0 {
                eprintln!(
                    "{}: {name}: {skipped} entries with noise gradients left out",
                    c.stem
                );
            }
            let e = rel_l2(&pick(tract_f64s(&f[*name])), &pick(tract_f64s(t)));
            worst = worst.max(e);
            assert!(
                e <= ADAMW_BOUND,
                "{}: {name} after AdamW: rel_l2 {e:.3e}",
                c.stem
            );
        }
    }
    eprintln!("worst AdamW rel_l2 {worst:.3e}");
}

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models")
}

/// The bound on the relative L2 error against torch on the
/// testdata models (the loss, every group's gradient or its strided sample
/// and norm, the input gradients). Measured over the 14 exports and their
/// losses: worst 4.8e-6 (MobileNetV3's dynamo export, sum loss, a
/// squeeze-excitation fc1 weight; its ts14 export 2.7e-6), 1.4e-6 for T5
/// (sum), at most 1.1e-6 for the others: f32 summation order, so 1e-4
/// stands with a 20x margin.
const MODEL_BOUND: f64 = 1e-4;

/// `v` (row-major `[r, c]`) transposed.
fn transpose2(v: &[f64], dims: &[usize]) -> Vec<f64> {
    let (r, c) = (dims[0], dims[1]);
    let mut out = vec![0.0; v.len()];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = v[i * c + j];
        }
    }
    out
}

/// `graphopt grad` on the architectures of `testdata/models`, both
/// exporters (`.ts14`, `.dynamo18`), against torch autograd on the same
/// torch modules, weights and inputs (`make_torch_refs.py` builds them
/// with `make_models.py`'s `arch_*` builders and checks that the inputs
/// are those of the committed `.inputs.npz`). Per architecture, the losses
/// of its manifest: `sum` (of the logits, of BERT's and ViT's pooler
/// output, of T5's output; not Whisper's, whose output ends in a
/// LayerNorm whose row sums are constant) and `mse` against a seeded
/// target.
///
/// The initializers are matched to torch's parameters by value (see the
/// script): a group is a set of initializers and torch tensors holding the
/// same value (a parameter, its transpose, or a convolution with its
/// BatchNorm folded in), checked as a whole (sum of the initializers'
/// gradients in torch's layout against the sum of torch's). Every gradient
/// graphopt computes is in a group; torch parameters outside every group
/// are skipped by exactly two rules, which the test asserts:
/// - a BatchNorm's scale γ that the exporter folded into the convolution
///   (resnet, mobilenet, both exporters): it has no initializer; the folded
///   weight W·γ/√(var+ε) and bias are checked (against dL/dW·√(var+ε)/γ
///   and dL/dβ);
/// - an all-zero bias whose addition the exporter dropped (the dynamo
///   exports drop a zero bias of Gemm and Conv: MobileNet's
///   squeeze-excitation and classifier biases, GPT-2's Conv1D biases, BERT's
///   and ViT's pooler biases, ViT's patch and Whisper's conv biases):
///   nothing to differentiate. Where it also shares one initializer with
///   equal parameters that kept theirs, the script tells them apart by the
///   torch module each using node records (`pkg.torch.onnx.name_scopes`).
///
/// Torch parameters with `requires_grad = False` (Whisper's sinusoidal
/// position embedding) are passed as `frozen`; the others all get a
/// gradient.
///
/// Gradients over 4096 elements are committed as their norm and every
/// `stride`-th entry (to keep the files small); both are checked.
#[test]
fn models_match_torch_autograd() {
    let tdir = dir().join("models");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tdir.join("MANIFEST.json")).unwrap())
            .unwrap();
    // Every comparison: what, relative error.
    let mut results: Vec<(String, f64)> = Vec::new();
    let check = |what: String, e: f64, results: &mut Vec<(String, f64)>| results.push((what, e));
    let mut exports = 0;
    for (arch, a) in manifest.as_object().unwrap() {
        if arch.starts_with('_') {
            continue;
        }
        let bytes = std::fs::read(tdir.join(format!("{arch}.refs.npz"))).unwrap();
        let refs = graphopt::tract::npz::read(&bytes).unwrap();
        for (stem, e) in a["exports"].as_object().unwrap() {
            exports += 1;
            for (p, why) in e["unmatched_params"].as_object().unwrap() {
                let why = why.as_str().unwrap();
                assert!(
                    why.starts_with("BatchNorm scale folded") || why.starts_with("all zeros"),
                    "{stem}: torch parameter {p} unmatched: {why}"
                );
            }
            assert!(
                e["unmatched_inits"].as_array().unwrap().is_empty(),
                "{stem}: initializers without a torch counterpart: {}",
                e["unmatched_inits"]
            );
            let groups = e["groups"].as_array().unwrap();
            let inits_of = |g: &serde_json::Value| -> Vec<String> {
                g["inits"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i[0].as_str().unwrap().to_string())
                    .collect()
            };
            // Parameters torch does not train (requires_grad = False).
            let frozen: Vec<String> = groups
                .iter()
                .filter(|g| g["frozen"].as_bool().unwrap())
                .flat_map(inits_of)
                .collect();
            let path = models_dir().join(format!("{stem}.onnx"));
            let inputs = std::fs::read(models_dir().join(format!("{stem}.inputs.npz"))).unwrap();
            for l in a["losses"].as_array().unwrap() {
                let kind = l["kind"].as_str().unwrap();
                let output = l["output"].as_str().unwrap();
                let mut s = graphopt::load(&path).unwrap();
                let r = s
                    .grad(&GradOptions {
                        autodiff: AutodiffOptions {
                            loss: Loss::parse(kind).unwrap(),
                            output: Some(output.into()),
                            input_grads: true,
                            frozen: frozen.clone(),
                            ..AutodiffOptions::default()
                        },
                        // The memory figures are not checked: the greedy
                        // plan (a debug build's offset search would take
                        // most of the test's time).
                        plan: PlanOptions {
                            search: false,
                            ..PlanOptions::default()
                        },
                        ..GradOptions::default()
                    })
                    .unwrap_or_else(|e| panic!("{stem}: {e}"));
                let mut f = graphopt::tract::npz::read(&inputs).unwrap();
                if let Some(t) = refs.get(&format!("{kind}/target")) {
                    f.insert("target".into(), t.clone());
                }
                let outs = run(&s, &f);
                let first = results.len();
                let tag = format!("{stem} {kind}({output})");
                let loss = tract_f64s(&outs["loss"])[0];
                let want = tract_f64s(&refs[&format!("{kind}/loss")])[0];
                check(
                    format!("{tag}: loss"),
                    (loss - want).abs() / want.abs(),
                    &mut results,
                );
                // Every gradient graphopt computes is checked.
                let in_groups: Vec<String> = groups
                    .iter()
                    .filter(|g| !g["frozen"].as_bool().unwrap())
                    .flat_map(inits_of)
                    .collect();
                for p in &r.params {
                    assert!(
                        in_groups.contains(p),
                        "{tag}: the gradient of {p} has no torch counterpart"
                    );
                }
                let mut checked = 0;
                for g in groups.iter().filter(|g| !g["frozen"].as_bool().unwrap()) {
                    checked += 1;
                    let id = g["id"].as_str().unwrap();
                    let info = &a["groups"][id];
                    let mut sum: Vec<f64> = Vec::new();
                    for i in g["inits"].as_array().unwrap() {
                        let (name, tr) = (i[0].as_str().unwrap(), i[1].as_bool().unwrap());
                        let out = outs
                            .get(&format!("{name}_grad"))
                            .unwrap_or_else(|| panic!("{tag}: {name} is not differentiated"));
                        let mut v = tract_f64s(out);
                        if tr {
                            v = transpose2(&v, out.shape());
                        }
                        if sum.is_empty() {
                            sum = v;
                        } else {
                            sum.iter_mut().zip(&v).for_each(|(a, b)| *a += b);
                        }
                    }
                    let what = format!("{tag}: {}", g["inits"]);
                    match info["stride"].as_u64() {
                        None => {
                            let want = tract_f64s(&refs[&format!("{kind}/{id}")]);
                            check(what, rel_l2(&sum, &want), &mut results);
                        }
                        Some(stride) => {
                            let want = tract_f64s(&refs[&format!("{kind}/{id}.sample")]);
                            let got: Vec<f64> =
                                sum.iter().step_by(stride as usize).copied().collect();
                            check(
                                format!("{what} (sample)"),
                                rel_l2(&got, &want),
                                &mut results,
                            );
                            let norm = sum.iter().map(|v| v * v).sum::<f64>().sqrt();
                            let want = tract_f64s(&refs[&format!("{kind}/{id}.norm")])[0];
                            check(
                                format!("{what} (norm)"),
                                (norm - want).abs() / want.max(1e-30),
                                &mut results,
                            );
                        }
                    }
                }
                for (name, t) in by_prefix(&refs, &format!("{kind}/input_grad/")) {
                    let got = tract_f64s(&outs[&format!("{name}_grad")]);
                    check(
                        format!("{tag}: input {name}"),
                        rel_l2(&got, &tract_f64s(t)),
                        &mut results,
                    );
                }
                let w = results[first..].iter().map(|r| r.1).fold(0f64, f64::max);
                eprintln!(
                    "{tag}: loss {loss:.6} torch {want:.6}; {checked} groups of {} parameters \
                     checked, worst rel_l2 {w:.2e}",
                    r.params.len()
                );
            }
        }
    }
    assert_eq!(exports, 14, "7 architectures x 2 exporters");
    let worst = results.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    eprintln!("worst rel_l2 {:.3e} ({})", worst.1, worst.0);
    let failures: Vec<String> = results
        .iter()
        .filter(|r| r.1.is_nan() || r.1 > MODEL_BOUND)
        .map(|r| format!("{}: rel_l2 {:.3e}", r.0, r.1))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
