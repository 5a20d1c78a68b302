#!/usr/bin/env python3
"""Single convolutions in graphopt's runtime beside onnxruntime CPU, same inputs, same thread
count, rounds interleaved (issue 20: the convolution paths of crates/exec/src/cpu).

    cargo build --release --bin graphopt
    python3 benches/conv_bench.py --graphopt NAME=target/release/graphopt [--graphopt OLD=path ...]
        [--rounds R] [--repeat N] [--threads T] [-k REGEX]

Each case is a one-node ONNX model (Conv or ConvTranspose, no bias, random weights, seeded),
written to benches/models/conv/ (git-ignored): resnet's 3x3 convolutions at batch 16 (56x56 to
7x7), a stride-2 3x3, the 7x7 stride-2 stem at batch 16 and 1, a 3x3 ConvTranspose, and the
weight gradient `graphopt grad` emits for resnet18's first 3x3 (input [64, 16, 56, 56], kernel
[64, 16, 56, 56], output [64, 64, 3, 3]). Per round every build and onnxruntime run each case in a
fresh process: `graphopt run --repeat N --threads T --json` (median of N) and an
InferenceSession (ORT_ENABLE_ALL, intra_op_num_threads=T; median of N after a warm-up, through
run_bench.py's child). Reported: each tool's best median over the rounds, GFLOP/s, the ratio to
onnxruntime, and graphopt's outputs against onnxruntime's (rel L2). Several `--graphopt` builds
give a before/after A/B beside the peer in one run. Writes benches/results/conv_bench.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import run_bench as rb  # noqa: E402  (the per-tool runners)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "benches", "models", "conv")
RESULTS = os.path.join(REPO, "benches", "results")

# (name, op, batch, in channels, out channels, size, kernel, stride, pad, dilation, threads or None)
CASES = [
    ("3x3 64ch 56x56 b16", "Conv", 16, 64, 64, 56, 3, 1, 1, 1, None),
    ("3x3 64ch 56x56 b16 1 thread", "Conv", 16, 64, 64, 56, 3, 1, 1, 1, 1),
    ("3x3 128ch 28x28 b16", "Conv", 16, 128, 128, 28, 3, 1, 1, 1, None),
    ("3x3 256ch 14x14 b16", "Conv", 16, 256, 256, 14, 3, 1, 1, 1, None),
    ("3x3 512ch 7x7 b16", "Conv", 16, 512, 512, 7, 3, 1, 1, 1, None),
    ("3x3 s2 64->128ch 56x56 b16", "Conv", 16, 64, 128, 56, 3, 2, 1, 1, None),
    ("7x7 s2 stem 3->64ch 224x224 b16", "Conv", 16, 3, 64, 224, 7, 2, 3, 1, None),
    ("7x7 s2 stem 3->64ch 224x224 b1", "Conv", 1, 3, 64, 224, 7, 2, 3, 1, None),
    ("ConvTranspose 3x3 64ch 56x56 b16", "ConvTranspose", 16, 64, 64, 56, 3, 1, 1, 1, None),
    ("weight gradient of a 3x3 64ch 56x56 b16, 1 thread", "Conv", 64, 16, 64, 56, 56, 1, 1, 1, 1),
]


def model(op, n, cin, cout, hw, k, s, p, d):
    """The one-node model, its input, and its multiply-add count x 2."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    if op == "Conv":
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.1
        oh = (hw + 2 * p - d * (k - 1) - 1) // s + 1
        flops = 2 * n * cout * oh * oh * cin * k * k
    else:
        w = rng.standard_normal((cin, cout, k, k)).astype(np.float32) * 0.1
        oh = (hw - 1) * s - 2 * p + d * (k - 1) + 1
        flops = 2 * n * cin * hw * hw * cout * k * k
    node = h.make_node(op, ["x", "W"], ["y"], strides=[s, s], pads=[p] * 4, kernel_shape=[k, k],
                       dilations=[d, d])
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, [n, cin, hw, hw])],
                         [h.make_tensor_value_info("y", T.FLOAT, [n, cout, oh, oh])],
                         [nh.from_array(w, "W")])
    x = np.random.default_rng(1).standard_normal((n, cin, hw, hw)).astype(np.float32)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), x, flops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphopt", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-k", help="only cases whose name matches this regex")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out", default="conv_bench")
    a = ap.parse_args()
    import onnx

    builds = dict(g.split("=", 1) if "=" in g else ("graphopt", g) for g in a.graphopt)
    os.makedirs(MODELS, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, op, *geom, threads in CASES:
            if a.k and not re.search(a.k, name):
                continue
            threads = threads or a.threads
            m, x, flops = model(op, *geom)
            path = os.path.join(MODELS, re.sub(r"[^\w]+", "_", name) + ".onnx")
            onnx.save(m, path)
            inputs = path[:-5] + ".npz"
            np.savez(inputs, x=x)
            times = {k: [] for k in [*builds, "onnxruntime"]}
            outs = {}
            for _ in range(a.rounds):
                for b, exe in builds.items():
                    out = os.path.join(tmp, f"{b}.npz")
                    r = rb.run_graphopt([exe], path, inputs, out, a.repeat, threads, a.timeout)
                    times[b].append(r["median_ms"])
                    outs[b] = out
                out = os.path.join(tmp, "ort.npz")
                times["onnxruntime"].append(rb.run_ort(path, inputs, out, a.repeat, threads,
                                                       a.timeout)["median_ms"])
            ref = np.load(out)["y"]
            row = {"case": name, "threads": threads, "gflop": flops / 1e9,
                   "ms": {k: min(v) for k, v in times.items()}, "all_ms": times,
                   "rel_l2": {b: float(np.linalg.norm(np.load(o)["y"] - ref) / np.linalg.norm(ref))
                              for b, o in outs.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    head = "| case | threads | " + " | ".join(f"{b} ms (GFLOP/s, vs ort)" for b in builds) + \
        " | onnxruntime ms (GFLOP/s) | rel L2 |"
    lines = [f"Single convolutions: graphopt builds {builds} beside onnxruntime, {a.threads} threads "
             f"unless noted, best median of {a.rounds} interleaved rounds of {a.repeat} runs.", "",
             head, "|" + "---|" * (len(builds) + 4)]
    for r in rows:
        ort = r["ms"]["onnxruntime"]
        cells = [f"{r['ms'][b]:.2f} ({r['gflop'] / r['ms'][b] * 1e3:.0f}, {r['ms'][b] / ort:.2f}x)"
                 for b in builds]
        err = ", ".join(f"{v:.1e}" for v in r["rel_l2"].values())
        lines.append(f"| {r['case']} | {r['threads']} | " + " | ".join(cells) +
                     f" | {ort:.2f} ({r['gflop'] / ort * 1e3:.0f}) | {err} |")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, a.out + ".json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(RESULTS, a.out + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
