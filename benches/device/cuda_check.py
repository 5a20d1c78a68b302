#!/usr/bin/env python3
"""Helper of benches/device/cuda_check.sh (run there, on the GPU machine).

Subcommands, each run by the shell script under its own timeout:

  export  DIR            resnet50 / bert_base / gpt2 with random weights
                         (no download), exported with torch to ONNX with a
                         dynamic batch axis, plus seeded inputs per batch.
  bench   DIR MODEL      for fp32 and fp16, batch 1 and 32: graphopt on
                         CUDA (--repeat, --json), graphopt on the CPU (batch
                         1), torch eager; outputs compared, latency and
                         memory recorded; appends rows to DIR/rows.jsonl.
  compile DIR MODEL      torch.compile latency at batch 32 (fp32, fp16).
  report  DIR OUTDIR     markdown table + JSON under OUTDIR.

graphopt runs as a subprocess (the release binary carried in); its figures
come from `graphopt run --json`: latency (best and median of the timed
runs, host inputs to host outputs, CUDA-graph replay), device memory
expected (weights + arena + workspace) and measured by cuMemGetInfo around
its two allocations. torch is timed the same way: pinned host inputs copied
non-blocking to the GPU, the forward pass, outputs copied back, synchronised.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

BATCHES = (1, 32)
SEQ = 128
REPEAT = 20
GRAPHOPT = os.environ.get("GRAPHOPT", "target/release/graphopt")


def log(*a):
    print(*a, flush=True)


def build(name, dtype="fp32"):
    import torch

    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        m = torchvision.models.resnet50(weights=None)
    elif name == "bert_base":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(attn_implementation="eager")
        inner = BertModel(cfg, add_pooling_layer=False)

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, input_ids):
                return self.m(input_ids=input_ids).last_hidden_state

        m = M()
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(attn_implementation="eager", use_cache=False)
        inner = GPT2Model(cfg)

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, input_ids):
                # An explicit all-ones mask: without one, transformers 5
                # looks for packed sequences with torch.diff, which the
                # TorchScript exporter cannot export.
                mask = torch.ones_like(input_ids)
                return self.m(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state

        m = M()
    else:
        raise SystemExit(f"unknown model {name}")
    m = m.eval()
    return m.half() if dtype == "fp16" else m


def example(name, batch, seed=0):
    rng = np.random.default_rng(seed + batch)
    if name == "resnet50":
        return {"x": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}
    return {"input_ids": rng.integers(0, 1000, size=(batch, SEQ), dtype=np.int64)}


def export(d):
    import torch

    os.makedirs(d, exist_ok=True)
    for name in ("resnet50", "bert_base", "gpt2"):
        path = f"{d}/{name}.onnx"
        if not os.path.exists(path):
            t0 = time.time()
            m = build(name)
            ex = example(name, 1)
            (iname,) = ex.keys()
            args = (torch.from_numpy(ex[iname]),)
            kw = dict(
                input_names=[iname],
                output_names=["y"],
                dynamic_axes={iname: {0: "batch"}, "y": {0: "batch"}},
                opset_version=17,
            )
            try:
                torch.onnx.export(m, args, path, dynamo=False, **kw)
            except Exception as e:  # the TorchScript exporter may be gone
                # The dynamo exporter may specialise the batch dim: export
                # one static model per batch instead.
                log(f"{name}: TorchScript export failed ({str(e)[:200]}); dynamo=True, one model per batch")
                del kw["dynamic_axes"]
                for b in BATCHES:
                    exb = example(name, b)
                    torch.onnx.export(m, (torch.from_numpy(exb[iname]),), f"{d}/{name}.b{b}.onnx", dynamo=True, **kw)
                open(path, "wb").close()  # marker: per-batch files
            log(f"exported {name} in {time.time() - t0:.1f} s")
        for b in BATCHES:
            np.savez(f"{d}/{name}.b{b}.npz", **example(name, b))


def run_graphopt(model, inputs, out, device, repeat, dims):
    cmd = [GRAPHOPT, "run", model, "--device", device, "--inputs", inputs, "-o", out, "--json"]
    cmd += ["--repeat", str(repeat)]
    for k, v in dims.items():
        cmd += ["--dim", f"{k}={v}"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    wall = time.time() - t0
    if p.returncode != 0:
        return {"error": (p.stderr.strip() or p.stdout.strip())[-600:], "wall_s": wall}
    r = json.loads(p.stdout)
    r["wall_s"] = wall
    return r


def compare(a, b):
    """max |a-b| / max |b|, and ||a-b|| / ||b||, in float64."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return {"shape_mismatch": [list(a.shape), list(b.shape)]}
    if not np.isfinite(a).all():
        return {"nan_or_inf": True}
    scale = max(np.abs(b).max(), 1e-30)
    return {
        "max_rel": float(np.abs(a - b).max() / scale),
        "l2_rel": float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)),
    }


def torch_eager(name, dtype, ex, repeat):
    import torch

    dev = torch.device("cuda")
    m = build(name, dtype).to(dev)
    (iname,) = ex.keys()
    x = torch.from_numpy(ex[iname])
    if dtype == "fp16" and x.dtype == torch.float32:
        x = x.half()
    x = x.pin_memory()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    with torch.inference_mode():
        for i in range(repeat + 2):
            t0 = time.perf_counter()
            y = m(x.to(dev, non_blocking=True)).float().cpu()
            torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - t0)
    times.sort()
    r = {
        "latency_best_ms": times[0] * 1e3,
        "latency_median_ms": times[len(times) // 2] * 1e3,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "weights_bytes": base,
    }
    del m
    torch.cuda.empty_cache()
    return r, y.numpy()


def optimized(d, name, dtype, b):
    """The graphopt-optimized model for this dtype and batch (made once)."""
    per_batch = os.path.getsize(f"{d}/{name}.onnx") == 0
    src = f"{d}/{name}.b{b}.onnx" if per_batch else f"{d}/{name}.onnx"
    opt = f"{d}/{name}{f'.b{b}' if per_batch else ''}.{dtype}.opt.onnx"
    if not os.path.exists(opt):
        cmd = [GRAPHOPT, "optimize", src, "-o", opt]
        if dtype == "fp16":
            cmd += ["--precision", "fp16", "--any-runtime"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("graphopt optimize: " + p.stderr[-600:])
    return opt


def bench(d, name):
    rows = []
    for dtype in ("fp32", "fp16"):
        for b in BATCHES:
            row = {"model": name, "dtype": dtype, "batch": b}
            try:
                opt = optimized(d, name, dtype, b)
            except Exception as e:
                row["error"] = str(e)
                rows.append(row)
                continue
            inputs = f"{d}/{name}.b{b}.npz"
            ex = dict(np.load(inputs))
            out_gpu = f"{d}/{name}.{dtype}.b{b}.cuda.npz"
            g = run_graphopt(opt, inputs, out_gpu, "cuda", REPEAT, {})
            row["graphopt_cuda"] = g
            y_gpu = None if "error" in g else np.load(out_gpu)["y"]
            if b == 1 and y_gpu is not None:
                out_cpu = f"{d}/{name}.{dtype}.b{b}.cpu.npz"
                c = run_graphopt(opt, inputs, out_cpu, "cpu", 1, {})
                row["graphopt_cpu_latency_ms"] = c.get("latency_best_ms")
                if "error" in c:
                    row["cpu_error"] = c["error"]
                else:
                    row["cuda_vs_cpu"] = compare(y_gpu, np.load(out_cpu)["y"])
            try:
                t, y_torch = torch_eager(name, dtype, ex, REPEAT)
                row["torch_eager"] = t
                if y_gpu is not None:
                    row["cuda_vs_torch"] = compare(y_gpu, y_torch)
            except Exception as e:
                row["torch_error"] = repr(e)[-600:]
            log(json.dumps(row)[:2000])
            rows.append(row)
    with open(f"{d}/rows.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def compile_bench(d, name):
    import torch

    out = []
    for dtype in ("fp32", "fp16"):
        b = 32
        ex = dict(np.load(f"{d}/{name}.b{b}.npz"))
        (iname,) = ex.keys()
        m = build(name, dtype).cuda()
        x = torch.from_numpy(ex[iname])
        if dtype == "fp16" and x.dtype == torch.float32:
            x = x.half()
        x = x.pin_memory()
        t0 = time.time()
        cm = torch.compile(m)
        times = []
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            for i in range(REPEAT + 2):
                s = time.perf_counter()
                cm(x.cuda(non_blocking=True)).float().cpu()
                torch.cuda.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - s)
        times.sort()
        r = {
            "model": name,
            "dtype": dtype,
            "batch": b,
            "torch_compile": {
                "compile_and_run_s": time.time() - t0,
                "latency_best_ms": times[0] * 1e3,
                "latency_median_ms": times[len(times) // 2] * 1e3,
                "max_memory_allocated": torch.cuda.max_memory_allocated(),
                "max_memory_reserved": torch.cuda.max_memory_reserved(),
            },
        }
        log(json.dumps(r))
        out.append(r)
        del m, cm
        torch.cuda.empty_cache()
    with open(f"{d}/compile.jsonl", "a") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")


def mib(x):
    return f"{x / 2**20:.0f}" if isinstance(x, (int, float)) else "-"


def report(d, outdir):
    os.makedirs(outdir, exist_ok=True)
    rows = [json.loads(l) for l in open(f"{d}/rows.jsonl")] if os.path.exists(f"{d}/rows.jsonl") else []
    comp = [json.loads(l) for l in open(f"{d}/compile.jsonl")] if os.path.exists(f"{d}/compile.jsonl") else []
    env = {}
    try:
        import torch

        env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    except Exception as e:
        env = {"torch_error": repr(e)}
    cmap = {(c["model"], c["dtype"], c["batch"]): c["torch_compile"] for c in comp}
    lines = [
        "# graphopt CUDA backend vs torch (benches/device/cuda_check.sh)",
        "",
        f"GPU: {env.get('gpu', '?')}, torch {env.get('torch', '?')}. Latency: host inputs to host outputs, "
        f"median of {REPEAT} after warm-up (graphopt: CUDA graph replay). Memory in MiB: graphopt = weights + arena + "
        "workspace (expected / measured by cuMemGetInfo); torch = max_memory_allocated / max_memory_reserved.",
        "",
        "| model | dtype | batch | graphopt ms | torch eager ms | torch.compile ms | lat ratio (g/eager) | graphopt MiB exp/meas | torch MiB alloc/reserved | mem ratio (g/reserved) | cuda vs cpu max_rel | cuda vs torch max_rel | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "batch" not in r:
            lines.append(f"| {r['model']} | {r['dtype']} | - | | | | | | | | | | {r.get('error', '')[:200]} |")
            continue
        g = r.get("graphopt_cuda", {})
        cu = g.get("cuda") or {}
        t = r.get("torch_eager", {})
        c = cmap.get((r["model"], r["dtype"], r["batch"]), {})
        gl, tl = g.get("latency_median_ms"), t.get("latency_median_ms")
        ge, gm = cu.get("expected_device_bytes"), cu.get("measured_device_bytes")
        tr = t.get("max_memory_reserved")
        note = (g.get("error") or r.get("torch_error") or r.get("cpu_error") or cu.get("graph_error") or "").replace("|", "/")[:200]
        fmt = lambda x: f"{x:.2f}" if isinstance(x, (int, float)) else "-"
        sci = lambda x: f"{x:.1e}" if isinstance(x, (int, float)) else "-"
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['batch']} | {fmt(gl)} | {fmt(tl)} | {fmt(c.get('latency_median_ms'))} | "
            f"{fmt(gl / tl) if gl and tl else '-'} | {mib(ge)} / {mib(gm)} | {mib(t.get('max_memory_allocated'))} / {mib(tr)} | "
            f"{fmt(ge / tr) if ge and tr else '-'} | {sci(r.get('cuda_vs_cpu', {}).get('max_rel'))} | "
            f"{sci(r.get('cuda_vs_torch', {}).get('max_rel'))} | {note} |"
        )
    lines += ["", "Goals (issue 14): device memory <= 0.6x torch eager reserved; latency <= 1.2x torch eager at batch 32."]
    md = "\n".join(lines) + "\n"
    with open(f"{outdir}/cuda_check.md", "w") as f:
        f.write(md)
    with open(f"{outdir}/cuda_check.json", "w") as f:
        json.dump({"env": env, "rows": rows, "torch_compile": comp}, f, indent=1)
    print(md)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "export":
        export(sys.argv[2])
    elif cmd == "bench":
        bench(sys.argv[2], sys.argv[3])
    elif cmd == "compile":
        compile_bench(sys.argv[2], sys.argv[3])
    elif cmd == "report":
        report(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown subcommand {cmd}")
