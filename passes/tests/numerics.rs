//! Numerical checks of every pass against the unoptimized model, on the
//! real models in `testdata/models/`, with tract as the reference executor.
//!
//! For each model tract can run: run each registered pass alone, and the
//! default pipeline to a fixed point, then compare outputs on seeded inputs.
//! Passes that only change structure must give bit-identical outputs; the
//! rest must stay within relative L2 1e-5.

use graphopt_passes::manager::{run_pipeline, ManagerOptions};
use std::path::{Path, PathBuf};

/// A label, its passes, and how many rounds to run them.
/// Passes that need options or change the model's contract; their own
/// tests check them numerically.
const OPT_IN: &[&str] = &["lower_precision", "upgrade_opset"];

type Pipeline = (String, Vec<Box<dyn graphopt_passes::Pass>>, usize);

fn models() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "onnx"));
    v.sort();
    v
}

#[test]
fn passes_preserve_outputs_on_real_models() {
    let mut ran = 0;
    let mut skipped = Vec::new();
    for path in models() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let loaded = graphopt_onnx::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let Ok(inputs) = graphopt_tract::sample_inputs(&loaded.model, &[], 3, 7) else {
            skipped.push(format!("{name} (inputs)"));
            continue;
        };
        let original = graphopt_tract::prepare(&loaded.model).unwrap();
        let reference = match graphopt_tract::run_bytes(&original, &inputs) {
            Ok(r) => r,
            Err(e) => {
                skipped.push(format!("{name} (tract: {})", e.root_cause()));
                continue;
            }
        };
        let mut pipelines: Vec<Pipeline> = graphopt_passes::registry()
            .iter()
            .filter(|p| !OPT_IN.contains(&p.name))
            .map(|p| (p.name.to_string(), vec![(p.make)()], 1))
            .collect();
        pipelines.push(("default".into(), graphopt_passes::default_pipeline(), 8));
        for (label, passes, rounds) in pipelines {
            let mut m = loaded.model.clone();
            let mut opts = ManagerOptions {
                verify: true,
                max_rounds: rounds,
                ..ManagerOptions::default()
            };
            run_pipeline(&mut m, &passes, &mut opts)
                .unwrap_or_else(|e| panic!("{name}: {label}: {e}"));
            let bytes = graphopt_tract::prepare(&m).unwrap();
            let got = graphopt_tract::run_bytes(&bytes, &inputs)
                .unwrap_or_else(|e| panic!("{name}: {label}: tract: {e:#}"));
            let diffs = graphopt_tract::compare::compare_outputs(
                &[],
                &reference,
                &got,
                &graphopt_tract::compare::Tolerance::default(),
            );
            assert_eq!(diffs.len(), reference.len(), "{name}: {label}: outputs");
            let exact = passes.iter().all(|p| p.exact());
            for d in diffs {
                if exact {
                    assert!(d.identical, "{name}: {label}: outputs differ ({d:?})");
                } else {
                    assert!(
                        d.rel_l2 <= 1e-5,
                        "{name}: {label}: output {}: rel L2 {} > 1e-5",
                        d.name,
                        d.rel_l2
                    );
                }
            }
        }
        ran += 1;
    }
    eprintln!("numerics: {ran} models checked; skipped: {skipped:?}");
    assert!(
        ran >= 3,
        "too few models ran in tract ({ran}); skipped: {skipped:?}"
    );
}
