#!/usr/bin/env python3
"""Quantization of the committed real models, checked in onnxruntime.

    python3 tests-py/quantize_models.py --graphopt target/debug/graphopt [--modes dynamic,static,...]

For every model in testdata/models/MANIFEST.json that onnxruntime runs, and every
mode of `--quantize` (dynamic, static, int8-weights, int4-weights):
  * run `graphopt optimize IN -o OUT --quantize MODE --calibration IN.inputs.npz --report R.json
    --max-error none`: the quantizer itself, without the default 5% bound's fallback
    (tests-py/quantize_bound.py checks the bound)
  * onnx.checker with full checks (strict shape/type inference) passes on OUT
  * OUT has no node outside the default domain that IN did not have (no contrib
    ops: int4 is the standard blocked DequantizeLinear of opset 21)
  * graph inputs and outputs keep their names and element types
  * OUT runs in onnxruntime twice on the saved inputs: with graph optimizations
    off (the standard ops as written), and with them all on plus
    `session.qdq_matmulnbits_accuracy_level=0` (what a user gets; onnxruntime fuses
    the int4 DequantizeLinear->MatMul into its MatMulNBits kernel, and accuracy
    level 0 keeps that exact). The worse rel L2 error of each float output
    against the float original (run here, optimizations off) stays within the
    model's bound for the mode in testdata/tolerances.json ("quantize" section;
    about 3x the measured error)
  * the error graphopt measured (tract, or graphopt's runtime where tract cannot run
    the model; the report's `error.rel_l2`) agrees with
    onnxruntime's (optimizations off) within 25% + 1e-4: the --max-error loop
    judges by that figure
  * models whose fp32 weights exceed 64 KB shrink to <= 0.30x (int8 modes; 0.32x
    with Conv) or <= 0.20x (int4, models without Conv: int4 applies to
    MatMul/Gemm/Gather and Conv weights whose input channels a block of 16 or
    more divides; the first and depthwise Convs stay int8)
Prints one line per (model, mode) and finally `N passed, M failed`; with
--measure, also the measured errors as JSON (to update the bounds).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO, load_tolerances, ort_session, rel_l2, resolve_graphopt, short_err  # noqa: E402

MODES = ["dynamic", "static", "int8-weights", "int4-weights"]
QUANT_OPS = {"DynamicQuantizeLinear", "QuantizeLinear", "MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv"}


def ort_user_session(path):
    """Optimizations on, as users run it, int4 kept exact."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def io_types(g):
    return {vi.name: vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.output)}


def foreign_nodes(g) -> int:
    n = 0
    for node in g.node:
        if node.domain not in ("", "ai.onnx"):
            n += 1
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                n += foreign_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                n += sum(foreign_nodes(s) for s in a.graphs)
    return n


def fp32_weight_bytes(m) -> int:
    return sum(int(np.prod(t.dims)) * 4 for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)


def worst_error(sess, feeds, expected):
    names = [o.name for o in sess.get_outputs()]
    got = sess.run(None, feeds)
    worst = 0.0
    for n, g in zip(names, got):
        e = expected[n]
        g = np.asarray(g)
        if g.shape != e.shape or g.dtype != e.dtype:
            raise ValueError(f"output {n}: {g.dtype}{list(g.shape)} vs {e.dtype}{list(e.shape)}")
        if e.dtype.kind == "f":
            worst = max(worst, rel_l2(g, e))
        elif not np.array_equal(g, e):
            raise ValueError(f"output {n}: integer/bool output differs")
    return worst


def check(entry, models_dir, graphopt, mode, tmp, args):
    name = entry["name"]
    src = os.path.join(models_dir, entry["file"])
    inputs = os.path.join(models_dir, entry["inputs"])
    dst_dir = os.path.join(tmp, f"{name}.{mode}")
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, "out.onnx")
    report_path = os.path.join(dst_dir, "report.json")
    cmd = [*graphopt, "optimize", src, "-o", dst, "--quantize", mode, "--calibration", inputs,
           "--report", report_path, "--max-error", "none", "-q"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except Exception as e:  # noqa: BLE001
        return False, f"graphopt did not run: {e}", None
    if proc.returncode != 0:
        return False, f"graphopt exit {proc.returncode}: {short_err(proc)}", None
    with open(report_path) as f:
        rep = json.load(f)["quantize"]
    notes = [f"w {rep['weights_ratio']:.3f}x", f"q {sum(rep['nodes_quantized'].values())}"]
    try:
        onnx.checker.check_model(dst, full_check=True)
    except Exception as e:  # noqa: BLE001
        return False, f"checker: {str(e).splitlines()[0][:200]}", None
    orig, out = onnx.load(src), onnx.load(dst)
    if foreign_nodes(out.graph) > foreign_nodes(orig.graph):
        return False, "nodes outside the default domain were added", None
    if io_types(orig.graph) != io_types(out.graph):
        return False, "graph input/output names or types changed", None
    has_conv = any(n.op_type == "Conv" for n in orig.graph.node)
    if fp32_weight_bytes(orig) > 65536:
        # int4 applies to MatMul/Gemm/Gather and to Conv weights whose input
        # channels a block divides; the first and depthwise Convs are int8.
        # Depthwise convolutions have many small weights left float and
        # per-channel scales of their own.
        cap = 0.20 if mode == "int4-weights" and not has_conv else 0.32 if has_conv else 0.30
        if rep["weights_ratio"] > cap:
            return False, f"weights only shrank to {rep['weights_ratio']:.3f}x (cap {cap})", None
    feeds = dict(np.load(inputs))
    ref = ort_session(src)
    expected = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
    try:
        e_plain = worst_error(ort_session(dst), feeds, expected)
        e_user = worst_error(ort_user_session(dst), feeds, expected)
    except Exception as e:  # noqa: BLE001
        return False, f"onnxruntime: {str(e).splitlines()[0][:240]}", None
    worst = max(e_plain, e_user)
    notes.append(f"rel L2 {e_plain:.3g} / optimized {e_user:.3g}")
    measured = (rep.get("error") or {}).get("rel_l2")
    if measured is None:
        notes.append(f"tract: {rep.get('error_skipped')}"[:80])
    elif any(n.op_type in QUANT_OPS for n in orig.graph.node):
        # tract's own int8 kernels round differently from onnxruntime's on
        # the ops the original already had; the figures cannot agree.
        notes.append(f"tract {measured:.3g} (original already quantized)")
    else:
        notes.append(f"tract {measured:.3g}")
        if abs(measured - e_plain) > 0.25 * e_plain + 1e-4:
            return False, f"tract's error {measured:.3g} disagrees with onnxruntime's {e_plain:.3g}", worst
    try:
        bound = float(args.tolerances["quantize"]["bounds"][name][mode])
    except KeyError:
        return False, f"no bound for {name} [{mode}] in testdata/tolerances.json ({', '.join(notes)})", worst
    notes.append(f"bound {bound:.2g}")
    if not worst <= bound:
        return False, f"rel L2 {worst:.3g} > {bound} ({', '.join(notes)})", worst
    return True, ", ".join(notes), worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("-k", help="only models whose name matches this regex")
    ap.add_argument("--keep", help="keep outputs in this folder")
    ap.add_argument("--measure", action="store_true", help="print the measured errors as JSON")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--jobs", type=int, default=2, help="models quantized at once")
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    args.tolerances = load_tolerances()
    models_dir = os.path.join(REPO, "testdata", "models")
    with open(os.path.join(models_dir, "MANIFEST.json")) as f:
        manifest = json.load(f)
    tmp_ctx = None
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        tmp = args.keep
    else:
        tmp_ctx = tempfile.TemporaryDirectory(prefix="graphopt-quantize-")
        tmp = tmp_ctx.name
    passed = failed = 0
    measured = {}
    jobs = []
    for entry in manifest["models"]:
        if args.k and not re.search(args.k, entry["name"]):
            continue
        if not entry.get("runs_in_ort") or not entry.get("inputs"):
            print(f"SKIP {entry['name']}: onnxruntime cannot run it (custom domain)")
            continue
        for mode in [x.strip() for x in args.modes.split(",") if x.strip()]:
            jobs.append((entry, mode))

    def one(job):
        entry, mode = job
        try:
            return check(entry, models_dir, graphopt, mode, tmp, args)
        except Exception as e:  # noqa: BLE001
            return False, f"harness error: {type(e).__name__}: {e}", None

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for (entry, mode), (ok, msg, err) in zip(jobs, pool.map(one, jobs)):
            if err is not None:
                measured.setdefault(entry["name"], {})[mode] = err
            print(f"{'PASS' if ok else 'FAIL'} {entry['name']} [{mode}]: {msg}", flush=True)
            passed += ok
            failed += not ok
    if args.measure:
        print(json.dumps(measured, indent=1))
    print(f"{passed} passed, {failed} failed")
    if tmp_ctx:
        tmp_ctx.cleanup()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
