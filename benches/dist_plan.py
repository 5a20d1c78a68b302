"""Per-device memory of GPT-2 medium and large trained on several devices,
on paper: `graphopt plan --distributed dp|zero1|zero2 --ranks N` on the
AdamW training step (`graphopt grad`), beside the ZeRO arithmetic.

    python benches/dist_plan.py [--models gpt2_medium,gpt2_large] [--ranks 8]
        [--budget 24GiB] [--seq 1024] [--out benches/results/dist_plan]

Each model is built from its transformers config with random weights (no
hub), exported with a symbolic batch at sequence length --seq (torch's
TorchScript exporter, opset 17; benches/models/NAME.seqS/, with external
data over 2 GiB), and turned into its AdamW
training step by `graphopt grad` (cross-entropy over the vocabulary). For
every scheme, the largest global batch whose per-rank bytes fit --budget
(`--max-batch`), and the per-rank bytes at the global batch --batch.

Then `graphopt partition --stages K --data ... --batch B` plans each
pipeline stage's AdamW training step (weights, optimizer state, gradient
accumulator, arenas of its forward, backward and update graphs, and the
inputs it keeps for its micro-batches in flight, GPipe with M = K): the
same graphs the ranks of `train --pipeline` build.

The ZeRO figures are for fp32 AdamW as graphopt trains (4 bytes of
parameters, 4 of gradients and 8 of optimizer state per parameter):
DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N, activations apart.
Needs the release build: cargo build --release --bin graphopt (or
--graphopt PATH).
"""

import argparse
import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "benches" / "models"
GRAPHOPT = ROOT / "target" / "release" / "graphopt"  # --graphopt

CONFIGS = {
    "gpt2_medium": dict(n_embd=1024, n_layer=24, n_head=16),
    "gpt2_large": dict(n_embd=1280, n_layer=36, n_head=20),
}


def export(name: str, seq: int) -> Path:
    import torch
    import transformers

    # Its own folder: over 2 GiB, the exporter writes external data files.
    path = MODELS / f"{name}.seq{seq}" / "model.onnx"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_positions=max(1024, seq), **CONFIGS[name])
    m = transformers.GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(ids).logits

    x = torch.randint(0, cfg.vocab_size, (1, seq))
    torch.onnx.export(Logits(m), (x,), str(path), input_names=["input_ids"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": {0: "batch"}, "logits": {0: "batch"}})
    return path


def graphopt(*args: str) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([str(GRAPHOPT), *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"graphopt {' '.join(args)}: {r.stderr.strip()}")
    out = json.loads(r.stdout)
    out["_seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt2_medium,gpt2_large")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--budget", default="24GiB")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8, help="global batch of the fixed-batch rows")
    ap.add_argument("--out", default=str(ROOT / "benches" / "results" / "dist_plan"))
    ap.add_argument("--graphopt", default=str(GRAPHOPT))
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--pipeline-batch", type=int, default=4,
                    help="global batch of the pipeline plan (M = --stages micro-batches)")
    a = ap.parse_args()
    globals()["GRAPHOPT"] = Path(a.graphopt)
    rows = []
    pipe_rows = []
    for name in a.models.split(","):
        model = export(name, a.seq)
        step = model.with_name("train_adamw.onnx")
        if not step.exists():
            subprocess.run([str(GRAPHOPT), "grad", str(model), "--optimizer", "adamw", "--loss",
                            "cross_entropy", "--class-axis", "-1", "-o", str(step)], check=True,
                           capture_output=True)
        for scheme in ["dp", "zero1", "zero2"]:
            common = ["plan", str(step), "--distributed", scheme, "--ranks", str(a.ranks)]
            fixed = graphopt(*common, "--dim", f"batch={a.batch}")
            best = graphopt(*common, "--budget", a.budget, "--max-batch")
            psi = fixed["param_elements"]
            n = a.ranks
            zero = {"dp": 16 * psi, "zero1": 8 * psi + 8 * psi / n, "zero2": 4 * psi + 12 * psi / n}[scheme]
            b = fixed["per_rank"]
            rows.append({
                "model": name, "scheme": scheme, "ranks": n, "params": psi,
                "zero_formula_bytes": zero,
                "at_batch": a.batch, "per_rank": b,
                "total_bytes": sum(b[k] for k in ["weights_bytes", "optimizer_state_bytes",
                                                  "gradient_bytes", "arena_bytes"]),
                "max_batch": best["batch"], "max_batch_per_rank": best["per_rank"],
                "seconds": fixed["_seconds"] + best["_seconds"],
            })
            print(json.dumps(rows[-1]), flush=True)
        # The pipeline: random token ids, the target shifted by one.
        import numpy as np
        rng = np.random.default_rng(0)
        ids = rng.integers(0, 50257, (a.pipeline_batch, a.seq)).astype(np.int64)
        data = model.with_name("pipeline_data.npz")
        np.savez(data, input_ids=ids, target=np.roll(ids, -1, 1))
        cut = model.with_name(f"stages{a.stages}")
        r = graphopt("partition", str(model), "--stages", str(a.stages), "-o", str(cut),
                     "--data", str(data), "--batch", str(a.pipeline_batch), "--loss",
                     "cross_entropy", "--class-axis", "-1", "--optimizer", "adamw")
        for st, pl in zip(r["manifest"]["stages"], r["planned"]):
            total = sum(pl[k] for k in ["weights_bytes", "optimizer_state_bytes", "gradient_bytes",
                                        "arena_bytes", "in_flight_bytes"])
            pipe_rows.append({"model": name, "stage": st["index"], "nodes": st["nodes"],
                              "flops": st["flops"], **pl, "total_bytes": total,
                              "seconds": r["_seconds"]})
            print(json.dumps(pipe_rows[-1]), flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"ranks": rows, "pipeline": pipe_rows}, indent=1) + "\n")
    gib = lambda x: f"{x / 2**30:.2f}"
    lines = [f"Per-device GiB, AdamW fp32, {a.ranks} ranks, sequence {a.seq}, global batch {a.batch}; "
             f"largest global batch within {a.budget} per device.", "",
             "| model | scheme | ZeRO formula (no activations) | weights | optimizer state | gradients "
             "| activations | total | max global batch |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["per_rank"]
        lines.append(f"| {r['model']} ({r['params'] / 1e6:.0f}M) | {r['scheme']} | {gib(r['zero_formula_bytes'])} "
                     f"| {gib(b['weights_bytes'])} | {gib(b['optimizer_state_bytes'])} "
                     f"| {gib(b['gradient_bytes'])} | {gib(b['arena_bytes'])} | {gib(r['total_bytes'])} "
                     f"| {r['max_batch']} |")
    lines += ["", f"Pipeline, {a.stages} stages (GPipe, {a.stages} micro-batches of "
              f"{a.pipeline_batch // a.stages} x {a.seq}), per-stage GiB as planned:", "",
              "| model | stage | share of FLOPs | weights | optimizer state | gradients | arenas "
              "| inputs in flight | total |", "|---|---|---|---|---|---|---|---|---|"]
    for name in a.models.split(","):
        mine = [r for r in pipe_rows if r["model"] == name]
        f = sum(r["flops"] for r in mine) or 1
        for r in mine:
            lines.append(f"| {name} | {r['stage']} | {100 * r['flops'] / f:.1f}% | {gib(r['weights_bytes'])} "
                         f"| {gib(r['optimizer_state_bytes'])} | {gib(r['gradient_bytes'])} "
                         f"| {gib(r['arena_bytes'])} | {gib(r['in_flight_bytes'])} | {gib(r['total_bytes'])} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
