//! [`torch_policy`]: a recomputation decision (a training graph after
//! [`crate::Session::remat`]) told per torch.fx node, for PyTorch's
//! selective activation checkpointing.
//!
//! torch's dynamo exporter (`torch.onnx.export(..., dynamo=True)`) marks
//! every ONNX node with the fx node it was translated from, in the
//! metadata property [`FX_NODE_KEY`]:
//!
//! ```text
//! %relu : [num_users=1] = call_function[target=torch.ops.aten.relu.default](args = (%getitem,), ...)
//! ```
//!
//! The forward part of a training graph (the loss's cone) keeps those
//! properties through `graphopt grad` and `remat` (whose recomputed copies
//! carry them too, beside [`graphopt_passes::remat::RECOMPUTE_KEY`]). A
//! forward fx node is then
//! - `save` when the backward pass (or a recomputed copy) reads one of the
//!   values its ONNX nodes produce: torch should keep its output;
//! - `recompute` when it was dropped (a copy recomputes it in the backward
//!   pass) or when the backward pass never reads what it produces (torch
//!   recomputes it only if its own autograd formulas need it).
//!
//! Forward values the backward pass reads whose producer names no fx node
//! (nodes the exporter did not mark, or that a pass created) are listed in
//! [`TorchPolicy::unmapped`]: they stay saved in graphopt's plan, and a
//! torch front end cannot tell torch anything about them.
//!
//! ```text
//! forward (fx names)   backward reads       remat drops   policy
//! conv2d               conv2d (BN's grad)   -             save
//! relu                 relu (Relu's grad)   relu          recompute (recomputed)
//! view                 -                    -             recompute (not read by backward)
//! ```

use graphopt_ir::{Graph, NodeId, ValueId};
use graphopt_passes::remat::{is_recompute, loss_cone, RECOMPUTE_KEY};
use graphopt_plan::liveness::value_size;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// The metadata key torch's dynamo exporter writes on each ONNX node.
pub const FX_NODE_KEY: &str = "pkg.torch.onnx.fx_node";

/// The `format` field of [`TorchPolicy`] (files from `graphopt remat
/// --torch-policy`).
pub const TORCH_POLICY_FORMAT: &str = "graphopt.torch-policy/1";

/// What torch should do with one fx node's outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FxPolicy {
    /// Keep the outputs for the backward pass (`CheckpointPolicy.MUST_SAVE`).
    Save,
    /// Do not keep them; recompute where backward needs them
    /// (`CheckpointPolicy.PREFER_RECOMPUTE`).
    Recompute,
}

/// Why an fx node got its policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FxReason {
    /// The backward pass (or a recomputed copy) reads its output.
    ReadByBackward,
    /// graphopt's solver dropped it: a copy recomputes it in the backward pass.
    Dropped,
    /// The backward pass never reads what it produces.
    NotReadByBackward,
}

/// One forward fx node's decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FxDecision {
    /// The fx node's name (`relu`, `conv2d_3`, `_native_batch_norm_legit_functional`).
    pub node: String,
    /// Its target as the exporter printed it (`torch.ops.aten.relu.default`).
    pub target: String,
    pub policy: FxPolicy,
    pub reason: FxReason,
    /// Bytes of the values of its ONNX nodes that the backward pass reads
    /// (for `save`) or that were dropped (for `recompute`, reason
    /// `dropped`), where shapes are known.
    pub bytes: u64,
}

/// The decision of one recomputation plan, per fx node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TorchPolicy {
    /// [`TORCH_POLICY_FORMAT`].
    pub format: &'static str,
    /// Forward fx nodes, in the order their first ONNX node runs.
    pub nodes: Vec<FxDecision>,
    pub saved: usize,
    pub recomputed: usize,
    /// Forward values the backward pass reads whose producer names no fx
    /// node (they stay saved).
    pub unmapped: Vec<String>,
}

/// The fx node name and target in a [`FX_NODE_KEY`] property
/// (`%relu : [...] = call_function[target=torch.ops.aten.relu.default](...)`).
pub fn parse_fx_node(text: &str) -> Option<(String, String)> {
    let rest = text.strip_prefix('%')?;
    let name = rest.split_whitespace().next()?.to_string();
    let target = rest
        .split_once("target=")
        .map(|(_, t)| t.split_once(']').map_or(t, |(t, _)| t).to_string())
        .unwrap_or_default();
    (!name.is_empty()).then_some((name, target))
}

fn fx_of(g: &Graph, n: NodeId) -> Option<(String, String)> {
    g.node(n)
        .metadata_props
        .iter()
        .find(|(k, _)| k == FX_NODE_KEY)
        .and_then(|(_, v)| parse_fx_node(v))
}

/// Does some node of `g` name its fx node ([`FX_NODE_KEY`])?
pub fn has_fx_nodes(g: &Graph) -> bool {
    g.nodes().any(|n| fx_of(g, n).is_some())
}

/// The per-fx-node decision of training graph `g` (after `remat`, or
/// store-all without it); `None` when no forward node carries
/// [`FX_NODE_KEY`] (the model did not come from torch's dynamo exporter).
pub fn torch_policy(g: &Graph) -> Option<TorchPolicy> {
    let forward = loss_cone(g);
    // Dropped originals: the names in the copies' RECOMPUTE_KEY.
    let dropped_nodes: HashSet<&str> = g
        .nodes()
        .filter_map(|n| {
            g.node(n)
                .metadata_props
                .iter()
                .find(|(k, _)| k == RECOMPUTE_KEY)
                .map(|(_, v)| v.as_str())
        })
        .collect();
    let mut by_fx: BTreeMap<String, (usize, FxDecision)> = BTreeMap::new();
    let mut unmapped = Vec::new();
    let mut any_fx = false;
    for (pos, n) in g.nodes().enumerate() {
        if !forward.contains(&n) || is_recompute(g.node(n)) {
            continue;
        }
        let fx = fx_of(g, n);
        any_fx |= fx.is_some();
        let d = g.node(n);
        // Values of this node the backward pass (or a copy) reads.
        let read: Vec<ValueId> = d
            .outputs()
            .iter()
            .flatten()
            .copied()
            .filter(|&v| {
                g.uses(v)
                    .iter()
                    .any(|u| !forward.contains(&u.node()) || is_recompute(g.node(u.node())))
            })
            .collect();
        let read_bytes: u64 = read.iter().map(|&v| value_size(g, v).unwrap_or(0)).sum();
        let dropped = dropped_nodes.contains(d.name.as_str())
            || (d.name.is_empty()
                && d.output(0)
                    .is_some_and(|v| dropped_nodes.contains(g.name(v))));
        let Some((name, target)) = fx else {
            unmapped.extend(read.iter().map(|&v| g.name(v).to_string()));
            continue;
        };
        let e = by_fx.entry(name.clone()).or_insert_with(|| {
            (
                pos,
                FxDecision {
                    node: name,
                    target,
                    policy: FxPolicy::Recompute,
                    reason: FxReason::NotReadByBackward,
                    bytes: 0,
                },
            )
        });
        let dec = &mut e.1;
        if !read.is_empty() {
            if dec.policy == FxPolicy::Recompute {
                dec.bytes = 0;
            }
            dec.policy = FxPolicy::Save;
            dec.reason = FxReason::ReadByBackward;
            dec.bytes += read_bytes;
        } else if dropped && dec.policy == FxPolicy::Recompute {
            dec.reason = FxReason::Dropped;
            dec.bytes += d
                .outputs()
                .iter()
                .flatten()
                .map(|&v| value_size(g, v).unwrap_or(0))
                .sum::<u64>();
        }
    }
    if !any_fx {
        return None;
    }
    let mut nodes: Vec<(usize, FxDecision)> = by_fx.into_values().collect();
    nodes.sort_by_key(|(pos, _)| *pos);
    let nodes: Vec<FxDecision> = nodes.into_iter().map(|(_, d)| d).collect();
    unmapped.sort();
    unmapped.dedup();
    Some(TorchPolicy {
        format: TORCH_POLICY_FORMAT,
        saved: nodes.iter().filter(|d| d.policy == FxPolicy::Save).count(),
        recomputed: nodes
            .iter()
            .filter(|d| d.policy == FxPolicy::Recompute)
            .count(),
        nodes,
        unmapped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_exporters_property() {
        let p = parse_fx_node(
            "%relu : [num_users=1] = call_function[target=torch.ops.aten.relu.default](args = (%getitem,), kwargs = {})",
        );
        assert_eq!(
            p,
            Some(("relu".into(), "torch.ops.aten.relu.default".into()))
        );
        assert_eq!(parse_fx_node("relu"), None);
        assert_eq!(parse_fx_node("%"), None);
        assert_eq!(
            parse_fx_node("%x : [num_users=1] = placeholder[target=x]"),
            Some(("x".into(), "x".into()))
        );
    }
}
