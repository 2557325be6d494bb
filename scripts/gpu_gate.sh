#!/usr/bin/env bash
# The accuracy gate's GPU rows (issue #7), on the GPU machine: the bundled arithmetic model's
# greedy accuracy on the 1,000 held-out problems under
#   transformers' own generate (float32, eager; sparse, and dense = index_topk above any sequence),
#   osprey on CUDA with its bf16 weights (FP8 indexer key cache, the default; and BF16 keys),
#   osprey on CUDA with the weights FP8 block-quantized by `osprey quantize --ue8m0` (cuBLASLt's
#   W8A8 block-scaled GEMM where the shape allows, and with every FP8 weight dequantised: w8a16),
#   osprey on CUDA with sparsity off (--dense),
#   osprey on CUDA with the FP8 latent cache (--kv-cache-dtype fp8, DeepSeek's fp8_ds_mla format),
# then a summary table (accuracy, 95% Wilson interval, failed ids, seconds). Reports, failures
# and logs go into LOG_DIR. The CPU rows and the negative controls run anywhere (bench/RESULTS.md).
#
# --task boxes (issue #19): the long-context model models/osprey-boxes (V3.2's attention and
# routing shapes, FP8 weights as shipped) on the 200 held-out box problems (3,000-8,000 tokens):
#   transformers' generate on the dequantised weights (float32, eager; sparse and dense),
#   osprey on CUDA with bf16 weights (the FP8 weights dequantised, exact: ue8m0 scales), with BF16
#   indexer keys, with the FP8 weights (W8A8 where the shape allows; and w8a16), with the FP8 latent
#   cache, with sparsity off (--dense), with the sm_90a tensor-core attention off
#   (OSPREY_MLA_SM90=0, the fast kernels' before/after), and the recent-window negative control
#   (--indexer-recent: must fail); --cpu-limit N adds the CPU row on the first N problems.
# Usage: scripts/gpu_gate.sh OSPREY_BINARY LOG_DIR [--task arith|boxes] [--limit N]
#          [--no-transformers] [--transformers-only] [--cpu-limit N]
set -uo pipefail
osprey=${1:?usage: gpu_gate.sh OSPREY_BINARY LOG_DIR [--task arith|boxes] [--limit N] [--no-transformers]}
log=${2:?usage: gpu_gate.sh OSPREY_BINARY LOG_DIR}
shift 2
limit=() hf=1 task=arith osprey_rows=1 cpu_limit=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --task) task=$2; shift 2 ;;
    --limit) limit=(--limit "$2"); shift 2 ;;
    --no-transformers) hf=0; shift ;;
    --transformers-only) osprey_rows=0; shift ;;
    --cpu-limit) cpu_limit=$2; shift 2 ;;
    *) echo "gpu_gate: unknown argument $1" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
if [[ $task == boxes ]]; then
  exec_boxes=1
elif [[ $task == arith ]]; then
  exec_boxes=0
else
  echo "gpu_gate: --task must be arith or boxes" >&2
  exit 2
fi
summary() {  # the table of LOG_DIR's row reports (accuracy, interval, failed ids, seconds)
  printf '%-22s %-22s %-18s %-8s %s\n' row accuracy "95% CI" seconds "failed ids"
  for f in "$log"/cuda_*.json "$log"/cpu*.json; do
    [[ -f $f ]] || continue
    python3 -c "
import json,sys; r=json.load(open(sys.argv[1])); n=sys.argv[1].split('/')[-1][:-5]
ids=[json.loads(l)['id'].rsplit('-',1)[-1] for l in open(sys.argv[1][:-5]+'.failures.jsonl')]
ids=', '.join(ids) if len(ids)<=12 else f'{len(ids)} ids'
print(f\"{n:<22} {r['accuracy']:.4f} ({r['correct']}/{r['n']})   [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}]  {r['seconds']:<8.1f} {ids}\")" "$f"
  done
}

if [[ $exec_boxes == 1 ]]; then
  model=$here/models/osprey-boxes
  if [[ ! -f $model/model.safetensors ]]; then
    echo "gpu_gate: $model is absent: train it first (scripts/train_boxes_gpu.sh)" >&2
    exit 2
  fi
  n=200; [[ ${#limit[@]} -gt 0 ]] && n=${limit[1]}
  if [[ $hf == 1 ]]; then  # transformers in the background, on its own copy (it writes there)
    cp -r "$model" "$work/hf"
    PYTHONUNBUFFERED=1 python3 "$here/tools/train_boxes.py" --eval-only --out "$work/hf" \
      --eval-n "$n" >"$log/transformers.log" 2>&1 &
    hf_pid=$!
  fi
  python3 "$here/tools/train_boxes.py" --dequantize "$model" --out "$work/bf16" \
    >"$log/dequantize.log" 2>&1 || status=1
  brow() {
    local name=$1
    shift
    if ! "$osprey" eval --task boxes --batch 64 --max-tokens 128 "${limit[@]}" \
        --failures "$log/$name.failures.jsonl" --report "$log/$name.json" "$@" \
        >"$log/$name.log" 2>&1; then
      echo "gpu_gate: $name failed (see $log/$name.log)" >&2
      status=1
    fi
  }
  if [[ $cpu_limit -gt 0 ]]; then  # the CPU row on the host's cores, beside the GPU rows
    "$osprey" eval --task boxes --batch 16 --max-tokens 128 --limit "$cpu_limit" --model "$model" \
      --failures "$log/cpu.failures.jsonl" --report "$log/cpu.json" >"$log/cpu.log" 2>&1 &
    cpu_pid=$!
  fi
  if [[ $osprey_rows == 1 ]]; then
    brow cuda_bf16 --model "$work/bf16" --device cuda
    brow cuda_bf16_keys --model "$work/bf16" --device cuda --bf16-index-keys
    brow cuda_fp8 --model "$model" --device cuda
    brow cuda_fp8_w8a16 --model "$model" --device cuda --fp8-gemm w8a16
    brow cuda_fp8_kv --model "$work/bf16" --device cuda --kv-cache-dtype fp8
    brow cuda_dense --model "$work/bf16" --device cuda --dense
    OSPREY_MLA_SM90=0 brow cuda_sm90_off --model "$work/bf16" --device cuda
    brow cuda_recent_control --model "$work/bf16" --device cuda --indexer-recent
  fi
  [[ $cpu_limit -gt 0 ]] && { wait "$cpu_pid" || status=1; }
  if [[ $hf == 1 ]]; then
    wait "$hf_pid" || status=1
    cp "$work/hf/train_report.json" "$log/transformers_report.json" 2>/dev/null
    cp "$work/hf/hf_failures.jsonl" "$log/transformers.failures.jsonl" 2>/dev/null
    cp "$work/hf/hf_failures_dense.jsonl" "$log/transformers_dense.failures.jsonl" 2>/dev/null
  fi
  {
    nvidia-smi -L
    summary
    grep -h '^transformers generate' "$log/transformers.log" 2>/dev/null
  } | tee "$log/summary.txt"
  # The recent-window control must fail: far below the sparse row.
  python3 - "$log" <<'PY' || status=1
import json, os, sys
d = sys.argv[1]
p = lambda n: json.load(open(os.path.join(d, n + ".json")))
if os.path.exists(os.path.join(d, "cuda_recent_control.json")) and os.path.exists(os.path.join(d, "cuda_bf16.json")):
    rec, ref = p("cuda_recent_control")["accuracy"], p("cuda_bf16")["accuracy"]
    ok = rec <= 0.2 and ref >= rec + 0.5
    print(f"recent-window control {rec:.3f} vs sparse {ref:.3f}: {'fails as it must' if ok else 'DOES NOT FAIL'}")
    sys.exit(0 if ok else 1)
PY
  exit $status
fi

model=$here/models/osprey-arith

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
  summary
  grep -h '^transformers generate' "$log/transformers.log" 2>/dev/null
  grep -h '^wrote' "$log/quantize.log"
} | tee "$log/summary.txt"
exit $status
