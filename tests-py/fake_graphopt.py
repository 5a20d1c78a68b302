#!/usr/bin/env python3
"""Stand-in for the `graphopt` binary, for testing the Python tooling.

Implements the CLI shape of
    graphopt optimize IN.onnx -o OUT.onnx [--passes none|a,b,c] [--report R.json]
as onnx.load + onnx.save (no optimization at all). Models that were stored
with external data are written back with external data next to OUT.

Usage from the test scripts:
    python3 tests-py/roundtrip_models.py --graphopt "python3 tests-py/fake_graphopt.py"
or make it executable and pass its path.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import onnx


def _uses_external_data(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return any(uses_external_data(t) for t in _get_all_tensors(model))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fake_graphopt")
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("optimize")
    o.add_argument("input")
    o.add_argument("-o", "--output", required=True)
    o.add_argument("--passes", default="default")
    o.add_argument("--report")
    args = p.parse_args(argv)

    # Fault injection for testing the harnesses themselves:
    #   FAKE_GRAPHOPT_BREAK=fail     exit 1 with an error message
    #   FAKE_GRAPHOPT_BREAK=perturb  change the first float32 initializer element by ~1%
    #   FAKE_GRAPHOPT_BREAK=touch    rewrite the input file in place (same bytes)
    #   FAKE_GRAPHOPT_BREAK=dropnode remove the last node of the main graph
    brk = os.environ.get("FAKE_GRAPHOPT_BREAK", "")
    if brk == "fail":
        print("error: injected failure", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    # Load without resolving external data first so we know how it was stored.
    shallow = onnx.load(args.input, load_external_data=False)
    external = _uses_external_data(shallow)
    del shallow
    model = onnx.load(args.input)
    if brk == "perturb":
        import numpy as np
        from onnx import numpy_helper

        for i, t in enumerate(model.graph.initializer):
            a = numpy_helper.to_array(t)
            if a.dtype == np.float32 and a.size:
                a = a.copy()
                a.flat[0] = a.flat[0] * np.float32(1.01) + np.float32(0.01)
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(a, t.name))
                break
    elif brk == "touch":
        with open(args.input, "rb") as f:
            data = f.read()
        time.sleep(0.01)
        with open(args.input, "wb") as f:
            f.write(data)
    elif brk == "dropnode" and len(model.graph.node):
        del model.graph.node[-1]
    if external:
        loc = os.path.basename(args.output) + ".data"
        data_path = os.path.join(os.path.dirname(os.path.abspath(args.output)), loc)
        if os.path.exists(data_path):
            os.remove(data_path)
        onnx.save(model, args.output, save_as_external_data=True,
                  all_tensors_to_one_file=True, location=loc, size_threshold=1024)
    else:
        onnx.save(model, args.output)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"tool": "fake_graphopt", "passes": args.passes,
                       "nodes": len(model.graph.node),
                       "seconds": time.perf_counter() - t0}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
