#!/usr/bin/env bash
# KV cache pressure on the H200 (issue #18): 64 concurrent 5000-token prompts against a KV cache
# forced small, on DeepSeek-V3.2's full width with 5 layers (FP8, random weights made on the GPU
# by --load-format dummy, the same --seed on both servers). scripts/pressure_test.sh runs the 64
# prompts one at a time on a server with the profiled cache, then all at once on a server with
# --num-gpu-blocks-override BLOCKS (default 1024 blocks of 64 tokens: ~12 of the 64 sequences of
# 5064 tokens fit), and checks: every request completes with 64 greedy tokens equal to the
# uncontended run's, osprey_num_preemptions_total > 0, and no request or KV block is left.
# (5000 + 64 tokens cross a block boundary while decoding, so running sequences get preempted.)
#   scripts/gpu_pressure_test.sh OSPREY_BINARY [LOG_DIR=$OUT/gpu_pressure] [BLOCKS=1024]
# Logs (both servers', both clients') and summary.txt go to LOG_DIR; non-zero exit on a failure.
set -uo pipefail
osprey=${1:?usage: gpu_pressure_test.sh OSPREY_BINARY [LOG_DIR] [BLOCKS]}
log=${2:-${OUT:-/tmp}/gpu_pressure}
blocks=${3:-1024}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$log"
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
"$osprey" make-model --preset dsv32 --fp8 --ue8m0 --config-only --out "$cfg" >/dev/null
vocab=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).vocab_size)' "$cfg/config.json")
status=0
t0=$SECONDS
bash "$here/scripts/pressure_test.sh" "$osprey" "$log" 64 5000 64 "$vocab" "$blocks" \
  --device cuda --load-format dummy --model "$cfg" --seed 1234 >"$log/pressure.log" 2>&1 || status=$?
{
  nvidia-smi -L
  echo "gpu_pressure_test: $([[ $status == 0 ]] && echo PASS || echo FAIL) in $((SECONDS - t0)) s" \
       "(64 x 5000-token prompts, 64 out, $blocks KV blocks in the contended run, vocab $vocab)"
  grep -h 'KV blocks\|KV cache' "$log"/*.server.log
  grep -h '^pressure uncontended' "$log/uncontended.log"
  grep -h '^|\|FAIL' "$log/contended.log" "$log/uncontended.log"
  grep -h 'preemptions [1-9]' "$log/contended.server.log" | tail -3
} | tee "$log/summary.txt"
exit $status
