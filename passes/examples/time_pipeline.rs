//! Times the default pipeline (to a fixed point, as `graphopt optimize`
//! runs it) on models, for before/after comparisons of the pass manager
//! and the IR.
//!
//! ```sh
//! cargo run -p graphopt-passes --example time_pipeline -- [--runs N] MODEL.onnx...
//! ```
//!
//! Prints, per model, the median (and least) wall time of the whole pipeline over N runs
//! (default 5; the model is loaded once and cloned per run), then the
//! per-pass times of the median run, how many whole-model type inferences
//! the run needed (each run of a type-reading pass used to infer once; with
//! the manager's type cache, only the first such run after a change does,
//! unless fold_shapes has just handed over the types it inferred),
//! and a hash of the optimized model's
//! text (the same hash before and after a change to the IR or the manager
//! shows that the output did not change).

use graphopt_passes::manager::{run_pipeline, ManagerOptions};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 5;
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        runs = args[i + 1].parse().expect("--runs N");
        args.drain(i..i + 2);
    }
    for path in &args {
        let model = graphopt_onnx::load(std::path::Path::new(path))
            .expect("model loads")
            .model;
        let mut times: Vec<(Duration, Vec<(&'static str, Duration)>)> = Vec::new();
        let mut text = String::new();
        let mut inferences = (0, 0);
        for _ in 0..runs {
            let mut m = model.clone();
            let passes = graphopt_passes::default_pipeline();
            let mut opts = ManagerOptions {
                verify: true,
                max_rounds: 8,
                ..ManagerOptions::default()
            };
            let t0 = Instant::now();
            let r = run_pipeline(&mut m, &passes, &mut opts).expect("pipeline runs");
            let total = t0.elapsed();
            inferences = count_inferences(&r, model.onnx_opset().unwrap_or(0));
            let mut per: Vec<(&'static str, Duration)> = Vec::new();
            for run in &r {
                match per.iter_mut().find(|(n, _)| *n == run.pass) {
                    Some(e) => e.1 += run.time,
                    None => per.push((run.pass, run.time)),
                }
            }
            times.push((total, per));
            if times.len() == runs {
                text = graphopt_text::print_model(&m, &graphopt_text::PrintOptions::default());
            }
        }
        times.sort_by_key(|t| t.0);
        let (total, per) = &times[times.len() / 2];
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        println!(
            "{path}: median {:.1} ms (min {:.1}) over {runs} runs; output text hash {:016x}",
            ms(*total),
            ms(times[0].0),
            h.finish()
        );
        println!(
            "  type inferences: {} with one per type-reading pass run, {} with the cache",
            inferences.0, inferences.1
        );
        for (name, t) in per {
            println!("  {name:<22} {:8.1} ms", ms(*t));
        }
    }
}

/// Type-reading passes of the default pipeline, with the opset each needs
/// before it infers anything.
const TYPED: &[(&str, i64)] = &[
    ("eliminate_noops", 0),
    ("fuse_layer_norm", 17),
    ("fuse_gelu", 20),
    ("fuse_matmul_add", 7),
];

/// (inferences without a cache, with the manager's cache) for `runs`.
fn count_inferences(runs: &[graphopt_passes::manager::PassRun], opset: i64) -> (usize, usize) {
    let (mut plain, mut cached, mut valid) = (0, 0, false);
    for r in runs {
        if TYPED.iter().any(|&(n, min)| n == r.pass && opset >= min) {
            plain += 1;
            if !valid {
                cached += 1;
                valid = true;
            }
        }
        // fold_shapes infers in place (it always did) and, when it folds
        // nothing, hands those types to the cache.
        if r.pass == "fold_shapes" && !r.stats.changed {
            valid = true;
        }
        let moved = r.nodes_before != r.nodes_after
            || r.initializer_bytes_before != r.initializer_bytes_after;
        if r.stats.changed || moved {
            valid = false;
        }
    }
    (plain, cached)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
