#!/usr/bin/env bash
# Runs every GPU test binary — the CUDA twin tests (test_cuda_*) and the GPU goldens
# (test_goldens_gpu) — and prints a summary table: per binary the result, tests
# passed/failed/skipped and seconds, then each twin's measured error (the TWIN lines), the graph
# node counts (GRAPH lines of test_cuda_graph), the FP8 GEMM
# path that ran, the sampling timings and any CPU/CUDA draw differences (PERF, SAMPLEDIFF lines of
# test_cuda_sample and test_cuda_engine_sampler), and the goldens' errors (GPUGOLDEN lines). Full
# logs go into the folder given.
# Usage: scripts/gpu_tests.sh LOG_DIR   (OSPREY_GPU_TEST_TIMEOUT: seconds per binary, default 540)
#   Binaries are taken from $OSPREY_GPU_BIN, else bin/ beside this script (a carried folder), else
#   build-cuda/tests/ops (a CUDA build in the repository). Exit status: non-zero if any failed.
set -uo pipefail
log_dir=${1:?usage: gpu_tests.sh LOG_DIR}
mkdir -p "$log_dir"
here=$(cd "$(dirname "$0")" && pwd)
if [[ -n ${OSPREY_GPU_BIN:-} ]]; then bin=$OSPREY_GPU_BIN
elif [[ -d $here/bin ]]; then bin=$here/bin
else bin=$here/../build-cuda/tests/ops
fi
nvidia-smi -L 2>&1 | tee "$log_dir/summary.txt"
status=0
rows=()
for t in "$bin"/test_cuda_* "$bin"/test_goldens_gpu; do
  [[ -x $t ]] || continue
  name=$(basename "$t")
  start=$(date +%s.%N)
  timeout "${OSPREY_GPU_TEST_TIMEOUT:-540}" "$t" >"$log_dir/$name.log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  passed=$(grep -c '^\[       OK \]' "$log_dir/$name.log")
  failed=$(grep -c '^\[  FAILED  \] [A-Za-z]*\.' "$log_dir/$name.log")
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z]*\.' "$log_dir/$name.log")
  result=PASS; [[ $rc == 0 ]] || { result="FAIL(rc=$rc)"; status=1; }
  rows+=("$(printf '%-20s %-12s %6s %6s %7s %8.1f' "$name" "$result" "$passed" "$failed" "$skipped" "$secs")")
done
{
  echo
  echo "== twin errors (rel_err = |out - ref| / |ref| against the CPU twin) =="
  cat "$log_dir"/test_cuda_*.log | grep -h '^TWIN' | sed 's/^TWIN //'
  echo
  echo "== CUDA graph node budgets (test_cuda_graph: what one captured call launches) =="
  grep -h '^GRAPH' "$log_dir"/test_cuda_graph.log 2>/dev/null | sed 's/^GRAPH //'
  echo
  echo "== FP8 GEMM paths =="
  cat "$log_dir"/test_cuda_*.log | grep -h '^FP8PATH' | sort | uniq -c
  echo
  echo "== sampling (time per call; CPU/CUDA draws that differ, with their boundary margin) =="
  cat "$log_dir"/test_cuda_*sample*.log 2>/dev/null | grep -h '^PERF\|^SAMPLEDIFF' | sed 's/^[A-Z]* //'
  echo
  echo "== GPU goldens (per-position error over max |ref|; greedy agreement) =="
  grep -h '^GPUGOLDEN' "$log_dir"/test_goldens_gpu.log 2>/dev/null | sed 's/^GPUGOLDEN //'
  echo
  printf '%-20s %-12s %6s %6s %7s %8s\n' binary result passed failed skipped seconds
  printf '%s\n' "${rows[@]}"
} | tee -a "$log_dir/summary.txt"
exit $status
