//! `graphopt optimize --quantize MODE ...` and `--compress METHOD ...`:
//! the flags, their [`graphopt::QuantizeOptions`] and
//! [`graphopt::CompressOptions`], and the printed summaries of the
//! reports. `--calibration`, `--exclude`, `--max-error` and
//! `--no-measure` go with either (or both).

use crate::util::human_bytes;
use graphopt::{
    Calibrate, CompressOptions, CompressReport, QuantizeMode, QuantizeOptions, QuantizeReport,
};
use std::path::PathBuf;

/// `--quantize` and the flags that go with it.
#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// Quantize after the pass pipeline: int8 weights and activations
    /// (`dynamic`: DynamicQuantizeLinear; `static`: calibrated
    /// QuantizeLinear/DequantizeLinear), or weights only (`int8-weights`,
    /// `int4-weights`: blocked opset-21 DequantizeLinear).
    #[arg(long, value_name = "dynamic|static|int8-weights|int4-weights")]
    pub quantize: Option<String>,
    /// Compress weights after the pass pipeline (before --precision and
    /// --quantize): k-means palettes with uint4/uint8 indices
    /// (`cluster:BITS`, bits 2, 3, 4, 6 or 8, one codebook per tensor or per
    /// G output channels), low-rank factors (`lowrank`: the least rank
    /// keeping ENERGY of each layer's energy, default 0.95; a fixed RANK;
    /// or params=F of each layer's parameters; activation-aware with
    /// --calibration), or weights within TOL relative L2 of another read
    /// as it (`share`, TOL defaults to --max-error).
    #[arg(
        long,
        value_name = "cluster:BITS[:per-channel-groups=G]|lowrank[:ENERGY|:RANK|:params=F]|share[:TOL]"
    )]
    pub compress: Option<String>,
    /// Calibration inputs: one npz per batch (by input name), or a directory
    /// of them. Default: seeded random inputs, with a warning.
    #[arg(long, value_name = "FILE.npz|DIR")]
    pub calibration: Option<PathBuf>,
    /// How activation ranges are taken (static mode; default minmax).
    #[arg(
        long,
        requires = "quantize",
        value_name = "minmax|percentile[:P]|entropy"
    )]
    pub calibrate: Option<String>,
    /// One scale per output channel (the default).
    #[arg(long, requires = "quantize", conflicts_with = "per_tensor")]
    pub per_channel: bool,
    /// One scale per weight tensor.
    #[arg(long, requires = "quantize")]
    pub per_tensor: bool,
    /// Symmetric activations (int8, zero point 0) and int4 weights without
    /// zero points.
    #[arg(long, requires = "quantize")]
    pub symmetric: bool,
    /// int4 block size (along the reduction axis; default 32).
    #[arg(long, requires = "quantize", value_name = "32|64|128")]
    pub block_size: Option<i64>,
    /// Op types or node names to leave float (uncompressed).
    #[arg(long, value_name = "OP|NAME,...", value_delimiter = ',')]
    pub exclude: Vec<String>,
    /// Bound on every output's relative L2 error against the float model on
    /// the calibration inputs (default 0.05): layers go back to float, the
    /// most sensitive first, until it holds; a model that meets it only all
    /// float, or cannot be measured, is an error (nothing written). `none`
    /// quantizes without a bound (the error is still reported).
    #[arg(long, value_name = "E|none")]
    pub max_error: Option<String>,
    /// Skip measuring the error against the float model (tract, or
    /// graphopt's runtime, runs both on the calibration inputs); this turns
    /// the bound off too.
    #[arg(long, conflicts_with = "max_error")]
    pub no_measure: bool,
}

impl QuantizeArgs {
    /// Refuses the shared flags without `--quantize` or `--compress`.
    fn check_shared(&self) -> graphopt::Result<()> {
        if self.quantize.is_some() || self.compress.is_some() {
            return Ok(());
        }
        let given = [
            ("--calibration", self.calibration.is_some()),
            ("--exclude", !self.exclude.is_empty()),
            ("--max-error", self.max_error.is_some()),
            ("--no-measure", self.no_measure),
        ];
        match given.iter().find(|g| g.1) {
            Some((flag, _)) => Err(graphopt::Error::new(format!(
                "{flag} goes with --quantize or --compress"
            ))),
            None => Ok(()),
        }
    }

    /// The compression options, or `None` without `--compress`.
    pub fn compress_options(
        &self,
        dims: &[(String, i64)],
        memory: graphopt::plan::DimValues,
        pipeline: graphopt::PipelineOptions,
    ) -> graphopt::Result<Option<CompressOptions>> {
        self.check_shared()?;
        let Some(spec) = &self.compress else {
            return Ok(None);
        };
        let max_error = match &self.max_error {
            Some(e) => QuantizeOptions::parse_max_error(e)?,
            None => graphopt::DEFAULT_MAX_ERROR.into(),
        };
        let defaults = CompressOptions::parse(spec, max_error)?;
        Ok(Some(CompressOptions {
            calibration: self.calibration.clone().map(Into::into),
            dims: dims.to_vec(),
            exclude: self.exclude.clone(),
            measure: !self.no_measure && defaults.measure,
            memory: Some(memory),
            pipeline,
            ..defaults
        }))
    }

    /// The options, or `None` without `--quantize`.
    pub fn options(
        &self,
        dims: &[(String, i64)],
        memory: graphopt::plan::DimValues,
        pipeline: graphopt::PipelineOptions,
    ) -> graphopt::Result<Option<QuantizeOptions>> {
        self.check_shared()?;
        let Some(mode) = &self.quantize else {
            return Ok(None);
        };
        let mode = QuantizeMode::parse(mode)?;
        let defaults = QuantizeOptions::new(mode);
        let max_error = match &self.max_error {
            Some(e) => QuantizeOptions::parse_max_error(e)?,
            None => defaults.max_error,
        };
        Ok(Some(QuantizeOptions {
            calibration: self.calibration.clone().map(Into::into),
            dims: dims.to_vec(),
            calibrate: match &self.calibrate {
                Some(c) => Calibrate::parse(c)?,
                None => defaults.calibrate,
            },
            per_channel: match (self.per_channel, self.per_tensor) {
                (true, _) => true,
                (_, true) => false,
                _ => defaults.per_channel,
            },
            symmetric: self.symmetric || defaults.symmetric,
            block_size: self.block_size.unwrap_or(defaults.block_size),
            exclude: self.exclude.clone(),
            max_error,
            measure: !self.no_measure && defaults.measure,
            memory: Some(memory),
            pipeline,
            ..defaults
        }))
    }
}

/// The printed summary.
pub fn text(r: &QuantizeReport) -> String {
    let mut out = format!(
        "quantize {}: weights {} -> {} ({:.3}x); {} weights, {} activations quantized\n",
        r.mode,
        human_bytes(r.weights_bytes_before),
        human_bytes(r.weights_bytes_after),
        r.weights_ratio,
        r.weights.len(),
        r.activations_quantized
    );
    if r.opset_before != r.opset_after {
        out += &format!(
            "  opset {} -> {}\n",
            r.opset_before.map_or("-".into(), |v| v.to_string()),
            r.opset_after.map_or("-".into(), |v| v.to_string())
        );
    }
    out += &format!("  {:<28} {:>8}\n", "nodes quantized", "count");
    for (op, n) in &r.nodes_quantized {
        out += &format!("  {:<28} {:>8}\n", op, n);
    }
    for k in &r.kept_ops {
        out += &format!("  float: {} x{} ({})\n", k.op, k.count, k.why);
    }
    for k in &r.kept_float {
        out += &format!("  float: {}: {}\n", k.name, k.why);
    }
    if !r.already_quantized.is_empty() {
        let mut by = std::collections::BTreeMap::<&str, usize>::new();
        for a in &r.already_quantized {
            *by.entry(a.what.as_str()).or_default() += 1;
        }
        let by: Vec<String> = by.iter().map(|(w, n)| format!("{w} x{n}")).collect();
        let names: Vec<&str> = r
            .already_quantized
            .iter()
            .take(3)
            .map(|a| a.name.as_str())
            .collect();
        let more = if r.already_quantized.len() > 3 {
            ", ..."
        } else {
            ""
        };
        out += &format!(
            "  already quantized, left as is: {} ({}): {}{more}\n",
            r.already_quantized.len(),
            by.join(", "),
            names.join(", ")
        );
    }
    if r.activations_calibrated > 0 {
        out += &format!(
            "  calibrated {} activation ranges ({}) on {}\n",
            r.activations_calibrated, r.calibrate, r.calibration
        );
    }
    out += &error_lines(
        &r.error,
        &r.error_skipped,
        r.max_error,
        &r.bound_off,
        &r.measured_in,
        &r.calibration,
        "float",
    );
    for w in &r.weight_only {
        out += &format!(
            "  weights only: {} (its activations quantized alone: error {:.3e}; weights only: {:.3e})\n",
            w.node, w.error, w.weights_only_error
        );
    }
    for w in &r.solo_float {
        out += &format!(
            "  float: {} (quantized alone: error {:.3e}; weights only: {:.3e})\n",
            w.node, w.error, w.weights_only_error
        );
    }
    if !r.fallback.is_empty() {
        out += &format!(
            "  given back for --max-error ({} runs): {}\n",
            r.runs,
            r.fallback.join(", ")
        );
    }
    match (&r.memory_before, &r.memory_after) {
        (Some(b), Some(a)) if b.error.is_none() && a.error.is_none() => {
            out += &format!(
                "memory at {}: weights {} -> {}; activations lower bound {} -> {}; arena {} -> {}\n",
                if b.dims.is_empty() { "static shapes" } else { &b.dims },
                human_bytes(b.weights_bytes),
                human_bytes(a.weights_bytes),
                human_bytes(b.lower_bound_bytes),
                human_bytes(a.lower_bound_bytes),
                human_bytes(b.arena_bytes),
                human_bytes(a.arena_bytes)
            );
        }
        (Some(b), Some(a)) => {
            let e = b.error.as_ref().or(a.error.as_ref()).expect("one failed");
            out += &format!("memory plan unavailable: {e}\n");
        }
        _ => {}
    }
    out
}

/// The error lines both summaries print: against `reference` on the
/// calibration inputs, the bound, where it was measured.
fn error_lines(
    error: &Option<graphopt::QuantError>,
    skipped: &Option<String>,
    bound: Option<f64>,
    bound_off: &Option<String>,
    measured_in: &Option<String>,
    calibration: &str,
    reference: &str,
) -> String {
    let mut out = String::new();
    match (error, skipped) {
        (Some(e), _) => {
            out += &format!(
                "  error vs {reference} on {calibration}{}: rel L2 {:.3e}, max abs {:.3e}{}\n",
                if e.jittered > 0 {
                    format!(" and {} jittered copies of its first batch", e.jittered)
                } else {
                    String::new()
                },
                e.rel_l2,
                e.max_abs,
                bound.map(|b| format!(" (bound {b})")).unwrap_or_default()
            );
        }
        (None, Some(why)) => out += &format!("  error NOT measured: {why}\n"),
        _ => {}
    }
    if let Some(off) = bound_off {
        out += &format!("  error bound: off ({off})\n");
    }
    if let Some(e) = measured_in {
        out += &format!("  measured in {e}\n");
    }
    out
}

/// Layers printed before "... N more" (`--report` has them all).
const SHOWN_LAYERS: usize = 24;

/// The printed summary of `--compress`.
pub fn compress_text(r: &CompressReport) -> String {
    let mut out = format!(
        "compress {}: weights {} -> {} ({:.3}x); {} weights compressed{}\n",
        r.method,
        human_bytes(r.weights_bytes_before),
        human_bytes(r.weights_bytes_after),
        r.weights_ratio,
        r.layers.len(),
        if r.activation_aware {
            ", activation-aware"
        } else {
            ""
        }
    );
    if r.opset_before != r.opset_after {
        out += &format!(
            "  opset {} -> {}\n",
            r.opset_before.map_or("-".into(), |v| v.to_string()),
            r.opset_after.map_or("-".into(), |v| v.to_string())
        );
    }
    if !r.layers.is_empty() {
        out += &format!(
            "  {:<32} {:<8} {:>10} {:>10} {:>9}  method\n",
            "weight", "op", "before", "after", "error"
        );
    }
    for l in r.layers.iter().take(SHOWN_LAYERS) {
        out += &format!(
            "  {:<32} {:<8} {:>10} {:>10} {:>9.3e}  {}\n",
            l.weight,
            l.op,
            human_bytes(l.bytes_before),
            human_bytes(l.bytes_after),
            l.error,
            l.method
        );
    }
    if r.layers.len() > SHOWN_LAYERS {
        out += &format!(
            "  ... {} more (--report lists them all)\n",
            r.layers.len() - SHOWN_LAYERS
        );
    }
    for (w, why) in r.kept.iter().take(SHOWN_LAYERS) {
        out += &format!("  kept: {w}: {why}\n");
    }
    if r.kept.len() > SHOWN_LAYERS {
        out += &format!("  ... {} more kept\n", r.kept.len() - SHOWN_LAYERS);
    }
    out += &error_lines(
        &r.error,
        &r.error_skipped,
        r.max_error,
        &r.bound_off,
        &r.measured_in,
        &r.calibration,
        "uncompressed",
    );
    if !r.fallback.is_empty() {
        out += &format!(
            "  left uncompressed to meet the bound ({}): {}\n",
            r.fallback.len(),
            r.fallback.join(", ")
        );
    }
    out
}
