#!/usr/bin/env bash
# Issue 13's router and FP8-padding checks on the GPU, in one run: the graph budgets
# (test_cuda_graph), the routing and linear twins (test_cuda_moe, test_cuda_gemm,
# test_cuda_fp8_gemm), and the GPU goldens twice, with the BF16 router logits (the default) and
# with OSPREY_ROUTER_BF16=0 (F32 gate and logits, as before), so their GPUGOLDEN lines compare.
# Usage: scripts/gpu_router_test.sh LOG_DIR   (binaries from $OSPREY_GPU_BIN, else bin/ beside this
#   script, else build-cuda/tests/ops and build-cuda/tests/model; test_goldens_gpu needs
#   OSPREY_TEST_DATA=<checkout>/tests/data). Exit status: non-zero if any binary failed.
set -uo pipefail
log_dir=${1:?usage: gpu_router_test.sh LOG_DIR}
mkdir -p "$log_dir"
here=$(cd "$(dirname "$0")" && pwd)
find_bin() {
  for d in ${OSPREY_GPU_BIN:-} "$here/bin" "$here/../build-cuda/tests/ops" "$here/../build-cuda/tests/model"; do
    [[ -n $d && -x $d/$1 ]] && { echo "$d/$1"; return; }
  done
}
status=0
rows=()
run() {  # name log [env...]
  local name=$1 log=$2; shift 2
  local t; t=$(find_bin "$name")
  if [[ -z $t ]]; then rows+=("$(printf '%-34s %s' "$log" MISSING)"); status=1; return; fi
  env "$@" timeout "${OSPREY_GPU_TEST_TIMEOUT:-540}" "$t" >"$log_dir/$log.log" 2>&1
  local rc=$? result=PASS
  [[ $rc == 0 ]] || { result="FAIL(rc=$rc)"; status=1; }
  rows+=("$(printf '%-34s %-12s passed %3s failed %3s skipped %3s' "$log" "$result" \
    "$(grep -c '^\[       OK \]' "$log_dir/$log.log")" \
    "$(grep -c '^\[  FAILED  \] [A-Za-z]*\.' "$log_dir/$log.log")" \
    "$(grep -c '^\[  SKIPPED \] [A-Za-z]*\.' "$log_dir/$log.log")")")
}
nvidia-smi -L 2>&1 | tee "$log_dir/summary.txt"
run test_cuda_graph test_cuda_graph
run test_cuda_moe test_cuda_moe
run test_cuda_gemm test_cuda_gemm
run test_cuda_fp8_gemm test_cuda_fp8_gemm
run test_goldens_gpu test_goldens_gpu_router_bf16
run test_goldens_gpu test_goldens_gpu_router_f32 OSPREY_ROUTER_BF16=0
{
  echo
  echo "== graph budgets =="
  grep -h '^GRAPH\|^    kernel' "$log_dir/test_cuda_graph.log" | sed 's/^GRAPH //'
  echo
  echo "== twins =="
  grep -h '^TWIN' "$log_dir"/test_cuda_*.log | sed 's/^TWIN //' | grep -i 'route\|router\|garbage'
  for v in bf16 f32; do
    echo
    echo "== GPU goldens, router $v =="
    grep -h '^GPUGOLDEN' "$log_dir/test_goldens_gpu_router_$v.log" 2>/dev/null | sed 's/^GPUGOLDEN //'
  done
  echo
  printf '%s\n' "${rows[@]}"
} | tee -a "$log_dir/summary.txt"
exit $status
