#!/usr/bin/env bash
# The device check of issue 14: graphopt's CUDA backend against its CPU
# backend and against torch (eager and torch.compile) on resnet50, bert_base
# and gpt2, fp32 and fp16, batch 1 and 32. One script, one device call, about
# 8 minutes; every step has its own timeout and a failed step does not stop
# the rest.
#
# Here (the build machine), first:
#   cargo build --release --bin graphopt        # about 13 minutes on 2 cores
#   ls -l target/release/graphopt               # with the ~12 MB tree it must fit 64 MiB;
#   strip target/release/graphopt               # if not, strip it
# and the Rust GPU tests (step 2b; the device machine has no Rust toolchain):
#   bash benches/device/cuda_check.sh --prepare  # cargo test --release --no-run;
#                                                # copies the test executables its
#                                                # JSON lists to target/gpu-tests/
# then, through the device tool, from the repository root:
#   run(command="bash benches/device/cuda_check.sh",
#       carry=["target/release/graphopt", "target/gpu-tests"], timeout_s=590)
# The markdown table and the JSON land in benches/results/cuda_check.{md,json}
# there and, since the device machine keeps nothing, in $OUT (they come back),
# with the Rust tests' log (rust_tests.log).
#
# The GPU machine (see ../shared/notes/dependencies.md): CUDA 13, driver 580,
# python3 with torch 2.11 (cu130), torchvision, transformers, onnx, numpy; no
# Rust, no network. Models are built with random weights (no download).
set -u
cd "$(dirname "$0")/../.."

# The Rust tests that drive the CUDA backend on the GPU, as
# `test-binary filter`: run with GRAPHOPT_REQUIRE_GPU=1, where a missing or
# unusable GPU fails them instead of skipping.
GPU_TESTS=(
  "cuda_gpu cuda_backend"
  "run_models cuda_runs_like_cpu_or_is_refused_in_one_line"
  "run_cmd cuda_and_missing_kernels_are_one_line_errors"
  "nccl nccl_one_rank_self_test"
)

if [ "${1:-}" = "--prepare" ]; then
  # Here, on the build machine: build the test executables (release, so
  # that run_cmd's `graphopt` is the carried target/release/graphopt) and
  # copy the ones cargo's JSON names to target/gpu-tests/, stripped, with
  # the workspace root they were built in (their testdata paths are baked
  # in from CARGO_MANIFEST_DIR). PROFILE=debug builds the debug ones.
  set -eo pipefail
  PROFILE=${PROFILE:-release}
  flags=(--no-run --message-format=json -p graphopt-exec -p graphopt -p graphopt-cli)
  [ "$PROFILE" = release ] && flags+=(--release)
  names=()
  for t in "${GPU_TESTS[@]}"; do
    names+=("${t%% *}")
    flags+=(--test "${t%% *}")
  done
  rm -rf target/gpu-tests
  mkdir -p target/gpu-tests
  cargo test "${flags[@]}" > target/gpu-tests/cargo.json
  python3 - target/gpu-tests "${names[@]}" < target/gpu-tests/cargo.json <<'PY'
import json, shutil, sys
out, names = sys.argv[1], set(sys.argv[2:])
found = {}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["kind"] == ["test"] and m["target"]["name"] in names:
        found[m["target"]["name"]] = m["executable"]
for n in sorted(names):
    if n not in found:
        sys.exit(f"--prepare: cargo built no test executable named {n}")
    shutil.copy2(found[n], f"{out}/{n}")
    print(f"{found[n]} -> {out}/{n}")
PY
  rm target/gpu-tests/cargo.json
  strip "${names[@]/#/target/gpu-tests/}"
  pwd -P > target/gpu-tests/ROOT
  du -ch target/gpu-tests/* "target/$PROFILE/graphopt" | tail -1 | sed 's/total$/to carry (with the graphopt binary; the limit is 64 MiB with the tree)/'
  exit 0
fi

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
# NCCL (torch's wheel ships libnccl.so.2; cudarc loads libnccl.so).
if ! ldconfig -p | grep -q 'libnccl.so '; then
  NCCL=$(python3 -c 'import site,glob; print(next(iter(glob.glob(site.getsitepackages()[0] + "/nvidia/nccl/lib/libnccl.so*")), ""))')
  if [ -n "$NCCL" ]; then
    mkdir -p /tmp/cuda_check/nccl && ln -sf "$NCCL" /tmp/cuda_check/nccl/libnccl.so
    export LD_LIBRARY_PATH="/tmp/cuda_check/nccl:${LD_LIBRARY_PATH:-}"
    echo "libnccl.so -> $NCCL"
  fi
fi
step libs 20 bash -c 'for l in libcuda.so.1 libcublas.so.13 libnvrtc.so.13; do python3 -c "import ctypes,sys; ctypes.CDLL(sys.argv[1]); print(sys.argv[1], \"loads\")" $l || echo "$l DOES NOT LOAD"; done'

# 2. A smoke test on a tiny model first: one line tells whether the
#    backend starts at all (NVRTC, cuBLAS, kernels) before the big models.
step smoke 60 bash -c '"$GRAPHOPT" run testdata/models/resnet_tiny.ts14.onnx --device cuda --inputs testdata/models/resnet_tiny.ts14.inputs.npz -o /tmp/cuda_check/smoke.cuda.npz --repeat 3 && "$GRAPHOPT" run testdata/models/resnet_tiny.ts14.onnx --inputs testdata/models/resnet_tiny.ts14.inputs.npz -o /tmp/cuda_check/smoke.cpu.npz && python3 -c "
import numpy as np
a = np.load(\"/tmp/cuda_check/smoke.cuda.npz\"); b = np.load(\"/tmp/cuda_check/smoke.cpu.npz\")
for k in b: print(k, \"max_rel\", float(np.abs(a[k]-b[k]).max() / max(np.abs(b[k]).max(), 1e-30)))"'

# 2b. The Rust GPU tests (the CUDA backend against the CPU backend on the
#     testdata models and launch-plan fixtures, through the library and the
#     CLI), as built by --prepare. Their testdata paths are those of the
#     build machine's workspace: that path is linked to this tree first.
if [ -f target/gpu-tests/ROOT ]; then
  ROOT=$(cat target/gpu-tests/ROOT)
  if [ ! -e "$ROOT" ]; then
    mkdir -p "$(dirname "$ROOT")" && ln -s "$(pwd -P)" "$ROOT" \
      || echo "!! cannot link $ROOT to this tree: the Rust tests will not find testdata"
  fi
  for t in "${GPU_TESTS[@]}"; do
    bin=target/gpu-tests/${t%% *}
    step "rust ${t%% *}" 150 bash -c 'GRAPHOPT_REQUIRE_GPU=1 "$1" "$2" --test-threads 1 --nocapture 2>&1 | tee -a "$3"; exit "${PIPESTATUS[0]}"' _ "$bin" "${t#* }" "$WORK/rust_tests.log"
  done
else
  echo "!! rust GPU tests not carried: run 'bash benches/device/cuda_check.sh --prepare' here and carry target/gpu-tests"
fi

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
  cp "$WORK"/rust_tests.log "$OUT"/ 2>/dev/null
fi
echo "== done in $(( $(date +%s) - START ))s"
