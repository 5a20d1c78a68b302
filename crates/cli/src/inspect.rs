//! `graphopt inspect IN [--json]`.

use crate::util::human_bytes;
use graphopt_ir::{Graph, Model};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

pub fn run(input: &Path, as_json: bool, dims: &[String]) -> anyhow::Result<()> {
    let dims = crate::util::parse_dims(dims)?;
    let mut loaded = graphopt_onnx::load(input)?;
    // Inference binds `--dim`s into the input/output shapes and tells which
    // ops have no shape rule.
    let inferred = graphopt_ir::infer::infer_model(
        &mut loaded.model,
        &graphopt_ir::infer::InferOptions { dims },
    );
    let m = &loaded.model;
    let g = &m.graph;

    let io = |vs: &[graphopt_ir::ValueId]| -> Vec<serde_json::Value> {
        vs.iter()
            .filter(|&&v| g.initializer(v).is_none())
            .map(|&v| {
                let ty = g.ty(v);
                json!({
                    "name": g.name(v),
                    "dtype": ty.and_then(|t| t.elem()).map(|d| d.to_string()),
                    "shape": ty.and_then(|t| t.shape()).map(|s| s.dims.iter().map(|d| match d {
                        graphopt_ir::Dim::Known(k) => json!(k),
                        graphopt_ir::Dim::Sym(s) => json!(s),
                        graphopt_ir::Dim::Unknown => json!(null),
                    }).collect::<Vec<_>>()),
                    "type": ty.map(|t| t.to_string()).unwrap_or_else(|| "?".into()),
                })
            })
            .collect()
    };
    let ops = crate::util::op_histogram(g);
    let mut by_dtype: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    weights_by_dtype(g, &mut by_dtype);
    let params: u64 = by_dtype.values().fold(0u64, |a, v| a.saturating_add(v.0));
    let bytes: u64 = by_dtype.values().fold(0u64, |a, v| a.saturating_add(v.1));
    let opsets: BTreeMap<String, i64> = m
        .opset_imports
        .iter()
        .map(|o| {
            (
                if o.domain.is_empty() {
                    "ai.onnx".to_string()
                } else {
                    o.domain.clone()
                },
                o.version,
            )
        })
        .collect();
    let file_size = std::fs::metadata(input).map(|m| m.len()).unwrap_or(0);
    let report = json!({
        "file": input.display().to_string(),
        "file_bytes": file_size,
        "external_data": loaded.info.used_external_data,
        "ir_version": m.ir_version,
        "producer": format!("{} {}", m.producer_name, m.producer_version).trim().to_string(),
        "opsets": opsets,
        "inputs": io(&g.inputs),
        "outputs": io(&g.outputs),
        "nodes": g.node_count_deep(),
        "ops": ops,
        "parameters": params,
        "parameter_bytes": bytes,
        "bytes_by_dtype": by_dtype.iter().map(|(k, v)| (k.clone(), json!({"elements": v.0, "bytes": v.1}))).collect::<BTreeMap<_, _>>(),
        "ops_without_shape_rule": inferred.unknown_ops,
        "functions": m.functions.iter().map(|f| format!("{}.{}", f.domain, f.name)).collect::<Vec<_>>(),
    });
    if as_json {
        crate::util::print_out(&format!("{}\n", serde_json::to_string_pretty(&report)?));
        return Ok(());
    }
    print_text(m, &report, file_size);
    Ok(())
}

/// Parameter elements and bytes per dtype, subgraphs included.
fn weights_by_dtype(g: &Graph, by_dtype: &mut BTreeMap<String, (u64, u64)>) {
    for &v in g.initializers() {
        if let Some(t) = g.initializer(v) {
            let e = by_dtype.entry(t.dtype.to_string()).or_default();
            e.0 = e.0.saturating_add(t.numel().unwrap_or(0));
            e.1 = e.1.saturating_add(t.nbytes());
        }
    }
    for (_, s) in g.subgraphs() {
        weights_by_dtype(s, by_dtype);
    }
}

fn print_text(m: &Model, r: &serde_json::Value, file_size: u64) {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "model      {}", r["file"].as_str().unwrap_or(""));
    let _ = writeln!(
        out,
        "size       {}{}",
        human_bytes(file_size),
        if r["external_data"] == true {
            " (+ external data)"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "producer   {}", r["producer"].as_str().unwrap_or(""));
    let _ = writeln!(out, "ir_version {}", m.ir_version);
    let opsets: Vec<String> = m
        .opset_imports
        .iter()
        .map(|o| {
            format!(
                "{} {}",
                if o.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &o.domain
                },
                o.version
            )
        })
        .collect();
    let _ = writeln!(out, "opsets     {}", opsets.join(", "));
    for (label, key) in [("inputs", "inputs"), ("outputs", "outputs")] {
        let _ = writeln!(out, "{label}:");
        for v in r[key].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  {:<30} {}",
                v["name"].as_str().unwrap_or(""),
                v["type"].as_str().unwrap_or("")
            );
        }
    }
    let _ = writeln!(
        out,
        "parameters {} ({})",
        r["parameters"],
        human_bytes(r["parameter_bytes"].as_u64().unwrap_or(0))
    );
    if let Some(o) = r["bytes_by_dtype"].as_object() {
        for (k, v) in o {
            let _ = writeln!(
                out,
                "  {:<12} {:>14} elements {:>12}",
                k,
                v["elements"],
                human_bytes(v["bytes"].as_u64().unwrap_or(0))
            );
        }
    }
    let _ = writeln!(out, "nodes      {}", r["nodes"]);
    if let Some(o) = r["ops"].as_object() {
        let mut v: Vec<(&String, u64)> = o
            .iter()
            .map(|(k, c)| (k, c.as_u64().unwrap_or(0)))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (k, c) in v {
            let _ = writeln!(out, "  {:<28} {:>6}", k, c);
        }
    }
    if let Some(u) = r["ops_without_shape_rule"]
        .as_array()
        .filter(|u| !u.is_empty())
    {
        let names: Vec<&str> = u.iter().filter_map(|x| x.as_str()).collect();
        let _ = writeln!(out, "no shape rule for: {}", names.join(", "));
    }
    if !m.functions.is_empty() {
        let _ = writeln!(out, "functions  {}", m.functions.len());
    }
    crate::util::print_out(&out);
}
