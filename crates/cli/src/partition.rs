//! `graphopt partition`: cuts a model into pipeline stages
//! ([`graphopt::Session::partition`]); this file turns arguments into that
//! call, writes the stage files and the manifest, and prints the stages.

use crate::util::{human_bytes, json_text, print_out};
use graphopt::partition::{write_partition, PartitionOptions, Schedule};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model (the inference model `graphopt train` would train).
    input: PathBuf,
    /// Stages (one per rank of `mpirun -np K graphopt train --pipeline`).
    #[arg(long, value_name = "K")]
    stages: usize,
    /// Micro-batches per batch (default: the stage count).
    #[arg(long, value_name = "M")]
    micro_batches: Option<usize>,
    /// gpipe (every micro-batch forward, then every one backward; the
    /// default) or 1f1b (one forward and one backward in turn: stage k
    /// keeps at most K - k micro-batches' inputs).
    #[arg(long, value_name = "gpipe|1f1b")]
    schedule: Option<String>,
    /// Bind a symbolic dim for the FLOPs the cuts balance (NAME=VALUE).
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Plan each stage's training step on a batch of this data (npz or a
    /// folder of shards, as `train --data`): its weights, optimizer state,
    /// gradients, arenas and the inputs it keeps in flight.
    #[arg(long, value_name = "TRAIN.npz|DIR", requires = "batch")]
    data: Option<PathBuf>,
    /// The global batch of the plan (with --data).
    #[arg(long, requires = "data")]
    batch: Option<usize>,
    /// As `train`: the target array, loss, class axis and optimizer of the
    /// plan (defaults: target, cross_entropy, 1, sgd).
    #[arg(long, value_name = "NAME", requires = "data")]
    target: Option<String>,
    #[arg(long, requires = "data")]
    loss: Option<String>,
    #[arg(long, allow_negative_numbers = true, requires = "data")]
    class_axis: Option<i64>,
    #[arg(long, requires = "data")]
    optimizer: Option<String>,
    /// Bytes each stage's device has (one for all, or one per stage,
    /// comma-separated): the cuts are chosen so that every stage's plan
    /// fits (the least slowest stage among those that do); none fitting
    /// is an error.
    #[arg(long, value_name = "BYTES[,BYTES...]", requires = "data")]
    budget: Option<String>,
    /// The folder of stage files and manifest.json (created).
    #[arg(short = 'o', value_name = "DIR")]
    output: PathBuf,
    /// Print the manifest as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> graphopt::Result<()> {
    let mut opts = PartitionOptions::new(a.stages);
    if let Some(m) = a.micro_batches {
        opts.micro_batches = m;
    }
    if let Some(s) = &a.schedule {
        opts.schedule = Schedule::parse(s)?;
    }
    opts.dims = graphopt::util::parse_dims(&a.dims)?;
    let session = graphopt::load(&a.input)?;
    // The plan and the budgets are checked before anything is written.
    let (p, planned) = match (&a.data, a.batch) {
        (Some(d), Some(b)) => {
            let mut t = graphopt::TrainOptions::new(b);
            if let Some(x) = &a.target {
                t.target = x.clone();
            }
            if let Some(l) = &a.loss {
                t.loss = graphopt::parse_loss(l)?;
            }
            t.class_axis = a.class_axis.unwrap_or(t.class_axis);
            if let Some(o) = &a.optimizer {
                t.optimizer = graphopt::OptimizerSpec::named(o);
            }
            let budgets = match &a.budget {
                None => Vec::new(),
                Some(list) => list
                    .split(',')
                    .map(|x| {
                        graphopt::util::parse_size(x)
                            .map_err(|e| graphopt::Error::new(format!("--budget {e}")))
                    })
                    .collect::<graphopt::Result<Vec<u64>>>()?,
            };
            let data = graphopt::MappedData::open(d)?;
            let (p, planned) = session.partition_within(&opts, &data, &t, &budgets)?;
            (p, Some(planned))
        }
        _ => (session.partition(&opts)?, None),
    };
    write_partition(&p, &a.output)?;
    let m = &p.manifest;
    if a.json {
        let v = serde_json::json!({ "manifest": m, "planned": planned });
        print_out(&json_text(&v)?);
        return Ok(());
    }
    let total: u64 = m.stages.iter().map(|s| s.flops).sum::<u64>().max(1);
    let mut out = format!(
        "{} -> {}/ ({} stages, {} micro-batches, {}: bubble {:.1}%)\n",
        a.input.display(),
        a.output.display(),
        m.stages.len(),
        m.micro_batches,
        m.schedule.name(),
        m.bubble * 100.0
    );
    for s in &m.stages {
        out += &format!(
            "  stage {}: {} nodes, {:.1}% of the FLOPs, {} parameters ({}), receives {}, sends {}\n",
            s.index,
            s.nodes,
            s.flops as f64 * 100.0 / total as f64,
            s.params.len(),
            human_bytes(s.param_bytes),
            s.receives.len(),
            s.sends.len()
        );
    }
    for s in planned.iter().flatten() {
        out += &format!(
            "  stage {} plans {}: weights {}, optimizer state {}, gradients {}, arenas {}, inputs in flight {}\n",
            s.stage,
            human_bytes(s.total()),
            human_bytes(s.weights_bytes),
            human_bytes(s.optimizer_state_bytes),
            human_bytes(s.gradient_bytes),
            human_bytes(s.arena_bytes),
            human_bytes(s.in_flight_bytes)
        );
    }
    print_out(&out);
    Ok(())
}
