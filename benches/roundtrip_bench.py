#!/usr/bin/env python3
"""Roundtrip benchmark: graphopt import->export vs. Python onnx.load+onnx.save.

    python3 benches/roundtrip_bench.py --graphopt target/release/graphopt [--model PATH] [--repeat N]

Without --model, uses benches/models/gpt2-medium.onnx and creates it first if
absent (GPT-2 medium: 24 layers, n_embd 1024, 16 heads, vocab 50257, random
seeded weights, TorchScript exporter opset 14, ~1.4 GB fp32; needs torch +
transformers and a few minutes; benches/models/ is git-ignored).

Measures, in the same run and on the same (page-cache-warm) file:
  (a) `graphopt optimize M -o OUT --passes none` (or `--passes default`: the
      default pipeline)  wall time + peak RSS of the child
  (b) a Python child doing onnx.load(M) + onnx.save(..., OUT)  wall time + peak RSS
Peak RSS comes from os.wait4() on each child (ru_maxrss). Reports the best of
--repeat runs, ratios (graphopt time / python time, peak RSS / model size),
prints a markdown table and writes benches/results/roundtrip.json.
"""
from __future__ import annotations

import argparse
import shutil
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_MODEL = os.path.join(HERE, "models", "gpt2-medium.onnx")

PY_ROUNDTRIP = r"""
import json, os, sys, time
t0 = time.perf_counter()
import onnx
from onnx.external_data_helper import _get_all_tensors, uses_external_data
t1 = time.perf_counter()
src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src)
t2 = time.perf_counter()
external = m.ByteSize() > 2_000_000_000 or any(
    uses_external_data(t) for t in _get_all_tensors(onnx.load(src, load_external_data=False)))
if external:
    onnx.save(m, dst, save_as_external_data=True, all_tensors_to_one_file=True,
              location=os.path.basename(dst) + ".data", size_threshold=1024)
else:
    onnx.save(m, dst)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "save_s": t3 - t2}))
"""


# --------------------------------------------------------------------- model

EXPORT_SCRIPT = r"""
import sys, time, warnings
import torch
from transformers import GPT2Config, GPT2LMHeadModel
warnings.simplefilter("ignore")
path = sys.argv[1]
torch.manual_seed(0)
torch.set_num_threads(2)
cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16,
                 use_cache=False, attn_implementation="eager")
t0 = time.time()
model = GPT2LMHeadModel(cfg).eval()

class Wrap(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask,
                      use_cache=False, return_dict=True).logits

ids = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
mask = torch.ones(1, 16, dtype=torch.int64)
bs = {0: "batch", 1: "seq"}
with torch.no_grad():
    torch.onnx.export(Wrap(model).eval(), (ids, mask), path, dynamo=False, opset_version=14,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": bs, "attention_mask": bs, "logits": bs},
                      do_constant_folding=True)
print(f"exported {path} in {time.time() - t0:.1f}s", flush=True)
"""


def ensure_model(path: str) -> None:
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"# creating {path} (GPT-2 medium, TorchScript exporter, opset 14) ...", flush=True)
    tmp = path + ".partial.onnx"
    subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, tmp], check=True)
    # torch may have written external data next to tmp; keep names consistent
    data_files = [f for f in os.listdir(os.path.dirname(path))
                  if f.startswith(os.path.basename(tmp)) and f != os.path.basename(tmp)]
    if data_files:
        import onnx  # rewrite with a stable external-data file name

        m = onnx.load(tmp)
        onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=os.path.basename(path) + ".data", size_threshold=1024)
        os.remove(tmp)
        for f in data_files:
            os.remove(os.path.join(os.path.dirname(path), f))
    else:
        os.replace(tmp, path)


def model_files(path: str) -> list[str]:
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    m = onnx.load(path, load_external_data=False)
    d = os.path.dirname(os.path.abspath(path))
    files = {path}
    for t in _get_all_tensors(m):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    files.add(os.path.join(d, e.value))
    return sorted(files)


def warm_cache(files: list[str]) -> None:
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


# ----------------------------------------------------------------- measuring

def measure(cmd: list[str], log_path: str) -> dict:
    """Run cmd; return wall seconds, peak RSS (bytes), exit code, stdout.

    Peak RSS comes from GNU time (`/usr/bin/time -f %M`) when present: the
    rusage that wait4 reports for a child also counts the memory of the
    forked Python process before exec, which inflates small children.
    """
    gnu_time = shutil.which("time") if os.path.exists("/usr/bin/time") else None
    with open(log_path, "w") as err, tempfile.TemporaryFile("w+") as out, \
            tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        full = ["/usr/bin/time", "-f", "%M", "-o", rss_file.name, *cmd] if gnu_time else cmd
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read()
        if gnu_time:
            lines = [l for l in rss_file.read().split() if l.isdigit()]
            rss = int(lines[-1]) * 1024 if lines else 0
        else:
            rss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"wall_s": wall, "peak_rss_bytes": rss, "rc": p.returncode,
            "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "stdout": stdout}


def remove_outputs(out_dir: str) -> None:
    for f in os.listdir(out_dir):
        if f.startswith("out"):
            os.remove(os.path.join(out_dir, f))


def resolve_graphopt(value: str | None) -> list[str]:
    value = value or os.environ.get("GRAPHOPT")
    if not value:
        for cand in ("target/release/graphopt", "target/debug/graphopt"):
            p = os.path.join(REPO, cand)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                value = p
                break
    if not value:
        raise SystemExit("graphopt binary not found: pass --graphopt PATH or set GRAPHOPT")
    if os.path.isfile(value):
        return ([sys.executable] if value.endswith(".py") else []) + [os.path.abspath(value)]
    return shlex.split(value)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphopt", help="graphopt binary or command (default: $GRAPHOPT, target/{release,debug})")
    ap.add_argument("--model", help=f"ONNX model (default: {os.path.relpath(DEFAULT_MODEL, REPO)}, created if absent)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool; best wall time is reported")
    ap.add_argument("--passes", default="none")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "roundtrip.json"))
    ap.add_argument("--tmp", help="directory for outputs (default: a temp dir next to the model)")
    args = ap.parse_args()

    graphopt = resolve_graphopt(args.graphopt)
    model = os.path.abspath(args.model or DEFAULT_MODEL)
    if args.model is None:
        ensure_model(model)
    elif not os.path.exists(model):
        raise SystemExit(f"no such model: {model}")
    files = model_files(model)
    size = sum(os.path.getsize(f) for f in files)
    print(f"# model {os.path.relpath(model, REPO)}: {fmt_bytes(size)} in {len(files)} file(s)", flush=True)
    warm_cache(files)

    tmp = args.tmp or tempfile.mkdtemp(prefix="roundtrip-bench-", dir=os.path.dirname(model))
    os.makedirs(tmp, exist_ok=True)
    dst = os.path.join(tmp, "out.onnx")
    runs = {"graphopt": [], "python": []}
    try:
        for i in range(args.repeat):
            # alternate the order so neither tool systematically gets the warmer cache
            order = ("graphopt", "python") if i % 2 == 0 else ("python", "graphopt")
            for tool in order:
                remove_outputs(tmp)
                if tool == "graphopt":
                    cmd = [*graphopt, "optimize", model, "-o", dst]
                    if args.passes != "default":  # `default`: graphopt's default pipeline
                        cmd += ["--passes", args.passes]
                else:
                    cmd = [sys.executable, "-c", PY_ROUNDTRIP, model, dst]
                r = measure(cmd, os.path.join(tmp, f"{tool}.stderr"))
                if r["rc"] != 0:
                    with open(os.path.join(tmp, f"{tool}.stderr")) as f:
                        err = f.read()[-2000:]
                    raise SystemExit(f"{tool} failed (rc={r['rc']}): {' '.join(cmd)}\n{err}")
                out_files = [os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith("out")]
                r["output_bytes"] = sum(os.path.getsize(f) for f in out_files)
                if tool == "python":
                    try:
                        r["phases"] = json.loads(r["stdout"].strip().splitlines()[-1])
                    except Exception:  # noqa: BLE001
                        pass
                del r["stdout"]
                runs[tool].append(r)
                print(f"#   run {i + 1} {tool:8s} {r['wall_s']:7.2f}s  peak RSS {fmt_bytes(r['peak_rss_bytes'])}",
                      flush=True)
        remove_outputs(tmp)
    finally:
        if not args.tmp:
            for f in os.listdir(tmp):
                os.remove(os.path.join(tmp, f))
            os.rmdir(tmp)

    best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in runs.items()}
    peak = {k: max(r["peak_rss_bytes"] for r in v) for k, v in runs.items()}
    g, p = best["graphopt"], best["python"]
    result = {
        "bench": "roundtrip",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "model": os.path.relpath(model, REPO) if model.startswith(REPO) else model,
        "model_bytes": size,
        "graphopt_cmd": graphopt,
        "graphopt_profile": ("debug" if any("target/debug" in c for c in graphopt) else
                             "release" if any("target/release" in c for c in graphopt) else "unknown"),
        "passes": args.passes,
        "repeat": args.repeat,
        "graphopt": {"best_wall_s": g["wall_s"], "peak_rss_bytes": peak["graphopt"],
                     "user_s": g["user_s"], "sys_s": g["sys_s"], "output_bytes": g["output_bytes"]},
        "python_onnx": {"best_wall_s": p["wall_s"], "peak_rss_bytes": peak["python"],
                        "user_s": p["user_s"], "sys_s": p["sys_s"], "output_bytes": p["output_bytes"],
                        "phases": p.get("phases")},
        "ratios": {
            "time_graphopt_over_python": g["wall_s"] / p["wall_s"],
            "graphopt_peak_rss_over_model": peak["graphopt"] / size,
            "python_peak_rss_over_model": peak["python"] / size,
        },
        "runs": runs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")

    print()
    print(f"Model: `{result['model']}` ({fmt_bytes(size)}), best of {args.repeat}\n")
    print("| tool | wall time (s) | peak RSS | peak RSS / model size | output size |")
    print("|---|---:|---:|---:|---:|")
    label = "(default pipeline)" if args.passes == "default" else f"--passes {args.passes}"
    print(f"| graphopt optimize {label} | {g['wall_s']:.2f} | {fmt_bytes(peak['graphopt'])} | "
          f"{result['ratios']['graphopt_peak_rss_over_model']:.2f} | {fmt_bytes(g['output_bytes'])} |")
    ph = p.get("phases") or {}
    extra = (f" (import {ph.get('import_s', 0):.2f} + load {ph.get('load_s', 0):.2f}"
             f" + save {ph.get('save_s', 0):.2f})") if ph else ""
    print(f"| python onnx.load + onnx.save | {p['wall_s']:.2f}{extra} | {fmt_bytes(peak['python'])} | "
          f"{result['ratios']['python_peak_rss_over_model']:.2f} | {fmt_bytes(p['output_bytes'])} |")
    print(f"\ngraphopt time / python time = {result['ratios']['time_graphopt_over_python']:.2f}")
    jp = os.path.abspath(args.json)
    print(f"results written to {os.path.relpath(jp, REPO) if jp.startswith(REPO + os.sep) else jp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
