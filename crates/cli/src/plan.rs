//! `graphopt plan`: the memory plan of a model at concrete dims
//! ([`graphopt::Session::plan`], [`graphopt::Session::max_batch`]), or of a
//! MiniMalloc interval file ([`graphopt::plan::plan_intervals`]); this file
//! turns arguments into those calls and prints what they return.

use crate::util::{human_bytes, json_text, print_out};
use graphopt::plan::DimValues;
use graphopt::{Error, IntervalRequest, PlanGraph, PlanRequest, PlanSettings};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model (omit with --intervals).
    input: Option<PathBuf>,
    /// Plan a MiniMalloc CSV (`id,lower,upper,size`) instead of a model.
    #[arg(long, value_name = "FILE.csv", conflicts_with = "input")]
    intervals: Option<PathBuf>,
    /// Bind a symbolic dim (NAME=VALUE), repeatable.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Value given to symbolic input dims that no --dim binds.
    #[arg(long, default_value_t = 1, value_name = "N")]
    default_dim: i64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Draw memory over time (original and chosen order) and the arena
    /// layout into an SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Offset alignment in bytes (default 256 for models, 1 for intervals).
    #[arg(long, value_name = "N")]
    alignment: Option<u64>,
    /// Re-check the plan with the independent checker.
    #[arg(long)]
    verify: bool,
    /// Plan the model as written (what onnxruntime or `--device cuda`
    /// runs) rather than the graph `graphopt run` executes on the CPU,
    /// whose fused kernels usually need less arena. (`--distributed` plans
    /// the model as written.)
    #[arg(long)]
    as_written: bool,
    /// Wall-clock limit of the offset search in seconds. Opt-in: without it
    /// a node budget ends the search and the plan is the same every run.
    #[arg(long, value_name = "S")]
    time_limit: Option<f64>,
    /// Node budget of the offset search (default 200,000; with
    /// --intervals, 1,300 per buffer and at least 200,000).
    #[arg(long, value_name = "N")]
    nodes: Option<u64>,
    /// Keep the model's node order (no memory-aware scheduling).
    #[arg(long)]
    no_reorder: bool,
    /// Fail when a value's size is still unknown after shape inference
    /// (by default such values, data-dependent or loop-carried, are dynamic
    /// allocations outside the arena, listed as `dynamic_values`).
    #[arg(long)]
    strict: bool,
    /// The default before `--strict` existed; accepted and ignored.
    #[arg(long, hide = true, conflicts_with = "strict")]
    ignore_unknown: bool,
    /// Plan the outputs of the model's donation table apart from the inputs
    /// they would overwrite (`graphopt grad` declares `<p>_new` over `<p>`).
    #[arg(long)]
    no_donate: bool,
    /// Give a graph input's whole shape (NAME=D0,D1,...), repeatable: binds
    /// its symbolic dims and sets its unnamed ones.
    #[arg(long = "shape", value_name = "NAME=D0,D1,...")]
    shapes: Vec<String>,
    /// Take the input shapes from the arrays of an npz (`np.savez`), as
    /// onnxruntime would see them.
    #[arg(long, value_name = "FILE.npz")]
    inputs: Option<PathBuf>,
    /// A capacity for --intervals to try first (e.g. the one in a
    /// MiniMalloc file name); the search still tries lower.
    #[arg(long, value_name = "BYTES")]
    capacity: Option<u64>,
    /// Memory budget for weights + arena (e.g. 8GiB, 512MB, 1000000).
    #[arg(long, value_name = "SIZE")]
    budget: Option<String>,
    /// Find the largest batch that fits --budget.
    #[arg(long, requires = "budget")]
    max_batch: bool,
    /// With --max-batch on a training graph: also the largest batch once
    /// recomputation (`graphopt remat`) lowers the peak as far as it goes.
    #[arg(long, requires = "max_batch")]
    remat: bool,
    /// The batch dim's name (default: the first symbolic dim of the first
    /// graph input).
    #[arg(long, value_name = "NAME")]
    batch_dim: Option<String>,
    /// On a training graph (`graphopt grad --optimizer ...`): one rank's
    /// bytes when --ranks ranks train it under this scheme, as `train
    /// --distributed` holds them; the batch dim is the global batch (with
    /// --max-batch: the largest that fits --budget per rank).
    #[arg(long, value_name = "dp|zero1|zero2", requires = "ranks")]
    distributed: Option<String>,
    /// Ranks (devices) sharing the batch, with --distributed.
    #[arg(long, value_name = "N", requires = "distributed")]
    ranks: Option<usize>,
    /// Threads of the offset search (default: the machine's; the result is
    /// the same for any count).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

pub fn run(a: Args) -> graphopt::Result<()> {
    if let Some(csv) = &a.intervals {
        return run_intervals(&a, csv);
    }
    let Some(input) = a.input.clone() else {
        return Err(Error::new(
            "plan: give a model file, or --intervals FILE.csv",
        ));
    };
    let session = graphopt::load(&input)?;
    let mut shapes = graphopt::util::parse_shapes(&a.shapes)?;
    if let Some(p) = &a.inputs {
        shapes.extend(graphopt::util::npz_shapes(p)?);
    }
    let req = PlanRequest {
        dims: DimValues {
            bound: graphopt::util::parse_dims(&a.dims)?,
            shapes,
            default: Some(a.default_dim),
        },
        options: settings(&a).options()?,
        verify: a.verify,
        graph: if a.as_written {
            PlanGraph::AsWritten
        } else {
            PlanGraph::CpuRuntime
        },
    };
    let budget = a
        .budget
        .as_deref()
        .map(|b| graphopt::util::parse_size(b).map_err(|e| Error::new(format!("--budget {e}"))))
        .transpose()?;
    if let Some(s) = &a.distributed {
        let scheme = graphopt::distributed::Scheme::parse(s)?;
        let ranks = a.ranks.expect("clap requires --ranks");
        let rp = session.plan_distributed(
            &req,
            scheme,
            ranks,
            a.batch_dim.as_deref(),
            budget.filter(|_| a.max_batch),
        )?;
        return print_ranks(&input, &rp, a.json);
    }
    let max_batch = match a.max_batch {
        true => {
            let budget = budget.expect("clap requires --budget");
            Some(session.max_batch(&req, a.batch_dim.as_deref(), budget)?)
        }
        false => None,
    };
    let with_remat: Option<(String, i64, u64)> = match (a.max_batch && a.remat, budget) {
        (true, Some(budget)) => Some(session.max_batch_remat(
            &req.dims,
            a.batch_dim.as_deref(),
            budget,
            std::time::Duration::from_secs_f64(graphopt::REMAT_TIME_LIMIT_S),
            req.graph,
        )?),
        _ => None,
    };
    let single = match &max_batch {
        Some(_) => None,
        None => Some(session.plan(&req)?),
    };
    let planned = match (&max_batch, &single) {
        (Some(mb), _) => &mb.at,
        (None, Some(p)) => p,
        (None, None) => unreachable!("one of the two is planned"),
    };
    let batch = max_batch
        .as_ref()
        .map(|mb| (mb.dim.clone(), mb.batch, mb.budget));
    // `req.verify`: the library checked the plan independently.
    let (model, plan, dims) = (&planned.model, &planned.plan, &planned.dims);
    if let Some(path) = &a.svg {
        let svg =
            graphopt::plan::svg::model_svg(model, plan).map_err(|e| session_err(&input, e))?;
        graphopt::util::write_atomic(path, svg.as_bytes())?;
    }
    let defaulted: Vec<&str> = dims
        .iter()
        .filter(|d| d.defaulted)
        .map(|d| d.name.as_str())
        .collect();
    if a.json {
        let mut v = match &max_batch {
            Some(mb) => graphopt::max_batch_json(mb, a.default_dim, a.verify)?,
            None => graphopt::plan_json(planned, a.default_dim, a.verify)?,
        };
        if let (Some((_, b, total)), Some(o)) = (&with_remat, v.as_object_mut()) {
            o.insert("max_batch_remat".into(), json!(b));
            o.insert("max_batch_remat_bytes".into(), json!(total));
        }
        print_out(&json_text(&v)?);
        return Ok(());
    }
    let mut out = String::new();
    let bytes = |b: u64| format!("{} ({b} B)", human_bytes(b));
    out += &format!("model: {}\n", input.display());
    if let Some((name, b, budget)) = &batch {
        out += &format!(
            "max batch: {name}={b} fits the budget of {} (weights + arena = {})\n",
            bytes(*budget),
            bytes(plan.weights_bytes + plan.arena_bytes)
        );
    }
    if let Some((name, b, total)) = &with_remat {
        out += &format!(
            "max batch with recomputation (graphopt remat): {name}={b} (weights + arena = {})\n",
            bytes(*total)
        );
    }
    if dims.is_empty() {
        out += "dims: none symbolic\n";
    } else {
        let list: Vec<String> = dims
            .iter()
            .map(|d| {
                format!(
                    "{}={}{}",
                    d.name,
                    d.value,
                    if d.defaulted { " (default)" } else { "" }
                )
            })
            .collect();
        out += &format!("dims: {}\n", list.join(", "));
        if !defaulted.is_empty() {
            out += &format!(
                "  unbound dims are set to {} (--default-dim); bind them with --dim NAME=VALUE\n",
                a.default_dim
            );
        }
    }
    let lb = plan.lower_bound_bytes;
    let lbo = plan.lower_bound_original_order_bytes;
    out += &format!(
        "weights:                      {}\n",
        bytes(plan.weights_bytes)
    );
    out += "activations, lower bound (peak of live bytes)\n";
    out += &format!("  original order:             {}\n", bytes(lbo));
    out += &format!(
        "  chosen order:               {}  ({}, {:+.1}%)\n",
        bytes(lb),
        plan.heuristic,
        (lb as f64 / lbo.max(1) as f64 - 1.0) * 100.0
    );
    out += &format!(
        "  chosen order, {} B aligned: {}\n",
        plan.alignment,
        bytes(plan.arena_lower_bound_bytes)
    );
    out += &format!(
        "arena:                        {}  = {:.4}x the aligned bound{}\n",
        bytes(plan.arena_bytes),
        plan.arena_bytes as f64 / plan.arena_lower_bound_bytes.max(1) as f64,
        if plan.optimal { ", optimal" } else { "" }
    );
    out += &format!(
        "naive (no reuse):             {}\n",
        bytes(plan.naive_bytes)
    );
    out += &format!(
        "weights + arena:              {}\n",
        bytes(plan.weights_bytes + plan.arena_bytes)
    );
    if !plan.donated.is_empty() {
        out += &format!(
            "donated:                      {} outputs over their inputs ({} held once: parameters and optimizer state)\n",
            plan.donated.len(),
            bytes(plan.donated_bytes)
        );
    }
    if !plan.donations_refused.is_empty() {
        out += &format!(
            "not donated: {}{}\n",
            plan.donations_refused
                .iter()
                .take(4)
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
            if plan.donations_refused.len() > 4 {
                "; ..."
            } else {
                ""
            }
        );
    }
    out += &format!(
        "alignment: {} B; {} tensors, {} in place; schedule of {} nodes\n",
        plan.alignment,
        plan.tensors.len(),
        plan.aliases.len(),
        plan.schedule.len()
    );
    if !plan.dynamic_values.is_empty() {
        let shown: Vec<&str> = plan
            .dynamic_values
            .iter()
            .take(12)
            .map(String::as_str)
            .collect();
        out += &format!(
            "dynamic, outside the arena (size unknown at these dims; --strict fails instead): {} value(s): {}{}\n",
            plan.dynamic_values.len(),
            shown.join(", "),
            if plan.dynamic_values.len() > shown.len() { ", ..." } else { "" }
        );
    }
    let at = plan
        .schedule_names
        .get(plan.peak_step)
        .map(String::as_str)
        .unwrap_or("-");
    out += &format!(
        "live at the peak (step {} of {}, node '{}'):\n",
        plan.peak_step,
        plan.schedule.len(),
        at
    );
    for t in plan.peak_tensors.iter().take(20) {
        out += &format!(
            "  {:>12}  {}  <- {}\n",
            human_bytes(t.size),
            t.name,
            t.producer.as_deref().unwrap_or("(graph input)")
        );
    }
    if plan.peak_tensors.len() > 20 {
        out += &format!("  ... and {} more\n", plan.peak_tensors.len() - 20);
    }
    if a.verify {
        out += "verify: ok (independent checker)\n";
    }
    print_out(&out);
    Ok(())
}

fn run_intervals(a: &Args, csv: &Path) -> graphopt::Result<()> {
    let r = graphopt::plan_intervals_file(
        csv,
        &IntervalRequest {
            settings: settings(a),
            capacity: a.capacity,
            verify: a.verify,
        },
    )?;
    if let Some(path) = &a.svg {
        let svg = graphopt::plan::svg::intervals_svg(
            &csv.display().to_string(),
            &r.buffers,
            &r.offsets,
            r.arena_bytes,
            r.lower_bound_bytes,
        );
        graphopt::util::write_atomic(path, svg.as_bytes())?;
    }
    if a.json {
        print_out(&json_text(&r)?);
        return Ok(());
    }
    let mut out = String::new();
    out += &format!(
        "intervals: {} ({} buffers)\n",
        csv.display(),
        r.buffers.len()
    );
    out += &format!("lower bound:      {} B\n", r.lower_bound_bytes);
    out += &format!(
        "arena:            {} B  = {:.4}x the bound{} ({})\n",
        r.arena_bytes,
        r.arena_bytes as f64 / r.lower_bound_bytes.max(1) as f64,
        if r.optimal { ", optimal" } else { "" },
        r.strategy
    );
    out += &format!("best greedy:      {} B\n", r.greedy_bytes);
    out += &format!("naive (no reuse): {} B\n", r.naive_bytes);
    out += &format!("alignment:        {} B\n", r.alignment);
    if a.verify {
        out += "verify: ok (independent checker)\n";
    }
    print_out(&out);
    Ok(())
}

/// The planner settings the arguments give (the library fills defaults
/// and range-checks them).
fn settings(a: &Args) -> PlanSettings {
    PlanSettings {
        alignment: a.alignment,
        node_budget: a.nodes,
        threads: a.threads,
        time_limit: a.time_limit,
        no_reorder: a.no_reorder,
        strict: a.strict,
        no_donate: a.no_donate,
    }
}

/// `path: error`.
fn session_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::new(format!("{}: {e}", path.display()))
}

/// `plan --distributed`: one rank's bytes beside the ZeRO arithmetic.
fn print_ranks(
    input: &Path,
    rp: &graphopt::distributed::RankPlan,
    json: bool,
) -> graphopt::Result<()> {
    if json {
        print_out(&json_text(rp)?);
        return Ok(());
    }
    let b = &rp.per_rank;
    let psi = rp.param_elements;
    let mut out = format!(
        "model: {}\n{} on {} ranks: {}={} ({} per rank){}\n",
        input.display(),
        rp.scheme.name(),
        rp.ranks,
        rp.batch_dim,
        rp.batch,
        rp.rank_batch,
        rp.budget_bytes
            .map(|x| format!(", the largest that fits {} per rank", human_bytes(x)))
            .unwrap_or_default()
    );
    out += &format!(
        "parameters: {psi} ({}); optimizer state on one process: {}\n",
        human_bytes(psi * 4),
        human_bytes(rp.state_bytes)
    );
    out += &format!(
        "per rank: weights {}, optimizer state {}, gradients {}, activations {} = {}\n",
        human_bytes(b.weights_bytes),
        human_bytes(b.optimizer_state_bytes),
        human_bytes(b.gradient_bytes),
        human_bytes(b.arena_bytes),
        human_bytes(b.total())
    );
    print_out(&out);
    Ok(())
}
