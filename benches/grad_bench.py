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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", default=os.environ.get("GRAPHOPT") or next(
        (str(p) for p in [ROOT / "target/release/graphopt", ROOT / "target/debug/graphopt"]
         if p.exists()), "graphopt"))
    ap.add_argument("--models", default="resnet50,bert_base,gpt2")
    ap.add_argument("--json", default=str(ROOT / "benches" / "results" / "grad.json"))
    a = ap.parse_args()
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
