//! `graphopt grad` end to end: the training graph is written, the printout
//! and the JSON report carry the figures, `graphopt plan` plans the result,
//! and bad arguments are one-line errors.

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_graphopt"))
}

fn model(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models")
        .join(format!("{name}.onnx"))
}

/// Asserts that a run succeeded; its stdout.
fn succeeded(o: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

#[test]
fn grad_writes_training_graph_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train.onnx");
    let report = dir.path().join("r.json");
    let stdout = succeeded(
        bin()
            .arg("grad")
            .arg(model("bert_tiny.ts14"))
            .arg("-o")
            .arg(&out)
            .args(["--loss", "cross_entropy", "--class-axis", "-1"])
            .args([
                "--frozen",
                "*word_embeddings*",
                "--optimizer",
                "sgd",
                "--lr",
                "0.1",
            ])
            .args(["--dim", "batch=2", "--dim", "sequence=8", "--report"])
            .arg(&report)
            .output()
            .unwrap(),
    );
    assert!(stdout.contains("saved for backward"), "{stdout}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let params = r["params"].as_array().unwrap();
    assert!(!params.is_empty());
    assert!(params
        .iter()
        .all(|p| !p.as_str().unwrap().contains("word_embeddings")));
    assert!(r["saved_activation_bytes"].as_u64().unwrap() > 0);
    assert!(r["backward_nodes"].as_u64().unwrap() > r["forward_nodes"].as_u64().unwrap());
    assert!(r["arena_bytes"].as_u64().unwrap() >= r["lower_bound_bytes"].as_u64().unwrap());
    // The decomposed GELUs' and LayerNorms' elementwise values are
    // recomputed from what the backward pass keeps anyway, which saves
    // less than holding every value the rules read.
    assert!(r["recomputed_pointwise"].as_u64().unwrap() > 0, "{r}");
    let held = dir.path().join("held.json");
    succeeded(
        bin()
            .arg("grad")
            .arg(model("bert_tiny.ts14"))
            .arg("-o")
            .arg(dir.path().join("held.onnx"))
            .args(["--loss", "cross_entropy", "--class-axis", "-1"])
            .args([
                "--frozen",
                "*word_embeddings*",
                "--optimizer",
                "sgd",
                "--lr",
                "0.1",
            ])
            .arg("--no-recompute-pointwise")
            .args(["--dim", "batch=2", "--dim", "sequence=8", "--report"])
            .arg(&held)
            .output()
            .unwrap(),
    );
    let h: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&held).unwrap()).unwrap();
    assert_eq!(h["recomputed_pointwise"].as_u64(), Some(0));
    assert!(
        r["saved_activation_bytes"].as_u64() < h["saved_activation_bytes"].as_u64(),
        "{} vs {}",
        r["saved_activation_bytes"],
        h["saved_activation_bytes"]
    );
    // The training graph plans.
    let p = bin()
        .arg("plan")
        .arg(&out)
        .args(["--dim", "batch=2", "--dim", "sequence=8"])
        .output()
        .unwrap();
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
}

#[test]
fn grad_rejects_unknown_loss_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .arg("grad")
        .arg(model("bert_tiny.ts14"))
        .arg("-o")
        .arg(dir.path().join("t.onnx"))
        .args(["--loss", "hinge"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("unknown loss 'hinge'"), "{err}");
}

/// `--optimizer adamw --params-as-inputs --init-out`: the parameters become
/// inputs, and the npz holds everything a runtime feeds besides the data.
#[test]
fn grad_adamw_params_as_inputs_writes_initial_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.onnx");
    let init = dir.path().join("init.npz");
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/autodiff/torch/mlp.ts.onnx");
    let stdout = succeeded(
        bin()
            .arg("grad")
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .args([
                "--loss",
                "cross_entropy",
                "--optimizer",
                "adamw",
                "--betas",
                "0.8,0.9",
            ])
            .args(["--params-as-inputs", "--init-out"])
            .arg(&init)
            .output()
            .unwrap(),
    );
    assert!(stdout.contains("optimizer state inputs: 13"), "{stdout}");
    let npz = graphopt::tract::npz::read(&std::fs::read(&init).unwrap()).unwrap();
    // 6 parameters, their 12 moments, and step.
    assert_eq!(npz.len(), 19, "{:?}", npz.keys().collect::<Vec<_>>());
    assert!(npz.contains_key("step") && npz.contains_key("fc1.weight_m"));
    let m = graphopt::load(&out).unwrap();
    let g = &m.model().graph;
    let w = g.value_by_name("fc1.weight").unwrap();
    assert!(g.is_input(w) && g.initializer(w).is_none());
    // A bad --betas is one line.
    let o = bin()
        .arg("grad")
        .arg(&src)
        .arg("-o")
        .arg(dir.path().join("u.onnx"))
        .args(["--optimizer", "adamw", "--betas", "0.9"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--betas") && err.trim().lines().count() == 1,
        "{err}"
    );
}

/// `--dropout-train`: the fixture's two Dropouts run in training mode (a
/// constant true `training_mode`, mask outputs) and stay through the
/// simplify pipeline; without the flag they are inference no-ops and go;
/// on a model without Dropout the flag is a reported no-op.
#[test]
fn grad_dropout_train() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/autodiff/nn/dropout.onnxtxt");
    let m = graphopt::text::parse_model(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let src = dir.path().join("dropout.onnx");
    graphopt::Session::from_model(m).save(&src).unwrap();
    let dropouts = |path: &Path| -> Vec<(usize, usize)> {
        let s = graphopt::load(path).unwrap();
        let g = &s.model().graph;
        g.nodes()
            .map(|n| g.node(n))
            .filter(|n| n.op_type == "Dropout")
            .map(|n| (n.inputs().len(), n.outputs().len()))
            .collect()
    };
    let out = dir.path().join("t.onnx");
    let report = dir.path().join("r.json");
    let stdout = succeeded(
        bin()
            .arg("grad")
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .args(["--dropout-train", "--report"])
            .arg(&report)
            .output()
            .unwrap(),
    );
    assert!(
        stdout.contains("dropout: 2 nodes in training mode (d, e)"),
        "{stdout}"
    );
    assert_eq!(dropouts(&out), [(3, 2), (3, 2)]);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["dropout_train"], serde_json::json!(["d", "e"]));
    assert_eq!(r["warnings"], serde_json::json!([]));

    let o = bin()
        .arg("grad")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stdout).contains("dropout:"));
    assert!(dropouts(&out).is_empty(), "inference Dropouts are no-ops");

    let mlp =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/autodiff/torch/mlp.ts.onnx");
    let o = bin()
        .arg("grad")
        .arg(&mlp)
        .arg("-o")
        .arg(&out)
        .arg("--dropout-train")
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: dropout_train: the model has no Dropout node")
            && err.contains("TrainingMode.TRAINING"),
        "{err}"
    );
}

/// `remat --torch-policy` on a dynamo export (whose ONNX nodes name their
/// fx nodes): the file says, per fx node, save or recompute; the dropped
/// nodes are real fx nodes of the model, and the counts add up. A
/// TorchScript export has no fx names: one-line error, no output written.
#[test]
fn remat_writes_the_torch_policy_of_a_dynamo_export() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.onnx");
    let dims = [
        "--dim", "s72=8", "--dim", "s70=128", "--dim", "s43=8", "--dim", "s53=128",
    ];
    succeeded(
        bin()
            .arg("grad")
            .arg(model("gpt2_tiny.dynamo18"))
            .arg("-o")
            .arg(&train)
            .args(["--loss", "sum"])
            .args(dims)
            .output()
            .unwrap(),
    );
    let out = dir.path().join("remat.onnx");
    let policy = dir.path().join("policy.json");
    succeeded(
        bin()
            .arg("remat")
            .arg(&train)
            .arg("-o")
            .arg(&out)
            .args(["--budget", "60%", "--time-limit", "2", "--torch-policy"])
            .arg(&policy)
            .args(dims)
            .output()
            .unwrap(),
    );
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&policy).unwrap()).unwrap();
    assert_eq!(p["format"], "graphopt.torch-policy/1");
    let nodes = p["nodes"].as_array().unwrap();
    let count = |policy: &str, reason: &str| {
        nodes
            .iter()
            .filter(|d| d["policy"] == policy && (reason.is_empty() || d["reason"] == reason))
            .count()
    };
    assert_eq!(count("save", ""), p["saved"].as_u64().unwrap() as usize);
    assert_eq!(
        count("recompute", ""),
        p["recomputed"].as_u64().unwrap() as usize
    );
    assert!(count("save", "read-by-backward") > 0, "{p}");
    // The 60% budget is met by dropping real ops (matmuls, softmax...), not
    // only shape arithmetic.
    let dropped_aten: Vec<&str> = nodes
        .iter()
        .filter(|d| d["reason"] == "dropped" && d["bytes"].as_u64().unwrap() > 4096)
        .map(|d| d["target"].as_str().unwrap())
        .collect();
    assert!(dropped_aten.len() >= 5, "{dropped_aten:?}");
    assert!(
        dropped_aten
            .iter()
            .all(|t| t.starts_with("torch.ops.aten.")),
        "{dropped_aten:?}"
    );
    // Every fx name is one the exporter wrote on a node of the input model.
    let src = std::fs::read(model("gpt2_tiny.dynamo18")).unwrap();
    let text = String::from_utf8_lossy(&src);
    for d in nodes {
        let needle = format!("%{} :", d["node"].as_str().unwrap());
        assert!(text.contains(&needle), "{needle} is not in the model");
    }

    // A TorchScript export: no fx names.
    let ts_train = dir.path().join("ts_train.onnx");
    succeeded(
        bin()
            .arg("grad")
            .arg(model("gpt2_tiny.ts14"))
            .arg("-o")
            .arg(&ts_train)
            .args(["--loss", "sum", "--dim", "batch=8", "--dim", "seq=128"])
            .output()
            .unwrap(),
    );
    let o = bin()
        .arg("remat")
        .arg(&ts_train)
        .arg("-o")
        .arg(dir.path().join("ts_remat.onnx"))
        .args(["--budget", "60%", "--time-limit", "2", "--torch-policy"])
        .arg(dir.path().join("ts_policy.json"))
        .args(["--dim", "batch=8", "--dim", "seq=128"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("names no torch.fx node"), "{err}");
    assert!(!dir.path().join("ts_policy.json").exists());
    assert!(!dir.path().join("ts_remat.onnx").exists());
}
