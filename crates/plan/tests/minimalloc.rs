//! The eleven MiniMalloc "challenging" instances (vendored in
//! `testdata/minimalloc/`): every plan must be valid and never worse than
//! greedy, and with the default options the quick ones reach their bound
//! (timing is measured by the example `minimalloc_bench` in release, not
//! here).

use graphopt_plan::{
    check_plan, default_node_budget, plan_intervals, read_minimalloc_csv, IntervalOptions,
};
use std::path::PathBuf;

#[test]
fn challenging_instances_are_valid() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/minimalloc");
    let rd = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        11,
        "expected 11 instances in {}",
        dir.display()
    );
    for f in files {
        let bufs = read_minimalloc_csv(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let opts = IntervalOptions {
            alignment: 1,
            node_budget: 20_000,
            ..IntervalOptions::default()
        };
        let plan = plan_intervals(&bufs, &opts);
        check_plan(&bufs, &plan.offsets, plan.arena, 1, &[])
            .unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        assert!(plan.arena >= plan.lower_bound);
        assert!(plan.arena <= plan.greedy_arena);
    }
}

/// With the options `graphopt plan --intervals` uses by default (the
/// node budget of `default_node_budget`, no target, alignment 1), the
/// instances that need few search nodes reach their lower bound. E and I
/// reach it too but after ~100k and ~466k nodes, and D and J stop above it
/// (1.0415x and 1.0487x; see `d_and_j_reach_their_best_known_arena`);
/// those four are measured in release by `minimalloc_bench --default
/// --no-target` (benches/README.md), not here.
#[test]
fn default_options_reach_the_bound() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/minimalloc");
    for name in ["A", "B", "C", "F", "G", "H", "K"] {
        let f = dir.join(format!("{name}.1048576.csv"));
        let bufs = read_minimalloc_csv(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let opts = IntervalOptions {
            alignment: 1,
            node_budget: default_node_budget(bufs.len()),
            ..IntervalOptions::default()
        };
        let plan = plan_intervals(&bufs, &opts);
        check_plan(&bufs, &plan.offsets, plan.arena, 1, &[])
            .unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        assert_eq!(
            plan.arena, plan.lower_bound,
            "{name}: {} nodes, strategy {}",
            plan.nodes, plan.strategy
        );
        assert!(plan.optimal, "{name}");
    }
}

/// D and J cannot reach their lower bound (none is known to); the
/// bisection probes that start from the highest capacity a probe gave up
/// on bring both to their best known arena (1,048,576) early: at 62,625
/// and 56,993 nodes with the default options (before those probes, D ended
/// its whole default budget, 276,903 nodes, at 1,055,744). Opt-in: ~160k
/// nodes take about 19 s of CPU in a debug build (2 s in release:
/// `cargo test --release -p graphopt-plan --test minimalloc -- --ignored`).
#[test]
#[ignore]
fn d_and_j_reach_their_best_known_arena() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/minimalloc");
    for name in ["D", "J"] {
        let f = dir.join(format!("{name}.1048576.csv"));
        let bufs = read_minimalloc_csv(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let opts = IntervalOptions {
            alignment: 1,
            node_budget: 80_000,
            ..IntervalOptions::default()
        };
        let plan = plan_intervals(&bufs, &opts);
        check_plan(&bufs, &plan.offsets, plan.arena, 1, &[])
            .unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        assert!(
            plan.arena <= 1_048_576,
            "{name}: {} after {} nodes",
            plan.arena,
            plan.nodes
        );
    }
}
