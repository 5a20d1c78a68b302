#!/usr/bin/env python3
"""Opt-in check on a model over 2 GiB (external data), too big for CI.

    python3 tests-py/large_model.py --graphopt target/release/graphopt [--dir DIR]

Builds (once) a 2.4 GB model whose weights live in external data, round-trips
it with `graphopt optimize --passes none` and with the default pipeline, and
checks: the output uses external data (automatic past 2 GiB), onnxruntime
outputs are bit-identical to the original's, the input is untouched, and
`--no-external-data` fails with a one-line error instead of writing a broken
file. Prints `N passed, M failed`.
"""
import argparse, hashlib, os, subprocess, sys, tempfile
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
import onnxruntime as ort

N = 200_000_000  # floats per weight; 3 weights = 2.4 GB


def build(path):
    if os.path.exists(path):
        return
    ws = []
    for i in range(3):
        w = np.full((N,), float(i + 1) / 8, dtype=np.float32)
        w[::1_000_003] = i
        ws.append(numpy_helper.from_array(w, f"w{i}"))
    nodes = [helper.make_node("Add", ["x", "w0"], ["a"]), helper.make_node("Mul", ["a", "w1"], ["b"]),
             helper.make_node("Sub", ["b", "w2"], ["y"])]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])], ws)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="big.onnx.data")


def digest(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def run(p, x):
    s = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", required=True)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "graphopt-large"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    src = os.path.join(a.dir, "big.onnx")
    build(src)
    before = (digest(src), digest(src + ".data"))
    x = np.linspace(-1, 1, N, dtype=np.float32)
    ref = run(src, x)
    passed = failed = 0
    for label, extra in [("passes none", ["--passes", "none"]), ("default", [])]:
        out = os.path.join(a.dir, f"out-{label.replace(' ', '_')}.onnx")
        p = subprocess.run([a.graphopt, "optimize", src, "-o", out, "-q", *extra], capture_output=True, text=True)
        ok = p.returncode == 0 and os.path.exists(out + ".data") and os.path.getsize(out) < (1 << 20)
        ok = ok and np.array_equal(run(out, x), ref)
        print(("PASS" if ok else "FAIL"), label, p.stderr.strip())
        passed += ok
        failed += not ok
    p = subprocess.run([a.graphopt, "optimize", src, "-o", os.path.join(a.dir, "inline.onnx"), "--no-external-data"],
                       capture_output=True, text=True)
    ok = p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "2 GiB" in p.stderr
    print(("PASS" if ok else "FAIL"), "--no-external-data refused:", p.stderr.strip())
    passed += ok
    failed += not ok
    ok = (digest(src), digest(src + ".data")) == before
    print(("PASS" if ok else "FAIL"), "input untouched")
    passed += ok
    failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
