//! `graphopt run`: runs a model in graphopt's runtime, one arena laid out
//! by the planner ([`graphopt::Session::run`]), and prints latency and
//! memory; this file turns arguments into that call and prints the report.

use crate::util::{human_bytes, json_text, print_out};
use graphopt::{Device, Error, Inputs, RunOptions};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(clap::Args)]
pub struct Args {
    /// The ONNX model.
    input: PathBuf,
    /// Inputs named like the model's in a numpy `.npz` (default: seeded
    /// random); their shapes bind the input dims.
    #[arg(long, value_name = "IN.npz")]
    inputs: Option<PathBuf>,
    /// Write the outputs to a numpy `.npz`.
    #[arg(short = 'o', long = "output", value_name = "OUT.npz")]
    output: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Bind a symbolic dim (NAME=VALUE), repeatable.
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Timed runs: the best and the median are printed.
    #[arg(long, default_value_t = 1, value_name = "N")]
    repeat: usize,
    /// Overwrite each arena region after its last reader, run again and
    /// fail when an output changed.
    #[arg(long)]
    poison: bool,
    /// Kernel threads (default: one per physical core)
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Feed --inputs holding NaN or Inf as they are (by default refused).
    #[arg(long)]
    allow_non_finite: bool,
    /// Plan the outputs of the model's donation table apart from the inputs
    /// they would overwrite (by default `<p>_new` is written over `<p>`).
    #[arg(long)]
    no_donate: bool,
    /// Time every node: print where the timed runs' time went, per op type
    /// and for the slowest nodes (CPU).
    #[arg(long)]
    profile: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> graphopt::Result<()> {
    let session = graphopt::load(&a.input)?;
    let dims = graphopt::util::parse_dims(&a.dims)?;
    let opts = RunOptions {
        inputs: match &a.inputs {
            Some(p) => Inputs::Npz(p.clone()),
            None => Inputs::default(),
        },
        dims,
        device: match a.device {
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
        },
        repeat: a.repeat,
        poison: a.poison,
        threads: a.threads,
        allow_non_finite: a.allow_non_finite,
        donate: !a.no_donate,
        profile: a.profile,
        tamper: None,
    };
    let r = session.run(&opts)?;
    if let Some(out) = &a.output {
        let arrays = r
            .named_outputs()
            .map(|(n, t)| Ok((n.to_string(), graphopt::to_tract(t)?)))
            .collect::<graphopt::Result<Vec<_>>>()?;
        let bytes = graphopt::tract::npz::write(&arrays)
            .map_err(|e| Error::new(format!("{}: {e:#}", out.display())))?;
        graphopt::util::write_atomic(out, &bytes)?;
    }
    if a.json {
        print_out(&json_text(&r)?);
    } else {
        let mut s = String::new();
        s += &format!(
            "ran {} on {:?} ({} thread(s)), inputs: {}\n",
            a.input.display(),
            r.device,
            r.threads,
            r.inputs
        );
        s += &format!(
            "latency     best {:.3} ms, median {:.3} ms of {}\n",
            r.latency_best_ms, r.latency_median_ms, r.repeat
        );
        s += &format!(
            "weights     {} resident (the initializers as stored, read in place{})\n",
            human_bytes(r.weights_bytes),
            if r.weights_copied_bytes > 0 {
                format!(
                    "; {} copied for alignment",
                    human_bytes(r.weights_copied_bytes)
                )
            } else {
                String::new()
            }
        );
        if r.palettized_weights > 0 {
            s += &format!(
                "palette     {} palettized weight(s) decoded per tile in {} fused node(s): {} of float32 weights never materialized\n",
                r.palettized_weights,
                r.palette_fused_nodes,
                human_bytes(r.palette_decoded_bytes)
            );
        }
        if r.quantized_weights > 0 {
            s += &format!(
                "quantized   {} integer weight(s) decoded per tile in {} fused node(s): {} of float32 weights never materialized\n",
                r.quantized_weights,
                r.quantized_fused_nodes,
                human_bytes(r.quantized_decoded_bytes)
            );
        }
        if r.half_fused_nodes > 0 {
            s += &format!(
                "half        {} MatMul/Gemm(s) widen their float16/bfloat16 weights per tile: {} of float32 copies never made\n",
                r.half_fused_nodes,
                human_bytes(r.half_widened_bytes)
            );
        }
        if r.elementwise_chains > 0 {
            s += &format!(
                "fused       {} elementwise node(s) run as {} chain(s), one loop over tiles each: their intermediates are never planned\n",
                r.elementwise_chain_nodes, r.elementwise_chains
            );
        }
        if r.residual_convs > 0 {
            s += &format!(
                "fused       {} Conv(s) add their residual image by image: their whole outputs are never planned\n",
                r.residual_convs
            );
        }
        if r.integer_matmuls > 0 {
            s += &format!(
                "quantized   {} MatMul/Gemm(s) of quantized activations run as integer GEMMs\n",
                r.integer_matmuls
            );
        }
        if r.integer_convs + r.qlinear_convs > 0 {
            s += &format!(
                "quantized   {} Conv(s) of quantized activations run on integer sums ({} with their \
                 QuantizeLinear as QLinearConv)\n",
                r.integer_convs + r.qlinear_convs,
                r.qlinear_convs
            );
        }
        if r.moved_pairs > 0 {
            s += &format!(
                "quantized   {} DequantizeLinear/QuantizeLinear pair(s) around Reshape/Transpose-like \
                 nodes dropped (they move the 8-bit values)\n",
                r.moved_pairs
            );
        }
        for (w, why) in &r.palette_kept {
            s += &format!("coded       {w}: decoded whole by its plain nodes ({why})\n");
        }
        s += &format!(
            "arena       {} planned, {} allocated{}\n",
            human_bytes(r.arena_planned_bytes),
            human_bytes(r.arena_allocated_bytes),
            if r.donated_bytes > 0 {
                format!(
                    " (holding {} of donated inputs once: parameters and optimizer state)",
                    human_bytes(r.donated_bytes)
                )
            } else {
                String::new()
            }
        );
        s += &format!("workspace   {}\n", human_bytes(r.workspace_bytes));
        if r.fused_activations > 0 {
            s += &format!(
                "fused       {} Relu/Clip node(s) applied by the Conv before them\n",
                r.fused_activations
            );
        }
        if r.subgraph_arena_bytes > 0 {
            s += &format!(
                "subgraphs   {} (nested arenas and workspaces: If/Loop/Scan bodies, nodes run alone)\n",
                human_bytes(r.subgraph_arena_bytes)
            );
        }
        if !r.dynamic_values.is_empty() {
            let shown: Vec<&str> = r
                .dynamic_values
                .iter()
                .take(8)
                .map(|s| s.as_str())
                .collect();
            s +=
                &format!(
                "dynamic     {} peak outside the arena, {} value(s) of data-dependent size: {}{}\n",
                human_bytes(r.dynamic_bytes),
                r.dynamic_values.len(),
                shown.join(", "),
                if r.dynamic_values.len() > shown.len() { ", ..." } else { "" }
            );
        }
        if let Some(c) = &r.cuda {
            s += &format!(
                "gpu         {}: {} kernel launch(es) per run, {} compiled kernel(s), setup {:.0} ms\n",
                c.gpu, c.launches_per_run, c.compiled_kernels, c.setup_ms
            );
            s += &format!(
                "device mem  {} expected (weights {} + arena {} + workspace {}), {} measured by cuMemGetInfo\n",
                human_bytes(c.expected_device_bytes),
                human_bytes(c.weights_device_bytes),
                human_bytes(c.arena_device_bytes),
                human_bytes(c.workspace_device_bytes),
                human_bytes(c.measured_device_bytes)
            );
            s += &format!(
                "cuda graph  {}\n",
                match (&c.graph_error, c.graph_replay) {
                    (Some(e), _) => format!("capture failed, ran op by op: {e}"),
                    (None, true) => "timed runs replayed one captured graph".to_string(),
                    (None, false) => "not used (one run)".to_string(),
                }
            );
        }
        if let Some(p) = r.peak_rss_bytes {
            s += &format!("peak RSS    {}\n", human_bytes(p));
        }
        if let Some(p) = &r.poison {
            s += &format!(
                "poison      {} region(s) poisoned, {}\n",
                p.regions,
                if p.ok {
                    "no output changed".to_string()
                } else {
                    format!("POISON REACHED {}", p.poisoned_outputs.join(", "))
                }
            );
        }
        for (n, t) in r.output_names.iter().zip(&r.outputs) {
            s += &format!("output      {n}: {:?} {:?}\n", t.dtype, t.shape);
        }
        if let Some(p) = &r.profile {
            s += &profile_text(p);
        }
        print_out(&s);
    }
    r.outcome()
}

/// The profile as a table: op types, then the slowest nodes.
fn profile_text(p: &graphopt::Profile) -> String {
    let mut s = format!(
        "\nprofile     {:.3} ms in the nodes per run (mean of the timed runs)\n",
        p.nodes_ms
    );
    s += &format!(
        "  {:<28} {:>6} {:>10} {:>7}\n",
        "op", "nodes", "ms", "share"
    );
    for o in &p.ops {
        s += &format!(
            "  {:<28} {:>6} {:>10.3} {:>6.1}%\n",
            o.op,
            o.nodes,
            o.ms,
            100.0 * o.share
        );
    }
    s += "  slowest nodes\n";
    for n in p.nodes.iter().take(graphopt::Profile::NODES) {
        s += &format!(
            "  {:<48} {:<14} {:>10.3} {:>6.1}%\n",
            n.node,
            n.op,
            n.ms,
            100.0 * n.share
        );
    }
    s
}
