#!/usr/bin/env python3
"""Accuracy after quantization on real trained models (no torch needed).

    python3 tests-py/quantize_digits.py --graphopt target/debug/graphopt

testdata/quant/make_digits.py trained an MLP and a small CNN on scikit-learn's
digits data set and committed them with 64 calibration images and the 540
held-out test images. For each model and each mode of `--quantize`, this runs
`graphopt optimize --quantize MODE --calibration digits_M.calib.npz`, checks
the output with the full onnx checker, runs the test images in onnxruntime
(optimizations on, `session.qdq_matmulnbits_accuracy_level=0`) and compares
top-1 accuracy with the float model's (run the same way). The drop must be at
most: static 1 point, dynamic and int8-weights 0.5, int4-weights 2 (issue 12).
Prints a table, then `N passed, M failed`.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO, resolve_graphopt, short_err  # noqa: E402

MAX_DROP = {"static": 1.0, "dynamic": 0.5, "int8-weights": 0.5, "int4-weights": 2.0}


def accuracy(path, x, y):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    logits = s.run(None, {"x": x})[0]
    return 100.0 * float((logits.argmax(1) == y).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--json", help="write the accuracies here")
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    d = os.path.join(REPO, "testdata", "quant")
    passed = failed = 0
    rows = {}
    with tempfile.TemporaryDirectory(prefix="graphopt-digits-") as tmp:
        for name in ["mlp", "cnn"]:
            src = os.path.join(d, f"digits_{name}.onnx")
            test = np.load(os.path.join(d, f"digits_{name}.test.npz"))
            x, y = test["x"], test["y"]
            base = accuracy(src, x, y)
            rows[name] = {"float": base}
            print(f"digits_{name}: float {base:.2f}%")
            for mode, cap in MAX_DROP.items():
                dst = os.path.join(tmp, f"{name}.{mode}.onnx")
                cmd = [*graphopt, "optimize", src, "-o", dst, "--quantize", mode, "--calibration",
                       os.path.join(d, f"digits_{name}.calib.npz"), "-q"]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if proc.returncode != 0:
                    print(f"FAIL digits_{name} [{mode}]: graphopt exit {proc.returncode}: {short_err(proc)}")
                    failed += 1
                    continue
                try:
                    onnx.checker.check_model(dst, full_check=True)
                    acc = accuracy(dst, x, y)
                except Exception as e:  # noqa: BLE001
                    print(f"FAIL digits_{name} [{mode}]: {str(e).splitlines()[0][:200]}")
                    failed += 1
                    continue
                drop = base - acc
                rows[name][mode] = acc
                ok = drop <= cap
                print(f"{'PASS' if ok else 'FAIL'} digits_{name} [{mode}]: accuracy {acc:.2f}% "
                      f"(drop {drop:+.2f} points, at most {cap})")
                passed += ok
                failed += not ok
    print("| model | float | " + " | ".join(MAX_DROP) + " |")
    print("|---|---|" + "---|" * len(MAX_DROP))
    for name, r in rows.items():
        cells = [f"{r[m]:.2f}" if m in r else "-" for m in MAX_DROP]
        print(f"| digits_{name} | {r['float']:.2f} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
