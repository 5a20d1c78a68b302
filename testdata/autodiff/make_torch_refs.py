#!/usr/bin/env python3
"""Torch autograd references for `graphopt grad` (developer-only: needs torch
and onnxscript; CI uses the committed files and never runs this).

    python3 testdata/autodiff/make_torch_refs.py      # from the repo root

For three small torch modules (an MLP, a CNN with BatchNorm in eval mode and
average/max pooling, a pre-norm transformer block whose attention is written
with torch.einsum), each exported with both exporters (TorchScript,
opset 14 -> NAME.ts.onnx; dynamo, opset 18 -> NAME.dynamo.onnx), it writes
into testdata/autodiff/torch/:

    NAME.EXP.onnx        the model
    NAME.EXP.refs.npz    in/<input>     the fixed inputs (and in/target)
                         loss           torch's loss (float64 scalar)
                         grad/<init>    d loss / d parameter, keyed by the ONNX
                                        initializer that holds the parameter
                                        (matched by name, else by value; a
                                        weight the exporter transposed is
                                        matched against its transpose and its
                                        gradient stored transposed likewise)
                         input_grad/<input>  d loss / d input (float inputs)
                         adamw/<init>  the parameter after 3 AdamW steps on
                                       the same batch (lr 1e-2, betas (0.9,
                                       0.99), eps 1e-8, weight decay 0.1)
    MANIFEST.json        per model: loss, class axis, matched parameters

Every parameter is perturbed with seeded noise first so that no two
parameters are equal (LayerNorm's ones would otherwise be ambiguous by
value). The same seeds give the same files on the same torch version.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "torch")
ADAMW = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
ADAMW_STEPS = 3


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 5)

    def forward(self, x):
        h = nn.functional.gelu(self.fc1(x))
        h = torch.relu(self.fc2(h)) + torch.tanh(h)
        return self.fc3(h)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = self.pool(torch.relu(self.bn1(self.conv1(x))))
        h = self.avg(nn.functional.hardswish(self.bn2(self.conv2(h))))
        h = torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1)
        return self.fc(h)


class Block(nn.Module):
    """Pre-norm transformer block; attention with torch.einsum."""

    def __init__(self, d=16, heads=2, ff=32):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / (d // h) ** 0.5
        a = torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.ln2(x))))


def build(name):
    g = torch.Generator().manual_seed({"mlp": 1, "cnn": 2, "block": 3}[name])
    torch.manual_seed({"mlp": 11, "cnn": 12, "block": 13}[name])
    if name == "mlp":
        m = Mlp()
        x = torch.randn(4, 8, generator=g)
        target = torch.tensor([0, 3, 1, 4])
        loss = "cross_entropy"
    elif name == "cnn":
        m = Cnn()
        x = torch.randn(2, 3, 8, 8, generator=g)
        target = torch.randn(2, 4, generator=g)
        loss = "mse"
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                n = mod.num_features
                mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
    else:
        m = Block()
        x = torch.randn(2, 5, 16, generator=g)
        target = None
        loss = "mean"
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    m.eval()
    return m, x, target, loss


def loss_of(kind, y, target):
    if kind == "cross_entropy":
        return nn.functional.cross_entropy(y, target)
    if kind == "mse":
        return nn.functional.mse_loss(y, target)
    if kind == "mean":
        return y.mean()
    return y.sum()


def export(m, x, path, exporter, optimize):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "ts":
            # PRESERVE keeps BatchNormalization (EVAL would fold it into the
            # convolution, and the folded weights are no torch parameter).
            torch.onnx.export(m, (x,), path, dynamo=False, opset_version=14,
                              input_names=["x"], output_names=["y"],
                              training=torch.onnx.TrainingMode.PRESERVE,
                              do_constant_folding=True)
        else:
            prog = torch.onnx.export(m, (x,), None, dynamo=True, opset_version=18,
                                     input_names=["x"], output_names=["y"], optimize=optimize)
            prog.save(path, external_data=False)


def match(params, inits):
    """torch name -> (onnx initializer, transposed)."""
    out = {}
    for pname, p in params.items():
        if pname in inits and inits[pname].shape == p.shape and np.array_equal(inits[pname], p):
            out[pname] = (pname, False)
            continue
        cands = [(i, False) for i, t in inits.items() if t.shape == p.shape and np.array_equal(t, p)]
        if p.ndim == 2:
            cands += [(i, True) for i, t in inits.items()
                      if t.shape == p.T.shape and np.array_equal(t, p.T)]
        if len(cands) != 1:
            raise SystemExit(f"parameter {pname}: {len(cands)} initializers hold it")
        out[pname] = cands[0]
    return out


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    manifest = {}
    for name in ["mlp", "cnn", "block"]:
        for exp in ["ts", "dynamo"]:
            m, x, target, kind = build(name)
            stem = f"{name}.{exp}"
            path = os.path.join(OUT, stem + ".onnx")
            # Not for the CNN: onnxscript's optimizer folds BatchNormalization
            # into the convolution, whose folded weights are no torch
            # parameter; the others need it (chunk() exports as
            # SplitToSequence otherwise).
            export(m, x, path, exp, optimize=name != "cnn")
            model = onnx.load(path)
            inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
            params = {n: p.detach().numpy() for n, p in m.named_parameters()}
            mapping = match(params, inits)
            xg = x.clone().requires_grad_(True)
            y = m(xg)
            loss = loss_of(kind, y, target)
            m.zero_grad()
            loss.backward()
            arrays = {"in/x": x.numpy(), "loss": np.array(loss.item(), dtype=np.float64),
                      "input_grad/x": xg.grad.numpy()}
            if target is not None:
                arrays["in/target"] = target.numpy()
            for pname, p in m.named_parameters():
                iname, tr = mapping[pname]
                g = p.grad.numpy()
                arrays[f"grad/{iname}"] = g.T if tr else g
            # AdamW, ADAMW_STEPS steps on the same batch.
            opt = torch.optim.AdamW(m.parameters(), **ADAMW)
            for _ in range(ADAMW_STEPS):
                opt.zero_grad()
                loss_of(kind, m(x), target).backward()
                opt.step()
            for pname, p in m.named_parameters():
                iname, tr = mapping[pname]
                v = p.detach().numpy()
                arrays[f"adamw/{iname}"] = v.T if tr else v
            np.savez(os.path.join(OUT, stem + ".refs.npz"),
                     **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
            manifest[stem] = dict(loss=kind, class_axis=1, params=len(mapping),
                                  transposed=sorted(i for i, t in mapping.values() if t))
            print(f"{stem}: loss {loss.item():.6f}, {len(mapping)} parameters matched")
    manifest["_meta"] = dict(torch=torch.__version__, onnx=onnx.__version__, adamw=ADAMW,
                             adamw_steps=ADAMW_STEPS)
    with open(os.path.join(OUT, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
