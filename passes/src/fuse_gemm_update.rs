//! A scaled Gemm added to a same-shaped value becomes that Gemm's `C`.
//!
//! `Sub(P, Mul(Gemm(A, B), s))` ==> `Gemm(A, B, P, alpha = -s·alpha, beta = 1)`
//! and likewise `Add` (either operand order) and the forms without the
//! `Mul`. This is the SGD update of a weight whose gradient is a Gemm
//! (`graphopt grad --optimizer sgd` writes `dW = Gemm(X, dY, transA = 1)` and
//! `W_new = W - lr·dW`): fused, the gradient is never held, and the
//! planner writes `W_new` over `W` in place (Gemm's `Over(2)` rule in
//! `graphopt_plan::inplace`), so a step holds no weight-sized buffer for it.
//! On BERT-base's step that is the 94 MB gradient of the MLM decoder, live
//! at the step's peak.
//!
//! Conditions:
//! 1. the Gemm has no `C` and its output is read by the `Mul` (or the
//!    `Add`/`Sub`) alone, as is the `Mul`'s; neither is a graph output;
//! 2. `s` is a one-element constant of rank at most 2 (so `s·G` has G's
//!    shape);
//! 3. the element type is float32, float16 or bfloat16 (Gemm's `alpha` is
//!    a float32 attribute: float64's scale would be rounded);
//! 4. `P` has the Gemm output's type and exactly its shape (known dims, or
//!    the same named dims), so `C` broadcasts nothing.
//!
//! Checked against the unfused step on gpt2_tiny, in tract and in
//! graphopt's runtime (`crates/graphopt/tests/grad_optim.rs`), and in
//! onnxruntime against torch's SGD losses on the digits CNN, whose
//! classifier update fuses (`tests-py/grad_digits_train.py`).
//!
//! The new Gemm takes over the `Add`/`Sub`'s output and its place in the
//! node order. Not exact: `P - s·(A·B)` rounds `s·(A·B)` once, where the
//! Gemm adds each block of the product to `P` as it goes (one rounding per
//! block of the reduction, 256 terms each).
//!
//! ```text
//! before:                                        after:
//! g (float[4,2] x, float[4,3] dy,                g (float[4,2] x, float[4,3] dy,
//!    float[2,3] w) => (float[2,3] w_new)            float[2,3] w) => (float[2,3] w_new)
//!   <float lr = {0.01}>                          {
//! {                                                w_new = Gemm <alpha: float = -0.01,
//!   g = Gemm <transA: int = 1> (x, dy)                           transA: int = 1> (x, dy, w)
//!   s = Mul (g, lr)                              }
//!   w_new = Sub (w, s)
//! }
//! ```

use crate::pattern::{
    const_tensor, is_op, only_use, other_input, replace_nodes, walk_typed, TypedGraph,
};
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::{AttrValue, Attribute, DType, Graph, Model, NewNode, NodeId, ValueId};

pub struct FuseGemmUpdate;

impl Pass for FuseGemmUpdate {
    fn name(&self) -> &'static str {
        "fuse_gemm_update"
    }

    fn exact(&self) -> bool {
        false
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        if model.onnx_opset().unwrap_or(0) < 7 {
            return Ok(stats);
        }
        let typed = cx.types(model);
        walk_typed(&mut model.graph, typed, &mut |g, tg| {
            fuse(g, &TypedGraph { tg }, &mut stats)
        })?;
        Ok(stats)
    }
}

/// One match of a Gemm: the `Mul` it also replaces (if any), the
/// `Add`/`Sub` whose output and place it takes, `P`, and the factor on the
/// product.
struct Update {
    remove: Vec<NodeId>,
    last: NodeId,
    p: ValueId,
    scale: f64,
}

fn fuse(g: &mut Graph, t: &TypedGraph, stats: &mut PassStats) -> Result<(), PassError> {
    for gemm in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(gemm) || !is_op(g.node(gemm), "Gemm") {
            continue;
        }
        let Some(u) = match_update(g, t, gemm) else {
            continue;
        };
        let d = g.node(gemm);
        let (a, b) = (d.input(0).expect("matched"), d.input(1).expect("matched"));
        let alpha = d.attr_float("alpha").unwrap_or(1.0) as f64 * u.scale;
        let mut attrs: Vec<Attribute> = d
            .attributes
            .iter()
            .filter(|a| !matches!(a.name.as_str(), "alpha" | "beta"))
            .cloned()
            .collect();
        if alpha != 1.0 {
            attrs.push(Attribute::new("alpha", AttrValue::Float(alpha as f32)));
        }
        attrs.sort_by(|x, y| x.name.cmp(&y.name));
        let y = g.node(u.last).output(0).expect("Add/Sub has an output");
        let mut new = NewNode::new("Gemm")
            .name(d.name.clone())
            .inputs(&[a, b, u.p])
            .outputs(&[y]);
        for at in attrs {
            new = new.attr(at);
        }
        let mut remove = vec![gemm];
        remove.extend(&u.remove);
        remove.push(u.last);
        replace_nodes(g, &remove, u.last, new)?;
        stats.add("updates_fused", 1);
        stats.add("nodes_removed", remove.len() as u64 - 1);
    }
    Ok(())
}

fn match_update(g: &Graph, t: &TypedGraph, gemm: NodeId) -> Option<Update> {
    let d = g.node(gemm);
    if d.inputs().iter().skip(2).any(Option::is_some) || d.outputs().len() != 1 {
        return None;
    }
    let (a, prod) = (d.input(0)?, d.output(0)?);
    d.input(1)?;
    let elem = t.elem(a)?;
    if !matches!(elem, DType::F32 | DType::F16 | DType::BF16) || t.elem(prod)? != elem {
        return None;
    }
    // The optional scale: Mul(prod, s) or Mul(s, prod).
    let mut next = only_use(g, prod)?;
    let mut scale = 1.0;
    let mut remove = Vec::new();
    let mut term = prod;
    if is_op(g.node(next), "Mul") {
        let m = g.node(next);
        let other = other_input(g, next, prod)?;
        let s = const_tensor(g, other)?;
        // One element, of rank at most 2: `G·s` keeps G's shape.
        if s.dtype != elem || s.numel().ok()? != 1 || s.dims.len() > 2 {
            return None;
        }
        scale = s.to_f64_vec()?.first().copied()?;
        if !scale.is_finite() {
            return None;
        }
        term = m.output(0)?;
        remove.push(next);
        next = only_use(g, term)?;
    }
    let n = g.node(next);
    let sub = is_op(n, "Sub");
    if !(sub || is_op(n, "Add")) || n.inputs().len() != 2 {
        return None;
    }
    let p = other_input(g, next, term)?;
    // `P - s·G` only (not `s·G - P`).
    if sub && n.input(0)? != p {
        return None;
    }
    if sub {
        scale = -scale;
    }
    // P: the product's type and exactly its shape.
    let (ps, gs) = (t.shape(p)?, t.shape(prod)?);
    if t.elem(p)? != elem || ps.rank() != 2 || ps.dims != gs.dims {
        return None;
    }
    if ps.dims.iter().any(|d| d.known().is_none() && !matches!(d, graphopt_ir::Dim::Sym(_))) {
        return None;
    }
    Some(Update {
        remove,
        last: next,
        p,
        scale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn sgd_update() {
        assert_pass(
            &FuseGemmUpdate,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[4,2] x, float[4,3] dy, float[2,3] w) => (float[2,3] w_new) <float lr = {0.5}> {
  d = Gemm <transA: int = 1> (x, dy)
  s = Mul (lr, d)
  w_new = Sub (w, s)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[4,2] x, float[4,3] dy, float[2,3] w) => (float[2,3] w_new) {
  w_new = Gemm <alpha: float = -0.5, transA: int = 1> (x, dy, w)
}
"#,
        );
    }

    #[test]
    fn shared_product_broadcast_or_reversed_sub_are_left_alone() {
        for src in [
            // The gradient is also an output (--keep-grads).
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[4,2] x, float[4,3] dy, float[2,3] w) => (float[2,3] w_new, float[2,3] d) <float lr = {0.5}> {
  d = Gemm <transA: int = 1> (x, dy)
  s = Mul (d, lr)
  w_new = Sub (w, s)
}
"#,
            // P broadcasts.
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[4,2] x, float[4,3] dy, float[3] w) => (float[2,3] w_new) {
  d = Gemm <transA: int = 1> (x, dy)
  w_new = Add (w, d)
}
"#,
            // s·G - P.
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[4,2] x, float[4,3] dy, float[2,3] w) => (float[2,3] w_new) {
  d = Gemm <transA: int = 1> (x, dy)
  w_new = Sub (d, w)
}
"#,
            // A Gemm with C already.
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[4,2] x, float[2,3] dy, float[3] b, float[4,3] w) => (float[4,3] y) {
  d = Gemm (x, dy, b)
  y = Add (w, d)
}
"#,
        ] {
            assert_unchanged(&FuseGemmUpdate, src);
        }
    }
}
