#!/usr/bin/env python3
"""Untrained digits models, their data, and torch's losses on them, so that
CI can check `graphopt train` against torch without torch:

    python testdata/train/make_train.py     # needs torch (CPU) and scikit-learn

writes, beside this script:
  digits_{cnn,mlp}.onnx        the untrained models (seeded), input "x", output "logits"
  digits_{cnn,mlp}.train.npz   the 1257 training images ("x") and labels ("y")
  (the 540 held-out images and labels are testdata/quant/digits_{cnn,mlp}.test.npz)
  torch.json                   torch's reference: for each model and optimizer,
                               the loss of each of the first STEPS steps and the
                               test accuracy after EPOCHS epochs

The split and the models are those of testdata/quant/make_digits.py. Torch
trains exactly as `graphopt train --no-shuffle --batch 32` does: batches in
file order, the last partial batch of an epoch dropped, cross-entropy (mean),
torch.optim.SGD / AdamW with the hyperparameters in torch.json. Seeded: the
same versions give the same files.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "quant"))
from make_digits import CNN, MLP  # noqa: E402

BATCH = 32
STEPS = 50
EPOCHS = 3
OPTIMIZERS = {
    "sgd": {"lr": 0.05, "weight_decay": 0.0},
    "adamw": {"lr": 0.002, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8},
}


def make_opt(name, params):
    h = OPTIMIZERS[name]
    if name == "sgd":
        return torch.optim.SGD(params, lr=h["lr"], weight_decay=h["weight_decay"])
    return torch.optim.AdamW(params, lr=h["lr"], weight_decay=h["weight_decay"],
                             betas=tuple(h["betas"]), eps=h["eps"])


def run(model, opt_name, x, y, xe, ye):
    opt = make_opt(opt_name, model.parameters())
    losses, step = [], 0
    for _ in range(EPOCHS):
        for i in range(0, len(x) - BATCH + 1, BATCH):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i:i + BATCH]), y[i:i + BATCH])
            loss.backward()
            opt.step()
            if step < STEPS:
                losses.append(float(loss))
            step += 1
    with torch.no_grad():
        acc = float((model(xe).argmax(1) == ye).float().mean())
    return {"losses": losses, "steps": step, "test_accuracy": acc}


def main():
    torch.manual_seed(0)
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=540, random_state=0, stratify=y)
    info = {"torch": torch.__version__, "batch": BATCH, "steps": STEPS, "epochs": EPOCHS,
            "loss": "cross_entropy", "optimizers": OPTIMIZERS, "models": {}}
    for name, cls, shape in [("cnn", CNN, (-1, 1, 8, 8)), ("mlp", MLP, (-1, 64))]:
        torch.manual_seed(1)
        model = cls()
        init = {k: v.clone() for k, v in model.state_dict().items()}
        xt, yt = torch.from_numpy(xtr.reshape(shape)), torch.from_numpy(ytr)
        path = os.path.join(HERE, f"digits_{name}.onnx")
        torch.onnx.export(model, (xt[:1],), path, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=17, dynamo=False)
        np.savez(os.path.join(HERE, f"digits_{name}.train.npz"), x=xtr.reshape(shape), y=ytr)
        test = np.load(os.path.join(HERE, "..", "quant", f"digits_{name}.test.npz"))
        assert np.array_equal(test["x"], xte.reshape(shape)) and np.array_equal(test["y"], yte)
        xe, ye = torch.from_numpy(xte.reshape(shape)), torch.from_numpy(yte)
        info["models"][name] = {}
        for opt_name in OPTIMIZERS:
            model.load_state_dict(init)
            r = run(model, opt_name, xt, yt, xe, ye)
            info["models"][name][opt_name] = r
            print(f"{name} {opt_name}: loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}, "
                  f"test accuracy {r['test_accuracy']:.4f} after {r['steps']} steps")
    with open(os.path.join(HERE, "torch.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
