//! Planning a whole model at concrete dims, and the largest batch that fits
//! a memory budget.
//!
//! Steps of [`plan_model`]:
//! 1. bind the given dims; symbolic dims of the graph inputs left unbound
//!    get the default (1), and the result says which ([`DimBinding`]);
//! 2. shape inference ([`graphopt_ir::infer::infer_model`]) at those dims,
//!    on a copy of the model;
//! 3. [`plan_graph`] on the inferred graph.
//!
//! [`max_batch`] searches the largest value of one dim such that weights +
//! arena fit a budget: doubling, then bisection, re-inferring shapes at
//! every probe (memory is assumed to grow with the batch).

use crate::plan::{Plan, PlanError, PlanOptions};
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{Dim, Model, Shape, Type, TypeKind};
use serde::Serialize;

/// One symbolic dim and the value the plan used for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DimBinding {
    pub name: String,
    pub value: i64,
    /// True when no binding named it and the default was used.
    pub defaulted: bool,
}

/// A model planned at concrete dims.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    /// The model with shapes inferred at `dims` (what the plan's value ids
    /// refer to).
    pub model: Model,
    pub plan: Plan,
    /// Every symbolic input dim, then other bound names, in that order.
    pub dims: Vec<DimBinding>,
}

/// Dims to plan at.
#[derive(Clone, Debug, Default)]
pub struct DimValues {
    /// `NAME=VALUE` bindings of symbolic dims.
    pub bound: Vec<(String, i64)>,
    /// Whole shapes of graph inputs by input name (`--shape NAME=D0,D1`, or
    /// the arrays of `--inputs X.npz`), as onnxruntime would see them: the
    /// input's symbolic dims are bound to these values, and its unnamed
    /// ones set.
    pub shapes: Vec<(String, Vec<i64>)>,
    /// The value of input dims nothing binds, named or not (1 if `None`).
    pub default: Option<i64>,
}

impl DimValues {
    pub fn new(bound: &[(String, i64)]) -> DimValues {
        DimValues {
            bound: bound.to_vec(),
            ..DimValues::default()
        }
    }
    fn default_value(&self) -> i64 {
        self.default.unwrap_or(1)
    }
}

/// Symbolic dim names of the graph inputs, in order of first appearance.
pub fn input_dim_names(m: &Model) -> Vec<String> {
    let g = &m.graph;
    let mut out: Vec<String> = Vec::new();
    for &v in &g.inputs {
        if g.initializer(v).is_some() {
            continue;
        }
        if let Some(s) = g.ty(v).and_then(|t| t.shape()) {
            for d in &s.dims {
                if let Dim::Sym(n) = d {
                    if !out.contains(n) {
                        out.push(n.clone());
                    }
                }
            }
        }
    }
    out
}

/// Why a model cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelPlanError {
    #[error("{count} value(s) still have unknown size after shape inference at these dims (--strict): {shown}{more} (bind dims with --dim NAME=VALUE, input shapes with --shape NAME=D0,D1,... or --inputs X.npz, or drop --strict to plan them as dynamic allocations outside the arena)", count = .0.len(), shown = .0.iter().take(12).cloned().collect::<Vec<_>>().join(", "), more = if .0.len() > 12 { ", ..." } else { "" })]
    UnknownSizes(Vec<String>),
    #[error("{0}")]
    Plan(PlanError),
    #[error("a dim cannot be negative: {0}={1}")]
    NegativeDim(String, i64),
    #[error("{0}")]
    BadShape(String),
    #[error("the budget of {budget} is too small even for {dim}=1 (weights {weights} + arena {arena} = {total})", budget = human_bytes(*.budget), weights = human_bytes(*.weights), arena = human_bytes(*.arena), total = human_bytes(.weights + .arena))]
    BudgetTooSmall {
        dim: String,
        budget: u64,
        weights: u64,
        arena: u64,
    },
    #[error("memory does not grow with '{0}' (is it the batch dim?)")]
    NotBatch(String),
    #[error("--max-batch varies '{0}': do not also bind it with --dim")]
    BatchBound(String),
    #[error("no symbolic input dim to use as the batch; name one with --batch-dim")]
    NoBatchDim,
}

impl From<PlanError> for ModelPlanError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::UnknownSizes(v) => ModelPlanError::UnknownSizes(v),
            other => ModelPlanError::Plan(other),
        }
    }
}

/// Infers shapes at `dims` and plans the model.
pub fn plan_model(
    base: &Model,
    dims: &DimValues,
    opts: &PlanOptions,
) -> Result<ModelPlan, ModelPlanError> {
    let (model, bindings) = bind_model(base, dims)?;
    let donations = if opts.donate {
        crate::donation::declared_donations(&model)
    } else {
        Vec::new()
    };
    let plan = crate::plan::plan_graph_donating(&model.graph, opts, &donations)?;
    Ok(ModelPlan {
        model,
        plan,
        dims: bindings,
    })
}

/// Steps 1 and 2 of [`plan_model`]: a copy of the model with its input
/// dims bound and shapes inferred at `dims`, and the bindings.
pub fn bind_model(
    base: &Model,
    dims: &DimValues,
) -> Result<(Model, Vec<DimBinding>), ModelPlanError> {
    if let Some((k, v)) = dims.bound.iter().find(|d| d.1 < 0) {
        return Err(ModelPlanError::NegativeDim(k.clone(), *v));
    }
    if dims.default_value() < 0 {
        return Err(ModelPlanError::NegativeDim(
            "(default)".into(),
            dims.default_value(),
        ));
    }
    let mut bindings: Vec<DimBinding> = dims
        .bound
        .iter()
        .map(|(k, v)| DimBinding {
            name: k.clone(),
            value: *v,
            defaulted: false,
        })
        .collect();
    for s in input_dim_names(base) {
        if !bindings.iter().any(|d| d.name == s) {
            bindings.push(DimBinding {
                name: s,
                value: dims.default_value(),
                defaulted: true,
            });
        }
    }
    let mut model = base.clone();
    // Sparse weights are planned as the dense weights runtimes load.
    model.graph.densify_sparse_initializers();
    bind_input_shapes(&mut model, dims, &mut bindings)?;
    infer_model(
        &mut model,
        &InferOptions {
            dims: bindings.iter().map(|d| (d.name.clone(), d.value)).collect(),
            // Plans are for the default inputs: an overridable input's
            // initializer (every initializer before IR 4) is its value.
            input_defaults: true,
        },
    );
    Ok((model, bindings))
}

/// Sets the shapes `dims.shapes` gives on the graph inputs (their symbolic
/// dims become bindings), and gives every remaining unnamed input dim the
/// default (listed as `input[axis]`, defaulted).
fn bind_input_shapes(
    model: &mut Model,
    dims: &DimValues,
    bindings: &mut Vec<DimBinding>,
) -> Result<(), ModelPlanError> {
    let g = &mut model.graph;
    let runtime: Vec<_> = g.runtime_inputs().collect();
    for (name, shape) in &dims.shapes {
        let Some(&v) = runtime.iter().find(|&&v| g.name(v) == name) else {
            let names: Vec<&str> = runtime.iter().map(|&v| g.name(v)).collect();
            return Err(ModelPlanError::BadShape(format!(
                "--shape {name}: the model has no input '{name}' (inputs: {})",
                names.join(", ")
            )));
        };
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return Err(ModelPlanError::NegativeDim(name.clone(), *d));
        }
        let Some(Type {
            kind: TypeKind::Tensor(t),
            ..
        }) = g.ty(v).cloned()
        else {
            return Err(ModelPlanError::BadShape(format!(
                "--shape {name}: input '{name}' is not a tensor"
            )));
        };
        if let Some(s) = &t.shape {
            if s.dims.len() != shape.len() {
                return Err(ModelPlanError::BadShape(format!(
                    "--shape {name}: the input has rank {}, {} dims given",
                    s.dims.len(),
                    shape.len()
                )));
            }
            for (axis, (d, &want)) in s.dims.iter().zip(shape).enumerate() {
                match d {
                    // A negative dim (old exporters write -1 for "any") is
                    // unknown: the given size replaces it.
                    Dim::Known(k) if *k >= 0 && *k != want => {
                        return Err(ModelPlanError::BadShape(format!(
                            "--shape {name}: dim {axis} is {k} in the model, {want} given"
                        )))
                    }
                    // "?" is how some exporters (paddle2onnx) write an
                    // unnamed dim, on several axes at once: not one size.
                    Dim::Sym(s) if s == "?" => {}
                    Dim::Sym(s) => match bindings.iter().find(|b| &b.name == s) {
                        Some(b) if !b.defaulted && b.value != want => {
                            return Err(ModelPlanError::BadShape(format!(
                                "--shape {name}: dim {axis} ('{s}') is {want}, but '{s}' is bound to {}",
                                b.value
                            )))
                        }
                        Some(_) => {
                            let b = bindings
                                .iter_mut()
                                .find(|b| &b.name == s)
                                .expect("found above");
                            b.value = want;
                            b.defaulted = false;
                        }
                        None => bindings.push(DimBinding {
                            name: s.clone(),
                            value: want,
                            defaulted: false,
                        }),
                    },
                    _ => {}
                }
            }
        }
        let dims_known = shape.iter().map(|&d| Dim::Known(d)).collect();
        g.value_mut(v).ty = Some(Type::tensor(t.elem, Some(Shape::new(dims_known))));
    }
    for &v in &runtime {
        let Some(Type {
            kind: TypeKind::Tensor(t),
            ..
        }) = g.ty(v).cloned()
        else {
            continue;
        };
        let Some(mut s) = t.shape.clone() else {
            continue;
        };
        let mut changed = false;
        for (axis, d) in s.dims.iter_mut().enumerate() {
            if *d == Dim::Unknown {
                *d = Dim::Known(dims.default_value());
                changed = true;
                bindings.push(DimBinding {
                    name: format!("{}[{axis}]", g.name(v)),
                    value: dims.default_value(),
                    defaulted: true,
                });
            }
        }
        if changed {
            g.value_mut(v).ty = Some(Type::tensor(t.elem, Some(s)));
        }
    }
    Ok(())
}

/// The result of [`max_batch`].
#[derive(Clone, Debug)]
pub struct MaxBatch {
    /// The batch dim's name.
    pub dim: String,
    /// The largest value that fits.
    pub batch: i64,
    pub budget: u64,
    /// The plan at that batch.
    pub at: ModelPlan,
}

/// The largest value of dim `name` (default: the first symbolic input
/// dim) whose weights + arena fit `budget` bytes.
pub fn max_batch(
    base: &Model,
    dims: &DimValues,
    name: Option<&str>,
    budget: u64,
    opts: &PlanOptions,
) -> Result<MaxBatch, ModelPlanError> {
    let name = match name {
        Some(n) => n.to_string(),
        None => input_dim_names(base)
            .into_iter()
            .next()
            .ok_or(ModelPlanError::NoBatchDim)?,
    };
    if dims.bound.iter().any(|(k, _)| *k == name) {
        return Err(ModelPlanError::BatchBound(name));
    }
    let probe = |b: i64| -> Result<ModelPlan, ModelPlanError> {
        let mut d = dims.clone();
        d.bound.push((name.clone(), b));
        plan_model(base, &d, opts)
    };
    let total = |p: &ModelPlan| p.plan.weights_bytes.saturating_add(p.plan.arena_bytes);
    let first = probe(1)?;
    if total(&first) > budget {
        return Err(ModelPlanError::BudgetTooSmall {
            dim: name,
            budget,
            weights: first.plan.weights_bytes,
            arena: first.plan.arena_bytes,
        });
    }
    let mut best = (1i64, first);
    let (mut lo, mut hi) = (1i64, None::<i64>);
    let limit = 1i64 << 40;
    while hi.is_none() {
        let b = lo.saturating_mul(2);
        if b > limit {
            return Err(ModelPlanError::NotBatch(name));
        }
        let r = probe(b)?;
        if total(&r) <= budget {
            lo = b;
            best = (b, r);
        } else {
            hi = Some(b);
        }
    }
    let mut hi = hi.expect("set above");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let r = probe(mid)?;
        if total(&r) <= budget {
            lo = mid;
            best = (mid, r);
        } else {
            hi = mid;
        }
    }
    Ok(MaxBatch {
        dim: name,
        batch: best.0,
        budget,
        at: best.1,
    })
}

/// `8GiB`, `512MB`, `1.5GB`, `1000000` → bytes (KB/MB/GB/TB are powers of
/// 1000, KiB/MiB/GiB/TiB powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}': expected a size such as 8GiB or 512MB"))?;
    let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        u => {
            return Err(format!(
                "'{s}': unknown unit '{u}' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    Ok((n * mul) as u64)
}

/// `1234567` → `1.23 MB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("1.5 kb").unwrap(), 1500);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_234_567), "1.23 MB");
    }
}
