#!/usr/bin/env bash
# The seesaw MLA kernel's TMA producer for dense BF16 decode (issue 11) on the GPU machine:
#   1. test_cuda_mla_sm90 as built (its dense tests run both producers themselves: block
#      boundaries to 64k with NaN in every unwritten cache row, block sizes 128 and 32, the TMA map
#      cache per (cache, n_blocks, block_size)), then again with OSPREY_MLA_DENSE_TMA=1 so that the
#      remaining dense BF16 cases (head counts under TP) take TMA too;
#   2. optionally (GRAPH_TEST=path of test_cuda_graph_step) the graph-replay-vs-eager step test with
#      OSPREY_MLA_DENSE_TMA=1 (a captured launch keeps its tensor map);
#   3. the A/B: `osprey bench kernels --op mla --mla-kernel 'dense decode' --no-baseline` (all 11
#      dense shapes, B=1..128, contexts 2k..64k) and `--quick --no-baseline`, each with
#      OSPREY_MLA_DENSE_TMA=0 and =1;
# then a summary: the twin lines, pass counts and the dense decode times side by side.
# Usage: scripts/gpu_mla_tma.sh OSPREY TEST_CUDA_MLA_SM90 LOG_DIR [all|tests|bench]
#   e.g. scripts/gpu_mla_tma.sh build/osprey build/tests/ops/test_cuda_mla_sm90 $OUT
#   (the last argument runs steps 1–2 or 3 only, to fit one device call each if all does not).
#   Each step has its own timeout (tests 240 s, bench runs 150 / 120 s): a hang cannot eat the call.
# Exit status: non-zero if a test or a bench run failed.
set -uo pipefail
usage="usage: gpu_mla_tma.sh OSPREY TEST_CUDA_MLA_SM90 LOG_DIR [all|tests|bench]"
osprey=${1:?$usage}
twins=${2:?$usage}
log=${3:?$usage}
part=${4:-all}
case $part in all | tests | bench) ;; *) echo "$usage" >&2; exit 2 ;; esac
mkdir -p "$log"
status=0
nvidia-smi -L 2>&1 | tee "$log/summary.txt"

run() {  # run NAME TIMEOUT_S ENV_VALUE CMD... : OSPREY_MLA_DENSE_TMA=ENV_VALUE (or unset: "-")
  local name=$1 limit=$2 tma=$3
  shift 3
  local start rc
  start=$(date +%s)
  if [[ $tma == - ]]; then
    timeout "$limit" env -u OSPREY_MLA_DENSE_TMA "$@" >"$log/$name.log" 2>&1
  else
    timeout "$limit" env OSPREY_MLA_DENSE_TMA="$tma" "$@" >"$log/$name.log" 2>&1
  fi
  rc=$?
  [[ $rc == 0 ]] || status=1
  printf '%-28s rc=%-4s %5ss\n' "$name" "$rc" "$(($(date +%s) - start))" | tee -a "$log/summary.txt"
}

if [[ $part != bench ]]; then
  run twins_default 240 - "$twins"
  run twins_tma 240 1 "$twins"
  if [[ -n ${GRAPH_TEST:-} ]]; then run graph_step_tma 240 1 "$GRAPH_TEST"; fi
fi
if [[ $part != tests ]]; then
  dense=(bench kernels --op mla --mla-kernel "dense decode" --no-baseline)
  run bench_dense_cpasync 150 0 "$osprey" "${dense[@]}"
  run bench_dense_tma 150 1 "$osprey" "${dense[@]}"
  run bench_quick_cpasync 120 0 "$osprey" bench kernels --op mla --quick --no-baseline
  run bench_quick_tma 120 1 "$osprey" bench kernels --op mla --quick --no-baseline
fi

{
  echo
  echo "== tests (passed / failed / skipped) =="
  for f in "$log"/twins_*.log "$log"/graph_step_tma.log; do
    [[ -f $f ]] || continue
    printf '%-24s %4s %4s %4s\n' "$(basename "$f" .log)" "$(grep -c '^\[       OK \]' "$f")" \
      "$(grep -c '^\[  FAILED  \] .* ([0-9]* ms)$' "$f")" "$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$f")"
  done
  echo
  echo "== twin errors =="
  cat "$log"/twins_*.log 2>/dev/null | grep -h '^TWIN' | sed 's/^TWIN //' | sort | uniq
  echo
  echo "== dense decode: time_us (TFLOP/s) with cp.async | with TMA; FlashMLA us; rel_err each =="
  paste <(grep -hs '^dense decode' "$log/bench_dense_cpasync.log") \
        <(grep -hs '^dense decode' "$log/bench_dense_tma.log") |
    awk -F'\t' '{ split($1, a, " +"); split($2, b, " +");
                  printf "%-5s B=%-4s s_q=%-2s ctx=%-6s %9s (%6s) | %9s (%6s)  FlashMLA %-7s err %s | %s\n",
                         a[3], a[4], a[5], a[6], a[7], a[8], b[7], b[8], a[12], a[14], b[14] }'
  echo
  echo "== quick set (both settings) =="
  cat "$log"/bench_quick_*.log 2>/dev/null | grep -h '^sparse\|^dense\|^seesaw'
} | tee -a "$log/summary.txt"
exit $status
