//! Optimizers in the training graph (`--optimizer sgd|adamw`) and
//! `--params-as-inputs`: the step is looped in tract, feeding the `_new`
//! outputs back, and compared with AdamW computed here in f64 from the
//! graph's own gradients (the formulas of `torch.optim.AdamW`; the
//! gradients themselves are checked against finite differences in
//! `grad_rules.rs` and against torch autograd in `grad_torch.rs`).

use graphopt::ir::Tensor;
use graphopt::text::parse_model;
use graphopt::tract::TractTensor;
use graphopt::{AutodiffOptions, GradOptions, GradReport, Optimizer, Session};
use std::collections::BTreeMap;
use std::path::Path;

fn fixture(rel: &str) -> graphopt::ir::Model {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/autodiff")
        .join(rel);
    parse_model(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn vals(t: &TractTensor) -> Vec<f64> {
    graphopt::tensor_f64s(t).unwrap()
}

fn to_tract(t: &Tensor) -> TractTensor {
    graphopt::tract::from_ir(t).unwrap()
}

fn train(
    model: &graphopt::ir::Model,
    optimizer: Optimizer,
    as_inputs: bool,
) -> (Session, GradReport) {
    let mut s = Session::from_model(model.clone());
    let r = s
        .grad(&GradOptions {
            autodiff: AutodiffOptions {
                optimizer,
                params_as_inputs: as_inputs,
                ..AutodiffOptions::default()
            },
            // The checks below read the gradients.
            keep_grads: true,
            ..GradOptions::default()
        })
        .unwrap();
    graphopt::ir::verify::verify_model(s.model()).unwrap();
    (s, r)
}

#[test]
fn with_an_optimizer_gradients_are_not_outputs_unless_kept() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/train/digits_mlp.onnx");
    let model = graphopt::load(&path).unwrap().into_model();
    let step = |keep_grads: bool| {
        let mut s = Session::from_model(model.clone());
        let r = s
            .grad(&GradOptions {
                autodiff: AutodiffOptions {
                    optimizer: Optimizer::Sgd {
                        lr: 0.01,
                        weight_decay: 0.0,
                    },
                    params_as_inputs: true,
                    ..AutodiffOptions::default()
                },
                dims: graphopt::plan::DimValues::new(&[("batch".to_string(), 64)]),
                keep_grads,
                ..GradOptions::default()
            })
            .unwrap();
        let g = &s.model().graph;
        let grads = g
            .outputs
            .iter()
            .filter(|&&v| g.name(v).ends_with("_grad"))
            .count();
        (grads, r)
    };
    let (dropped, lean) = step(false);
    let (kept, full) = step(true);
    assert_eq!((dropped, kept), (0, lean.params.len()));
    // Every gradient lived to the end of the step; now each dies at its
    // update, and the parameters' updates take their inputs' bytes.
    assert_eq!(lean.donations.len(), lean.params.len());
    assert!(
        lean.lower_bound_bytes < full.lower_bound_bytes,
        "{} vs {}",
        lean.lower_bound_bytes,
        full.lower_bound_bytes
    );
}

/// Runs `model` in tract with inputs by name; returns outputs by name.
fn run(
    model: &graphopt::ir::Model,
    feeds: &BTreeMap<String, TractTensor>,
) -> BTreeMap<String, TractTensor> {
    let g = &model.graph;
    let ins: Vec<TractTensor> = g
        .runtime_inputs()
        .map(|v| {
            feeds
                .get(g.name(v))
                .unwrap_or_else(|| panic!("no feed for input {}", g.name(v)))
                .clone()
        })
        .collect();
    let outs = graphopt::tract::run_bytes(&graphopt::tract::prepare(model).unwrap(), &ins).unwrap();
    g.outputs
        .iter()
        .zip(outs)
        .map(|(&o, t)| (g.name(o).to_string(), t))
        .collect()
}

/// Worst relative L2 error of the parameters and moments against the f64
/// reference over 4 steps, measured: 1.0e-7 (f32 rounding); the bound is
/// about 3x.
const ADAMW_BOUND: f64 = 3e-7;

#[test]
fn adamw_matches_reference_over_steps() {
    let model = fixture("matmul/gemm_trans.onnxtxt");
    let (lr, b1, b2, eps, wd) = (0.05, 0.8, 0.95, 1e-6, 0.1);
    let opt = Optimizer::AdamW {
        lr,
        beta1: b1,
        beta2: b2,
        eps,
        weight_decay: wd,
    };
    let (s, r) = train(&model, opt, true);
    let g = &s.model().graph;
    // Parameters are graph inputs without initializers.
    for p in &r.params {
        let v = g.value_by_name(p).unwrap();
        assert!(g.is_input(v) && g.initializer(v).is_none(), "{p}");
    }
    assert_eq!(r.state_inputs[0], "step");
    assert_eq!(r.state_inputs.len(), 1 + 2 * r.params.len());
    // Every state input has a matching `_new` output, and so does each param.
    let out_names: Vec<&str> = g.outputs.iter().map(|&o| g.name(o)).collect();
    for name in r.params.iter().chain(&r.state_inputs) {
        assert!(
            out_names.contains(&format!("{name}_new").as_str()),
            "{name}_new missing"
        );
    }

    let data = graphopt::tract::sample_inputs(&model, &[], 1, 5).unwrap();
    let mut feeds: BTreeMap<String, TractTensor> = BTreeMap::new();
    feeds.insert(g.name(model.graph.inputs[0]).to_string(), data[0].clone());
    for (name, t) in &r.initial_state {
        feeds.insert(name.clone(), to_tract(t));
    }
    // The f64 reference state.
    let mut p_ref: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut m_ref: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut v_ref: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (name, t) in &r.initial_state {
        if r.params.contains(name) {
            let x = t.to_f64_vec().unwrap();
            m_ref.insert(name.clone(), vec![0.0; x.len()]);
            v_ref.insert(name.clone(), vec![0.0; x.len()]);
            p_ref.insert(name.clone(), x);
        }
    }
    assert_eq!(p_ref.len(), r.params.len());
    let mut worst = 0f64;
    for step in 1..=4 {
        let outs = run(s.model(), &feeds);
        assert_eq!(vals(&outs["step_new"]), [step as f64]);
        for p in &r.params {
            // The reference update from the graph's own gradient.
            let gr = vals(&outs[&format!("{p}_grad")]);
            let (pp, m, v) = (
                p_ref.get_mut(p).unwrap(),
                m_ref.get_mut(p).unwrap(),
                v_ref.get_mut(p).unwrap(),
            );
            let (c1, c2) = (1.0 - b1.powi(step), 1.0 - b2.powi(step));
            for i in 0..pp.len() {
                m[i] = b1 * m[i] + (1.0 - b1) * gr[i];
                v[i] = b2 * v[i] + (1.0 - b2) * gr[i] * gr[i];
                pp[i] = pp[i] * (1.0 - lr * wd) - lr / c1 * m[i] / (v[i].sqrt() / c2.sqrt() + eps);
            }
            for (got, want) in [
                (vals(&outs[&format!("{p}_new")]), &*pp),
                (vals(&outs[&format!("{p}_m_new")]), &*m),
                (vals(&outs[&format!("{p}_v_new")]), &*v),
            ] {
                let num: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
                let den: f64 = want.iter().map(|b| b * b).sum();
                let rel = num.sqrt() / den.sqrt().max(1e-12);
                worst = worst.max(rel);
                assert!(rel <= ADAMW_BOUND, "step {step}, {p}: rel {rel:.3e}");
            }
        }
        // Feed the state back, and this step's parameters (the reference
        // keeps its own f64 copy: errors do not compound unnoticed).
        for name in r.params.iter().chain(&r.state_inputs) {
            let new = outs[&format!("{name}_new")].clone();
            feeds.insert(name.clone(), new);
        }
    }
    eprintln!("adamw: worst rel {worst:.3e}");
}

/// The same first step with the parameters kept as initializers; the loss
/// falls over a few AdamW steps.
#[test]
fn adamw_with_initializers_and_npz() {
    let model = fixture("matmul/gemm_trans.onnxtxt");
    let opt = Optimizer::adamw_default();
    let (a, ra) = train(&model, opt, false);
    let (b, rb) = train(&model, opt, true);
    assert_eq!(ra.params, rb.params);
    // Without params_as_inputs the initial state is the optimizer's only.
    assert_eq!(ra.initial_state.len(), ra.state_inputs.len());
    assert_eq!(
        rb.initial_state.len(),
        rb.state_inputs.len() + rb.params.len()
    );
    let data = graphopt::tract::sample_inputs(&model, &[], 1, 5).unwrap();
    let mk = |r: &GradReport| {
        let mut f = BTreeMap::new();
        f.insert("x".to_string(), data[0].clone());
        for (n, t) in &r.initial_state {
            f.insert(n.clone(), to_tract(t));
        }
        f
    };
    let (oa, ob) = (run(a.model(), &mk(&ra)), run(b.model(), &mk(&rb)));
    for p in &ra.params {
        let k = format!("{p}_new");
        assert_eq!(vals(&oa[&k]), vals(&ob[&k]), "{k}");
    }
    // Parameters fed as inputs and the optimizer's state are not counted
    // as saved for backward.
    assert_eq!(ra.saved_input_bytes, rb.saved_input_bytes);
    assert!(
        rb.saved
            .iter()
            .all(|v| !rb.params.contains(&v.name) && !rb.state_inputs.contains(&v.name)),
        "{:?}",
        rb.saved
    );
    // The npz holds every initial array.
    let npz = graphopt::initial_state_npz(&rb).unwrap();
    let back = graphopt::tract::npz::read(&npz).unwrap();
    let names: Vec<&String> = back.keys().collect();
    assert_eq!(names.len(), rb.initial_state.len(), "{names:?}");
    // Loop AdamW: the loss falls.
    let mut feeds = mk(&rb);
    let mut losses = Vec::new();
    for _ in 0..5 {
        let outs = run(b.model(), &feeds);
        losses.push(vals(&outs["loss"])[0]);
        for name in rb.params.iter().chain(&rb.state_inputs) {
            feeds.insert(name.clone(), outs[&format!("{name}_new")].clone());
        }
    }
    assert!(losses[4] < losses[0], "{losses:?}");
}

/// Name clashes with the optimizer's state are errors, not renames.
#[test]
fn adamw_state_name_clash_is_an_error() {
    let src = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x, int64 step) => (float[2,3] y)
  <float[2,3] w = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6}> {
  y = Mul (x, w)
}"#;
    let model = parse_model(src).unwrap();
    let err = graphopt::autodiff::build_training_graph(
        &model,
        &AutodiffOptions {
            optimizer: Optimizer::adamw_default(),
            ..AutodiffOptions::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("'step'"), "{err}");
}

/// Each parameter's update runs as soon as its gradient is complete, so
/// the gradients are never alive together (issue: "the parameter
/// gradients never have to be alive together"). Counted in program order,
/// which `remat`, the planner and the runtimes start from, on a real
/// model: with the updates after the whole backward pass all 18 named
/// gradients of bert_tiny were alive at once; now one is. Also in program
/// order: every `<p>_new` still overwrites `<p>` (no reader of `<p>` comes
/// after its update), and no parameter-sized optimizer temporary (AdamW's
/// `β1·m`, `β2·v`, the decayed parameter) is made before its gradient.
#[test]
fn each_update_runs_as_soon_as_its_gradient_is_complete() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/bert_tiny.ts14.onnx");
    let model = graphopt::load(&path).unwrap().into_model();
    for optimizer in [
        Optimizer::Sgd {
            lr: 0.01,
            weight_decay: 0.01,
        },
        Optimizer::adamw_default(),
    ] {
        let mut s = Session::from_model(model.clone());
        let dims =
            graphopt::plan::DimValues::new(&[("batch".to_string(), 2), ("seq".to_string(), 16)]);
        let r = s
            .grad(&GradOptions {
                autodiff: AutodiffOptions {
                    optimizer,
                    params_as_inputs: true,
                    loss: graphopt::Loss::Mse,
                    ..AutodiffOptions::default()
                },
                dims: dims.clone(),
                ..GradOptions::default()
            })
            .unwrap();
        let g = &s.model().graph;
        let pos: std::collections::HashMap<_, _> =
            g.order().iter().enumerate().map(|(i, &n)| (n, i)).collect();
        // Each parameter's gradient: `<p>_grad`, or, where
        // fuse_gemm_update took the weight gradient into a Gemm (SGD with
        // weight decay: `Gemm(X, dY, wd·p)`, the decayed gradient), the
        // value the update scales by the learning rate (`<p>_new = Sub(p,
        // Mul(x, lr))`).
        let grad_of = |p: &String| {
            g.value_by_name(&format!("{p}_grad")).or_else(|| {
                let (sub, _) = g.producer(g.value_by_name(&format!("{p}_new"))?)?;
                let (mul, _) = g.producer(g.node(sub).input(1)?)?;
                let x = g.node(mul).input(0)?;
                (g.node(sub).op_type == "Sub" && g.node(mul).op_type == "Mul").then_some(x)
            })
        };
        // (made, last read) of every gradient.
        let spans: Vec<(usize, usize)> = r
            .params
            .iter()
            .filter_map(grad_of)
            .filter_map(|v| {
                let made = pos[&g.producer(v)?.0];
                let last = g.uses(v).iter().map(|u| pos[&u.node()]).max()?;
                Some((made, last))
            })
            .collect();
        assert!(spans.len() >= 18, "{} gradients", spans.len());
        let most = (0..g.order().len())
            .map(|t| spans.iter().filter(|&&(a, b)| a <= t && t <= b).count())
            .max()
            .unwrap();
        assert_eq!(most, 1, "{optimizer:?}: {most} gradients alive at once");
        // The optimizer's nodes are named after what they make (`<p>_new`,
        // `<p>_m_new`, `<p>_v_new`): none of those of parameter size comes
        // before the parameter's gradient.
        for p in &r.params {
            let Some(gv) = g.value_by_name(&format!("{p}_grad")) else {
                continue;
            };
            let made = pos[&g.producer(gv).unwrap().0];
            let rank = |v| g.ty(v).and_then(|t| t.shape()).map(|s| s.dims.len());
            let early: Vec<String> = g
                .order()
                .iter()
                .filter(|&n| pos[n] < made)
                .filter(|&&n| {
                    let name = &g.node(n).name;
                    [
                        format!("grad/{p}_new_"),
                        format!("grad/{p}_m_new_"),
                        format!("grad/{p}_v_new_"),
                    ]
                    .iter()
                    .any(|pre| name.starts_with(pre.as_str()))
                })
                .filter(|&&n| g.node(n).output(0).and_then(rank).is_some_and(|r| r > 0))
                .map(|&n| g.node(n).name.clone())
                .collect();
            assert!(
                early.is_empty(),
                "{optimizer:?}: before {p}'s gradient: {early:?}"
            );
        }
        let planned = graphopt::plan::plan_model(
            s.model(),
            &dims,
            &graphopt::plan::PlanOptions {
                reorder: false,
                search: false,
                ..graphopt::plan::PlanOptions::default()
            },
        )
        .unwrap();
        assert!(
            planned.plan.donations_refused.is_empty(),
            "{optimizer:?}: {:?}",
            planned.plan.donations_refused
        );
        assert_eq!(
            r.donations.len(),
            planned.plan.donated.len(),
            "{optimizer:?}"
        );
    }
}

/// Worst relative L2 error of a fused SGD update (`W_new = Gemm(X, dY, W,
/// alpha = -lr)`) against the unfused step's `W - lr·dW`, as the update
/// `W_new - W`, on gpt2_tiny: measured 0 in tract, 9.3e-7 in graphopt's
/// runtime (its Gemm sums in another order than tract's, and `W_new` is
/// rounded at the weight's magnitude, far above the update's); the bound
/// is about 3x.
const FUSED_SGD_BOUND: f64 = 3e-6;

/// SGD without weight decay writes each 2-D weight's update into the Gemm
/// that computes its gradient (`fuse_gemm_update`), on a real model: the
/// gradient is never held, the plan writes `<p>_new` in place over `<p>`
/// at that Gemm, and the updates match the unfused step's, in tract and in
/// graphopt's runtime running the donated plan.
#[test]
fn sgd_updates_of_matmul_weights_run_inside_their_gradient_gemm() {
    use graphopt::exec::{CpuBackend, Executable, RunOptions};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    let model = graphopt::load(dir.join("gpt2_tiny.ts14.onnx"))
        .unwrap()
        .into_model();
    let dims = graphopt::plan::DimValues::new(&[("batch".to_string(), 2), ("seq".to_string(), 8)]);
    let step = |simplify: bool| {
        let mut s = Session::from_model(model.clone());
        let r = s
            .grad(&GradOptions {
                autodiff: AutodiffOptions {
                    optimizer: Optimizer::Sgd {
                        lr: 0.05,
                        weight_decay: 0.0,
                    },
                    params_as_inputs: true,
                    loss: graphopt::Loss::CrossEntropy,
                    class_axis: -1,
                    ..AutodiffOptions::default()
                },
                dims: dims.clone(),
                simplify,
                ..GradOptions::default()
            })
            .unwrap();
        (s, r)
    };
    let (fused, r) = step(true);
    let (plain, _) = step(false);
    let g = &fused.model().graph;
    // Every parameter whose gradient is a Gemm: the 2-D weights of the
    // attention, MLP and LM-head MatMuls.
    let updated: Vec<&String> = r
        .params
        .iter()
        .filter(|p| {
            let (Some(pv), Some(nv)) = (g.value_by_name(p), g.value_by_name(&format!("{p}_new")))
            else {
                return false;
            };
            g.producer(nv).is_some_and(|(n, _)| {
                let d = g.node(n);
                d.op_type == "Gemm" && d.input(2) == Some(pv)
            })
        })
        .collect();
    assert!(updated.len() >= 9, "{} fused: {updated:?}", updated.len());
    for p in &updated {
        assert!(g.value_by_name(&format!("{p}_grad")).is_none(), "{p}_grad");
    }
    // Planned: each is written in place over its weight at its Gemm.
    let mp = graphopt::plan::plan_model(
        fused.model(),
        &dims,
        &graphopt::plan::PlanOptions::default(),
    )
    .unwrap();
    assert!(
        mp.plan.donations_refused.is_empty(),
        "{:?}",
        mp.plan.donations_refused
    );
    let in_place = mp
        .plan
        .aliases
        .iter()
        .filter(|a| a.op_type == "Gemm")
        .count();
    assert_eq!(in_place, updated.len());

    // The same step, fused and not, in tract; then the fused one in
    // graphopt's runtime with the donated plan.
    let ids: Vec<i64> = (0..16).map(|i| (i * 37 + 11) % 256).collect();
    let target: Vec<i64> = (0..16).map(|i| (i * 53 + 7) % 256).collect();
    let mut feeds = BTreeMap::new();
    let i64s = |v: &[i64]| to_tract(&Tensor::from_i64(vec![2, 8], v).unwrap());
    feeds.insert("input_ids".to_string(), i64s(&ids));
    feeds.insert("attention_mask".to_string(), i64s(&[1; 16]));
    feeds.insert("target".to_string(), i64s(&target));
    for (n, t) in &r.initial_state {
        feeds.insert(n.clone(), to_tract(t));
    }
    let (of, op) = (run(fused.model(), &feeds), run(plain.model(), &feeds));
    let fg = &fused.model().graph;
    let host: Vec<graphopt::HostTensor> = fg
        .runtime_inputs()
        .map(|v| graphopt::to_host(&feeds[fg.name(v)]).unwrap())
        .collect();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let (outs, _) = exe
        .run(
            &host,
            &RunOptions {
                threads: 2,
                poison: false,
            },
        )
        .unwrap();
    let ours: BTreeMap<&str, &graphopt::HostTensor> = mp
        .model
        .graph
        .outputs
        .iter()
        .map(|&o| mp.model.graph.name(o))
        .zip(&outs)
        .collect();
    let rel = |a: &[f64], b: &[f64]| {
        let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f64 = b.iter().map(|y| y * y).sum();
        (num / den.max(1e-300)).sqrt()
    };
    let (mut worst_tract, mut worst_ours) = (0f64, 0f64);
    for p in &updated {
        let k = format!("{p}_new");
        let w = vals(&feeds[p.as_str()]);
        let delta = |v: Vec<f64>| -> Vec<f64> { v.iter().zip(&w).map(|(a, b)| a - b).collect() };
        let want = delta(vals(&op[&k]));
        assert!(want.iter().any(|&d| d != 0.0), "{k}: no update");
        worst_tract = worst_tract.max(rel(&delta(vals(&of[&k])), &want));
        let got: Vec<f64> = ours[k.as_str()]
            .to_f32()
            .unwrap()
            .iter()
            .map(|&x| x as f64)
            .collect();
        worst_ours = worst_ours.max(rel(&delta(got), &want));
    }
    eprintln!("fused SGD updates: tract {worst_tract:.2e}, graphopt runtime {worst_ours:.2e}");
    assert!(worst_tract <= FUSED_SGD_BOUND, "tract: {worst_tract:e}");
    assert!(worst_ours <= FUSED_SGD_BOUND, "runtime: {worst_ours:e}");
}

/// A parameter that is exactly another one transposed (a tied LM head the
/// exporter's constant folding wrote twice) is named in a warning; a
/// different matrix, and a pair of all-zero matrices, are not.
#[test]
fn a_parameter_that_is_another_transposed_is_named_as_a_split_tie() {
    let text = |wt: &str| {
        format!(
            r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y, float[2,2] z)
  <float[3,4] w = {{1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0}},
   float[4,3] wt = {{{wt}}},
   float[2,2] z1 = {{0.0, 0.0, 0.0, 0.0}}, float[2,2] z2 = {{0.0, 0.0, 0.0, 0.0}}> {{
  h = MatMul (x, w)
  y = MatMul (h, wt)
  a = MatMul (x, w)
  s = Slice (a, st, en)
  st = Constant <value = int64[1] {{0}}> ()
  en = Constant <value = int64[1] {{2}}> ()
  b = MatMul (s, z1)
  z = MatMul (b, z2)
}}"#
        )
    };
    let warnings = |wt: &str| {
        let mut s = Session::from_model(parse_model(&text(wt)).unwrap());
        s.grad(&GradOptions::default()).unwrap().warnings
    };
    let tied = warnings("1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0, 4.0, 8.0, 12.0");
    assert_eq!(tied.len(), 1, "{tied:?}");
    assert!(
        tied[0].starts_with("parameters 'w' and 'wt' hold the same values transposed"),
        "{tied:?}"
    );
    let apart = warnings("1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0, 4.0, 8.0, 12.5");
    assert!(apart.is_empty(), "{apart:?}");
}
