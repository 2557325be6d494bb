#!/usr/bin/env bash
# Programmatic dependent launch (ops/cuda/hopper/pdl.cuh) on the GPU, one device call: the
# correctness checks it needs, then decode steps with it on and off, then Nsight Compute's
# per-kernel times of the B = 1 step (issue 13's breakdown).
#   DL=SECONDS scripts/gpu_pdl_ab.sh CARRY_DIR [LOG_DIR=$OUT]
# CARRY_DIR holds carry.txz (bin/: osprey and the test binaries; lib/: their libraries; tok/:
# DeepSeek-V3's tokenizer.json), packed by a CUDA build here. DL: seconds this script may take
# (default 540). Prints a summary at the end; logs in LOG_DIR (at most 8 files).
set -uo pipefail
carry=${1:?usage: gpu_pdl_ab.sh CARRY_DIR [LOG_DIR]}
log=${2:-${OUT:-/tmp/gpu_pdl_ab}}
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

# 1. Correctness, in parallel (the GPU shared; nothing timed meanwhile).
tl=$(( $(left) > 400 ? 170 : 90 ))
run_test() {  # name binary filter
  local name=$1 bin=$2 filter=$3
  timeout $tl "$B/$bin" --gtest_filter="$filter" > "$log/t_$name.log" 2>&1
  echo "$name rc=$? ok=$(grep -c '^\[       OK \]' "$log/t_$name.log") failed=$(grep -c '^\[  FAILED  \] [A-Za-z]*\.' "$log/t_$name.log")"
}
{
  run_test graph_step test_cuda_graph_step 'CudaGraphStep.PdlChangesNoByte:CudaGraphStep.Dsv32LikeReplayMatchesEager:CudaGraphStep.NoMemsetNoHostNodeAndKernelBudgetPerLayer:CudaGraphStep.EngineGreedyTokensMatchEager' &
  run_test basic test_cuda_basic '*' &
  run_test goldens test_goldens_gpu '*' &
  run_test gemm test_cuda_gemm '*' &
  run_test indexer test_cuda_indexer '*' &
  run_test fp8_dense test_cuda_fp8_gemm 'CudaOps.LinearFp8SwapAb*:CudaOps.Linears*' &
  run_test mla_sm90 test_cuda_mla_sm90 'CudaMlaSm90.SparseDecode*:CudaMlaSm90.Dense*:CudaMlaSm90.SparsePrefillChunk' &
  wait
} > "$log/tests.txt" 2>&1
cat "$log/tests.txt" >> "$sum"; rm -f "$log/tests.txt"
grep -h '^PDL\|^GPUGOLDEN' "$log"/t_*.log | head -20 >> "$sum"
cat "$log"/t_*.log > "$log/tests_all.log"; rm -f "$log"/t_*.log
echo "tests took $((SECONDS - t0)) s" >> "$sum"

# 2. Decode steps, PDL on and off (graphs and eager), one process each.
step() {  # label env...
  local label=$1; shift
  [[ $(left) -gt 100 ]] || { echo "skip $label (time)" >> "$sum"; return; }
  env "$@" timeout 150 "$B/osprey" bench step --preset dsv32 --load-format dummy --batch 1,16,64 \
    --context 5000 --warmup 5 --iters 20 --cuda-graph > "$log/step_$label.log" 2>&1
  echo "== bench step $label (rc $?)" >> "$sum"
  grep -E 'ceilings|PDL|^decode|^step|graph' "$log/step_$label.log" | head -20 >> "$sum"
}
step pdl_on OSPREY_PDL=1
step pdl_off OSPREY_PDL=0
step pdl_on_again OSPREY_PDL=1

# 3. Nsight Compute: per-kernel times of the eager B = 1 step (kernels one at a time, so PDL
#    does not change them); summed by name.
if [[ $(left) -gt 90 ]] && command -v ncu >/dev/null; then
  timeout $(( $(left) - 30 )) ncu --metrics gpu__time_duration.sum --csv --clock-control none \
    "$B/osprey" bench step --preset dsv32 --load-format dummy --batch 1 --context 5000 --warmup 1 \
    --iters 2 > "$log/ncu_b1.csv" 2> "$log/ncu_b1_sums.txt"
  LAST=200 python3 scripts/ncu_kernel_sums.py "$log/ncu_b1.csv" >> "$log/ncu_b1_sums.txt" 2>&1
  head -45 "$log/ncu_b1_sums.txt" >> "$sum"
  xz -9 "$log/ncu_b1.csv"
fi
echo "total $((SECONDS - t0)) s" >> "$sum"
cat "$sum"
