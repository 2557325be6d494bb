#!/usr/bin/env bash
# The parallel model on GPUs (issue 15). Usage: scripts/gpu_dist_test.sh BUILD_DIR OUT_DIR
#   one H200 (always): test_dist_gpu — NCCL with one rank (every collective on device buffers),
#     and the committed models through the parallel path (TCP control + NCCL, EP with one rank:
#     every MoE layer's dispatch/combine through NCCL's all-to-all) against the single-GPU model.
#   several GPUs (when nvidia-smi lists them): one process per GPU (each --nnodes W --node-rank r
#     with CUDA_VISIBLE_DEVICES=r over loopback), TP2/TP4/TP8 and DP+EP on the dsv32 proxy with
#     dummy FP8 weights through `osprey serve` + one completion, and the bundled model's eval.
# Every step logs to OUT_DIR; the summary lists PASS / FAIL / SKIP per step.
set -u
build=${1:?BUILD_DIR}; out=${2:?OUT_DIR}
mkdir -p "$out"
osprey="$build/osprey"
summary="$out/summary.txt"; : > "$summary"
step() {  # name, command...
  local name=$1; shift
  if "$@" > "$out/$name.log" 2>&1; then echo "PASS $name" | tee -a "$summary"
  else echo "FAIL $name (rc $?, $out/$name.log)" | tee -a "$summary"; fi
}
step nccl_one_rank "$build/tests/dist/test_dist_gpu"
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs: $ngpu" | tee -a "$summary"
proxy="$out/dsv32-proxy"
"$osprey" make-model --preset dsv32 --out "$proxy" --config-only > "$out/make_model.log" 2>&1
# W processes, one per GPU; rank 0 serves on PORT, one completion is checked, then all stop.
serve_world() {  # world, flags...
  local w=$1; shift
  local port=$((8100 + w)) mport=$((29600 + w)) pids=()
  for r in $(seq 1 $((w - 1))); do
    CUDA_VISIBLE_DEVICES=$r "$osprey" serve --model "$proxy" --load-format dummy --device cuda \
      "$@" --nnodes "$w" --node-rank "$r" --master-port $mport > "$out/rank$r.log" 2>&1 &
    pids+=($!)
  done
  CUDA_VISIBLE_DEVICES=0 "$osprey" serve --model "$proxy" --load-format dummy --device cuda "$@" \
    --nnodes "$w" --node-rank 0 --master-port $mport --port $port > "$out/rank0.log" 2>&1 &
  local p0=$!
  for _ in $(seq 600); do curl -sf localhost:$port/health > /dev/null && break; sleep 1; done
  curl -sf localhost:$port/v1/completions -d '{"prompt": [1,2,3,4,5,6,7,8], "max_tokens": 16}'
  local rc=$?
  kill -INT $p0; wait $p0; for p in "${pids[@]}"; do wait "$p"; done
  return $rc
}
for w in 2 4 8; do
  if [ "$ngpu" -ge $w ]; then
    step "tp$w" serve_world $w --tensor-parallel-size $w
    step "dp$w-ep" serve_world $w --data-parallel-size $w --enable-expert-parallel
  else
    echo "SKIP tp$w dp$w-ep (needs $w GPUs)" | tee -a "$summary"
  fi
done
echo "The 61-layer V3.2 shape (TP8 bench serve 5000/500/64, bench comm, DP8+EP):" \
  "scripts/gpu_dist_full.sh $osprey OUT_DIR (its own device call)" | tee -a "$summary"
cat "$summary"
