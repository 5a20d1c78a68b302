//! GELU fusion.
//!
//! Replaces the decomposed GELU that exporters write by one `Gelu` node
//! (opset ≥ 20, where `Gelu` exists; run `upgrade_opset` first on older
//! models):
//! 1. erf form, `x * 0.5 * (1 + Erf(x / √2))` ==> `Gelu(x)`, with
//!    `x / 1.4142135` or `x * 0.70710678`, and the `0.5` applied to `x`, to
//!    `1 + erf`, or to the product (or as a division by 2);
//! 2. tanh form, `0.5 * x * (1 + Tanh(√(2/π) * (x + 0.044715 * x³)))` ==>
//!    `Gelu(x, approximate="tanh")`, with `x³` as `Pow(x, 3)` or `x * x * x`.
//!
//! Every intermediate value must be read only inside the pattern, and every
//! constant must be a one-element constant (within relative 1e-5 of the
//! exact coefficient; 1e-3 for float16, 8e-3 for bfloat16, whose roundings
//! are that coarse) that does not broadcast `x` to a larger rank. The
//! fused node takes over the final value, so its name is kept. Not exact:
//! `Gelu` evaluates the formula with its own rounding. Works in subgraphs.
//!
//! ```text
//! before (opset 20):                         after:
//! g (float[4] x) => (float[4] y)             g (float[4] x) => (float[4] y) {
//!   <float s = {1.4142135}, float one = {1},   y = Gelu (x)
//!    float half = {0.5}> {                   }
//!   d = Div (x, s)
//!   e = Erf (d)
//!   a = Add (e, one)
//!   m = Mul (x, a)
//!   y = Mul (m, half)
//! }
//! ```

use crate::pattern::{
    const_tensor, is_op, only_use, other_input, replace_nodes, walk_typed, TypedGraph,
};
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::{AttrValue, Attribute, DType, Graph, Model, NewNode, NodeId, ValueId};

pub struct FuseGelu;

impl Pass for FuseGelu {
    fn name(&self) -> &'static str {
        "fuse_gelu"
    }

    fn exact(&self) -> bool {
        false
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        if model.onnx_opset().unwrap_or(0) < 20 {
            return Ok(stats);
        }
        let typed = cx.types(model);
        walk_typed(&mut model.graph, typed, &mut |g, tg| {
            fuse(g, &TypedGraph { tg }, &mut stats)
        })?;
        Ok(stats)
    }
}

/// A matched GELU: its input, the nodes to remove, the last of them.
struct Gelu {
    x: ValueId,
    nodes: Vec<NodeId>,
    last: NodeId,
    tanh: bool,
}

fn fuse(g: &mut Graph, t: &TypedGraph, stats: &mut PassStats) -> Result<(), PassError> {
    for n in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(n) {
            continue;
        }
        let d = g.node(n);
        let m = if is_op(d, "Erf") {
            match_erf(g, t, n)
        } else if is_op(d, "Tanh") {
            match_tanh(g, t, n)
        } else {
            None
        };
        let Some(m) = m else { continue };
        let y = g.node(m.last).output(0).expect("matched Mul has an output");
        let mut new = NewNode::new("Gelu")
            .name(g.node(m.last).name.clone())
            .inputs(&[m.x])
            .outputs(&[y]);
        if m.tanh {
            new = new.attr(Attribute::new(
                "approximate",
                AttrValue::String(b"tanh".to_vec()),
            ));
        }
        replace_nodes(g, &m.nodes, m.last, new)?;
        stats.add(if m.tanh { "gelu_tanh" } else { "gelu_erf" }, 1);
        stats.add("nodes_removed", m.nodes.len() as u64 - 1);
    }
    Ok(())
}

/// `Erf(x / √2)` (or `Erf(x * (1/√2))`) followed by the common tail.
fn match_erf(g: &Graph, t: &TypedGraph, erf: NodeId) -> Option<Gelu> {
    let e_in = g.node(erf).input(0)?;
    let (scale, _) = g.producer(e_in)?;
    only_use(g, e_in)?;
    let sd = g.node(scale);
    let x = if is_op(sd, "Div") {
        let x = sd.input(0)?;
        is_coeff(g, t, sd.input(1)?, std::f64::consts::SQRT_2, x).then_some(x)?
    } else if is_op(sd, "Mul") {
        mul_by(g, t, scale, std::f64::consts::FRAC_1_SQRT_2)?
    } else {
        return None;
    };
    let (nodes, last) = tail(g, t, erf, x)?;
    Some(Gelu {
        x,
        nodes: [vec![scale, erf], nodes].concat(),
        last,
        tanh: false,
    })
}

/// `Tanh(√(2/π) * (x + 0.044715 * x³))` followed by the common tail.
fn match_tanh(g: &Graph, t: &TypedGraph, tanh: NodeId) -> Option<Gelu> {
    let t_in = g.node(tanh).input(0)?;
    only_use(g, t_in)?;
    let (outer, _) = g.producer(t_in)?;
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt();
    let inner = is_op(g.node(outer), "Mul")
        .then(|| mul_by(g, t, outer, sqrt_2_over_pi))
        .flatten()?;
    only_use(g, inner)?;
    let (add, _) = g.producer(inner)?;
    let ad = g.node(add);
    if !is_op(ad, "Add") {
        return None;
    }
    let (a0, a1) = (ad.input(0)?, ad.input(1)?);
    // One operand is x, the other 0.044715 * x³.
    for (x, w) in [(a0, a1), (a1, a0)] {
        let Some(mut cube_nodes) = cubic_term(g, t, w, x) else {
            continue;
        };
        let (nodes, last) = tail(g, t, tanh, x)?;
        let mut all = vec![add, outer, tanh];
        all.append(&mut cube_nodes);
        all.extend(nodes);
        return Some(Gelu {
            x,
            nodes: all,
            last,
            tanh: true,
        });
    }
    None
}

/// `w = 0.044715 * x³`, read only by the pattern: the nodes computing it.
fn cubic_term(g: &Graph, t: &TypedGraph, w: ValueId, x: ValueId) -> Option<Vec<NodeId>> {
    only_use(g, w)?;
    let (m, _) = g.producer(w)?;
    if !is_op(g.node(m), "Mul") {
        return None;
    }
    let cube = mul_by(g, t, m, 0.044715)?;
    only_use(g, cube)?;
    let (p, _) = g.producer(cube)?;
    let pd = g.node(p);
    if is_op(pd, "Pow") && pd.input(0)? == x && is_coeff(g, t, pd.input(1)?, 3.0, x) {
        return Some(vec![m, p]);
    }
    // x * x * x, as Mul(Mul(x, x), x) in either operand order.
    if is_op(pd, "Mul") {
        let (i0, i1) = (pd.input(0)?, pd.input(1)?);
        let sq = if i0 == x { i1 } else if i1 == x { i0 } else { return None };
        only_use(g, sq)?;
        let (s, _) = g.producer(sq)?;
        let sd = g.node(s);
        if is_op(sd, "Mul") && sd.input(0)? == x && sd.input(1)? == x {
            return Some(vec![m, p, s]);
        }
    }
    None
}

/// From `f` (the Erf or Tanh node): `a = 1 + f`, then `0.5 * x * a` in any
/// association. Returns the tail's nodes and the last one.
fn tail(g: &Graph, t: &TypedGraph, f: NodeId, x: ValueId) -> Option<(Vec<NodeId>, NodeId)> {
    let fv = g.node(f).output(0)?;
    let add = only_use(g, fv)?;
    let ad = g.node(add);
    if !is_op(ad, "Add") || ad.inputs().len() != 2 {
        return None;
    }
    let one = if ad.input(0)? == fv { ad.input(1)? } else { ad.input(0)? };
    if !is_coeff(g, t, one, 1.0, x) {
        return None;
    }
    let a = ad.output(0)?;
    let m1 = only_use(g, a)?;
    if !is_op(g.node(m1), "Mul") {
        return None;
    }
    let other = other_input(g, m1, a)?;
    let m1_out = g.node(m1).output(0)?;
    // (x * a) * 0.5, or (x * a) / 2
    if other == x {
        let m2 = only_use(g, m1_out)?;
        return halves(g, t, m2, m1_out, x).then(|| (vec![add, m1, m2], m2));
    }
    // (0.5 * a) * x
    if is_coeff(g, t, other, 0.5, x) {
        let m2 = only_use(g, m1_out)?;
        let d2 = g.node(m2);
        return (is_op(d2, "Mul") && other_input(g, m2, m1_out)? == x)
            .then(|| (vec![add, m1, m2], m2));
    }
    // (0.5 * x) * a, or (x / 2) * a
    only_use(g, other)?;
    let (h, _) = g.producer(other)?;
    let hd = g.node(h);
    let ok = (is_op(hd, "Mul") && mul_by(g, t, h, 0.5) == Some(x))
        || (is_op(hd, "Div") && hd.input(0)? == x && is_coeff(g, t, hd.input(1)?, 2.0, x));
    ok.then(|| (vec![add, h, m1], m1))
}

/// True when node `n` computes `v * 0.5` or `v / 2`.
fn halves(g: &Graph, t: &TypedGraph, n: NodeId, v: ValueId, x: ValueId) -> bool {
    let d = g.node(n);
    if is_op(d, "Mul") {
        return other_input(g, n, v).is_some_and(|c| is_coeff(g, t, c, 0.5, x));
    }
    is_op(d, "Div")
        && d.input(0) == Some(v)
        && d.input(1).is_some_and(|c| is_coeff(g, t, c, 2.0, x))
}

/// For a two-input Mul `n` with a constant `c` as one operand: the other.
fn mul_by(g: &Graph, t: &TypedGraph, n: NodeId, c: f64) -> Option<ValueId> {
    let d = g.node(n);
    if d.inputs().len() != 2 {
        return None;
    }
    let (i0, i1) = (d.input(0)?, d.input(1)?);
    if is_coeff(g, t, i1, c, i0) {
        Some(i0)
    } else if is_coeff(g, t, i0, c, i1) {
        Some(i1)
    } else {
        None
    }
}

/// True when `c` is a one-element float constant within relative 1e-5 of
/// `want`, of no larger rank than `x` (so it never broadcasts `x` up).
fn is_coeff(g: &Graph, t: &TypedGraph, c: ValueId, want: f64, x: ValueId) -> bool {
    let Some(tc) = const_tensor(g, c) else {
        return false;
    };
    if !tc.dtype.is_float() || !tc.dims.iter().all(|&d| d == 1) {
        return false;
    }
    if !tc.dims.is_empty() && t.rank(x).is_none_or(|r| r < tc.dims.len()) {
        return false;
    }
    // The coefficient as rounded to the constant's type: f16 holds √2 as
    // 1.4140625, 1.1e-4 away.
    let tol = match tc.dtype {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        _ => 1e-5,
    };
    tc.to_f64_vec()
        .is_some_and(|v| v.len() == 1 && (v[0] - want).abs() <= tol * want.abs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    const ERF: &str = r#"
<ir_version: 9, opset_import: ["" : 20]>
g (float[4] x) => (float[4] y) <float s = {1.4142135}, float one = {1.0}, float half = {0.5}> {
  d = Div (x, s)
  e = Erf (d)
  a = Add (e, one)
  m = Mul (x, a)
  y = Mul (m, half)
}
"#;

    #[test]
    fn erf_form() {
        assert_pass(
            &FuseGelu,
            ERF,
            r#"
<ir_version: 9, opset_import: ["" : 20]>
g (float[4] x) => (float[4] y) {
  y = Gelu (x)
}
"#,
        );
    }

    #[test]
    fn too_low_opset() {
        assert_unchanged(&FuseGelu, &ERF.replace("\"\" : 20", "\"\" : 18"));
    }

    #[test]
    fn intermediate_read_elsewhere() {
        assert_unchanged(
            &FuseGelu,
            r#"
<ir_version: 9, opset_import: ["" : 20]>
g (float[4] x) => (float[4] y, float[4] e) <float s = {1.4142135}, float one = {1.0}, float half = {0.5}> {
  d = Div (x, s)
  e = Erf (d)
  a = Add (e, one)
  m = Mul (x, a)
  y = Mul (m, half)
}
"#,
        );
    }

    #[test]
    fn wrong_constant_or_non_constant() {
        assert_unchanged(&FuseGelu, &ERF.replace("{1.4142135}", "{1.5}"));
        assert_unchanged(
            &FuseGelu,
            r#"
<ir_version: 9, opset_import: ["" : 20]>
g (float[4] x, float half) => (float[4] y) <float s = {1.4142135}, float one = {1.0}> {
  d = Div (x, s)
  e = Erf (d)
  a = Add (e, one)
  m = Mul (x, a)
  y = Mul (m, half)
}
"#,
        );
    }

    #[test]
    fn broadcasting_constant_is_not_fused() {
        // x is a scalar; a [1] constant would make the result [1].
        assert_unchanged(
            &FuseGelu,
            r#"
<ir_version: 9, opset_import: ["" : 20]>
g (float x) => (float[1] y) <float[1] s = {1.4142135}, float one = {1.0}, float half = {0.5}> {
  d = Div (x, s)
  e = Erf (d)
  a = Add (e, one)
  m = Mul (x, a)
  y = Mul (m, half)
}
"#,
        );
    }
}
