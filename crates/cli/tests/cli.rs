//! The CLI contract: bad input gets one clear line and a non-zero exit, the
//! input is never modified, outputs are deterministic.

use graphopt_proto as pb;
use graphopt_proto::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_graphopt"))
}

fn vi(name: &str, dims: &[i64]) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{dimension::Value, Dimension};
    pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(pb::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(Value::DimValue(d)),
                            denotation: None,
                        })
                        .collect(),
                }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

fn node(name: &str, op: &str, ins: &[&str], outs: &[&str]) -> pb::NodeProto {
    pb::NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn model(nodes: Vec<pb::NodeProto>, inits: Vec<pb::TensorProto>) -> pb::ModelProto {
    pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(pb::GraphProto {
            name: Some("g".into()),
            node: nodes,
            initializer: inits,
            input: vec![vi("x", &[2])],
            output: vec![vi("y", &[2])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn good() -> pb::ModelProto {
    model(
        vec![
            node("relu", "Relu", &["x"], &["t"]),
            node("id", "Identity", &["t"], &["u"]),
            node("neg", "Neg", &["u"], &["y"]),
            node("dead", "Neg", &["x"], &["z"]),
        ],
        vec![],
    )
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs `graphopt optimize` on `input`; returns (status ok, stderr).
fn optimize(input: &Path, extra: &[&str]) -> (bool, String) {
    let out = input.with_extension("out.onnx");
    let o = bin()
        .arg("optimize")
        .arg(input)
        .arg("-o")
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

fn assert_one_line_error(stderr: &str, must: &[&str]) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for m in must {
        assert!(lines[0].contains(m), "'{m}' missing in: {stderr}");
    }
}

#[test]
fn optimize_runs_default_pipeline_and_reports() {
    let d = tempfile::tempdir().unwrap();
    let input = write(d.path(), "m.onnx", &good().encode_to_vec());
    let before = std::fs::read(&input).unwrap();
    let report = d.path().join("r.json");
    let (ok, err) = optimize(&input, &["--report", report.to_str().unwrap(), "-q"]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(&input).unwrap(), before, "input modified");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["nodes_before"], 4);
    assert_eq!(r["nodes_after"], 2);
    assert!(r["passes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["time_ms"].is_number()));
    let out = pb::ModelProto::decode(&std::fs::read(input.with_extension("out.onnx")).unwrap()[..])
        .unwrap();
    let ops: Vec<_> = out
        .graph
        .unwrap()
        .node
        .iter()
        .map(|n| n.op_type.clone().unwrap())
        .collect();
    assert_eq!(ops, ["Relu", "Neg"]);
}

#[test]
fn output_is_byte_identical_across_runs() {
    let d = tempfile::tempdir().unwrap();
    let input = write(d.path(), "m.onnx", &good().encode_to_vec());
    let mut outs = Vec::new();
    for i in 0..2 {
        let out = d.path().join(format!("o{i}.onnx"));
        let s = bin()
            .arg("optimize")
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .arg("-q")
            .status()
            .unwrap();
        assert!(s.success());
        outs.push(std::fs::read(out).unwrap());
    }
    assert_eq!(outs[0], outs[1]);
}

#[test]
fn passes_none_keeps_every_node() {
    let d = tempfile::tempdir().unwrap();
    let input = write(d.path(), "m.onnx", &good().encode_to_vec());
    let (ok, err) = optimize(&input, &["--passes", "none", "-q"]);
    assert!(ok, "{err}");
    let out = pb::ModelProto::decode(&std::fs::read(input.with_extension("out.onnx")).unwrap()[..])
        .unwrap();
    assert_eq!(out.graph.unwrap().node.len(), 4);
}

#[test]
fn truncated_and_garbage_files() {
    let d = tempfile::tempdir().unwrap();
    let bytes = good().encode_to_vec();
    let t = write(d.path(), "trunc.onnx", &bytes[..bytes.len() / 2]);
    let (ok, err) = optimize(&t, &[]);
    assert!(!ok);
    assert_one_line_error(&err, &["trunc.onnx", "truncated or corrupt"]);
    let g = write(d.path(), "junk.onnx", b"this is not a model at all");
    let (ok, err) = optimize(&g, &[]);
    assert!(!ok);
    assert_one_line_error(&err, &["junk.onnx"]);
    let e = write(d.path(), "empty.onnx", b"");
    let (ok, err) = optimize(&e, &[]);
    assert!(!ok);
    assert_one_line_error(&err, &["empty.onnx", "empty"]);
    let (ok, err) = optimize(&d.path().join("missing.onnx"), &[]);
    assert!(!ok);
    assert_one_line_error(&err, &["missing.onnx", "cannot open"]);
}

#[test]
fn cycle_is_reported_with_node_names() {
    let d = tempfile::tempdir().unwrap();
    let m = model(
        vec![
            node("a", "Add", &["x", "c"], &["b"]),
            node("c_node", "Neg", &["b"], &["c"]),
            node("out", "Relu", &["b"], &["y"]),
        ],
        vec![],
    );
    let p = write(d.path(), "cyc.onnx", &m.encode_to_vec());
    let (ok, err) = optimize(&p, &[]);
    assert!(!ok);
    assert_one_line_error(&err, &["cyc.onnx", "cycle", "'a'", "'c_node'"]);
}

#[test]
fn missing_input_names_the_node() {
    let d = tempfile::tempdir().unwrap();
    let m = model(vec![node("mul1", "Mul", &["x", "w"], &["y"])], vec![]);
    let p = write(d.path(), "miss.onnx", &m.encode_to_vec());
    let (ok, err) = optimize(&p, &[]);
    assert!(!ok);
    assert_one_line_error(&err, &["miss.onnx", "node 'mul1' (Mul)", "'w'"]);
}

#[test]
fn external_data_may_not_leave_the_folder() {
    let d = tempfile::tempdir().unwrap();
    let sub = d.path().join("m");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(d.path().join("secret.bin"), [0u8; 8]).unwrap();
    let w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![2],
        data_type: Some(1),
        data_location: Some(1),
        external_data: vec![pb::StringStringEntryProto {
            key: Some("location".into()),
            value: Some("../secret.bin".into()),
        }],
        ..Default::default()
    };
    let m = model(vec![node("mul1", "Mul", &["x", "w"], &["y"])], vec![w]);
    let p = write(&sub, "ext.onnx", &m.encode_to_vec());
    let (ok, err) = optimize(&p, &[]);
    assert!(!ok);
    assert_one_line_error(
        &err,
        &["ext.onnx", "initializer 'w'", "leaves the model's folder"],
    );
}

#[test]
fn overflowing_dims_are_rejected() {
    let d = tempfile::tempdir().unwrap();
    let w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![i64::MAX, 4],
        data_type: Some(1),
        raw_data: Some(vec![0u8; 8].into()),
        ..Default::default()
    };
    let m = model(vec![node("mul1", "Mul", &["x", "w"], &["y"])], vec![w]);
    let p = write(d.path(), "big.onnx", &m.encode_to_vec());
    let (ok, err) = optimize(&p, &[]);
    assert!(!ok);
    assert_one_line_error(&err, &["big.onnx", "initializer 'w'", "overflow"]);
}

#[test]
fn unknown_pass_lists_valid_ones() {
    let d = tempfile::tempdir().unwrap();
    let input = write(d.path(), "m.onnx", &good().encode_to_vec());
    let (ok, err) = optimize(&input, &["--passes", "dce,fold_everything"]);
    assert!(!ok);
    assert_one_line_error(
        &err,
        &[
            "unknown pass 'fold_everything'",
            "dce",
            "eliminate_identity",
        ],
    );
}

#[test]
fn refuses_to_overwrite_the_input() {
    let d = tempfile::tempdir().unwrap();
    let input = write(d.path(), "m.onnx", &good().encode_to_vec());
    let o = bin()
        .arg("optimize")
        .arg(&input)
        .arg("-o")
        .arg(&input)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_one_line_error(
        &String::from_utf8_lossy(&o.stderr),
        &["overwrite the input"],
    );
}

#[test]
fn inspect_print_and_passes() {
    let d = tempfile::tempdir().unwrap();
    let input = write(d.path(), "m.onnx", &good().encode_to_vec());
    let o = bin()
        .args(["inspect", "--json"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(o.status.success());
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["nodes"], 4);
    assert_eq!(j["ops"]["Neg"], 2);
    assert_eq!(j["inputs"][0]["name"], "x");
    assert_eq!(j["opsets"]["ai.onnx"], 17);
    let o = bin().arg("print").arg(&input).output().unwrap();
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains("Relu (x)") || text.contains("Relu(x)"),
        "{text}"
    );
    let o = bin().arg("passes").output().unwrap();
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("dce") && text.contains("eliminate_identity"));
}

#[test]
fn external_data_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![2],
        data_type: Some(1),
        raw_data: Some(vec![0u8, 0, 128, 63, 0, 0, 0, 64].into()),
        ..Default::default()
    };
    let m = model(vec![node("mul1", "Mul", &["x", "w"], &["y"])], vec![w]);
    let input = write(d.path(), "m.onnx", &m.encode_to_vec());
    let out = d.path().join("o.onnx");
    let s = bin()
        .arg("optimize")
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .args(["--external-data=4", "-q"])
        .status()
        .unwrap();
    assert!(s.success());
    assert_eq!(
        std::fs::read(d.path().join("o.onnx.data")).unwrap(),
        [0u8, 0, 128, 63, 0, 0, 0, 64]
    );
    // Reading it back keeps it external and the data intact.
    let out2 = d.path().join("o2.onnx");
    let s = bin()
        .arg("optimize")
        .arg(&out)
        .arg("-o")
        .arg(&out2)
        .args(["--no-external-data", "-q"])
        .status()
        .unwrap();
    assert!(s.success());
    let back = pb::ModelProto::decode(&std::fs::read(&out2).unwrap()[..]).unwrap();
    let t = &back.graph.unwrap().initializer[0];
    assert_eq!(
        t.raw_data.as_deref(),
        Some(&[0u8, 0, 128, 63, 0, 0, 0, 64][..])
    );
}
