#!/usr/bin/env python3
"""`--compress` on every testdata model: valid ONNX, runs in onnxruntime, errors that agree (issue 23).

    python3 tests-py/compress_models.py --graphopt target/debug/graphopt [-k REGEX] [--methods ...]

For every model in testdata/models and testdata/pypi (their MANIFEST.json) and every
method, two runs of `graphopt optimize IN -o OUT --passes none --compress METHOD
--calibration IN.inputs.npz`:
  * `--max-error none`: exit 0; OUT passes the full onnx checker (strict shape
    inference included), adds no node outside the default domain, and runs in
    onnxruntime with optimizations off and all on (where it runs the original). Its worst
    float output's relative L2 error against the original, in onnxruntime, agrees with
    the error graphopt measured (tract or its own runtime) and reported: within 10% +
    1e-4 of it. Wherever weights were compressed, the file's weights are smaller.
    graphopt's runtime (`graphopt run`, which decodes palettes per tile) runs OUT
    wherever it runs the original, within RUNTIME_BOUND of onnxruntime's outputs of OUT.
  * the default bound (5%): exit 0 with a measured error within it (and onnxruntime's
    within it plus 10% + 1e-4), or exit 1 with one line naming `--max-error` and no
    OUT written.
Each method must compress weights on some model (the rewrite fires). Prints one line
per (model, method, run), then `N passed, M failed`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import manifest_models as models, ort_error, rel_l2, resolve_graphopt, short_err  # noqa: E402

METHODS = ["cluster:4", "cluster:3:per-channel-groups=4", "cluster:8", "lowrank:params=0.5", "share"]
# Methods that must compress weights on some testdata model. (No testdata
# model has two weights within 5% of each other: `share` is checked for
# validity here, and merging on a real model in crates/cli/tests/compress.rs.)
MUST_FIRE = ["cluster:4", "cluster:3:per-channel-groups=4", "cluster:8", "lowrank:params=0.5"]
BOUND = 0.05
# graphopt's runtime against onnxruntime on the same compressed file (worst
# rel L2 of a float output; the engines sum in different orders), by output
# dtype. Measured 2026-12-02: float32 4.2e-6 (the worst model and method),
# float16 1.4e-4 (mlp_fp16, whose weights stay as they are).
RUNTIME_BOUND = {"float32": 1.5e-5, "float16": 5e-4}


def check(graphopt, name, src, inputs, ort_runs, method, bounded, tmp, timeout):
    import onnx

    tag = f"{name}.{method.replace(':', '_')}.{'b' if bounded else 'n'}"
    dst = os.path.join(tmp, tag + ".onnx")
    rep_path = os.path.join(tmp, tag + ".json")
    cmd = [*graphopt, "optimize", src, "-o", dst, "--passes", "none", "--compress", method,
           "--calibration", inputs, "--report", rep_path, "-q"]
    if not bounded:
        cmd += ["--max-error", "none"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timeout", 0
    if bounded and p.returncode == 1:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
        if len(lines) != 1 or "--max-error" not in lines[0]:
            return False, f"exit 1 but not one line naming --max-error: {short_err(p)}", 0
        if os.path.exists(dst):
            return False, "refused but wrote the output", 0
        return True, "refused: " + lines[0][:160], 0
    if p.returncode != 0:
        return False, f"exit {p.returncode}: {short_err(p)}", 0
    with open(rep_path) as f:
        rep = json.load(f)["compress"]
    layers = len(rep["layers"])
    if rep.get("error") is None:
        # Neither engine runs the original (a custom domain): only with
        # no bound, and said in a warning.
        if bounded or not any("error not measured" in w for w in rep["warnings"]):
            return False, f"no measured error ({rep.get('error_skipped')}; {rep['warnings']})", layers
        err = None
    else:
        # JSON has no infinity: null is a NaN or Inf where the original
        # was finite (a log of a factored filterbank's negative values).
        err = rep["error"].get("rel_l2")
        err = float("inf") if err is None else err
    if bounded and not (rep.get("max_error") == BOUND and err is not None and err <= BOUND):
        return False, f"exit 0 with error {err} (bound {rep.get('max_error')})", layers
    if layers and not rep["weights_bytes_after"] < rep["weights_bytes_before"]:
        return False, f"{layers} layers compressed but weights did not shrink", layers
    m = onnx.load(dst)
    try:
        onnx.checker.check_model(m, full_check=True)
    except Exception as ex:  # noqa: BLE001
        return False, f"onnx checker: {str(ex).splitlines()[0][:200]}", layers
    foreign = {n.domain for n in m.graph.node} - {"", "ai.onnx"}
    orig_domains = {n.domain for n in onnx.load(src).graph.node} - {"", "ai.onnx"}
    if foreign - orig_domains:
        return False, f"nodes in new domains {sorted(foreign - orig_domains)}", layers
    note = f"{layers} layers, w {rep['weights_ratio']:.3f}x, error {err} ({rep.get('measured_in')})"
    if ort_runs and err is not None:
        for level in ("disable_all", "all"):
            try:
                e = ort_error(src, dst, inputs, level)
            except Exception as ex:  # noqa: BLE001
                return False, f"onnxruntime ({level}): {str(ex).splitlines()[0][:200]}", layers
            # graphopt's error is the worst over the batch and two jittered
            # copies of it: onnxruntime's on the batch is at most that.
            if not (e <= err * 1.1 + 1e-4 or (np.isinf(err) and not np.isfinite(e))):
                return False, f"onnxruntime's error {e:.3g} disagrees with graphopt's ({note})", layers
            if bounded and not e <= BOUND * 1.1 + 1e-4:
                return False, f"onnxruntime's error {e:.3g} is over the bound ({note})", layers
        note += f", onnxruntime {e:.3g}"
    if not bounded and ort_runs:
        ok, why = runtime_agrees(graphopt, src, dst, inputs, tmp, tag)
        if not ok:
            return False, f"graphopt's runtime: {why} ({note})", layers
        note += f", runtime {why}"
    return True, note, layers


def runtime_agrees(graphopt, src, dst, inputs, tmp, tag):
    """graphopt's runtime on OUT against onnxruntime on OUT (optimizations off)."""
    def run(path, out):
        p = subprocess.run([*graphopt, "run", path, "--inputs", inputs, "-o", out], capture_output=True,
                           text=True, timeout=600)
        return p.returncode == 0, short_err(p)

    ran, why = run(dst, os.path.join(tmp, tag + ".run.npz"))
    if not ran:
        orig_ran, _ = run(src, os.path.join(tmp, tag + ".orig.npz"))
        return (not orig_ran), (f"does not run the original either ({why})" if not orig_ran else why)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    s = ort.InferenceSession(dst, so, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(inputs))
    want = dict(zip([o.name for o in s.get_outputs()],
                    s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})))
    got = dict(np.load(os.path.join(tmp, tag + ".run.npz")))
    ok, notes = True, []
    for k, w in want.items():
        if w.dtype.kind == "f" and np.isfinite(w).all():
            e = rel_l2(np.asarray(got[k], dtype=w.dtype), w)
            ok &= e <= RUNTIME_BOUND.get(str(w.dtype), RUNTIME_BOUND["float16"])
            notes.append(f"{e:.2g}")
    return ok, f"{'/'.join(notes) or '-'} from onnxruntime"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("-k", help="only models whose name matches this regex")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    methods = args.methods.split(",")
    todo = [(n, s, i, r, m, b) for (n, s, i, r) in models() for m in methods for b in (False, True)
            if not args.k or re.search(args.k, n)]
    fired = {m: 0 for m in methods}
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="graphopt-compress-") as tmp, ThreadPoolExecutor(args.jobs) as ex:
        futs = [ex.submit(check, graphopt, n, s, i, r, m, b, tmp, args.timeout) for (n, s, i, r, m, b) in todo]
        for (n, _, _, _, m, b), f in zip(todo, futs):
            ok, note, layers = f.result()
            if not b:
                fired[m] += layers
            print(f"{'PASS' if ok else 'FAIL'} {n} [{m}{', bound' if b else ''}]: {note}", flush=True)
            passed += ok
            failed += not ok
    for m, n in fired.items():
        if n == 0 and m in MUST_FIRE:
            print(f"FAIL [{m}]: compressed no weight on any model")
            failed += 1
    print(f"# layers compressed per method (--max-error none): {fired}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
