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

use graphopt::ir::Tensor;
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
    t.cast_to::<f64>()
        .unwrap()
        .to_plain_array_view::<f64>()
        .unwrap()
        .iter()
        .copied()
        .collect()
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
