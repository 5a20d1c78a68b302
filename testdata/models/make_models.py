#!/usr/bin/env python3
"""Generate the small real-architecture ONNX test models in testdata/models/.

Developer-only: needs torch, torchvision, transformers, onnx, onnxruntime,
onnxscript (CI does NOT rerun this; it uses the committed files).

    python3 testdata/models/make_models.py [--out DIR] [--only NAME,NAME]

For every model NAME it writes
    NAME.onnx             the model (NAME.onnx.data too for external-data models)
    NAME.inputs.npz       seeded sample inputs, keyed by graph input name
    NAME.outputs.npz      onnxruntime's outputs on those inputs (the reference),
                          keyed by graph output name
and MANIFEST.json describing all of them plus the exports that failed.

Reference outputs are produced with a deterministic ORT session
(CPUExecutionProvider, graph optimizations disabled, 1 intra/inter-op thread);
tests must use the same settings (see MANIFEST.json "ort_session") to get
bit-identical results.

All weights are random (seeded); nothing is downloaded.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_MODEL_BYTES = 2 * 1024 * 1024  # per model (including external data)
VOCAB = 256  # vocabulary of the tiny transformer models (keeps embeddings small)

ORT_SESSION = {
    "providers": ["CPUExecutionProvider"],
    "graph_optimization_level": "ORT_DISABLE_ALL",
    "intra_op_num_threads": 1,
    "inter_op_num_threads": 1,
}


def ort_session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------
# torch architectures (built lazily so --only can skip heavy imports)
# --------------------------------------------------------------------------

def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def arch_resnet_tiny():
    """ResNet-style CNN built from torchvision's BasicBlock, reduced width."""
    torch = _torch()
    from torch import nn
    from torchvision.models.resnet import BasicBlock

    class TinyResNet(nn.Module):
        def __init__(self, widths=(8, 16, 32, 64), num_classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, widths[0], 3, stride=1, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            layers, inplanes = [], widths[0]
            for i, w in enumerate(widths):
                stride = 1 if i == 0 else 2
                down = None
                if stride != 1 or inplanes != w:
                    down = nn.Sequential(nn.Conv2d(inplanes, w, 1, stride=stride, bias=False),
                                         nn.BatchNorm2d(w))
                layers.append(BasicBlock(inplanes, w, stride, down))
                inplanes = w
            self.layers = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(inplanes, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layers(x)
            return self.fc(torch.flatten(self.avgpool(x), 1))

    torch.manual_seed(0)
    m = TinyResNet()
    _randomize_bn(m)
    m.eval()
    x = torch.randn(2, 3, 32, 32)
    return dict(module=m, args=(x,), input_names=["pixel_values"], output_names=["logits"],
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})


def arch_mobilenet_v3_small():
    torch = _torch()
    from torchvision.models import mobilenet_v3_small

    torch.manual_seed(1)
    m = mobilenet_v3_small(width_mult=0.25, num_classes=10)
    _randomize_bn(m)
    m.eval()
    x = torch.randn(2, 3, 32, 32)
    return dict(module=m, args=(x,), input_names=["pixel_values"], output_names=["logits"],
                dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})


def _randomize_bn(m):
    """Give BatchNorm layers non-trivial running stats so they matter."""
    torch = _torch()
    from torch import nn

    g = torch.Generator().manual_seed(1234)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            mod.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            mod.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


def _hf_ids(torch, vocab, batch=2, seq=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.int64)


def arch_bert_tiny():
    torch = _torch()
    from torch import nn
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
                     attn_implementation="eager")
    torch.manual_seed(2)
    bert = BertModel(cfg).eval()

    class Wrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids, return_dict=True)
            return o.last_hidden_state, o.pooler_output

    ids = _hf_ids(torch, VOCAB)
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0  # some padding so the mask matters
    tt = torch.zeros(2, 8, dtype=torch.int64)
    tt[:, 4:] = 1
    bs = {0: "batch", 1: "seq"}
    return dict(module=Wrap(bert).eval(), args=(ids, mask, tt),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["last_hidden_state", "pooler_output"],
                dynamic_axes={"input_ids": bs, "attention_mask": bs, "token_type_ids": bs,
                              "last_hidden_state": bs, "pooler_output": {0: "batch"}})


def arch_gpt2_tiny():
    torch = _torch()
    from torch import nn
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=2, n_inner=128,
                     bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="eager")
    torch.manual_seed(3)
    gpt = GPT2LMHeadModel(cfg).eval()

    class Wrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=False, return_dict=True).logits

    ids = _hf_ids(torch, VOCAB, seed=1)
    mask = torch.ones(2, 8, dtype=torch.int64)
    bs = {0: "batch", 1: "seq"}
    return dict(module=Wrap(gpt).eval(), args=(ids, mask),
                input_names=["input_ids", "attention_mask"], output_names=["logits"],
                dynamic_axes={"input_ids": bs, "attention_mask": bs, "logits": bs})


def arch_vit_tiny():
    torch = _torch()
    from torch import nn
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                    attn_implementation="eager")
    torch.manual_seed(4)
    vit = ViTModel(cfg, add_pooling_layer=True).eval()

    class Wrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, pixel_values):
            o = self.m(pixel_values=pixel_values, return_dict=True)
            return o.last_hidden_state, o.pooler_output

    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    return dict(module=Wrap(vit).eval(), args=(x,), input_names=["pixel_values"],
                output_names=["last_hidden_state", "pooler_output"],
                dynamic_axes={"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"},
                              "pooler_output": {0: "batch"}})


def arch_t5_encoder_tiny():
    torch = _torch()
    from torch import nn
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=32,
                   feed_forward_proj="gated-gelu", attn_implementation="eager")
    torch.manual_seed(6)
    t5 = T5EncoderModel(cfg).eval()

    class Wrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          return_dict=True).last_hidden_state

    ids = _hf_ids(torch, VOCAB, seed=2)
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[0, 5:] = 0
    bs = {0: "batch", 1: "seq"}
    return dict(module=Wrap(t5).eval(), args=(ids, mask),
                input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                dynamic_axes={"input_ids": bs, "attention_mask": bs, "last_hidden_state": bs})


def arch_whisper_encoder_tiny():
    torch = _torch()
    from torch import nn
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2,
                        decoder_layers=1, decoder_attention_heads=2, d_model=64,
                        encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
                        max_target_positions=32, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, decoder_start_token_id=1, attn_implementation="eager")
    torch.manual_seed(7)
    enc = WhisperEncoder(cfg).eval()

    class Wrap(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_features):
            return self.m(input_features=input_features, return_dict=True).last_hidden_state

    # Whisper requires exactly 2 * max_source_positions input frames.
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(8))
    return dict(module=Wrap(enc).eval(), args=(x,), input_names=["input_features"],
                output_names=["last_hidden_state"],
                dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}})


def arch_mlp_fp16():
    """Small conv+MLP in float16 (exported from a .half() torch module)."""
    torch = _torch()
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc1 = nn.Linear(8 * 8 * 8, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = torch.relu(self.conv(x))
            x = torch.nn.functional.max_pool2d(x, 2)
            x = torch.flatten(x, 1)
            x = torch.nn.functional.gelu(self.fc1(x))
            return torch.softmax(self.fc2(x), dim=-1)

    torch.manual_seed(9)
    m = Net().eval().half()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(10)).half()
    return dict(module=m, args=(x,), input_names=["x"], output_names=["probs"],
                dynamic_axes={"x": {0: "batch"}, "probs": {0: "batch"}})


def arch_scripted_control_flow():
    """torch.jit.script'ed module with data-dependent control flow (If + Loop)."""
    torch = _torch()
    from torch import nn

    class CF(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, n: torch.Tensor):
            y = self.lin(x)
            if bool(y.sum() > 0):
                y = y * 2.0
            else:
                y = y - 1.0
            for _ in range(int(n)):
                y = torch.tanh(y) + x
            return y

    torch.manual_seed(11)
    m = torch.jit.script(CF().eval())
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(12))
    n = torch.tensor(3, dtype=torch.int64)
    return dict(module=m, args=(x, n), input_names=["x", "n"], output_names=["y"],
                dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, scripted=True)


ARCHS = {
    "resnet_tiny": arch_resnet_tiny,
    "mobilenet_v3_small": arch_mobilenet_v3_small,
    "bert_tiny": arch_bert_tiny,
    "gpt2_tiny": arch_gpt2_tiny,
    "vit_tiny": arch_vit_tiny,
    "t5_encoder_tiny": arch_t5_encoder_tiny,
    "whisper_encoder_tiny": arch_whisper_encoder_tiny,
    "mlp_fp16": arch_mlp_fp16,
    "scripted_cf": arch_scripted_control_flow,
}

# (arch, exporter, opset). exporter: "torchscript" (dynamo=False) or "dynamo".
EXPORTS = [
    ("resnet_tiny", "torchscript", 9),
    ("resnet_tiny", "torchscript", 14),
    ("resnet_tiny", "dynamo", 18),
    ("mobilenet_v3_small", "torchscript", 11),
    ("mobilenet_v3_small", "torchscript", 14),
    ("mobilenet_v3_small", "dynamo", 18),
    ("bert_tiny", "torchscript", 9),  # expected to fail (dynamic Slice needs opset >= 10)
    ("bert_tiny", "torchscript", 11),
    ("bert_tiny", "torchscript", 14),
    ("bert_tiny", "dynamo", 18),
    ("gpt2_tiny", "torchscript", 14),
    ("gpt2_tiny", "dynamo", 18),
    ("vit_tiny", "torchscript", 14),
    ("vit_tiny", "dynamo", 18),
    ("t5_encoder_tiny", "torchscript", 14),
    ("t5_encoder_tiny", "torchscript", 11),  # exports, but ORT rejects the graph (type error)
    ("t5_encoder_tiny", "dynamo", 18),
    ("whisper_encoder_tiny", "torchscript", 14),
    ("whisper_encoder_tiny", "dynamo", 18),
    ("mlp_fp16", "torchscript", 14),
    ("mlp_fp16", "dynamo", 18),
    ("scripted_cf", "torchscript", 9),
    ("scripted_cf", "torchscript", 14),
    ("scripted_cf", "dynamo", 18),  # dynamo exporter and ScriptModules: expected to fail
]

# The tests' error bounds live in testdata/tolerances.json, not here.


def export_name(arch, exporter, opset):
    return f"{arch}.{'ts' if exporter == 'torchscript' else 'dynamo'}{opset}"


def do_export(spec, exporter, opset, path):
    torch = _torch()
    for p in (path, path + ".data"):
        if os.path.exists(p):
            os.remove(p)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()) as out:
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(spec["module"], spec["args"], path, dynamo=False, opset_version=opset,
                              input_names=spec["input_names"], output_names=spec["output_names"],
                              dynamic_axes=spec["dynamic_axes"], do_constant_folding=True)
        else:
            from torch.export import Dim

            dyn = []
            for name in spec["input_names"]:
                axes = spec["dynamic_axes"].get(name, {})
                dyn.append({ax: Dim.AUTO for ax in axes} or None)
            dyn = tuple(dyn)
            prog = torch.onnx.export(spec["module"], spec["args"], None, dynamo=True,
                                     opset_version=opset, input_names=spec["input_names"],
                                     output_names=spec["output_names"], dynamic_shapes=dyn,
                                     optimize=True)
            prog.save(path, external_data=False)
    return out.getvalue()


# --------------------------------------------------------------------------
# hand-built models (onnx.helper)
# --------------------------------------------------------------------------

def build_if_model():
    """If with both branches capturing outer-scope values, plus a Loop."""
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    Z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])
    rng = np.random.default_rng(100)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((4,)).astype(np.float32), "b")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    cond_true = numpy_helper.from_array(np.array(True), "cond_true")

    then_g = helper.make_graph(
        [helper.make_node("Mul", ["h", "two"], ["then_out"], name="then_mul"),
         helper.make_node("Add", ["then_out", "b"], ["then_out2"], name="then_add")],
        "then_branch", [], [helper.make_tensor_value_info("then_out2", TensorProto.FLOAT, None)])
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["else_out"], name="else_neg"),
         helper.make_node("Relu", ["else_out"], ["else_out2"], name="else_relu")],
        "else_branch", [], [helper.make_tensor_value_info("else_out2", TensorProto.FLOAT, None)])
    # Loop body: carried c <- tanh(c) * two + b ; scan output: reduce-mean of c per iteration.
    body = helper.make_graph(
        [helper.make_node("Tanh", ["c_in"], ["c_t"], name="body_tanh"),
         helper.make_node("Mul", ["c_t", "two"], ["c_m"], name="body_mul"),
         helper.make_node("Add", ["c_m", "b"], ["c_out"], name="body_add"),
         helper.make_node("ReduceMean", ["c_out"], ["scan_out"], keepdims=0, name="body_mean"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "loop_body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("c_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("c_out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [])])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("ReduceSum", ["h"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Greater", ["s", "zero"], ["pred"], name="gt"),
        helper.make_node("If", ["pred"], ["branch_out"], then_branch=then_g, else_branch=else_g,
                         name="if0"),
        helper.make_node("Loop", ["trip", "cond_true", "branch_out"], ["y", "means"], body=body,
                         name="loop0"),
        helper.make_node("ReduceMax", ["y"], ["z_pre"], axes=[0], keepdims=0, name="rmax"),
        helper.make_node("Add", ["z_pre", "means_last"], ["z"], name="zadd"),
        helper.make_node("ReduceMean", ["means"], ["means_last"], keepdims=0, name="mean_of_means"),
    ]
    # keep it topologically sorted: move means_last before zadd
    nodes = nodes[:6] + [nodes[7], nodes[6]]
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    g = helper.make_graph(nodes, "if_loop", [X], [Y, Z], [w, b, two, trip, cond_true, zero])
    m = helper.make_model(g, opset_imports=[helper.make_operatorsetid("", 13)],
                          producer_name="graphopt-make_models")
    m.ir_version = 8
    # two inputs: one takes each branch (sum of x@w positive / negative)
    rng = np.random.default_rng(101)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    s = float((x @ numpy_helper.to_array(w)).sum())
    x_other = (-x).astype(np.float32)
    inputs = {"x": x if s > 0 else x_other}
    inputs_else = {"x": x_other if s > 0 else x}
    return m, inputs, inputs_else


def build_custom_domain_model():
    """Standard ops around an opaque com.example::FancyOp node (not runnable in ORT)."""
    rng = np.random.default_rng(200)
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("FancyOp", ["h", "w"], ["f", "f_aux"], domain="com.example",
                         name="fancy", alpha=0.5, mode="fast", ints=[1, 2, 3],
                         t=numpy_helper.from_array(np.arange(4, dtype=np.int32), "t")),
        helper.make_node("Relu", ["f"], ["y"], name="relu"),
    ]
    g = helper.make_graph(nodes, "custom_domain", [X], [Y], [w])
    g.value_info.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, ["batch", 8]))
    m = helper.make_model(g, opset_imports=[helper.make_operatorsetid("", 17),
                                            helper.make_operatorsetid("com.example", 1)],
                          producer_name="graphopt-make_models")
    m.ir_version = 8
    m.metadata_props.append(onnx.StringStringEntryProto(key="note", value="roundtrip-only"))
    x = rng.standard_normal((2, 8)).astype(np.float32)
    return m, {"x": x}


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------

def model_bytes(path):
    total = os.path.getsize(path)
    d = os.path.dirname(path)
    m = onnx.load(path, load_external_data=False)
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    files = set()
    for t in _get_all_tensors(m):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    files.add(e.value)
    for f in files:
        total += os.path.getsize(os.path.join(d, f))
    return total, sorted(files)


def full_check_ok(path):
    try:
        onnx.checker.check_model(path, full_check=True)
        return True, None
    except Exception as e:  # noqa: BLE001
        try:
            onnx.checker.check_model(path)
            return False, f"full_check failed (plain check ok): {str(e).splitlines()[0][:200]}"
        except Exception as e2:  # noqa: BLE001
            return False, f"check failed: {str(e2).splitlines()[0][:200]}"


def write_npz(path, arrays):
    np.savez(path, **arrays)
    back = np.load(path)
    assert sorted(back.files) == sorted(arrays), (path, back.files, list(arrays))


def run_reference(out_dir, name, inputs, runs_in_ort=True, extra=None):
    """Write NAME.inputs.npz / NAME.outputs.npz and return the manifest entry fields."""
    path = os.path.join(out_dir, name + ".onnx")
    m = onnx.load(path, load_external_data=False)
    in_names = [i.name for i in m.graph.input
                if i.name not in {t.name for t in m.graph.initializer}]
    out_names = [o.name for o in m.graph.output]
    assert set(inputs) == set(in_names), (name, list(inputs), in_names)
    write_npz(os.path.join(out_dir, name + ".inputs.npz"), inputs)
    entry = dict(input_names=in_names, output_names=out_names,
                 inputs=name + ".inputs.npz", runs_in_ort=runs_in_ort)
    if runs_in_ort:
        try:
            sess = ort_session(path)
        except Exception as e:
            raise RuntimeError(f"exported, but ORT cannot load it: {str(e).splitlines()[0][:300]}") from None
        outs = sess.run(None, inputs)
        outs2 = ort_session(path).run(None, inputs)  # determinism check
        for a, b in zip(outs, outs2):
            assert a.tobytes() == b.tobytes(), f"{name}: ORT not deterministic"
        write_npz(os.path.join(out_dir, name + ".outputs.npz"), dict(zip(out_names, outs)))
        entry["outputs"] = name + ".outputs.npz"
        if extra:
            for k, other in extra.items():
                write_npz(os.path.join(out_dir, f"{name}.{k}.inputs.npz"), other)
                o = sess.run(None, other)
                write_npz(os.path.join(out_dir, f"{name}.{k}.outputs.npz"), dict(zip(out_names, o)))
                entry.setdefault("extra_datasets", []).append(
                    {"inputs": f"{name}.{k}.inputs.npz", "outputs": f"{name}.{k}.outputs.npz"})
    else:
        entry["outputs"] = None
    return entry


def root_cause(e):
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


def to_np_inputs(spec):
    return {n: a.detach().cpu().numpy() for n, a in zip(spec["input_names"], spec["args"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--only", help="comma-separated model names (or arch names) to (re)generate")
    args = ap.parse_args()
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    manifest_path = os.path.join(out_dir, "MANIFEST.json")
    old = {}
    if only and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            old_manifest = json.load(f)
        old = {e["name"]: e for e in old_manifest["models"]}

    def wanted(name, arch=None):
        return only is None or name in only or (arch is not None and arch in only)

    import torch
    import torchvision
    import transformers

    if only is None:  # full regeneration: drop stale generated files
        for fn in os.listdir(out_dir):
            if fn.endswith((".onnx", ".onnx.data", ".npz")):
                os.remove(os.path.join(out_dir, fn))

    t_start = time.time()
    models, failed = {}, []
    specs = {}

    for arch, exporter, opset in EXPORTS:
        name = export_name(arch, exporter, opset)
        if not wanted(name, arch):
            if name in old:
                models[name] = old[name]
            continue
        t0 = time.time()
        try:
            if arch not in specs:
                specs[arch] = ARCHS[arch]()
            spec = specs[arch]
            path = os.path.join(out_dir, name + ".onnx")
            do_export(spec, exporter, opset, path)
            size, ext = model_bytes(path)
            if ext:
                raise RuntimeError(f"exporter wrote external data {ext}")
            if size > MAX_MODEL_BYTES:
                raise RuntimeError(f"model too large: {size} bytes")
            fc, fc_err = full_check_ok(path)
            entry = dict(name=name, file=name + ".onnx", arch=arch,
                         source=dict(exporter=exporter, opset=opset, dynamo=exporter == "dynamo",
                                     torch=torch.__version__),
                         full_check=fc)
            if fc_err:
                entry["check_note"] = fc_err
            entry.update(run_reference(out_dir, name, to_np_inputs(spec)))
            entry["size_bytes"] = size
            models[name] = entry
            print(f"[ok]   {name:32s} {size / 1024:8.1f} KiB  {time.time() - t0:5.1f}s", flush=True)
        except Exception as e:  # noqa: BLE001
            msg = root_cause(e).replace(os.path.abspath(out_dir) + os.sep, "")
            failed.append(dict(name=name, arch=arch, exporter=exporter, opset=opset, error=msg))
            for p in (os.path.join(out_dir, name + ".onnx"), os.path.join(out_dir, name + ".onnx.data")):
                if os.path.exists(p):
                    os.remove(p)
            print(f"[FAIL] {name:32s} {msg[:150]}", flush=True)

    # ---- int8: dynamic quantization of the tiny BERT -----------------------
    name = "bert_tiny.ts14.int8"
    src = os.path.join(out_dir, "bert_tiny.ts14.onnx")
    if wanted(name) and os.path.exists(src):
        from onnxruntime.quantization import QuantType, quantize_dynamic

        path = os.path.join(out_dir, name + ".onnx")
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(src, path, weight_type=QuantType.QInt8)
        inputs = dict(np.load(os.path.join(out_dir, "bert_tiny.ts14.inputs.npz")))
        fc, fc_err = full_check_ok(path)
        entry = dict(name=name, file=name + ".onnx", arch="bert_tiny",
                     source=dict(exporter="torchscript+onnxruntime.quantization.quantize_dynamic",
                                 opset=14, dynamo=False, weight_type="QInt8"), full_check=fc)
        if fc_err:
            entry["check_note"] = fc_err
        entry.update(run_reference(out_dir, name, inputs))
        entry["size_bytes"] = model_bytes(path)[0]
        models[name] = entry
        print(f"[ok]   {name:32s} {entry['size_bytes'] / 1024:8.1f} KiB", flush=True)
    elif name in old:
        models[name] = old[name]

    # ---- external data: tiny GPT-2 saved with external data -----------------
    name = "gpt2_tiny.ts14.extdata"
    src = os.path.join(out_dir, "gpt2_tiny.ts14.onnx")
    if wanted(name) and os.path.exists(src):
        path = os.path.join(out_dir, name + ".onnx")
        loc = name + ".onnx.data"
        if os.path.exists(os.path.join(out_dir, loc)):
            os.remove(os.path.join(out_dir, loc))
        m = onnx.load(src)
        onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=loc, size_threshold=256)
        size, ext = model_bytes(path)
        assert ext == [loc], ext
        inputs = dict(np.load(os.path.join(out_dir, "gpt2_tiny.ts14.inputs.npz")))
        fc, fc_err = full_check_ok(path)
        entry = dict(name=name, file=name + ".onnx", external_data=ext, arch="gpt2_tiny",
                     source=dict(exporter="torchscript+onnx.save(save_as_external_data=True)",
                                 opset=14, dynamo=False, size_threshold=256), full_check=fc)
        if fc_err:
            entry["check_note"] = fc_err
        entry.update(run_reference(out_dir, name, inputs))
        entry["size_bytes"] = size
        models[name] = entry
        print(f"[ok]   {name:32s} {size / 1024:8.1f} KiB  (external data)", flush=True)
    elif name in old:
        models[name] = old[name]

    # ---- hand-built If/Loop model ------------------------------------------
    name = "if_loop.helper13"
    if wanted(name):
        m, inputs, inputs_else = build_if_model()
        onnx.checker.check_model(m, full_check=True)
        path = os.path.join(out_dir, name + ".onnx")
        onnx.save(m, path)
        entry = dict(name=name, file=name + ".onnx", arch="if_loop",
                     source=dict(exporter="onnx.helper", opset=13), full_check=True)
        entry.update(run_reference(out_dir, name, inputs, extra={"else": inputs_else}))
        entry["size_bytes"] = model_bytes(path)[0]
        models[name] = entry
        print(f"[ok]   {name:32s} {entry['size_bytes'] / 1024:8.1f} KiB", flush=True)
    elif name in old:
        models[name] = old[name]

    # ---- custom-domain opaque node (roundtrip only) -------------------------
    name = "custom_domain.helper17"
    if wanted(name):
        m, inputs = build_custom_domain_model()
        path = os.path.join(out_dir, name + ".onnx")
        onnx.save(m, path)
        fc, fc_err = full_check_ok(path)
        entry = dict(name=name, file=name + ".onnx", arch="custom_domain",
                     source=dict(exporter="onnx.helper", opset=17, custom_domains=["com.example"]),
                     full_check=fc, roundtrip_only=True)
        if fc_err:
            entry["check_note"] = fc_err
        entry.update(run_reference(out_dir, name, inputs, runs_in_ort=False))
        entry["size_bytes"] = model_bytes(path)[0]
        models[name] = entry
        print(f"[ok]   {name:32s} {entry['size_bytes'] / 1024:8.1f} KiB  (roundtrip-only)", flush=True)
    elif name in old:
        models[name] = old[name]

    if only and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            prev_failed = json.load(f).get("failed_exports", [])
        redone = {f["name"] for f in failed} | set(models)
        failed = [f for f in prev_failed if f["name"] not in redone
                  and not wanted(f["name"], f.get("arch"))] + failed

    total = sum(e["size_bytes"] for e in models.values())
    manifest = {
        "description": "Small real-architecture ONNX models for graphopt roundtrip tests. "
                       "Generated by make_models.py (random seeded weights).",
        "generator": {"python": platform.python_version(), "torch": torch.__version__,
                      "torchvision": torchvision.__version__,
                      "transformers": transformers.__version__, "onnx": onnx.__version__,
                      "onnxruntime": ort.__version__, "numpy": np.__version__},
        "ort_session": ORT_SESSION,
        "comparison": {"passes_none": "bit-identical (NaN == NaN) to the original model run in "
                                      "onnxruntime on the same machine (the saved outputs are "
                                      "bit-identical only on a CPU like the generator's)",
                       "passes_enabled": "relative L2 error per output <= the model's bound in "
                                         "testdata/tolerances.json"},
        "total_bytes": total,
        "models": sorted(models.values(), key=lambda e: e["name"]),
        "failed_exports": failed,
    }
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"\n{len(models)} models, {total / 1024 / 1024:.2f} MiB total, {len(failed)} exports failed, "
          f"{time.time() - t_start:.1f}s")
    if total > 10 * 1024 * 1024:
        print("WARNING: total size exceeds 10 MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
