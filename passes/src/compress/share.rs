//! `share`: weights that are equal, or within a relative L2 distance of
//! each other, become one tensor (see the module doc of `compress`).
//!
//! In initializer order, each weight is compared with the weights of its
//! shape kept so far; the first within `tolerance` (`‖w − k‖ / ‖w‖`) is
//! what its readers read from then on, and it goes. The distance is
//! accumulated with an early exit, so unlike weights cost little.

use super::{readers_of, values, CompressReport, Layer, Target};
use crate::PassError;
use graphopt_ir::{Graph, ValueId};

pub(super) fn apply(
    g: &mut Graph,
    targets: &[Target],
    tolerance: f64,
    report: &mut CompressReport,
) -> Result<(), PassError> {
    // Kept weights: value, dims, values, squared norm.
    let mut kept: Vec<(ValueId, Vec<i64>, Vec<f32>)> = Vec::new();
    for t in targets {
        let dims = g.initializer(t.v).expect("an initializer").dims.clone();
        let w = values(g, t.v);
        let norm2: f64 = w.iter().map(|&x| (x as f64).powi(2)).sum();
        let limit = tolerance * tolerance * norm2;
        let hit = kept.iter().find_map(|(k, kd, kv)| {
            if *kd != dims {
                return None;
            }
            let mut d = 0.0f64;
            for (&a, &b) in w.iter().zip(kv) {
                d += (a as f64 - b as f64).powi(2);
                if d > limit {
                    return None;
                }
            }
            Some((*k, d))
        });
        let Some((k, d)) = hit else {
            kept.push((t.v, dims, w));
            continue;
        };
        let (nodes, op) = readers_of(g, t);
        let bytes = g.initializer(t.v).map_or(0, |x| x.nbytes());
        let err = if norm2 > 0.0 { (d / norm2).sqrt() } else { 0.0 };
        report.layers.push(Layer {
            weight: t.name.clone(),
            nodes,
            op,
            detail: format!("shares {}", g.name(k)),
            bytes_before: bytes,
            bytes_after: 0,
            weight_error: err,
        });
        g.replace_all_uses(t.v, k)?;
        g.take_initializer(t.v);
        g.remove_value(t.v);
    }
    Ok(())
}
