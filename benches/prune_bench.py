#!/usr/bin/env python3
"""`graphopt prune` against Torch-Pruning, same models, same weights, same ratio and criterion (issue 22).

    /path/to/venv/bin/python benches/prune_bench.py [--graphopt target-release/release/graphopt]
        [--ratio 0.3] [--models resnet50,mobilenet_v2,vit_b_16,bert_base] [--no-latency]

Torch-Pruning 1.6.1 (pinned) is installed on first use into its own folder,
benches/models/prune/tp-1.6.1 (`pip install --target ... --no-deps`: it uses this venv's torch),
and runs in a child process with that folder first on its path.

For each model the child builds the torch module (random weights, seed 0), exports it once
(TorchScript exporter, opset 17, dynamic batch) for graphopt, then prunes the module in place
with Torch-Pruning: `MetaPruner`, `GroupMagnitudeImportance(p=1)` (L1, as `--criterion l1`),
`pruning_ratio=R` per group (not global), the classifier ignored (graphopt keeps graph outputs),
attention heads removed whole where the model has them (`prune_num_heads=True`,
`head_pruning_ratio=R`, `prune_head_dims=False`), which is what graphopt does. Then
`graphopt prune ONNX --ratio R --criterion l1`. Both on the same input (batch 1):

  * parameters and FLOPs after / before (Torch-Pruning counts MACs with its own counter, graphopt
    FLOPs at batch 1; the ratios compare);
  * time to prune (Torch-Pruning: building the dependency graph and the step; graphopt: the
    whole command with `--no-measure`, load and save included);
  * output error before fine-tuning, relative L2 against the unpruned model (torch's outputs for
    Torch-Pruning, onnxruntime's for graphopt);
  * the manual fix-ups each tool needed: the lines this script writes for Torch-Pruning beyond the
    pruner call (head counts, attributes the model's forward reads), none for graphopt.

With latency (default), resnet50 and bert_base at batch 8 run before and after pruning (also
pruned with `--round-to 16`) in graphopt's runtime and in onnxruntime (2 threads, median of 5;
run_bench.py's harness): the goal is a latency fall of at least 0.8x the FLOP fall.

Writes benches/results/prune.md and prune.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(HERE, "models", "prune", "bench")
TP_VERSION = "1.6.1"
TP_DIR = os.path.join(HERE, "models", "prune", f"tp-{TP_VERSION}")
LATENCY_MODELS = ("resnet50", "bert_base")
# The latency rows also prune with `--round-to` this (kernel-friendly counts).
ROUND_TO = 16

CHILD = r'''
import json, os, sys, time, warnings
warnings.simplefilter("ignore")
import numpy as np, torch, torch.nn as nn
import torch_pruning as tp
name, ratio, onnx_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(2)
fixups = []
num_heads = {}
ignored = []
if name in ("resnet50", "mobilenet_v2", "vit_b_16"):
    import torchvision
    model = getattr(torchvision.models, name)(weights=None).eval()
    if name == "vit_b_16":
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zeroes it
    x = (torch.randn(1, 3, 224, 224),)
    x8 = (torch.randn(8, 3, 224, 224),)
    names = ["input"]
    ignored = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == 1000]
    if name == "vit_b_16":
        for m in model.modules():
            if isinstance(m, nn.MultiheadAttention):
                num_heads[m] = m.num_heads
        fixups.append("num_heads={mha: mha.num_heads for every nn.MultiheadAttention}")
    wrap = lambda out: out
else:
    from transformers import BertConfig, BertModel
    from transformers.models.bert.modeling_bert import BertSelfAttention
    class W(nn.Module):
        def __init__(s, m): super().__init__(); s.m = m
        def forward(s, ids, mask): return s.m(input_ids=ids, attention_mask=mask).last_hidden_state
    model = W(BertModel(BertConfig(attn_implementation="eager"), add_pooling_layer=False).eval()).eval()
    x = (torch.randint(0, 30000, (1, 128)), torch.ones(1, 128, dtype=torch.int64))
    x8 = (torch.randint(0, 30000, (8, 128)), torch.ones(8, 128, dtype=torch.int64))
    names = ["input_ids", "attention_mask"]
    for m in model.modules():
        if isinstance(m, BertSelfAttention):
            num_heads[m.query] = m.num_attention_heads
            num_heads[m.key] = m.num_attention_heads
            num_heads[m.value] = m.num_attention_heads
    fixups.append("num_heads={query/key/value Linear: num_attention_heads} for every BertSelfAttention")
    # The last hidden state is the output: its width stays (graphopt keeps graph outputs).
    ignored = [model.m.encoder.layer[-1].output.dense]
    fixups.append("ignored_layers=[the last layer's output projection] (the output keeps its width)")
with torch.no_grad():
    y0 = model(*x)
dyn = {n: {0: "batch"} for n in names}
torch.onnx.export(model, x, onnx_path, opset_version=17, dynamo=False, input_names=names,
                  output_names=["output"], dynamic_axes={**dyn, "output": {0: "batch"}})
np.savez(onnx_path[:-5] + ".inputs.npz", **{n: a.numpy() for n, a in zip(names, x)})
np.savez(onnx_path[:-5] + ".b8.inputs.npz", **{n: a.numpy() for n, a in zip(names, x8)})
macs0, params0 = tp.utils.count_ops_and_params(model, x)
t0 = time.perf_counter()
kw = {}
if num_heads:
    kw = dict(num_heads=num_heads, prune_num_heads=True, prune_head_dims=False, head_pruning_ratio=ratio)
pruner = tp.pruner.MetaPruner(model, x, importance=tp.importance.GroupMagnitudeImportance(p=1),
                              pruning_ratio=ratio, global_pruning=False, ignored_layers=ignored, **kw)
pruner.step()
seconds = time.perf_counter() - t0
if name == "vit_b_16":
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            m.num_heads = pruner.num_heads[m]
            m.head_dim = m.embed_dim // m.num_heads
    model.hidden_dim = model.conv_proj.out_channels
    fixups.append("after the step: mha.num_heads, mha.head_dim = embed_dim // num_heads")
    fixups.append("after the step: model.hidden_dim = conv_proj.out_channels (read by forward)")
if name == "bert_base":
    for m in model.modules():
        if isinstance(m, BertSelfAttention):
            m.num_attention_heads = pruner.num_heads[m.query]
            m.attention_head_size = m.query.out_features // m.num_attention_heads
            m.all_head_size = m.query.out_features
    fixups.append("after the step: num_attention_heads, attention_head_size, all_head_size per layer")
macs1, params1 = tp.utils.count_ops_and_params(model, x)
with torch.no_grad():
    y1 = model(*x)
err = float(torch.linalg.norm((y1 - y0).double()) / torch.linalg.norm(y0.double()))
json.dump({"params_before": int(params0), "params_after": int(params1), "macs_before": int(macs0),
           "macs_after": int(macs1), "seconds": seconds, "error": err, "fixups": fixups}, sys.stdout)
'''


def ensure_tp():
    if os.path.isdir(os.path.join(TP_DIR, "torch_pruning")):
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", TP_DIR,
                    f"torch-pruning=={TP_VERSION}"], check=True)


def torch_pruning(name, ratio):
    path = os.path.join(OUT, f"{name}.onnx")
    script = os.path.join(OUT, ".tp_child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    env = dict(os.environ, PYTHONPATH=TP_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, script, name, str(ratio), path], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return path, {"status": "failed: " + (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["status"] = "ok"
    return path, r


def ort_outputs(path, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})


def graphopt_prune(graphopt, path, ratio, round_to=None):
    tag = f".r{round_to}" if round_to else ""
    dst = path[:-5] + f"{tag}.pruned.onnx"
    rep = path[:-5] + f"{tag}.prune.json"
    extra = ["--round-to", str(round_to)] if round_to else []
    t0 = time.perf_counter()
    p = subprocess.run([graphopt, "prune", path, "-o", dst, "--ratio", str(ratio), "--criterion", "l1",
                        "--no-measure", "--report", rep, *extra], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        return dst, {"status": "failed: " + (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    r = json.load(open(rep))
    feeds = dict(np.load(path[:-5] + ".inputs.npz"))
    want = ort_outputs(path, feeds)[0].astype(np.float64)
    got = ort_outputs(dst, feeds)[0].astype(np.float64)
    return dst, {"status": "ok", "params_before": r["params_before"], "params_after": r["params_after"],
                 "flops_before": r["flops_before"], "flops_after": r["flops_after"], "seconds": seconds,
                 "error": float(np.linalg.norm(got - want) / np.linalg.norm(want)),
                 "groups": len(r["groups"]), "head_groups": sum(g["kind"] == "heads" for g in r["groups"]),
                 "left_alone": len(r["left_alone"])}


def latency(graphopt, before, after, rounded):
    sys.path.insert(0, HERE)
    import run_bench as rb  # noqa: E402

    inputs = before[:-5] + ".b8.inputs.npz"
    out = {}
    for tag, path in (("before", before), ("after", after), ("after_round_to", rounded)):
        o = path[:-5] + ".out.npz"
        out[tag] = {"graphopt_ms": rb.run_graphopt([graphopt], path, inputs, o, 5, 2, 1800)["median_ms"],
                    "onnxruntime_ms": rb.run_ort(path, inputs, o, 5, 2, 1800)["median_ms"]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt", default=os.path.join(REPO, "target-release/release/graphopt"))
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--models", default="resnet50,mobilenet_v2,vit_b_16,bert_base")
    ap.add_argument("--no-latency", action="store_true")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    ensure_tp()
    rows = []
    for name in a.models.split(","):
        path, tpr = torch_pruning(name, a.ratio)
        row = {"model": name, "torch_pruning": tpr}
        if os.path.exists(path):
            dst, gr = graphopt_prune(a.graphopt, path, a.ratio)
            row["graphopt"] = gr
            if gr["status"] == "ok" and not a.no_latency and name in LATENCY_MODELS:
                rdst, rr = graphopt_prune(a.graphopt, path, a.ratio, ROUND_TO)
                row["graphopt_round_to"] = rr
                row["latency_b8"] = latency(a.graphopt, path, dst, rdst)
        print(json.dumps(row), flush=True)
        rows.append(row)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "prune.json"), "w") as f:
        json.dump({"ratio": a.ratio, "torch_pruning": TP_VERSION, "rows": rows}, f, indent=1)
    lines = [f"# `graphopt prune` vs Torch-Pruning {TP_VERSION}, ratio {a.ratio}, L1, per group "
             "(benches/prune_bench.py)", "",
             "| model | params after/before: graphopt / TP | FLOPs after/before: graphopt / TP (MACs) | "
             "time: graphopt / TP | error before fine-tuning: graphopt / TP | TP's manual fix-ups |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        g, t = r.get("graphopt", {}), r["torch_pruning"]
        if g.get("status") != "ok" or t.get("status") != "ok":
            lines.append(f"| {r['model']} | graphopt: {g.get('status')}; TP: {t.get('status')} | | | | |")
            continue
        fr = g["flops_after"] / g["flops_before"] if g["flops_before"] else float("nan")
        lines.append(
            f"| {r['model']} | {g['params_after'] / g['params_before']:.3f} / "
            f"{t['params_after'] / t['params_before']:.3f} | {fr:.3f} / {t['macs_after'] / t['macs_before']:.3f} | "
            f"{g['seconds']:.2f} s / {t['seconds']:.2f} s | {g['error']:.3g} / {t['error']:.3g} | "
            f"{'; '.join(t['fixups']) or 'none'} |")
    lat = [r for r in rows if "latency_b8" in r]
    if lat:
        lines += ["", "Latency at batch 8 (median of 5, 2 threads), after / before, against the FLOP ratio:", "",
                  "| model | FLOPs after/before | graphopt runtime | onnxruntime | fall / FLOP fall (goal >= 0.8) |",
                  "|---|---|---|---|---|"]
        for r in lat:
            L = r["latency_b8"]
            for label, g, key in ((r["model"], r["graphopt"], "after"),
                                  (f"{r['model']}, --round-to {ROUND_TO}", r["graphopt_round_to"], "after_round_to")):
                fr = g["flops_after"] / g["flops_before"]
                gx = L[key]["graphopt_ms"] / L["before"]["graphopt_ms"]
                ox = L[key]["onnxruntime_ms"] / L["before"]["onnxruntime_ms"]
                lines.append(f"| {label} | {fr:.3f} | {gx:.3f} ({L['before']['graphopt_ms']:.0f} -> "
                             f"{L[key]['graphopt_ms']:.0f} ms) | {ox:.3f} ({L['before']['onnxruntime_ms']:.0f} -> "
                             f"{L[key]['onnxruntime_ms']:.0f} ms) | graphopt {(1 - gx) / (1 - fr):.2f}, "
                             f"onnxruntime {(1 - ox) / (1 - fr):.2f} |")
    with open(os.path.join(HERE, "results", "prune.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
