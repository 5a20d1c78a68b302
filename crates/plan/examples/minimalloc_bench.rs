//! Runs the interval planner on a folder of MiniMalloc CSV instances and
//! prints one row per instance.
//!
//! `cargo run --release -p graphopt-plan --example minimalloc_bench -- <dir> [seconds] [--no-target] [--threads N] [--json FILE] [--nodes N|--default]`
//!
//! `--nodes N` ends each search on a node budget instead of the clock (no
//! time limit: the plans are the same on every run and machine);
//! `--default` uses the budget `graphopt plan --intervals` uses by default
//! ([`default_node_budget`]), so the table shows what users get.
//!
//! The capacity is read from the file name (`A.1048576.csv` means
//! 1,048,576 bytes), as in MiniMalloc's benchmark folders, and given to the
//! planner as its first target, the way MiniMalloc's solver receives it
//! (`--no-target` starts from the lower bound alone). `time_s` is the time
//! until the reported arena was found; the search itself runs until the
//! arena is proven optimal or the time limit.

use graphopt_plan::greedy::Greedy;
use graphopt_plan::{
    arena_of, check_plan, default_node_budget, lower_bound, plan_intervals, read_minimalloc_csv,
    IntervalOptions,
};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().cloned() else {
        eprintln!("usage: minimalloc_bench <dir> [seconds, default 1] [--no-target] [--threads N] [--json FILE]");
        std::process::exit(2);
    };
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let no_target = args.iter().any(|a| a == "--no-target");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let threads: usize = flag("--threads").and_then(|s| s.parse().ok()).unwrap_or(2);
    let json_out = flag("--json");
    let nodes: Option<u64> = flag("--nodes").and_then(|s| s.parse().ok());
    let default_budget = args.iter().any(|a| a == "--default");
    let mut rows: Vec<String> = Vec::new();
    let mut files: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect(),
        Err(e) => {
            eprintln!("cannot read {dir}: {e}");
            std::process::exit(1);
        }
    };
    files.sort();
    println!(
        "{:<10} {:>7} {:>11} {:>11} {:>11} {:>11} {:>7} {:>8} {:>8} {:>9} {:>8} {:>9}  strategy",
        "instance",
        "buffers",
        "lower",
        "best-known",
        "greedy",
        "ours",
        "ratio",
        "time_s",
        "total_s",
        "nodes",
        "known_s",
        "known_n"
    );
    let mut failures = 0;
    for f in files {
        let name = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{}: {e}", f.display());
                failures += 1;
                continue;
            }
        };
        let bufs = match read_minimalloc_csv(&text) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{}: {e}", f.display());
                failures += 1;
                continue;
            }
        };
        let known: Option<u64> = name.split('.').nth(1).and_then(|s| s.parse().ok());
        let budget = if default_budget {
            Some(default_node_budget(bufs.len()))
        } else {
            nodes
        };
        let opts = IntervalOptions {
            alignment: 1,
            time_limit: match budget {
                Some(_) => None,
                None => Some(Duration::from_secs_f64(secs)),
            },
            search: true,
            node_budget: budget.unwrap_or(u64::MAX),
            target: if no_target { None } else { known },
            threads,
        };
        let greedy = Greedy::ALL
            .iter()
            .map(|g| arena_of(&bufs, &g.assign(&bufs, 1)))
            .min()
            .unwrap_or(0);
        let t = Instant::now();
        let plan = plan_intervals(&bufs, &opts);
        let total = t.elapsed().as_secs_f64();
        let dt = plan.found_after_s;
        // When the arena first reached the best known one (the greedy
        // arena counts as found at 0 s; never: -1).
        let (to_known_s, to_known_nodes) = match known {
            Some(k) if plan.greedy_arena <= k => (0.0, 0),
            Some(k) => plan
                .improvements
                .iter()
                .find(|i| i.arena <= k)
                .map_or((-1.0, 0), |i| (i.seconds, i.nodes)),
            None => (-1.0, 0),
        };
        let lb = lower_bound(&bufs);
        let valid = check_plan(&bufs, &plan.offsets, plan.arena, 1, &[]).is_ok();
        if !valid {
            failures += 1;
        }
        println!(
            "{:<10} {:>7} {:>11} {:>11} {:>11} {:>11} {:>7.4} {:>8.3} {:>8.3} {:>9} {:>8.3} {:>9}  {}{}",
            name.split('.').next().unwrap_or(""),
            bufs.len(),
            lb,
            known.map(|k| k.to_string()).unwrap_or("-".into()),
            greedy,
            plan.arena,
            plan.arena as f64 / lb.max(1) as f64,
            dt,
            total,
            plan.nodes,
            to_known_s,
            to_known_nodes,
            plan.strategy,
            if valid { "" } else { "  INVALID" }
        );
        rows.push(format!(
            "{{\"instance\":\"{}\",\"buffers\":{},\"lower_bound\":{},\"best_known\":{},\"greedy_best\":{},\"arena\":{},\"ratio\":{:.4},\"time_s\":{:.3},\"search_s\":{:.3},\"nodes\":{},\"to_best_known_s\":{:.3},\"to_best_known_nodes\":{},\"strategy\":\"{}\",\"valid\":{}}}",
            name.split('.').next().unwrap_or(""),
            bufs.len(),
            lb,
            known.map(|k| k.to_string()).unwrap_or("null".into()),
            greedy,
            plan.arena,
            plan.arena as f64 / lb.max(1) as f64,
            dt,
            total,
            plan.nodes,
            to_known_s,
            to_known_nodes,
            plan.strategy,
            valid
        ));
    }
    if let Some(path) = json_out {
        let text = format!(
            "{{\"time_limit_s\":{secs},\"threads\":{threads},\"target_from_file_name\":{},\"instances\":[\n  {}\n]}}\n",
            !no_target,
            rows.join(",\n  ")
        );
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("{path}: {e}");
            failures += 1;
        }
    }
    if failures > 0 {
        std::process::exit(1);
    }
}
