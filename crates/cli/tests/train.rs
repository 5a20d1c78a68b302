//! `graphopt train` on the untrained digits models of `testdata/train/`,
//! against torch's losses recorded there by `make_train.py` (so CI needs no
//! torch): same initial weights, same batches (`--no-shuffle`, batch 32,
//! the last partial batch dropped), same hyperparameters.
//!
//! - per-step losses over the first 50 steps within [`LOSS_REL`] of torch's,
//!   SGD and AdamW, CNN and MLP;
//! - test accuracy after 3 epochs within half a point of torch's (CNN,
//!   AdamW), and the written model is the trained inference model: run
//!   again through the library, it gives the accuracy the report gave;
//! - a run resumed from a checkpoint logs the same losses, bit for bit, as
//!   the uninterrupted run;
//! - bad input is one line and exit 1, with nothing written;
//! - `--budget` recomputes (vit_tiny) before it splits the batch, and
//!   folders of npz or npy shards train like the one file.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Relative difference per step from torch's loss (measured: 4.3e-7 at
/// most over the four runs, CNN AdamW step 48).
const LOSS_REL: f64 = 1.3e-6;

fn td(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(p)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("graphopt-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `graphopt ARGS`: (exit code, stdout, stderr).
fn graphopt(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_graphopt"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

fn torch() -> Value {
    serde_json::from_str(&std::fs::read_to_string(td("train/torch.json")).unwrap()).unwrap()
}

/// `--optimizer NAME` and its hyperparameters from torch.json.
fn opt_args(t: &Value, name: &str) -> Vec<String> {
    let h = &t["optimizers"][name];
    let mut a = vec![
        "--optimizer".to_string(),
        name.to_string(),
        "--lr".into(),
        h["lr"].as_f64().unwrap().to_string(),
        "--weight-decay".into(),
        h["weight_decay"].as_f64().unwrap().to_string(),
    ];
    if name == "adamw" {
        let b = h["betas"].as_array().unwrap();
        a.push("--betas".into());
        a.push(format!("{},{}", b[0], b[1]));
        a.push("--eps".into());
        a.push(h["eps"].as_f64().unwrap().to_string());
    }
    a
}

/// Runs `graphopt train` on digits model `m`; returns the JSON report and
/// the log's losses.
fn train(m: &str, dir: &Path, extra: &[String], shuffle: bool) -> (Value, Vec<f64>) {
    let mut args: Vec<String> = vec![
        "--target".into(),
        "y".into(),
        "--batch".into(),
        "32".into(),
        "--threads".into(),
        "2".into(),
    ];
    if !shuffle {
        args.push("--no-shuffle".into());
    }
    args.extend(extra.iter().cloned());
    train_on(
        &td(&format!("train/digits_{m}.onnx")),
        &td(&format!("train/digits_{m}.train.npz")),
        dir,
        &args,
    )
}

/// `graphopt train MODEL --data DATA ARGS --json --log` into `dir`: the
/// JSON report and the log's losses.
fn train_on(model: &Path, data: &Path, dir: &Path, extra: &[String]) -> (Value, Vec<f64>) {
    let log = dir.join("log.csv");
    let out = dir.join("trained.onnx");
    let mut args: Vec<String> = vec![
        "train".into(),
        model.display().to_string(),
        "--data".into(),
        data.display().to_string(),
        "-o".into(),
        out.display().to_string(),
        "--log".into(),
        log.display().to_string(),
        "--json".into(),
    ];
    args.extend(extra.iter().cloned());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = graphopt(&a);
    assert_eq!(code, 0, "{args:?}: {stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let csv = std::fs::read_to_string(&log).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("step,epoch,loss,lr,time_s,data_wait_s"));
    let losses = lines
        .map(|l| l.split(',').nth(2).unwrap().parse::<f64>().unwrap())
        .collect();
    (report, losses)
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn losses_follow_torch_for_50_steps() {
    let t = torch();
    let steps = t["steps"].as_u64().unwrap() as usize;
    for m in ["cnn", "mlp"] {
        for o in ["sgd", "adamw"] {
            let dir = tmp(&format!("{m}-{o}"));
            let mut extra = opt_args(&t, o);
            extra.extend(["--steps".to_string(), steps.to_string()]);
            let (report, got) = train(m, &dir, &extra, false);
            let want: Vec<f64> = t["models"][m][o]["losses"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(got.len(), steps, "{m} {o}");
            assert_eq!(report["steps"], steps);
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs() / b.abs())
                .fold(0.0, f64::max);
            eprintln!("{m} {o}: worst relative loss difference {worst:.3e}");
            assert!(worst <= LOSS_REL, "{m} {o}: {worst:e}\n{got:?}\n{want:?}");
            // Training changed the loss: the comparison is not of a flat line.
            assert!((want[0] - want[steps - 1]).abs() > 0.01, "{m} {o}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[test]
fn accuracy_after_three_epochs_matches_torch_and_the_written_model() {
    let t = torch();
    let dir = tmp("accuracy");
    let mut extra = opt_args(&t, "adamw");
    let test = td("quant/digits_cnn.test.npz");
    extra.extend([
        "--epochs".to_string(),
        t["epochs"].to_string(),
        "--eval".into(),
        test.display().to_string(),
    ]);
    let (report, _) = train("cnn", &dir, &extra, false);
    let evals = report["evals"].as_array().unwrap();
    assert_eq!(evals.len(), 3, "one eval per epoch");
    let ours = evals[2]["value"].as_f64().unwrap();
    let theirs = t["models"]["cnn"]["adamw"]["test_accuracy"]
        .as_f64()
        .unwrap();
    assert_eq!(report["steps"], t["models"]["cnn"]["adamw"]["steps"]);
    assert!(
        (ours - theirs).abs() <= 0.005,
        "accuracy {ours} vs torch {theirs}"
    );
    // The written model: the inference graph with the trained weights.
    let session = graphopt::load(dir.join("trained.onnx")).unwrap();
    let original = graphopt::load(td("train/digits_cnn.onnx")).unwrap();
    assert_eq!(
        session.model().graph.nodes().count(),
        original.model().graph.nodes().count(),
        "no training nodes"
    );
    let data = graphopt::tract::npz::read(&std::fs::read(&test).unwrap()).unwrap();
    let x = graphopt::to_host(&data["x"]).unwrap();
    let y = graphopt::to_host(&data["y"]).unwrap();
    let r = session
        .run(&graphopt::RunOptions {
            inputs: graphopt::Inputs::Tensors(vec![x]),
            ..graphopt::RunOptions::default()
        })
        .unwrap();
    let logits = r.outputs[0].to_f32().unwrap();
    let labels: Vec<i64> = y
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let right = labels
        .iter()
        .enumerate()
        .filter(|(i, &l)| {
            let row = &logits[i * 10..(i + 1) * 10];
            let best = (0..10).fold(0, |b, c| if row[c] > row[b] { c } else { b });
            best as i64 == l
        })
        .count();
    assert_eq!(right as f64 / labels.len() as f64, ours);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_run_logs_the_same_losses() {
    let t = torch();
    let dir = tmp("resume");
    let ck = dir.join("ck");
    let mut extra = opt_args(&t, "adamw");
    // Shuffled, across an epoch boundary (39 steps per epoch).
    extra.extend(
        ["--steps", "45", "--seed", "3", "--checkpoint"]
            .iter()
            .map(|s| s.to_string()),
    );
    extra.push(ck.display().to_string());
    extra.extend(["--every".to_string(), "30".to_string()]);
    let base = extra;
    let (_, full) = train("mlp", &dir, &base, true);
    assert!(ck.join("step-00000030.npz").exists());
    assert!(ck.join("step-00000045.npz").exists());
    std::fs::remove_file(ck.join("step-00000045.npz")).unwrap();
    let mut resumed = base.clone();
    resumed.extend(["--resume".to_string(), ck.display().to_string()]);
    let (report, tail) = train("mlp", &dir, &resumed, true);
    assert_eq!(report["resumed_from"][1], 30);
    assert_eq!(tail.len(), 15);
    assert_eq!(tail, full[30..].to_vec(), "resumed losses differ");
    // Another seed cannot resume from it.
    let mut other = resumed.clone();
    let i = other.iter().position(|a| a == "--seed").unwrap();
    other[i + 1] = "4".into();
    let mut args = vec!["train".to_string()];
    args.extend([
        td("train/digits_mlp.onnx").display().to_string(),
        "--data".into(),
        td("train/digits_mlp.train.npz").display().to_string(),
        "--target".into(),
        "y".into(),
        "--batch".into(),
        "32".into(),
        "-o".into(),
        dir.join("x.onnx").display().to_string(),
    ]);
    args.extend(other);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = graphopt(&a);
    assert_eq!(code, 1);
    assert!(err.contains("another --seed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_training_input_is_one_line() {
    let dir = tmp("bad");
    let out = dir.join("out.onnx");
    let model = td("train/digits_cnn.onnx").display().to_string();
    let data = td("train/digits_cnn.train.npz").display().to_string();
    let o = out.display().to_string();
    // A NaN in the data.
    let x: Vec<f32> = (0..4 * 64)
        .map(|i| if i == 70 { f32::NAN } else { 0.5 })
        .collect();
    let nan = dir.join("nan.npz");
    let arrays = vec![
        (
            "x".to_string(),
            graphopt::to_tract(&graphopt::HostTensor::from_f32(&[4, 1, 8, 8], &x)).unwrap(),
        ),
        (
            "y".to_string(),
            graphopt::to_tract(&graphopt::HostTensor::from_i64(&[4], &[0, 1, 2, 3])).unwrap(),
        ),
    ];
    std::fs::write(&nan, graphopt::tract::npz::write(&arrays).unwrap()).unwrap();
    let nan_s = nan.display().to_string();
    let mlp_data = td("train/digits_mlp.train.npz").display().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--data", &data, "--batch", "8"],
            "no array 'target' (the loss's target; name another array with --target)",
        ),
        (
            vec!["--data", &nan_s, "--target", "y", "--batch", "2"],
            "array 'x' holds NaN or Inf (example 1)",
        ),
        (
            vec!["--data", &mlp_data, "--target", "y", "--batch", "8"],
            "array 'x' is float[8, 64] per batch of 8, the model's input 'x' is float[batch, 1, 8, 8]",
        ),
        (
            vec!["--data", &data, "--target", "y", "--batch", "5000"],
            "--batch 5000",
        ),
        (
            vec!["--data", &data, "--target", "y", "--batch", "8", "--optimizer", "none"],
            "training needs an optimizer",
        ),
        (
            vec!["--data", &data, "--target", "y", "--batch", "8", "--steps", "0"],
            "--steps 0",
        ),
    ];
    for (extra, must) in cases {
        let mut args = vec!["train", model.as_str(), "-o", o.as_str()];
        args.extend(extra);
        let (code, _, err) = graphopt(&args);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(code, 1, "{args:?}: {err}");
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].contains(must),
            "{args:?}: '{must}' missing in {err}"
        );
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn micro_batches_give_the_whole_batch_update() {
    // 4 micro-batches of 8: the gradients are averaged and AdamW steps once
    // per batch of 32, so the losses still follow torch's whole batches.
    let t = torch();
    let dir = tmp("micro");
    let mut extra = opt_args(&t, "adamw");
    extra.extend(
        ["--steps", "50", "--micro-batches", "4"]
            .iter()
            .map(|s| s.to_string()),
    );
    let (report, got) = train("cnn", &dir, &extra, false);
    assert_eq!(
        (
            report["micro_batches"].as_u64(),
            report["micro_batch"].as_u64()
        ),
        (Some(4), Some(8))
    );
    let want = t["models"]["cnn"]["adamw"]["losses"].as_array().unwrap();
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b.as_f64().unwrap()).abs() / b.as_f64().unwrap())
        .fold(0.0, f64::max);
    eprintln!("cnn adamw, 4 micro-batches: worst relative loss difference {worst:.3e}");
    assert!(worst <= LOSS_REL, "{worst:e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_budget_chooses_the_micro_batches() {
    // Planned bytes of the CNN's SGD step at batch 512 (parameters,
    // accumulators, arenas, workspaces): 16.8 MB whole, 9.1 MB in 2
    // micro-batches, 5.0 MB in 4, 2.9 MB in 8.
    let dir = tmp("budget");
    let args = |budget: &str| -> Vec<String> {
        vec![
            "--batch".into(),
            "512".into(),
            "--steps".into(),
            "1".into(),
            "--budget".into(),
            budget.into(),
        ]
    };
    let model = td("train/digits_cnn.onnx").display().to_string();
    let data = td("train/digits_cnn.train.npz").display().to_string();
    let out = dir.join("b.onnx").display().to_string();
    let run = |budget: &str| {
        let mut a: Vec<String> = vec![
            "train".into(),
            model.clone(),
            "--data".into(),
            data.clone(),
            "--target".into(),
            "y".into(),
            "-o".into(),
            out.clone(),
            "--json".into(),
        ];
        a.extend(args(budget));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        graphopt(&a)
    };
    let (code, stdout, err) = run("5.1MB");
    assert_eq!(code, 0, "{err}");
    let r: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(r["micro_batches"], 4, "{r}");
    assert!(r["planned_bytes"].as_u64().unwrap() <= 5_100_000);
    let (code, _, err) = run("100KB");
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no micro-batch fits") && err.contains("512 x 1: "),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn evals_leave_the_training_untouched() {
    // The eval loss runs the step's graph, whose updates land on the
    // parameters it keeps in its arena (donation): the next step must
    // still start from the trained values, so the losses equal a run
    // without evals, bit for bit.
    let t = torch();
    let test = td("quant/digits_mlp.test.npz").display().to_string();
    let mut base = opt_args(&t, "adamw");
    base.extend(["--epochs", "2"].iter().map(|s| s.to_string()));
    let dir = tmp("eval-a");
    let (_, plain) = train("mlp", &dir, &base, false);
    for metric in ["loss", "accuracy"] {
        let dir = tmp(&format!("eval-{metric}"));
        let mut with = base.clone();
        with.extend([
            "--eval".to_string(),
            test.clone(),
            "--metric".into(),
            metric.into(),
        ]);
        let (report, losses) = train("mlp", &dir, &with, false);
        assert_eq!(report["evals"].as_array().unwrap().len(), 2, "{metric}");
        assert_eq!(losses, plain, "{metric}: the evals changed the training");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_budget_recomputes_before_it_splits_the_batch() {
    // vit_tiny's SGD step on a sum loss at batch 32 plans 5.04 MB whole.
    // Within 4 MB, recomputation keeps the batch whole (28 nodes
    // recomputed, 3.99 MB planned); without it the batch is split in 4.
    let dir = tmp("remat");
    let mut rng = 1u64;
    let pixels: Vec<f32> = (0..64 * 3 * 32 * 32)
        .map(|_| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((rng >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    let x = graphopt::HostTensor::from_f32(&[64, 3, 32, 32], &pixels);
    let data = dir.join("pixels.npz");
    let npz =
        graphopt::tract::npz::write(&[("pixel_values".into(), graphopt::to_tract(&x).unwrap())])
            .unwrap();
    std::fs::write(&data, npz).unwrap();
    let model = td("models/vit_tiny.ts14.onnx");
    let base = strings(&[
        "--batch",
        "32",
        "--steps",
        "2",
        "--loss",
        "sum",
        "--threads",
        "2",
    ]);
    let with = |extra: &[&str]| {
        let mut a = base.clone();
        a.extend(strings(extra));
        train_on(&model, &data, &dir, &a)
    };
    let (whole, losses) = with(&[]);
    assert_eq!(whole["recompute"], Value::Null, "{whole}");
    let (r, remat_losses) = with(&["--budget", "4MB"]);
    assert_eq!(r["micro_batches"], 1, "{r}");
    assert!(r["planned_bytes"].as_u64().unwrap() <= 4_000_000, "{r}");
    assert!(
        r["planned_bytes"].as_u64() < whole["planned_bytes"].as_u64(),
        "{r}"
    );
    let c = &r["recompute"];
    assert!(c["recomputed_nodes"].as_u64().unwrap() > 0, "{r}");
    assert!(c["extra_flops_pct"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        c["lower_bound_after_bytes"].as_u64() < c["lower_bound_before_bytes"].as_u64(),
        "{r}"
    );
    // Recomputed values are the same ops on the same inputs: the losses
    // are the whole step's, bit for bit.
    assert_eq!(remat_losses, losses);
    let (r, _) = with(&["--budget", "4MB", "--remat", "none"]);
    assert!(r["micro_batches"].as_u64().unwrap() > 1, "{r}");
    assert_eq!(r["recompute"], Value::Null, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shards_are_read_in_place_with_the_losses_of_one_file() {
    // The digits CNN's data as one npz, as two npz shards, and as one npy
    // file per array: the same examples, so the same losses, bit for bit.
    let dir = tmp("shards");
    let bytes = std::fs::read(td("train/digits_cnn.train.npz")).unwrap();
    let arrays = graphopt::tract::npz::read(&bytes).unwrap();
    let npz = dir.join("npz");
    let npy = dir.join("npy");
    std::fs::create_dir_all(&npz).unwrap();
    std::fs::create_dir_all(&npy).unwrap();
    let mut halves: Vec<Vec<(String, graphopt::tract::TractTensor)>> = vec![Vec::new(), Vec::new()];
    for (name, t) in &arrays {
        let n = t.shape()[0];
        for (k, half) in halves.iter_mut().enumerate() {
            let (a, b) = if k == 0 { (0, n / 3) } else { (n / 3, n) };
            half.push((name.clone(), t.slice(0, a, b).unwrap()));
        }
        std::fs::write(
            npy.join(format!("{name}.npy")),
            graphopt::tract::npz::write_npy(t).unwrap(),
        )
        .unwrap();
    }
    for (k, half) in halves.iter().enumerate() {
        std::fs::write(
            npz.join(format!("part-{k}.npz")),
            graphopt::tract::npz::write(half).unwrap(),
        )
        .unwrap();
    }
    let args = strings(&[
        "--target",
        "y",
        "--batch",
        "32",
        "--steps",
        "20",
        "--threads",
        "2",
    ]);
    let model = td("train/digits_cnn.onnx");
    let (_, one) = train_on(&model, &td("train/digits_cnn.train.npz"), &dir, &args);
    for folder in [&npz, &npy] {
        let (r, losses) = train_on(&model, folder, &dir, &args);
        assert_eq!(losses, one, "{}", folder.display());
        assert_eq!(r["examples"], arrays["x"].shape()[0], "{r}");
    }
    // A folder mixing both kinds is refused in one line.
    std::fs::copy(npz.join("part-0.npz"), npy.join("part-0.npz")).unwrap();
    let (code, _, err) = graphopt(&[
        "train",
        &model.display().to_string(),
        "--data",
        &npy.display().to_string(),
        "--target",
        "y",
        "--batch",
        "32",
        "-o",
        &dir.join("x.onnx").display().to_string(),
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("holds both .npz and .npy files"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_eval_loss_over_several_batches_reads_the_trained_state() {
    // The eval runs the step's graph, which writes its update over the
    // state it keeps: every eval batch must still read the trained state.
    // Two copies of one batch give that batch's loss.
    let dir = tmp("evalloss");
    let bytes = std::fs::read(td("train/digits_cnn.train.npz")).unwrap();
    let arrays = graphopt::tract::npz::read(&bytes).unwrap();
    let mut once = Vec::new();
    let mut twice = Vec::new();
    for (name, t) in &arrays {
        let b = t.slice(0, 0, 32).unwrap();
        let two = graphopt::tract::TractTensor::stack_tensors(0, &[b.clone(), b.clone()]).unwrap();
        once.push((name.clone(), b));
        twice.push((name.clone(), two));
    }
    let mut values = Vec::new();
    for (k, a) in [once, twice].iter().enumerate() {
        let eval = dir.join(format!("eval{k}.npz"));
        std::fs::write(&eval, graphopt::tract::npz::write(a).unwrap()).unwrap();
        let args = strings(&[
            "--target",
            "y",
            "--batch",
            "32",
            "--steps",
            "2",
            "--threads",
            "2",
            "--metric",
            "loss",
            "--eval",
            eval.to_str().unwrap(),
            "--lr",
            "0.5",
        ]);
        let (r, _) = train_on(
            &td("train/digits_cnn.onnx"),
            &td("train/digits_cnn.train.npz"),
            &dir,
            &args,
        );
        values.push(
            r["evals"].as_array().unwrap().last().unwrap()["value"]
                .as_f64()
                .unwrap(),
        );
    }
    assert_eq!(values[0], values[1], "{values:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
