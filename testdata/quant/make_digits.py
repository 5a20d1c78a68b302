#!/usr/bin/env python3
"""Trains a small CNN and an MLP on scikit-learn's bundled digits data set
and writes what the quantization accuracy test needs, so that CI needs no
torch:

    /work/benchenv/bin/python testdata/quant/make_digits.py

writes, beside this script:
  digits_mlp.onnx, digits_cnn.onnx     float32 models, input "x", output "logits"
  digits_{mlp,cnn}.calib.npz           64 training images ("x"): calibration
  digits_{mlp,cnn}.test.npz            the 540 held-out images ("x") and labels ("y")
  digits.json                          float test accuracies and how they were made

Needs torch (CPU) and scikit-learn. Seeded: the same versions give the same
files.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = os.path.dirname(os.path.abspath(__file__))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 128), torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        )

    def forward(self, x):
        return self.net(x)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
        )
        self.head = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 10),
        )

    def forward(self, x):
        return self.head(self.features(x))


def train(model, x, y, epochs=60):
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
    return model.eval()


def main():
    torch.manual_seed(0)
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=540, random_state=0, stratify=y)
    info = {"torch": torch.__version__, "train": len(xtr), "test": len(xte), "models": {}}
    for name, model, shape in [("mlp", MLP(), (-1, 64)), ("cnn", CNN(), (-1, 1, 8, 8))]:
        xt = torch.from_numpy(xtr.reshape(shape))
        train(model, xt, torch.from_numpy(ytr))
        xe = xte.reshape(shape)
        with torch.no_grad():
            acc = float((model(torch.from_numpy(xe)).argmax(1).numpy() == yte).mean())
        path = os.path.join(HERE, f"digits_{name}.onnx")
        torch.onnx.export(model, (xt[:1],), path, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=17, dynamo=False)
        np.savez(os.path.join(HERE, f"digits_{name}.calib.npz"), x=xtr[:64].reshape(shape))
        np.savez(os.path.join(HERE, f"digits_{name}.test.npz"), x=xe, y=yte)
        info["models"][name] = {"test_accuracy": acc}
        print(f"{name}: float test accuracy {acc:.4f}")
    with open(os.path.join(HERE, "digits.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
