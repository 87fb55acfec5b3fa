#!/usr/bin/env bash
# compute-sanitizer over a subset of the CUDA tests that runs every relconv kernel in every dtype:
# memcheck, initcheck, synccheck and (on a very small subset, it is slow) racecheck.
#
#   bash tests/gpu_host/sanitize.sh SUMMARY_FILE
#
# Writes SUMMARY_FILE with, per tool, the command, the errors compute-sanitizer counted, its exit code
# and pytest's result line; full logs go next to it as SUMMARY_FILE.<tool>.log. Exits non-zero when
# any tool found an error, failed or timed out. Sized for about 8 minutes on one H100; per-tool
# limits (seconds) can be changed with SANITIZE_TIMEOUT_<TOOL>=..., e.g. SANITIZE_TIMEOUT_MEMCHECK=600.
#
# Torch's caching allocator hands out slices of large blocks, which hides out-of-bounds accesses and
# uninitialised reads from memcheck/initcheck; PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns it off there.
set -u -o pipefail

summary=${1:?usage: bash tests/gpu_host/sanitize.sh SUMMARY_FILE}
cd "$(dirname "$0")/../.."
mkdir -p "$(dirname "$summary")"
sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [[ ! -x $sanitizer ]]; then
  echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin)" | tee "$summary"
  exit 2
fi

PYTEST=(python -m pytest -q -p no:cacheprovider -m cuda -W ignore::UserWarning)

# Every kernel and dtype once: parity (pair path, 4 dtypes, groups), the table path in two shapes
# (scalar and vector loads), the weight gradient's 128-wide pipelined tiles (16-bit and exact fp32),
# the voxel map builders, the graph map builder (typed_edge_map, hubs and out-of-range input) and
# the sparse row sum (csr_row_sum: vector and element paths, empty rows, chunked long rows), the pair
# sum added in place (relational_conv_add_: every dtype, a strided out), the pair path's bias rows and
# the grid conv map (spconv's strided layers: regular and transposed, 2-D, bad coordinates).
MEDIUM_FILES=(tests/ops/test_relational_conv_cuda.py tests/ops/test_weight_grad_cuda.py tests/voxel/test_kernel_map_cuda.py
              tests/graph/test_device_map.py tests/ops/test_csr_row_sum.py tests/ops/test_relational_conv_add.py
              tests/ops/test_conv_epilogue.py tests/voxel/test_grid_map.py)
MEDIUM_K="test_cpu_cuda_parity and (16-16-1 or 32-48-4) or test_neighbor_table_forward_and_gradients and (3-17-1-torch.int32 or 64-64-2-torch.int64) or test_weight_grad_matches_reference and 128-128-1 and int32 or test_submanifold_matches_reference and dilation0-1-kernel0 or test_strided_matches_reference and dilation0-1-2-kernel1 or test_transposed_table or test_empty_and_single_voxel"
MEDIUM_K+=" or test_same_map_as_the_cpu_build or test_same_map_on_hubs or test_out_of_range_raises_like"
MEDIUM_K+=" or test_long_rows_match or test_unaligned_features or test_empty_rows_and_empty or test_entries_out_of_range_are_skipped or test_matches_the_dense_product and (3-torch.int32 or 64-torch.int64)"
MEDIUM_K+=" or test_adds_the_sum_onto_out and cuda or test_a_strided_out_is_updated_in_place and cuda or test_cuda_pair_path_epilogue_matches_unfused"
MEDIUM_K+=" or test_grid_op_equals_the_torch_builder or test_grid_op_errors_name_the_problem"
MEDIUM=("${MEDIUM_FILES[@]}" -k "$MEDIUM_K")
# racecheck instruments every shared-memory access (minutes per test): the tensor-core pair path and
# SIMT pair path (forward, input and weight gradients) and the tensor-core neighbour-table path.
SMALL=(tests/ops/test_relational_conv_cuda.py
       -k "test_cpu_cuda_parity and (32-48-4-torch.float16 or 32-48-4-torch.float32) or test_neighbor_table_forward_and_gradients and 64-64-2-torch.int32-torch.float16")

status=0
: >"$summary"
{
  echo "relconv compute-sanitizer summary"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
  echo "sanitizer: $("$sanitizer" --version 2>/dev/null | tail -1)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  echo
} >>"$summary"

run_tool() {
  local tool=$1 limit=$2 nocache=$3
  shift 3
  local log="$summary.$tool.log"
  local env_prefix=(env RELCONV_PROPERTY_EXAMPLES=3)
  [[ $nocache == 1 ]] && env_prefix+=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  local cmd=("${env_prefix[@]}" timeout "$limit" "$sanitizer" --tool "$tool" --error-exitcode 1 "${PYTEST[@]}" "$@")
  local start=$SECONDS
  "${cmd[@]}" >"$log" 2>&1
  local rc=$?
  local errors
  # memcheck/initcheck/synccheck end with "ERROR SUMMARY: N errors"; racecheck with
  # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
  errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: .*\([0-9]+ errors' "$log" | tail -1 | grep -Eo '[0-9]+( errors)?$' | grep -Eo '^[0-9]+')
  local result
  result=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|no tests ran|[0-9]+ (passed|failed|skipped|deselected)' "$log" | tail -1)
  local verdict=ok
  if [[ $rc == 124 ]]; then
    verdict="TIMEOUT after ${limit}s"
  elif [[ -z $errors ]]; then
    verdict="NO ERROR SUMMARY (sanitizer did not finish; see log)"
  elif [[ $errors != 0 || $rc != 0 ]]; then
    verdict=FAIL
  fi
  [[ $verdict != ok ]] && status=1
  {
    echo "== $tool: $verdict"
    echo "command: ${cmd[*]}"
    echo "errors found: ${errors:-unknown}"
    echo "exit code: $rc"
    echo "pytest: ${result:-no result line}"
    echo "seconds: $((SECONDS - start))"
    echo "log: $log"
    echo
  } >>"$summary"
  echo "$tool: $verdict (errors ${errors:-?}, exit $rc, $((SECONDS - start)) s)"
}

# memcheck: MEDIUM plus hostile input on CUDA (bad indices and coordinates must not touch memory out of
# bounds). Every CUDA test file took over 170 s under memcheck on an H100.
MEMCHECK=("${MEDIUM_FILES[@]}" tests/test_hostile_input.py -k "($MEDIUM_K) or test_hostile_input")
run_tool memcheck "${SANITIZE_TIMEOUT_MEMCHECK:-240}" 1 "${MEMCHECK[@]}"
run_tool initcheck "${SANITIZE_TIMEOUT_INITCHECK:-120}" 1 "${MEDIUM[@]}"
run_tool synccheck "${SANITIZE_TIMEOUT_SYNCCHECK:-90}" 0 "${MEDIUM[@]}"
run_tool racecheck "${SANITIZE_TIMEOUT_RACECHECK:-170}" 0 "${SMALL[@]}"

echo "overall: $([[ $status == 0 ]] && echo 'clean' || echo 'NOT clean')" >>"$summary"
cat "$summary"
exit $status
