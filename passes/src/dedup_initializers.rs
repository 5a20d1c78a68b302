//! Initializer deduplication.
//!
//! Initializers with the same dtype, dims and bytes (every dtype: floats
//! compare by bits, so `0.0` and `-0.0` stay apart; strings element by
//! element) are one tensor: readers of the later ones read the first (in
//! initializer order), and the copies go. Candidates are grouped by a hash
//! of dtype, dims and content, and confirmed by a full comparison.
//!
//! 1. Weights that are already tied (one initializer read by several nodes)
//!    stay tied; nothing is ever untied.
//! 2. A graph input with an initializer is an overridable default, not a
//!    constant: it is never merged, neither into another nor another into it.
//! 3. An initializer that is a graph output keeps its name: it can be the
//!    kept copy, never the dropped one.
//! 4. Initializers nothing reads (and that are not graph inputs or outputs)
//!    are removed.
//!
//! Works in each subgraph on its own initializers. Reports
//! `initializers_removed` and `bytes_saved`. Exact.
//!
//! ```text
//! before:                                     after:
//! g (float[2] x) => (float[2] y)              g (float[2] x) => (float[2] y)
//!   <float[2] a = {1, 2}, float[2] b = {1, 2},  <float[2] a = {1, 2}> {
//!    float[2] unused = {0, 0}> {                 t = Mul (x, a)
//!   t = Mul (x, a)                               y = Add (t, a)
//!   y = Add (t, b)                             }
//! }
//! ```

use crate::cse::tensor_eq;
use crate::util::for_each_subgraph;
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{DType, Graph, Model, Tensor, TensorData, ValueId};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

pub struct DedupInitializers;

impl Pass for DedupInitializers {
    fn name(&self) -> &'static str {
        "dedup_initializers"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for_each_subgraph(&mut model.graph, &mut |g| dedup(g, &mut stats))?;
        dedup(&mut model.graph, &mut stats)?;
        Ok(stats)
    }
}

fn content_hash(t: &Tensor) -> u64 {
    let mut h = DefaultHasher::new();
    (t.dtype, &t.dims).hash(&mut h);
    match &t.data {
        TensorData::Raw(b) => b.as_ref().hash(&mut h),
        TensorData::Strings(s) => s.hash(&mut h),
    }
    h.finish()
}

fn dedup(g: &mut Graph, stats: &mut PassStats) -> Result<(), PassError> {
    // Unread initializers first, so they are never chosen as the kept copy.
    for v in g.initializers().to_vec() {
        if g.uses(v).is_empty() && !g.is_output(v) && !g.is_input(v) {
            if let Some(t) = g.take_initializer(v) {
                stats.add("bytes_saved", t.nbytes());
                stats.add("initializers_removed", 1);
            }
            g.remove_value(v);
        }
    }
    // Only same dtype and dims can be equal: hash the content of those
    // that share both with another initializer, not of every weight.
    let mut shapes: HashMap<(DType, Vec<i64>), usize> = HashMap::new();
    for &v in g.initializers() {
        let t = g.initializer(v).expect("listed as an initializer");
        if !g.is_input(v) {
            *shapes.entry((t.dtype, t.dims.clone())).or_default() += 1;
        }
    }
    let mut groups: HashMap<u64, Vec<ValueId>> = HashMap::new();
    let mut merges: Vec<(ValueId, ValueId)> = Vec::new();
    for v in g.initializers().to_vec() {
        if g.is_input(v) {
            continue;
        }
        let t = g.initializer(v).expect("listed as an initializer");
        if shapes.get(&(t.dtype, t.dims.clone())).copied().unwrap_or(0) < 2 {
            continue;
        }
        let cands = groups.entry(content_hash(t)).or_default();
        let hit = cands
            .iter()
            .copied()
            .find(|&k| tensor_eq(g.initializer(k).expect("kept"), t));
        match hit {
            Some(keep) if !g.is_output(v) => merges.push((v, keep)),
            // A graph output keeps its own copy (and can be kept for later
            // duplicates).
            _ => cands.push(v),
        }
    }
    for (dup, keep) in merges {
        g.replace_all_uses(dup, keep)?;
        if let Some(t) = g.take_initializer(dup) {
            stats.add("bytes_saved", t.nbytes());
            stats.add("initializers_removed", 1);
        }
        g.remove_value(dup);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn merges_equal_and_drops_unused() {
        assert_pass(
            &DedupInitializers,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) <float[2] a = {1.0, 2.0}, float[2] b = {1.0, 2.0}, float[2] unused = {0.0, 0.0}> {
  t = Mul (x, a)
  y = Add (t, b)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) <float[2] a = {1.0, 2.0}> {
  t = Mul (x, a)
  y = Add (t, a)
}
"#,
        );
    }

    #[test]
    fn keeps_signed_zeros_dtypes_dims_and_overridable_inputs_apart() {
        assert_unchanged(
            &DedupInitializers,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, float[2] d) => (float[2] y) <float[2] d = {1.0, 2.0}, float[2] a = {1.0, 2.0}, float[2] z = {0.0, 0.0}, float[2] nz = {-0.0, 0.0}, int32[2] i = {1, 2}, int32[1,2] j = {1, 2}> {
  t1 = Mul (x, a)
  t2 = Mul (t1, d)
  t3 = Add (t2, z)
  t4 = Add (t3, nz)
  c = Concat <axis = 0> (i, i)
  r = Reshape (j, c)
  y = Identity (t4)
}
"#,
        );
    }

    #[test]
    fn graph_output_initializer_keeps_its_name() {
        assert_pass(
            &DedupInitializers,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y, float[2] o) <float[2] a = {1.0, 2.0}, float[2] o = {1.0, 2.0}, float[2] b = {1.0, 2.0}> {
  t = Mul (x, a)
  y = Add (t, b)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y, float[2] o) <float[2] a = {1.0, 2.0}, float[2] o = {1.0, 2.0}> {
  t = Mul (x, a)
  y = Add (t, a)
}
"#,
        );
    }
}
