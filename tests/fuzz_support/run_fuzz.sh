#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time (a ctest of the sanitizer build):
#   run_fuzz.sh FUZZER SEED_DIR SECONDS WORK_DIR [libFuzzer flags...]
# New inputs go to WORK_DIR/corpus (the committed seeds are only read); a crash or a broken
# property leaves its reproducer as WORK_DIR/crash-* and fails. On success prints one line,
#   fuzz NAME: EXECS executions in SECONDS s (EXECS/s), corpus N inputs, no failure
# and appends it to WORK_DIR/../fuzz_summary.txt. Commit a reproducer to SEED_DIR once fixed.
set -euo pipefail
fuzzer=$1 seeds=$2 seconds=$3 work=$4
shift 4
name=$(basename "$fuzzer")
mkdir -p "$work/corpus"
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=3072 -malloc_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds" \
  >"$work/fuzz.log" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then
  tail -n 60 "$work/fuzz.log"
  echo "fuzz $name: FAILED (status $status); reproducer: $(ls "$work"/crash-* "$work"/leak-* "$work"/oom-* "$work"/timeout-* 2>/dev/null | head -1)" >&2
  exit "$status"
fi
execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$work/fuzz.log" | grep -oE '[0-9]+$')
rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$work/fuzz.log" | grep -oE '[0-9]+$')
inputs=$(find "$work/corpus" -type f | wc -l)
line="fuzz $name: $execs executions in $seconds s ($rate/s), corpus $inputs inputs, no failure"
echo "$line"
echo "$line" >>"$(dirname "$work")/fuzz_summary.txt"
