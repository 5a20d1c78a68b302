#!/usr/bin/env python3
"""Memory-plan benchmark (issue 3): the MiniMalloc hard set and the real models.

1. MiniMalloc "challenging" instances (testdata/minimalloc, vendored):
   runs `cargo run --release -p graphopt-plan --example minimalloc_bench` with a
   1 s limit and 2 threads, once with the capacity from the file name as the
   first target (as MiniMalloc's solver receives it) and once from the lower
   bound alone.
2. Every model in testdata/models: `graphopt plan --json --verify
   --ignore-unknown` with every symbolic dim at 1 and at 8; prints original-order
   bound, chosen-order bound, aligned bound, arena, naive and arena/bound.

Writes benches/results/plan.json. Options: --graphopt BIN (default
$GRAPHOPT or target/release/graphopt, else target/debug/graphopt), --seconds S.
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "testdata" / "minimalloc"


def minimalloc(seconds, target):
    out = ROOT / "target" / f"minimalloc_{'target' if target else 'lb'}.json"
    cmd = ["cargo", "run", "-q", "--release", "-p", "graphopt-plan", "--example",
           "minimalloc_bench", "--", str(BENCH), str(seconds), "--json", str(out)]
    if not target:
        cmd.append("--no-target")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    sys.stderr.write(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
    return json.loads(out.read_text())


def models(graphopt, default_dim):
    rows = []
    for f in sorted((ROOT / "testdata" / "models").glob("*.onnx")):
        t = time.time()
        r = subprocess.run([graphopt, "plan", str(f), "--json", "--verify", "--ignore-unknown",
                            "--default-dim", str(default_dim)], capture_output=True, text=True)
        dt = time.time() - t
        if r.returncode != 0:
            rows.append({"model": f.stem, "error": r.stderr.strip()})
            continue
        d = json.loads(r.stdout)
        rows.append({
            "model": f.stem, "dims": d["dims"], "weights_bytes": d["weights_bytes"],
            "original_order_bound": d["lower_bound_original_order_bytes"],
            "chosen_order_bound": d["lower_bound_bytes"],
            "aligned_bound": d["arena_lower_bound_bytes"], "arena_bytes": d["arena_bytes"],
            "naive_bytes": d["naive_bytes"], "schedule": d["schedule_heuristic"],
            "strategy": d["strategy"], "optimal": d["optimal"], "verified": d.get("verified", False),
            "unknown_size_values": d.get("unknown_size_values", []),
            "arena_over_aligned_bound": round(d["arena_bytes"] / max(1, d["arena_lower_bound_bytes"]), 4),
            "arena_over_bound": round(d["arena_bytes"] / max(1, d["lower_bound_bytes"]), 4),
            "chosen_over_original": round(d["lower_bound_bytes"] / max(1, d["lower_bound_original_order_bytes"]), 4),
            "time_s": round(dt, 3),
        })
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", default=os.environ.get("GRAPHOPT"))
    ap.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args()
    g = a.graphopt
    if not g:
        rel = ROOT / "target" / "release" / "graphopt"
        g = str(rel if rel.exists() else ROOT / "target" / "debug" / "graphopt")
    res = {"machine": f"{os.cpu_count()} cores", "minimalloc": {}, "models": {}}
    if BENCH.exists():
        for target in (True, False):
            key = "capacity_from_file_name" if target else "lower_bound_only"
            res["minimalloc"][key] = mm = minimalloc(a.seconds, target)
            print(f"\n### MiniMalloc hard set, {a.seconds:g} s limit, 2 threads, {key.replace('_', ' ')}\n")
            print("| instance | buffers | lower bound | best known | greedy best | ours | ours/bound | time to result (s) |")
            print("|---|---|---|---|---|---|---|---|")
            for r in mm["instances"]:
                print(f"| {r['instance']} | {r['buffers']} | {r['lower_bound']:,} | {r['best_known']:,} | "
                      f"{r['greedy_best']:,} | {r['arena']:,} | {r['ratio']:.4f} | {r['time_s']:.3f} |")
    for dd in (1, 8):
        rows = res["models"][f"dims_{dd}"] = models(g, dd)
        print(f"\n### Real models, every symbolic dim = {dd}, alignment 256\n")
        print("| model | original-order bound | chosen-order bound | naive | arena | arena/aligned bound | arena/bound | schedule |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            if "error" in r:
                print(f"| {r['model']} | error: {r['error']} |")
                continue
            print(f"| {r['model']} | {r['original_order_bound']:,} | {r['chosen_order_bound']:,} | {r['naive_bytes']:,} | "
                  f"{r['arena_bytes']:,} | {r['arena_over_aligned_bound']:.4f} | {r['arena_over_bound']:.4f} | {r['schedule']} |")
    out = ROOT / "benches" / "results" / "plan.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
