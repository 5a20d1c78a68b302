#!/usr/bin/env python3
"""`graphopt grad --dropout-train` run in plain onnxruntime, whose Dropout
draws real random masks in training mode (tract runs Dropout in inference
only, so the Rust tests fix the masks).

    python3 tests-py/grad_dropout.py --graphopt target/debug/graphopt

On the rule fixture testdata/autodiff/nn/dropout.onnxtxt (x -> MatMul w ->
Dropout(ratio 0.5, with its mask output) -> Tanh -> Dropout(no ratio, no
mask) -> Mul k; loss = sum):
  * the training graph passes the full onnx checker; both Dropouts have a
    constant true `training_mode` and a mask output;
  * run RUNS times with the masks added as graph outputs (and seeded
    Dropouts, for repeatable runs), each run's forward is 2·h·mask1 into
    the Tanh, its loss the forward recomputed in numpy from that run's
    masks, and the gradients of w, k and x are dy·mask/(1 - ratio) through
    both Dropouts, computed in numpy from the masks of the same run, within
    BOUND (relative to the same sums over absolute values);
  * the masks are random: they differ between runs, and about half of the
    entries are kept (over all runs, the kept fraction within 0.35..0.65).
Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnx.helper
import onnx.parser
import onnxruntime as ort
from onnx import numpy_helper

FIXTURE = os.path.join("testdata", "autodiff", "nn", "dropout.onnxtxt")
RUNS = 20
# Measured worst error (see rel) against numpy in float64 from the float32
# forward values: 9.1e-8; the bound is about 3x.
BOUND = 3e-7


def rel(a, b, scale=None):
    """‖a - b‖ / ‖scale‖ (scale: b): `scale` is the same sum over absolute
    values, so that a result of terms that cancel (a loss near 0, a
    gradient of one kept entry where tanh saturates) is judged against the
    float32 rounding of its terms."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    s = b if scale is None else np.asarray(scale, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(s), 1e-12))


def check(graphopt, tmp):
    with open(FIXTURE) as f:
        model = onnx.parser.parse_model(f.read())
    src = os.path.join(tmp, "dropout.onnx")
    onnx.save(model, src)
    out = os.path.join(tmp, "dropout.train.onnx")
    r = subprocess.run([graphopt, "grad", src, "-o", out, "--dropout-train", "--input-grads"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return [f"graphopt grad failed: {r.stderr.strip()}"]
    if "dropout: 2 nodes in training mode" not in r.stdout:
        return [f"no dropout line in the printout: {r.stdout}"]
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    drops = [n for n in m.graph.node if n.op_type == "Dropout"]
    if len(drops) != 2 or any(len(n.input) < 3 or len(n.output) < 2 for n in drops):
        return ["the Dropouts are not both in training form with masks"]
    if any(not bool(inits.get(n.input[2], np.array(False))) for n in drops):
        return ["a training_mode is not a constant true"]
    # Expose the masks, the MatMul's and the Tanh's outputs.
    mm = next(n for n in m.graph.node if n.op_type == "MatMul")
    th = next(n for n in m.graph.node if n.op_type == "Tanh")
    m1, m2, h, tn = drops[0].output[1], drops[1].output[1], mm.output[0], th.output[0]
    for name in (m1, m2, h, tn):
        m.graph.output.append(onnx.ValueInfoProto(name=name))
    # Seeded (onnxruntime draws a new mask each run from the seeded
    # generator), so that the runs are the same every time.
    for i, n in enumerate(drops):
        n.attribute.append(onnx.helper.make_attribute("seed", 17 + i))
    path = os.path.join(tmp, "dropout.exposed.onnx")
    onnx.save(m, path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    w = inits["w"].astype(np.float64)
    k = inits["k"].astype(np.float64)
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    worst, kept, masks, msgs = 0.0, [], set(), []
    for _ in range(RUNS):
        res = dict(zip(names, sess.run(None, {"x": x})))
        a, b = res[m1].astype(np.float64), res[m2].astype(np.float64)
        kept += [a.mean(), b.mean()]
        masks.add((res[m1].tobytes(), res[m2].tobytes()))
        # The forward: d = 2·h·m1 (so t = tanh d), e = 2·t·m2.
        t32 = res[tn]
        t = t32.astype(np.float64)
        hh = res[h].astype(np.float64)
        err = rel(t, np.tanh(2 * hh * a))
        worst = max(worst, err)
        if err > BOUND:
            msgs.append(f"tanh input is not 2·h·mask: {err:.3e}")
        e = 2 * t * b
        dt = 2 * b * k
        # 1 - t² as the graph computes it, in float32 (where tanh saturates
        # it is a difference of nearly equal numbers).
        dh = 2 * a * dt * (np.float32(1) - t32 * t32).astype(np.float64)
        xd = x.astype(np.float64)
        for name, got, want, scale in [
                ("loss", res["loss"], (e * k).sum(), np.abs(e * k).sum()),
                ("k_grad", res["k_grad"], e, e),
                ("w_grad", res["w_grad"], xd.T @ dh, np.abs(xd).T @ np.abs(dh)),
                ("x_grad", res["x_grad"], dh @ w.T, np.abs(dh) @ np.abs(w).T)]:
            err = rel(got, want, scale)
            worst = max(worst, err)
            if err > BOUND:
                msgs.append(f"{name}: {err:.3e} from dy·mask/(1 - ratio)")
    frac = float(np.mean(kept))
    if len(masks) < RUNS // 2:
        msgs.append(f"only {len(masks)} different masks in {RUNS} runs")
    if not 0.35 <= frac <= 0.65:
        msgs.append(f"kept fraction {frac:.2f}, not about 1 - ratio = 0.5")
    return msgs or [f"ok: {RUNS} runs, {len(masks)} different masks, kept {frac:.2f}, "
                    f"worst {worst:.1e}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            msgs = check(a.graphopt, tmp)
        except Exception as e:  # noqa: BLE001 - report
            msgs = [f"error: {e}"]
    ok = len(msgs) == 1 and msgs[0].startswith("ok")
    for msg in msgs:
        print(f"{'PASS' if ok else 'FAIL'} dropout: {msg}")
    print(f"{int(ok)} passed, {int(not ok)} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
