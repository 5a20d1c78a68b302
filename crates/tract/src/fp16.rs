//! The fp16 emulation that validation and the tests share: how graphopt runs
//! an fp16 model in tract so that it computes as onnxruntime's CPU provider
//! and GPU GEMMs do.

use graphopt_ir::{DType, Model};

/// The model as validation runs it in tract: every node computing in
/// fp16 runs its arithmetic in fp32 between Casts (inputs up, outputs back
/// to fp16), which is how onnxruntime's CPU provider runs fp16 ops (it has
/// few fp16 kernels) and how fp16 GEMMs accumulate on GPUs. Values stay
/// rounded to fp16 between ops, so overflow and rounding show as they
/// would; and tract runs its fast fp32 kernels (its fp16 ones are slow on
/// x86, and it rejects fp16 Gemm). Ops that only move data run as they are.
///
/// Element types come from shape inference, so a model read from a file
/// without `value_info` is emulated the same as one fresh from a pass.
pub fn fp16_proxy(m: &Model) -> anyhow::Result<Model> {
    let mut m = m.clone();
    graphopt_ir::infer::infer_model(&mut m, &graphopt_ir::infer::InferOptions::default());
    let mut counter = 0;
    proxy_graph(&mut m.graph, &mut counter)?;
    Ok(m)
}

fn proxy_graph(g: &mut graphopt_ir::Graph, counter: &mut usize) -> anyhow::Result<()> {
    use graphopt_ir::{AttrValue, Attribute, NewNode, Type};
    const MOVES: &[&str] = &[
        "Cast",
        "Reshape",
        "Transpose",
        "Gather",
        "GatherElements",
        "GatherND",
        "Concat",
        "Slice",
        "Squeeze",
        "Unsqueeze",
        "Identity",
        "Flatten",
        "Expand",
        "Split",
        "Shape",
        "Size",
        "Tile",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
        "Dropout",
        "Constant",
        "If",
        "Loop",
        "Scan",
    ];
    let elem = |g: &graphopt_ir::Graph, v| g.ty(v).and_then(|t: &Type| t.elem());
    let cast = |to: DType| Attribute::new("to", AttrValue::Int(to.to_onnx() as i64));
    // Names unique across subgraphs (a body must not shadow an outer name).
    fn fresh(
        g: &mut graphopt_ir::Graph,
        counter: &mut usize,
        v: graphopt_ir::ValueId,
        shape: Option<graphopt_ir::Shape>,
    ) -> graphopt_ir::ValueId {
        *counter += 1;
        let name = format!("{}_proxy32_{}", g.name(v), *counter);
        g.fresh_value(&name, Some(graphopt_ir::Type::tensor(DType::F32, shape)))
    }
    for n in g.nodes().collect::<Vec<_>>() {
        if g.node(n).has_subgraphs() {
            let mut attrs = std::mem::take(&mut g.node_mut(n).attributes);
            for a in &mut attrs {
                for sub in a.graphs_mut() {
                    proxy_graph(sub, counter)?;
                }
            }
            g.node_mut(n).attributes = attrs;
            g.refresh_captures(n);
        }
        let d = g.node(n);
        if !d.domain.is_empty() || MOVES.contains(&d.op_type.as_str()) {
            continue;
        }
        let outs: Vec<(usize, graphopt_ir::ValueId)> = d
            .outputs()
            .iter()
            .enumerate()
            .filter_map(|(i, o)| {
                o.filter(|&o| elem(g, o) == Some(DType::F16))
                    .map(|o| (i, o))
            })
            .collect();
        if outs.is_empty() {
            continue;
        }
        for (slot, v) in d.inputs().to_vec().into_iter().enumerate() {
            let Some(v) = v.filter(|&v| elem(g, v) == Some(DType::F16)) else {
                continue;
            };
            let shape = g.ty(v).and_then(|t| t.shape()).cloned();
            let w = fresh(g, counter, v, shape);
            g.insert_node_before(
                n,
                NewNode::new("Cast")
                    .inputs(&[v])
                    .outputs(&[w])
                    .attr(cast(DType::F32)),
            )?;
            g.set_input(n, slot, Some(w));
        }
        for (slot, out) in outs {
            let shape = g.ty(out).and_then(|t| t.shape()).cloned();
            let o32 = fresh(g, counter, out, shape);
            g.set_output(n, slot, Some(o32));
            g.insert_node_after(
                n,
                NewNode::new("Cast")
                    .inputs(&[o32])
                    .outputs(&[out])
                    .attr(cast(DType::F16)),
            )?;
        }
    }
    Ok(())
}
