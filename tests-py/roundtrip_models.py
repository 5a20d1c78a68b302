#!/usr/bin/env python3
"""Roundtrip the committed real-architecture models through `graphopt optimize`.

    python3 tests-py/roundtrip_models.py --graphopt target/debug/graphopt [--passes none]

For every model in testdata/models/MANIFEST.json:
  * run `graphopt optimize IN -o TMP/OUT.onnx [--passes P]`
  * the input model (and its external data) must not be modified (bytes + mtime)
  * onnx.checker must pass on the output (full_check where it passed on the original)
  * graph inputs/outputs must keep their names
  * the output runs in onnxruntime on NAME.inputs.npz; compared, output by output, with
    the original model run in onnxruntime on this machine (NAME.outputs.npz, recorded
    on another CPU, is bit-identical only on a like CPU: a mismatch is noted, not failed):
      --passes none : bit-identical (NaN == NaN)
      default passes: each output's relative L2 error <= the model's "default"
                      bound in testdata/tolerances.json (exact for ints/bools)
      other --passes: the same bound, or --tol
  * roundtrip-only models (custom domains ORT can't run): structural comparison
    (node count, op multiset, graph I/O, opsets) instead of running them.
Prints one line per model and finally `N passed, M failed`; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    REPO, bit_equal, check_level, checker_error, close_enough, compare_structure,
    external_data_files, file_fingerprint, load_tolerances, ort_session, resolve_graphopt,
    run_optimize, short_err, tolerance,
)


def check_model(entry, models_dir, graphopt, passes, tmp, args):
    name = entry["name"]
    src = os.path.join(models_dir, entry["file"])
    src_files = [src, *external_data_files(src)]
    before = file_fingerprint(src_files)
    dst_dir = os.path.join(tmp, name)
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, "out.onnx")
    report = os.path.join(dst_dir, "report.json") if args.report else None
    notes = []

    t0 = time.perf_counter()
    try:
        proc = run_optimize(graphopt, src, dst, passes, report, timeout=args.timeout)
    except Exception as e:  # noqa: BLE001 (TimeoutExpired, OSError)
        return False, f"graphopt did not run: {e}"
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        return False, f"graphopt exit {proc.returncode}: {short_err(proc)}"
    after = file_fingerprint(src_files)
    if after != before:
        changed = [os.path.basename(p) for p in src_files if before[p] != after[p]]
        return False, f"input files modified: {changed}"
    if not os.path.exists(dst):
        return False, "graphopt exited 0 but wrote no output"
    if report:
        try:
            with open(report) as f:
                json.load(f)
        except Exception as e:  # noqa: BLE001
            return False, f"--report file missing or not JSON: {e}"

    try:
        new = onnx.load(dst)
    except Exception as e:  # noqa: BLE001
        return False, f"output does not load as ModelProto: {e}"
    orig = onnx.load(src)
    full = bool(entry.get("full_check", True))
    lvl = check_level(dst, full=full)
    want = 2 if full else check_level(src, full=False)
    if lvl < want:
        return False, f"onnx.checker fails on output: {checker_error(dst, full)}"

    diffs = compare_structure(orig, new)
    io_diffs = [d for d in diffs if d.startswith(("graph inputs", "graph outputs"))]
    # With passes enabled unused graph inputs may legitimately go; outputs never.
    if passes == "none" and diffs and (entry.get("roundtrip_only") or args.strict_structure):
        return False, "structure changed: " + "; ".join(diffs)
    if io_diffs and (passes == "none" or any(d.startswith("graph outputs") for d in io_diffs)):
        return False, "; ".join(io_diffs)
    s_o, s_n = len(orig.graph.node), len(new.graph.node)
    notes.append(f"nodes {s_o}->{s_n}" if s_o != s_n else f"nodes {s_o}")
    if diffs and passes == "none":
        notes.append("STRUCTURE CHANGED: " + "; ".join(diffs))

    if not entry.get("runs_in_ort", True) or not entry.get("outputs"):
        notes.append("roundtrip-only (not run in ORT)")
        return True, f"{dt:.2f}s " + ", ".join(notes)

    datasets = [{"inputs": entry["inputs"], "outputs": entry["outputs"]},
                *entry.get("extra_datasets", [])]
    try:
        sess = ort_session(dst)
    except Exception as e:  # noqa: BLE001
        return False, f"ORT cannot load output: {str(e).strip().splitlines()[0][:300]}"
    sess_inputs = {i.name for i in sess.get_inputs()}
    out_names = [o.name for o in sess.get_outputs()]
    # The reference is the ORIGINAL model run here: the saved outputs were
    # recorded on another CPU, and onnxruntime's kernels (MLAS) round
    # differently on different instruction sets, so they are bit-identical
    # only on a machine like the one that made them. Whether they are
    # reproduced is reported, not failed.
    try:
        orig_sess = ort_session(src)
    except Exception as e:  # noqa: BLE001
        return False, f"ORT cannot load the original: {str(e).strip().splitlines()[0][:300]}"
    orig_inputs = {i.name for i in orig_sess.get_inputs()}
    orig_names = [o.name for o in orig_sess.get_outputs()]
    not_reproduced = 0
    worst = 0.0
    tol = None
    if passes != "none":
        tol = args.tol if args.tol is not None else tolerance(args.tolerances, name, "default")
    for ds in datasets:
        inputs = dict(np.load(os.path.join(models_dir, ds["inputs"])))
        saved = np.load(os.path.join(models_dir, ds["outputs"]))
        ref = dict(zip(orig_names, orig_sess.run(None, {k: v for k, v in inputs.items() if k in orig_inputs})))
        not_reproduced += sum(not bit_equal(ref[n], saved[n])[0] for n in entry["output_names"])
        feed = {k: v for k, v in inputs.items() if k in sess_inputs}
        if set(feed) != sess_inputs:
            return False, f"output model wants inputs {sorted(sess_inputs)}, have {sorted(inputs)}"
        try:
            got = sess.run(None, feed)
        except Exception as e:  # noqa: BLE001
            return False, f"ORT run failed on output: {str(e).strip().splitlines()[0][:300]}"
        for ref_name in entry["output_names"]:
            if ref_name not in out_names:
                return False, f"output {ref_name!r} missing (have {out_names})"
            a = got[out_names.index(ref_name)]
            b = ref[ref_name]
            if passes == "none":
                ok, why = bit_equal(a, b)
            else:
                ok, why = close_enough(a, b, tol)
                m = re.search(r"rel_l2=([0-9.e+-]+|inf|nan)", why)
                if m:
                    worst = max(worst, float(m.group(1)))
            if not ok:
                return False, f"output {ref_name!r} ({os.path.basename(ds['outputs'])}): {why}"
    notes.append("bit-identical" if passes == "none" else f"max rel_l2 {worst:.3g} (bound {tol:.2g})")
    if not_reproduced:
        notes.append(f"note: the original reproduces {not_reproduced} saved output(s) only approximately on this CPU")
    return True, f"{dt:.2f}s " + ", ".join(notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt", help="graphopt binary or command (default: $GRAPHOPT, target/{release,debug})")
    ap.add_argument("--passes", default=None,
                    help="value for --passes (default: omit the flag, i.e. graphopt's default pipeline)")
    ap.add_argument("--models", default=os.path.join(REPO, "testdata", "models"),
                    help="directory holding MANIFEST.json")
    ap.add_argument("-k", "--filter", help="regex on model names")
    ap.add_argument("--report", action="store_true", help="also pass --report and require valid JSON")
    ap.add_argument("--strict-structure", action="store_true",
                    help="with --passes none, fail when node count / op multiset changes")
    ap.add_argument("--keep", help="keep outputs in this directory instead of a temp dir")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--tol", type=float,
                    help="rel L2 bound for every model (default: testdata/tolerances.json, mode 'default')")
    args = ap.parse_args()

    graphopt = resolve_graphopt(args.graphopt)
    args.tolerances = load_tolerances()
    with open(os.path.join(args.models, "MANIFEST.json")) as f:
        manifest = json.load(f)
    entries = manifest["models"]
    if args.filter:
        entries = [e for e in entries if re.search(args.filter, e["name"])]

    tmp = args.keep or tempfile.mkdtemp(prefix="graphopt-roundtrip-")
    os.makedirs(tmp, exist_ok=True)
    passed = failed = 0
    t_all = time.perf_counter()
    try:
        for entry in entries:
            try:
                ok, msg = check_model(entry, args.models, graphopt, args.passes, tmp, args)
            except Exception as e:  # noqa: BLE001
                ok, msg = False, f"harness error: {type(e).__name__}: {e}"
            print(f"{'PASS' if ok else 'FAIL'}  {entry['name']:34s} {msg}", flush=True)
            passed += ok
            failed += not ok
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# graphopt: {' '.join(graphopt)}  passes: {args.passes or '(default)'}  "
          f"{time.perf_counter() - t_all:.1f}s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
