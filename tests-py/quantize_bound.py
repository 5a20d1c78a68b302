#!/usr/bin/env python3
"""The default error bound of `--quantize`: never exit 0 above it (issue 27).

    python3 tests-py/quantize_bound.py --graphopt target/debug/graphopt [-k REGEX] [--modes ...]

For every model in testdata/models and testdata/pypi (their MANIFEST.json) and every
mode of `--quantize`, `graphopt optimize IN -o OUT --passes none --quantize MODE
--calibration IN.inputs.npz` runs with the default bound (5% relative L2 of any
output against the float model). Then either:
  * exit 0: the report's bound is 0.05 and its measured error is within it, and,
    where onnxruntime runs the original, OUT's worst float output in onnxruntime
    (optimizations off) is within the bound too (plus 10% + 1e-4 for the engines'
    rounding: graphopt measures in tract or its own runtime);
  * exit 1: one line on stderr naming `--max-error` (or, in static mode, the
    calibration that neither engine could run), and OUT not written.
Anything else fails. Prints one line per (model, mode), then `N passed, M failed`
with the counts of kept and refused.
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

MODES = ["dynamic", "static", "int8-weights", "int4-weights"]
BOUND = 0.05


def check(graphopt, name, src, inputs, ort_runs, mode, tmp, timeout):
    dst = os.path.join(tmp, f"{name}.{mode}.onnx")
    rep_path = os.path.join(tmp, f"{name}.{mode}.json")
    cmd = [*graphopt, "optimize", src, "-o", dst, "--passes", "none", "--quantize", mode,
           "--calibration", inputs, "--report", rep_path, "-q"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timeout", None
    if p.returncode == 1:
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        # The bound's refusal, or a model neither engine runs (static mode
        # cannot calibrate it): one line either way.
        if len(lines) != 1 or not ("--max-error" in lines[0] or "calibration:" in lines[0]):
            return False, f"exit 1 but not one line naming the cause: {short_err(p)}", None
        if os.path.exists(dst):
            return False, "refused but wrote the output", None
        return True, "refused: " + lines[0][:160], "refused"
    if p.returncode != 0:
        return False, f"exit {p.returncode}: {short_err(p)}", None
    with open(rep_path) as f:
        rep = json.load(f)["quantize"]
    err = (rep.get("error") or {}).get("rel_l2")
    if rep.get("max_error") != BOUND:
        return False, f"report bound {rep.get('max_error')}, expected the default {BOUND}", None
    if err is None or not err <= BOUND:
        return False, f"exit 0 with measured error {err} over the bound", None
    note = f"kept: w {rep['weights_ratio']:.3f}x, error {err:.3g} ({rep.get('measured_in')})"
    if ort_runs:
        try:
            e = ort_error(src, dst, inputs)
        except Exception as ex:  # noqa: BLE001
            return False, f"onnxruntime: {str(ex).splitlines()[0][:200]}", None
        note += f", onnxruntime {e:.3g}"
        if not e <= BOUND * 1.1 + 1e-4:
            return False, f"onnxruntime's error {e:.3g} is over the bound ({note})", None
    return True, note, "kept"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("-k", help="only models whose name matches this regex")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    todo = [(n, s, i, r, m) for (n, s, i, r) in models() for m in args.modes.split(",")
            if not args.k or re.search(args.k, n)]
    counts = {"kept": 0, "refused": 0}
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="graphopt-bound-") as tmp, ThreadPoolExecutor(args.jobs) as ex:
        futs = [ex.submit(check, graphopt, n, s, i, r, m, tmp, args.timeout) for (n, s, i, r, m) in todo]
        for (n, _, _, _, m), f in zip(todo, futs):
            ok, note, kind = f.result()
            print(f"{'PASS' if ok else 'FAIL'} {n} [{m}]: {note}", flush=True)
            if ok:
                passed += 1
                counts[kind] += 1
            else:
                failed += 1
    print(f"# {counts['kept']} kept within the bound, {counts['refused']} refused")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
