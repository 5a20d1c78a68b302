#!/usr/bin/env python3
"""Torch autograd references for `graphopt grad` (developer-only: needs torch,
torchvision, transformers and onnxscript; CI uses the committed files and
never runs this).

    python3 testdata/autodiff/make_torch_refs.py [--only small|models] [--check]

Small modules (checked by crates/graphopt/tests/grad_torch.rs,
gradients_match_torch_autograd and adamw_matches_torch_optim): an MLP, a CNN
with BatchNorm in eval mode and average/max pooling, a pre-norm transformer
block whose attention is written with torch.einsum, each exported with both
exporters (TorchScript, opset 14 -> NAME.ts.onnx; dynamo, opset 18 ->
NAME.dynamo.onnx), into testdata/autodiff/torch/:

    NAME.EXP.onnx        the model
    NAME.EXP.refs.npz    in/<input>     the fixed inputs (and in/target)
                         loss           torch's loss (float64 scalar)
                         grad/<init>    d loss / d parameter, keyed by the ONNX
                                        initializer that holds the parameter
                                        (matched by name, else by value; a
                                        weight the exporter transposed is
                                        matched against its transpose and its
                                        gradient stored transposed likewise)
                         input_grad/<input>  d loss / d input (float inputs)
                         adamw/<init>  the parameter after 3 AdamW steps on
                                       the same batch (lr 1e-2, betas (0.9,
                                       0.99), eps 1e-8, weight decay 0.1)
    MANIFEST.json        per model: loss, class axis, matched parameters

Every parameter is perturbed with seeded noise first so that no two
parameters are equal (LayerNorm's ones would otherwise be ambiguous by
value).

The architectures of testdata/models (checked by grad_torch.rs,
models_match_torch_autograd): resnet_tiny, mobilenet_v3_small, bert_tiny,
gpt2_tiny, vit_tiny, t5_encoder_tiny, whisper_encoder_tiny, built by
make_models.py's own arch_* builders (imported, not copied), so that the
weights and inputs are exactly those of the committed .ts14 and .dynamo18
exports (the inputs are compared with the committed .inputs.npz). For each
(MODEL_LOSSES: `sum` and `mse` against a seeded target, see there) into
testdata/autodiff/torch/models/:

    ARCH.refs.npz        <loss>/loss               torch's loss (float32)
                         <loss>/target             the mse target
                         <loss>/input_grad/<input> d loss / d float input
                         <loss>/<group>            d loss / d group (whole), or
                         <loss>/<group>.norm       its L2 norm and
                         <loss>/<group>.sample     every stride-th entry
    MANIFEST.json        per architecture: the losses (torch's values), the
                         groups (torch references, shape, stride), and per
                         export the groups' initializers (transposed or
                         not), the torch parameters left out and why

How initializers are matched to torch's parameters by value (renamed,
transposed, deduplicated, BatchNorm-folded, dropped): see _model_groups.
All arrays are float32 (only the small modules' loss is float64).

Reproducibility: `--check` regenerates everything into a temporary folder
and compares it with the committed files. On the generating machine
(torch 2.15.0+cu132, CPU, 1 thread) the model references are reproduced
bitwise; the small modules' within 3.6e-7 of each array's largest
magnitude (they were generated on another CPU), leaving out AdamW entries
whose gradient is rounding noise, as grad_torch.rs does.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "torch")
ADAMW = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
ADAMW_STEPS = 3


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 5)

    def forward(self, x):
        h = nn.functional.gelu(self.fc1(x))
        h = torch.relu(self.fc2(h)) + torch.tanh(h)
        return self.fc3(h)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = self.pool(torch.relu(self.bn1(self.conv1(x))))
        h = self.avg(nn.functional.hardswish(self.bn2(self.conv2(h))))
        h = torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1)
        return self.fc(h)


class Block(nn.Module):
    """Pre-norm transformer block; attention with torch.einsum."""

    def __init__(self, d=16, heads=2, ff=32):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / (d // h) ** 0.5
        a = torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.ln2(x))))


def build(name):
    g = torch.Generator().manual_seed({"mlp": 1, "cnn": 2, "block": 3}[name])
    torch.manual_seed({"mlp": 11, "cnn": 12, "block": 13}[name])
    if name == "mlp":
        m = Mlp()
        x = torch.randn(4, 8, generator=g)
        target = torch.tensor([0, 3, 1, 4])
        loss = "cross_entropy"
    elif name == "cnn":
        m = Cnn()
        x = torch.randn(2, 3, 8, 8, generator=g)
        target = torch.randn(2, 4, generator=g)
        loss = "mse"
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                n = mod.num_features
                mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
    else:
        m = Block()
        x = torch.randn(2, 5, 16, generator=g)
        target = None
        loss = "mean"
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    m.eval()
    return m, x, target, loss


def loss_of(kind, y, target):
    if kind == "cross_entropy":
        return nn.functional.cross_entropy(y, target)
    if kind == "mse":
        return nn.functional.mse_loss(y, target)
    if kind == "mean":
        return y.mean()
    return y.sum()


def export(m, x, path, exporter, optimize):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "ts":
            # PRESERVE keeps BatchNormalization (EVAL would fold it into the
            # convolution, and the folded weights are no torch parameter).
            torch.onnx.export(m, (x,), path, dynamo=False, opset_version=14,
                              input_names=["x"], output_names=["y"],
                              training=torch.onnx.TrainingMode.PRESERVE,
                              do_constant_folding=True)
        else:
            prog = torch.onnx.export(m, (x,), None, dynamo=True, opset_version=18,
                                     input_names=["x"], output_names=["y"], optimize=optimize)
            prog.save(path, external_data=False)


def match(params, inits):
    """torch name -> (onnx initializer, transposed)."""
    out = {}
    for pname, p in params.items():
        if pname in inits and inits[pname].shape == p.shape and np.array_equal(inits[pname], p):
            out[pname] = (pname, False)
            continue
        cands = [(i, False) for i, t in inits.items() if t.shape == p.shape and np.array_equal(t, p)]
        if p.ndim == 2:
            cands += [(i, True) for i, t in inits.items()
                      if t.shape == p.T.shape and np.array_equal(t, p.T)]
        if len(cands) != 1:
            raise SystemExit(f"parameter {pname}: {len(cands)} initializers hold it")
        out[pname] = cands[0]
    return out


def small_refs(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    manifest = {}
    for name in ["mlp", "cnn", "block"]:
        for exp in ["ts", "dynamo"]:
            m, x, target, kind = build(name)
            stem = f"{name}.{exp}"
            path = os.path.join(out_dir, stem + ".onnx")
            # Not for the CNN: onnxscript's optimizer folds BatchNormalization
            # into the convolution, whose folded weights are no torch
            # parameter; the others need it (chunk() exports as
            # SplitToSequence otherwise).
            export(m, x, path, exp, optimize=name != "cnn")
            model = onnx.load(path)
            inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
            params = {n: p.detach().numpy() for n, p in m.named_parameters()}
            mapping = match(params, inits)
            xg = x.clone().requires_grad_(True)
            y = m(xg)
            loss = loss_of(kind, y, target)
            m.zero_grad()
            loss.backward()
            arrays = {"in/x": x.numpy(), "loss": np.array(loss.item(), dtype=np.float64),
                      "input_grad/x": xg.grad.numpy()}
            if target is not None:
                arrays["in/target"] = target.numpy()
            for pname, p in m.named_parameters():
                iname, tr = mapping[pname]
                g = p.grad.numpy()
                arrays[f"grad/{iname}"] = g.T if tr else g
            # AdamW, ADAMW_STEPS steps on the same batch.
            opt = torch.optim.AdamW(m.parameters(), **ADAMW)
            for _ in range(ADAMW_STEPS):
                opt.zero_grad()
                loss_of(kind, m(x), target).backward()
                opt.step()
            for pname, p in m.named_parameters():
                iname, tr = mapping[pname]
                v = p.detach().numpy()
                arrays[f"adamw/{iname}"] = v.T if tr else v
            np.savez(os.path.join(out_dir, stem + ".refs.npz"),
                     **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
            manifest[stem] = dict(loss=kind, class_axis=1, params=len(mapping),
                                  transposed=sorted(i for i, t in mapping.values() if t))
            print(f"{stem}: loss {loss.item():.6f}, {len(mapping)} parameters matched")
    manifest["_meta"] = dict(torch=torch.__version__, onnx=onnx.__version__, adamw=ADAMW,
                             adamw_steps=ADAMW_STEPS)
    with open(os.path.join(out_dir, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------
# The architectures of testdata/models (make_models.py's arch_* builders)
# ---------------------------------------------------------------------------

MODELS_DIR = os.path.normpath(os.path.join(HERE, "..", "models"))
# Per architecture, the losses as (kind, output). `sum` reads an output that
# no LayerNorm ends: the sum of a LayerNorm's row is its bias's sum whatever
# the input, so every other gradient of it is exactly 0 and its computed
# value rounding noise (BERT and ViT sum their pooler output instead;
# Whisper's only output ends in a LayerNorm: mse only). T5's RMSNorm does
# not subtract the mean, so its sum is a fair loss.
MODEL_LOSSES = {
    "resnet_tiny": [("sum", "logits"), ("mse", "logits")],
    "mobilenet_v3_small": [("sum", "logits"), ("mse", "logits")],
    "bert_tiny": [("sum", "pooler_output"), ("mse", "last_hidden_state")],
    "gpt2_tiny": [("sum", "logits"), ("mse", "logits")],
    "vit_tiny": [("sum", "pooler_output"), ("mse", "last_hidden_state")],
    "t5_encoder_tiny": [("sum", "last_hidden_state"), ("mse", "last_hidden_state")],
    "whisper_encoder_tiny": [("mse", "last_hidden_state")],
}
# The exports compared: one per exporter (TorchScript at opset 14, dynamo).
MODEL_EXPORTS = ("ts14", "dynamo18")
# A reference of up to FULL_LIMIT elements (every bias and norm weight, the
# 64x64 attention matrices, most of MobileNet's convolutions) is stored
# whole; a larger one as its L2 norm and every `stride`-th entry of its
# flattened torch layout (stride = ceil(n / SAMPLE)), so that the files stay
# under 2 MB.
FULL_LIMIT = 4096
SAMPLE = 512
# A BatchNorm fold is recognized by value within this relative tolerance
# (the exporters compute the folded weights in float32).
FOLD_RTOL = 1e-5


def _make_models():
    sys.path.insert(0, MODELS_DIR)
    try:
        import make_models
    finally:
        sys.path.pop(0)
    return make_models


def _fold_pairs(module):
    """(conv, bn) module names: each Conv2d followed directly, in module
    registration order, by a BatchNorm2d over its output channels (the
    conv-bn pairs of torchvision's ResNet and MobileNetV3)."""
    mods = list(module.named_modules())
    return [(cn, bn) for (cn, c), (bn, b) in zip(mods, mods[1:])
            if isinstance(c, nn.Conv2d) and isinstance(b, nn.BatchNorm2d)
            and b.num_features == c.out_channels]


class _Union:
    def __init__(self):
        self.parent = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


def _model_groups(module, model):
    """Matches the initializers of one export to the torch module by value.

    The torch side is a set of references, each a tensor in torch's layout
    whose gradient torch computes:
      p:NAME         a parameter, matched where an initializer equals it
                     (2-D: or its transpose, as exporters store Linear
                     weights for MatMul);
      fold:CONV      W·s, a convolution's weight with the following
                     BatchNorm (eval mode) folded in, s = γ/√(var + eps)
                     per output channel; its gradient is dL/dW / s;
      p:BN.bias      also matched as the folded bias (b_conv - mean)·s + β,
                     whose gradient is dL/dβ.
    An initializer and a reference holding the same value are linked; each
    connected component is one group, checked as a whole: the sum of its
    initializers' gradients (in torch's layout) against the sum of its
    references' gradients. That covers an exporter that stored one tensor
    for several equal parameters (TorchScript deduplicates equal
    initializers: BERT's zero biases are one) and one parameter used twice
    (GPT-2's tied embedding: the Gather's table and the lm_head's
    transposed copy)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    params = {n: p.detach().numpy() for n, p in module.named_parameters()}
    mods = dict(module.named_modules())
    cands = []  # (ref key, value in torch layout, exact)
    for n, v in params.items():
        cands.append((f"p:{n}", v, True))
    folded_gamma = set()
    for cn, bn in _fold_pairs(module):
        c, b = mods[cn], mods[bn]
        s = (b.weight.detach().double() / torch.sqrt(b.running_var.double() + b.eps)).numpy()
        w = c.weight.detach().double().numpy()
        cb = c.bias.detach().double().numpy() if c.bias is not None else 0.0
        cands.append((f"fold:{cn}", w * s[:, None, None, None], False))
        cands.append((f"p:{bn}.bias",
                      (cb - b.running_mean.double().numpy()) * s + b.bias.detach().double().numpy(),
                      False))
        folded_gamma.add(f"{bn}.weight")
    u = _Union()
    links = {}  # init -> (ref, transposed)
    floats = {k: v for k, v in inits.items() if v.dtype == np.float32 and v.size > 1}
    for iname, t in floats.items():
        for key, v, exact in cands:
            for tr in (False, True):
                if tr and v.ndim != 2:
                    continue
                vv = v.T if tr else v
                if vv.shape != t.shape:
                    continue
                if exact:
                    hit = np.array_equal(t, vv)
                else:
                    hit = np.allclose(t, vv, rtol=FOLD_RTOL, atol=FOLD_RTOL * np.abs(vv).max())
                if hit:
                    links.setdefault(iname, []).append((key, tr))
                    u.union("i:" + iname, "r:" + key)
    comps = {}
    for iname, ls in links.items():
        root = u.find("i:" + iname)
        c = comps.setdefault(root, dict(refs=set(), inits={}))
        for key, tr in ls:
            c["refs"].add(key)
            if iname in c["inits"] and c["inits"][iname] != tr:
                raise SystemExit(f"initializer {iname} matches both ways")
            c["inits"][iname] = tr
    # Uses of each initializer, and the torch modules each using node came from
    # (the dynamo exporter records them in the node's metadata).
    uses, scopes = {}, {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        sc = set(json.loads(meta["pkg.torch.onnx.name_scopes"].replace("'", '"'))) \
            if "pkg.torch.onnx.name_scopes" in meta else set()
        for i in node.input:
            uses[i] = uses.get(i, 0) + 1
            scopes.setdefault(i, set()).update(sc)
    dropped = set()
    groups = []
    for c in comps.values():
        refs = sorted(c["refs"])
        n_uses = sum(uses.get(i, 0) for i in c["inits"])
        if n_uses < len(refs):
            # Fewer uses than parameters: the exporter shared one initializer
            # among equal parameters and dropped the addition of some (zero
            # biases). The used ones are those of the modules the using
            # nodes came from.
            used_scopes = set().union(*(scopes.get(i, set()) for i in c["inits"]))
            kept = [r for r in refs if r.startswith("p:")
                    and r[2:].rsplit(".", 1)[0] in used_scopes]
            if len(kept) != n_uses:
                raise SystemExit(f"initializers {sorted(c['inits'])}: {n_uses} uses, "
                                 f"{len(refs)} parameters, {len(kept)} by the nodes' scopes")
            dropped.update(r[2:] for r in refs if r not in kept)
            refs = kept
        frozen = {r for r in refs
                  if not module.get_parameter(r[2:] if r.startswith("p:")
                                              else r[5:] + ".weight").requires_grad}
        if frozen and len(frozen) != len(refs):
            raise SystemExit(f"group {refs}: some parameters frozen, some not")
        groups.append(dict(refs=refs, inits=sorted([i, t] for i, t in c["inits"].items()),
                           frozen=bool(frozen)))
    groups.sort(key=lambda g: g["refs"][0])
    matched = {r for g in groups for r in g["refs"]}
    unmatched_params = {}
    for n in params:
        if f"p:{n}" in matched or (n.endswith(".weight") and f"fold:{n[:-7]}" in matched):
            continue
        if n in folded_gamma and any(r.startswith("fold:") for r in matched):
            unmatched_params[n] = ("BatchNorm scale folded into the convolution's weight and "
                                   "bias: no initializer of its own")
        elif n in dropped or not params[n].any():
            unmatched_params[n] = ("all zeros, and the exporter dropped its addition: no "
                                   "initializer, nothing to differentiate")
        else:
            unmatched_params[n] = "no initializer holds its value (nor its transpose)"
    unmatched_inits = sorted(i for i in floats if i not in links)
    return groups, unmatched_params, unmatched_inits


def _torch_refs(module, spec, kind, output, seed):
    """Torch's loss and the gradient of every reference key (see
    _model_groups) and of every float input, for one loss."""
    args = [a.clone().requires_grad_(True) if a.is_floating_point() else a
            for a in spec["args"]]
    module.zero_grad()
    outs = module(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    y = dict(zip(spec["output_names"], outs))[output]
    target = None
    if kind == "sum":
        loss = y.sum()
    else:
        target = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))
        loss = nn.functional.mse_loss(y, target)
    loss.backward()
    refs = {}
    mods = dict(module.named_modules())
    for n, p in module.named_parameters():
        refs[f"p:{n}"] = (p.grad if p.grad is not None else torch.zeros_like(p)).numpy()
    for cn, bn in _fold_pairs(module):
        c, b = mods[cn], mods[bn]
        s = (b.weight.detach().double() / torch.sqrt(b.running_var.double() + b.eps))
        g = c.weight.grad.double() / s[:, None, None, None]
        refs[f"fold:{cn}"] = g.float().numpy()
    in_grads = {n: a.grad.numpy() for n, a in zip(spec["input_names"], args)
                if a.is_floating_point()}
    return float(loss.item()), target, refs, in_grads


def model_refs(out_dir):
    """Writes ARCH.refs.npz for each architecture and MANIFEST.json."""
    mm = _make_models()
    os.makedirs(out_dir, exist_ok=True)
    manifest = {}
    total = 0
    for ai, (arch, losses) in enumerate(MODEL_LOSSES.items()):
        spec = mm.ARCHS[arch]()
        module = spec["module"].eval()
        entry = dict(losses=[], exports={})
        group_ids = {}  # frozenset(refs) -> id
        group_info = {}
        for exp in MODEL_EXPORTS:
            stem = f"{arch}.{exp}"
            path = os.path.join(MODELS_DIR, stem + ".onnx")
            inputs = dict(np.load(os.path.join(MODELS_DIR, stem + ".inputs.npz")))
            for n, a in zip(spec["input_names"], spec["args"]):
                if not np.array_equal(inputs[n], a.numpy()):
                    raise SystemExit(f"{stem}: input {n} differs from make_models.py's")
            groups, unp, uni = _model_groups(module, onnx.load(path))
            out_groups = []
            for g in groups:
                k = frozenset(g["refs"])
                if k not in group_ids:
                    group_ids[k] = f"g{len(group_ids)}"
                out_groups.append(dict(id=group_ids[k], refs=g["refs"], inits=g["inits"],
                                       frozen=g["frozen"]))
                group_info[group_ids[k]] = g["refs"]
            entry["exports"][stem] = dict(groups=out_groups, unmatched_params=unp,
                                          unmatched_inits=uni)
            print(f"{stem}: {len(groups)} groups, {len(unp)} parameters and {len(uni)} "
                  f"initializers unmatched")
        arrays = {}
        # Storage: whole, or norm + strided sample.
        shapes = {}
        for loss_i, (kind, output) in enumerate(MODEL_LOSSES[arch]):
            loss, target, refs, in_grads = _torch_refs(module, spec, kind, output,
                                                       seed=100 + 10 * ai + loss_i)
            entry["losses"].append(dict(kind=kind, output=output, torch_loss=loss))
            arrays[f"{kind}/loss"] = np.array(loss, dtype=np.float32)
            if target is not None:
                arrays[f"{kind}/target"] = target.numpy()
            for n, g in in_grads.items():
                arrays[f"{kind}/input_grad/{n}"] = g
            for gid, keys in group_info.items():
                ref = np.sum([refs[k].astype(np.float64) for k in keys], axis=0)
                shapes[gid] = list(ref.shape)
                arrays[f"{kind}/{gid}"] = ref
        entry["groups"] = {}
        for gid, s in shapes.items():
            n = int(np.prod(s))
            stride = None if n <= FULL_LIMIT else -(-n // SAMPLE)
            entry["groups"][gid] = dict(refs=group_info[gid], shape=s, stride=stride)
            for kind, _ in MODEL_LOSSES[arch]:
                ref = arrays.pop(f"{kind}/{gid}")
                if stride is None:
                    arrays[f"{kind}/{gid}"] = ref.astype(np.float32)
                else:
                    arrays[f"{kind}/{gid}.norm"] = np.array(np.linalg.norm(ref), np.float32)
                    arrays[f"{kind}/{gid}.sample"] = ref.reshape(-1)[::stride].astype(np.float32)
        fn = os.path.join(out_dir, arch + ".refs.npz")
        np.savez(fn, **{k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()})
        total += os.path.getsize(fn)
        manifest[arch] = entry
        print(f"{arch}: {os.path.getsize(fn) / 1024:.0f} KiB")
    import torchvision
    import transformers
    manifest["_meta"] = dict(torch=torch.__version__, torchvision=torchvision.__version__,
                             transformers=transformers.__version__, onnx=onnx.__version__,
                             full_limit=FULL_LIMIT, sample=SAMPLE)
    with open(os.path.join(out_dir, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"models: {total / 1024:.0f} KiB of references")


def check(out_dir, fresh_dir):
    """Compares regenerated references with the committed ones: every array
    within 1e-6 of the largest magnitude of the committed one; the
    manifests' structure equal."""
    bad = []
    for fn in sorted(os.listdir(fresh_dir)):
        new_p, old_p = os.path.join(fresh_dir, fn), os.path.join(out_dir, fn)
        if not os.path.exists(old_p):
            bad.append(f"{fn}: not committed")
            continue
        if fn.endswith(".npz"):
            a, b = np.load(old_p), np.load(new_p)
            if sorted(a.files) != sorted(b.files):
                bad.append(f"{fn}: different arrays")
                continue
            worst = 0.0
            for k in a.files:
                x, y = a[k].astype(np.float64), b[k].astype(np.float64)
                if x.shape != y.shape:
                    bad.append(f"{fn}:{k}: shape {x.shape} != {y.shape}")
                    continue
                if k.startswith("adamw/"):
                    # AdamW divides by the gradient's own magnitude: entries
                    # whose gradient is rounding noise (the attention key
                    # bias's, exactly 0 in exact arithmetic) take a full
                    # step of the noise's sign. Left out, as grad_torch.rs
                    # does.
                    g = a["grad/" + k[6:]].astype(np.float64)
                    keep = (g == 0) | (np.abs(g) > 1e-5 * np.abs(g).max())
                    x, y = x[keep], y[keep]
                d = np.abs(x - y).max(initial=0.0) / max(np.abs(x).max(initial=0.0), 1e-30)
                worst = max(worst, d)
                if d > 1e-6:
                    bad.append(f"{fn}:{k}: differs by {d:.2e} (relative to its max)")
            print(f"{fn}: worst difference {worst:.2e} (relative to each array's max)")
        elif fn.endswith(".json"):
            with open(old_p) as f1, open(new_p) as f2:
                if json.load(f1).keys() != json.load(f2).keys():
                    bad.append(f"{fn}: different entries")
    for b in bad:
        print("MISMATCH", b)
    return 1 if bad else 0


def main():
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["small", "models"])
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary folder and compare with the committed files")
    args = ap.parse_args()
    torch.set_num_threads(1)
    jobs = [("small", OUT, small_refs), ("models", os.path.join(OUT, "models"), model_refs)]
    rc = 0
    for name, out_dir, fn in jobs:
        if args.only and args.only != name:
            continue
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                fn(tmp)
                rc |= check(out_dir, tmp)
        else:
            fn(out_dir)
    return rc


if __name__ == "__main__":
    sys.exit(main())
