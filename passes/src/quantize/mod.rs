//! Quantization to int8 / int4 in standard ONNX ops (default domain only).
//!
//! Why: weights take 4x less memory in int8 and 8x less in int4, and the
//! usual tool (onnxruntime's quantizer) refuses Constant-node weights and
//! emits contrib ops for int4. This pass writes only `DequantizeLinear`,
//! `QuantizeLinear` and `DynamicQuantizeLinear`, so the output runs on any
//! ONNX runtime (onnxruntime fuses the patterns into integer kernels).
//!
//! Modes ([`QuantMode`]):
//! - `int8-weights`: every weight of a MatMul, Gemm, Conv or Gather
//!   (embedding) is stored int8, symmetric, per output channel, and
//!   dequantized once by `DequantizeLinear` (opset 13, `axis`).
//! - `int4-weights`: as above, but 2-D MatMul/Gemm/Gather weights are
//!   packed 4-bit with one scale (and, unless symmetric, a uint4 zero
//!   point) per `block_size` elements along the reduction axis (or the
//!   largest smaller power of two, down to 16, that divides it): the
//!   blocked `DequantizeLinear` of opset 21. Conv weights `[O, I, k...]`
//!   block along their input channels (axis 1). Weights whose reduction
//!   axis no such block divides (a Conv with 3 or 24 input channels, a
//!   depthwise Conv) fall back to int8. The scales are stored float16: for
//!   a float32 weight a `Cast` of the scales to float32 (1/32 of the
//!   elements) feeds the `DequantizeLinear`, which writes the float32
//!   weight exactly. At block 32 that is 0.5 + 2/32 + 0.5/32 bytes per
//!   element, 0.145x of fp32 (0.141x symmetric). onnxruntime folds the
//!   Cast and still fuses `DequantizeLinear` -> `MatMul` into its
//!   `MatMulNBits` kernel (a float16 `DequantizeLinear` output cast to
//!   float32 would not fuse: BERT-base ran 8.7x slower in it). Each scale is
//!   rounded to float16 before its block is quantized with it; a weight
//!   with a block scale float16 cannot hold (under 6.1e-5 or over 65504)
//!   keeps float32 scales, with a warning. [`Quantize::int4_f16_scales`]
//!   off gives float32 scales throughout.
//! - `dynamic`: weights on the same symmetric int8 grid, stored as uint8
//!   around zero point 128 (onnxruntime's x86 u8s8 kernels saturate; see
//!   `quantize_weight`), and each float activation read by a
//!   quantized MatMul/Gemm/Conv (both operands of attention MatMuls) goes
//!   through `DynamicQuantizeLinear` + `DequantizeLinear` (the QDQ form of
//!   dynamic quantization; one pair per activation).
//! - `static`: weights as in `dynamic`, and activations through `QuantizeLinear` +
//!   `DequantizeLinear` with scales from calibrated ranges the caller gives
//!   ([`Quantize::ranges`], by value name): uint8 asymmetric, or int8
//!   symmetric with `symmetric`. An activation without a range keeps its
//!   node weight-only (the report lists the names it wanted:
//!   [`QuantReport::wanted_ranges`]).
//!
//! Rules the output keeps:
//! 1. A weight is a float32 (or float16) initializer (not an overridable graph input) or
//!    a `Constant` node's value, in any graph. Its reads are followed
//!    through `Transpose`, `Reshape` and `Identity` and into If/Loop/Scan
//!    bodies that capture it. It is quantized only when every read ends in
//!    a weight slot of a quantized MatMul/Gemm/Conv/Gather; shared and tied
//!    weights (an embedding also used, transposed, as the LM head) are
//!    stored once. The per-channel axis is the output channel of every read
//!    mapped back through the Transposes/Reshapes; reads that disagree get
//!    one per-tensor scale.
//! 2. The weight's value keeps its name and shape: a `DequantizeLinear`
//!    just before its first reader (or where the `Constant` was) writes it from
//!    `NAME_quantized`, `NAME_scale` (and `NAME_zero_point`). Readers are
//!    untouched, so biases stay float (the QDQ format allows it).
//! 3. Normalizations, softmax and every op other than the four stay float
//!    (listed in [`QuantReport::kept_ops`] with why); so do weights smaller
//!    than `min_weight_elems`, nodes named or typed in `exclude`, and
//!    main-graph nodes in `keep_nodes` (the `--max-error` fallback); nodes
//!    in `weight_only_nodes` keep float activations, and in int4 mode the
//!    weights read by `int8_nodes` are int8 instead (a Loop in it covers
//!    its body's readers of the weight it carries).
//! 4. What the model had quantized already stays exactly as it was:
//!    integer ops (`MatMulInteger`, `ConvInteger`, `QLinear*`,
//!    `DynamicQuantizeLinear`, onnxruntime's `QGemm`, `QAttention`,
//!    `MatMulNBits`, ...), Q/DQ pairs, `DequantizeLinear` weights, their
//!    scales and zero points, and this pass's own output (quantizing twice
//!    changes nothing). A MatMul/Gemm/Conv/Gather with an input that is a
//!    `DequantizeLinear` output (through Transpose/Reshape/Identity/Cast,
//!    or captured by a body) is quantized already: no second
//!    `DynamicQuantizeLinear` or Q/DQ pair goes on its inputs and its
//!    float weights stay float. Listed in
//!    [`QuantReport::already_quantized`].
//! 5. The default-domain opset is raised (by `upgrade_opset`) to 13, 19
//!    when float16 weights are quantized (float16 scales), or 21 for int4,
//!    and the IR version to one that has int4. float16 weights keep float16
//!    compute: only their storage is quantized (DynamicQuantizeLinear takes
//!    float32 only).
//!
//! Needs element types: runs inference on a copy. Run it last (after the
//! fusions; Gemm and fused Conv weights are quantized as they are).
//!
//! ```text
//! before:                                  after (int8-weights):
//! g (float[1,4] x) => (float[1,2] y)       g (float[1,4] x) => (float[1,2] y)
//!   <float[4,2] w = {...}> {                 <int8[4,2] w_quantized = {...},
//!   y = MatMul (x, w)                         float[2] w_scale = {...}> {
//! }                                          w = DequantizeLinear <axis: int = 1> (w_quantized, w_scale)
//!                                            y = MatMul (x, w)
//!                                          }
//! ```
//!
//! int4-weights (block 32, asymmetric) on a float32 weight `[64, 8]`:
//!
//! ```text
//! before:                          after:
//! <float[64,8] w = {...}> {        <uint4[64,8] w_quantized = {...},
//!   y = MatMul (x, w)               float16[2,8] w_scale = {...},    one per 32 rows (K) and column
//! }                                 uint4[2,8] w_zero_point = {...}> {
//!                                    w_scale_f32 = Cast <to: int = 1> (w_scale)
//!                                    w = DequantizeLinear <axis: int = 0, block_size: int = 32> (w_quantized, w_scale_f32, w_zero_point)
//!                                    y = MatMul (x, w)
//!                                  }
//! ```

pub mod calibrate;

pub use calibrate::{Calibrate, RangeCollector};

use crate::upgrade_opset::UpgradeOpset;
use crate::{Pass, PassContext, PassError, PassStats};
use bytes::Bytes;
use graphopt_ir::infer::{InferOptions, TypeTable};
use graphopt_ir::{
    AttrValue, Attribute, DType, Graph, Model, NewNode, NodeId, Tensor, Type, Use, ValueId,
};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What to quantize, and to what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantMode {
    Dynamic,
    Static,
    Int8Weights,
    Int4Weights,
}

impl QuantMode {
    pub fn parse(s: &str) -> Result<QuantMode, PassError> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "dynamic" => Ok(QuantMode::Dynamic),
            "static" => Ok(QuantMode::Static),
            "int8-weights" => Ok(QuantMode::Int8Weights),
            "int4-weights" => Ok(QuantMode::Int4Weights),
            _ => Err(PassError(format!(
                "unknown quantization mode '{s}'; valid: dynamic, static, int8-weights, int4-weights"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Dynamic => "dynamic",
            QuantMode::Static => "static",
            QuantMode::Int8Weights => "int8-weights",
            QuantMode::Int4Weights => "int4-weights",
        }
    }

    /// The default-domain opset the output needs.
    pub fn min_opset(self) -> i64 {
        match self {
            QuantMode::Int4Weights => 21,
            _ => 13,
        }
    }

    pub fn activations(self) -> bool {
        matches!(self, QuantMode::Dynamic | QuantMode::Static)
    }
}

/// The pass and its options. `Quantize` (the constant) is the registry's
/// configuration: dynamic int8, per channel.
#[derive(Clone, Debug)]
pub struct Quantize {
    pub mode: QuantMode,
    /// One scale per output channel (else one per weight tensor).
    pub per_channel: bool,
    /// Activations int8 with zero point 0 (static), and int4 weights without
    /// zero points. int8 weights are always symmetric.
    pub symmetric: bool,
    /// int4 block size along the reduction axis (16 or more, a power of two).
    pub block_size: i64,
    /// Op types or node names left float.
    pub exclude: Vec<String>,
    /// Main-graph nodes left float (ids are stable across clones).
    pub keep_nodes: Vec<NodeId>,
    /// Main-graph nodes whose weights are quantized but whose activations
    /// stay float (dynamic and static modes), as when their activation
    /// quantization alone breaks an error bound.
    pub weight_only_nodes: Vec<NodeId>,
    /// Main-graph nodes whose weights are int8 (per channel unless
    /// `per_channel` is off) in int4 mode (a weight any of them reads), as
    /// when int4 breaks an error bound.
    pub int8_nodes: Vec<NodeId>,
    /// Calibrated `(min, max)` of activations, by value name (static mode).
    pub ranges: BTreeMap<String, (f32, f32)>,
    /// Weights with fewer elements stay float.
    pub min_weight_elems: u64,
    /// int4 block scales of float32 weights stored float16 (cast to
    /// float32 in the graph); else float32 (0.016x of fp32 more).
    pub int4_f16_scales: bool,
}

#[allow(non_upper_case_globals)]
pub const Quantize: Quantize = Quantize {
    mode: QuantMode::Dynamic,
    per_channel: true,
    symmetric: false,
    block_size: 32,
    exclude: Vec::new(),
    keep_nodes: Vec::new(),
    weight_only_nodes: Vec::new(),
    int8_nodes: Vec::new(),
    ranges: BTreeMap::new(),
    min_weight_elems: 256,
    int4_f16_scales: true,
};

impl Default for Quantize {
    fn default() -> Self {
        Quantize
    }
}

/// What one quantization did.
#[derive(Clone, Debug, Default)]
pub struct QuantReport {
    /// Main-graph nodes quantized (weights or activations), program order.
    pub quantized: Vec<NodeId>,
    /// Nodes quantized by op type, subgraphs included.
    pub by_op: BTreeMap<String, u64>,
    /// Weights quantized: name and format (`int8 per-channel axis 1`, ...).
    pub weights: Vec<(String, String)>,
    /// Activations quantized (one Q/DQ or DynamicQuantizeLinear pair each).
    pub activations: u64,
    /// MatMul/Gemm/Conv/Gather nodes and weights left float, with why.
    pub kept_float: Vec<(String, String)>,
    /// Other ops left float: count and why.
    pub kept_ops: BTreeMap<String, (u64, String)>,
    /// Activations static mode wanted a range for (main graph and bodies).
    pub wanted_ranges: Vec<String>,
    /// What the model had quantized already, left exactly as it was: node
    /// and what (`MatMulInteger`, `QDQ weight`, `QDQ activation`,
    /// `MatMul on dequantized inputs`, ...), program order, bodies after
    /// their graph.
    pub already_quantized: Vec<(String, String)>,
    pub weight_bytes_before: u64,
    pub weight_bytes_after: u64,
    pub opset_before: Option<i64>,
    pub opset_after: Option<i64>,
    pub warnings: Vec<String>,
}

impl QuantReport {
    pub fn stats(&self) -> PassStats {
        let mut s = PassStats::default();
        s.add("nodes_quantized", self.by_op.values().sum());
        s.add("weights_quantized", self.weights.len() as u64);
        s.add("activations_quantized", self.activations);
        s.add(
            "opset_raised",
            (self.opset_before != self.opset_after) as u64,
        );
        s.add(
            "bytes_saved",
            self.weight_bytes_before
                .saturating_sub(self.weight_bytes_after),
        );
        s
    }
}

impl Pass for Quantize {
    fn name(&self) -> &'static str {
        "quantize"
    }
    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }
    fn run_in(&self, model: &mut Model, _cx: &mut PassContext) -> Result<PassStats, PassError> {
        let r = self.quantize(model)?;
        let mut s = r.stats();
        s.warnings = r.warnings;
        Ok(s)
    }
    fn exact(&self) -> bool {
        false
    }
}

/// Ops that stay float, and why (for the report).
const KEPT_OPS: &[(&str, &str)] = &[
    ("LayerNormalization", "normalization: statistics need float"),
    ("BatchNormalization", "normalization: statistics need float"),
    ("InstanceNormalization", "normalization: statistics need float"),
    ("GroupNormalization", "normalization: statistics need float"),
    ("RMSNormalization", "normalization: statistics need float"),
    ("LpNormalization", "normalization: statistics need float"),
    ("Softmax", "softmax: exponent range needs float"),
    ("LogSoftmax", "softmax: exponent range needs float"),
    ("ConvTranspose", "not quantized by this pass (MatMul/Gemm/Conv/Gather only)"),
    ("Einsum", "not quantized by this pass (MatMul/Gemm/Conv/Gather only)"),
];

/// A read of a weight: node, slot, and the weight axes of the read value.
struct Read {
    /// Output-channel axis in the weight's coordinates (None: unknown).
    channel: Option<usize>,
    /// Reduction axis in the weight's coordinates (int4 blocking).
    reduce: Option<usize>,
    conv: bool,
    /// The reader is in `int8_nodes` (or inside a Loop that is).
    int8: bool,
    /// The main-graph Loop whose body holds the reader, reading the weight
    /// as a loop-carried state: it stands for the reader in the report's
    /// `quantized` (the fallback gives it back whole).
    owner: Option<NodeId>,
    /// The body input the reader reads the weight as (a quantized weight
    /// under that name too).
    alias: Option<String>,
}

/// How the weights of one graph were decided.
enum Decision {
    Quantize(Vec<Read>),
    Keep(String),
}

struct Ctx<'a> {
    q: &'a Quantize,
    report: QuantReport,
    /// Every value name in the model (new names must be unique model-wide).
    names: HashSet<String>,
    quantized_weights: HashSet<String>,
    /// Body inputs that carry a quantized weight through a Loop: their
    /// readers keep float activations (a recurrence would requantize its
    /// state every step, and the error compounds).
    loop_weights: HashSet<String>,
    uses_int4: bool,
    /// Gather nodes replaced by the gathered int8 form (counted already),
    /// and Loops whose bodies read a quantized weight as their state: the
    /// main-graph nodes quantized besides those of step 2.
    gathered: Vec<NodeId>,
    /// A float16 weight was quantized (its float16 scales need opset 19).
    uses_f16: bool,
    /// Element types by value name, every graph (names are unique
    /// model-wide, and a body's captures need the enclosing graph's types).
    elems: HashMap<String, DType>,
    /// Values the model had dequantized (`DequantizeLinear` outputs, and
    /// layout ops and Casts of them), by name: a body sees them as
    /// captures.
    dequantized: HashSet<String>,
}

impl Quantize {
    /// Quantizes `model` in place and reports what it did. On error the
    /// model may be partly changed; callers that need atomicity work on a
    /// clone (the manager does).
    pub fn quantize(&self, model: &mut Model) -> Result<QuantReport, PassError> {
        if !(16..=4096).contains(&self.block_size) || self.block_size.count_ones() != 1 {
            return Err(PassError(format!(
                "quantize: block size {} is not a power of two in 16..=4096",
                self.block_size
            )));
        }
        let before = weight_bytes(&model.graph);
        let opset_before = model.onnx_opset();
        let Some(opset) = opset_before else {
            return Err(PassError(
                "quantize: the model imports no default-domain opset".into(),
            ));
        };
        // On a copy: a refused opset upgrade leaves the model as it was.
        let mut m = model.clone();
        let types = TypeTable::infer(&m, &InferOptions::default());
        let mut names = HashSet::new();
        collect_names(&m.graph, &mut names);
        let mut elems = HashMap::new();
        collect_elems(&m.graph, &types, &mut elems);
        let mut cx = Ctx {
            q: self,
            report: QuantReport::default(),
            names,
            quantized_weights: HashSet::new(),
            loop_weights: HashSet::new(),
            uses_int4: false,
            uses_f16: false,
            gathered: Vec::new(),
            elems,
            dequantized: HashSet::new(),
        };
        quantize_graph(&mut m.graph, &types, &mut cx, true)?;
        let mut r = cx.report;
        let changed = !r.weights.is_empty() || r.activations > 0;
        let need = if cx.uses_f16 {
            self.mode.min_opset().max(19)
        } else {
            self.mode.min_opset()
        };
        if changed && opset < need {
            // DequantizeLinear's axis needs 13, blocked int4 21; the upgrade
            // leaves the quantization nodes as they are.
            UpgradeOpset { target: need }
                .run(&mut m)
                .map_err(|e| {
                    PassError(format!(
                        "quantize: {} needs opset {need}: {e}",
                        self.mode.name()
                    ))
                })?;
        }
        if cx.uses_int4 && m.ir_version < 10 {
            m.ir_version = 10;
        }
        if changed {
            *model = m;
        }
        r.weight_bytes_before = before;
        r.weight_bytes_after = weight_bytes(&model.graph);
        r.opset_before = opset_before;
        r.opset_after = model.onnx_opset();
        Ok(r)
    }

    fn excluded(&self, g: &Graph, n: NodeId, main: bool) -> Option<String> {
        let d = g.node(n);
        if self
            .exclude
            .iter()
            .any(|e| e == &d.op_type || (!d.name.is_empty() && e == &d.name))
        {
            return Some("excluded".into());
        }
        if main && self.keep_nodes.contains(&n) {
            return Some("kept float to meet the error bound".into());
        }
        None
    }
}

fn is_target(op: &str) -> bool {
    matches!(op, "MatMul" | "Gemm" | "Conv" | "Gather")
}

/// Contrib ops (onnxruntime's `com.microsoft`) that compute on quantized
/// tensors, besides every `QLinear*` and `QOrdered*`.
const QUANTIZED_CONTRIB: &[&str] = &[
    "QGemm",
    "QAttention",
    "QEmbedLayerNormalization",
    "DynamicQuantizeMatMul",
    "DynamicQuantizeLSTM",
    "MatMulIntegerToFloat",
    "MatMulNBits",
    "MatMulBnb4",
    "GatherBlockQuantized",
    "QMoE",
    "QuantizeLinear",
    "DequantizeLinear",
];

/// What node `n` is when it belongs to a quantization the model already
/// had (it stays as it is): an integer op, a Q/DQ node, or a
/// MatMul/Gemm/Conv/Gather reading a `DequantizeLinear` output.
fn prequantized(g: &Graph, n: NodeId, cx: &Ctx) -> Option<String> {
    let d = g.node(n);
    let op = d.op_type.as_str();
    if !d.domain.is_empty() {
        let q = op.starts_with("QLinear")
            || op.starts_with("QOrdered")
            || QUANTIZED_CONTRIB.contains(&op);
        return q.then(|| d.qualified_op());
    }
    match op {
        "MatMulInteger" | "ConvInteger" | "DynamicQuantizeLinear" => Some(op.into()),
        _ if op.starts_with("QLinear") => Some(op.into()),
        "QuantizeLinear" => {
            // Counted at its DequantizeLinear when that is all it feeds.
            let uses = d.output(0).map_or(&[][..], |y| g.uses(y));
            let paired = !uses.is_empty()
                && uses.iter().all(|u| {
                    matches!(*u, Use::Input { node, slot: 0 }
                        if g.node(node).op_type == "DequantizeLinear")
                });
            (!paired).then(|| op.into())
        }
        "DequantizeLinear" => {
            // What it dequantizes: a constant (through layout ops and the
            // Gather of a quantized embedding) or a quantized activation.
            let mut x = d.input(0)?;
            for _ in 0..16 {
                if g.constant(x).is_some() {
                    return Some("QDQ weight".into());
                }
                let Some((p, _)) = g.producer(x) else { break };
                let pd = g.node(p);
                match pd.op_type.as_str() {
                    "Constant" => return Some("QDQ weight".into()),
                    "QuantizeLinear" => return Some("QDQ activation".into()),
                    "DynamicQuantizeLinear" => return Some("QDQ activation (dynamic)".into()),
                    "Transpose" | "Reshape" | "Identity" | "Gather" | "Squeeze"
                    | "Unsqueeze" => match pd.input(0) {
                        Some(i) => x = i,
                        None => break,
                    },
                    _ => break,
                }
            }
            Some("DequantizeLinear".into())
        }
        "Gather" if gathered_rows(g, n) == Some(true) => {
            Some("int8 embedding, gathered rows".into())
        }
        _ if is_target(op) && quantized_already(g, n, cx) => {
            Some(format!("{op} on dequantized inputs"))
        }
        _ => None,
    }
}

/// Whether `n` is quantized already: an input is (through layout ops and
/// Casts) the output of a `DequantizeLinear` the model had, or it is a
/// Gather of an int8 embedding's rows or row scales (this pass's
/// `gathered` form). Quantizing its inputs again would round twice.
fn quantized_already(g: &Graph, n: NodeId, cx: &Ctx) -> bool {
    g.node(n)
        .inputs()
        .iter()
        .flatten()
        .any(|&x| matches!(source(g, x, cx), Source::Dequantized))
        || gathered_rows(g, n).is_some()
}

/// For a Gather of the gathered int8 form `Mul(Cast(Gather(Q, ids)),
/// Gather(S, ids))` with `Q` an integer constant: `Some(true)` for the
/// Gather of `Q`'s rows, `Some(false)` for the Gather of their scales.
fn gathered_rows(g: &Graph, n: NodeId) -> Option<bool> {
    let d = g.node(n);
    if d.op_type != "Gather" || !d.domain.is_empty() {
        return None;
    }
    let is = |m: NodeId, op: &str| g.node(m).op_type == op && g.node(m).domain.is_empty();
    let producer = |v: ValueId, op: &str| g.producer(v).map(|(p, _)| p).filter(|&p| is(p, op));
    // The other operand of each Mul reading `v`.
    let mul_others = |v: ValueId| -> Vec<ValueId> {
        g.uses(v)
            .iter()
            .filter_map(|u| match *u {
                Use::Input { node: m, .. } if is(m, "Mul") => {
                    g.node(m).inputs().iter().flatten().find(|&&o| o != v).copied()
                }
                _ => None,
            })
            .collect()
    };
    let int_rows = |gather: NodeId| {
        g.node(gather)
            .input(0)
            .and_then(|q| g.constant(q))
            .is_some_and(|t| matches!(t.dtype, DType::I8 | DType::U8 | DType::I4 | DType::U4))
    };
    let y = d.output(0)?;
    // The scales' Gather: multiplied by the Cast of the rows' Gather.
    let rows_cast = |x: ValueId| {
        producer(x, "Cast")
            .and_then(|c| g.node(c).input(0))
            .and_then(|r| producer(r, "Gather"))
            .is_some_and(int_rows)
    };
    if mul_others(y).into_iter().any(rows_cast) {
        return Some(false);
    }
    // The rows' Gather: an integer table, cast, then multiplied by a Gather.
    if int_rows(n) {
        for u in g.uses(y) {
            let Use::Input { node: c, .. } = *u else {
                continue;
            };
            let Some(cy) = g.node(c).output(0).filter(|_| is(c, "Cast")) else {
                continue;
            };
            if mul_others(cy)
                .into_iter()
                .any(|o| producer(o, "Gather").is_some())
            {
                return Some(true);
            }
        }
    }
    None
}

fn label(g: &Graph, n: NodeId) -> String {
    let d = g.node(n);
    if d.name.is_empty() {
        format!("{}#{}", d.op_type, n.index())
    } else {
        d.name.clone()
    }
}

fn collect_names(g: &Graph, out: &mut HashSet<String>) {
    for v in g.values() {
        out.insert(g.name(v).to_string());
    }
    for (_, sub) in g.subgraphs() {
        collect_names(sub, out);
    }
}

fn collect_elems(g: &Graph, types: &TypeTable, out: &mut HashMap<String, DType>) {
    for v in g.values() {
        if let Some(e) = types.ty(v).and_then(|t| t.elem()) {
            out.entry(g.name(v).to_string()).or_insert(e);
        }
    }
    for n in g.nodes() {
        for (ai, a) in g.node(n).attributes.iter().enumerate() {
            for (gi, sub) in a.graphs().enumerate() {
                if let Some(st) = types.sub(n, ai, gi) {
                    collect_elems(sub, st, out);
                }
            }
        }
    }
}

/// Initializer and Constant-node bytes, subgraphs included.
pub fn weight_bytes(g: &Graph) -> u64 {
    let mut b: u64 = g
        .initializers()
        .iter()
        .filter_map(|&v| g.initializer(v))
        .map(|t| t.nbytes())
        .sum();
    for n in g.nodes() {
        let d = g.node(n);
        if d.op_type == "Constant" && d.domain.is_empty() {
            b += d.attr_tensor("value").map_or(0, |t| t.nbytes());
        }
    }
    b + g.subgraphs().map(|(_, s)| weight_bytes(s)).sum::<u64>()
}

/// The float32 weight `v` holds, if it is one (initializer or Constant).
fn weight_tensor(g: &Graph, v: ValueId) -> Option<&Tensor> {
    let t = match g.constant(v) {
        Some(t) => t,
        None => {
            let (n, _) = g.producer(v)?;
            let d = g.node(n);
            if d.op_type != "Constant" || !d.domain.is_empty() {
                return None;
            }
            d.attr_tensor("value")?
        }
    };
    (matches!(t.dtype, DType::F32 | DType::F16) && t.raw().is_some()).then_some(t)
}

/// Where the reads of `v` end, with `map[i]` the weight axis of `v`'s axis
/// `i`. Stops with `Err(why)` at a read that is not a weight slot.
fn follow(
    g: &Graph,
    types: &TypeTable,
    v: ValueId,
    (dims, map): (&[i64], &[Option<usize>]),
    cx: &Ctx,
    main: bool,
    out: &mut Vec<Read>,
) -> Result<(), String> {
    if g.is_output(v) {
        return Err(format!("'{}' is a graph output", g.name(v)));
    }
    follow_uses(g, types, v, (dims, map), cx, main, out)
}

/// [`follow`] on `v`'s readers only (a Loop body's pass-through state is
/// also a body output).
fn follow_uses(
    g: &Graph,
    types: &TypeTable,
    v: ValueId,
    (dims, map): (&[i64], &[Option<usize>]),
    cx: &Ctx,
    main: bool,
    out: &mut Vec<Read>,
) -> Result<(), String> {
    for u in g.uses(v).to_vec() {
        match u {
            Use::Capture { node } => {
                let d = g.node(node);
                for (ai, a) in d.attributes.iter().enumerate() {
                    for (gi, sub) in a.graphs().enumerate() {
                        let Some(sv) = sub.value_by_name(g.name(v)).filter(|&x| sub.is_outer(x))
                        else {
                            continue;
                        };
                        let empty = TypeTable::of(sub);
                        let st = types.sub(node, ai, gi).unwrap_or(&empty);
                        follow(sub, st, sv, (dims, map), cx, false, out)?;
                    }
                }
            }
            Use::Input { node, slot } => {
                let d = g.node(node);
                let op = d.op_type.as_str();
                let slot = slot as usize;
                if !d.domain.is_empty() {
                    return Err(format!("read by custom op {}", d.qualified_op()));
                }
                let r = dims.len();
                match op {
                    "Identity" => {
                        let o = d.output(0).ok_or("Identity without output")?;
                        follow(g, types, o, (dims, map), cx, main, out)?;
                    }
                    // A loop-carried value the body hands back unchanged (a
                    // TensorFlow export's LSTM weights): its readers in the
                    // body, and the Loop's final value of it.
                    "Loop" if slot >= 2 => {
                        if let Some(why) = cx.q.excluded(g, node, main) {
                            return Err(format!("read by Loop '{}' ({why})", label(g, node)));
                        }
                        let pass_through = d.attributes.iter().enumerate().find_map(|(ai, a)| {
                            let body = (a.name == "body").then(|| a.graphs().next()).flatten()?;
                            // Loop inputs (M, cond, v...) and body inputs
                            // (i, cond, v...) line up; body outputs are
                            // (cond, v..., scan outputs), the Loop's (v...,
                            // scan outputs). The state must come back
                            // unchanged and go nowhere else.
                            let bi = *body.inputs.get(slot)?;
                            let once = body.outputs.iter().filter(|&&o| o == bi).count() == 1;
                            (once && body.outputs.get(slot - 1) == Some(&bi))
                                .then_some((ai, body, bi))
                        });
                        let Some((ai, body, bi)) = pass_through else {
                            return Err(format!(
                                "read by Loop '{}' as a state its body changes",
                                label(g, node)
                            ));
                        };
                        let empty = TypeTable::of(body);
                        let st = types.sub(node, ai, 0).unwrap_or(&empty);
                        let start = out.len();
                        follow_uses(body, st, bi, (dims, map), cx, false, out)?;
                        let int8 = main && cx.q.int8_nodes.contains(&node);
                        for r in &mut out[start..] {
                            r.int8 |= int8;
                            if main {
                                r.owner.get_or_insert(node);
                            }
                            r.alias.get_or_insert_with(|| body.name(bi).to_string());
                        }
                        if let Some(o) = d.output(slot - 2) {
                            follow(g, types, o, (dims, map), cx, main, out)?;
                        }
                    }
                    "Transpose" => {
                        let perm: Vec<usize> = match d.attr_ints("perm") {
                            Some(p) => p.iter().map(|&x| x as usize).collect(),
                            None => (0..r).rev().collect(),
                        };
                        if perm.len() != r || perm.iter().any(|&p| p >= r) {
                            return Err(format!("Transpose '{}' has a bad perm", label(g, node)));
                        }
                        let nd: Vec<i64> = perm.iter().map(|&p| dims[p]).collect();
                        let nm: Vec<Option<usize>> = perm.iter().map(|&p| map[p]).collect();
                        let o = d.output(0).ok_or("Transpose without output")?;
                        follow(g, types, o, (&nd, &nm), cx, main, out)?;
                    }
                    "Reshape" if slot == 0 => {
                        let o = d.output(0).ok_or("Reshape without output")?;
                        let nd: Vec<i64> = types
                            .ty(o)
                            .and_then(|t| t.shape())
                            .and_then(|s| s.as_known())
                            .ok_or_else(|| {
                                format!("Reshape '{}' has an unknown shape", label(g, node))
                            })?;
                        // Axes kept from the front and from the back map
                        // through; merged or split axes do not.
                        let mut nm = vec![None; nd.len()];
                        let mut i = 0;
                        while i < r.min(nd.len()) && dims[i] == nd[i] {
                            nm[i] = map[i];
                            i += 1;
                        }
                        let mut j = 0;
                        while j < r.min(nd.len()) && dims[r - 1 - j] == nd[nd.len() - 1 - j] {
                            nm[nd.len() - 1 - j] = map[r - 1 - j];
                            j += 1;
                        }
                        follow(g, types, o, (&nd, &nm), cx, main, out)?;
                    }
                    _ if is_target(op) => {
                        if let Some(why) = cx.q.excluded(g, node, main) {
                            return Err(format!("read by {} '{}' ({why})", op, label(g, node)));
                        }
                        if quantized_already(g, node, cx) {
                            return Err(format!(
                                "read by {op} '{}', quantized already (it reads a DequantizeLinear output)",
                                label(g, node)
                            ));
                        }
                        let at = |a: usize| map.get(a).copied().flatten();
                        let (channel, reduce) = match (op, slot) {
                            ("MatMul", 1) if r >= 2 => (at(r - 1), at(r - 2)),
                            ("MatMul", 0) if r >= 2 => (at(r - 2), at(r - 1)),
                            ("Gemm", 0 | 1) if r == 2 => {
                                let t = d
                                    .attr_int(if slot == 0 { "transA" } else { "transB" })
                                    .unwrap_or(0)
                                    != 0;
                                // A: rows are outputs; B: columns are.
                                let out_axis = if slot == 0 { t as usize } else { 1 - t as usize };
                                (at(out_axis), at(1 - out_axis))
                            }
                            ("Conv", 1) if r >= 3 => (at(0), at(1)),
                            ("Gather", 0) if r >= 1 => {
                                let a = d.attr_int("axis").unwrap_or(0);
                                let a = if a < 0 { a + r as i64 } else { a } as usize;
                                let other = (r == 2).then(|| 1 - a.min(1));
                                (at(a.min(r - 1)), other.and_then(at))
                            }
                            _ => {
                                return Err(format!(
                                    "read by {op} '{}' as input {slot}",
                                    label(g, node)
                                ))
                            }
                        };
                        out.push(Read {
                            channel,
                            reduce,
                            conv: op == "Conv",
                            int8: main && cx.q.int8_nodes.contains(&node),
                            owner: None,
                            alias: None,
                        });
                    }
                    _ => {
                        return Err(format!(
                            "read by {op} '{}' (not a MatMul/Gemm/Conv/Gather weight)",
                            label(g, node)
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}

fn quantize_graph(
    g: &mut Graph,
    types: &TypeTable,
    cx: &mut Ctx,
    main: bool,
) -> Result<(), PassError> {
    // 0. What the model had quantized already stays as it is.
    for n in g.nodes() {
        let d = g.node(n);
        let passes = matches!(
            d.op_type.as_str(),
            "Transpose" | "Reshape" | "Identity" | "Cast"
        ) && d.input(0).is_some_and(|x| cx.dequantized.contains(g.name(x)));
        if (d.op_type == "DequantizeLinear" || passes) && d.domain.is_empty() {
            if let Some(y) = d.output(0) {
                cx.dequantized.insert(g.name(y).to_string());
            }
        }
        // A dequantized value a Loop carries is dequantized in its body.
        if d.op_type == "Loop" && d.domain.is_empty() {
            for (slot, x) in d.inputs().iter().enumerate().skip(2) {
                if !x.is_some_and(|x| cx.dequantized.contains(g.name(x))) {
                    continue;
                }
                for a in d.attributes.iter().filter(|a| a.name == "body") {
                    for body in a.graphs() {
                        if let Some(&bi) = body.inputs.get(slot) {
                            cx.dequantized.insert(body.name(bi).to_string());
                        }
                    }
                }
            }
        }
    }
    for n in g.nodes() {
        if let Some(what) = prequantized(g, n, cx) {
            cx.report.already_quantized.push((label(g, n), what));
        }
    }

    // 1. Weights: decide, then rewrite each one's producer.
    let mut cands: Vec<ValueId> = g
        .initializers()
        .iter()
        .copied()
        .filter(|&v| !g.is_input(v))
        .collect();
    for n in g.nodes() {
        let d = g.node(n);
        if d.op_type == "Constant" && d.domain.is_empty() {
            cands.extend(d.output(0));
        }
    }
    for v in cands {
        let Some(t) = weight_tensor(g, v) else {
            continue;
        };
        let dims = t.dims.clone();
        let numel = t.numel().unwrap_or(0);
        let map: Vec<Option<usize>> = (0..dims.len()).map(Some).collect();
        let mut reads = Vec::new();
        let decision = match follow(g, types, v, (&dims, &map), cx, main, &mut reads) {
            Err(why) => Decision::Keep(why),
            Ok(()) if reads.is_empty() => continue,
            Ok(()) if numel < cx.q.min_weight_elems => Decision::Keep(format!(
                "small: {numel} elements < {}",
                cx.q.min_weight_elems
            )),
            Ok(()) => Decision::Quantize(std::mem::take(&mut reads)),
        };
        let name = g.name(v).to_string();
        match decision {
            Decision::Keep(why) => {
                // Only weights some quantizable node wanted are news.
                if !reads.is_empty()
                    || why.starts_with("small")
                    || why.contains("excluded")
                    || why.contains("error bound")
                    || why.contains("read by Loop")
                {
                    cx.report.kept_float.push((name, why));
                }
            }
            Decision::Quantize(reads) => {
                let fmt = quantize_weight(g, v, &dims, &reads, cx)?;
                cx.quantized_weights.insert(name.clone());
                for r in &reads {
                    if let Some(a) = &r.alias {
                        cx.quantized_weights.insert(a.clone());
                        cx.loop_weights.insert(a.clone());
                    }
                    if let Some(o) = r.owner.filter(|o| !cx.gathered.contains(o)) {
                        cx.gathered.push(o);
                    }
                }
                cx.report.weights.push((name, fmt));
            }
        }
    }

    let gathered = std::mem::take(&mut cx.gathered);
    if main {
        cx.report.quantized.extend(gathered);
    }

    // 2. Nodes: which are quantized, and their activations.
    let mut act_cache: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for n in g.nodes().collect::<Vec<_>>() {
        let d = g.node(n);
        if !d.domain.is_empty() {
            continue;
        }
        let op = d.op_type.clone();
        if let Some((_, why)) = KEPT_OPS.iter().find(|(o, _)| *o == op) {
            let e = cx
                .report
                .kept_ops
                .entry(op.clone())
                .or_insert((0, why.to_string()));
            e.0 += 1;
            continue;
        }
        if !is_target(&op) || quantized_already(g, n, cx) {
            continue;
        }
        if let Some(why) = cx.q.excluded(g, n, main) {
            cx.report.kept_float.push((label(g, n), why));
            continue;
        }
        let slots: &[usize] = match op.as_str() {
            "MatMul" | "Gemm" => &[0, 1],
            "Conv" => &[0, 1],
            _ => &[0],
        };
        let mut weights_ok = true;
        let mut any_weight = false;
        let mut acts = Vec::new();
        for &s in slots {
            let Some(x) = g.node(n).input(s) else {
                continue;
            };
            match source(g, x, cx) {
                Source::Quantized => any_weight = true,
                Source::FloatWeight => weights_ok = false,
                Source::Activation => acts.push((s, x)),
                // Not reached: such nodes are skipped above.
                Source::Dequantized => weights_ok = false,
            }
        }
        if op == "Gather" {
            if any_weight {
                *cx.report.by_op.entry(op).or_default() += 1;
                if main {
                    cx.report.quantized.push(n);
                }
            }
            continue;
        }
        if !weights_ok {
            cx.report.kept_float.push((
                label(g, n),
                "its weight stays float (see the weights kept float)".into(),
            ));
            continue;
        }
        let mut acted = false;
        let recurrent = d
            .inputs()
            .iter()
            .flatten()
            .any(|&x| cx.loop_weights.contains(g.name(x)));
        let weight_only = main && cx.q.weight_only_nodes.contains(&n) || recurrent;
        if recurrent && cx.q.mode.activations() && !acts.is_empty() {
            cx.report.kept_float.push((
                label(g, n),
                "activations float: it reads a weight a Loop carries (a recurrence); weights only"
                    .into(),
            ));
        } else if weight_only && cx.q.mode.activations() && !acts.is_empty() {
            cx.report.kept_float.push((
                label(g, n),
                "activations float: their quantization alone breaks the error bound; weights only"
                    .into(),
            ));
        }
        if cx.q.mode.activations() && (any_weight || acts.len() >= 2) && !weight_only {
            let mut ok = true;
            for &(_, x) in &acts {
                let elem = types
                    .ty(x)
                    .and_then(|t| t.elem())
                    .or_else(|| cx.elems.get(g.name(x)).copied());
                if elem != Some(DType::F32) {
                    ok = false;
                }
                if cx.q.mode == QuantMode::Static && !cx.q.ranges.contains_key(g.name(x)) {
                    ok = false;
                }
            }
            if cx.q.mode == QuantMode::Static {
                for &(_, x) in &acts {
                    let nm = g.name(x).to_string();
                    if !cx.report.wanted_ranges.contains(&nm) {
                        cx.report.wanted_ranges.push(nm);
                    }
                }
            }
            if ok {
                for &(s, x) in &acts {
                    let q = match act_cache.get(&x) {
                        Some(&q) => q,
                        None => {
                            let q = quantize_activation(g, n, x, cx)?;
                            act_cache.insert(x, q);
                            cx.report.activations += 1;
                            q
                        }
                    };
                    g.set_input(n, s, Some(q));
                }
                acted = !acts.is_empty();
            } else if !acts.is_empty() {
                let why = if cx.q.mode == QuantMode::Static {
                    "an input has no calibrated range or is not float32; weights only"
                } else {
                    "an input is not float32; weights only"
                };
                cx.report.kept_float.push((label(g, n), why.into()));
            }
        }
        if any_weight || acted {
            *cx.report.by_op.entry(op).or_default() += 1;
            if main {
                cx.report.quantized.push(n);
            }
        }
    }

    // 3. Bodies.
    let hosts: Vec<NodeId> = g.nodes().filter(|&n| g.node(n).has_subgraphs()).collect();
    for n in hosts {
        let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
        let mut res = Ok(());
        'outer: for (ai, a) in attrs.iter_mut().enumerate() {
            for (gi, sub) in a.graphs_mut().enumerate() {
                let empty = TypeTable::of(sub);
                let st = types.sub(n, ai, gi).unwrap_or(&empty);
                if let Err(e) = quantize_graph(sub, st, cx, false) {
                    res = Err(e);
                    break 'outer;
                }
            }
        }
        g.node_mut(n).attributes = attrs;
        g.refresh_captures(n);
        res?;
    }
    Ok(())
}

enum Source {
    /// A weight this run quantized.
    Quantized,
    FloatWeight,
    Activation,
    /// The output of a `DequantizeLinear` the model had.
    Dequantized,
}

/// What input `x` is: a quantized weight (through Transpose/Reshape/
/// Identity), a float constant, a dequantized value (through those and
/// Casts), or an activation.
fn source(g: &Graph, x: ValueId, cx: &Ctx) -> Source {
    let mut v = x;
    // Past a Cast only a DequantizeLinear counts (a constant behind a
    // Cast is read as an activation, as before).
    let mut cast = false;
    for _ in 0..16 {
        if cx.quantized_weights.contains(g.name(v)) && !cast {
            return Source::Quantized;
        }
        if g.is_outer(v) {
            return if cx.dequantized.contains(g.name(v)) {
                Source::Dequantized
            } else {
                Source::Activation
            };
        }
        // Overridable initializers (graph inputs with a default, as IR < 4
        // writes every weight) are weights too, left float.
        if g.initializer(v).is_some() {
            return if cast {
                Source::Activation
            } else {
                Source::FloatWeight
            };
        }
        let Some((n, _)) = g.producer(v) else {
            // A body input a Loop feeds a dequantized value.
            return if cx.dequantized.contains(g.name(v)) {
                Source::Dequantized
            } else {
                Source::Activation
            };
        };
        let d = g.node(n);
        match d.op_type.as_str() {
            "DequantizeLinear" => return Source::Dequantized,
            "Constant" if cast => return Source::Activation,
            "Constant" => return Source::FloatWeight,
            "Transpose" | "Reshape" | "Identity" | "Cast" => {
                cast |= d.op_type == "Cast";
                match d.input(0) {
                    Some(i) => v = i,
                    None => return Source::Activation,
                }
            }
            _ => return Source::Activation,
        }
    }
    Source::Activation
}

/// A new value name unique in the whole model.
fn fresh(cx: &mut Ctx, hint: &str) -> String {
    let mut name = hint.to_string();
    let mut i = 1;
    while cx.names.contains(&name) {
        name = format!("{hint}_{i}");
        i += 1;
    }
    cx.names.insert(name.clone());
    name
}

fn add_init(g: &mut Graph, cx: &mut Ctx, hint: &str, t: Tensor) -> Result<ValueId, PassError> {
    let name = fresh(cx, hint);
    let v = g.add_value(name, Some(Type::known(t.dtype, &t.dims)))?;
    g.set_initializer(v, t);
    Ok(v)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    let Some(b) = t.raw() else {
        return Vec::new();
    };
    match t.dtype {
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// Scales in the weight's own float type (DequantizeLinear writes the
/// scale's type; float16 scales need opset 19).
fn scales_tensor(dtype: DType, dims: Vec<i64>, v: &[f32]) -> Result<Tensor, PassError> {
    Ok(match dtype {
        DType::F16 => {
            let raw: Vec<u8> = v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect();
            Tensor::from_raw(DType::F16, dims, Bytes::from(raw))?
        }
        _ => Tensor::from_f32(dims, v)?,
    })
}

/// Packs 4-bit values (low nibble first), as ONNX's raw_data holds them.
pub(crate) fn pack4(v: &[i8]) -> Vec<u8> {
    v.chunks(2)
        .map(|c| (c[0] as u8 & 0xF) | ((c.get(1).copied().unwrap_or(0) as u8 & 0xF) << 4))
        .collect()
}

/// float16's largest finite value and smallest positive normal value.
const F16_MAX: f32 = 65504.0;
const F16_MIN_NORMAL: f32 = 6.103_515_6e-5;

/// A scale as a float16 scale tensor stores it, for a float16 weight: the
/// nearest float16, at least the smallest subnormal (the weight's own
/// values are no finer than that).
fn f16_scale(s: f32) -> f32 {
    half::f16::from_f32(s)
        .to_f32()
        .max(half::f16::from_bits(1).to_f32())
}

/// A block scale in float16 for a float32 weight, or `None` where float16
/// would lose it: above 65504, or below the smallest normal (6.1e-5),
/// where subnormals keep too few bits.
fn f16_scale_fitting(s: f32) -> Option<f32> {
    let h = half::f16::from_f32(s).to_f32();
    (h.is_finite() && (F16_MIN_NORMAL..=F16_MAX).contains(&h)).then_some(h)
}

/// 4-bit blocks of `b` elements along axis `a` of a weight `w` of shape
/// `dims`: the values (uint4 around a zero point, or symmetric int4), and
/// one scale and zero point per block, in the scales' layout (`dims` with
/// `dims[a] / b` on axis `a`). Each scale is rounded by `store` (to how
/// its tensor holds it) before the block is quantized with it, so the
/// rounding of a float16 scale costs no more than that; `None` when
/// `store` refuses a scale.
fn int4_blocks(
    w: &[f32],
    dims: &[i64],
    a: usize,
    b: usize,
    sym: bool,
    store: &dyn Fn(f32) -> Option<f32>,
) -> Option<(Vec<i8>, Vec<f32>, Vec<i8>)> {
    let outer = dims[..a].iter().product::<i64>() as usize;
    let na = dims[a] as usize;
    let inner = dims[a + 1..].iter().product::<i64>() as usize;
    let nb = na / b;
    let ns = outer * nb * inner;
    let mut scales = vec![0f32; ns];
    let mut zps = vec![0i8; ns];
    let mut q = vec![0i8; w.len()];
    for o in 0..outer {
        for blk in 0..nb {
            for i in 0..inner {
                let si = (o * nb + blk) * inner + i;
                let pos = |k: usize| (o * na + blk * b + k) * inner + i;
                if sym {
                    let amax = (0..b).fold(0f32, |m, k| m.max(w[pos(k)].abs()));
                    let s = store(if amax > 0.0 { amax / 7.0 } else { 1.0 })?;
                    scales[si] = s;
                    for k in 0..b {
                        q[pos(k)] = (w[pos(k)] / s).round_ties_even().clamp(-8.0, 7.0) as i8;
                    }
                } else {
                    let lo = (0..b).fold(0f32, |m, k| m.min(w[pos(k)]));
                    let hi = (0..b).fold(0f32, |m, k| m.max(w[pos(k)]));
                    let s = store(if hi > lo { (hi - lo) / 15.0 } else { 1.0 })?;
                    let z = (-lo / s).round_ties_even().clamp(0.0, 15.0);
                    scales[si] = s;
                    zps[si] = z as i8;
                    for k in 0..b {
                        q[pos(k)] = ((w[pos(k)] / s).round_ties_even() + z).clamp(0.0, 15.0) as i8;
                    }
                }
            }
        }
    }
    Some((q, scales, zps))
}

/// `W` ==> `W = DequantizeLinear(W_quantized, W_scale[, W_zero_point])`,
/// and for int4 with float16 scales of a float32 weight
/// `W = DequantizeLinear(W_quantized, Cast(W_scale), W_zero_point)`.
/// Returns the format, for the report.
fn quantize_weight(
    g: &mut Graph,
    v: ValueId,
    dims: &[i64],
    reads: &[Read],
    cx: &mut Ctx,
) -> Result<String, PassError> {
    let t = weight_tensor(g, v)
        .ok_or_else(|| PassError(format!("quantize: '{}' is not a float weight", g.name(v))))?
        .clone();
    let w = f32s(&t);
    if t.dtype == DType::F16 {
        cx.uses_f16 = true;
    }
    let name = g.name(v).to_string();
    let r = dims.len();
    // int4 mode, unless a reader wants int8 weights.
    let int4_mode = cx.q.mode == QuantMode::Int4Weights && !reads.iter().any(|x| x.int8);
    if let Some(gathers) = gather_only(g, v, r) {
        if !int4_mode && cx.q.per_channel {
            return gathered(g, v, &t, &w, dims, &gathers, cx);
        }
    }
    let agree = |f: &dyn Fn(&Read) -> Option<usize>| -> Option<usize> {
        let first = f(&reads[0])?;
        reads.iter().all(|x| f(x) == Some(first)).then_some(first)
    };
    let channel = if cx.q.per_channel {
        agree(&|x| x.channel)
    } else {
        None
    };
    let reduce = agree(&|x| x.reduce);
    // The block: `block_size`, or the largest smaller power of two (down
    // to 16) that divides the reduction axis.
    let mut b = cx.q.block_size;
    if let Some(a) = reduce {
        while b > 16 && dims[a] % b != 0 {
            b /= 2;
        }
    }
    // MatMul/Gemm/Gather weights are 2-D; Conv weights block along their
    // input channels (axis 1 of [O, I/group, k...]).
    let conv = reads.iter().any(|x| x.conv);
    let int4 = int4_mode
        && reduce.is_some_and(|a| dims[a] % b == 0)
        && if conv {
            r >= 3 && reads.iter().all(|x| x.conv)
        } else {
            r == 2
        };
    let mut attrs = Vec::new();
    let (qt, st, zt, fmt);
    // A float32 weight whose int4 scales are float16 (a Cast of the
    // scales goes before the DequantizeLinear).
    let mut cast_scales = false;
    if int4 {
        let a = reduce.expect("int4 needs it");
        let sym = cx.q.symmetric;
        let bu = b as usize;
        let (blocks, scale_dt, note) = if t.dtype == DType::F16 {
            let x = int4_blocks(&w, dims, a, bu, sym, &|s| Some(f16_scale(s)))
                .expect("f16_scale refuses nothing");
            (x, DType::F16, "")
        } else if let Some(x) = cx
            .q
            .int4_f16_scales
            .then(|| int4_blocks(&w, dims, a, bu, sym, &f16_scale_fitting))
            .flatten()
        {
            cast_scales = true;
            (x, DType::F16, "")
        } else if !cx.q.int4_f16_scales {
            let x = int4_blocks(&w, dims, a, bu, sym, &Some).expect("Some refuses nothing");
            (x, DType::F32, "")
        } else {
            cx.report.warnings.push(format!(
                "'{name}': int4 block scales kept float32: a block's scale is outside float16's normal range [6.1e-5, 65504]"
            ));
            let x = int4_blocks(&w, dims, a, bu, sym, &Some).expect("Some refuses nothing");
            (
                x,
                DType::F32,
                " (a block scale is outside float16's range)",
            )
        };
        let (q, scales, zps) = blocks;
        let mut sdims = dims.to_vec();
        sdims[a] = dims[a] / b;
        let qd = if sym { DType::I4 } else { DType::U4 };
        qt = Tensor::from_raw(qd, dims.to_vec(), Bytes::from(pack4(&q)))?;
        st = scales_tensor(scale_dt, sdims.clone(), &scales)?;
        zt = (!sym)
            .then(|| Tensor::from_raw(DType::U4, sdims, Bytes::from(pack4(&zps))))
            .transpose()?;
        attrs.push(Attribute::new("axis", AttrValue::Int(a as i64)));
        attrs.push(Attribute::new("block_size", AttrValue::Int(b)));
        fmt = format!(
            "{} blocked axis {a} block {b}, {} scales{note}",
            if sym { "int4" } else { "uint4+zp" },
            if scale_dt == DType::F16 { "float16" } else { "float32" }
        );
        cx.uses_int4 = true;
        if scale_dt == DType::F16 {
            cx.uses_f16 = true;
        }
    } else {
        let (nc, stride, axis) = match channel {
            Some(c) => {
                let stride: usize = dims[c + 1..].iter().product::<i64>() as usize;
                (dims[c] as usize, stride, Some(c))
            }
            None => (1, w.len().max(1), None),
        };
        let mut amax = vec![0f32; nc];
        for (i, x) in w.iter().enumerate() {
            let c = if axis.is_some() { (i / stride) % nc } else { 0 };
            amax[c] = amax[c].max(x.abs());
        }
        // A float16 weight's scales are float16: rounded first, so that
        // the values are quantized with the scale the node reads.
        let scales: Vec<f32> = amax
            .iter()
            .map(|&m| if m > 0.0 { m / 127.0 } else { 1.0 })
            .map(|s| if t.dtype == DType::F16 { f16_scale(s) } else { s })
            .collect();
        // With quantized activations, weights are uint8 around zero point
        // 128: onnxruntime's x86 u8s8 integer kernels (AVX2, what its QDQ
        // fusion picks for int8 weights) saturate their 16-bit pair sums
        // and gave 4-5x the error on the testdata transformers; u8u8 does
        // not. The values are the same symmetric int8 grid either way.
        let u8w = cx.q.mode.activations();
        let off = if u8w { 128.0 } else { 0.0 };
        let q: Vec<u8> = w
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let c = if axis.is_some() { (i / stride) % nc } else { 0 };
                let v = (x / scales[c]).round_ties_even().clamp(-127.0, 127.0) + off;
                if u8w {
                    v as u8
                } else {
                    v as i8 as u8
                }
            })
            .collect();
        let qd = if u8w { DType::U8 } else { DType::I8 };
        qt = Tensor::from_raw(qd, dims.to_vec(), Bytes::from(q))?;
        st = match axis {
            Some(_) => scales_tensor(t.dtype, vec![nc as i64], &scales)?,
            None => scales_tensor(t.dtype, vec![], &scales[..1])?,
        };
        let zdims = if axis.is_some() { vec![nc as i64] } else { vec![] };
        zt = u8w
            .then(|| Tensor::from_raw(DType::U8, zdims, Bytes::from(vec![128u8; st.numel().unwrap_or(1) as usize])))
            .transpose()?;
        if let Some(a) = axis {
            attrs.push(Attribute::new("axis", AttrValue::Int(a as i64)));
        }
        let kind = if u8w { "uint8 (zero point 128)" } else { "int8" };
        fmt = match axis {
            Some(a) => format!("{kind} per-channel axis {a}"),
            None => format!("{kind} per-tensor"),
        };
    }
    let qv = add_init(g, cx, &format!("{name}_quantized"), qt)?;
    let mut sv = add_init(g, cx, &format!("{name}_scale"), st)?;
    // float16 scales of a float32 weight: a Cast of the scales (1/32 of
    // the elements) to float32, so that the DequantizeLinear writes the
    // float32 weight exactly and onnxruntime, which folds the Cast, still
    // fuses it with the MatMul into MatMulNBits.
    let scale_cast = if cast_scales {
        let s32 = g.add_value(
            fresh(cx, &format!("{name}_scale_f32")),
            Some(Type::tensor(DType::F32, g.ty(sv).and_then(|t| t.shape()).cloned())),
        )?;
        let cast = NewNode::new("Cast")
            .name(fresh(cx, &format!("{name}_scale_cast")))
            .inputs(&[sv])
            .outputs(&[s32])
            .attr(Attribute::new("to", AttrValue::Int(DType::F32.to_onnx() as i64)));
        sv = s32;
        Some(cast)
    } else {
        None
    };
    let mut inputs = vec![qv, sv];
    if let Some(z) = zt {
        inputs.push(add_init(g, cx, &format!("{name}_zero_point"), z)?);
    }
    let mut node = NewNode::new("DequantizeLinear")
        .name(fresh(cx, &format!("{name}_dequantize")))
        .inputs(&inputs)
        .outputs(&[v]);
    node.attributes = attrs;
    let dq = match g.producer(v) {
        Some((c, _)) => {
            // A Constant: the DequantizeLinear takes its place.
            let pos = g.position(c).unwrap_or(0);
            g.remove_node(c);
            g.insert_node(pos, node)?
        }
        None => {
            // Just before the first reader, so that the float copy lives
            // no longer than it must (a planner sees it as an activation).
            g.take_initializer(v);
            let first = g.first_in_order(g.uses(v).iter().map(|u| u.node()));
            match first {
                Some(f) => g.insert_node_before(f, node)?,
                None => g.insert_node(0, node)?,
            }
        }
    };
    if let Some(cast) = scale_cast {
        g.insert_node_before(dq, cast)?;
    }
    Ok(fmt)
}

/// The Gather nodes reading `v` when every read is `Gather(v, ids)` on
/// axis 0 of a 2-D table in this graph (an embedding).
fn gather_only(g: &Graph, v: ValueId, rank: usize) -> Option<Vec<NodeId>> {
    if rank != 2 || g.is_output(v) {
        return None;
    }
    let mut out = Vec::new();
    for u in g.uses(v) {
        let Use::Input { node, slot: 0 } = *u else {
            return None;
        };
        let d = g.node(node);
        let axis = d.attr_int("axis").unwrap_or(0);
        if d.op_type != "Gather" || !d.domain.is_empty() || !(axis == 0 || axis == -2) {
            return None;
        }
        out.push(node);
    }
    (!out.is_empty()).then_some(out)
}

/// An embedding read only by Gathers, in int8 with one scale per row:
/// `y = Gather(W, ids)` ==> `y = Mul(Cast(Gather(W_quantized, ids)),
/// Gather(W_scale, ids))` (`W_scale` is `[rows, 1]`). The same arithmetic
/// as `DequantizeLinear` (`q * scale` in float), but only the gathered rows
/// are ever float: a `DequantizeLinear` in front of the Gather would
/// materialize the whole table (94 MB for BERT-base's) on every run.
fn gathered(
    g: &mut Graph,
    v: ValueId,
    t: &Tensor,
    w: &[f32],
    dims: &[i64],
    gathers: &[NodeId],
    cx: &mut Ctx,
) -> Result<String, PassError> {
    let name = g.name(v).to_string();
    let (rows, cols) = (dims[0] as usize, dims[1] as usize);
    let mut scales = vec![1f32; rows];
    let mut q = vec![0u8; w.len()];
    for (r, s) in scales.iter_mut().enumerate() {
        let row = &w[r * cols..(r + 1) * cols];
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        if amax > 0.0 {
            *s = amax / 127.0;
        }
        for (k, x) in row.iter().enumerate() {
            q[r * cols + k] = (x / *s).round_ties_even().clamp(-127.0, 127.0) as i8 as u8;
        }
    }
    let qv = add_init(
        g,
        cx,
        &format!("{name}_quantized"),
        Tensor::from_raw(DType::I8, dims.to_vec(), Bytes::from(q))?,
    )?;
    let sv = add_init(
        g,
        cx,
        &format!("{name}_scale"),
        scales_tensor(t.dtype, vec![rows as i64, 1], &scales)?,
    )?;
    for &n in gathers {
        let (Some(ids), Some(y)) = (g.node(n).input(1), g.node(n).output(0)) else {
            continue;
        };
        let nm = match g.node(n).name.as_str() {
            "" => g.name(y).to_string(),
            s => s.to_string(),
        };
        let shape = g.ty(y).and_then(|ty| ty.shape()).cloned();
        let qr = g.add_value(
            fresh(cx, &format!("{name}_rows_quantized")),
            Some(Type::tensor(DType::I8, shape.clone())),
        )?;
        let sr = g.add_value(fresh(cx, &format!("{name}_rows_scale")), None)?;
        let qf = g.add_value(
            fresh(cx, &format!("{name}_rows")),
            Some(Type::tensor(t.dtype, shape)),
        )?;
        let node = |op: &str, suffix: &str, cx: &mut Ctx| {
            NewNode::new(op).name(fresh(cx, &format!("{nm}_{suffix}")))
        };
        let n1 = node("Gather", "rows", cx).inputs(&[qv, ids]).outputs(&[qr]);
        let n2 = node("Gather", "row_scales", cx).inputs(&[sv, ids]).outputs(&[sr]);
        let n3 = node("Cast", "cast", cx)
            .inputs(&[qr])
            .outputs(&[qf])
            .attr(Attribute::new("to", AttrValue::Int(t.dtype.to_onnx() as i64)));
        let n4 = node("Mul", "dequantize", cx).inputs(&[qf, sr]).outputs(&[y]);
        g.insert_node_before(n, n1)?;
        g.insert_node_before(n, n2)?;
        g.insert_node_before(n, n3)?;
        let pos = g.position(n).unwrap_or(0);
        g.remove_node(n);
        g.insert_node(pos, n4)?;
        *cx.report.by_op.entry("Gather".into()).or_default() += 1;
        cx.gathered.push(n);
    }
    match g.producer(v) {
        Some((c, _)) => g.remove_node(c),
        None => {
            g.take_initializer(v);
        }
    }
    if g.uses(v).is_empty() {
        g.remove_value(v);
    }
    Ok("int8 per-row, gathered (the float table is never built)".into())
}

/// Activation `x`, read by node `n` ==> its dequantized value (dynamic:
/// `DynamicQuantizeLinear` + `DequantizeLinear`; static: `QuantizeLinear` +
/// `DequantizeLinear` with the calibrated scale), placed before `n`.
fn quantize_activation(
    g: &mut Graph,
    n: NodeId,
    x: ValueId,
    cx: &mut Ctx,
) -> Result<ValueId, PassError> {
    let name = g.name(x).to_string();
    let shape = g.ty(x).and_then(|t| t.shape()).cloned();
    let (q, s, z, first);
    match cx.q.mode {
        QuantMode::Static => {
            let (lo, hi) = cx.q.ranges[&name];
            let (scale, zp, zdt) = activation_params(lo, hi, cx.q.symmetric);
            s = add_init(g, cx, &format!("{name}_scale"), Tensor::scalar_f32(scale))?;
            z = add_init(
                g,
                cx,
                &format!("{name}_zero_point"),
                Tensor::from_raw(zdt, vec![], Bytes::from(vec![zp as u8]))?,
            )?;
            q = g.add_value(fresh(cx, &format!("{name}_quantized")), Some(Type::tensor(zdt, shape.clone())))?;
            first = NewNode::new("QuantizeLinear")
                .name(fresh(cx, &format!("{name}_quantize")))
                .inputs(&[x, s, z])
                .outputs(&[q]);
        }
        _ => {
            q = g.add_value(
                fresh(cx, &format!("{name}_quantized")),
                Some(Type::tensor(DType::U8, shape.clone())),
            )?;
            s = g.add_value(fresh(cx, &format!("{name}_scale")), Some(Type::known(DType::F32, &[])))?;
            z = g.add_value(
                fresh(cx, &format!("{name}_zero_point")),
                Some(Type::known(DType::U8, &[])),
            )?;
            first = NewNode::new("DynamicQuantizeLinear")
                .name(fresh(cx, &format!("{name}_quantize")))
                .inputs(&[x])
                .outputs(&[q, s, z]);
        }
    }
    let out = g.add_value(
        fresh(cx, &format!("{name}_dequantized")),
        Some(Type::tensor(DType::F32, shape)),
    )?;
    let second = NewNode::new("DequantizeLinear")
        .name(fresh(cx, &format!("{name}_dequantize")))
        .inputs(&[q, s, z])
        .outputs(&[out]);
    g.insert_node_before(n, first)?;
    g.insert_node_before(n, second)?;
    Ok(out)
}

/// Scale, zero point and its type for activations in `[lo, hi]`: uint8
/// over `[min(lo, 0), max(hi, 0)]`, or int8 symmetric.
pub fn activation_params(lo: f32, hi: f32, symmetric: bool) -> (f32, i32, DType) {
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let ok = |s: f32| if s.is_finite() && s > 0.0 { s } else { 1.0 };
    if symmetric {
        (ok(lo.abs().max(hi) / 127.0), 0, DType::I8)
    } else {
        let s = ok((hi - lo) / 255.0);
        let z = (-lo / s).round_ties_even().clamp(0.0, 255.0) as i32;
        (s, z, DType::U8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphopt_text::{parse_model, print_model, PrintOptions};

    /// `# quantize: MODE [key=value ...]` on the fixture's first line
    /// (`int8=V`: the node writing value `V` is in `int8_nodes`).
    fn options_from(src: &str, m: &graphopt_ir::Model) -> Quantize {
        let mut q = Quantize {
            min_weight_elems: 16,
            ..Quantize
        };
        let line = src
            .lines()
            .find_map(|l| l.strip_prefix("# quantize:"))
            .expect("fixture names its mode");
        for (i, tok) in line.split_whitespace().enumerate() {
            if i == 0 {
                q.mode = QuantMode::parse(tok).unwrap();
                continue;
            }
            let (k, v) = tok.split_once('=').unwrap_or((tok, ""));
            match k {
                "per_tensor" => q.per_channel = false,
                "symmetric" => q.symmetric = true,
                "block" => q.block_size = v.parse().unwrap(),
                "exclude" => q.exclude.push(v.to_string()),
                "min" => q.min_weight_elems = v.parse().unwrap(),
                "int8" => {
                    let g = &m.graph;
                    let (n, _) = g.producer(g.value_by_name(v).unwrap()).unwrap();
                    q.int8_nodes.push(n);
                }
                "range" => {
                    let (n, r) = v.split_once(':').unwrap();
                    let (lo, hi) = r.split_once(',').unwrap();
                    q.ranges
                        .insert(n.into(), (lo.parse().unwrap(), hi.parse().unwrap()));
                }
                _ => panic!("unknown fixture option {k}"),
            }
        }
        q
    }

    /// `testdata/passes/quantize/modes/*.onnxtxt`: one fixture per mode and
    /// case, the before→after diff snapshotted as the harness does.
    #[test]
    fn mode_fixtures() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/passes/quantize/modes");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "onnxtxt"))
            .collect();
        files.sort();
        assert!(!files.is_empty());
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(dir.join("snapshots"));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        let _guard = settings.bind_to_scope();
        let opts = PrintOptions::default();
        for f in files {
            let src = std::fs::read_to_string(&f).unwrap();
            let mut m = parse_model(&src).unwrap();
            let q = options_from(&src, &m);
            graphopt_ir::verify::verify_model(&m).unwrap();
            let before = print_model(&m, &opts);
            let r = q.quantize(&mut m).unwrap();
            graphopt_ir::verify::verify_model(&m)
                .unwrap_or_else(|e| panic!("{}: after quantize: {e}", f.display()));
            let after = print_model(&m, &opts);
            let diff = similar::TextDiff::from_lines(&before, &after)
                .unified_diff()
                .context_radius(1000)
                .header("before", "after")
                .to_string();
            // Lines only some cases have, so the others' snapshots stay.
            let mut extra = String::new();
            if !r.already_quantized.is_empty() {
                extra += &format!("already quantized: {:?}\n", r.already_quantized);
            }
            if !r.warnings.is_empty() {
                extra += &format!("warnings: {:?}\n", r.warnings);
            }
            let snap = format!(
                "mode: {}\nby op: {:?}\nweights: {:?}\nactivations: {}\nkept float: {:?}\nkept ops: {:?}\n{extra}weight bytes: {} -> {}\n\n{diff}",
                q.mode.name(),
                r.by_op,
                r.weights,
                r.activations,
                r.kept_float,
                r.kept_ops,
                r.weight_bytes_before,
                r.weight_bytes_after
            );
            let case = f.file_stem().unwrap().to_string_lossy().to_string();
            insta::assert_snapshot!(case.as_str(), snap);
        }
    }

    /// Quantizing a fixture's output again, in the same mode, changes
    /// nothing (every weight as small as 1 element included): what the
    /// first run wrote is quantized already, and says so.
    #[test]
    fn quantizing_twice_changes_nothing() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/passes/quantize/modes");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "onnxtxt"))
            .collect();
        files.sort();
        let opts = PrintOptions::default();
        for f in files {
            let src = std::fs::read_to_string(&f).unwrap();
            let mut m = parse_model(&src).unwrap();
            let q = options_from(&src, &m);
            let first = q.quantize(&mut m).unwrap();
            let once = print_model(&m, &opts);
            let again = Quantize {
                min_weight_elems: 1,
                ..q.clone()
            };
            let r = again.quantize(&mut m).unwrap();
            let case = f.file_stem().unwrap().to_string_lossy().to_string();
            assert_eq!(once, print_model(&m, &opts), "{case}: the second run changed the model");
            assert!(
                r.weights.is_empty() && r.activations == 0 && r.by_op.is_empty(),
                "{case}: {:?} {} {:?}",
                r.weights,
                r.activations,
                r.by_op
            );
            let changed = !first.weights.is_empty() || first.activations > 0;
            assert_eq!(
                !r.already_quantized.is_empty(),
                changed,
                "{case}: {:?}",
                r.already_quantized
            );
        }
    }

    #[test]
    fn int4_packing_is_low_nibble_first() {
        assert_eq!(pack4(&[1, 2, 3]), vec![0x21, 0x03]);
        assert_eq!(pack4(&[-1, -8]), vec![0x8F]);
    }

    #[test]
    fn bad_block_size_is_one_line_error() {
        let mut m = parse_model(
            "<ir_version: 8, opset_import: [\"\" : 17]>\ng (float[1,4] x) => (float[1,4] y) {\n  y = Relu (x)\n}\n",
        )
        .unwrap();
        let e = Quantize {
            block_size: 48,
            ..Quantize
        }
        .quantize(&mut m)
        .unwrap_err();
        assert!(e.0.contains("block size 48"), "{e}");
    }
}
