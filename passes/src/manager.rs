//! The pass manager: runs a pipeline, verifies the IR after every pass,
//! dumps it before/after passes on request, times passes, iterates to a
//! fixed point, and can stop after N pass runs to bisect a miscompile.

use crate::{Pass, PassError, PassStats};
use graphopt_ir::verify::verify_model;
use graphopt_ir::Model;
use std::time::{Duration, Instant};

/// Prints the IR for `--dump-ir` (the CLI passes the text printer in, so
/// that passes do not depend on the text format).
pub type DumpFn<'a> = &'a dyn Fn(&Model) -> String;

/// How to run a pipeline.
pub struct ManagerOptions<'a> {
    /// Verify after every pass (always on in debug builds and tests).
    pub verify: bool,
    /// Dump the IR before and after passes whose name matches the filter
    /// (`all` or a comma list), to `dump_sink`.
    pub dump_filter: Option<String>,
    pub dump: Option<DumpFn<'a>>,
    pub dump_sink: Option<&'a mut dyn std::io::Write>,
    /// Repeat the pipeline until nothing changes (at most this many rounds).
    pub max_rounds: usize,
    /// Stop after this many pass runs (bisecting).
    pub stop_after: Option<usize>,
}

impl Default for ManagerOptions<'_> {
    fn default() -> Self {
        ManagerOptions {
            verify: cfg!(debug_assertions),
            dump_filter: None,
            dump: None,
            dump_sink: None,
            max_rounds: 1,
            stop_after: None,
        }
    }
}

/// One pass run.
#[derive(Clone, Debug)]
pub struct PassRun {
    pub pass: &'static str,
    pub round: usize,
    pub stats: PassStats,
    pub time: Duration,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub initializer_bytes_before: u64,
    pub initializer_bytes_after: u64,
}

/// Runs `passes` over `model`.
pub fn run_pipeline(
    model: &mut Model,
    passes: &[Box<dyn Pass>],
    opts: &mut ManagerOptions<'_>,
) -> Result<Vec<PassRun>, PassError> {
    let verify = opts.verify || cfg!(debug_assertions);
    let mut runs = Vec::new();
    for round in 0..opts.max_rounds.max(1) {
        let mut changed = false;
        for p in passes {
            if opts.stop_after.is_some_and(|n| runs.len() >= n) {
                return Ok(runs);
            }
            let name = p.name();
            let dump_this = opts.dump_filter.as_deref().is_some_and(|f| {
                f == "all" || f.split(',').any(|x| x.trim().replace('-', "_") == name)
            });
            if dump_this {
                dump(opts, &format!("before {name} (round {})", round + 1), model);
            }
            let nodes_before = model.graph.node_count_deep();
            let bytes_before = model.graph.initializer_bytes_deep();
            let t0 = Instant::now();
            let stats = p
                .run(model)
                .map_err(|e| PassError(format!("pass {name}: {e}")))?;
            let time = t0.elapsed();
            if verify {
                verify_model(model)
                    .map_err(|e| PassError(format!("after pass {name}: IR is invalid: {e}")))?;
            }
            if dump_this {
                dump(opts, &format!("after {name} (round {})", round + 1), model);
            }
            changed |= stats.changed;
            runs.push(PassRun {
                pass: name,
                round,
                stats,
                time,
                nodes_before,
                nodes_after: model.graph.node_count_deep(),
                initializer_bytes_before: bytes_before,
                initializer_bytes_after: model.graph.initializer_bytes_deep(),
            });
        }
        if !changed {
            break;
        }
    }
    Ok(runs)
}

fn dump(opts: &mut ManagerOptions<'_>, title: &str, model: &Model) {
    if let (Some(f), Some(sink)) = (opts.dump, opts.dump_sink.as_mut()) {
        let _ = writeln!(sink, "// ---- IR {title} ----\n{}", f(model));
    }
}

/// Test helpers for pass files: parse ONNX text, run one pass with the
/// verifier on, compare printed results.
#[cfg(test)]
pub(crate) mod testing {
    use crate::Pass;
    use graphopt_text::{parse_model, print_model, PrintOptions};

    fn run(pass: &dyn Pass, src: &str) -> String {
        let mut m = parse_model(src).unwrap_or_else(|e| panic!("fixture does not parse: {e}"));
        graphopt_ir::verify::verify_model(&m).expect("fixture is valid");
        pass.run(&mut m).expect("pass runs");
        graphopt_ir::verify::verify_model(&m)
            .unwrap_or_else(|e| panic!("after {}: {e}", pass.name()));
        print_model(&m, &PrintOptions::default())
    }

    fn canon(src: &str) -> String {
        print_model(
            &parse_model(src).expect("expected text parses"),
            &PrintOptions::default(),
        )
    }

    /// Asserts that `pass` turns `before` into `after`.
    pub(crate) fn assert_pass(pass: &dyn Pass, before: &str, after: &str) {
        assert_eq!(run(pass, before), canon(after), "pass {}", pass.name());
    }

    /// Asserts that `pass` leaves `src` as it is.
    pub(crate) fn assert_unchanged(pass: &dyn Pass, src: &str) {
        assert_eq!(
            run(pass, src),
            canon(src),
            "pass {} changed the graph",
            pass.name()
        );
    }
}
