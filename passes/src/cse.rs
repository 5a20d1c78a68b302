//! Common-subexpression elimination.
//!
//! Two nodes with the same op, domain, overload, attributes (compared bit
//! for bit: `0.0` and `-0.0` differ, as do NaN payloads) and the same input
//! values compute the same outputs, so the later one goes and its readers
//! read the earlier one's outputs. Program order is walked once: a node's
//! inputs are already canonical when it is visited, so whole duplicated
//! chains collapse in one run (`Shape(x)` exported ten times, the
//! `Gather`/`Unsqueeze` after each, ...). The first node in program order is
//! the one kept, so the result is deterministic.
//!
//! Never merged:
//! 1. nondeterministic ops (`RandomNormal`, `RandomUniform`, their `Like`
//!    forms, `Multinomial`, `Bernoulli`, `Dropout` — random in training
//!    mode);
//! 2. nodes outside the default ONNX domain (a custom op may have state);
//! 3. nodes holding subgraphs (skipping them is simpler than comparing
//!    graphs structurally, and they are rarely duplicated);
//! 4. a copy that `remat` inserted to recompute a value (metadata
//!    `graphopt.remat`): merging it would undo the rematerialization;
//! 5. a node one of whose outputs is a graph output (the name is part of
//!    the interface) — it is kept, and later duplicates can merge into it.
//!
//! Identical *initializers* are `dedup_initializers`' job; run it before
//! this pass so that nodes reading equal constants are seen as equal.
//! Runs inside subgraphs too. Exact: no arithmetic changes.
//!
//! ```text
//! before:                                  after:
//! g (float[N,4] x) => (float[N,4] y) {     g (float[N,4] x) => (float[N,4] y) {
//!   a = Relu (x)                             a = Relu (x)
//!   b = Relu (x)                             y = Add (a, a)
//!   y = Add (a, b)                         }
//! }
//! ```

use crate::util::for_each_subgraph;
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{AttrValue, Attribute, Graph, Model, NodeData, NodeId, Tensor, TensorData};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for_each_subgraph(&mut model.graph, &mut |g| cse(g, &mut stats))?;
        cse(&mut model.graph, &mut stats)?;
        Ok(stats)
    }
}

const NONDETERMINISTIC: &[&str] = &[
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
];

fn cse(g: &mut Graph, stats: &mut PassStats) -> Result<(), PassError> {
    // Hash of a node's key -> nodes kept with that hash, in program order.
    let mut seen: HashMap<u64, Vec<NodeId>> = HashMap::new();
    for n in g.order().to_vec() {
        let node = g.node(n);
        if !eligible(node) {
            continue;
        }
        let h = key_hash(node);
        let prev = seen
            .get(&h)
            .and_then(|c| c.iter().copied().find(|&m| same(g.node(m), node)));
        let Some(keep) = prev else {
            seen.entry(h).or_default().push(n);
            continue;
        };
        if node.outputs().iter().flatten().any(|&o| g.is_output(o)) {
            continue;
        }
        let pairs: Vec<_> = node
            .outputs()
            .iter()
            .zip(g.node(keep).outputs())
            .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
            .collect();
        g.remove_node(n);
        for (dup, kept) in pairs {
            g.replace_all_uses(dup, kept)?;
            g.remove_value(dup);
        }
        stats.add("nodes_removed", 1);
    }
    Ok(())
}

fn eligible(n: &NodeData) -> bool {
    (n.domain.is_empty() || n.domain == "ai.onnx")
        && !NONDETERMINISTIC.contains(&n.op_type.as_str())
        && !n.has_subgraphs()
        && !n.outputs().is_empty()
        && !crate::remat::is_recompute(n)
}

/// Same computation: op, overload, inputs, output arity and attributes.
fn same(a: &NodeData, b: &NodeData) -> bool {
    a.op_type == b.op_type
        && a.domain == b.domain
        && a.overload == b.overload
        && a.inputs() == b.inputs()
        && a.outputs().len() == b.outputs().len()
        && a.outputs()
            .iter()
            .zip(b.outputs())
            .all(|(x, y)| x.is_some() == y.is_some())
        && a.attributes.len() == b.attributes.len()
        && a.attributes.iter().all(|x| {
            b.attr(&x.name)
                .is_some_and(|y| attr_value_eq(&x.value, &y.value))
        })
}

fn key_hash(n: &NodeData) -> u64 {
    let mut h = DefaultHasher::new();
    n.op_type.hash(&mut h);
    n.domain.hash(&mut h);
    n.inputs().hash(&mut h);
    n.outputs().len().hash(&mut h);
    let mut attrs: Vec<&Attribute> = n.attributes.iter().collect();
    attrs.sort_by(|a, b| a.name.cmp(&b.name));
    for a in attrs {
        a.name.hash(&mut h);
        hash_attr(&a.value, &mut h);
    }
    h.finish()
}

/// Hashes the cheap parts of an attribute (tensor payloads only by length:
/// [`same`] compares them in full).
fn hash_attr(v: &AttrValue, h: &mut DefaultHasher) {
    std::mem::discriminant(v).hash(h);
    match v {
        AttrValue::Float(f) => f.to_bits().hash(h),
        AttrValue::Int(i) => i.hash(h),
        AttrValue::String(s) => s.hash(h),
        AttrValue::Floats(f) => f.iter().for_each(|x| x.to_bits().hash(h)),
        AttrValue::Ints(i) => i.hash(h),
        AttrValue::Strings(s) => s.hash(h),
        AttrValue::Tensor(t) => (t.dtype, &t.dims, t.nbytes()).hash(h),
        _ => {}
    }
}

/// Bitwise equality of attribute values (floats by bits).
fn attr_value_eq(a: &AttrValue, b: &AttrValue) -> bool {
    use AttrValue as V;
    let fbits = |x: &[f32], y: &[f32]| {
        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
    };
    match (a, b) {
        (V::Float(x), V::Float(y)) => x.to_bits() == y.to_bits(),
        (V::Floats(x), V::Floats(y)) => fbits(x, y),
        (V::Tensor(x), V::Tensor(y)) => tensor_eq(x, y),
        (V::Tensors(x), V::Tensors(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| tensor_eq(p, q))
        }
        (V::SparseTensor(x), V::SparseTensor(y)) => {
            x.dims == y.dims && tensor_eq(&x.values, &y.values) && tensor_eq(&x.indices, &y.indices)
        }
        // Subgraph-holding nodes are never compared.
        (V::Graph(_), _) | (V::Graphs(_), _) | (V::SparseTensors(_), _) => false,
        (x, y) => x == y,
    }
}

/// Same dtype, dims and payload bytes (a tensor attribute's own name and
/// doc do not change what it computes).
pub(crate) fn tensor_eq(a: &Tensor, b: &Tensor) -> bool {
    a.dtype == b.dtype
        && a.dims == b.dims
        && match (&a.data, &b.data) {
            (TensorData::Raw(x), TensorData::Raw(y)) => x == y,
            (TensorData::Strings(x), TensorData::Strings(y)) => x == y,
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn merges_duplicate_chains() {
        assert_pass(
            &Cse,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,4] x) => (float[N,4] y) <int64[1] i = {0}> {
  s1 = Shape (x)
  g1 = Gather (s1, i)
  s2 = Shape (x)
  g2 = Gather (s2, i)
  c = Concat <axis = 0> (g1, g2)
  y = Reshape (x, c)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,4] x) => (float[N,4] y) <int64[1] i = {0}> {
  s1 = Shape (x)
  g1 = Gather (s1, i)
  c = Concat <axis = 0> (g1, g1)
  y = Reshape (x, c)
}
"#,
        );
    }

    #[test]
    fn attributes_compare_bitwise() {
        assert_unchanged(
            &Cse,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  a = LeakyRelu <alpha = 0.0> (x)
  b = LeakyRelu <alpha = -0.0> (x)
  y = Add (a, b)
}
"#,
        );
    }

    #[test]
    fn random_ops_and_graph_outputs_stay() {
        assert_unchanged(
            &Cse,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y, float[2] z, float[2] w) {
  r1 = RandomUniformLike (x)
  r2 = RandomUniformLike (x)
  y = Add (r1, r2)
  z = Neg (x)
  w = Neg (x)
}
"#,
        );
    }

    #[test]
    fn multi_output_nodes_merge_slot_by_slot() {
        assert_pass(
            &Cse,
            r#"
<ir_version: 8, opset_import: ["" : 18]>
g (float[4] x) => (float[2] y) {
  a, b = Split <num_outputs = 2> (x)
  c, d = Split <num_outputs = 2> (x)
  y = Sub (b, d)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 18]>
g (float[4] x) => (float[2] y) {
  a, b = Split <num_outputs = 2> (x)
  y = Sub (b, b)
}
"#,
        );
    }
}
