#!/usr/bin/env python3
"""Mixed precision: graphopt vs onnxconverter-common, side by side, same models, same run.

    cargo build --release -p graphopt
    pip install onnxconverter-common
    python3 benches/precision_bench.py --graphopt target/release/graphopt [-k REGEX] [--no-generate]

Models: testdata/models (the fp32 ones onnxruntime runs), pretrained OCR and speech models
shipped in PyPI packages (benches/pypi_models.py), plus larger ones made on
first use into benches/models/ (git-ignored): torchvision CNNs (resnet50,
mobilenet_v2; shared with simplify_bench.py), BERT-base and GPT-2 from both
exporters (shared), ViT-base, a T5-small encoder, a Whisper encoder, a DB-style
text detector (resnet18 + FPN + Resize + sigmoid head, PaddleOCR-like) and a
scripted model with If subgraphs. Random seeded weights; every model has an
`.inputs.npz` beside it.

Per model and tool: weights bytes, Cast count, whether onnxruntime (CPU, graph
optimizations off) loads and runs the output, and the error against the fp32
model on the same inputs (rel L2 over all float outputs, max abs).
Tools: `graphopt --precision fp16`, `graphopt --precision fp16 --validate`,
`graphopt --precision fp16-weights`, `graphopt --precision bf16`, and
`onnxconverter_common.float16.convert_float_to_float16(model, keep_io_types=True)`.

Writes benches/results/precision.json and benches/results/precision.md (the
table, also printed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(REPO, "benches", "models")
RESULTS = os.path.join(REPO, "benches", "results")
sys.path.insert(0, os.path.join(REPO, "tests-py"))
from _common import resolve_graphopt  # noqa: E402

ELEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}

# ----------------------------------------------------------------- models

TORCH_CHILD = r"""
import os, sys, warnings, torch
warnings.simplefilter("ignore")
name, exporter, path = sys.argv[1], sys.argv[2], sys.argv[3]
# Optional batch and sequence length (run_bench.py exports batch 8 too).
B = int(sys.argv[4]) if len(sys.argv) > 4 else 1
S = int(sys.argv[5]) if len(sys.argv) > 5 else 16
torch.manual_seed(0)
torch.set_num_threads(2)
import torch.nn as nn
import torch.nn.functional as F

class W(nn.Module):
    def __init__(s, m, f): super().__init__(); s.m = m; s.f = f
    def forward(s, *a): return s.f(s.m, *a)

if name in ("resnet50", "mobilenet_v2"):
    import torchvision
    model = getattr(torchvision.models, name)(weights=None).eval()
    args = (torch.randn(B, 3, 224, 224),); names = ["input"]
elif name == "bert_base":
    from transformers import BertConfig, BertModel
    model = W(BertModel(BertConfig(attn_implementation="eager")).eval(),
              lambda m, ids, mask: m(input_ids=ids, attention_mask=mask).last_hidden_state)
    args = (torch.randint(0, 30000, (B, S)), torch.ones(B, S, dtype=torch.int64))
    names = ["input_ids", "attention_mask"]
elif name == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    model = W(GPT2LMHeadModel(GPT2Config(use_cache=False, attn_implementation="eager")).eval(),
              lambda m, ids, mask: m(input_ids=ids, attention_mask=mask, use_cache=False).logits)
    args = (torch.randint(0, 50000, (B, S)), torch.ones(B, S, dtype=torch.int64))
    names = ["input_ids", "attention_mask"]
elif name == "vit_base":
    from transformers import ViTConfig, ViTModel
    model = W(ViTModel(ViTConfig(attn_implementation="eager"), add_pooling_layer=False).eval(),
              lambda m, x: m(pixel_values=x).last_hidden_state)
    args = (torch.randn(1, 3, 224, 224),); names = ["pixel_values"]
elif name == "t5_small_encoder":
    from transformers import T5Config, T5EncoderModel
    model = W(T5EncoderModel(T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8)).eval(),
              lambda m, ids, mask: m(input_ids=ids, attention_mask=mask).last_hidden_state)
    args = (torch.randint(0, 32000, (1, 32)), torch.ones(1, 32, dtype=torch.int64))
    names = ["input_ids", "attention_mask"]
elif name == "whisper_base_encoder":
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    cfg = WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
                        max_source_positions=750, attn_implementation="eager")
    model = W(WhisperEncoder(cfg).eval(), lambda m, x: m(x).last_hidden_state)
    args = (torch.randn(1, 80, 1500),); names = ["input_features"]
elif name == "db_detector":
    # DB-style text detector (PaddleOCR's det model shape): resnet18 backbone,
    # FPN with nearest/bilinear Resize, probability head with sigmoid.
    import torchvision
    class DB(nn.Module):
        def __init__(s):
            super().__init__()
            r = torchvision.models.resnet18(weights=None)
            s.stem = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool)
            s.l1, s.l2, s.l3, s.l4 = r.layer1, r.layer2, r.layer3, r.layer4
            s.lat = nn.ModuleList([nn.Conv2d(c, 96, 1) for c in (64, 128, 256, 512)])
            s.out = nn.ModuleList([nn.Conv2d(96, 24, 3, padding=1) for _ in range(4)])
            s.head = nn.Sequential(nn.Conv2d(96, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(),
                                   nn.ConvTranspose2d(24, 24, 2, 2), nn.BatchNorm2d(24), nn.ReLU(),
                                   nn.ConvTranspose2d(24, 1, 2, 2))
        def forward(s, x):
            c1 = s.l1(s.stem(x)); c2 = s.l2(c1); c3 = s.l3(c2); c4 = s.l4(c3)
            p4 = s.lat[3](c4)
            p3 = s.lat[2](c3) + F.interpolate(p4, scale_factor=2.0, mode="nearest")
            p2 = s.lat[1](c2) + F.interpolate(p3, scale_factor=2.0, mode="nearest")
            p1 = s.lat[0](c1) + F.interpolate(p2, scale_factor=2.0, mode="nearest")
            fs = [F.interpolate(o(p), size=p1.shape[2:], mode="bilinear", align_corners=False)
                  for o, p in zip(s.out, (p1, p2, p3, p4))]
            return torch.sigmoid(s.head(torch.cat(fs, 1)))
    model = DB().eval()
    args = (torch.randn(1, 3, 320, 320),); names = ["image"]
elif name == "if_branches":
    # Data-dependent control flow: the TorchScript exporter emits If nodes
    # whose branches hold MatMuls, Softmax and LayerNorm.
    class Gate(nn.Module):
        def __init__(s):
            super().__init__()
            s.a = nn.Linear(256, 256); s.b = nn.Linear(256, 256); s.n = nn.LayerNorm(256)
        def forward(s, x):
            h = s.a(x)
            if bool(h.mean() > 0):
                y = torch.softmax(s.b(h), -1) * 4.0
            else:
                y = s.n(s.b(torch.relu(h)))
            return y + h
    model = torch.jit.script(Gate().eval())
    args = (torch.randn(8, 256),); names = ["x"]
else:
    raise SystemExit(f"unknown model {name}")
with torch.no_grad():
    if exporter == "ts":
        torch.onnx.export(model, args, path, dynamo=False, opset_version=14 if name != "if_branches" else 17,
                          input_names=names)
    else:
        torch.onnx.export(model, args, path, dynamo=True, opset_version=18, input_names=names,
                          external_data=False)
import numpy as np
np.savez(path[:-5] + ".inputs.npz", **{n: a.numpy() for n, a in zip(names, args)})
"""

GENERATED = [
    ("resnet50", "ts"), ("mobilenet_v2", "ts"), ("vit_base", "ts"),
    ("bert_base", "ts"), ("bert_base", "dynamo"), ("gpt2", "ts"), ("gpt2", "dynamo"),
    ("t5_small_encoder", "ts"), ("whisper_base_encoder", "ts"),
    ("db_detector", "ts"), ("if_branches", "ts"),
]


def export_model(name: str, exporter: str, path: str, timeout: float, batch: int = 1,
                 seq: int = 16) -> str | None:
    """Exports one model of TORCH_CHILD to `path` (and its `.inputs.npz`) with
    seeded random weights; None when it worked, else why not."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"# exporting {os.path.basename(path)} ...", flush=True)
    # A file, not `-c`: torch.jit.script needs the source of the classes.
    child = os.path.join(os.path.dirname(path), ".precision_export.py")
    with open(child, "w") as f:
        f.write(TORCH_CHILD)
    try:
        p = subprocess.run([sys.executable, child, name, exporter, path, str(batch), str(seq)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    if p.returncode != 0:
        return (p.stderr.strip().splitlines() or ["?"])[-1][:200]
    return None


def generated_models(generate: bool, timeout: float) -> list[tuple[str, str, str]]:
    os.makedirs(MODELS_DIR, exist_ok=True)
    out = []
    for name, exporter in GENERATED:
        path = os.path.join(MODELS_DIR, f"{name}.{exporter}.onnx")
        inputs = path[:-5] + ".inputs.npz"
        if not (os.path.exists(path) and os.path.exists(inputs)):
            if not generate:
                continue
            why = export_model(name, exporter, path, timeout)
            if why:
                print(f"#   failed: {why}")
                continue
        out.append((f"{name}.{exporter}", path, inputs))
    return out


def testdata_models() -> list[tuple[str, str, str]]:
    d = os.path.join(REPO, "testdata", "models")
    with open(os.path.join(d, "MANIFEST.json")) as f:
        manifest = json.load(f)
    out = []
    for e in manifest["models"]:
        if not e.get("runs_in_ort") or "fp16" in e["name"]:
            continue
        out.append((f"testdata/{e['name']}", os.path.join(d, e["file"]), os.path.join(d, e["inputs"])))
    return out


# ----------------------------------------------------------------- measures

def weight_bytes(model, only=None) -> int:
    """Initializer bytes (subgraphs included); `only`: that element type only."""
    total = 0

    def walk(g):
        nonlocal total
        for t in g.initializer:
            if only is not None and t.data_type != only:
                continue
            n = int(np.prod(t.dims)) if len(t.dims) else 1
            total += n * ELEM_BYTES.get(t.data_type, 4)
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for s in a.graphs:
                        walk(s)
                elif a.type == onnx.AttributeProto.TENSOR and n.op_type == "Constant":
                    # Some exporters (paddle2onnx) keep every weight in a Constant node.
                    t = a.t
                    if only is None or t.data_type == only:
                        k = int(np.prod(t.dims)) if len(t.dims) else 1
                        total += k * ELEM_BYTES.get(t.data_type, 4)
    walk(model.graph)
    return total


def cast_count(model) -> int:
    count = 0

    def walk(g):
        nonlocal count
        for n in g.node:
            count += n.op_type == "Cast"
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for s in a.graphs:
                        walk(s)
    walk(model.graph)
    return count


def ort_run(path: str, feeds: dict):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return s.run(None, {k: v for k, v in feeds.items() if k in names})


def error(ref, got) -> dict:
    num = den = 0.0
    max_abs = 0.0
    for a, b in zip(ref, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f":
            continue
        if a.shape != b.shape:
            return {"rel_l2": float("inf"), "max_abs": float("inf")}
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        same = (np.isnan(a64) & np.isnan(b64)) | (a64 == b64)
        d = np.where(same, 0.0, np.abs(a64 - b64))
        d = np.where(np.isnan(d), np.inf, d)
        max_abs = max(max_abs, float(d.max()) if d.size else 0.0)
        num += float(np.sum(d * d))
        den += float(np.sum(np.where(np.isfinite(a64), a64, 0.0) ** 2))
    rel = (num / den) ** 0.5 if den > 0 else num ** 0.5
    return {"rel_l2": rel, "max_abs": max_abs}


def measure(path: str, feeds: dict, ref) -> dict:
    m = onnx.load(path)
    r = {"weights_bytes": weight_bytes(m), "casts": cast_count(m)}
    try:
        t0 = time.perf_counter()
        got = ort_run(path, feeds)
        r["ort_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        r["ort"] = True
        r.update(error(ref, got))
    except Exception as e:  # noqa: BLE001
        r["ort"] = False
        r["ort_error"] = str(e).splitlines()[0][:300]
    return r


def run_graphopt(graphopt, src, dst, precision, validate, timeout):
    rep = dst + ".report.json"
    cmd = [*graphopt, "optimize", src, "-o", dst, "--precision", precision, "--report", rep, "-q"]
    if validate:
        # best-effort: a model tract cannot run is lowered unvalidated and
        # reported as such; ending over tolerance still fails the run.
        cmd.append("--validate=best-effort")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        return None, {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300], "time_s": round(dt, 2)}
    with open(rep) as f:
        report = json.load(f)["precision"]
    info = {"time_s": round(dt, 2),
            "kept_weights": [k["name"] for k in report.get("kept_fp32_weights", [])],
            "fp32_read_kept": any(w.startswith("weights only fp32 nodes read stay fp32")
                                  for w in report.get("warnings", []))}
    if validate:
        info["validation"] = report.get("validation") or {}
        if report.get("validation_skipped"):
            info["validation"]["skipped"] = report["validation_skipped"]
    return dst, info


def run_converter(src, dst, timeout):
    code = (
        "import sys, onnx\n"
        "from onnxconverter_common import float16\n"
        "m = onnx.load(sys.argv[1])\n"
        "m = float16.convert_float_to_float16(m, keep_io_types=True)\n"
        "onnx.save(m, sys.argv[2])\n"
    )
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", code, src, dst], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, {"error": "timeout"}
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        return None, {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300], "time_s": round(dt, 2)}
    return dst, {"time_s": round(dt, 2)}


TOOLS = [
    ("graphopt fp16", lambda g, s, d, t: run_graphopt(g, s, d, "fp16", False, t)),
    ("graphopt fp16 --validate", lambda g, s, d, t: run_graphopt(g, s, d, "fp16", True, t)),
    ("graphopt fp16-weights", lambda g, s, d, t: run_graphopt(g, s, d, "fp16-weights", False, t)),
    ("graphopt bf16", lambda g, s, d, t: run_graphopt(g, s, d, "bf16", False, t)),
    ("onnxconverter-common fp16", lambda g, s, d, t: run_converter(s, d, t)),
]


# ----------------------------------------------------------------- main

def fmt_bytes(n):
    for u in ("B", "KB", "MB", "GB"):
        if n < 1000 or u == "GB":
            return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
        n /= 1000
    return str(n)


def cell(r):
    if r is None:
        return "—"
    if "error" in r and "ort" not in r:
        return "fails: " + r["error"][:40].replace("|", "/")
    if not r.get("ort"):
        return f"{r['ratio']:.2f}x, {r['casts']} Casts, **ORT fails**"
    return f"{r['ratio']:.2f}x, {r['casts']} Casts, {r['rel_l2']:.1e} / {r['max_abs']:.1e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("-k", help="only models whose name matches this regex")
    ap.add_argument("--no-generate", action="store_true", help="use only models already in benches/models")
    ap.add_argument("--sets", default="testdata,generated,pypi",
                    help="comma-separated model sets: testdata, generated (torch exports), "
                         "pypi (pretrained OCR/speech models from PyPI packages, benches/pypi_models.py)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--skip-tools", default="",
                    help="comma-separated tool labels to leave out, e.g. 'graphopt fp16 --validate'")
    ap.add_argument("--json", default=os.path.join(RESULTS, "precision.json"))
    ap.add_argument("--md", default=os.path.join(RESULTS, "precision.md"))
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    sets = set(args.sets.split(","))
    models = []
    if "testdata" in sets:
        models += testdata_models()
    if "generated" in sets:
        models += generated_models(not args.no_generate, args.timeout)
    if "pypi" in sets:
        from pypi_models import pypi_models
        models += pypi_models(fetch=not args.no_generate)
    if args.k:
        models = [m for m in models if re.search(args.k, m[0])]
    results = []
    with tempfile.TemporaryDirectory(prefix="precision-bench-") as tmp:
        for name, path, inputs in models:
            feeds = dict(np.load(inputs))
            base = onnx.load(path)
            row = {"model": name, "weights_bytes": weight_bytes(base), "casts": cast_count(base),
                   "fp32_weights_bytes": weight_bytes(base, onnx.TensorProto.FLOAT),
                   "file_bytes": os.path.getsize(path)}
            fp32_sizes = {t.name: 4 * (int(np.prod(t.dims)) if len(t.dims) else 1)
                          for t in base.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
            del base
            try:
                ref = ort_run(path, feeds)
            except Exception as e:  # noqa: BLE001
                print(f"# {name}: onnxruntime cannot run the fp32 model: {e}")
                continue
            row["tools"] = {}
            for label, fn in TOOLS:
                if label in args.skip_tools.split(","):
                    continue
                dst = os.path.join(tmp, re.sub(r"\W+", "_", f"{name}_{label}") + ".onnx")
                try:
                    out, info = fn(graphopt, path, dst, args.timeout)
                except subprocess.TimeoutExpired:
                    out, info = None, {"error": "timeout"}
                r = dict(info)
                if out:
                    r.update(measure(out, feeds, ref))
                    r["ratio"] = r["weights_bytes"] / max(row["weights_bytes"], 1)
                    # Without the weights the report keeps fp32 on purpose
                    # (windows, bases, quantization parameters, constants
                    # computed on at run time).
                    kept = sum(fp32_sizes.get(n, 0) for n in r.get("kept_weights", []))
                    r["ratio_without_kept"] = (r["weights_bytes"] - kept) / max(row["weights_bytes"] - kept, 1)
                    os.remove(out)
                row["tools"][label] = r
                status = cell(r) if out else "fails: " + r.get("error", "?")
                print(f"{name:40} {label:28} {status}", flush=True)
            results.append(row)

    goals = check_goals(results)
    os.makedirs(RESULTS, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"versions": versions(), "models": results, "goals": goals}, f, indent=1)
        f.write("\n")
    md = table(results, goals)
    with open(args.md, "w") as f:
        f.write(md)
    print()
    print(md)
    return 0 if all(g["ok"] for g in goals) else 1


def check_goals(results) -> list[dict]:
    g_runs = [r["model"] for r in results if not all(
        (t := r["tools"].get(k)) and t.get("ort") for k in
        ("graphopt fp16", "graphopt fp16 --validate", "graphopt fp16-weights", "graphopt bf16")
        if k in r["tools"])]
    # fp32 models: weights over 4 KB, at least 90% of them fp32 (not the int8 one).
    heavy = [r for r in results if r["weights_bytes"] > 4096
             and r["fp32_weights_bytes"] >= 0.9 * r["weights_bytes"]]
    g_ratio = [r["model"] for r in heavy if any(
        (t := r["tools"].get(k)) and t.get("ort") and t.get("ratio_without_kept", t["ratio"]) > 0.51
        and not t.get("fp32_read_kept")
        for k in ("graphopt fp16", "graphopt fp16-weights", "graphopt bf16"))]
    worse = []
    for r in results:
        c, g = r["tools"].get("onnxconverter-common fp16"), r["tools"].get("graphopt fp16")
        if c and c.get("ort") and g and g.get("ort") and g["rel_l2"] > c["rel_l2"] * 1.05 + 1e-6:
            worse.append(f"{r['model']} ({g['rel_l2']:.2e} vs {c['rel_l2']:.2e})")
    val = []
    for r in results:
        if "graphopt fp16 --validate" not in r["tools"]:
            continue
        v = (r["tools"].get("graphopt fp16 --validate") or {}).get("validation") or {}
        if v.get("skipped"):
            continue
        if not v.get("ok"):
            val.append(r["model"])
    fw = [f"{r['model']} ({t['rel_l2']:.1e})" for r in results
          if (t := r["tools"].get("graphopt fp16-weights")) and t.get("ort") and t["rel_l2"] > 1e-3]
    skipped = [r["model"] for r in results if
               ((r["tools"].get("graphopt fp16 --validate") or {}).get("validation") or {}).get("skipped")]
    return [
        {"goal": "graphopt's output loads and runs in onnxruntime on every model (all 4 modes)",
         "ok": not g_runs, "failing": g_runs},
        {"goal": "weights <= 0.51x for fp32 models (fp16, fp16-weights, bf16), leaving out the weights the "
                 "report keeps fp32 and why (and fp16/bf16 runs whose report says storing fp32-read weights "
                 "low would raise weights + arena)", "ok": not g_ratio,
         "failing": g_ratio},
        {"goal": "graphopt fp16 error (rel L2) no worse than the converter's where the converter's output runs",
         "ok": not worse, "failing": worse},
        {"goal": "fp16-weights error (rel L2) <= 1e-3", "ok": not fw, "failing": fw},
        {"goal": "--validate: within tolerance on every model tract can run", "ok": not val, "failing": val,
         "not_validated": skipped},
    ]


def table(results, goals) -> str:
    lines = [
        "Each cell: weights vs fp32, Cast count, rel L2 / max abs error vs fp32 in onnxruntime (CPU).",
        "",
        "| model | fp32 weights | graphopt fp16 | graphopt fp16 --validate | graphopt fp16-weights | graphopt bf16 | onnxconverter-common fp16 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["tools"]
        v = (t.get("graphopt fp16 --validate") or {}).get("validation") or {}
        vcell = cell(t.get("graphopt fp16 --validate"))
        if v.get("skipped"):
            vcell += " (not validated: tract)"
        elif v:
            kept = len(v.get("kept_nodes", [])) + len(v.get("kept_weights", []))
            vcell += f" ({'ok' if v.get('ok') else 'NOT ok'}, kept {kept})"
        lines.append(f"| {r['model']} | {fmt_bytes(r['weights_bytes'])} | {cell(t.get('graphopt fp16'))} | {vcell} | "
                     f"{cell(t.get('graphopt fp16-weights'))} | {cell(t.get('graphopt bf16'))} | "
                     f"{cell(t.get('onnxconverter-common fp16'))} |")
    n = len(results)
    conv_runs = sum(1 for r in results if (r["tools"].get("onnxconverter-common fp16") or {}).get("ort"))
    lines += ["", f"onnxconverter-common's output runs in onnxruntime on {conv_runs} of {n} models.", ""]
    for g in goals:
        lines.append(f"- {'PASS' if g['ok'] else 'FAIL'}: {g['goal']}"
                     + (f" — failing: {', '.join(g['failing'])}" if g["failing"] else "")
                     + (f" (not validated, tract cannot run: {', '.join(g['not_validated'])})"
                        if g.get("not_validated") else ""))
    return "\n".join(lines) + "\n"


def versions() -> dict:
    import onnxruntime
    out = {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    try:
        import onnxconverter_common
        out["onnxconverter_common"] = onnxconverter_common.__version__
    except Exception:  # noqa: BLE001
        pass
    return out


if __name__ == "__main__":
    sys.exit(main())
