#!/usr/bin/env python3
"""ONNX backend node-test conformance of `graphopt optimize --passes none`.

    python3 tests-py/conformance.py --graphopt target/debug/graphopt [--out DIR] [--jobs N]

Generates the ONNX backend *node* test cases from the installed onnx package
(onnx.backend.test.case.node.collect_testcases; the wheel ships the generators,
not the data), writes each case's model.onnx, roundtrips it through
`graphopt optimize IN -o OUT --passes none`, and then:

  * the roundtripped file must load as a ModelProto;
  * onnx.checker must pass on it (full_check if it passed on the original,
    otherwise the plain check if that passed on the original);
  * structure must be preserved: node count (incl. subgraphs), op multiset,
    graph input/output names, opset imports, model-local functions;
  * if ORT can run the ORIGINAL on the case inputs, the ROUNDTRIPPED model must
    run too and give bit-identical outputs (NaN == NaN). Whether the original
    also matches the case's expected outputs (rtol/atol) is reported, not required.

`--suites node,simple,pytorch-converted,pytorch-operator` (or `all`) adds the
~140 multi-node model cases shipped as files inside the onnx wheel.

Classes:
  pass  all of the above
  fail  graphopt error/timeout, unloadable output, checker/structure regression,
        ORT cannot run the roundtripped model, or output mismatch
  skip  "ort cannot run original" (structural checks above still enforced), or
        "nondeterministic" (the original disagrees with itself across two runs)

Prints per-class counts and failing case names; the final line is
`N passed, M failed, K skipped`; exit 1 if anything failed.
Per-case details go to DIR/results.json.

`--exec` checks graphopt's own runtime instead (the per-op kernel tests):
every node case whose ops all have CPU kernels (the `KERNELS` table of
crates/exec/src/cpu/registry.rs) runs as `graphopt run CASE.onnx --inputs IN.npz
-o OUT.npz --poison`, and its outputs must match the case's expected outputs
at the case's rtol/atol. Classes there:
  pass   ran, poison clean, outputs match
  fail   a kernel error, a crash, a mismatch, poison reaching an output; or a
         case in EXEC_KNOWN_FAILURES that no longer fails (remove it: the
         list is exact)
  xfail  fails, and EXEC_KNOWN_FAILURES says why
  skip   an op without a kernel ("no kernel": not in the table, or the
         one-line refusal of `graphopt run` for a dtype or attribute the
         kernel lacks, or for Scan before opset 9; If, Loop and Scan run
         when every op of their bodies has a kernel), a subgraph of another
         op, inputs or outputs the runtime does not
         take (non-tensors, omitted optionals, element types), or values
         whose size the runtime cannot plan even at run time (a float
         Range whose length depends on computed values)
It ends with the list of ops that have CPU kernels and their pass counts.
After a full run (no -k), every op of the table must have a passing case or
an entry in EXEC_UNTESTED_OPS that says why not (exact: a listed op that
passes is a failure too).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    REPO, allclose_nested, bit_equal, check_level, checker_error, compare_structure,
    resolve_graphopt, run_optimize, short_err,
)

CASES: list = []  # filled in the parent before the pool forks
CFG: dict = {}


DATA_SUITES = ("simple", "pytorch-converted", "pytorch-operator")


def _read_pb(path: str, type_proto):
    with open(path, "rb") as f:
        data = f.read()
    if type_proto.HasField("sequence_type"):
        p = onnx.SequenceProto()
        p.ParseFromString(data)
        return numpy_helper.to_list(p)
    if type_proto.HasField("optional_type"):
        p = onnx.OptionalProto()
        p.ParseFromString(data)
        return numpy_helper.to_optional(p)
    if type_proto.HasField("map_type"):
        p = onnx.MapProto()
        p.ParseFromString(data)
        return numpy_helper.to_dict(p)
    p = onnx.TensorProto()
    p.ParseFromString(data)
    return numpy_helper.to_array(p)


def collect_data_suite(suite: str):
    """Model test cases shipped as files in the onnx wheel (onnx/backend/test/data/SUITE)."""
    from onnx.backend.test.case.test_case import TestCase

    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", suite)
    cases = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        d = os.path.join(root, name)
        mp = os.path.join(d, "model.onnx")
        ds = os.path.join(d, "test_data_set_0")
        if not (os.path.isfile(mp) and os.path.isdir(ds)):
            continue
        model = onnx.load(mp)
        init = {t.name for t in model.graph.initializer}
        gin = [i for i in model.graph.input if i.name not in init]
        inputs, outputs = [], []
        for j, vi in enumerate(gin):
            f = os.path.join(ds, f"input_{j}.pb")
            if os.path.exists(f):
                inputs.append(_read_pb(f, vi.type))
        for j, vi in enumerate(model.graph.output):
            f = os.path.join(ds, f"output_{j}.pb")
            if os.path.exists(f):
                outputs.append(_read_pb(f, vi.type))
        cases.append(TestCase(name=f"{suite}/{name}", model_name=name, url=None, model_dir=d,
                              model=model, data_sets=[(inputs, outputs)], kind=suite,
                              rtol=1e-3, atol=1e-7))
    return cases


def collect_cases(pattern: str | None, suites=("node",)):
    import onnx.backend.test.case.node as node_cases

    cases = []
    if "node" in suites:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np_err = np.seterr(all="ignore")
            try:
                cases = node_cases.collect_testcases(None)
            finally:
                np.seterr(**np_err)
        cases = [c for c in cases if c.kind == "node" and c.model is not None]
    for suite in suites:
        if suite in DATA_SUITES:
            cases += collect_data_suite(suite)
        elif suite != "node":
            raise SystemExit(f"unknown suite {suite!r}; known: node, {', '.join(DATA_SUITES)}")
    if pattern:
        rx = re.compile(pattern)
        cases = [c for c in cases if rx.search(c.name)]
    return sorted(cases, key=lambda c: c.name)


# ----------------------------------------------------------------- ORT feeding

def _to_value(x):
    """Case data -> value ORT's python API accepts (TensorProto -> ndarray, recursively)."""
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, list):
        return [_to_value(v) for v in x]
    if isinstance(x, dict):
        return {k: _to_value(v) for k, v in x.items()}
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x


_FLOAT8 = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ,
           onnx.TensorProto.FLOAT8E5M2, onnx.TensorProto.FLOAT8E5M2FNUZ}


def _ort_input(v):
    """float8 arrays (ml_dtypes) can't be fed directly; wrap them as typed OrtValues."""
    if isinstance(v, np.ndarray) and v.dtype.kind == "V" and v.dtype.itemsize == 1:
        try:
            et = onnx.helper.np_dtype_to_tensor_dtype(v.dtype)
        except Exception:  # noqa: BLE001
            return v
        if et in _FLOAT8:
            import onnxruntime as ort

            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(v).view(np.uint8), et)
    return v


def make_feed(model: onnx.ModelProto, inputs):
    init_names = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in init_names]
    feed = {}
    for vi, val in zip(graph_inputs, inputs):
        v = _to_value(val)
        if v is None:  # absent optional: leave unfed
            continue
        feed[vi.name] = _ort_input(v)
    return feed


def _ort_err(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:240]


def run_ort(path: str, feed):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


# --------------------------------------------------------------------- worker

def _proto_identical(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """Informational: equal after clearing fields a roundtrip may legitimately rewrite."""
    a2, b2 = onnx.ModelProto(), onnx.ModelProto()
    a2.CopyFrom(a)
    b2.CopyFrom(b)
    for m in (a2, b2):
        m.ClearField("producer_name")
        m.ClearField("producer_version")
    return a2.SerializeToString(deterministic=True) == b2.SerializeToString(deterministic=True)


def run_case(idx: int) -> dict:
    try:
        return _run_case(idx)
    except Exception as e:  # noqa: BLE001
        return {"name": CASES[idx].name, "cls": "fail", "expected_match": None, "proto_identical": None,
                "reason": f"harness error: {type(e).__name__}: {e}"[:300]}


def _run_case(idx: int) -> dict:
    case = CASES[idx]
    out_dir = os.path.join(CFG["out"], case.name)
    src = os.path.join(out_dir, "model.onnx")
    dst = os.path.join(out_dir, "roundtrip.onnx")
    res = {"name": case.name, "cls": None, "reason": "", "expected_match": None,
           "proto_identical": None}
    t0 = time.perf_counter()
    try:
        proc = run_optimize(CFG["graphopt"], src, dst, "none", timeout=CFG["timeout"])
    except Exception as e:  # noqa: BLE001 (TimeoutExpired, OSError)
        res.update(cls="fail", reason=f"graphopt did not finish: {type(e).__name__}: {e}"[:300])
        return res
    res["graphopt_s"] = round(time.perf_counter() - t0, 4)
    if proc.returncode != 0:
        res.update(cls="fail", reason=f"graphopt exit {proc.returncode}: {short_err(proc)}")
        with open(os.path.join(out_dir, "graphopt.stderr"), "w") as f:
            f.write(proc.stderr or "")
        return res
    try:
        new = onnx.load(dst)
    except Exception as e:  # noqa: BLE001
        res.update(cls="fail", reason=f"output not a loadable ModelProto: {e}"[:300])
        return res
    orig = case.model
    res["proto_identical"] = _proto_identical(orig, new)

    # checker: no regression w.r.t. the original
    lvl_orig = check_level(orig, full=True)
    if lvl_orig:
        lvl_new = check_level(new, full=lvl_orig == 2)
        want = lvl_orig if lvl_orig == 1 else 2
        if lvl_new < want:
            res.update(cls="fail", reason="checker fails on roundtrip (passes on original): "
                       + checker_error(new, full=lvl_orig == 2))
            return res

    diffs = compare_structure(orig, new)
    if diffs:
        res.update(cls="fail", reason="structure changed: " + "; ".join(diffs)[:400])
        return res

    if CFG.get("plan"):
        # Every node-test model must plan (values of unknown size become
        # dynamic allocations), and the independent checker must accept it.
        try:
            proc = subprocess.run([*CFG["graphopt"], "plan", src, "--json", "--verify", "--nodes", "20000"],
                                  capture_output=True, text=True, timeout=CFG["timeout"])
        except Exception as e:  # noqa: BLE001
            res.update(cls="fail", reason=f"plan did not finish: {type(e).__name__}: {e}"[:300])
            return res
        if proc.returncode != 0:
            res.update(cls="fail", reason=f"plan failed: {short_err(proc)}")
            return res
        p = json.loads(proc.stdout)
        res["plan"] = {"arena": p["arena_bytes"], "bound": p["arena_lower_bound_bytes"],
                       "alignment": p["alignment"], "dynamic": len(p.get("dynamic_values", []))}

    inputs, expected = case.data_sets[0]
    try:
        feed = make_feed(orig, inputs)
        ref = run_ort(src, feed)
    except Exception as e:  # noqa: BLE001
        res.update(cls="skip", reason="ort cannot run original: " + _ort_err(e))
        return res
    try:
        got = run_ort(dst, make_feed(new, inputs))
    except Exception as e:  # noqa: BLE001
        res.update(cls="fail", reason="ORT runs original but not roundtrip: " + _ort_err(e))
        return res
    try:
        res["expected_match"] = bool(len(ref) == len(expected) and all(
            allclose_nested(r, _to_value(e), case.rtol, case.atol) for r, e in zip(ref, expected)))
    except Exception:  # noqa: BLE001
        res["expected_match"] = False
    if len(got) != len(ref):
        res.update(cls="fail", reason=f"{len(got)} outputs vs {len(ref)}")
        return res
    for i, (a, b) in enumerate(zip(got, ref)):
        ok, why = bit_equal(a, b)
        if not ok:
            # Nondeterministic op (random*, dropout...)? Compare the original with itself.
            try:
                ref2 = run_ort(src, feed)
                self_ok = all(bit_equal(x, y)[0] for x, y in zip(ref, ref2))
            except Exception:  # noqa: BLE001
                self_ok = True
            if not self_ok:
                res.update(cls="skip", reason="nondeterministic: original disagrees with itself")
                return res
            res.update(cls="fail", reason=f"output {i} ({orig.graph.output[i].name}) differs: {why}")
            return res
    res["cls"] = "pass"
    return res


# ------------------------------------------------------------- --exec mode

_RANDOM_DROPOUT = ("Dropout in training mode with a ratio above 0 draws a random mask; the runtime "
                   "refuses it (no RNG to match the reference's)")
_F32_IFFT = ("the expected values are numpy's ifft in complex64: 10 of 200 imaginary parts that are "
             "exactly 0 come out 1.9e-7 there, beyond the case's atol 1e-7; the runtime sums in f64 "
             "and gives 3e-15 (within 4.4e-15 of numpy's complex128 ifft everywhere)")
# Node cases that fail in graphopt's runtime, and why. Exact: a listed case
# that stops failing is itself a failure (remove it from the list).
EXEC_KNOWN_FAILURES: dict[str, str] = {
    "test_training_dropout": _RANDOM_DROPOUT,
    "test_training_dropout_default": _RANDOM_DROPOUT,
    "test_training_dropout_default_mask": _RANDOM_DROPOUT,
    "test_training_dropout_mask": _RANDOM_DROPOUT,
    "test_attention_4d_causal_fp16_expanded": (
        "fp16 rounding: 2 of 192 outputs are 2 fp16 ulps (4.9e-4 at 0.49) off the reference, which "
        "computes with numpy's fp16 arithmetic where the runtime computes each node in f32 and rounds "
        "its output once; the case's rtol 1e-3 is about one ulp"),
    "test_dft_inverse": _F32_IFFT,
    "test_dft_inverse_opset19": _F32_IFFT,
}

# `graphopt run` refusals that make a case a skip (not a failure): the
# runtime does not take it yet. Anything else that stops a run is a failure.
_EXEC_SKIPS = [
    (re.compile(r"no cpu kernel for"), "no kernel"),
    (re.compile(r"Scan before opset 9"), "no kernel"),
    (re.compile(r"data-dependent size"), "dynamic size"),
    # A size the runtime cannot plan even at the input shapes it sees (a
    # float Range whose length depends on computed values).
    (re.compile(r"is unknown even at the input shapes seen"), "dynamic size"),
    (re.compile(r"which the runtime does not handle|holds strings|string default"), "element type"),
    (re.compile(r"has no concrete shape"), "unknown shape"),
    (re.compile(r"inputs\.npz: array .*unsupported dtype"), "input element type"),
    (re.compile(r"output type \w+ is not supported"), "output element type"),
]


def cpu_kernel_ops() -> list[str]:
    """The default-domain ops of the CPU backend's kernel table (`KERNELS` in
    crates/exec/src/cpu/registry.rs), read from its source: the op name of
    each line of the table that starts with `widen("` or `as_is("` (a unit
    test there checks that this finds every default-domain entry)."""
    path = os.path.join(REPO, "crates", "exec", "src", "cpu", "registry.rs")
    with open(path) as f:
        m = re.search(r"pub const KERNELS: &\[Entry\] = &\[(.*?)\n\];", f.read(), re.S)
    ops = re.findall(r'^\s*(?:widen|as_is)\("(\w+)"', m.group(1), re.M) if m else []
    if not ops:
        raise SystemExit(f"no `pub const KERNELS` table with widen(\"Op\", ...) entries in {path}")
    return ops


def data_sized_ops() -> list[str]:
    """The ops whose output size depends on input values, which the runtime
    computes on the host (`OPS` in crates/exec/src/cpu/data_sized.rs); held
    to the same rule as the kernel table's: each needs a passing node case."""
    path = os.path.join(REPO, "crates", "exec", "src", "cpu", "data_sized.rs")
    with open(path) as f:
        m = re.search(r"pub const OPS: &\[&str\] = &\[(.*?)\];", f.read(), re.S)
    ops = re.findall(r'"(\w+)"', m.group(1)) if m else []
    if not ops:
        raise SystemExit(f"no `pub const OPS` list in {path}")
    return ops


# Ops of the CPU kernel table that no passing node case covers, and why.
# Exact, as EXEC_KNOWN_FAILURES: after a full --exec run, an op of the table
# without a passing case and not listed here is a failure, and so is a listed
# op that has one (remove it) or that is not in the table.
EXEC_UNTESTED_OPS: dict[str, str] = {
}


# Ops the runtime runs as nested programs (crates/exec/src/control.rs), not
# kernels of the table.
CONTROL_OPS = ["If", "Loop", "Scan"]


def case_ops(model: onnx.ModelProto) -> tuple[list[str], bool]:
    """Op types of the main graph and its subgraphs (non-default domains
    qualified), and whether a subgraph is not an If, Loop or Scan body."""
    ops, other = [], False

    def walk(g):
        nonlocal other
        for n in g.node:
            ops.append(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
            for a in n.attribute:
                subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else (
                    list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
                if subs and n.op_type not in CONTROL_OPS:
                    other = True
                for s in subs:
                    walk(s)

    walk(model.graph)
    return ops, other


def _run_exec_case(idx: int) -> dict:
    case = CASES[idx]
    out_dir = os.path.join(CFG["out"], case.name)
    model = case.model
    ops, sub = case_ops(model)
    res = {"name": case.name, "cls": "skip", "reason": "", "ops": sorted(set(ops))}
    missing = sorted({o for o in ops if o not in CFG["kernel_ops"]})
    if missing:
        res["reason"] = f"no kernel: {', '.join(missing)}"
        return res
    if sub:
        res["reason"] = "subgraph: only If, Loop and Scan bodies run"
        return res
    inputs, expected = case.data_sets[0]
    init = {t.name for t in model.graph.initializer}
    gin = [i for i in model.graph.input if i.name not in init]
    arrays = {}
    for vi, val in zip(gin, inputs):
        v = _to_value(val)
        if v is None:
            res["reason"] = "omitted optional input"
            return res
        if not isinstance(v, np.ndarray):
            res["reason"] = f"non-tensor input ({type(v).__name__})"
            return res
        if v.dtype.kind in "OUSVc":
            res["reason"] = f"input element type {v.dtype}"
            return res
        arrays[vi.name] = v
    if len(arrays) != len(gin) or any(not isinstance(_to_value(e), np.ndarray) for e in expected):
        res["reason"] = "non-tensor or missing input or output"
        return res
    src = os.path.join(out_dir, "model.onnx")
    inp = os.path.join(out_dir, "inputs.npz")
    outp = os.path.join(out_dir, "outputs.npz")
    np.savez(inp, **arrays)
    # Node tests feed NaN and Inf on purpose (IsNaN, Max with NaN, ...).
    cmd = [*CFG["graphopt"], "run", src, "--inputs", inp, "-o", outp, "--poison", "--threads", "1",
           "--allow-non-finite"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CFG["timeout"])
    except Exception as e:  # noqa: BLE001
        res.update(cls="fail", reason=f"graphopt run did not finish: {type(e).__name__}: {e}"[:300])
        return res
    if proc.returncode != 0:
        err = short_err(proc)
        for rx, kind in _EXEC_SKIPS:
            if rx.search(proc.stderr or ""):
                res["reason"] = f"{kind}: {err}"
                return res
        res.update(cls="fail", reason=f"graphopt run exit {proc.returncode}: {err}")
        return res
    try:
        with np.load(outp) as z:
            got = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001
        res.update(cls="fail", reason=f"unreadable outputs: {e}"[:300])
        return res
    names = [o.name for o in model.graph.output]
    for i, (name, e) in enumerate(zip(names, expected)):
        e = _to_value(e)
        if name not in got:
            res.update(cls="fail", reason=f"output {i} ({name}) missing")
            return res
        a = got[name]
        if not allclose_nested(a, e, case.rtol, case.atol):
            if a.shape != e.shape:
                why = f"shape {a.shape} != expected {e.shape}"
            else:
                with np.errstate(all="ignore"):
                    d = np.abs(a.astype(np.float64) - e.astype(np.float64))
                why = f"max abs diff {np.nanmax(d) if d.size else 0:.3g} (rtol {case.rtol}, atol {case.atol})"
            res.update(cls="fail", reason=f"output {i} ({name}) differs: {why}")
            return res
    res.update(cls="pass", reason="")
    return res


def run_exec_case(idx: int) -> dict:
    try:
        return _run_exec_case(idx)
    except Exception as e:  # noqa: BLE001
        return {"name": CASES[idx].name, "cls": "fail", "ops": [],
                "reason": f"harness error: {type(e).__name__}: {e}"[:300]}


def exec_summary(results: list, kernel_ops: list[str], table_ops: list[str]) -> int:
    """Applies EXEC_KNOWN_FAILURES and EXEC_UNTESTED_OPS (exactly), prints the per-op
    table; returns the failure count."""
    names = {r["name"] for r in results}
    for r in results:
        known = EXEC_KNOWN_FAILURES.get(r["name"])
        if known is None:
            continue
        if r["cls"] == "fail":
            r.update(cls="xfail", reason=f"{known} [{r['reason']}]")
        else:
            r.update(cls="fail", reason=f"in EXEC_KNOWN_FAILURES but {r['cls']}: remove it")
    if not CFG.get("filtered"):
        for stale in sorted(set(EXEC_KNOWN_FAILURES) - names):
            results.append({"name": stale, "cls": "fail", "ops": [],
                            "reason": "in EXEC_KNOWN_FAILURES but no such case: remove it"})
    per_op = {op: Counter() for op in kernel_ops}
    for r in results:
        for op in r.get("ops", []):
            if op in per_op:
                per_op[op][r["cls"]] += 1
    if not CFG.get("filtered"):
        # Every op of the kernel table has a passing node case, or a stated
        # reason in EXEC_UNTESTED_OPS (the list is exact).
        for op in table_ops:
            why, passed = EXEC_UNTESTED_OPS.get(op), per_op[op]["pass"]
            if not passed and why is None:
                results.append({"name": f"[op {op}]", "cls": "fail", "ops": [],
                                "reason": f"{op} is in the CPU kernel table but no node case passes: "
                                          "add one or an EXEC_UNTESTED_OPS entry saying why"})
            elif passed and why is not None:
                results.append({"name": f"[op {op}]", "cls": "fail", "ops": [],
                                "reason": f"in EXEC_UNTESTED_OPS but {passed} node case(s) pass: remove it"})
        for stale in sorted(set(EXEC_UNTESTED_OPS) - set(table_ops)):
            results.append({"name": f"[op {stale}]", "cls": "fail", "ops": [],
                            "reason": "in EXEC_UNTESTED_OPS but not in the CPU kernel table: remove it"})
    counts = Counter(r["cls"] for r in results)
    fails = [r for r in results if r["cls"] == "fail"]
    if fails:
        print(f"\nFAILED ({len(fails)}):")
        for r in fails:
            print(f"  {r['name']}: {r['reason']}")
    xf = [r for r in results if r["cls"] == "xfail"]
    if xf:
        print(f"\nKNOWN FAILURES ({len(xf)}):")
        for r in xf:
            print(f"  {r['name']}: {r['reason']}")
    if CFG.get("list_skips"):
        print("\nSKIPPED:")
        for r in results:
            if r["cls"] == "skip":
                print(f"  {r['name']}: {r['reason']}")
    skip_kinds = Counter(re.sub(r":.*", "", r["reason"]) for r in results if r["cls"] == "skip")
    print(f"\n# ops with CPU kernels ({len(kernel_ops)}): node cases passed/run "
          "(run = pass + fail + known failures; cases skipped for another op or an unsupported type not counted)")
    cells = []
    for op in kernel_ops:
        c = per_op[op]
        run = c["pass"] + c["fail"] + c["xfail"]
        cells.append(f"{op} {c['pass']}/{run}")
    for i in range(0, len(cells), 6):
        print("#   " + ", ".join(cells[i:i + 6]))
    untested = [op for op in kernel_ops if not sum(per_op[op][k] for k in ("pass", "fail", "xfail"))]
    if untested and not CFG.get("filtered"):
        print(f"# kernels no node case ran: {', '.join(untested)}")
    print("# skip reasons:", ", ".join(f"{k}: {v}" for k, v in skip_kinds.most_common()) or "-")
    print("\n# classes:", ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return counts.get("fail", 0)


def _init_worker(cfg):
    CFG.update(cfg)
    warnings.simplefilter("ignore")


# ----------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt", help="graphopt binary or command (default: $GRAPHOPT, target/{release,debug})")
    ap.add_argument("--out", help="work directory (kept); default: a temp dir that is removed")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("-k", "--filter", help="regex on case names")
    ap.add_argument("--suites", default="node",
                    help="comma-separated: node (generated, default), and/or the model cases shipped "
                         f"in the onnx wheel: {', '.join(DATA_SUITES)}; 'all' = every one")
    ap.add_argument("--timeout", type=float, default=60, help="per graphopt invocation (s)")
    ap.add_argument("--plan", action="store_true",
                    help="also `graphopt plan --verify` every model: it must plan, and the arena is reported "
                         "against the aligned lower bound")
    ap.add_argument("--exec", action="store_true",
                    help="run each node case whose ops have CPU kernels in graphopt's runtime (`graphopt run`) "
                         "and compare with the expected outputs, instead of the roundtrip")
    ap.add_argument("--list-skips", action="store_true", help="print every skipped case and reason")
    ap.add_argument("--expect-fail", help="file with case names (one per line) allowed to fail")
    args = ap.parse_args()

    t_start = time.perf_counter()
    graphopt = resolve_graphopt(args.graphopt)
    suites = ("node", *DATA_SUITES) if args.suites == "all" else tuple(args.suites.split(","))
    cases = collect_cases(args.filter, suites)
    CASES.extend(cases)
    out = args.out or tempfile.mkdtemp(prefix="graphopt-conformance-")
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    for c in cases:
        d = os.path.join(out, c.name)
        os.makedirs(d, exist_ok=True)
        for stale in ("roundtrip.onnx", "graphopt.stderr"):
            if os.path.exists(os.path.join(d, stale)):
                os.remove(os.path.join(d, stale))
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(c.model.SerializeToString())
    t_gen = time.perf_counter() - t_start
    print(f"# {len(cases)} cases ({'+'.join(suites)}) from onnx {onnx.__version__} written to {out} ({t_gen:.1f}s)",
          flush=True)

    cfg = {"graphopt": graphopt, "out": out, "timeout": args.timeout, "plan": args.plan}
    if args.exec:
        if suites != ("node",):
            raise SystemExit("--exec runs the node suite only")
        table_ops = cpu_kernel_ops() + data_sized_ops()
        cfg.update(kernel_ops=table_ops + CONTROL_OPS, table_ops=table_ops, filtered=bool(args.filter),
                   list_skips=args.list_skips)
    work = run_exec_case if args.exec else run_case
    _init_worker(cfg)
    results = []
    t_run = time.perf_counter()
    try:
        if args.jobs <= 1:
            for i in range(len(cases)):
                results.append(work(i))
        else:
            ctx = mp.get_context("fork")
            with ctx.Pool(args.jobs, initializer=_init_worker, initargs=(cfg,)) as pool:
                for r in pool.imap_unordered(work, range(len(cases)), chunksize=4):
                    results.append(r)
                    if len(results) % 250 == 0:
                        print(f"#   {len(results)}/{len(cases)} ...", flush=True)
    finally:
        pass
    t_run = time.perf_counter() - t_run
    results.sort(key=lambda r: r["name"])
    if args.exec:
        nfail = exec_summary(results, cfg["kernel_ops"], cfg["table_ops"])
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump({"graphopt": graphopt, "onnx": onnx.__version__, "cases": results}, f, indent=1)
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
        c = Counter(r["cls"] for r in results)
        print(f"# run phase {t_run:.1f}s with {args.jobs} jobs; total {time.perf_counter() - t_start:.1f}s")
        print(f"{c.get('pass', 0)} passed, {nfail} failed, {c.get('skip', 0)} skipped, "
              f"{c.get('xfail', 0)} known failures")
        return 1 if nfail else 0

    allowed = set()
    if args.expect_fail:
        with open(args.expect_fail) as f:
            allowed = {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}
    for r in results:
        if r["cls"] == "fail" and r["name"] in allowed:
            r["cls"] = "xfail"

    counts = Counter(r["cls"] for r in results)
    skip_reasons = Counter(re.sub(r":.*", "", r["reason"]) for r in results if r["cls"] == "skip")
    passes = [r for r in results if r["cls"] == "pass"]
    exp_ok = sum(1 for r in passes if r["expected_match"])
    identical = sum(1 for r in results if r["proto_identical"])
    loaded = sum(1 for r in results if r["proto_identical"] is not None)
    gtimes = [r["graphopt_s"] for r in results if "graphopt_s" in r]

    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"graphopt": graphopt, "onnx": onnx.__version__, "counts": dict(counts),
                   "cases": results}, f, indent=1)

    fails = [r for r in results if r["cls"] == "fail"]
    if fails:
        print(f"\nFAILED ({len(fails)}):")
        for r in fails:
            print(f"  {r['name']}: {r['reason']}")
    if args.list_skips:
        print("\nSKIPPED:")
        for r in results:
            if r["cls"] == "skip":
                print(f"  {r['name']}: {r['reason']}")
    fail_kinds = Counter(re.sub(r"[:(].*", "", r["reason"]).strip() for r in fails)
    print("\n# classes:", ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if fail_kinds:
        print("# failure kinds:", ", ".join(f"{k}: {v}" for k, v in fail_kinds.most_common()))
    print("# skip reasons:", ", ".join(f"{k}: {v}" for k, v in skip_reasons.most_common()) or "-")
    print(f"# passes whose original also matches the expected outputs (rtol/atol): {exp_ok}/{len(passes)}")
    print(f"# roundtrip protos identical to the original (ignoring producer): {identical}/{loaded}")
    if gtimes:
        print(f"# graphopt per call: mean {1000 * np.mean(gtimes):.1f} ms, max {1000 * max(gtimes):.0f} ms;"
              f" run phase {t_run:.1f}s with {args.jobs} jobs; total {time.perf_counter() - t_start:.1f}s")
    plans = [r["plan"] for r in results if "plan" in r]
    if plans:
        over = [p for p in plans if p["arena"] > 1.01 * p["bound"]]
        # Above 1.01x only where the gap is under one alignment unit: tiny
        # arenas whose bound is not a multiple of the alignment.
        real = [p for p in over if p["arena"] - p["bound"] > p["alignment"] + 8]
        print(f"# planned {len(plans)} models: {len(over)} arenas above 1.01x the aligned bound, "
              f"{len(real)} of them by more than one alignment unit; "
              f"{sum(1 for p in plans if p['dynamic'])} with dynamic values")
        for p in real[:10]:
            print(f"#   gap: {p}")
    if counts.get("xfail"):
        print(f"# {counts['xfail']} expected failures (--expect-fail)")
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    print(f"{counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, {counts.get('skip', 0)} skipped")
    return 1 if counts.get("fail") else 0


if __name__ == "__main__":
    sys.exit(main())
