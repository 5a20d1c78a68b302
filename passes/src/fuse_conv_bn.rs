//! Conv + BatchNormalization folding.
//!
//! Folds per-output-channel affine ops that follow a Conv into its weights
//! and bias:
//! 1. `BatchNormalization(Conv(x, W, B), scale, bias, mean, var)` ==>
//!    `Conv(x, W * k, (B - mean) * k + bias)` with `k = scale / √(var + ε)`;
//! 2. `Mul(Conv(x, W, B), c)` ==> `Conv(x, W * c, B * c)`, and `Div` by `c`
//!    likewise with `1/c`;
//! 3. `Add(Conv(x, W, B), c)` ==> `Conv(x, W, B + c)`, and `Sub` of `c`;
//!    after a `ConvTranspose` too (its bias has `W.dims[1] * group`
//!    channels), which is the only rule for `ConvTranspose`s that follow;
//! 4. `Conv(Mul(x, s), W, B)` ==> `Conv(x, W * s, B)` for a one-element
//!    constant `s` (and `Div` by `s` with `1/s`), on `Conv` and
//!    `ConvTranspose`: both are linear in `x`, and zero padding stays zero
//!    (a GELU's trailing `* 0.5` before a 1x1 Conv in PP-OCR models). The
//!    Mul's output must be read by the Conv only.
//!
//! Preconditions, each checked: the weights, bias and all BN/Mul/Add
//! operands are constants (initializers or Constant nodes); the Conv output
//! is read only by the folded node; `W` and `B` are read only by this Conv
//! (tied weights stay tied and no initializer is duplicated); BN is in
//! inference mode (no `training_mode`, or constant false; no used extra
//! outputs; `spatial` = 1 when present); `c` has one element, or the shape
//! `[M,1,..]` / `[1,M,1,..]` of one value per output channel, and never
//! broadcasts the Conv output to a larger rank. Arithmetic is done in f64
//! and rounded once to the weights' dtype (f32, f16, bf16 or f64). Repeats
//! on a Conv until nothing more folds (Conv → BN → Mul → Add folds whole).
//!
//! The Conv takes over the final value, so its name is kept. Not exact (the
//! folded weights round differently). Works in subgraphs on their own
//! constants.
//!
//! ```text
//! before:                                        after:
//! g (float[1,1,3,3] x) => (float[1,2,3,3] y)     g (float[1,1,3,3] x) => (float[1,2,3,3] y)
//!   <float[2,1,1,1] w = {1, 2},                    <float[2,1,1,1] w = {2, 6},
//!    float[2,1,1] c = {2, 3},                       float[2] w_bias = {1, -1}> {
//!    float[2,1,1] d = {1, -1}> {                   y = Conv (x, w, w_bias)
//!   t = Conv (x, w)                              }
//!   u = Mul (t, c)
//!   y = Add (u, d)
//! }
//! ```
//! The Mul scales the weights (a Conv without bias keeps none); the Add
//! then creates the bias. The test `header_example` checks this example.

use crate::pattern::{const_tensor, is_op, only_use, sweep_constants};
use crate::util::for_each_subgraph;
use crate::{Pass, PassError, PassStats};
use bytes::Bytes;
use graphopt_ir::{DType, Graph, Model, NodeId, Tensor, ValueId};

pub struct FuseConvBn;

impl Pass for FuseConvBn {
    fn name(&self) -> &'static str {
        "fuse_conv_bn"
    }

    fn exact(&self) -> bool {
        false
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for_each_subgraph(&mut model.graph, &mut |g| fuse(g, &mut stats))?;
        fuse(&mut model.graph, &mut stats)?;
        Ok(stats)
    }
}

/// A per-output-channel affine map `y = a * conv + b`, one entry per channel.
struct Affine {
    a: Vec<f64>,
    b: Vec<f64>,
}

fn fuse(g: &mut Graph, stats: &mut PassStats) -> Result<(), PassError> {
    for conv in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(conv)
            || !(is_op(g.node(conv), "Conv") || is_op(g.node(conv), "ConvTranspose"))
        {
            continue;
        }
        while fold_input_scale(g, conv)? {
            stats.add("input_scales_folded", 1);
            stats.add("nodes_removed", 1);
        }
        while let Some((next, affine, label)) = follower(g, conv) {
            if !fold(g, conv, next, &affine)? {
                break;
            }
            stats.add(label, 1);
            stats.add("nodes_removed", 1);
        }
    }
    Ok(())
}

/// The weight tensor of `conv` when it is a float constant read only by it.
fn weight(g: &Graph, conv: NodeId) -> Option<(ValueId, Tensor)> {
    let w = g.node(conv).input(1)?;
    let t = const_tensor(g, w)?;
    (t.dtype.is_float() && t.dims.len() >= 3 && g.uses(w).len() == 1).then_some((w, t))
}

/// The node after `conv` that folds into it, as an affine map per channel.
fn follower(g: &Graph, conv: NodeId) -> Option<(NodeId, Affine, &'static str)> {
    let cd = g.node(conv);
    if cd.inputs().len() > 3 || cd.outputs().len() != 1 {
        return None;
    }
    let (_, w) = weight(g, conv)?;
    let transposed = cd.op_type == "ConvTranspose";
    let m = if transposed {
        usize::try_from(w.dims[1].checked_mul(cd.attr_int("group").unwrap_or(1))?).ok()?
    } else {
        usize::try_from(w.dims[0]).ok()?
    };
    let rank = w.dims.len();
    if let Some(b) = cd.input(2) {
        let bt = const_tensor(g, b)?;
        if bt.dims != [m as i64] || g.uses(b).len() != 1 {
            return None;
        }
    }
    let y = cd.output(0)?;
    let next = only_use(g, y)?;
    let nd = g.node(next);
    if !(nd.domain.is_empty() || nd.domain == "ai.onnx") {
        return None;
    }
    match nd.op_type.as_str() {
        "BatchNormalization" | "Mul" | "Div" if transposed => None,
        "BatchNormalization" => {
            if nd.input(0)? != y
                || nd.inputs().len() != 5
                || nd.attr("spatial").is_some_and(|_| nd.attr_int("spatial") != Some(1))
                || nd.attr_int("training_mode").unwrap_or(0) != 0
                || nd
                    .outputs()
                    .iter()
                    .skip(1)
                    .flatten()
                    .any(|&o| g.is_output(o) || !g.uses(o).is_empty())
            {
                return None;
            }
            let p = |i: usize| -> Option<Vec<f64>> {
                let t = const_tensor(g, nd.input(i)?)?;
                (t.dims == [m as i64] && t.dtype.is_float()).then(|| t.to_f64_vec())?
            };
            let (scale, bias, mean, var) = (p(1)?, p(2)?, p(3)?, p(4)?);
            let eps = nd.attr_float("epsilon").unwrap_or(1e-5) as f64;
            let mut a = Vec::with_capacity(m);
            let mut b = Vec::with_capacity(m);
            for c in 0..m {
                let k = scale[c] / (var[c] + eps).sqrt();
                a.push(k);
                b.push(bias[c] - mean[c] * k);
            }
            Some((next, Affine { a, b }, "batch_norms_folded"))
        }
        op @ ("Mul" | "Add" | "Sub" | "Div") => {
            if nd.inputs().len() != 2 {
                return None;
            }
            let (i0, i1) = (nd.input(0)?, nd.input(1)?);
            // Sub and Div only with the Conv on the left.
            let c = if i0 == y {
                i1
            } else if i1 == y && matches!(op, "Mul" | "Add") {
                i0
            } else {
                return None;
            };
            if c == y {
                return None;
            }
            let ct = const_tensor(g, c)?;
            if ct.dtype != w.dtype {
                return None;
            }
            let per = per_channel(&ct, m, rank)?;
            let (a, b) = match op {
                "Mul" => (per, vec![0.0; m]),
                "Div" => (per.iter().map(|v| 1.0 / v).collect(), vec![0.0; m]),
                "Add" => (vec![1.0; m], per),
                _ => (vec![1.0; m], per.iter().map(|v| -v).collect()),
            };
            let label = if matches!(op, "Mul" | "Div") {
                "scales_folded"
            } else {
                "shifts_folded"
            };
            Some((next, Affine { a, b }, label))
        }
        _ => None,
    }
}

/// `c`'s value for each of `m` channels, when `c` broadcast against a
/// `[N, M, ...]` Conv output of rank `rank` is constant apart from the
/// channel axis and does not raise the rank.
fn per_channel(c: &Tensor, m: usize, rank: usize) -> Option<Vec<f64>> {
    if c.dims.len() > rank {
        return None;
    }
    let mut dims = vec![1i64; rank - c.dims.len()];
    dims.extend(&c.dims);
    if dims[0] != 1 || dims[2..].iter().any(|&d| d != 1) || !(dims[1] == 1 || dims[1] == m as i64)
    {
        return None;
    }
    let v = c.to_f64_vec()?;
    match v.len() {
        1 => Some(vec![v[0]; m]),
        n if n == m => Some(v),
        _ => None,
    }
}

/// Folds `affine` (computed by node `next`) into `conv`'s weights and bias.
fn fold(g: &mut Graph, conv: NodeId, next: NodeId, affine: &Affine) -> Result<bool, PassError> {
    let Some((w, wt)) = weight(g, conv) else {
        return Ok(false);
    };
    let m = affine.a.len();
    let Some(wv) = wt.to_f64_vec() else {
        return Ok(false);
    };
    let per = wv.len() / m.max(1);
    let new_w: Vec<f64> = wv
        .iter()
        .enumerate()
        .map(|(i, &v)| v * affine.a[i / per.max(1)])
        .collect();
    let old_b = g.node(conv).input(2);
    let bv = match old_b.and_then(|b| const_tensor(g, b)) {
        Some(t) => t.to_f64_vec(),
        None => Some(vec![0.0; m]),
    };
    let Some(bv) = bv.filter(|b| b.len() == m) else {
        return Ok(false);
    };
    let new_b: Vec<f64> = (0..m).map(|c| bv[c] * affine.a[c] + affine.b[c]).collect();
    let Some(wt2) = encode(wt.dtype, wt.dims.clone(), &new_w) else {
        return Ok(false);
    };
    let Some(bt2) = encode(wt.dtype, vec![m as i64], &new_b) else {
        return Ok(false);
    };
    let bias_needed = old_b.is_some() || affine.b.iter().any(|&v| v != 0.0);

    if affine.a.iter().any(|&a| a != 1.0) {
        set_const(g, conv, 1, w, wt2);
    }
    if bias_needed {
        match old_b {
            Some(b) => set_const(g, conv, 2, b, bt2),
            None => {
                let hint = format!("{}_bias", g.name(w));
                let b = g.add_initializer(&hint, bt2);
                g.set_input(conv, 2, Some(b));
            }
        }
    }
    // The Conv takes over `next`'s output (and its name).
    let y = g.node(conv).output(0).expect("Conv has an output");
    let y2 = g.node(next).output(0).expect("folded node has an output");
    let read: Vec<ValueId> = g.node(next).inputs().iter().flatten().copied().collect();
    let extra: Vec<ValueId> = g.node(next).outputs().iter().skip(1).flatten().copied().collect();
    g.remove_node(next);
    g.set_output(conv, 0, Some(y2));
    g.remove_value(y);
    for o in extra {
        g.remove_value(o);
    }
    sweep_constants(g, &read);
    Ok(true)
}

/// Rule 4: `Conv(Mul(x, s), W, B)` ==> `Conv(x, W * s, B)` (`Div` by `s`:
/// `W / s`) for a one-element constant `s` of the weights' dtype.
fn fold_input_scale(g: &mut Graph, conv: NodeId) -> Result<bool, PassError> {
    let Some(xs) = g.node(conv).input(0) else {
        return Ok(false);
    };
    let Some((mul, 0)) = g.producer(xs) else {
        return Ok(false);
    };
    let md = g.node(mul);
    let div = is_op(md, "Div");
    if !(is_op(md, "Mul") || div) || md.inputs().len() != 2 || only_use(g, xs) != Some(conv) {
        return Ok(false);
    }
    let Some((w, wt)) = weight(g, conv) else {
        return Ok(false);
    };
    let (Some(i0), Some(i1)) = (md.input(0), md.input(1)) else {
        return Ok(false);
    };
    // The scale on the right (or on the left of a Mul).
    let (x, c) = match (const_tensor(g, i1), const_tensor(g, i0)) {
        (Some(t), _) => (i0, t),
        (None, Some(t)) if !div => (i1, t),
        _ => return Ok(false),
    };
    let Some(sv) = c.to_f64_vec().filter(|v| v.len() == 1 && c.dtype == wt.dtype) else {
        return Ok(false);
    };
    // The Mul must not broadcast x to a larger shape: s has one element,
    // so that only happens through a higher rank.
    if c.dims.len() > wt.dims.len() {
        return Ok(false);
    }
    let k = if div { 1.0 / sv[0] } else { sv[0] };
    let Some(wv) = wt.to_f64_vec() else {
        return Ok(false);
    };
    let scaled: Vec<f64> = wv.iter().map(|&v| v * k).collect();
    let Some(wt2) = encode(wt.dtype, wt.dims.clone(), &scaled) else {
        return Ok(false);
    };
    set_const(g, conv, 1, w, wt2);
    let read: Vec<ValueId> = g.node(mul).inputs().iter().flatten().copied().collect();
    g.set_input(conv, 0, Some(x));
    g.remove_node(mul);
    g.remove_value(xs);
    sweep_constants(g, &read);
    Ok(true)
}

/// Replaces constant input `slot` (value `v`) of `n` by `t`: in place when
/// `v` is an initializer, else through a new initializer.
fn set_const(g: &mut Graph, n: NodeId, slot: usize, v: ValueId, t: Tensor) {
    if g.constant(v).is_some() {
        g.set_initializer(v, t);
    } else {
        let hint = g.name(v).to_string();
        let nv = g.add_initializer(&hint, t);
        g.set_input(n, slot, Some(nv));
        sweep_constants(g, &[v]);
    }
}

/// `vals` rounded once to `dtype`, as a tensor.
fn encode(dtype: DType, dims: Vec<i64>, vals: &[f64]) -> Option<Tensor> {
    let raw: Vec<u8> = match dtype {
        DType::F32 => vals.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
        DType::F64 => vals.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        DType::F16 => vals
            .iter()
            .flat_map(|&v| half::f16::from_f64(v).to_le_bytes())
            .collect(),
        DType::BF16 => vals
            .iter()
            .flat_map(|&v| half::bf16::from_f64(v).to_le_bytes())
            .collect(),
        _ => return None,
    };
    Tensor::from_raw(dtype, dims, Bytes::from(raw)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn batch_norm_folds() {
        assert_pass(
            &FuseConvBn,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y)
  <float[2,1,1,1] w = {1.0, 2.0}, float[2] s = {2.0, 1.0}, float[2] b = {1.0, 0.0},
   float[2] mu = {0.5, 1.0}, float[2] var = {4.0, 1.0}> {
  t = Conv (x, w)
  y = BatchNormalization <epsilon = 0.0> (t, s, b, mu, var)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y)
  <float[2,1,1,1] w = {1.0, 2.0}, float[2] w_bias = {0.5, -1.0}> {
  y = Conv (x, w, w_bias)
}
"#,
        );
    }

    /// The example in the module doc.
    #[test]
    fn header_example() {
        assert_pass(
            &FuseConvBn,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y)
  <float[2,1,1,1] w = {1.0, 2.0}, float[2,1,1] c = {2.0, 3.0}, float[2,1,1] d = {1.0, -1.0}> {
  t = Conv (x, w)
  u = Mul (t, c)
  y = Add (u, d)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y)
  <float[2,1,1,1] w = {2.0, 6.0}, float[2] w_bias = {1.0, -1.0}> {
  y = Conv (x, w, w_bias)
}
"#,
        );
    }

    #[test]
    fn conv_output_read_twice() {
        assert_unchanged(
            &FuseConvBn,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] t) <float[2,1,1,1] w = {1.0, 2.0}, float[2,1,1] c = {2.0, 3.0}> {
  t = Conv (x, w)
  y = Mul (t, c)
}
"#,
        );
    }

    #[test]
    fn non_constant_or_wrong_shape_operand() {
        assert_unchanged(
            &FuseConvBn,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x, float[2,1,1] c) => (float[1,2,3,3] y) <float[2,1,1,1] w = {1.0, 2.0}> {
  t = Conv (x, w)
  y = Mul (t, c)
}
"#,
        );
        // Varies along the width: not per channel.
        assert_unchanged(
            &FuseConvBn,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y) <float[2,1,1,1] w = {1.0, 2.0}, float[3] c = {1.0, 2.0, 3.0}> {
  t = Conv (x, w)
  y = Mul (t, c)
}
"#,
        );
    }

    #[test]
    fn shared_weights_and_training_bn_are_kept() {
        assert_unchanged(
            &FuseConvBn,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] z) <float[2,1,1,1] w = {1.0, 2.0}, float c = {2.0}> {
  t = Conv (x, w)
  y = Mul (t, c)
  z = Conv (x, w)
}
"#,
        );
        assert_unchanged(
            &FuseConvBn,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y)
  <float[2,1,1,1] w = {1.0, 2.0}, float[2] s = {2.0, 1.0}, float[2] b = {1.0, 0.0},
   float[2] mu = {0.5, 1.0}, float[2] var = {4.0, 1.0}> {
  t = Conv (x, w)
  y = BatchNormalization <training_mode = 1> (t, s, b, mu, var)
}
"#,
        );
    }
}
