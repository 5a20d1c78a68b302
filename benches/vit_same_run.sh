#!/bin/bash
# Same run, ViT-B/16 (both exports of simplify_bench.py --torch, in benches/models/): the release
# library path of graphopt optimize (benches/vit_lib_release; byte-identical output to the CLI)
# vs onnxsim, with a plain cp of the input as the floor of the write. Build the helper with the
# workspace's lock file (it is its own workspace):
#   cp Cargo.lock benches/vit_lib_release/ && CARGO_TARGET_DIR=target-release \
#     cargo build --release --manifest-path benches/vit_lib_release/Cargo.toml
# Usage:
#   PY=.venv/bin/python benches/vit_same_run.sh target-release/release/vit_lib_release
V=${1:?vit_lib_release binary}; PY=${PY:-python3}; ROOT=$(cd "$(dirname "$0")/.." && pwd)
echo "load at start: $(cat /proc/loadavg)"
for rep in 1 2; do
for m in ts dynamo; do
  in=$ROOT/benches/models/vit_b_16.$m.onnx
  rm -f /tmp/vit_$m.r$rep.onnx
  /usr/bin/time -f "graphopt-release-lib $m rep$rep: %e s wall, %U user, %S sys" $V $in /tmp/vit_$m.r$rep.onnx 2>&1
  rm -f /tmp/vit_$m.cp.onnx
  /usr/bin/time -f "cp $m rep$rep: %e s wall, %U user, %S sys" cp $in /tmp/vit_$m.cp.onnx 2>&1
  /usr/bin/time -f "onnxsim $m rep$rep: %e s wall, %U user, %S sys" $PY -c "
import sys, onnx, onnxsim
m = onnx.load(sys.argv[1]); s, ok = onnxsim.simplify(m); assert ok; onnx.save(s, sys.argv[2])" $in /tmp/vit_$m.s.onnx 2>&1 | tail -1
done
done
echo "load at end: $(cat /proc/loadavg)"
