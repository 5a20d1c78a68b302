#!/usr/bin/env python3
"""onnxruntime's own QDQ quantization of the testdata CNNs, run in graphopt's runtime.

    python3 tests-py/ort_quantized_run.py --graphopt target/debug/graphopt

For each model below, `onnxruntime.quantization.quantize_static` (QDQ format,
per-channel int8 weights, uint8 activations, calibrated on the model's saved
inputs) writes what a user brings: every Conv between QuantizeLinear/
DequantizeLinear pairs, its bias a DequantizeLinear of int32. Then:
  * `graphopt run OUT --inputs IN.inputs.npz --json -o G.npz` runs it; on a CPU
    with AVX-512 VNNI the lowering (crates/exec/src/lower.rs, `integer_convs`)
    turns every Conv whose activations and weight are dequantized, but those
    of one input channel per group (depthwise), into an integer convolution (QLinearConv with its output's
    QuantizeLinear, or IntegerConv), as onnxruntime fuses them; elsewhere none
  * with VNNI, each output stays within 1e-6 relative L2 of onnxruntime's on
    the same file (all optimizations on, its QDQ fusions included). Measured
    on an AMD EPYC with AVX-512 VNNI: 0, the same bits (graphopt's QLinearConv
    requantizes as onnxruntime does). Without VNNI graphopt runs the
    dequantized float path, whose distance from onnxruntime's integer kernels
    is printed, not bounded. (VNNI is read from /proc/cpuinfo: Linux.)
Prints one line per model and finally `N passed, M failed`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "testdata", "models")
MODELS_RUN = ["resnet_tiny.ts14", "mobilenet_v3_small.ts14"]
BOUND = 1e-6


def integer_eligible(graph) -> int:
    """Convs reading a DequantizeLinear's activations and weight, with more
    than one input channel per group: what the lowering makes integer."""
    made = {o: n for n in graph.node for o in n.output}
    dims = {t.name: list(t.dims) for t in graph.initializer}
    count = 0
    for n in graph.node:
        if n.op_type != "Conv":
            continue
        srcs = [made.get(i) for i in n.input[:2]]
        if not all(s is not None and s.op_type == "DequantizeLinear" for s in srcs):
            continue
        wdims = dims.get(srcs[1].input[0], [])
        count += not (len(wdims) > 1 and wdims[1] == 1)
    return count


def vnni() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx512_vnni" in flags and " avx512f" in flags


def quantize(src: str, inputs: dict, out: str) -> None:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.done = False

        def get_next(self):
            if self.done:
                return None
            self.done = True
            return inputs

    quantize_static(src, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", required=True)
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort

    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS_RUN:
            src = os.path.join(MODELS, f"{name}.onnx")
            npz = os.path.join(MODELS, f"{name}.inputs.npz")
            feeds = dict(np.load(npz))
            out = os.path.join(tmp, f"{name}.qdq.onnx")
            quantize(src, feeds, out)
            graph = onnx.load(out).graph
            convs = sum(n.op_type == "Conv" for n in graph.node)
            eligible = integer_eligible(graph)
            got = os.path.join(tmp, f"{name}.out.npz")
            r = subprocess.run([args.graphopt, "run", out, "--inputs", npz, "--json", "-o", got],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {name}: graphopt run: {r.stderr.strip()}")
                failed += 1
                continue
            rep = json.loads(r.stdout)
            integer = rep["integer_convs"] + rep["qlinear_convs"]
            want = eligible if vnni() else 0
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            ref = dict(zip(names, sess.run(None, feeds)))
            g = dict(np.load(got))
            worst = 0.0
            for k, v in ref.items():
                v = v.astype(np.float64)
                d = np.linalg.norm(g[k].astype(np.float64) - v)
                worst = max(worst, float(d / max(np.linalg.norm(v), 1e-30)))
            ok = integer == want and (worst <= BOUND or not vnni())
            print(f"{'ok' if ok else 'FAIL'} {name}: {integer} of {convs} Convs on integers "
                  f"(want {want}; {rep['qlinear_convs']} QLinearConv), rel L2 {worst:.2e} "
                  f"against onnxruntime (bound {BOUND:.0e})")
            passed += ok
            failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
