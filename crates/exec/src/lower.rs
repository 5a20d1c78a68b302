//! Lowering a model for the CPU backend before it is planned: coded
//! weights (palettes, issue 23; integers with scales, issue 20) decoded per
//! tile inside the kernels that read them.
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
//! An integer weight is what `--quantize` writes (and onnxruntime's
//! quantizers): `W = DequantizeLinear(q, scale, zero_point?)` with constant
//! int8/uint8/int4/uint4 `q`, per-tensor, per-axis or blocked scales, the
//! scale a constant or a `Cast` to float32 of a float16/bfloat16 constant.
//!
//! Run as written, the arena holds the decoded float32 weight (and, for a
//! palette, the int32 indices). [`lower_coded`] rewrites each reader of `W`
//! into a node of domain [`CODED_DOMAIN`] that reads the stored data
//! itself, and removes the chain:
//!
//! | reader                    | fused node                                  |
//! |---------------------------|---------------------------------------------|
//! | `MatMul(A, W)`, `W` 2-D   | `PaletteMatMul(A, codebook, indices)`       |
//! | `Gemm(A, W, C?)`          | `PaletteGemm(A, codebook, indices, C?)`     |
//! | `Conv(X, W, B?)`          | `PaletteConv(X, codebook, indices, B?)`     |
//! | `Gather(W, ids)`, axis 0  | `PaletteGather(codebook, indices, ids)`     |
//!
//! and for an integer weight the same readers except Conv: `DequantMatMul(A,
//! q, scale, zero_point?)`, `DequantGemm(A, q, scale, zero_point?, C?)` and
//! `DequantGather(q, scale, zero_point?, ids)` (an absent zero point is an
//! empty slot). An integer weight read by a Conv keeps its chain (see
//! `DEQUANT_OPS` for why), silently.
//!
//! The fused node keeps the reader's name, outputs and attributes, and adds
//! `palette_weight_shape` (`S`), and `palette_groups` (`[ng, -1]`, `ng = 1`
//! per tensor) or `dequant_axis` and `dequant_block_size` (0: not
//! blocked). The kernels are in [`crate::cpu::coded`].
//!
//! Then a `DequantMatMul` whose `A` is itself dequantized uint8 (what
//! `--quantize dynamic` and `static` write before a weight's MatMul:
//! `DequantizeLinear(DynamicQuantizeLinear(x))`, or of a QuantizeLinear)
//! and whose weight is 8-bit with per-tensor or per-column float32 scales
//! becomes `IntegerMatMul(xq, xs, xz?, q, scale, zero_point?)`, an integer
//! GEMM ([`crate::cpu::qgemm`]), on CPUs with AVX-512 VNNI (elsewhere the
//! float path is faster and stays); the activations' DequantizeLinear goes
//! when nothing else reads it ([`integer_matmuls`]).
//!
//! How the planner sees it: shape inference has no rule for a custom
//! domain, but it types a call to a model-local function by inferring its
//! body. So the lowering also adds one function per fused op, whose body is
//! the op's exact ONNX meaning (Cast, Reshape of codebook and indices to
//! `[ng, -1]`, GatherElements, Reshape to `S`; or Cast of the scale and
//! DequantizeLinear; then the reader, attributes passed by reference):
//! `plan_model` infers the fused node's output at the bound dims like any
//! other node, and plans one tensor for it and none for the chain. The IR
//! and the planner know nothing of coded weights; the lowered model is
//! still a valid ONNX model (a runtime without the kernels could inline the
//! functions).
//!
//! A weight is fused only when the codebook, the indices (and the shape),
//! or `q`, the scale and the zero point, are initializers that are not
//! graph inputs, `W` is no graph output and every reader of `W` is one of
//! the table's (reading it only in that slot); otherwise its chain is left
//! to the plain nodes and [`CodedLowering::kept`] says why. Only the main graph is lowered
//! (If/Loop bodies run as written). Apply this to a copy of the model, and
//! only for the CPU backend: the CUDA backend has no kernels for these ops
//! and runs the chain as written.

use graphopt_ir::{
    AttrKind, AttrValue, Attribute, DType, Function, Graph, Model, NewNode, NodeId, OpsetImport,
    Use, ValueId,
};

/// The domain of the fused nodes (internal to graphopt's CPU runtime).
pub const CODED_DOMAIN: &str = "graphopt.exec";
/// The fused ops of palettes, by the reader they replace: MatMul, Gemm,
/// Conv, Gather.
const PALETTE_OPS: [Option<&str>; 4] = [
    Some("PaletteMatMul"),
    Some("PaletteGemm"),
    Some("PaletteConv"),
    Some("PaletteGather"),
];
/// The fused ops of integer weights, likewise. A Conv's integer weight is
/// left to DequantizeLinear and the plain Conv: one conv's weight is small
/// (at most 9.4 MB in ResNet-50, and it dies at its reader), and the
/// plain Conv's kernels (1×1 tiles, depthwise, output tiles) are both
/// faster than the fused kernel's im2col blocks and summed in another
/// order, so a fused Conv would neither save much nor give the same bits.
const DEQUANT_OPS: [Option<&str>; 4] = [
    Some("DequantMatMul"),
    Some("DequantGemm"),
    None,
    Some("DequantGather"),
];
/// Every fused op.
pub const CODED_OPS: &[&str] = &[
    "PaletteMatMul",
    "PaletteGemm",
    "PaletteConv",
    "PaletteGather",
    "DequantMatMul",
    "DequantGemm",
    "DequantGather",
    INTEGER_MATMUL,
];
/// A `DequantMatMul` whose activations are quantized too, run as an
/// integer GEMM ([`integer_matmuls`]).
pub const INTEGER_MATMUL: &str = "IntegerMatMul";
/// The names' prefixes: the op that follows is the reader's.
pub const PALETTE_PREFIX: &str = "Palette";
pub const DEQUANT_PREFIX: &str = "Dequant";
/// Attribute: the decoded weight's shape `S`.
pub const WEIGHT_SHAPE_ATTR: &str = "palette_weight_shape";
/// Attribute: `[ng, -1]`, codebooks and indices as rows of groups.
pub const GROUPS_ATTR: &str = "palette_groups";
/// Attribute: DequantizeLinear's `axis` (the reader may have its own).
pub const DEQUANT_AXIS_ATTR: &str = "dequant_axis";
/// Attribute: DequantizeLinear's `block_size` (0: not blocked).
pub const DEQUANT_BLOCK_ATTR: &str = "dequant_block_size";

/// What [`lower_coded`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodedLowering {
    /// Palettized weights whose decode chain was removed.
    pub weights: usize,
    /// Fused nodes made (one per reader of those weights).
    pub fused: usize,
    /// Bytes of the float32 weights no longer decoded whole (4 per
    /// element), the int32 indices aside (4 more per element).
    pub decoded_bytes: u64,
    /// Integer weights (DequantizeLinear of constants) whose chain was
    /// removed.
    pub integer_weights: usize,
    /// Fused nodes made for them.
    pub integer_fused: usize,
    /// Bytes of their float32 weights no longer decoded whole.
    pub integer_decoded_bytes: u64,
    /// MatMuls of quantized activations and integer weights made integer
    /// GEMMs ([`integer_matmuls`]).
    pub integer_matmuls: usize,
    /// Coded weights left to the plain nodes, and why.
    pub kept: Vec<(String, String)>,
}

/// What a decode chain reads.
enum Source {
    Palette {
        codebook: ValueId,
        indices: ValueId,
        groups: i64,
    },
    Integer {
        q: ValueId,
        /// A float32, float16 or bfloat16 constant (a Cast's input).
        scale: ValueId,
        zero_point: Option<ValueId>,
        axis: i64,
        block: i64,
    },
}

/// A decode chain found in the graph.
struct Chain {
    source: Source,
    /// `S`.
    shape: Vec<i64>,
    /// The chain's nodes, its last (the one making `W`) first.
    nodes: Vec<NodeId>,
}

impl Chain {
    /// The fused ops, in [`PALETTE_OPS`]' order.
    fn ops(&self) -> &'static [Option<&'static str>; 4] {
        match self.source {
            Source::Palette { .. } => &PALETTE_OPS,
            Source::Integer { .. } => &DEQUANT_OPS,
        }
    }
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
/// codebook and indices, or a DequantizeLinear of constants
/// ([`integer_chain`]).
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
                source: Source::Palette {
                    codebook: cb,
                    indices: idx,
                    groups: 1,
                },
                shape,
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
                source: Source::Palette {
                    codebook: cb,
                    indices: idx,
                    groups: cbt.dims[0],
                },
                shape,
                nodes: vec![n, ge, cast],
            })
        }
        "DequantizeLinear" => integer_chain(g, n),
        _ => None,
    }
}

/// The chain of `DequantizeLinear` node `n`, if its `q`, scale (or the
/// float16/bfloat16 constant a Cast makes it of) and zero point are
/// constants of a layout the kernels read.
fn integer_chain(g: &Graph, n: NodeId) -> Option<Chain> {
    let d = g.node(n);
    let q = d.input(0)?;
    let qt = g.constant(q)?;
    if !matches!(qt.dtype, DType::I8 | DType::U8 | DType::I4 | DType::U4) {
        return None;
    }
    let mut nodes = vec![n];
    let mut scale = d.input(1)?;
    let st = match g.constant(scale) {
        Some(t) if t.dtype == DType::F32 => t,
        Some(_) => return None,
        None => {
            let (c, _) = g.producer(scale)?;
            let cd = g.node(c);
            if cd.op_type != "Cast"
                || !default_domain(&cd.domain)
                || cd.attr_int("to") != Some(DType::F32.to_onnx() as i64)
            {
                return None;
            }
            scale = cd.input(0)?;
            nodes.push(c);
            let t = g.constant(scale)?;
            if !matches!(t.dtype, DType::F16 | DType::BF16 | DType::F32) {
                return None;
            }
            t
        }
    };
    let zero_point = d.input(2);
    if let Some(z) = zero_point {
        let zt = g.constant(z)?;
        if zt.dtype != qt.dtype || zt.dims != st.dims {
            return None;
        }
    }
    let axis = d.attr_int("axis").unwrap_or(1);
    let block = d.attr_int("block_size").unwrap_or(0);
    // The layout the kernel takes (a node it would refuse stays plain,
    // where DequantizeLinear's kernel says why).
    let dims: Vec<usize> = qt.dims.iter().map(|&x| x.max(0) as usize).collect();
    let sdims: Vec<usize> = st.dims.iter().map(|&x| x.max(0) as usize).collect();
    if block < 0 {
        return None;
    }
    crate::cpu::quant::scale_axis(&dims, &sdims, axis, block as usize, "").ok()?;
    Some(Chain {
        source: Source::Integer {
            q,
            scale,
            zero_point,
            axis,
            block,
        },
        shape: qt.dims.clone(),
        nodes,
    })
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
fn fused_op(g: &Graph, n: NodeId, w: ValueId, c: &Chain) -> Result<&'static str, String> {
    let rank = c.shape.len();
    let ops = c.ops();
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
        "MatMul" if rank == 2 => (ops[0], 1),
        "Gemm" if rank == 2 => (ops[1], 1),
        "Conv" if rank == 3 || rank == 4 => (ops[2], 1),
        "Gather" if rank >= 1 => {
            let a = d.attr_int("axis").unwrap_or(0);
            if a != 0 && a != -(rank as i64) {
                return Err(format!("{} (axis {a})", why()));
            }
            (ops[3], 0)
        }
        _ => return Err(why()),
    };
    if slots != [slot] {
        return Err(format!("{} in input slot(s) {slots:?}", why()));
    }
    op.ok_or_else(why)
}

/// A copy of `m` lowered by [`lower_coded`] (tensor data is shared, so
/// the copy costs the graph's structure): what the CPU runner and the
/// reference engine plan, once per model.
pub fn lowered_copy(m: &Model) -> (Model, CodedLowering) {
    let mut copy = m.clone();
    // Sparse weights (`graphopt prune --unstructured`) are held dense.
    copy.graph.densify_sparse_initializers();
    let r = lower_coded(&mut copy);
    (copy, r)
}

/// Rewrites, in the main graph of `m`, every reader of a palettized or
/// integer weight into a fused node (see the module docs) and removes the decode
/// chains; adds the fused ops' functions and the domain's opset import.
/// Returns what it did; a model without coded weights is unchanged.
pub fn lower_coded(m: &mut Model) -> CodedLowering {
    let mut report = CodedLowering::default();
    let g = &mut m.graph;
    let candidates: Vec<ValueId> = g
        .order()
        .iter()
        .filter_map(|&n| g.node(n).output(0))
        .collect();
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
        // An integer weight read by a Conv stays as written (DEQUANT_OPS).
        let conv = |&r: &NodeId| g.node(r).op_type == "Conv" && default_domain(&g.node(r).domain);
        if matches!(c.source, Source::Integer { .. }) && readers.iter().any(conv) {
            continue;
        }
        let mut ops = Vec::new();
        for &r in &readers {
            match fused_op(g, r, w, &c) {
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
        let bytes = c.shape.iter().product::<i64>().max(0) as u64 * 4;
        match c.source {
            Source::Palette { .. } => {
                report.weights += 1;
                report.fused += readers.len();
                report.decoded_bytes += bytes;
            }
            Source::Integer { .. } => {
                report.integer_weights += 1;
                report.integer_fused += readers.len();
                report.integer_decoded_bytes += bytes;
            }
        }
    }
    // Without VNNI the integer GEMM's portable loop is slower than the
    // float path: the MatMuls stay DequantMatMul there.
    if crate::cpu::qgemm::available() {
        report.integer_matmuls = integer_matmuls(g);
    }
    // The fused ops the graph holds now (a DequantMatMul may have become an
    // IntegerMatMul).
    let g = &m.graph;
    let used_ops: Vec<&str> = CODED_OPS
        .iter()
        .copied()
        .filter(|op| {
            g.nodes()
                .any(|n| g.node(n).domain == CODED_DOMAIN && g.node(n).op_type == *op)
        })
        .collect();
    if used_ops.is_empty() {
        return report;
    }
    let opset = m.onnx_opset().unwrap_or(18);
    for op in used_ops {
        if m.function(CODED_DOMAIN, op).is_none() {
            m.functions.push(function(op, opset));
        }
    }
    if m.opset(CODED_DOMAIN).is_none() {
        m.opset_imports.push(OpsetImport {
            domain: CODED_DOMAIN.into(),
            version: 1,
        });
    }
    report
}

/// `a` as `DequantizeLinear(xq, xs, xz?)` of uint8 activations with one
/// scale and zero point: `xq` from DynamicQuantizeLinear, or from a
/// QuantizeLinear to uint8; `xs` and `xz` that node's outputs or scalar
/// constants. Returns the DequantizeLinear and `[xq, xs, xz]`.
fn quantized_activation(g: &Graph, a: ValueId) -> Option<(NodeId, [Option<ValueId>; 3])> {
    let (dq, _) = g.producer(a)?;
    let d = g.node(dq);
    if d.op_type != "DequantizeLinear" || !default_domain(&d.domain) {
        return None;
    }
    let (xq, xs, xz) = (d.input(0)?, d.input(1)?, d.input(2));
    let (p, slot) = g.producer(xq)?;
    let pd = g.node(p);
    let from = |v: ValueId, k: u32| g.producer(v) == Some((p, k));
    let scalar = |v: ValueId, t: DType| {
        g.constant(v)
            .is_some_and(|c| c.dtype == t && c.dims.iter().product::<i64>() == 1)
    };
    let ok = match pd.op_type.as_str() {
        "DynamicQuantizeLinear" if default_domain(&pd.domain) && slot == 0 => {
            (from(xs, 1) || scalar(xs, DType::F32))
                && xz.is_none_or(|z| from(z, 2) || scalar(z, DType::U8))
        }
        "QuantizeLinear" if default_domain(&pd.domain) && slot == 0 => {
            // uint8 output: the zero point's type, or opset 21's
            // output_dtype, uint8 by default.
            let u8_out = DType::U8.to_onnx() as i64;
            pd.attr_int("output_dtype").is_none_or(|t| t == u8_out)
                && pd.input(2).is_none_or(|z| scalar(z, DType::U8))
                && scalar(xs, DType::F32)
                && xz.is_none_or(|z| scalar(z, DType::U8))
        }
        _ => false,
    };
    ok.then_some((dq, [Some(xq), Some(xs), xz]))
}

/// Makes every `DequantMatMul` whose activations are quantized
/// ([`quantized_activation`]) and whose weight is int8/uint8 with
/// per-tensor or per-column float32 scales an `IntegerMatMul(xq, xs, xz?,
/// q, scale, zero_point?)`: an integer GEMM (`crate::cpu::qgemm`) that
/// sums `(xq − xz)(q − zero_point)` exactly and scales once, as
/// onnxruntime's MatMulInteger kernels do, instead of dequantizing both
/// operands. The activations' DequantizeLinear goes when nothing else
/// reads it (its float32 output is then never made). Returns how many.
fn integer_matmuls(g: &mut Graph) -> usize {
    let order: Vec<NodeId> = g.order().to_vec();
    let mut made = 0;
    for r in order {
        let d = g.node(r);
        if d.domain != CODED_DOMAIN || d.op_type != "DequantMatMul" {
            continue;
        }
        let (Some(a), Some(q), Some(sc)) = (d.input(0), d.input(1), d.input(2)) else {
            continue;
        };
        let Some((dq, act)) = quantized_activation(g, a) else {
            continue;
        };
        let (Some(qt), Some(st)) = (g.constant(q), g.constant(sc)) else {
            continue;
        };
        let per_column = st.dims.len() == 1
            && qt.dims.len() == 2
            && st.dims[0] == qt.dims[1]
            && matches!(d.attr_int(DEQUANT_AXIS_ATTR), Some(1) | Some(-1) | None);
        let ok = matches!(qt.dtype, DType::I8 | DType::U8)
            && qt.dims.len() == 2
            && st.dtype == DType::F32
            && (st.dims.iter().product::<i64>() == 1 || per_column)
            && d.attr_int(DEQUANT_BLOCK_ATTR).unwrap_or(0) == 0;
        if !ok {
            continue;
        }
        let mut inputs = act.to_vec();
        inputs.extend([Some(q), Some(sc), d.input(3)]);
        let attributes = d.attributes.clone();
        replace_reader(g, r, INTEGER_MATMUL, inputs, attributes);
        if g.uses(a).is_empty() && !g.is_output(a) {
            g.remove_node(dq);
            g.remove_value(a);
        }
        made += 1;
    }
    made
}

/// Replaces reader `r` by the fused node `op`.
fn fuse(g: &mut Graph, r: NodeId, op: &str, c: &Chain) {
    let d = g.node(r).clone();
    let ours = [
        WEIGHT_SHAPE_ATTR,
        GROUPS_ATTR,
        DEQUANT_AXIS_ATTR,
        DEQUANT_BLOCK_ATTR,
    ];
    let mut attributes: Vec<Attribute> = d
        .attributes
        .iter()
        .filter(|a| !ours.contains(&a.name.as_str()))
        .cloned()
        .collect();
    attributes.push(Attribute::new(
        WEIGHT_SHAPE_ATTR,
        AttrValue::Ints(c.shape.clone()),
    ));
    // The weight's data slots, and the attributes that read them.
    let data: Vec<Option<ValueId>> = match c.source {
        Source::Palette {
            codebook,
            indices,
            groups,
        } => {
            attributes.push(Attribute::new(
                GROUPS_ATTR,
                AttrValue::Ints(vec![groups, -1]),
            ));
            vec![Some(codebook), Some(indices)]
        }
        Source::Integer {
            q,
            scale,
            zero_point,
            axis,
            block,
        } => {
            attributes.push(Attribute::new(DEQUANT_AXIS_ATTR, AttrValue::Int(axis)));
            attributes.push(Attribute::new(DEQUANT_BLOCK_ATTR, AttrValue::Int(block)));
            vec![Some(q), Some(scale), zero_point]
        }
    };
    let gather = op.ends_with("Gather");
    let mut inputs: Vec<Option<ValueId>> = if gather { vec![] } else { vec![d.input(0)] };
    inputs.extend(data);
    // What followed the weight: Gather's ids, Gemm's C or Conv's B.
    let rest = if gather { d.input(1) } else { d.input(2) };
    if rest.is_some() {
        inputs.push(rest);
    }
    replace_reader(g, r, op, inputs, attributes);
}

/// Replaces node `r` by a node `op` of [`CODED_DOMAIN`] with `inputs`
/// (trailing empty slots dropped) and `attributes`, and `r`'s name,
/// outputs, doc string and metadata.
fn replace_reader(
    g: &mut Graph,
    r: NodeId,
    op: &str,
    mut inputs: Vec<Option<ValueId>>,
    attributes: Vec<Attribute>,
) {
    let d = g.node(r).clone();
    while inputs.last() == Some(&None) {
        inputs.pop();
    }
    for k in 0..d.outputs().len() {
        g.set_output(r, k, None);
    }
    let new = NewNode {
        name: d.name.clone(),
        op_type: op.to_string(),
        domain: CODED_DOMAIN.to_string(),
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
    fn add(b: &mut Graph, node: NewNode) {
        b.add_node(node).expect("well-formed body");
    }
    if op == INTEGER_MATMUL {
        return integer_matmul_function(opset);
    }
    let palette = op.starts_with(PALETTE_PREFIX);
    let reader = op
        .trim_start_matches(PALETTE_PREFIX)
        .trim_start_matches(DEQUANT_PREFIX);
    let data: &[&str] = if palette {
        &["codebook", "indices"]
    } else {
        &["q", "scale", "zero_point"]
    };
    // The reader's inputs, the weight's data in its slot.
    let mut formals: Vec<&str> = match reader {
        "Gather" => vec![],
        "Conv" => vec!["X"],
        _ => vec!["A"],
    };
    formals.extend(data);
    formals.push(match reader {
        "Gather" => "ids",
        "Gemm" => "C",
        "Conv" => "B",
        _ => "",
    });
    formals.retain(|n| !n.is_empty());
    let f: Vec<ValueId> = formals.iter().map(|n| val(&mut b, n)).collect();
    let v = |b: &Graph, n: &str| b.value_by_name(n).expect("formal");
    let [w, y] = ["W", "Y"].map(|n| val(&mut b, n));
    if palette {
        let (cb, idx) = (v(&b, "codebook"), v(&b, "indices"));
        let names = ["i", "groups", "cb2", "i2", "flat", "shape"];
        let [i, groups, cb2, i2, flat, shape] = names.map(|n| val(&mut b, n));
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
    } else {
        let (q, sc, zp) = (v(&b, "q"), v(&b, "scale"), v(&b, "zero_point"));
        let s32 = val(&mut b, "scale_f32");
        add(
            &mut b,
            NewNode::new("Cast")
                .inputs(&[sc])
                .outputs(&[s32])
                .attr(Attribute::new(
                    "to",
                    AttrValue::Int(DType::F32.to_onnx() as i64),
                )),
        );
        add(
            &mut b,
            NewNode::new("DequantizeLinear")
                .inputs(&[q, s32, zp])
                .outputs(&[w])
                .attr(attr_ref("axis", DEQUANT_AXIS_ATTR, AttrKind::Int))
                .attr(attr_ref("block_size", DEQUANT_BLOCK_ATTR, AttrKind::Int)),
        );
    }
    let first = v(&b, formals[0]);
    let last = v(&b, formals[formals.len() - 1]);
    let (node, passed): (NewNode, &[(&str, AttrKind)]) = match reader {
        "MatMul" => (NewNode::new("MatMul").inputs(&[first, w]), &[]),
        "Gemm" => (
            NewNode::new("Gemm").inputs(&[first, w, last]),
            &[
                ("alpha", AttrKind::Float),
                ("beta", AttrKind::Float),
                ("transA", AttrKind::Int),
                ("transB", AttrKind::Int),
            ],
        ),
        "Conv" => (
            NewNode::new("Conv").inputs(&[first, w, last]),
            &[
                ("auto_pad", AttrKind::String),
                ("dilations", AttrKind::Ints),
                ("group", AttrKind::Int),
                ("kernel_shape", AttrKind::Ints),
                ("pads", AttrKind::Ints),
                ("strides", AttrKind::Ints),
            ],
        ),
        _ => (
            NewNode::new("Gather").inputs(&[w, last]),
            &[("axis", AttrKind::Int)],
        ),
    };
    let node = passed
        .iter()
        .fold(node, |n, &(a, k)| n.attr(attr_ref(a, a, k)));
    add(&mut b, node.outputs(&[y]));
    b.inputs = f;
    b.outputs = vec![y];
    let mut attributes = vec![WEIGHT_SHAPE_ATTR.to_string()];
    if palette {
        attributes.push(GROUPS_ATTR.to_string());
    } else {
        attributes.push(DEQUANT_AXIS_ATTR.to_string());
        attributes.push(DEQUANT_BLOCK_ATTR.to_string());
    }
    attributes.extend(passed.iter().map(|(a, _)| a.to_string()));
    Function {
        name: op.to_string(),
        domain: CODED_DOMAIN.to_string(),
        overload: String::new(),
        attributes,
        attribute_defaults: Vec::new(),
        opset_imports: vec![OpsetImport {
            domain: String::new(),
            version: opset,
        }],
        doc_string: format!(
            "graphopt's CPU runtime: {reader} of a {} weight, decoded per tile in the kernel",
            if palette { "palettized" } else { "quantized" }
        ),
        metadata_props: Vec::new(),
        body: b,
    }
}

/// [`INTEGER_MATMUL`]'s function: both operands dequantized, then MatMul.
fn integer_matmul_function(opset: i64) -> Function {
    let mut b = Graph::new(INTEGER_MATMUL);
    let names = [
        "xq",
        "xs",
        "xz",
        "q",
        "scale",
        "zero_point",
        "A",
        "scale_f32",
        "W",
        "Y",
    ];
    let [xq, xs, xz, q, sc, zp, a, s32, w, y] =
        names.map(|n| b.add_value(n, None).expect("fresh body"));
    for node in [
        NewNode::new("DequantizeLinear")
            .inputs(&[xq, xs, xz])
            .outputs(&[a]),
        NewNode::new("Cast")
            .inputs(&[sc])
            .outputs(&[s32])
            .attr(Attribute::new(
                "to",
                AttrValue::Int(DType::F32.to_onnx() as i64),
            )),
        NewNode::new("DequantizeLinear")
            .inputs(&[q, s32, zp])
            .outputs(&[w])
            .attr(attr_ref("axis", DEQUANT_AXIS_ATTR, AttrKind::Int)),
        NewNode::new("MatMul").inputs(&[a, w]).outputs(&[y]),
    ] {
        b.add_node(node).expect("well-formed body");
    }
    b.inputs = vec![xq, xs, xz, q, sc, zp];
    b.outputs = vec![y];
    Function {
        name: INTEGER_MATMUL.to_string(),
        domain: CODED_DOMAIN.to_string(),
        overload: String::new(),
        attributes: vec![
            WEIGHT_SHAPE_ATTR.to_string(),
            DEQUANT_AXIS_ATTR.to_string(),
            DEQUANT_BLOCK_ATTR.to_string(),
        ],
        attribute_defaults: Vec::new(),
        opset_imports: vec![OpsetImport {
            domain: String::new(),
            version: opset,
        }],
        doc_string: "graphopt's CPU runtime: MatMul of quantized activations and an integer \
                     weight, as an integer GEMM"
            .into(),
        metadata_props: Vec::new(),
        body: b,
    }
}
