//! Planning coverage: weights made at run time from shape initializers
//! (the onnx zoo's IR-3 graphs), input shapes given by hand, and values of
//! data-dependent size planned as dynamic allocations.

use graphopt::plan::DimValues;
use graphopt::{PlanRequest, Session};

fn session(text: &str) -> Session {
    Session::from_model(graphopt::text::parse_model(text).expect("fixture parses"))
}

/// IR 3: every initializer is also a graph input (an overridable default).
/// The weight is made by ConstantOfShape from such an input.
const ZOO: &str = r#"
<ir_version: 3, opset_import: ["" : 9]>
g (float[1,64] x, int64[2] w_shape = {64, 32}) => (float[1,32] y) {
  w = ConstantOfShape <value = float[1] {0.5}> (w_shape)
  y = MatMul (x, w)
}
"#;

#[test]
fn constant_of_shape_weights_from_default_inputs_are_planned() {
    let p = session(ZOO).plan(&PlanRequest::default()).unwrap();
    assert!(
        p.plan.dynamic_values.is_empty(),
        "{:?}",
        p.plan.dynamic_values
    );
    // The weight (64 x 32 floats) is an activation of the arena.
    let w = p.plan.tensors.iter().find(|t| t.name == "w").unwrap();
    assert_eq!(w.size, 64 * 32 * 4);
    // Strict planning agrees.
    let strict = PlanRequest {
        options: graphopt::plan::PlanOptions {
            strict: true,
            ..Default::default()
        },
        ..Default::default()
    };
    session(ZOO).plan(&strict).unwrap();
}

#[test]
fn unnamed_input_dims_get_the_default_or_a_given_shape() {
    let text = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[?,80,?] mel) => (float[?,80,?] y) {
  y = Relu (mel)
}
"#;
    let p = session(text).plan(&PlanRequest::default()).unwrap();
    let names: Vec<&str> = p.dims.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["mel[0]", "mel[2]"]);
    assert!(p.dims.iter().all(|d| d.defaulted && d.value == 1));
    let req = PlanRequest {
        dims: DimValues {
            shapes: vec![("mel".into(), vec![2, 80, 300])],
            ..Default::default()
        },
        ..Default::default()
    };
    let p = session(text).plan(&req).unwrap();
    let y = p.plan.tensors.iter().find(|t| t.name == "y").unwrap();
    assert_eq!(y.size, 2 * 80 * 300 * 4);
    // A shape that contradicts the model is one clear error.
    let bad = PlanRequest {
        dims: DimValues {
            shapes: vec![("mel".into(), vec![2, 64, 300])],
            ..Default::default()
        },
        ..Default::default()
    };
    let err = session(text).plan(&bad).unwrap_err().to_string();
    assert!(err.contains("dim 1 is 80 in the model, 64 given"), "{err}");
}

/// paddle2onnx writes `-1` for a free batch dim and the name `?` for the
/// height and width at once (PaddleOCR's direction classifier, in the
/// rapidocr wheel): a given shape fills both, as onnxruntime accepts it.
#[test]
fn minus_one_and_question_mark_dims_take_the_given_shape() {
    use graphopt::ir::{Dim, Shape, Type};
    let text = r#"
<ir_version: 7, opset_import: ["" : 11]>
g (float[N,3,H,W] x) => (float[N,3,H,W] y) {
  y = Relu (x)
}
"#;
    let mut m = graphopt::text::parse_model(text).unwrap();
    let x = m.graph.inputs[0];
    let dims = vec![
        Dim::Known(-1),
        Dim::Known(3),
        Dim::Sym("?".into()),
        Dim::Sym("?".into()),
    ];
    m.graph.value_mut(x).ty = Some(Type::tensor(
        graphopt::ir::DType::F32,
        Some(Shape::new(dims)),
    ));
    let req = PlanRequest {
        dims: DimValues {
            shapes: vec![("x".into(), vec![1, 3, 48, 192])],
            ..Default::default()
        },
        ..Default::default()
    };
    let p = Session::from_model(m.clone()).plan(&req).unwrap();
    let y = p.plan.tensors.iter().find(|t| t.name == "y").unwrap();
    assert_eq!(y.size, 3 * 48 * 192 * 4);
    // The fp16 range check samples inputs for the -1 dim too (it once
    // overflowed computing the sample's size).
    let mut s = Session::from_model(m);
    let opts = graphopt::PrecisionOptions::new(graphopt::Precision::F16);
    let r = s.lower_precision(&opts).unwrap();
    let rc = r.range_check.expect("fp16 runs the range check");
    assert!(rc.skipped.is_none(), "{:?}", rc.skipped);
}

#[test]
fn data_dependent_sizes_are_dynamic_unless_strict() {
    let text = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[8] x) => (float[?] y) {
  i = NonZero (x)
  f = Flatten <axis = 0> (i)
  s = Squeeze (f)
  y = Gather (x, s)
}
"#;
    let p = session(text).plan(&PlanRequest::default()).unwrap();
    assert!(!p.plan.dynamic_values.is_empty());
    for d in &p.plan.dynamic_values {
        assert!(
            p.plan.tensors.iter().all(|t| &t.name != d),
            "{d} in the arena"
        );
    }
    graphopt::plan::check_graph_plan(&p.model.graph, &p.plan).unwrap();
    let strict = PlanRequest {
        options: graphopt::plan::PlanOptions {
            strict: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let err = session(text).plan(&strict).unwrap_err().to_string();
    assert!(
        err.contains("unknown size") && err.contains("--strict"),
        "{err}"
    );
}

/// The default pipeline never raises the planned arena: on every testdata
/// model, with every input dim 8, the optimized model's arena is at most
/// the exported one's. (Merging q/k/v MatMuls raised it by up to 40%, which
/// is why `fuse_parallel_matmul` is not in the default pipeline.)
#[test]
fn default_pipeline_never_raises_the_planned_arena() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
        .collect();
    files.sort();
    assert!(files.len() >= 20);
    let req = PlanRequest {
        dims: DimValues {
            default: Some(8),
            ..Default::default()
        },
        options: graphopt::plan::PlanOptions {
            node_budget: 20_000,
            ..Default::default()
        },
        verify: false,
        // The pipeline's effect on the model itself.
        graph: graphopt::PlanGraph::AsWritten,
    };
    let mut worse = Vec::new();
    for f in &files {
        let mut s = graphopt::load(f).unwrap();
        let before = s.plan(&req).unwrap().plan.arena_bytes;
        s.optimize(&graphopt::OptimizeOptions::default()).unwrap();
        let after = s.plan(&req).unwrap().plan.arena_bytes;
        if after > before {
            worse.push(format!("{}: {before} -> {after}", f.display()));
        }
    }
    assert!(
        worse.is_empty(),
        "the default pipeline raised the arena: {worse:?}"
    );
}

/// `plan` plans the graph `run` executes on the CPU (issue 20): on models
/// whose elementwise chains (BERT, GPT-2) or residual convolutions
/// (ResNet) the runtime fuses, the planned arena is the one a run
/// allocates, and no larger than the model's as written (smaller on BERT;
/// the tiny GPT-2's and ResNet's peaks lie where nothing is fused).
#[test]
fn plan_prints_the_arena_run_allocates() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    for (name, smaller) in [
        ("bert_tiny.ts14", true),
        ("gpt2_tiny.ts14", false),
        ("resnet_tiny.ts14", false),
    ] {
        let s = graphopt::load(dir.join(format!("{name}.onnx"))).expect("loads");
        let inputs = dir.join(format!("{name}.inputs.npz"));
        let ran = s
            .run(&graphopt::RunOptions {
                inputs: if inputs.exists() {
                    graphopt::Inputs::Npz(inputs)
                } else {
                    graphopt::Inputs::default()
                },
                ..Default::default()
            })
            .expect("runs");
        let dims: Vec<(&str, i64)> = ran
            .dims
            .iter()
            .map(|d| (d.name.as_str(), d.value))
            .collect();
        let planned = s.plan(&PlanRequest::at(&dims)).expect("plans");
        assert_eq!(
            planned.plan.arena_bytes, ran.arena_planned_bytes,
            "{name}: plan and run disagree"
        );
        let written = s
            .plan(&PlanRequest {
                graph: graphopt::PlanGraph::AsWritten,
                ..PlanRequest::at(&dims)
            })
            .expect("plans");
        let (p, w) = (planned.plan.arena_bytes, written.plan.arena_bytes);
        assert!(
            p < w || (p == w && !smaller),
            "{name}: lowered {p} vs as written {w}"
        );
    }
}
