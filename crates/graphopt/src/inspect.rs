//! [`Session::inspect`]: what a model is: inputs and outputs with dtypes and
//! (symbolic) shapes, ops, parameters by dtype, opsets, functions, and the
//! ops shape inference has no rule for.

use crate::session::Session;
use graphopt_ir::infer::{infer_model, InferOptions};
use graphopt_ir::{Dim, Graph, ValueId};
use serde::Serialize;
use std::collections::BTreeMap;

/// A graph input or output.
#[derive(Clone, Debug, Serialize)]
pub struct IoInfo {
    pub name: String,
    pub dtype: Option<String>,
    /// Known dims as numbers, symbolic ones as names, unknown as null.
    pub shape: Option<Vec<serde_json::Value>>,
    /// The type as ONNX text prints it (`float[batch,3,224,224]`).
    #[serde(rename = "type")]
    pub ty: String,
}

/// Elements and bytes of one dtype's initializers.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DtypeBytes {
    pub elements: u64,
    pub bytes: u64,
}

/// What [`Session::inspect`] reports.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    pub file: String,
    pub file_bytes: u64,
    pub external_data: bool,
    pub ir_version: i64,
    pub producer: String,
    /// Domain (`ai.onnx` for the default) to version.
    pub opsets: BTreeMap<String, i64>,
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    pub nodes: usize,
    pub ops: BTreeMap<String, usize>,
    pub parameters: u64,
    pub parameter_bytes: u64,
    pub bytes_by_dtype: BTreeMap<String, DtypeBytes>,
    pub ops_without_shape_rule: Vec<String>,
    pub functions: Vec<String>,
}

impl Session {
    /// Summarizes the model, with shapes inferred at `dims`.
    pub fn inspect(&self, dims: &[(String, i64)]) -> Inspection {
        let mut m = self.model.clone();
        let inferred = infer_model(
            &mut m,
            &InferOptions {
                dims: dims.to_vec(),
                ..Default::default()
            },
        );
        let g = &m.graph;
        let io = |vs: &[ValueId]| -> Vec<IoInfo> {
            vs.iter()
                .filter(|&&v| g.initializer(v).is_none())
                .map(|&v| {
                    let ty = g.ty(v);
                    IoInfo {
                        name: g.name(v).to_string(),
                        dtype: ty.and_then(|t| t.elem()).map(|d| d.to_string()),
                        shape: ty.and_then(|t| t.shape()).map(|s| {
                            s.dims
                                .iter()
                                .map(|d| match d {
                                    Dim::Known(k) => serde_json::json!(k),
                                    Dim::Sym(s) => serde_json::json!(s),
                                    Dim::Unknown => serde_json::Value::Null,
                                })
                                .collect()
                        }),
                        ty: ty.map(|t| t.to_string()).unwrap_or_else(|| "?".into()),
                    }
                })
                .collect()
        };
        let mut by_dtype = BTreeMap::new();
        weights_by_dtype(g, &mut by_dtype);
        let opsets = m
            .opset_imports
            .iter()
            .map(|o| {
                let d = if o.domain.is_empty() {
                    "ai.onnx".to_string()
                } else {
                    o.domain.clone()
                };
                (d, o.version)
            })
            .collect();
        Inspection {
            file: self.label(),
            file_bytes: self
                .source
                .as_ref()
                .and_then(|p| std::fs::metadata(p).ok())
                .map_or(0, |m| m.len()),
            external_data: self.used_external_data,
            ir_version: m.ir_version,
            producer: format!("{} {}", m.producer_name, m.producer_version)
                .trim()
                .to_string(),
            opsets,
            inputs: io(&g.inputs),
            outputs: io(&g.outputs),
            nodes: g.node_count_deep(),
            ops: crate::util::op_histogram(g),
            parameters: by_dtype
                .values()
                .fold(0u64, |a, v: &DtypeBytes| a.saturating_add(v.elements)),
            parameter_bytes: by_dtype
                .values()
                .fold(0u64, |a, v| a.saturating_add(v.bytes)),
            bytes_by_dtype: by_dtype,
            ops_without_shape_rule: inferred.unknown_ops.into_iter().collect(),
            functions: m
                .functions
                .iter()
                .map(|f| format!("{}.{}", f.domain, f.name))
                .collect(),
        }
    }
}

/// Parameter elements and bytes per dtype, subgraphs included.
fn weights_by_dtype(g: &Graph, by_dtype: &mut BTreeMap<String, DtypeBytes>) {
    for &v in g.initializers() {
        if let Some(t) = g.initializer(v) {
            let e = by_dtype.entry(t.dtype.to_string()).or_default();
            e.elements = e.elements.saturating_add(t.numel().unwrap_or(0));
            e.bytes = e.bytes.saturating_add(t.nbytes());
        }
    }
    for (_, s) in g.subgraphs() {
        weights_by_dtype(s, by_dtype);
    }
}
