#!/usr/bin/env bash
# The accuracy gate's GPU rows (issue #7), on the GPU machine: the bundled arithmetic model's
# greedy accuracy on the 1,000 held-out problems under
#   transformers' own generate (float32, eager; sparse, and dense = index_topk above any sequence),
#   osprey on CUDA with its bf16 weights (FP8 indexer key cache, the default; and BF16 keys),
#   osprey on CUDA with the weights FP8 block-quantized by `osprey quantize --ue8m0` (cuBLASLt's
#   W8A8 block-scaled GEMM where the shape allows, and with every FP8 weight dequantised: w8a16),
#   osprey on CUDA with sparsity off (--dense),
#   osprey on CUDA with the FP8 latent cache (--kv-cache-dtype fp8, DeepSeek's fp8_ds_mla format),
# then a summary table (accuracy, 95% Wilson interval, seconds). Reports, failures and logs go
# into LOG_DIR. The CPU rows and the negative controls run anywhere (bench/RESULTS.md).
# Usage: scripts/gpu_gate.sh OSPREY_BINARY LOG_DIR [--limit N] [--no-transformers]
set -uo pipefail
osprey=${1:?usage: gpu_gate.sh OSPREY_BINARY LOG_DIR [--limit N] [--no-transformers]}
log=${2:?usage: gpu_gate.sh OSPREY_BINARY LOG_DIR}
shift 2
limit=() hf=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --limit) limit=(--limit "$2"); shift 2 ;;
    --no-transformers) hf=0; shift ;;
    *) echo "gpu_gate: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
model=$here/models/osprey-arith
mkdir -p "$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

# transformers in the background (its own copy of the folder: it writes its failures there).
if [[ $hf == 1 ]]; then
  cp -r "$model" "$work/hf"
  hf_limit=(); [[ ${#limit[@]} -gt 0 ]] && hf_limit=(--eval-limit "${limit[1]}")
  PYTHONUNBUFFERED=1 python3 "$here/tools/train_arith.py" --eval-only --out "$work/hf" \
    "${hf_limit[@]}" >"$log/transformers.log" 2>&1 &
  hf_pid=$!
fi

"$osprey" quantize --model "$model" --out "$work/fp8" --ue8m0 >"$log/quantize.log" 2>&1 || status=1
row() {
  local name=$1
  shift
  if ! "$osprey" eval --task arith --batch 256 "${limit[@]}" --failures "$log/$name.failures.jsonl" \
      --report "$log/$name.json" "$@" >"$log/$name.log" 2>&1; then
    echo "gpu_gate: $name failed (see $log/$name.log)" >&2
    status=1
  fi
}
row cuda_bf16 --model "$model" --device cuda
row cuda_bf16_keys --model "$model" --device cuda --bf16-index-keys
row cuda_fp8 --model "$work/fp8" --device cuda
row cuda_fp8_w8a16 --model "$work/fp8" --device cuda --fp8-gemm w8a16
row cuda_fp8_kv --model "$model" --device cuda --kv-cache-dtype fp8
row cuda_dense --model "$model" --device cuda --dense

if [[ $hf == 1 ]]; then
  wait "$hf_pid" || status=1
  cp "$work/hf/train_report.json" "$log/transformers_report.json" 2>/dev/null
  cp "$work/hf/hf_failures.jsonl" "$log/transformers.failures.jsonl" 2>/dev/null
  cp "$work/hf/hf_failures_dense.jsonl" "$log/transformers_dense.failures.jsonl" 2>/dev/null
fi
{
  nvidia-smi -L
  printf '%-22s %-22s %-18s %s\n' row accuracy "95% CI" seconds
  for f in "$log"/cuda_*.json; do
    [[ -f $f ]] || continue
    python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); n=sys.argv[1].split('/')[-1][:-5]
print(f\"{n:<22} {r['accuracy']:.4f} ({r['correct']}/{r['n']})   [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}]  {r['seconds']:.1f}\")" "$f"
  done
  grep -h '^transformers generate' "$log/transformers.log" 2>/dev/null
  grep -h '^wrote' "$log/quantize.log"
} | tee "$log/summary.txt"
exit $status
