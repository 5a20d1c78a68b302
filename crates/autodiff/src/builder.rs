//! The training-graph builder: the loss, the backward sweep, the outputs.

use crate::cx::{int_attr, Cx};
use crate::{glob_match, rules, GradError, GradOptions, Loss, Optimizer, Result, TrainingGraph};
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{DType, Graph, Model, NewNode, NodeId, Shape, Type, ValueId};
use std::collections::{HashMap, HashSet};

fn is_float(g: &Graph, v: ValueId) -> bool {
    g.ty(v).and_then(|t| t.elem()).is_some_and(|d| d.is_float())
}

/// Which initializers are trained: see [`GradOptions::trainable`] (with
/// default options: every float initializer of more than one element but
/// BatchNormalization's running statistics).
pub fn trainable(g: &Graph, opts: &GradOptions) -> Vec<ValueId> {
    // BatchNormalization's running mean and variance are buffers, not
    // parameters (torch does not train them): the default leaves them out.
    let buffers: HashSet<ValueId> = g
        .nodes()
        .map(|n| g.node(n))
        .filter(|n| n.op_type == "BatchNormalization")
        .flat_map(|n| [n.input(3), n.input(4)])
        .flatten()
        .collect();
    g.initializers()
        .iter()
        .copied()
        .filter(|&v| {
            let t = match g.initializer(v) {
                Some(t) => t,
                None => return false,
            };
            if !t.dtype.is_float() {
                return false;
            }
            let name = g.name(v);
            let picked = if opts.trainable.is_empty() || opts.trainable.iter().any(|p| p == "all") {
                t.numel().is_ok_and(|n| n > 1) && !buffers.contains(&v)
            } else {
                opts.trainable.iter().any(|p| glob_match(p, name))
            };
            picked && !opts.frozen.iter().any(|p| glob_match(p, name))
        })
        .collect()
}

/// Builds the training graph of `model`: see the crate docs.
pub fn build_training_graph(model: &Model, opts: &GradOptions) -> Result<TrainingGraph> {
    let mut m = model.clone();
    let original_inits: HashSet<ValueId> = m.graph.initializers().iter().copied().collect();
    let opset = m.onnx_opset().unwrap_or(1);
    if opset < 13 {
        return Err(GradError::Invalid(format!(
            "default-domain opset {opset} is older than 13, the oldest the gradient rules \
             emit; raise it first (graphopt optimize --opset 13)"
        )));
    }
    infer_model(&mut m, &InferOptions::default());
    let g = &mut m.graph;
    let dropout_train = if opts.dropout_train {
        dropout_to_training(g)?
    } else {
        Vec::new()
    };
    let y = match &opts.output {
        Some(name) => g
            .outputs
            .iter()
            .copied()
            .find(|&v| g.name(v) == name)
            .ok_or_else(|| GradError::Invalid(format!("the model has no output '{name}'")))?,
        None => *g
            .outputs
            .first()
            .ok_or_else(|| GradError::Invalid("the model has no outputs".into()))?,
    };
    if !is_float(g, y) {
        return Err(GradError::Invalid(format!(
            "output '{}' is not a float tensor: it has no gradient",
            g.name(y)
        )));
    }
    let params = trainable(g, opts);
    let inputs: Vec<ValueId> = if opts.input_grads {
        g.inputs
            .iter()
            .copied()
            .filter(|&v| g.initializer(v).is_none() && is_float(g, v))
            .collect()
    } else {
        Vec::new()
    };

    // Values that depend on a differentiated value, through float values.
    let forward: Vec<NodeId> = g.order().to_vec();
    let mut requires: HashSet<ValueId> = params.iter().chain(&inputs).copied().collect();
    for &n in &forward {
        let node = g.node(n);
        // Subgraph captures count as inputs: a parameter used inside an
        // If or Loop body makes the node's outputs depend on it.
        if node
            .inputs()
            .iter()
            .flatten()
            .chain(node.captures())
            .any(|v| requires.contains(v))
        {
            for o in node.outputs().iter().flatten() {
                if is_float(g, *o) || g.ty(*o).and_then(|t| t.elem()).is_none() {
                    requires.insert(*o);
                }
            }
        }
    }

    let mut shapes = HashMap::new();
    let mut added = Vec::new();
    let mut wants16 = false;
    let dt = g.ty(y).and_then(|t| t.elem()).unwrap_or(DType::F32);

    // The loss (forward) and the gradient of `y` (the seed).
    let (loss, seed) = {
        let anchor = g
            .producer(y)
            .map(|(n, _)| n)
            .or_else(|| g.order().first().copied())
            .ok_or_else(|| GradError::Invalid("the model has no nodes".into()))?;
        let mut cx = Cx::new(g, opset, anchor, &mut shapes, &mut added, &mut wants16);
        cx.prefix = Some("loss".into());
        build_loss(&mut cx, y, dt, opts)?
    };
    g.rename_value(loss, "loss").ok();

    // The backward sweep, in reverse program order: every consumer of a
    // value comes after it, so its gradient is complete when reached.
    let mut grads: HashMap<ValueId, ValueId> = HashMap::new();
    grads.insert(y, seed);
    for &n in forward.iter().rev() {
        let node = g.node(n);
        let dys: Vec<Option<ValueId>> = node
            .outputs()
            .iter()
            .map(|o| o.and_then(|o| grads.get(&o).copied()))
            .collect();
        if dys.iter().all(|d| d.is_none()) {
            continue;
        }
        let needs: Vec<bool> = node
            .inputs()
            .iter()
            .map(|i| i.is_some_and(|i| requires.contains(&i) && is_float(g, i)))
            .collect();
        let captures = node.captures().iter().any(|v| requires.contains(v));
        if !needs.iter().any(|&b| b) && !captures {
            continue;
        }
        let domain_ok = node.domain.is_empty() || node.domain == "ai.onnx";
        // A rule differentiates through inputs only; a node whose subgraph
        // reads a differentiated value has none.
        let rule = (domain_ok && !captures)
            .then(|| rules::lookup(&node.op_type))
            .flatten();
        let Some(rule) = rule else {
            return Err(GradError::NoRule {
                op: node.qualified_op(),
                node: if node.name.is_empty() {
                    node.output(0)
                        .map(|v| g.name(v).to_string())
                        .unwrap_or_default()
                } else {
                    node.name.clone()
                },
            });
        };
        let inputs_of: Vec<Option<ValueId>> = node.inputs().to_vec();
        let mut cx = Cx::new(g, opset, n, &mut shapes, &mut added, &mut wants16);
        cx.needs = needs.clone();
        let dxs = rule(&mut cx, &dys)?;
        for (i, dx) in dxs.into_iter().enumerate() {
            let (Some(dx), Some(x)) = (dx, inputs_of.get(i).copied().flatten()) else {
                continue;
            };
            if !needs.get(i).copied().unwrap_or(false) {
                continue;
            }
            let acc = match grads.get(&x) {
                // Two uniform gradients add as scalars (both are x-shaped).
                Some(&old) => match (cx.uniform(old), cx.uniform(dx)) {
                    (Some(a), Some(b)) => {
                        let dt = cx.dtype(a)?;
                        let s = cx.scalar_op("Add", &[a, b], dt)?;
                        cx.expand_like(s, x)?
                    }
                    _ => cx.op("Add", &[old, dx], vec![])?,
                },
                None => dx,
            };
            grads.insert(x, acc);
        }
    }

    // Outputs: loss, then one gradient per parameter (and input).
    let mut outs = vec![loss];
    let mut named: HashSet<ValueId> = HashSet::new();
    for &p in params.iter().chain(&inputs) {
        let ty = g.ty(p).cloned();
        let pdt = ty.as_ref().and_then(|t| t.elem()).unwrap_or(dt);
        let want = format!("{}_grad", g.name(p));
        let gv = match grads.get(&p).copied() {
            Some(gv) => gv,
            None => {
                // No path to the loss: the gradient is zero.
                let anchor = forward[0];
                let mut cx = Cx::new(g, opset, anchor, &mut shapes, &mut added, &mut wants16);
                cx.prefix = Some(want.clone());
                cx.zeros_like(p, pdt)?
            }
        };
        let renamable = g.producer(gv).is_some_and(|(n, _)| added.contains(&n))
            && !named.contains(&gv)
            && !g.is_output(gv)
            && g.value_by_name(&want).is_none();
        let out = if renamable {
            g.rename_value(gv, &want)?;
            gv
        } else {
            let o = g.fresh_value(&want, None);
            let id = g.add_node(
                NewNode::new("Identity")
                    .name(format!("grad/{}", g.name(o)))
                    .inputs(&[gv])
                    .outputs(&[o]),
            )?;
            added.push(id);
            o
        };
        named.insert(out);
        g.value_mut(out).ty = ty;
        outs.push(out);
    }
    let grads_out: Vec<ValueId> = outs[1..=params.len()].to_vec();
    let mut state_inputs = Vec::new();
    let opt_start = added.len();
    match opts.optimizer {
        Optimizer::None => {}
        Optimizer::Sgd { lr, weight_decay } => {
            for (&p, &gv) in params.iter().zip(&grads_out) {
                let ty = g.ty(p).cloned();
                let pdt = ty.as_ref().and_then(|t| t.elem()).unwrap_or(dt);
                let want = format!("{}_new", g.name(p));
                let anchor = forward[0];
                let mut cx = Cx::new(g, opset, anchor, &mut shapes, &mut added, &mut wants16);
                cx.prefix = Some(want.clone());
                let step = if weight_decay != 0.0 {
                    let wd = cx.scale(p, pdt, weight_decay as f64)?;
                    cx.op("Add", &[gv, wd], vec![])?
                } else {
                    gv
                };
                let s = cx.scale(step, pdt, lr as f64)?;
                let new = cx.op("Sub", &[p, s], vec![])?;
                name_output(g, new, &want, ty)?;
                outs.push(new);
            }
        }
        Optimizer::AdamW { .. } => {
            let anchor = forward[0];
            let mut cx = Cx::new(g, opset, anchor, &mut shapes, &mut added, &mut wants16);
            let (news, state_outs, ins) = adamw(&mut cx, &params, &grads_out, dt, opts.optimizer)?;
            outs.extend(news);
            outs.extend(state_outs);
            state_inputs = ins;
        }
    }
    g.value_mut(loss).ty = Some(Type::tensor(dt, Some(Shape::known(&[]))));
    g.outputs = outs;
    dce(g);

    let mut opset_raised = None;
    if wants16 && opset < 16 {
        for o in &mut m.opset_imports {
            if o.domain.is_empty() || o.domain == "ai.onnx" {
                o.version = 16;
            }
        }
        opset_raised = Some((opset, 16));
    }
    let mut initial_params = Vec::new();
    if opts.params_as_inputs {
        let g = &mut m.graph;
        for &p in &params {
            if let Some(t) = g.take_initializer(p) {
                if !g.inputs.contains(&p) {
                    g.inputs.push(p);
                }
                initial_params.push((g.name(p).to_string(), t));
            }
        }
    }
    infer_model(&mut m, &InferOptions::default());
    let updates: Vec<NodeId> = added[opt_start..].to_vec();
    let added: HashSet<NodeId> = added.into_iter().collect();
    if fold_uniform_expands(&mut m.graph, &added) {
        dce(&mut m.graph);
    }
    // Constants the rules made (shapes, scalars) that a removed node read.
    let g = &mut m.graph;
    let dead: Vec<ValueId> = g
        .initializers()
        .iter()
        .copied()
        .filter(|v| !original_inits.contains(v))
        .filter(|&v| g.uses(v).is_empty() && !g.is_output(v) && !g.is_input(v))
        .collect();
    for v in dead {
        g.take_initializer(v);
        g.remove_value(v);
    }
    let held: HashSet<ValueId> = params.iter().chain(&state_inputs).copied().collect();
    schedule_updates(&mut m.graph, &updates, &held)?;
    let forward_nodes = forward_cone(&m.graph).len();
    let backward_nodes = m.graph.node_count() - forward_nodes;
    let names = |vs: &[ValueId]| vs.iter().map(|&v| m.graph.name(v).to_string()).collect();
    Ok(TrainingGraph {
        params: names(&params),
        inputs: names(&inputs),
        forward_nodes,
        backward_nodes,
        opset_raised,
        state_inputs: state_inputs
            .iter()
            .map(|&v| m.graph.name(v).to_string())
            .collect(),
        initial_params,
        dropout_train,
        model: m,
    })
}

/// Places each optimizer node (`updates`) right after the last node it
/// depends on, and after every other reader of the parameters and state
/// (`held`) it reads (one that only other optimizer nodes read goes with
/// the first of them), instead of after the whole backward pass: each
/// parameter's update then runs as soon as its gradient is complete, the
/// gradient dies there, and `<p>_new` may still overwrite `<p>` (nothing
/// reads `<p>` after it). Program order is what the planner, `remat` and
/// the runtimes start from, so the gradients are never alive together.
///
/// ```text
/// before: dW2 = ..; dW1 = ..; W2_new = W2 - lr*dW2; W1_new = W1 - lr*dW1
/// after:  dW2 = ..; W2_new = W2 - lr*dW2; dW1 = ..; W1_new = W1 - lr*dW1
/// ```
fn schedule_updates(g: &mut Graph, updates: &[NodeId], held: &HashSet<ValueId>) -> Result<()> {
    let order: Vec<NodeId> = g.order().to_vec();
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let moving: HashSet<NodeId> = updates
        .iter()
        .copied()
        .filter(|n| pos.contains_key(n))
        .collect();
    if moving.is_empty() {
        return Ok(());
    }
    // The position of the node each moving node goes right after (None:
    // the start). Program order is topological, so a moving producer's
    // slot is known before its readers'.
    let mut slot: HashMap<NodeId, Option<usize>> = HashMap::new();
    for &n in &order {
        if !moving.contains(&n) {
            continue;
        }
        let node = g.node(n);
        let mut s: Option<usize> = None;
        for &v in node.inputs().iter().flatten().chain(node.captures()) {
            if let Some((p, _)) = g.producer(v) {
                let ps = if moving.contains(&p) {
                    slot[&p]
                } else {
                    pos.get(&p).copied()
                };
                s = s.max(ps);
            } else if held.contains(&v) {
                for u in g.uses(v) {
                    if !moving.contains(&u.node()) {
                        s = s.max(pos.get(&u.node()).copied());
                    }
                }
            }
        }
        slot.insert(n, s);
    }
    // A moving node that only other moving nodes read goes with the first
    // of them, not earlier: AdamW's `β1·m`, `β2·v` and `(1 - lr·wd)·p` read
    // only state or the parameter, and placed as early as they may run they
    // would hold a parameter-sized tensor from the start (or the
    // parameter's last forward reader) to the gradient. Readers come later
    // in program order, so they are settled first, and each only delays.
    for &n in order.iter().rev() {
        if !moving.contains(&n) {
            continue;
        }
        let outs: Vec<ValueId> = g.node(n).outputs().iter().flatten().copied().collect();
        if outs.iter().any(|&o| g.is_output(o)) {
            continue;
        }
        let readers: Vec<NodeId> = outs
            .iter()
            .flat_map(|&o| g.uses(o).iter().map(|u| u.node()))
            .collect();
        if !readers.is_empty() && readers.iter().all(|r| moving.contains(r)) {
            let first = readers.iter().map(|r| slot[r]).min().expect("not empty");
            slot.insert(n, first);
        }
    }
    let mut after: Vec<Vec<NodeId>> = vec![Vec::new(); order.len()];
    let mut new = Vec::with_capacity(order.len());
    for &n in &order {
        match slot.get(&n) {
            Some(Some(s)) => after[*s].push(n),
            Some(None) => new.push(n),
            None => {}
        }
    }
    for (i, &n) in order.iter().enumerate() {
        if !moving.contains(&n) {
            new.push(n);
        }
        new.append(&mut after[i]);
    }
    // (set_order refuses a node placed before a producer it reads.)
    g.set_order(new)
        .map_err(|e| GradError::Invalid(format!("ordering the optimizer's updates: {e}")))
}

/// Switches every Dropout of the main graph to training mode: its
/// `training_mode` input becomes a constant true (the ratio stays as given),
/// and a missing mask output is added, for the backward to read. Returns
/// the nodes' names.
fn dropout_to_training(g: &mut Graph) -> Result<Vec<String>> {
    let nodes: Vec<NodeId> = g
        .nodes()
        .filter(|&n| {
            let node = g.node(n);
            node.op_type == "Dropout" && (node.domain.is_empty() || node.domain == "ai.onnx")
        })
        .collect();
    let mut names = Vec::new();
    if nodes.is_empty() {
        return Ok(names);
    }
    let t = graphopt_ir::Tensor::from_raw(DType::Bool, vec![], vec![1u8].into())?;
    let yes = g.add_initializer("dropout_training_mode", t);
    for n in nodes {
        g.set_input(n, 2, Some(yes));
        let node = g.node(n);
        let x = node.input(0);
        let label = if node.name.is_empty() {
            node.output(0)
                .map(|v| g.name(v).to_string())
                .unwrap_or_default()
        } else {
            node.name.clone()
        };
        if node.output(1).is_none() {
            let shape = x.and_then(|x| g.ty(x)).and_then(|t| t.shape()).cloned();
            let hint = format!("{}_mask", label.replace(['/', ':', '.'], "_"));
            let mask = g.fresh_value(
                hint.trim_start_matches('_'),
                Some(Type::tensor(DType::Bool, shape)),
            );
            g.set_output(n, 1, Some(mask));
        }
        names.push(label);
    }
    Ok(names)
}

/// Names `v` (a new value) `want` unless the name is taken, and types it.
fn name_output(g: &mut Graph, v: ValueId, want: &str, ty: Option<Type>) -> Result<()> {
    if g.value_by_name(want).is_none() {
        g.rename_value(v, want)?;
    }
    g.value_mut(v).ty = ty;
    Ok(())
}

/// Adds the graph input `name` typed `ty`; an error if the name is taken.
fn add_state_input(g: &mut Graph, name: &str, ty: Option<Type>) -> Result<ValueId> {
    let v = g.add_value(name, ty).map_err(|_| {
        GradError::Invalid(format!(
            "the model already has a value named '{name}', which the optimizer's state needs"
        ))
    })?;
    g.inputs.push(v);
    Ok(v)
}

/// The AdamW update (see [`Optimizer::AdamW`]): returns the outputs
/// `<p>_new` (one per parameter), then the state outputs (`<p>_m_new`,
/// `<p>_v_new` per parameter, then `step_new`), then the state inputs
/// (`step`, then `<p>_m`, `<p>_v` per parameter).
#[allow(clippy::type_complexity)]
fn adamw(
    cx: &mut Cx,
    params: &[ValueId],
    grads: &[ValueId],
    dt: DType,
    opt: Optimizer,
) -> Result<(Vec<ValueId>, Vec<ValueId>, Vec<ValueId>)> {
    let Optimizer::AdamW {
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
    } = opt
    else {
        return Err(GradError::Invalid("not AdamW".into()));
    };
    let (lr, b1, b2, eps, wd) = (lr, beta1, beta2, eps, weight_decay);
    if !(0.0..1.0).contains(&b1) || !(0.0..1.0).contains(&b2) {
        return Err(GradError::Invalid(format!(
            "AdamW's betas must lie in [0, 1), got ({beta1}, {beta2})"
        )));
    }
    let mut m_outs = Vec::new();
    let mut v_outs = Vec::new();
    let mut news = Vec::new();
    let step = add_state_input(
        cx.g,
        "step",
        Some(Type::tensor(DType::I64, Some(Shape::known(&[])))),
    )?;
    let mut state_in = vec![step];
    cx.prefix = Some("step_new".into());
    let one_i = {
        let t = graphopt_ir::Tensor::from_i64(vec![], &[1])?;
        cx.constant("one", t)
    };
    let t_i = cx.op("Add", &[step, one_i], vec![])?;
    name_output(
        cx.g,
        t_i,
        "step_new",
        Some(Type::tensor(DType::I64, Some(Shape::known(&[])))),
    )?;
    // The bias corrections in double, as torch computes them in Python
    // floats: step_size = lr/(1 - β1^t) and √(1 - β2^t); cast per type.
    cx.prefix = Some("adamw".into());
    let td = cx.op(
        "Cast",
        &[t_i],
        vec![int_attr("to", DType::F64.to_onnx() as i64)],
    )?;
    let one = cx.scalar(DType::F64, 1.0)?;
    let pw = |cx: &mut Cx, b: f64| -> Result<ValueId> {
        let bv = cx.scalar(DType::F64, b)?;
        let p = cx.op("Pow", &[bv, td], vec![])?;
        cx.op("Sub", &[one, p], vec![])
    };
    let d1 = pw(cx, b1)?;
    let lrv = cx.scalar(DType::F64, lr)?;
    let step_size = cx.op("Div", &[lrv, d1], vec![])?;
    let d2 = pw(cx, b2)?;
    let c2 = cx.op("Sqrt", &[d2], vec![])?;
    let mut corr: HashMap<DType, (ValueId, ValueId)> = HashMap::new();
    for (&p, &gv) in params.iter().zip(grads) {
        let ty = cx.g.ty(p).cloned();
        let pdt = ty.as_ref().and_then(|t| t.elem()).unwrap_or(dt);
        let pname = cx.g.name(p).to_string();
        let (c1, c2) = match corr.get(&pdt) {
            Some(&c) => c,
            None if pdt == DType::F64 => (step_size, c2),
            None => {
                cx.prefix = Some("adamw".into());
                let to = vec![int_attr("to", pdt.to_onnx() as i64)];
                let c = (
                    cx.op("Cast", &[step_size], to.clone())?,
                    cx.op("Cast", &[c2], to)?,
                );
                corr.insert(pdt, c);
                c
            }
        };
        let m = add_state_input(cx.g, &format!("{pname}_m"), ty.clone())?;
        let v = add_state_input(cx.g, &format!("{pname}_v"), ty.clone())?;
        state_in.extend([m, v]);
        cx.prefix = Some(format!("{pname}_m_new"));
        let bm = cx.scale(m, pdt, b1)?;
        let gm = cx.scale(gv, pdt, 1.0 - b1)?;
        let m2 = cx.op("Add", &[bm, gm], vec![])?;
        name_output(cx.g, m2, &format!("{pname}_m_new"), ty.clone())?;
        cx.prefix = Some(format!("{pname}_v_new"));
        let bv = cx.scale(v, pdt, b2)?;
        let gg = cx.op("Mul", &[gv, gv], vec![])?;
        let gv2 = cx.scale(gg, pdt, 1.0 - b2)?;
        let v2 = cx.op("Add", &[bv, gv2], vec![])?;
        name_output(cx.g, v2, &format!("{pname}_v_new"), ty.clone())?;
        cx.prefix = Some(format!("{pname}_new"));
        let sv = cx.op("Sqrt", &[v2], vec![])?;
        let sc = cx.op("Div", &[sv, c2], vec![])?;
        let e = cx.scalar(pdt, eps)?;
        let den = cx.op("Add", &[sc, e], vec![])?;
        let q = cx.op("Div", &[m2, den], vec![])?;
        let upd = cx.op("Mul", &[q, c1], vec![])?;
        let decayed = cx.scale(p, pdt, 1.0 - lr * wd)?;
        let new = cx.op("Sub", &[decayed, upd], vec![])?;
        name_output(cx.g, new, &format!("{pname}_new"), ty)?;
        news.push(new);
        m_outs.push(m2);
        v_outs.push(v2);
    }
    let mut state_out = Vec::new();
    for (m, v) in m_outs.into_iter().zip(v_outs) {
        state_out.extend([m, v]);
    }
    state_out.push(t_i);
    Ok((news, state_out, state_in))
}

/// The nodes `loss` depends on: the forward pass and the loss. Every other
/// node belongs to the backward pass.
pub fn forward_cone(g: &Graph) -> HashSet<NodeId> {
    g.cone(g.outputs.first().copied())
}

/// Lets a broadcasting reader (`Add`, `Sub`, `Mul`, `Div`, `Where`) of a
/// uniform gradient `Expand(s, shape)` (`s` of rank 0, see
/// [`Cx::uniform`]) that the backward pass added read `s` itself when
/// another of its inputs already has the `Expand`'s whole shape (static
/// or symbolic dims, as inferred): the broadcast gives the same result,
/// and no gradient-sized tensor of one repeated number is made. Returns
/// whether a reader changed (the `Expand` may then be dead).
fn fold_uniform_expands(g: &mut Graph, added: &HashSet<NodeId>) -> bool {
    let default = |d: &str| d.is_empty() || d == "ai.onnx";
    let full_dims = |g: &Graph, v: ValueId| -> Option<Vec<graphopt_ir::Dim>> {
        let d = g.ty(v)?.shape()?.dims.clone();
        (!d.contains(&graphopt_ir::Dim::Unknown)).then_some(d)
    };
    let mut changed = false;
    let expands: Vec<NodeId> = g
        .nodes()
        .filter(|n| added.contains(n))
        .filter(|&n| g.node(n).op_type == "Expand" && default(&g.node(n).domain))
        .collect();
    for n in expands {
        let (Some(s), Some(e)) = (g.node(n).input(0), g.node(n).output(0)) else {
            continue;
        };
        let scalar = g
            .ty(s)
            .and_then(|t| t.shape())
            .is_some_and(|sh| sh.dims.is_empty());
        let Some(edims) = full_dims(g, e).filter(|_| scalar) else {
            continue;
        };
        let readers: Vec<(NodeId, usize)> = g
            .uses(e)
            .iter()
            .filter_map(|u| match *u {
                graphopt_ir::Use::Input { node, slot } => Some((node, slot as usize)),
                graphopt_ir::Use::Capture { .. } => None,
            })
            .collect();
        for (r, slot) in readers {
            let d = g.node(r);
            if !matches!(d.op_type.as_str(), "Add" | "Sub" | "Mul" | "Div" | "Where")
                || !default(&d.domain)
            {
                continue;
            }
            let covered = d.inputs().iter().enumerate().any(|(k, i)| {
                k != slot && i.is_some_and(|i| i != e && full_dims(g, i).as_ref() == Some(&edims))
            });
            if covered {
                g.set_input(r, slot, Some(s));
                changed = true;
            }
        }
    }
    changed
}

/// Removes nodes none of whose outputs is used or a graph output.
fn dce(g: &mut Graph) {
    loop {
        let dead: Vec<NodeId> = g
            .nodes()
            .rev()
            .filter(|&n| {
                g.node(n)
                    .outputs()
                    .iter()
                    .flatten()
                    .all(|&o| g.uses(o).is_empty() && !g.is_output(o))
            })
            .collect();
        if dead.is_empty() {
            return;
        }
        g.remove_nodes(&dead);
    }
}

/// Adds the graph input `target` typed `ty`.
fn add_target(cx: &mut Cx, ty: Option<Type>) -> Result<ValueId> {
    let t = cx
        .g
        .add_value("target", ty)
        .map_err(|_| GradError::Invalid("the model already has a value named 'target'".into()))?;
    cx.g.inputs.push(t);
    Ok(t)
}

/// Builds `loss(y)` and returns it with `d loss / d y`.
fn build_loss(
    cx: &mut Cx,
    y: ValueId,
    dt: DType,
    opts: &GradOptions,
) -> Result<(ValueId, ValueId)> {
    let kd0 = || int_attr("keepdims", 0);
    Ok(match opts.loss {
        // The seeds of sum and mean are uniform: a scalar broadcast to y's
        // shape (`Expand`), which the rules that can read the scalar
        // instead never materialize (see `Cx::uniform`).
        Loss::Sum => {
            let l = cx.op("ReduceSum", &[y], vec![kd0()])?;
            let one = cx.scalar(dt, 1.0)?;
            (l, cx.expand_like(one, y)?)
        }
        Loss::Mean => {
            let l = cx.op("ReduceMean", &[y], vec![kd0()])?;
            let one = cx.scalar(dt, 1.0)?;
            let n = cx.numel_f(y, dt)?;
            let s = cx.scalar_op("Div", &[one, n], dt)?;
            (l, cx.expand_like(s, y)?)
        }
        Loss::Mse | Loss::L1 => {
            let t = add_target(cx, cx.g.ty(y).cloned())?;
            let diff = cx.op("Sub", &[y, t], vec![])?;
            let n = cx.numel_f(y, dt)?;
            if opts.loss == Loss::Mse {
                let sq = cx.op("Mul", &[diff, diff], vec![])?;
                let l = cx.op("ReduceMean", &[sq], vec![kd0()])?;
                let two = cx.scalar(dt, 2.0)?;
                let k = cx.op("Div", &[two, n], vec![])?;
                (l, cx.op("Mul", &[diff, k], vec![])?)
            } else {
                let a = cx.op("Abs", &[diff], vec![])?;
                let l = cx.op("ReduceMean", &[a], vec![kd0()])?;
                let s = cx.op("Sign", &[diff], vec![])?;
                (l, cx.op("Div", &[s, n], vec![])?)
            }
        }
        Loss::CrossEntropy => {
            let yd = cx.dims(y).ok_or_else(|| {
                GradError::Invalid("cross_entropy needs the rank of the output".into())
            })?;
            let r = yd.len() as i64;
            let ca = if opts.class_axis < 0 {
                opts.class_axis + r
            } else {
                opts.class_axis
            };
            if ca < 0 || ca >= r {
                return Err(GradError::Invalid(format!(
                    "class axis {} is out of range for an output of rank {r}",
                    opts.class_axis
                )));
            }
            let mut td = yd.clone();
            td.remove(ca as usize);
            let t = add_target(cx, Some(Type::tensor(DType::I64, Some(Shape::new(td)))))?;
            // loss = mean(logsumexp(y) - y[target]), written so that no
            // tensor of y's size lives beside y: y - max(y) and its Exp
            // are elementwise, and the planner runs them in place over y
            // (once y[target] is read); LogSoftmax would hold a second
            // copy of y (the logits of a language model: 411 MB for GPT-2
            // at 8 x 256).
            let axis = || int_attr("axis", ca);
            let tu = cx.unsqueeze(t, &[ca])?;
            let picked = cx.op("GatherElements", &[y, tu], vec![axis()])?;
            let mx = cx.reduce_max(y, &[ca], true)?;
            let shifted = cx.op("Sub", &[y, mx], vec![])?;
            let e = cx.op("Exp", &[shifted], vec![])?;
            let sum = cx.reduce_sum(e, &[ca], true)?;
            let log_sum = cx.op("Log", &[sum], vec![])?;
            // log_sum - (y[target] - max), as torch rounds it: both small.
            let picked_shifted = cx.op("Sub", &[picked, mx], vec![])?;
            let nll = cx.op("Sub", &[log_sum, picked_shifted], vec![])?;
            let l = cx.op("ReduceMean", &[nll], vec![kd0()])?;
            // d loss / d y = (softmax(y) - onehot(target)) / numel(target),
            // without a one-hot tensor as large as y: the softmax (in place
            // over the saved Exp) less one where the target points, a
            // ScatterElements that the planner also runs in place.
            let p = cx.op("Div", &[e, sum], vec![])?;
            let picked_p = cx.op("GatherElements", &[p, tu], vec![axis()])?;
            let one = cx.scalar(dt, 1.0)?;
            let less_one = cx.op("Sub", &[picked_p, one], vec![])?;
            let diff = cx.op("ScatterElements", &[p, tu, less_one], vec![axis()])?;
            let n = cx.numel_f(t, dt)?;
            (l, cx.op("Div", &[diff, n], vec![])?)
        }
    })
}
