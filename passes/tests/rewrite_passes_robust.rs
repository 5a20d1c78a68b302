//! Every registered pass (`graphopt_passes::registry()`, so a new pass is
//! covered without touching this file) on every fixture of every pass.
//! Fixtures of other passes are inputs a pass was not written for, which is
//! the point. For each (pass, fixture):
//! - every fixture parses (a fixture that does not is a failure: it would
//!   otherwise silently drop out of this test and of `fixtures.rs`);
//! - the pass succeeds: an error is a failure unless the pair is listed in
//!   [`EXPECTED_ERRORS`] with the reason and a piece of the message, and a
//!   listed pair that succeeds is a failure too (the list is stale);
//! - the result passes the verifier, two runs give the same printout and
//!   counters (determinism), and a pass that reports no change leaves the
//!   model exactly as it was.
//!
//! Panics fail the test as they are.

use graphopt_passes::Pass;
use graphopt_text::{parse_model, print_model, PrintOptions};
use std::path::{Path, PathBuf};

/// (pass, fixture path under `testdata/passes/`, a piece of the error
/// message, why the refusal is right).
/// (None now: the one there was, DFT across opset 20, is upgraded.)
const EXPECTED_ERRORS: &[(&str, &str, &str, &str)] = &[];

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/passes");
    let mut files = Vec::new();
    for dir in std::fs::read_dir(&root).unwrap().filter_map(Result::ok) {
        if let Ok(rd) = std::fs::read_dir(dir.path()) {
            files.extend(
                rd.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "onnxtxt")),
            );
        }
    }
    files.sort();
    files
}

fn rel(f: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/passes");
    f.strip_prefix(&root).unwrap_or(f).display().to_string()
}

#[test]
fn every_pass_on_every_fixture_succeeds_verifies_and_is_deterministic() {
    let files = fixtures();
    let passes: Vec<Box<dyn Pass>> = graphopt_passes::registry()
        .iter()
        .map(|p| (p.make)())
        .collect();
    assert!(passes.len() >= 14, "registry has {} passes", passes.len());
    let mut failures = Vec::new();
    let mut expected_seen = Vec::new();
    let mut runs = 0;
    for f in &files {
        let name = rel(f);
        let text = std::fs::read_to_string(f).unwrap();
        let model = match parse_model(&text) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{name}: does not parse: {e}"));
                continue;
            }
        };
        let before = print_model(&model, &PrintOptions::default());
        for pass in &passes {
            let p = pass.name();
            let once = || {
                let mut m = model.clone();
                let r = pass.run(&mut m);
                (r, print_model(&m, &PrintOptions::default()), m)
            };
            let (a, a_text, a_model) = once();
            let (b, b_text, _) = once();
            let expected = EXPECTED_ERRORS
                .iter()
                .find(|(ep, ef, _, _)| *ep == p && *ef == name);
            let stats = match (a, expected) {
                (Err(e), Some((_, _, piece, _))) if e.0.contains(piece) => {
                    expected_seen.push((p, name.clone()));
                    assert!(
                        b.is_err_and(|e2| e2 == e),
                        "{name}: {p}: error not deterministic"
                    );
                    continue;
                }
                (Err(e), _) => {
                    failures.push(format!("{name}: {p}: error: {e}"));
                    continue;
                }
                (Ok(s), _) => s,
            };
            runs += 1;
            if let Err(e) = graphopt_ir::verify::verify_model(&a_model) {
                failures.push(format!("{name}: {p}: invalid IR: {e}"));
            }
            match b {
                Ok(s2) if s2 == stats && b_text == a_text => {}
                _ => failures.push(format!("{name}: {p}: not deterministic")),
            }
            if !stats.changed && a_text != before {
                failures.push(format!("{name}: {p}: changed the model without saying so"));
            }
        }
    }
    for (p, f, _, why) in EXPECTED_ERRORS {
        if !expected_seen.iter().any(|(sp, sf)| sp == p && sf == f) {
            failures.push(format!(
                "{f}: {p}: listed in EXPECTED_ERRORS ({why}) but did not fail that way"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    assert_eq!(
        runs + expected_seen.len(),
        files.len() * passes.len(),
        "some (pass, fixture) pairs were not run"
    );
}
