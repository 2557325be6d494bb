#!/usr/bin/env bash
# The seesaw MLA kernel's sparse prefill variant (issue 11, OSPREY_MLA_PREFILL=pipelined) on the
# GPU machine:
#   1. test_cuda_mla_sm90 as built (SparsePrefillVariants runs both prefill kernels itself against
#      the CPU twin), then again with OSPREY_MLA_PREFILL=pipelined so that every other BF16 sparse
#      case with several tokens a sequence (SparseRepeatedIndicesAndSq2) takes the variant too and
#      the decode cases show they do not;
#   2. `osprey bench kernels --op mla --mla-kernel 'sparse prefill' --no-baseline`: every sparse
#      prefill shape, each BF16 one with both kernels (rows "sparse prefill" and "  pipelined"),
#      and `--quick --no-baseline` with OSPREY_MLA_PREFILL=pipelined (decode rows unchanged);
# then a summary: pass counts, twin lines and the prefill rows.
# Usage: scripts/gpu_mla_prefill.sh OSPREY TEST_CUDA_MLA_SM90 LOG_DIR [all|tests|bench]
#   e.g. scripts/gpu_mla_prefill.sh build/osprey build/tests/ops/test_cuda_mla_sm90 $OUT
#   Each step has its own timeout (tests 240 s, bench runs 300 / 120 s).
# Exit status: non-zero if a test or a bench run failed.
set -uo pipefail
usage="usage: gpu_mla_prefill.sh OSPREY TEST_CUDA_MLA_SM90 LOG_DIR [all|tests|bench]"
osprey=${1:?$usage}
twins=${2:?$usage}
log=${3:?$usage}
part=${4:-all}
case $part in all | tests | bench) ;; *) echo "$usage" >&2; exit 2 ;; esac
mkdir -p "$log"
status=0
nvidia-smi -L 2>&1 | tee "$log/summary.txt"

run() {  # run NAME TIMEOUT_S ENV_VALUE CMD... : OSPREY_MLA_PREFILL=ENV_VALUE (or unset: "-")
  local name=$1 limit=$2 v=$3
  shift 3
  local start rc
  start=$(date +%s)
  if [[ $v == - ]]; then
    timeout "$limit" env -u OSPREY_MLA_PREFILL "$@" >"$log/$name.log" 2>&1
  else
    timeout "$limit" env OSPREY_MLA_PREFILL="$v" "$@" >"$log/$name.log" 2>&1
  fi
  rc=$?
  [[ $rc == 0 ]] || status=1
  printf '%-28s rc=%-4s %5ss\n' "$name" "$rc" "$(($(date +%s) - start))" | tee -a "$log/summary.txt"
}

if [[ $part != bench ]]; then
  run twins_default 240 - "$twins"
  run twins_pipelined 240 pipelined "$twins"
fi
if [[ $part != tests ]]; then
  run bench_prefill 300 - "$osprey" bench kernels --op mla --mla-kernel "sparse prefill" --no-baseline
  run bench_quick_pipelined 120 pipelined "$osprey" bench kernels --op mla --quick --no-baseline
fi

{
  echo
  echo "== tests (passed / failed / skipped) =="
  for f in "$log"/twins_*.log; do
    [[ -f $f ]] || continue
    printf '%-24s %4s %4s %4s\n' "$(basename "$f" .log)" "$(grep -c '^\[       OK \]' "$f")" \
      "$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$f")" "$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$f")"
  done
  echo
  echo "== twin errors =="
  cat "$log"/twins_*.log 2>/dev/null | grep -h '^TWIN' | sed 's/^TWIN //' | sort | uniq
  echo
  echo "== sparse prefill: seesaw rows, then the variant's ('  pipelined') =="
  grep -hs '^sparse prefill\|^  pipelined\|CHECK FAILED' "$log/bench_prefill.log"
  echo
  echo "== quick set with OSPREY_MLA_PREFILL=pipelined =="
  grep -hs '^sparse\|^dense\|^  pipelined' "$log/bench_quick_pipelined.log"
} | tee -a "$log/summary.txt"
exit $status
