//! Snapshots of `prune`'s dependency-group finder on the fixtures in
//! `testdata/passes/prune/` (what the pass then does to them is in
//! `fixtures.rs`' snapshots): every group with its members, and every
//! walk left alone with its reason.

use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_passes::prune::groups::find;
use graphopt_text::parse_model;
use std::fmt::Write;
use std::path::Path;

fn describe(src: &str) -> String {
    let model = parse_model(src).unwrap();
    let mut shapes = model.clone();
    infer_model(&mut shapes, &InferOptions::default());
    let g = &model.graph;
    let found = find(&model, &shapes.graph);
    let label = |n| {
        let d = g.node(n);
        format!("{} {}", d.op_type, g.name(d.output(0).unwrap()))
    };
    let mut out = String::new();
    for (i, grp) in found.groups.iter().enumerate() {
        writeln!(
            out,
            "group {i}: {} {} of {} from {}",
            grp.units,
            grp.kind(),
            grp.block,
            label(grp.source)
        )
        .unwrap();
        for (p, s) in &grp.members {
            let w = if grp.weights.contains(p) {
                " (weight)"
            } else {
                ""
            };
            let rep = if s.repeat > 1 {
                format!(" repeat {} stride {}", s.repeat, s.stride)
            } else {
                String::new()
            };
            writeln!(
                out,
                "  {}[{}] offset {} block {}{rep}{w}",
                g.name(p.value),
                p.axis,
                s.offset,
                s.block
            )
            .unwrap();
        }
        for l in &grp.literals {
            writeln!(
                out,
                "  rewrites axis {} of the shape of {} ('{}'[{}])",
                l.axis,
                label(l.reshape),
                g.name(l.value),
                l.index
            )
            .unwrap();
        }
        for (&n, a) in &grp.splits {
            writeln!(out, "  sets the sizes of {} on axis {a}", label(n)).unwrap();
        }
        for (&n, a) in &grp.gathers {
            writeln!(out, "  renumbers the indices of {} (axis {a})", label(n)).unwrap();
        }
        for &n in &grp.depthwise {
            writeln!(out, "  sets the group of {}", label(n)).unwrap();
        }
    }
    for l in &found.left_alone {
        writeln!(out, "left alone: {}: {}", label(l.source), l.reason).unwrap();
    }
    out
}

#[test]
fn group_finder_fixtures() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/passes/prune");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(dir.join("groups"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let _guard = settings.bind_to_scope();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "onnxtxt"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the prune fixtures are missing");
    for f in files {
        let case = f.file_stem().unwrap().to_string_lossy().to_string();
        insta::assert_snapshot!(
            case.as_str(),
            describe(&std::fs::read_to_string(&f).unwrap())
        );
    }
}
