//! `graphopt train`: trains a model with graphopt's training step
//! ([`graphopt::Session::train`]); this file turns arguments into that call
//! and prints what it returns (a progress bar on a terminal).

use crate::grad::{globs, Hyperparameters};
use crate::util::{human_bytes, json_text, print_out};
use graphopt::{DataSource, MappedData, Metric, TrainLength, TrainOptions};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model (an inference model: the training step is built from it).
    input: PathBuf,
    /// Where to write the trained model: the input model with its trained
    /// weights, no training nodes.
    #[arg(short = 'o', value_name = "TRAINED.onnx")]
    output: PathBuf,
    /// Training data: an npz whose arrays are named like the model's inputs,
    /// plus the target; or a folder of shards concatenated in name order (npz
    /// files, or npy files holding one array each). Read memory-mapped.
    #[arg(long, value_name = "TRAIN.npz|DIR")]
    data: PathBuf,
    /// Data measured after every epoch and at the end.
    #[arg(long, value_name = "EVAL.npz|DIR")]
    eval: Option<PathBuf>,
    /// What the eval pass measures (default accuracy).
    #[arg(long, value_name = "accuracy|loss")]
    metric: Option<String>,
    /// sum | mean | mse | l1 | cross_entropy (default cross_entropy).
    #[arg(long)]
    loss: Option<String>,
    /// The output the loss reads (default: the first).
    #[arg(long = "output", value_name = "NAME")]
    output_name: Option<String>,
    /// The data array holding the target (default `target`).
    #[arg(long, value_name = "NAME")]
    target: Option<String>,
    /// cross_entropy's class axis (default 1, as torch; -1 for language models).
    #[arg(long, allow_negative_numbers = true)]
    class_axis: Option<i64>,
    /// `all`, or comma-separated globs of trainable initializers.
    #[arg(long, value_name = "all|GLOB,...")]
    trainable: Option<String>,
    /// Comma-separated globs of initializers to keep frozen.
    #[arg(long, value_name = "GLOB,...")]
    frozen: Option<String>,
    /// sgd | adamw (default sgd).
    #[arg(long)]
    optimizer: Option<String>,
    #[command(flatten)]
    hyper: Hyperparameters,
    /// Examples per step. The last partial batch of an epoch is dropped.
    #[arg(long)]
    batch: usize,
    /// Split each batch into M equal micro-batches whose gradients are
    /// accumulated: the update is the whole batch's, in less memory.
    #[arg(long, value_name = "M")]
    micro_batches: Option<usize>,
    /// Bytes the step may plan for (parameters, optimizer state, gradient
    /// accumulators, arenas, workspaces), e.g. 2GB or 1.5GiB; without
    /// --micro-batches, the fewest micro-batches that fit are chosen.
    #[arg(long, value_name = "BYTES")]
    budget: Option<String>,
    /// Under --budget: `auto` recomputes forward values in the backward pass
    /// where micro-batches alone do not fit, so the largest micro-batch that
    /// fits wins; `none` only splits the batch (default auto).
    #[arg(long, value_name = "auto|none", requires = "budget")]
    remat: Option<String>,
    /// Share each batch between the ranks of an MPI launch (`mpirun -np N
    /// graphopt train ... --distributed dp`): `dp` all-reduces the
    /// gradients; `zero1` also cuts the optimizer state into one slice per
    /// rank; `zero2` also reduce-scatters the gradients. --batch is the
    /// global batch. Needs a graphopt built with `--features mpi`.
    #[arg(long, value_name = "dp|zero1|zero2")]
    distributed: Option<String>,
    /// dp and zero1: the size of a bucket of gradients, each all-reduced as
    /// soon as the backward pass has made it, while the pass goes on
    /// (default 25MiB).
    #[arg(long, value_name = "BYTES", requires = "distributed")]
    bucket_size: Option<String>,
    /// Train as one stage of the pipeline in DIR (`graphopt partition`):
    /// `mpirun -np K graphopt train MODEL --pipeline DIR ...`, one rank per
    /// stage; rank 0 writes the whole trained model.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["distributed", "budget", "checkpoint", "resume", "eval"])]
    pipeline: Option<PathBuf>,
    /// Seconds a rank waits for the others in one collective before it
    /// exits with an error (default 300).
    #[arg(long, value_name = "SECS")]
    comm_timeout: Option<f64>,
    /// Epochs (default: one, when --steps is not given either).
    #[arg(long, conflicts_with = "steps")]
    epochs: Option<usize>,
    /// Steps, continuing across epochs.
    #[arg(long)]
    steps: Option<usize>,
    /// Seed of each epoch's permutation of the examples (default 0).
    #[arg(long)]
    seed: Option<u64>,
    /// Visit the examples in file order.
    #[arg(long)]
    no_shuffle: bool,
    /// Dropout as in inference (default: training mode, as torch's model.train()).
    #[arg(long)]
    no_dropout: bool,
    /// Write checkpoints (weights, optimizer state, position) into DIR.
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// Steps between checkpoints, one also written at the end (default 100).
    #[arg(long, requires = "checkpoint")]
    every: Option<usize>,
    /// Continue from the latest checkpoint in DIR (or from this file).
    #[arg(long, value_name = "DIR|FILE")]
    resume: Option<PathBuf>,
    /// Write the step log as CSV: step, epoch, loss, lr, time, data wait.
    #[arg(long, value_name = "LOG.csv")]
    log: Option<PathBuf>,
    /// Draw the loss (and the eval metric) against the step as SVG.
    #[arg(long, value_name = "LOSS.svg")]
    plot: Option<PathBuf>,
    /// Threads of the runtime.
    #[arg(long)]
    threads: Option<usize>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Set when this process is a rank of a distributed run that failed.
static RANK_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is a rank of a distributed run that failed.
pub fn rank_failed() -> bool {
    RANK_FAILED.load(std::sync::atomic::Ordering::SeqCst)
}

pub fn run(a: Args) -> graphopt::Result<()> {
    // A distributed run joins the other ranks before anything else, and
    // each rank's error names it.
    let scheme = a
        .distributed
        .as_deref()
        .map(graphopt::distributed::Scheme::parse)
        .transpose()?;
    let what = match (scheme, &a.pipeline) {
        (Some(s), _) => format!("--distributed {}", s.name()),
        (None, Some(_)) => "--pipeline".to_string(),
        (None, None) => return train(a, &graphopt::distributed::World::solo(), None),
    };
    graphopt::distributed::require_launch(&what)?;
    let timeout = graphopt::distributed::comm_timeout(a.comm_timeout, "--comm-timeout")?;
    let world = graphopt::distributed::World::init(timeout)?;
    match train(a, &world, scheme) {
        // Finalizes MPI once every rank is done.
        Ok(()) => Ok(()),
        Err(e) => {
            // A failed rank exits at once, without finalizing MPI (which
            // would wait for ranks still inside a collective): `mpirun`
            // sees it exit and ends the others.
            if world.ranks() > 1 {
                RANK_FAILED.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            let e = world.rank_error(e);
            std::mem::forget(world);
            Err(e)
        }
    }
}

fn train(
    a: Args,
    world: &graphopt::distributed::World,
    scheme: Option<graphopt::distributed::Scheme>,
) -> graphopt::Result<()> {
    // Rank 0 writes and prints; the other ranks only report errors.
    let lead = world.rank() == 0;
    // The library's defaults, overridden by what is given.
    let mut opts = TrainOptions::new(a.batch);
    opts.distributed = scheme;
    if let Some(l) = &a.loss {
        opts.loss = graphopt::parse_loss(l)?;
    }
    opts.output = a.output_name.clone();
    if let Some(t) = &a.target {
        opts.target = t.clone();
    }
    opts.class_axis = a.class_axis.unwrap_or(opts.class_axis);
    let name = a
        .optimizer
        .as_deref()
        .unwrap_or(&opts.optimizer.name)
        .to_string();
    opts.optimizer = a.hyper.spec(&name)?;
    opts.trainable = globs(&a.trainable);
    opts.frozen = globs(&a.frozen);
    opts.dropout_train = !a.no_dropout;
    match (a.epochs, a.steps) {
        (_, Some(s)) => opts.length = TrainLength::Steps(s),
        (Some(e), None) => opts.length = TrainLength::Epochs(e),
        (None, None) => {}
    }
    opts.seed = a.seed.unwrap_or(opts.seed);
    opts.shuffle = !a.no_shuffle;
    opts.threads = a.threads;
    if let Some(m) = &a.metric {
        opts.metric = Metric::parse(m)?;
    }
    opts.checkpoint = a.checkpoint.clone();
    opts.every = a.every.unwrap_or(opts.every);
    opts.resume = a.resume.clone();
    opts.micro_batches = a.micro_batches;
    if let Some(b) = &a.bucket_size {
        opts.bucket_bytes = graphopt::util::parse_size(b)
            .map_err(|e| graphopt::Error::new(format!("--bucket-size {e}")))?;
    }
    opts.budget = a
        .budget
        .as_deref()
        .map(|b| {
            graphopt::util::parse_size(b).map_err(|e| graphopt::Error::new(format!("--budget {e}")))
        })
        .transpose()?;
    if let Some(r) = &a.remat {
        opts.remat = graphopt::parse_train_remat(r)?;
    }
    opts.validate()?;
    let mut session = graphopt::load(&a.input)?;
    if lead {
        session.check_output_path(&a.output)?;
    }
    let data = MappedData::open(&a.data)?;
    let eval = a.eval.as_deref().map(MappedData::open).transpose()?;
    let bar = lead && std::io::stderr().is_terminal() && !a.json;
    let started = Instant::now();
    let mut progress = |r: &graphopt::StepRecord| {
        if !bar {
            return;
        }
        let total = r.total_steps;
        let frac = r.step as f64 / total.max(1) as f64;
        let rate = r.step as f64 / started.elapsed().as_secs_f64().max(1e-9);
        let eta = total.saturating_sub(r.step) as f64 / rate.max(1e-9);
        let filled = (frac * 30.0).round() as usize;
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{:>6}/{total} [{}{}] loss {:<10.5} {rate:>6.2} steps/s  ETA {eta:>5.0} s ",
            r.step,
            "=".repeat(filled.min(30)),
            " ".repeat(30 - filled.min(30)),
            r.loss
        );
        let _ = err.flush();
    };
    let result = match &a.pipeline {
        Some(dir) => session.train_pipeline(
            world.comm(),
            dir,
            &data,
            eval.as_ref().map(|e| e as &dyn DataSource),
            &opts,
            &mut progress,
        ),
        None => session.train_on(
            world.comm(),
            &data,
            eval.as_ref().map(|e| e as &dyn DataSource),
            &opts,
            &mut progress,
        ),
    };
    if bar {
        eprintln!();
    }
    let r = result?;
    if !lead {
        return Ok(());
    }
    session.save(&a.output)?;
    if let Some(p) = &a.log {
        graphopt::util::write_atomic(p, r.log_csv().as_bytes())?;
    }
    if let Some(p) = &a.plot {
        let title = a.input.display().to_string();
        graphopt::util::write_atomic(p, graphopt::train_svg(&title, &r).as_bytes())?;
    }
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    if a.json {
        print_out(&json_text(&r)?);
        return Ok(());
    }
    let mut out = format!(
        "{} -> {}\ndata: {} ({} examples, batch {}{})\n",
        a.input.display(),
        a.output.display(),
        r.data,
        r.examples,
        r.batch,
        if r.dropped_per_epoch > 0 {
            format!(
                "; the last {} of each epoch's order are left out",
                r.dropped_per_epoch
            )
        } else {
            String::new()
        }
    );
    if let Some((from, step)) = &r.resumed_from {
        out += &format!("resumed from {from} at step {step}\n");
    }
    if r.micro_batches > 1 || r.budget_bytes.is_some() {
        out += &format!(
            "micro-batches: {} of {} examples{}\n",
            r.micro_batches,
            r.micro_batch,
            r.budget_bytes
                .map(|b| format!(
                    " (planned {} within --budget {})",
                    human_bytes(r.planned_bytes),
                    human_bytes(b)
                ))
                .unwrap_or_default()
        );
    }
    if let Some(d) = &r.distributed {
        out += &format!(
            "ranks: {} ({}, {}), {} examples each per step; rank 0 in collectives {:.3} s\n",
            d.ranks,
            d.engine,
            d.scheme.name(),
            d.local_batch,
            d.comm_s
        );
        if d.buckets > 0 {
            out += &format!(
                "gradients all-reduced in {} buckets, {} of them started during the backward pass\n",
                d.buckets, d.buckets_overlapped
            );
        }
        for b in &d.per_rank {
            out += &format!(
                "  rank {}: weights {}, optimizer state {}, gradients {}, arenas {}\n",
                b.rank,
                human_bytes(b.weights_bytes),
                human_bytes(b.optimizer_state_bytes),
                human_bytes(b.gradient_bytes),
                human_bytes(b.arena_bytes)
            );
        }
    }
    if let Some(p) = &r.pipeline {
        out += &format!(
            "pipeline: {} stages, {} micro-batches ({}, bubble {:.1}%); rank 0 sending and receiving {:.3} s\n",
            p.stages,
            p.micro_batches,
            p.schedule,
            p.bubble * 100.0,
            p.comm_s
        );
        for s in &p.per_stage {
            out += &format!(
                "  stage {}: {} parameters, weights {}, optimizer state {}, gradients {}, arenas {}, inputs in flight {}\n",
                s.stage,
                s.params,
                human_bytes(s.weights_bytes),
                human_bytes(s.optimizer_state_bytes),
                human_bytes(s.gradient_bytes),
                human_bytes(s.arena_bytes),
                human_bytes(s.in_flight_bytes)
            );
        }
    }
    if let Some(c) = &r.recompute {
        out += &format!(
            "recomputation: {} nodes ({}), {:+.1}% FLOPs; peak lower bound {} -> {}\n",
            c.recomputed_nodes,
            c.strategy,
            c.extra_flops_pct,
            human_bytes(c.lower_bound_before_bytes),
            human_bytes(c.lower_bound_after_bytes)
        );
    }
    out += &format!(
        "trained: {} steps ({:.2} epochs), {} loss, {}, {} parameters in {} tensors\n",
        r.steps,
        r.epochs,
        r.loss,
        r.optimizer,
        r.param_elements,
        r.params.len()
    );
    if let (Some(f), Some(l)) = (r.first_loss, r.last_loss) {
        out += &format!("loss: {f:.6} -> {l:.6}\n");
    }
    if let Some(e) = r.evals.last() {
        out += &format!(
            "eval {}: {:.4} on {} examples\n",
            match e.metric {
                Metric::Accuracy => "accuracy",
                Metric::Loss => "loss",
            },
            e.value,
            e.examples
        );
    }
    out += &format!(
        "memory: weights {}, optimizer state {}, arena {}{}, workspace {}{}\n",
        human_bytes(r.weights_bytes),
        human_bytes(r.state_bytes),
        human_bytes(r.arena_bytes),
        if r.donated_bytes > 0 {
            format!(
                " (holding {} of them once, updated in place)",
                human_bytes(r.donated_bytes)
            )
        } else {
            String::new()
        },
        human_bytes(r.workspace_bytes),
        r.peak_rss_bytes
            .map(|b| format!("; peak RSS {}", human_bytes(b)))
            .unwrap_or_default()
    );
    out += &format!(
        "time: {:.2} s ({:.2} steps/s, {} threads), waiting for data {:.3} s\n",
        r.time_s, r.steps_per_s, r.threads, r.data_wait_s
    );
    if let Some(c) = r.checkpoints.last() {
        out += &format!("checkpoints: {} (last {c})\n", r.checkpoints.len());
    }
    print_out(&out);
    Ok(())
}
