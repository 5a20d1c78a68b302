//! Fuses a Conv into the Add of its output and a residual of the same
//! shape, for the CPU runtime: `ConvAdd(X, W, R, B?)` in domain
//! `graphopt.exec` ([`crate::cpu::conv_add`]) runs the convolution image
//! by image into the workspace and adds each image's residual, writing the
//! sum over `R` where the plan lets it (the planner's in-place rule for
//! the op: output over input 2, [`graphopt_plan::inplace_rule_in`]). The
//! convolution's whole output is then never planned: in a ResNet block,
//! the block's last convolution and its shortcut no longer hold two
//! block-sized tensors at once.
//!
//! Taken where the Conv's output is read by that Add alone, both Add
//! inputs are float32 of one 4-D shape (equal dims, none unknown), and
//! the Conv's input has at most as many elements per image as its output
//! (the fused node reads it where the Add was, so it lives that much
//! longer in place of the output that is no longer planned). The Relu
//! after the Add is then fused into the node as any activation after a
//! Conv is.
//!
//! Before (a ResNet bottleneck's end):
//! ```text
//! c = Conv <kernel_shape = [1, 1]> (h, W3, B3); s = Add (c, shortcut); y = Relu (s)
//! ```
//! After:
//! ```text
//! s = graphopt.exec::ConvAdd <kernel_shape = [1, 1]> (h, W3, shortcut, B3); y = Relu (s)
//! ```

use crate::lower::{
    attr_ref, default_domain, import_exec_domain, replace_node, CODED_DOMAIN, CONV_ATTRS,
};
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{DType, Dim, Function, Graph, Model, NewNode, NodeId, OpsetImport, Use, ValueId};

use graphopt_plan::CONV_ADD;

/// Fuses every Conv + Add it can in the main graph of `m` (see the module
/// docs). Returns how many.
pub fn fuse_residual(m: &mut Model) -> usize {
    let mut typed = m.clone();
    infer_model(&mut typed, &InferOptions::default());
    let g = &typed.graph;
    let mut pairs: Vec<(NodeId, NodeId, ValueId)> = Vec::new();
    for &add in g.order() {
        let d = g.node(add);
        if d.op_type != "Add" || !default_domain(&d.domain) || !d.attributes.is_empty() {
            continue;
        }
        let (Some(a), Some(b)) = (d.input(0), d.input(1)) else {
            continue;
        };
        if a == b || d.inputs().len() != 2 {
            continue;
        }
        for (c, r) in [(a, b), (b, a)] {
            if let Some(conv) = fusable(g, add, c, r) {
                pairs.push((add, conv, r));
                break;
            }
        }
    }
    let mut fused = 0;
    for (add, conv, r) in pairs {
        let cd = m.graph.node(conv).clone();
        let (Some(x), Some(w)) = (cd.input(0), cd.input(1)) else {
            continue;
        };
        let mut inputs = vec![Some(x), Some(w), Some(r)];
        if let Some(bias) = cd.input(2) {
            inputs.push(Some(bias));
        }
        let c = cd.output(0).expect("checked");
        replace_node(
            &mut m.graph,
            add,
            CODED_DOMAIN,
            CONV_ADD,
            inputs,
            cd.attributes.clone(),
            None,
        );
        m.graph.remove_node(conv);
        m.graph.remove_value(c);
        fused += 1;
    }
    if fused > 0 {
        if m.function(CODED_DOMAIN, CONV_ADD).is_none() {
            let opset = m.onnx_opset().unwrap_or(18);
            m.functions.push(function(opset));
        }
        import_exec_domain(m);
    }
    fused
}

/// The Conv producing `c` when `Add(c, r)` (node `add`) may become a
/// `ConvAdd`.
fn fusable(g: &Graph, add: NodeId, c: ValueId, r: ValueId) -> Option<NodeId> {
    let (conv, _) = g.producer(c)?;
    let cd = g.node(conv);
    if cd.op_type != "Conv" || !default_domain(&cd.domain) || cd.outputs().len() != 1 {
        return None;
    }
    if g.is_output(c)
        || g.uses(c).len() != 1
        || !matches!(g.uses(c)[0], Use::Input { node, .. } if node == add)
        || cd.input(0) == Some(r)
    {
        return None;
    }
    let ty = |v: ValueId| g.ty(v).and_then(|t| t.as_tensor());
    let (tc, tr) = (ty(c)?, ty(r)?);
    if tc.elem != DType::F32 || tr.elem != DType::F32 {
        return None;
    }
    let (sc, sr) = (tc.shape.as_ref()?, tr.shape.as_ref()?);
    // Equal dims (a symbol equals itself; an unknown dim is unknown).
    if sc.dims != sr.dims || sc.dims.len() != 4 || sc.dims.contains(&Dim::Unknown) {
        return None;
    }
    // The fused node reads X where the Add was: X then lives until there,
    // which must cost no more than the Conv's output it saves (X of the
    // same batch dim and at most as many elements per image).
    let sx = ty(cd.input(0)?)?.shape.as_ref()?;
    let per_image = |s: &graphopt_ir::Shape| -> Option<i64> {
        s.dims[1..].iter().try_fold(1i64, |p, d| match d {
            Dim::Known(v) => p.checked_mul(*v),
            _ => None,
        })
    };
    if sx.dims.len() != 4 || sx.dims[0] != sc.dims[0] || per_image(sx)? > per_image(sc)? {
        return None;
    }
    Some(conv)
}

/// The function typing `ConvAdd`: `Add(Conv(X, W, B), R)`.
fn function(opset: i64) -> Function {
    let mut b = Graph::new(CONV_ADD);
    let mut val = |n: &str| b.add_value(n, None).expect("fresh body");
    let (x, w, r, bias, t, y) = (
        val("X"),
        val("W"),
        val("R"),
        val("B"),
        val("conv"),
        val("Y"),
    );
    let conv = CONV_ATTRS.iter().fold(
        NewNode::new("Conv").inputs(&[x, w, bias]).outputs(&[t]),
        |n, &(a, k)| n.attr(attr_ref(a, a, k)),
    );
    b.add_node(conv).expect("well-formed body");
    b.add_node(NewNode::new("Add").inputs(&[t, r]).outputs(&[y]))
        .expect("well-formed body");
    b.inputs = vec![x, w, r, bias];
    b.outputs = vec![y];
    Function {
        name: CONV_ADD.to_string(),
        domain: CODED_DOMAIN.to_string(),
        overload: String::new(),
        attributes: CONV_ATTRS.iter().map(|(a, _)| a.to_string()).collect(),
        attribute_defaults: Vec::new(),
        opset_imports: vec![OpsetImport {
            domain: String::new(),
            version: opset,
        }],
        doc_string: "graphopt's CPU runtime: a Conv and the Add of a residual, image by image"
            .into(),
        metadata_props: Vec::new(),
        body: b,
    }
}
