//! `remat`: rematerialization (gradient checkpointing) of a training graph
//! under a memory budget.
//!
//! A training graph keeps every forward value that the backward pass reads
//! alive from the forward pass until its backward reader runs: at the turn
//! from forward to backward all of them are live at once, which is the
//! peak. This pass *drops* a chosen set of forward nodes' outputs after
//! their last forward reader and inserts, for each dropped node, a copy of
//! it that recomputes the outputs right before their first backward reader
//! (before the first copy that reads them, for chains of dropped nodes).
//! Backward readers read the copies. Memory falls, compute rises by the
//! copies' FLOPs ([`cost`]).
//!
//! Which nodes to drop is the solvers' job ([`solve`]): `optimal` (exact
//! branch-and-bound, small graphs), `fast` (greedy by bytes freed per FLOP
//! with the simulator in the loop, then local search), `sqrt` (Chen et
//! al.) and `per-block` (one checkpoint per repeated block, as
//! `torch.utils.checkpoint` around each layer). [`sim`] holds the problem
//! and the simulator they all score with; the caller (`Session::remat` in
//! the `graphopt` crate) checks every answer with the real planner.
//!
//! Rules:
//! - only pure nodes are recomputed: default domain, no random ops
//!   (`Random*`, `Multinomial`, `Bernoulli`, `Dropout`), no subgraphs;
//! - forward and backward come from the graph (see [`sim`]): the loss's
//!   cone is forward, so `graphopt grad` graphs and any ONNX graph with the
//!   loss as its first output work;
//! - a recomputed copy carries the metadata property
//!   [`RECOMPUTE_KEY`]` = "<original node>"`, which is exported with the
//!   model; `cse` never merges a node that has it, so neither this pipeline
//!   nor a later `graphopt optimize` of the output folds the copies back
//!   into the nodes they repeat (which would undo the pass);
//! - run the simplify pipeline (with `cse`) *before* this pass, never to
//!   undo it; the verifier runs after it.
//!
//! Recomputation repeats the same ops on the same inputs, so every output
//! (the loss and each gradient) is bit-identical before and after.
//!
//! ```text
//! before (Relu's output r is saved for the backward Mul):
//!   h = MatMul (x, W)
//!   r = Relu (h)
//!   y = MatMul (r, W2)
//!   loss = ReduceSum (y)
//!   ...                                  # backward
//!   dr = MatMul (dy, W2t)
//!   dh = Mul (dr, mask)                  # mask = Greater(r, 0)
//!   W2_grad = MatMul (rt, dy)            # rt = Transpose(r)
//! after (drop = {Relu}): r dies after `y`; a copy runs before its first
//! backward reader:
//!   h = MatMul (x, W)
//!   r = Relu (h)
//!   y = MatMul (r, W2)
//!   loss = ReduceSum (y)
//!   ...
//!   r_remat = Relu (h)                   # metadata graphopt.remat = "Relu_1"
//!   rt = Transpose (r_remat)
//!   ...
//! ```

pub mod cost;
pub mod sim;
pub mod solve;

use crate::PassError;
use graphopt_ir::{Graph, NewNode, NodeData, NodeId, ValueId};
pub use sim::{Problem, Simulated};
pub use solve::{solve, Solution, Strategy};

/// The metadata key marking a recomputed copy (value: the original node's
/// name).
pub const RECOMPUTE_KEY: &str = "graphopt.remat";

/// Is `n` a copy this pass inserted?
pub fn is_recompute(n: &NodeData) -> bool {
    n.metadata_props.iter().any(|(k, _)| k == RECOMPUTE_KEY)
}

/// The loss of a training graph: the output named `loss`, else the first
/// output.
pub fn loss_value(g: &Graph) -> Option<ValueId> {
    g.outputs
        .iter()
        .copied()
        .find(|&v| g.name(v) == "loss")
        .or_else(|| g.outputs.first().copied())
}

/// The loss's cone: every node [`loss_value`] depends on. This is the
/// forward pass; the rest is backward.
pub fn loss_cone(g: &Graph) -> std::collections::HashSet<NodeId> {
    g.cone(loss_value(g))
}

/// Why `g` is not a training graph this pass can work on, or `None` when
/// it is one: `p` (built from `g`, with its types inferred at concrete
/// dims) must have a backward part ([`Problem::has_backward`]), and the
/// loss (the output named `loss`, else the first output) must hold one
/// element when its shape is known. `graphopt grad` graphs and the
/// hand-written fixtures pass; an inference model fails on one or the
/// other (a second output's head reads the first output's cone and would
/// look like a backward pass, but its first output is not a scalar).
pub fn not_a_training_graph(g: &Graph, p: &Problem) -> Option<String> {
    if !p.has_backward() {
        return Some("every node computes the first output (the loss)".into());
    }
    let loss = loss_value(g)?;
    let n = g
        .ty(loss)
        .and_then(|t| t.as_tensor())
        .and_then(|t| t.shape.as_ref())
        .and_then(|s| s.numel());
    match n {
        Some(n) if n > 1 => Some(format!(
            "its loss, output '{}', has {n} elements where a loss has one",
            g.name(loss)
        )),
        _ => None,
    }
}

/// What [`rewrite`] inserted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rewritten {
    /// Names of the recomputed copies, in order of insertion.
    pub recomputed_nodes: Vec<String>,
    /// Forward values freed after their forward use (their backward
    /// readers read a copy).
    pub dropped_values: Vec<String>,
}

/// Inserts the recomputation of every node dropped in `drop` (indexed by
/// position in `p.order`) into `g`, which must have `p.order` as its
/// program order (the graph `p` was built from, or one with the same nodes
/// and order, such as the same model before shape inference). Copies go
/// right before their anchor; the caller schedules the result.
pub fn rewrite(g: &mut Graph, p: &Problem, drop: &[bool]) -> Result<Rewritten, PassError> {
    if g.order() != p.order.as_slice() {
        return Err(PassError(
            "remat: the graph's node order differs from the one the drop set was chosen on".into(),
        ));
    }
    if drop.len() != p.len() {
        return Err(PassError("remat: drop set of the wrong length".into()));
    }
    for (i, &d) in drop.iter().enumerate() {
        if d && !p.candidates.contains(&i) && !p.followers.contains(&i) {
            let n = g.node(p.order[i]);
            return Err(PassError(format!(
                "remat: node '{}' ({}) cannot be recomputed",
                n.name,
                n.qualified_op()
            )));
        }
    }
    let anchor = p.anchors(drop);
    let mut out = Rewritten::default();
    let mut taken: std::collections::HashSet<String> =
        g.nodes().map(|n| g.node(n).name.clone()).collect();
    // Original value -> its recomputed copy.
    let mut copy: std::collections::HashMap<ValueId, ValueId> = Default::default();
    for i in 0..p.len() {
        if !drop[i] || anchor[i] == usize::MAX {
            continue;
        }
        let n = p.order[i];
        let d = g.node(n).clone();
        let base = if d.name.is_empty() {
            d.output(0)
                .map(|v| g.name(v).to_string())
                .unwrap_or_else(|| n.to_string())
        } else {
            d.name.clone()
        };
        let ins: Vec<Option<ValueId>> = d
            .inputs()
            .iter()
            .map(|v| v.map(|v| copy.get(&v).copied().unwrap_or(v)))
            .collect();
        let mut outs = Vec::new();
        for &o in d.outputs() {
            outs.push(o.map(|o| {
                let hint = format!("{}_remat", g.name(o));
                let ty = g.ty(o).cloned();
                let c = g.fresh_value(&hint, ty);
                copy.insert(o, c);
                out.dropped_values.push(g.name(o).to_string());
                c
            }));
        }
        let mut props = d.metadata_props.clone();
        props.push((RECOMPUTE_KEY.to_string(), base.clone()));
        let hint = format!("remat/{base}");
        let name = if taken.contains(&hint) {
            (1..)
                .map(|k| format!("{hint}_{k}"))
                .find(|s| !taken.contains(s))
                .expect("some suffix is free")
        } else {
            hint
        };
        taken.insert(name.clone());
        let new = NewNode {
            name: name.clone(),
            op_type: d.op_type.clone(),
            domain: d.domain.clone(),
            overload: d.overload.clone(),
            inputs: ins,
            outputs: outs,
            attributes: d.attributes.clone(),
            doc_string: d.doc_string.clone(),
            metadata_props: props,
            preserved: d.preserved.clone(),
        };
        g.insert_node_before(p.order[anchor[i]], new)?;
        out.recomputed_nodes.push(name);
    }
    // Backward readers read the copies.
    for i in 0..p.len() {
        if p.nodes[i].forward {
            continue;
        }
        let n = p.order[i];
        let ins: Vec<Option<ValueId>> = g.node(n).inputs().to_vec();
        for (slot, v) in ins.into_iter().enumerate() {
            if let Some(c) = v.and_then(|v| copy.get(&v).copied()) {
                g.set_input(n, slot, Some(c));
            }
        }
        if g.node(n).has_subgraphs() {
            // A subgraph capturing a dropped value keeps reading the
            // original (captures cannot be redirected one by one).
            g.refresh_captures(n);
        }
    }
    Ok(out)
}

/// Node ids of a drop set, for reports.
pub fn dropped_nodes(p: &Problem, drop: &[bool]) -> Vec<NodeId> {
    (0..p.len())
        .filter(|&i| drop[i])
        .map(|i| p.order[i])
        .collect()
}
