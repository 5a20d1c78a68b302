//! graphopt's optimization passes.
//!
//! One pass per file. Each file opens with a `//!` comment saying what the
//! pass does, why, what must hold before it runs, and a before→after example
//! in ONNX text. Every pass is listed once in [`registry`] (through the
//! `passes!` macro below), which the CLI's `--passes`, `graphopt passes` and
//! the unknown-name error all read. Adding a pass means: its file, one line
//! in `passes!`, optionally one line in [`default_pipeline`], and its
//! fixtures under `testdata/passes/<name>/`.
//!
//! Passes run through the [`manager`], which verifies the IR after each pass
//! and can dump it, time it, and stop early to bisect.

pub mod manager;
mod pattern;
pub mod remat;
mod util;

use graphopt_ir::infer::{InferOptions, TypeTable};
use graphopt_ir::Model;
use std::collections::BTreeMap;
use std::fmt;

/// What a pass reports about one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Did the pass change the model?
    pub changed: bool,
    /// Named counters (`nodes_removed`, `initializers_removed`,
    /// `bytes_saved`, ...), in name order.
    pub counters: BTreeMap<&'static str, u64>,
    /// Things the user should know (a constant clamped, a rule skipped),
    /// one line each. Passes never print; whoever runs the pipeline shows
    /// them (the CLI prints them to stderr as `warning: PASS: ...`).
    pub warnings: Vec<String>,
}

impl PassStats {
    /// Adds `n` to counter `name` (and marks the model changed if `n > 0`).
    pub fn add(&mut self, name: &'static str, n: u64) {
        if n > 0 {
            self.changed = true;
            *self.counters.entry(name).or_default() += n;
        }
    }

    pub fn get(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Records a warning (does not mark the model changed).
    pub fn warn(&mut self, w: impl Into<String>) {
        self.warnings.push(w.into());
    }

    pub fn merge(&mut self, other: &PassStats) {
        self.changed |= other.changed;
        for (k, v) in &other.counters {
            *self.counters.entry(k).or_default() += v;
        }
        self.warnings.extend(other.warnings.iter().cloned());
    }
}

/// Facts about the model that stay true until a pass changes it, computed
/// on first use and shared by the passes that follow. The manager hands one
/// context to every pass of a pipeline and calls [`PassContext::invalidate`]
/// after each pass that reports a change, so a pass that runs when nothing
/// changed since the last inference gets the types for free (in a
/// fixed-point pipeline, the last round changes nothing at all).
///
/// The contract this relies on: a pass that changes the model says so in
/// [`PassStats::changed`]. (Writing inferred types into the model, as
/// `fold_shapes` does, is not a change: inference gives the same types
/// again.)
#[derive(Debug, Default)]
pub struct PassContext {
    types: Option<TypeTable>,
    inferences: usize,
}

impl PassContext {
    pub fn new() -> PassContext {
        PassContext::default()
    }

    /// The types inference gives `model` (with default options), as a side
    /// table: inferred on the first call after [`PassContext::invalidate`],
    /// then reused. `model` itself keeps its own declared types.
    pub fn types(&mut self, model: &Model) -> &TypeTable {
        if self.types.is_none() {
            self.inferences += 1;
        }
        self.types
            .get_or_insert_with(|| TypeTable::infer(model, &InferOptions::default()))
    }

    /// Hands over types known to be what inference gives the model now
    /// (a pass that has just inferred them in place).
    pub(crate) fn set_types(&mut self, types: TypeTable) {
        self.types = Some(types);
    }

    /// Forgets everything computed (the model has changed).
    pub fn invalidate(&mut self) {
        self.types = None;
    }

    /// How many times [`PassContext::types`] ran inference.
    pub fn inferences(&self) -> usize {
        self.inferences
    }
}

/// A pass failed: one line saying why and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassError(pub String);

impl fmt::Display for PassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for PassError {}

impl From<graphopt_ir::IrError> for PassError {
    fn from(e: graphopt_ir::IrError) -> Self {
        PassError(e.0)
    }
}

/// A transformation of the model.
pub trait Pass {
    /// The registry name (snake_case, same as the file name).
    fn name(&self) -> &'static str;
    /// Runs the pass once.
    fn run(&self, model: &mut Model) -> Result<PassStats, PassError>;
    /// Runs the pass once with the pipeline's shared [`PassContext`] (what
    /// the manager calls). Passes that read inferred types override this to
    /// take them from the context, and implement [`Pass::run`] as
    /// `self.run_in(model, &mut PassContext::new())`; the others keep this
    /// default.
    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let _ = cx;
        self.run(model)
    }
    /// True when the pass never changes arithmetic, so outputs stay
    /// bit-identical (the numerical tests hold it to that); false for
    /// rewrites that may round differently (fusions into weights, ...),
    /// which are held to relative L2 ≤ 1e-5 instead.
    fn exact(&self) -> bool {
        true
    }
}

/// One registry entry.
pub struct PassInfo {
    pub name: &'static str,
    pub doc: &'static str,
    pub make: fn() -> Box<dyn Pass>,
}

/// Declares the pass modules and the registry in one list.
macro_rules! passes {
    ($($module:ident :: $ty:ident => $doc:literal,)*) => {
        $(pub mod $module;)*
        /// Every pass, in name order, with its one-line doc.
        pub fn registry() -> &'static [PassInfo] {
            static REGISTRY: &[PassInfo] = &[
                $(PassInfo {
                    name: stringify!($module),
                    doc: $doc,
                    make: || Box::new($module::$ty),
                },)*
            ];
            REGISTRY
        }
    };
}

passes! {
    compress::Compress => "weight compression in standard ONNX: k-means palettes (cluster), low-rank factors (lowrank), shared near-equal weights (share) (configure with --compress)",
    cse::Cse => "common-subexpression elimination: identical nodes on identical inputs computed once",
    dce::Dce => "dead-code elimination: unused nodes, initializers, value_info and captures",
    dedup_initializers::DedupInitializers => "shares initializers with identical content (every dtype); keeps tied weights tied",
    dequantize_constants::DequantizeConstants => "opt-in: constant DequantizeLinear folded to float weights, DynamicQuantizeLinear spelled in float ops (for executors without integer kernels)",
    eliminate_identity::EliminateIdentity => "removes Identity nodes, keeping graph output names",
    eliminate_noops::EliminateNoops => "removes no-op nodes (Dropout, same-type Cast, identity Transpose, ...) and folds exact round trips",
    eliminate_zero_add::EliminateZeroAdd => "removes Add/Sub of a constant zero of either sign that broadcasts nothing (not exact: -0 may stay -0)",
    fold_constants::FoldConstants => "evaluates nodes whose inputs are all constant, under a size cap; Constant nodes become initializers",
    fold_shapes::FoldShapes => "replaces Shape/Gather/Concat chains whose values are known from shape inference by constants",
    fuse_conv_bn::FuseConvBn => "folds BatchNormalization and per-channel Mul/Add after Conv, a bias Add after ConvTranspose, and a scalar Mul before either into the weights",
    fuse_gelu::FuseGelu => "replaces decomposed GELU (erf and tanh forms) by Gelu (opset >= 20)",
    fuse_gemm_update::FuseGemmUpdate => "a scaled Gemm added to a same-shaped value becomes the Gemm's C (SGD's W - lr·dW: the gradient is never held)",
    fuse_layer_norm::FuseLayerNorm => "replaces decomposed LayerNorm by LayerNormalization (opset >= 17)",
    fuse_matmul_add::FuseMatmulAdd => "MatMul followed by a bias Add becomes Gemm where Gemm's rules allow",
    fuse_parallel_matmul::FuseParallelMatmul => "three or more MatMuls on one input with constant weights become one MatMul on concatenated weights + Split",
    inline_constant_if::InlineConstantIf => "an If whose condition is a constant is replaced by the nodes of the branch it takes",
    lower_precision::LowerPrecision => "fp16/bf16 lowering with an fp32 keep-list and clean Cast boundaries (configure with --precision)",
    merge_reshape_axes::MergeReshapeAxes => "an Unsqueeze or Squeeze of a Reshape to a constant shape becomes one Reshape",
    merge_slices::MergeSlices => "a Slice of a Slice with constant parameters becomes one Slice",
    prune::Prune => "structured pruning: removes whole channels, hidden units and attention heads by dependency group (configure with graphopt prune)",
    quantize::Quantize => "int8/int4 quantization in standard DequantizeLinear/QuantizeLinear ops (configure with --quantize)",
    upgrade_opset::UpgradeOpset => "opt-in: raises the default-domain opset, rewriting ops whose signature changed",
}

/// Looks up a pass by name (`-` and `_` are the same). The error lists the
/// valid names.
pub fn lookup(name: &str) -> Result<Box<dyn Pass>, PassError> {
    let norm = name.trim().replace('-', "_");
    registry()
        .iter()
        .find(|p| p.name == norm)
        .map(|p| (p.make)())
        .ok_or_else(|| {
            let names: Vec<&str> = registry().iter().map(|p| p.name).collect();
            PassError(format!(
                "unknown pass '{name}'; valid passes: {}",
                names.join(", ")
            ))
        })
}

/// Parses a comma-separated pass list. `none` (or an empty list) is no pass.
pub fn parse_pipeline(list: &str) -> Result<Vec<Box<dyn Pass>>, PassError> {
    if list.trim() == "none" || list.trim().is_empty() {
        return Ok(Vec::new());
    }
    list.split(',').map(lookup).collect()
}

/// The pipeline `graphopt optimize` runs by default, to a fixed point.
pub fn default_pipeline() -> Vec<Box<dyn Pass>> {
    vec![
        // First, because it only rewires uses: every later pass sees
        // producers directly, and the nodes it removes are gone for good.
        Box::new(eliminate_identity::EliminateIdentity),
        // Constant nodes become initializers and constant-only arithmetic
        // is evaluated, so that the passes below see constants as such
        // (shape inference reads their values, fusions match their scalars).
        Box::new(fold_constants::FoldConstants),
        // Needs the constants above to know the most shape values; what it
        // folds turns Shape->Gather->Concat chains into initializers, which
        // the next round's fold_constants carries further (ConstantOfShape,
        // Range, Expand of those).
        Box::new(fold_shapes::FoldShapes),
        // After folding, which turns conditions computed from constants and
        // shapes into constants; the inlined branch's nodes then go through
        // the passes below with the rest of the graph.
        Box::new(inline_constant_if::InlineConstantIf),
        // Conv+BN right after folding (BN parameters are constants now) and
        // before dedup_initializers: it refuses weights that other nodes
        // share, and dedup may share equal biases between convolutions.
        Box::new(fuse_conv_bn::FuseConvBn),
        // After folding has produced its constants, and before cse: nodes
        // reading two equal constants are then seen as equal.
        Box::new(dedup_initializers::DedupInitializers),
        // Merges the repeated Shape/Gather/Unsqueeze chains that exporters
        // emit once per use (the dynamic ones fold_shapes cannot fold), so
        // that no-op and fusion patterns below see one producer.
        Box::new(cse::Cse),
        // Needs the types fold_shapes inferred and the constants folded
        // above to see that a Reshape/Expand/Cast changes nothing.
        Box::new(eliminate_noops::EliminateNoops),
        // The zero biases eliminate_noops keeps for their sign of zero.
        Box::new(eliminate_zero_add::EliminateZeroAdd),
        // With the no-ops gone, so that Slice chains are adjacent.
        Box::new(merge_slices::MergeSlices),
        Box::new(merge_reshape_axes::MergeReshapeAxes),
        // Not fuse_parallel_matmul: merging q/k/v into one MatMul + Split
        // keeps the concatenated product and its three slices live at
        // once, which raised the planned arena of the testdata
        // transformers by 16-40% (every input dim 8; bert_tiny.ts14:
        // 84 KB -> 117 KB; crates/graphopt/tests/plan_coverage.rs holds the
        // pipeline to never raising it). It stays available by name for
        // runtimes that prefer one large GEMM over memory.
        // Fusions last: they match on cleaned-up graphs (constant scalars
        // as initializers, single producers, no-op Casts/Reshapes gone).
        // The three pattern fusions below do not overlap (a LayerNorm or
        // GELU decomposition holds no MatMul), so their order only fixes
        // the output; the element-wise ones go first, as they shrink the
        // graph most.
        Box::new(fuse_layer_norm::FuseLayerNorm),
        Box::new(fuse_gelu::FuseGelu),
        Box::new(fuse_matmul_add::FuseMatmulAdd),
        // After fuse_matmul_add, whose Gemms have a C and are left alone.
        Box::new(fuse_gemm_update::FuseGemmUpdate),
        // Last, to sweep what the passes before it left unused (the
        // fixed-point loop runs dedup and cse again on fused weights).
        Box::new(dce::Dce),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry's name (from the `passes!` entry, that is, the module)
    /// is the name the pass reports: the manager, `--dump-ir` filters and
    /// reports use the latter, `--passes` the former.
    #[test]
    fn registry_names_are_pass_names() {
        for p in registry() {
            assert_eq!((p.make)().name(), p.name);
            assert_eq!(lookup(&p.name.replace('_', "-")).unwrap().name(), p.name);
        }
        let names: Vec<&str> = registry().iter().map(|p| p.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted, "registry in name order, each once");
    }
}
