#!/usr/bin/env bash
# osprey serve --load-format dummy on a model folder without weights or tokenizer (only its
# config.json): completions take token ids; chat says why it cannot work.
set -euo pipefail
u=$OSPREY_URL
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(curl -s "$u/v1/completions" -d '{"prompt": [5, 6, 7, 8], "max_tokens": 6, "ignore_eos": true}')
[[ $out == *'"completion_tokens":6'* ]] || fail "token-id completion: $out"
code=$(curl -s -o /tmp/osprey_dummy_chat.json -w '%{http_code}' "$u/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "hi"}]}')
[[ $code == 400 ]] && grep -q 'no tokenizer' /tmp/osprey_dummy_chat.json || fail "chat without a tokenizer: $code $(cat /tmp/osprey_dummy_chat.json)"
echo "dummy_test: all checks passed"
