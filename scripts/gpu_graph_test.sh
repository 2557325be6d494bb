#!/usr/bin/env bash
# One CUDA graph per decode step (issue 13), on the GPU, in one run. Every step logs to OUT_DIR;
# OUT_DIR/summary.txt lists PASS / FAIL per step and the measured lines.
# Usage: scripts/gpu_graph_test.sh OSPREY OUT_DIR
#   OSPREY: a CUDA build's osprey binary; its build folder's test binaries (tests/ops, tests/engine,
#   tests/model) named below are run too (or $OSPREY_GPU_BIN/<name>, a carried folder). Carried
#   binaries: set OSPREY_BUNDLED_MODEL=<checkout>/models/osprey-arith.
#   graph_step       test_cuda_graph_step: replay vs eager (bundled model + a random small
#                    V3.2-like model) at B = 1, 2, 3, 5, 8, 9, 13, 16; no memset / host node and
#                    the per-layer kernel budget; the shrink-tail rule on the device metadata; the
#                    engine's greedy tokens with --cuda-graph (sync and async) = eager; sampling
#                    inside the graph = the Sampler on the same logits token for token (greedy,
#                    seeded random, penalties, min_tokens, logprobs; B = 1, 3, 5, 8, 13), the
#                    sampling graph = the logits graph + 1 sample kernel, ids-only read-back, the
#                    sampling rows' shrink tail, the engine's in-graph = host sampling (sync and
#                    async) and its counted fallback (GRAPHSAMPLE lines); speculative verify steps
#                    as graphs keyed (bucket, 1 + K): replay = padded warm-up bit for bit (logits,
#                    hidden states, cache), no memset / host node, the decode budget per layer,
#                    the engine's greedy tokens with --speculative-config K = 1, 2, 3 and graphs
#                    = eager (VGRAPH lines).
#   graph_ops        test_cuda_graph: the single-op budgets, and V3.2's cuBLASLt GEMMs at their real
#                    widths (lm_head, router gate, weights_proj; FP8 past 32 tokens) at 1, 16, 64
#                    tokens: no memset node (lt_matmul's choice of a memset-free candidate).
#   fp8_gemm         test_cuda_fp8_gemm: the swap-AB twins, and ops::linears (one quantisation of
#                    x for several FP8 linears) bit for bit against a linear() each.
#   async_cuda       test_async_scheduling on cuda: overlapped = synchronous, incl. prompts in
#                    chunks that sample no row (the staging of an empty logits_indices); at most
#                    one launch wakes a sleeping executor worker.
#   goldens_gpu      test_goldens_gpu with the default BF16 router, and with OSPREY_ROUTER_BF16=0
#                    (needs OSPREY_TEST_DATA=<checkout>/tests/data for carried binaries).
#   bench_step       osprey bench step --preset dsv32 (dummy FP8, 5 layers) at B = 1, 16, 64,
#                    context 5000, eager and --cuda-graph rows (+ the graph's node counts; any
#                    memset node is printed with its size and the kernels around it; cuBLASLt's
#                    algorithm choices are counted).
#   bench_verify     the same with --spec-tokens 2: verify rows (s_q = 3) eager and as graph
#                    replays (vgraph rows, + the verify graph's node counts).
#   bench_loop       osprey bench step --engine-loop at B = 1, 64 (sync and async engine loops:
#                    host time, idle gap, identical tokens, worker wake-ups; B=64 decodes once its
#                    64 prompts of 5000 tokens are in: ~160 chunked-prefill steps first).
#   eval_eager / eval_graph   osprey eval --task arith on the bundled model on the GPU, with
#                    --enforce-eager and with the default (graphs) (batch 64, 1000 problems): the
#                    accuracy lines must agree; only the default run replays graphs.
#   serve_graph      osprey serve (graphs by default): health, 4 completions, /metrics counting
#                    graph replays.
set -u
osprey=${1:?usage: gpu_graph_test.sh OSPREY OUT_DIR}; out=${2:?OUT_DIR}
mkdir -p "$out"
build=$(cd "$(dirname "$osprey")" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
model=${OSPREY_BUNDLED_MODEL:-$root/models/osprey-arith}
summary="$out/summary.txt"; : > "$summary"
step() {  # name, command...
  local name=$1; shift
  local t0; t0=$(date +%s)
  # A shell function (serve_check) runs in a child bash: timeout runs programs only.
  local cmd=("$@")
  if declare -F "$1" > /dev/null; then
    export -f "$1" serve_smoke
    export osprey model out
    cmd=(bash -c "$1")
  fi
  if timeout "${OSPREY_GPU_TEST_TIMEOUT:-540}" "${cmd[@]}" > "$out/$name.log" 2>&1; then
    echo "PASS $name ($(( $(date +%s) - t0 )) s)" | tee -a "$summary"
  else echo "FAIL $name (rc $?, $out/$name.log)" | tee -a "$summary"; fi
}
find_test() {
  for d in ${OSPREY_GPU_BIN:-} "$build/tests/ops" "$build/tests/engine" "$build/tests/model"; do
    [[ -n $d && -x $d/$1 ]] && { echo "$d/$1"; return; }
  done
  echo "missing-$1"
}
nvidia-smi -L > "$out/gpus.txt" 2>&1 || true

step graph_step env OSPREY_BUNDLED_MODEL="$model" "$(find_test test_cuda_graph_step)"
grep -h '^GRAPH\|^VGRAPH\|^\[  FAILED\|Failure\|Expected\|Which is\|  Actual' "$out/graph_step.log" |
  grep -v '^    kernel' | head -80 | tee -a "$summary"
if grep -q '^\[  SKIPPED' "$out/graph_step.log"; then
  echo "FAIL graph_step: skipped (no CUDA device seen)" | tee -a "$summary"
fi
step graph_ops "$(find_test test_cuda_graph)"
grep -h '^GRAPH lm_head\|^GRAPH router gate\|^GRAPH indexer\|^GRAPH cuBLASLt\|^\[  FAILED' \
  "$out/graph_ops.log" | tee -a "$summary"
step fp8_gemm "$(find_test test_cuda_fp8_gemm)"
step async_cuda "$(find_test test_async_scheduling)" --gtest_filter='*/cuda'
grep -h '^\[  FAILED\|^\[  PASSED\|^\[  SKIPPED' "$out/async_cuda.log" | tee -a "$summary"
step goldens_gpu env OSPREY_TEST_DATA="${OSPREY_TEST_DATA:-$root/tests/data}" \
  "$(find_test test_goldens_gpu)"
step goldens_gpu_router_f32 env OSPREY_ROUTER_BF16=0 \
  OSPREY_TEST_DATA="${OSPREY_TEST_DATA:-$root/tests/data}" "$(find_test test_goldens_gpu)"

step bench_step "$osprey" bench step --preset dsv32 --load-format dummy --batch 1,16,64 \
  --context 5000 --warmup 10 --iters 50 --cuda-graph
grep -h '^graph B=\|^  memset node\|^  cuBLASLt\|^decode B=\|^graph  B=\|^step ' "$out/bench_step.log" |
  tee -a "$summary"
step bench_verify "$osprey" bench step --preset dsv32 --load-format dummy --batch 1,16,64 \
  --context 5000 --warmup 10 --iters 50 --spec-tokens 2 --cuda-graph
grep -h '^verify graph\|^verify B=\|^vgraph B=\|^decode B=\|^step ' "$out/bench_verify.log" |
  tee -a "$summary"
step bench_loop "$osprey" bench step --preset dsv32 --load-format dummy --batch 1,64 \
  --context 5000 --warmup 5 --iters 40 --engine-loop
grep -h -A12 '^engine loop' "$out/bench_loop.log" | tee -a "$summary"

for mode in eager graph; do
  flag=(); [[ $mode == eager ]] && flag=(--enforce-eager)  # graphs are the default on the GPU
  step "eval_$mode" "$osprey" eval --task arith --model "$model" --device cuda --batch 64 \
    --limit 1000 "${flag[@]}"
  echo "eval_$mode: $(grep -h '^accuracy\|^cuda graphs' "$out/eval_$mode.log" | tr '\n' ' ')" |
    tee -a "$summary"
done
if grep -q '^cuda graphs: [1-9]' "$out/eval_graph.log" && ! grep -q '^cuda graphs' "$out/eval_eager.log"
then echo "PASS eval: graphs by default, none with --enforce-eager" | tee -a "$summary"
else echo "FAIL eval: the default run replayed no graph, or --enforce-eager did" | tee -a "$summary"; fi
a=$(grep -h '^accuracy' "$out/eval_eager.log" | awk '{print $2, $3}')
b=$(grep -h '^accuracy' "$out/eval_graph.log" | awk '{print $2, $3}')
if [[ -n $a && $a == "$b" ]]; then echo "PASS eval: same accuracy eager and graph ($a)" | tee -a "$summary"
else echo "CHECK eval: eager '$a' vs graph '$b' (greedy: expected equal)" | tee -a "$summary"; fi

# shellcheck source=serve_smoke.sh
. "$(dirname "$0")/serve_smoke.sh"
serve_check() {
  serve_smoke "$osprey" "$model" 8241 "$out/serve.log" "$out/metrics.txt"  # graphs: the default
}
step serve_graph serve_check
if awk '$1 == "osprey_cuda_graph_replays_total" && $2 > 0 {ok = 1} END {exit !ok}' "$out/metrics.txt"
then echo "PASS serve: /metrics counts graph replays ($(grep '^osprey_cuda_graph' "$out/metrics.txt" | tr '\n' ' '))" | tee -a "$summary"
else echo "FAIL serve: no graph replay in /metrics" | tee -a "$summary"; fi
cat "$summary"
