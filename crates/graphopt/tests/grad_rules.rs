//! The gradient rules, one fixture per op family under
//! `testdata/autodiff/<family>/<case>.onnxtxt`:
//!
//! 1. the training graph (loss `sum`, every float initializer of rank ≥ 1
//!    and every float input differentiated) is snapshot-tested in
//!    `testdata/autodiff/<family>/snapshots/`, so a change in a rule shows
//!    up in review as a `.snap` diff;
//! 2. every gradient is checked in tract against central finite
//!    differences of the graph's own `loss`, and the loss against the sum
//!    of the forward output;
//! 3. in double precision, on seeded random small shapes (broadcast
//!    weights, random axes and batch dims), the elementwise, matmul,
//!    softmax, reduction, CumSum and Einsum rules against central
//!    differences with h = 1e-6, as `torch.autograd.gradcheck` does.

use graphopt::autodiff::{build_training_graph, GradOptions, Loss};
use graphopt::text::{parse_model, print_model, PrintOptions};
use graphopt::tract::TractTensor;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/autodiff")
}

fn sorted_dir(p: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// (family, case, path) of every fixture.
fn fixtures() -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    for dir in sorted_dir(&root()).into_iter().filter(|d| d.is_dir()) {
        let fam = dir.file_name().unwrap().to_string_lossy().to_string();
        for f in sorted_dir(&dir) {
            if f.extension().and_then(|e| e.to_str()) == Some("onnxtxt") {
                let case = f.file_stem().unwrap().to_string_lossy().to_string();
                out.push((fam.clone(), case, f));
            }
        }
    }
    assert!(
        out.len() >= 10,
        "fixtures missing under {}",
        root().display()
    );
    out
}

fn opts(case: &str) -> GradOptions {
    GradOptions {
        input_grads: true,
        // BatchNormalization's running statistics are not trained by
        // default; train every initializer there so that their rule is
        // checked too.
        trainable: if case == "batch_norm" {
            vec!["*".into()]
        } else {
            Vec::new()
        },
        dropout_train: case == "dropout",
        ..GradOptions::default()
    }
}

#[test]
fn rule_snapshots() {
    for (fam, case, path) in fixtures() {
        let model = parse_model(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let train = build_training_graph(&model, &opts(&case))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        graphopt::ir::verify::verify_model(&train.model)
            .unwrap_or_else(|e| panic!("{}: invalid training graph: {e}", path.display()));
        let text = format!(
            "forward nodes: {}, backward nodes: {}\nparams: {:?}\n\n{}",
            train.forward_nodes,
            train.backward_nodes,
            train.params,
            print_model(&train.model, &PrintOptions::default())
        );
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(root().join(&fam).join("snapshots"));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.bind(|| insta::assert_snapshot!(case.as_str(), text));
    }
}

fn sum_f32(t: &TractTensor) -> f64 {
    let c = t.cast_to::<f32>().unwrap();
    c.to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .sum()
}

/// Largest relative L2 error measured over the rule fixtures (h = 1e-2,
/// f32 in tract): 2.20e-4 (activations/prelu, input x, whose gradient
/// entries are small), 1.84e-4 (nn/batch_norm, the variance: the difference's
/// own truncation error, h²·f'''/6, is largest on `(v + ε)^-½` at v ≈ 0.5),
/// then 1.05e-4 (activations/hard_sigmoid_swish_leaky, input x, whose
/// gradients are small) and 5.3e-5 (nn/layer_norm, input x); the bound is
/// about 3x.
const BOUND: f64 = 6e-4;

/// Largest measured over the losses: 2.3e-4 (l1, whose kink at 0 the
/// central difference straddles least well); the bound is about 3x.
const LOSS_BOUND: f64 = 7e-4;

#[test]
fn rules_match_finite_differences() {
    let mut failures = Vec::new();
    let mut worst = 0f64;
    for (fam, case, path) in fixtures() {
        if case == "dropout" {
            // tract runs Dropout in inference only: checked with its mask
            // fixed by `dropout_train_reads_the_forward_mask`.
            continue;
        }
        let model = parse_model(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let train = build_training_graph(&model, &opts(&case)).unwrap();
        let inputs = graphopt::tract::sample_inputs(&model, &[], 1, 7).unwrap();
        // The loss is the forward output's sum.
        let fwd = graphopt::tract::run_bytes(&graphopt::tract::prepare(&model).unwrap(), &inputs)
            .unwrap_or_else(|e| panic!("{fam}/{case}: forward: {e}"));
        let names: Vec<String> = train.params.iter().chain(&train.inputs).cloned().collect();
        let (loss, checks) = graphopt::grad_check(&train.model, &names, &inputs, 1e-2, 64)
            .unwrap_or_else(|e| panic!("{fam}/{case}: {e}"));
        let want = sum_f32(&fwd[0]);
        assert!(
            (loss - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{fam}/{case}: loss {loss} != sum of output {want}"
        );
        for c in checks {
            eprintln!(
                "{fam}/{case}: {}: rel_l2 {:.2e} max_abs {:.2e} ({} elements)",
                c.name, c.rel_l2, c.max_abs, c.elements
            );
            worst = worst.max(c.rel_l2);
            if c.rel_l2 > BOUND || !c.rel_l2.is_finite() {
                failures.push(format!("{fam}/{case}: {} rel_l2 {:.3e}", c.name, c.rel_l2));
            }
        }
    }
    eprintln!("worst rel_l2 {worst:.3e}");
    assert!(
        failures.is_empty(),
        "gradients off:\n{}",
        failures.join("\n")
    );
}

/// Every loss against finite differences on one small classifier.
#[test]
fn losses_match_finite_differences() {
    let path = root().join("activations/softmax.onnxtxt");
    let model = parse_model(&std::fs::read_to_string(path).unwrap()).unwrap();
    for loss in [
        Loss::Sum,
        Loss::Mean,
        Loss::Mse,
        Loss::L1,
        Loss::CrossEntropy,
    ] {
        let train = build_training_graph(
            &model,
            &GradOptions {
                loss,
                ..GradOptions::default()
            },
        )
        .unwrap();
        let mut inputs = graphopt::tract::sample_inputs(&model, &[], 1, 3).unwrap();
        match loss {
            Loss::Mse | Loss::L1 => {
                let t: Vec<f32> = (0..8).map(|i| (i as f32 * 0.37).sin()).collect();
                inputs.push(TractTensor::from_shape(&[2, 4], &t).unwrap());
            }
            Loss::CrossEntropy => {
                inputs.push(TractTensor::from_shape(&[2], &[3i64, 1]).unwrap());
            }
            _ => {}
        }
        loss_grads_match(&format!("{loss:?}"), &train, &inputs);
    }
}

/// The training graph's gradients against central differences, each
/// within [`LOSS_BOUND`], with a finite loss; returns the loss.
fn loss_grads_match(
    label: &str,
    train: &graphopt::autodiff::TrainingGraph,
    inputs: &[TractTensor],
) -> f64 {
    let (l, checks) = graphopt::grad_check(&train.model, &train.params, inputs, 1e-2, 64).unwrap();
    assert!(l.is_finite(), "{label}: loss {l}");
    assert!(!checks.is_empty(), "{label}: nothing checked");
    for c in checks {
        eprintln!("{label}: {}: rel_l2 {:.2e}", c.name, c.rel_l2);
        assert!(
            c.rel_l2 <= LOSS_BOUND,
            "{label}: {} rel_l2 {:.3e}",
            c.name,
            c.rel_l2
        );
    }
    l
}

#[test]
fn no_rule_is_an_error_naming_op_and_node() {
    let src = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y)
  <float[2,3] w = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6}> {
  h = Mul (x, w)
  y = Celu <alpha = 1.0> (h)
}"#;
    let model = parse_model(src).unwrap();
    let err = build_training_graph(&model, &GradOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("Celu") && msg.contains("'y'"), "{msg}");
    // Frozen, the weight needs no gradient and Celu is not on a path.
    let frozen = GradOptions {
        frozen: vec!["w".into()],
        ..GradOptions::default()
    };
    let t = build_training_graph(&model, &frozen).unwrap();
    assert!(t.params.is_empty());
}

/// The backward pass keeps only what the rules need: Relu and Sigmoid read
/// their outputs, Reshape only a (static) shape, Mul its operands.
#[test]
fn saved_for_backward_is_minimal() {
    let src = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[2,6] x) => (float[3,4] y)
  <float[2,6] w = {0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8, 0.9, -1.0, 1.1, -1.2}, int64[2] shp = {3, 4}> {
  m = Mul (x, w)
  h = Relu (m)
  r = Reshape (h, shp)
  e = Exp (r)
  y = Sigmoid (e)
}"#;
    let saved_of = |recompute_pointwise: bool| {
        let mut s = graphopt::Session::from_model(parse_model(src).unwrap());
        let r = s
            .grad(&graphopt::GradOptions {
                recompute_pointwise,
                ..graphopt::GradOptions::default()
            })
            .unwrap();
        let mut saved: Vec<String> = r.saved.iter().map(|v| v.name.clone()).collect();
        saved.sort();
        (saved, r)
    };
    // What the rules read: x for Mul's weight gradient; h (Relu's output),
    // e (Exp's output) and y (Sigmoid's output); not m, r.
    let (saved, r) = saved_of(false);
    assert_eq!(saved, ["e", "h", "x", "y"], "{:?}", r.saved);
    assert_eq!(r.saved_activation_bytes, 3 * 48);
    assert_eq!(r.saved_input_bytes, 48);
    assert_eq!(r.recomputed_pointwise, 0);
    // By default the elementwise values that come from kept ones are
    // recomputed: h = Relu(Mul(x, w)) from x, y = Sigmoid(e) from e.
    let (saved, r) = saved_of(true);
    assert_eq!(saved, ["e", "x"], "{:?}", r.saved);
    assert_eq!(r.saved_activation_bytes, 48);
    assert_eq!(r.recomputed_pointwise, 3, "Mul, Relu and Sigmoid");
}

/// `--optimizer sgd`: `<param>_new = param - lr·(grad + wd·param)`.
#[test]
fn sgd_updates_parameters() {
    let path = root().join("matmul/gemm_trans.onnxtxt");
    let model = parse_model(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (lr, wd) = (0.1f32, 0.01f32);
    let train = build_training_graph(
        &model,
        &GradOptions {
            optimizer: graphopt::Optimizer::Sgd {
                lr,
                weight_decay: wd,
            },
            ..GradOptions::default()
        },
    )
    .unwrap();
    let g = &train.model.graph;
    let inputs = graphopt::tract::sample_inputs(&model, &[], 1, 5).unwrap();
    let outs =
        graphopt::tract::run_bytes(&graphopt::tract::prepare(&train.model).unwrap(), &inputs)
            .unwrap();
    let vals = |t: &TractTensor| -> Vec<f32> {
        t.cast_to::<f32>()
            .unwrap()
            .to_plain_array_view::<f32>()
            .unwrap()
            .iter()
            .copied()
            .collect()
    };
    let n = train.params.len();
    assert_eq!(g.outputs.len(), 1 + 2 * n);
    for (k, p) in train.params.iter().enumerate() {
        assert_eq!(g.name(g.outputs[1 + n + k]), format!("{p}_new"));
        let w: Vec<f32> = g
            .initializer(g.value_by_name(p).unwrap())
            .unwrap()
            .to_f64_vec()
            .unwrap()
            .iter()
            .map(|&v| v as f32)
            .collect();
        let (grad, new) = (vals(&outs[1 + k]), vals(&outs[1 + n + k]));
        for i in 0..w.len() {
            let want = w[i] - lr * (grad[i] + wd * w[i]);
            assert!(
                (new[i] - want).abs() <= 1e-6,
                "{p}[{i}]: {} != {want}",
                new[i]
            );
        }
    }
}

/// A seeded generator for the random-shape checks (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(2685821657736338717)
    }
    /// In `lo..=hi`.
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
    fn float(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn dims(&mut self, rank: usize) -> Vec<i64> {
        (0..rank).map(|_| self.int(1, 4)).collect()
    }
    /// `dims` with some axes set to 1 and leading axes dropped: a shape
    /// that broadcasts to `dims`.
    fn broadcastable(&mut self, dims: &[i64]) -> Vec<i64> {
        let drop = self.int(0, dims.len() as i64 - 1) as usize;
        dims[drop..]
            .iter()
            .map(|&d| if self.int(0, 2) == 0 { 1 } else { d })
            .collect()
    }
}

fn shape_text(dims: &[i64]) -> String {
    dims.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A double initializer with values in `lo..hi`.
fn dinit(rng: &mut Rng, name: &str, dims: &[i64], lo: f64, hi: f64) -> String {
    let n: i64 = dims.iter().product();
    let vals: Vec<String> = (0..n)
        .map(|_| format!("{:.6}", rng.float(lo, hi)))
        .collect();
    format!(
        "double[{}] {name} = {{{}}}",
        shape_text(dims),
        vals.join(", ")
    )
}

/// One random model: `(description, ONNX text)`; every weight and the
/// input `x` are double.
fn random_case(rng: &mut Rng, kind: usize) -> (String, String) {
    let rank = rng.int(1, 4) as usize;
    let xd = rng.dims(rank);
    let mut inits = Vec::new();
    let mut body = Vec::new();
    let mut yd = xd.clone();
    let desc;
    match kind {
        // Unary ops on h = x·w (w broadcast), times h.
        0 => {
            // (tract has no double Erf, Sigmoid, LeakyRelu or tanh Gelu, so
            // not those nor Gelu and Softplus here: the f32 fixtures check
            // them.)
            let ops = [
                "Exp",
                "Tanh",
                "Elu",
                "Relu",
                "PRelu",
                "Sqrt",
                "Log",
                "Reciprocal",
                "Neg",
                "HardSwish",
            ];
            let op = ops[rng.int(0, ops.len() as i64 - 1) as usize];
            let wd = rng.broadcastable(&xd);
            inits.push(dinit(rng, "w", &wd, -1.5, 1.5));
            body.push("h = Mul (x, w)".to_string());
            let arg = if matches!(op, "Sqrt" | "Log" | "Reciprocal") {
                inits.push("double one = {1.0}".into());
                body.push("h2 = Mul (h, h)".into());
                body.push("hp = Add (h2, one)".into());
                "hp"
            } else {
                "h"
            };
            let call = match op {
                "PRelu" => {
                    let sd = rng.broadcastable(&xd);
                    inits.push(dinit(rng, "slope", &sd, 0.1, 0.5));
                    format!("a = PRelu ({arg}, slope)")
                }
                _ => format!("a = {op} ({arg})"),
            };
            body.push(call);
            body.push("y = Mul (a, h)".into());
            desc = format!("{op} x{xd:?} w{wd:?}");
        }
        // Binary broadcasting ops.
        1 => {
            let ops = ["Add", "Sub", "Mul", "Div", "Pow"];
            let op = ops[rng.int(0, ops.len() as i64 - 1) as usize];
            let wd = rng.broadcastable(&xd);
            let (lo, hi) = if matches!(op, "Div" | "Pow") {
                (0.5, 1.5)
            } else {
                (-1.5, 1.5)
            };
            inits.push(dinit(rng, "w", &wd, lo, hi));
            inits.push("double two = {2.0}".into());
            body.push("x2 = Mul (x, x)".into());
            body.push("xp = Add (x2, two)".into());
            let a = if matches!(op, "Pow") { "xp" } else { "x" };
            body.push(format!("h = {op} ({a}, w)"));
            body.push(format!("g = {op} (w, xp)"));
            body.push("p = Mul (h, h)".into());
            body.push("y = Add (p, g)".into());
            desc = format!("{op} x{xd:?} w{wd:?}");
        }
        // MatMul with broadcast batch dims.
        2 => {
            let (m, k, n) = (rng.int(1, 4), rng.int(1, 4), rng.int(1, 4));
            let nb = rng.int(0, 2) as usize;
            let batch = rng.dims(nb);
            let mut xdd = batch.clone();
            xdd.extend([m, k]);
            let wb = if batch.is_empty() {
                vec![]
            } else {
                rng.broadcastable(&batch)
            };
            let mut wd = wb;
            wd.extend([k, n]);
            inits.push(dinit(rng, "w", &wd, -1.0, 1.0));
            body.push("h = MatMul (x, w)".into());
            body.push("y = Mul (h, h)".into());
            yd = batch.clone();
            yd.extend([m, n]);
            desc = format!("MatMul x{xdd:?} w{wd:?}");
            return (desc, model_text(&xdd, &yd, &inits, &body));
        }
        // Softmax / LogSoftmax on a random axis.
        3 => {
            let op = if rng.int(0, 1) == 0 {
                "Softmax"
            } else {
                "LogSoftmax"
            };
            let axis = rng.int(-(rank as i64), rank as i64 - 1);
            inits.push(dinit(rng, "w", &xd, -1.5, 1.5));
            inits.push(dinit(rng, "k", &xd, -1.0, 1.0));
            body.push("h = Mul (x, w)".into());
            body.push(format!("s = {op} <axis = {axis}> (h)"));
            body.push("y = Mul (s, k)".into());
            desc = format!("{op} axis {axis} x{xd:?}");
        }
        // Reductions over random axes.
        4 => {
            let ops = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"];
            let op = ops[rng.int(0, 3) as usize];
            let mut axes: Vec<i64> = (0..rank as i64).filter(|_| rng.int(0, 1) == 1).collect();
            if axes.is_empty() {
                axes.push(0);
            }
            let keep = rng.int(0, 1);
            inits.push(dinit(rng, "w", &xd, -1.5, 1.5));
            inits.push(format!(
                "int64[{}] ax = {{{}}}",
                axes.len(),
                axes.iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            body.push("h = Mul (x, w)".into());
            body.push(format!("r = {op} <keepdims = {keep}> (h, ax)"));
            body.push("y = Mul (r, r)".into());
            yd = (0..rank)
                .filter_map(|i| {
                    if axes.contains(&(i as i64)) {
                        (keep == 1).then_some(1)
                    } else {
                        Some(xd[i])
                    }
                })
                .collect();
            desc = format!("{op} axes {axes:?} keepdims {keep} x{xd:?}");
        }
        // CumSum on a random axis.
        5 => {
            let axis = rng.int(0, rank as i64 - 1);
            let (ex, rev) = (rng.int(0, 1), rng.int(0, 1));
            inits.push(dinit(rng, "w", &xd, -1.5, 1.5));
            inits.push(format!("int64 ax = {{{axis}}}"));
            body.push("h = Mul (x, w)".into());
            body.push(format!(
                "c = CumSum <exclusive = {ex}, reverse = {rev}> (h, ax)"
            ));
            body.push("y = Mul (c, c)".into());
            desc = format!("CumSum axis {axis} exclusive {ex} reverse {rev} x{xd:?}");
        }
        // Einsum: a batched contraction.
        _ => {
            let (b, i, j, k) = (rng.int(1, 3), rng.int(1, 4), rng.int(1, 4), rng.int(1, 4));
            let xdd = vec![b, i, j];
            inits.push(dinit(rng, "w", &[b, j, k], -1.0, 1.0));
            body.push("h = Einsum <equation = \"bij,bjk->bik\"> (x, w)".into());
            body.push("y = Mul (h, h)".into());
            desc = format!("Einsum bij,bjk x{xdd:?} k {k}");
            return (desc, model_text(&xdd, &[b, i, k], &inits, &body));
        }
    }
    (desc, model_text(&xd, &yd, &inits, &body))
}

fn model_text(xd: &[i64], yd: &[i64], inits: &[String], body: &[String]) -> String {
    format!(
        "<ir_version: 9, opset_import: [\"\" : 20]>\ng (double[{}] x) => (double[{}] y)\n  <{}> {{\n  {}\n}}\n",
        shape_text(xd),
        shape_text(yd),
        inits.join(", "),
        body.join("\n  ")
    )
}

/// Largest relative L2 error of the double-precision checks (h = 1e-6, 8
/// cases of each of 7 kinds of random models, seeded), measured: 1.9e-9
/// (LogSoftmax, a weight); the bound is about 3x. (LayerNormalization is not
/// among them: tract computes its statistics in float even for double
/// inputs, which leaves float noise in a double check; the f32 fixture and
/// the torch comparison cover it.)
const F64_BOUND: f64 = 6e-9;

/// `torch.autograd.gradcheck` style: every weight's and the input's
/// gradient against central differences in double, on random small shapes
/// (broadcast weights, random axes, random batch dims), run in tract.
#[test]
fn rules_gradcheck_f64_random_shapes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut worst = (0f64, String::new());
    let mut failures = Vec::new();
    for round in 0..8 {
        for kind in 0..7 {
            let (desc, text) = random_case(&mut rng, kind);
            let model = parse_model(&text).unwrap_or_else(|e| panic!("{desc}: {e}\n{text}"));
            let train = build_training_graph(
                &model,
                &GradOptions {
                    input_grads: true,
                    trainable: vec!["w".into(), "slope".into(), "scale".into(), "bias".into()],
                    ..GradOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("{desc}: {e}"));
            let inputs =
                graphopt::tract::sample_inputs(&model, &[], 1, round * 7 + kind as u64).unwrap();
            let names: Vec<String> = train.params.iter().chain(&train.inputs).cloned().collect();
            let (_, checks) = graphopt::grad_check(&train.model, &names, &inputs, 1e-6, 16)
                .unwrap_or_else(|e| panic!("{desc}: {e}\n{text}"));
            for c in checks {
                if c.rel_l2 > worst.0 {
                    worst = (c.rel_l2, format!("{desc}: {}", c.name));
                }
                if c.rel_l2 > F64_BOUND || !c.rel_l2.is_finite() {
                    failures.push(format!("{desc}: {} rel_l2 {:.3e}", c.name, c.rel_l2));
                }
            }
        }
    }
    eprintln!("worst f64 rel_l2 {:.3e} ({})", worst.0, worst.1);
    assert!(
        failures.is_empty(),
        "gradients off:\n{}",
        failures.join("\n")
    );
}

/// Replaces every Dropout of `m` (in training mode) by its training-mode
/// definition with a fixed mask: `mask` an initializer, `y = x · mask /
/// (1 - ratio)`, so that tract (which runs Dropout in inference only) runs
/// the training graph deterministically. Returns the masks, in node order.
fn fix_dropout_masks(m: &mut graphopt::ir::Model) -> Vec<Vec<bool>> {
    use graphopt::ir::{DType, NewNode, Tensor};
    let g = &mut m.graph;
    let drops: Vec<_> = g
        .nodes()
        .filter(|&n| g.node(n).op_type == "Dropout")
        .collect();
    let mut masks = Vec::new();
    for (k, n) in drops.into_iter().enumerate() {
        let node = g.node(n).clone();
        let (x, y, mask) = (
            node.input(0).unwrap(),
            node.output(0).unwrap(),
            node.output(1).expect("the builder adds the mask"),
        );
        let ratio = node
            .input(1)
            .map(|r| g.initializer(r).unwrap().to_f64_vec().unwrap()[0])
            .unwrap_or(0.5);
        let dims: Vec<i64> = g
            .ty(x)
            .and_then(|t| t.shape())
            .unwrap()
            .dims
            .iter()
            .map(|d| d.known().unwrap())
            .collect();
        let n_el: i64 = dims.iter().product();
        // Both kept and dropped entries, differently per node.
        let bits: Vec<bool> = (0..n_el).map(|i| (i * 5 + 3 * k as i64) % 3 != 0).collect();
        let raw: Vec<u8> = bits.iter().map(|&b| b as u8).collect();
        let pos = g.position(n).unwrap();
        g.remove_node(n);
        g.set_initializer(
            mask,
            Tensor::from_raw(DType::Bool, dims, raw.into()).unwrap(),
        );
        let scale = g.add_initializer(
            "fixed_scale",
            Tensor::from_f32(vec![], &[(1.0 / (1.0 - ratio)) as f32]).unwrap(),
        );
        let c = g.fresh_value("fixed_mask_f", None);
        let p = g.fresh_value("fixed_kept", None);
        let mut cast = NewNode::new("Cast").inputs(&[mask]).outputs(&[c]);
        cast.attributes = vec![graphopt::ir::Attribute::new(
            "to",
            graphopt::ir::AttrValue::Int(1),
        )];
        g.insert_node(pos, cast).unwrap();
        g.insert_node(pos + 1, NewNode::new("Mul").inputs(&[x, c]).outputs(&[p]))
            .unwrap();
        g.insert_node(
            pos + 2,
            NewNode::new("Mul").inputs(&[p, scale]).outputs(&[y]),
        )
        .unwrap();
        masks.push(bits);
    }
    masks
}

/// `dropout_train` on `nn/dropout` (a Dropout with ratio 0.5 and its mask
/// output, then one with neither): both run in training mode (training_mode
/// a constant true, the second given a mask output), the backward reads the
/// masks, and with the masks fixed (tract runs Dropout in inference only)
/// the gradients are `dy · mask / (1 - ratio)` through both (computed here
/// by hand, within 1e-6) and match central differences.
#[test]
fn dropout_train_reads_the_forward_mask() {
    let path = root().join("nn/dropout.onnxtxt");
    let model = parse_model(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut train = build_training_graph(&model, &opts("dropout")).unwrap();
    assert_eq!(train.dropout_train, ["d", "e"]);
    let g = &train.model.graph;
    for n in g.nodes().filter(|&n| g.node(n).op_type == "Dropout") {
        let node = g.node(n);
        let tm = node.input(2).expect("training_mode");
        assert_eq!(g.initializer(tm).unwrap().to_i64_vec().unwrap(), [1]);
        let mask = node.output(1).expect("mask output");
        assert!(
            g.uses(mask)
                .iter()
                .any(|u| g.node(u.node()).name.starts_with("grad/")),
            "the backward does not read the mask of {}",
            node.name
        );
    }
    // Without the option, the same Dropouts are the identity.
    let plain = build_training_graph(&model, &GradOptions::default()).unwrap();
    assert!(plain.dropout_train.is_empty());
    let pg = &plain.model.graph;
    assert!(pg
        .nodes()
        .filter(|&n| pg.node(n).op_type == "Dropout")
        .all(|n| pg.node(n).input(2).is_none()));

    let masks = fix_dropout_masks(&mut train.model);
    let inputs = graphopt::tract::sample_inputs(&model, &[], 1, 5).unwrap();
    let names: Vec<String> = train.params.iter().chain(&train.inputs).cloned().collect();
    assert_eq!(names, ["w", "k", "x"]);
    let (_, checks) = graphopt::grad_check(&train.model, &names, &inputs, 1e-2, 64).unwrap();
    for c in &checks {
        eprintln!("dropout: {}: rel_l2 {:.2e}", c.name, c.rel_l2);
        assert!(c.rel_l2 <= BOUND, "{}: rel_l2 {:.3e}", c.name, c.rel_l2);
    }
    // By hand: h = x·w, d = 2·h·m1, t = tanh d, e = 2·t·m2, y = e·k.
    let f = |t: &TractTensor| graphopt::tensor_f64s(t).unwrap();
    let init = |n: &str| {
        let g = &model.graph;
        g.initializer(g.value_by_name(n).unwrap())
            .unwrap()
            .to_f64_vec()
            .unwrap()
    };
    let (x, w, k) = (f(&inputs[0]), init("w"), init("k"));
    let (m1, m2) = (&masks[0], &masks[1]);
    let mut dh = [0.0; 8];
    for i in 0..2 {
        for j in 0..4 {
            let h: f64 = (0..8).map(|l| x[i * 8 + l] * w[l * 4 + j]).sum();
            let q = i * 4 + j;
            let d = if m1[q] { 2.0 * h } else { 0.0 };
            let dt = if m2[q] { 2.0 * k[q] } else { 0.0 };
            let dd = dt * (1.0 - d.tanh().powi(2));
            dh[q] = if m1[q] { 2.0 * dd } else { 0.0 };
        }
    }
    let mut dw = vec![0.0; 32];
    let mut dx = vec![0.0; 16];
    for i in 0..2 {
        for l in 0..8 {
            for j in 0..4 {
                dw[l * 4 + j] += x[i * 8 + l] * dh[i * 4 + j];
                dx[i * 8 + l] += dh[i * 4 + j] * w[l * 4 + j];
            }
        }
    }
    let outs =
        graphopt::tract::run_bytes(&graphopt::tract::prepare(&train.model).unwrap(), &inputs)
            .unwrap();
    let g = &train.model.graph;
    let out = |name: &str| {
        let i = g.outputs.iter().position(|&o| g.name(o) == name).unwrap();
        f(&outs[i])
    };
    for (name, want) in [("w_grad", dw), ("x_grad", dx)] {
        let got = out(name);
        let num: f64 = got.iter().zip(&want).map(|(a, b)| (a - b).powi(2)).sum();
        let den: f64 = want.iter().map(|b| b * b).sum();
        let e = (num / den).sqrt();
        eprintln!("dropout: {name} by hand: rel_l2 {e:.2e}");
        assert!(e <= 1e-6, "{name}: rel_l2 {e:.3e} against dy·mask/(1-p)");
    }
}

/// The shape numpy broadcasting gives `a` and `b`.
fn broadcast(a: &[i64], b: &[i64]) -> Vec<i64> {
    let r = a.len().max(b.len());
    let at = |d: &[i64], i: usize| {
        let lead = r - d.len();
        if i < lead {
            1
        } else {
            d[i - lead]
        }
    };
    (0..r).map(|i| at(a, i).max(at(b, i))).collect()
}

/// The sum and mean losses seed a uniform gradient (a scalar broadcast,
/// never materialized where the reader can use the scalar): MatMul's rule
/// then sums rows and columns instead of multiplying by ones, and Add,
/// Sub, Neg, Reshape, Transpose and Expand pass it on scaled by their
/// broadcast. In double against central differences, on random batch
/// broadcasts of both MatMul operands (either may lack or repeat batch
/// axes, which takes the general products).
#[test]
fn uniform_seed_rules_gradcheck_f64_random_shapes() {
    let mut rng = Rng(0x5eed_0fa5);
    let mut failures = Vec::new();
    let mut worst = (0f64, String::new());
    for round in 0..16u64 {
        let (m, k, n) = (rng.int(1, 4), rng.int(1, 4), rng.int(1, 4));
        let nb = rng.int(0, 2) as usize;
        let batch = rng.dims(nb);
        let side = |rng: &mut Rng| {
            if batch.is_empty() || rng.int(0, 2) == 0 {
                batch.clone()
            } else {
                rng.broadcastable(&batch)
            }
        };
        let (xb, wb) = (side(&mut rng), side(&mut rng));
        let mut xd = xb.clone();
        xd.extend([m, k]);
        let mut wd = wb.clone();
        wd.extend([k, n]);
        let mut hd = broadcast(&xb, &wb);
        hd.extend([m, n]);
        let mut inits = vec![dinit(&mut rng, "w", &wd, -1.0, 1.0)];
        let mut body = vec!["h = MatMul (x, w)".to_string()];
        let tail = round % 5;
        let yd = match tail {
            0 => {
                body.push("y = Identity (h)".into());
                hd.clone()
            }
            1 => {
                let bd = rng.broadcastable(&hd);
                inits.push(dinit(&mut rng, "bias", &bd, -1.0, 1.0));
                body.push("y = Add (h, bias)".into());
                hd.clone()
            }
            2 => {
                let bd = rng.broadcastable(&hd);
                inits.push(dinit(&mut rng, "bias", &bd, -1.0, 1.0));
                body.push("s = Sub (bias, h)".into());
                body.push("y = Neg (s)".into());
                hd.clone()
            }
            3 => {
                let r = hd.len();
                let mut perm: Vec<i64> = (0..r as i64).collect();
                perm.swap(r - 2, r - 1);
                let p = perm.iter().map(|v| v.to_string()).collect::<Vec<_>>();
                body.push(format!("t = Transpose <perm = [{}]> (h)", p.join(", ")));
                inits.push("int64[1] flat = {-1}".into());
                body.push("y = Reshape (t, flat)".into());
                vec![hd.iter().product()]
            }
            _ => {
                let mut ed = vec![2];
                ed.extend(&hd);
                inits.push(format!(
                    "int64[{}] big = {{{}}}",
                    ed.len(),
                    ed.iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                body.push("y = Expand (h, big)".into());
                ed
            }
        };
        let loss = if round % 2 == 0 {
            Loss::Sum
        } else {
            Loss::Mean
        };
        let desc = format!("{loss:?} MatMul x{xd:?} w{wd:?} tail {tail}");
        let text = model_text(&xd, &yd, &inits, &body);
        let model = parse_model(&text).unwrap_or_else(|e| panic!("{desc}: {e}\n{text}"));
        let train = build_training_graph(
            &model,
            &GradOptions {
                loss,
                input_grads: true,
                trainable: vec!["w".into(), "bias".into()],
                ..GradOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{desc}: {e}"));
        let inputs = graphopt::tract::sample_inputs(&model, &[], 1, round).unwrap();
        let names: Vec<String> = train.params.iter().chain(&train.inputs).cloned().collect();
        let (_, checks) = graphopt::grad_check(&train.model, &names, &inputs, 1e-6, 16)
            .unwrap_or_else(|e| panic!("{desc}: {e}\n{text}"));
        for c in checks {
            if c.rel_l2 > worst.0 {
                worst = (c.rel_l2, format!("{desc}: {}", c.name));
            }
            // Where the gradient nearly cancels (a row sum of w close to
            // 0) the relative error is the difference quotient's roundoff,
            // eps·|loss|/h ≈ 1e-10 absolute: off means both bounds broken.
            if (c.rel_l2 > F64_BOUND && c.max_abs > 1e-9) || !c.rel_l2.is_finite() {
                failures.push(format!(
                    "{desc}: {} rel_l2 {:.3e} max_abs {:.3e}",
                    c.name, c.rel_l2, c.max_abs
                ));
            }
        }
    }
    eprintln!("worst f64 rel_l2 {:.3e} ({})", worst.0, worst.1);
    assert!(
        failures.is_empty(),
        "gradients off:\n{}",
        failures.join("\n")
    );
}

/// Cross-entropy on a rank-3 output, classes on the middle axis (as
/// `torch.nn.CrossEntropyLoss` takes `[N, C, L]`) and on the last, in f32
/// and f64, against central differences: the loss is written as
/// `logsumexp(y) - y[target]` and its gradient as the softmax less one at
/// the targets, along whichever axis holds the classes.
#[test]
fn cross_entropy_on_any_class_axis_matches_finite_differences() {
    for ty in ["float", "double"] {
        let w: Vec<String> = (0..12)
            .map(|i| format!("{:.3}", ((i as f64) * 0.7).sin()))
            .collect();
        let src = format!(
            r#"<ir_version: 8, opset_import: ["" : 17]>
g ({ty}[2,3,4] x) => ({ty}[2,3,4] y)
  <{ty}[3,4] w = {{{}}}> {{
  h = Mul (x, w)
  y = Tanh (h)
}}"#,
            w.join(", ")
        );
        let model = parse_model(&src).unwrap();
        for (axis, target) in [
            (1i64, vec![2i64, 0, 1, 2, 1, 1, 0, 2]),
            (-1, vec![3, 0, 1, 2, 3, 1]),
        ] {
            let train = build_training_graph(
                &model,
                &GradOptions {
                    loss: Loss::CrossEntropy,
                    class_axis: axis,
                    ..GradOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("{ty} axis {axis}: {e}"));
            let mut inputs = graphopt::tract::sample_inputs(&model, &[], 1, 3).unwrap();
            let tshape: &[usize] = if axis == 1 { &[2, 4] } else { &[2, 3] };
            inputs.push(TractTensor::from_shape(tshape, &target).unwrap());
            let label = format!("{ty} axis {axis}");
            let l = loss_grads_match(&label, &train, &inputs);
            assert!(l > 0.0, "{label}: loss {l}");
        }
    }
}
