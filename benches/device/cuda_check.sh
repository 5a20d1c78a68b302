#!/usr/bin/env bash
# The device check of issue 14: graphopt's CUDA backend against its CPU
# backend and against torch (eager and torch.compile) on resnet50, bert_base
# and gpt2, fp32 and fp16, batch 1 and 32. One script, one device call, about
# 8 minutes; every step has its own timeout and a failed step does not stop
# the rest.
#
# Here (the build machine), first:
#   cargo build --release --bin graphopt        # about 13 minutes on 2 cores
# then, through the device tool, from the repository root:
#   run(command="bash benches/device/cuda_check.sh", carry=["target/release/graphopt"], timeout_s=590)
# The markdown table and the JSON land in benches/results/cuda_check.{md,json}
# there and, since the device machine keeps nothing, in $OUT (they come back).
#
# The GPU machine (see ../shared/notes/dependencies.md): CUDA 13, driver 580,
# python3 with torch 2.11 (cu130), torchvision, transformers, onnx, numpy; no
# Rust, no network. Models are built with random weights (no download).
set -u
cd "$(dirname "$0")/../.."
export GRAPHOPT=${GRAPHOPT:-target/release/graphopt}
export PYTHONUNBUFFERED=1
WORK=${WORK:-/tmp/cuda_check}
RESULTS=benches/results
mkdir -p "$WORK" "$RESULTS"
START=$(date +%s)
step() { # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "== $name (timeout ${secs}s, t=$(( $(date +%s) - START ))s)"
  timeout --kill-after=10 "$secs" "$@"
  local rc=$?
  [ $rc -eq 0 ] || echo "!! $name failed (rc=$rc)"
  return 0
}

# 1. Environment; the CUDA 13 libraries cudarc loads at run time.
step env 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"; ls -l "$GRAPHOPT"'
if ! ldconfig -p | grep -q 'libcublas.so.13' || ! ldconfig -p | grep -q 'libnvrtc.so.13'; then
  SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
  LIBS=$(find "$SITE/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null | tr '\n' ':')
  export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:-}"
  echo "cuBLAS/NVRTC 13 not in ldconfig: LD_LIBRARY_PATH += $LIBS"
fi
step libs 20 bash -c 'for l in libcuda.so.1 libcublas.so.13 libnvrtc.so.13; do python3 -c "import ctypes,sys; ctypes.CDLL(sys.argv[1]); print(sys.argv[1], \"loads\")" $l || echo "$l DOES NOT LOAD"; done'

# 2. A smoke test on a tiny model first: one line tells whether the
#    backend starts at all (NVRTC, cuBLAS, kernels) before the big models.
step smoke 60 bash -c '"$GRAPHOPT" run testdata/models/resnet_tiny.ts14.onnx --device cuda --inputs testdata/models/resnet_tiny.ts14.inputs.npz -o /tmp/cuda_check/smoke.cuda.npz --repeat 3 && "$GRAPHOPT" run testdata/models/resnet_tiny.ts14.onnx --inputs testdata/models/resnet_tiny.ts14.inputs.npz -o /tmp/cuda_check/smoke.cpu.npz && python3 -c "
import numpy as np
a = np.load(\"/tmp/cuda_check/smoke.cuda.npz\"); b = np.load(\"/tmp/cuda_check/smoke.cpu.npz\")
for k in b: print(k, \"max_rel\", float(np.abs(a[k]-b[k]).max() / max(np.abs(b[k]).max(), 1e-30)))"'

# 3. Export with torch (random weights), seeded inputs.
step export 150 python3 benches/device/cuda_check.py export "$WORK"

# 4. Per model: optimize (fp32, fp16), graphopt CUDA and CPU, torch eager.
for m in resnet50 bert_base gpt2; do
  step "bench $m" 120 python3 benches/device/cuda_check.py bench "$WORK" "$m"
done

# 5. torch.compile at batch 32, as long as time is left (the 8-minute budget).
for m in resnet50 bert_base gpt2; do
  LEFT=$(( 450 - ($(date +%s) - START) ))
  if [ "$LEFT" -gt 40 ]; then
    step "torch.compile $m" "$LEFT" python3 benches/device/cuda_check.py compile "$WORK" "$m"
  else
    echo "== torch.compile $m skipped: ${LEFT}s left"
  fi
done

# 6. Report.
step report 30 python3 benches/device/cuda_check.py report "$WORK" "$RESULTS"
if [ -n "${OUT:-}" ]; then
  cp "$RESULTS"/cuda_check.md "$RESULTS"/cuda_check.json "$OUT"/ 2>/dev/null
  cat "$WORK"/rows.jsonl > "$OUT"/rows.jsonl 2>/dev/null
fi
echo "== done in $(( $(date +%s) - START ))s"
