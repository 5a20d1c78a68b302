//! Lowering a model for the CPU backend before it is planned: palettized
//! weights (issue 23) decoded per tile inside the kernels that read them.
//!
//! A palettized float32 weight `W` of shape `S` is stored as a float32
//! codebook and packed indices (uint8, or uint4 at opset 21), decoded in
//! standard ONNX by one of two chains (what the `compress` pass writes):
//!
//! ```text
//! per tensor:  i = Cast <to = 6> (indices[S])                   codebook[k]
//!              W = Gather <axis = 0> (codebook, i)
//! per group:   i = Cast <to = 6> (indices[ng, numel/ng])       codebook[ng, k]
//!              f = GatherElements <axis = 1> (codebook, i)
//!              W = Reshape (f, shape)                           shape = S
//! ```
//!
//! Run as written, the arena holds the int32 indices (4 bytes an element)
//! and the decoded weight (4 more). [`lower_palette`] rewrites each reader
//! of `W` into a node of domain [`PALETTE_DOMAIN`] that reads the codebook
//! and the packed indices themselves, and removes the chain:
//!
//! | reader                    | fused node                                  |
//! |---------------------------|---------------------------------------------|
//! | `MatMul(A, W)`, `W` 2-D   | `PaletteMatMul(A, codebook, indices)`       |
//! | `Gemm(A, W, C?)`          | `PaletteGemm(A, codebook, indices, C?)`     |
//! | `Conv(X, W, B?)`          | `PaletteConv(X, codebook, indices, B?)`     |
//! | `Gather(W, ids)`, axis 0  | `PaletteGather(codebook, indices, ids)`     |
//!
//! The fused node keeps the reader's name, outputs and attributes, and adds
//! `palette_weight_shape` (`S`) and `palette_groups` (`[ng, -1]`, `ng = 1`
//! per tensor). The kernels are in [`crate::cpu::palette`].
//!
//! How the planner sees it: shape inference has no rule for a custom
//! domain, but it types a call to a model-local function by inferring its
//! body. So the lowering also adds one function per fused op, whose body is
//! the op's exact ONNX meaning (Cast, Reshape of codebook and indices to
//! `[ng, -1]`, GatherElements, Reshape to `S`, then the reader, attributes
//! passed by reference): `plan_model` infers the fused node's output at the
//! bound dims like any other node, and plans one tensor for it and none for
//! the chain. The IR and the planner know nothing of palettes; the lowered
//! model is still a valid ONNX model (a runtime without the kernels could
//! inline the functions).
//!
//! A weight is fused only when the codebook, the indices (and the shape)
//! are initializers that are not graph inputs, `W` is no graph output and
//! every reader of `W` is one of the table's (reading it only in that
//! slot); otherwise its chain is left to the plain nodes and
//! [`PaletteLowering::kept`] says why. Only the main graph is lowered
//! (If/Loop bodies run as written). Apply this to a copy of the model, and
//! only for the CPU backend: the CUDA backend has no kernels for these ops
//! and runs the chain as written.

use graphopt_ir::{
    AttrKind, AttrValue, Attribute, DType, Function, Graph, Model, NewNode, NodeId, OpsetImport,
    Use, ValueId,
};

/// The domain of the fused nodes (internal to graphopt's CPU runtime).
pub const PALETTE_DOMAIN: &str = "graphopt.exec";
/// The fused ops, by the reader they replace.
pub const PALETTE_OPS: &[&str] = &[
    "PaletteMatMul",
    "PaletteGemm",
    "PaletteConv",
    "PaletteGather",
];
/// Attribute: the decoded weight's shape `S`.
pub const WEIGHT_SHAPE_ATTR: &str = "palette_weight_shape";
/// Attribute: `[ng, -1]`, codebooks and indices as rows of groups.
pub const GROUPS_ATTR: &str = "palette_groups";

/// What [`lower_palette`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PaletteLowering {
    /// Palettized weights whose decode chain was removed.
    pub weights: usize,
    /// Fused nodes made (one per reader of those weights).
    pub fused: usize,
    /// Bytes of the float32 weights no longer decoded whole (4 per
    /// element), the int32 indices aside (4 more per element).
    pub decoded_bytes: u64,
    /// Palettized weights left to the plain nodes, and why.
    pub kept: Vec<(String, String)>,
}

/// A decode chain found in the graph.
struct Chain {
    codebook: ValueId,
    indices: ValueId,
    /// `S`.
    shape: Vec<i64>,
    groups: i64,
    /// Cast, then Gather or GatherElements, then Reshape (per group).
    nodes: Vec<NodeId>,
}

fn default_domain(d: &str) -> bool {
    d.is_empty() || d == "ai.onnx"
}

/// `v` as `Cast(indices)` to int32 or int64 with uint8/uint4 `indices`.
fn cast_of_indices(g: &Graph, v: ValueId) -> Option<(NodeId, ValueId)> {
    let (n, _) = g.producer(v)?;
    let d = g.node(n);
    if d.op_type != "Cast" || !default_domain(&d.domain) {
        return None;
    }
    let to = d.attr_int("to")?;
    if to != DType::I32.to_onnx() as i64 && to != DType::I64.to_onnx() as i64 {
        return None;
    }
    let i = d.input(0)?;
    let t = g.constant(i)?;
    matches!(t.dtype, DType::U8 | DType::U4).then_some((n, i))
}

/// The chain that produces `w`, if it is a palette decode with constant
/// codebook and indices.
fn chain(g: &Graph, w: ValueId) -> Option<Chain> {
    let (n, _) = g.producer(w)?;
    let d = g.node(n);
    if !default_domain(&d.domain) {
        return None;
    }
    match d.op_type.as_str() {
        "Gather" => {
            let cb = d.input(0)?;
            let cbt = g.constant(cb)?;
            let axis = d.attr_int("axis").unwrap_or(0);
            if cbt.dtype != DType::F32 || cbt.dims.len() != 1 || (axis != 0 && axis != -1) {
                return None;
            }
            let (cast, idx) = cast_of_indices(g, d.input(1)?)?;
            let shape = g.constant(idx)?.dims.clone();
            Some(Chain {
                codebook: cb,
                indices: idx,
                shape,
                groups: 1,
                nodes: vec![n, cast],
            })
        }
        "Reshape" => {
            let s = g.constant(d.input(1)?)?.to_i64_vec()?;
            let allowzero = d.attr_int("allowzero").unwrap_or(0) != 0;
            let (ge, _) = g.producer(d.input(0)?)?;
            let e = g.node(ge);
            if e.op_type != "GatherElements" || !default_domain(&e.domain) {
                return None;
            }
            let axis = e.attr_int("axis").unwrap_or(0);
            if axis != 1 && axis != -1 {
                return None;
            }
            let cb = e.input(0)?;
            let cbt = g.constant(cb)?;
            let (cast, idx) = cast_of_indices(g, e.input(1)?)?;
            let it = g.constant(idx)?;
            if cbt.dtype != DType::F32
                || cbt.dims.len() != 2
                || it.dims.len() != 2
                || cbt.dims[0] != it.dims[0]
            {
                return None;
            }
            let shape = reshape_target(&it.dims, &s, allowzero)?;
            Some(Chain {
                codebook: cb,
                indices: idx,
                shape,
                groups: cbt.dims[0],
                nodes: vec![n, ge, cast],
            })
        }
        _ => None,
    }
}

/// Reshape's output shape for input dims `from` and target `to` (0 copies
/// the input's dim unless `allowzero`, one -1 takes the rest).
fn reshape_target(from: &[i64], to: &[i64], allowzero: bool) -> Option<Vec<i64>> {
    let numel: i64 = from.iter().product();
    let mut out = Vec::with_capacity(to.len());
    let mut infer = None;
    for (i, &d) in to.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*from.get(i)?),
            d if d >= 0 => out.push(d),
            _ => return None,
        }
    }
    let known: i64 = out.iter().product();
    if let Some(i) = infer {
        if known == 0 || numel % known != 0 {
            return None;
        }
        out[i] = numel / known;
    } else if known != numel {
        return None;
    }
    Some(out)
}

/// The fused op for reader `n` of `w`, or why there is none.
fn fused_op(g: &Graph, n: NodeId, w: ValueId, rank: usize) -> Result<&'static str, String> {
    let d = g.node(n);
    let why = || match d.name.as_str() {
        "" => format!("read by {}", d.qualified_op()),
        n => format!("read by {} '{n}'", d.qualified_op()),
    };
    if !default_domain(&d.domain) {
        return Err(why());
    }
    let slots: Vec<usize> = (0..d.inputs().len())
        .filter(|&k| d.input(k) == Some(w))
        .collect();
    let (op, slot) = match d.op_type.as_str() {
        "MatMul" if rank == 2 => ("PaletteMatMul", 1),
        "Gemm" if rank == 2 => ("PaletteGemm", 1),
        "Conv" if rank == 3 || rank == 4 => ("PaletteConv", 1),
        "Gather" if rank >= 1 => {
            let a = d.attr_int("axis").unwrap_or(0);
            if a != 0 && a != -(rank as i64) {
                return Err(format!("{} (axis {a})", why()));
            }
            ("PaletteGather", 0)
        }
        _ => return Err(why()),
    };
    if slots != [slot] {
        return Err(format!("{} in input slot(s) {slots:?}", why()));
    }
    Ok(op)
}

/// A copy of `m` lowered by [`lower_palette`] (tensor data is shared, so
/// the copy costs the graph's structure): what the CPU runner and the
/// reference engine plan, once per model.
pub fn lowered_copy(m: &Model) -> (Model, PaletteLowering) {
    let mut copy = m.clone();
    // Sparse weights (`graphopt prune --unstructured`) are held dense.
    copy.graph.densify_sparse_initializers();
    let r = lower_palette(&mut copy);
    (copy, r)
}

/// Rewrites, in the main graph of `m`, every reader of a palettized
/// weight into a fused node (see the module docs) and removes the decode
/// chains; adds the fused ops' functions and the domain's opset import.
/// Returns what it did; a model without palettized weights is unchanged.
pub fn lower_palette(m: &mut Model) -> PaletteLowering {
    let mut report = PaletteLowering::default();
    let g = &mut m.graph;
    let candidates: Vec<ValueId> = g
        .order()
        .iter()
        .filter_map(|&n| g.node(n).output(0))
        .collect();
    let mut used_ops: Vec<&'static str> = Vec::new();
    for w in candidates {
        let Some(c) = chain(g, w) else {
            continue;
        };
        let name = g.name(w).to_string();
        if g.is_output(w) {
            report.kept.push((name, "a graph output".into()));
            continue;
        }
        let mut readers = Vec::new();
        let mut refused = None;
        for u in g.uses(w) {
            match *u {
                Use::Capture { node } => {
                    refused = Some(format!(
                        "read inside a subgraph of {}",
                        g.node(node).qualified_op()
                    ));
                }
                Use::Input { node, .. } => {
                    if !readers.contains(&node) {
                        readers.push(node);
                    }
                }
            }
        }
        let mut ops = Vec::new();
        for &r in &readers {
            match fused_op(g, r, w, c.shape.len()) {
                Ok(op) => ops.push(op),
                Err(e) => refused = Some(e),
            }
        }
        if let Some(why) = refused {
            report.kept.push((name, why));
            continue;
        }
        if readers.is_empty() {
            continue;
        }
        for (&r, &op) in readers.iter().zip(&ops) {
            fuse(g, r, op, &c);
            if !used_ops.contains(&op) {
                used_ops.push(op);
            }
        }
        // The chain is dead now: W, then the values it was made from.
        for &n in &c.nodes {
            let outs: Vec<ValueId> = g.node(n).outputs().iter().flatten().copied().collect();
            if outs
                .iter()
                .any(|&o| !g.uses(o).is_empty() || g.is_output(o))
            {
                break;
            }
            g.remove_node(n);
            for o in outs {
                g.remove_value(o);
            }
        }
        report.weights += 1;
        report.fused += readers.len();
        report.decoded_bytes += c.shape.iter().product::<i64>().max(0) as u64 * 4;
    }
    if used_ops.is_empty() {
        return report;
    }
    let opset = m.onnx_opset().unwrap_or(18);
    for op in used_ops {
        if m.function(PALETTE_DOMAIN, op).is_none() {
            m.functions.push(function(op, opset));
        }
    }
    if m.opset(PALETTE_DOMAIN).is_none() {
        m.opset_imports.push(OpsetImport {
            domain: PALETTE_DOMAIN.into(),
            version: 1,
        });
    }
    report
}

/// Replaces reader `r` by the fused node `op`.
fn fuse(g: &mut Graph, r: NodeId, op: &str, c: &Chain) {
    let d = g.node(r).clone();
    let (cb, idx) = (Some(c.codebook), Some(c.indices));
    let mut inputs: Vec<Option<ValueId>> = match op {
        "PaletteGather" => vec![cb, idx, d.input(1)],
        _ => vec![d.input(0), cb, idx],
    };
    if matches!(op, "PaletteGemm" | "PaletteConv") {
        if let Some(b) = d.input(2) {
            inputs.push(Some(b));
        }
    }
    let mut attributes: Vec<Attribute> = d
        .attributes
        .iter()
        .filter(|a| a.name != WEIGHT_SHAPE_ATTR && a.name != GROUPS_ATTR)
        .cloned()
        .collect();
    attributes.push(Attribute::new(
        WEIGHT_SHAPE_ATTR,
        AttrValue::Ints(c.shape.clone()),
    ));
    attributes.push(Attribute::new(
        GROUPS_ATTR,
        AttrValue::Ints(vec![c.groups, -1]),
    ));
    for k in 0..d.outputs().len() {
        g.set_output(r, k, None);
    }
    let new = NewNode {
        name: d.name.clone(),
        op_type: op.to_string(),
        domain: PALETTE_DOMAIN.to_string(),
        inputs,
        outputs: d.outputs().to_vec(),
        attributes,
        doc_string: d.doc_string.clone(),
        metadata_props: d.metadata_props.clone(),
        ..NewNode::default()
    };
    g.insert_node_before(r, new)
        .expect("the reader's outputs were just released");
    g.remove_node(r);
}

fn attr_ref(name: &str, attr: &str, kind: AttrKind) -> Attribute {
    Attribute::new(
        name,
        AttrValue::Ref {
            attr: attr.into(),
            kind,
        },
    )
}

/// The function defining fused op `op`: the decode chain and the reader,
/// in the default domain at `opset`.
fn function(op: &str, opset: i64) -> Function {
    let mut b = Graph::new(op);
    fn val(b: &mut Graph, n: &str) -> ValueId {
        b.add_value(n, None).expect("fresh body")
    }
    let formals: &[&str] = match op {
        "PaletteMatMul" => &["A", "codebook", "indices"],
        "PaletteGemm" => &["A", "codebook", "indices", "C"],
        "PaletteConv" => &["X", "codebook", "indices", "B"],
        _ => &["codebook", "indices", "ids"],
    };
    let f: Vec<ValueId> = formals.iter().map(|n| val(&mut b, n)).collect();
    let v = |b: &Graph, n: &str| b.value_by_name(n).expect("formal");
    let (cb, idx) = (v(&b, "codebook"), v(&b, "indices"));
    let names = ["i", "groups", "cb2", "i2", "flat", "shape", "W", "Y"];
    let [i, groups, cb2, i2, flat, shape, w, y] = names.map(|n| val(&mut b, n));
    fn add(b: &mut Graph, node: NewNode) {
        b.add_node(node).expect("well-formed body");
    }
    add(
        &mut b,
        NewNode::new("Cast")
            .inputs(&[idx])
            .outputs(&[i])
            .attr(Attribute::new(
                "to",
                AttrValue::Int(DType::I32.to_onnx() as i64),
            )),
    );
    add(
        &mut b,
        NewNode::new("Constant").outputs(&[groups]).attr(attr_ref(
            "value_ints",
            GROUPS_ATTR,
            AttrKind::Ints,
        )),
    );
    add(
        &mut b,
        NewNode::new("Reshape")
            .inputs(&[cb, groups])
            .outputs(&[cb2]),
    );
    add(
        &mut b,
        NewNode::new("Reshape").inputs(&[i, groups]).outputs(&[i2]),
    );
    add(
        &mut b,
        NewNode::new("GatherElements")
            .inputs(&[cb2, i2])
            .outputs(&[flat])
            .attr(Attribute::new("axis", AttrValue::Int(1))),
    );
    add(
        &mut b,
        NewNode::new("Constant").outputs(&[shape]).attr(attr_ref(
            "value_ints",
            WEIGHT_SHAPE_ATTR,
            AttrKind::Ints,
        )),
    );
    add(
        &mut b,
        NewNode::new("Reshape").inputs(&[flat, shape]).outputs(&[w]),
    );
    let reader = match op {
        "PaletteMatMul" => NewNode::new("MatMul").inputs(&[f[0], w]),
        "PaletteGemm" => {
            let mut n = NewNode::new("Gemm").inputs(&[f[0], w, f[3]]);
            for (a, k) in [
                ("alpha", AttrKind::Float),
                ("beta", AttrKind::Float),
                ("transA", AttrKind::Int),
                ("transB", AttrKind::Int),
            ] {
                n = n.attr(attr_ref(a, a, k));
            }
            n
        }
        "PaletteConv" => {
            let mut n = NewNode::new("Conv").inputs(&[f[0], w, f[3]]);
            for (a, k) in [
                ("auto_pad", AttrKind::String),
                ("dilations", AttrKind::Ints),
                ("group", AttrKind::Int),
                ("kernel_shape", AttrKind::Ints),
                ("pads", AttrKind::Ints),
                ("strides", AttrKind::Ints),
            ] {
                n = n.attr(attr_ref(a, a, k));
            }
            n
        }
        _ => {
            NewNode::new("Gather")
                .inputs(&[w, f[2]])
                .attr(attr_ref("axis", "axis", AttrKind::Int))
        }
    };
    add(&mut b, reader.outputs(&[y]));
    b.inputs = f;
    b.outputs = vec![y];
    let mut attributes = vec![WEIGHT_SHAPE_ATTR.to_string(), GROUPS_ATTR.to_string()];
    let optional: &[&str] = match op {
        "PaletteGemm" => &["alpha", "beta", "transA", "transB"],
        "PaletteConv" => &[
            "auto_pad",
            "dilations",
            "group",
            "kernel_shape",
            "pads",
            "strides",
        ],
        "PaletteGather" => &["axis"],
        _ => &[],
    };
    attributes.extend(optional.iter().map(|s| s.to_string()));
    Function {
        name: op.to_string(),
        domain: PALETTE_DOMAIN.to_string(),
        overload: String::new(),
        attributes,
        attribute_defaults: Vec::new(),
        opset_imports: vec![OpsetImport {
            domain: String::new(),
            version: opset,
        }],
        doc_string: format!(
            "graphopt's CPU runtime: {} of a palettized weight, decoded per tile in the kernel",
            op.trim_start_matches("Palette")
        ),
        metadata_props: Vec::new(),
        body: b,
    }
}
