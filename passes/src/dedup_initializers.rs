//! Initializer deduplication.
//!
//! Initializers with the same dtype, dims and bytes (every dtype: floats
//! compare by bits, so `0.0` and `-0.0` stay apart; strings element by
//! element) are one tensor: readers of the later ones read the first (in
//! initializer order), and the copies go. Candidates are grouped by dtype,
//! dims and a fingerprint of 64 sampled words (constant time per tensor),
//! then by a full content hash, and confirmed by a full comparison. Only
//! tensors whose samples match another's are read in full, so a model whose
//! weights are all distinct costs a few page reads per weight in every
//! fixed-point round, not a pass over all its bytes (BERT-base: 440 MB).
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

/// Words sampled for the fingerprint.
const SAMPLES: usize = 64;

/// A constant-time fingerprint: the length and [`SAMPLES`] evenly spaced
/// 8-byte words (all bytes of small tensors). Equal tensors have equal
/// fingerprints.
fn sample_key(t: &Tensor) -> u64 {
    let mut h = DefaultHasher::new();
    match &t.data {
        TensorData::Raw(b) if b.len() > SAMPLES * 8 => {
            b.len().hash(&mut h);
            let last = b.len() - 8;
            for i in 0..SAMPLES {
                let at = i * last / (SAMPLES - 1);
                b[at..at + 8].hash(&mut h);
            }
        }
        TensorData::Raw(b) => b.as_ref().hash(&mut h),
        TensorData::Strings(s) => s.hash(&mut h),
    }
    h.finish()
}

/// A hash of all the content, at about memory speed: four independent
/// multiply-rotate lanes over little-endian words.
fn content_hash(t: &Tensor) -> u64 {
    const K: [u64; 4] = [
        0x9E37_79B9_7F4A_7C15,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
        0x85EB_CA77_C2B2_AE63,
    ];
    let b = match &t.data {
        TensorData::Raw(b) => b.as_ref(),
        TensorData::Strings(s) => {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            return h.finish();
        }
    };
    let mut lanes = K;
    let mut chunks = b.chunks_exact(32);
    for c in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            *lane = (*lane ^ w).wrapping_mul(K[i]).rotate_left(29);
        }
    }
    let mut h = DefaultHasher::new();
    (b.len(), lanes, chunks.remainder()).hash(&mut h);
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
    // Only same dtype, dims and sampled words can be equal: hash the full
    // content of those that share all three with another initializer, not
    // of every weight.
    let mut keys: HashMap<ValueId, (DType, Vec<i64>, u64)> = HashMap::new();
    let mut counts: HashMap<(DType, Vec<i64>, u64), usize> = HashMap::new();
    for &v in g.initializers() {
        let t = g.initializer(v).expect("listed as an initializer");
        if !g.is_input(v) {
            let key = (t.dtype, t.dims.clone(), sample_key(t));
            *counts.entry(key.clone()).or_default() += 1;
            keys.insert(v, key);
        }
    }
    let mut groups: HashMap<(u64, u64), Vec<ValueId>> = HashMap::new();
    let mut merges: Vec<(ValueId, ValueId)> = Vec::new();
    for v in g.initializers().to_vec() {
        let Some(key) = keys.get(&v) else {
            continue;
        };
        if counts.get(key).copied().unwrap_or(0) < 2 {
            continue;
        }
        let t = g.initializer(v).expect("listed as an initializer");
        let cands = groups.entry((key.2, content_hash(t))).or_default();
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

    /// Tensors above the sampled size: equal ones merge, and ones that
    /// differ only between sampled words stay apart.
    #[test]
    fn large_tensors_compare_in_full() {
        let vals = |k: usize| {
            (0..300)
                .map(|i| if i == k { "7.0".to_string() } else { format!("{i}.0") })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (a, b, c) = (vals(999), vals(999), vals(150));
        let before = format!(
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[300] x) => (float[300] y) <float[300] a = {{{a}}}, float[300] b = {{{b}}}, float[300] c = {{{c}}}> {{
  t = Mul (x, a)
  u = Add (t, b)
  y = Sub (u, c)
}}
"#
        );
        let after = format!(
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[300] x) => (float[300] y) <float[300] a = {{{a}}}, float[300] c = {{{c}}}> {{
  t = Mul (x, a)
  u = Add (t, a)
  y = Sub (u, c)
}}
"#
        );
        assert_pass(&DedupInitializers, &before, &after);
    }
}
