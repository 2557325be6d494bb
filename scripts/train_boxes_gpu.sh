#!/usr/bin/env bash
# Issue #19 on the GPU machine: trains the long-context gate model (tools/train_boxes.py: V3.2's
# attention and routing shapes, FP8 weights) within one device command, then packs the model
# folder for the way back: the device returns at most 8 files of 16 MiB each from OUT, so the
# folder comes back as a tar split into 15 MiB parts.
#   OUT/train.log                     everything the trainer printed
#   OUT/train_report.json             losses, steps, the sparse / dense / recent-window accuracies
#   OUT/osprey-boxes.tar.part00, 01   the folder (config.json, model.safetensors, tokenizer,
#                                     train_report.json)
#   OUT/hf_check_failures.jsonl       transformers' generate on the saved folder, wrong answers
#   OUT/gpu.txt                       nvidia-smi -L
# Unpack here: cat OUT/osprey-boxes.tar.part* | tar -xf - -C models/
# Usage: scripts/train_boxes_gpu.sh OUT [--smoke] [-- train_boxes.py args...]
#   --smoke: every path of the trainer on little data, about 2 minutes (a check before the run)
#   full:    --time-budget-s 480 by default, about 8.5 minutes with the imports
set -uo pipefail
out=${1:?usage: train_boxes_gpu.sh OUT [--smoke] [-- train args]}
shift
smoke=() train_args=()
if [[ $# -gt 0 && $1 == --smoke ]]; then smoke=(--smoke); shift; fi
if [[ $# -gt 0 && $1 == -- ]]; then shift; train_args=("$@"); fi
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi -L >"$out/gpu.txt" 2>&1
PYTHONUNBUFFERED=1 python3 "$here/tools/train_boxes.py" "${smoke[@]}" --out "$work/osprey-boxes" \
  "${train_args[@]}" 2>&1 | tee "$out/train.log"
status=${PIPESTATUS[0]}
folder=$work/osprey-boxes
if [[ -f $folder/train_report.json ]]; then
  cp "$folder/train_report.json" "$out/"
  [[ -f $folder/hf_check_failures.jsonl ]] && mv "$folder/hf_check_failures.jsonl" "$out/"
  tar -C "$work" -cf - osprey-boxes | split -b 15m -d - "$out/osprey-boxes.tar.part"
  ls -l "$folder" "$out"
  python3 - "$out/train_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ev = r.get("eval") or {}
for k in ("sparse", "dense", "recent", "short_sparse", "short_recent"):
    if k in ev:
        print(f"{k:>13}: {ev[k]['accuracy']:.4f} ({ev[k]['correct']}/{ev[k]['n']}) {ev[k]['ci95']}")
hf = r.get("hf_check")
if hf:
    print(f"transformers generate (sparse, saved folder): {hf['correct']}/{hf['n']}")
print(f"steps {r['steps']} (sparse from {r['sparse_from_step']}), {r['train_seconds']} s training, "
      f"{r['total_seconds']} s in all; model {r['model_mb']} MB")
PY
else
  echo "train_boxes_gpu: no model folder was written" >&2
  status=1
fi
exit $status
