//! `prune` on the real models of `testdata/models`, checked in tract.
//!
//! Removing a group's units is the same function as the unpruned model
//! with those units' *consumer* weights zeroed (the input channels of the
//! next Conv, the rows of the next MatMul): nothing else reads them. So
//! each pruned model must give, to float rounding, the outputs of the
//! unpruned model masked that way, which the test builds independently
//! from the pass's decision. This catches a weight sliced on the wrong
//! axis or at the wrong offset, a Reshape constant not rewritten, a
//! depthwise group not updated. It also asserts that pruning fired where
//! it must (the groups and heads each model has) and that parameters fell.

use graphopt_ir::{DType, Graph, Model, Tensor, Use};
use graphopt_passes::prune::{Amount, Criterion, Prune};
use graphopt_tract::compare::{compare_outputs, Tolerance};
use graphopt_tract::TractTensor;
use std::path::PathBuf;

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/models")
}

fn run(m: &Model, inputs: &[TractTensor]) -> Vec<TractTensor> {
    let bytes = graphopt_tract::prepare(m).unwrap();
    graphopt_tract::run_bytes(&bytes, inputs).unwrap()
}

/// Whether `g` reads weight `w` along `axis` as its input side.
fn consumer_axis(g: &Graph, w: graphopt_ir::ValueId, axis: usize) -> bool {
    let rank = g.initializer(w).map(|t| t.dims.len()).unwrap_or(0);
    g.uses(w).iter().all(|u| {
        let Use::Input { node, slot: 1 } = *u else {
            return false;
        };
        let d = g.node(node);
        match d.op_type.as_str() {
            "Conv" => d.attr_int("group").unwrap_or(1) == 1 && axis == 1,
            "ConvTranspose" => axis == 0,
            "MatMul" => axis + 2 == rank,
            "Gemm" => axis == usize::from(d.attr_int("transB").unwrap_or(0) != 0),
            _ => false,
        }
    })
}

/// `t` with positions `pos` on `axis` set to zero (f32).
fn zeroed(t: &Tensor, axis: usize, pos: &[usize]) -> Tensor {
    assert_eq!(t.dtype, DType::F32);
    let mut v: Vec<f32> = t.to_f64_vec().unwrap().iter().map(|&x| x as f32).collect();
    let d: Vec<usize> = t.dims.iter().map(|&x| x as usize).collect();
    let len = d[axis];
    let inner: usize = d[axis + 1..].iter().product();
    let outer: usize = d[..axis].iter().product();
    for o in 0..outer {
        for &p in pos {
            let b = (o * len + p) * inner;
            v[b..b + inner].iter_mut().for_each(|x| *x = 0.0);
        }
    }
    Tensor::from_f32(t.dims.clone(), &v).unwrap()
}

struct Expect {
    model: &'static str,
    /// At least this many groups pruned, with at least this many of heads.
    groups: usize,
    heads: usize,
}

const EXPECT: &[Expect] = &[
    Expect {
        model: "resnet_tiny.ts9",
        groups: 8,
        heads: 0,
    },
    Expect {
        model: "resnet_tiny.ts14",
        groups: 8,
        heads: 0,
    },
    Expect {
        model: "resnet_tiny.dynamo18",
        groups: 8,
        heads: 0,
    },
    Expect {
        model: "mobilenet_v3_small.ts11",
        groups: 26,
        heads: 0,
    },
    Expect {
        model: "mobilenet_v3_small.ts14",
        groups: 26,
        heads: 0,
    },
    Expect {
        model: "mobilenet_v3_small.dynamo18",
        groups: 26,
        heads: 0,
    },
    Expect {
        model: "bert_tiny.ts14",
        groups: 4,
        heads: 2,
    },
    Expect {
        model: "t5_encoder_tiny.dynamo18",
        groups: 3,
        heads: 1,
    },
    Expect {
        model: "bert_tiny.dynamo18",
        groups: 4,
        heads: 2,
    },
    Expect {
        model: "gpt2_tiny.ts14",
        groups: 4,
        heads: 2,
    },
    Expect {
        model: "gpt2_tiny.dynamo18",
        groups: 4,
        heads: 2,
    },
];

#[test]
fn pruned_models_equal_their_masked_originals() {
    let mut failures = Vec::new();
    for e in EXPECT {
        let path = models_dir().join(format!("{}.onnx", e.model));
        let loaded = graphopt_onnx::load(&path).unwrap_or_else(|err| panic!("{}: {err}", e.model));
        let mut pass = Prune {
            amount: Amount::Ratio(0.5),
            criterion: Criterion::L1,
            ..Prune
        };
        // A group that a LayerNormalization normalizes over is not the
        // masked model (its statistics change with the channels): those
        // are protected here, and checked in onnxruntime by
        // tests-py/prune_models.py instead.
        let first = pass.decide(&loaded.model).unwrap();
        pass.protect = first
            .groups
            .iter()
            .filter_map(|grp| {
                let g = &first.model.graph;
                let normalized = grp.members.keys().any(|p| {
                    g.uses(p.value).iter().any(|u| {
                        let d = g.node(u.node());
                        d.op_type == "LayerNormalization" && d.input(0) == Some(p.value)
                    })
                });
                normalized.then(|| {
                    let p = grp
                        .members
                        .keys()
                        .find(|p| g.initializer(p.value).is_none())
                        .unwrap();
                    g.name(p.value).to_string()
                })
            })
            .collect();
        let decision = pass.decide(&loaded.model).unwrap();
        let pruned_groups = decision.removed.iter().filter(|r| !r.is_empty()).count();
        let heads = decision
            .groups
            .iter()
            .zip(&decision.removed)
            .filter(|(g, r)| g.block > 1 && !r.is_empty())
            .count();
        if pruned_groups < e.groups || heads < e.heads {
            failures.push(format!(
                "{}: {pruned_groups} groups pruned ({heads} of heads), expected at least {} ({})",
                e.model, e.groups, e.heads
            ));
            continue;
        }
        // The masked original.
        let mut masked = decision.model.clone();
        let mut masked_weights = 0;
        for (grp, rm) in decision.groups.iter().zip(&decision.removed) {
            for p in &grp.weights {
                if !consumer_axis(&masked.graph, p.value, p.axis) {
                    continue;
                }
                let span = grp.members[p];
                let pos: Vec<usize> = rm.iter().flat_map(|&u| span.positions(u)).collect();
                let t = zeroed(masked.graph.initializer(p.value).unwrap(), p.axis, &pos);
                masked.graph.set_initializer(p.value, t);
                masked_weights += 1;
            }
        }
        assert!(
            masked_weights >= pruned_groups,
            "{}: nothing masked",
            e.model
        );
        let mut pruned = loaded.model.clone();
        let report = pass.prune(&mut pruned).unwrap();
        assert!(
            report.params_after < report.params_before,
            "{}: parameters did not fall",
            e.model
        );
        graphopt_ir::verify::verify_model(&pruned).unwrap();
        let inputs = graphopt_tract::sample_inputs(&loaded.model, &[], 2, 11).unwrap();
        let want = run(&masked, &inputs);
        let got = run(&pruned, &inputs);
        let names: Vec<String> = pruned
            .graph
            .outputs
            .iter()
            .map(|&v| pruned.graph.name(v).to_string())
            .collect();
        for d in compare_outputs(&names, &want, &got, &Tolerance::default()) {
            if let Some(err) = &d.error {
                failures.push(format!("{}: output {}: {err}", e.model, d.name));
            } else if d.rel_l2.is_nan() || d.rel_l2 > 1e-5 {
                failures.push(format!(
                    "{}: output {} is {:.3e} from the masked original",
                    e.model, d.name, d.rel_l2
                ));
            }
        }
        eprintln!(
            "{}: {pruned_groups} groups ({heads} heads), params {} -> {}",
            e.model, report.params_before, report.params_after
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--global` takes the ratio of all channels: on BERT a head counts its
/// 32 channels, so the channels removed are half of all, to within one
/// unit's width.
#[test]
fn global_ratio_counts_channels_not_units() {
    let path = models_dir().join("bert_tiny.dynamo18.onnx");
    let loaded = graphopt_onnx::load(&path).unwrap();
    let pass = Prune {
        amount: Amount::Ratio(0.5),
        global: true,
        ..Prune
    };
    let d = pass.decide(&loaded.model).unwrap();
    let width = |i: usize| d.groups[i].block;
    let total: usize = (0..d.groups.len())
        .map(|i| d.groups[i].units * width(i))
        .sum();
    let removed: usize = (0..d.groups.len())
        .map(|i| d.removed[i].len() * width(i))
        .sum();
    let widest = (0..d.groups.len()).map(width).max().unwrap();
    assert!(d.groups.iter().any(|g| g.block > 1), "no head group");
    assert!(
        removed <= total / 2 && removed + widest > total / 2,
        "{removed} of {total} channels removed"
    );
}
