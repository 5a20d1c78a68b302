#!/usr/bin/env python3
"""Reference data for tests-py/grad_digits_train.py (issue 10, "a real
training run"): a small CNN on scikit-learn's digits trained by torch with
plain SGD; the test replays the same steps with graphopt's SGD training
graph in onnxruntime and needs neither torch nor scikit-learn.

    /work/benchenv/bin/python testdata/autodiff/digits/make_digits_train.py

Needs torch (CPU), scikit-learn, onnx and numpy. Writes, next to this file:

* `digits.npz`: `x_train` (1257, 64) and `x_test` (540, 64) as uint8 pixel
  values 0..16 (the net's input is `x / 16` as float32, shaped (N, 1, 8, 8)),
  `y_train`, `y_test` (uint8 class indices), and `order` (STEPS, 32) int16:
  the training rows of each step's batch (one `np.random.default_rng(0)`
  permutation per epoch, cut into full batches of 32; the 9 leftover rows of
  each epoch are dropped).
  Split: `train_test_split(test_size=540, random_state=0, stratify=y)`.
* `cnn_untrained.onnx`: Conv2d(1,8,3,padding=1)-ReLU-MaxPool2d(2)-
  Conv2d(8,16,3,padding=1)-ReLU-Flatten-Linear(256,10) after
  `torch.manual_seed(0)`, exported BEFORE training (TorchScript exporter,
  `dynamo=False`, opset 17, dynamic batch axis; input `x`, output `logits`).
* `torch_curve.npz`: `loss` (STEPS,) float64, torch's `F.cross_entropy` of
  each step's batch before that step's update (`torch.optim.SGD(lr=LR)`, no
  momentum, no weight decay, one thread), `test_accuracy` (fraction of the
  540 test images after the last step), `lr`, `steps`, `batch`.

Deterministic: rerunning rewrites byte-identical files (checked with
`--check`, which writes to a temporary folder and compares).
"""
from __future__ import annotations

import argparse
import filecmp
import io
import os
import sys
import tempfile
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LR = 0.1
BATCH = 32
STEPS = 300
FILES = ["digits.npz", "cnn_untrained.onnx", "torch_curve.npz"]


def data():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = d.data.astype(np.uint8)  # integer pixel values 0..16
    assert np.array_equal(x, d.data) and x.max() == 16
    y = d.target.astype(np.uint8)
    return train_test_split(x, y, test_size=540, random_state=0, stratify=y)


def order(n):
    rng = np.random.default_rng(0)
    out = []
    while len(out) < STEPS:
        perm = rng.permutation(n)
        out += [perm[i:i + BATCH] for i in range(0, n - BATCH + 1, BATCH)]
    return np.stack(out[:STEPS]).astype(np.int16)


def make_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(16 * 4 * 4, 10),
    )


def as_input(x_u8):
    return (x_u8.astype(np.float32) / np.float32(16)).reshape(-1, 1, 8, 8)


def save_npz(path, **arrays):
    # np.savez_compressed stores zip timestamps of "now": write the members
    # with a fixed date so reruns are byte-identical.
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for k in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[k]), allow_pickle=False)
            info = zipfile.ZipInfo(k + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())


def build(out_dir):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    xtr, xte, ytr, yte = data()
    idx = order(len(xtr))
    save_npz(os.path.join(out_dir, "digits.npz"), x_train=xtr, x_test=xte,
             y_train=ytr, y_test=yte, order=idx)

    model = make_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.zeros(2, 1, 8, 8),), os.path.join(out_dir, "cnn_untrained.onnx"),
            dynamo=False, opset_version=17, input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        )

    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0, weight_decay=0.0)
    x = torch.from_numpy(as_input(xtr))
    y = torch.from_numpy(ytr.astype(np.int64))
    losses = []
    for b in idx.astype(np.int64):
        opt.zero_grad()
        loss = F.cross_entropy(model(x[b]), y[b])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        model.eval()
        pred = model(torch.from_numpy(as_input(xte))).argmax(1).numpy()
    acc = float((pred == yte).mean())
    save_npz(os.path.join(out_dir, "torch_curve.npz"), loss=np.array(losses, np.float64),
             test_accuracy=np.float64(acc), lr=np.float64(LR), steps=np.int64(STEPS),
             batch=np.int64(BATCH))
    return losses, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="rebuild in a temporary folder and compare with the committed files")
    a = ap.parse_args()
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            build(tmp)
            bad = [f for f in FILES if not filecmp.cmp(os.path.join(tmp, f), os.path.join(HERE, f), shallow=False)]
        print("differ: " + ", ".join(bad) if bad else "identical: " + ", ".join(FILES))
        return 1 if bad else 0
    losses, acc = build(HERE)
    print(f"{STEPS} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(mean of last 20 {np.mean(losses[-20:]):.4f}), test accuracy {100 * acc:.2f}%")
    for f in FILES:
        print(f"{f}: {os.path.getsize(os.path.join(HERE, f))} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
