//! The reshape sandwich: an element-wise chain between two Reshapes that
//! put the data back in its original shape.
//!
//! `a = Reshape(x, s1); b = f(a); y = Reshape(b, s2)` ==> `y = f(x)` when
//! 1. `f` is a small DAG of element-wise nodes (unary ops, and binary or
//!    variadic ones such as `Add`/`Mul`/`Pow`/`Max`/`Clip`/`Where`) whose
//!    every input is `a`, another node of the DAG, or a constant with one
//!    element and no more dims than `x` (so it broadcasts nothing);
//! 2. each value the DAG computes is read only inside it (`b` only by the
//!    outer Reshape), none is a graph output, and `a` is read only by it;
//! 3. `y`'s inferred shape is `x`'s (known dims, or the same symbolic ones).
//!
//! Why it is exact: a Reshape keeps the elements in row-major order (so `a`
//! has `x`'s element count and order), and an element-wise op with one-element
//! operands computes each output element from the element at the same flat
//! position. So `f` on `x` gives, element for element, what `f` on `a` gave,
//! in `x`'s shape, which is `y`'s. GPT-2's dynamo export wraps its tanh-GELU
//! this way (`[B*S,4H]` -> `[B,S,4H]` -> GELU -> `[B*S,4H]`).
//!
//! The DAG's values change shape, so their declared types take `x`'s shape
//! (keeping their element type); `b` takes over `y` (and its name, when `y`
//! is a graph output, through [`bypass`]).
//!
//! ```text
//! before:                                     after:
//! g (float[6,4] x) => (float[6,4] y)          g (float[6,4] x) => (float[6,4] y) {
//!     <int64[3] s1 = {2, 3, 4},                 t = Tanh (x)
//!      int64[2] s2 = {-1, 4}, float h = {0.5}>  y = Mul (t, h)
//! {                                           }
//!   a = Reshape (x, s1)
//!   t = Tanh (a)
//!   b = Mul (t, h)
//!   y = Reshape (b, s2)
//! }
//! ```

use super::{drop_if_dead, same_shape};
use crate::pattern::{const_tensor, is_op, sweep_constants, TypedGraph};
use crate::util::bypass;
use crate::{PassError, PassStats};
use graphopt_ir::{Graph, NodeId, Use, ValueId};

/// Most nodes a chain may have (GPT-2's tanh-GELU has 7).
const MAX_CHAIN: usize = 32;

/// Ops that compute each output element from the inputs' elements at the
/// same (broadcast) position, with no attribute that depends on the shape.
fn elementwise(op: &str) -> bool {
    matches!(
        op,
        "Abs" | "Acos" | "Acosh" | "Asin" | "Asinh" | "Atan" | "Atanh" | "Ceil" | "Cos"
            | "Cosh" | "Erf" | "Exp" | "Floor" | "Log" | "Neg" | "Not" | "Reciprocal"
            | "Relu" | "Round" | "Sigmoid" | "Sign" | "Sin" | "Sinh" | "Softplus"
            | "Softsign" | "Sqrt" | "Tan" | "Tanh" | "Elu" | "Selu" | "Celu" | "LeakyRelu"
            | "ThresholdedRelu" | "HardSigmoid" | "HardSwish" | "Gelu" | "Mish" | "IsNaN"
            | "IsInf" | "Cast" | "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Max"
            | "Min" | "And" | "Or" | "Xor" | "Equal" | "Less" | "Greater" | "LessOrEqual"
            | "GreaterOrEqual" | "BitShift" | "Clip" | "Where"
    )
}

/// The chain feeding `b`: its nodes (in no particular order), the value `a`
/// it starts from (output of a Reshape), and its constant operands.
struct Chain {
    nodes: Vec<NodeId>,
    a: ValueId,
    consts: Vec<ValueId>,
}

/// Walks back from `b` through element-wise nodes until every path ends at
/// the same Reshape output or a one-element constant.
fn collect(g: &Graph, b: ValueId) -> Option<Chain> {
    let mut nodes: Vec<NodeId> = Vec::new();
    let mut consts: Vec<ValueId> = Vec::new();
    let mut a: Option<ValueId> = None;
    let mut seen: Vec<ValueId> = Vec::new();
    let mut stack = vec![b];
    while let Some(v) = stack.pop() {
        if seen.contains(&v) {
            continue;
        }
        seen.push(v);
        let (p, _) = g.producer(v)?;
        let d = g.node(p);
        if is_op(d, "Reshape") && v != b {
            if a.is_some_and(|a| a != v) {
                return None;
            }
            a = Some(v);
            continue;
        }
        let default_domain = d.domain.is_empty() || d.domain == "ai.onnx";
        if !default_domain || !elementwise(&d.op_type) || d.has_subgraphs() {
            return None;
        }
        if d.outputs().len() != 1 || nodes.len() >= MAX_CHAIN {
            return None;
        }
        nodes.push(p);
        let mut reads_chain = false;
        for &i in d.inputs().iter().flatten() {
            if const_tensor(g, i).is_some_and(|c| c.dims.iter().all(|&d| d == 1)) {
                consts.push(i);
            } else {
                reads_chain = true;
                stack.push(i);
            }
        }
        // A node of constants only would keep its own (one-element) shape.
        if !reads_chain {
            return None;
        }
    }
    Some(Chain {
        nodes,
        a: a?,
        consts,
    })
}

/// True when every use of `v` is an input of a node in `nodes`.
fn read_only_by(g: &Graph, v: ValueId, nodes: &[NodeId]) -> bool {
    !g.is_output(v)
        && g.uses(v)
            .iter()
            .all(|u| matches!(u, Use::Input { node, .. } if nodes.contains(node)))
}

/// `y = Reshape(f(Reshape(x, s1)), s2)` with `y` shaped like `x` and `f`
/// element-wise ==> `y = f(x)` (the module doc gives the conditions).
/// `n` is the outer Reshape. Returns whether it fired.
pub(super) fn fold(
    g: &mut Graph,
    t: &TypedGraph,
    n: NodeId,
    stats: &mut PassStats,
) -> Result<bool, PassError> {
    let d = g.node(n);
    let (Some(b), Some(s2), Some(y)) = (d.input(0), d.input(1), d.output(0)) else {
        return Ok(false);
    };
    let Some(chain) = collect(g, b) else {
        return Ok(false);
    };
    let a = chain.a;
    let (p, _) = g.producer(a).expect("collect found a's producer");
    let Some(x) = g.node(p).input(0) else {
        return Ok(false);
    };
    // y must have x's shape: then f(x) has y's shape when no constant
    // has more dims than x.
    let Some(rank) = t.rank(x) else {
        return Ok(false);
    };
    if !same_shape(t, x, y, true) {
        return Ok(false);
    }
    let consts_fit = chain
        .consts
        .iter()
        .all(|&c| const_tensor(g, c).is_some_and(|c| c.dims.len() <= rank));
    if !consts_fit {
        return Ok(false);
    }
    // Nothing outside the chain may see a value whose shape changes.
    let b_only_by_n = !g.is_output(b)
        && matches!(g.uses(b), [Use::Input { node, slot: 0 }] if *node == n);
    let inner_ok = chain.nodes.iter().all(|&c| {
        let o = g.node(c).output(0).expect("collect checks one output");
        o == b || read_only_by(g, o, &chain.nodes)
    });
    if !b_only_by_n || !inner_ok || !read_only_by(g, a, &chain.nodes) {
        return Ok(false);
    }
    let y_typed = g.is_output(y) && g.ty(y).is_some();
    if !bypass(g, n, b, stats)? {
        return Ok(false);
    }
    // Stale types: the chain's values now have x's shape (`b`, when it took
    // over the graph output `y`, has `y`'s declared type already).
    let x_shape = g.ty(x).and_then(|ty| ty.shape()).cloned();
    for &c in &chain.nodes {
        let o = g.node(c).output(0).expect("collect checks one output");
        if o == b && y_typed {
            continue;
        }
        let vd = g.value_mut(o);
        match vd.ty.as_mut().and_then(|ty| ty.as_tensor_mut()) {
            Some(tt) => tt.shape = x_shape.clone(),
            None => vd.ty = None,
        }
    }
    for &c in &chain.nodes {
        let slots: Vec<usize> = (g.node(c).inputs().iter().enumerate())
            .filter(|(_, i)| **i == Some(a))
            .map(|(s, _)| s)
            .collect();
        for s in slots {
            g.set_input(c, s, Some(x));
        }
    }
    drop_if_dead(g, p, stats);
    sweep_constants(g, &[s2]);
    stats.add("sandwiches_folded", 1);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::EliminateNoops;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn doc_example() {
        assert_pass(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x) => (float[6,4] y)
  <int64[3] s1 = {2, 3, 4}, int64[2] s2 = {-1, 4}, float h = {0.5}> {
  a = Reshape (x, s1)
  t = Tanh (a)
  b = Mul (t, h)
  y = Reshape (b, s2)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x) => (float[6,4] y) <float h = {0.5}> {
  t = Tanh (x)
  y = Mul (t, h)
}
"#,
        );
    }

    #[test]
    fn non_scalar_operand_is_kept() {
        // w broadcasts along a's last dim, which is not x's.
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x) => (float[6,4] y)
  <int64[3] s1 = {2, 3, 4}, int64[2] s2 = {-1, 4}, float[4] w = {1, 2, 3, 4}> {
  a = Reshape (x, s1)
  t = Tanh (a)
  b = Mul (t, w)
  y = Reshape (b, s2)
}
"#,
        );
    }

    #[test]
    fn operand_with_more_dims_than_x_is_kept() {
        // f(x) would be [1,1,6] where y is [6].
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6] x) => (float[6] y)
  <int64[2] s1 = {2, 3}, int64[1] s2 = {6}, float[1,1,1] w = {2}> {
  a = Reshape (x, s1)
  b = Mul (a, w)
  y = Reshape (b, s2)
}
"#,
        );
    }

    #[test]
    fn non_constant_operand_is_kept() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x, float v) => (float[6,4] y) <int64[3] s1 = {2, 3, 4}, int64[2] s2 = {-1, 4}> {
  a = Reshape (x, s1)
  b = Mul (a, v)
  y = Reshape (b, s2)
}
"#,
        );
    }

    #[test]
    fn intermediate_read_outside_is_kept() {
        // t is also read by the ReduceSum; a by Shape.
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x) => (float[6,4] y, float[1,1,1] r, int64[3] sh)
  <int64[3] s1 = {2, 3, 4}, int64[2] s2 = {-1, 4}, float h = {0.5}> {
  a = Reshape (x, s1)
  t = Tanh (a)
  b = Mul (t, h)
  y = Reshape (b, s2)
  r = ReduceSum (t)
  a3 = Reshape (x, s1)
  t3 = Tanh (a3)
  b3 = Reshape (t3, s2)
  sh = Shape (a3)
}
"#,
        );
    }

    #[test]
    fn target_not_shape_of_x_is_kept() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x) => (float[4,6] y)
  <int64[3] s1 = {2, 3, 4}, int64[2] s2 = {4, 6}, float h = {0.5}> {
  a = Reshape (x, s1)
  t = Tanh (a)
  b = Mul (t, h)
  y = Reshape (b, s2)
}
"#,
        );
    }

    #[test]
    fn graph_output_in_the_middle_is_kept() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x) => (float[6,4] y, float[2,3,4] t)
  <int64[3] s1 = {2, 3, 4}, int64[2] s2 = {-1, 4}, float h = {0.5}> {
  a = Reshape (x, s1)
  t = Tanh (a)
  b = Mul (t, h)
  y = Reshape (b, s2)
}
"#,
        );
    }

    #[test]
    fn non_elementwise_op_is_kept() {
        assert_unchanged(
            &EliminateNoops,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[6,4] x) => (float[6,4] y) <int64[3] s1 = {2, 3, 4}, int64[2] s2 = {-1, 4}> {
  a = Reshape (x, s1)
  b = Softmax (a)
  y = Reshape (b, s2)
}
"#,
        );
    }
}
