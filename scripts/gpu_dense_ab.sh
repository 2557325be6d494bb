#!/usr/bin/env bash
# Several FP8 linears of one input in one swap-AB launch (on one block an item, or the persistent
# grid variant), and the split-KV combine over the split tokens only (issue 13's B = 1 step), on
# the GPU, one device call: the correctness checks they need, then decode steps with them and with
# the dense path as before, then Nsight Compute's per-kernel times of the B = 1 step.
#   [TESTS=...] [TEST_S=170] [STEPS="new old waves nogroup"] [KERNELS=0|1] DL=SECONDS \
#     scripts/gpu_dense_ab.sh CARRY_DIR [LOG_DIR=$OUT]
# Step variants: new and new_b (the defaults), old (OSPREY_FP8_DENSE_GRID=waves
# OSPREY_FP8_DENSE_GROUP=0: one block an item, a launch a linear), waves
# (OSPREY_FP8_DENSE_GRID=waves), nogroup (OSPREY_FP8_DENSE_GROUP=0), group64 and group64_b
# (OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS=64), auto and auto_b (OSPREY_FP8_DENSE_KGROUPS=auto: the stage
# depth by the launch's shape), kg4 (OSPREY_FP8_DENSE_KGROUPS=4, the default spelt out), wide48 and
# wide48_b (OSPREY_FP8_SWAPAB_WIDE_MAX_MB=48: the grouped launch for small linears up to 64
# tokens). STEP_BATCH (env): bench step's --batch (1,16,64). E.g. the two eighteenth-session
# variants against the default, alternated:
#   STEPS="new auto new_b auto_b" STEP_BATCH=1,16 NCU=0 ...; STEPS="new wide48 new_b wide48_b"
#   STEP_BATCH=56,64 NCU=0 ...
# KERNELS=1 adds `bench kernels --op gemm --m 1,16,32`; NCU=0 leaves out Nsight Compute.
# CARRY_DIR holds carry.txz (bin/: osprey and the test binaries; lib/: their libraries; tok/:
# DeepSeek-V3's tokenizer.json), packed by a CUDA build here. DL: seconds this script may take
# (default 540). Prints a summary at the end; logs in LOG_DIR (at most 8 files).
set -uo pipefail
carry=${1:?usage: gpu_dense_ab.sh CARRY_DIR [LOG_DIR]}
log=${2:-${OUT:-/tmp/gpu_dense_ab}}
deadline=$((SECONDS + ${DL:-540}))
mkdir -p "$log"
G=$(mktemp -d)
xz -dc "$carry/carry.txz" | tar -C "$G" -xf -
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64
export OSPREY_TEST_DATA=$PWD/tests/data
export OSPREY_BUNDLED_MODEL=$PWD/models/osprey-arith
B=$G/bin
left() { echo $((deadline - SECONDS)); }
sum=$log/summary.txt
nvidia-smi -L | tee "$sum"
t0=$SECONDS

# 1. Correctness, in parallel (the GPU shared; nothing timed meanwhile). TESTS (env): entries
#    "name|binary|gtest filter" separated by spaces; TEST_S: each binary's time limit.
tl=${TEST_S:-170}
run_test() {  # name binary filter
  local name=$1 bin=$2 filter=$3
  timeout $tl "$B/$bin" --gtest_filter="$filter" > "$log/t_$name.log" 2>&1
  echo "$name rc=$? ok=$(grep -c '^\[       OK \]' "$log/t_$name.log") failed=$(grep -c '^\[  FAILED  \] [A-Za-z]*\.' "$log/t_$name.log")"
}
default_tests='graph_step|test_cuda_graph_step|CudaGraphStep.PdlChangesNoByte:CudaGraphStep.Dsv32LikeReplayMatchesEager:CudaGraphStep.NoMemsetNoHostNodeAndKernelBudgetPerLayer:CudaGraphStep.VerifyGraphHoldsTheDecodeBudgetPerLayer:CudaGraphStep.EngineGreedyTokensMatchEager:CudaGraphStep.Dsv32LikeVerifyReplayMatchesEager
goldens|test_goldens_gpu|*
fp8_gemm|test_cuda_fp8_gemm|*
mla_sm90|test_cuda_mla_sm90|*
gemm|test_cuda_gemm|*
moe|test_cuda_moe|*'
{
  while IFS='|' read -r name bin filter; do
    [[ -n $name ]] && run_test "$name" "$bin" "$filter" &
  done <<< "$(tr ' ' '\n' <<< "${TESTS:-$default_tests}")"
  wait
} > "$log/tests.txt" 2>&1
cat "$log/tests.txt" >> "$sum"; rm -f "$log/tests.txt"
grep -h '^PDL\|^GRAPH\|^VGRAPH\|^GPUGOLDEN' "$log"/t_*.log | head -20 >> "$sum"
cat "$log"/t_*.log > "$log/tests_all.log"; rm -f "$log"/t_*.log
echo "tests took $((SECONDS - t0)) s" >> "$sum"

# 2. Decode steps: the new dense grid and grouping, then as before, then each alone; one process
#    each.
step() {  # label env...
  local label=$1; shift
  [[ $(left) -gt 100 ]] || { echo "skip $label (time)" >> "$sum"; return; }
  env "$@" timeout 150 "$B/osprey" bench step --preset dsv32 --load-format dummy --batch "${STEP_BATCH:-1,16,64}" \
    --context 5000 --warmup 5 --iters 20 --cuda-graph > "$log/step_$label.log" 2>&1
  echo "== bench step $label (rc $?)" >> "$sum"
  grep -E 'ceilings|^decode|^graph' "$log/step_$label.log" | sort -u | head -20 >> "$sum"
}
# STEPS (env): the variants to run, by label (new, old, waves, nogroup; default all four).
for v in ${STEPS:-new old waves nogroup}; do
  case $v in
    new) step new OSPREY_PDL=1 ;;
    old) step old OSPREY_FP8_DENSE_GRID=waves OSPREY_FP8_DENSE_GROUP=0 ;;
    waves) step waves OSPREY_FP8_DENSE_GRID=waves ;;
    nogroup) step nogroup OSPREY_FP8_DENSE_GROUP=0 ;;
    new_b) step new_b OSPREY_PDL=1 ;;
    group64) step group64 OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS=64 ;;
    group64_b) step group64_b OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS=64 ;;
    auto) step auto OSPREY_FP8_DENSE_KGROUPS=auto ;;
    auto_b) step auto_b OSPREY_FP8_DENSE_KGROUPS=auto ;;
    kg4) step kg4 OSPREY_FP8_DENSE_KGROUPS=4 ;;
    wide48) step wide48 OSPREY_FP8_SWAPAB_WIDE_MAX_MB=48 ;;
    wide48_b) step wide48_b OSPREY_FP8_SWAPAB_WIDE_MAX_MB=48 ;;
  esac
done

# 2b. KERNELS=1 (env): the FP8 linears alone at decode token counts (bench kernels --op gemm:
#     each projection, then the linears of one input grouped and not, on both grids).
#     KERNEL_M (env): its token counts (default 1,16,32); KERNEL_ENV: its environment (e.g.
#     OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS=64).
if [[ ${KERNELS:-0} == 1 && $(left) -gt 120 ]]; then
  env ${KERNEL_ENV:-OSPREY_PDL=1} timeout 150 "$B/osprey" bench kernels --op gemm --m "${KERNEL_M:-1,16,32}" \
    > "$log/kernels_gemm.log" 2>&1
  echo "== ${KERNEL_ENV:-} bench kernels --op gemm --m ${KERNEL_M:-1,16,32} (rc $?)" >> "$sum"
  grep -A40 'linears of one x' "$log/kernels_gemm.log" >> "$sum"
fi

# 3. Nsight Compute: per-kernel times of the eager B = 1 step (kernels one at a time, so PDL
#    does not change them); summed by name.
if [[ ${NCU:-1} == 1 && $(left) -gt 90 ]] && command -v ncu >/dev/null; then
  timeout $(( $(left) - 30 )) ncu --metrics gpu__time_duration.sum --csv --clock-control none \
    "$B/osprey" bench step --preset dsv32 --load-format dummy --batch 1 --context 5000 --warmup 1 \
    --iters 2 > "$log/ncu_b1.csv" 2> "$log/ncu_b1_sums.txt"
  LAST=200 python3 scripts/ncu_kernel_sums.py "$log/ncu_b1.csv" >> "$log/ncu_b1_sums.txt" 2>&1
  head -45 "$log/ncu_b1_sums.txt" >> "$sum"
  xz -9 "$log/ncu_b1.csv"
fi
echo "total $((SECONDS - t0)) s" >> "$sum"
cat "$sum"
