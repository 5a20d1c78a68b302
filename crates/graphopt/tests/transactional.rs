//! A `Session` step that fails leaves the session exactly as it was: the
//! model's bytes and its pass history. Failures are injected mid-pipeline
//! (a failing pass after real rewrites), after the pipeline (quantize
//! refusing its options once the pipeline has run), before any work (a
//! lowering whose inputs cannot be read), and inside grad and remat.

use graphopt::ir::Model;
use graphopt::passes::{Pass, PassError, PassStats};
use graphopt::{
    ErrorKind, GradOptions, Inputs, OptimizeOptions, PipelineOptions, Precision, PrecisionOptions,
    QuantizeOptions, Session, ValidateOptions,
};
use std::path::PathBuf;

fn model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models")
        .join(format!("{name}.onnx"))
}

/// What must not change: the model's bytes and the pass history.
fn state(s: &Session) -> (Vec<u8>, usize) {
    (s.to_bytes().unwrap(), s.pass_runs().len())
}

/// Fails on its first run, after the passes before it rewrote the model.
struct Failing;

impl Pass for Failing {
    fn name(&self) -> &'static str {
        "failing"
    }
    fn run(&self, _: &mut Model) -> Result<PassStats, PassError> {
        Err(PassError("injected failure".into()))
    }
}

#[test]
fn failing_pass_mid_pipeline_restores_the_model() {
    let mut s = graphopt::load(model("bert_tiny.ts14")).unwrap();
    let before = state(&s);
    // The whole default pipeline runs once, then the failing pass.
    let mut passes = graphopt::passes::default_pipeline();
    let n = passes.len();
    passes.push(Box::new(Failing));
    let e = s
        .apply_passes(&passes, 1, &PipelineOptions::default())
        .unwrap_err();
    assert!(e.message().contains("injected failure"), "{e}");
    assert_eq!(state(&s), before);
    // The passes before the failing one did rewrite the model: without the
    // failure, the same prefix changes it (so the restore above is real).
    let mut t = graphopt::load(model("bert_tiny.ts14")).unwrap();
    let prefix: Vec<Box<dyn Pass>> = graphopt::passes::default_pipeline()
        .into_iter()
        .take(n)
        .collect();
    let runs = t
        .apply_passes(&prefix, 1, &PipelineOptions::default())
        .unwrap();
    assert!(runs.iter().any(|r| r.changed));
    assert_ne!(state(&t).0, before.0);
}

#[test]
fn lowering_whose_inputs_cannot_be_read_leaves_the_session() {
    let mut s = graphopt::load(model("resnet_tiny.ts14")).unwrap();
    let before = state(&s);
    let e = s
        .optimize(&OptimizeOptions {
            precision: Some(PrecisionOptions {
                // Refused before any work (optimize checks the lowering's
                // options and data first).
                validate: Some(ValidateOptions {
                    inputs: Inputs::Npz("no/such/inputs.npz".into()),
                    rtol: 1e-2,
                    atol: 1e-3,
                    best_effort: false,
                    force: false,
                }),
                ..PrecisionOptions::new(Precision::F16)
            }),
            ..OptimizeOptions::default()
        })
        .unwrap_err();
    assert!(e.message().contains("no/such/inputs.npz"), "{e}");
    assert_eq!(state(&s), before);
    // The same request without validation changes the model.
    s.optimize(&OptimizeOptions {
        precision: Some(PrecisionOptions::new(Precision::F16)),
        ..OptimizeOptions::default()
    })
    .unwrap();
    assert_ne!(state(&s).0, before.0);
}

#[test]
fn quantize_refused_after_optimize_restores() {
    let mut s = graphopt::load(model("bert_tiny.ts14")).unwrap();
    let before = state(&s);
    let e = s
        .optimize(&OptimizeOptions {
            quantize: Some(QuantizeOptions {
                // Refused by quantize, after the pipeline changed the model.
                block_size: 48,
                ..QuantizeOptions::new(graphopt::QuantizeMode::Int4Weights)
            }),
            ..OptimizeOptions::default()
        })
        .unwrap_err();
    assert!(e.message().contains("block"), "{e}");
    assert_eq!(state(&s), before);
}

#[test]
fn grad_and_remat_failures_restore() {
    // An opset-9 model: grad raises the opset first, then fails on the
    // unknown output.
    let mut s = graphopt::load(model("resnet_tiny.ts9")).unwrap();
    let before = state(&s);
    let mut opts = GradOptions::default();
    opts.autodiff.output = Some("no_such_output".into());
    assert!(s.grad(&opts).is_err());
    assert_eq!(state(&s), before);

    let mut t = graphopt::load(model("gpt2_tiny.ts14")).unwrap();
    t.grad(&GradOptions::default()).unwrap();
    let before = state(&t);
    let e = t
        .remat(&graphopt::RematOptions {
            budget: graphopt::Budget::Bytes(1),
            dims: graphopt::plan::DimValues::new(&[("batch".into(), 4), ("seq".into(), 8)]),
            strategy: graphopt::RematStrategy::Auto,
            time_limit: std::time::Duration::from_secs(5),
            donate: true,
        })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Budget, "{e}");
    assert_eq!(state(&t), before);

    // A sweep refused on an inference model leaves it as it was.
    let mut u = graphopt::load(model("bert_tiny.ts14")).unwrap();
    let before = state(&u);
    let e = u
        .remat_sweep(
            &graphopt::plan::DimValues::default(),
            &[],
            4,
            std::time::Duration::from_secs(5),
        )
        .unwrap_err();
    assert!(e.message().contains("no backward pass"), "{e}");
    assert_eq!(state(&u), before);
}
