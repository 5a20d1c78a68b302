//! What the backward pass holds, planned on real training graphs:
//! 1. the sum and mean losses seed a scalar broadcast, not a tensor of
//!    ones the size of the output: on a language model's logits no
//!    backward value has the logits' shape (MatMul's rule reads the
//!    scalar);
//! 2. MaxPool's gradient holds one input-sized tensor: its zeros, the
//!    ScatterElements that adds the output gradient into them (planned in
//!    place) and the Reshape to the input's shape (a view) share one
//!    buffer;
//! 3. cross-entropy holds the logits' size once: its forward (y - max,
//!    Exp) and its gradient (softmax, the ScatterElements that takes one
//!    off at the targets, the division by the count) all run in place over
//!    the logits' buffer, with no LogSoftmax copy and no one-hot tensor;
//! 4. a weight's gradients copy neither the weight nor the activation
//!    transposed (Gemm's transA/transB read them in place).

use graphopt::plan::{DimValues, PlanOptions};
use graphopt::{AutodiffOptions, GradOptions, Loss, Session};
use std::path::PathBuf;

fn model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models")
        .join(format!("{name}.onnx"))
}

fn grad(name: &str, loss: Loss) -> Session {
    let mut s = graphopt::load(model(name)).unwrap();
    s.grad(&GradOptions {
        autodiff: AutodiffOptions {
            loss,
            ..AutodiffOptions::default()
        },
        ..GradOptions::default()
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    s
}

/// Plans `s` with its inputs' symbolic dims bound in order, cycling
/// through `values` (so `[batch, seq]` and an exporter's `[s72, s70, s43,
/// s53]` get the same numbers).
fn planned(s: &Session, values: &[i64]) -> graphopt::plan::ModelPlan {
    let d: Vec<(String, i64)> = graphopt::plan::input_dim_names(s.model())
        .into_iter()
        .zip(values.iter().cycle())
        .map(|(k, &v)| (k, v))
        .collect();
    graphopt::plan::plan_model(
        s.model(),
        &DimValues::new(&d),
        &PlanOptions {
            search: false,
            ..PlanOptions::default()
        },
    )
    .unwrap()
}

fn known_dims(g: &graphopt::ir::Graph, v: graphopt::ir::ValueId) -> Option<Vec<i64>> {
    g.ty(v)?.shape()?.dims.iter().map(|d| d.known()).collect()
}

#[test]
fn sum_and_mean_seeds_are_not_materialized_at_the_logits_size() {
    for name in ["gpt2_tiny.ts14", "gpt2_tiny.dynamo18"] {
        for loss in [Loss::Sum, Loss::Mean] {
            let s = grad(name, loss);
            let mp = planned(&s, &[3, 5]);
            let g = &mp.model.graph;
            let logits = g.value_by_name("logits").unwrap();
            let ld = known_dims(g, logits).unwrap();
            assert_eq!(ld.iter().product::<i64>(), 3 * 5 * 256, "{name}: {ld:?}");
            let cone = graphopt::autodiff::forward_cone(g);
            let big: Vec<String> = g
                .nodes()
                .filter(|n| !cone.contains(n))
                .flat_map(|n| {
                    g.node(n)
                        .outputs()
                        .iter()
                        .flatten()
                        .copied()
                        .collect::<Vec<_>>()
                })
                .filter(|&v| known_dims(g, v).is_some_and(|d| d == ld))
                .map(|v| format!("{} <- {}", g.name(v), g.producer_node(v).unwrap().op_type))
                .collect();
            assert!(
                big.is_empty(),
                "{name} ({loss:?}): backward values of the logits' shape {ld:?}: {big:?}"
            );
            // What is left of the seed is a scalar, no Expand to the logits.
            let expands = g
                .nodes()
                .filter(|&n| g.node(n).op_type == "Expand")
                .filter(|&n| {
                    let o = g.node(n).output(0).unwrap();
                    known_dims(g, o).is_some_and(|d| d == ld)
                })
                .count();
            assert_eq!(expands, 0, "{name} ({loss:?})");
        }
    }
}

#[test]
fn max_pool_backward_holds_one_input_sized_tensor() {
    for name in ["resnet_tiny.ts14", "resnet_tiny.dynamo18"] {
        let s = grad(name, Loss::Sum);
        let mp = planned(&s, &[16]);
        let (g, plan) = (&mp.model.graph, &mp.plan);
        let pool = g
            .nodes()
            .find(|&n| g.node(n).op_type == "MaxPool")
            .unwrap_or_else(|| panic!("{name}: no MaxPool"));
        let x = g.node(pool).input(0).unwrap();
        let x_numel: i64 = known_dims(g, x).unwrap().iter().product();
        let scatter = g
            .nodes()
            .find(|&n| g.node(n).op_type == "ScatterElements")
            .unwrap_or_else(|| panic!("{name}: no ScatterElements"));
        let sd = g.node(scatter);
        let (zeros, out) = (sd.input(0).unwrap(), sd.output(0).unwrap());
        assert_eq!(
            g.producer_node(zeros).unwrap().op_type,
            "ConstantOfShape",
            "{name}"
        );
        // Every backward tensor of the input's size in the MaxPool's
        // gradient: the zeros, the scatter and the reshape to X's shape.
        let mut trio = vec![zeros, out];
        trio.extend(
            g.uses(out)
                .iter()
                .map(|u| u.node())
                .filter(|&n| g.node(n).op_type == "Reshape")
                .filter_map(|n| g.node(n).output(0)),
        );
        assert_eq!(trio.len(), 3, "{name}: {trio:?}");
        let tensor = |v| {
            plan.tensors
                .iter()
                .find(|t| t.value == v)
                .unwrap_or_else(|| panic!("{name}: '{}' is not planned", g.name(v)))
        };
        for &v in &trio {
            assert_eq!(tensor(v).size, 4 * x_numel as u64, "{name}: {}", g.name(v));
        }
        let offsets: Vec<u64> = trio.iter().map(|&v| tensor(v).offset).collect();
        assert!(
            offsets.iter().all(|&o| o == offsets[0]),
            "{name}: MaxPool's gradient holds {} input-sized buffers: {offsets:?}",
            offsets.len()
        );
        assert!(
            plan.aliases.iter().any(|a| a.op_type == "ScatterElements"
                && plan.tensors[a.input].value == zeros
                && plan.tensors[a.output].value == out),
            "{name}: ScatterElements is not in place over its zeros"
        );
        // At the scatter's step the live bytes hold one input-sized float
        // tensor of the pool's gradient, not three.
        let step = plan.schedule.iter().position(|&n| n == scatter).unwrap();
        let live_input_sized: std::collections::BTreeSet<u64> = plan
            .tensors
            .iter()
            .filter(|t| t.first <= step && step <= t.last && t.size == 4 * x_numel as u64)
            .filter(|t| trio.contains(&t.value))
            .map(|t| t.offset)
            .collect();
        assert_eq!(live_input_sized.len(), 1, "{name}");
    }
}

#[test]
fn cross_entropy_holds_the_logits_once() {
    for name in ["gpt2_tiny.ts14", "gpt2_tiny.dynamo18"] {
        let mut s = graphopt::load(model(name)).unwrap();
        s.grad(&GradOptions {
            autodiff: AutodiffOptions {
                loss: Loss::CrossEntropy,
                class_axis: -1,
                ..AutodiffOptions::default()
            },
            ..GradOptions::default()
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mp = planned(&s, &[3, 5]);
        let (g, plan) = (&mp.model.graph, &mp.plan);
        let logits = g.value_by_name("logits").unwrap();
        let ld = known_dims(g, logits).unwrap();
        // The logits and the loss's values of their shape.
        let mut big = vec![logits];
        big.extend(
            g.nodes()
                .filter(|&n| g.node(n).name.starts_with("grad/loss"))
                .filter_map(|n| g.node(n).output(0))
                .filter(|&v| known_dims(g, v).is_some_and(|d| d == ld)),
        );
        assert!(big.len() >= 5, "{name}: {} logits-sized values", big.len());
        for op in ["LogSoftmax", "OneHot"] {
            assert!(
                g.nodes().all(|n| g.node(n).op_type != op),
                "{name}: the loss has a {op}"
            );
        }
        let most = (0..plan.schedule.len())
            .map(|t| {
                plan.tensors
                    .iter()
                    .filter(|x| big.contains(&x.value) && x.first <= t && t <= x.last)
                    .map(|x| x.offset)
                    .collect::<std::collections::BTreeSet<u64>>()
                    .len()
            })
            .max()
            .unwrap();
        assert_eq!(most, 1, "{name}: logits-sized buffers live at once");
    }
}

/// 4. A weight's gradients read the weight and the activation where they
///    are: `dA = Gemm(dY, W, transB=1)` and `dW = Gemm(A, dY, transA=1)`,
///    with no transposed copy of either (one Transpose per weight and one
///    activation-sized Transpose per product before).
#[test]
fn weight_gradients_transpose_nothing() {
    // gpt2's Conv1D layers export as Gemm (whose rule already used
    // transA/transB); its LM head is a MatMul.
    // (Not the sum loss: its uniform seed takes MatMul's other rule.)
    for (name, least, loss) in [
        ("gpt2_tiny.ts14", 1, Loss::CrossEntropy),
        ("bert_tiny.ts14", 12, Loss::Mse),
    ] {
        let mut s = graphopt::load(model(name)).unwrap();
        let r = s
            .grad(&GradOptions {
                autodiff: AutodiffOptions {
                    loss,
                    class_axis: -1,
                    params_as_inputs: true,
                    ..AutodiffOptions::default()
                },
                ..GradOptions::default()
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let g = &s.model().graph;
        let is_param = |v| r.params.iter().any(|p| p == g.name(v));
        let matmuls: Vec<_> = g
            .nodes()
            .filter(|&n| g.node(n).op_type == "MatMul")
            .filter(|&n| g.node(n).input(1).is_some_and(is_param))
            .collect();
        assert!(
            matmuls.len() >= least,
            "{name}: {} MatMuls with a weight",
            matmuls.len()
        );
        let forward = graphopt::autodiff::forward_cone(g);
        // What a value is a view of, through Reshapes.
        let source = |mut x| {
            while let Some(p) = g.producer_node(x).filter(|p| p.op_type == "Reshape") {
                x = p.input(0).unwrap();
            }
            x
        };
        for &mm in &matmuls {
            let w = g.node(mm).input(1).unwrap();
            let label = &g.node(mm).name;
            let gemm = |n: &graphopt::ir::NodeData, attr: &str| {
                n.op_type == "Gemm" && n.attr_int(attr) == Some(1)
            };
            assert!(
                g.nodes()
                    .any(|n| gemm(g.node(n), "transB") && g.node(n).input(1) == Some(w)),
                "{name}: {label}: no dA Gemm reading the weight"
            );
            assert!(
                g.nodes()
                    .all(|n| g.node(n).op_type != "Transpose" || g.node(n).input(0) != Some(w)),
                "{name}: {label}: weight transposed"
            );
            // dW is a Gemm (transA) whose activation operand is no
            // transposed copy (it may be the activation, a view of it, or
            // its pointwise recomputation).
            let gw = g.value_by_name(&format!("{}_grad", g.name(w))).unwrap();
            let p = g.producer_node(gw).unwrap();
            assert!(gemm(p, "transA"), "{name}: {label}: dW is {}", p.op_type);
            // (The forward pass's own Transposes, such as attention's
            // heads put back in order, are not copies the gradient made.)
            let a = source(p.input(0).unwrap());
            assert!(
                g.producer(a).is_none_or(|(n, _)| {
                    g.node(n).op_type != "Transpose" || forward.contains(&n)
                }),
                "{name}: {label}: dW reads a transposed copy"
            );
        }
    }
}
