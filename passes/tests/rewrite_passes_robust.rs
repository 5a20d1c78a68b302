//! The simplification and fusion passes on every fixture of every pass:
//! they never panic, leave a valid IR, and are deterministic (two runs on
//! the same input print the same result). Fixtures of other passes are
//! inputs these passes were not written for, which is the point.

use graphopt_passes::Pass;
use graphopt_text::{parse_model, print_model, PrintOptions};
use std::path::Path;

const PASSES: &[&str] = &[
    "eliminate_noops",
    "fuse_conv_bn",
    "fuse_matmul_add",
    "fuse_layer_norm",
    "fuse_gelu",
    "upgrade_opset",
];

#[test]
fn never_panic_and_deterministic_on_all_fixtures() {
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
    let mut runs = 0;
    for f in &files {
        let Ok(model) = parse_model(&std::fs::read_to_string(f).unwrap()) else {
            continue;
        };
        for name in PASSES {
            let pass: Box<dyn Pass> = graphopt_passes::lookup(name).unwrap();
            let once = |m: &graphopt_ir::Model| {
                let mut m = m.clone();
                let r = pass.run(&mut m);
                if r.is_ok() {
                    graphopt_ir::verify::verify_model(&m)
                        .unwrap_or_else(|e| panic!("{}: {name}: {e}", f.display()));
                }
                (
                    r.map(|s| s.counters),
                    print_model(&m, &PrintOptions::default()),
                )
            };
            let (a, b) = (once(&model), once(&model));
            assert_eq!(a, b, "{}: {name} is not deterministic", f.display());
            // A pass that reports no change leaves the model as it was.
            if let Ok(c) = &a.0 {
                if c.is_empty() {
                    assert_eq!(
                        a.1,
                        print_model(&model, &PrintOptions::default()),
                        "{}: {name} changed the model without saying so",
                        f.display()
                    );
                }
            }
            runs += 1;
        }
    }
    assert!(runs > 50, "too few runs: {runs}");
}
