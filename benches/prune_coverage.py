#!/usr/bin/env python3
"""`graphopt prune --ratio 0.3` on the torchvision and transformers families, both exporters (issue 22).

    /path/to/venv/bin/python benches/prune_coverage.py [--graphopt target/release/graphopt] [-k REGEX]

Exports each family with random weights (no hub) through the TorchScript exporter
(opset 17) and the dynamo exporter (opset 18) into benches/models/prune/, prunes it
with `graphopt prune --ratio 0.3 --calibration` (the export's inputs), and checks the
output in onnxruntime. Writes benches/results/prune_coverage.md and .json: per model
the groups found (channels / heads) and pruned, what was left alone, parameters and
FLOPs after / before, the error before fine-tuning, and whether onnxruntime runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(HERE, "models", "prune")

FAMILIES = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
            "convnext_tiny", "vit_b_16", "bert", "gpt2", "t5_encoder", "whisper_encoder"]

EXPORT = r'''
import sys, warnings, torch, numpy as np
warnings.simplefilter("ignore")
name, exporter, path = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(2)
import torch.nn as nn
class W(nn.Module):
    def __init__(s, m, f): super().__init__(); s.m = m; s.f = f
    def forward(s, *a): return s.f(s.m, *a)
B, S = 1, 16
if name in ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
            "convnext_tiny", "vit_b_16"):
    import torchvision
    model = getattr(torchvision.models, name)(weights=None).eval()
    if name == "vit_b_16":
        # torchvision zeroes the classifier: the logits would not move.
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    args = (torch.randn(B, 3, 224, 224),); names = ["input"]
elif name == "bert":
    from transformers import BertConfig, BertModel
    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, attn_implementation="eager")
    model = W(BertModel(cfg).eval(), lambda m, ids, mask: m(input_ids=ids, attention_mask=mask).last_hidden_state)
    args = (torch.randint(0, 30000, (B, S)), torch.ones(B, S, dtype=torch.int64)); names = ["input_ids", "attention_mask"]
elif name == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=256, n_layer=4, n_head=4, use_cache=False, attn_implementation="eager")
    model = W(GPT2LMHeadModel(cfg).eval(), lambda m, ids, mask: m(input_ids=ids, attention_mask=mask, use_cache=False).logits)
    args = (torch.randint(0, 50000, (B, S)), torch.ones(B, S, dtype=torch.int64)); names = ["input_ids", "attention_mask"]
elif name == "t5_encoder":
    from transformers import T5Config, T5EncoderModel
    model = W(T5EncoderModel(T5Config(d_model=256, d_ff=1024, num_layers=4, num_heads=4)).eval(),
              lambda m, ids, mask: m(input_ids=ids, attention_mask=mask).last_hidden_state)
    args = (torch.randint(0, 32000, (B, S)), torch.ones(B, S, dtype=torch.int64)); names = ["input_ids", "attention_mask"]
elif name == "whisper_encoder":
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    cfg = WhisperConfig(d_model=256, encoder_layers=4, encoder_attention_heads=4, encoder_ffn_dim=1024,
                        max_source_positions=100, attn_implementation="eager")
    model = W(WhisperEncoder(cfg).eval(), lambda m, x: m(x).last_hidden_state)
    args = (torch.randn(B, 80, 200),); names = ["input_features"]
else:
    raise SystemExit(f"unknown family {name}")
kw = dict(input_names=names, output_names=["output"])
if exporter == "ts":
    torch.onnx.export(model, args, path, opset_version=17, dynamo=False, **kw)
else:
    torch.onnx.export(model, args, path, opset_version=18, dynamo=True, external_data=False, **kw)
np.savez(path[:-5] + ".inputs.npz", **{n: a.numpy() for n, a in zip(names, args)})
'''


def export(name, exporter):
    path = os.path.join(OUT, f"{name}.{exporter}.onnx")
    if not os.path.exists(path):
        script = os.path.join(OUT, ".export.py")
        with open(script, "w") as f:
            f.write(EXPORT)
        p = subprocess.run([sys.executable, script, name, exporter, path], capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(path):
            return None, (p.stderr.strip().splitlines() or ["export failed"])[-1][:200]
    return path, None


def ort_runs(src, dst, inputs):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    feeds = dict(np.load(inputs))
    s = ort.InferenceSession(dst, so, providers=["CPUExecutionProvider"])
    r = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    got = s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})
    want = r.run(None, {i.name: feeds[i.name] for i in r.get_inputs()})
    num = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in zip(got, want))
    den = sum(float(np.sum(w.astype(np.float64) ** 2)) for w in want)
    return (num / max(den, 1e-30)) ** 0.5


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt", default=os.path.join(REPO, "target-release/release/graphopt"))
    ap.add_argument("--ratio", default="0.3")
    ap.add_argument("-k")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rows = []
    for fam in FAMILIES:
        for exporter in ("ts", "dynamo"):
            name = f"{fam}.{exporter}"
            if args.k and not re.search(args.k, name):
                continue
            path, why = export(fam, exporter)
            row = {"model": name}
            if path is None:
                row["status"] = f"export failed: {why}"
                rows.append(row)
                print(name, row["status"], flush=True)
                continue
            inputs = path[:-5] + ".inputs.npz"
            dst = os.path.join(OUT, f"{name}.pruned.onnx")
            rep = os.path.join(OUT, f"{name}.prune.json")
            t0 = time.time()
            p = subprocess.run([args.graphopt, "prune", path, "-o", dst, "--ratio", args.ratio,
                                "--calibration", inputs, "--report", rep], capture_output=True, text=True)
            row["seconds"] = round(time.time() - t0, 2)
            if p.returncode != 0:
                row["status"] = "refused: " + p.stderr.strip().splitlines()[-1][:300]
                rows.append(row)
                print(name, row["status"], flush=True)
                continue
            r = json.load(open(rep))
            groups = r["groups"]
            row.update({
                "groups": len(groups),
                "head_groups": sum(g["kind"] == "heads" for g in groups),
                "pruned": sum(g["removed"] > 0 for g in groups),
                "left_alone": len(r["left_alone"]),
                "left_alone_reasons": sorted({re.sub(r"'[^']*'", "'…'", why) for _, why in r["left_alone"]})[:8],
                "params_ratio": round(r["params_ratio"], 4),
                "flops_ratio": None if r["flops_ratio"] is None else round(r["flops_ratio"], 4),
                "error": (r.get("error") or {}).get("rel_l2"),
            })
            try:
                row["ort_rel_l2"] = ort_runs(path, dst, inputs)
                row["status"] = "ok"
            except Exception as ex:  # noqa: BLE001
                row["status"] = "onnxruntime: " + str(ex).splitlines()[0][:200]
            rows.append(row)
            print(name, {k: v for k, v in row.items() if k != "left_alone_reasons"}, flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "prune_coverage.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = [f"# `graphopt prune --ratio {args.ratio}` coverage (benches/prune_coverage.py)", "",
             "| model | groups (heads) | pruned | left alone | params after/before | FLOPs after/before | "
             "error before fine-tuning | onnxruntime |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | | | | | | | {r.get('status')} |")
            continue
        lines.append(f"| {r['model']} | {r['groups']} ({r['head_groups']}) | {r['pruned']} | {r['left_alone']} | "
                     f"{r['params_ratio']:.3f} | {r['flops_ratio']} | {r['error']:.3g} | runs (rel L2 {r['ort_rel_l2']:.3g} vs original) |")
    lines += ["", "Why groups were left alone (names elided):", ""]
    for r in rows:
        for why in r.get("left_alone_reasons", []):
            lines.append(f"- {r['model']}: {why}")
    with open(os.path.join(HERE, "results", "prune_coverage.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
