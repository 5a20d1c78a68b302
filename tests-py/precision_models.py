#!/usr/bin/env python3
"""Mixed-precision lowering on the committed real models, checked in onnxruntime.

    python3 tests-py/precision_models.py --graphopt target/debug/graphopt [--precision fp16,bf16,fp16-weights]

For every model in testdata/models/MANIFEST.json that onnxruntime runs, the
pretrained audio front ends in testdata/pypi/MANIFEST.json (copied from the
onnx-asr wheel: a resampler that builds its sinc kernel at run time, STFT/DFT
mel front ends), and every precision:
  * run `graphopt optimize IN -o OUT --precision P --report R.json`
  * onnx.checker with full checks (strict shape/type inference) passes on OUT
  * graph inputs and outputs keep their names and element types
  * OUT loads and runs in onnxruntime (CPU provider, optimizations off) on the
    saved inputs; the error of each output against the fp32 original's outputs
    (run in onnxruntime on this machine)
    stays within the model's bound for the precision in testdata/tolerances.json
    (rel L2; integer/bool outputs exact)
  * for fp32 models the initializer bytes shrink to <= 0.51x
  * Cast hygiene: no Cast reads a Cast inserted by graphopt, no Cast converts to
    its input's own type, and neither count exceeds the original model's
With --validate, fp16 and fp16-weights also run `--validate` (tract, random
inputs) and require the report to say the result is within tolerance (models
tract cannot run are reported as "validate skipped": the script passes
`--validate=best-effort`).
Prints one line per (model, precision) and finally `N passed, M failed`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    REPO, load_tolerances, ort_session, rel_l2, resolve_graphopt, short_err, tolerance,
)

# The rel L2 bound against the fp32 reference outputs, per model and
# precision, is in testdata/tolerances.json (about 3x the measured error;
# modes "fp16", "bf16", "fp16-weights").


def elem_types(g):
    return {vi.name: vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.output)}


def cast_hygiene(model):
    """(chains, same_type) counts over all graphs, with types from ONNX inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001
        inferred = model
    chains = same = 0

    def walk(g, types):
        nonlocal chains, same
        types = dict(types)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type"):
                types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
        producers = {o: n for n in g.node for o in n.output}
        for n in g.node:
            if n.op_type == "Cast" and n.domain in ("", "ai.onnx"):
                src = n.input[0]
                p = producers.get(src)
                if p is not None and p.op_type == "Cast":
                    chains += 1
                to = next((a.i for a in n.attribute if a.name == "to"), None)
                if to is not None and types.get(src) == to:
                    same += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, types)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        walk(sg, types)

    walk(inferred.graph, {})
    return chains, same


def fp32_weight_fraction(model):
    total = f32 = 0
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        size = n * {1: 4, 10: 2, 16: 2, 11: 8, 7: 8, 6: 4, 3: 1, 2: 1, 9: 1}.get(t.data_type, 4)
        total += size
        if t.data_type == onnx.TensorProto.FLOAT:
            f32 += size
    return f32 / total if total else 0.0


def run_ort(path, feeds):
    sess = ort_session(path)
    names = [o.name for o in sess.get_outputs()]
    return names, sess.run(None, feeds)


def check(entry, models_dir, graphopt, precision, tmp, args):
    import subprocess

    name = entry["name"]
    src = os.path.join(models_dir, entry["file"])
    dst_dir = os.path.join(tmp, f"{name}.{precision}")
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, "out.onnx")
    report_path = os.path.join(dst_dir, "report.json")
    cmd = [*graphopt, "optimize", src, "-o", dst, "--precision", precision, "--report", report_path]
    validating = args.validate and precision != "bf16"
    if validating:
        # best-effort: a model tract cannot run is lowered unvalidated (and
        # reported as skipped); ending over tolerance still fails the run.
        cmd.append("--validate=best-effort")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except Exception as e:  # noqa: BLE001
        return False, f"graphopt did not run: {e}"
    if proc.returncode != 0:
        return False, f"graphopt exit {proc.returncode}: {short_err(proc)}"
    with open(report_path) as f:
        rep = json.load(f)["precision"]
    notes = [f"w {rep['weights_ratio']:.3f}x", f"casts {rep['casts_before']}->{rep['casts_after']}",
             f"low {rep['nodes_lowered']}"]

    try:
        onnx.checker.check_model(dst, full_check=True)
    except Exception as e:  # noqa: BLE001
        return False, f"checker: {str(e).splitlines()[0][:200]}"
    orig = onnx.load(src)
    out = onnx.load(dst)
    if elem_types(orig.graph) != elem_types(out.graph):
        return False, "graph input/output names or types changed"
    o_chains, o_same = cast_hygiene(orig)
    chains, same = cast_hygiene(out)
    if chains > o_chains or same > o_same:
        return False, f"Cast hygiene: {chains} Cast chains (was {o_chains}), {same} same-type Casts (was {o_same})"

    # Weights the report lists as kept fp32, with why (a window an STFT reads,
    # constants computed on at run time, quantization parameters), are left
    # out of the ratio; everything else must halve.
    kept = {k["name"] for k in rep.get("kept_fp32_weights", [])}
    kept_bytes = sum(4 * int(np.prod(t.dims)) for t in orig.graph.initializer
                     if t.name in kept and t.data_type == onnx.TensorProto.FLOAT)
    ratio = (rep["weights_bytes_after"] - kept_bytes) / max(rep["weights_bytes_before"] - kept_bytes, 1)
    # Weights only fp32 nodes read stay fp32 where storing them low with a
    # Cast back would raise weights + arena (the report's warning says so,
    # with both totals).
    store_note = any(w.startswith("weights only fp32 nodes read stay fp32") for w in rep.get("warnings", []))
    if store_note:
        notes.append("fp32-read weights kept (weights + arena)")
    if fp32_weight_fraction(orig) > 0.9 and rep["weights_bytes_before"] > 4096 and ratio > 0.51 \
            and not store_note:
        return False, f"weights only shrank to {rep['weights_ratio']:.3f}x ({ratio:.3f}x without those kept fp32)"

    if validating:
        v = rep.get("validation") or {}
        if rep.get("validation_skipped"):
            notes.append(f"validate skipped ({rep['validation_skipped'][:60]})")
        elif not v.get("ok"):
            return False, f"--validate did not reach tolerance: {v}"
        else:
            notes.append(f"validate rel {v['rel_l2']:.1e} kept {len(v['kept_nodes']) + len(v['kept_weights'])}")

    feeds = dict(np.load(os.path.join(models_dir, entry["inputs"])))
    # The reference is the fp32 original run here, not the saved outputs:
    # onnxruntime rounds differently on different CPUs (see roundtrip_models.py).
    try:
        onames, ogot = run_ort(src, feeds)
    except Exception as e:  # noqa: BLE001
        return False, f"onnxruntime on the original: {str(e).splitlines()[0][:240]}"
    expected = dict(zip(onames, ogot))
    try:
        names, got = run_ort(dst, feeds)
    except Exception as e:  # noqa: BLE001
        return False, f"onnxruntime: {str(e).splitlines()[0][:240]}"
    worst = 0.0
    for n, g in zip(names, got):
        e = expected[n]
        g = np.asarray(g)
        if g.shape != e.shape or g.dtype != e.dtype:
            return False, f"output {n}: {g.dtype}{list(g.shape)} vs {e.dtype}{list(e.shape)}"
        if e.dtype.kind == "f":
            err = rel_l2(g, e)
            worst = max(worst, err)
        elif not np.array_equal(g, e):
            return False, f"output {n}: integer/bool output differs"
    bound = tolerance(args.tolerances, name, precision)
    notes.append(f"rel L2 {worst:.3g} (bound {bound:.2g})")
    if not worst <= bound:
        return False, f"rel L2 {worst:.3g} > {bound} ({', '.join(notes)})"
    return True, ", ".join(notes)


def make_ir3_model(path):
    """An IR-3 model (opset 8, every initializer also a graph input, as old
    exporters wrote them): Conv, a Shape->Gather->Concat->Reshape chain,
    Gemm, MatMul. Returns seeded inputs and the fp32 outputs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = {
        "conv_w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
        "conv_b": rng.standard_normal(4).astype(np.float32) * 0.1,
        "fc_w": rng.standard_normal((64, 256)).astype(np.float32) * 0.05,
        "fc_b": rng.standard_normal(64).astype(np.float32) * 0.1,
        "proj": rng.standard_normal((64, 16)).astype(np.float32) * 0.1,
        "idx": np.array([0], dtype=np.int64),
        "minus1": np.array([-1], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["b"], axis=0),
        helper.make_node("Concat", ["b", "minus1"], ["t"], axis=0),
        helper.make_node("Reshape", ["r", "t"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["h"], transB=1),
        helper.make_node("MatMul", ["h", "proj"], ["y"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])] + [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for k, v in w.items()
    ]
    g = helper.make_graph(nodes, "ir3", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 3
    onnx.save(m, path)
    feeds = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    return feeds, run_ort(path, feeds)[1][0]


def ir3_bound(tolerances, label):
    """The IR-3 model's bound from testdata/tolerances.json: its mode for
    --precision runs, 'default' for the pipeline, 'pass' for any single
    pass (lower_precision alone is fp16)."""
    table = tolerances["bounds"]["ir3_synthetic"]
    if label == "lower_precision":
        label = "fp16"
    return table[label] if label in table else table["pass"]


def check_ir3(graphopt, tmp, args):
    """IR < 4 requires every initializer to be a graph input too. Every
    pass alone, the default pipeline and each precision must keep that
    rule (onnxruntime refuses the file otherwise) and the outputs."""
    import subprocess

    src = os.path.join(tmp, "ir3.onnx")
    feeds, ref = make_ir3_model(src)
    listed = subprocess.run([*graphopt, "passes"], capture_output=True, text=True).stdout
    passes = [ln.split()[0] for ln in listed.splitlines() if ln and not ln.startswith(" ")]
    runs = [("default", [])] + [(p, ["--passes", p]) for p in passes if p != "upgrade_opset"]
    runs += [(p, ["--precision", p]) for p in [x.strip() for x in args.precision.split(",") if x.strip()]]
    results = []
    for label, extra in runs:
        dst = os.path.join(tmp, f"ir3.{label}.onnx")
        proc = subprocess.run([*graphopt, "optimize", src, "-o", dst, *extra],
                              capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            results.append((False, label, f"graphopt exit {proc.returncode}: {short_err(proc)}"))
            continue
        out = onnx.load(dst)
        declared = {i.name for i in out.graph.input}
        missing = [t.name for t in out.graph.initializer if t.name not in declared]
        if out.ir_version >= 4:
            results.append((False, label, f"ir_version became {out.ir_version}"))
            continue
        if missing:
            results.append((False, label, f"initializers not declared as inputs: {missing[:5]}"))
            continue
        try:
            got = run_ort(dst, feeds)[1][0]
        except Exception as e:  # noqa: BLE001
            results.append((False, label, f"onnxruntime: {str(e).splitlines()[0][:240]}"))
            continue
        err = rel_l2(np.asarray(got, dtype=np.float32), ref)
        bound = ir3_bound(args.tolerances, label)
        results.append((err <= bound, label, f"rel L2 {err:.3e} (bound {bound})"))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--precision", default="fp16,bf16,fp16-weights")
    ap.add_argument("-k", help="only models whose name matches this regex")
    ap.add_argument("--validate", action="store_true", help="also run --validate (fp16, fp16-weights)")
    ap.add_argument("--keep", help="keep outputs in this folder")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    args.tolerances = load_tolerances()
    entries = []
    for sub in ("models", "pypi"):
        models_dir = os.path.join(REPO, "testdata", sub)
        with open(os.path.join(models_dir, "MANIFEST.json")) as f:
            entries += [(e, models_dir) for e in json.load(f)["models"]]
    tmp_ctx = None
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        tmp = args.keep
    else:
        tmp_ctx = tempfile.TemporaryDirectory(prefix="graphopt-precision-")
        tmp = tmp_ctx.name
    passed = failed = 0
    for entry, models_dir in entries:
        if args.k and not re.search(args.k, entry["name"]):
            continue
        if not entry.get("runs_in_ort") or not entry.get("outputs"):
            print(f"SKIP {entry['name']}: onnxruntime cannot run it (custom domain)")
            continue
        for p in [x.strip() for x in args.precision.split(",") if x.strip()]:
            try:
                ok, msg = check(entry, models_dir, graphopt, p, tmp, args)
            except Exception as e:  # noqa: BLE001
                ok, msg = False, f"harness error: {type(e).__name__}: {e}"
            print(f"{'PASS' if ok else 'FAIL'} {entry['name']} [{p}]: {msg}", flush=True)
            passed += ok
            failed += not ok
    if not args.k or re.search(args.k, "ir3"):
        for ok, label, msg in check_ir3(graphopt, tmp, args):
            print(f"{'PASS' if ok else 'FAIL'} ir3 [{label}]: {msg}", flush=True)
            passed += ok
            failed += not ok
    print(f"{passed} passed, {failed} failed")
    if tmp_ctx:
        tmp_ctx.cleanup()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
