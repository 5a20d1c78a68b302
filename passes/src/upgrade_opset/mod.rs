//! Opset upgrade (opt-in).
//!
//! Raises the default-domain (`ai.onnx`) opset of a model to a target
//! version, rewriting every node whose signature or meaning changed between
//! the two versions, so that fusions that need newer ops (`LayerNormalization`
//! at 17, `Gelu` at 20) can apply to models exported at older opsets.
//!
//! The registry's `upgrade_opset` targets opset [`DEFAULT_TARGET`] (20);
//! library users pick another with `UpgradeOpset { target }`. Targets from
//! 7 to [`MAX_TARGET`] are supported; sources from opset 7 up (older ones had
//! per-op `broadcast`/`consumed_inputs` attributes). A model already at or
//! above the target is left alone; a target below the model's opset is an
//! error (no downgrades).
//!
//! Rewrites (see `ops.rs`; each applies when the upgrade crosses its version):
//! - 13: `Squeeze`/`Unsqueeze`/`ReduceSum` axes, `Split` split: attr → input;
//!   `Softmax`/`LogSoftmax`/`Hardmax` change from "flatten to 2-D at axis" to
//!   "along axis": kept when the axis is the last one, else rewritten as
//!   `Reshape(Softmax(Flatten(x, axis)), Shape(x))`;
//! - 18: other `Reduce*` axes attr → input; `Split` without sizes gets
//!   `num_outputs`;
//! - 10: `Slice` starts/ends/axes and `TopK` k attr → input; `Upsample`
//!   becomes `Resize`; 11: `Pad` pads/value and `Clip` min/max attr → input,
//!   `Resize`-10 gets `coordinate_transformation_mode="asymmetric"` (its old
//!   meaning) and a roi slot, `Scatter` becomes `ScatterElements`;
//! - 12: `Dropout` ratio attr → input (the mask, whose type changed at 10,
//!   must be unused); 9/14: `BatchNormalization` loses `spatial` (1 only)
//!   and its training-only outputs (which must be unused);
//! - 16: `RoiAlign` keeps its old `output_half_pixel` mode; 20: `GridSample`
//!   mode names (`bilinear` → `linear`, `bicubic` → `cubic`), `DFT` axis
//!   attr (default 1) → input.
//!
//! Every other op must be on the list of ops whose later versions only add
//! types or attributes whose defaults keep the old meaning. Anything else
//! (an unknown or experimental op, `GroupNormalization` across 21,
//! Scan-8, an attribute that refers to a function attribute) is
//! refused with a `PassError` naming the node and op, and the model is left
//! unchanged: the pass never writes a model it is not sure of. Subgraphs are
//! upgraded with their graph; model-local functions that import the default
//! domain are upgraded too (their constants become `Constant` nodes, since
//! functions have no initializers). The IR version is raised to the lowest
//! one that allows the target opset.
//!
//! Exact: only signatures change; the arithmetic is the same.
//!
//! ```text
//! before (opset 11):                       after (opset 20):
//! g (float[2,3] x) => (float[2,1] y) {     g (float[2,3] x) => (float[2,1] y)
//!   y = ReduceMean <axes = [1]> (x)          <int64[1] y_axes = {1}> {
//! }                                          y = ReduceMean (x, y_axes)
//!                                          }
//! ```

mod ops;

use crate::pattern::{walk_typed, TypedGraph};
use crate::util::for_each_subgraph;
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::infer::TypeTable;
use graphopt_ir::{Graph, Model};

/// The target of the registry's `upgrade_opset`.
pub const DEFAULT_TARGET: i64 = 20;
/// The newest opset this pass knows the changes up to.
pub const MAX_TARGET: i64 = 22;
/// The oldest source opset handled.
pub const MIN_SOURCE: i64 = 7;

/// Raises the default-domain opset to `target`.
pub struct UpgradeOpset {
    pub target: i64,
}

/// The registry entry (`passes!` builds passes from a value named like the
/// type): `UpgradeOpset` with [`DEFAULT_TARGET`].
#[allow(non_upper_case_globals)]
pub const UpgradeOpset: UpgradeOpset = UpgradeOpset {
    target: DEFAULT_TARGET,
};

impl Pass for UpgradeOpset {
    fn name(&self) -> &'static str {
        "upgrade_opset"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let to = self.target;
        let Some(from) = model.onnx_opset() else {
            return Ok(stats);
        };
        if !(MIN_SOURCE..=MAX_TARGET).contains(&to) {
            return Err(PassError(format!(
                "target opset {to} is outside the supported range {MIN_SOURCE}..={MAX_TARGET}"
            )));
        }
        if from >= to {
            return Ok(stats);
        }
        if from < MIN_SOURCE {
            return Err(PassError(format!(
                "cannot upgrade from opset {from}: sources older than {MIN_SOURCE} are not supported"
            )));
        }
        // Work on a copy, so that a refusal leaves the model as it was.
        let typed = cx.types(model);
        let mut m = model.clone();
        walk_typed(&mut m.graph, typed, &mut |g, tg| {
            let mut cx = ops::Cx {
                from,
                to,
                in_function: false,
                t: TypedGraph { tg },
                stats: &mut stats,
            };
            ops::upgrade_graph(g, &mut cx)
        })?;
        let empty = TypeTable::default();
        for f in &mut m.functions {
            let Some(imp) = f
                .opset_imports
                .iter_mut()
                .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            else {
                continue;
            };
            let ffrom = imp.version;
            if ffrom >= to {
                continue;
            }
            if ffrom < MIN_SOURCE {
                return Err(PassError(format!(
                    "function '{}' imports opset {ffrom}, older than {MIN_SOURCE}",
                    f.name
                )));
            }
            imp.version = to;
            let name = f.name.clone();
            let mut up = |g: &mut Graph| {
                let mut cx = ops::Cx {
                    from: ffrom,
                    to,
                    in_function: true,
                    t: TypedGraph { tg: &empty },
                    stats: &mut stats,
                };
                ops::upgrade_graph(g, &mut cx)
                    .map_err(|e| PassError(format!("in function '{name}': {e}")))
            };
            for_each_subgraph(&mut f.body, &mut up)?;
            up(&mut f.body)?;
        }
        for o in &mut m.opset_imports {
            if o.domain.is_empty() || o.domain == "ai.onnx" {
                o.version = to;
            }
        }
        m.ir_version = m.ir_version.max(min_ir_version(to));
        stats.add("opset_raised", (to - from) as u64);
        *model = m;
        Ok(stats)
    }
}

/// The oldest IR version that allows default-domain opset `opset`.
fn min_ir_version(opset: i64) -> i64 {
    match opset {
        ..=8 => 3,
        9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        _ => 10,
    }
}

#[cfg(test)]
mod tests;
