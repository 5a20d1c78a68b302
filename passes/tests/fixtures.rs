//! Snapshot-tested pass development.
//!
//! Every `testdata/passes/<pass>/<case>.onnxtxt` holds a graph in ONNX text.
//! This test parses it, runs `<pass>` with the verifier on, and snapshots
//! the before→after diff in `testdata/passes/<pass>/snapshots/`. A change in
//! a pass's behaviour shows up in review as a `.snap` diff; accept new
//! snapshots with `cargo insta review` (or `INSTA_UPDATE=always`).

use graphopt_passes::manager::{run_pipeline, ManagerOptions};
use graphopt_text::{parse_model, print_model, PrintOptions};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/passes")
}

fn sorted_dir(p: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Runs one fixture and returns its snapshot text.
fn run_fixture(pass_name: &str, path: &Path) -> String {
    let src = std::fs::read_to_string(path).unwrap();
    let mut model = parse_model(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    graphopt_ir::verify::verify_model(&model)
        .unwrap_or_else(|e| panic!("{}: invalid fixture: {e}", path.display()));
    let opts = PrintOptions::default();
    let before = print_model(&model, &opts);
    let pass = graphopt_passes::lookup(pass_name).unwrap();
    let mut mopts = ManagerOptions {
        verify: true,
        ..ManagerOptions::default()
    };
    let runs = run_pipeline(&mut model, std::slice::from_ref(&pass), &mut mopts)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after = print_model(&model, &opts);
    let diff = similar::TextDiff::from_lines(&before, &after);
    let mut out = String::new();
    out.push_str(&format!(
        "pass: {pass_name}\ncounters: {:?}\n\n",
        runs[0].stats.counters
    ));
    if before == after {
        out.push_str("(unchanged)\n");
        out.push_str(&before);
    } else {
        out.push_str(
            &diff
                .unified_diff()
                .context_radius(1000)
                .header("before", "after")
                .to_string(),
        );
    }
    out
}

#[test]
fn pass_fixtures() {
    let mut count = 0;
    for dir in sorted_dir(&root()) {
        if !dir.is_dir() {
            continue;
        }
        let pass_name = dir.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            graphopt_passes::lookup(&pass_name).is_ok(),
            "fixture folder {} names no registered pass",
            dir.display()
        );
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(dir.join("snapshots"));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        let _guard = settings.bind_to_scope();
        for f in sorted_dir(&dir) {
            if f.extension().and_then(|e| e.to_str()) != Some("onnxtxt") {
                continue;
            }
            let case = f.file_stem().unwrap().to_string_lossy().to_string();
            let snap = run_fixture(&pass_name, &f);
            insta::assert_snapshot!(case.as_str(), snap);
            count += 1;
        }
    }
    assert!(count > 0, "no fixtures found under {}", root().display());
}

#[test]
fn every_pass_has_fixtures() {
    for p in graphopt_passes::registry() {
        let dir = root().join(p.name);
        let n = dir
            .read_dir()
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.path().extension().is_some_and(|x| x == "onnxtxt"))
                    .count()
            })
            .unwrap_or(0);
        assert!(
            n > 0,
            "pass {} has no fixtures in {}",
            p.name,
            dir.display()
        );
    }
}
