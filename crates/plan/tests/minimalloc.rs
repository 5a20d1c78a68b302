//! The eleven MiniMalloc "challenging" instances (vendored in
//! `testdata/minimalloc/`): every plan must be valid and never worse than
//! greedy (timing is measured by the example `minimalloc_bench` in release,
//! not here).

use graphopt_plan::{check_plan, plan_intervals, read_minimalloc_csv, IntervalOptions};
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
