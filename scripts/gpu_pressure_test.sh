#!/usr/bin/env bash
# KV cache pressure on the H200 (issue #18): 64 concurrent 5000-token prompts against a KV cache
# forced small, on DeepSeek-V3.2's full width with 5 layers (FP8, random weights made on the GPU
# by --load-format dummy, the same --seed on both servers). The 64 prompts run one at a time on a
# server with the profiled cache, then all at once on a server with --num-gpu-blocks-override
# BLOCKS (default 1024 blocks of 64 tokens: ~12 of the 64 sequences of 5064 tokens fit); checks:
# every request completes with 64 greedy tokens equal to the uncontended run's,
# osprey_num_preemptions_total > 0, and no request or KV block is left. The GPU kernels are not
# batch-invariant and the random-weight proxy has no margin between its top logits, so the client
# also judges each unequal output as vLLM's check_logprobs_close does (parted at a near-tie, the
# log-probabilities before it within a tolerance, a mismatched-pairs control that must fail);
# PRESSURE_COMPARE=close makes that judgement the pass criterion instead of equality. The client is
# tools/pressure_client.py (the GPU machine has python3, not Node.js; the CPU twin of this test,
# scripts/pressure_test.sh, uses tests/server/pressure.mjs with the same prompts and checks).
#   scripts/gpu_pressure_test.sh OSPREY_BINARY [LOG_DIR=$OUT/gpu_pressure] [BLOCKS=1024]
# Logs (both servers', both clients') and summary.txt go to LOG_DIR; non-zero exit on a failure.
set -uo pipefail
osprey=${1:?usage: gpu_pressure_test.sh OSPREY_BINARY [LOG_DIR] [BLOCKS]}
log=${2:-${OUT:-/tmp}/gpu_pressure}
blocks=${3:-1024}
here=$(cd "$(dirname "$0")/.." && pwd)
n=64 len=5000 max=64
mkdir -p "$log"
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
"$osprey" make-model --preset dsv32 --fp8 --ue8m0 --config-only --out "$cfg" >/dev/null
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$cfg/config.json")
common=(--max-model-len $((len + max + 64)) --max-num-seqs "$n" --max-num-batched-tokens 8192
        --device cuda --load-format dummy --model "$cfg" --seed 1234)
status=0
t0=$SECONDS
OSPREY_SERVER_LOG=$log/uncontended.server.log "$here/scripts/server_test.sh" "$osprey" "${common[@]}" -- \
  bash -c "python3 $here/tools/pressure_client.py uncontended \$OSPREY_URL $n $len $max $vocab $log/uncontended.json" \
  >"$log/uncontended.log" 2>&1 || status=$?
if [[ $status == 0 ]]; then
  OSPREY_SERVER_LOG=$log/contended.server.log "$here/scripts/server_test.sh" "$osprey" "${common[@]}" \
    --num-gpu-blocks-override "$blocks" -- \
    bash -c "python3 $here/tools/pressure_client.py contended \$OSPREY_URL $n $len $max $vocab $log/uncontended.json" \
    >"$log/contended.log" 2>&1 || status=$?
fi
{
  nvidia-smi -L
  echo "gpu_pressure_test: $([[ $status == 0 ]] && echo PASS || echo FAIL) in $((SECONDS - t0)) s" \
       "($n x $len-token prompts, $max out, $blocks KV blocks in the contended run, vocab $vocab)"
  grep -h 'KV blocks\|KV cache' "$log"/*.server.log 2>/dev/null | head -4
  grep -h '^pressure uncontended\|^|\|FAIL\|PASS' "$log/uncontended.log" "$log/contended.log" 2>/dev/null
  grep -h 'preemptions [1-9]' "$log/contended.server.log" 2>/dev/null | tail -3
} | tee "$log/summary.txt"
exit $status
