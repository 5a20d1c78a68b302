#!/usr/bin/env python3
"""Training graphs of the real models run in plain onnxruntime.

    python3 tests-py/grad_models.py --graphopt target/debug/graphopt

For each model below: `graphopt grad IN -o TMP/TRAIN.onnx --loss mse`, then
  * the full onnx checker passes and every node is in the default domain;
  * onnxruntime runs it on NAME.inputs.npz and a fixed `target`;
  * its `loss` equals mean((y - target)^2) with y from NAME.outputs.npz
    (the torch reference output), within 1e-4 relative;
  * every gradient is finite, and not all of them are zero.
Prints one line per model and `N passed, M failed`; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
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


def check(graphopt: str, name: str, tmp: str) -> str | None:
    src = os.path.join("testdata", "models", name + ".onnx")
    out = os.path.join(tmp, name + ".train.onnx")
    r = subprocess.run([graphopt, "grad", src, "-o", out, "--loss", "mse"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"graphopt grad failed: {r.stderr.strip()}"
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    domains = {n.domain for n in m.graph.node} - {"", "ai.onnx"}
    if domains:
        return f"non-default domains {domains}"
    inputs = dict(np.load(os.path.join("testdata", "models", name + ".inputs.npz")))
    outputs = np.load(os.path.join("testdata", "models", name + ".outputs.npz"))
    first = onnx.load(src, load_external_data=False).graph.output[0].name
    y = outputs[first].astype(np.float64)
    target = np.sin(np.arange(y.size) * 0.37).reshape(y.shape).astype(np.float32)
    sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name] for i in sess.get_inputs() if i.name in inputs}
    feeds["target"] = target
    res = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    want = float(np.mean((y - target) ** 2))
    loss = float(res[0])
    if abs(loss - want) > 1e-4 * max(abs(want), 1.0):
        return f"loss {loss} != mse of the reference output {want}"
    grads = res[1:]
    if not all(np.isfinite(g).all() for g in grads):
        return "a gradient is not finite"
    if not any(np.abs(g).max() > 0 for g in grads):
        return "every gradient is zero"
    return f"ok: loss {loss:.5f}, {len(grads)} gradients ({names[1]}, ...)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", required=True)
    a = ap.parse_args()
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            try:
                msg = check(a.graphopt, name, tmp)
            except Exception as e:  # noqa: BLE001 - report and go on
                msg = f"error: {e}"
            ok = msg is not None and msg.startswith("ok")
            passed += ok
            failed += not ok
            print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
