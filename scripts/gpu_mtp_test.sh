#!/usr/bin/env bash
# MTP speculative decoding on the H200 (issue 16). Usage: scripts/gpu_mtp_test.sh BUILD_DIR OUT_DIR
#   1 test_speculative (the CPU identity / rollback / distribution tests, on this machine too)
#   2 a random v32-tiny with an MTP layer on the GPU: greedy ids with MTP K=1,2,3 == without
#     (osprey generate --device cuda --tokens, several prompts), FP8 and BF16
#   3 models/osprey-arith, when it has its MTP layer: eval --device cuda without and with
#     --speculative-config K=1,2,3 on all held-out problems (--outputs compared: identical
#     answers; accuracy unchanged; acceptance rate and mean accepted length printed), at batch 64
#     and at batch 1 (single-stream speed), seconds per run in the logs
#   4 osprey serve --device cuda on osprey-arith with / without MTP + bench serve (tok/s at
#     concurrency 1 and 16; the report's Speculative Decoding section)
#   5 the dsv32 proxy (random FP8 weights, 5 layers of DeepSeek-V3.2's shapes and one MTP layer):
#     bench step decode vs verify (s_q = 1 + K) and the MTP catch-up / draft steps at B = 1, 16,
#     64 for K = 1, 2, 3, with the speedup at step 3's measured mean accepted length
# Every step logs to OUT_DIR; summary.txt lists PASS / FAIL / SKIP per step.
set -u
build=${1:?BUILD_DIR}; out=${2:?OUT_DIR}
mkdir -p "$out"
osprey="$build/osprey"
summary="$out/summary.txt"; : > "$summary"
step() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$out/$name.log" 2>&1; then echo "PASS $name ($((SECONDS - t0)) s)" | tee -a "$summary"
  else echo "FAIL $name (rc $?, $out/$name.log)" | tee -a "$summary"; fi
}
spec() { echo "{\"method\": \"mtp\", \"num_speculative_tokens\": $1}"; }

# 1
step test_speculative "$build/tests/engine/test_speculative"

# 2: greedy ids on the GPU, MTP on == off.
tiny_identity() {  # model dir
  local m=$1 rc=0
  for prompt in 5 1,2,3,4,5,6,7 $(seq -s, 3 150) $(seq -s, 40 103); do
    local ref
    ref=$("$osprey" generate --device cuda --model "$m" --tokens "$prompt" --max-tokens 48 \
      --ignore-eos 2>/dev/null) || return 1
    for k in 1 2 3; do
      local got
      got=$("$osprey" generate --device cuda --model "$m" --tokens "$prompt" --max-tokens 48 \
        --ignore-eos --speculative-config "$(spec $k)") || return 1
      if [ "$got" != "$ref" ]; then echo "K=$k differs: $ref vs $got"; rc=1
      else echo "K=$k same (${#prompt} chars of prompt)"; fi
    done
  done
  return $rc
}
"$osprey" make-model --preset v32-tiny --mtp --seed 16 --out "$out/v32-tiny-mtp" > /dev/null
"$osprey" make-model --preset v32-tiny --mtp --seed 16 --fp8 --out "$out/v32-tiny-mtp-fp8" > /dev/null
step tiny_identity_bf16 tiny_identity "$out/v32-tiny-mtp"
step tiny_identity_fp8 tiny_identity "$out/v32-tiny-mtp-fp8"

# 3: the bundled model.
arith=$(dirname "$0")/../models/osprey-arith
has_mtp() { python3 - "$1" <<'PY'
import json, os, sys
d = sys.argv[1]
c = json.load(open(os.path.join(d, "config.json")))
n = c.get("num_nextn_predict_layers", 0)
names = set()
for f in os.listdir(d):
    if f.endswith(".safetensors"):
        b = open(os.path.join(d, f), "rb"); k = int.from_bytes(b.read(8), "little")
        names |= set(json.loads(b.read(k)))
sys.exit(0 if n > 0 and f"model.layers.{c['num_hidden_layers']}.eh_proj.weight" in names else 1)
PY
}
if has_mtp "$arith"; then
  for batch in 64 1; do
    limit=""; [ $batch = 1 ] && limit="--limit 100"
    step "arith_b${batch}_off" "$osprey" eval --task arith --model "$arith" --device cuda \
      --batch $batch $limit --outputs "$out/arith_b${batch}_off.jsonl" \
      --report "$out/arith_b${batch}_off.json" --failures "$out/arith_b${batch}_off_fail.jsonl"
    for k in 1 2 3; do
      step "arith_b${batch}_k$k" "$osprey" eval --task arith --model "$arith" --device cuda \
        --batch $batch $limit --speculative-config "$(spec $k)" \
        --outputs "$out/arith_b${batch}_k$k.jsonl" --report "$out/arith_b${batch}_k$k.json" \
        --failures "$out/arith_b${batch}_k${k}_fail.jsonl"
      step "arith_b${batch}_k${k}_identical" cmp "$out/arith_b${batch}_off.jsonl" \
        "$out/arith_b${batch}_k$k.jsonl"
    done
  done
  grep -h "accuracy\|speculative" "$out"/arith_b*.log | tee -a "$summary"
  # 4: serving speed.
  serve_bench() {  # port, extra serve flags...
    local port=$1; shift
    "$osprey" serve --model "$arith" --device cuda --port "$port" "$@" > "$out/serve_$port.log" 2>&1 &
    local pid=$!
    for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
    local rc=0
    for c in 1 16; do
      "$osprey" bench serve --base-url "http://localhost:$port" --dataset random --input-len 128 \
        --output-len 256 --num-prompts $((c * 8)) --max-concurrency $c \
        --result-json "$out/bench_${port}_c$c.json" || rc=1
    done
    curl -s "localhost:$port/metrics" | grep spec_decode
    kill -INT $pid; wait $pid
    return $rc
  }
  step serve_off serve_bench 8200
  for k in 1 2 3; do step "serve_k$k" serve_bench $((8200 + k)) --speculative-config "$(spec $k)"; done
  grep -h "Output token throughput\|Acceptance rate\|Mean accepted length" "$out"/serve_*.log \
    "$out"/serve_off.log 2>/dev/null | head -40 >> "$summary"
else
  echo "SKIP arith_* serve_* (models/osprey-arith has no MTP layer yet: tools/train_arith.py)" |
    tee -a "$summary"
fi

# 5: the dsv32 proxy: decode vs verify step cost.
proxy="$out/dsv32-proxy"
"$osprey" make-model --preset dsv32 --out "$proxy" --config-only > /dev/null
for k in 1 2 3; do
  # The speedup at the bundled model's measured mean accepted length (step 3's report), if any.
  acc=()
  len=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["spec_mean_accepted_length"])' \
    "$out/arith_b64_k$k.json" 2>/dev/null) && acc=(--accepted-length "$len")
  step "dsv32_step_k$k" "$osprey" bench step --model "$proxy" --load-format dummy \
    --batch 1,16,64 --context 5000 --spec-tokens $k "${acc[@]}"
done
grep -h "^decode\|^verify\|^mtp\|^MTP" "$out"/dsv32_step_k*.log | tee -a "$summary"
cat "$summary"
