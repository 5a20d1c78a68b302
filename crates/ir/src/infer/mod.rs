//! Dtype and shape inference with symbolic dims.
//!
//! [`infer_graph`] walks a graph's nodes in program order and computes each
//! output's type from its inputs' types, attributes and — for shape-carrying
//! integer tensors — their partially known *values*. A value known as a small
//! vector of dims (the output of `Shape`, `Gather` on it, `Concat` of those,
//! arithmetic on them...) is tracked in a side table so that `Reshape`,
//! `Expand`, `ConstantOfShape`, `Tile`, `Slice`... whose targets are computed
//! at run time (as PyTorch exports do) still get static or symbolic shapes.
//!
//! Inferred types *refine* declared ones: unknown element types, ranks and
//! dims are filled in; a real conflict keeps the declared type and records a
//! warning. An op without a rule leaves its outputs untouched. Inference
//! never fails and never panics, whatever the input.
//!
//! Layout: this file is the driver (graphs, subgraphs, model-local
//! functions, merging); [`dims`] holds dim arithmetic and broadcasting,
//! `values` the shape-value propagation, and one file per op family holds
//! the type rules.

mod control;
mod ctx;
pub mod dims;
mod elementwise;
mod nn;
mod reduce;
mod shape_ops;
mod table;
mod values;

#[cfg(test)]
mod onnx_compare;
#[cfg(test)]
mod tests;

use crate::{
    AttrValue, Dim, Function, Graph, Model, NodeId, OpsetImport, Shape, Type, TypeKind, ValueId,
};
use ctx::Cx;
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use table::TypeTable;
pub use values::MAX_TRACKED;

/// Options for inference.
#[derive(Clone, Debug, Default)]
pub struct InferOptions {
    /// Binds symbolic dim NAME to VALUE (`--dim NAME=VALUE`): the symbol is
    /// replaced by the value everywhere, graph inputs included.
    pub dims: Vec<(String, i64)>,
    /// Read the initializers of graph inputs (overridable defaults: every
    /// initializer is also an input before IR version 4) as those inputs'
    /// values. Planning does, for the default inputs; passes must not, as a
    /// caller may override them.
    pub input_defaults: bool,
}

/// What inference did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferReport {
    /// Op types with no inference rule (qualified by domain when not the
    /// default one), deduplicated and sorted.
    pub unknown_ops: Vec<String>,
    /// Conflicts between declared and inferred types, and ops whose inputs
    /// are inconsistent, one line each.
    pub warnings: Vec<String>,
    /// Number of values whose type gained information.
    pub inferred: usize,
    /// Values of the main graph known as a vector of dims (small integer
    /// tensors of rank 0 or 1: shapes and what is computed from them). A
    /// rank-0 value is a vector of one entry; entries may be symbolic or
    /// unknown.
    pub shape_values: BTreeMap<ValueId, Vec<Dim>>,
}

/// Infers types in a whole model: its main graph (and, recursively, its
/// subgraphs), using model-local functions to type calls to them.
pub fn infer_model(m: &mut Model, opts: &InferOptions) -> InferReport {
    let opsets = if m.opset_imports.is_empty() {
        vec![OpsetImport {
            domain: String::new(),
            version: 18,
        }]
    } else {
        m.opset_imports.clone()
    };
    let Model {
        graph, functions, ..
    } = m;
    let mut st = State::new(opts, functions);
    let vals = infer_in(graph, &opsets, &mut st, &HashMap::new(), &HashMap::new(), 0);
    st.finish(vals)
}

/// Infers types in one graph whose default-domain opset is `opset`.
pub fn infer_graph(g: &mut Graph, opset: i64, opts: &InferOptions) -> InferReport {
    let opsets = vec![OpsetImport {
        domain: String::new(),
        version: opset,
    }];
    let mut st = State::new(opts, &[]);
    let vals = infer_in(g, &opsets, &mut st, &HashMap::new(), &HashMap::new(), 0);
    st.finish(vals)
}

/// The values of `g` known as vectors of dims, computed on a copy of `g`
/// (the graph itself is not changed). See [`InferReport::shape_values`].
pub fn const_shape_values(
    g: &Graph,
    opset: i64,
    opts: &InferOptions,
) -> BTreeMap<ValueId, Vec<Dim>> {
    let mut g = g.clone();
    infer_graph(&mut g, opset, opts).shape_values
}

/// A value known as a vector of dims; `scalar` for rank 0 (one entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SVal {
    pub elems: Vec<Dim>,
    pub scalar: bool,
}

impl SVal {
    pub fn vec(elems: Vec<Dim>) -> SVal {
        SVal {
            elems,
            scalar: false,
        }
    }
    pub fn scalar(d: Dim) -> SVal {
        SVal {
            elems: vec![d],
            scalar: true,
        }
    }
    pub fn known(&self) -> Option<Vec<i64>> {
        self.elems.iter().map(Dim::known).collect()
    }
}

/// Inference-wide state.
struct State<'a> {
    bind: Vec<(String, i64)>,
    input_defaults: bool,
    functions: &'a [Function],
    unknown: BTreeSet<String>,
    warnings: Vec<String>,
    inferred: usize,
}

const MAX_WARNINGS: usize = 1000;
const MAX_DEPTH: usize = 32;
/// Loop/Scan bodies nested deeper than this are not probed.
const MAX_PROBE_DEPTH: usize = 3;

impl<'a> State<'a> {
    fn new(opts: &InferOptions, functions: &'a [Function]) -> State<'a> {
        State {
            bind: opts.dims.clone(),
            input_defaults: opts.input_defaults,
            functions,
            unknown: BTreeSet::new(),
            warnings: Vec::new(),
            inferred: 0,
        }
    }

    fn warn(&mut self, msg: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(msg);
        }
    }

    fn finish(self, vals: HashMap<ValueId, SVal>) -> InferReport {
        let shape_values = vals.into_iter().map(|(k, v)| (k, v.elems)).collect();
        InferReport {
            unknown_ops: self.unknown.into_iter().collect(),
            warnings: self.warnings,
            inferred: self.inferred,
            shape_values,
        }
    }

    fn bind_dim(&self, d: &mut Dim) {
        if let Dim::Sym(s) = d {
            if let Some((_, v)) = self.bind.iter().find(|(n, _)| n == s) {
                *d = Dim::Known(*v);
            }
        }
    }

    fn bind_type(&self, t: &mut Type) {
        if self.bind.is_empty() {
            return;
        }
        match &mut t.kind {
            TypeKind::Tensor(tt) | TypeKind::SparseTensor(tt) => {
                if let Some(s) = &mut tt.shape {
                    for d in &mut s.dims {
                        self.bind_dim(d);
                    }
                }
            }
            TypeKind::Sequence(Some(e)) | TypeKind::Optional(e) | TypeKind::Map(_, e) => {
                self.bind_type(e)
            }
            _ => {}
        }
    }
}

fn opset_of(opsets: &[OpsetImport], domain: &str) -> Option<i64> {
    let norm = |d: &str| if d == "ai.onnx" { "" } else { d }.to_string();
    let want = norm(domain);
    opsets
        .iter()
        .find(|o| norm(&o.domain) == want)
        .map(|o| o.version)
}

/// Infers `g` in place. `outer_tys` / `outer_vals` give the types and shape
/// values of the captures of enclosing-scope values (keyed by this graph's
/// capture ids). Returns the shape-value table of `g`.
fn infer_in(
    g: &mut Graph,
    opsets: &[OpsetImport],
    st: &mut State,
    outer_tys: &HashMap<ValueId, Type>,
    outer_vals: &HashMap<ValueId, SVal>,
    depth: usize,
) -> HashMap<ValueId, SVal> {
    let opset = opset_of(opsets, "").unwrap_or(18);
    // Bind symbolic dims everywhere, and give initializers without a
    // declared type the type of their data.
    let all: Vec<ValueId> = g.values().collect();
    for &v in &all {
        if let Some(t) = g.value_mut(v).ty.as_mut() {
            st.bind_type(t);
        }
        if g.ty(v).is_none() {
            if let Some(t) = g.initializer(v) {
                let ty = Type::known(t.dtype, &t.dims);
                g.value_mut(v).ty = Some(ty);
            }
        }
    }
    let mut outer_tys = outer_tys.clone();
    for t in outer_tys.values_mut() {
        st.bind_type(t);
    }
    let mut vals: HashMap<ValueId, SVal> = outer_vals.clone();
    for &v in &all {
        let value = match g.constant(v) {
            Some(t) => Some(t),
            None if st.input_defaults => g.initializer(v),
            None => None,
        };
        if let Some(t) = value {
            if let Some(sv) = values::from_tensor(t) {
                vals.insert(v, sv);
            }
        }
    }
    let order: Vec<NodeId> = g.order().to_vec();
    for n in order {
        if depth < MAX_DEPTH && g.node(n).has_subgraphs() {
            infer_subgraphs(g, n, opsets, st, &outer_tys, &vals, depth);
        }
        let node = g.node(n);
        let std_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        let outs: Option<Vec<Option<Type>>> = if std_domain {
            let cx = Cx {
                g,
                node,
                opset,
                vals: &vals,
                outer: &outer_tys,
                input_defaults: st.input_defaults,
                warns: Default::default(),
            };
            let r = infer_node(&cx);
            for w in cx.warns.into_inner() {
                st.warn(w);
            }
            r
        } else if let Some(f) = st
            .functions
            .iter()
            .find(|f| f.domain == node.domain && f.name == node.op_type)
        {
            (depth < MAX_DEPTH).then(|| call_function(g, n, f, st, &outer_tys, depth))
        } else {
            None
        };
        let Some(outs) = outs else {
            st.unknown.insert(g.node(n).qualified_op());
            continue;
        };
        let node_outs: Vec<Option<ValueId>> = g.node(n).outputs().to_vec();
        for (i, o) in node_outs.iter().enumerate() {
            let (Some(o), Some(Some(mut t))) = (o, outs.get(i).cloned()) else {
                continue;
            };
            st.bind_type(&mut t);
            merge_into(g, *o, t, st);
        }
        if std_domain {
            let cx = Cx {
                g,
                node: g.node(n),
                opset,
                vals: &vals,
                outer: &outer_tys,
                input_defaults: st.input_defaults,
                warns: Default::default(),
            };
            let new_vals = values::propagate(&cx);
            for (i, sv) in new_vals.into_iter().enumerate() {
                if let (Some(Some(o)), Some(mut sv)) = (node_outs.get(i), sv) {
                    for d in &mut sv.elems {
                        st.bind_dim(d);
                    }
                    vals.insert(*o, sv);
                }
            }
        }
    }
    vals
}

/// Infers the subgraphs of node `n` (If branches, Loop/Scan bodies), typing
/// (or refining the declared types of) their formal inputs from the node's
/// inputs, and their captures from the enclosing scope.
fn infer_subgraphs(
    g: &mut Graph,
    n: NodeId,
    opsets: &[OpsetImport],
    st: &mut State,
    outer_tys: &HashMap<ValueId, Type>,
    outer_vals: &HashMap<ValueId, SVal>,
    depth: usize,
) {
    let node = g.node(n);
    let op = node.op_type.clone();
    let in_ty = |i: usize| -> Option<Type> {
        let v = node.input(i)?;
        outer_tys.get(&v).cloned().or_else(|| g.ty(v).cloned())
    };
    let in_tys: Vec<Option<Type>> = (0..node.inputs().len()).map(in_ty).collect();
    let scan_in_axes: Vec<i64> = node
        .attr_ints("scan_input_axes")
        .map(|a| a.to_vec())
        .unwrap_or_default();
    let num_scan_inputs = node.attr_int("num_scan_inputs").unwrap_or(0).max(0) as usize;
    let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
    for a in &mut attrs {
        let graphs: Vec<&mut Graph> = match &mut a.value {
            AttrValue::Graph(b) => vec![b.as_mut()],
            AttrValue::Graphs(v) => v.iter_mut().collect(),
            _ => continue,
        };
        for sub in graphs {
            // Formal inputs.
            let formal: Vec<Option<Type>> = match op.as_str() {
                "Loop" => {
                    let mut v = vec![
                        Some(Type::known(crate::DType::I64, &[])),
                        Some(Type::known(crate::DType::Bool, &[])),
                    ];
                    v.extend(in_tys.iter().skip(2).cloned());
                    v
                }
                "Scan" => {
                    let n_state = in_tys.len().saturating_sub(num_scan_inputs);
                    let mut v: Vec<Option<Type>> = in_tys.iter().take(n_state).cloned().collect();
                    for (j, t) in in_tys.iter().skip(n_state).enumerate() {
                        let axis = scan_in_axes.get(j).copied().unwrap_or(0);
                        v.push(t.as_ref().and_then(|t| {
                            let tt = t.as_tensor()?;
                            let shape = tt.shape.as_ref().and_then(|s| {
                                let ax = dims::norm_axis(axis, s.rank())?;
                                let mut d = s.dims.clone();
                                d.remove(ax);
                                Some(Shape::new(d))
                            });
                            Some(Type::tensor(tt.elem, shape))
                        }));
                    }
                    v
                }
                _ => Vec::new(),
            };
            // Captures.
            let mut sub_tys = HashMap::new();
            let mut sub_vals = HashMap::new();
            for v in sub.values().collect::<Vec<_>>() {
                if !sub.is_outer(v) {
                    continue;
                }
                if let Some(pv) = g.value_by_name(sub.name(v)) {
                    if let Some(t) = outer_tys.get(&pv).or_else(|| g.ty(pv)) {
                        sub_tys.insert(v, t.clone());
                    }
                    if let Some(sv) = outer_vals.get(&pv) {
                        sub_vals.insert(v, sv.clone());
                    }
                }
            }
            // Loop-carried and scan-state values may change type between
            // iterations: infer a copy of the body with the initial types,
            // and type the real body with what both iterations share.
            let carried: Option<(usize, usize, usize)> = match op.as_str() {
                "Loop" => Some((2, 1, in_tys.len().saturating_sub(2))),
                "Scan" => Some((0, 0, in_tys.len().saturating_sub(num_scan_inputs))),
                _ => None,
            };
            let mut formal = formal;
            if let Some((first_in, first_out, n)) = carried {
                if n > 0 && depth >= MAX_PROBE_DEPTH {
                    // Deeply nested: do not probe (that doubles the work per
                    // level); only element types and ranks are kept.
                    for k in 0..n {
                        if let Some(Some(t)) = formal.get_mut(first_in + k) {
                            if let Some(s) = t.as_tensor_mut().and_then(|tt| tt.shape.as_mut()) {
                                s.dims.iter_mut().for_each(|d| *d = Dim::Unknown);
                            }
                        }
                    }
                } else if n > 0 {
                    let mut probe = sub.clone();
                    set_formal(&mut probe, &formal);
                    let (w, c) = (st.warnings.len(), st.inferred);
                    infer_in(&mut probe, opsets, st, &sub_tys, &sub_vals, depth + 1);
                    st.warnings.truncate(w);
                    st.inferred = c;
                    for k in 0..n {
                        let out = probe.outputs.get(first_out + k).and_then(|&o| probe.ty(o));
                        if let Some(f) = formal.get_mut(first_in + k) {
                            *f = control::join(f.as_ref(), out);
                        }
                    }
                }
            }
            set_formal(sub, &formal);
            let sub_opsets = opsets.to_vec();
            infer_in(sub, &sub_opsets, st, &sub_tys, &sub_vals, depth + 1);
        }
    }
    g.node_mut(n).attributes = attrs;
}

/// Types a subgraph's formal inputs, refining declared types.
fn set_formal(sub: &mut Graph, formal: &[Option<Type>]) {
    let inputs = sub.inputs.clone();
    for (i, v) in inputs.iter().enumerate() {
        if let Some(Some(t)) = formal.get(i) {
            let merged = match sub.ty(*v) {
                None => Some(t.clone()),
                Some(d) => merge_types(d, t, "", &mut Vec::new()),
            };
            if let Some(m) = merged {
                sub.value_mut(*v).ty = Some(m);
            }
        }
    }
}

/// Types a call to a model-local function by inferring a copy of its body
/// with the call's argument types and attributes.
fn call_function(
    g: &Graph,
    n: NodeId,
    f: &Function,
    st: &mut State,
    outer_tys: &HashMap<ValueId, Type>,
    depth: usize,
) -> Vec<Option<Type>> {
    let node = g.node(n);
    let mut body = f.body.clone();
    let formal = body.inputs.clone();
    for (i, v) in formal.iter().enumerate() {
        if let Some(a) = node.input(i) {
            let t = outer_tys.get(&a).or_else(|| g.ty(a)).cloned();
            body.value_mut(*v).ty = t;
        }
    }
    // Substitute attribute references.
    let order: Vec<NodeId> = body.order().to_vec();
    for bn in order {
        let attrs = &mut body.node_mut(bn).attributes;
        let mut i = 0;
        while i < attrs.len() {
            if let AttrValue::Ref { attr, .. } = &attrs[i].value {
                let actual = node
                    .attr(attr)
                    .or_else(|| f.attribute_defaults.iter().find(|a| &a.name == attr));
                match actual {
                    Some(a) => {
                        attrs[i].value = a.value.clone();
                        i += 1;
                    }
                    None => {
                        attrs.remove(i);
                    }
                }
            } else {
                i += 1;
            }
        }
    }
    let opsets = if f.opset_imports.is_empty() {
        vec![OpsetImport {
            domain: String::new(),
            version: 18,
        }]
    } else {
        f.opset_imports.clone()
    };
    // Warnings and counts inside a function copy are not the caller's.
    let (w, c) = (st.warnings.len(), st.inferred);
    infer_in(
        &mut body,
        &opsets,
        st,
        &HashMap::new(),
        &HashMap::new(),
        depth + 1,
    );
    st.warnings.truncate(w);
    st.inferred = c;
    body.outputs.iter().map(|&o| body.ty(o).cloned()).collect()
}

/// Dispatches to the op families.
fn infer_node(cx: &Cx) -> Option<Vec<Option<Type>>> {
    elementwise::infer(cx)
        .or_else(|| shape_ops::infer(cx))
        .or_else(|| nn::infer(cx))
        .or_else(|| reduce::infer(cx))
        .or_else(|| control::infer(cx))
}

/// Merges inferred type `t` into value `v`'s type.
fn merge_into(g: &mut Graph, v: ValueId, t: Type, st: &mut State) {
    let name = g.name(v).to_string();
    let old = g.ty(v).cloned();
    let mut warns = Vec::new();
    let merged = match &old {
        None => {
            if has_undefined(&t) {
                None
            } else {
                Some(t)
            }
        }
        Some(d) => merge_types(d, &t, &name, &mut warns),
    };
    for w in warns {
        st.warn(w);
    }
    if let Some(m) = merged {
        if old.as_ref() != Some(&m) {
            st.inferred += 1;
            g.value_mut(v).ty = Some(m);
        }
    }
}

fn has_undefined(t: &Type) -> bool {
    match &t.kind {
        TypeKind::Tensor(tt) | TypeKind::SparseTensor(tt) => tt.elem == crate::DType::Undefined,
        TypeKind::Sequence(Some(e)) | TypeKind::Optional(e) => has_undefined(e),
        TypeKind::Unset => true,
        _ => false,
    }
}

/// Refines declared type `d` with inferred type `t`. `None`: keep `d`.
fn merge_types(d: &Type, t: &Type, name: &str, warns: &mut Vec<String>) -> Option<Type> {
    match (&d.kind, &t.kind) {
        (TypeKind::Unset, _) => (!has_undefined(t)).then(|| t.clone()),
        (TypeKind::Tensor(dt), TypeKind::Tensor(it)) => {
            let elem = if dt.elem == crate::DType::Undefined {
                it.elem
            } else {
                if it.elem != crate::DType::Undefined && it.elem != dt.elem {
                    warns.push(format!(
                        "value '{name}': declared element type {} but inferred {}",
                        dt.elem, it.elem
                    ));
                }
                dt.elem
            };
            let shape = match (&dt.shape, &it.shape) {
                (None, s) => s.clone(),
                (Some(s), None) => Some(s.clone()),
                (Some(ds), Some(is)) => {
                    if ds.rank() != is.rank() {
                        warns.push(format!(
                            "value '{name}': declared shape {ds} but inferred {is} (rank differs)"
                        ));
                        Some(ds.clone())
                    } else {
                        let mut out = ds.clone();
                        for (k, (a, b)) in ds.dims.iter().zip(&is.dims).enumerate() {
                            out.dims[k] = match (a, b) {
                                (Dim::Known(x), Dim::Known(y)) if x != y => {
                                    warns.push(format!(
                                        "value '{name}': declared shape {ds} but inferred {is} (dim {k})"
                                    ));
                                    a.clone()
                                }
                                (Dim::Known(_), _) => a.clone(),
                                (_, Dim::Known(_)) => b.clone(),
                                (Dim::Unknown, _) => b.clone(),
                                (Dim::Sym(_), _) => a.clone(),
                            };
                        }
                        Some(out)
                    }
                }
            };
            let mut out = d.clone();
            out.kind = TypeKind::Tensor(crate::TensorType::new(elem, shape));
            Some(out)
        }
        (TypeKind::Sequence(None), TypeKind::Sequence(Some(_))) => Some(t.clone()),
        (TypeKind::Sequence(Some(de)), TypeKind::Sequence(Some(ie))) => {
            let e = merge_types(de, ie, name, warns)?;
            let mut out = d.clone();
            out.kind = TypeKind::Sequence(Some(Box::new(e)));
            Some(out)
        }
        (TypeKind::Optional(de), TypeKind::Optional(ie)) => {
            let e = merge_types(de, ie, name, warns)?;
            let mut out = d.clone();
            out.kind = TypeKind::Optional(Box::new(e));
            Some(out)
        }
        (a, b) if std::mem::discriminant(a) != std::mem::discriminant(b) => {
            warns.push(format!(
                "value '{name}': declared type {d} but inferred {t}"
            ));
            None
        }
        _ => None,
    }
}
