//! MatMul + Add fusion into Gemm.
//!
//! `Add(MatMul(A, B), C)` ==> `Gemm(A, B, C)` where Gemm's rules allow it:
//! 1. `A` has rank 2 (from shape inference): Gemm has no batch dims, and
//!    flattening a rank-3 `A` would need Reshapes around it, which would
//!    not make the graph smaller;
//! 2. `B` is a rank-2 constant (a weight);
//! 3. `C` (a constant or a value of known shape) is unidirectionally
//!    broadcastable to `[M, N]`: shape `[]`, `[1]`, `[N]`, `[1, N]`,
//!    `[M, 1]`, `[M, N]` (M compared as a known or named dim), so the Add
//!    never broadcasts the product to a larger shape;
//! 4. the element type is a float type, and the MatMul output is read only
//!    by the Add; the default-domain opset is ≥ 7 (Gemm with broadcasting).
//!
//! The Gemm takes over the Add's output (its name is kept). Not exact:
//! a Gemm kernel may accumulate and add the bias in a different order.
//! Works in subgraphs.
//!
//! ```text
//! before:                                      after:
//! g (float[N,4] a) => (float[N,3] y)           g (float[N,4] a) => (float[N,3] y)
//!   <float[4,3] w = {...}, float[3] b = {...}>   <float[4,3] w = {...}, float[3] b = {...}> {
//! {                                              y = Gemm (a, w, b)
//!   t = MatMul (a, w)                          }
//!   y = Add (t, b)
//! }
//! ```

use crate::pattern::{
    const_tensor, is_op, only_use, replace_nodes, walk_typed, TypedGraph,
};
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::{DType, Dim, Graph, Model, NewNode, NodeId, ValueId};

pub struct FuseMatmulAdd;

impl Pass for FuseMatmulAdd {
    fn name(&self) -> &'static str {
        "fuse_matmul_add"
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

fn fuse(g: &mut Graph, t: &TypedGraph, stats: &mut PassStats) -> Result<(), PassError> {
    for mm in g.nodes().collect::<Vec<_>>() {
        if !g.is_live_node(mm) || !is_op(g.node(mm), "MatMul") {
            continue;
        }
        let Some((a, b, c, add)) = match_gemm(g, t, mm) else {
            continue;
        };
        let y = g.node(add).output(0).expect("Add has an output");
        let new = NewNode::new("Gemm")
            .name(g.node(mm).name.clone())
            .inputs(&[a, b, c])
            .outputs(&[y]);
        replace_nodes(g, &[mm, add], add, new)?;
        stats.add("gemms", 1);
        stats.add("nodes_removed", 1);
    }
    Ok(())
}

fn match_gemm(g: &Graph, t: &TypedGraph, mm: NodeId) -> Option<(ValueId, ValueId, ValueId, NodeId)> {
    let d = g.node(mm);
    if d.inputs().len() != 2 {
        return None;
    }
    let (a, b, p) = (d.input(0)?, d.input(1)?, d.output(0)?);
    let a_shape = t.shape(a).filter(|s| s.rank() == 2)?;
    let elem = t.elem(a)?;
    if !matches!(elem, DType::F32 | DType::F16 | DType::F64 | DType::BF16) {
        return None;
    }
    let bt = const_tensor(g, b)?;
    if bt.dims.len() != 2 || bt.dtype != elem {
        return None;
    }
    let k = &a_shape.dims[1];
    if k.known().is_some_and(|k| k != bt.dims[0]) {
        return None;
    }
    let n = bt.dims[1];
    let add = only_use(g, p)?;
    let ad = g.node(add);
    if !is_op(ad, "Add") || ad.inputs().len() != 2 {
        return None;
    }
    let c = if ad.input(0)? == p { ad.input(1)? } else { ad.input(0)? };
    if c == p {
        return None;
    }
    let c_dims: Vec<Dim> = match const_tensor(g, c) {
        Some(ct) => {
            if ct.dtype != elem {
                return None;
            }
            ct.dims.iter().map(|&d| Dim::Known(d)).collect()
        }
        None => {
            if t.elem(c)? != elem {
                return None;
            }
            t.shape(c)?.dims.clone()
        }
    };
    let m = &a_shape.dims[0];
    let ok = match c_dims.as_slice() {
        [] => true,
        [last] => is_one_or(last, &Dim::Known(n)),
        [first, last] => is_one_or(first, m) && is_one_or(last, &Dim::Known(n)),
        _ => false,
    };
    ok.then_some((a, b, c, add))
}

/// True when `d` is 1 or the same known or named size as `want`.
fn is_one_or(d: &Dim, want: &Dim) -> bool {
    match (d, want) {
        (Dim::Known(1), _) => true,
        (Dim::Known(x), Dim::Known(y)) => x == y,
        (Dim::Sym(x), Dim::Sym(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn bias_row() {
        assert_pass(
            &FuseMatmulAdd,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] a) => (float[N,3] y) <float[2,3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, float[3] b = {1.0, 1.0, 1.0}> {
  t = MatMul (a, w)
  y = Add (b, t)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] a) => (float[N,3] y) <float[2,3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, float[3] b = {1.0, 1.0, 1.0}> {
  y = Gemm (a, w, b)
}
"#,
        );
    }

    #[test]
    fn rank_3_input_is_left_alone() {
        assert_unchanged(
            &FuseMatmulAdd,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[B,N,2] a) => (float[B,N,3] y) <float[2,3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, float[3] b = {1.0, 1.0, 1.0}> {
  t = MatMul (a, w)
  y = Add (t, b)
}
"#,
        );
    }

    #[test]
    fn broadcasting_bias_and_shared_product_are_left_alone() {
        // [2,N,3] bias would broadcast the product up.
        assert_unchanged(
            &FuseMatmulAdd,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] a, float[2,N,3] b) => (float[2,N,3] y) <float[2,3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}> {
  t = MatMul (a, w)
  y = Add (t, b)
}
"#,
        );
        assert_unchanged(
            &FuseMatmulAdd,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] a) => (float[N,3] y, float[N,3] t) <float[2,3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, float[3] b = {1.0, 1.0, 1.0}> {
  t = MatMul (a, w)
  y = Add (t, b)
}
"#,
        );
    }

    #[test]
    fn non_constant_weight_or_column_mismatch() {
        assert_unchanged(
            &FuseMatmulAdd,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] a, float[2,3] w) => (float[N,3] y) <float[3] b = {1.0, 1.0, 1.0}> {
  t = MatMul (a, w)
  y = Add (t, b)
}
"#,
        );
        assert_unchanged(
            &FuseMatmulAdd,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] a, float[M,3] b) => (float[N,3] y) <float[2,3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}> {
  t = MatMul (a, w)
  y = Add (t, b)
}
"#,
        );
    }
}
