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
        (with(Amount::Ratio(1.0)), "--ratio 1: expected a fraction in [0, 1)"),
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
    assert!(Criterion::parse("taylor").unwrap_err().0.contains("not built yet"));
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
    assert_eq!(x.graph.initializer(x.graph.value_by_name("w1").unwrap()).unwrap().dims, [4, 6]);
    // A parameter target: w1 4x8 + b1 8 + w2 8x3 = 64; each unit is 8.
    let mut x = m.clone();
    let r = with(Amount::TargetParams(40.0)).prune(&mut x).unwrap();
    assert!(r.params_after <= 40 && r.params_after > 40 - 8, "{r:?}");
    assert!(r.trials > 2);
    // A target no ratio meets (one unit always stays: 8 parameters).
    let e = with(Amount::TargetParams(5.0)).prune(&mut m.clone()).unwrap_err().0;
    assert!(e.starts_with("no ratio meets the target of 5 parameters"), "{e}");
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
