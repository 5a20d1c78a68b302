#!/usr/bin/env python3
"""Rematerialized training graphs compute bit-identical losses and gradients.

    python3 tests-py/remat_models.py --graphopt target/debug/graphopt

For each model below: `graphopt grad IN -o TRAIN --loss mse`, then
`graphopt remat TRAIN -o REMAT --budget B --strategy S --dim D=V` (every
symbolic input dim) at the first V of DIM_VALUES and budget of BUDGETS that
recomputes at least one node, for S = auto (and sqrt, per-block on BASELINES_ON); then
  * the full onnx checker passes on REMAT, and REMAT has more nodes;
  * onnxruntime (CPU, one thread) runs TRAIN and REMAT on NAME.inputs.npz
    and a fixed `target`, with graph optimizations off and on: every output
    (the loss and each gradient) is bit-identical between the two.
Prints one line per model and `N passed, M failed`; exits 1 on any failure
(a model where no budget recomputes anything fails too, unless no drop set
lowers its peak at all: then it passes as n/a, nothing to compare).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort

MODELS = [
    "bert_tiny.ts14", "bert_tiny.dynamo18", "gpt2_tiny.ts14", "gpt2_tiny.dynamo18",
    "t5_encoder_tiny.ts14", "t5_encoder_tiny.dynamo18", "vit_tiny.ts14", "vit_tiny.dynamo18",
    "whisper_encoder_tiny.ts14", "whisper_encoder_tiny.dynamo18",
    "resnet_tiny.ts14", "resnet_tiny.dynamo18",
    "mobilenet_v3_small.ts14", "mobilenet_v3_small.dynamo18",
]
BUDGETS = ["50%", "70%", "90%"]
# Values for every symbolic input dim: at small dims the gradients (live to
# the end) make the peak and recomputation cannot lower it.
DIM_VALUES = [16, 128]
# sqrt and per-block run on the models named here too (time: the default
# test run stays short).
BASELINES_ON = {"gpt2_tiny.ts14", "mobilenet_v3_small.ts14"}


def run(path: str, feeds: dict, optimize: bool) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def dims_of(path: str, value: int) -> list[str]:
    """`--dim NAME=value` for every symbolic dim of the inputs (activations
    then outweigh the gradients, which stay live to the end)."""
    m = onnx.load(path, load_external_data=False)
    out: list[str] = []
    for i in m.graph.input:
        for d in i.type.tensor_type.shape.dim:
            if d.dim_param and f"{d.dim_param}={value}" not in out:
                out += ["--dim", f"{d.dim_param}={value}"]
    return out


def check(graphopt: str, name: str, tmp: str) -> str:
    src = os.path.join("testdata", "models", name + ".onnx")
    train = os.path.join(tmp, name + ".train.onnx")
    r = subprocess.run([graphopt, "grad", src, "-o", train, "--loss", "mse"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"graphopt grad failed: {r.stderr.strip()}"
    inputs = dict(np.load(os.path.join("testdata", "models", name + ".inputs.npz")))
    outputs = np.load(os.path.join("testdata", "models", name + ".outputs.npz"))
    first = onnx.load(src, load_external_data=False).graph.output[0].name
    y = outputs[first]
    target = np.sin(np.arange(y.size) * 0.37).reshape(y.shape).astype(np.float32)
    sess = ort.InferenceSession(train, providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name] for i in sess.get_inputs() if i.name in inputs}
    feeds["target"] = target
    ref = {opt: run(train, feeds, opt) for opt in (False, True)}
    n_train = len(onnx.load(train).graph.node)
    done = []
    for strategy in ["auto", "sqrt", "per-block"] if name in BASELINES_ON else ["auto"]:
        out = os.path.join(tmp, f"{name}.{strategy}.remat.onnx")
        rep = None
        for value, budget in [(v, b) for v in DIM_VALUES for b in BUDGETS]:
            r = subprocess.run([graphopt, "remat", train, "-o", out, "--budget", budget,
                                "--strategy", strategy, "--json", *dims_of(train, value)],
                               capture_output=True, text=True)
            if r.returncode == 0:
                rep = json.loads(r.stdout)
                if rep["recomputed_nodes"]:
                    break
                rep = None
        if rep is None:
            if strategy != "auto":
                continue  # a baseline may find nothing on a model without blocks
            # Fine when no drop set lowers the peak at all (the gradients or
            # the backward's own temporaries make it): nothing to rewrite.
            r = subprocess.run([graphopt, "remat", train, "--sweep", "--json", "--strategy", "fast",
                                *dims_of(train, DIM_VALUES[-1])], capture_output=True, text=True)
            pts = json.loads(r.stdout)["frontiers"][0]["points"] if r.returncode == 0 else []
            if pts and all(p["peak_fraction"] >= 1.0 for p in pts):
                return ("ok: n/a, recomputation cannot lower this graph's peak at dims "
                        f"{DIM_VALUES} (nothing rewritten)")
            return f"no budget of {BUDGETS} made auto recompute anything"
        m = onnx.load(out)
        onnx.checker.check_model(m, full_check=True)
        if len(m.graph.node) <= n_train:
            return f"{strategy}: {len(m.graph.node)} nodes after remat, {n_train} before"
        for opt in (False, True):
            got = run(out, feeds, opt)
            for k, (a, b) in enumerate(zip(ref[opt], got)):
                if a.shape != b.shape or a.tobytes() != b.tobytes():
                    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                    return (f"{strategy}: output {k} differs (optimizations "
                            f"{'on' if opt else 'off'}): max |diff| {diff:g}")
        done.append(f"{strategy} {budget} at dims={value}: {len(rep['recomputed_nodes'])} copies, "
                    f"peak {rep['lower_bound_after_bytes'] / max(rep['lower_bound_before_bytes'], 1):.2f}")
    return f"ok: {len(ref[False])} outputs bit-identical; " + "; ".join(done)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            try:
                msg = check(a.graphopt, name, tmp)
            except Exception as e:  # noqa: BLE001 - report and go on
                msg = f"error: {e}"
            ok = msg.startswith("ok")
            passed += ok
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
