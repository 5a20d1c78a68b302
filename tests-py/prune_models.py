#!/usr/bin/env python3
"""`graphopt prune` on every testdata model: valid, smaller ONNX that onnxruntime runs (issue 22).

    python3 tests-py/prune_models.py --graphopt target/debug/graphopt [-k REGEX] [--ratio 0.3]

For every model in testdata/models and testdata/pypi (their MANIFEST.json) with inputs:
`graphopt prune IN -o OUT --ratio R --calibration IN.inputs.npz --report R.json`.
  * exit 1 is accepted only as one line saying the model has no prunable group, with no
    OUT written;
  * on exit 0: OUT passes the full onnx checker (strict shape inference included); its
    float initializers hold exactly the reported `params_after` elements, fewer than the
    input's; it runs in onnxruntime with optimizations off and all on wherever the
    original runs there, and its error against the original in onnxruntime agrees with
    the error graphopt measured and reported (within 10% + 1e-4: graphopt's is the worst
    over the batch and jittered copies of it); `graphopt optimize`, `plan` and `grad
    --loss mse` accept it.
Unstructured sparsity (`--sparsity 0.8 --unstructured`) on the models in SPARSE: the file gets
smaller, passes the onnx checker (not the full one: its type inference rejects a sparse
initializer read by a dense op, a limit of the checker) and runs in onnxruntime with the error
graphopt reports.
Pruning must fire on every model in MUST_PRUNE (the rewrite is shown to work on real
exports of both torch exporters). Prints one line per model, then `N passed, M failed`.
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
from _common import manifest_models as models, ort_error, resolve_graphopt, short_err  # noqa: E402

# Models graphopt must prune, and how many groups of attention heads it must
# find in each (at --ratio 0.3 a layer of 2 heads keeps both: found, not cut).
MUST_PRUNE = {
    "resnet_tiny.ts9": 0, "resnet_tiny.ts14": 0, "resnet_tiny.dynamo18": 0,
    "mobilenet_v3_small.ts11": 0, "mobilenet_v3_small.ts14": 0, "mobilenet_v3_small.dynamo18": 0,
    "bert_tiny.ts14": 2, "bert_tiny.ts11": 2, "bert_tiny.dynamo18": 2,
    "gpt2_tiny.dynamo18": 2, "gpt2_tiny.ts14": 2, "gpt2_tiny.ts14.extdata": 2, "mlp_fp16.ts14": 0, "mlp_fp16.dynamo18": 0,
    "t5_encoder_tiny.ts14": 1, "t5_encoder_tiny.dynamo18": 1,
    "vit_tiny.ts14": 2, "vit_tiny.dynamo18": 2,
    "whisper_encoder_tiny.ts14": 2, "whisper_encoder_tiny.dynamo18": 2,
}


SPARSE = ["resnet_tiny.ts14", "bert_tiny.dynamo18", "mobilenet_v3_small.ts14"]


def check_sparse(graphopt, name, src, inputs, tmp, timeout):
    import onnx

    dst = os.path.join(tmp, name + ".sparse.onnx")
    rep_path = os.path.join(tmp, name + ".sparse.json")
    p = subprocess.run([*graphopt, "prune", src, "-o", dst, "--sparsity", "0.8", "--unstructured",
                        "--calibration", inputs, "--report", rep_path], capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        return False, f"--unstructured: exit {p.returncode}: {short_err(p)}"
    rep = json.load(open(rep_path))["sparsity"]
    if not (rep["stored_sparse"] > 0 and os.path.getsize(dst) < os.path.getsize(src)):
        return False, f"--unstructured: the file did not shrink ({rep})"
    m = onnx.load(dst)
    try:
        onnx.checker.check_model(m)
    except Exception as ex:  # noqa: BLE001
        return False, f"--unstructured: onnx checker: {str(ex).splitlines()[0][:200]}"
    err = json.load(open(rep_path))["error"]["rel_l2"]
    e = ort_error(src, dst, inputs, "disable_all")
    if not e <= err * 1.1 + 1e-4:
        return False, f"--unstructured: onnxruntime's error {e:.3g} disagrees with graphopt's {err:.3g}"
    return True, (f"sparse {rep['stored_sparse']}/{rep['weights']} weights, file "
                  f"{os.path.getsize(dst) / os.path.getsize(src):.2f}x, error {err:.3g}, onnxruntime {e:.3g}")


def float_params(path):
    import onnx
    from onnx import numpy_helper

    m = onnx.load(path)
    n = 0
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype.kind == "f":
            n += a.size
    return n


def check(graphopt, name, src, inputs, ort_runs, ratio, tmp, timeout):
    import onnx

    dst = os.path.join(tmp, name + ".pruned.onnx")
    rep_path = os.path.join(tmp, name + ".json")
    cmd = [*graphopt, "prune", src, "-o", dst, "--ratio", str(ratio), "--calibration", inputs,
           "--report", rep_path]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timeout", None
    if p.returncode == 1:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
        if len(lines) != 1 or "no prunable group" not in lines[0]:
            return False, f"exit 1 but not one 'no prunable group' line: {short_err(p)}", None
        if os.path.exists(dst):
            return False, "refused but wrote the output", None
        return True, "no group: " + lines[0][-160:], None
    if p.returncode != 0:
        return False, f"exit {p.returncode}: {short_err(p)}", None
    with open(rep_path) as f:
        rep = json.load(f)
    pruned = [g for g in rep["groups"] if g["removed"] > 0]
    heads = [g for g in rep["groups"] if g["kind"] == "heads"]
    m = onnx.load(dst)
    try:
        onnx.checker.check_model(m, full_check=True)
    except Exception as ex:  # noqa: BLE001
        return False, f"onnx checker: {str(ex).splitlines()[0][:200]}", rep
    n = float_params(dst)
    if n != rep["params_after"] or (pruned and not n < float_params(src)):
        return False, f"file holds {n} parameters, report says {rep['params_after']}", rep
    err = (rep.get("error") or {}).get("rel_l2")
    note = (f"{len(pruned)} groups pruned ({len(heads)} of heads found), params {rep['params_ratio']:.3f}x, "
            f"FLOPs {rep['flops_ratio'] if rep['flops_ratio'] is None else round(rep['flops_ratio'], 3)}x, "
            f"error {err}")
    if ort_runs:
        if err is None:
            return False, f"no measured error ({rep.get('error_skipped')})", rep
        for level in ("disable_all", "all"):
            try:
                e = ort_error(src, dst, inputs, level)
            except Exception as ex:  # noqa: BLE001
                return False, f"onnxruntime ({level}): {str(ex).splitlines()[0][:200]}", rep
            if not e <= err * 1.1 + 1e-4:
                return False, f"onnxruntime's error {e:.3g} disagrees with graphopt's ({note})", rep
        note += f", onnxruntime {e:.3g}"
    for sub in (["optimize", dst, "-o", os.path.join(tmp, name + ".opt.onnx")],
                ["plan", dst],
                ["grad", dst, "-o", os.path.join(tmp, name + ".grad.onnx"), "--loss", "mse"]):
        q = subprocess.run([*graphopt, *sub], capture_output=True, text=True, timeout=timeout)
        o = subprocess.run([*graphopt, *sub[:1], src, *sub[2:]], capture_output=True, text=True,
                           timeout=timeout)
        # What the original passes, the pruned model passes.
        if o.returncode == 0 and q.returncode != 0:
            return False, f"graphopt {sub[0]} refuses it: {short_err(q)}", rep
    return True, note, rep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("-k", help="only models whose name matches this regex")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    todo = [t for t in models() if not args.k or re.search(args.k, t[0])]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        with ThreadPoolExecutor(args.jobs) as ex:
            results = list(ex.map(lambda t: (t[0], check(graphopt, *t, args.ratio, tmp, args.timeout)), todo))
    seen = set()
    for name, (ok, note, rep) in results:
        seen.add(name)
        if ok and name in MUST_PRUNE:
            groups = (rep or {}).get("groups", [])
            pruned = [g for g in groups if g["removed"] > 0]
            heads = [g for g in groups if g["kind"] == "heads"]
            if not pruned or len(heads) < MUST_PRUNE[name]:
                ok, note = False, f"must prune ({MUST_PRUNE[name]} head groups): {note}"
        if ok and name in SPARSE:
            src, inputs = next((t[1], t[2]) for t in todo if t[0] == name)
            with tempfile.TemporaryDirectory() as tmp:
                ok, extra = check_sparse(graphopt, name, src, inputs, tmp, args.timeout)
            note += "; " + extra
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {note}")
        passed += ok
        failed += not ok
    for name in MUST_PRUNE:
        if not args.k and name not in seen:
            print(f"FAIL {name}: not in the manifests")
            failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
