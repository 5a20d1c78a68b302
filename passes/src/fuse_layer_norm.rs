//! LayerNorm fusion.
//!
//! Replaces the decomposed layer normalization that TorchScript exports at
//! opset < 17 by one `LayerNormalization` (opset ≥ 17, where it exists; run
//! `upgrade_opset` first on older models):
//!
//! ```text
//! m = ReduceMean(x, axes)           d = Sub(x, m)
//! v = ReduceMean(Pow(d, 2), axes)   (or Mul(d, d))
//! n = Div(d, Sqrt(Add(v, eps)))     (or Mul(d, Reciprocal(Sqrt(...))))
//! y = Add(Mul(n, gamma), beta)      ==> y = LayerNormalization(x, gamma, beta)
//! ```
//!
//! Conditions, each checked:
//! 1. the default-domain opset is ≥ 17;
//! 2. both ReduceMeans reduce the same last `k` axes of `x` (axes as an
//!    attribute before opset 18, as a constant input from 18), keepdims=1;
//!    positive axes need `x`'s rank from shape inference;
//! 3. `eps` is a one-element float constant, the exponent is 2;
//! 4. `gamma` (and `beta`, which may be absent) have exactly the normalized
//!    shape `x.shape[-k:]`, all dims known: a broadcasting `[1, H]` gamma is
//!    left alone, because LayerNormalization wants `[H]`. The scale may be
//!    absent too (a norm without affine weights, or an all-ones scale that
//!    `eliminate_noops` removed, as in randomly initialized exports): an
//!    fp32 `x` then gets a ones initializer as `gamma`;
//! 5. every intermediate value is read only inside the pattern (`d` twice).
//!
//! The fused node takes over the final value (its name is kept). Not exact:
//! LayerNormalization computes in float32 (`stash_type=1`) with its own
//! rounding. Works in subgraphs.
//!
//! ```text
//! before (opset 17, H = 4):                after:
//! g (float[2,4] x) => (float[2,4] y)       g (float[2,4] x) => (float[2,4] y)
//!   <float two = {2}, float eps = {1e-5},    <float[4] gamma = {...}, float[4] beta = {...}> {
//!    float[4] gamma = {...},                 y = LayerNormalization <axis = -1, epsilon = 1e-05> (x, gamma, beta)
//!    float[4] beta = {...}> {              }
//!   m = ReduceMean <axes = [-1]> (x)
//!   d = Sub (x, m)
//!   p = Pow (d, two)
//!   v = ReduceMean <axes = [-1]> (p)
//!   e = Add (v, eps)
//!   s = Sqrt (e)
//!   n = Div (d, s)
//!   t = Mul (n, gamma)
//!   y = Add (t, beta)
//! }
//! ```

use crate::pattern::{
    const_ints, const_tensor, is_op, only_use, other_input, replace_nodes, walk_typed, TypedGraph,
};
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::{AttrValue, Attribute, DType, Graph, Model, NewNode, NodeId, Tensor, ValueId};

pub struct FuseLayerNorm;

impl Pass for FuseLayerNorm {
    fn name(&self) -> &'static str {
        "fuse_layer_norm"
    }

    fn exact(&self) -> bool {
        false
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let opset = model.onnx_opset().unwrap_or(0);
        if opset < 17 {
            return Ok(stats);
        }
        let typed = cx.types(model);
        walk_typed(&mut model.graph, typed, &mut |g, tg| {
            fuse(g, &TypedGraph { tg }, &mut stats)
        })?;
        Ok(stats)
    }
}

struct LayerNorm {
    x: ValueId,
    /// `None`: no scale follows (a LayerNorm without affine weights, or one
    /// whose all-ones scale `eliminate_noops` removed); the fused node gets
    /// a ones initializer of the normalized shape.
    gamma: Option<ValueId>,
    norm_shape: Vec<i64>,
    beta: Option<ValueId>,
    eps: f32,
    k: usize,
    nodes: Vec<NodeId>,
    last: NodeId,
}

fn fuse(g: &mut Graph, t: &TypedGraph, stats: &mut PassStats) -> Result<(), PassError> {
    for n in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(n) || !is_op(g.node(n), "ReduceMean") {
            continue;
        }
        let Some(m) = match_layer_norm(g, t, n) else {
            continue;
        };
        let y = g.node(m.last).output(0).expect("matched node has an output");
        let gamma = match m.gamma {
            Some(v) => v,
            None => {
                let n: i64 = m.norm_shape.iter().product();
                let ones = Tensor::from_f32(m.norm_shape.clone(), &vec![1.0; n as usize])?;
                g.add_initializer("ln_scale_ones", ones)
            }
        };
        let mut inputs = vec![m.x, gamma];
        inputs.extend(m.beta);
        let new = NewNode::new("LayerNormalization")
            .name(g.node(m.last).name.clone())
            .inputs(&inputs)
            .outputs(&[y])
            .attr(Attribute::new("axis", AttrValue::Int(-(m.k as i64))))
            .attr(Attribute::new("epsilon", AttrValue::Float(m.eps)));
        replace_nodes(g, &m.nodes, m.last, new)?;
        stats.add("layer_norms", 1);
        stats.add("nodes_removed", m.nodes.len() as u64 - 1);
    }
    Ok(())
}

/// The output of single-use `v`'s only reader, if that reader is `op`.
fn next(g: &Graph, v: ValueId, op: &str) -> Option<NodeId> {
    let n = only_use(g, v)?;
    is_op(g.node(n), op).then_some(n)
}

fn out(g: &Graph, n: NodeId) -> Option<ValueId> {
    g.node(n).output(0)
}

fn match_layer_norm(g: &Graph, t: &TypedGraph, mean: NodeId) -> Option<LayerNorm> {
    let x = g.node(mean).input(0)?;
    let k = reduced_last_axes(g, t, mean, x)?;
    let sub = next(g, out(g, mean)?, "Sub")?;
    let sd = g.node(sub);
    if sd.input(0)? != x || sd.input(1)? != out(g, mean)? {
        return None;
    }
    let d = out(g, sub)?;
    // d is read by the square and by the division, nothing else.
    let readers: Vec<NodeId> = g.uses(d).iter().map(|u| u.node()).collect();
    if g.is_output(d) || !(2..=3).contains(&readers.len()) {
        return None;
    }
    let square = *readers.iter().find(|&&r| {
        let rd = g.node(r);
        (is_op(rd, "Pow") && rd.input(0) == Some(d) && rd.input(1).is_some_and(|e| scalar_is(g, e, 2.0)))
            || (is_op(rd, "Mul") && rd.input(0) == Some(d) && rd.input(1) == Some(d))
    })?;
    let divide = *readers.iter().find(|&&r| r != square)?;
    if readers.iter().any(|&r| r != square && r != divide) {
        return None;
    }
    let var = next(g, out(g, square)?, "ReduceMean")?;
    if reduced_last_axes(g, t, var, out(g, square)?)? != k {
        return None;
    }
    let add_eps = next(g, out(g, var)?, "Add")?;
    let eps_v = other_input(g, add_eps, out(g, var)?)?;
    let eps = const_tensor(g, eps_v)
        .filter(|c| c.dtype.is_float() && c.dims.iter().all(|&d| d == 1) && c.dims.len() <= k)?
        .to_f64_vec()?;
    let eps = *eps.first().filter(|e| **e >= 0.0)? as f32;
    let sqrt = next(g, out(g, add_eps)?, "Sqrt")?;
    let mut nodes = vec![mean, sub, square, var, add_eps, sqrt];
    let dd = g.node(divide);
    let normed = if is_op(dd, "Div") {
        if dd.input(0)? != d || dd.input(1)? != out(g, sqrt)? {
            return None;
        }
        out(g, divide)?
    } else if is_op(dd, "Mul") {
        let recip = next(g, out(g, sqrt)?, "Reciprocal")?;
        // The reciprocal must be read by this Mul alone (a training graph's
        // backward pass reads it too).
        if other_input(g, divide, d)? != out(g, recip)? || only_use(g, out(g, recip)?) != Some(divide)
        {
            return None;
        }
        nodes.push(recip);
        out(g, divide)?
    } else {
        return None;
    };
    nodes.push(divide);
    let norm_shape = normalized_shape(t, x, k)?;
    // The affine tail: Mul(normed, gamma), then optionally Add(., beta).
    // Either may be missing when its weights were all ones / zeros and
    // eliminate_noops removed it; a missing scale becomes a ones tensor
    // (fp32 models only: it is made as fp32).
    let mut last = divide;
    let mut gamma = None;
    if let Some(scale) = next(g, normed, "Mul") {
        // A scale that broadcasts beyond the normalized shape is not
        // LayerNormalization's: leave the whole pattern alone.
        let gm = other_input(g, scale, normed)?;
        if !has_shape(g, t, gm, &norm_shape) {
            return None;
        }
        nodes.push(scale);
        last = scale;
        gamma = Some(gm);
    }
    if gamma.is_none() && t.elem(x) != Some(DType::F32) {
        return None;
    }
    let mut beta = None;
    let tail = out(g, last)?;
    if let Some(shift) = next(g, tail, "Add") {
        let b = other_input(g, shift, tail)?;
        if has_shape(g, t, b, &norm_shape) {
            nodes.push(shift);
            last = shift;
            beta = Some(b);
        }
    }
    Some(LayerNorm {
        x,
        gamma,
        norm_shape,
        beta,
        eps,
        k,
        nodes,
        last,
    })
}

/// `k` when ReduceMean `n` over `x` reduces exactly the last `k` axes with
/// keepdims=1.
fn reduced_last_axes(g: &Graph, t: &TypedGraph, n: NodeId, x: ValueId) -> Option<usize> {
    let d = g.node(n);
    if d.attr_int("keepdims").unwrap_or(1) != 1 {
        return None;
    }
    let mut axes = match d.input(1) {
        Some(a) => const_ints(g, a)?,
        None => d.attr_ints("axes")?.to_vec(),
    };
    if axes.is_empty() {
        return None;
    }
    if axes.iter().any(|&a| a >= 0) {
        let r = t.rank(x)? as i64;
        for a in &mut axes {
            if *a >= 0 {
                *a -= r;
            }
        }
    }
    axes.sort_unstable();
    axes.dedup();
    let k = axes.len() as i64;
    (axes == (-k..0).collect::<Vec<_>>()).then_some(k as usize)
}

/// The last `k` dims of `x`, all known.
fn normalized_shape(t: &TypedGraph, x: ValueId, k: usize) -> Option<Vec<i64>> {
    let s = t.shape(x)?;
    let r = s.rank();
    if r < k {
        return None;
    }
    s.dims[r - k..].iter().map(|d| d.known()).collect()
}

/// True when `v` (a constant, or a value of known type) has shape `want`.
fn has_shape(g: &Graph, t: &TypedGraph, v: ValueId, want: &[i64]) -> bool {
    if let Some(c) = const_tensor(g, v) {
        return c.dims == want && c.dtype.is_float();
    }
    t.shape(v)
        .and_then(|s| s.as_known())
        .is_some_and(|s| s == want)
}

fn scalar_is(g: &Graph, v: ValueId, want: f64) -> bool {
    const_tensor(g, v)
        .and_then(|c| c.to_f64_vec())
        .is_some_and(|x| x.len() == 1 && x[0] == want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    const LN: &str = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y)
  <float two = {2.0}, float eps = {1e-5}, float[4] gamma = {1.0, 2.0, 3.0, 4.0}, float[4] beta = {0.5, 0.5, 0.5, 0.5}> {
  m = ReduceMean <axes = [-1]> (x)
  d = Sub (x, m)
  p = Pow (d, two)
  v = ReduceMean <axes = [-1]> (p)
  e = Add (v, eps)
  s = Sqrt (e)
  n = Div (d, s)
  t = Mul (n, gamma)
  y = Add (t, beta)
}
"#;

    #[test]
    fn torchscript_form() {
        assert_pass(
            &FuseLayerNorm,
            LN,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y)
  <float[4] gamma = {1.0, 2.0, 3.0, 4.0}, float[4] beta = {0.5, 0.5, 0.5, 0.5}> {
  y = LayerNormalization <axis = -1, epsilon = 1e-05> (x, gamma, beta)
}
"#,
        );
    }

    #[test]
    fn without_affine_weights_gets_a_ones_scale() {
        // The scale (all ones) and shift (all zeros) were removed by
        // eliminate_noops, as on randomly initialized exports.
        let bare = LN
            .replace("  t = Mul (n, gamma)\n  y = Add (t, beta)\n", "")
            .replace("n = Div (d, s)", "y = Div (d, s)");
        assert_pass(
            &FuseLayerNorm,
            &bare,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y)
  <float[4] gamma = {1.0, 2.0, 3.0, 4.0}, float[4] beta = {0.5, 0.5, 0.5, 0.5}, float[4] ln_scale_ones = {1.0, 1.0, 1.0, 1.0}> {
  y = LayerNormalization <axis = -1, epsilon = 1e-05> (x, ln_scale_ones)
}
"#,
        );
        // A shift without a scale keeps its Add as LayerNormalization's bias.
        let shift_only = LN
            .replace("  t = Mul (n, gamma)\n", "")
            .replace("y = Add (t, beta)", "y = Add (n, beta)");
        assert_pass(
            &FuseLayerNorm,
            &shift_only,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y)
  <float[4] gamma = {1.0, 2.0, 3.0, 4.0}, float[4] beta = {0.5, 0.5, 0.5, 0.5}, float[4] ln_scale_ones = {1.0, 1.0, 1.0, 1.0}> {
  y = LayerNormalization <axis = -1, epsilon = 1e-05> (x, ln_scale_ones, beta)
}
"#,
        );
    }

    #[test]
    fn reciprocal_read_elsewhere_is_left_alone() {
        let recip = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y, float[2,1] r)
  <float two = {2.0}, float eps = {1e-5}, float[4] gamma = {1.0, 2.0, 3.0, 4.0}> {
  m = ReduceMean <axes = [-1]> (x)
  d = Sub (x, m)
  p = Pow (d, two)
  v = ReduceMean <axes = [-1]> (p)
  e = Add (v, eps)
  s = Sqrt (e)
  r = Reciprocal (s)
  n = Mul (d, r)
  y = Mul (n, gamma)
}
"#;
        assert_unchanged(&FuseLayerNorm, recip);
        // Read only by the Mul, the same pattern fuses.
        let fused = recip.replace(", float[2,1] r)", ")");
        let mut m = graphopt_text::parse_model(&fused).unwrap();
        let stats = FuseLayerNorm.run(&mut m).unwrap();
        assert_eq!(stats.get("layer_norms"), 1);
    }

    #[test]
    fn too_low_opset() {
        assert_unchanged(&FuseLayerNorm, &LN.replace("\"\" : 17", "\"\" : 16"));
    }

    #[test]
    fn wrong_axes() {
        assert_unchanged(&FuseLayerNorm, &LN.replace("axes = [-1]> (x)", "axes = [0]> (x)"));
        assert_unchanged(&FuseLayerNorm, &LN.replace("axes = [-1]> (p)", "axes = [0]> (p)"));
    }

    #[test]
    fn mean_read_elsewhere() {
        assert_unchanged(
            &FuseLayerNorm,
            &LN.replace("=> (float[2,4] y)", "=> (float[2,4] y, float[2,1] m)"),
        );
    }

    #[test]
    fn broadcasting_gamma_is_left_alone() {
        assert_unchanged(
            &FuseLayerNorm,
            &LN.replace("float[4] gamma", "float[1,4] gamma"),
        );
    }

    #[test]
    fn rms_norm_is_not_layer_norm() {
        assert_unchanged(
            &FuseLayerNorm,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x) => (float[2,4] y) <float two = {2.0}, float eps = {1e-6}, float[4] w = {1.0, 2.0, 3.0, 4.0}> {
  p = Pow (x, two)
  v = ReduceMean <axes = [-1]> (p)
  e = Add (v, eps)
  s = Sqrt (e)
  r = Reciprocal (s)
  n = Mul (x, r)
  y = Mul (w, n)
}
"#,
        );
    }
}
