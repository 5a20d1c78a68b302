//! The library and the command agree: `graphopt::load(..).optimize(..)` and
//! `save` give the same bytes as `graphopt optimize`, with its defaults.

use std::path::{Path, PathBuf};
use std::process::Command;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models")
}

fn cli(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .output()
        .expect("graphopt runs");
    assert!(
        out.status.success(),
        "graphopt {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn library_defaults_equal_the_command() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "bert_tiny.ts14.onnx",
        "gpt2_tiny.ts14.extdata.onnx",
        "if_loop.helper13.onnx",
    ] {
        let input = models().join(name);
        // Same file names in two folders: external data files are named
        // after the model file.
        let (cli_dir, lib_dir) = (dir.path().join("cli"), dir.path().join("lib"));
        std::fs::create_dir_all(&cli_dir).unwrap();
        std::fs::create_dir_all(&lib_dir).unwrap();
        let by_cli = cli_dir.join(name);
        let by_lib = lib_dir.join(name);
        cli(&[
            "optimize",
            input.to_str().unwrap(),
            "-o",
            by_cli.to_str().unwrap(),
            "-q",
        ]);
        let mut s = graphopt::load(&input).unwrap();
        let report = s.optimize(&graphopt::OptimizeOptions::default()).unwrap();
        assert!(
            report.after.nodes < report.before.nodes || name.starts_with("if_loop"),
            "{name}: the default pipeline removed nothing"
        );
        let saved = s.save(&by_lib).unwrap();
        assert!(
            std::fs::read(&by_cli).unwrap() == std::fs::read(&by_lib).unwrap(),
            "{name}: library and command outputs differ"
        );
        // External data is carried through as the input had it.
        assert_eq!(
            saved.external_bytes > 0,
            name.contains("extdata"),
            "{name}: external data not carried through"
        );
    }
}

#[test]
fn library_precision_equals_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let input = models().join("mobilenet_v3_small.ts14.onnx");
    let by_cli = dir.path().join("cli.onnx");
    let by_lib = dir.path().join("lib.onnx");
    cli(&[
        "optimize",
        input.to_str().unwrap(),
        "-o",
        by_cli.to_str().unwrap(),
        "--precision",
        "fp16",
        "--validate",
        "-q",
    ]);
    let mut s = graphopt::load(&input).unwrap();
    s.optimize(&graphopt::OptimizeOptions::default()).unwrap();
    let r = s
        .lower_precision(&graphopt::PrecisionOptions {
            validate: Some(graphopt::ValidateOptions::default()),
            ..graphopt::PrecisionOptions::new(graphopt::Precision::F16)
        })
        .unwrap();
    assert!(r.nodes_lowered > 0);
    assert!(r.validation.as_ref().is_some_and(|v| v.ok));
    s.save(&by_lib).unwrap();
    assert!(
        std::fs::read(&by_cli).unwrap() == std::fs::read(&by_lib).unwrap(),
        "library and command outputs differ"
    );
    // lower_precision ran through the pass manager: it is in the history.
    assert_eq!(
        s.pass_runs().last().map(|r| r.name),
        Some("lower_precision")
    );
}

#[test]
fn stop_after_counts_precision_lowering_as_a_pass_run() {
    let input = models().join("bert_tiny.ts14.onnx");
    let pipeline = graphopt::PipelineOptions {
        stop_after: Some(3),
        ..Default::default()
    };
    let mut s = graphopt::load(&input).unwrap();
    let r = s
        .optimize(&graphopt::OptimizeOptions {
            passes: Some("eliminate_identity,fold_constants".into()),
            pipeline: pipeline.clone(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.passes.len(), 2);
    assert!(!r.stopped_early);
    // The third run is the lowering; a fourth would be refused.
    let lp = s
        .lower_precision(&graphopt::PrecisionOptions {
            pipeline: pipeline.clone(),
            ..graphopt::PrecisionOptions::new(graphopt::Precision::F16)
        })
        .unwrap();
    assert!(lp.nodes_lowered > 0 && !lp.stopped_early);
    let r = s
        .optimize(&graphopt::OptimizeOptions {
            pipeline,
            ..Default::default()
        })
        .unwrap();
    assert!(r.stopped_early && r.passes.is_empty());
    let names: Vec<&str> = s.pass_runs().iter().map(|r| r.name).collect();
    assert_eq!(
        names,
        ["eliminate_identity", "fold_constants", "lower_precision"]
    );
}
