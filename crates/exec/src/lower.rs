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
//! `DEQUANT_OPS` for why), silently, unless the Conv's activations are
//! quantized too (below).
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
//! Likewise a Conv whose activations are quantized and whose weight is an
//! 8-bit DequantizeLinear of constants becomes an `IntegerConv` (float32
//! output) on exact integer sums ([`crate::cpu::qlinear`]), or, where only
//! a QuantizeLinear (or a Relu or Clip, then a QuantizeLinear whose
//! saturation makes it redundant) reads it, the standard `QLinearConv` writing
//! that QuantizeLinear's output, as onnxruntime fuses the QDQ convolutions
//! of its quantizers ([`integer_convs`]). The activations then stay 8-bit
//! from one convolution to the next.
//!
//! A float16 or bfloat16 weight (an initializer, what `--precision fp16`
//! and `bf16` write) read by a MatMul or Gemm as its `B`, directly or
//! through a Cast to float32 (what `fp16-weights` and `bf16` write before a
//! float32 product; the Cast then goes), is decoded per tile too: the
//! reader becomes `HalfMatMul(A, W)` or `HalfGemm(A, W, C?)`
//! ([`half_weights`]), whose kernel widens tiles of `W` to float32 as it
//! multiplies, where the plain node would widen all of `W` into its
//! workspace on every run (the activations `A` and `C` are still widened
//! whole, and the output rounded back once, as for any fp16 node).
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
    Tensor, Use, ValueId,
};

/// The domain of the fused nodes (internal to graphopt's CPU runtime).
pub const CODED_DOMAIN: &str = graphopt_plan::EXEC_DOMAIN;
/// The fused ops of palettes, by the reader they replace: MatMul, Gemm,
/// Conv, Gather.
const PALETTE_OPS: [Option<&str>; 4] = [
    Some("PaletteMatMul"),
    Some("PaletteGemm"),
    Some("PaletteConv"),
    Some("PaletteGather"),
];
/// The fused ops of integer weights, likewise. A Conv's integer weight is
/// left to DequantizeLinear and the plain Conv (unless its activations are
/// quantized too: [`integer_convs`]): one conv's weight is small (at most
/// 9.4 MB in ResNet-50, and it dies at its reader), and the plain Conv's
/// kernels (1×1 tiles, depthwise, output tiles) are both faster than the
/// fused kernel's im2col blocks and summed in another order, so a fused
/// Conv would neither save much nor give the same bits.
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
    INTEGER_GEMM,
    INTEGER_CONV,
    "HalfMatMul",
    "HalfGemm",
    graphopt_plan::CHAIN_OP,
    graphopt_plan::CONV_ADD,
];
/// A `DequantMatMul` whose activations are quantized too, run as an
/// integer GEMM ([`integer_matmuls`]).
pub const INTEGER_MATMUL: &str = "IntegerMatMul";
/// A `DequantGemm` whose activations are quantized too, with a bias row,
/// run as an integer GEMM ([`integer_matmuls`]).
pub const INTEGER_GEMM: &str = "IntegerGemm";
/// A Conv of quantized activations and an integer weight, run on integer
/// sums ([`integer_convs`]).
pub const INTEGER_CONV: &str = "IntegerConv";
/// The names' prefixes: the op that follows is the reader's.
pub const PALETTE_PREFIX: &str = "Palette";
pub const DEQUANT_PREFIX: &str = "Dequant";
pub const HALF_PREFIX: &str = "Half";
/// Attribute of `HalfMatMul`/`HalfGemm`: the type the weight is read as
/// (its own, or float32 where a Cast widened it before the reader).
pub const HALF_TO_ATTR: &str = "half_compute_type";
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
    /// Convs of quantized activations and integer weights run on integer
    /// sums ([`integer_convs`]): as `IntegerConv` (float output), and as
    /// `QLinearConv` (with the QuantizeLinear of their output).
    pub integer_convs: usize,
    pub qlinear_convs: usize,
    /// DequantizeLinear/QuantizeLinear pairs of one scale and zero point
    /// around a data-movement node, dropped ([`drop_moved_pairs`]).
    pub moved_pairs: usize,
    /// MatMuls and Gemms of float16/bfloat16 weights that widen them per
    /// tile ([`half_weights`]), and the float32 bytes those weights would
    /// take widened whole (once per node, on every run).
    pub half_fused: usize,
    pub half_widened_bytes: u64,
    /// Chains of elementwise nodes (float32 results) fused into one node each
    /// ([`crate::fuse_chains`]), and the nodes they replaced.
    pub chains: usize,
    pub chain_nodes: usize,
    /// Convs whose output was added to a residual, fused with the Add
    /// ([`crate::fuse_residual`]).
    pub residual_convs: usize,
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

pub(crate) fn default_domain(d: &str) -> bool {
    d.is_empty() || d == "ai.onnx"
}

/// Imports [`CODED_DOMAIN`] into `m` (version 1) unless it is already:
/// what every lowering that adds the runtime's fused ops does.
pub(crate) fn import_exec_domain(m: &mut Model) {
    if m.opset(CODED_DOMAIN).is_none() {
        m.opset_imports.push(OpsetImport {
            domain: CODED_DOMAIN.into(),
            version: 1,
        });
    }
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
    report.moved_pairs = drop_moved_pairs(g);
    (report.half_fused, report.half_widened_bytes) = half_weights(g);
    // Without VNNI the integer GEMM's portable loop is slower than the
    // float path: the MatMuls stay DequantMatMul there.
    if crate::cpu::qgemm::available() {
        report.integer_matmuls = integer_matmuls(g);
        (report.integer_convs, report.qlinear_convs) = integer_convs(g);
        // A chain kept above may have gone with an integer node (a bias's).
        report
            .kept
            .retain(|(name, _)| g.value_by_name(name).is_some());
    }
    // Before the chains, which would take the Add (and its Relu).
    report.residual_convs = crate::fuse_residual::fuse_residual(m);
    (report.chains, report.chain_nodes) = crate::fuse_chains::fuse_chains(m);
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
    import_exec_domain(m);
    report
}

/// `a` as `DequantizeLinear(xq, xs, xz?)` of uint8 activations with one
/// scale and zero point: `xq` from DynamicQuantizeLinear, or from a
/// QuantizeLinear (or QLinearConv) to uint8, `xs` and `xz` that node's
/// outputs or scalar constants; or from any other node (a Reshape of 8-bit
/// values, [`drop_moved_pairs`]) where a uint8 scalar zero point says `xq`
/// is uint8. Returns the DequantizeLinear and `[xq, xs, xz]`.
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
    let scalar = |v: ValueId, t: DType| scalar_constant(g, v).is_some_and(|c| c.dtype == t);
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
        // A QLinearConv that `integer_convs` made of an earlier Conv and
        // its QuantizeLinear.
        "QLinearConv" if default_domain(&pd.domain) && slot == 0 => {
            pd.input(7).is_some_and(|z| scalar(z, DType::U8))
                && scalar(xs, DType::F32)
                && xz.is_none_or(|z| scalar(z, DType::U8))
        }
        // Anything else (a Reshape or Transpose of uint8 values,
        // [`drop_moved_pairs`]): a uint8 zero point says `xq` is uint8.
        _ => scalar(xs, DType::F32) && xz.is_some_and(|z| scalar(z, DType::U8)),
    };
    ok.then_some((dq, [Some(xq), Some(xs), xz]))
}

/// Rewrites every default-domain MatMul and Gemm whose `B` is a 2-D
/// float16 or bfloat16 initializer `W` (not a graph input), or a Cast of
/// one to float32, into `HalfMatMul(A, W)` or `HalfGemm(A, W, C?)` (the
/// reader's attributes, [`WEIGHT_SHAPE_ATTR`], and [`HALF_TO_ATTR`]: `W`'s
/// type, or float32 after a Cast), whose kernel widens `W` tile by tile
/// ([`crate::cpu::coded`]). `W` stays an initializer for its other
/// readers; a Cast nothing else reads goes. Returns how many nodes, and the
/// float32 bytes of their weights (what the plain nodes, or the Cast, widen
/// whole on every run).
fn half_weights(g: &mut Graph) -> (usize, u64) {
    let mut fused = 0;
    let mut bytes = 0;
    for r in g.order().to_vec() {
        let d = g.node(r);
        let op = match d.op_type.as_str() {
            "MatMul" => "HalfMatMul",
            "Gemm" => "HalfGemm",
            _ => continue,
        };
        if !default_domain(&d.domain) {
            continue;
        }
        let (Some(a), Some(read)) = (d.input(0), d.input(1)) else {
            continue;
        };
        // The weight itself, or a Cast to float32 of it (what
        // `--precision fp16-weights` and `bf16` write before a float32
        // MatMul): the compute type is then float32.
        // Only where every reader of the Cast is such a product (a Cast
        // that stays would keep its f32 copy: nothing to gain).
        let only_products = |g: &Graph| {
            !g.is_output(read)
                && g.uses(read).iter().all(|u| match *u {
                    Use::Input { node, slot } => {
                        let n = g.node(node);
                        slot == 1
                            && matches!(n.op_type.as_str(), "MatMul" | "Gemm")
                            && default_domain(&n.domain)
                            && n.input(0) != Some(read)
                    }
                    Use::Capture { .. } => false,
                })
        };
        let (w, cast) = match g.producer(read) {
            Some((c, _))
                if g.node(c).op_type == "Cast"
                    && default_domain(&g.node(c).domain)
                    && g.node(c).attr_int("to") == Some(DType::F32.to_onnx() as i64)
                    && only_products(g) =>
            {
                match g.node(c).input(0) {
                    Some(w) => (w, Some(c)),
                    None => continue,
                }
            }
            _ => (read, None),
        };
        let Some(t) = g.constant(w) else {
            continue;
        };
        if !matches!(t.dtype, DType::F16 | DType::BF16) || t.dims.len() != 2 || a == read {
            continue;
        }
        let compute = if cast.is_some() { DType::F32 } else { t.dtype };
        let shape = t.dims.clone();
        let widened = shape.iter().product::<i64>().max(0) as u64 * 4;
        // Each plain reader widened its own copy; a Cast made one.
        if cast.is_none() {
            bytes += widened;
        }
        let mut inputs = vec![Some(a), Some(w)];
        if op == "HalfGemm" {
            inputs.push(d.input(2));
        }
        let mut attributes: Vec<Attribute> = d
            .attributes
            .iter()
            .filter(|a| a.name != WEIGHT_SHAPE_ATTR && a.name != HALF_TO_ATTR)
            .cloned()
            .collect();
        attributes.push(Attribute::new(WEIGHT_SHAPE_ATTR, AttrValue::Ints(shape)));
        attributes.push(Attribute::new(
            HALF_TO_ATTR,
            AttrValue::Int(compute.to_onnx() as i64),
        ));
        replace_reader(g, r, op, inputs, attributes);
        fused += 1;
        // The Cast goes once nothing reads its output.
        if let Some(c) = cast {
            if g.uses(read).is_empty() && !g.is_output(read) {
                g.remove_node(c);
                g.remove_value(read);
                bytes += widened;
            }
        }
    }
    (fused, bytes)
}

/// Makes every `DequantMatMul` (and every `DequantGemm` without transposes,
/// alpha 1, whose `C` is a row of constants added with beta 1: a float
/// constant, or a DequantizeLinear of constants, as [`constant_bias`] reads
/// it; then an `IntegerGemm` adding that row after the scale) whose
/// activations are quantized
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
        let gemm = d.op_type == "DequantGemm";
        if d.domain != CODED_DOMAIN || (d.op_type != "DequantMatMul" && !gemm) {
            continue;
        }
        // A Gemm as a MatMul plus a bias row: no transposes, alpha 1, and
        // C (if any) a vector of constants added with beta 1.
        let plain_gemm = d.attr_int("transA").unwrap_or(0) == 0
            && d.attr_int("transB").unwrap_or(0) == 0
            && d.attr_float("alpha").unwrap_or(1.0) == 1.0
            && (d.input(4).is_none() || d.attr_float("beta").unwrap_or(1.0) == 1.0);
        if gemm && !plain_gemm {
            continue;
        }
        let c = if gemm { d.input(4) } else { None };
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
        let n = qt.dims[1];
        let bias = match c {
            None => None,
            Some(c) => match constant_bias(g, c, n) {
                Some(b) => Some((c, b)),
                None => continue,
            },
        };
        let wz = d.input(3);
        let attributes: Vec<Attribute> = d
            .attributes
            .iter()
            .filter(|a| !["transA", "transB", "alpha", "beta"].contains(&a.name.as_str()))
            .cloned()
            .collect();
        let mut inputs = act.to_vec();
        inputs.extend([Some(q), Some(sc), wz]);
        let op = match &bias {
            None => INTEGER_MATMUL,
            Some((c, b)) => {
                inputs.push(Some(bias_constant(g, *c, b)));
                INTEGER_GEMM
            }
        };
        replace_reader(g, r, op, inputs, attributes);
        if g.uses(a).is_empty() && !g.is_output(a) {
            g.remove_node(dq);
            g.remove_value(a);
        }
        if let Some((c, b)) = bias {
            remove_unread(g, c, &b.nodes);
        }
        made += 1;
    }
    made
}

/// Makes every `Conv(DequantizeLinear(xq, xs, xz?), DequantizeLinear(q,
/// scale, zero_point?), B?)` with quantized activations
/// ([`quantized_activation`]), a constant int8/uint8 weight of more than one
/// input channel per group with one float32 scale or one per output
/// channel (axis 0), and a bias that is none, a float32 constant or a
/// DequantizeLinear of constants ([`constant_bias`]), a convolution on exact
/// integer sums ([`crate::cpu::qlinear`]), as onnxruntime runs the QDQ
/// convolutions of its quantizers:
///
/// - when the Conv's output is read only by `QuantizeLinear(y, ys, yz)`
///   (one constant scale and zero point), or only by a Relu or a Clip
///   read only by one that saturates wherever the Relu or Clip would clip
///   (a Relu: `yz` the lowest value of its type), the three become the standard `QLinearConv(xq, xs, xz, q,
///   scale, zero_point, ys, yz, B')` writing the QuantizeLinear's output,
///   with the bias quantized at scale `xs · scale[c]` as onnxruntime's
///   quantizers quantize it (`round_half_even(B[c] / (xs · scale[c]))` in
///   float32, int32; it needs `xs` constant; int32 constants already at
///   that scale are taken as they are). Quantizing a float bias moves the
///   sum by at most half a step of `xs · scale[c]` before the output is
///   requantized. The float32 output, the Relu's and the dequantized
///   operands are never made;
/// - otherwise it becomes `IntegerConv(xq, xs, xz?, q, scale, zero_point?,
///   B?)` of [`CODED_DOMAIN`], whose float32 output is `f32(Σ (xq −
///   xz)(q − zero_point)) · (xs · scale[c]) + B[c]`.
///
/// The activations' and the weight's DequantizeLinear go when nothing
/// else reads them. Returns how many of each were made.
fn integer_convs(g: &mut Graph) -> (usize, usize) {
    let order: Vec<NodeId> = g.order().to_vec();
    let (mut float, mut linear) = (0, 0);
    for r in order {
        if !g.is_live_node(r) {
            continue;
        }
        let d = g.node(r);
        if d.op_type != "Conv" || !default_domain(&d.domain) {
            continue;
        }
        let (Some(a), Some(w), b) = (d.input(0), d.input(1), d.input(2)) else {
            continue;
        };
        let Some((dq, act)) = quantized_activation(g, a) else {
            continue;
        };
        let Some((wn, _)) = g.producer(w) else {
            continue;
        };
        if g.node(wn).op_type != "DequantizeLinear" || !default_domain(&g.node(wn).domain) {
            continue;
        }
        let Some(Chain {
            source:
                Source::Integer {
                    q,
                    scale,
                    zero_point,
                    axis,
                    block,
                },
            nodes,
            ..
        }) = integer_chain(g, wn)
        else {
            continue;
        };
        let (Some(qt), Some(st)) = (g.constant(q), g.constant(scale)) else {
            continue;
        };
        let (m, q_type) = (qt.dims.first().copied().unwrap_or(0), qt.dtype);
        let rank = qt.dims.len() as i64;
        let per_channel = st.dims == [m] && (if axis < 0 { axis + rank } else { axis }) == 0;
        let bias = match b {
            None => None,
            Some(b) => match constant_bias(g, b, m) {
                Some(bias) => Some(bias),
                None => continue,
            },
        };
        // Convolutions of one input channel per group (depthwise, or a
        // one-channel image) stay float: their integer taps run in scalar
        // loops, slower than the float kernels' vectors.
        let depthwise = qt.dims.get(1) == Some(&1);
        let ok = matches!(qt.dtype, DType::I8 | DType::U8)
            && !depthwise
            && (3..=4).contains(&qt.dims.len())
            && nodes.len() == 1
            && st.dtype == DType::F32
            && (st.dims.iter().product::<i64>() == 1 || per_channel)
            && block == 0;
        if !ok {
            continue;
        }
        let attributes = d.attributes.clone();
        match requantized(g, r, act[1], m, scale, bias.as_ref()) {
            Some(rq) => {
                let [xq, xs, xz] = act;
                let xz = xz.unwrap_or_else(|| zero_of(g, DType::U8));
                let wz = zero_point.unwrap_or_else(|| zero_of(g, q_type));
                let inputs = vec![
                    xq,
                    xs,
                    Some(xz),
                    Some(q),
                    Some(scale),
                    Some(wz),
                    Some(rq.ys),
                    Some(rq.yz),
                    rq.bias,
                ];
                for &n in rq.nodes.iter().rev() {
                    let outs: Vec<ValueId> =
                        g.node(n).outputs().iter().flatten().copied().collect();
                    g.remove_node(n);
                    for o in outs {
                        if o != rq.out {
                            g.remove_value(o);
                        }
                    }
                }
                replace_node(
                    g,
                    r,
                    "",
                    "QLinearConv",
                    inputs,
                    attributes,
                    Some(vec![Some(rq.out)]),
                );
                linear += 1;
            }
            None => {
                let b = match (b, &bias) {
                    (Some(b), Some(bias)) => Some(bias_constant(g, b, bias)),
                    _ => b,
                };
                let mut inputs = act.to_vec();
                inputs.extend([Some(q), Some(scale), zero_point, b]);
                let mut attributes = attributes;
                attributes.push(Attribute::new(DEQUANT_AXIS_ATTR, AttrValue::Int(axis)));
                replace_node(g, r, CODED_DOMAIN, INTEGER_CONV, inputs, attributes, None);
                float += 1;
            }
        }
        for (v, n) in [(a, dq), (w, wn)] {
            if g.uses(v).is_empty() && !g.is_output(v) {
                g.remove_node(n);
                g.remove_value(v);
            }
        }
        if let (Some(b), Some(bias)) = (b, bias) {
            remove_unread(g, b, &bias.nodes);
        }
    }
    (float, linear)
}

/// A bias `b` ([`Bias`]) as one float32 constant: `b` itself where it is
/// one, else a new initializer of its values (dequantized here once).
fn bias_constant(g: &mut Graph, b: ValueId, bias: &Bias) -> ValueId {
    if bias.nodes.is_empty() {
        return b;
    }
    let raw: Vec<u8> = bias.floats.iter().flat_map(|v| v.to_le_bytes()).collect();
    let n = bias.floats.len() as i64;
    let t = Tensor::from_raw(DType::F32, vec![n], raw.into()).expect("n floats");
    let name = format!("{}_dequantized", g.name(b));
    g.add_initializer(&name, t)
}

/// Removes `nodes` (a chain, each reading the next one's output, `v`
/// the first one's) while nothing reads their outputs, and the
/// initializers they leave unread (or `v` itself, a constant nothing
/// reads now): a bias's Identity and DequantizeLinear nodes and constants
/// once the fused node reads its own.
fn remove_unread(g: &mut Graph, mut v: ValueId, nodes: &[NodeId]) {
    if nodes.is_empty() {
        drop_if_unread(g, v);
    }
    for &n in nodes {
        if !g.uses(v).is_empty() || g.is_output(v) {
            break;
        }
        let ins: Vec<ValueId> = g.node(n).inputs().iter().flatten().copied().collect();
        g.remove_node(n);
        g.remove_value(v);
        for &i in &ins {
            drop_if_unread(g, i);
        }
        match ins.first() {
            Some(&x) => v = x,
            None => break,
        }
    }
}

/// Removes initializer `v` if nothing reads it and it is neither a graph
/// input nor an output (the runtime would bind it as a weight).
fn drop_if_unread(g: &mut Graph, v: ValueId) {
    if g.is_live_value(v)
        && g.initializer(v).is_some()
        && g.uses(v).is_empty()
        && !g.is_input(v)
        && !g.is_output(v)
    {
        g.take_initializer(v);
        g.remove_value(v);
    }
}

/// A Conv's (or Gemm's) bias `[m]`: a float32 constant, or `DequantizeLinear(bq, bs,
/// bz?)` of int32 constants (what onnxruntime's QDQ quantizer writes, at
/// scale `xs · ws[c]`) or of 8-bit ones (a bias it quantized as an
/// activation, where an exporter shared it), as float32 values.
struct Bias {
    floats: Vec<f32>,
    /// The nodes from the Conv's bias back to the constant: Identity nodes,
    /// then the DequantizeLinear if any.
    nodes: Vec<NodeId>,
    /// The DequantizeLinear's integers and scales (`bq − bz`, `bs`).
    ints: Option<(Vec<i64>, Vec<f32>)>,
}

/// [`Bias`] of value `b`, if it is one (through Identity nodes, which
/// exporters leave where biases were shared).
fn constant_bias(g: &Graph, b: ValueId, m: i64) -> Option<Bias> {
    if let Some((n, _)) = g.producer(b) {
        let d = g.node(n);
        if d.op_type == "Identity" && default_domain(&d.domain) {
            let mut bias = constant_bias(g, d.input(0)?, m)?;
            bias.nodes.insert(0, n);
            return Some(bias);
        }
    }
    if let Some(t) = g.constant(b) {
        return (t.dtype == DType::F32 && t.dims == [m]).then(|| Bias {
            floats: t
                .to_f64_vec()
                .unwrap_or_default()
                .iter()
                .map(|&v| v as f32)
                .collect(),
            nodes: Vec::new(),
            ints: None,
        });
    }
    let (n, _) = g.producer(b)?;
    let d = g.node(n);
    if d.op_type != "DequantizeLinear"
        || !default_domain(&d.domain)
        || d.attr_int("block_size").unwrap_or(0) != 0
    {
        return None;
    }
    let qt = g.constant(d.input(0)?)?;
    let st = g.constant(d.input(1)?)?;
    let int32 = qt.dtype == DType::I32;
    if !matches!(qt.dtype, DType::I32 | DType::U8 | DType::I8)
        || qt.dims != [m]
        || st.dtype != DType::F32
    {
        return None;
    }
    let scales: Vec<f32> = st.to_f64_vec()?.iter().map(|&v| v as f32).collect();
    if scales.len() != 1 && scales.len() != m as usize {
        return None;
    }
    let zeros = match d.input(2) {
        None => vec![0; 1],
        Some(z) => {
            let zt = g.constant(z)?;
            if zt.dtype != qt.dtype || zt.dims != st.dims {
                return None;
            }
            zt.to_i64_vec()?
        }
    };
    let at = |v: usize, c: usize| if v == 1 { 0 } else { c };
    let q = qt.to_i64_vec()?;
    let ints: Vec<i64> = (0..m as usize)
        .map(|c| q[c] - zeros[at(zeros.len(), c)])
        .collect();
    let bs: Vec<f32> = (0..m as usize)
        .map(|c| scales[at(scales.len(), c)])
        .collect();
    // DequantizeLinear's float32: (q − z) as f32, times the scale.
    let floats = ints
        .iter()
        .zip(&bs)
        .map(|(&i, &s)| i as i32 as f32 * s)
        .collect();
    Some(Bias {
        floats,
        nodes: vec![n],
        ints: int32.then_some((ints, bs)),
    })
}

/// Nodes that only move elements (a quantized value's DequantizeLinear and
/// QuantizeLinear around them with one scale and zero point cancel).
const MOVES: &[&str] = &[
    "Flatten",
    "Identity",
    "Reshape",
    "Squeeze",
    "Transpose",
    "Unsqueeze",
];

/// Drops every `DequantizeLinear(xq, s, z)` → move → `QuantizeLinear(·, s,
/// z)` pair around a node that only moves elements ([`MOVES`]: Reshape,
/// Transpose, ...) with one scale and zero point, constants equal on
/// both sides: the move then runs on `xq` itself and writes the
/// QuantizeLinear's output, as onnxruntime drops such pairs from its QDQ
/// graphs. Exact: `round((xq − z)·s / s) + z = xq` for every 8-bit value
/// (the product's rounding is far below half a step) when the
/// DequantizeLinear's output is float32 and `s` finite and non-zero with
/// `255·s` finite, as required here. The activations
/// stay 8-bit, and two passes over them go. Returns how many.
fn drop_moved_pairs(g: &mut Graph) -> usize {
    let order: Vec<NodeId> = g.order().to_vec();
    let mut dropped = 0;
    for n in order {
        if !g.is_live_node(n) {
            continue;
        }
        let d = g.node(n);
        if !MOVES.contains(&d.op_type.as_str()) || !default_domain(&d.domain) {
            continue;
        }
        let (Some(a), Some(out)) = (d.input(0), d.output(0)) else {
            continue;
        };
        let Some((dq, _)) = g.producer(a) else {
            continue;
        };
        let Some(q) = sole_reader(g, out) else {
            continue;
        };
        let (dd, qd) = (g.node(dq), g.node(q));
        let single = sole_reader(g, a) == Some(n);
        if dd.op_type != "DequantizeLinear"
            || qd.op_type != "QuantizeLinear"
            || !default_domain(&dd.domain)
            || !default_domain(&qd.domain)
            || !single
            || dd.attr_int("block_size").unwrap_or(0) != 0
            || dd
                .attr_int("output_dtype")
                .is_some_and(|t| t != DType::F32.to_onnx() as i64)
            || qd.attr_int("block_size").unwrap_or(0) != 0
            || qd.attr_int("saturate").is_some_and(|v| v != 1)
        {
            continue;
        }
        let (Some(xq), Some(s), z) = (dd.input(0), dd.input(1), dd.input(2)) else {
            continue;
        };
        let (Some(s2), z2, Some(qo)) = (qd.input(1), qd.input(2), qd.output(0)) else {
            continue;
        };
        // One scale and zero point, equal constants on both sides, and the
        // QuantizeLinear's output of the zero point's (8-bit) type.
        let scalar = |v: ValueId| scalar_constant(g, v);
        let same = |x: ValueId, y: ValueId| {
            x == y
                || matches!((scalar(x), scalar(y)), (Some(a), Some(b)) if a.dtype == b.dtype && a.raw() == b.raw())
        };
        let zero_type = z.and_then(&scalar).map(|t| t.dtype);
        // A finite, non-zero scale whose products with 8-bit values stay
        // finite (else the float path makes NaN or saturates, and the pair
        // is not the identity).
        let usable = |t: &graphopt_ir::Tensor| {
            t.dtype == DType::F32
                && t.to_f64_vec().is_some_and(|v| {
                    let s = v[0] as f32;
                    s != 0.0 && (s.abs() * 255.0).is_finite()
                })
        };
        let ok = scalar(s).is_some_and(usable)
            && same(s, s2)
            && match (z, z2) {
                (Some(z), Some(z2)) => same(z, z2),
                _ => false,
            }
            && matches!(zero_type, Some(DType::U8 | DType::I8))
            && qd
                .attr_int("output_dtype")
                .is_none_or(|t| Some(t) == zero_type.map(|d| d.to_onnx() as i64));
        if !ok {
            continue;
        }
        g.remove_node(q);
        g.set_input(n, 0, Some(xq));
        g.set_output(n, 0, Some(qo));
        g.remove_value(out);
        g.remove_node(dq);
        g.remove_value(a);
        dropped += 1;
    }
    dropped
}

/// The node that alone reads `v` (at its first input slot), if `v` is no
/// graph output.
fn sole_reader(g: &Graph, v: ValueId) -> Option<NodeId> {
    if g.is_output(v) {
        return None;
    }
    match g.uses(v) {
        [Use::Input { node, slot: 0 }] => Some(*node),
        _ => None,
    }
}

/// `v` as a constant of one element (any shape).
fn scalar_constant(g: &Graph, v: ValueId) -> Option<&Tensor> {
    g.constant(v)
        .filter(|t| t.dims.iter().product::<i64>() == 1)
}

/// A scalar zero of type `t` (8-bit), one initializer shared by every
/// node that needs it.
fn zero_of(g: &mut Graph, t: DType) -> ValueId {
    let name = format!("graphopt_exec_zero_{}", t.name());
    if let Some(v) = g
        .value_by_name(&name)
        .filter(|&v| g.initializer(v).is_some())
    {
        return v;
    }
    let raw = vec![0u8; t.storage_bytes(1).unwrap_or(1) as usize];
    let z = Tensor::from_raw(t, vec![], raw.into()).expect("one element");
    g.add_initializer(&name, z)
}

/// What [`requantized`] found after a Conv.
struct Requantized {
    /// The Relu (if any) and the QuantizeLinear, in order.
    nodes: Vec<NodeId>,
    /// The QuantizeLinear's output, its scale and zero point.
    out: ValueId,
    ys: ValueId,
    yz: ValueId,
    /// The bias quantized at scale `xs · scale[c]`, int32.
    bias: Option<ValueId>,
}

/// Conv `r`'s output as read only by `QuantizeLinear(y, ys, yz)`, or by a
/// Relu or Clip read only by one that saturates where it clips, with
/// constant scalar `ys` and `yz` (8-bit), and the bias quantized at scale
/// `xs · scale[c]` (`xs` a constant; the scales positive, the quantized
/// bias within int32).
fn requantized(
    g: &mut Graph,
    r: NodeId,
    xs: Option<ValueId>,
    m: i64,
    scale: ValueId,
    bias: Option<&Bias>,
) -> Option<Requantized> {
    let y = g.node(r).output(0)?;
    let mut nodes = Vec::new();
    let mut n = sole_reader(g, y)?;
    // A Relu (bounds 0, ∞) or a Clip of constant bounds before the
    // QuantizeLinear.
    let bounds = |g: &Graph, n: NodeId| -> Option<(f64, f64)> {
        let d = g.node(n);
        if !default_domain(&d.domain) {
            return None;
        }
        let bound = |i: usize, none: f64| match d.input(i) {
            None => Some(none),
            Some(v) => scalar_constant(g, v)
                .filter(|t| t.dtype == DType::F32)?
                .to_f64_vec()
                .map(|v| v[0]),
        };
        match d.op_type.as_str() {
            "Relu" => Some((0.0, f64::INFINITY)),
            "Clip" if d.attr("min").is_none() && d.attr("max").is_none() => {
                Some((bound(1, f64::NEG_INFINITY)?, bound(2, f64::INFINITY)?))
            }
            _ => None,
        }
    };
    let clip = bounds(g, n);
    if clip.is_some() {
        nodes.push(n);
        n = sole_reader(g, g.node(n).output(0)?)?;
    }
    let qd = g.node(n);
    if qd.op_type != "QuantizeLinear" || !default_domain(&qd.domain) {
        return None;
    }
    let (ys, yz, out) = (qd.input(1)?, qd.input(2)?, qd.output(0)?);
    let yst = scalar_constant(g, ys).filter(|t| t.dtype == DType::F32)?;
    let yzt = scalar_constant(g, yz).filter(|t| matches!(t.dtype, DType::U8 | DType::I8))?;
    let ysv = yst.to_f64_vec()?[0];
    let yzv = yzt.to_i64_vec()?[0];
    // The Relu or Clip is the QuantizeLinear's saturation when its bounds
    // lie outside what the output can hold: a value it clips saturates
    // anyway, and it passes every other.
    let (lo, hi) = if yzt.dtype == DType::U8 {
        (0.0, 255.0)
    } else {
        (-128.0, 127.0)
    };
    let inside =
        |(min, max): (f64, f64)| min <= (lo - yzv as f64) * ysv && max >= (hi - yzv as f64) * ysv;
    if ysv.is_nan() || ysv <= 0.0 || clip.is_some_and(|c| !inside(c)) {
        return None;
    }
    if qd
        .attr_int("output_dtype")
        .is_some_and(|t| t != yzt.dtype.to_onnx() as i64)
    {
        return None;
    }
    nodes.push(n);
    let bias = match bias {
        None => None,
        Some(bias) => {
            let xs = g.constant(xs?)?.to_f64_vec()?[0] as f32;
            let sc: Vec<f32> = g
                .constant(scale)?
                .to_f64_vec()?
                .iter()
                .map(|&v| v as f32)
                .collect();
            let s = |c: usize| xs * sc[if sc.len() == 1 { 0 } else { c }];
            // Integers already at the scale QLinearConv adds them at are
            // taken as they are; anything else is quantized to it.
            let exact = bias
                .ints
                .as_ref()
                .filter(|(_, bs)| bs.iter().enumerate().all(|(c, &v)| v == s(c)));
            let mut raw = Vec::with_capacity(4 * m as usize);
            for c in 0..m as usize {
                // In float32, as onnxruntime's quantizers divide.
                let qb = match exact {
                    Some((ints, _)) => ints[c] as f64,
                    None => (bias.floats[c] / s(c)).round_ties_even() as f64,
                };
                let sc = s(c);
                if sc.is_nan() || sc <= 0.0 || qb.is_nan() || qb.abs() >= i32::MAX as f64 {
                    return None;
                }
                raw.extend_from_slice(&(qb as i32).to_le_bytes());
            }
            let t = Tensor::from_raw(DType::I32, vec![m], raw.into()).ok()?;
            Some(g.add_initializer("conv_bias_quantized", t))
        }
    };
    Some(Requantized {
        nodes,
        out,
        ys,
        yz,
        bias,
    })
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
    inputs: Vec<Option<ValueId>>,
    attributes: Vec<Attribute>,
) {
    replace_node(g, r, CODED_DOMAIN, op, inputs, attributes, None);
}

/// Replaces node `r` by a node `op` of `domain` with `inputs` (trailing
/// empty slots dropped), `attributes` and `outputs` (`r`'s if `None`), and
/// `r`'s name, doc string and metadata. `r`'s outputs that the new node
/// does not write are removed.
pub(crate) fn replace_node(
    g: &mut Graph,
    r: NodeId,
    domain: &str,
    op: &str,
    mut inputs: Vec<Option<ValueId>>,
    attributes: Vec<Attribute>,
    outputs: Option<Vec<Option<ValueId>>>,
) {
    let d = g.node(r).clone();
    while inputs.last() == Some(&None) {
        inputs.pop();
    }
    for k in 0..d.outputs().len() {
        g.set_output(r, k, None);
    }
    let outputs = outputs.unwrap_or_else(|| d.outputs().to_vec());
    let new = NewNode {
        name: d.name.clone(),
        op_type: op.to_string(),
        domain: domain.to_string(),
        inputs,
        outputs: outputs.clone(),
        attributes,
        doc_string: d.doc_string.clone(),
        metadata_props: d.metadata_props.clone(),
        ..NewNode::default()
    };
    g.insert_node_before(r, new)
        .expect("the reader's outputs were just released");
    g.remove_node(r);
    for o in d.outputs().iter().flatten() {
        if !outputs.contains(&Some(*o)) {
            g.remove_value(*o);
        }
    }
}

/// A Conv's attributes, which the fused Conv nodes' functions pass on.
pub(crate) const CONV_ATTRS: &[(&str, AttrKind)] = &[
    ("auto_pad", AttrKind::String),
    ("dilations", AttrKind::Ints),
    ("group", AttrKind::Int),
    ("kernel_shape", AttrKind::Ints),
    ("pads", AttrKind::Ints),
    ("strides", AttrKind::Ints),
];

pub(crate) fn attr_ref(name: &str, attr: &str, kind: AttrKind) -> Attribute {
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
    if op == INTEGER_MATMUL || op == INTEGER_GEMM || op == INTEGER_CONV {
        return integer_function(op, opset);
    }
    let palette = op.starts_with(PALETTE_PREFIX);
    let half = op.starts_with(HALF_PREFIX);
    let reader = op
        .trim_start_matches(PALETTE_PREFIX)
        .trim_start_matches(DEQUANT_PREFIX)
        .trim_start_matches(HALF_PREFIX);
    let data: &[&str] = if palette {
        &["codebook", "indices"]
    } else if half {
        // The weight itself: the reader's own meaning, no decode chain.
        &["W"]
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
    let y = val(&mut b, "Y");
    let w = if half {
        // W read as the compute type: an identity Cast, or float16/bfloat16
        // widened to float32 (exact either way).
        let (stored, w) = (v(&b, "W"), val(&mut b, "W_compute"));
        add(
            &mut b,
            NewNode::new("Cast")
                .inputs(&[stored])
                .outputs(&[w])
                .attr(attr_ref("to", HALF_TO_ATTR, AttrKind::Int)),
        );
        w
    } else {
        val(&mut b, "W")
    };
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
    } else if !half {
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
        "Conv" => (NewNode::new("Conv").inputs(&[first, w, last]), CONV_ATTRS),
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
    } else if half {
        attributes.push(HALF_TO_ATTR.to_string());
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
            if palette {
                "palettized"
            } else if half {
                "float16/bfloat16"
            } else {
                "quantized"
            }
        ),
        metadata_props: Vec::new(),
        body: b,
    }
}

/// The function of [`INTEGER_MATMUL`], [`INTEGER_GEMM`] or
/// [`INTEGER_CONV`]: both operands dequantized, then MatMul (and the bias
/// added), or Conv with its bias.
fn integer_function(op: &str, opset: i64) -> Function {
    let conv = op == INTEGER_CONV;
    let gemm = op == INTEGER_GEMM;
    let mut b = Graph::new(op);
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
    let passed: &[(&str, AttrKind)] = if conv { CONV_ATTRS } else { &[] };
    let bias = (conv || gemm).then(|| b.add_value("B", None).expect("fresh body"));
    // The MatMul's product before its bias (IntegerGemm), else Y.
    let product = if gemm {
        b.add_value("P", None).expect("fresh body")
    } else {
        y
    };
    let reader = match bias {
        Some(bias) if conv => NewNode::new("Conv").inputs(&[a, w, bias]),
        _ => NewNode::new("MatMul").inputs(&[a, w]),
    };
    let reader = passed
        .iter()
        .fold(reader, |n, &(at, k)| n.attr(attr_ref(at, at, k)));
    let add = bias
        .filter(|_| gemm)
        .map(|bias| NewNode::new("Add").inputs(&[product, bias]).outputs(&[y]));
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
        reader.outputs(&[product]),
    ]
    .into_iter()
    .chain(add)
    {
        b.add_node(node).expect("well-formed body");
    }
    b.inputs = vec![xq, xs, xz, q, sc, zp];
    b.inputs.extend(bias);
    b.outputs = vec![y];
    let mut attributes = vec![DEQUANT_AXIS_ATTR.to_string()];
    if !conv {
        attributes.extend([
            WEIGHT_SHAPE_ATTR.to_string(),
            DEQUANT_BLOCK_ATTR.to_string(),
        ]);
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
            "graphopt's CPU runtime: {} of quantized activations and an integer weight, on \
             exact integer sums",
            if conv {
                "Conv"
            } else if gemm {
                "MatMul plus a bias row"
            } else {
                "MatMul"
            }
        ),
        metadata_props: Vec::new(),
        body: b,
    }
}
