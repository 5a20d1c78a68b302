#!/usr/bin/env python3
"""`graphopt.torch.checkpoint` against PyTorch's own recomputation, in one run
on CPU (issue 26): peak memory, step time and FLOPs of one training step.

    python3 benches/torch_checkpoint_bench.py [--models resnet50,bert_base,gpt2]
        [--steps 3] [--small]

Needs torch, torchvision, transformers, onnxscript and the graphopt Python
package (``pip install ./crates/python``). Random seeded weights from
configs, nothing downloaded. Models (``--small`` quarters the batch):

  resnet50   torchvision resnet50, train mode, batch 32 x 3x224x224
  bert_base  transformers BertModel(BertConfig()), batch 8 x 128
  gpt2       transformers GPT2LMHeadModel(GPT2Config()), batch 8 x 256

The loss is the sum of the first output for every setting (graphopt plans
for ``loss="sum"``). Settings, per model:

  none        plain eager step
  per-block   torch.utils.checkpoint (use_reentrant=False) around each
              ResNet stage (layer1..layer4) or each transformer layer
              (transformers' gradient_checkpointing_enable)
  compile     torch.compile with torch._functorch.config.
              activation_memory_budget = 0.5 and the
              aot_eager_decomp_partition backend: the min-cut partitioner
              that budget drives, with eager kernels (no inductor code
              generation), so its memory and FLOPs are measured like the
              others'
  graphopt@X  graphopt.torch.checkpoint with the budget set to setting X's
              measured peak; when the measured peak lands outside 0.93-1.02x
              of it, again with the budget scaled by target/measured (at
              most 3 tries, all reported)

Measured per setting:
  peak        bytes allocated during one step above what was allocated
              before it (parameters; gradients are set to None before the
              profiler starts), from
              the profiler's memory events (torch.profiler with
              profile_memory=True: every CPU allocation and free, summed in
              time order). Not RSS.
  time        median step time of --steps steps after one warm-up
  flops       matmul/conv FLOPs (torch.utils.flop_counter) plus one per
              output element of every other op, counted on the ops that
              actually run (inside compiled graphs too)
  predicted   graphopt's planned peak (its planner's figure for the step)

Writes benches/results/torch_checkpoint.{json,md}.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

ROOT = Path(__file__).resolve().parent.parent
warnings.filterwarnings("ignore")


def build(name: str, small: bool):
    torch.manual_seed(0)
    div = 4 if small else 1
    if name == "resnet50":
        import torchvision

        m = torchvision.models.resnet50(weights=None)
        return m, (torch.randn(32 // div, 3, 224, 224),), [m.layer1, m.layer2, m.layer3, m.layer4]
    import transformers

    if name == "bert_base":
        m = transformers.BertModel(transformers.BertConfig(use_cache=False))
        ids = torch.randint(0, 30522, (8 // div, 128))
        return m, (ids,), "hf"
    if name == "gpt2":
        # No KV cache in training (its DynamicCache output does not export).
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False))
        ids = torch.randint(0, 50257, (8 // div, 256))
        return m, (ids,), "hf"
    raise SystemExit(f"unknown model {name}")


def first(out):
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        return out.to_tuple()[0]
    return out[0]


def step(model, args, zero: bool = True):
    if zero:
        model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    loss = first(model(*args)).sum()
    loss.backward()
    return loss.detach()


def peak_bytes(model, args) -> int:
    """One step's peak above what is allocated before it (gradients freed
    before the profiler starts), by ``graphopt.torch.measure_peak``."""
    import graphopt.torch as gt

    model.zero_grad(set_to_none=True)
    return gt.measure_peak(lambda: step(model, args, zero=False))


class _Count(TorchDispatchMode):
    """FLOPs of the ops that run: torch.utils.flop_counter's formulas for
    matmul/conv/attention, one per output element for every other op."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        f = flop_registry.get(func._overloadpacket)
        if f is not None:
            self.flops += f(*args, **kwargs, out_val=out)
        else:
            self.flops += sum(t.numel() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def flops_of(fn, mode=None) -> int:
    """FLOPs of ``fn()``; ``mode``: the counter a compiled model runs its
    graphs under (an active dispatch mode around torch.compile'd code would
    make it fall back to eager)."""
    if mode is not None:
        mode.flops = 0
        fn()
        return int(mode.flops)
    m = _Count()
    with m:
        fn()
    return int(m.flops)


def compiled(model, counting: bool):
    """torch.compile with activation_memory_budget 0.5 on the stock
    aot_eager_decomp_partition backend; with ``counting``, the same backend
    running its graphs under a ``_Count`` (for FLOPs only)."""
    import torch._functorch.config as fconfig

    fconfig.activation_memory_budget = 0.5
    if not counting:
        return torch.compile(model, backend="aot_eager_decomp_partition")
    from torch._dynamo.backends.debugging import aot_eager_decomp_partition_with_mode

    mode = _Count()
    c = torch.compile(model, backend=functools.partial(aot_eager_decomp_partition_with_mode, mode=mode))
    c._bench_count = mode
    return c


def per_block(model, blocks):
    if blocks == "hf":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model
    for b in blocks:
        f = b.forward
        b.forward = lambda *a, _f=f: torch.utils.checkpoint.checkpoint(_f, *a, use_reentrant=False)
    return model


def measure(label, model, args, steps, predicted=None, extra=None, flops=None):
    step(model, args)  # warm-up (compiles)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(model, args)
        times.append(time.perf_counter() - t)
    peak = peak_bytes(model, args)
    if flops is None:
        flops = flops_of(lambda: step(model, args))
    row = {
        "setting": label,
        "peak_bytes": peak,
        "step_s": statistics.median(times),
        "flops": flops,
        "predicted_peak_bytes": predicted,
    }
    row.update(extra or {})
    print(
        f"  {label:<22} peak {peak / 2**20:9.1f} MiB  step {row['step_s']:7.3f} s  "
        f"{flops / 1e9:9.2f} GFLOP" + (f"  predicted {predicted / 2**20:9.1f} MiB" if predicted else ""),
        flush=True,
    )
    return row


def grad_error(ref_grads, model) -> float:
    """Worst L2-relative gradient error over the parameters, against the
    plain module's gradients; parameters whose gradient is zero up to
    rounding (|g| below 1e-9 of the model's largest, such as attention key
    biases, which softmax makes exactly zero in exact arithmetic) are
    compared absolutely, against that largest."""
    top = max(g.abs().max().item() for g in ref_grads if g is not None)
    worst = 0.0
    for g, p in zip(ref_grads, model.parameters()):
        if g is None:
            continue
        d = (p.grad - g).norm().item()
        n = g.norm().item()
        worst = max(worst, d / n if g.abs().max().item() > 1e-9 * top else d / top)
    return worst


def graphopt_at(name, small, target, steps, label):
    import graphopt.torch as gt

    ref, args, _ = build(name, small)
    ref.train()
    ref_loss = step(ref, args).item()
    ref_grads = [None if p.grad is None else p.grad.clone() for p in ref.parameters()]
    del ref
    rows = []
    budget = int(target)
    for attempt in range(3):
        model, args, _ = build(name, small)
        model.train()
        t = time.perf_counter()
        try:
            w = gt.checkpoint(model, args, budget=budget)
        except Exception as e:  # a budget below graphopt's least peak
            least = re.search(r"reaches here: [^(]*\((\d+) bytes", str(e))
            if least is None or attempt == 2:
                print(f"  {label}: {e}", flush=True)
                return rows
            # The target is below what graphopt reaches: measure its least.
            print(f"  {label}: below graphopt's least peak; trying that", flush=True)
            budget = int(least.group(1))
            continue
        plan_s = time.perf_counter() - t
        r = w.report
        row = measure(
            f"{label} (try {attempt + 1})",
            w,
            args,
            steps,
            predicted=r.planned_peak_bytes,
            extra={
                "target_peak_bytes": int(target),
                "budget_bytes": budget,
                "plan_s": plan_s,
                "saved_ops": r.saved_ops,
                "recomputed_ops": r.recomputed_ops,
                "unmapped": len(r.unmapped),
                "planned_extra_flops_pct": r.extra_flops_pct,
            },
        )
        loss = step(w, args).item()
        row["loss_rel_error"] = abs(loss - ref_loss) / max(abs(ref_loss), 1e-30)
        row["grad_rel_error"] = grad_error(ref_grads, w.module)
        print(f"    loss error {row['loss_rel_error']:.2e}, worst gradient error {row['grad_rel_error']:.2e}", flush=True)
        rows.append(row)
        if 0.93 * target <= row["peak_bytes"] <= 1.02 * target:
            break
        budget = int(budget * target / row["peak_bytes"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,bert_base,gpt2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a quarter of the batch")
    ap.add_argument("--out", default=str(ROOT / "benches" / "results" / "torch_checkpoint"))
    a = ap.parse_args()
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "small": a.small, "models": {}}
    for name in a.models.split(","):
        print(f"{name}:", flush=True)
        rows = []
        model, args, blocks = build(name, a.small)
        model.train()
        rows.append(measure("none", model, args, a.steps))
        model, args, blocks = build(name, a.small)
        model.train()
        rows.append(measure("per-block", per_block(model, blocks), args, a.steps))
        model, args, blocks = build(name, a.small)
        model.train()
        try:
            counted, cargs, _ = build(name, a.small)
            counted = compiled(counted.train(), counting=True)
            step(counted, cargs)
            flops = flops_of(lambda: step(counted, cargs), counted._bench_count)
            del counted
            rows.append(measure("compile(budget 0.5)", compiled(model, counting=False), args, a.steps, flops=flops))
        except Exception as e:
            print(f"  compile: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        base = rows[0]
        for ref in rows[1:]:
            rows += graphopt_at(name, a.small, ref["peak_bytes"], a.steps, f"graphopt@{ref['setting'].split('(')[0]}")
        for r in rows:
            r["extra_flops"] = r["flops"] - base["flops"]
            r["extra_time_s"] = r["step_s"] - base["step_s"]
        results["models"][name] = rows
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        f"torch {results['torch']}, {results['threads']} threads, CPU; peak from the profiler's memory events",
        "",
        "| model | setting | peak MiB | predicted MiB | pred/meas | step s | extra step s | extra GFLOP | grad error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in results["models"].items():
        for r in rows:
            p = r.get("predicted_peak_bytes")
            pred = f"{p / 2**20:.1f}" if p else ""
            ratio = f"{p / r['peak_bytes']:.3f}" if p else ""
            lines.append(
                f"| {name} | {r['setting']} | {r['peak_bytes'] / 2**20:.1f} | {pred} | {ratio} | "
                f"{r['step_s']:.3f} | {r['extra_time_s']:.3f} | {r['extra_flops'] / 1e9:.2f} | "
                + (f"{r['grad_rel_error']:.1e} |" if "grad_rel_error" in r else " |")
            )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
