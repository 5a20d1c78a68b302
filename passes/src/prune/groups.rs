//! The dependency-group finder of `prune`.
//!
//! A *group* is a set of tensor axes that share one index space of
//! prunable *units*: removing unit `u` removes the same positions from
//! every member. A member is a place (a value and one of its axes) and a
//! span: unit `u` covers positions `offset + u·block .. offset + (u+1)·block`
//! on that axis. `block` is 1 for channels and hidden units, the head size
//! for attention heads; `offset` places a group inside a Concat's output.
//!
//! A walk starts at the output channels of a Conv, ConvTranspose, Gemm or
//! MatMul with a constant weight and follows the axis both ways through
//! the graph until every path ends where the channels are consumed (the
//! input channels of the next Conv, the rows of the next MatMul weight):
//! ```text
//! a = Conv(x, w1)            group: a[1], w1[0], bn.*[0], b[1], s[1],
//! b = BatchNormalization(a)         w2[0], y[1], w3[1]
//! s = Add(b, y)              (the residual Add couples w2's channels in)
//! t = Relu(s)
//! z = Conv(t, w3)
//! ```
//! Every op the walk passes has a rule (the table in [`Walk::forward`] and
//! [`Walk::backward`]). An op without one, a graph input or output, a
//! shape computed at run time, or a weight also read elsewhere ends the
//! walk: the whole group is left alone and the reason reported. Nothing is
//! guessed.
//!
//! Attention heads are found, not configured: a Reshape that splits the
//! pruned axis into `[heads, head_dim]` cannot move single channels, so the
//! walk restarts with units of `head_dim` channels. Query, key and value
//! projections meet through the attention MatMuls (their head axes are
//! batch axes there), and the output projection consumes the merged heads:
//! one group, whole heads.

use graphopt_ir::{Graph, NodeId, Use, ValueId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One axis of one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    pub value: ValueId,
    pub axis: usize,
}

/// Where a group's units lie on a member's axis: unit `u` covers
/// `offset + r·stride + u·block .. + block` for each `r < repeat` (a
/// repeat of 1 but for a fused projection split into equal parts, such as
/// GPT-2's query, key and value: unit `u` is then head `u` of each part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub offset: usize,
    pub block: usize,
    pub repeat: usize,
    pub stride: usize,
}

impl Span {
    pub fn new(offset: usize, block: usize) -> Span {
        Span {
            offset,
            block,
            repeat: 1,
            stride: 0,
        }
    }

    /// The positions of unit `u`.
    pub fn positions(&self, u: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.repeat).flat_map(move |r| {
            let a = self.offset + r * self.stride + u * self.block;
            a..a + self.block
        })
    }

    /// One past the last position of `units` units.
    fn end(&self, units: usize) -> usize {
        self.offset + (self.repeat - 1) * self.stride + units * self.block
    }
}

/// A group that can be pruned.
#[derive(Clone, Debug)]
pub struct Group {
    /// The node the walk started at (its output channels are the units).
    pub source: NodeId,
    pub units: usize,
    /// Channels per unit at the source (1, or the head size).
    pub block: usize,
    /// Every member, activations and weights.
    pub members: BTreeMap<Place, Span>,
    /// The members that are constant weights.
    pub weights: BTreeSet<Place>,
    /// Depthwise Convs whose `group` follows the channel count.
    pub depthwise: BTreeSet<NodeId>,
    /// Sizes in Reshape shapes that name a member's size.
    pub literals: Vec<Literal>,
    /// Splits along a member axis (that axis): their sizes follow.
    pub splits: BTreeMap<NodeId, usize>,
    /// Identity Gathers along a member axis (their output's axis): their
    /// indices are renumbered.
    pub gathers: BTreeMap<NodeId, usize>,
}

impl Group {
    /// Heads (units of several channels) or channels.
    pub fn kind(&self) -> &'static str {
        if self.block > 1 {
            "heads"
        } else {
            "channels"
        }
    }
}

/// Where a Reshape's target size for one output axis is written: element
/// `index` of the constant `value`, read by `reader` at input `slot` (the
/// Reshape itself, or the Concat or Unsqueeze that builds its shape at
/// run time from constant pieces and other dims).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Literal {
    pub reshape: NodeId,
    /// The Reshape's output axis.
    pub axis: usize,
    pub reader: NodeId,
    pub slot: usize,
    pub value: ValueId,
    pub index: usize,
}

/// The constant element that gives element `i` of `v` (read by `reader`
/// at `slot`): `v` itself when constant, else through the Concat of 1-D
/// pieces, or the Unsqueeze of a scalar, that built it (`depth` bounds the
/// search).
fn literal(
    g: &Graph,
    shapes: &Graph,
    reader: NodeId,
    slot: usize,
    v: ValueId,
    i: usize,
    depth: usize,
) -> Option<Literal> {
    if g.initializer(v).is_some() {
        return Some(Literal {
            reshape: reader,
            axis: 0,
            reader,
            slot,
            value: v,
            index: i,
        });
    }
    if depth > 4 || g.uses(v).len() != 1 {
        return None;
    }
    let (n, _) = g.producer(v)?;
    let d = g.node(n);
    match d.op_type.as_str() {
        "Concat" => {
            let mut start = 0;
            for (k, x) in d.inputs().iter().enumerate() {
                let x = (*x)?;
                let l = *dims(shapes, x)?.first()?;
                if i < start + l {
                    return literal(g, shapes, n, k, x, i - start, depth + 1);
                }
                start += l;
            }
            None
        }
        "Unsqueeze" | "Cast" | "Identity" if i == 0 => {
            literal(g, shapes, n, 0, d.input(0)?, 0, depth + 1)
        }
        _ => None,
    }
}

/// The tensor and axis whose size element `i` of `v` is read from at run
/// time (`Shape`, then Gather, Slice, Squeeze, Unsqueeze and Concat of its
/// pieces), if it is one: `x.view(-1, x.size(-1))`.
fn dim_source(
    g: &Graph,
    shapes: &Graph,
    v: ValueId,
    i: usize,
    depth: usize,
) -> Option<(ValueId, usize)> {
    if depth > 6 {
        return None;
    }
    let (n, _) = g.producer(v)?;
    let d = g.node(n);
    let c = |k: usize| {
        d.input(k)
            .and_then(|v| g.initializer(v))
            .and_then(|t| t.to_i64_vec())
    };
    match d.op_type.as_str() {
        "Shape" => {
            let x = d.input(0)?;
            let (start, end) = shape_range(d, dims(shapes, x)?.len());
            (start + i < end).then_some((x, start + i))
        }
        "Concat" => {
            let mut start = 0;
            for x in d.inputs() {
                let x = (*x)?;
                let l = *dims(shapes, x)?.first()?;
                if i < start + l {
                    return dim_source(g, shapes, x, i - start, depth + 1);
                }
                start += l;
            }
            None
        }
        "Unsqueeze" | "Squeeze" | "Cast" | "Identity" if i == 0 => {
            dim_source(g, shapes, d.input(0)?, 0, depth + 1)
        }
        "Gather" => {
            let idx = c(1)?;
            let rank = dims(shapes, d.input(0)?)?.first().copied()? as i64;
            let j = *idx.get(i)?;
            let j = if j < 0 { j + rank } else { j };
            dim_source(g, shapes, d.input(0)?, usize::try_from(j).ok()?, depth + 1)
        }
        "Slice" => {
            let (st, steps) = (c(1)?, c(4).unwrap_or_else(|| vec![1]));
            if st.len() != 1 || steps != [1] {
                return None;
            }
            let rank = dims(shapes, d.input(0)?)?.first().copied()? as i64;
            let st = if st[0] < 0 {
                (st[0] + rank).max(0)
            } else {
                st[0].min(rank)
            };
            dim_source(g, shapes, d.input(0)?, st as usize + i, depth + 1)
        }
        _ => None,
    }
}

/// The dims `[start, end)` a `Shape` node reads of a rank-`rank` tensor.
fn shape_range(d: &graphopt_ir::NodeData, rank: usize) -> (usize, usize) {
    let r = rank as i64;
    let norm = |x: i64| (if x < 0 { x + r } else { x }).clamp(0, r) as usize;
    let start = norm(d.attr_int("start").unwrap_or(0));
    let end = norm(d.attr_int("end").unwrap_or(r));
    (start, end.max(start))
}

/// A walk that ended without a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftAlone {
    pub source: NodeId,
    pub reason: String,
}

/// What [`find`] found.
#[derive(Clone, Debug, Default)]
pub struct Groups {
    pub groups: Vec<Group>,
    pub left_alone: Vec<LeftAlone>,
}

enum Fail {
    Unsafe(String),
    /// Units must span this many channels (a Reshape splits heads); or,
    /// the alternative, repeat in this many parts (the Reshape splits a
    /// fused projection).
    NeedBlock(usize, Option<usize>),
    /// Units must repeat in this many equal parts (a Split cuts them).
    NeedRepeat(usize),
}

type Step = Result<(), Fail>;

fn unsafe_<T>(msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail::Unsafe(msg.into()))
}

/// Finds the groups of `g`. `shapes` is `g` with inferred static shapes
/// (the same value and node ids), for the sizes Flatten and Reshape need.
pub fn find(model: &graphopt_ir::Model, shapes: &Graph) -> Groups {
    let g = &model.graph;
    let cfg = Cfg {
        opset: model.onnx_opset().unwrap_or(17),
        // Before IR 4 every initializer is also a graph input, by rule:
        // those are weights. From IR 4 an initializer listed as an input
        // is an overridable default, and keeps its shape.
        inputs_are_weights: model.ir_version < 4,
    };
    let mut out = Groups::default();
    // Places some walk already covered (found or left alone).
    let mut seen: BTreeSet<Place> = BTreeSet::new();
    for n in g.nodes() {
        let Some((place, len)) = source(g, shapes, n) else {
            continue;
        };
        if seen.contains(&place) || len < 2 {
            continue;
        }
        let mut span = Span::new(0, 1);
        // Spans to try if the current one fails, and the first failure.
        let mut fallback: Vec<Span> = Vec::new();
        let mut first_failure: Option<String> = None;
        loop {
            let units = if span.repeat > 1 {
                span.stride / span.block
            } else {
                len / span.block
            };
            let mut w = Walk::new(g, shapes, cfg);
            let r = w.run(place, span, n, units);
            seen.extend(w.members.keys().copied());
            match r {
                Ok(()) => {
                    out.groups.push(Group {
                        source: n,
                        units,
                        block: span.block,
                        weights: w
                            .members
                            .keys()
                            .filter(|p| g.initializer(p.value).is_some())
                            .copied()
                            .collect(),
                        members: w.members,
                        depthwise: w.depthwise,
                        literals: w.literals,
                        splits: w.splits,
                        gathers: w.gathers,
                    });
                    break;
                }
                Err(Fail::NeedBlock(m, alt)) => {
                    if let Some(k) = alt {
                        if len % k == 0 && span.repeat == 1 {
                            fallback.push(Span {
                                repeat: k,
                                stride: len / k,
                                ..span
                            });
                        }
                    }
                    let b = lcm(span.block, m);
                    let whole = if span.repeat > 1 { span.stride } else { len };
                    if b >= whole || whole % b != 0 || b == span.block {
                        let reason = first_failure
                            .get_or_insert(format!(
                                "a Reshape splits the {whole} channels into units of {m}, which do not divide them into prunable units"
                            ))
                            .clone();
                        match fallback.pop() {
                            Some(f) => span = f,
                            None => {
                                out.left_alone.push(LeftAlone { source: n, reason });
                                break;
                            }
                        }
                        continue;
                    }
                    span.block = b;
                }
                Err(Fail::NeedRepeat(k)) => {
                    if span.repeat > 1 || len % k != 0 || (len / k) % span.block != 0 {
                        out.left_alone.push(LeftAlone {
                            source: n,
                            reason: format!(
                                "a Split cuts the {len} channels into {k} parts unevenly"
                            ),
                        });
                        break;
                    }
                    span.repeat = k;
                    span.stride = len / k;
                }
                Err(Fail::Unsafe(reason)) => {
                    let reason = first_failure.get_or_insert(reason).clone();
                    match fallback.pop() {
                        Some(f) => span = f,
                        None => {
                            out.left_alone.push(LeftAlone { source: n, reason });
                            break;
                        }
                    }
                }
            }
        }
    }
    resolve_shared(g, &mut out);
    out
}

/// A group may not slice positions of a weight another group slices (a
/// shared initializer): the later one is left alone. Groups on disjoint
/// segments of one axis (a Concat's parts) are fine.
fn resolve_shared(g: &Graph, out: &mut Groups) {
    let mut owned: BTreeMap<Place, Vec<(usize, usize)>> = BTreeMap::new();
    let mut keep = Vec::new();
    for grp in std::mem::take(&mut out.groups) {
        let range = |p: &Place| {
            let s = grp.members[p];
            (s.offset, s.end(grp.units))
        };
        let clash = grp.weights.iter().find(|p| {
            let (a, b) = range(p);
            owned
                .get(p)
                .is_some_and(|v| v.iter().any(|&(c, d)| a < d && c < b))
        });
        if let Some(p) = clash {
            out.left_alone.push(LeftAlone {
                source: grp.source,
                reason: format!(
                    "weight '{}' is shared with another group on the same axis",
                    g.name(p.value)
                ),
            });
            continue;
        }
        for p in &grp.weights {
            owned.entry(*p).or_default().push(range(p));
        }
        keep.push(grp);
    }
    out.groups = keep;
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

fn default_domain(g: &Graph, n: NodeId) -> bool {
    let d = &g.node(n).domain;
    d.is_empty() || d == "ai.onnx"
}

/// The place of a producer's output channels, and its length.
fn source(g: &Graph, shapes: &Graph, n: NodeId) -> Option<(Place, usize)> {
    if !default_domain(g, n) {
        return None;
    }
    let d = g.node(n);
    let out = d.output(0)?;
    let od = dims(shapes, out)?;
    let w = d.input(1)?;
    g.initializer(w)?;
    let axis = match d.op_type.as_str() {
        "Conv" | "ConvTranspose" if od.len() >= 3 => 1,
        "Gemm" if od.len() == 2 => 1,
        "MatMul" if od.len() >= 2 && dims(shapes, w)?.len() == 2 => od.len() - 1,
        _ => return None,
    };
    Some((Place { value: out, axis }, od[axis]))
}

/// Static dims of `v` (inferred, or the initializer's).
pub fn dims(shapes: &Graph, v: ValueId) -> Option<Vec<usize>> {
    if let Some(t) = shapes.initializer(v) {
        return t.dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    }
    let s = shapes.ty(v)?.shape()?.as_known()?;
    s.iter().map(|&d| usize::try_from(d).ok()).collect()
}

fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

const UNARY: &[&str] = &[
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Tanh",
    "Softplus",
    "Softsign",
    "Mish",
    "Gelu",
    "Erf",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Neg",
    "Abs",
    "Sign",
    "Floor",
    "Ceil",
    "Round",
    "Sin",
    "Cos",
    "Identity",
    "Dropout",
    "Cast",
    "Clip",
    "ThresholdedRelu",
    "Shrink",
    "IsNaN",
    "Not",
];

const BINARY: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Where", "Equal",
    "Less", "Greater", "And", "Or", "Mod",
];

const POOL: &[&str] = &[
    "MaxPool",
    "AveragePool",
    "LpPool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "GlobalLpPool",
];

const RESHAPE: &[&str] = &["Reshape", "Flatten", "Squeeze", "Unsqueeze"];

/// A Concat input and where it lies on the Concat's axis.
type Segment = (ValueId, usize, usize);

/// What the walk needs of the model beyond its graph.
#[derive(Clone, Copy)]
struct Cfg {
    opset: i64,
    inputs_are_weights: bool,
}

struct Walk<'a> {
    g: &'a Graph,
    shapes: &'a Graph,
    cfg: Cfg,
    /// The node whose rule is running: a weight it joins is read by it.
    current: Option<NodeId>,
    units: usize,
    members: BTreeMap<Place, Span>,
    /// Weight members and the nodes whose reads put them there.
    weights: BTreeMap<Place, BTreeSet<NodeId>>,
    queue: VecDeque<(Place, Span)>,
    depthwise: BTreeSet<NodeId>,
    literals: Vec<Literal>,
    splits: BTreeMap<NodeId, usize>,
    gathers: BTreeMap<NodeId, usize>,
}

impl<'a> Walk<'a> {
    fn new(g: &'a Graph, shapes: &'a Graph, cfg: Cfg) -> Walk<'a> {
        Walk {
            g,
            shapes,
            cfg,
            current: None,
            units: 0,
            members: BTreeMap::new(),
            weights: BTreeMap::new(),
            queue: VecDeque::new(),
            depthwise: BTreeSet::new(),
            literals: Vec::new(),
            splits: BTreeMap::new(),
            gathers: BTreeMap::new(),
        }
    }

    fn run(&mut self, start: Place, span: Span, source: NodeId, units: usize) -> Step {
        self.units = units;
        self.add(start, span)?;
        // The source's own weight and bias.
        self.backward(source, start, span)?;
        while let Some((p, s)) = self.queue.pop_front() {
            if self.g.is_input(p.value) {
                return unsafe_(format!(
                    "graph input '{}' keeps its shape",
                    self.g.name(p.value)
                ));
            }
            if self.g.is_output(p.value) {
                return unsafe_(format!(
                    "graph output '{}' keeps its shape",
                    self.g.name(p.value)
                ));
            }
            if let Some((n, _)) = self.g.producer(p.value) {
                if n != source || p != start {
                    self.backward(n, p, s)?;
                }
            }
            for &u in self.g.uses(p.value) {
                match u {
                    Use::Input { node, slot } => self.forward(node, slot as usize, p, s)?,
                    Use::Capture { node } => {
                        return unsafe_(format!(
                            "'{}' is read inside a subgraph of {}",
                            self.g.name(p.value),
                            self.label(node)
                        ))
                    }
                }
            }
        }
        // Every read of a sliced weight must be one the group accounts for:
        // a node whose rule joined it.
        let none = BTreeSet::new();
        for p in self
            .members
            .keys()
            .filter(|p| self.g.initializer(p.value).is_some())
        {
            let readers = self.weights.get(p).unwrap_or(&none);
            for u in self.g.uses(p.value) {
                let joined = readers.contains(&u.node());
                if !joined {
                    return unsafe_(format!(
                        "weight '{}' is also read by {}",
                        self.g.name(p.value),
                        self.label(u.node())
                    ));
                }
            }
        }
        Ok(())
    }

    fn label(&self, n: NodeId) -> String {
        let d = self.g.node(n);
        if d.name.is_empty() {
            format!("{} {}", d.op_type, n)
        } else {
            format!("{} '{}'", d.op_type, d.name)
        }
    }

    fn len(&self, v: ValueId, axis: usize) -> Option<usize> {
        dims(self.shapes, v).and_then(|d| d.get(axis).copied())
    }

    fn add(&mut self, p: Place, s: Span) -> Step {
        if let Some(old) = self.members.get(&p) {
            if *old != s {
                return unsafe_(format!(
                    "'{}' axis {} is reached at two different channel offsets",
                    self.g.name(p.value),
                    p.axis
                ));
            }
            // Another read of a weight already in the group.
            if let (Some(n), true) = (self.current, self.g.initializer(p.value).is_some()) {
                self.weights.entry(p).or_default().insert(n);
            }
            return Ok(());
        }
        let Some(len) = self.len(p.value, p.axis) else {
            return unsafe_(format!(
                "the size of '{}' axis {} is not known",
                self.g.name(p.value),
                p.axis
            ));
        };
        if s.end(self.units) > len {
            return unsafe_(format!(
                "'{}' axis {} is shorter than the group",
                self.g.name(p.value),
                p.axis
            ));
        }
        if self.g.initializer(p.value).is_some() {
            if self.g.is_output(p.value) {
                return unsafe_(format!(
                    "weight '{}' is a graph output and keeps its shape",
                    self.g.name(p.value)
                ));
            }
            if self.g.is_input(p.value) && !self.cfg.inputs_are_weights {
                return unsafe_(format!(
                    "weight '{}' is an overridable graph input and keeps its shape",
                    self.g.name(p.value)
                ));
            }
            if let Some(n) = self.current {
                self.weights.entry(p).or_default().insert(n);
            }
        }
        self.members.insert(p, s);
        if self.g.initializer(p.value).is_none() {
            self.queue.push_back((p, s));
        }
        Ok(())
    }

    /// A constant weight read by `reader` joins on `axis`.
    fn weight(&mut self, w: ValueId, axis: usize, s: Span, reader: NodeId) -> Step {
        if self.g.initializer(w).is_none() {
            return unsafe_(format!(
                "the weight '{}' of {} is not a constant",
                self.g.name(w),
                self.label(reader)
            ));
        }
        let p = Place { value: w, axis };
        self.add(p, s)?;
        self.weights.entry(p).or_default().insert(reader);
        Ok(())
    }

    /// A value read or written by `n` joins on `axis`: as a weight when it
    /// is constant.
    fn join(&mut self, v: ValueId, axis: usize, s: Span, n: NodeId) -> Step {
        if self.g.initializer(v).is_some() {
            self.weight(v, axis, s, n)
        } else {
            self.add(Place { value: v, axis }, s)
        }
    }

    /// Elementwise ops with broadcast: every input whose aligned axis has
    /// the group's length joins; one of size 1 broadcasts and stays.
    fn couple(&mut self, n: NodeId, out_axis: usize, s: Span) -> Step {
        let d = self.g.node(n);
        let out = d.output(0).expect("checked");
        let Some(ro) = dims(self.shapes, out).map(|d| d.len()) else {
            return unsafe_(format!("the shape of {} is not known", self.label(n)));
        };
        let full = self.len(out, out_axis).unwrap_or(0);
        let inputs: Vec<ValueId> = d.inputs().iter().flatten().copied().collect();
        for v in inputs {
            let Some(vd) = dims(self.shapes, v) else {
                return unsafe_(format!("the shape of '{}' is not known", self.g.name(v)));
            };
            let lead = ro.saturating_sub(vd.len());
            if out_axis < lead {
                continue;
            }
            let ax = out_axis - lead;
            match vd[ax] {
                1 if full != 1 => {}
                l if l == full => self.join(v, ax, s, n)?,
                l => {
                    return unsafe_(format!(
                        "{} broadcasts '{}' of size {l} against {full}",
                        self.label(n),
                        self.g.name(v)
                    ))
                }
            }
        }
        self.add(
            Place {
                value: out,
                axis: out_axis,
            },
            s,
        )
    }

    /// Per-channel parameters of normalizations: BatchNormalization and
    /// InstanceNormalization on axis 1, LayerNormalization's scale and
    /// bias on the normalized axes.
    fn norm(&mut self, n: NodeId, axis: usize, s: Span) -> Step {
        let d = self.g.node(n).clone();
        let op = d.op_type.as_str();
        let x = d.input(0).expect("checked");
        let rank = dims(self.shapes, x).map(|d| d.len()).unwrap_or(0);
        match op {
            "BatchNormalization" | "InstanceNormalization" => {
                if axis != 1 {
                    return unsafe_(format!(
                        "{} normalizes axis 1, the group is on axis {axis}",
                        self.label(n)
                    ));
                }
                if d.outputs()
                    .iter()
                    .skip(1)
                    .flatten()
                    .any(|&o| self.in_use(o))
                {
                    return unsafe_(format!("{} has running-statistics outputs", self.label(n)));
                }
                for p in d.inputs().iter().skip(1).flatten() {
                    self.weight(*p, 0, s, n)?;
                }
            }
            _ => {
                let k = norm_axis(d.attr_int("axis").unwrap_or(-1), rank).unwrap_or(rank);
                if axis >= k {
                    for p in d.inputs().iter().skip(1).flatten() {
                        let pr = dims(self.shapes, *p).map(|d| d.len()).unwrap_or(0);
                        let lead = (rank - k).saturating_sub(pr);
                        if axis - k >= lead {
                            self.join(*p, axis - k - lead, s, n)?;
                        }
                    }
                }
                if d.outputs()
                    .iter()
                    .skip(1)
                    .flatten()
                    .any(|&o| self.in_use(o))
                {
                    return unsafe_(format!(
                        "{} has mean/variance outputs in use",
                        self.label(n)
                    ));
                }
            }
        }
        self.add(Place { value: x, axis }, s)?;
        let y = d.output(0).expect("checked");
        self.add(Place { value: y, axis }, s)
    }

    /// Reshape, Flatten, Squeeze and Unsqueeze: the axis through the
    /// static sizes.
    fn reshape(&mut self, n: NodeId, from: ValueId, to: ValueId, p: Place, s: Span) -> Step {
        let d = self.g.node(n);
        if d.op_type == "Squeeze" && d.attr_ints("axes").is_none() && d.input(1).is_none() {
            // Squeeze without axes drops every dim of size 1: one a group
            // pruned down to one unit would go too.
            return unsafe_(format!("{} squeezes every dim of size 1", self.label(n)));
        }
        let (Some(fd), Some(td)) = (dims(self.shapes, from), dims(self.shapes, to)) else {
            return unsafe_(format!("{}: its shapes are not known", self.label(n)));
        };
        let (axis, span) =
            map_reshape(&fd, &td, p.axis, s, self.units).map_err(|e| self.reshape_fail(n, e))?;
        let d = self.g.node(n);
        if d.op_type == "Reshape" {
            let out = d.output(0).expect("checked");
            let out_axis = if to == out { axis } else { p.axis };
            let in_axis = if to == out { p.axis } else { axis };
            let sv = d.input(1).expect("a Reshape has a shape");
            let data = d.input(0).expect("a Reshape has data");
            // No other element of the shape may copy the pruned dim: a 0
            // at its index, or its size read at run time.
            let out_rank = dims(self.shapes, out).map(|x| x.len()).unwrap_or(0);
            for j in (0..out_rank).filter(|&j| j != out_axis) {
                let copies = match literal(self.g, self.shapes, n, 1, sv, j, 0) {
                    Some(l) => {
                        j == in_axis
                            && self
                                .g
                                .initializer(l.value)
                                .and_then(|t| t.to_i64_vec())
                                .and_then(|v| v.get(l.index).copied())
                                == Some(0)
                    }
                    None => dim_source(self.g, self.shapes, sv, j, 0) == Some((data, in_axis)),
                };
                if copies {
                    return unsafe_(format!(
                        "{}: its axis {j} takes the size of the pruned axis",
                        self.label(n)
                    ));
                }
            }
            let Some(lit) = literal(self.g, self.shapes, n, 1, sv, out_axis, 0) else {
                // Read at run time from the reshaped tensor's own pruned
                // axis, the size follows by itself.
                if dim_source(self.g, self.shapes, sv, out_axis, 0) == Some((data, in_axis)) {
                    return self.add(Place { value: to, axis }, span);
                }
                return unsafe_(format!(
                    "{}: the size of its axis {out_axis} is computed at run time",
                    self.label(n)
                ));
            };
            let at = self
                .g
                .initializer(lit.value)
                .and_then(|t| t.to_i64_vec())
                .and_then(|v| v.get(lit.index).copied());
            match at {
                Some(0) if out_axis != in_axis => {
                    return unsafe_(format!(
                        "{}: its shape copies a dim (0) the group changes",
                        self.label(n)
                    ))
                }
                Some(x) if x > 0 => {
                    let l = Literal {
                        reshape: n,
                        axis: out_axis,
                        ..lit
                    };
                    if !self.literals.contains(&l) {
                        self.literals.push(l);
                    }
                }
                Some(_) => {}
                None => return unsafe_(format!("{}: its shape is unreadable", self.label(n))),
            }
        }
        self.add(Place { value: to, axis }, span)
    }

    fn reshape_fail(&self, n: NodeId, e: Fail) -> Fail {
        match e {
            Fail::Unsafe(why) => Fail::Unsafe(format!("{}: {why}", self.label(n))),
            other => other,
        }
    }

    /// A rule of `n` is about to run: `n` is a default-domain op with the
    /// inputs and outputs its rule reads, and the weights it joins are
    /// read by it.
    fn enter(&mut self, n: NodeId) -> Step {
        if !default_domain(self.g, n) {
            return unsafe_(format!("{} is a custom op", self.label(n)));
        }
        self.well_formed(n)?;
        self.current = Some(n);
        Ok(())
    }

    /// Through `n` from an input (`slot`) at `p`.
    fn forward(&mut self, n: NodeId, slot: usize, p: Place, s: Span) -> Step {
        let g = self.g;
        self.enter(n)?;
        let d = g.node(n).clone();
        let op = d.op_type.as_str();
        let a = p.axis;
        let out = d.output(0);
        let out_dims = out.and_then(|o| dims(self.shapes, o));
        let Some(out) = out else {
            return unsafe_(format!("{} has no output", self.label(n)));
        };
        match op {
            "Conv" if slot == 0 && a == 1 => {
                let w = d.input(1).expect("conv weight");
                let group = d.attr_int("group").unwrap_or(1);
                let wd = dims(self.shapes, w).unwrap_or_default();
                if group == 1 {
                    self.weight(w, 1, s, n)
                } else if self.is_depthwise(n) {
                    self.weight(w, 0, s, n)?;
                    if let Some(b) = d.input(2) {
                        self.weight(b, 0, s, n)?;
                    }
                    self.depthwise.insert(n);
                    self.add(
                        Place {
                            value: out,
                            axis: 1,
                        },
                        s,
                    )
                } else {
                    unsafe_(format!(
                        "{} is a grouped convolution (group {group}, weight {wd:?}) that is not depthwise",
                        self.label(n)
                    ))
                }
            }
            "ConvTranspose" if slot == 0 && a == 1 => {
                if d.attr_int("group").unwrap_or(1) != 1 {
                    return unsafe_(format!("{} is grouped", self.label(n)));
                }
                self.weight(d.input(1).expect("weight"), 0, s, n)
            }
            "Gemm" if slot == 0 => {
                let ta = d.attr_int("transA").unwrap_or(0) != 0;
                let tb = d.attr_int("transB").unwrap_or(0) != 0;
                let k_axis = if ta { 0 } else { 1 };
                if a == k_axis {
                    self.join(d.input(1).expect("B"), if tb { 1 } else { 0 }, s, n)
                } else {
                    self.add(
                        Place {
                            value: out,
                            axis: 0,
                        },
                        s,
                    )?;
                    if let Some(c) = d.input(2) {
                        if dims(self.shapes, c).is_some_and(|cd| cd.len() == 2 && cd[0] > 1) {
                            self.join(c, 0, s, n)?;
                        }
                    }
                    Ok(())
                }
            }
            "Gemm" if slot == 2 => self.gemm_out(n, a, s),
            "MatMul" => {
                let (Some(ad), Some(bd), Some(od)) = (
                    d.input(0).and_then(|v| dims(self.shapes, v)),
                    d.input(1).and_then(|v| dims(self.shapes, v)),
                    out_dims,
                ) else {
                    return unsafe_(format!("{}: its shapes are not known", self.label(n)));
                };
                let (ra, rb, ro) = (ad.len(), bd.len(), od.len());
                if ra < 2 || rb < 2 {
                    return unsafe_(format!("{} has a 1-D operand", self.label(n)));
                }
                let (x, xr, other, or_) = if slot == 0 {
                    (ra, ra, d.input(1).expect("B"), rb)
                } else {
                    (rb, rb, d.input(0).expect("A"), ra)
                };
                let _ = x;
                if slot == 0 && a == xr - 1 {
                    // A's columns meet B's rows: consumed.
                    self.join(other, or_ - 2, s, n)
                } else if slot == 1 && a == xr - 2 {
                    self.join(other, or_ - 1, s, n)
                } else if slot == 0 && a == xr - 2 {
                    self.add(
                        Place {
                            value: out,
                            axis: ro - 2,
                        },
                        s,
                    )
                } else if slot == 1 && a == xr - 1 {
                    self.add(
                        Place {
                            value: out,
                            axis: ro - 1,
                        },
                        s,
                    )
                } else {
                    // A batch axis: the other operand's aligned axis joins.
                    let oa = a + (ro - xr);
                    self.matmul_batch(n, oa, s)
                }
            }
            "Gather" if slot == 0 => {
                let (ga, ri) = self.gather_axes(n)?;
                if a == ga {
                    // Only an identity gather (`as_strided` lowered by the
                    // dynamo exporter: indices 0, 1, ... along one axis)
                    // maps the channels one to one.
                    match self.identity_gather(n, ga) {
                        Some(k) => {
                            self.gathers.insert(n, ga + k);
                            self.add(
                                Place {
                                    value: out,
                                    axis: ga + k,
                                },
                                s,
                            )
                        }
                        None => unsafe_(format!("{} gathers along the pruned axis", self.label(n))),
                    }
                } else {
                    let oa = if a < ga { a } else { a + ri - 1 };
                    self.add(
                        Place {
                            value: out,
                            axis: oa,
                        },
                        s,
                    )
                }
            }
            "BatchNormalization" | "InstanceNormalization" | "LayerNormalization" if slot == 0 => {
                self.norm(n, a, s)
            }
            "Softmax" | "LogSoftmax" | "Hardmax" => {
                let rank = out_dims.map(|d| d.len()).unwrap_or(0);
                if self.normalizes(&d, rank, a) {
                    unsafe_(format!("{} normalizes over the pruned axis", self.label(n)))
                } else {
                    self.add(
                        Place {
                            value: out,
                            axis: a,
                        },
                        s,
                    )
                }
            }
            op if UNARY.contains(&op) && slot == 0 => {
                if d.outputs()
                    .iter()
                    .skip(1)
                    .flatten()
                    .any(|&o| self.in_use(o))
                {
                    return unsafe_(format!("{}: its mask output is in use", self.label(n)));
                }
                self.add(
                    Place {
                        value: out,
                        axis: a,
                    },
                    s,
                )
            }
            op if BINARY.contains(&op) => {
                let ro = out_dims.map(|d| d.len()).unwrap_or(0);
                let ri = dims(self.shapes, p.value).map(|d| d.len()).unwrap_or(0);
                self.couple(n, a + ro.saturating_sub(ri), s)
            }
            op if POOL.contains(&op) && slot == 0 => {
                if a != 1 {
                    return unsafe_(format!("{} pools over the pruned axis", self.label(n)));
                }
                if d.output(1).is_some_and(|o| self.in_use(o)) {
                    return unsafe_(format!("{}'s indices are in use", self.label(n)));
                }
                self.add(
                    Place {
                        value: out,
                        axis: 1,
                    },
                    s,
                )
            }
            op if op.starts_with("Reduce") && slot == 0 => self.reduce(n, p, s, true),
            "Transpose" => {
                let rank = out_dims.map(|d| d.len()).unwrap_or(0);
                let perm: Vec<usize> = match d.attr_ints("perm") {
                    Some(p) => p.iter().map(|&x| x as usize).collect(),
                    None => (0..rank).rev().collect(),
                };
                match perm.iter().position(|&x| x == a) {
                    Some(oa) => self.add(
                        Place {
                            value: out,
                            axis: oa,
                        },
                        s,
                    ),
                    None => unsafe_(format!("{}: bad perm", self.label(n))),
                }
            }
            op if RESHAPE.contains(&op) && slot == 0 => self.reshape(n, p.value, out, p, s),
            "Concat" => self.concat_forward(n, slot, p, s),
            "Split" | "Slice" if slot == 0 => self.slice_like(n, p, s, true),
            "Shape" => self.shape_read(n, p),
            "Expand" if slot == 0 => self.expand(n, p, s, true),
            _ => unsafe_(format!(
                "{} (input {slot}) has no pruning rule for axis {a}",
                self.label(n)
            )),
        }
    }

    /// Through `n` from its output at `p`.
    fn backward(&mut self, n: NodeId, p: Place, s: Span) -> Step {
        let g = self.g;
        self.enter(n)?;
        let d = g.node(n).clone();
        let op = d.op_type.as_str();
        let a = p.axis;
        if d.output(0) != Some(p.value) && !matches!(op, "Split") {
            return unsafe_(format!(
                "{}: output '{}' has no pruning rule",
                self.label(n),
                g.name(p.value)
            ));
        }
        let x = d.input(0);
        match op {
            "Conv" if a == 1 => {
                let group = d.attr_int("group").unwrap_or(1);
                let w = d.input(1).expect("weight");
                if group == 1 {
                    self.weight(w, 0, s, n)?;
                } else if self.is_depthwise(n) {
                    self.weight(w, 0, s, n)?;
                    self.depthwise.insert(n);
                    self.add(
                        Place {
                            value: x.expect("x"),
                            axis: 1,
                        },
                        s,
                    )?;
                } else {
                    return unsafe_(format!(
                        "{} is a grouped convolution (group {group}) that is not depthwise",
                        self.label(n)
                    ));
                }
                if let Some(b) = d.input(2) {
                    self.weight(b, 0, s, n)?;
                }
                Ok(())
            }
            "ConvTranspose" if a == 1 => {
                if d.attr_int("group").unwrap_or(1) != 1 {
                    return unsafe_(format!("{} is grouped", self.label(n)));
                }
                self.weight(d.input(1).expect("weight"), 1, s, n)?;
                if let Some(b) = d.input(2) {
                    self.weight(b, 0, s, n)?;
                }
                Ok(())
            }
            "Gemm" => self.gemm_out(n, a, s),
            "MatMul" => {
                let (Some(ad), Some(bd), Some(od)) = (
                    x.and_then(|v| dims(self.shapes, v)),
                    d.input(1).and_then(|v| dims(self.shapes, v)),
                    dims(self.shapes, p.value),
                ) else {
                    return unsafe_(format!("{}: its shapes are not known", self.label(n)));
                };
                let (ra, rb, ro) = (ad.len(), bd.len(), od.len());
                if ra < 2 || rb < 2 {
                    return unsafe_(format!("{} has a 1-D operand", self.label(n)));
                }
                if a == ro - 1 {
                    self.join(d.input(1).expect("B"), rb - 1, s, n)
                } else if a == ro - 2 {
                    self.join(x.expect("A"), ra - 2, s, n)
                } else {
                    self.matmul_batch(n, a, s)
                }
            }
            "Gather" => {
                let data = x.expect("data");
                let (ga, ri) = self.gather_axes(n)?;
                let da = if a < ga {
                    a
                } else if a >= ga + ri {
                    a + 1 - ri
                } else if self.identity_gather(n, ga).is_some_and(|k| ga + k == a) {
                    self.gathers.insert(n, a);
                    ga
                } else {
                    return unsafe_(format!(
                        "{}: the pruned axis comes from its indices",
                        self.label(n)
                    ));
                };
                self.join(data, da, s, n)
            }
            "BatchNormalization" | "InstanceNormalization" | "LayerNormalization" => {
                self.norm(n, a, s)
            }
            "Softmax" | "LogSoftmax" | "Hardmax" => {
                let rank = dims(self.shapes, p.value).map(|d| d.len()).unwrap_or(0);
                if self.normalizes(&d, rank, a) {
                    unsafe_(format!("{} normalizes over the pruned axis", self.label(n)))
                } else {
                    self.add(
                        Place {
                            value: x.expect("x"),
                            axis: a,
                        },
                        s,
                    )
                }
            }
            op if UNARY.contains(&op) => self.add(
                Place {
                    value: x.expect("x"),
                    axis: a,
                },
                s,
            ),
            op if BINARY.contains(&op) => self.couple(n, a, s),
            op if POOL.contains(&op) => {
                if a != 1 {
                    return unsafe_(format!("{} pools over the pruned axis", self.label(n)));
                }
                self.add(
                    Place {
                        value: x.expect("x"),
                        axis: 1,
                    },
                    s,
                )
            }
            op if op.starts_with("Reduce") => self.reduce(n, p, s, false),
            "Transpose" => {
                let rank = dims(self.shapes, p.value).map(|d| d.len()).unwrap_or(0);
                let perm: Vec<usize> = match d.attr_ints("perm") {
                    Some(p) => p.iter().map(|&x| x as usize).collect(),
                    None => (0..rank).rev().collect(),
                };
                match perm.get(a) {
                    Some(&ia) => self.add(
                        Place {
                            value: x.expect("x"),
                            axis: ia,
                        },
                        s,
                    ),
                    None => unsafe_(format!("{}: bad perm", self.label(n))),
                }
            }
            op if RESHAPE.contains(&op) => self.reshape(n, p.value, x.expect("x"), p, s),
            "Concat" => self.concat_backward(n, p, s),
            "Slice" | "Split" => self.slice_like(n, p, s, false),
            "Expand" => self.expand(n, p, s, false),
            _ => unsafe_(format!(
                "{} (output) has no pruning rule for axis {a}",
                self.label(n)
            )),
        }
    }

    /// The inputs and outputs the rules read are there, and every input and
    /// output's rank is known and agrees with the op's (a malformed or
    /// mistyped node is left alone, never read past its end).
    fn well_formed(&self, n: NodeId) -> Step {
        let d = self.g.node(n);
        let need = match d.op_type.as_str() {
            "Conv" | "ConvTranspose" | "Gemm" | "MatMul" | "Gather" | "Expand" | "Reshape" => 2,
            "BatchNormalization" => 5,
            "Concat" | "Where" => d.inputs().len(),
            _ => 1,
        };
        let bad = d.inputs().len() < need
            || d.inputs().iter().take(need).any(|i| i.is_none())
            || d.output(0).is_none();
        if bad {
            return unsafe_(format!(
                "{} lacks an input or output its rule reads",
                self.label(n)
            ));
        }
        let ranks: Vec<usize> = d
            .inputs()
            .iter()
            .chain(d.outputs())
            .flatten()
            .filter_map(|&v| dims(self.shapes, v).map(|x| x.len()))
            .collect();
        let out_rank = d
            .output(0)
            .and_then(|o| dims(self.shapes, o))
            .map(|x| x.len());
        let broadcasting = BINARY.contains(&d.op_type.as_str())
            || matches!(d.op_type.as_str(), "MatMul" | "Expand");
        if broadcasting {
            if let Some(r) = out_rank {
                if ranks.iter().any(|&x| x > r) {
                    return unsafe_(format!(
                        "{}: an input has a higher rank than its output",
                        self.label(n)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `v` is read, or is a graph output.
    fn in_use(&self, v: ValueId) -> bool {
        !self.g.uses(v).is_empty() || self.g.is_output(v)
    }

    /// Whether a Softmax-like node normalizes over axis `a`: its axis, and
    /// before opset 13 every axis from it on (the input is coerced to 2-D).
    fn normalizes(&self, d: &graphopt_ir::NodeData, rank: usize, a: usize) -> bool {
        let default = if self.cfg.opset < 13 { 1 } else { -1 };
        match norm_axis(d.attr_int("axis").unwrap_or(default), rank) {
            Some(ax) if self.cfg.opset < 13 => a >= ax,
            Some(ax) => a == ax,
            None => true,
        }
    }

    /// For a Gather along `ga` whose indices are a constant `0, 1, ...,
    /// n-1` laid along one axis `k` (every other dim 1) and `n` is the
    /// data's size there: `k`.
    fn identity_gather(&self, n: NodeId, ga: usize) -> Option<usize> {
        let d = self.g.node(n);
        let t = self.g.initializer(d.input(1)?)?;
        let idx = t.to_i64_vec()?;
        let len = *dims(self.shapes, d.input(0)?)?.get(ga)?;
        let k = t.dims.iter().position(|&x| x > 1)?;
        let ok = idx.len() == len
            && t.dims.iter().enumerate().all(|(j, &x)| j == k || x == 1)
            && idx.iter().enumerate().all(|(i, &v)| v == i as i64);
        ok.then_some(k)
    }

    /// A Gather's axis (on its data) and its indices' rank.
    fn gather_axes(&self, n: NodeId) -> Result<(usize, usize), Fail> {
        let d = self.g.node(n);
        let Some(dd) = d.input(0).and_then(|v| dims(self.shapes, v)) else {
            return unsafe_(format!("{}: its shapes are not known", self.label(n)));
        };
        let ga = norm_axis(d.attr_int("axis").unwrap_or(0), dd.len()).unwrap_or(0);
        let ri = d
            .input(1)
            .and_then(|v| dims(self.shapes, v))
            .map(|d| d.len())
            .unwrap_or(0);
        Ok((ga, ri))
    }

    fn is_depthwise(&self, n: NodeId) -> bool {
        let d = self.g.node(n);
        let group = d.attr_int("group").unwrap_or(1);
        let (Some(wd), Some(xd)) = (
            d.input(1).and_then(|w| dims(self.shapes, w)),
            d.input(0).and_then(|x| dims(self.shapes, x)),
        ) else {
            return false;
        };
        wd.len() >= 3
            && wd[1] == 1
            && xd.len() == wd.len()
            && xd[1] as i64 == group
            && wd[0] as i64 == group
    }

    /// Gemm's output columns: B's columns, C's last axis where it has them.
    fn gemm_out(&mut self, n: NodeId, a: usize, s: Span) -> Step {
        let d = self.g.node(n).clone();
        let out = d.output(0).expect("checked");
        if a != 1 {
            return unsafe_(format!("{}: the group is on its rows", self.label(n)));
        }
        let tb = d.attr_int("transB").unwrap_or(0) != 0;
        self.join(d.input(1).expect("B"), if tb { 0 } else { 1 }, s, n)?;
        if let Some(c) = d.input(2) {
            let cd = dims(self.shapes, c).unwrap_or_default();
            let full = self.len(out, 1).unwrap_or(0);
            if cd.last().is_some_and(|&l| l == full && full != 1) {
                self.join(c, cd.len() - 1, s, n)?;
            }
        }
        self.add(
            Place {
                value: out,
                axis: 1,
            },
            s,
        )
    }

    /// A batch axis of a MatMul (output axis `oa`): both operands' aligned
    /// axes join where they are not broadcast.
    fn matmul_batch(&mut self, n: NodeId, oa: usize, s: Span) -> Step {
        let d = self.g.node(n).clone();
        let out = d.output(0).expect("checked");
        let ro = dims(self.shapes, out).map(|d| d.len()).unwrap_or(0);
        let full = self.len(out, oa).unwrap_or(0);
        for v in [d.input(0), d.input(1)].into_iter().flatten() {
            let vd = dims(self.shapes, v).unwrap_or_default();
            let lead = ro - vd.len();
            if oa < lead {
                continue;
            }
            match vd[oa - lead] {
                1 if full != 1 => {}
                l if l == full => self.join(v, oa - lead, s, n)?,
                _ => return unsafe_(format!("{}: batch dims do not match", self.label(n))),
            }
        }
        self.add(
            Place {
                value: out,
                axis: oa,
            },
            s,
        )
    }

    fn reduce(&mut self, n: NodeId, p: Place, s: Span, forward: bool) -> Step {
        let d = self.g.node(n).clone();
        let x = d.input(0).expect("x");
        let out = d.output(0).expect("y");
        let Some(rank) = dims(self.shapes, x).map(|d| d.len()) else {
            return unsafe_(format!("{}: its shapes are not known", self.label(n)));
        };
        if d.attr_ints("axes").is_none()
            && d.input(1).is_some_and(|v| self.g.initializer(v).is_none())
        {
            return unsafe_(format!(
                "{}: its axes are computed at run time",
                self.label(n)
            ));
        }
        let axes: Vec<usize> = match d.attr_ints("axes").map(|a| a.to_vec()).or_else(|| {
            d.input(1)
                .and_then(|v| self.g.initializer(v))
                .and_then(|t| t.to_i64_vec())
        }) {
            Some(a) if !a.is_empty() => a.iter().filter_map(|&x| norm_axis(x, rank)).collect(),
            _ => {
                if d.attr_int("noop_with_empty_axes").unwrap_or(0) != 0 {
                    Vec::new()
                } else {
                    (0..rank).collect()
                }
            }
        };
        let keep = d.attr_int("keepdims").unwrap_or(1) != 0;
        // Input axis -> output axis.
        let map = |ia: usize| -> Option<usize> {
            if axes.contains(&ia) {
                None
            } else if keep {
                Some(ia)
            } else {
                Some(ia - axes.iter().filter(|&&r| r < ia).count())
            }
        };
        if forward {
            match map(p.axis) {
                Some(oa) => self.add(
                    Place {
                        value: out,
                        axis: oa,
                    },
                    s,
                ),
                // A reduction over the channels (a decomposed LayerNorm's or
                // RMSNorm's statistics, a sum of features) consumes them:
                // its output's shape does not depend on how many there are.
                None => Ok(()),
            }
        } else {
            match (0..rank).find(|&ia| map(ia) == Some(p.axis)) {
                Some(ia) => self.add(Place { value: x, axis: ia }, s),
                None => unsafe_(format!("{}: no input axis", self.label(n))),
            }
        }
    }

    /// A Concat's axis and its inputs' (value, start, length) on it.
    fn concat_segments(&self, n: NodeId) -> Option<(usize, Vec<Segment>)> {
        let d = self.g.node(n);
        let out = d.output(0)?;
        let rank = dims(self.shapes, out)?.len();
        let c = norm_axis(d.attr_int("axis")?, rank)?;
        let mut start = 0;
        let mut segs = Vec::new();
        for &v in d.inputs() {
            let v = v?;
            let l = *dims(self.shapes, v)?.get(c)?;
            segs.push((v, start, l));
            start += l;
        }
        Some((c, segs))
    }

    fn concat_forward(&mut self, n: NodeId, slot: usize, p: Place, s: Span) -> Step {
        let Some((c, segs)) = self.concat_segments(n) else {
            return unsafe_(format!("{}: its shapes are not known", self.label(n)));
        };
        let out = self.g.node(n).output(0).expect("checked");
        if p.axis != c {
            for (v, _, _) in segs {
                self.join(v, p.axis, s, n)?;
            }
            return self.add(
                Place {
                    value: out,
                    axis: p.axis,
                },
                s,
            );
        }
        let start = segs[slot].1;
        self.add(
            Place {
                value: out,
                axis: c,
            },
            Span {
                offset: start + s.offset,
                ..s
            },
        )
    }

    fn concat_backward(&mut self, n: NodeId, p: Place, s: Span) -> Step {
        let Some((c, segs)) = self.concat_segments(n) else {
            return unsafe_(format!("{}: its shapes are not known", self.label(n)));
        };
        if p.axis != c {
            for (v, _, _) in segs {
                self.join(v, p.axis, s, n)?;
            }
            return Ok(());
        }
        let end = s.end(self.units);
        match segs
            .iter()
            .find(|(_, start, l)| *start <= s.offset && end <= start + l)
        {
            Some(&(v, start, _)) => self.join(
                v,
                c,
                Span {
                    offset: s.offset - start,
                    ..s
                },
                n,
            ),
            None => unsafe_(format!(
                "{}: the group spans several of its inputs",
                self.label(n)
            )),
        }
    }

    /// Split and Slice along another axis pass the group through.
    fn slice_like(&mut self, n: NodeId, p: Place, s: Span, forward: bool) -> Step {
        let d = self.g.node(n).clone();
        let x = d.input(0).expect("x");
        let Some(rank) = dims(self.shapes, x).map(|d| d.len()) else {
            return unsafe_(format!("{}: its shapes are not known", self.label(n)));
        };
        let touched: Vec<usize> = if d.op_type == "Split" {
            vec![norm_axis(d.attr_int("axis").unwrap_or(0), rank).unwrap_or(0)]
        } else {
            match d
                .input(3)
                .map(|v| self.g.initializer(v).and_then(|t| t.to_i64_vec()))
            {
                Some(Some(a)) => a.iter().filter_map(|&x| norm_axis(x, rank)).collect(),
                Some(None) => {
                    return unsafe_(format!(
                        "{}: its axes are computed at run time",
                        self.label(n)
                    ))
                }
                None => {
                    let starts = d
                        .input(1)
                        .and_then(|v| self.g.initializer(v))
                        .and_then(|t| t.to_i64_vec());
                    match starts {
                        Some(st) => (0..st.len()).collect(),
                        None => (0..rank).collect(),
                    }
                }
            }
        };
        if touched.contains(&p.axis) {
            if d.op_type == "Split" {
                return self.split_on_axis(n, p, s, forward);
            }
            return unsafe_(format!("{} cuts the pruned axis", self.label(n)));
        }
        if forward {
            for o in d.outputs().iter().flatten() {
                self.add(
                    Place {
                        value: *o,
                        axis: p.axis,
                    },
                    s,
                )?;
            }
            Ok(())
        } else {
            self.add(
                Place {
                    value: x,
                    axis: p.axis,
                },
                s,
            )?;
            for o in d.outputs().iter().flatten() {
                self.add(
                    Place {
                        value: *o,
                        axis: p.axis,
                    },
                    s,
                )?;
            }
            Ok(())
        }
    }

    /// Expand: the axis passes through where the input has it; the target
    /// size there is 1 or -1 (kept), the group's length (rewritten), or
    /// read at run time from the input's own axis.
    fn expand(&mut self, n: NodeId, p: Place, s: Span, forward: bool) -> Step {
        let d = self.g.node(n).clone();
        let (x, out) = (d.input(0).expect("x"), d.output(0).expect("y"));
        let (Some(xd), Some(od)) = (dims(self.shapes, x), dims(self.shapes, out)) else {
            return unsafe_(format!("{}: its shapes are not known", self.label(n)));
        };
        let lead = od.len() - xd.len();
        let oa = if forward { p.axis + lead } else { p.axis };
        let full = od[oa];
        let Some(sv) = d.input(1) else {
            return unsafe_(format!("{} has no shape", self.label(n)));
        };
        let sl = dims(self.shapes, sv)
            .and_then(|d| d.first().copied())
            .unwrap_or(0);
        let Some(idx) = (oa + sl).checked_sub(od.len()) else {
            // The shape does not reach this axis: the input's size stays.
            return self.expand_join(x, out, oa, lead, &xd, s);
        };
        if let Some(lit) = literal(self.g, self.shapes, n, 1, sv, idx, 0) {
            let at = self
                .g
                .initializer(lit.value)
                .and_then(|t| t.to_i64_vec())
                .and_then(|v| v.get(lit.index).copied());
            match at {
                Some(1) | Some(-1) if oa >= lead && xd[oa - lead] == full => {}
                Some(v) if v as usize == full => {
                    let l = Literal {
                        reshape: n,
                        axis: oa,
                        ..lit
                    };
                    if !self.literals.contains(&l) {
                        self.literals.push(l);
                    }
                }
                _ => return unsafe_(format!("{}: its target size is unreadable", self.label(n))),
            }
        } else if oa < lead || dim_source(self.g, self.shapes, sv, idx, 0) != Some((x, oa - lead)) {
            return unsafe_(format!(
                "{}: the size of its axis {oa} is computed at run time",
                self.label(n)
            ));
        }
        self.expand_join(x, out, oa, lead, &xd, s)
    }

    fn expand_join(
        &mut self,
        x: ValueId,
        out: ValueId,
        oa: usize,
        lead: usize,
        xd: &[usize],
        s: Span,
    ) -> Step {
        if oa >= lead && xd[oa - lead] > 1 {
            self.add(
                Place {
                    value: x,
                    axis: oa - lead,
                },
                s,
            )?;
        }
        self.add(
            Place {
                value: out,
                axis: oa,
            },
            s,
        )
    }

    /// A Split along the pruned axis. A group inside one part moves to that
    /// part; a group over the whole axis cut into equal parts (a fused
    /// query/key/value projection) repeats its units in every part.
    fn split_on_axis(&mut self, n: NodeId, p: Place, s: Span, forward: bool) -> Step {
        let d = self.g.node(n).clone();
        let x = d.input(0).expect("x");
        let outs: Vec<ValueId> = d.outputs().iter().flatten().copied().collect();
        if outs.len() != d.outputs().len() {
            return unsafe_(format!("{} has an unused output", self.label(n)));
        }
        let mut segs = Vec::new();
        let mut start = 0;
        for &o in &outs {
            let Some(l) = self.len(o, p.axis) else {
                return unsafe_(format!("{}: its shapes are not known", self.label(n)));
            };
            segs.push((o, start, l));
            start += l;
        }
        let k = segs.len();
        let equal = segs.iter().all(|sg| sg.2 == segs[0].2);
        if let Some(v) = d.input(1) {
            if self.g.initializer(v).is_none() {
                return unsafe_(format!(
                    "{}: its sizes are computed at run time",
                    self.label(n)
                ));
            }
        }
        let sized = d.input(1).is_some() || d.attr_ints("split").is_some();
        self.splits.insert(n, p.axis);
        if forward {
            if s.repeat == k && equal && s.stride == segs[0].2 {
                for &(o, _, _) in &segs {
                    self.add(
                        Place {
                            value: o,
                            axis: p.axis,
                        },
                        Span {
                            repeat: 1,
                            stride: 0,
                            ..s
                        },
                    )?;
                }
                return Ok(());
            }
            if s.repeat == 1 && sized {
                let end = s.end(self.units);
                if let Some(&(o, st, _)) = segs
                    .iter()
                    .find(|(_, st, l)| *st <= s.offset && end <= st + l)
                {
                    return self.add(
                        Place {
                            value: o,
                            axis: p.axis,
                        },
                        Span {
                            offset: s.offset - st,
                            ..s
                        },
                    );
                }
                if s.offset == 0 && equal && end == start && k > 1 {
                    return Err(Fail::NeedRepeat(k));
                }
            } else if s.repeat == 1 && s.offset == 0 && equal && s.end(self.units) == start && k > 1
            {
                return Err(Fail::NeedRepeat(k));
            }
            return unsafe_(format!(
                "{} cuts the pruned axis across the group",
                self.label(n)
            ));
        }
        // Backward from one part: the input's span, unless the input is
        // already a member repeating over the parts.
        let slot = segs
            .iter()
            .position(|sg| sg.0 == p.value)
            .expect("an output of the Split");
        let xp = Place {
            value: x,
            axis: p.axis,
        };
        if let Some(have) = self.members.get(&xp) {
            if have.repeat == k && equal && have.stride == segs[0].2 && have.offset == s.offset {
                return Ok(());
            }
        }
        if !sized {
            return unsafe_(format!(
                "{} splits into equal parts, and the group is in one of them",
                self.label(n)
            ));
        }
        self.add(
            xp,
            Span {
                offset: segs[slot].1 + s.offset,
                ..s
            },
        )
    }

    /// Whether every read of `v` (a shape of `x`, or a piece of one) ends
    /// in the shape of a Reshape of `x` itself (those check, through
    /// [`dim_source`], that the dims they take are the ones that follow).
    fn only_reshapes_itself(&self, v: ValueId, x: ValueId, depth: usize) -> bool {
        if depth > 6 || self.g.is_output(v) {
            return false;
        }
        self.g.uses(v).iter().all(|u| {
            let Use::Input { node, slot } = *u else {
                return false;
            };
            let d = self.g.node(node);
            match d.op_type.as_str() {
                "Reshape" => slot == 1 && d.input(0) == Some(x),
                "Gather" | "Slice" | "Squeeze" | "Unsqueeze" | "Concat" | "Cast" => {
                    (d.op_type == "Concat" || slot == 0)
                        && d.output(0)
                            .is_some_and(|o| self.only_reshapes_itself(o, x, depth + 1))
                }
                _ => false,
            }
        })
    }

    /// `Shape` of a member is fine when only other dims are read from it.
    fn shape_read(&mut self, n: NodeId, p: Place) -> Step {
        let d = self.g.node(n);
        let rank = dims(self.shapes, p.value).map(|d| d.len()).unwrap_or(0);
        let (start, end) = shape_range(d, rank);
        if !(start..end).contains(&p.axis) {
            // `Shape(start, end)` reads other dims only.
            return Ok(());
        }
        let len = end - start;
        let out = d.output(0).expect("checked");
        if self.g.is_output(out) {
            return unsafe_(format!("{}: the shape is a graph output", self.label(n)));
        }
        if self.only_reshapes_itself(out, p.value, 0) {
            return Ok(());
        }
        for u in self.g.uses(out) {
            let Use::Input { node, slot: 0 } = *u else {
                return unsafe_(format!("{}: its shape is used whole", self.label(n)));
            };
            let gd = self.g.node(node);
            let idx = gd
                .input(1)
                .and_then(|v| self.g.initializer(v))
                .and_then(|t| t.to_i64_vec());
            let c = |k: usize| {
                gd.input(k)
                    .and_then(|v| self.g.initializer(v))
                    .and_then(|t| t.to_i64_vec())
            };
            let ok = match gd.op_type.as_str() {
                "Gather" => {
                    matches!(idx.as_deref(), Some(ix) if ix.iter().all(|&i| norm_axis(i, len).map(|k| k + start) != Some(p.axis)))
                }
                // `x.shape[:-1]`: a range of dims without the pruned one.
                "Slice" => match (c(1).as_deref(), c(2).as_deref(), gd.inputs().len() <= 4) {
                    (Some(&[st]), Some(&[en]), true) => {
                        let r = len as i64;
                        let norm = |x: i64| if x < 0 { (x + r).max(0) } else { x.min(r) };
                        let step_ok = c(4).is_none_or(|s| s == [1]);
                        let (st, en) = (norm(st), norm(en));
                        step_ok && !(st..en).contains(&(p.axis as i64 - start as i64))
                    }
                    _ => false,
                },
                _ => false,
            };
            if !ok {
                return unsafe_(format!(
                    "{}: the shape reaches {} whole",
                    self.label(n),
                    self.label(node)
                ));
            }
        }
        Ok(())
    }
}

/// The axis and span of a reshape's output (`to`) for a group on axis
/// `a` of its input (`from`); works both ways (a merge one way is a split
/// the other).
fn map_reshape(
    from: &[usize],
    to: &[usize],
    a: usize,
    s: Span,
    units: usize,
) -> Result<(usize, Span), Fail> {
    let prod = |d: &[usize]| d.iter().product::<usize>();
    if prod(from) != prod(to) {
        return unsafe_("sizes differ");
    }
    let outer = prod(&from[..a]);
    let len = from[a];
    let inner = prod(&from[a + 1..]);
    // Candidate output axes: those whose leading product is `outer`.
    let cands: Vec<usize> = (0..to.len()).filter(|&p| prod(&to[..p]) == outer).collect();
    // The same axis.
    for &p in &cands {
        if to[p] == len && prod(&to[p + 1..]) == inner {
            return Ok((p, s));
        }
    }
    // Merged with the dims after it: positions scale by what it absorbs.
    for &p in &cands {
        if to[p].is_multiple_of(len) && to[p] > len {
            let m = to[p] / len;
            if prod(&to[p + 1..]) * m == inner && inner % m == 0 {
                return Ok((
                    p,
                    Span {
                        offset: s.offset * m,
                        block: s.block * m,
                        stride: s.stride * m,
                        ..s
                    },
                ));
            }
        }
    }
    // Split into [to[p], ...]: units must be whole slabs of the inner part.
    for &p in &cands {
        if to[p] > 1 && len.is_multiple_of(to[p]) && len > to[p] {
            let m = len / to[p];
            if prod(&to[p + 1..]) != m * inner {
                continue;
            }
            if s.offset.is_multiple_of(m) && s.block.is_multiple_of(m) && s.stride.is_multiple_of(m)
            {
                return Ok((
                    p,
                    Span {
                        offset: s.offset / m,
                        block: s.block / m,
                        stride: s.stride / m,
                        ..s
                    },
                ));
            }
            // Units repeating in the outer parts live on the inner axis
            // (a fused projection reshaped to `[3, E]`).
            if s.repeat == to[p] && s.stride == m && to.get(p + 1) == Some(&m) {
                return Ok((
                    p + 1,
                    Span {
                        repeat: 1,
                        stride: 0,
                        ..s
                    },
                ));
            }
            if s.offset.is_multiple_of(m) && units > 0 {
                let alt =
                    (s.offset == 0 && s.repeat == 1 && s.block == 1 && to.get(p + 1) == Some(&m))
                        .then_some(to[p]);
                return Err(Fail::NeedBlock(m, alt));
            }
            return unsafe_(format!(
                "it splits axis {a} into units of {m} the group's offset does not align with"
            ));
        }
    }
    // The inner axis of `[k, E]` merged into `k·E`: units repeat k times.
    if a > 0 && s.repeat == 1 {
        let k = from[a - 1];
        for p in 0..to.len() {
            if prod(&to[..p]) * k == outer && to[p] == k * len && prod(&to[p + 1..]) == inner {
                return Ok((
                    p,
                    Span {
                        repeat: k,
                        stride: len,
                        ..s
                    },
                ));
            }
        }
    }
    unsafe_(format!(
        "it reshapes {from:?} to {to:?} across the pruned axis {a}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_maps_merge_split_and_same() {
        let s = Span::new(0, 1);
        // Flatten of [1, 8, 2, 2] into [1, 32]: channel c is 4 positions.
        let (a, sp) = map_reshape(&[1, 8, 2, 2], &[1, 32], 1, s, 8).ok().unwrap();
        assert_eq!((a, sp.block), (1, 4));
        // [1, 8, 1, 1] -> [1, 8]: the same axis.
        let (a, sp) = map_reshape(&[1, 8, 1, 1], &[1, 8], 1, s, 8).ok().unwrap();
        assert_eq!((a, sp.block), (1, 1));
        // Heads: [2, 3, 12] -> [2, 3, 4, 3] needs units of 3.
        assert!(matches!(
            map_reshape(&[2, 3, 12], &[2, 3, 4, 3], 2, s, 12),
            Err(Fail::NeedBlock(3, _))
        ));
        let h = Span::new(0, 3);
        let (a, sp) = map_reshape(&[2, 3, 12], &[2, 3, 4, 3], 2, h, 4)
            .ok()
            .unwrap();
        assert_eq!((a, sp.block), (2, 1));
        // And back: heads merge into units of 3 channels.
        let one = Span::new(0, 1);
        let (a, sp) = map_reshape(&[2, 3, 4, 3], &[2, 3, 12], 2, one, 4)
            .ok()
            .unwrap();
        assert_eq!((a, sp.block), (2, 3));
    }
}
