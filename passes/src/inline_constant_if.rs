//! If with a constant condition: the taken branch replaces the node.
//!
//! `If(c)` where `c` is a constant one-element tensor (an initializer of the
//! graph that holds the `If`) ==> the nodes of `then_branch` (`c` true) or
//! `else_branch` (`c` false) placed where the `If` was; the branch's
//! initializers become initializers of the graph, its outer reads read the
//! graph's values, and the `If`'s outputs are produced by the branch's
//! output nodes directly (a branch output that is not produced inside the
//! branch, an outer value or an initializer, or that appears twice, is
//! copied by an `Identity`, which `eliminate_identity` then removes where
//! the output name allows). The other branch is dropped.
//!
//! Exporters leave such `If`s behind when a Python condition on a constant
//! becomes a graph condition (silero VAD's `If` on a `Cast` of a constant
//! picks one of two LSTM decoders). Only structure changes: the taken
//! branch computes the same values, so outputs stay bit-identical.
//!
//! Left alone: a branch whose value names clash with names of the graph
//! (ONNX names are unique across scopes, so this only happens in models
//! that break that rule), a branch with graph inputs (If branches have
//! none), with sparse initializers, or whose outputs do not match the
//! `If`'s in number. Works in subgraphs (with a local constant condition).
//!
//! ```text
//! before:                                          after:
//! g (float[2] x) => (float[2] y)                   g (float[2] x) => (float[2] y) {
//!   <bool c = {1}> {                                 y = Relu (x)
//!   y = If (c) <then_branch = t () => (float[2] a) { }
//!                  a = Relu (x)
//!                }, else_branch = e () => (float[2] b) {
//!                  b = Neg (x)
//!                }>
//! }
//! ```

use crate::util::for_each_subgraph;
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{AttrValue, Graph, Model, NewNode, NodeId, ValueId};
use std::collections::HashMap;

pub struct InlineConstantIf;

impl Pass for InlineConstantIf {
    fn name(&self) -> &'static str {
        "inline_constant_if"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for_each_subgraph(&mut model.graph, &mut |g| inline_all(g, false, &mut stats))?;
        inline_all(&mut model.graph, true, &mut stats)?;
        Ok(stats)
    }
}

fn inline_all(g: &mut Graph, top: bool, stats: &mut PassStats) -> Result<(), PassError> {
    // Inlined branches may hold constant Ifs of their own: repeat until none.
    loop {
        let mut changed = false;
        for n in g.nodes().collect::<Vec<_>>() {
            if g.is_live_node(n) && inline_one(g, n, top, stats)? {
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
    }
}

/// The branch an `If` node takes, when its condition is a local constant.
fn taken_branch(g: &Graph, n: NodeId) -> Option<&'static str> {
    let d = g.node(n);
    if d.op_type != "If" || !(d.domain.is_empty() || d.domain == "ai.onnx") {
        return None;
    }
    let c = g.constant(d.input(0)?)?;
    match c.to_f64_vec()?.as_slice() {
        [v] => Some(if *v != 0.0 { "then_branch" } else { "else_branch" }),
        _ => None,
    }
}

fn inline_one(g: &mut Graph, n: NodeId, top: bool, stats: &mut PassStats) -> Result<bool, PassError> {
    let Some(which) = taken_branch(g, n) else {
        return Ok(false);
    };
    let Some(AttrValue::Graph(b)) = g.node(n).attr(which).map(|a| a.value.clone()) else {
        return Ok(false);
    };
    let outs: Vec<Option<ValueId>> = g.node(n).outputs().to_vec();
    if !b.inputs.is_empty() || b.outputs.len() != outs.len() || !b.sparse_initializers().is_empty() {
        return Ok(false);
    }
    // Check everything before changing anything: with the If's branches
    // set aside, no name of the branch may exist in the graph, and every
    // outer read must resolve (in the main graph, to an existing value).
    let attrs = std::mem::take(&mut g.node_mut(n).attributes);
    g.refresh_captures(n);
    let ok = b.values().filter(|&v| b.is_live_value(v)).all(|v| {
        if b.is_outer(v) {
            !top || g.value_by_name(b.name(v)).is_some()
        } else {
            !g.defines_name_deep(b.name(v))
        }
    });
    if !ok {
        g.node_mut(n).attributes = attrs;
        g.refresh_captures(n);
        return Ok(false);
    }
    drop(attrs);

    // Branch output i is produced directly into the If's output i when a
    // branch node produces it and it is not listed twice.
    let mut direct: HashMap<ValueId, ValueId> = HashMap::new();
    for (i, &bo) in b.outputs.iter().enumerate() {
        if let Some(y) = outs[i] {
            if b.producer(bo).is_some() && !direct.contains_key(&bo) {
                direct.insert(bo, y);
                g.set_output(n, i, None);
            }
        }
    }
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for v in b.values().filter(|&v| b.is_live_value(v)) {
        let name = b.name(v);
        let gv = if b.is_outer(v) {
            g.value_or_outer(name)
        } else if let Some(&y) = direct.get(&v) {
            y
        } else if b.producer(v).is_some() || b.initializer(v).is_some() {
            let gv = g.add_value(name, b.ty(v).cloned())?;
            if let Some(t) = b.initializer(v) {
                g.set_initializer(gv, t.clone());
            }
            gv
        } else {
            continue;
        };
        let bd = b.value(v);
        if !bd.doc_string.is_empty() && g.value(gv).doc_string.is_empty() {
            g.value_mut(gv).doc_string = bd.doc_string.clone();
        }
        if b.value_info.contains(&v) && !g.value_info.contains(&gv) && !g.is_output(gv) {
            g.value_info.push(gv);
        }
        map.insert(v, gv);
    }
    let m = |v: &Option<ValueId>| v.map(|v| map[&v]);
    for bn in b.order().to_vec() {
        let d = b.node(bn);
        g.insert_node_before(
            n,
            NewNode {
                name: d.name.clone(),
                op_type: d.op_type.clone(),
                domain: d.domain.clone(),
                overload: d.overload.clone(),
                inputs: d.inputs().iter().map(m).collect(),
                outputs: d.outputs().iter().map(m).collect(),
                attributes: d.attributes.clone(),
                doc_string: d.doc_string.clone(),
                metadata_props: d.metadata_props.clone(),
                preserved: d.preserved.clone(),
            },
        )?;
        stats.add("nodes_inlined", 1);
    }
    // The outputs not produced directly: copied by an Identity.
    for (i, &bo) in b.outputs.iter().enumerate() {
        let Some(y) = outs[i] else { continue };
        if direct.get(&bo) == Some(&y) {
            continue;
        }
        g.set_output(n, i, None);
        g.insert_node_before(
            n,
            NewNode::new("Identity")
                .name(g.fresh_name(&format!("{}_copy", g.name(y))))
                .inputs(&[map[&bo]])
                .outputs(&[y]),
        )?;
    }
    g.remove_node(n);
    stats.add("ifs_inlined", 1);
    stats.add("nodes_removed", 1);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn takes_the_else_branch_of_a_false_condition() {
        assert_pass(
            &InlineConstantIf,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2] x) => (float[2] y) <bool c = {0}> {
              y = If (c) <then_branch = t () => (float[2] a) { a = Relu (x) },
                          else_branch = e () => (float[2] b) { b = Neg (x) }>
            }"#,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2] x) => (float[2] y) <bool c = {0}> {
              y = Neg (x)
            }"#,
        );
    }

    #[test]
    fn outer_value_output_goes_through_identity() {
        assert_pass(
            &InlineConstantIf,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2] x) => (float[2] y) <bool c = {1}> {
              y = If (c) <then_branch = t () => (float[2] x) { },
                          else_branch = e () => (float[2] b) { b = Neg (x) }>
            }"#,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2] x) => (float[2] y) <bool c = {1}> {
              [y_copy] y = Identity (x)
            }"#,
        );
    }

    #[test]
    fn non_constant_condition_is_kept() {
        assert_unchanged(
            &InlineConstantIf,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2] x, bool c) => (float[2] y) {
              y = If (c) <then_branch = t () => (float[2] a) { a = Relu (x) },
                          else_branch = e () => (float[2] b) { b = Neg (x) }>
            }"#,
        );
    }
}
