//! Binding a model to a plan: every check of [`super::Executable::new`]
//! (invariants 1 to 3 of the executor), each node's inputs and outputs
//! resolved to arena offsets, weights or dynamic slots, a kernel made per
//! node by a [`KernelMaker`] (the host [`Backend`]s here, the CUDA
//! backend in `crate::cuda`), special steps (If, Loop, nodes touching
//! dynamic values) set up as nested programs.

use super::memory::{
    dyn_free_after, poison_regions, release_pages, Aligned, Loc, Region, Weight, ALIGN,
};
use super::ExecError;
use crate::backend::{Backend, Kernel, KernelIo, NodeCtx, TensorInfo};
use crate::control::{self, OutSlot, Special};
use crate::cpu::data_sized;
use crate::tensor::{elem_size, numel};
use bytes::Bytes;
use graphopt_ir::{DType, Graph, Model, TensorData, ValueId};
use graphopt_plan::{inplace_rule_in, InPlace, Plan};

pub(crate) struct Step<K> {
    pub(crate) name: String,
    pub(crate) op: String,
    pub(crate) kernel: K,
    pub(crate) inputs: Vec<Option<(Loc, TensorInfo)>>,
    /// Arena offset, length and type of each output (`None`: omitted).
    pub(crate) outputs: Vec<Option<(usize, usize, TensorInfo)>>,
    /// Input slots living in output 0's storage.
    pub(crate) in_place: Vec<usize>,
    /// An aliased view: the bytes are already there.
    pub(crate) skip: bool,
    /// If/Loop, or a node touching a dynamic value: run as a nested
    /// program (`kernel` is then a placeholder and `outputs` empty).
    pub(crate) special: Option<Box<Special>>,
}

/// What makes kernels for [`bind`]: a host [`Backend`] (kernels on byte
/// slices) or a device backend (kernels on device addresses, see
/// `crate::cuda`). Both share every plan check below.
pub(crate) trait KernelMaker {
    type K;
    fn name(&self) -> &str;
    fn has_op(&self, domain: &str, op_type: &str) -> bool;
    fn make(&self, ctx: &NodeCtx) -> Result<Self::K, String>;
    fn workspace_bytes(k: &Self::K) -> usize;
    fn in_place(k: &Self::K) -> bool;
    /// A placeholder kernel for steps run as nested programs (If, Loop,
    /// nodes touching dynamic values); `None` (the default) refuses them.
    fn nop(&self) -> Option<Self::K> {
        None
    }
    /// Whether kernels take an omitted output followed by a present one
    /// (LSTM's `("", Y_h)`): the host runtime hands such a gap to the
    /// kernel as an empty placeholder; `false` (the default) refuses it.
    fn output_gaps(&self) -> bool {
        false
    }
}

/// The placeholder kernel of a special step (never run).
struct Nop;

impl Kernel for Nop {
    fn run(&self, _: &mut KernelIo) -> Result<(), String> {
        Err("a special step has no kernel".into())
    }
}

pub(super) struct HostMaker<'a>(pub(super) &'a dyn Backend);

impl KernelMaker for HostMaker<'_> {
    type K = Box<dyn Kernel>;
    fn name(&self) -> &str {
        self.0.name()
    }
    fn has_op(&self, domain: &str, op_type: &str) -> bool {
        self.0.has_op(domain, op_type)
    }
    fn make(&self, ctx: &NodeCtx) -> Result<Self::K, String> {
        self.0.kernel(ctx)
    }
    fn workspace_bytes(k: &Self::K) -> usize {
        k.workspace_bytes()
    }
    fn in_place(k: &Self::K) -> bool {
        k.in_place()
    }
    fn nop(&self) -> Option<Self::K> {
        Some(Box::new(Nop))
    }
    fn output_gaps(&self) -> bool {
        true
    }
}

/// A model bound to a plan: every check of [`Executable::new`] done, every
/// kernel made, nothing allocated but misaligned weights.
pub(crate) struct Bound<K> {
    pub(crate) steps: Vec<Step<K>>,
    pub(crate) arena_bytes: u64,
    /// Largest kernel scratch.
    pub(crate) max_workspace: usize,
    /// In-place staging bytes (64-aligned), placed before the scratch.
    pub(crate) staging_bytes: usize,
    pub(crate) weights: Vec<Weight>,
    pub(crate) weights_bytes: u64,
    pub(crate) weights_copied: u64,
    pub(crate) inputs: Vec<(String, usize, TensorInfo)>,
    pub(crate) defaults: Vec<(usize, Bytes)>,
    pub(crate) outputs: Vec<(String, Loc, TensorInfo)>,
    pub(crate) poison_after: Vec<Vec<Region>>,
    /// Names of the dynamic values, by store slot.
    pub(crate) dyn_names: Vec<String>,
    /// Dynamic values to free after each step.
    pub(crate) dyn_free_after: Vec<Vec<usize>>,
}

fn info(g: &Graph, v: ValueId) -> Result<TensorInfo, ExecError> {
    let t = g.ty(v).and_then(|t| t.as_tensor()).ok_or_else(|| {
        ExecError::Unsupported(format!("value '{}' is not a typed tensor", g.name(v)))
    })?;
    let dims = t.shape.as_ref().and_then(|s| s.as_known()).ok_or_else(|| {
        ExecError::Unsupported(format!(
            "value '{}' has no concrete shape (bind its dims)",
            g.name(v)
        ))
    })?;
    // Packed 4-bit initializers (uint4/int4) are read in place as weights
    // (Cast, the palette kernels); no arena value has such a type.
    let packed_weight = crate::tensor::is_packed4(t.elem) && g.constant(v).is_some();
    if elem_size(t.elem).is_none() && !packed_weight {
        return Err(ExecError::Unsupported(format!(
            "value '{}' has element type {}, which the runtime does not handle",
            g.name(v),
            t.elem.name()
        )));
    }
    Ok(TensorInfo {
        dtype: t.elem,
        shape: dims.iter().map(|&d| d as usize).collect(),
    })
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// Binds `model` to `plan`, asking `maker` for every kernel: the checks
/// and layout of [`Executable::new`], shared with device backends.
pub(crate) fn bind<M: KernelMaker>(
    model: &Model,
    plan: &Plan,
    backend: &M,
) -> Result<Bound<M::K>, ExecError> {
    let g = &model.graph;

    // Invariant 1 first by name: an op without any kernel, or a
    // subgraph, is named before anything else is checked.
    let specials = backend.nop().is_some();
    for &n in &plan.schedule {
        let d = g.node(n);
        let why: String = if d.has_subgraphs() {
            if !specials {
                "subgraphs (If/Loop/Scan) are not supported yet on this backend".into()
            } else if let Err(e) = control::supported_control(d) {
                e
            } else {
                continue;
            }
        } else if !(backend.has_op(&d.domain, &d.op_type)
            || specials && data_sized::is_data_sized(&d.domain, &d.op_type))
        {
            "no kernel for this op yet".into()
        } else {
            continue;
        };
        return Err(ExecError::NoKernel {
            backend: backend.name().to_string(),
            op: d.qualified_op(),
            node: if d.name.is_empty() {
                n.to_string()
            } else {
                d.name.clone()
            },
            why,
        });
    }
    if !plan.dynamic_values.is_empty() && !specials {
        return Err(ExecError::Unsupported(format!(
            "{} value(s) of data-dependent size ({}): dynamic allocation is not implemented yet",
            plan.dynamic_values.len(),
            plan.dynamic_values.join(", ")
        )));
    }
    let opset = model
        .opset_imports
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(1, |o| o.version);
    let nvals = g.values().map(|v| v.index() + 1).max().unwrap_or(0);
    let mut tensor_of: Vec<Option<usize>> = vec![None; nvals];
    // Values of data-dependent size: the dynamic store's slots.
    let mut dyn_of: Vec<Option<usize>> = vec![None; nvals];
    for (i, name) in plan.dynamic_values.iter().enumerate() {
        let v = g.value_by_name(name).ok_or_else(|| {
            ExecError::BadPlan(format!("dynamic value '{name}' is not in the graph"))
        })?;
        dyn_of[v.index()] = Some(i);
    }
    for (i, t) in plan.tensors.iter().enumerate() {
        tensor_of[t.value.index()] = Some(i);
        if t.offset + t.size > plan.arena_bytes {
            return Err(ExecError::BadPlan(format!(
                "tensor '{}' at [{}, +{}) lies outside the arena of {} bytes",
                t.name, t.offset, t.size, plan.arena_bytes
            )));
        }
    }
    // Weights: initializers that are not graph inputs, read in place.
    let mut weights = Vec::new();
    let mut weight_of: Vec<Option<usize>> = vec![None; nvals];
    let (mut weights_bytes, mut weights_copied) = (0u64, 0u64);
    for &w in g.initializers() {
        if g.is_input(w) {
            continue;
        }
        let t = g.initializer(w).expect("listed initializer");
        let TensorData::Raw(b) = &t.data else {
            return Err(ExecError::Unsupported(format!(
                "initializer '{}' holds strings",
                g.name(w)
            )));
        };
        weights_bytes += b.len() as u64;
        let es = elem_size(t.dtype).unwrap_or(1);
        let wt = if b.as_ptr().align_offset(es.max(1)) == 0 {
            Weight::Shared(b.clone())
        } else {
            weights_copied += b.len() as u64;
            let mut a = Aligned::new(b.len());
            a.bytes_mut().copy_from_slice(b);
            release_pages(b);
            Weight::Copied(a)
        };
        weight_of[w.index()] = Some(weights.len());
        weights.push(wt);
    }
    let loc = |v: ValueId| -> Result<Loc, ExecError> {
        if let Some(i) = weight_of[v.index()] {
            return Ok(Loc::Weight(i));
        }
        if let Some(i) = dyn_of[v.index()] {
            return Ok(Loc::Dynamic(i));
        }
        match tensor_of[v.index()] {
            Some(t) => Ok(Loc::Arena {
                offset: plan.tensors[t].offset as usize,
                len: plan.tensors[t].size as usize,
            }),
            None => Err(ExecError::Unsupported(format!(
                "value '{}' is neither a weight nor a planned tensor (outer-scope values are not supported)",
                g.name(v)
            ))),
        }
    };
    // Declared aliases: output value -> input value.
    let mut alias_in: Vec<Option<ValueId>> = vec![None; nvals];
    for a in &plan.aliases {
        alias_in[plan.tensors[a.output].value.index()] = Some(plan.tensors[a.input].value);
    }
    let mut steps = Vec::new();
    let mut max_ws = 0usize;
    let mut max_stage = 0usize;
    for &n in &plan.schedule {
        let d = g.node(n);
        let name = if d.name.is_empty() {
            n.to_string()
        } else {
            d.name.clone()
        };
        let refuse = |why: String| ExecError::NoKernel {
            backend: backend.name().to_string(),
            op: d.qualified_op(),
            node: name.clone(),
            why,
        };
        let touches_dynamic = d
            .inputs()
            .iter()
            .chain(d.outputs())
            .flatten()
            .any(|v| dyn_of[v.index()].is_some());
        // Ops of data-dependent output size run on the host even where the
        // planner knew the size (their outputs are then copied in place).
        let data_sized = data_sized::is_data_sized(&d.domain, &d.op_type);
        if d.has_subgraphs() || touches_dynamic || data_sized {
            let kernel = backend.nop().ok_or_else(|| {
                refuse(if data_sized {
                    "ops of data-dependent output size are not supported yet on this backend"
                        .into()
                } else {
                    "subgraphs (If/Loop/Scan) and values of data-dependent size are not supported yet on this backend".into()
                })
            })?;
            // Inputs: the node's, then its non-weight captures (If/Loop),
            // or the distinct non-weight inputs (a node run alone).
            let (kind, fed, node_inputs, capture_names) = if d.has_subgraphs() {
                let kind = control::control_kind(d, g, model).map_err(&refuse)?;
                let mut fed: Vec<Option<ValueId>> = d.inputs().to_vec();
                let mut names = Vec::new();
                for &c in d.captures() {
                    if weight_of[c.index()].is_none() {
                        fed.push(Some(c));
                        names.push(g.name(c).to_string());
                    }
                }
                (kind, fed, d.inputs().len(), names)
            } else {
                let (kind, fed) = control::node_kind(g, d, model).map_err(&refuse)?;
                let n = fed.len();
                (kind, fed.into_iter().map(Some).collect(), n, Vec::new())
            };
            let mut inputs = Vec::new();
            for v in fed {
                inputs.push(match v {
                    None => None,
                    Some(v) => Some((loc(v)?, info_or_dynamic(g, v, &dyn_of)?)),
                });
            }
            let mut outs = Vec::new();
            for &o in d.outputs() {
                let Some(v) = o else {
                    outs.push(None);
                    continue;
                };
                outs.push(Some(match loc(v)? {
                    Loc::Arena { offset, len } => {
                        let ti = info(g, v)?;
                        let want = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                        if len != want {
                            return Err(ExecError::BadPlan(format!(
                                "tensor '{}' is planned at {len} bytes but holds {want}",
                                g.name(v)
                            )));
                        }
                        OutSlot::Arena {
                            name: g.name(v).to_string(),
                            offset,
                            len,
                            shape: ti.shape,
                        }
                    }
                    Loc::Dynamic(index) => OutSlot::Dynamic { index },
                    Loc::Weight(_) => {
                        return Err(ExecError::BadPlan(format!(
                            "output '{}' of node '{name}' is an initializer",
                            g.name(v)
                        )))
                    }
                }));
            }
            steps.push(Step {
                name,
                op: d.op_type.clone(),
                kernel,
                inputs,
                outputs: Vec::new(),
                in_place: Vec::new(),
                skip: false,
                special: Some(Box::new(Special {
                    kind,
                    node_inputs,
                    capture_names,
                    outputs: outs,
                })),
            });
            continue;
        }
        let mut inputs = Vec::new();
        let mut infos = Vec::new();
        let mut constants = Vec::new();
        for &i in d.inputs() {
            match i {
                None => {
                    inputs.push(None);
                    infos.push(None);
                    constants.push(None);
                }
                Some(v) => {
                    let ti = info(g, v)?;
                    let l = loc(v)?;
                    constants.push(match l {
                        Loc::Weight(w) => Some(weights[w].bytes()),
                        _ => None,
                    });
                    inputs.push(Some((l, ti.clone())));
                    infos.push(Some(ti));
                }
            }
        }
        let mut outputs = Vec::new();
        let mut out_infos = Vec::new();
        for &o in d.outputs() {
            match o {
                None => {
                    outputs.push(None);
                    out_infos.push(TensorInfo {
                        dtype: DType::F32,
                        shape: vec![0],
                    });
                }
                Some(v) => {
                    let ti = info(g, v)?;
                    let Loc::Arena { offset, len } = loc(v)? else {
                        return Err(ExecError::BadPlan(format!(
                            "output '{}' of node '{name}' is an initializer",
                            g.name(v)
                        )));
                    };
                    let want = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                    if len != want {
                        return Err(ExecError::BadPlan(format!(
                            "tensor '{}' is planned at {len} bytes but holds {want}",
                            g.name(v)
                        )));
                    }
                    outputs.push(Some((offset, len, ti.clone())));
                    out_infos.push(ti);
                }
            }
        }
        if let Some(k) = d.outputs().iter().position(|o| o.is_none()) {
            if !backend.output_gaps() && d.outputs()[k..].iter().any(|o| o.is_some()) {
                return Err(refuse(format!(
                    "output {k} is omitted but a later one is not (not supported yet)"
                )));
            }
        }
        let ctx = NodeCtx {
            node: d,
            opset,
            inputs: infos,
            outputs: out_infos,
            constants,
        };
        let kernel = backend.make(&ctx).map_err(refuse)?;
        // In-place slots and aliased views.
        let host = d.output(0).and_then(|o| alias_in[o.index()]);
        let rule = inplace_rule_in(&d.domain, &d.op_type);
        let mut in_place = Vec::new();
        let mut skip = false;
        if let Some(h) = host {
            match rule {
                InPlace::View if d.input(0) == Some(h) => skip = true,
                InPlace::Elementwise => {
                    in_place = (0..d.inputs().len())
                        .filter(|&k| d.input(k) == Some(h))
                        .collect();
                }
                // Output 0 over input j only, read by no other slot.
                InPlace::Over(j) if graphopt_plan::liveness::over_host(d) == Some(h) => {
                    in_place = vec![j];
                }
                _ => {
                    return Err(ExecError::BadPlan(format!(
                        "node '{name}' ({}) has an in-place pair its rule does not allow",
                        d.op_type
                    )))
                }
            }
        }
        // Invariant 3: no overlap but the declared pair.
        let outs: Vec<(usize, usize)> = outputs.iter().flatten().map(|o| (o.0, o.1)).collect();
        for (a, x) in outs.iter().enumerate() {
            for y in &outs[a + 1..] {
                if overlaps(*x, *y) {
                    return Err(ExecError::BadPlan(format!(
                        "two outputs of node '{name}' overlap"
                    )));
                }
            }
        }
        if !skip {
            for (k, i) in inputs.iter().enumerate() {
                if in_place.contains(&k) {
                    continue;
                }
                if let Some((Loc::Arena { offset, len }, _)) = i {
                    if outs.iter().any(|o| overlaps(*o, (*offset, *len))) {
                        return Err(ExecError::BadPlan(format!(
                            "node '{name}' writes over its input {k}, which the plan does not declare in place"
                        )));
                    }
                }
            }
        }
        if !skip {
            max_ws = max_ws.max(M::workspace_bytes(&kernel));
            if !in_place.is_empty() && !M::in_place(&kernel) {
                max_stage = max_stage.max(outputs[0].as_ref().map_or(0, |o| o.1));
            }
        }
        steps.push(Step {
            name,
            op: d.op_type.clone(),
            kernel,
            inputs,
            outputs,
            in_place,
            skip,
            special: None,
        });
    }
    // Graph inputs and outputs.
    let mut inputs = Vec::new();
    let mut defaults = Vec::new();
    for &v in &g.inputs {
        let Loc::Arena { offset, .. } = loc(v)? else {
            continue;
        };
        match g.initializer(v) {
            Some(t) => {
                let Some(b) = t.raw() else {
                    return Err(ExecError::Unsupported(format!(
                        "input '{}' has a string default",
                        g.name(v)
                    )));
                };
                defaults.push((offset, b.clone()));
            }
            None => inputs.push((g.name(v).to_string(), offset, info(g, v)?)),
        }
    }
    let mut outputs = Vec::new();
    for &v in &g.outputs {
        outputs.push((
            g.name(v).to_string(),
            loc(v)?,
            info_or_dynamic(g, v, &dyn_of)?,
        ));
    }
    let dyn_free_after = dyn_free_after(&steps, &outputs, plan.dynamic_values.len());
    let poison_after = poison_regions(g, plan);
    Ok(Bound {
        steps,
        arena_bytes: plan.arena_bytes,
        max_workspace: max_ws,
        staging_bytes: max_stage.next_multiple_of(ALIGN),
        weights,
        weights_bytes,
        weights_copied,
        inputs,
        defaults,
        outputs,
        poison_after,
        dyn_names: plan.dynamic_values.clone(),
        dyn_free_after,
    })
}

/// [`info`], or for a value of data-dependent size its element type with
/// an empty placeholder shape (the run-time shape travels with the value).
fn info_or_dynamic(
    g: &Graph,
    v: ValueId,
    dyn_of: &[Option<usize>],
) -> Result<TensorInfo, ExecError> {
    if dyn_of[v.index()].is_none() {
        return info(g, v);
    }
    Ok(TensorInfo {
        dtype: g.ty(v).and_then(|t| t.elem()).unwrap_or(DType::F32),
        shape: Vec::new(),
    })
}
