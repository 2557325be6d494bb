#!/usr/bin/env bash
# --nnodes over TCP loopback with the CPU twin: the ranks as separate processes (node 0 holds rank
# 0; node 1 the others) give the same logits, bit for bit, as the ranks as threads of one process
# (both twins sum in rank order); a node that never starts is named by rank 0 after the timeout.
# Usage: multinode_test.sh OSPREY MODEL_DIR PORT_BASE
set -u
osprey=$1 model=$2 port=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
hash_of() { grep '^xxh64' "$1" | awk '{print $2}'; }
toks=1,2,3,4,5,6,7,8,9,10,11,12
run_case() {  # name, flags...
  local name=$1; shift
  "$osprey" logits --model "$model" --tokens $toks --out "$tmp/t.npy" "$@" > "$tmp/threads.txt" 2>/dev/null \
    || fail "$name: threads run failed"
  port=$((port + 1))
  "$osprey" logits --model "$model" --tokens $toks --out "$tmp/n1.npy" "$@" --nnodes 2 --node-rank 1 \
    --master-port $port > "$tmp/n1.txt" 2>&1 &
  local pid=$!
  "$osprey" logits --model "$model" --tokens $toks --out "$tmp/n0.npy" "$@" --nnodes 2 --node-rank 0 \
    --master-port $port > "$tmp/n0.txt" 2>&1 || { cat "$tmp/n0.txt"; fail "$name: node 0 failed"; }
  wait $pid || { cat "$tmp/n1.txt"; fail "$name: node 1 failed"; }
  local a b
  a=$(hash_of "$tmp/threads.txt") b=$(hash_of "$tmp/n0.txt")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$name: threads $a, processes $b"
  echo "ok: $name over 2 processes = threads (xxh64 $a)"
}
run_case tp2 --tensor-parallel-size 2
run_case dp2-ep --data-parallel-size 2 --enable-expert-parallel
run_case dp4-ep --data-parallel-size 4 --enable-expert-parallel   # 2 ranks per process
run_case tp4-ep --tensor-parallel-size 4 --enable-expert-parallel

# Node 1 never starts: rank 0 names ranks 2 and 3 within the timeout, and exits non-zero.
port=$((port + 1))
start=$(date +%s)
if OSPREY_DIST_TIMEOUT=2 "$osprey" logits --model "$model" --tokens $toks --out "$tmp/x.npy" \
    --data-parallel-size 4 --enable-expert-parallel --nnodes 2 --master-port $port > "$tmp/e.txt" 2>&1; then
  fail "node 0 ran without node 1"
fi
grep -q "rank(s) 2, 3 did not connect" "$tmp/e.txt" || { cat "$tmp/e.txt"; fail "missing ranks not named"; }
[ $(( $(date +%s) - start )) -lt 20 ] || fail "the missing node took too long to report"
echo "ok: a missing node is named: $(grep -o 'rank(s) 2, 3 did not connect[^(]*' "$tmp/e.txt")"
