#!/usr/bin/env bash
# `osprey serve --device cuda` end to end on the GPU machine (issue #6):
#   1 the bundled arithmetic model: the curl checks of the CPU server tests, then the accuracy gate
#     through the server (`osprey eval --server`, every request over HTTP, streamed);
#   2 DeepSeek-V3.2's full width with 5 layers (FP8, random weights made on the GPU by
#     --load-format dummy; DeepSeek-V3's tokenizer when given): a token-id completion, a streamed
#     chat, /metrics, and a short `osprey bench serve` at 5000 tokens in.
# The KV cache comes from --gpu-memory-utilization of the memory left after the weights (the log
# line is kept). Logs into LOG_DIR; a summary at the end; non-zero exit if a check failed.
# Usage: scripts/gpu_serve_test.sh OSPREY_BINARY LOG_DIR [DEEPSEEK_TOKENIZER_JSON]
set -uo pipefail
osprey=${1:?usage: gpu_serve_test.sh OSPREY_BINARY LOG_DIR [TOKENIZER_JSON]}
log=${2:?usage: gpu_serve_test.sh OSPREY_BINARY LOG_DIR [TOKENIZER_JSON]}
tok=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$log"
status=0
summary=()
check() {  # name, command...
  local name=$1
  shift
  if OSPREY_SERVER_LOG=$log/$name.server.log "$@" >"$log/$name.log" 2>&1; then summary+=("PASS $name"); else summary+=("FAIL $name"); status=1; fi
}

# 1 The arithmetic model on the GPU behind HTTP.
check arith_curl "$here/scripts/server_test.sh" "$osprey" --device cuda --max-num-seqs 256 -- \
  bash "$here/tests/server/curl_test.sh"
check arith_eval_server "$here/scripts/server_test.sh" "$osprey" --device cuda --max-num-seqs 256 -- \
  bash -c "'$osprey' eval --task arith --server \$OSPREY_URL --concurrency 256 \
    --failures '$log/arith_server.failures.jsonl' --report '$log/arith_server.json'"

# 2 The full-width model (config only; weights made on the GPU).
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
"$osprey" make-model --preset dsv32 --fp8 --ue8m0 --config-only --out "$cfg" >/dev/null
if [[ -n $tok ]]; then cp "$tok" "$cfg/tokenizer.json"; fi
full() {
  local u=$OSPREY_URL
  set -e
  out=$(curl -s "$u/v1/completions" -d '{"prompt": [5, 6, 7, 8], "max_tokens": 8, "ignore_eos": true}')
  echo "completion: $out"
  [[ $out == *'"completion_tokens":8'* ]]
  if [[ -n $tok ]]; then
    sse=$(curl -sN "$u/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "ignore_eos": true, "stream": true}')
    echo "chat stream: $sse" | head -c 2000
    [[ $(grep -c '^data: \[DONE\]' <<<"$sse") == 1 ]]
    "$osprey" bench serve --base-url "$u" --tokenizer "$cfg" --input-len 5000 --output-len 64 \
      --num-prompts 16 --max-concurrency 16 --result-json "$serve_log_dir/full_bench.json" --no-progress
  fi
  metrics=$(curl -s "$u/metrics")
  grep -E '^osprey_(num_requests_running|kv_cache_usage_perc|generation_tokens_total)' <<<"$metrics"
}
export -f full
# (not `log`: server_test.sh assigns its own log variable, which an exported one would leak into)
serve_log_dir=$log
export tok cfg serve_log_dir osprey
check fullwidth_serve "$here/scripts/server_test.sh" "$osprey" --device cuda --load-format dummy \
  --model "$cfg" --max-model-len 8192 --max-num-seqs 64 -- bash -c full

{
  nvidia-smi -L
  printf '%s\n' "${summary[@]}"
  grep -h 'KV cache' "$log"/*.server.log
  grep -h '^accuracy' "$log/arith_eval_server.log"
  grep -h -A40 '====' "$log/fullwidth_serve.log" | head -40
} | tee "$log/summary.txt"
exit $status
