#!/usr/bin/env python3
"""Training-graph benchmark (issue 10): `graphopt grad` against torch autograd
on the same models in the same run.

    python3 benches/grad_bench.py [--graphopt BIN] [--models resnet50,bert_base,gpt2]

Needs torch, torchvision and transformers (e.g. /work/benchenv). For each
model (random seeded weights, nothing downloaded; eval mode: BatchNorm in
inference form, no dropout; fixed shapes):

  resnet50   torchvision resnet50, batch 2, 3x224x224, loss = logits.sum()
  bert_base  transformers BertModel(BertConfig()), batch 2, seq 128,
             loss = last_hidden_state.sum()
  gpt2       transformers GPT2Model(GPT2Config()), batch 2, seq 128,
             loss = last_hidden_state.sum()

* torch: one forward + loss under torch.autograd.graph.saved_tensors_hooks;
  every tensor autograd saves for backward is counted once per storage
  (what stays alive), split into parameters, the model's inputs, and
  activations (everything else). Also the forward+backward wall time.
* graphopt: the model exported with the TorchScript exporter (opset 17,
  TrainingMode.PRESERVE so BatchNormalization is kept, cached in
  benches/models/), then `graphopt grad M -o T --loss sum
  --report R.json`, timed; its report gives the saved activation and input
  bytes and the planner's activation lower bound and arena for the step.

Prints a markdown table and writes benches/results/grad.json. The build
time is the whole command (load, differentiate, simplify, plan, save);
measure with a release binary for a timing claim.

    python3 benches/grad_bench.py --coverage --ort-training /path/to/venv/bin/python

compares which models each tool differentiates, against onnxruntime-training
1.19.2's `generate_artifacts` (it conflicts with onnxruntime, so it runs in its
own venv: `python3 -m venv V && V/bin/pip install onnxruntime-training==1.19.2
onnx 'numpy<2'`). Models: the three above (exported as above) and every fp32
model of testdata/models. Both tools get an MSE loss on the first output
(`graphopt grad --loss mse`; `artifacts.LossType.MSELoss`) and every float
initializer of more than one element as trainable, with AdamW
(`--optimizer adamw`; `OptimType.AdamW`). Per tool: whether it built a
training graph, the build time, and whether that graph runs in plain
onnxruntime (this venv's, with seeded random inputs). Writes
benches/results/grad_coverage.json and a markdown table.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "benches" / "models"


def build(name):
    import torch

    torch.manual_seed(0)
    if name == "resnet50":
        from torchvision.models import resnet50

        m = resnet50(weights=None).eval()
        args = (torch.randn(2, 3, 224, 224),)
        names = ["pixel_values"]
        out = lambda o: o  # noqa: E731
    else:
        from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

        if name == "bert_base":
            m = BertModel(BertConfig(attn_implementation="eager")).eval()
        else:
            m = GPT2Model(GPT2Config(attn_implementation="eager")).eval()
        g = torch.Generator().manual_seed(1)
        args = (torch.randint(0, 1000, (2, 128), generator=g),)
        names = ["input_ids"]
        out = lambda o: o.last_hidden_state  # noqa: E731

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return out(self.m(x))

    return Wrap(m).eval(), args, names


def torch_saved(m, args):
    import torch

    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    inputs = {a.untyped_storage().data_ptr() for a in args}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = m(*args).sum()
    loss.backward()
    dt = time.perf_counter() - t0
    split = {"params": 0, "inputs": 0, "activations": 0}
    for ptr, n in seen.items():
        k = "params" if ptr in params else "inputs" if ptr in inputs else "activations"
        split[k] += n
    return split, dt


def export(m, args, names, path):
    import torch

    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        # PRESERVE keeps BatchNormalization as torch runs it (EVAL would
        # fold it into the convolutions, and save less than torch can).
        torch.onnx.export(m, args, str(path), dynamo=False, opset_version=17,
                          input_names=names, output_names=["y"], do_constant_folding=True,
                          training=torch.onnx.TrainingMode.PRESERVE)


ORT_TRAINING_CHILD = r"""
import json, os, sys, time, onnx
import onnxruntime
onnxruntime.set_default_logger_severity(3)
from onnxruntime.training import artifacts
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
m = onnx.load(src)
names = [t.name for t in m.graph.initializer
         if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) > 0 and
         int(__import__("numpy").prod(t.dims)) > 1]
inputs = {i.name for i in m.graph.input}
names = [n for n in names if n not in inputs]
t0 = time.perf_counter()
try:
    artifacts.generate_artifacts(m, requires_grad=names, frozen_params=[],
                                 loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out)
    err = None
except Exception as e:
    err = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
print(json.dumps({"s": time.perf_counter() - t0, "error": err, "trainable": len(names)}))
"""


def plain_ort_runs(path):
    """None when the model loads and runs in this venv's onnxruntime on seeded
    random inputs (symbolic dims 2), else the first line of why not."""
    import numpy as np
    import onnxruntime as ort

    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {}
        types = {"tensor(float)": np.float32, "tensor(int64)": np.int64,
                 "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16}
        for i in s.get_inputs():
            shape = [d if isinstance(d, int) else 2 for d in i.shape]
            dt = types.get(i.type)
            if dt is None:
                return f"input {i.name}: {i.type}"
            if dt in (np.int64, np.int32):
                feeds[i.name] = (np.zeros(shape) if i.name == "step" else
                                 rng.integers(0, 2, shape)).astype(dt)
            elif dt is np.bool_:
                feeds[i.name] = np.ones(shape, dt)
            else:
                feeds[i.name] = rng.standard_normal(shape).astype(dt)
        s.run(None, feeds)
        return None
    except Exception as e:  # noqa: BLE001
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def coverage(a):
    """Which models graphopt grad and generate_artifacts differentiate."""
    import onnx as _onnx

    models = []
    for name in ["resnet50", "bert_base", "gpt2"]:
        path = MODELS / f"{name}.grad.onnx"
        if not path.exists():
            m, args, names = build(name)
            export(m, args, names, path)
        models.append((name, path))
    man = json.loads((ROOT / "testdata/models/MANIFEST.json").read_text())
    for e in man["models"]:
        if "fp16" in e["name"] or "int8" in e["name"]:
            continue
        models.append((e["name"], ROOT / "testdata/models" / e["file"]))
    rows = []
    for name, path in models:
        row = {"model": name}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "t.onnx"
            t0 = time.perf_counter()
            r = subprocess.run([a.graphopt, "grad", str(path), "-o", str(out), "--loss", "mse",
                                "--optimizer", "adamw"], capture_output=True, text=True)
            row["graphopt_s"] = round(time.perf_counter() - t0, 3)
            row["graphopt_error"] = r.stderr.strip().splitlines()[-1][:200] if r.returncode else None
            if not r.returncode:
                row["graphopt_plain_ort"] = plain_ort_runs(out)
            if a.ort_training:
                art = Path(tmp) / "art"
                c = subprocess.run([a.ort_training, "-c", ORT_TRAINING_CHILD, str(path), str(art)],
                                   capture_output=True, text=True)
                try:
                    j = json.loads(c.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    # No result line: the child died (onnxruntime's log lines
                    # start with a date; the cause is the last other line).
                    why = [ln for ln in c.stderr.strip().splitlines() if not ln[:2].isdigit()]
                    j = {"s": None, "error": f"exit code {c.returncode}" +
                         (f": {why[-1][:160]}" if why else " (crashed, no message)")}
                row["ort_training_s"] = None if j["s"] is None else round(j["s"], 3)
                row["ort_training_error"] = j["error"]
                tm = art / "training_model.onnx"
                if j["error"] is None and tm.exists():
                    row["ort_training_plain_ort"] = plain_ort_runs(tm)
                    ops = {(n.domain or "ai.onnx") for n in _onnx.load(str(tm)).graph.node}
                    row["ort_training_domains"] = sorted(ops)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    def cell(err, s, plain):
        if err:
            return f"FAILS: {err}"
        runs = "runs in plain onnxruntime" if plain is None else f"does not run in plain onnxruntime ({plain})"
        return f"{s:.2f} s, {runs}"

    print("| model | graphopt grad | generate_artifacts |")
    print("|---|---|---|")
    for r in rows:
        ot = ("not run" if "ort_training_error" not in r else
              cell(r["ort_training_error"], r["ort_training_s"] or 0, r.get("ort_training_plain_ort")))
        print(f"| {r['model']} | {cell(r['graphopt_error'], r['graphopt_s'], r.get('graphopt_plain_ort'))}"
              f" | {ot} |")
    out = ROOT / "benches" / "results" / "grad_coverage.json"
    out.write_text(json.dumps({"rows": rows, "graphopt": a.graphopt}, indent=1) + "\n")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", default=os.environ.get("GRAPHOPT") or next(
        (str(p) for p in [ROOT / "target/release/graphopt", ROOT / "target/debug/graphopt"]
         if p.exists()), "graphopt"))
    ap.add_argument("--models", default="resnet50,bert_base,gpt2")
    ap.add_argument("--json", default=str(ROOT / "benches" / "results" / "grad.json"))
    ap.add_argument("--coverage", action="store_true",
                    help="which models each tool differentiates (see the module doc)")
    ap.add_argument("--ort-training", help="a Python with onnxruntime-training 1.19.2")
    a = ap.parse_args()
    if a.coverage:
        return coverage(a)
    import torch

    torch.set_num_threads(2)
    rows = []
    for name in a.models.split(","):
        m, args, names = build(name)
        saved, t_torch = torch_saved(m, args)
        path = MODELS / f"{name}.grad.onnx"
        export(m, args, names, path)
        del m
        with tempfile.TemporaryDirectory() as tmp:
            rep = Path(tmp) / "r.json"
            t0 = time.perf_counter()
            r = subprocess.run([a.graphopt, "grad", str(path), "-o", str(Path(tmp) / "t.onnx"),
                                "--loss", "sum", "--report", str(rep)],
                               capture_output=True, text=True)
            t_go = time.perf_counter() - t0
            if r.returncode != 0:
                rows.append({"model": name, "error": r.stderr.strip(), "torch_saved": saved})
                print(f"{name}: graphopt failed: {r.stderr.strip()}", file=sys.stderr)
                continue
            g = json.loads(rep.read_text())
        row = {
            "model": name,
            "torch_saved_activation_bytes": saved["activations"],
            "torch_saved_input_bytes": saved["inputs"],
            "torch_saved_param_bytes": saved["params"],
            "torch_fwd_bwd_s": round(t_torch, 3),
            "graphopt_saved_activation_bytes": g["saved_activation_bytes"],
            "graphopt_saved_input_bytes": g["saved_input_bytes"],
            "graphopt_lower_bound_bytes": g["lower_bound_bytes"],
            "graphopt_arena_bytes": g["arena_bytes"],
            "graphopt_forward_nodes": g["forward_nodes"],
            "graphopt_backward_nodes": g["backward_nodes"],
            "graphopt_grad_s": round(t_go, 2),
            "graphopt_binary": a.graphopt,
            "saved_ratio_graphopt_over_torch": round(
                g["saved_activation_bytes"] / max(1, saved["activations"]), 4),
        }
        rows.append(row)
        print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    mb = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    print("| model | torch saved act. MiB | graphopt saved act. MiB | ratio | torch saved inputs MiB "
          "| graphopt saved inputs MiB | plan lower bound MiB | arena MiB | fwd/bwd nodes "
          "| grad build s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {mb(r['torch_saved']['activations'])} | failed | | | | | | | |")
            continue
        print(f"| {r['model']} | {mb(r['torch_saved_activation_bytes'])} | "
              f"{mb(r['graphopt_saved_activation_bytes'])} | {r['saved_ratio_graphopt_over_torch']} | "
              f"{mb(r['torch_saved_input_bytes'])} | {mb(r['graphopt_saved_input_bytes'])} | "
              f"{mb(r['graphopt_lower_bound_bytes'])} | {mb(r['graphopt_arena_bytes'])} | "
              f"{r['graphopt_forward_nodes']}/{r['graphopt_backward_nodes']} | {r['graphopt_grad_s']} |")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"rows": rows, "torch": torch.__version__}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
