//! Inline checks of the rules in the module doc; the fixtures under
//! `testdata/passes/lower_precision/` snapshot the full outputs.

use super::*;
use graphopt_text::{parse_model, print_model, PrintOptions};

fn run(pass: &LowerPrecision, src: &str) -> (Model, LowerReport) {
    let mut m = parse_model(src).unwrap_or_else(|e| panic!("fixture does not parse: {e}"));
    graphopt_ir::verify::verify_model(&m).expect("fixture is valid");
    let r = pass.lower(&mut m).expect("pass runs");
    graphopt_ir::verify::verify_model(&m).unwrap_or_else(|e| panic!("after lowering: {e}"));
    (m, r)
}

fn text(m: &Model) -> String {
    print_model(m, &PrintOptions::default())
}

const MLP: &str = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x) => (float[1,2] y) <float[4,2] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}> {
  m = MatMul (x, w)
  y = Softmax (m)
}
"#;

#[test]
fn matmul_low_softmax_fp32_one_cast_each_way() {
    let (m, r) = run(&LowerPrecision, MLP);
    let t = text(&m);
    assert_eq!(r.casts_inserted, 2, "{t}");
    assert!(t.contains("float16[4,2] w"), "{t}");
    assert!(t.contains("m = MatMul (x_float16, w)"), "{t}");
    assert!(t.contains("y = Softmax (m_float)"), "{t}");
    assert!(t.contains("(float[1,4] x) => (float[1,2] y)"), "{t}");
    assert_eq!(r.weights_lowered, vec!["w".to_string()]);
}

#[test]
fn keep_list_and_io_types_are_options() {
    let p = LowerPrecision {
        keep_fp32: vec!["MatMul".into()],
        ..LowerPrecision
    };
    let (m, r) = run(&p, MLP);
    assert!(r.lowered.is_empty());
    // w is too small to be stored low for fp32 readers.
    assert!(text(&m).contains("float[4,2] w"));
    let p = LowerPrecision {
        allow_low: vec!["Softmax".into()],
        keep_io_types: false,
        ..LowerPrecision
    };
    let (m, r) = run(&p, MLP);
    let t = text(&m);
    assert_eq!(r.casts_after, 0, "{t}");
    assert!(t.contains("(float16[1,4] x) => (float16[1,2] y)"), "{t}");
}

#[test]
fn integer_tensors_are_never_touched() {
    let src = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (int64[3] ids, float[1,4] x) => (int64[3] o, float[1,4] y) <int64[3] k = {1, 2, 3}> {
  o = Add (ids, k)
  y = Relu (x)
}
"#;
    let (m, r) = run(&LowerPrecision, src);
    assert_eq!(r.casts_inserted, 0);
    assert!(r.lowered.is_empty(), "Relu follows its fp32 input");
    assert_eq!(text(&m), text(&parse_model(src).unwrap()));
}

#[test]
fn bf16_keeps_ops_onnxruntime_cannot_run() {
    let p = LowerPrecision {
        precision: Precision::BF16,
        ..LowerPrecision
    };
    let (m, r) = run(&p, MLP);
    // No bf16 MatMul on onnxruntime's CPU: compute stays fp32, the weight
    // is too small to be stored low.
    assert!(r.kept_no_kernel.contains("MatMul"));
    assert!(r.lowered.is_empty());
    assert_eq!(count_casts(&m.graph), 0);
    let p = LowerPrecision {
        precision: Precision::BF16,
        ort_cpu: false,
        ..LowerPrecision
    };
    let (m, _) = run(&p, MLP);
    assert!(text(&m).contains("bfloat16[4,2] w"));
}

#[test]
fn registry_default_is_fp16() {
    let p = crate::lookup("lower_precision").unwrap();
    assert_eq!(p.name(), "lower_precision");
    assert!(!p.exact());
    assert_eq!(
        Precision::parse("fp16-weights").unwrap(),
        Precision::F16Weights
    );
    assert!(Precision::parse("int4").is_err());
}

/// Options from a fixture's `# options: key=value ...` line.
fn options_from(src: &str) -> LowerPrecision {
    let mut p = LowerPrecision;
    for line in src.lines() {
        let Some(rest) = line.trim().strip_prefix("# options:") else {
            continue;
        };
        for kv in rest.split_whitespace() {
            let (k, v) = kv.split_once('=').expect("key=value");
            let list = || v.split(',').map(str::to_string).collect::<Vec<_>>();
            match k {
                "precision" => p.precision = Precision::parse(v).unwrap(),
                "keep_fp32" => p.keep_fp32 = list(),
                "allow_low" => p.allow_low = list(),
                "keep_io_types" => p.keep_io_types = v == "true",
                "ort_cpu" => p.ort_cpu = v == "true",
                _ => panic!("unknown option {k}"),
            }
        }
    }
    p
}

/// `testdata/passes/lower_precision/modes/*.onnxtxt`: fixtures that need
/// options (the registry-driven fixture harness runs the default fp16
/// configuration on the files one folder up). Snapshots the before→after
/// diff like the harness does.
#[test]
fn mode_fixtures() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/passes/lower_precision/modes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnxtxt"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(dir.join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let _guard = settings.bind_to_scope();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        let pass = options_from(&src);
        let before = text(&parse_model(&src).unwrap());
        let (m, r) = run(&pass, &src);
        let after = text(&m);
        let diff = similar::TextDiff::from_lines(&before, &after)
            .unified_diff()
            .context_radius(1000)
            .header("before", "after")
            .to_string();
        let kept = if r.kept_fp32_weights.is_empty() {
            String::new()
        } else {
            format!("weights kept fp32: {:?}\n", r.kept_fp32_weights)
        };
        let snap = format!(
            "precision: {}\nlowered: {}, casts: {} -> {}, weight bytes: {} -> {}, clamped: {:?}, kept (no kernel): {:?}\n{kept}\n{}",
            pass.precision.name(),
            r.lowered_total,
            r.casts_before,
            r.casts_after,
            r.weight_bytes_before,
            r.weight_bytes_after,
            r.clamped,
            r.kept_no_kernel,
            if before == after { "(unchanged)\n".to_string() } else { diff }
        );
        let case = f.file_stem().unwrap().to_string_lossy().to_string();
        insta::assert_snapshot!(case.as_str(), snap);
    }
}

#[test]
fn keeping_an_if_node_keeps_its_bodies_fp32() {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/passes/lower_precision/subgraph_if.onnxtxt"),
    )
    .unwrap();
    let (_, r) = run(&LowerPrecision, &src);
    assert_eq!(r.subgraph_hosts.len(), 1);
    assert_eq!(
        r.lowered_total, 2,
        "outer MatMul and the else-branch MatMul"
    );
    let keep = LowerPrecision {
        keep_nodes: r.subgraph_hosts.clone(),
        ..LowerPrecision
    };
    let (m, r2) = run(&keep, &src);
    assert_eq!(r2.lowered_total, 1, "only the outer MatMul");
    assert!(r2.subgraph_hosts.is_empty());
    // The branches cast the captured low value up; nothing inside is low.
    let t = text(&m);
    assert!(!t.contains("e_out_float16"), "{t}");
}

/// bf16 with one fp32 MatMul reading every weight: storing it low would
/// need a full fp32 copy at once, so it stays fp32 with a warning; a second
/// reader of a second weight halves that and both are stored low.
#[test]
fn fp32_read_weights_are_held_when_their_copies_cost_more() {
    let p = LowerPrecision {
        precision: Precision::BF16,
        ..LowerPrecision
    };
    let one = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x) => (float[1,4] y) <float[4,4] w = {1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125}> {
  y = MatMul (x, w)
}
"#;
    let (_, r) = run(&p, one);
    assert!(r.weights_lowered.is_empty(), "{:?}", r.weights_lowered);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.starts_with("weights only fp32 nodes read stay fp32: storing 1 of them")),
        "{:?}",
        r.warnings
    );
    let two = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x) => (float[1,4] y) <float[4,4] w = {1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125}, float[4,4] v = {1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125}> {
  h = MatMul (x, w)
  y = MatMul (h, v)
}
"#;
    let (_, r) = run(&p, two);
    assert_eq!(r.weights_lowered.len(), 2, "{:?}", r.warnings);
}

/// A mask computed from constants alone is a constant to the Add that
/// reads it: the Add runs low behind one Cast of the mask, rather than
/// falling back to fp32 and spreading fp32 downstream.
#[test]
fn computed_constants_do_not_pull_their_readers_to_fp32() {
    let src = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x) => (float[1,4] y) <float[4,4] w = {1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125, 1.0, 0.5, 0.25, 0.125}, float[4] i = {0.0, 1.0, 2.0, 3.0}, float s = {0.5}> {
  m = MatMul (x, w)
  t = Mul (i, s)
  k = Sin (t)
  [masked] a = Add (m, k)
  y = Relu (a)
}
"#;
    let (m, r) = run(&LowerPrecision, src);
    let t = text(&m);
    assert_eq!(r.kept_constant_compute.len(), 2, "{t}");
    assert!(t.contains("a = Add (m, k_float16)"), "{t}");
    assert_eq!(r.lowered.len(), 3, "MatMul, Add and Relu run low: {t}");
}
