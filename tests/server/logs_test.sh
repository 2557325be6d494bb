#!/usr/bin/env bash
# osprey serve's logs (server: --enable-log-requests --log-stats-interval 1): one access line per
# request with peer, route, status, seconds, id and token counts; a stats line while busy.
set -euo pipefail
u=$OSPREY_URL
log=$OSPREY_SERVER_LOG_FILE
fail() { echo "FAIL: $*" >&2; echo "--- server log:" >&2; cat "$log" >&2; exit 1; }
curl -s "$u/v1/completions" -d '{"prompt": "1+2=", "max_tokens": 7, "ignore_eos": true}' >/dev/null
curl -s "$u/v1/completions" -d '{"prompt": "1+2=", "max_tokens": 0}' >/dev/null
# Keep the engine busy across a stats tick: 8 streams of 600 tokens.
for i in $(seq 1 8); do
  curl -sN "$u/v1/completions" -d '{"prompt": "3+4=", "max_tokens": 600, "ignore_eos": true, "stream": true}' >/dev/null &
done
wait
sleep 0.2
grep -Eq '^osprey: 127\.0\.0\.1:[0-9]+ "POST /v1/completions" 200 [0-9.]+ s id=cmpl-[0-9a-f]+ prompt_tokens=[0-9]+ completion_tokens=7 finish=length$' "$log" ||
  fail "no access line for the 7-token completion"
grep -Eq '^osprey: 127\.0\.0\.1:[0-9]+ "POST /v1/completions" 400 [0-9.]+ s$' "$log" || fail "no access line for the 400"
[[ $(grep -c '"POST /v1/completions" 200 .*completion_tokens=600 finish=length' "$log") == 8 ]] || fail "not 8 access lines for the streams"
grep -Eq '^osprey serve: prompt throughput [0-9.]+ tokens/s, generation throughput [1-9][0-9.]* tokens/s, running [0-9]+ reqs, waiting [0-9]+ reqs, KV cache usage [0-9.]+%, prefix cache hit rate [0-9.]+%, preemptions [0-9]+$' "$log" ||
  fail "no stats line with generation throughput while busy"
echo "logs_test: all checks passed"
