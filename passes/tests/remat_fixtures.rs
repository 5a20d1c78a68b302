//! `remat` on small hand-written training graphs (`testdata/remat/*.onnxtxt`:
//! a forward pass to `loss`, then backward nodes reading saved values).
//!
//! For each fixture, at a budget a third of the way from the least
//! simulated peak the solvers reach to the store-all peak:
//! the candidates, the drop set each strategy chooses, its simulated peak
//! and extra FLOPs, and the before→after diff of the model rewritten with
//! `optimal`'s drop set and scheduled by the planner's memory-aware
//! scheduler are snapshotted in `testdata/remat/snapshots/`. The test also
//! checks that:
//! - `optimal` finds the least extra FLOPs of every drop set that fits
//!   (exhaustive enumeration of the candidates, which are few here);
//! - the rewritten model passes the verifier, its real planner peak is at
//!   most the simulated one, and the recomputed copies survive `cse`.

use graphopt_passes::remat::{self, solve, Problem, Strategy};
use graphopt_text::{parse_model, print_model, PrintOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/remat")
}

fn names(p: &Problem, g: &graphopt_ir::Graph, idx: &[usize]) -> Vec<String> {
    idx.iter()
        .map(|&i| {
            let n = g.node(p.order[i]);
            let out = n
                .output(0)
                .map(|v| g.name(v).to_string())
                .unwrap_or_default();
            format!("{}({out})", n.op_type)
        })
        .collect()
}

/// The least extra FLOPs over every subset of the candidates that fits.
fn brute_force(p: &Problem, budget: u64) -> Option<u64> {
    let k = p.candidates.len();
    assert!(k <= 16, "too many candidates to enumerate: {k}");
    let mut best: Option<u64> = None;
    for mask in 0u32..(1 << k) {
        let mut d = p.base_drop();
        for (j, &c) in p.candidates.iter().enumerate() {
            if mask & (1 << j) != 0 {
                d[c] = true;
            }
        }
        let s = p.simulate(&d);
        if s.peak <= budget && best.is_none_or(|b| s.extra_flops < b) {
            best = Some(s.extra_flops);
        }
    }
    best
}

fn run_case(path: &Path) -> String {
    let src = std::fs::read_to_string(path).unwrap();
    let mut model = parse_model(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    graphopt_ir::infer::infer_model(&mut model, &Default::default());
    graphopt_ir::verify::verify_model(&model).unwrap();
    let g = &model.graph;
    let p = Problem::new(g);
    let store_all = p.simulate(&vec![false; p.len()]);
    let least = solve::least_peak(&p, Duration::from_secs(10)).1.peak;
    let budget = least + (store_all.peak - least) / 3;
    let mut out = format!(
        "candidates: {:?}\nfollowers: {:?}\nstore-all peak {} B, least {} B; budget {} B\n",
        names(&p, g, &p.candidates),
        names(&p, g, &p.followers),
        store_all.peak,
        least,
        budget
    );
    let brute = brute_force(&p, budget);
    let mut chosen = None;
    for s in [
        Strategy::Optimal,
        Strategy::Fast,
        Strategy::Sqrt,
        Strategy::PerBlock,
    ] {
        match solve(&p, s, budget, Duration::from_secs(10)) {
            Some(sol) => {
                let dropped: Vec<usize> = p
                    .candidates
                    .iter()
                    .copied()
                    .filter(|&i| sol.drop[i])
                    .collect();
                out += &format!(
                    "{}: drop {:?}, peak {} B, extra {} FLOPs{}\n",
                    s.name(),
                    names(&p, g, &dropped),
                    sol.sim.peak,
                    sol.sim.extra_flops,
                    if sol.proven_optimal { " (proven)" } else { "" }
                );
                if s == Strategy::Optimal {
                    assert!(sol.proven_optimal, "{}: optimal timed out", path.display());
                    assert_eq!(
                        Some(sol.sim.extra_flops),
                        brute,
                        "{}: optimal is not the least",
                        path.display()
                    );
                    chosen = Some(sol.drop.clone());
                }
            }
            None => out += &format!("{}: nothing fits\n", s.name()),
        }
    }
    if let Some(b) = brute {
        assert!(chosen.is_some(), "{}: a drop set fits", path.display());
        let _ = b;
    }
    let Some(drop) = chosen else {
        return out;
    };
    let before = print_model(&model, &PrintOptions::default());
    let mut after_model = model.clone();
    let rw = remat::rewrite(&mut after_model.graph, &p, &drop).unwrap();
    let sch = graphopt_plan::schedule::memory_aware_schedule(&after_model.graph, true).unwrap();
    after_model.graph.set_order(sch.order.clone()).unwrap();
    graphopt_ir::verify::verify_model(&after_model).unwrap();
    let sim = p.simulate(&drop);
    assert!(
        sch.peak <= sim.peak,
        "{}: planner peak {} above the simulated {}",
        path.display(),
        sch.peak,
        sim.peak
    );
    // cse leaves the copies alone.
    let mut merged = after_model.clone();
    let cse = graphopt_passes::lookup("cse").unwrap();
    cse.run(&mut merged).unwrap();
    assert_eq!(
        merged.graph.node_count(),
        after_model.graph.node_count(),
        "{}: cse merged recomputed copies",
        path.display()
    );
    out += &format!(
        "rewritten: {} copies ({:?}); planner peak {} B (heuristic {})\n\n",
        rw.recomputed_nodes.len(),
        rw.dropped_values,
        sch.peak,
        sch.heuristic
    );
    let after = print_model(&after_model, &PrintOptions::default());
    out += &similar::TextDiff::from_lines(&before, &after)
        .unified_diff()
        .context_radius(1000)
        .header("before", "after")
        .to_string();
    out
}

#[test]
fn remat_fixtures() {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root().join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let _guard = settings.bind_to_scope();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnxtxt"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for f in files {
        let case = f.file_stem().unwrap().to_string_lossy().to_string();
        insta::assert_snapshot!(case.as_str(), run_case(&f));
    }
}

/// Every fixture is a training graph; an inference model is not, whether
/// everything computes its one output or a second head reads the first's
/// cone (then the "loss" is not a scalar).
#[test]
fn training_graphs_are_told_from_inference_models() {
    let problem = |src: &str| {
        let mut model = parse_model(src).unwrap();
        graphopt_ir::infer::infer_model(&mut model, &Default::default());
        let p = Problem::new(&model.graph);
        remat::not_a_training_graph(&model.graph, &p)
    };
    let mut fixtures = 0;
    for entry in std::fs::read_dir(root()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "onnxtxt") {
            let why = problem(&std::fs::read_to_string(&path).unwrap());
            assert_eq!(why, None, "{}", path.display());
            fixtures += 1;
        }
    }
    assert!(fixtures >= 4);
    let one = "<ir_version: 8, opset_import: [\"\" : 17]>\n\
               one (float[4,8] x) => (float[4,8] y) {\n  a = Tanh (x)\n  y = Relu (a)\n}\n";
    let why = problem(one).expect("an inference model");
    assert!(
        why.contains("every node computes the first output"),
        "{why}"
    );
    let two = "<ir_version: 8, opset_import: [\"\" : 17]>\n\
               two (float[4,8] x) => (float[4,8] y, float[4,8] z) {\n  a = Tanh (x)\n  \
               y = Relu (a)\n  z = Sigmoid (a)\n}\n";
    let why = problem(two).expect("an inference model with two heads");
    assert!(why.contains("output 'y', has 32 elements"), "{why}");
}

/// The simulator counts in-place Scatters as the planner does: a
/// ScatterElements writing over zeros that die there (MaxPool's and
/// Gather's gradients) shares their storage, and one whose `data` is read
/// again, or is also its `updates`, does not. Store-all, in the graph's
/// order, the simulated peak is the planner's (the scatter's step is the
/// peak, so sharing or not shows).
#[test]
fn simulated_scatter_in_place_matches_the_planner() {
    let add = "reduction = \"add\"";
    for (body, merged) in [
        (
            format!("s = ScatterElements <axis = 0, {add}> (z, i, u)\n  y = Exp (s)"),
            true,
        ),
        (
            format!("s = ScatterElements <axis = 0, {add}> (z, i, u)\n  y = Add (s, z)"),
            false,
        ),
        (
            format!("s = ScatterElements <axis = 0, {add}> (z, i, z)\n  y = Exp (s)"),
            false,
        ),
    ] {
        let src = format!(
            "<ir_version: 8, opset_import: [\"\" : 16]>\n\
             g (float[8] x, int64[8] i) => (float loss, float[256] y)\n  \
             <int64[1] n = {{256}}> {{\n  \
             a = Exp (x)\n  loss = ReduceSum <keepdims = 0> (a)\n  \
             u = Neg (a)\n  z = ConstantOfShape (n)\n  {body}\n}}\n"
        );
        let mut model = parse_model(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        graphopt_ir::infer::infer_model(&mut model, &Default::default());
        let g = &model.graph;
        let p = Problem::new(g);
        let sim = p.simulate(&vec![false; p.len()]).peak;
        let live = graphopt_plan::liveness::liveness(g, g.order()).unwrap();
        let (planned, _) = graphopt_plan::liveness::peak(&live.storages, g.order().len());
        assert_eq!(sim, planned, "{body}");
        let aliased = live.aliases.iter().any(|a| a.op_type == "ScatterElements");
        assert_eq!(aliased, merged, "{body}");
    }
}
