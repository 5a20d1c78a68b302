//! Nodes the kernel table cannot express: If, Loop and Scan (their bodies are
//! subgraphs), and nodes that read or write a value of data-dependent size
//! (a Loop's scan outputs, an If whose branches differ in shape, and
//! everything downstream: the plan's `dynamic_values`).
//!
//! Each runs as a nested program ([`Body`]): a graph made standalone (its
//! formal inputs, then the outer values it captures, become graph inputs;
//! captured weights become its initializers), planned by graphopt-plan at
//! the concrete shapes seen at run time and bound to a nested
//! [`Executable`] with its own arena. Nested executables are cached per
//! input shapes, like the outer plan, and always use the CPU backend.
//!
//! - If: the condition picks a branch; its outputs are the node's.
//! - Loop: runs the body while `i < M` (when M is given) and the condition
//!   holds (when given); loop-carried values feed the next iteration, scan
//!   outputs are stacked along a new axis 0.
//! - Scan (opset 9+, along any axis, either direction): the body runs once
//!   per slice of the scan inputs along their scan axes with the state
//!   carried; scan outputs are stacked along their scan axes (reversed for
//!   a reverse direction).
//! - A node touching a dynamic value: the node alone, as a one-node graph.
//!
//! Inputs are copied out of the arena (or the dynamic store) and outputs
//! copied back: control flow pays copies, not kernels' time.

use crate::cpu::CpuBackend;
use crate::executor::{Executable, RunOptions, RunStats};
use crate::tensor::{elem_size, numel, HostTensor};
use graphopt_ir::{DType, Graph, Model, NewNode, NodeData, Shape, Tensor, Type, ValueId};
use graphopt_plan::{DimValues, PlanOptions};
use std::collections::HashMap;

/// What a special step runs.
pub(crate) enum Kind {
    If {
        then_b: Body,
        else_b: Body,
    },
    Loop {
        body: Body,
    },
    /// Scan (opset 9+): `m` scan inputs after the states; the axis (as
    /// given: negative counts from the back) and reverse flag per scan
    /// input, then per scan output.
    Scan {
        body: Body,
        m: usize,
        in_axes: Vec<i64>,
        out_axes: Vec<i64>,
        in_rev: Vec<bool>,
        out_rev: Vec<bool>,
    },
    /// One ordinary node run alone (it reads or writes a dynamic value).
    Node(Body),
    /// A node whose output size depends on its input values (NonZero,
    /// Unique, ...): computed on the host ([`crate::cpu::data_sized`]).
    DataSized(DataSized),
}

/// A [`Kind::DataSized`] node: where each input slot comes from and which
/// outputs are present.
pub(crate) struct DataSized {
    op: String,
    attrs: Vec<graphopt_ir::Attribute>,
    slots: Vec<Slot>,
    present: Vec<bool>,
}

/// Where an input slot of a [`DataSized`] node comes from.
enum Slot {
    Omitted,
    /// The step's `k`-th fed input.
    Fed(usize),
    Weight(HostTensor),
}

/// A special step: the node's inputs (then its non-weight captures) are the
/// step's `inputs`; where its outputs go is here.
pub(crate) struct Special {
    pub(crate) kind: Kind,
    /// Number of the node's own input slots; the step inputs after them
    /// are captures, named by `capture_names`.
    pub(crate) node_inputs: usize,
    pub(crate) capture_names: Vec<String>,
    /// Where each output goes (`None`: omitted).
    pub(crate) outputs: Vec<Option<OutSlot>>,
}

#[derive(Clone, Debug)]
pub(crate) enum OutSlot {
    Arena {
        name: String,
        offset: usize,
        len: usize,
        shape: Vec<usize>,
    },
    Dynamic {
        index: usize,
    },
}

/// The input types a nested program was planned for, with the contents
/// of the inputs folded in as constants.
type ShapeKey = Vec<(DType, Vec<usize>, Option<Vec<u8>>)>;

/// Integer inputs of at most this many elements are folded into a node
/// run alone (shapes, axes, sizes: what its shape inference needs).
const FOLD_MAX_ELEMS: usize = 64;

/// Nested programs kept per body (the oldest is dropped beyond this).
const MAX_CACHED: usize = 64;

/// A graph run as a nested program, planned per input shapes.
pub(crate) struct Body {
    graph: Box<Graph>,
    /// Opsets and functions of the enclosing model.
    header: Box<Model>,
    /// Captured outer weights, by name: initializers of the standalone graph.
    weights: Vec<(String, Tensor)>,
    /// Non-weight outer values of `graph`, in the order fed after the
    /// formal inputs.
    feeds: Vec<String>,
    /// Fold small integer formal inputs into the program as constants (a
    /// node run alone: a Reshape's computed shape must be known to plan
    /// its output).
    fold_ints: bool,
    /// With [`Body::fold_ints`], per formal input: fold it when small
    /// whatever its numeric type (floats, fp16, other integer widths), as
    /// it sizes the node's output ([`sizing_slots`]).
    fold_any: Vec<bool>,
    cache: Vec<(ShapeKey, Executable)>,
}

impl Body {
    /// `graph`'s outer values that are weights of the enclosing graph are
    /// copied in; the others are fed at run time by name.
    pub(crate) fn new(graph: Graph, outer: &Graph, model: &Model) -> Body {
        let mut weights = Vec::new();
        let mut feeds = Vec::new();
        for v in graph.values() {
            if !graph.is_outer(v) {
                continue;
            }
            let name = graph.name(v).to_string();
            match outer
                .value_by_name(&name)
                .filter(|&o| !outer.is_input(o))
                .and_then(|o| outer.initializer(o))
            {
                Some(t) => weights.push((name, t.clone())),
                None => feeds.push(name),
            }
        }
        Body {
            graph: Box::new(graph),
            header: Box::new(model.clone_header()),
            weights,
            feeds,
            fold_ints: false,
            fold_any: Vec::new(),
            cache: Vec::new(),
        }
    }

    fn folded(&self, k: usize, t: &HostTensor) -> bool {
        self.fold_ints
            && k < self.graph.inputs.len()
            && (matches!(t.dtype, DType::I64 | DType::I32)
                || self.fold_any.get(k).copied().unwrap_or(false) && t.dtype != DType::Bool)
            && numel(&t.shape) <= FOLD_MAX_ELEMS
    }

    /// Bytes of the nested arenas and workspaces made so far (recursively).
    pub(crate) fn arena_bytes(&self) -> u64 {
        self.cache
            .iter()
            .map(|(_, e)| {
                e.arena_allocated_bytes() + e.workspace_bytes() + e.subgraph_arena_bytes()
            })
            .sum()
    }

    /// Runs on `formal` (the graph's own inputs, in order), reading the
    /// fed outer values from `captures` by name.
    fn run(
        &mut self,
        formal: Vec<HostTensor>,
        captures: &[(&str, &HostTensor)],
        opts: &RunOptions,
        stats: &mut RunStats,
    ) -> Result<Vec<HostTensor>, String> {
        let mut fed = formal;
        for f in &self.feeds {
            let t = captures
                .iter()
                .find(|c| c.0 == f)
                .ok_or_else(|| format!("outer value '{f}' is not available to the subgraph"))?;
            fed.push(t.1.clone());
        }
        let key: ShapeKey = fed
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let c = self.folded(k, t).then(|| t.data.clone());
                (t.dtype, t.shape.clone(), c)
            })
            .collect();
        let slot = match self.cache.iter().position(|c| c.0 == key) {
            Some(i) => i,
            None => {
                let exe = self.build(&fed)?;
                if self.cache.len() >= MAX_CACHED {
                    // Folded values that change every run (a loop counter
                    // feeding a Reshape): keep memory bounded.
                    self.cache.remove(0);
                }
                self.cache.push((key, exe));
                self.cache.len() - 1
            }
        };
        let fed: Vec<HostTensor> = fed
            .into_iter()
            .enumerate()
            .filter(|(k, t)| !self.folded(*k, t))
            .map(|(_, t)| t)
            .collect();
        let exe = &mut self.cache[slot].1;
        let (out, s) = exe.run(&fed, opts).map_err(|e| e.to_string())?;
        stats.poisoned_regions += s.poisoned_regions;
        stats.kernels_run += s.kernels_run;
        stats.subgraph_runs += 1 + s.subgraph_runs;
        stats.dynamic_peak_bytes = stats.dynamic_peak_bytes.max(s.dynamic_peak_bytes);
        Ok(out)
    }

    /// The graph made standalone at the types of `fed`, planned and bound.
    fn build(&self, fed: &[HostTensor]) -> Result<Executable, String> {
        let body = &self.graph;
        let nformal = body.inputs.len();
        if fed.len() != nformal + self.feeds.len() {
            return Err(format!(
                "subgraph '{}' takes {} inputs, {} given",
                body.name,
                nformal,
                fed.len() - self.feeds.len()
            ));
        }
        let ty = |t: &HostTensor| {
            let dims: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
            Type::tensor(t.dtype, Some(Shape::known(&dims)))
        };
        let mut g = Graph::new(body.name.clone());
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        let err = |e: graphopt_ir::IrError| format!("subgraph '{}': {e}", body.name);
        for (k, &v) in body.inputs.iter().enumerate() {
            let t = &fed[k];
            let nv = g.add_value(body.name(v), Some(ty(t))).map_err(err)?;
            if self.folded(k, t) {
                let dims = t.shape.iter().map(|&d| d as i64).collect();
                let c = Tensor::from_raw(t.dtype, dims, t.data.clone().into()).map_err(err)?;
                g.set_initializer(nv, c);
            } else {
                g.inputs.push(nv);
            }
            map.insert(v, nv);
        }
        for v in body.values() {
            if !body.is_outer(v) {
                continue;
            }
            let name = body.name(v);
            if let Some((_, t)) = self.weights.iter().find(|w| w.0 == name) {
                let nv = g.add_value(name, None).map_err(err)?;
                g.set_initializer(nv, t.clone());
                map.insert(v, nv);
            } else {
                let k = self
                    .feeds
                    .iter()
                    .position(|f| f == name)
                    .expect("fed by name");
                let nv = g
                    .add_value(name, Some(ty(&fed[nformal + k])))
                    .map_err(err)?;
                g.inputs.push(nv);
                map.insert(v, nv);
            }
        }
        for &v in body.initializers() {
            if map.contains_key(&v) {
                continue;
            }
            let nv = g.add_value(body.name(v), None).map_err(err)?;
            g.set_initializer(nv, body.initializer(v).expect("initializer").clone());
            map.insert(v, nv);
        }
        let mut get = |g: &mut Graph, v: ValueId| -> Result<ValueId, String> {
            if let Some(&n) = map.get(&v) {
                return Ok(n);
            }
            // Types inside are re-inferred at these shapes.
            let n = g.add_value(body.name(v), None).map_err(err)?;
            map.insert(v, n);
            Ok(n)
        };
        for &n in body.order() {
            let d: &NodeData = body.node(n);
            let mut inputs = Vec::new();
            for i in d.inputs() {
                inputs.push(match i {
                    Some(v) => Some(get(&mut g, *v)?),
                    None => None,
                });
            }
            let mut outputs = Vec::new();
            for o in d.outputs() {
                outputs.push(match o {
                    Some(v) => Some(get(&mut g, *v)?),
                    None => None,
                });
            }
            g.add_node(NewNode {
                name: d.name.clone(),
                op_type: d.op_type.clone(),
                domain: d.domain.clone(),
                overload: d.overload.clone(),
                inputs,
                outputs,
                attributes: d.attributes.clone(),
                doc_string: String::new(),
                metadata_props: Vec::new(),
                preserved: Vec::new(),
            })
            .map_err(err)?;
        }
        for &o in &body.outputs {
            let n = get(&mut g, o)?;
            g.outputs.push(n);
        }
        let model = Model {
            graph: g,
            ..self.header.clone_header()
        };
        let popts = PlanOptions {
            threads: 1,
            ..PlanOptions::default()
        };
        let mp = graphopt_plan::plan_model(&model, &DimValues::default(), &popts)
            .map_err(|e| format!("subgraph '{}': {e}", body.name))?;
        if self.fold_ints && !mp.plan.dynamic_values.is_empty() {
            // A node run alone whose output size is still unknown (NonZero
            // and the like): running it alone again would not end.
            return Err(format!(
                "the size of {} is unknown even at the input shapes seen ({}): not supported yet",
                mp.plan.dynamic_values.join(", "),
                fed.iter()
                    .map(|t| format!("{} {:?}", t.dtype.name(), t.shape))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Executable::new(&mp.model, &mp.plan, &CpuBackend).map_err(|e| e.to_string())
    }
}

/// A weight's elements as a [`HostTensor`] (dense, little-endian).
fn host_tensor(t: &Tensor) -> Result<HostTensor, String> {
    let data = t
        .raw()
        .ok_or_else(|| format!("a {} weight is not supported here", t.dtype.name()))?
        .to_vec();
    let shape = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("weight dimension {d}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HostTensor {
        dtype: t.dtype,
        shape,
        data,
    })
}

/// The model's header (opsets, functions) without its graph.
trait CloneHeader {
    fn clone_header(&self) -> Model;
}

impl CloneHeader for Model {
    fn clone_header(&self) -> Model {
        Model {
            ir_version: self.ir_version,
            opset_imports: self.opset_imports.clone(),
            functions: self.functions.clone(),
            ..Model::default()
        }
    }
}

/// The one-node graph that runs `d` alone: its non-weight inputs become
/// graph inputs, its weight inputs initializers. Returns the graph and the
/// outer values fed, in order.
pub(crate) fn one_node_graph(g: &Graph, d: &NodeData) -> Result<(Graph, Vec<ValueId>), String> {
    let mut sub = Graph::new(if d.name.is_empty() {
        d.op_type.clone()
    } else {
        d.name.clone()
    });
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    let mut fed = Vec::new();
    let err = |e: graphopt_ir::IrError| e.to_string();
    for &v in d.inputs().iter().flatten() {
        if map.contains_key(&v) {
            continue;
        }
        let nv = sub.add_value(g.name(v), None).map_err(err)?;
        match g.initializer(v).filter(|_| !g.is_input(v)) {
            Some(t) => sub.set_initializer(nv, t.clone()),
            None => {
                sub.inputs.push(nv);
                fed.push(v);
            }
        }
        map.insert(v, nv);
    }
    let inputs = d.inputs().iter().map(|i| i.map(|v| map[&v])).collect();
    let mut outputs = Vec::new();
    for o in d.outputs() {
        outputs.push(match o {
            Some(v) => {
                let nv = sub.add_value(g.name(*v), None).map_err(err)?;
                sub.outputs.push(nv);
                Some(nv)
            }
            None => None,
        });
    }
    sub.add_node(NewNode {
        name: d.name.clone(),
        op_type: d.op_type.clone(),
        domain: d.domain.clone(),
        overload: d.overload.clone(),
        inputs,
        outputs,
        attributes: d.attributes.clone(),
        ..NewNode::default()
    })
    .map_err(err)?;
    Ok((sub, fed))
}

fn scalar_bool(t: &HostTensor, what: &str) -> Result<bool, String> {
    if t.dtype != DType::Bool || numel(&t.shape) != 1 {
        return Err(format!(
            "{what} must be one bool, got {} {:?}",
            t.dtype.name(),
            t.shape
        ));
    }
    Ok(t.data[0] != 0)
}

fn scalar_i64(t: &HostTensor, what: &str) -> Result<i64, String> {
    if numel(&t.shape) != 1 {
        return Err(format!(
            "{what} must be one integer, got shape {:?}",
            t.shape
        ));
    }
    Ok(match t.dtype {
        DType::I64 => i64::from_le_bytes(t.data[..8].try_into().expect("8 bytes")),
        DType::I32 => i32::from_le_bytes(t.data[..4].try_into().expect("4 bytes")) as i64,
        d => return Err(format!("{what} must be int64, got {}", d.name())),
    })
}

impl Special {
    /// Runs the node on `inputs` (node inputs, then captures); returns the
    /// present outputs in order.
    pub(crate) fn run(
        &mut self,
        inputs: Vec<Option<HostTensor>>,
        opts: &RunOptions,
        stats: &mut RunStats,
    ) -> Result<Vec<HostTensor>, String> {
        let all = self.run_all(inputs, opts, stats)?;
        if matches!(self.kind, Kind::Node(_) | Kind::DataSized(_)) {
            // The one-node graph's outputs are the present ones.
            return Ok(all);
        }
        Ok(all
            .into_iter()
            .zip(&self.outputs)
            .filter(|(_, s)| s.is_some())
            .map(|(t, _)| t)
            .collect())
    }

    fn run_all(
        &mut self,
        inputs: Vec<Option<HostTensor>>,
        opts: &RunOptions,
        stats: &mut RunStats,
    ) -> Result<Vec<HostTensor>, String> {
        let (node_in, caps) = inputs.split_at(self.node_inputs);
        let captures: Vec<(&str, &HostTensor)> = self
            .capture_names
            .iter()
            .zip(caps)
            .filter_map(|(n, t)| t.as_ref().map(|t| (n.as_str(), t)))
            .collect();
        let nout = self.outputs.len();
        match &mut self.kind {
            Kind::Node(body) => {
                let formal: Vec<HostTensor> = node_in.iter().flatten().cloned().collect();
                body.run(formal, &[], opts, stats)
            }
            Kind::DataSized(ds) => {
                let mut ins = Vec::with_capacity(ds.slots.len());
                for s in &ds.slots {
                    ins.push(match s {
                        Slot::Omitted => None,
                        Slot::Fed(k) => Some(
                            node_in
                                .get(*k)
                                .and_then(|t| t.as_ref())
                                .ok_or_else(|| format!("input {k} was not fed"))?,
                        ),
                        Slot::Weight(t) => Some(t),
                    });
                }
                let all = crate::cpu::data_sized::run(&ds.op, &ds.attrs, &ins)?;
                stats.kernels_run += 1;
                Ok(all
                    .into_iter()
                    .zip(&ds.present)
                    .filter(|(_, &p)| p)
                    .map(|(t, _)| t)
                    .collect())
            }
            Kind::If { then_b, else_b } => {
                let c = node_in
                    .first()
                    .and_then(|c| c.as_ref())
                    .ok_or("the condition is missing")?;
                let body = if scalar_bool(c, "the condition")? {
                    then_b
                } else {
                    else_b
                };
                let out = body.run(Vec::new(), &captures, opts, stats)?;
                if out.len() < nout {
                    return Err(format!(
                        "the branch gives {} outputs, the node has {nout}",
                        out.len()
                    ));
                }
                Ok(out.into_iter().take(nout).collect())
            }
            Kind::Scan {
                body,
                m,
                in_axes,
                out_axes,
                in_rev,
                out_rev,
            } => {
                let n = node_in.len() - *m;
                let ins: Vec<HostTensor> = node_in
                    .iter()
                    .map(|t| t.clone().ok_or("an input is missing"))
                    .collect::<Result<_, _>>()?;
                let (states, scan_in) = ins.split_at(n);
                let mut states = states.to_vec();
                let axes: Vec<usize> = scan_in
                    .iter()
                    .zip(in_axes.iter())
                    .map(|(t, &a)| scan_axis(a, t.shape.len(), "scan_input_axes"))
                    .collect::<Result<_, _>>()?;
                let len = match scan_in.first() {
                    Some(t) => t.shape[axes[0]],
                    None => 0,
                };
                if scan_in.iter().zip(&axes).any(|(t, &a)| t.shape[a] != len) {
                    return Err("scan inputs differ in length along their scan axes".into());
                }
                let k = body.graph.outputs.len() - n;
                let mut scans: Vec<Vec<HostTensor>> = vec![Vec::new(); k];
                for step in 0..len {
                    let mut formal = std::mem::take(&mut states);
                    for (j, t) in scan_in.iter().enumerate() {
                        let row = if in_rev[j] { len - 1 - step } else { step };
                        formal.push(slice_at(t, axes[j], row));
                    }
                    let out = body.run(formal, &captures, opts, stats)?;
                    if out.len() != n + k {
                        return Err(format!(
                            "the body gives {} outputs, expected {}",
                            out.len(),
                            n + k
                        ));
                    }
                    let mut out = out.into_iter();
                    states.extend(out.by_ref().take(n));
                    for (j, t) in out.enumerate() {
                        scans[j].push(t);
                    }
                }
                let mut result = states;
                for (j, mut parts) in scans.into_iter().enumerate() {
                    if out_rev[j] {
                        parts.reverse();
                    }
                    let slot = self.outputs.get(n + j).and_then(|o| o.as_ref());
                    let stacked = stack(parts, slot)?;
                    let rank = stacked.shape.len();
                    let a = scan_axis(out_axes[j], rank, "scan_output_axes")?;
                    result.push(if len == 0 {
                        stacked
                    } else {
                        move_axis0(stacked, a)
                    });
                }
                Ok(result.into_iter().take(nout).collect())
            }
            Kind::Loop { body } => {
                let trip = match node_in.first().and_then(|t| t.as_ref()) {
                    Some(t) => Some(scalar_i64(t, "the trip count M")?),
                    None => None,
                };
                let mut cond = match node_in.get(1).and_then(|t| t.as_ref()) {
                    Some(t) => Some(scalar_bool(t, "the condition")?),
                    None => None,
                };
                if trip.is_none() && cond.is_none() {
                    return Err("neither a trip count nor a condition: the loop never ends".into());
                }
                let mut carried: Vec<HostTensor> = Vec::new();
                for (k, t) in node_in.iter().enumerate().skip(2) {
                    carried.push(
                        t.clone()
                            .ok_or_else(|| format!("loop-carried input {k} is missing"))?,
                    );
                }
                let n = carried.len();
                let nscan = body.graph.outputs.len().saturating_sub(1 + n);
                let mut scans: Vec<Vec<HostTensor>> = vec![Vec::new(); nscan];
                let mut i: i64 = 0;
                while trip.is_none_or(|m| i < m) && cond != Some(false) {
                    let mut formal = vec![
                        HostTensor::from_i64(&[], &[i]),
                        HostTensor {
                            dtype: DType::Bool,
                            shape: Vec::new(),
                            data: vec![u8::from(cond.unwrap_or(true))],
                        },
                    ];
                    formal.append(&mut carried);
                    let out = body.run(formal, &captures, opts, stats)?;
                    if out.len() != 1 + n + nscan {
                        return Err(format!(
                            "the body gives {} outputs, expected {}",
                            out.len(),
                            1 + n + nscan
                        ));
                    }
                    let mut out = out.into_iter();
                    let c = out.next().expect("counted");
                    if cond.is_some() {
                        cond = Some(scalar_bool(&c, "the body's condition")?);
                    }
                    carried.extend(out.by_ref().take(n));
                    for (k, t) in out.enumerate() {
                        scans[k].push(t);
                    }
                    i += 1;
                }
                let mut result = carried;
                for (k, parts) in scans.into_iter().enumerate() {
                    result.push(stack(
                        parts,
                        self.outputs.get(n + k).and_then(|o| o.as_ref()),
                    )?);
                }
                Ok(result.into_iter().take(nout).collect())
            }
        }
    }

    /// Nested arenas and workspaces made so far.
    pub(crate) fn arena_bytes(&self) -> u64 {
        match &self.kind {
            Kind::If { then_b, else_b } => then_b.arena_bytes() + else_b.arena_bytes(),
            Kind::Loop { body } | Kind::Scan { body, .. } => body.arena_bytes(),
            Kind::Node(b) => b.arena_bytes(),
            Kind::DataSized(_) => 0,
        }
    }
}

/// Scan outputs of every iteration stacked along a new axis 0. With no
/// iteration the shape is `[0]` and the planned shape's tail when known.
fn stack(parts: Vec<HostTensor>, slot: Option<&OutSlot>) -> Result<HostTensor, String> {
    let Some(first) = parts.first() else {
        let shape = match slot {
            Some(OutSlot::Arena { shape, .. }) => shape.clone(),
            _ => vec![0],
        };
        return Ok(HostTensor {
            dtype: DType::F32,
            shape,
            data: Vec::new(),
        });
    };
    let (dtype, inner) = (first.dtype, first.shape.clone());
    let mut data = Vec::with_capacity(first.data.len() * parts.len());
    for p in &parts {
        if p.dtype != dtype || p.shape != inner {
            return Err(format!(
                "scan output changes from {} {:?} to {} {:?} between iterations",
                dtype.name(),
                inner,
                p.dtype.name(),
                p.shape
            ));
        }
        data.extend_from_slice(&p.data);
    }
    let mut shape = vec![parts.len()];
    shape.extend(inner);
    Ok(HostTensor { dtype, shape, data })
}

/// A scan axis `a` (negative counts from the back) of a tensor of rank
/// `rank`, checked.
fn scan_axis(a: i64, rank: usize, what: &str) -> Result<usize, String> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if !(0..r).contains(&x) {
        return Err(format!("{what} {a} is out of range for rank {r}"));
    }
    Ok(x as usize)
}

/// The slice `row` of `t` along `axis`, that axis dropped.
fn slice_at(t: &HostTensor, axis: usize, row: usize) -> HostTensor {
    let len = t.shape[axis];
    let outer: usize = t.shape[..axis].iter().product();
    let inner = t.data.len() / (outer * len).max(1);
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let at = (o * len + row) * inner;
        data.extend_from_slice(&t.data[at..at + inner]);
    }
    let mut shape = t.shape.clone();
    shape.remove(axis);
    HostTensor {
        dtype: t.dtype,
        shape,
        data,
    }
}

/// `t` with its axis 0 moved to `axis` (the scan outputs stacked along
/// axis 0 put where `scan_output_axes` says).
fn move_axis0(t: HostTensor, axis: usize) -> HostTensor {
    if axis == 0 {
        return t;
    }
    let len = t.shape[0];
    let outer: usize = t.shape[1..=axis].iter().product();
    let inner = t.data.len() / (len * outer).max(1);
    let mut data = vec![0u8; t.data.len()];
    for j in 0..len {
        for o in 0..outer {
            let from = (j * outer + o) * inner;
            let to = (o * len + j) * inner;
            data[to..to + inner].copy_from_slice(&t.data[from..from + inner]);
        }
    }
    let mut shape = t.shape[1..].to_vec();
    shape.insert(axis, len);
    HostTensor {
        dtype: t.dtype,
        shape,
        data,
    }
}

/// Bytes of a host tensor's elements as its type says.
pub(crate) fn nbytes(t: &HostTensor) -> usize {
    numel(&t.shape) * elem_size(t.dtype).unwrap_or(1)
}

/// Refusal of a subgraph node this runtime does not run.
pub(crate) fn supported_control(d: &NodeData) -> Result<(), String> {
    let default = d.domain.is_empty() || d.domain == "ai.onnx";
    match d.op_type.as_str() {
        "If" | "Loop" if default => Ok(()),
        "Scan" if default => Ok(()),
        _ => Err("subgraphs of this op are not supported yet (If, Loop and Scan run)".into()),
    }
}

/// The subgraph attribute `name` of `d`.
pub(crate) fn graph_attr<'a>(d: &'a NodeData, name: &str) -> Result<&'a Graph, String> {
    match d.attr(name).map(|a| &a.value) {
        Some(graphopt_ir::AttrValue::Graph(g)) => Ok(g),
        _ => Err(format!("attribute '{name}' (a graph) is missing")),
    }
}

/// The kind of a control node: its bodies made nested programs.
pub(crate) fn control_kind(d: &NodeData, outer: &Graph, model: &Model) -> Result<Kind, String> {
    supported_control(d)?;
    Ok(match d.op_type.as_str() {
        "If" => Kind::If {
            then_b: Body::new(graph_attr(d, "then_branch")?.clone(), outer, model),
            else_b: Body::new(graph_attr(d, "else_branch")?.clone(), outer, model),
        },
        "Scan" => {
            if model.onnx_opset().is_some_and(|v| v < 9) {
                return Err("Scan before opset 9 (batched, sequence_lens) is not supported".into());
            }
            let body = graph_attr(d, "body")?;
            let m = d
                .attr_int("num_scan_inputs")
                .ok_or("attribute 'num_scan_inputs' is missing")? as usize;
            let n = d
                .inputs()
                .len()
                .checked_sub(m)
                .ok_or("fewer inputs than num_scan_inputs")?;
            let k = body
                .outputs
                .len()
                .checked_sub(n)
                .ok_or("the body gives fewer outputs than states")?;
            if body.inputs.len() != n + m || d.inputs().iter().any(|i| i.is_none()) {
                return Err(format!(
                    "the body takes {} inputs, the node gives {} (states, scan inputs)",
                    body.inputs.len(),
                    d.inputs().len()
                ));
            }
            let dirs = |a: &str, len: usize| -> Vec<bool> {
                let v = d.attr_ints(a).unwrap_or(&[]);
                (0..len)
                    .map(|i| v.get(i).is_some_and(|&x| x == 1))
                    .collect()
            };
            let axes = |a: &str, len: usize| -> Vec<i64> {
                let v = d.attr_ints(a).unwrap_or(&[]);
                (0..len).map(|i| v.get(i).copied().unwrap_or(0)).collect()
            };
            Kind::Scan {
                body: Body::new(body.clone(), outer, model),
                m,
                in_axes: axes("scan_input_axes", m),
                out_axes: axes("scan_output_axes", k),
                in_rev: dirs("scan_input_directions", m),
                out_rev: dirs("scan_output_directions", k),
            }
        }
        _ => {
            let body = graph_attr(d, "body")?;
            if body.inputs.len() != d.inputs().len() {
                return Err(format!(
                    "the body takes {} inputs, the node gives {} (M, cond, carried values)",
                    body.inputs.len(),
                    d.inputs().len()
                ));
            }
            Kind::Loop {
                body: Body::new(body.clone(), outer, model),
            }
        }
    })
}

/// A one-node program for `d`.
pub(crate) fn node_kind(
    g: &Graph,
    d: &NodeData,
    model: &Model,
) -> Result<(Kind, Vec<ValueId>), String> {
    let (sub, fed) = one_node_graph(g, d)?;
    if crate::cpu::data_sized::is_data_sized(&d.domain, &d.op_type) {
        let mut slots = Vec::new();
        for i in d.inputs() {
            slots.push(match i {
                None => Slot::Omitted,
                Some(v) => match fed.iter().position(|f| f == v) {
                    Some(k) => Slot::Fed(k),
                    None => {
                        let t = g.initializer(*v).ok_or_else(|| {
                            format!("input '{}' is neither fed nor a weight", g.name(*v))
                        })?;
                        Slot::Weight(host_tensor(t)?)
                    }
                },
            });
        }
        return Ok((
            Kind::DataSized(DataSized {
                op: d.op_type.clone(),
                attrs: d.attributes.clone(),
                slots,
                present: d.outputs().iter().map(|o| o.is_some()).collect(),
            }),
            fed,
        ));
    }
    let mut body = Body::new(sub, g, model);
    body.fold_ints = true;
    // Inputs of other types that size an output are folded too, so the
    // output's size is known; data inputs are not (a Resize's float image
    // would rebuild the program each run). Formal input k is fed value
    // fed[k], which may sit at any of the node's slots.
    let sizing = sizing_slots(&d.op_type);
    body.fold_any = fed
        .iter()
        .map(|&v| {
            d.inputs()
                .iter()
                .enumerate()
                .any(|(i, x)| *x == Some(v) && sizing.contains(&i))
        })
        .collect();
    Ok((Kind::Node(body), fed))
}

/// The input slots of a node run alone that size its output whatever
/// their numeric type (small integer inputs are folded anyway): Range's
/// bounds, Resize's and Upsample's roi, scales and sizes, OneHot's depth.
fn sizing_slots(op: &str) -> &'static [usize] {
    match op {
        "Range" => &[0, 1, 2],
        "Resize" | "Upsample" => &[1, 2, 3],
        "OneHot" => &[1],
        _ => &[],
    }
}
