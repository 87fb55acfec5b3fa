#!/usr/bin/env bash
# One call on the GPU host: build the extension once, then run the named steps, logging under $OUT.
#   bash benchmarks/gpu_host.sh build test bench-ops ...
# Steps: build | test (the CUDA suite, nothing deselected) | sanitize (compute-sanitizer) | test-all |
# any other name = a command in STEPS below. test and sanitize are benchmarks/gpu_checks.py's steps:
# each rewrites benchmarks/results/gpu_checks.md and .json (copied into $OUT) from all results so far.
# Peer steps (crosscheck, benchmarks.run) need `source benchmarks/peers/activate.sh` first, with
# .peers/spconv_site.tar.xz, .peers/wcn_built and .peers/ts_built carried.
set -uo pipefail
OUT=${OUT:-/tmp/relconv-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
declare -A STEPS=(
  [test]="python -m benchmarks.gpu_checks suite summary"
  [sanitize]="python -m benchmarks.gpu_checks sanitize summary"
  [test-all]="python -m pytest -q tests -p no:cacheprovider"
  [bench-ops]="python -m benchmarks.ops.bench_relational_conv --device cuda --out $OUT/ops"
  [bench-voxel]="python -m benchmarks.voxel.bench_layers --device cuda --out $OUT/voxel"
  [crosscheck]="python -m benchmarks.crosscheck --out $OUT/crosscheck"
)
status=0
for step in "$@"; do
  start=$(date +%s)
  if [ "$step" = build ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    # The host has no network: the CUTLASS/CuTe headers come carried, as the include/ tree of the
    # nvidia-cutlass wheel (.peers/cutlass/cutlass_include.tar.xz, 1 MB against the wheel's 6.4).
    if [ -f .peers/cutlass/cutlass_include.tar.xz ]; then
      mkdir -p /tmp/cutlass_include && tar -xJf .peers/cutlass/cutlass_include.tar.xz -C /tmp/cutlass_include
      export CUTLASS_INCLUDE_DIR=/tmp/cutlass_include
    fi
    python -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
    rm "$OUT/build.log"  # $OUT returns few files; the log matters only on failure
  else
    cmd=${STEPS[$step]:-$step}
    eval "$cmd" >"$OUT/$step.log" 2>&1 || status=1
    tail -4 "$OUT/$step.log"
  fi
  echo "== $step done in $(( $(date +%s) - start )) s"
done
exit $status
