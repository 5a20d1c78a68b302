//! Mixed-precision lowering: fp16 / bf16 compute with an fp32 keep-list,
//! or fp16 weight storage with fp32 compute.
//!
//! Why: halving weights and activations is the first memory win users reach
//! for, and the usual converter breaks models at its Cast boundaries. This
//! pass decides a compute type per node, then legalizes the boundaries.
//!
//! Modes ([`Precision`]):
//! - `fp16` / `bf16`: matrix products (MatMul, Gemm, Conv, ConvTranspose,
//!   Einsum) run low; ops on the fp32 keep-list
//!   ([`ops::DEFAULT_KEEP_FP32`], after PyTorch autocast: softmax, norms,
//!   sum-like reductions, exp/log/pow/erf/reciprocal/sqrt, losses, CumSum, DFT/STFT,
//!   Range, TopK, NMS, RoiAlign) run fp32, and so do MatMul/Gemm/Conv
//!   against a constant that looks like a signal-processing basis (DFT,
//!   STFT: [`ops::BASIS_GAIN`]); every other op follows its inputs
//!   (autocast's "promote" rule: low when all its non-constant float inputs
//!   are low, else fp32). Constants take the type their consumers want.
//!   A matrix product whose result reaches a Log through clamps and shifts
//!   only (a log-mel spectrogram's mel MatMul) stays fp32 (`feeds_log`).
//!   Arithmetic on constants alone that the folder left in the graph (it
//!   refuses results much larger than their inputs: a resampler's sinc
//!   kernel computed from index ranges, a window built from a few scalars)
//!   stays fp32 with the constants it reads, and so does the data movement
//!   feeding it: rounding `i / 441` to fp16 and then scaling it by 436 moves
//!   a sinc argument by a fifth of a radian. Only its result is cast, where a
//!   low node reads it ([`constant_compute`]).
//! - `fp16-weights`: every fp32 weight is stored fp16 and cast to fp32 once;
//!   compute stays fp32; weights read by constant-only arithmetic stay fp32.
//!
//! Rules the output keeps:
//! 1. Only fp32 tensors change; integer, bool, fp64 and already-low tensors
//!    are never touched. Ops outside the default domain stay as they are.
//! 2. A node runs low only where the ONNX schema admits the low type for its
//!    compute parameter and, unless `ort_cpu` is off, onnxruntime's CPU
//!    provider loads it (table probed by `gen_tables.py`; bf16 has almost no
//!    CPU kernels, so bf16 mode lowers data movement and stores weights).
//! 3. Exactly one Cast per boundary: each (value, target type) pair is cast
//!    once, just before its first reader; a Cast is never applied to a Cast
//!    (a boundary after an existing `Cast(x)` casts `x` instead), and Casts
//!    left to the same type or unused are removed.
//! 4. An initializer read both low and fp32 is stored once, low, as
//!    `NAME_fp16`/`NAME_bf16`, with one Cast back to fp32 named `NAME`.
//!    fp32 weights of at least `min_weight_elems` elements are stored low
//!    even when only fp32 nodes read them, unless that would clamp them or
//!    flush more than 1% of their values below fp16's normal range.
//! 5. fp16 constants beyond ±65504 are clamped to ±65504; the names are
//!    listed as a warning.
//! 6. Graph inputs and outputs keep their types (`keep_io_types`); an
//!    output computed low gets a Cast that writes the original name. If /
//!    Loop / Scan bodies are lowered in place with their formal inputs and
//!    outputs unchanged, so the nodes' types stay consistent.
//! 7. `value_info`, the Cast `to` attributes and initializer dtypes agree
//!    with the new types.
//!
//! Needs every value's element type: runs shape/dtype inference on a copy
//! first. Run it after fusions (they see fp32 patterns) and before memory
//! planning.
//!
//! ```text
//! before:                                    after (fp16):
//! g (float[1,4] x) => (float[1,2] y)         g (float[1,4] x) => (float[1,2] y)
//!   <float[4,2] w = {...}> {                   <float16[4,2] w = {...}> {
//!   m = MatMul (x, w)                          x_float16 = Cast <to: int = 10> (x)
//!   y = Softmax (m)                            m = MatMul (x_float16, w)
//! }                                            m_float = Cast <to: int = 1> (m)
//!                                              y = Softmax (m_float)
//!                                            }
//! ```

mod convert;
mod ops;
mod tables;
#[cfg(test)]
mod tests;

pub use convert::{f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, F16_MAX};
pub use ops::{ALWAYS_LOW, DEFAULT_KEEP_FP32};

use crate::{Pass, PassError, PassStats};
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{
    AttrValue, Attribute, DType, Graph, Model, NewNode, NodeId, Place, Tensor, Type, Use, ValueId,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// The target precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F16,
    BF16,
    /// fp16 storage, fp32 compute.
    F16Weights,
}

impl Precision {
    pub fn parse(s: &str) -> Result<Precision, PassError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fp16" | "float16" | "f16" | "half" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::BF16),
            "fp16-weights" | "fp16_weights" => Ok(Precision::F16Weights),
            _ => Err(PassError(format!(
                "unknown precision '{s}'; valid: fp16, bf16, fp16-weights"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F16 => "fp16",
            Precision::BF16 => "bf16",
            Precision::F16Weights => "fp16-weights",
        }
    }

    /// The storage type of lowered tensors.
    pub fn low(self) -> DType {
        match self {
            Precision::BF16 => DType::BF16,
            Precision::F16 | Precision::F16Weights => DType::F16,
        }
    }
}

/// The pass and its options. `LowerPrecision` (the constant) is the default
/// configuration, which is what the registry builds.
#[derive(Clone, Debug)]
pub struct LowerPrecision {
    pub precision: Precision,
    /// Op types or node names to keep in fp32, besides the default list.
    pub keep_fp32: Vec<String>,
    /// Op types or node names to take off the default keep-list.
    pub allow_low: Vec<String>,
    /// Graph inputs and outputs keep their element types.
    pub keep_io_types: bool,
    /// Lower only ops onnxruntime's CPU provider can load in low precision.
    pub ort_cpu: bool,
    /// Main-graph nodes to keep fp32 (validation fallback; ids are stable
    /// across clones of the same model). For an If/Loop/Scan node: its
    /// bodies stay fp32.
    pub keep_nodes: Vec<NodeId>,
    /// Main-graph initializers to leave fp32 (validation fallback).
    pub keep_weights: Vec<String>,
    /// fp32 weights read only by fp32 nodes are stored low when they have at
    /// least this many elements.
    pub min_weight_elems: u64,
}

/// The default configuration: fp16, default keep-list, io types kept.
#[allow(non_upper_case_globals)]
pub const LowerPrecision: LowerPrecision = LowerPrecision {
    precision: Precision::F16,
    keep_fp32: Vec::new(),
    allow_low: Vec::new(),
    keep_io_types: true,
    ort_cpu: true,
    keep_nodes: Vec::new(),
    keep_weights: Vec::new(),
    min_weight_elems: 16,
};

impl Default for LowerPrecision {
    fn default() -> Self {
        LowerPrecision
    }
}

/// What one lowering did.
#[derive(Clone, Debug, Default)]
pub struct LowerReport {
    /// Main-graph nodes now computing low, in program order.
    pub lowered: Vec<NodeId>,
    /// Nodes computing low, subgraphs included.
    pub lowered_total: u64,
    /// Main-graph nodes (If/Loop/Scan) with nodes computing low in their
    /// bodies; keeping one (`keep_nodes`) keeps its bodies fp32.
    pub subgraph_hosts: Vec<NodeId>,
    /// Main-graph initializers now stored low (names before lowering).
    pub weights_lowered: Vec<String>,
    pub casts_before: u64,
    pub casts_after: u64,
    pub casts_inserted: u64,
    pub casts_removed: u64,
    /// Constants clamped to ±65504, with the number of values clamped.
    pub clamped: Vec<(String, u64)>,
    /// Main-graph fp32 weights left fp32 although large enough to store
    /// low, with why: read by a quantization or custom-domain op (exact
    /// scales), or not faithful in fp16 (beyond its range, or too much of
    /// it below the normal range).
    pub kept_fp32_weights: Vec<(String, String)>,
    /// Matrix products kept fp32 because a constant operand looks like a
    /// signal-processing basis (name or op type, and its gain; see
    /// [`ops::BASIS_GAIN`]).
    pub kept_sensitive: Vec<(String, f64)>,
    /// Op types kept fp32 because onnxruntime's CPU provider cannot run
    /// them low (or the schema does not admit the type).
    pub kept_no_kernel: BTreeSet<String>,
    /// Matrix products (name or op type) kept fp32 because their result
    /// reaches a Log through clamps and shifts only (see `feeds_log`).
    pub kept_before_log: Vec<String>,
    /// Nodes (name or op type) kept fp32 because they compute a constant
    /// from constants alone with arithmetic, or feed such a computation
    /// (see [`constant_compute`]).
    pub kept_constant_compute: Vec<String>,
    pub weight_bytes_before: u64,
    pub weight_bytes_after: u64,
    pub warnings: Vec<String>,
}

impl LowerReport {
    /// The pass manager's counters for this lowering.
    pub fn stats(&self) -> PassStats {
        let mut stats = PassStats::default();
        stats.add("nodes_lowered", self.lowered_total);
        stats.add("initializers_lowered", self.weights_lowered.len() as u64);
        stats.add("casts_inserted", self.casts_inserted);
        stats.add("casts_removed", self.casts_removed);
        stats.add("constants_clamped", self.clamped.len() as u64);
        if !self.kept_fp32_weights.is_empty() {
            stats.add("weights_kept_fp32", self.kept_fp32_weights.len() as u64);
        }
        if !self.kept_sensitive.is_empty() {
            stats.add("basis_products_kept_fp32", self.kept_sensitive.len() as u64);
        }
        if !self.kept_before_log.is_empty() {
            stats.add("products_before_log_kept_fp32", self.kept_before_log.len() as u64);
        }
        if !self.kept_constant_compute.is_empty() {
            stats.add(
                "constant_compute_kept_fp32",
                self.kept_constant_compute.len() as u64,
            );
        }
        stats.add(
            "bytes_saved",
            self.weight_bytes_before.saturating_sub(self.weight_bytes_after),
        );
        stats
    }
}

impl Pass for LowerPrecision {
    fn name(&self) -> &'static str {
        "lower_precision"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let inputs_before = model.graph.inputs.len();
        let r = self.lower(model)?;
        let mut stats = r.stats();
        // fp32 weights that were also graph inputs become plain weights (a
        // change even when nothing is lowered).
        stats.add(
            "weight_inputs_removed",
            inputs_before.saturating_sub(model.graph.inputs.len()) as u64,
        );
        // The caller shows them (the manager returns them in `PassRun`).
        stats.warnings = r.warnings;
        Ok(stats)
    }

    fn exact(&self) -> bool {
        false
    }
}

/// Element types inferred on a copy of a graph, with its subgraphs'.
#[derive(Default)]
struct Types {
    elems: HashMap<ValueId, DType>,
    subs: HashMap<(NodeId, usize, usize), Types>,
}

impl Types {
    fn of(g: &Graph) -> Types {
        let mut t = Types::default();
        for v in g.values() {
            if let Some(e) = g.ty(v).and_then(Type::elem) {
                t.elems.insert(v, e);
            }
        }
        for n in g.nodes() {
            for (ai, a) in g.node(n).attributes.iter().enumerate() {
                for (gi, sub) in a.graphs().enumerate() {
                    t.subs.insert((n, ai, gi), Types::of(sub));
                }
            }
        }
        t
    }
}

/// Per-run state shared by all graphs.
struct Cx<'a> {
    opts: &'a LowerPrecision,
    /// The compute type of lowered nodes.
    low: DType,
    /// The storage type of weights only fp32 nodes read (fp16 where the
    /// opset has no bfloat16 Cast).
    store: DType,
    /// Every value name in the model: new names must be unique across
    /// subgraphs too (the ONNX checker requires it).
    names: HashSet<String>,
    opset: i64,
    keep: HashSet<String>,
    report: LowerReport,
}

impl LowerPrecision {
    /// Lowers `model` and says what it did.
    pub fn lower(&self, model: &mut Model) -> Result<LowerReport, PassError> {
        let mut typed = model.clone();
        infer_model(&mut typed, &InferOptions::default());
        let types = Types::of(&typed.graph);
        drop(typed);

        let mut keep: HashSet<String> = DEFAULT_KEEP_FP32.iter().map(|s| s.to_string()).collect();
        for a in &self.allow_low {
            keep.remove(a.trim());
        }
        keep.extend(self.keep_fp32.iter().map(|s| s.trim().to_string()));
        let opset = model.onnx_opset().unwrap_or(18);
        let low = self.precision.low();
        // Cast gained bfloat16 in opset 13; below, weights are stored fp16.
        let store = if low == DType::BF16 && opset < 13 {
            DType::F16
        } else {
            low
        };
        let mut names = HashSet::new();
        collect_names(&model.graph, &mut names);
        let mut cx = Cx {
            opts: self,
            low,
            store,
            names,
            opset,
            keep,
            report: LowerReport::default(),
        };
        if store != low {
            cx.report.warnings.push(format!(
                "opset {opset} has no bfloat16 Cast (opset 13 has): weights read by fp32 nodes are stored fp16; run upgrade_opset first for bf16"
            ));
        }
        cx.report.casts_before = count_casts(&model.graph);
        cx.report.weight_bytes_before = model.graph.initializer_bytes_deep();
        lower_graph(
            &mut model.graph,
            &types,
            &HashMap::new(),
            true,
            false,
            &mut cx,
        )?;
        cx.report.casts_after = count_casts(&model.graph);
        cx.report.weight_bytes_after = model.graph.initializer_bytes_deep();
        if !cx.report.clamped.is_empty() {
            let list: Vec<String> = cx
                .report
                .clamped
                .iter()
                .map(|(n, c)| format!("{n} ({c})"))
                .collect();
            cx.report.warnings.insert(
                0,
                format!(
                    "{} constant(s) had values beyond ±65504, clamped: {}",
                    list.len(),
                    list.join(", ")
                ),
            );
        }
        Ok(cx.report)
    }
}

fn collect_names(g: &Graph, names: &mut HashSet<String>) {
    names.extend(g.values().map(|v| g.name(v).to_string()));
    for (_, s) in g.subgraphs() {
        collect_names(s, names);
    }
}

/// A value named `hint` (or `hint_N`), unique in the whole model.
fn fresh(g: &mut Graph, cx: &mut Cx<'_>, hint: &str, ty: Option<Type>) -> ValueId {
    let mut name = hint.to_string();
    let mut i = 0;
    while g.value_by_name(&name).is_some() || cx.names.contains(&name) {
        i += 1;
        name = format!("{hint}_{i}");
    }
    cx.names.insert(name.clone());
    g.fresh_value(&name, ty)
}

/// Cast nodes in `g` and its subgraphs.
pub fn count_casts(g: &Graph) -> u64 {
    g.nodes().filter(|&n| is_cast(g, n)).count() as u64
        + g.subgraphs().map(|(_, s)| count_casts(s)).sum::<u64>()
}

fn is_cast(g: &Graph, n: NodeId) -> bool {
    let d = g.node(n);
    d.op_type == "Cast" && (d.domain.is_empty() || d.domain == "ai.onnx")
}

fn default_domain(g: &Graph, n: NodeId) -> bool {
    let d = &g.node(n).domain;
    d.is_empty() || d == "ai.onnx"
}

/// What a subgraph needs to know of a value of an enclosing graph.
#[derive(Clone, Debug, Default)]
struct OuterInfo {
    orig: Option<DType>,
    new: Option<DType>,
    /// The value is `Cast(src)` there: `src`'s name and element type, so a
    /// boundary inside the subgraph casts `src` instead (no Cast chains).
    cast_src: Option<(String, DType)>,
}

/// The element type of each value before (`orig`) and after (`new`).
struct Elems {
    orig: HashMap<ValueId, DType>,
    new: HashMap<ValueId, DType>,
}

impl Elems {
    fn orig(&self, v: ValueId) -> Option<DType> {
        self.orig.get(&v).copied()
    }
    fn cur(&self, v: ValueId) -> Option<DType> {
        self.new.get(&v).copied()
    }
}

/// A Constant node's fp32 `value` tensor.
fn constant_node_tensor(g: &Graph, v: ValueId) -> Option<(NodeId, &Tensor)> {
    let (n, _) = g.producer(v)?;
    let d = g.node(n);
    if d.op_type != "Constant" || !default_domain(g, n) {
        return None;
    }
    d.attr_tensor("value")
        .filter(|t| t.dtype == DType::F32)
        .map(|t| (n, t))
}

/// Lowers one graph. `outer` gives, for values captured from enclosing
/// graphs, their element types before and after lowering. `main` is the
/// model's graph (whose io types follow `keep_io_types`; a subgraph's
/// formal inputs and outputs never change).
fn lower_graph(
    g: &mut Graph,
    types: &Types,
    outer: &HashMap<String, OuterInfo>,
    main: bool,
    frozen: bool,
    cx: &mut Cx<'_>,
) -> Result<(), PassError> {
    let low = cx.low;
    let keep_io = !main || cx.opts.keep_io_types;
    let mut el = Elems {
        orig: types.elems.clone(),
        new: HashMap::new(),
    };
    for v in g.values().collect::<Vec<_>>() {
        if g.is_outer(v) {
            let info = outer.get(g.name(v)).cloned().unwrap_or_default();
            let (o, n) = (info.orig, info.new);
            el.orig.remove(&v);
            if let Some(o) = o {
                el.orig.insert(v, o);
            }
            if let Some(n) = n {
                el.new.insert(v, n);
                set_elem(g, v, n);
            }
        } else if let Some(o) = el.orig(v) {
            el.new.insert(v, o);
        }
    }

    // Weights listed as graph inputs (old exporters list every initializer)
    // are weights, not runtime inputs: make them constants.
    if main {
        let weight_inputs: Vec<ValueId> = g
            .inputs
            .iter()
            .copied()
            .filter(|&v| g.initializer(v).is_some_and(|t| t.dtype == DType::F32))
            .collect();
        if !weight_inputs.is_empty() {
            g.inputs.retain(|v| !weight_inputs.contains(v));
            cx.report.warnings.push(format!(
                "{} fp32 initializer(s) were also listed as graph inputs; they are now plain weights",
                weight_inputs.len()
            ));
        }
        if !keep_io {
            for v in g.inputs.clone() {
                if el.orig(v) == Some(DType::F32) {
                    el.new.insert(v, low);
                }
            }
        }
    }

    // 0. Constant-only arithmetic, and what feeds it, stays fp32.
    let const_compute = if frozen {
        HashSet::new()
    } else {
        constant_compute(g, &el)
    };
    for n in g.nodes() {
        if const_compute.contains(&n) {
            let d = g.node(n);
            let label = if d.name.is_empty() { d.op_type.clone() } else { d.name.clone() };
            cx.report.kept_constant_compute.push(label);
        }
    }

    // 1. Decide each node's compute type, forward in program order.
    let mut req: HashMap<(NodeId, usize), DType> = HashMap::new();
    let mut lowered: Vec<NodeId> = Vec::new();
    // Constants, and values computed from constants alone (kept fp32 above,
    // cast once where a low node reads them) for readers that compute: data
    // movement of a computed value would only round it (in bf16 mode, where
    // little but data movement runs low, for nothing).
    let is_const = |g: &Graph, n: NodeId, v: ValueId| {
        g.constant(v).is_some()
            || constant_node_tensor(g, v).is_some()
            || (!ops::moves_data(&g.node(n).op_type)
                && g.producer(v)
                    .is_some_and(|(p, _)| const_compute.contains(&p)))
    };
    for n in g.nodes().collect::<Vec<_>>() {
        let d = g.node(n);
        if d.op_type == "Constant" && default_domain(g, n) {
            continue;
        }
        let decision = if frozen || const_compute.contains(&n) {
            None
        } else {
            decide(g, n, &el, main, cx, &is_const)
        };
        let d = g.node(n);
        let inputs = d.inputs().to_vec();
        let outputs = d.outputs().to_vec();
        match decision {
            Some(row) => {
                let p = row.out_param(0);
                for (slot, v) in inputs.iter().enumerate() {
                    let Some(v) = *v else { continue };
                    if row.in_param(slot) == p {
                        req.insert((n, slot), low);
                    } else if let Some(t) = el.orig(v).filter(|t| t.is_float()) {
                        req.insert((n, slot), t);
                    }
                }
                for (slot, o) in outputs.iter().enumerate() {
                    if let Some(o) = *o {
                        if row.out_param(slot) == p && el.orig(o) == Some(DType::F32) {
                            el.new.insert(o, low);
                        }
                    }
                }
                lowered.push(n);
            }
            None => {
                let op = g.node(n).op_type.clone();
                for (slot, v) in inputs.iter().enumerate() {
                    let Some(v) = *v else { continue };
                    if ops::flexible_slot(&op, slot) && default_domain(g, n) {
                        continue;
                    }
                    if let Some(t) = el.orig(v).filter(|t| t.is_float()) {
                        req.insert((n, slot), t);
                    }
                }
            }
        }
    }
    cx.report.lowered_total += lowered.len() as u64;
    if main {
        cx.report.lowered = lowered.clone();
    }

    // 2. Constants take the type their readers want.
    lower_constants(g, &mut el, &req, &const_compute, keep_io, main, cx)?;

    // 3. Outputs computed low get a Cast back that keeps their name.
    if keep_io {
        for i in 0..g.outputs.len() {
            let v = g.outputs[i];
            let (Some(o), Some(nw)) = (el.orig(v), el.cur(v)) else {
                continue;
            };
            if o == nw || !o.is_float() {
                continue;
            }
            let hint = format!("{}_{}", g.name(v), nw.name());
            let ty = retyped(g, v, nw);
            let w = fresh(g, cx, &hint, ty);
            el.new.insert(w, nw);
            let uses: Vec<Use> = g.uses(v).to_vec();
            if let Some((p, slot)) = g.producer(v) {
                g.set_output(p, slot as usize, Some(w));
                // Readers that want the original type keep reading `v`
                // (the Cast's output); the others read the low value.
                for u in uses {
                    if let Use::Input { node, slot } = u {
                        if req.get(&(node, slot as usize)) != Some(&o) {
                            g.set_input(node, slot as usize, Some(w));
                        }
                    }
                }
                el.new.insert(v, o);
                set_elem(g, v, o);
                add_cast(g, Place::After(p), w, v, o, cx)?;
            } else {
                // A pass-through of a captured value: cast into a new output.
                let hint = format!("{}_{}", g.name(v), o.name());
                let ty = retyped(g, v, o);
                let out = fresh(g, cx, &hint, ty);
                el.new.insert(out, o);
                add_cast(g, Place::End, v, out, o, cx)?;
                g.outputs[i] = out;
            }
        }
    }

    // 4. One Cast per (value, wanted type), before its first reader.
    let mut groups: BTreeMap<(ValueId, i32), Vec<(NodeId, usize)>> = BTreeMap::new();
    for n in g.nodes() {
        for (slot, v) in g.node(n).inputs().iter().enumerate() {
            let Some(v) = *v else { continue };
            let (Some(&want), Some(have)) = (req.get(&(n, slot)), el.cur(v)) else {
                continue;
            };
            if want != have && have.is_float() {
                groups
                    .entry((v, want.to_onnx()))
                    .or_default()
                    .push((n, slot));
            }
        }
    }
    for ((v, want), readers) in groups {
        let want = DType::from_onnx(want);
        // Never cast a Cast: start from the first Cast's input instead.
        let mut src = v;
        if let Some((p, _)) = g.producer(v) {
            if is_cast(g, p) {
                if let Some(x) = g.node(p).input(0) {
                    if el.cur(x).is_some_and(|t| t != DType::String) {
                        src = x;
                    }
                }
            }
        } else if g.is_outer(v) {
            if let Some((s, t)) = outer.get(g.name(v)).and_then(|i| i.cast_src.clone()) {
                if t != DType::String {
                    src = g.value_or_outer(&s);
                    el.orig.insert(src, t);
                    el.new.insert(src, t);
                    set_elem(g, src, t);
                }
            }
        }
        let target = if el.cur(src) == Some(want) {
            src
        } else {
            let pos = g
                .first_in_order(readers.iter().map(|&(r, _)| r))
                .map_or(Place::Start, Place::Before);
            let hint = format!("{}_{}", g.name(v), want.name());
            let ty = retyped(g, v, want);
            let out = fresh(g, cx, &hint, ty);
            el.new.insert(out, want);
            add_cast(g, pos, src, out, want, cx)?;
            out
        };
        for (r, slot) in readers {
            g.set_input(r, slot, Some(target));
        }
    }

    // 5. Remove Casts made same-type or unused by lowering.
    cleanup_casts(g, &mut el, cx);

    // 6. Types of values that changed.
    for (&v, &t) in &el.new {
        if g.is_live_value(v) && el.orig(v) != Some(t) && g.initializer(v).is_none() {
            set_elem(g, v, t);
        }
    }

    // 7. Subgraphs, with the captured values' final types.
    let nodes: Vec<NodeId> = g.nodes().filter(|&n| g.node(n).has_subgraphs()).collect();
    for n in nodes {
        let mut inner: HashMap<String, OuterInfo> = HashMap::new();
        for v in g.values() {
            let cast_src = g
                .producer(v)
                .filter(|&(p, _)| is_cast(g, p))
                .and_then(|(p, _)| g.node(p).input(0))
                .and_then(|x| Some((g.name(x).to_string(), el.cur(x)?)));
            let info = if g.is_outer(v) {
                outer.get(g.name(v)).cloned().unwrap_or_default()
            } else {
                OuterInfo {
                    orig: el.orig(v),
                    new: el.cur(v),
                    cast_src,
                }
            };
            inner.insert(g.name(v).to_string(), info);
        }
        // Values of enclosing graphs stay visible further in.
        for (k, t) in outer {
            inner.entry(k.clone()).or_insert_with(|| t.clone());
        }
        let freeze = frozen || (main && cx.opts.keep_nodes.contains(&n));
        let before = cx.report.lowered_total;
        let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
        for (ai, a) in attrs.iter_mut().enumerate() {
            for (gi, sub) in a.graphs_mut().enumerate() {
                let empty = Types::default();
                let t = types.subs.get(&(n, ai, gi)).unwrap_or(&empty);
                lower_graph(sub, t, &inner, false, freeze, cx)?;
            }
        }
        if main && cx.report.lowered_total > before {
            cx.report.subgraph_hosts.push(n);
        }
        g.node_mut(n).attributes = attrs;
        g.refresh_captures(n);
    }
    // Boundaries moved into subgraphs may leave Casts here unused.
    cleanup_casts(g, &mut el, cx);
    if !main {
        // Captures nothing reads any more (a boundary now reads the
        // Cast's source instead).
        for v in g.values().collect::<Vec<_>>() {
            if g.is_outer(v) && g.uses(v).is_empty() && !g.is_output(v) {
                g.remove_value(v);
            }
        }
    }
    Ok(())
}

/// Node `n`'s low-precision row, if `n` should compute low.
fn decide(
    g: &Graph,
    n: NodeId,
    el: &Elems,
    main: bool,
    cx: &mut Cx<'_>,
    is_const: &dyn Fn(&Graph, NodeId, ValueId) -> bool,
) -> Option<&'static ops::OpRow> {
    let opts = cx.opts;
    if opts.precision == Precision::F16Weights || !default_domain(g, n) {
        return None;
    }
    let d = g.node(n);
    let op = d.op_type.as_str();
    if (main && opts.keep_nodes.contains(&n))
        || cx.keep.contains(op)
        || (!d.name.is_empty() && cx.keep.contains(&d.name))
        || ops::ATTR_TYPED.contains(&op)
        || ops::is_quant_op(op)
        || op == "Cast"
    {
        return None;
    }
    if let Some(gain) = basis_operand(g, n) {
        let label = if d.name.is_empty() { op.to_string() } else { d.name.clone() };
        cx.report.kept_sensitive.push((label, gain));
        return None;
    }
    // A window multiplied in before an STFT/DFT: the product stays fp32 with
    // the window (the transform itself is on the keep-list).
    if op == "Mul" && mul_feeds_signal_op(g, n) {
        return None;
    }
    if ops::ALWAYS_LOW.contains(&op) && feeds_log(g, n) {
        let label = if d.name.is_empty() { op.to_string() } else { d.name.clone() };
        cx.report.kept_before_log.push(label);
        return None;
    }
    let row = ops::row(op, cx.opset)?;
    let out0 = d.output(0)?;
    if el.orig(out0) != Some(DType::F32) {
        return None;
    }
    let p = row.out_param(0);
    if p.is_empty() {
        return None;
    }
    let (params, ort) = match opts.precision {
        Precision::BF16 => (row.bf16_params, row.ort_bf16),
        _ => (row.f16_params, row.ort_f16),
    };
    // Bound slots must all be known fp32 (they share one type parameter).
    let bound_in = d
        .inputs()
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.filter(|_| row.in_param(i) == p));
    let bound: Vec<ValueId> = bound_in.collect();
    if bound.iter().any(|&v| el.orig(v) != Some(DType::F32)) {
        return None;
    }
    let follows = ops::ALWAYS_LOW.contains(&op)
        || bound
            .iter()
            .all(|&v| is_const(g, n, v) || el.cur(v) == Some(cx.low));
    if !follows {
        return None;
    }
    if !params.contains(&p) || (opts.ort_cpu && ort != Some(true)) {
        cx.report.kept_no_kernel.insert(op.to_string());
        return None;
    }
    Some(row)
}

/// Nodes of `g` that compute from constants alone (initializers, Constant
/// nodes and their results) with arithmetic, or that feed such arithmetic
/// through data movement only. The folder leaves these when the result is
/// much larger than its inputs (a sinc kernel from two index ranges); their
/// inputs are small and their intermediate values are not rounded. Pure data
/// movement of a weight (a Transpose the folder kept) is not included, so its
/// weight is still stored low.
fn constant_compute(g: &Graph, el: &Elems) -> HashSet<NodeId> {
    let mut konst: HashSet<ValueId> = g
        .initializers()
        .iter()
        .copied()
        .filter(|&v| !g.is_input(v))
        .collect();
    let mut derived: Vec<NodeId> = Vec::new();
    for n in g.nodes() {
        let d = g.node(n);
        let pure = default_domain(g, n) && !d.has_subgraphs() && !ops::is_random(&d.op_type);
        let all_const = d.inputs().iter().flatten().all(|v| konst.contains(v));
        if pure && all_const {
            konst.extend(d.outputs().iter().flatten().copied());
            if d.op_type != "Constant" {
                derived.push(n);
            }
        }
    }
    let mut keep: HashSet<NodeId> = HashSet::new();
    for &n in derived.iter().rev() {
        let d = g.node(n);
        let float_out = d
            .outputs()
            .iter()
            .flatten()
            .any(|&o| el.orig(o).is_some_and(|t| t.is_float()));
        // Quantization ops stay fp32 on their own rule (and say so there).
        let arith = float_out && !ops::moves_data(&d.op_type) && !ops::is_quant_op(&d.op_type);
        let feeds_kept = d.outputs().iter().flatten().any(|&o| {
            g.uses(o).iter().any(|u| match u {
                Use::Input { node, .. } => keep.contains(node),
                Use::Capture { .. } => false,
            })
        });
        if arith || feeds_kept {
            keep.insert(n);
        }
    }
    keep
}

/// Whether matrix product `n`'s result reaches a Log through clamps, shifts
/// and data movement only (`Log(Clip(MatMul(power, mel), 1e-10))`, a log-mel
/// spectrogram). A logarithm reads the relative precision of every value,
/// and a power spectrum spans many decades: fp16 turns its quiet bins into
/// subnormals or zeros, which the clamp then lifts to the floor.
fn feeds_log(g: &Graph, n: NodeId) -> bool {
    reaches(g, n, 4, |op| op == "Log", |op| {
        ops::moves_data(op) || matches!(op, "Clip" | "Max" | "Min" | "Add" | "Sub" | "Abs" | "Relu")
    })
}

/// Whether a reader of node `n`'s outputs, at most `depth` nodes on, is an
/// op `target` accepts, walking only through ops `through` accepts.
fn reaches(
    g: &Graph,
    n: NodeId,
    depth: usize,
    target: impl Fn(&str) -> bool,
    through: impl Fn(&str) -> bool,
) -> bool {
    let mut frontier: Vec<ValueId> = g.node(n).outputs().iter().flatten().copied().collect();
    for _ in 0..depth {
        let mut next = Vec::new();
        for v in frontier {
            for u in g.uses(v) {
                let Use::Input { node, .. } = u else { continue };
                let op = g.node(*node).op_type.as_str();
                if target(op) {
                    return true;
                }
                if through(op) {
                    next.extend(g.node(*node).outputs().iter().flatten().copied());
                }
            }
        }
        frontier = next;
    }
    false
}

/// Whether Mul node `n`'s product reaches an STFT/DFT through data movement
/// only: a window applied by hand before the transform.
fn mul_feeds_signal_op(g: &Graph, n: NodeId) -> bool {
    reaches(g, n, 6, ops::is_signal_op, ops::moves_data)
}

/// The largest [`ops::basis_gain`] at or above [`ops::BASIS_GAIN`] among
/// the constant operands of a MatMul, Gemm or Conv: a signal-processing
/// basis (DFT, STFT, DCT) that stays fp32.
fn basis_operand(g: &Graph, n: NodeId) -> Option<f64> {
    let d = g.node(n);
    let konst = |slot: usize| -> Option<&Tensor> {
        let v = (*d.inputs().get(slot)?)?;
        g.constant(v).or_else(|| constant_node_tensor(g, v).map(|(_, t)| t))
    };
    let k_of = |t: &Tensor, slot: usize| -> Option<i64> {
        let r = t.dims.len();
        match (d.op_type.as_str(), slot) {
            ("MatMul", 0) if r >= 1 => Some(t.dims[r - 1]),
            ("MatMul", 1) if r >= 2 => Some(t.dims[r - 2]),
            ("MatMul", 1) if r == 1 => Some(t.dims[0]),
            ("Gemm", 0) if r == 2 => Some(t.dims[usize::from(d.attr_int("transA") != Some(1))]),
            ("Gemm", 1) if r == 2 => Some(t.dims[usize::from(d.attr_int("transB") == Some(1))]),
            ("Conv", 1) if r >= 2 => Some(t.dims[1..].iter().product()),
            _ => None,
        }
    };
    if !matches!(d.op_type.as_str(), "MatMul" | "Gemm" | "Conv") {
        return None;
    }
    (0..2)
        .filter_map(|slot| {
            let t = konst(slot)?;
            ops::basis_gain(t, k_of(t, slot)?)
        })
        .filter(|&gain| gain >= ops::BASIS_GAIN)
        .reduce(f64::max)
}

/// Step 2: initializers and Constant nodes read low are stored low; fp32
/// weights read only fp32 are stored low with one Cast back when that is
/// faithful (rule 4 of the module doc).
fn lower_constants(
    g: &mut Graph,
    el: &mut Elems,
    req: &HashMap<(NodeId, usize), DType>,
    const_compute: &HashSet<NodeId>,
    keep_io: bool,
    main: bool,
    cx: &mut Cx<'_>,
) -> Result<(), PassError> {
    let low = cx.low;
    let mut consts: Vec<ValueId> = g
        .initializers()
        .iter()
        .copied()
        .filter(|&v| !g.is_input(v))
        .collect();
    consts.extend(g.values().filter(|&v| constant_node_tensor(g, v).is_some()));
    let hold = fp32_read_weights_to_hold(g, req, &consts, const_compute, main, cx);
    for v in consts {
        let is_init = g.initializer(v).is_some();
        let t = match (g.initializer(v), constant_node_tensor(g, v)) {
            (Some(t), _) => t.clone(),
            (None, Some((_, t))) => t.clone(),
            _ => continue,
        };
        if t.dtype != DType::F32 {
            continue;
        }
        let name = g.name(v).to_string();
        let (mut wants_low, mut wants_f32) = (false, false);
        // Read by a quantization op or an opaque custom-domain op, or a
        // basis whose product stays fp32: its fp32 bits must stay (see
        // `ops::is_quant_op`, `basis_operand`).
        let mut exact: Option<&str> = None;
        for u in g.uses(v) {
            match u {
                Use::Input { node, slot } => {
                    if !default_domain(g, *node) || ops::is_quant_op(&g.node(*node).op_type) {
                        exact = Some("read by a quantization or custom-domain op");
                        wants_f32 = true;
                    } else if basis_operand(g, *node).is_some() {
                        exact = Some("a signal-processing basis (kept fp32 with its product)");
                        wants_f32 = true;
                    } else if ops::is_signal_op(&g.node(*node).op_type)
                        || (g.node(*node).op_type == "Mul" && mul_feeds_signal_op(g, *node))
                    {
                        // A window's sidelobes are tens of dB down: fp16
                        // rounding raises the leakage floor that quiet bins
                        // (and their logs) read.
                        exact = Some("read by STFT/DFT (a window; kept fp32)");
                        wants_f32 = true;
                    } else if const_compute.contains(node) {
                        exact = Some("read by arithmetic on constants (kept fp32 with it)");
                        wants_f32 = true;
                    }
                    match req.get(&(*node, *slot as usize)) {
                        Some(&t) if t == low => wants_low = true,
                        Some(_) => wants_f32 = true,
                        None => {}
                    }
                }
                Use::Capture { .. } => wants_f32 = true,
            }
        }
        let is_out = g.is_output(v);
        if is_out && keep_io {
            wants_f32 = true;
        }
        if main && cx.opts.keep_weights.contains(&name) {
            continue;
        }
        let target = if wants_low { low } else { cx.store };
        let Some((lt, conv)) = convert::lower_tensor(&t, target) else {
            continue;
        };
        let record_clamp = |cx: &mut Cx<'_>| {
            if conv.clamped > 0 {
                cx.report.clamped.push((name.clone(), conv.clamped));
            }
        };
        if wants_low && !wants_f32 {
            // Every reader is low: convert in place.
            if is_init {
                g.set_initializer(v, lt);
            } else if let Some((n, _)) = constant_node_tensor(g, v) {
                set_value_attr(g, n, lt);
            }
            el.new.insert(v, low);
            set_elem(g, v, low);
            record_clamp(cx);
            if main && is_init {
                cx.report.weights_lowered.push(name);
            }
            continue;
        }
        let numel = t.numel().unwrap_or(0);
        let candidate = is_init && !is_out && (wants_low || numel >= cx.opts.min_weight_elems);
        if candidate && main && (exact.is_some() || !conv.faithful()) {
            let why = if let Some(why) = exact {
                why
            } else if conv.clamped > 0 {
                "beyond fp16's range"
            } else {
                "too many values below fp16's normal range"
            };
            cx.report.kept_fp32_weights.push((name.clone(), why.to_string()));
        }
        let store_low = candidate
            && exact.is_none()
            && conv.faithful()
            && (wants_low || !hold.contains(&v));
        if store_low {
            // Stored once, low; one Cast back to fp32 under the old name.
            let mut lt = lt;
            lt.name = String::new();
            let lv = new_initializer(g, cx, &format!("{name}_{}", short(lt.dtype)), lt);
            el.orig.insert(lv, low);
            el.new.insert(lv, low);
            g.take_initializer(v);
            let readers: Vec<(NodeId, usize)> = g
                .uses(v)
                .iter()
                .filter_map(|u| match u {
                    Use::Input { node, slot } => Some((*node, *slot as usize)),
                    _ => None,
                })
                .collect();
            for &(r, slot) in &readers {
                if req.get(&(r, slot)) == Some(&low) {
                    g.set_input(r, slot, Some(lv));
                }
            }
            if !g.uses(v).is_empty() {
                let pos = first_reader(g, v);
                add_cast(g, pos, lv, v, DType::F32, cx)?;
            } else {
                g.remove_value(v);
                el.new.remove(&v);
            }
            if main {
                cx.report.weights_lowered.push(name);
            }
        } else if wants_low && is_init && (conv.clamped > 0 || exact.is_some()) {
            // Beyond fp16's range, or read by a quantization op too, and
            // read fp32: a (clamped) low copy for the low readers, so they
            // see ±65504 rather than ±inf.
            let mut lt = lt;
            lt.name = String::new();
            let lv = new_initializer(g, cx, &format!("{name}_{}", short(lt.dtype)), lt);
            el.orig.insert(lv, low);
            el.new.insert(lv, low);
            let readers: Vec<(NodeId, usize)> = g
                .uses(v)
                .iter()
                .filter_map(|u| match u {
                    Use::Input { node, slot } => Some((*node, *slot as usize)),
                    _ => None,
                })
                .collect();
            for (r, slot) in readers {
                if req.get(&(r, slot)) == Some(&low) {
                    g.set_input(r, slot, Some(lv));
                }
            }
            record_clamp(cx);
        }
    }
    Ok(())
}

/// fp16/bf16: the fp32 weights that only fp32 nodes read, when storing them
/// low would cost more than it saves. Each such weight stored low gets a
/// Cast back whose fp32 copy lives in the arena while its reader runs, so
/// storing saves 2 bytes per element (fp16 or bf16), but one node may need
/// an fp32 copy, 4 bytes per element, of every weight it reads at once.
/// When the largest such set of copies outweighs the total saving and those
/// weights are at least half of the fp32 weights lowering may store low
/// (weights kept fp32 on another rule are not counted; one fp32 LSTM or mel
/// MatMul holding most of the rest, so the peak holds the copy), they all
/// stay fp32 and a warning says why. `fp16-weights`, which asks for fp16 storage by name,
/// is never held.
fn fp32_read_weights_to_hold(
    g: &Graph,
    req: &HashMap<(NodeId, usize), DType>,
    consts: &[ValueId],
    const_compute: &HashSet<NodeId>,
    main: bool,
    cx: &mut Cx<'_>,
) -> HashSet<ValueId> {
    if cx.opts.precision == Precision::F16Weights {
        return HashSet::new();
    }
    // Weights that stay fp32 on another rule are never stored low: they
    // neither save nor need a copy (see `lower_constants`).
    let kept_anyway = |v: ValueId| {
        (main && cx.opts.keep_weights.iter().any(|k| k == g.name(v)))
            || g.uses(v).iter().any(|u| {
                let Use::Input { node: r, .. } = u else {
                    return false;
                };
                let op = g.node(*r).op_type.as_str();
                !default_domain(g, *r)
                    || ops::is_quant_op(op)
                    || ops::is_signal_op(op)
                    || (op == "Mul" && mul_feeds_signal_op(g, *r))
                    || const_compute.contains(r)
                    || basis_operand(g, *r).is_some()
            })
    };
    let mut saved = 0u64;
    // fp32 weight bytes that lowering may store low (all but those kept).
    let mut storable = 0u64;
    let mut per_reader: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut held = HashSet::new();
    for &v in consts {
        let Some(t) = g.initializer(v) else { continue };
        let numel = t.numel().unwrap_or(0);
        if t.dtype != DType::F32 || g.is_output(v) || kept_anyway(v) {
            continue;
        }
        storable += 4 * numel;
        if numel < cx.opts.min_weight_elems {
            continue;
        }
        let readers: Vec<(NodeId, usize)> = g
            .uses(v)
            .iter()
            .filter_map(|u| match u {
                Use::Input { node, slot } => Some((*node, *slot as usize)),
                Use::Capture { .. } => None,
            })
            .collect();
        if readers.is_empty() || readers.iter().any(|k| req.get(k) == Some(&cx.low)) {
            continue;
        }
        saved += 2 * numel;
        for (r, _) in readers {
            *per_reader.entry(r).or_default() += 4 * numel;
        }
        held.insert(v);
    }
    let Some((&node, &copies)) = per_reader.iter().max_by_key(|(_, &b)| b) else {
        return HashSet::new();
    };
    // Only when they are most of the fp32 weights lowering may store low:
    // then the peak, which holds every weight, also holds the copy. A small
    // one (Whisper's position table) is stored low, as its copy likely fits
    // the arena.
    if copies <= saved || 2 * (2 * saved) < storable {
        return HashSet::new();
    }
    let d = g.node(node);
    let label = if d.name.is_empty() { d.op_type.clone() } else { d.name.clone() };
    cx.report.warnings.push(format!(
        "weights only fp32 nodes read stay fp32: storing {} of them low would save {saved} bytes but '{label}' would need {copies} bytes of fp32 copies at once",
        held.len()
    ));
    held
}

fn new_initializer(g: &mut Graph, cx: &mut Cx<'_>, hint: &str, t: Tensor) -> ValueId {
    let ty = Some(Type::known(t.dtype, &t.dims));
    let v = fresh(g, cx, hint, ty);
    g.set_initializer(v, t);
    v
}

/// `fp16` / `bf16`: the suffix of low copies.
fn short(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        _ => "fp16",
    }
}

fn set_value_attr(g: &mut Graph, n: NodeId, t: Tensor) {
    let attrs = &mut g.node_mut(n).attributes;
    if let Some(a) = attrs.iter_mut().find(|a| a.name == "value") {
        a.value = AttrValue::Tensor(t);
    }
}

/// Right before the first node reading `v` (as an input or through a
/// subgraph), or at the end.
fn first_reader(g: &Graph, v: ValueId) -> Place {
    g.first_in_order(g.uses(v).iter().map(|u| u.node()))
        .map_or(Place::End, Place::Before)
}

/// `v`'s type with element type `t` (shape kept).
fn retyped(g: &Graph, v: ValueId, t: DType) -> Option<Type> {
    let shape = g.ty(v).and_then(|ty| ty.shape()).cloned();
    Some(Type::tensor(t, shape))
}

fn set_elem(g: &mut Graph, v: ValueId, t: DType) {
    let shape = g.ty(v).and_then(|ty| ty.shape()).cloned();
    match g.value_mut(v).ty.as_mut().and_then(Type::as_tensor_mut) {
        Some(tt) => tt.elem = t,
        None => g.value_mut(v).ty = Some(Type::tensor(t, shape)),
    }
}

/// Inserts `out = Cast<to>(src)` at `pos`.
fn add_cast(
    g: &mut Graph,
    pos: Place,
    src: ValueId,
    out: ValueId,
    to: DType,
    cx: &mut Cx<'_>,
) -> Result<(), PassError> {
    let name = format!("{}_cast", g.name(out));
    g.insert_node_at(
        pos,
        NewNode::new("Cast")
            .name(name)
            .inputs(&[src])
            .outputs(&[out])
            .attr(Attribute::new("to", AttrValue::Int(to.to_onnx() as i64))),
    )?;
    cx.report.casts_inserted += 1;
    Ok(())
}

/// Removes Casts that lowering made unused or same-type, to a fixed point.
fn cleanup_casts(g: &mut Graph, el: &mut Elems, cx: &mut Cx<'_>) {
    loop {
        let mut changed = false;
        for n in g.nodes().collect::<Vec<_>>() {
            if !is_cast(g, n) {
                continue;
            }
            let d = g.node(n);
            let (Some(x), Some(y)) = (d.input(0), d.output(0)) else {
                continue;
            };
            let to = d.attr_int("to").map(|c| DType::from_onnx(c as i32));
            let unused = g.uses(y).is_empty() && !g.is_output(y);
            let same = to.is_some() && el.cur(x) == to;
            if unused {
                g.remove_node(n);
                g.remove_value(y);
            } else if same && !g.is_output(y) {
                if g.replace_all_uses(y, x).is_err() {
                    continue;
                }
                g.remove_node(n);
                g.remove_value(y);
            } else if same {
                // `y` is a graph output: x's producer writes `y` directly
                // and x's other readers read `y`.
                let Some((p, slot)) = g.producer(x) else {
                    continue;
                };
                if g.is_output(x) || g.is_input(x) {
                    continue;
                }
                g.remove_node(n);
                g.set_output(p, slot as usize, Some(y));
                if g.replace_all_uses(x, y).is_err() {
                    // Undo: a subgraph defines a value named like `y`.
                    g.set_output(p, slot as usize, Some(x));
                    continue;
                }
                g.remove_value(x);
            } else {
                continue;
            }
            el.new.remove(&y);
            cx.report.casts_removed += 1;
            changed = true;
        }
        if !changed {
            break;
        }
    }
}
