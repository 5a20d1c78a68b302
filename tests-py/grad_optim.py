#!/usr/bin/env python3
"""AdamW training graphs run in plain onnxruntime against numpy and torch.

    python3 tests-py/grad_optim.py --graphopt target/debug/graphopt

For each torch export in testdata/autodiff/torch (made by
testdata/autodiff/make_torch_refs.py, which also saved torch's parameters
after 3 AdamW steps):
  `graphopt grad M -o T --loss L --optimizer adamw --keep-grads --lr .. --betas ..
   --eps .. --weight-decay .. --params-as-inputs --trainable <torch's
   parameters> --init-out INIT.npz`, then
  * the full onnx checker passes, every node is in the default domain, and
    the parameters are graph inputs without initializers;
  * INIT.npz holds every input but the data (parameters, zero moments,
    step 0);
  * onnxruntime loops the step 3 times, feeding every `_new` output back;
    each step's `_new` outputs equal AdamW computed in numpy (float64) from
    that step's `_grad` outputs and the fed state, within NUMPY_BOUND;
  * the parameters after 3 steps equal torch.optim.AdamW's within
    TORCH_BOUND (entries whose torch gradient is rounding noise, 0 < |g| <=
    1e-5 max|g|, left out: AdamW turns noise into full steps of its sign).
Prints one line per model and `N passed, M failed`; exits 1 on any failure.
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

DIR = os.path.join("testdata", "autodiff", "torch")
# Measured worst relative L2 errors, bounds about 3x:
NUMPY_BOUND = 3e-7  # measured 1.0e-7 (f32 rounding of the update)
TORCH_BOUND = 4e-7  # measured 1.2e-7


def rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def check(graphopt, stem, meta, tmp):
    refs = dict(np.load(os.path.join(DIR, stem + ".refs.npz")))
    hp = meta["_meta"]["adamw"]
    steps = meta["_meta"]["adamw_steps"]
    params = sorted(k[len("adamw/"):] for k in refs if k.startswith("adamw/"))
    out = os.path.join(tmp, stem + ".train.onnx")
    init = os.path.join(tmp, stem + ".init.npz")
    r = subprocess.run([graphopt, "grad", os.path.join(DIR, stem + ".onnx"), "-o", out,
                        "--loss", meta[stem]["loss"], "--optimizer", "adamw",
                        "--lr", str(hp["lr"]), "--betas", f"{hp['betas'][0]},{hp['betas'][1]}",
                        "--eps", str(hp["eps"]), "--weight-decay", str(hp["weight_decay"]),
                        "--params-as-inputs", "--trainable", ",".join(params),
                        "--keep-grads", "--init-out", init], capture_output=True, text=True)
    if r.returncode != 0:
        return f"graphopt grad failed: {r.stderr.strip()}"
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    if {n.domain for n in m.graph.node} - {"", "ai.onnx"}:
        return "non-default domains"
    inits = {t.name for t in m.graph.initializer}
    inputs = [i.name for i in m.graph.input]
    if any(p in inits or p not in inputs for p in params):
        return "a parameter is not a plain graph input"
    state = dict(np.load(init))
    data = {k[3:]: v for k, v in refs.items() if k.startswith("in/")}
    missing = set(inputs) - set(state) - set(data)
    if missing:
        return f"INIT.npz lacks {sorted(missing)}"
    if int(state["step"]) != 0 or any(np.any(state[f"{p}_m"]) for p in params):
        return "the initial state is not zero"
    sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    feeds = {**data, **state}
    b1, b2 = hp["betas"]
    lr, eps, wd = hp["lr"], hp["eps"], hp["weight_decay"]
    worst_np = 0.0
    for t in range(1, steps + 1):
        res = dict(zip(names, sess.run(None, {i: feeds[i] for i in inputs})))
        if int(res["step_new"]) != t:
            return f"step_new {res['step_new']} != {t}"
        for p in params:
            g = res[f"{p}_grad"].astype(np.float64)
            m = b1 * feeds[f"{p}_m"].astype(np.float64) + (1 - b1) * g
            v = b2 * feeds[f"{p}_v"].astype(np.float64) + (1 - b2) * g * g
            w = feeds[p].astype(np.float64)
            new = w * (1 - lr * wd) - lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
            for got, want in [(res[f"{p}_m_new"], m), (res[f"{p}_v_new"], v), (res[f"{p}_new"], new)]:
                e = rel(got, want)
                worst_np = max(worst_np, e)
                if e > NUMPY_BOUND:
                    return f"step {t}, {p}: {e:.3e} from numpy's AdamW"
        for k in list(feeds):
            if f"{k}_new" in res:
                feeds[k] = res[f"{k}_new"]
    worst_t = 0.0
    for p in params:
        g = refs[f"grad/{p}"]
        keep = (g == 0) | (np.abs(g) > 1e-5 * np.abs(g).max())
        e = rel(feeds[p][keep], refs[f"adamw/{p}"][keep])
        worst_t = max(worst_t, e)
        if e > TORCH_BOUND:
            return f"{p}: {e:.3e} from torch's AdamW after {steps} steps"
    return f"ok: {len(params)} parameters, {steps} steps; vs numpy {worst_np:.1e}, vs torch {worst_t:.1e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", required=True)
    a = ap.parse_args()
    with open(os.path.join(DIR, "MANIFEST.json")) as f:
        meta = json.load(f)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for stem in sorted(k for k in meta if not k.startswith("_")):
            try:
                msg = check(a.graphopt, stem, meta, tmp)
            except Exception as e:  # noqa: BLE001 - report and go on
                msg = f"error: {e}"
            ok = msg.startswith("ok")
            passed += ok
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {stem}: {msg}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
