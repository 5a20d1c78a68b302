//! The pass manager: runs a pipeline, verifies the IR after every pass,
//! dumps it before/after passes on request, times passes, iterates to a
//! fixed point, and can stop after N pass runs to bisect a miscompile.
//!
//! A pipeline runs whole or not at all: when a pass fails, the model is
//! restored to what it was before the first pass.
//!
//! One [`PassContext`] serves the whole pipeline: facts computed for one
//! pass (inferred types) are reused by the next until a pass changes the
//! model. Passes do not print: their warnings come back in each
//! [`PassRun`]'s stats for the caller to show.

use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::verify::verify_model;
use graphopt_ir::Model;
use std::time::{Duration, Instant};

/// Prints the IR for `--dump-ir` (the CLI passes the text printer in, so
/// that passes do not depend on the text format).
pub type DumpFn<'a> = &'a dyn Fn(&Model) -> String;

/// How to run a pipeline.
pub struct ManagerOptions<'a> {
    /// Verify after every pass (always on in debug builds and tests).
    /// Without it the model is verified once, after the last pass that
    /// changed it: an invalid model never leaves the manager either way,
    /// but only this names the pass that broke it.
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

/// One pass run. Its warnings are in `stats.warnings`.
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
    passes: &[Box<dyn Pass + '_>],
    opts: &mut ManagerOptions<'_>,
) -> Result<Vec<PassRun>, PassError> {
    let verify = opts.verify || cfg!(debug_assertions);
    // Whole or not at all: a failing pass (or a final verification that
    // fails) leaves the model as it was before the first pass. Tensor data
    // is shared between the copies, so this costs the graph's structure.
    let snapshot = model.clone();
    let result = run_passes(model, passes, opts, verify).and_then(|runs| {
        if !verify && runs.iter().any(|r| r.stats.changed) {
            let names: Vec<&str> = runs
                .iter()
                .filter(|r| r.stats.changed)
                .map(|r| r.pass)
                .collect();
            verify_model(model).map_err(|e| {
                PassError(format!(
                    "after passes {} (verify after each to find which): IR is invalid: {e}",
                    names.join(", ")
                ))
            })?;
        }
        Ok(runs)
    });
    if result.is_err() {
        *model = snapshot;
    }
    result
}

fn run_passes(
    model: &mut Model,
    passes: &[Box<dyn Pass + '_>],
    opts: &mut ManagerOptions<'_>,
    verify: bool,
) -> Result<Vec<PassRun>, PassError> {
    let mut runs = Vec::new();
    let mut cx = PassContext::new();
    for round in 0..opts.max_rounds.max(1) {
        let mut changed = false;
        for p in passes {
            if opts.stop_after.is_some_and(|n| runs.len() >= n) {
                return Ok(runs);
            }
            let name = p.name();
            let dump_this = opts
                .dump_filter
                .as_deref()
                .is_some_and(|f| dump_matches(f, name));
            if dump_this {
                dump(opts, &format!("before {name} (round {})", round + 1), model);
            }
            let nodes_before = model.graph.node_count_deep();
            let bytes_before = model.graph.initializer_bytes_deep();
            let t0 = Instant::now();
            let stats = p
                .run_in(model, &mut cx)
                .map_err(|e| PassError(format!("pass {name}: {e}")))?;
            let time = t0.elapsed();
            let nodes_after = model.graph.node_count_deep();
            let bytes_after = model.graph.initializer_bytes_deep();
            // The counts guard against a pass that changes the model but
            // forgets to say so.
            if stats.changed || nodes_after != nodes_before || bytes_after != bytes_before {
                cx.invalidate();
            }
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
                nodes_after,
                initializer_bytes_before: bytes_before,
                initializer_bytes_after: bytes_after,
            });
        }
        if !changed {
            break;
        }
    }
    Ok(runs)
}

/// Does `--dump-ir=FILTER` name pass `name`? `all`, or a comma list
/// (`-` and `_` are the same).
fn dump_matches(filter: &str, name: &str) -> bool {
    filter == "all"
        || filter
            .split(',')
            .any(|x| x.trim().replace('-', "_") == name)
}

fn dump(opts: &mut ManagerOptions<'_>, title: &str, model: &Model) {
    if let (Some(f), Some(sink)) = (opts.dump, opts.dump_sink.as_mut()) {
        let _ = writeln!(sink, "// ---- IR {title} ----\n{}", f(model));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A pass that reports a change on its first `changes` runs, logs its
    /// runs, and (if `typed`) reads the context's types, logging how many
    /// inferences the context has run by then.
    struct Fake<'a> {
        name: &'static str,
        changes: Cell<usize>,
        typed: bool,
        log: &'a RefCell<Vec<String>>,
    }

    impl<'a> Fake<'a> {
        fn new(name: &'static str, changes: usize, log: &'a RefCell<Vec<String>>) -> Self {
            Fake {
                name,
                changes: Cell::new(changes),
                typed: false,
                log,
            }
        }
    }

    impl Pass for Fake<'_> {
        fn name(&self) -> &'static str {
            self.name
        }
        fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
            self.run_in(model, &mut PassContext::new())
        }
        fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
            let mut entry = self.name.to_string();
            if self.typed {
                cx.types(model);
                entry += &format!("@{}", cx.inferences());
            }
            self.log.borrow_mut().push(entry);
            let mut stats = PassStats::default();
            if self.changes.get() > 0 {
                self.changes.set(self.changes.get() - 1);
                stats.changed = true;
                stats.warn(format!("{} changed", self.name));
            }
            Ok(stats)
        }
    }

    fn boxed<'a>(passes: Vec<Fake<'a>>) -> Vec<Box<dyn Pass + 'a>> {
        passes
            .into_iter()
            .map(|p| Box::new(p) as Box<dyn Pass + 'a>)
            .collect()
    }

    fn run(
        passes: &[Box<dyn Pass + '_>],
        opts: &mut ManagerOptions<'_>,
    ) -> Vec<(&'static str, usize)> {
        let mut m = Model::default();
        let runs = run_pipeline(&mut m, passes, opts).unwrap();
        runs.iter().map(|r| (r.pass, r.round)).collect()
    }

    /// Edits the model (its doc string), or fails.
    struct Edit(Option<&'static str>);

    impl Pass for Edit {
        fn name(&self) -> &'static str {
            if self.0.is_some() {
                "edit"
            } else {
                "fail"
            }
        }
        fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
            let Some(text) = self.0 else {
                return Err(PassError("injected failure".into()));
            };
            model.doc_string.push_str(text);
            Ok(PassStats {
                changed: true,
                ..PassStats::default()
            })
        }
    }

    #[test]
    fn a_failing_pass_restores_the_model() {
        let mut m = Model {
            doc_string: "start".into(),
            ..Model::default()
        };
        let passes: Vec<Box<dyn Pass>> = vec![
            Box::new(Edit(Some("+a"))),
            Box::new(Edit(Some("+b"))),
            Box::new(Edit(None)),
        ];
        let e = run_pipeline(&mut m, &passes, &mut ManagerOptions::default()).unwrap_err();
        assert!(e.0.contains("pass fail: injected failure"), "{}", e.0);
        assert_eq!(m.doc_string, "start");
        // Without the failing pass the edits stay.
        run_pipeline(&mut m, &passes[..2], &mut ManagerOptions::default()).unwrap();
        assert_eq!(m.doc_string, "start+a+b");
    }

    #[test]
    fn fixed_point_stops_when_nothing_changes() {
        let log = RefCell::new(Vec::new());
        let passes = boxed(vec![Fake::new("a", 2, &log), Fake::new("b", 0, &log)]);
        let mut opts = ManagerOptions {
            max_rounds: 8,
            ..ManagerOptions::default()
        };
        // Rounds 1 and 2 change (a), round 3 does not: three rounds.
        let runs = run(&passes, &mut opts);
        assert_eq!(
            runs,
            [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
        );
    }

    #[test]
    fn max_rounds_bounds_the_loop() {
        let log = RefCell::new(Vec::new());
        let passes = boxed(vec![Fake::new("a", 100, &log)]);
        let mut opts = ManagerOptions {
            max_rounds: 3,
            ..ManagerOptions::default()
        };
        assert_eq!(run(&passes, &mut opts).len(), 3);
        // Zero rounds still runs the pipeline once.
        let mut opts = ManagerOptions {
            max_rounds: 0,
            ..ManagerOptions::default()
        };
        assert_eq!(run(&passes, &mut opts), [("a", 0)]);
    }

    #[test]
    fn stop_after_counts_pass_runs_across_rounds() {
        let log = RefCell::new(Vec::new());
        let passes = boxed(vec![Fake::new("a", 100, &log), Fake::new("b", 0, &log)]);
        for (n, want) in [(0, 0), (1, 1), (3, 3), (5, 5)] {
            let mut opts = ManagerOptions {
                max_rounds: 8,
                stop_after: Some(n),
                ..ManagerOptions::default()
            };
            let runs = run(&passes, &mut opts);
            assert_eq!(runs.len(), want, "stop after {n}");
        }
        assert_eq!(
            log.borrow().len(),
            9,
            "a stopped pipeline runs no further pass"
        );
        let mut opts = ManagerOptions {
            max_rounds: 8,
            stop_after: Some(3),
            ..ManagerOptions::default()
        };
        assert_eq!(run(&passes, &mut opts), [("a", 0), ("b", 0), ("a", 1)]);
    }

    #[test]
    fn dump_filter_selects_passes() {
        let dumps = |filter: &str| -> Vec<String> {
            let log = RefCell::new(Vec::new());
            let passes = boxed(vec![
                Fake::new("fold_a", 0, &log),
                Fake::new("fuse_b", 0, &log),
                Fake::new("c", 0, &log),
            ]);
            let printer = |_: &Model| "IR".to_string();
            let mut sink: Vec<u8> = Vec::new();
            let mut opts = ManagerOptions {
                dump_filter: Some(filter.to_string()),
                dump: Some(&printer),
                dump_sink: Some(&mut sink),
                ..ManagerOptions::default()
            };
            run(&passes, &mut opts);
            drop(opts);
            String::from_utf8(sink)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("// ----"))
                .map(|l| {
                    l.trim_matches(|c| c == '/' || c == '-' || c == ' ')
                        .to_string()
                })
                .collect()
        };
        assert_eq!(
            dumps("fuse-b"),
            ["IR before fuse_b (round 1)", "IR after fuse_b (round 1)"]
        );
        assert_eq!(dumps("c, fold_a").len(), 4);
        assert_eq!(dumps("all").len(), 6);
        assert!(dumps("nothing").is_empty());
        assert!(dumps("fuse").is_empty(), "names match whole");
    }

    #[test]
    fn types_are_inferred_again_only_after_a_change() {
        let log = RefCell::new(Vec::new());
        let mut reader = Fake::new("r", 0, &log);
        reader.typed = true;
        let mut reader2 = Fake::new("s", 0, &log);
        reader2.typed = true;
        let passes = boxed(vec![reader, Fake::new("w", 1, &log), reader2]);
        let mut opts = ManagerOptions {
            max_rounds: 8,
            ..ManagerOptions::default()
        };
        run(&passes, &mut opts);
        // Round 1: r infers, w changes the model, s infers again. Round 2
        // changes nothing: both readers reuse the second inference.
        assert_eq!(*log.borrow(), ["r@1", "w", "s@2", "r@2", "w", "s@2"]);
    }

    #[test]
    fn fold_shapes_hands_its_types_over() {
        let log = RefCell::new(Vec::new());
        let mut reader = Fake::new("r", 0, &log);
        reader.typed = true;
        let passes: Vec<Box<dyn Pass + '_>> =
            vec![Box::new(crate::fold_shapes::FoldShapes), Box::new(reader)];
        run(&passes, &mut ManagerOptions::default());
        // fold_shapes folded nothing: the reader needs no inference.
        assert_eq!(*log.borrow(), ["r@0"]);
    }

    #[test]
    fn warnings_come_back_in_the_runs() {
        let log = RefCell::new(Vec::new());
        let passes = boxed(vec![Fake::new("a", 1, &log)]);
        let mut m = Model::default();
        let runs = run_pipeline(&mut m, &passes, &mut ManagerOptions::default()).unwrap();
        assert_eq!(runs[0].stats.warnings, ["a changed"]);
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
