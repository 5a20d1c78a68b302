//! Per-op rewrites of the opset upgrade (see the module doc).

use crate::pattern::TypedGraph;
use crate::{PassError, PassStats};
use bytes::Bytes;
use graphopt_ir::{
    AttrValue, Attribute, DType, Graph, NewNode, NodeId, Tensor, Type, ValueId,
};

/// Ops whose versions from 7 to 22 only add types, or attributes and inputs
/// whose defaults keep the old meaning: nothing to rewrite.
const COMPATIBLE: &[&str] = &[
    "Abs", "Acos", "Acosh", "Add", "AffineGrid", "And", "ArgMax", "ArgMin", "Asin", "Asinh",
    "Atan", "Atanh", "AveragePool", "Bernoulli", "BitShift", "BitwiseAnd", "BitwiseNot",
    "BitwiseOr", "BitwiseXor", "BlackmanWindow", "Cast", "CastLike", "Ceil", "Celu",
    "CenterCropPad", "Col2Im", "Compress", "Concat", "ConcatFromSequence", "Constant",
    "ConstantOfShape", "Conv", "ConvInteger", "ConvTranspose", "Cos", "Cosh", "CumSum",
    "DeformConv", "DepthToSpace", "DequantizeLinear", "Det", "Div", "DynamicQuantizeLinear",
    "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike", "Flatten", "Floor", "GRU",
    "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool",
    "GlobalMaxPool", "Greater", "GreaterOrEqual", "HammingWindow", "HannWindow", "HardSigmoid",
    "HardSwish", "Identity", "If", "ImageDecoder", "InstanceNormalization", "IsInf", "IsNaN",
    "LRN", "LSTM", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "Loop",
    "LpNormalization", "LpPool", "MatMul", "MatMulInteger", "Max", "MaxPool", "MaxRoiPool",
    "MaxUnpool", "Mean", "MeanVarianceNormalization", "MelWeightMatrix", "Min", "Mish", "Mod",
    "Mul", "Multinomial", "Neg", "NegativeLogLikelihoodLoss", "NonMaxSuppression", "NonZero",
    "Not", "OneHot", "Optional", "OptionalGetElement", "OptionalHasElement", "Or", "PRelu",
    "Pow", "QLinearConv", "QLinearMatMul", "QuantizeLinear", "RNN", "RandomNormal",
    "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Range", "Reciprocal",
    "RegexFullMatch", "Relu", "Reshape", "ReverseSequence", "Round", "STFT", "ScatterElements",
    "ScatterND", "Selu", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
    "SequenceInsert", "SequenceLength", "SequenceMap", "Shape", "Shrink", "Sigmoid", "Sign",
    "Sin", "Sinh", "Size", "SoftmaxCrossEntropyLoss", "Softplus", "Softsign", "SpaceToDepth",
    "SplitToSequence", "Sqrt", "StringConcat", "StringNormalizer", "StringSplit", "Sub", "Sum",
    "Tan", "Tanh", "TfIdfVectorizer", "ThresholdedRelu", "Tile", "Transpose", "Trilu", "Unique",
    "Where", "Xor",
];

/// Ops with a rewrite below (or a refusal under some version pairs).
const HANDLED: &[&str] = &[
    "BatchNormalization", "Clip", "DFT", "Dropout", "GridSample", "GroupNormalization",
    "Hardmax", "LogSoftmax", "Pad", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    "Resize", "RoiAlign", "Scan", "Scatter", "Slice", "Softmax", "Split", "Squeeze", "TopK",
    "Unsqueeze", "Upsample",
];

/// Reductions whose `axes` became an input at opset 18 (ReduceSum: 13).
const REDUCE_18: &[&str] = &[
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSumSquare",
];

/// The state of one graph's upgrade.
pub(super) struct Cx<'a, 'b> {
    pub from: i64,
    pub to: i64,
    /// In a function body: constants become Constant nodes.
    pub in_function: bool,
    pub t: TypedGraph<'a>,
    pub stats: &'b mut PassStats,
}

impl Cx<'_, '_> {
    /// True when the upgrade crosses version `v` (the op's signature at `v`
    /// differs from the one before).
    fn crosses(&self, v: i64) -> bool {
        self.from < v && self.to >= v
    }
}

type R<T> = Result<T, String>;

/// Upgrades every default-domain node of `g` (its subgraphs are done by the
/// caller).
pub(super) fn upgrade_graph(g: &mut Graph, cx: &mut Cx) -> Result<(), PassError> {
    for n in g.nodes().collect::<Vec<_>>() {
        let d = g.node(n);
        if !(d.domain.is_empty() || d.domain == "ai.onnx") {
            continue;
        }
        let what = if d.name.is_empty() {
            match d.output(0) {
                Some(o) => format!("node computing '{}'", g.name(o)),
                None => "unnamed node".to_string(),
            }
        } else {
            format!("node '{}'", d.name)
        };
        let op = d.op_type.clone();
        upgrade_node(g, cx, n).map_err(|e| {
            PassError(format!(
                "cannot upgrade {what} ({op}) from opset {} to {}: {e}",
                cx.from, cx.to
            ))
        })?;
    }
    Ok(())
}

fn upgrade_node(g: &mut Graph, cx: &mut Cx, n: NodeId) -> R<()> {
    let op = g.node(n).op_type.clone();
    let op = op.as_str();
    let changed = match op {
        "Softmax" | "LogSoftmax" | "Hardmax" if cx.crosses(13) => softmax(g, cx, n)?,
        "ReduceSum" | "Squeeze" | "Unsqueeze" if cx.crosses(13) => axes_to_input(g, cx, n)?,
        _ if REDUCE_18.contains(&op) && cx.crosses(18) => axes_to_input(g, cx, n)?,
        "Split" => split(g, cx, n)?,
        "Slice" if cx.crosses(10) => slice(g, cx, n)?,
        "TopK" if cx.crosses(10) => topk(g, cx, n)?,
        "Pad" if cx.crosses(11) => pad(g, cx, n)?,
        "Clip" if cx.crosses(11) => clip(g, cx, n)?,
        "Dropout" => dropout(g, cx, n)?,
        "BatchNormalization" => batch_norm(g, cx, n)?,
        "Upsample" if cx.to >= 10 => upsample(g, cx, n)?,
        "Resize" if cx.crosses(11) => resize_10(g, cx, n)?,
        "Scatter" if cx.to >= 11 => {
            edit(g, n, |new| new.op_type = "ScatterElements".into())?;
            true
        }
        "RoiAlign" if cx.crosses(16) => {
            // RoiAlign-10 behaved as the later "output_half_pixel" mode.
            let has = g.node(n).attr("coordinate_transformation_mode").is_some();
            if !has {
                edit(g, n, |new| {
                    set_attr(new, "coordinate_transformation_mode", str_attr("output_half_pixel"))
                })?;
            }
            !has
        }
        "GridSample" if cx.crosses(20) => {
            let mode = str_value(g, n, "mode")?.unwrap_or_else(|| "bilinear".into());
            let new_mode = match mode.as_str() {
                "bilinear" => "linear",
                "bicubic" => "cubic",
                "nearest" => "nearest",
                m => return Err(format!("unknown mode '{m}'")),
            };
            edit(g, n, |new| set_attr(new, "mode", str_attr(new_mode)))?;
            true
        }
        "GroupNormalization" if cx.crosses(21) => {
            return Err("GroupNormalization-21 changed the meaning of scale and bias".into())
        }
        "DFT" if cx.crosses(20) => dft_axis(g, cx, n)?,
        "Scan" if cx.from < 9 => return Err("Scan-8 has a batch axis that Scan-9 dropped".into()),
        _ if COMPATIBLE.contains(&op) || HANDLED.contains(&op) => false,
        _ => return Err("no known upgrade for this op".into()),
    };
    if changed {
        cx.stats.add("nodes_rewritten", 1);
    }
    Ok(())
}

// ---- helpers ------------------------------------------------------------


/// Replaces node `n` by a copy edited by `f`, at the same place.
fn edit(g: &mut Graph, n: NodeId, f: impl FnOnce(&mut NewNode)) -> R<NodeId> {
    let d = g.node(n);
    let mut new = NewNode {
        name: d.name.clone(),
        op_type: d.op_type.clone(),
        domain: d.domain.clone(),
        overload: d.overload.clone(),
        inputs: d.inputs().to_vec(),
        outputs: d.outputs().to_vec(),
        attributes: d.attributes.clone(),
        doc_string: d.doc_string.clone(),
        metadata_props: d.metadata_props.clone(),
        preserved: d.preserved.clone(),
    };
    f(&mut new);
    while new.inputs.last() == Some(&None) {
        new.inputs.pop();
    }
    while new.outputs.last() == Some(&None) {
        new.outputs.pop();
    }
    let prev = g.prev_node(n);
    g.remove_node(n);
    match prev {
        Some(p) => g.insert_node_after(p, new),
        None => g.insert_node(0, new),
    }
    .map_err(|e| e.0)
}

fn set_attr(new: &mut NewNode, name: &str, v: AttrValue) {
    new.attributes.retain(|a| a.name != name);
    new.attributes.push(Attribute::new(name, v));
}

fn drop_attr(new: &mut NewNode, name: &str) {
    new.attributes.retain(|a| a.name != name);
}

fn set_slot(new: &mut NewNode, slot: usize, v: Option<ValueId>) {
    if new.inputs.len() <= slot {
        new.inputs.resize(slot + 1, None);
    }
    new.inputs[slot] = v;
}

fn str_attr(s: &str) -> AttrValue {
    AttrValue::String(s.as_bytes().to_vec())
}

/// Checks that attribute `name` holds a concrete value (not a reference to
/// a function attribute, which cannot be turned into an input).
fn attr_value(g: &Graph, n: NodeId, name: &str) -> R<Option<AttrValue>> {
    match g.node(n).attr(name) {
        None => Ok(None),
        Some(a) => match &a.value {
            AttrValue::Ref { attr, .. } => Err(format!(
                "attribute '{name}' refers to function attribute '{attr}'"
            )),
            v => Ok(Some(v.clone())),
        },
    }
}

fn ints_value(g: &Graph, n: NodeId, name: &str) -> R<Option<Vec<i64>>> {
    match attr_value(g, n, name)? {
        None => Ok(None),
        Some(AttrValue::Ints(v)) => Ok(Some(v)),
        Some(AttrValue::Int(v)) => Ok(Some(vec![v])),
        Some(_) => Err(format!("attribute '{name}' is not a list of ints")),
    }
}

fn float_value(g: &Graph, n: NodeId, name: &str) -> R<Option<f32>> {
    match attr_value(g, n, name)? {
        None => Ok(None),
        Some(AttrValue::Float(v)) => Ok(Some(v)),
        Some(_) => Err(format!("attribute '{name}' is not a float")),
    }
}

fn str_value(g: &Graph, n: NodeId, name: &str) -> R<Option<String>> {
    match attr_value(g, n, name)? {
        None => Ok(None),
        Some(AttrValue::String(v)) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
        Some(_) => Err(format!("attribute '{name}' is not a string")),
    }
}

/// A name hint for a constant feeding node `n`.
fn hint(g: &Graph, n: NodeId, what: &str) -> String {
    let d = g.node(n);
    let base = match d.output(0) {
        Some(o) => g.name(o).to_string(),
        None => d.name.clone(),
    };
    format!("{base}_{what}")
}

/// A new constant read by node `n`: an initializer, or in a function body
/// (which has none) a Constant node placed before `n`.
fn konst(g: &mut Graph, cx: &Cx, n: NodeId, what: &str, t: Tensor) -> R<ValueId> {
    let name = hint(g, n, what);
    if !cx.in_function {
        return Ok(g.add_initializer(&name, t));
    }
    let v = g.fresh_value(&name, Some(Type::known(t.dtype, &t.dims)));
    g.insert_node_before(
        n,
        NewNode::new("Constant")
            .outputs(&[v])
            .attr(Attribute::new("value", AttrValue::Tensor(t))),
    )
    .map_err(|e| e.0)?;
    Ok(v)
}

fn ints_tensor(v: &[i64]) -> Tensor {
    Tensor::from_i64(vec![v.len() as i64], v).expect("1-D int64 is well formed")
}

/// A scalar of float type `dtype`.
fn float_scalar(dtype: DType, v: f32) -> R<Tensor> {
    let raw: Vec<u8> = match dtype {
        DType::F32 => v.to_le_bytes().to_vec(),
        DType::F64 => (v as f64).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
        d => return Err(format!("a {d} operand cannot take a float attribute value")),
    };
    Tensor::from_raw(dtype, vec![], Bytes::from(raw)).map_err(|e| e.0)
}

/// The element type of input `slot` of `n`, from inference or declarations.
fn input_elem(g: &Graph, cx: &Cx, n: NodeId, slot: usize) -> R<DType> {
    let x = g
        .node(n)
        .input(slot)
        .ok_or_else(|| format!("input {slot} is missing"))?;
    cx.t.elem(x)
        .or_else(|| cx.t.elem_of(g, x))
        .ok_or_else(|| format!("the element type of '{}' is unknown", g.name(x)))
}

/// Extra outputs that must go: refuses if one is read.
fn drop_outputs_from(g: &Graph, n: NodeId, first: usize, why: &str) -> R<Vec<ValueId>> {
    let outs: Vec<ValueId> = g.node(n).outputs().iter().skip(first).flatten().copied().collect();
    for &o in &outs {
        if g.is_output(o) || !g.uses(o).is_empty() {
            return Err(format!("output '{}' is read, but {why}", g.name(o)));
        }
    }
    Ok(outs)
}

/// Drops outputs from `keep` on (already checked unused); the node's new id.
fn truncate_outputs(g: &mut Graph, n: NodeId, keep: usize, dropped: Vec<ValueId>) -> R<NodeId> {
    if dropped.is_empty() {
        return Ok(n);
    }
    let n = edit(g, n, |new| new.outputs.truncate(keep))?;
    for v in dropped {
        g.remove_value(v);
    }
    Ok(n)
}

// ---- rewrites -----------------------------------------------------------

/// Softmax-13 works along `axis`; before, it flattened to 2-D at `axis`.
/// The same when `axis` is the last one; otherwise
/// `Softmax(x, axis)` ==> `Reshape(Softmax(Flatten(x, axis), -1), Shape(x))`.
fn softmax(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let axis = ints_value(g, n, "axis")?.map_or(1, |v| v[0]);
    let x = g.node(n).input(0).ok_or("input 0 is missing")?;
    let rank = cx
        .t
        .rank(x)
        .or_else(|| g.ty(x).and_then(|t| t.shape()).map(|s| s.rank()))
        .map(|r| r as i64);
    let last = axis == -1 || rank.is_some_and(|r| axis == r - 1 || axis + r == r - 1);
    if last {
        if g.node(n).attr("axis").is_none() {
            edit(g, n, |new| set_attr(new, "axis", AttrValue::Int(axis)))?;
            return Ok(true);
        }
        return Ok(false);
    }
    let y = g.node(n).output(0).ok_or("output 0 is missing")?;
    let base = g.name(y).to_string();
    let shape = g.fresh_value(&format!("{base}_shape"), None);
    let flat = g.fresh_value(&format!("{base}_2d"), None);
    let flat_out = g.fresh_value(&format!("{base}_2d_out"), None);
    g.insert_node_before(n, NewNode::new("Shape").inputs(&[x]).outputs(&[shape]))
        .map_err(|e| e.0)?;
    g.insert_node_before(
        n,
        NewNode::new("Flatten")
            .inputs(&[x])
            .outputs(&[flat])
            .attr(Attribute::new("axis", AttrValue::Int(axis))),
    )
    .map_err(|e| e.0)?;
    let sm = edit(g, n, |new| {
        set_slot(new, 0, Some(flat));
        new.outputs[0] = Some(flat_out);
        set_attr(new, "axis", AttrValue::Int(-1));
    })?;
    g.insert_node_after(
        sm,
        NewNode::new("Reshape").inputs(&[flat_out, shape]).outputs(&[y]),
    )
    .map_err(|e| e.0)?;
    Ok(true)
}

/// `axes` attribute ==> constant input 1 (Squeeze/Unsqueeze/ReduceSum at 13,
/// the other reductions at 18). No `axes` means all axes, before and after.
fn axes_to_input(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let Some(axes) = ints_value(g, n, "axes")? else {
        return Ok(false);
    };
    if g.node(n).input(1).is_some() {
        return Err("has both an axes attribute and a second input".into());
    }
    let is_unsqueeze = g.node(n).op_type == "Unsqueeze";
    let c = if axes.is_empty() && !is_unsqueeze {
        None
    } else {
        Some(konst(g, cx, n, "axes", ints_tensor(&axes))?)
    };
    edit(g, n, |new| {
        drop_attr(new, "axes");
        set_slot(new, 1, c);
    })?;
    Ok(true)
}

/// DFT-17 `axis` attribute (default 1) ==> input 2 at 20 (whose default
/// is -2): always written out.
fn dft_axis(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let axis = match attr_value(g, n, "axis")? {
        None => 1,
        Some(AttrValue::Int(v)) => v,
        Some(_) => return Err("attribute 'axis' is not an int".into()),
    };
    let c = konst(g, cx, n, "axis", Tensor::scalar_i64(axis))?;
    edit(g, n, |new| {
        drop_attr(new, "axis");
        set_slot(new, 2, Some(c));
    })?;
    Ok(true)
}

/// Split: `split` attribute ==> input at 13; at 18 an equal split needs
/// `num_outputs` (the same split when the axis divides evenly, which
/// Split-13 required).
fn split(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let mut changed = false;
    let mut n = n;
    if cx.crosses(13) {
        if let Some(sizes) = ints_value(g, n, "split")? {
            let c = konst(g, cx, n, "split", ints_tensor(&sizes))?;
            n = edit(g, n, |new| {
                drop_attr(new, "split");
                set_slot(new, 1, Some(c));
            })?;
            changed = true;
        }
    }
    if cx.crosses(18) && g.node(n).input(1).is_none() && g.node(n).attr("num_outputs").is_none()
    {
        let k = g.node(n).outputs().len() as i64;
        edit(g, n, |new| set_attr(new, "num_outputs", AttrValue::Int(k)))?;
        changed = true;
    }
    Ok(changed)
}

/// Slice-1 attributes `starts`, `ends`, `axes` ==> inputs 1, 2, 3.
fn slice(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let starts = ints_value(g, n, "starts")?.ok_or("attribute 'starts' is missing")?;
    let ends = ints_value(g, n, "ends")?.ok_or("attribute 'ends' is missing")?;
    let axes = ints_value(g, n, "axes")?;
    let s = konst(g, cx, n, "starts", ints_tensor(&starts))?;
    let e = konst(g, cx, n, "ends", ints_tensor(&ends))?;
    let a = match axes {
        Some(a) => Some(konst(g, cx, n, "axes", ints_tensor(&a))?),
        None => None,
    };
    edit(g, n, |new| {
        for k in ["starts", "ends", "axes"] {
            drop_attr(new, k);
        }
        set_slot(new, 1, Some(s));
        set_slot(new, 2, Some(e));
        set_slot(new, 3, a);
    })?;
    Ok(true)
}

/// TopK-1 attribute `k` ==> input 1, an int64 `[1]`.
fn topk(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let k = ints_value(g, n, "k")?.ok_or("attribute 'k' is missing")?;
    let c = konst(g, cx, n, "k", ints_tensor(&k))?;
    edit(g, n, |new| {
        drop_attr(new, "k");
        set_slot(new, 1, Some(c));
    })?;
    Ok(true)
}

/// Pad-2 attributes `pads`, `value` ==> inputs 1, 2 (`value` 0 is the
/// default and needs no input).
fn pad(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let pads = ints_value(g, n, "pads")?.ok_or("attribute 'pads' is missing")?;
    let value = float_value(g, n, "value")?.unwrap_or(0.0);
    let p = konst(g, cx, n, "pads", ints_tensor(&pads))?;
    let v = if value != 0.0 {
        let dt = input_elem(g, cx, n, 0)?;
        Some(konst(g, cx, n, "value", float_scalar(dt, value)?)?)
    } else {
        None
    };
    edit(g, n, |new| {
        drop_attr(new, "pads");
        drop_attr(new, "value");
        set_slot(new, 1, Some(p));
        set_slot(new, 2, v);
    })?;
    Ok(true)
}

/// Clip-6 attributes `min`, `max` ==> inputs 1, 2 of the input's type.
fn clip(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let lo = float_value(g, n, "min")?;
    let hi = float_value(g, n, "max")?;
    if lo.is_none() && hi.is_none() {
        return Ok(false);
    }
    let dt = input_elem(g, cx, n, 0)?;
    let lo = match lo {
        Some(v) => Some(konst(g, cx, n, "min", float_scalar(dt, v)?)?),
        None => None,
    };
    let hi = match hi {
        Some(v) => Some(konst(g, cx, n, "max", float_scalar(dt, v)?)?),
        None => None,
    };
    edit(g, n, |new| {
        drop_attr(new, "min");
        drop_attr(new, "max");
        set_slot(new, 1, lo);
        set_slot(new, 2, hi);
    })?;
    Ok(true)
}

/// Dropout: the mask's type changed at 10 (so it must be unused and goes);
/// `ratio` became input 1 at 12.
fn dropout(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let mut changed = false;
    let mut n = n;
    if cx.crosses(10) {
        let dropped = drop_outputs_from(g, n, 1, "Dropout's mask changes type at opset 10")?;
        if !dropped.is_empty() {
            n = truncate_outputs(g, n, 1, dropped)?;
            changed = true;
        }
    }
    if cx.crosses(12) {
        if let Some(r) = float_value(g, n, "ratio")? {
            let c = konst(g, cx, n, "ratio", Tensor::scalar_f32(r))?;
            edit(g, n, |new| {
                drop_attr(new, "ratio");
                set_slot(new, 1, Some(c));
            })?;
            changed = true;
        }
    }
    Ok(changed)
}

/// BatchNormalization: `spatial` went at 9 (only 1, the default, has an
/// equivalent); the training-only outputs went at 14.
fn batch_norm(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let mut changed = false;
    let mut n = n;
    if cx.crosses(9) {
        if let Some(s) = ints_value(g, n, "spatial")? {
            if s != [1] {
                return Err("spatial=0 has no equivalent from opset 9".into());
            }
            n = edit(g, n, |new| drop_attr(new, "spatial"))?;
            changed = true;
        }
    }
    if cx.crosses(14) {
        let dropped = drop_outputs_from(g, n, 1, "the training outputs changed at opset 14")?;
        if !dropped.is_empty() {
            truncate_outputs(g, n, 1, dropped)?;
            changed = true;
        }
    }
    Ok(changed)
}

/// Upsample ==> Resize. At 10 the signature is the same; from 11 Resize
/// needs the old coordinate mapping spelled out (`asymmetric`, nearest
/// rounding down) and a roi slot.
fn upsample(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let mode = str_value(g, n, "mode")?.unwrap_or_else(|| "nearest".into());
    let mode = match mode.as_str() {
        "nearest" => "nearest",
        "linear" | "bilinear" => "linear",
        m => return Err(format!("unknown mode '{m}'")),
    };
    let scales = match attr_value(g, n, "scales")? {
        Some(AttrValue::Floats(s)) => {
            let t = Tensor::from_f32(vec![s.len() as i64], &s).map_err(|e| e.0)?;
            konst(g, cx, n, "scales", t)?
        }
        Some(_) => return Err("attribute 'scales' is not a list of floats".into()),
        None => g.node(n).input(1).ok_or("has no scales")?,
    };
    let roi = roi_slot(g, cx, n)?;
    let to = cx.to;
    edit(g, n, |new| {
        new.op_type = "Resize".into();
        drop_attr(new, "scales");
        set_attr(new, "mode", str_attr(mode));
        new.inputs.truncate(1);
        if to == 10 {
            set_slot(new, 1, Some(scales));
        } else {
            set_slot(new, 1, roi);
            set_slot(new, 2, Some(scales));
            old_resize_attrs(new, mode);
        }
    })?;
    Ok(true)
}

/// Resize-10 (`X, scales`, asymmetric) ==> Resize-11+ (`X, roi, scales`).
fn resize_10(g: &mut Graph, cx: &Cx, n: NodeId) -> R<bool> {
    let mode = str_value(g, n, "mode")?.unwrap_or_else(|| "nearest".into());
    let scales = g.node(n).input(1).ok_or("has no scales")?;
    let roi = roi_slot(g, cx, n)?;
    edit(g, n, |new| {
        new.inputs.truncate(1);
        set_slot(new, 1, roi);
        set_slot(new, 2, Some(scales));
        old_resize_attrs(new, &mode);
    })?;
    Ok(true)
}

/// Resize-11 and 12 require the roi input (an empty one will do); from 13
/// it is optional.
fn roi_slot(g: &mut Graph, cx: &Cx, n: NodeId) -> R<Option<ValueId>> {
    if cx.to >= 13 {
        return Ok(None);
    }
    let t = Tensor::from_f32(vec![0], &[]).map_err(|e| e.0)?;
    Ok(Some(konst(g, cx, n, "roi", t)?))
}

fn old_resize_attrs(new: &mut NewNode, mode: &str) {
    set_attr(new, "coordinate_transformation_mode", str_attr("asymmetric"));
    if mode == "nearest" {
        set_attr(new, "nearest_mode", str_attr("floor"));
    }
}
