use super::*;
use graphopt_text::parse_model;

fn fixture(name: &str) -> Model {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/passes/prune")
        .join(name);
    parse_model(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn with(amount: Amount) -> Prune {
    Prune { amount, ..Prune }
}

#[test]
fn bad_options_are_one_line_errors_and_leave_the_model() {
    let m = fixture("mlp.onnxtxt");
    for (p, want) in [
        (
            with(Amount::Ratio(1.0)),
            "--ratio 1: expected a fraction in [0, 1)",
        ),
        (with(Amount::Ratio(-0.1)), "--ratio -0.1"),
        (with(Amount::TargetParams(0.0)), "expected a positive"),
        (
            Prune {
                protect: vec!["nope".into()],
                ..Prune
            },
            "--protect nope: the model has no tensor named 'nope'",
        ),
        (
            Prune {
                round_to: 0,
                ..Prune
            },
            "--round-to 0",
        ),
    ] {
        let mut x = m.clone();
        let e = p.prune(&mut x).unwrap_err().0;
        assert!(e.contains(want), "{e}");
        assert!(!e.contains('\n'));
        assert_eq!(x, m);
    }
    let e = Prune {
        criterion: Criterion::Taylor,
        ..Prune
    }
    .prune(&mut m.clone())
    .unwrap_err()
    .0;
    assert!(e.contains("--criterion taylor needs --calibration"), "{e}");
}

#[test]
fn a_model_without_groups_says_why() {
    let src = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x) => (float[1,3] y) <float[4,3] w = {1,2,3,4,5,6,7,8,9,10,11,12}> {
  y = MatMul (x, w)
}"#;
    let mut m = parse_model(src).unwrap();
    let e = Prune.prune(&mut m).unwrap_err().0;
    assert!(
        e.starts_with("no prunable group in the model (MatMul")
            && e.contains("graph output 'y' keeps its shape"),
        "{e}"
    );
}

#[test]
fn protect_round_to_and_targets() {
    let m = fixture("mlp.onnxtxt");
    // Protecting a member keeps its group.
    let p = Prune {
        protect: vec!["r".into()],
        ..Prune
    };
    let e = p.prune(&mut m.clone()).unwrap_err().0;
    assert!(e.contains("protected: 'r'"), "{e}");
    // 8 hidden units at ratio 0.5 keep 4; rounded to 3 they keep 6.
    let mut x = m.clone();
    let r = Prune {
        round_to: 3,
        ..Prune
    }
    .prune(&mut x)
    .unwrap();
    assert_eq!(r.groups[0].removed, 2);
    assert_eq!(
        x.graph
            .initializer(x.graph.value_by_name("w1").unwrap())
            .unwrap()
            .dims,
        [4, 6]
    );
    // A parameter target: w1 4x8 + b1 8 + w2 8x3 = 64; each unit is 8.
    let mut x = m.clone();
    let r = with(Amount::TargetParams(40.0)).prune(&mut x).unwrap();
    assert!(r.params_after <= 40 && r.params_after > 40 - 8, "{r:?}");
    assert!(r.trials > 2);
    // A target no ratio meets (one unit always stays: 8 parameters).
    let e = with(Amount::TargetParams(5.0))
        .prune(&mut m.clone())
        .unwrap_err()
        .0;
    assert!(
        e.starts_with("no ratio meets the target of 5 parameters"),
        "{e}"
    );
}

#[test]
fn global_ranking_spreads_the_ratio_by_importance() {
    let m = fixture("residual.onnxtxt");
    let mut a = m.clone();
    let ra = Prune {
        global: true,
        ..Prune
    }
    .prune(&mut a)
    .unwrap();
    let total: usize = ra.groups.iter().map(|g| g.removed).sum();
    assert_eq!(total, 4, "{ra:?}");
    // Deterministic: the same options give the same model.
    let mut b = m.clone();
    Prune {
        global: true,
        ..Prune
    }
    .prune(&mut b)
    .unwrap();
    assert_eq!(a, b);
}

#[test]
fn random_and_l2_criteria_differ_from_l1_but_keep_counts() {
    let m = fixture("mlp.onnxtxt");
    let mut outs = Vec::new();
    for c in [Criterion::L1, Criterion::L2, Criterion::Random] {
        let mut x = m.clone();
        let r = Prune {
            criterion: c,
            ..Prune
        }
        .prune(&mut x)
        .unwrap();
        assert_eq!(r.groups[0].removed, 4);
        outs.push(x);
    }
    assert_ne!(outs[0], outs[2]);
}

#[test]
fn unstructured_sparsity_zeroes_the_smallest_and_stores_sparse_past_two_thirds() {
    let m = fixture("mlp.onnxtxt");
    let w1 = |m: &Model| m.graph.value_by_name("w1").unwrap();
    let orig = m.graph.initializer(w1(&m)).unwrap().to_f64_vec().unwrap();
    // 0.75 of w1's 32 elements: 24 zeros, 8 kept, stored sparse (8 values
    // and 8 int64 indices: 96 bytes against 128).
    let mut x = m.clone();
    let r = with(Amount::Sparsity(0.75)).prune(&mut x).unwrap();
    let s = r.sparsity.clone().unwrap();
    assert_eq!((s.weights, s.stored_sparse), (2, 2), "{s:?}");
    assert_eq!(s.zeroed, 24 + 18);
    assert!(s.file_bytes_after < s.file_bytes_before);
    assert_eq!(r.params_after, r.params_before);
    let v = w1(&x);
    assert!(x.graph.initializer(v).is_none());
    let mut dense = x.clone();
    assert_eq!(dense.graph.densify_sparse_initializers(), 2);
    let got = dense.graph.initializer(v).unwrap().to_f64_vec().unwrap();
    let mut mags: Vec<f64> = orig.iter().map(|x| x.abs()).collect();
    mags.sort_by(f64::total_cmp);
    let cut = mags[23];
    for (o, g) in orig.iter().zip(&got) {
        if o.abs() > cut {
            assert_eq!(o, g);
        } else {
            assert_eq!(*g, 0.0);
        }
    }
    assert_eq!(got.iter().filter(|&&g| g == 0.0).count(), 24);
    // At 0.5 the zeros stay dense (sparse would be larger).
    let mut y = m.clone();
    let r = with(Amount::Sparsity(0.5)).prune(&mut y).unwrap();
    assert_eq!(r.sparsity.unwrap().stored_sparse, 0);
    assert!(y.graph.sparse_initializers().is_empty());
    let e = with(Amount::Sparsity(1.0))
        .prune(&mut m.clone())
        .unwrap_err()
        .0;
    assert!(
        e.contains("--sparsity 1: expected a fraction in [0, 1)"),
        "{e}"
    );
}
