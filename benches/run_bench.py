#!/usr/bin/env python3
"""`graphopt run` beside onnxruntime CPU: latency, peak RSS and activation memory, same inputs,
same thread count, same run.

    cargo build --release --bin graphopt
    python3 benches/run_bench.py --graphopt target/release/graphopt [-k REGEX] [--repeat N]
        [--threads N] [--no-fp16]

Models (exported on first use into benches/models/run/, git-ignored, seeded random weights, by
precision_bench.py's exporter): torchvision resnet50 and mobilenet_v2 (224x224), BERT-base and
GPT-2 (124M, LM head) at sequence length 128, each at batch 1 and 8 (TorchScript exporter), and
the fp16 version of each (`graphopt optimize --precision fp16`).

Per model, each tool in its own fresh process:
  * graphopt: `graphopt run OPT.onnx --inputs IN.npz --repeat N --threads T --json`, where OPT is
    the default pipeline's output (graphopt's own runtime runs what graphopt makes); activation
    memory = the planned arena + kernel workspace (+ dynamic allocations), all allocated once.
  * onnxruntime: InferenceSession(ORIGINAL, ORT_ENABLE_ALL, intra_op_num_threads=T, sequential,
    CPU memory arena off so freed activations leave the process); one warm-up run then N timed runs.
    Its activation memory is read as peak RSS during the runs minus RSS after session creation
    (weights and initialised kernels are resident by then): the allocations its runs made.
  * Both: best and median latency of N, peak RSS of the process (VmHWM), and graphopt's outputs
    against onnxruntime's (rel L2 over the float outputs).
  * `--rounds R` (default 1) alternates the two processes R times per row (and torch's step R
    times): the median of the rounds' medians, the best of all runs, the highest RSS. On a
    machine whose speed drifts over seconds (shared hosts), a single back-to-back pair can put
    one tool in a slow spell; alternating spreads the spells over both.
The fp16 rows give both tools the same fp16 file; so do the int8 rows (`--no-int8` skips them):
each model at batch 1 through `graphopt optimize --quantize dynamic` and `--quantize static`
(calibrated on the row's inputs, the default 5% error bound), and through onnxruntime's own
`quantize_static` (`ort-qdq`: QDQ format, per-channel int8 weights, uint8 activations, calibrated
on the row's inputs: the int8 file a user of onnxruntime brings), reported like the fp16 rows.

Training rows (issue 20; `--no-train` skips them): one SGD step of torchvision resnet18 at batch 16
(224x224), BERT-base (masked-LM head) at batch 8 x 128 and GPT-2 (LM head) at batch 4 x 256, each
with cross-entropy over its classes: `graphopt grad MODEL --loss cross_entropy --optimizer sgd`
(models and data from train_bench.py), the same step graph run by both tools (outputs: the loss
and every updated parameter), and torch eager's step on the same module at the same thread count
(train_bench.py's child: forward, loss, backward, optimizer step; median of its steps after the
first).

Goals (issue 13): activation memory <= onnxruntime's on every model; graphopt's peak RSS <=
(weights + arena + workspace) + 10%; latency within 1.5x of onnxruntime at batch 8 on resnet50 and
bert_base. Writes benches/results/run.json and run.md (the table, also printed).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benches", "results")
RUN_MODELS = os.path.join(REPO, "benches", "models", "run")
sys.path.insert(0, os.path.join(REPO, "tests-py"))
sys.path.insert(0, os.path.join(REPO, "benches"))
from _common import resolve_graphopt  # noqa: E402
import precision_bench as pb  # noqa: E402  (the torch exporter)
import quantize_bench as qb  # noqa: E402  (rel_err)

SEQ = 128
MODELS = [(n, b) for n in ("resnet50", "mobilenet_v2", "bert_base", "gpt2") for b in (1, 8)]
# (model, batch) of the training rows; train_bench.py builds them.
TRAIN = [("resnet18", 16), ("bert_base", 8), ("gpt2", 4)]

ORT_CHILD = r"""
import json, sys, time, numpy as np, onnxruntime as ort
path, inputs, out, repeat, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.enable_cpu_mem_arena = False
so.log_severity_level = 3
s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(inputs))
want = {i.name for i in s.get_inputs()}
feeds = {k: v for k, v in feeds.items() if k in want}
rss_ready = status("VmRSS")
res = s.run(None, feeds)
times = []
for _ in range(repeat):
    t = time.perf_counter(); s.run(None, feeds); times.append(time.perf_counter() - t)
np.savez(out, **dict(zip([o.name for o in s.get_outputs()], res)))
json.dump({"best_ms": min(times) * 1e3, "median_ms": float(np.median(times)) * 1e3,
           "rss_ready": rss_ready, "peak_rss": status("VmHWM")}, sys.stdout)
"""


def file_bytes(path: str) -> int:
    n = os.path.getsize(path)
    data = path + ".data"
    return n + (os.path.getsize(data) if os.path.exists(data) else 0)


def sh(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["?"])[-1][:300])
    return p.stdout


def prepare(graphopt, name, batch, fp16, timeout) -> tuple[str, str, str]:
    """(original, graphopt's file, inputs) for one row, exporting and optimizing on first use."""
    src = os.path.join(RUN_MODELS, f"{name}.b{batch}.ts.onnx")
    inputs = src[:-5] + ".inputs.npz"
    if not (os.path.exists(src) and os.path.exists(inputs)):
        why = pb.export_model(name, "ts", src, timeout, batch=batch, seq=SEQ)
        if why:
            raise RuntimeError(f"export failed: {why}")
    opt = src[:-5] + (".fp16.onnx" if fp16 else ".opt.onnx")
    if not os.path.exists(opt):
        extra = ["--precision", "fp16"] if fp16 else []
        sh([*graphopt, "optimize", src, "-o", opt, *extra], timeout)
    return (opt if fp16 else src), opt, inputs


def run_graphopt(graphopt, path, inputs, out, repeat, threads, timeout) -> dict:
    r = json.loads(sh([*graphopt, "run", path, "--inputs", inputs, "-o", out, "--repeat", str(repeat),
                       "--threads", str(threads), "--json"], timeout))
    act = r["arena_allocated_bytes"] + r["workspace_bytes"] + r.get("dynamic_bytes", 0)
    return {"best_ms": r["latency_best_ms"], "median_ms": r["latency_median_ms"],
            "weights_bytes": r["weights_bytes"], "arena_bytes": r["arena_allocated_bytes"],
            "arena_planned_bytes": r["arena_planned_bytes"], "workspace_bytes": r["workspace_bytes"],
            "dynamic_bytes": r.get("dynamic_bytes", 0), "activation_bytes": act,
            "peak_rss": r.get("peak_rss_bytes")}


def run_ort(path, inputs, out, repeat, threads, timeout) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(ORT_CHILD)
    try:
        r = json.loads(sh([sys.executable, f.name, path, inputs, out, str(repeat), str(threads)], timeout))
    finally:
        os.unlink(f.name)
    r["activation_bytes"] = max(0, r["peak_rss"] - r["rss_ready"])
    return r


def prepare_train(graphopt, name, timeout) -> tuple[str, str, int]:
    """(step graph, its inputs, torch's step in seconds) for one training row."""
    import train_bench as tb  # noqa: E402  (the torch models and their export)

    onnx, data, axis = tb.export(name)
    step = os.path.join(RUN_MODELS, f"train_{name}.sgd.onnx")
    if not os.path.exists(step):
        os.makedirs(RUN_MODELS, exist_ok=True)
        sh([*graphopt, "grad", str(onnx), "-o", step, "--loss", "cross_entropy", "--class-axis",
            str(axis), "--optimizer", "sgd"], timeout)
    return step, str(data)


def torch_step(name, threads, timeout) -> float:
    out = sh([sys.executable, os.path.join(REPO, "benches", "train_bench.py"), "--torch-child", name,
              "--steps", "6", "--threads", str(threads)], timeout)
    return json.loads(out.strip().splitlines()[-1])["step_s"]


def combine(runs: list[dict]) -> dict:
    """One tool's `--rounds` processes as one result: the median of their medians, the best
    best, the highest peak RSS and activation figure; every round's median is kept."""
    r = dict(runs[-1])
    r["median_ms"] = float(np.median([x["median_ms"] for x in runs]))
    r["best_ms"] = min(x["best_ms"] for x in runs)
    for key in ("peak_rss", "activation_bytes"):
        if all(x.get(key) is not None for x in runs):
            r[key] = max(x[key] for x in runs)
    r["round_medians_ms"] = [round(x["median_ms"], 2) for x in runs]
    return r


def run_pair(row, ort_file, go_file, inputs, o_out, g_out, a, graphopt) -> None:
    """Both tools on one row, alternating for `--rounds` rounds (onnxruntime, then graphopt,
    each a fresh process of `--repeat` runs): a machine whose speed drifts over seconds
    slows both alike instead of whichever ran during the slow spell."""
    o_runs, g_runs = [], []
    for _ in range(a.rounds):
        o_runs.append(run_ort(ort_file, inputs, o_out, a.repeat, a.threads, a.timeout))
        g_runs.append(run_graphopt(graphopt, go_file, inputs, g_out, a.repeat, a.threads,
                                   a.timeout))
    row["onnxruntime"], row["graphopt"] = combine(o_runs), combine(g_runs)


def run_both(row, path, inputs, tmp, a, graphopt) -> tuple[str, str]:
    """Runs `path` in both tools into `row`; returns their output files."""
    g_out, o_out = os.path.join(tmp, "g.npz"), os.path.join(tmp, "o.npz")
    row["file_bytes"] = file_bytes(path)
    run_pair(row, path, path, inputs, o_out, g_out, a, graphopt)
    row["rel_l2"] = qb.rel_err(dict(np.load(o_out)), dict(np.load(g_out)))
    return g_out, o_out


def vs_fp32(row, ref, g_out, o_out) -> None:
    """Each tool's error against onnxruntime's fp32 outputs (`ref`, when that row ran)."""
    if os.path.exists(ref):
        fp32 = dict(np.load(ref))
        row["graphopt_vs_fp32"] = qb.rel_err(fp32, dict(np.load(g_out)))
        row["onnxruntime_vs_fp32"] = qb.rel_err(fp32, dict(np.load(o_out)))


def ort_qdq(src: str, inputs: str, out: str) -> None:
    """onnxruntime's static QDQ quantization of `src` (per-channel int8 weights, uint8
    activations; tests-py/ort_quantized_run.py's), calibrated on the arrays of `inputs`,
    written atomically to `out`."""
    from ort_quantized_run import quantize
    tmp = out + ".tmp.onnx"
    quantize(src, dict(np.load(inputs)), tmp)
    os.replace(tmp, out)


def mb(n) -> str:
    return "—" if n is None else f"{n / 1e6:.1f} MB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphopt")
    ap.add_argument("-k", help="only rows whose name matches this regex")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the tools this many times per row (median of the rounds' medians)")
    ap.add_argument("--no-fp16", action="store_true")
    ap.add_argument("--no-train", action="store_true", help="skip the training-step rows")
    ap.add_argument("--no-int8", action="store_true", help="skip the int8 rows")
    ap.add_argument("--out", default="run", help="results as benches/results/OUT.json and OUT.md")
    ap.add_argument("--from-json", help="rewrite run.md from a run.json (no runs)")
    ap.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: expected at least 1")
    graphopt = resolve_graphopt(a.graphopt)
    if a.from_json:
        with open(a.from_json) as f:
            saved = json.load(f)
        a.repeat, a.threads, a.rounds = saved["repeat"], saved["threads"], saved.get("rounds", 1)
        md = table(saved["rows"], check_goals(saved["rows"]), graphopt, a)
        print(md)
        with open(os.path.join(RESULTS, f"{a.out}.md"), "w") as f:
            f.write(md)
        return
    with tempfile.TemporaryDirectory(prefix="run_bench.") as tmp:
        rows = measure(a, graphopt, tmp)
    goals = check_goals(rows)
    md = table(rows, goals, graphopt, a)
    print(md)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{a.out}.json"), "w") as f:
        json.dump({"rows": rows, "goals": goals, "repeat": a.repeat, "threads": a.threads,
                   "rounds": a.rounds,
                   "machine": f"{platform.machine()}, {os.cpu_count()} cpus"}, f, indent=1)
    with open(os.path.join(RESULTS, f"{a.out}.md"), "w") as f:
        f.write(md)


def measure(a, graphopt, tmp: str) -> list[dict]:
    """Runs every selected row; `tmp` holds the output files the rows compare."""
    rows = []
    for name, batch in MODELS:
        for fp16 in ([False] if a.no_fp16 else [False, True]):
            row_name = f"{name} b{batch}" + (" fp16" if fp16 else "")
            if a.k and not re.search(a.k, row_name):
                continue
            row = {"model": row_name}
            try:
                ort_file, go_file, inputs = prepare(graphopt, name, batch, fp16, a.timeout)
                row["file_bytes"] = file_bytes(go_file)
                g_out, o_out = os.path.join(tmp, "g.npz"), os.path.join(tmp, "o.npz")
                run_pair(row, ort_file, go_file, inputs, o_out, g_out, a, graphopt)
                row["rel_l2"] = qb.rel_err(dict(np.load(o_out)), dict(np.load(g_out)))
                ref = os.path.join(tmp, f"fp32.{name}.{batch}.npz")
                if not fp16:
                    os.replace(o_out, ref)
                else:
                    vs_fp32(row, ref, g_out, o_out)
            except Exception as e:  # noqa: BLE001
                row["error"] = str(e)
            print(json.dumps(row), flush=True)
            rows.append(row)
    int8_modes = ("dynamic", "static", "ort-qdq")
    for name, mode in ([] if a.no_int8 else [(n, m) for n, _ in MODELS[::2] for m in int8_modes]):
        row_name = f"{name} b1 int8 {mode}"
        if a.k and not re.search(a.k, row_name):
            continue
        row = {"model": row_name, "int8": True}
        try:
            src, _, inputs = prepare(graphopt, name, 1, False, a.timeout)
            q = src[:-5] + f".{mode}.onnx"
            if not os.path.exists(q) and mode == "ort-qdq":
                ort_qdq(src, inputs, q)
            elif not os.path.exists(q):
                sh([*graphopt, "optimize", src, "-o", q, "--quantize", mode, "--calibration", inputs],
                   a.timeout)
            g_out, o_out = run_both(row, q, inputs, tmp, a, graphopt)
            vs_fp32(row, os.path.join(tmp, f"fp32.{name}.1.npz"), g_out, o_out)
        except Exception as e:  # noqa: BLE001
            row["error"] = str(e)
        print(json.dumps(row), flush=True)
        rows.append(row)
    for name, batch in ([] if a.no_train else TRAIN):
        row_name = f"{name} b{batch} sgd step"
        if a.k and not re.search(a.k, row_name):
            continue
        row = {"model": row_name, "train": True}
        try:
            step, inputs = prepare_train(graphopt, name, a.timeout)
            run_both(row, step, inputs, tmp, a, graphopt)
            row["torch_step_ms"] = 1e3 * float(np.median(
                [torch_step(name, a.threads, a.timeout) for _ in range(a.rounds)]))
        except Exception as e:  # noqa: BLE001
            row["error"] = str(e)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def check_goals(rows) -> list[dict]:
    ok = [r for r in rows if "error" not in r]
    act = [r["model"] for r in ok
           if r["graphopt"]["activation_bytes"] > r["onnxruntime"]["activation_bytes"]]
    rss = []
    for r in ok:
        g = r["graphopt"]
        if g["peak_rss"] is None:
            continue
        bound = 1.1 * (g["weights_bytes"] + g["arena_bytes"] + g["workspace_bytes"] + g["dynamic_bytes"])
        if g["peak_rss"] > bound:
            rss.append(f'{r["model"]}: {g["peak_rss"] / bound * 1.1:.2f}x of weights+arena+workspace')
    train = [(r["model"], r["graphopt"]["median_ms"], r["onnxruntime"]["median_ms"], r["torch_step_ms"])
             for r in ok if r.get("train") and "torch_step_ms" in r]
    ratio = [(r["model"], r["graphopt"]["median_ms"] / r["onnxruntime"]["median_ms"])
             for r in ok if not r.get("train")]
    fp32 = [x for x in ratio if not x[0].endswith("fp16") and " int8 " not in x[0]]
    fp16 = [x for x in ratio if x[0].endswith("fp16") or " int8 " in x[0]]
    lat = []
    for r in ok:
        if re.fullmatch(r"(resnet50|bert_base) b8", r["model"]):
            ratio = r["graphopt"]["median_ms"] / r["onnxruntime"]["median_ms"]
            lat.append((r["model"], ratio))
    return [
        {"goal": "activation memory <= onnxruntime's on every model", "met": not act and bool(ok),
         "detail": f"above: {', '.join(act)}" if act else f"{len(ok)} rows"},
        {"goal": "graphopt peak RSS <= weights + arena + workspace + 10%", "met": not rss and bool(ok),
         "detail": "; ".join(rss) if rss else f"{len(ok)} rows"},
        {"goal": "latency <= 1.5x onnxruntime at batch 8 on resnet50 and bert_base (median)",
         "met": bool(lat) and all(x <= 1.5 for _, x in lat),
         "detail": ", ".join(f"{m}: {x:.2f}x" for m, x in lat) or "not measured"},
        {"goal": "issue 20: fp32 latency <= 1.2x onnxruntime at batch 1 and 8 (median)",
         "met": bool(fp32) and all(x <= 1.2 for _, x in fp32),
         "detail": ", ".join(f"{m}: {x:.2f}x" for m, x in fp32) or "not measured"},
        {"goal": "issue 20: fp16 and int8 latency <= 1.5x onnxruntime (median)",
         "met": bool(fp16) and all(x <= 1.5 for _, x in fp16),
         "detail": ", ".join(f"{m}: {x:.2f}x" for m, x in fp16) or "not measured"},
        {"goal": "training step <= torch eager's and <= onnxruntime's on the same graph (median)",
         "met": bool(train) and all(g <= t and g <= o for _, g, o, t in train),
         "detail": ", ".join(f"{m}: {g / t:.2f}x torch, {g / o:.2f}x onnxruntime"
                             for m, g, o, t in train) or "not measured"},
        {"goal": "every row ran", "met": len(ok) == len(rows),
         "detail": "; ".join(f'{r["model"]}: {r["error"]}' for r in rows if "error" in r) or "yes"},
    ]


def table(rows, goals, graphopt, a) -> str:
    out = [f"`graphopt run` vs onnxruntime {ort_version()} CPU, {a.threads} threads each, "
           + (f"median (best) of {a.repeat} runs, " if a.rounds == 1 else
              f"median of {a.rounds} alternating rounds' medians (best of all), {a.repeat} runs per "
              "round, ")
           + "same inputs, one process per tool, model and round; "
           f"graphopt: `{' '.join(graphopt)}`.", "",
           "Activations: graphopt = planned arena + workspace (allocated once); onnxruntime = peak "
           "RSS during its runs minus RSS after session creation (CPU arena off).", "",
           "rel L2: graphopt's outputs against onnxruntime's on the same file; for fp16 and int8 rows, "
           "in brackets, each tool's against onnxruntime's fp32 outputs (graphopt / onnxruntime).", "",
           "Training rows (`sgd step`): one SGD step of `graphopt grad`'s graph in both runtimes; "
           "torch = torch eager's step on the same module (median of 5 after the first"
           + (f"; the median of {a.rounds} such processes, after the row's rounds)"
              if a.rounds > 1 else ")") + ".", "",
           "| model | weights | graphopt latency | ort latency | ratio | torch eager | graphopt act. | ort act. | "
           "act. ratio | graphopt peak RSS | ort peak RSS | rel L2 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f'| {r["model"]} | FAILED: {r["error"]} ||||||||||')
            continue
        g, o = r["graphopt"], r["onnxruntime"]
        out.append(
            f'| {r["model"]} | {mb(g["weights_bytes"])} | {g["median_ms"]:.1f} ({g["best_ms"]:.1f}) ms | '
            f'{o["median_ms"]:.1f} ({o["best_ms"]:.1f}) ms | {g["median_ms"] / o["median_ms"]:.2f}x | '
            + (f'{r["torch_step_ms"]:.1f} ms ({g["median_ms"] / r["torch_step_ms"]:.2f}x) | '
               if "torch_step_ms" in r else "— | ") +
            f'{mb(g["activation_bytes"])} | {mb(o["activation_bytes"])} | '
            f'{g["activation_bytes"] / max(o["activation_bytes"], 1):.2f}x | {mb(g["peak_rss"])} | '
            f'{mb(o["peak_rss"])} | {r["rel_l2"]:.1e}' +
            (f' ({r["graphopt_vs_fp32"]:.1e} / {r["onnxruntime_vs_fp32"]:.1e})'
             if "graphopt_vs_fp32" in r else "") + " |")
    out += ["", "| goal | met | detail |", "|---|---|---|"]
    out += [f'| {x["goal"]} | {"yes" if x["met"] else "NO"} | {x["detail"]} |' for x in goals]
    return "\n".join(out) + "\n"


def ort_version() -> str:
    try:
        import onnxruntime

        return onnxruntime.__version__
    except ImportError:
        return "?"


if __name__ == "__main__":
    main()
