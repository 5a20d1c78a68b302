//! Parallel MatMul fusion: three or more `MatMul`s reading the same input
//! with constant 2-D weights of the same row count (attention's q/k/v
//! projections) become one `MatMul` on the weights concatenated along their
//! columns, followed by a `Split` of its last axis; when every one of them
//! feeds a bias `Add` of a constant 1-D bias (its only use), the biases are
//! concatenated too and added once, before the `Split`.
//!
//! Why: `n` MatMuls (+ `n` Adds) become 2 (+ 1) nodes and one large GEMM
//! instead of `n` small ones. Two MatMuls are left alone: MatMul + Split is
//! no fewer nodes.
//!
//! Guards: default domain, the weights are constants (initializers or
//! `Constant` nodes) of rank 2 and one element type, no MatMul (or fused
//! Add) output is a graph output, and the Split outputs take over the old
//! values, so readers are unchanged. Needs opset ≥ 13 (`Split` with a
//! `split` input). Not `exact()`: the wider GEMM may block its sums
//! differently, so results may differ in the last bits.
//!
//! Runs after `eliminate_noops` (zero biases are gone by then, so the
//! MatMuls of a bias-free export line up without Adds).
//!
//! ```text
//! before:                                  after:
//! q = MatMul (x, wq)                       qkv = MatMul (x, w_cat)
//! k = MatMul (x, wk)                       q, k, v = Split <axis = -1> (qkv, sizes)
//! v = MatMul (x, wv)
//! ```

use crate::pattern::{const_tensor, is_op, only_use, sweep_constants};
use crate::util::for_each_subgraph;
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{AttrValue, Attribute, DType, Graph, Model, NewNode, NodeId, Tensor, ValueId};

pub struct FuseParallelMatmul;

impl Pass for FuseParallelMatmul {
    fn name(&self) -> &'static str {
        "fuse_parallel_matmul"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        if model.onnx_opset().unwrap_or(0) < 13 {
            return Ok(stats);
        }
        for_each_subgraph(&mut model.graph, &mut |g| fuse(g, &mut stats))?;
        fuse(&mut model.graph, &mut stats)?;
        Ok(stats)
    }

    fn exact(&self) -> bool {
        false
    }
}


/// One MatMul of a group: the node, its weight, and its bias Add if any.
struct Member {
    mm: NodeId,
    w: ValueId,
    wt: Tensor,
    add: Option<(NodeId, ValueId, Tensor)>,
}

fn fuse(g: &mut Graph, stats: &mut PassStats) -> Result<(), PassError> {
    // Group candidate MatMuls by their first input, in program order.
    let mut groups: Vec<(ValueId, Vec<NodeId>)> = Vec::new();
    for n in g.nodes() {
        let d = g.node(n);
        if !is_op(d, "MatMul") {
            continue;
        }
        let (Some(a), Some(_), Some(y)) = (d.input(0), d.input(1), d.output(0)) else {
            continue;
        };
        if g.is_output(y) {
            continue;
        }
        match groups.iter_mut().find(|(v, _)| *v == a) {
            Some((_, ns)) => ns.push(n),
            None => groups.push((a, vec![n])),
        }
    }
    for (_, ns) in groups {
        let Some(members) = members(g, &ns) else {
            continue;
        };
        rewrite(g, members, stats)?;
    }
    Ok(())
}

/// The members of a group, when it has at least three and they agree.
fn members(g: &Graph, ns: &[NodeId]) -> Option<Vec<Member>> {
    let mut out: Vec<Member> = Vec::new();
    for &n in ns {
        let w = g.node(n).input(1)?;
        let Some(wt) = const_tensor(g, w) else {
            continue;
        };
        // Whole-byte element types only: rows are cut by byte counts.
        let whole_bytes = matches!(
            wt.dtype,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::I32 | DType::I64
        );
        if wt.dims.len() != 2 || wt.raw().is_none() || !whole_bytes {
            continue;
        }
        if let Some(first) = out.first() {
            if wt.dtype != first.wt.dtype || wt.dims[0] != first.wt.dims[0] {
                continue;
            }
        }
        out.push(Member {
            mm: n,
            w,
            wt,
            add: bias_add(g, n),
        });
    }
    if out.len() < 3 {
        return None;
    }
    // Biases are fused only when every member has one.
    if !out.iter().all(|m| m.add.is_some()) {
        for m in &mut out {
            m.add = None;
        }
    }
    Some(out)
}

/// `Add(MatMul(..), b)` (either side) with `b` a constant of shape `[N]`,
/// the MatMul's only reader, its output not a graph output.
fn bias_add(g: &Graph, mm: NodeId) -> Option<(NodeId, ValueId, Tensor)> {
    let y = g.node(mm).output(0)?;
    let n_cols = const_tensor(g, g.node(mm).input(1)?)?.dims.get(1).copied()?;
    let add = only_use(g, y)?;
    let d = g.node(add);
    if !is_op(d, "Add") || g.is_output(d.output(0)?) {
        return None;
    }
    let b = if d.input(0)? == y { d.input(1)? } else { d.input(0)? };
    let bt = const_tensor(g, b)?;
    (bt.dims == [n_cols] && bt.raw().is_some()).then_some((add, b, bt))
}

/// Concatenates 2-D row-major tensors along axis 1 (or 1-D ones).
fn concat_cols(ts: &[&Tensor]) -> Option<Tensor> {
    let rows = if ts[0].dims.len() == 2 { ts[0].dims[0] } else { 1 };
    let mut chunks: Vec<(&[u8], usize)> = Vec::new();
    for t in ts {
        let raw = t.raw()?;
        let row_bytes = raw.len() / rows as usize;
        chunks.push((raw, row_bytes));
    }
    let mut buf = Vec::with_capacity(chunks.iter().map(|c| c.0.len()).sum());
    for r in 0..rows as usize {
        for (raw, rb) in &chunks {
            buf.extend_from_slice(&raw[r * rb..(r + 1) * rb]);
        }
    }
    let cols: i64 = ts.iter().map(|t| *t.dims.last().unwrap_or(&0)).sum();
    let dims = if ts[0].dims.len() == 2 {
        vec![rows, cols]
    } else {
        vec![cols]
    };
    Tensor::from_raw(ts[0].dtype, dims, bytes::Bytes::from(buf)).ok()
}

fn rewrite(g: &mut Graph, ms: Vec<Member>, stats: &mut PassStats) -> Result<(), PassError> {
    let a = g.node(ms[0].mm).input(0).expect("grouped on input 0");
    let wts: Vec<&Tensor> = ms.iter().map(|m| &m.wt).collect();
    let Some(w_cat) = concat_cols(&wts) else {
        return Ok(());
    };
    let with_bias = ms.iter().all(|m| m.add.is_some());
    let b_cat = if with_bias {
        let bts: Vec<&Tensor> = ms.iter().map(|m| &m.add.as_ref().expect("checked").2).collect();
        match concat_cols(&bts) {
            Some(t) => Some(t),
            None => return Ok(()),
        }
    } else {
        None
    };
    // The values the Split hands back: the Adds' outputs, else the MatMuls'.
    let finals: Vec<ValueId> = ms
        .iter()
        .map(|m| {
            let n = m.add.as_ref().map_or(m.mm, |a| a.0);
            g.node(n).output(0).expect("checked output")
        })
        .collect();
    let sizes: Vec<i64> = ms.iter().map(|m| m.wt.dims[1]).collect();
    let mut remove: Vec<NodeId> = ms.iter().map(|m| m.mm).collect();
    remove.extend(ms.iter().filter_map(|m| m.add.as_ref().map(|a| a.0)));
    let mut read: Vec<ValueId> = ms.iter().map(|m| m.w).collect();
    read.extend(ms.iter().filter_map(|m| m.add.as_ref().map(|a| a.1)));
    let first = g
        .nodes()
        .find(|n| remove.contains(n))
        .expect("members are in the graph");
    // The new nodes take the first member's place: after its predecessor.
    let mut at = g.prev_node(first);
    let mm_outs: Vec<ValueId> = ms
        .iter()
        .filter(|m| m.add.is_some())
        .map(|m| g.node(m.mm).output(0).expect("checked output"))
        .collect();
    g.remove_nodes(&remove);
    for v in mm_outs {
        if g.uses(v).is_empty() {
            g.remove_value(v);
        }
    }
    let w = g.add_initializer("w_cat", w_cat);
    let mut cur = g.fresh_value("matmul_cat", None);
    let mut added = 0u64;
    let mut put = |g: &mut Graph, new: NewNode| -> Result<(), PassError> {
        let id = match at {
            Some(p) => g.insert_node_after(p, new)?,
            None => g.insert_node(0, new)?,
        };
        at = Some(id);
        added += 1;
        Ok(())
    };
    put(g, NewNode::new("MatMul").inputs(&[a, w]).outputs(&[cur]))?;
    if let Some(bt) = b_cat {
        let b = g.add_initializer("b_cat", bt);
        let sum = g.fresh_value("add_cat", None);
        put(g, NewNode::new("Add").inputs(&[cur, b]).outputs(&[sum]))?;
        cur = sum;
    }
    let split_sizes = Tensor::from_i64(vec![sizes.len() as i64], &sizes)?;
    let s = g.add_initializer("split", split_sizes);
    put(
        g,
        NewNode::new("Split")
            .inputs(&[cur, s])
            .outputs(&finals)
            .attr(Attribute::new("axis", AttrValue::Int(-1))),
    )?;
    sweep_constants(g, &read);
    let before = remove.len() as u64;
    stats.add("nodes_removed", before - added);
    stats.add("groups_fused", 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn qkv_with_biases() {
        assert_pass(
            &FuseParallelMatmul,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] x) => (float[N,1] y)
  <float[2,1] wq = {1, 2}, float[2,2] wk = {3, 4, 5, 6}, float[2,1] wv = {7, 8},
   float[1] bq = {1}, float[2] bk = {2, 3}, float[1] bv = {4}> {
  q0 = MatMul (x, wq)
  q = Add (q0, bq)
  k0 = MatMul (x, wk)
  k = Add (bk, k0)
  v0 = MatMul (x, wv)
  v = Add (v0, bv)
  s = ReduceSum <keepdims = 1> (k)
  t = Mul (q, s)
  y = Add (t, v)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] x) => (float[N,1] y)
  <float[2,4] w_cat = {1, 3, 4, 7, 2, 5, 6, 8}, float[4] b_cat = {1, 2, 3, 4}, int64[3] split = {1, 2, 1}> {
  matmul_cat = MatMul (x, w_cat)
  add_cat = Add (matmul_cat, b_cat)
  q, k, v = Split <axis = -1> (add_cat, split)
  s = ReduceSum <keepdims = 1> (k)
  t = Mul (q, s)
  y = Add (t, v)
}
"#,
        );
    }

    #[test]
    fn must_not_fire() {
        // 1. only two MatMuls share `x`; 2. a weight is not constant;
        // 3. an output is a graph output.
        assert_unchanged(
            &FuseParallelMatmul,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,2] x, float[2,1] w, float[N,2] z) => (float[N,1] y, float[N,1] o, float[N,1] o2)
  <float[2,1] wq = {1, 2}, float[2,1] wk = {3, 4}> {
  q = MatMul (x, wq)
  k = MatMul (x, wk)
  y = Add (q, k)
  a = MatMul (z, wq)
  b = MatMul (z, w)
  c = Add (a, b)
  o = MatMul (z, wk)
  o2 = Neg (c)
}
"#,
        );
    }
}
