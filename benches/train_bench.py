#!/usr/bin/env python3
"""`graphopt train` against torch eager on CPU, in the same run, at the same
thread count (issue 21): step time and peak RSS.

    python3 benches/train_bench.py --graphopt target-release/release/graphopt \
        [--models resnet18,gpt2] [--threads 2] [--steps 6]

Needs torch, torchvision and transformers (random seeded weights from
configs, nothing downloaded). Per model, each in its own process so that
peak RSS is its own:

  resnet18  torchvision resnet18, batch 16, 3x224x224, 1000 classes,
            cross-entropy, SGD lr 0.01 (eval-mode export: BatchNorm in its
            inference form on both sides, torch's in eval mode too)
  gpt2      transformers GPT2LMHeadModel(GPT2Config()), batch 4 x 256,
            next-token cross-entropy over the vocabulary, SGD lr 0.01
  bert_base transformers BertForMaskedLM(BertConfig()), batch 8 x 128,
            cross-entropy over the vocabulary at every position, SGD lr 0.01
            (also the training rows of run_bench.py)

* torch: `model(x)`, the loss, `backward()`, `optimizer.step()` for
  `--steps` steps on random data; step time is the median of the steps
  after the first; peak RSS is the process's (`VmHWM`; a child's
  `ru_maxrss` starts at its parent's high-water mark on Linux).
* graphopt: the model exported with the TorchScript exporter (opset 17,
  cached in benches/models/), the same random data as an npz, then
  `graphopt train --steps N --batch B --no-shuffle --threads T --json`;
  step time is the median step-to-step time of its log after the first;
  peak RSS is the report's (the process's `VmHWM`).

Prints a markdown table with the ratios and writes
benches/results/train.json.

    python3 benches/train_bench.py --max-batch 2GiB [--models resnet18,gpt2]

finds instead the largest batch that trains within that peak RSS (the
issue's "larger batches" goal), each probe two steps in its own process:

* torch: the largest batch whose measured peak RSS fits.
* graphopt: the largest batch trained whole (`--micro-batches 1`) under
  `--budget P`, where P is the limit less what the process holds beside the
  plan (measured at torch's largest batch and twice it, taken as linear in
  the batch, plus 5%): so `--budget` chooses the recomputation that makes
  it fit, and the measured peak RSS must fit too. Micro-batches would let any batch train, so they are not
  counted.

Batches grow by doubling from 1, then bisect; the result goes to
benches/results/train_max_batch.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "benches" / "models"


DEFAULT_BATCH = {"resnet18": 16, "gpt2": 4, "bert_base": 8}


def build(name: str, batch: int | None = None):
    import torch

    torch.manual_seed(0)
    b = batch or DEFAULT_BATCH[name]
    if name == "resnet18":
        import torchvision

        m = torchvision.models.resnet18(weights=None).eval()
        x = torch.randn(b, 3, 224, 224)
        y = torch.randint(0, 1000, (b,))
        return m, {"x": x}, y, 1
    if name == "gpt2":
        import transformers

        m = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
        s = 256
        x = torch.randint(0, 50257, (b, s))
        y = torch.randint(0, 50257, (b, s))
        return m, {"input_ids": x}, y, -1
    if name == "bert_base":
        import transformers

        m = transformers.BertForMaskedLM(transformers.BertConfig()).eval()
        s = 128
        x = torch.randint(0, 30522, (b, s))
        y = torch.randint(0, 30522, (b, s))
        return m, {"input_ids": x}, y, -1
    raise SystemExit(f"unknown model {name}")


def torch_child(name: str, steps: int, threads: int, batch: int | None = None) -> None:
    import torch

    torch.set_num_threads(threads)
    m, inputs, y, axis = build(name, batch)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        out = m(**inputs)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        if axis == -1:
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        else:
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    # VmHWM, not ru_maxrss: on Linux a child's ru_maxrss starts at its
    # parent's high-water mark (kept across fork and exec), and the parent
    # has exported the model, so ru_maxrss reported the parent's peak
    # whenever it was the larger (gpt2: 4.8 GB). VmHWM is this process's.
    rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
               if line.startswith("VmHWM:"))
    print(json.dumps({"step_s": statistics.median(times[1:]), "peak_rss": rss, "loss0": None}))


def export(name: str, batch: int | None = None) -> tuple[Path, Path, int]:
    """The model (cached; with a symbolic batch when `batch` is given) and
    an npz of one batch of random data."""
    import numpy as np
    import torch

    MODELS.mkdir(parents=True, exist_ok=True)
    path = MODELS / (f"train_{name}.onnx" if batch is None else f"train_{name}.dynbatch.onnx")
    m, inputs, y, axis = build(name, batch)
    if not path.exists():
        class Logits(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *a):
                out = self.m(*a)
                return out if isinstance(out, torch.Tensor) else out.logits

        axes = None if batch is None else {k: {0: "batch"} for k in [*inputs, "logits"]}
        torch.onnx.export(Logits(m), tuple(inputs.values()), str(path), input_names=list(inputs),
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes=axes)
    data = Path(tempfile.mkdtemp()) / f"{name}.npz"
    arrays = {k: v.numpy() for k, v in inputs.items()}
    arrays["target"] = y.numpy()
    np.savez(data, **arrays)
    return path, data, axis


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphopt", default=str(ROOT / "target-release" / "release" / "graphopt"))
    ap.add_argument("--models", default="resnet18,gpt2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--max-batch", metavar="SIZE", help="find the largest batch within this peak RSS")
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_child:
        torch_child(a.torch_child, a.steps, a.threads, a.batch)
        return
    if a.max_batch:
        max_batch(a)
        return
    rows = []
    for name in a.models.split(","):
        onnx, data, axis = export(name)
        t = json.loads(subprocess.run(
            [sys.executable, __file__, "--torch-child", name, "--steps", str(a.steps),
             "--threads", str(a.threads)], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        batch = DEFAULT_BATCH[name]
        # The data holds one batch: each step trains on it again.
        out = Path(tempfile.mkdtemp()) / "trained.onnx"
        cmd = [a.graphopt, "train", str(onnx), "--data", str(data), "--batch", str(batch),
               "--steps", str(a.steps), "--no-shuffle", "--loss", "cross_entropy", "--class-axis",
               str(axis), "--optimizer", "sgd", "--lr", "0.01", "--threads", str(a.threads),
               "-o", str(out), "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            rows.append({"model": name, "torch": t, "graphopt_error": p.stderr.strip()})
            print(f"{name}: graphopt failed: {p.stderr.strip()}", file=sys.stderr)
            continue
        r = json.loads(p.stdout)
        ts = [s["time_s"] for s in r["log"]]
        step = statistics.median([b - a_ for a_, b in zip(ts[1:], ts[2:])] or [ts[-1]])
        rows.append({
            "model": name, "batch": batch, "threads": a.threads, "steps": a.steps,
            "torch": t,
            "graphopt": {"step_s": step, "peak_rss": r["peak_rss_bytes"],
                         "planned": r["planned_bytes"], "arena": r["arena_bytes"],
                         "weights": r["weights_bytes"], "donated": r["donated_bytes"]},
        })
    print("| model | torch step | graphopt step | time ratio | torch peak RSS | graphopt peak RSS | RSS ratio | graphopt planned |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "graphopt" not in row:
            print(f"| {row['model']} | {row['torch']['step_s']:.2f} s | failed | | | | | |")
            continue
        t, g = row["torch"], row["graphopt"]
        print(f"| {row['model']} b{row['batch']} | {t['step_s']:.2f} s | {g['step_s']:.2f} s | "
              f"{g['step_s'] / t['step_s']:.2f}x | {t['peak_rss'] / 1e6:.0f} MB | {g['peak_rss'] / 1e6:.0f} MB | "
              f"{g['peak_rss'] / t['peak_rss']:.2f}x | {g['planned'] / 1e6:.0f} MB |")
    res = ROOT / "benches" / "results"
    res.mkdir(exist_ok=True)
    (res / "train.json").write_text(json.dumps(rows, indent=1) + "\n")


def size(s: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    t = s.strip().lower()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(t)


def largest(fits, start: int = 1, cap: int = 4096) -> tuple[int, dict]:
    """The largest batch b >= 1 with fits(b) not None: doubling, then bisection."""
    best, found = 0, {}
    b = start
    while b <= cap:
        r = fits(b)
        if r is None:
            break
        best, found = b, r
        b *= 2
    hi = min(b, cap + 1)
    lo = best
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = fits(mid)
        if r is None:
            hi = mid
        else:
            lo, found = mid, r
    return lo, found


def max_batch(a) -> None:
    limit = size(a.max_batch)
    rows = []
    for name in a.models.split(","):
        def torch_fits(b: int):
            p = subprocess.run([sys.executable, __file__, "--torch-child", name, "--steps", "2",
                                "--threads", str(a.threads), "--batch", str(b)],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print(f"  torch {name} b{b}: failed", file=sys.stderr)
                return None
            r = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"  torch {name} b{b}: {r['peak_rss'] / 2**20:.0f} MiB", file=sys.stderr)
            return r if r["peak_rss"] <= limit else None

        def graphopt_run(b: int, budget: int | None):
            onnx, data, axis = export(name, b)
            out = Path(tempfile.mkdtemp()) / "trained.onnx"
            cmd = [a.graphopt, "train", str(onnx), "--data", str(data), "--batch", str(b),
                   "--steps", "2", "--no-shuffle", "--loss", "cross_entropy", "--class-axis",
                   str(axis), "--optimizer", "sgd", "--lr", "0.01", "--threads", str(a.threads),
                   "-o", str(out), "--json"]
            if budget is not None:
                cmd += ["--budget", str(budget), "--micro-batches", "1"]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"  graphopt {name} b{b}: {p.stderr.strip()[:300]}", file=sys.stderr)
                return None
            r = json.loads(p.stdout)
            r.pop("log", None)
            rc = r.get("recompute") or {}
            print(f"  graphopt {name} b{b}: {r['peak_rss_bytes'] / 2**20:.0f} MiB, planned "
                  f"{r['planned_bytes'] / 2**20:.0f} MiB, recomputed {rc.get('recomputed_nodes', 0)} nodes "
                  f"(+{rc.get('extra_flops_pct', 0):.1f}% FLOPs)", file=sys.stderr)
            return r

        tb, tr = largest(torch_fits)
        # What the process holds beside the plan (the binary, the loaded
        # model, the batches being gathered): measured at two batches and
        # taken as linear in the batch.
        b1 = max(tb, 1)
        runs = [graphopt_run(b, None) for b in (b1, 2 * b1)]
        over = [r["peak_rss_bytes"] - r["planned_bytes"] if r else 0 for r in runs]
        slope = max(over[1] - over[0], 0) / b1

        def overhead(b: int) -> float:
            return over[0] + slope * (b - b1)

        def graphopt_fits(b: int):
            budget = int(limit - overhead(b) * 1.05)
            if budget <= 0:
                return None
            r = graphopt_run(b, budget)
            if r is not None:
                r["budget"] = budget
            return r if r is not None and r["peak_rss_bytes"] <= limit else None

        gb, gr = largest(graphopt_fits, start=max(tb, 1))
        rows.append({"model": name, "limit": limit, "torch_batch": tb, "torch": tr,
                     "graphopt_batch": gb, "overhead": over, "overhead_per_example": slope,
                     "graphopt": gr})
        print(f"{name}: torch {tb}, graphopt {gb}", file=sys.stderr)
    print("| model | limit | torch batch | torch peak RSS | graphopt batch (whole, --budget) | "
          "graphopt peak RSS | recomputed | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        g = r["graphopt"] or {}
        rc = g.get("recompute") or {}
        print(f"| {r['model']} | {r['limit'] / 2**30:.2f} GiB | {r['torch_batch']} | "
              f"{(r['torch'] or {}).get('peak_rss', 0) / 2**20:.0f} MiB | {r['graphopt_batch']} | "
              f"{g.get('peak_rss_bytes', 0) / 2**20:.0f} MiB | {rc.get('recomputed_nodes', 0)} nodes, "
              f"+{rc.get('extra_flops_pct', 0):.1f}% FLOPs | "
              + (f"{r['graphopt_batch'] / r['torch_batch']:.2f}x |" if r["torch_batch"]
                 else "torch fits no batch |"))
    res = ROOT / "benches" / "results"
    res.mkdir(exist_ok=True)
    (res / "train_max_batch.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
