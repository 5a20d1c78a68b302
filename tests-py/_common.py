"""Shared helpers for graphopt's Python test scripts (no torch needed)."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


TOLERANCES = os.path.join(REPO, "testdata", "tolerances.json")


def load_tolerances() -> dict:
    """The shared table of error bounds, testdata/tolerances.json (format at its top)."""
    import json

    with open(TOLERANCES) as f:
        return json.load(f)


def tolerance(table: dict, model: str, mode: str) -> float:
    """The rel L2 bound of `model` in `mode`; a missing entry is an error, never a default."""
    try:
        return float(table["bounds"][model][mode])
    except KeyError:
        raise KeyError(f"no bound for model {model!r}, mode {mode!r} in {TOLERANCES}") from None


def resolve_graphopt(arg: str | None) -> list[str]:
    """Command prefix for graphopt: --graphopt, else $GRAPHOPT, else target/{release,debug}/graphopt.

    The value may be a command line with arguments (e.g. "python3 tests-py/fake_graphopt.py").
    """
    value = arg or os.environ.get("GRAPHOPT")
    if not value:
        for cand in ("target/release/graphopt", "target/debug/graphopt"):
            p = os.path.join(REPO, cand)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                value = p
                break
    if not value:
        raise SystemExit("graphopt binary not found: pass --graphopt PATH or set GRAPHOPT")
    if os.path.isfile(value):
        cmd = [os.path.abspath(value)]
        if value.endswith(".py"):
            import sys

            cmd = [sys.executable, *cmd]
        return cmd
    cmd = shlex.split(value)
    if cmd and os.path.isfile(cmd[-1]) and cmd[-1].endswith(".py"):
        cmd[-1] = os.path.abspath(cmd[-1])
    return cmd


def run_optimize(graphopt: list[str], src: str, dst: str, passes: str | None,
                 report: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [*graphopt, "optimize", src, "-o", dst]
    if passes is not None:
        cmd += ["--passes", passes]
    if report:
        cmd += ["--report", report]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def short_err(proc: subprocess.CompletedProcess, limit: int = 300) -> str:
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # prefer a line that looks like an error message
    for ln in lines:
        if "error" in ln.lower():
            return ln.strip()[:limit]
    return (lines[-1].strip() if lines else f"exit code {proc.returncode}")[:limit]


def file_fingerprint(paths: list[str]) -> dict[str, tuple[int, int, str]]:
    out = {}
    for p in paths:
        st = os.stat(p)
        with open(p, "rb") as f:
            h = hashlib.sha256()
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[p] = (st.st_size, st.st_mtime_ns, h.hexdigest())
    return out


def external_data_files(path: str) -> list[str]:
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    m = onnx.load(path, load_external_data=False)
    d = os.path.dirname(os.path.abspath(path))
    files = set()
    for t in _get_all_tensors(m):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    files.add(os.path.join(d, e.value))
    return sorted(files)


def manifest_models(folders=("models", "pypi")) -> list[tuple[str, str, str, bool]]:
    """(name, model path, inputs path, runs in onnxruntime) of every model with inputs in the
    MANIFEST.json of testdata/<folder>."""
    out = []
    for folder in folders:
        d = os.path.join(REPO, "testdata", folder)
        with open(os.path.join(d, "MANIFEST.json")) as f:
            for e in json.load(f)["models"]:
                if e.get("inputs"):
                    out.append((e["name"], os.path.join(d, e["file"]), os.path.join(d, e["inputs"]),
                                bool(e.get("runs_in_ort"))))
    return out


def ort_session(model: str | bytes, opt_level: str = "disable_all"):
    """Deterministic CPU session: 1 thread, graph optimizations disabled by default."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[opt_level]
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ort_error(src: str, dst: str, inputs: str, level: str = "disable_all") -> float:
    """Worst relative L2 of DST's float outputs against SRC's, both in onnxruntime on the
    arrays of INPUTS (SRC with optimizations off, DST at LEVEL)."""
    feeds = dict(np.load(inputs))
    ref, got = ort_session(src), ort_session(dst, level)
    names = [o.name for o in ref.get_outputs()]
    want = dict(zip(names, ref.run(None, {i.name: feeds[i.name] for i in ref.get_inputs()})))
    out = got.run(None, {i.name: feeds[i.name] for i in got.get_inputs()})
    worst = 0.0
    for o, g in zip(got.get_outputs(), out):
        e = want[o.name]
        if e.dtype.kind == "f":
            worst = max(worst, rel_l2(np.asarray(g, dtype=e.dtype), e))
    return worst


# ---------------------------------------------------------------- comparisons

def _as_np(x: Any) -> Any:
    if isinstance(x, (np.ndarray, np.generic)):
        return np.asarray(x)
    return x


def bit_equal(a: Any, b: Any) -> tuple[bool, str]:
    """Bit-identical comparison of (nested) ORT values; NaN equals NaN (any payload)."""
    a, b = _as_np(a), _as_np(b)
    if a is None or b is None:
        return (a is None and b is None), ("" if a is None and b is None else "None vs value")
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
            return False, f"{type(a).__name__} vs {type(b).__name__}"
        if len(a) != len(b):
            return False, f"sequence length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            ok, why = bit_equal(x, y)
            if not ok:
                return False, f"[{i}] {why}"
        return True, ""
    if isinstance(a, dict) or isinstance(b, dict):
        if not isinstance(a, dict) or not isinstance(b, dict) or a.keys() != b.keys():
            return False, "map keys differ"
        for k in a:
            ok, why = bit_equal(a[k], b[k])
            if not ok:
                return False, f"[{k!r}] {why}"
        return True, ""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype:
        return False, f"dtype {a.dtype} vs {b.dtype}"
    if a.shape != b.shape:
        return False, f"shape {a.shape} vs {b.shape}"
    if a.size == 0:
        return True, ""
    if a.dtype.kind in "fc" or a.dtype.kind == "V" or str(a.dtype).startswith(("float8", "bfloat")):
        if a.dtype.kind in "fc":
            nan = np.isnan(a) & np.isnan(b)
        else:
            nan = np.zeros(a.shape, bool)
        if a.dtype.kind == "c":
            ab = a.view(np.uint8).reshape(a.shape + (-1,))
            bb = b.view(np.uint8).reshape(b.shape + (-1,))
        else:
            ab = np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (-1,))
            bb = np.ascontiguousarray(b).view(np.uint8).reshape(b.shape + (-1,))
        same = np.all(ab == bb, axis=-1) | nan
        if not np.all(same):
            n = int((~same).sum())
            return False, f"{n}/{a.size} elements differ in bits"
        return True, ""
    if a.dtype.kind == "O":
        ok = a.shape == b.shape and all(x == y for x, y in zip(a.ravel(), b.ravel()))
        return ok, "" if ok else "object elements differ"
    if not np.array_equal(a, b):
        return False, f"{int((a != b).sum())}/{a.size} elements differ"
    return True, ""


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """Relative L2 error of a w.r.t. reference b (NaNs at the same positions ignored)."""
    a = np.asarray(a).astype(np.float64)
    b = np.asarray(b).astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    a = np.where(both_nan, 0, a)
    b = np.where(both_nan, 0, b)
    same_inf = np.isinf(a) & (a == b)
    a = np.where(same_inf, 0, a)
    b = np.where(same_inf, 0, b)
    num = np.linalg.norm((a - b).ravel())
    den = np.linalg.norm(b.ravel())
    if not np.isfinite(num):
        return float("inf")
    return float(num / den) if den > 0 else float(num)


def close_enough(a: Any, b: Any, tol: float) -> tuple[bool, str]:
    """Tolerance comparison used when passes are enabled: rel L2 for floats, exact otherwise."""
    a, b = _as_np(a), _as_np(b)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)) or a is None or b is None \
            or isinstance(a, dict):
        return bit_equal(a, b)
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False, f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.kind in "fc":
        e = rel_l2(a, b)
        return (e <= tol), f"rel_l2={e:.3g}"
    return bit_equal(a, b)


def allclose_nested(actual: Any, expected: Any, rtol: float, atol: float) -> bool:
    """onnx-backend-test style closeness (used only for the informational expected-output check)."""
    actual, expected = _as_np(actual), _as_np(expected)
    if expected is None or actual is None:
        return actual is None and expected is None
    if isinstance(expected, (list, tuple)):
        return isinstance(actual, (list, tuple)) and len(actual) == len(expected) and all(
            allclose_nested(x, y, rtol, atol) for x, y in zip(actual, expected))
    if isinstance(expected, dict):
        return isinstance(actual, dict) and actual.keys() == expected.keys() and all(
            allclose_nested(actual[k], expected[k], rtol, atol) for k in expected)
    try:
        a, e = np.asarray(actual), np.asarray(expected)
        if e.dtype.kind == "V" and a.dtype == np.uint8 and e.dtype.itemsize == 1:
            a = a.view(e.dtype)  # ORT returns float8 outputs as raw uint8
        if a.shape != e.shape:
            return False
        if e.dtype.kind in "fc" or a.dtype.kind in "fc":
            np.testing.assert_allclose(a.astype(np.float64) if a.dtype.kind != "c" else a,
                                       e.astype(np.float64) if e.dtype.kind != "c" else e,
                                       rtol=rtol, atol=atol, equal_nan=True)
            return True
        if e.dtype.kind in "OUS":
            return all(str(x) == str(y) for x, y in zip(a.ravel(), e.ravel()))
        return bool(np.array_equal(a.astype(e.dtype) if a.dtype != e.dtype else a, e))
    except (AssertionError, TypeError, ValueError):
        return False


# ------------------------------------------------------------ structural check

def structure(model) -> dict:
    """Coarse structural summary of a ModelProto (recursing into subgraphs)."""
    from collections import Counter

    ops: Counter = Counter()
    n_nodes = 0

    def walk(g):
        nonlocal n_nodes
        for n in g.node:
            n_nodes += 1
            ops[(n.domain if n.domain != "ai.onnx" else "", n.op_type)] += 1
            for a in n.attribute:
                if a.HasField("g"):
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(model.graph)
    return {
        "nodes": n_nodes,
        "ops": ops,
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
        "opsets": {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import},
        "functions": sorted((f.domain, f.name) for f in model.functions),
    }


def compare_structure(orig, new) -> list[str]:
    a, b = structure(orig), structure(new)
    diffs = []
    if a["nodes"] != b["nodes"]:
        diffs.append(f"node count {a['nodes']} -> {b['nodes']}")
    if a["ops"] != b["ops"]:
        extra = b["ops"] - a["ops"]
        missing = a["ops"] - b["ops"]
        diffs.append(f"ops differ (+{dict(extra)} -{dict(missing)})")
    if a["inputs"] != b["inputs"]:
        diffs.append(f"graph inputs {a['inputs']} -> {b['inputs']}")
    if a["outputs"] != b["outputs"]:
        diffs.append(f"graph outputs {a['outputs']} -> {b['outputs']}")
    if a["opsets"] != b["opsets"]:
        diffs.append(f"opsets {a['opsets']} -> {b['opsets']}")
    if a["functions"] != b["functions"]:
        diffs.append(f"functions {a['functions']} -> {b['functions']}")
    return diffs


def check_level(model_or_path, full: bool = True) -> int:
    """2 = full_check passes, 1 = plain check passes, 0 = checker fails."""
    import onnx

    try:
        onnx.checker.check_model(model_or_path, full_check=full)
        return 2 if full else 1
    except Exception:  # noqa: BLE001
        if not full:
            return 0
        try:
            onnx.checker.check_model(model_or_path)
            return 1
        except Exception:  # noqa: BLE001
            return 0


def checker_error(model_or_path, full: bool) -> str:
    import onnx

    try:
        onnx.checker.check_model(model_or_path, full_check=full)
        return ""
    except Exception as e:  # noqa: BLE001
        return str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
