#!/usr/bin/env python3
"""Planning coverage: does `graphopt plan` give a valid plan on every model onnxruntime runs?

    python3 benches/plan_coverage.py [--graphopt BIN] [--sets testdata,pypi,light]

For every model of the sets (testdata/models, the pretrained PyPI OCR/speech models of
benches/pypi_models.py, and the onnx package's `light` model-zoo graphs), with the
model's own inputs where it has an `.inputs.npz` (shapes as onnxruntime sees them):
`graphopt plan MODEL --json --verify [--inputs X.npz]`. A row passes when the plan
verifies with the independent checker and its arena is within 1.01x its aligned lower
bound; values of data-dependent size are dynamic allocations outside the arena and are
counted, not failures. Writes benches/results/plan_coverage.json and prints a table.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests-py"))
from _common import resolve_graphopt  # noqa: E402


def model_sets(sets):
    out = []
    if "testdata" in sets:
        for f in sorted(glob.glob(os.path.join(REPO, "testdata", "models", "*.onnx"))):
            npz = f[:-5] + ".inputs.npz"
            out.append((f"testdata/{os.path.basename(f)[:-5]}", f, npz if os.path.exists(npz) else None))
    if "pypi" in sets:
        from pypi_models import pypi_models
        out += pypi_models()
    if "light" in sets:
        import onnx
        light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
        for f in sorted(glob.glob(os.path.join(light, "*.onnx"))):
            out.append((f"light/{os.path.basename(f)[:-5]}", f, None))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt")
    ap.add_argument("--sets", default="testdata,pypi,light")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "plan_coverage.json"))
    args = ap.parse_args()
    graphopt = resolve_graphopt(args.graphopt)
    rows = []
    for name, path, inputs in model_sets(set(args.sets.split(","))):
        cmd = [*graphopt, "plan", path, "--json", "--verify"]
        if inputs:
            cmd += ["--inputs", inputs]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        dt = time.perf_counter() - t0
        row = {"model": name, "inputs": bool(inputs), "time_s": round(dt, 2)}
        if p.returncode != 0:
            row["error"] = (p.stderr.strip().splitlines() or ["?"])[-1][:300]
        else:
            d = json.loads(p.stdout)
            bound = max(1, d["arena_lower_bound_bytes"])
            row.update({
                "arena_bytes": d["arena_bytes"], "aligned_bound_bytes": d["arena_lower_bound_bytes"],
                "ratio": round(d["arena_bytes"] / bound, 4), "verified": d.get("verified", False),
                "dynamic_values": len(d.get("dynamic_values", [])),
                "subgraph_arena_bytes": d.get("subgraph_arena_bytes", 0),
            })
            row["ok"] = bool(row["verified"]) and row["ratio"] <= 1.01
        row.setdefault("ok", False)
        rows.append(row)
        status = (f"{row['arena_bytes']:>12,} B  {row['ratio']:.4f}x  dyn {row['dynamic_values']}"
                  if "error" not in row else "FAILS: " + row["error"])
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {name:55} {status}", flush=True)
    n_ok = sum(r["ok"] for r in rows)
    print(f"\n{n_ok} / {len(rows)} models planned, verified, arena <= 1.01x the aligned bound"
          f" ({sum(1 for r in rows if r.get('dynamic_values'))} with dynamic values)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"graphopt": " ".join(graphopt), "models": rows}, f, indent=1)
        f.write("\n")
    return 0 if n_ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
