#!/usr/bin/env bash
# Issue #17 on the GPU machine: retrains the bundled arithmetic model with its chat modes (plain,
# thinking, the calculator tool; tools/train_arith.py) into OUT/osprey-arith, evaluates it under
# transformers (plain accuracy sparse and dense on the 1,000 test problems; thinking and the
# calculator round trip on 300), then, given an osprey binary, runs osprey's accuracy gate on the
# new folder (`osprey eval --task arith`, plain prompts: it must stay within the old interval).
# Logs and reports: OUT/train.log, OUT/osprey-arith/train_report.json, OUT/eval_*.{log,json}.
# Usage: scripts/train_arith_tools.sh OUT [OSPREY_BINARY [--device cuda|cpu]] [-- train args...]
set -uo pipefail
out=${1:?usage: train_arith_tools.sh OUT [OSPREY_BINARY [--device cuda|cpu]] [-- train args]}
shift
osprey="" device=cuda train_args=()
if [[ $# -gt 0 && $1 != -- ]]; then osprey=$1; shift; fi
if [[ $# -gt 1 && $1 == --device ]]; then device=$2; shift 2; fi
if [[ $# -gt 0 && $1 == -- ]]; then shift; train_args=("$@"); fi
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
status=0
PYTHONUNBUFFERED=1 python3 "$here/tools/train_arith.py" --out "$out/osprey-arith" --minutes 8 \
  "${train_args[@]}" 2>&1 | tee "$out/train.log"
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "train_arith_tools: training failed" >&2; exit 1; }
if [[ -n $osprey ]]; then
  "$osprey" eval --task arith --model "$out/osprey-arith" --device "$device" --batch 256 \
    --failures "$out/eval_plain.failures.jsonl" --report "$out/eval_plain.json" \
    >"$out/eval_plain.log" 2>&1 || { echo "train_arith_tools: osprey eval failed" >&2; status=1; }
  tail -3 "$out/eval_plain.log"
fi
python3 - "$out/osprey-arith/train_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ev = r.get("eval") or {}
for k in ("sparse", "dense"):
    if k in ev:
        print(f"{k:>12}: {ev[k]['accuracy']:.4f} {ev[k]['ci95']}")
for k, v in (ev.get("modes") or {}).items():
    if isinstance(v, dict):
        print(f"{k:>12}: {v['accuracy']:.4f} {v['ci95']} ({v['correct']}/{v['n']})")
PY
exit $status
