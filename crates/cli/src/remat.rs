//! `graphopt remat`: recomputation under a memory budget
//! ([`graphopt::Session::remat`], [`graphopt::Session::remat_sweep`]); this
//! file turns arguments into those calls and prints what they return.

use crate::util::{human_bytes, json_text, print_out};
use graphopt::plan::DimValues;
use graphopt::{Budget, Error, RematOptions, RematStrategy};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The training graph (from `graphopt grad`, or any ONNX graph whose
    /// first output is the loss).
    input: PathBuf,
    /// Where to write the rewritten graph.
    #[arg(short = 'o', value_name = "OUT.onnx")]
    output: Option<PathBuf>,
    /// Peak memory budget: bytes (`2GiB`, `500MB`, `1000000`) or `PCT%` of
    /// the store-everything activation lower bound. With --sweep: the
    /// frontier point it picks is reported as `chosen` and marked in --svg.
    #[arg(long, value_name = "BYTES|PCT%")]
    budget: Option<String>,
    /// Bind a symbolic dim (NAME=VALUE), repeatable; others are 1.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// auto | optimal | fast | sqrt | per-block (default auto; with
    /// --sweep, default auto, fast, sqrt and per-block side by side).
    #[arg(long)]
    strategy: Option<String>,
    /// Seconds one solve may take (the exact solver returns its best).
    #[arg(long, value_name = "S", default_value_t = graphopt::REMAT_TIME_LIMIT_S)]
    time_limit: f64,
    /// Plan without the model's donation table (by default `<p>_new` is
    /// written over `<p>`, as in `plan` and `run`).
    #[arg(long)]
    no_donate: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Write the report as JSON.
    #[arg(long, value_name = "R.json")]
    report: Option<PathBuf>,
    /// Print the Pareto frontier of every strategy (peak against extra
    /// FLOPs) instead of rewriting.
    #[arg(long)]
    sweep: bool,
    /// Budgets per frontier with --sweep.
    #[arg(long, default_value_t = graphopt::SWEEP_POINTS)]
    points: usize,
    /// Write an SVG: when rewriting, the memory timeline before and after;
    /// with --sweep, the frontiers with the chosen point (--budget's pick,
    /// else the knee) marked, above the timelines of store-all and of that
    /// point.
    #[arg(long, value_name = "PLOT.svg")]
    svg: Option<PathBuf>,
    /// Write the decision per torch.fx node (save or recompute) as JSON,
    /// for a PyTorch selective-checkpoint policy: the model must come from
    /// `torch.onnx.export(..., dynamo=True)`, whose nodes name their fx
    /// nodes (`graphopt.torch.checkpoint` applies it for you).
    #[arg(long, value_name = "POLICY.json")]
    torch_policy: Option<PathBuf>,
}

pub fn run(a: Args) -> graphopt::Result<()> {
    let strategy = a
        .strategy
        .as_deref()
        .map(graphopt::parse_strategy)
        .transpose()?;
    let time_limit = graphopt::util::seconds("--time-limit", a.time_limit)?;
    let dims = DimValues::new(&graphopt::util::parse_dims(&a.dims)?);
    let mut session = graphopt::load(&a.input)?;
    if a.sweep && a.torch_policy.is_some() {
        return Err(Error::new(
            "remat: --torch-policy writes the decision of one budget; use it without --sweep",
        ));
    }
    if a.sweep {
        // No --strategy: the library's sweep set (graphopt::SWEEP_STRATEGIES).
        let strategies: Vec<RematStrategy> = strategy.into_iter().collect();
        let budget = a.budget.as_deref().map(Budget::parse).transpose()?;
        let s =
            session.remat_sweep_with_budget(&dims, &strategies, a.points, time_limit, budget)?;
        if a.json {
            print_out(&json_text(&s)?);
        } else {
            let mut out = format!(
                "{}: {} nodes, {} recomputable; store-all peak {}, {:.3} GFLOP\n",
                a.input.display(),
                s.nodes,
                s.candidates,
                human_bytes(s.lower_bound_store_all_bytes),
                s.flops as f64 / 1e9
            );
            for f in &s.frontiers {
                out += &format!(
                    "{} ({:.2} s):\n  {:>10} {:>9} {:>11} {:>7}\n",
                    f.strategy, f.seconds, "peak", "of all", "extra FLOPs", "copies"
                );
                for p in &f.points {
                    out += &format!(
                        "  {:>10} {:>8.1}% {:>10.2}% {:>7}\n",
                        human_bytes(p.peak_bytes),
                        100.0 * p.peak_fraction,
                        p.extra_flops_pct,
                        p.recomputed_nodes
                    );
                }
            }
            print_out(&out);
        }
        if let Some(path) = &a.report {
            graphopt::util::write_atomic(path, json_text(&s)?.as_bytes())?;
        }
        if let Some(path) = &a.svg {
            let svg = graphopt::remat_sweep_svg(&a.input.display().to_string(), &s);
            graphopt::util::write_atomic(path, svg.as_bytes())?;
        }
        return Ok(());
    }
    let output = a
        .output
        .as_ref()
        .ok_or_else(|| Error::new("remat: -o OUT.onnx is required (or --sweep)"))?;
    let budget = Budget::parse(
        a.budget
            .as_deref()
            .ok_or_else(|| Error::new("remat: --budget BYTES|PCT% is required (or --sweep)"))?,
    )?;
    session.check_output_path(output)?;
    if a.torch_policy.is_some() && !graphopt::has_fx_nodes(&session.model().graph) {
        return Err(Error::new(format!(
            "remat: --torch-policy: {} names no torch.fx node ({} metadata); export it with \
             torch.onnx.export(..., dynamo=True)",
            a.input.display(),
            graphopt::FX_NODE_KEY
        )));
    }
    let r = session.remat(&RematOptions {
        budget,
        dims: dims.clone(),
        strategy: strategy.unwrap_or(RematStrategy::Auto),
        time_limit,
        donate: !a.no_donate,
    })?;
    if let Some(path) = &a.torch_policy {
        // remat keeps the fx names of the nodes it saw: the policy exists
        // whenever the input names fx nodes, which was checked up front.
        let policy = r
            .torch_policy
            .as_ref()
            .ok_or_else(|| Error::new("remat: --torch-policy: no fx node survived the rewrite"))?;
        graphopt::util::write_atomic(path, json_text(policy)?.as_bytes())?;
    }
    session.save(output)?;
    if a.json {
        print_out(&json_text(&r)?);
    } else {
        let pct = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
        print_out(&format!(
            "{} -> {}\nstrategy {}{}: {} values dropped, {} nodes recomputed ({:.2} s)\n\
             activation lower bound {} -> {} ({:.1}%, budget {})\narena {} -> {}{}\n\
             FLOPs {:.3} G -> {:.3} G (+{:.2}%)\n",
            a.input.display(),
            output.display(),
            r.strategy,
            if r.proven_optimal {
                " (proven optimal)"
            } else {
                ""
            },
            r.dropped_values.len(),
            r.recomputed_nodes.len(),
            r.solve_seconds,
            human_bytes(r.lower_bound_before_bytes),
            human_bytes(r.lower_bound_after_bytes),
            pct(r.lower_bound_after_bytes, r.lower_bound_before_bytes),
            human_bytes(r.budget_bytes),
            human_bytes(r.arena_before_bytes),
            human_bytes(r.arena_after_bytes),
            if r.donated_bytes > 0 {
                format!(
                    " (holding {} of parameters and optimizer state once, donated)",
                    human_bytes(r.donated_bytes)
                )
            } else {
                String::new()
            },
            r.flops_before as f64 / 1e9,
            r.flops_after as f64 / 1e9,
            pct(
                r.flops_after - r.flops_before.min(r.flops_after),
                r.flops_before
            ),
        ));
    }
    if let Some(path) = &a.report {
        graphopt::util::write_atomic(path, json_text(&r)?.as_bytes())?;
    }
    if let Some(path) = &a.svg {
        let svg = graphopt::remat_svg(&a.input.display().to_string(), &r);
        graphopt::util::write_atomic(path, svg.as_bytes())?;
    }
    Ok(())
}
