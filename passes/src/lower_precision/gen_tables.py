"""Generates `tables.rs`: per ONNX op version, the type parameter of every
formal input/output, and whether onnxruntime's CPU provider loads a node of
that op whose compute type parameter is float16 / bfloat16.

The probe builds a one-node model per (op, since_version), with the type
parameter of output 0 set to the low type, every other parameter float (or
its first allowed type), and asks onnxruntime to create a session (kernel
lookup happens there, including ORT's fp16 fallback that wraps nodes without
an fp16 CPU kernel in Casts). Rerun after upgrading onnx or onnxruntime:

    python3 passes/src/lower_precision/gen_tables.py > passes/src/lower_precision/tables.rs
"""
import sys
import warnings

import onnx
import onnx.defs
import onnxruntime as ort
from onnx import TensorProto, helper

warnings.filterwarnings("ignore")
ort.set_default_logger_severity(4)
MIN_OPSET = 7
MAX_OPSET = 23  # highest default-domain opset this onnxruntime accepts (checked below)

NAMES = {v: k for k, v in TensorProto.DataType.items()}
PREFER = ["tensor(float)", "tensor(int64)", "tensor(int32)", "tensor(bool)"]
# Required attributes the probe must supply.
ATTRS = {
    "Cast": {"to": 1}, "Concat": {"axis": 0}, "DepthToSpace": {"blocksize": 2},
    "SpaceToDepth": {"blocksize": 2}, "LRN": {"size": 1}, "Einsum": {"equation": "ij,jk->ik"},
    "ConcatFromSequence": {"axis": 0}, "AveragePool": {"kernel_shape": [1]},
    "MaxPool": {"kernel_shape": [1]}, "LpPool": {"kernel_shape": [1]}, "MaxRoiPool": {"pooled_shape": [1, 1]},
    "Scatter": {}, "ConvInteger": {}, "Col2Im": {}, "Split": {}, "Upsample": {}, "EyeLike": {},
    "RandomNormal": {"shape": [1]}, "RandomUniform": {"shape": [1]},
    "TreeEnsemble": None, "CastLike": {}, "Scan": None, "If": None, "Loop": None,
    "Constant": None, "Multinomial": {}, "GridSample": {},
}
# Required attributes of old op versions (tried when the plain probe is rejected).
OLD_ATTRS = {
    "Slice": {"starts": [0], "ends": [1]}, "Unsqueeze": {"axes": [0]}, "Squeeze": {"axes": [0]},
    "Pad": {"pads": [0, 0]}, "TopK": {"k": 1}, "Upsample": {"scales": [1.0, 1.0]},
    "ReduceMean": {"axes": [0]},
}
SKIP_OPS = {"If", "Loop", "Scan", "Constant", "SequenceMap"}


def elem(type_str):
    t = type_str[len("tensor("):-1]
    return {"float": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
            "double": TensorProto.DOUBLE, "int64": TensorProto.INT64, "int32": TensorProto.INT32,
            "bool": TensorProto.BOOL, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
            "string": TensorProto.STRING, "int16": TensorProto.INT16, "uint16": TensorProto.UINT16,
            "uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64}.get(t)


def probe(schema, low, opset):
    """True/False: ORT loads the node with output 0's parameter set to `low`; None: cannot probe."""
    cons = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    if not schema.outputs:
        return None
    p = schema.outputs[0].type_str
    if p not in cons or low not in cons[p]:
        return None
    choice = {}
    for name, allowed in cons.items():
        if name == p:
            choice[name] = low
        else:
            choice[name] = next((x for x in PREFER if x in allowed), allowed[0])
    def ty(ts):
        s = choice.get(ts, ts)
        return elem(s) if s.startswith("tensor(") else None
    inputs, names = [], []
    for i, f in enumerate(schema.inputs):
        if f.option == onnx.defs.OpSchema.FormalParameterOption.Optional:
            break
        count = 2 if f.option == onnx.defs.OpSchema.FormalParameterOption.Variadic else 1
        for k in range(count):
            t = ty(f.type_str)
            if t is None:
                return None
            n = f"i{i}_{k}"
            inputs.append(helper.make_tensor_value_info(n, t, None))
            names.append(n)
    outs, onames = [], []
    for i, f in enumerate(schema.outputs):
        if f.option == onnx.defs.OpSchema.FormalParameterOption.Optional and i > 0:
            break
        t = ty(f.type_str)
        if t is None:
            return None
        outs.append(helper.make_tensor_value_info(f"o{i}", t, None))
        onames.append(f"o{i}")
    attrs = ATTRS.get(schema.name, {})
    if attrs is None:
        return None
    if schema.name == "Einsum":
        names, inputs = names[:2], inputs[:2]
    r = _session(schema, names, inputs, onames, outs, attrs, opset)
    if r is None and schema.name in OLD_ATTRS:
        r = _session(schema, names, inputs, onames, outs, {**attrs, **OLD_ATTRS[schema.name]}, opset)
    return r


def _session(schema, names, inputs, onames, outs, attrs, opset):
    node = helper.make_node(schema.name, names, onames, **attrs)
    g = helper.make_graph([node], "probe", inputs, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return True
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        if "Exception during initialization" in msg:
            return True  # the kernel was found; only the probe's made-up attributes are wrong
        if "NOT_IMPLEMENTED" in msg or "Could not find an implementation" in msg:
            return False
        print(f"// probe error {schema.name}-{schema.since_version} {[i.type.tensor_type.elem_type for i in outs]}: {msg.splitlines()[0][:160]}", file=sys.stderr)
        return None


def main():
    rows = []
    by_op = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx") or s.deprecated or s.name in SKIP_OPS:
            continue
        by_op.setdefault(s.name, []).append(s)
    for name in sorted(by_op):
        versions = sorted(by_op[name], key=lambda s: s.since_version)
        for vi, s in enumerate(versions):
            if s.since_version > MAX_OPSET:
                continue
            # Probe at the first opset onnxruntime accepts where this version
            # is current (versions replaced before MIN_OPSET are never probed).
            until = versions[vi + 1].since_version - 1 if vi + 1 < len(versions) else MAX_OPSET
            opset = max(s.since_version, MIN_OPSET)
            cons = {c.type_param_str: list(c.allowed_type_strs) for c in s.type_constraints}
            floaty = any("tensor(float)" in v for v in cons.values()) or any(
                f.type_str == "tensor(float)" for f in list(s.inputs) + list(s.outputs))
            if not floaty:
                continue
            def params(fs):
                return [(f.type_str if f.type_str in cons else "") for f in fs]
            ins, outs = params(s.inputs), params(s.outputs)
            var_in = bool(s.inputs) and s.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
            var_out = bool(s.outputs) and s.outputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
            lowp = lambda t: [p for p, v in cons.items() if t in v]
            reachable = opset <= until
            f16 = probe(s, "tensor(float16)", opset) if reachable else None
            bf16 = probe(s, "tensor(bfloat16)", opset) if reachable else None
            rows.append((name, s.since_version, ins, var_in, outs, var_out,
                         lowp("tensor(float16)"), lowp("tensor(bfloat16)"), f16, bf16))
    print("// @generated by gen_tables.py from onnx", onnx.__version__, "and onnxruntime", ort.__version__)
    print("// (CPUExecutionProvider). Do not edit by hand.")
    print("")
    print("use super::ops::OpRow;")
    print("")
    # One row per (op, since-version): rustfmt would spread each over 12 lines.
    print("#[rustfmt::skip]")
    print("pub(super) static OPS: &[OpRow] = &[")
    q = lambda xs: "&[" + ", ".join(f'"{x}"' for x in xs) + "]"
    b = lambda x: {True: "Some(true)", False: "Some(false)", None: "None"}[x]
    for (name, v, ins, vi, outs, vo, pf, pb, f16, bf16) in rows:
        print(f'    OpRow {{ op: "{name}", since: {v}, ins: {q(ins)}, var_in: {str(vi).lower()}, outs: {q(outs)}, '
              f'var_out: {str(vo).lower()}, f16_params: {q(pf)}, bf16_params: {q(pb)}, ort_f16: {b(f16)}, ort_bf16: {b(bf16)} }},')
    print("];")


main()
