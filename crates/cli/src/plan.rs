//! `graphopt plan`: the memory plan of a model at concrete dims, or of a
//! MiniMalloc interval file.
//!
//! Steps for a model:
//! 1. load, bind `--dim`s; symbolic dims of the graph inputs left unbound
//!    get `--default-dim` (1), and the output says which;
//! 2. shape inference ([`graphopt_ir::infer::infer_model`]) at those dims;
//! 3. [`graphopt_plan::plan_graph`]: schedule, liveness, in-place merges,
//!    offsets; values whose size is still unknown are an error naming them
//!    (or, with `--ignore-unknown`, left out of the arena and listed);
//! 4. the checker ([`graphopt_plan::check_graph_plan`]) on `--verify`.
//!
//! `--max-batch` searches the largest batch such that weights + arena fit
//! `--budget`: doubling, then bisection, re-inferring shapes at every
//! probe (memory is assumed to grow with the batch).

use crate::util::human_bytes;
use anyhow::{anyhow, bail, Context};
use graphopt_ir::{Dim, Model};
use graphopt_plan::{
    check_graph_plan, check_plan, default_node_budget, liveness, plan_graph, plan_intervals,
    read_minimalloc_csv, Buffer, IntervalOptions, Plan, PlanError, PlanOptions,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// Wall-clock limit of the offset search in seconds. Opt-in: without it
    /// a node budget ends the search and the plan is the same every run.
    #[arg(long, value_name = "S")]
    time_limit: Option<f64>,
    /// Node budget of the offset search (default 200,000; with
    /// --intervals, 2,000 per buffer and at least 200,000).
    #[arg(long, value_name = "N")]
    nodes: Option<u64>,
    /// Keep the model's node order (no memory-aware scheduling).
    #[arg(long)]
    no_reorder: bool,
    /// Leave values of unknown size out of the arena instead of failing.
    #[arg(long)]
    ignore_unknown: bool,
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
    /// The batch dim's name (default: the first symbolic dim of the first
    /// graph input).
    #[arg(long, value_name = "NAME")]
    batch_dim: Option<String>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(csv) = &a.intervals {
        return run_intervals(&a, csv);
    }
    let Some(input) = a.input.clone() else {
        bail!("plan: give a model file, or --intervals FILE.csv");
    };
    if a.default_dim < 0 {
        bail!("--default-dim cannot be negative");
    }
    let loaded = graphopt_onnx::load(&input)?;
    let base = loaded.model;
    let bound = crate::util::parse_dims(&a.dims)?;
    let opts = PlanOptions {
        alignment: a.alignment.unwrap_or(256).max(1),
        reorder: !a.no_reorder,
        search: true,
        time_limit: a.time_limit.map(Duration::from_secs_f64),
        node_budget: a.nodes.unwrap_or(200_000),
        threads: 2,
        ignore_unknown: a.ignore_unknown,
    };
    let budget = a.budget.as_deref().map(parse_size).transpose()?;
    let mut batch_info = None;
    let (model, plan, dims) = if a.max_batch {
        let budget = budget.expect("clap requires --budget");
        let name = match &a.batch_dim {
            Some(n) => n.clone(),
            None => input_syms(&base).into_iter().next().ok_or_else(|| {
                anyhow!(
                    "{}: no symbolic input dim to use as the batch; name one with --batch-dim",
                    input.display()
                )
            })?,
        };
        if bound.iter().any(|(k, _)| *k == name) {
            bail!("--max-batch varies '{name}': do not also bind it with --dim");
        }
        let (b, m, p, d) = max_batch(&base, &bound, a.default_dim, &name, budget, &opts, &input)?;
        batch_info = Some((name, b, budget));
        (m, p, d)
    } else {
        let (m, p, d) = plan_at(&base, &bound, a.default_dim, &opts, &input)?;
        (m, p, d)
    };
    let g = &model.graph;
    if a.verify {
        check_graph_plan(g, &plan).map_err(|errs| {
            anyhow!(
                "{}: plan check failed: {}",
                input.display(),
                errs.iter()
                    .map(|e| e.0.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })?;
    }
    if let Some(path) = &a.svg {
        let svg = svg_for_model(&model, &plan)?;
        crate::util::write_atomic(path, svg.as_bytes())?;
    }
    let defaulted: Vec<&str> = dims.iter().filter(|d| d.2).map(|d| d.0.as_str()).collect();
    if a.json {
        let mut v = serde_json::to_value(&plan)?;
        let o = v.as_object_mut().expect("a plan serializes to an object");
        o.insert(
            "dims".into(),
            json!(dims
                .iter()
                .map(|d| (d.0.clone(), json!(d.1)))
                .collect::<serde_json::Map<_, _>>()),
        );
        o.insert("default_dim".into(), json!(a.default_dim));
        o.insert("defaulted_dims".into(), json!(defaulted));
        o.insert("peak_tensors".into(), json!(plan.peak_tensors));
        o.insert("schedule_heuristic".into(), json!(plan.heuristic));
        o.insert("strategy".into(), json!(plan.strategy));
        o.insert("optimal".into(), json!(plan.optimal));
        if !plan.unknown_size.is_empty() {
            o.insert("unknown_size_values".into(), json!(plan.unknown_size));
        }
        if a.verify {
            o.insert("verified".into(), json!(true));
        }
        if let Some((name, b, budget)) = &batch_info {
            o.insert("batch_dim".into(), json!(name));
            o.insert("max_batch".into(), json!(b));
            o.insert("budget_bytes".into(), json!(budget));
        }
        crate::util::print_out(&format!("{}\n", serde_json::to_string_pretty(&v)?));
        return Ok(());
    }
    let mut out = String::new();
    let bytes = |b: u64| format!("{} ({b} B)", human_bytes(b));
    out += &format!("model: {}\n", input.display());
    if let Some((name, b, budget)) = &batch_info {
        out += &format!(
            "max batch: {name}={b} fits the budget of {} (weights + arena = {})\n",
            bytes(*budget),
            bytes(plan.weights_bytes + plan.arena_bytes)
        );
    }
    if dims.is_empty() {
        out += "dims: none symbolic\n";
    } else {
        let list: Vec<String> = dims
            .iter()
            .map(|d| format!("{}={}{}", d.0, d.1, if d.2 { " (default)" } else { "" }))
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
    out += &format!(
        "alignment: {} B; {} tensors, {} in place; schedule of {} nodes\n",
        plan.alignment,
        plan.tensors.len(),
        plan.aliases.len(),
        plan.schedule.len()
    );
    if !plan.unknown_size.is_empty() {
        out += &format!(
            "left out (unknown size, --ignore-unknown): {}\n",
            plan.unknown_size.join(", ")
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
    crate::util::print_out(&out);
    Ok(())
}

/// (name, value, defaulted) for every symbolic dim of the graph inputs,
/// plus `--dim` bindings of other names.
pub(crate) type DimList = Vec<(String, i64, bool)>;

/// Symbolic dim names of the graph inputs, in order of first appearance.
fn input_syms(m: &Model) -> Vec<String> {
    let g = &m.graph;
    let mut out: Vec<String> = Vec::new();
    for &v in &g.inputs {
        if g.initializer(v).is_some() {
            continue;
        }
        if let Some(s) = g.ty(v).and_then(|t| t.shape()) {
            for d in &s.dims {
                if let Dim::Sym(n) = d {
                    if !out.contains(n) {
                        out.push(n.clone());
                    }
                }
            }
        }
    }
    out
}

/// Infers shapes at the bound dims (unbound input dims get `default`) and
/// plans the model.
pub(crate) fn plan_at(
    base: &Model,
    bound: &[(String, i64)],
    default: i64,
    opts: &PlanOptions,
    input: &Path,
) -> anyhow::Result<(Model, Plan, DimList)> {
    let mut dims: DimList = bound.iter().map(|(k, v)| (k.clone(), *v, false)).collect();
    for s in input_syms(base) {
        if !dims.iter().any(|d| d.0 == s) {
            dims.push((s, default, true));
        }
    }
    let mut m = base.clone();
    graphopt_ir::infer::infer_model(
        &mut m,
        &graphopt_ir::infer::InferOptions {
            dims: dims.iter().map(|d| (d.0.clone(), d.1)).collect(),
        },
    );
    let plan = plan_graph(&m.graph, opts).map_err(|e| match e {
        PlanError::UnknownSizes(v) => {
            let shown: Vec<&str> = v.iter().take(12).map(String::as_str).collect();
            anyhow!(
                "{}: {} value(s) still have unknown size after shape inference at these dims: {}{} (bind dims with --dim NAME=VALUE, or pass --ignore-unknown to leave them out of the arena)",
                input.display(),
                v.len(),
                shown.join(", "),
                if v.len() > shown.len() { ", ..." } else { "" }
            )
        }
        other => anyhow!("{}: {other}", input.display()),
    })?;
    Ok((m, plan, dims))
}

/// The largest value of dim `name` whose plan fits `budget` bytes.
#[allow(clippy::type_complexity)]
fn max_batch(
    base: &Model,
    bound: &[(String, i64)],
    default: i64,
    name: &str,
    budget: u64,
    opts: &PlanOptions,
    input: &Path,
) -> anyhow::Result<(i64, Model, Plan, DimList)> {
    let probe = |b: i64| -> anyhow::Result<(Model, Plan, DimList)> {
        let mut dims = bound.to_vec();
        dims.push((name.to_string(), b));
        let (m, p, mut d) = plan_at(base, &dims, default, opts, input)?;
        for x in &mut d {
            if x.0 == name {
                x.2 = false;
            }
        }
        Ok((m, p, d))
    };
    let total = |p: &Plan| p.weights_bytes.saturating_add(p.arena_bytes);
    let first = probe(1)?;
    if total(&first.1) > budget {
        bail!(
            "{}: the budget of {} is too small even for {name}=1 (weights {} + arena {} = {})",
            input.display(),
            human_bytes(budget),
            human_bytes(first.1.weights_bytes),
            human_bytes(first.1.arena_bytes),
            human_bytes(total(&first.1))
        );
    }
    // Does the batch change anything at all?
    let mut best = (1i64, first);
    let (mut lo, mut hi) = (1i64, None::<i64>);
    let limit = 1i64 << 40;
    while hi.is_none() {
        let b = lo.saturating_mul(2);
        if b > limit {
            bail!(
                "{}: memory does not grow with '{name}' (is it the batch dim?)",
                input.display()
            );
        }
        let r = probe(b)?;
        if total(&r.1) <= budget {
            lo = b;
            best = (b, r);
        } else {
            hi = Some(b);
        }
    }
    let mut hi = hi.expect("set above");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let r = probe(mid)?;
        if total(&r.1) <= budget {
            lo = mid;
            best = (mid, r);
        } else {
            hi = mid;
        }
    }
    let (b, (m, p, d)) = best;
    Ok((b, m, p, d))
}

/// `8GiB`, `512MB`, `1.5GB`, `1000000` → bytes (KB/MB/GB/TB are powers of
/// 1000, KiB/MiB/GiB/TiB powers of 1024).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow!("--budget '{s}': expected a size such as 8GiB or 512MB"))?;
    let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        u => bail!("--budget '{s}': unknown unit '{u}' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"),
    };
    Ok((n * mul) as u64)
}

fn run_intervals(a: &Args, csv: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(csv).with_context(|| format!("{}: cannot read", csv.display()))?;
    let bufs = read_minimalloc_csv(&text).map_err(|e| anyhow!("{}: {e}", csv.display()))?;
    let align = a.alignment.unwrap_or(1).max(1);
    let opts = IntervalOptions {
        alignment: align,
        search: true,
        node_budget: a.nodes.unwrap_or(default_node_budget(bufs.len())),
        time_limit: a.time_limit.map(Duration::from_secs_f64),
        target: a.capacity,
        threads: 2,
    };
    let plan = plan_intervals(&bufs, &opts);
    if a.verify {
        check_plan(&bufs, &plan.offsets, plan.arena, align, &[]).map_err(|errs| {
            anyhow!(
                "{}: plan check failed: {}",
                csv.display(),
                errs.iter()
                    .map(|e| e.0.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })?;
    }
    let naive: u64 = bufs
        .iter()
        .filter(|b| b.is_live())
        .map(|b| graphopt_plan::align_up(b.size, align))
        .sum();
    if let Some(path) = &a.svg {
        let rects: Vec<Rect> = bufs
            .iter()
            .zip(&plan.offsets)
            .filter(|(b, _)| b.is_live())
            .map(|(b, &o)| Rect {
                name: b.id.to_string(),
                t0: b.lower,
                t1: b.upper,
                off: o,
                size: b.size,
            })
            .collect();
        let curve = interval_curve(&bufs);
        let svg = render_svg(
            &format!("{}", csv.display()),
            &[("live bytes", &curve, "#1f77b4")],
            &rects,
            plan.arena,
            plan.lower_bound,
        );
        crate::util::write_atomic(path, svg.as_bytes())?;
    }
    if a.json {
        let tensors: Vec<serde_json::Value> = bufs
            .iter()
            .zip(&plan.offsets)
            .map(|(b, &o)| {
                json!({"name": b.id.to_string(), "size": b.size, "offset": o, "first": b.lower, "last": b.upper - 1})
            })
            .collect();
        let v = json!({
            "naive_bytes": naive,
            "lower_bound_bytes": plan.lower_bound,
            "arena_bytes": plan.arena,
            "alignment": align,
            "greedy_bytes": plan.greedy_arena,
            "strategy": plan.strategy,
            "optimal": plan.optimal,
            "nodes": plan.nodes,
            "verified": a.verify,
            "tensors": tensors,
        });
        crate::util::print_out(&format!("{}\n", serde_json::to_string_pretty(&v)?));
        return Ok(());
    }
    let mut out = String::new();
    out += &format!("intervals: {} ({} buffers)\n", csv.display(), bufs.len());
    out += &format!("lower bound:      {} B\n", plan.lower_bound);
    out += &format!(
        "arena:            {} B  = {:.4}x the bound{} ({})\n",
        plan.arena,
        plan.arena as f64 / plan.lower_bound.max(1) as f64,
        if plan.optimal { ", optimal" } else { "" },
        plan.strategy
    );
    out += &format!("best greedy:      {} B\n", plan.greedy_arena);
    out += &format!("naive (no reuse): {naive} B\n");
    out += &format!("alignment:        {align} B\n");
    if a.verify {
        out += "verify: ok (independent checker)\n";
    }
    crate::util::print_out(&out);
    Ok(())
}

/// Live bytes of an interval set at every time boundary, as (time, bytes)
/// steps.
fn interval_curve(bufs: &[Buffer]) -> Vec<(i64, u64)> {
    let mut ev: Vec<(i64, i128)> = Vec::new();
    for b in bufs.iter().filter(|b| b.is_live()) {
        ev.push((b.lower, b.size as i128));
        ev.push((b.upper, -(b.size as i128)));
    }
    ev.sort_unstable();
    let mut out: Vec<(i64, u64)> = Vec::new();
    let mut cur = 0i128;
    for (t, d) in ev {
        cur += d;
        match out.last_mut() {
            Some(last) if last.0 == t => last.1 = cur.max(0) as u64,
            _ => out.push((t, cur.max(0) as u64)),
        }
    }
    out
}

/// A labelled (time, bytes) step line and its colour.
type Curve<'a> = (&'a str, &'a Vec<(i64, u64)>, &'a str);

struct Rect {
    name: String,
    t0: i64,
    t1: i64,
    off: u64,
    size: u64,
}

fn svg_for_model(m: &Model, plan: &Plan) -> anyhow::Result<String> {
    let g = &m.graph;
    let original: Vec<_> = g.nodes().collect();
    let curve = |order: &[graphopt_ir::NodeId]| -> anyhow::Result<Vec<(i64, u64)>> {
        let l = liveness::liveness_with(g, order, true).map_err(|e| anyhow!("{e}"))?;
        Ok(liveness::live_bytes(&l.storages, order.len())
            .into_iter()
            .enumerate()
            .map(|(i, b)| (i as i64, b))
            .collect())
    };
    let orig = curve(&original)?;
    let chosen = curve(&plan.schedule)?;
    let rects: Vec<Rect> = plan
        .tensors
        .iter()
        .filter(|t| t.size > 0)
        .map(|t| Rect {
            name: t.name.clone(),
            t0: t.first as i64,
            t1: t.last as i64 + 1,
            off: t.offset,
            size: t.size,
        })
        .collect();
    Ok(render_svg(
        &g.name,
        &[
            ("original order", &orig, "#d62728"),
            ("chosen order", &chosen, "#1f77b4"),
        ],
        &rects,
        plan.arena_bytes,
        plan.lower_bound_bytes,
    ))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Two panels: live bytes over time (one step line per curve, dashed
/// lines at the arena size and the bound), then the arena layout with one
/// rectangle per tensor (time × address; hover for name, size, offset).
fn render_svg(title: &str, curves: &[Curve], rects: &[Rect], arena: u64, bound: u64) -> String {
    let (w, ph, pad_l, pad_r, top) = (960.0f64, 260.0f64, 90.0f64, 20.0f64, 40.0f64);
    let lh = 360.0f64;
    let y2 = top + ph + 60.0; // layout panel top
    let height = y2 + lh + 50.0;
    let t_max = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.0 + 1))
        .chain(rects.iter().map(|r| r.t1))
        .max()
        .unwrap_or(1)
        .max(1);
    let t_min = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.0))
        .chain(rects.iter().map(|r| r.t0))
        .min()
        .unwrap_or(0)
        .min(t_max - 1);
    let y_max = curves
        .iter()
        .flat_map(|c| c.1.iter().map(|p| p.1))
        .chain([arena, bound])
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let pw = w - pad_l - pad_r;
    let xs = |t: i64| pad_l + (t - t_min) as f64 / (t_max - t_min) as f64 * pw;
    let ys = |b: f64| top + ph - b / y_max * ph;
    let mut s = String::new();
    s += &format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s += &format!(
        "<text x=\"{pad_l}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Memory over time: {}</text>\n",
        esc(title)
    );
    // Axes and grid of panel 1.
    for k in 0..=4 {
        let b = y_max * k as f64 / 4.0;
        let y = ys(b);
        s += &format!(
            "<line x1=\"{pad_l}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n",
            pad_l + pw
        );
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            pad_l - 6.0,
            y + 4.0,
            human_bytes(b as u64)
        );
    }
    // Arena label above its line, bound label below its own.
    for (label, val, color, dy) in [
        ("arena", arena, "#2ca02c", -4.0),
        ("lower bound", bound, "#555", 13.0),
    ] {
        let y = ys(val as f64);
        s += &format!(
            "<line x1=\"{pad_l}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"{color}\" stroke-dasharray=\"6 4\"/>\n",
            pad_l + pw
        );
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{color}\">{label} {}</text>\n",
            pad_l + pw,
            y + dy,
            human_bytes(val)
        );
    }
    for (i, (label, pts, color)) in curves.iter().enumerate() {
        let mut d = String::new();
        for (k, &(t, b)) in pts.iter().enumerate() {
            let next = pts.get(k + 1).map(|p| p.0).unwrap_or(t + 1);
            let (x0, x1, y) = (xs(t), xs(next), ys(b as f64));
            if k == 0 {
                d += &format!("M{x0:.1},{:.1} L{x0:.1},{y:.1} ", ys(0.0));
            } else {
                d += &format!("L{x0:.1},{y:.1} ");
            }
            d += &format!("L{x1:.1},{y:.1} ");
        }
        // The first curve (original order) wide and pale underneath, so a
        // chosen order equal to it still shows both.
        let (width, opacity) = if i == 0 && curves.len() > 1 {
            (4.0, 0.45)
        } else {
            (1.4, 1.0)
        };
        s += &format!(
            "<path d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\" stroke-opacity=\"{opacity}\"/>\n"
        );
        let ly = top + 14.0 + 16.0 * i as f64;
        s += &format!(
            "<line x1=\"{}\" x2=\"{}\" y1=\"{ly}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
            pad_l + 10.0,
            pad_l + 30.0,
            pad_l + 36.0,
            ly + 4.0,
            esc(label)
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">schedule step</text>\n",
        pad_l + pw / 2.0,
        top + ph + 30.0
    );
    // Panel 2: the arena layout.
    s += &format!(
        "<text x=\"{pad_l}\" y=\"{}\" font-size=\"15\" font-weight=\"bold\">Arena layout (time × address), {} tensors in {}</text>\n",
        y2 - 12.0,
        rects.len(),
        human_bytes(arena)
    );
    let amax = arena.max(1) as f64;
    let ya = |o: f64| y2 + lh - o / amax * lh;
    s += &format!(
        "<rect x=\"{pad_l}\" y=\"{y2}\" width=\"{pw}\" height=\"{lh}\" fill=\"#f7f7f7\" stroke=\"#999\"/>\n"
    );
    for k in 0..=4 {
        let o = amax * k as f64 / 4.0;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            pad_l - 6.0,
            ya(o) + 4.0,
            human_bytes(o as u64)
        );
    }
    for r in rects {
        let mut h: u32 = 2166136261;
        for c in r.name.bytes() {
            h = (h ^ c as u32).wrapping_mul(16777619);
        }
        let hue = h % 360;
        let (x0, x1) = (xs(r.t0), xs(r.t1));
        let (yt, yb) = (ya((r.off + r.size) as f64), ya(r.off as f64));
        s += &format!(
            "<rect x=\"{x0:.2}\" y=\"{yt:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"hsl({hue},60%,65%)\" stroke=\"#333\" stroke-width=\"0.3\"><title>{} size {} offset {} steps [{}, {})</title></rect>\n",
            (x1 - x0).max(0.5),
            (yb - yt).max(0.5),
            esc(&r.name),
            r.size,
            r.off,
            r.t0,
            r.t1
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">schedule step (chosen order)</text>\n",
        pad_l + pw / 2.0,
        y2 + lh + 30.0
    );
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("1.5 kb").unwrap(), 1500);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }
}
