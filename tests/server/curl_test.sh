#!/usr/bin/env bash
# curl against osprey serve: the endpoints answer with the documented shapes.
set -euo pipefail
u=$OSPREY_URL
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(curl -s -o /dev/null -w '%{http_code}' "$u/health") == 200 ]] || fail "/health"
models=$(curl -s "$u/v1/models")  # (no curl | grep -q: with pipefail, grep's early exit fails curl)
[[ $models == *'"object":"list"'* ]] || fail "/v1/models: $models"
# The bundled model is served under its folder's name, not its path.
[[ $models == *'"id":"osprey-arith"'* ]] || fail "/v1/models: the bundled model's id is not osprey-arith: $models"
out=$(curl -s "$u/v1/completions" -H 'Content-Type: application/json' -d '{"prompt": "Ann has 2 apples", "max_tokens": 5, "temperature": 0}')
echo "$out" | grep -q '"object":"text_completion"' || fail "completion: $out"
echo "$out" | grep -q '"completion_tokens":' || fail "completion usage: $out"
sse=$(curl -sN "$u/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true}')
[[ $(echo "$sse" | grep -c '^data: ') -ge 3 ]] || fail "chat stream events: $sse"
[[ $(echo "$sse" | tail -n 2 | head -n 1) == "data: [DONE]" || $(echo "$sse" | grep -c '^data: \[DONE\]') == 1 ]] || fail "stream ends with [DONE]"
tok=$(curl -s "$u/tokenize" -d '{"prompt": "Ann has 12 apples"}')
ids=$(echo "$tok" | sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p')
[[ -n $ids ]] || fail "tokenize: $tok"
back=$(curl -s "$u/detokenize" -d "{\"tokens\": [$ids]}")
echo "$back" | grep -q 'Ann has 12 apples' || fail "detokenize round trip: $back"
metrics=$(curl -s "$u/metrics")
grep -q '^osprey_time_to_first_token_seconds_count [1-9]' <<<"$metrics" || fail "/metrics histogram"
# A CPU server runs every step eagerly: the graph counters are there, at 0.
grep -q "^osprey_cuda_graph_replays_total 0$" <<<"$metrics" && grep -q "^osprey_cuda_graph_capture_failures_total 0$" <<<"$metrics" && grep -q "^osprey_cuda_graph_sampled_steps_total 0$" <<<"$metrics" || fail "/metrics graph counters"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$u/v1/completions" -d '{') == 400 ]] || fail "malformed JSON is 400"
echo "curl_test: all checks passed"
