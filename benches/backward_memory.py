#!/usr/bin/env python3
"""What each gradient rule keeps for the backward pass, against torch
autograd (issue 21 item 3, "backward rules at torch's memory").

    python3 benches/backward_memory.py --graphopt BIN [--cases relu,conv3x3] [--out DIR]

Needs torch (the bench venv). One case per op with a gradient rule, a
small torch module at a realistic activation size (a ResNet stage's
[8, 64, 56, 56], a transformer's [4, 256, 768], attention scores
[4, 12, 256, 256]):

* torch: the module's forward under `torch.autograd.graph.saved_tensors_hooks`,
  with its input an activation (`requires_grad=True`); every tensor autograd
  saves, once per storage, parameters and buffers left out: the bytes the
  backward pass holds from the forward.
* graphopt: the module exported with the TorchScript exporter (opset 17,
  `TrainingMode.PRESERVE`), its output multiplied by a fixed random buffer
  `r` (so that no rule sees the sum loss's uniform gradient; torch runs the
  same product, outside the hooks), then `graphopt grad M -o T --loss sum
  --input-grads --frozen R --report R.json`: the report's saved activation
  and input bytes (forward values and graph inputs that backward nodes
  read), after the default pipeline and the pointwise recomputation
  `graphopt grad` does by default. Also the planner's activation peak of
  that training step (`lower_bound_bytes`), for scale (torch's transient
  backward memory is not measured here).

Prints a markdown table and writes backward_memory.md and
backward_memory.json under benches/results/ (or --out).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONV = [8, 64, 56, 56]
POOL = [8, 64, 112, 112]
SEQ = [4, 256, 768]
ATTN = [4, 12, 256, 256]


def cases():
    """(family, name, torch module, input shape, input kind, what it exports to)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Fn(nn.Module):
        def __init__(self, f, **params):
            super().__init__()
            for k, v in params.items():
                setattr(self, k, nn.Parameter(v))
            self.f = f

        def forward(self, x):
            return self.f(self, x)

    g = torch.Generator().manual_seed(0)

    def p(*shape):
        return torch.randn(*shape, generator=g)

    E = SEQ[-1]
    return [
        ("elementwise", "add_bias", Fn(lambda m, x: x + m.b, b=p(E)), SEQ, "f", "Add"),
        ("elementwise", "mul_weight", Fn(lambda m, x: x * m.w, w=p(E)), SEQ, "f", "Mul"),
        ("elementwise", "div_weight", Fn(lambda m, x: x / m.w, w=p(E)), SEQ, "f", "Div"),
        ("elementwise", "sub_neg", Fn(lambda m, x: m.b - x, b=p(E)), SEQ, "f", "Sub"),
        ("elementwise", "pow2", Fn(lambda m, x: x.pow(2)), SEQ, "f", "Pow"),
        ("elementwise", "sqrt", Fn(lambda m, x: torch.sqrt(x)), SEQ, "+", "Sqrt"),
        ("elementwise", "exp", Fn(lambda m, x: torch.exp(x)), SEQ, "f", "Exp"),
        ("elementwise", "log", Fn(lambda m, x: torch.log(x)), SEQ, "+", "Log"),
        ("elementwise", "reciprocal", Fn(lambda m, x: torch.reciprocal(x)), SEQ, "+", "Reciprocal"),
        ("elementwise", "where_mask", Fn(lambda m, x: torch.where(x > 0, x, m.b), b=p(E)), SEQ, "f",
         "Where"),
        ("activations", "relu", nn.ReLU(), CONV, "f", "Relu"),
        ("activations", "relu6", nn.ReLU6(), CONV, "f", "Clip"),
        ("activations", "leaky_relu", nn.LeakyReLU(0.1), CONV, "f", "LeakyRelu"),
        ("activations", "elu", nn.ELU(), CONV, "f", "Elu"),
        ("activations", "prelu", nn.PReLU(64), CONV, "f", "PRelu"),
        ("activations", "sigmoid", nn.Sigmoid(), CONV, "f", "Sigmoid"),
        ("activations", "tanh", nn.Tanh(), CONV, "f", "Tanh"),
        ("activations", "hardsigmoid", nn.Hardsigmoid(), CONV, "f", "HardSigmoid"),
        ("activations", "hardswish", nn.Hardswish(), CONV, "f", "HardSwish"),
        ("activations", "softplus", nn.Softplus(), CONV, "f", "Softplus"),
        ("activations", "gelu_erf", nn.GELU(), SEQ, "f", "Erf and pointwise ops"),
        ("activations", "gelu_tanh", nn.GELU(approximate="tanh"), SEQ, "f", "Tanh and pointwise ops"),
        ("activations", "softmax", nn.Softmax(dim=-1), ATTN, "f", "Softmax"),
        ("activations", "log_softmax", nn.LogSoftmax(dim=-1), ATTN, "f", "LogSoftmax"),
        ("matmul", "linear_3d", nn.Linear(E, E), SEQ, "f", "MatMul, Add"),
        ("matmul", "linear_2d", nn.Linear(E, E), [SEQ[0] * SEQ[1], E], "f", "Gemm"),
        ("matmul", "x_xt", Fn(lambda m, x: x @ x.transpose(-1, -2)), SEQ, "f", "MatMul, Transpose"),
        ("einsum", "einsum", Fn(lambda m, x: torch.einsum("bij,jk->bik", x, m.w), w=p(E, E)), SEQ, "f",
         "Einsum"),
        ("reduce", "sum_last", Fn(lambda m, x: x.sum(-1)), SEQ, "f", "ReduceSum"),
        ("reduce", "mean_last", Fn(lambda m, x: x.mean(-1)), SEQ, "f", "ReduceMean"),
        ("reduce", "amax_last", Fn(lambda m, x: x.amax(-1)), SEQ, "f", "ReduceMax"),
        ("reduce", "cumsum", Fn(lambda m, x: x.cumsum(-1)), SEQ, "f", "CumSum"),
        ("reduce", "global_avg_pool", nn.AdaptiveAvgPool2d(1), CONV, "f", "GlobalAveragePool"),
        ("shape", "reshape_transpose",
         Fn(lambda m, x: x.reshape(4, 256, 12, 64).transpose(1, 2)), SEQ, "f", "Reshape, Transpose"),
        ("shape", "expand", Fn(lambda m, x: x[:, :1].expand(-1, 256, -1)), SEQ, "f", "Slice, Expand"),
        ("shape", "concat", Fn(lambda m, x: torch.cat([x, m.b.expand_as(x)], -1), b=p(E)), SEQ, "f",
         "Concat"),
        ("shape", "split", Fn(lambda m, x: x.split(256, -1)[1]), SEQ, "f", "Split"),
        ("shape", "slice", Fn(lambda m, x: x[:, 1:-1, :384]), SEQ, "f", "Slice"),
        ("shape", "pad", Fn(lambda m, x: F.pad(x, (1, 1, 2, 2))), CONV, "f", "Pad"),
        ("shape", "embedding", nn.Embedding(30522, E), SEQ[:2], "i", "Gather"),
        ("nn", "conv3x3", nn.Conv2d(64, 64, 3, padding=1), CONV, "f", "Conv"),
        ("nn", "conv3x3_stride2", nn.Conv2d(64, 128, 3, stride=2, padding=1), CONV, "f", "Conv"),
        ("nn", "conv_depthwise", nn.Conv2d(64, 64, 3, padding=1, groups=64), CONV, "f", "Conv"),
        ("nn", "max_pool", nn.MaxPool2d(3, 2, 1), POOL, "f", "MaxPool"),
        ("nn", "avg_pool", nn.AvgPool2d(2), CONV, "f", "AveragePool"),
        ("nn", "batch_norm_eval", nn.BatchNorm2d(64).eval(), CONV, "f", "BatchNormalization"),
        ("nn", "layer_norm", nn.LayerNorm(E), SEQ, "f", "LayerNormalization"),
        ("norm", "group_norm", nn.GroupNorm(8, 64), CONV, "f", "GroupNormalization (or decomposed)"),
        ("norm", "instance_norm", nn.InstanceNorm2d(64, affine=True), CONV, "f",
         "InstanceNormalization"),
    ]


def make_input(shape, kind):
    import torch

    g = torch.Generator().manual_seed(1)
    if kind == "i":
        return torch.randint(0, 30522, shape, generator=g)
    x = torch.randn(*shape, generator=g)
    return x.abs() + 0.5 if kind == "+" else x


def scaled(op, x):
    """`op(x) * r`, `r` a fixed random buffer shaped like the output."""
    import torch

    with torch.no_grad():
        y = op(x)
    r = torch.randn(*y.shape, generator=torch.Generator().manual_seed(2))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.op = op
            self.register_buffer("r", r)

        def forward(self, x):
            return self.op(x) * self.r

    return M().eval() if not op.training else M()


def torch_saved(m, x):
    """Bytes autograd saves inside `m.op` (per storage; parameters and
    buffers out), split into the op's input and the rest."""
    import torch

    skip = {t.untyped_storage().data_ptr() for t in list(m.parameters()) + list(m.buffers())}
    xin = x.detach().requires_grad_(x.is_floating_point())
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = m.op(xin)
    (y * m.r).sum().backward()
    ptr_x = xin.untyped_storage().data_ptr()
    out = {"input": 0, "activations": 0}
    for ptr, n in seen.items():
        if ptr in skip:
            continue
        out["input" if ptr == ptr_x else "activations"] += n
    return out


def export(m, x, path):
    import torch

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"], do_constant_folding=True,
                          training=torch.onnx.TrainingMode.PRESERVE)


def buffer_name(path):
    """The initializer the final Mul reads (the buffer `r`)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    last = [n for n in m.graph.node if "y" in n.output][0]
    names = [i for i in last.input if i in inits]
    if last.op_type != "Mul" or len(names) != 1:
        raise SystemExit(f"{path}: the output is not Mul(op, r): {last.op_type} {list(last.input)}")
    return names[0]


def graphopt_saved(binary, path, frozen, tmp):
    out, rep = Path(tmp) / "t.onnx", Path(tmp) / "r.json"
    r = subprocess.run([binary, "grad", str(path), "-o", str(out), "--loss", "sum", "--input-grads",
                        "--frozen", frozen, "--report", str(rep)], capture_output=True, text=True)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    j = json.loads(rep.read_text())
    return {
        "input": j["saved_input_bytes"],
        "activations": j["saved_activation_bytes"],
        "saved": [(s["name"], s["bytes"]) for s in j["saved"]],
        "peak": j["lower_bound_bytes"],
        "backward_nodes": j["backward_nodes"],
    }


def mb(n):
    return f"{n / 1e6:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphopt", required=True, help="the graphopt binary")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--out", default=str(ROOT / "benches" / "results"))
    ap.add_argument("--note", default="", help="a line for the report (which build was measured)")
    a = ap.parse_args()
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(2)
    want = {c for c in a.cases.split(",") if c}
    rows = []
    for fam, name, op, shape, kind, onnx_ops in cases():
        if want and name not in want:
            continue
        x = make_input(shape, kind)
        m = scaled(op, x)
        row = {"family": fam, "case": name, "input": shape, "onnx": onnx_ops}
        row["torch"] = torch_saved(m, x)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.onnx"
            export(m, x, path)
            row["graphopt"] = graphopt_saved(a.graphopt, path, buffer_name(path), tmp)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    lines = [
        "# Backward memory per gradient rule (benches/backward_memory.py)",
        "",
        "Saved for backward: the bytes a training step holds from the forward for "
        "the op's gradient (its input, an activation, and what the op computes); "
        "parameters and buffers left out. torch: `saved_tensors_hooks` around the "
        "module's forward, per storage. graphopt: `graphopt grad --loss sum "
        "--input-grads` on the TorchScript export of the module times a fixed "
        "buffer, the report's saved input and activation bytes (after the default "
        "pipeline and pointwise recomputation). MB = 10^6 bytes. graphopt step "
        "peak: the planner's activation peak of that whole training step (input, "
        "saved values, gradients), for scale; torch's transient backward memory is "
        "not measured.",
        "",
        "| family | case (ONNX ops) | input | torch saved MB | graphopt saved MB | "
        "graphopt / torch | graphopt saves | graphopt step peak MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["torch"]["input"] + r["torch"]["activations"]
        gp = r["graphopt"]
        if "error" in gp:
            lines.append(f"| {r['family']} | {r['case']} ({r['onnx']}) | {r['input']} | {mb(t)} | "
                         f"FAILS: {gp['error']} | | | |")
            continue
        gs = gp["input"] + gp["activations"]
        ratio = "=" if gs == t else ("-" if t == 0 else f"{gs / t:.2f}")
        what = ", ".join(f"{n} {mb(b or 0)}" for n, b in gp["saved"]) or "nothing"
        lines.append(f"| {r['family']} | {r['case']} ({r['onnx']}) | {r['input']} | {mb(t)} | "
                     f"{mb(gs)} | {ratio} | {what} | {mb(gp['peak'])} |")
    more, less = [], []
    for r in rows:
        gp = r["graphopt"]
        if "error" in gp:
            continue
        t = r["torch"]["input"] + r["torch"]["activations"]
        gs = gp["input"] + gp["activations"]
        if gs > t:
            more.append(f"{r['case']} ({mb(gs)} vs {mb(t)} MB)")
        elif gs < t:
            less.append(f"{r['case']} ({mb(gs)} vs {mb(t)} MB)")
    lines += [
        "",
        f"graphopt saves more than torch: {', '.join(more) or 'nowhere'}.",
        "",
        f"graphopt saves less than torch: {', '.join(less) or 'nowhere'}.",
        "",
        f"Equal: {len(rows) - len(more) - len(less)} of {len(rows)} cases.",
        "",
        f"torch {torch.__version__}. {a.note}".rstrip(),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not want:
        (out / "backward_memory.md").write_text(text)
        (out / "backward_memory.json").write_text(
            json.dumps({"rows": rows, "graphopt": a.graphopt, "note": a.note,
                        "torch": torch.__version__}, indent=1)
            + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
