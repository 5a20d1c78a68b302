#!/usr/bin/env python3
"""Digits training result (issue 10): an MLP trained by looping graphopt's
AdamW training graph in onnxruntime, side by side with torch training the
same net from the same start on the same batches.

    /work/benchenv/bin/python benches/grad_digits.py [--graphopt BIN] [--epochs 20]

Needs torch (CPU), scikit-learn, onnx, onnxruntime and numpy. Run by hand.

* Data: scikit-learn's bundled digits set (1797 8x8 images, 10 classes),
  pixels / 16 so inputs lie in [0, 1], `train_test_split(test_size=540,
  random_state=0, stratify=y)`: 1257 train, 540 test.
* Net: Linear(64,128)-ReLU-Linear(128,64)-ReLU-Linear(64,10), seeded
  (`torch.manual_seed(0)`), exported BEFORE training with the TorchScript
  exporter (`dynamo=False`, opset 17, dynamic batch axis), so both sides
  start from identical weights.
* Training graph: `graphopt grad MLP.onnx -o train.onnx --loss cross_entropy
  --optimizer adamw --lr 1e-3 --params-as-inputs --init-out init.npz`
  (defaults: betas 0.9,0.999, eps 1e-8, weight decay 0.01). Each step feeds
  the data `x`, the int64 class indices `target`, and the parameters, moments
  and `step` from the previous step's `_new` outputs (the first step from
  init.npz).
* torch: `torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
  weight_decay=0.01)` and `F.cross_entropy`, the same minibatches of 32 in
  the same order (one seeded permutation per epoch; the last batch of each
  epoch has 9 rows).
* Reported: mean train loss per epoch for both, the largest per-step loss
  difference (all steps and the first 20), final test accuracy (graphopt's
  trained parameters written back into the inference ONNX and run in
  onnxruntime; torch's model directly), and the largest absolute difference
  of the final parameters.

Prints a markdown table and writes benches/results/grad_digits.json and
benches/results/grad_digits.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benches" / "results"

LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01  # graphopt grad's AdamW default (`--weight-decay`, see --help)
BATCH = 32


def data():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=540, random_state=0, stratify=y)
    return xtr, xte, ytr, yte


def make_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def export(model, path):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.zeros(2, 64),), str(path), dynamo=False, opset_version=17,
            input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        )


def batches(n, epochs, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        perm = rng.permutation(n)
        out.append([perm[i:i + BATCH] for i in range(0, n, BATCH)])
    return out


def match_params(onnx_params, torch_params):
    """Map each trainable ONNX parameter name to a torch parameter name: by
    name when the exporter kept it, else by value (also transposed)."""
    mapping = {}
    for name, arr in onnx_params.items():
        if name in torch_params and torch_params[name].shape == arr.shape \
                and np.array_equal(torch_params[name], arr):
            mapping[name] = (name, False)
            continue
        for tname, t in torch_params.items():
            if t.shape == arr.shape and np.array_equal(t, arr):
                mapping[name] = (tname, False)
                break
            if t.ndim == 2 and t.T.shape == arr.shape and np.array_equal(t.T, arr):
                mapping[name] = (tname, True)
                break
        else:
            raise SystemExit(f"no torch parameter matches ONNX parameter {name!r}")
    return mapping


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt", default=os.environ.get("GRAPHOPT", str(ROOT / "target" / "debug" / "graphopt")))
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--json", default=str(RESULTS / "grad_digits.json"))
    ap.add_argument("--md", default=str(RESULTS / "grad_digits.md"))
    ap.add_argument("--tmp", help="keep the ONNX files and init.npz in this folder")
    args = ap.parse_args()

    import onnx
    import onnxruntime as ort
    import torch
    import torch.nn.functional as F
    from onnx import numpy_helper

    torch.set_num_threads(1)
    xtr, xte, ytr, yte = data()
    model = make_model()

    tmp = Path(args.tmp) if args.tmp else Path(tempfile.mkdtemp(prefix="grad_digits_"))
    tmp.mkdir(parents=True, exist_ok=True)
    mlp, train, init = tmp / "mlp.onnx", tmp / "train.onnx", tmp / "init.npz"
    export(model, mlp)

    cmd = [args.graphopt, "grad", str(mlp), "-o", str(train), "--loss", "cross_entropy",
           "--optimizer", "adamw", "--lr", str(LR), "--params-as-inputs", "--init-out", str(init)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    grad_s = time.perf_counter() - t0
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"graphopt grad failed ({r.returncode})")
    print(r.stdout.strip())

    tg = onnx.load(str(train))
    onnx.checker.check_model(tg, full_check=True)
    domains = sorted({n.domain or "ai.onnx" for n in tg.graph.node})
    state = dict(np.load(init))
    sess = ort.InferenceSession(str(train), providers=["CPUExecutionProvider"])
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    target_in = next(i for i in sess.get_inputs() if i.name == "target")
    state_names = [n for n in in_names if n not in ("x", "target")]
    missing = [n for n in state_names if n not in state]
    if missing:
        raise SystemExit(f"init.npz lacks {missing}")
    feedback = [n for n in state_names if f"{n}_new" in out_names]
    params = [n for n in state_names if n + "_m" in state_names]

    tparams = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    mapping = match_params({p: state[p] for p in params}, tparams)

    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    xtr_t, ytr_t = torch.from_numpy(xtr), torch.from_numpy(ytr)

    order = batches(len(xtr), args.epochs)
    epochs = []
    step_losses_g, step_losses_t = [], []
    t_g = t_t = 0.0
    for e, bs in enumerate(order):
        lg, lt, ns = 0.0, 0.0, 0
        for idx in bs:
            feed = {"x": xtr[idx], "target": ytr[idx].astype(np.int64)}
            feed.update({n: state[n] for n in state_names})
            t0 = time.perf_counter()
            outs = dict(zip(out_names, sess.run(None, feed)))
            t_g += time.perf_counter() - t0
            for n in feedback:
                state[n] = outs[f"{n}_new"]
            loss_g = float(outs["loss"])

            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr_t[idx]), ytr_t[idx])
            loss.backward()
            opt.step()
            t_t += time.perf_counter() - t0
            loss_t = float(loss.detach())

            step_losses_g.append(loss_g)
            step_losses_t.append(loss_t)
            lg += loss_g * len(idx)
            lt += loss_t * len(idx)
            ns += len(idx)
        epochs.append({"epoch": e + 1, "loss_graphopt": lg / ns, "loss_torch": lt / ns})
        print(f"epoch {e + 1:3d}  loss graphopt {lg / ns:.6f}  torch {lt / ns:.6f}")

    step_diff = np.abs(np.array(step_losses_g) - np.array(step_losses_t))

    # Test accuracy: graphopt's trained parameters written back into the inference model.
    inf = onnx.load(str(mlp))
    by_name = {t.name: t for t in inf.graph.initializer}
    for p in params:
        if p not in by_name:
            raise SystemExit(f"inference model has no initializer {p!r}")
        by_name[p].CopyFrom(numpy_helper.from_array(state[p].astype(np.float32), p))
    trained = tmp / "mlp.trained.onnx"
    onnx.save(inf, str(trained))
    isess = ort.InferenceSession(str(trained), providers=["CPUExecutionProvider"])
    acc_g = float((isess.run(None, {"x": xte})[0].argmax(1) == yte).mean())
    with torch.no_grad():
        model.eval()
        acc_t = float((model(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
        tfinal = {k: v.detach().numpy() for k, v in model.named_parameters()}

    pdiff = {}
    for p, (tn, transposed) in mapping.items():
        t = tfinal[tn].T if transposed else tfinal[tn]
        g = state[p]
        pdiff[p] = {
            "torch_name": tn, "transposed": transposed,
            "max_abs_diff": float(np.abs(g - t).max()),
            "rel_l2": float(np.linalg.norm(g - t) / np.linalg.norm(t)),
        }
    max_pdiff = max(d["max_abs_diff"] for d in pdiff.values())
    max_rel = max(d["rel_l2"] for d in pdiff.values())

    steps = len(step_losses_g)
    res = {
        "setup": {
            "data": "sklearn load_digits, pixels/16, train_test_split(test_size=540, random_state=0, stratify=y)",
            "n_train": int(len(xtr)), "n_test": int(len(xte)),
            "net": "Linear(64,128)-ReLU-Linear(128,64)-ReLU-Linear(64,10), torch.manual_seed(0)",
            "export": "TorchScript (dynamo=False), opset 17, dynamic batch axis, before training",
            "graphopt_cmd": " ".join(["graphopt"] + cmd[1:]).replace(str(tmp) + "/", ""),
            "optimizer": {"name": "adamw", "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY},
            "batch": BATCH, "epochs": args.epochs, "steps": steps,
            "order": "one np.random.default_rng(0).permutation per epoch, batches of 32 in that order",
            "training_graph": {"nodes": len(tg.graph.node), "inputs": len(in_names), "outputs": len(out_names),
                               "domains": domains, "target_input": {"name": target_in.name, "type": target_in.type}},
            "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__,
                         "numpy": np.__version__, "python": platform.python_version()},
        },
        "epochs": epochs,
        "step_loss_graphopt": step_losses_g,
        "step_loss_torch": step_losses_t,
        "max_step_loss_diff": float(step_diff.max()),
        "max_step_loss_diff_first20": float(step_diff[:20].max()),
        "test_accuracy_graphopt": acc_g,
        "test_accuracy_torch": acc_t,
        "param_max_abs_diff": max_pdiff,
        "param_max_rel_l2": max_rel,
        "params": pdiff,
        "time_s": {"graphopt_grad": grad_s, "ort_steps": t_g, "torch_steps": t_t},
    }

    show = sorted({1, 2, 3, 5, 10, 15, args.epochs} & set(range(1, args.epochs + 1)))
    lines = [
        f"Digits MLP (64-128-64-10), AdamW lr 1e-3 wd {WEIGHT_DECAY}, batch {BATCH}, "
        f"{args.epochs} epochs ({steps} steps), {len(xtr)} train / {len(xte)} test",
        "",
        "| epoch | train loss graphopt (ORT) | train loss torch | abs diff |",
        "|---:|---:|---:|---:|",
    ]
    for e in show:
        r_ = epochs[e - 1]
        lines.append(f"| {e} | {r_['loss_graphopt']:.6f} | {r_['loss_torch']:.6f} | "
                     f"{abs(r_['loss_graphopt'] - r_['loss_torch']):.2e} |")
    lines += [
        "",
        "| | graphopt (ORT) | torch |",
        "|---|---:|---:|",
        f"| test accuracy | {acc_g * 100:.2f}% | {acc_t * 100:.2f}% |",
        "",
        f"* largest per-step loss difference: {step_diff.max():.2e} (first 20 steps: {step_diff[:20].max():.2e})",
        f"* final parameters: max abs diff {max_pdiff:.2e}, worst relative L2 {max_rel:.2e}",
        f"* training graph: {len(tg.graph.node)} nodes, domains {', '.join(domains)}, "
        f"passes `onnx.checker` (full); `target` input {target_in.type}",
    ]
    md = "\n".join(lines) + "\n"
    print()
    print(md)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    Path(args.md).write_text(md)
    print(f"wrote {args.json} and {args.md}")


if __name__ == "__main__":
    main()
