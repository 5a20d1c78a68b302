//! `graphopt inspect IN [--json] [--dim NAME=VALUE]...`.

use crate::util::{human_bytes, json_text, print_out};
use std::fmt::Write as _;
use std::path::Path;

pub fn run(input: &Path, as_json: bool, dims: &[String]) -> graphopt::Result<()> {
    let dims = graphopt::util::parse_dims(dims)?;
    let r = graphopt::load(input)?.inspect(&dims);
    if as_json {
        print_out(&json_text(&r)?);
        return Ok(());
    }
    let mut out = String::new();
    let _ = writeln!(out, "model      {}", r.file);
    let _ = writeln!(
        out,
        "size       {}{}",
        human_bytes(r.file_bytes),
        if r.external_data {
            " (+ external data)"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "producer   {}", r.producer);
    let _ = writeln!(out, "ir_version {}", r.ir_version);
    let opsets: Vec<String> = r.opsets.iter().map(|(d, v)| format!("{d} {v}")).collect();
    let _ = writeln!(out, "opsets     {}", opsets.join(", "));
    for (label, list) in [("inputs", &r.inputs), ("outputs", &r.outputs)] {
        let _ = writeln!(out, "{label}:");
        for v in list {
            let _ = writeln!(out, "  {:<30} {}", v.name, v.ty);
        }
    }
    let _ = writeln!(
        out,
        "parameters {} ({})",
        r.parameters,
        human_bytes(r.parameter_bytes)
    );
    for (k, v) in &r.bytes_by_dtype {
        let _ = writeln!(
            out,
            "  {:<12} {:>14} elements {:>12}",
            k,
            v.elements,
            human_bytes(v.bytes)
        );
    }
    let _ = writeln!(out, "nodes      {}", r.nodes);
    let mut ops: Vec<(&String, &usize)> = r.ops.iter().collect();
    ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (k, c) in ops {
        let _ = writeln!(out, "  {:<28} {:>6}", k, c);
    }
    if !r.ops_without_shape_rule.is_empty() {
        let _ = writeln!(
            out,
            "no shape rule for: {}",
            r.ops_without_shape_rule.join(", ")
        );
    }
    if !r.functions.is_empty() {
        let _ = writeln!(out, "functions  {}", r.functions.len());
    }
    print_out(&out);
    Ok(())
}
