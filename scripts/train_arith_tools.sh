#!/usr/bin/env bash
# Issues #16 and #17 on the GPU machine, in one call of under 10 minutes: retrains the bundled
# arithmetic model with its MTP layer and its chat modes (plain, thinking, the calculator tool;
# tools/train_arith.py: training capped at 7 minutes and the whole script at a wall-clock budget),
# evaluates it under transformers (the chat modes on 300 test problems, plain accuracy sparse and
# dense on the 1,000, the MTP draft acceptance for K = 1, 2, 3), then, given an osprey binary, runs
# osprey's accuracy gate on the new folder (`osprey eval --task arith`, plain prompts: it must
# stay within the old interval), and packs everything into OUT.
#
# Usage: scripts/train_arith_tools.sh OUT [OSPREY_BINARY [--device cuda|cpu]] [-- train args...]
#   smoke, ~2-3 min (every code path on tiny data; osprey eval on 50 problems):
#     scripts/train_arith_tools.sh $OUT build/osprey --device cuda -- --smoke
#   full, < 10 min:
#     scripts/train_arith_tools.sh $OUT build/osprey --device cuda
# Budgets (environment): TRAIN_ARITH_BUDGET_S (510: the whole training script, evaluation
# included), TRAIN_ARITH_EVAL_RESERVE_S (120: of it, kept for saving and evaluating),
# OSPREY_EVAL_TIMEOUT_S (55), TRAIN_ARITH_PART_MIB (15: the archive's part size).
#
# OUT receives at most 6 files (a device call returns 8, each at most 16 MiB):
#   osprey-arith.tar.gz, or osprey-arith.tar.gz.00, .01, ... (15 MiB parts) when larger:
#     osprey-arith/  config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
#                    train_report.json: what models/osprey-arith holds
#     eval/          transformers' failures and chat-mode outputs, osprey eval's report,
#                    failures and log
#   train.log, train_report.json, eval_plain.json, summary.txt (also inside the archive)
# Unpack and install:
#   mkdir -p /tmp/arith && cat OUT/osprey-arith.tar.gz* | tar -xz -C /tmp/arith
#   cp /tmp/arith/osprey-arith/* models/osprey-arith/
set -uo pipefail
usage="usage: train_arith_tools.sh OUT [OSPREY_BINARY [--device cuda|cpu]] [-- train args]"
out=${1:?$usage}
shift
osprey="" device=cuda train_args=()
if [[ $# -gt 0 && $1 != -- ]]; then osprey=$1; shift; fi
if [[ $# -gt 1 && $1 == --device ]]; then device=$2; shift 2; fi
if [[ $# -gt 0 && $1 == -- ]]; then shift; train_args=("$@"); shift $#; fi
[[ $# -eq 0 ]] || { echo "train_arith_tools: unexpected argument $1; $usage" >&2; exit 2; }
if [[ -n $osprey && ! -x $osprey ]]; then
  echo "train_arith_tools: $osprey is not an executable osprey binary" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$work/osprey-arith
evald=$work/eval
mkdir -p "$evald"
smoke=0
for a in "${train_args[@]}"; do [[ $a == --smoke ]] && smoke=1; done
status=0

PYTHONUNBUFFERED=1 python3 "$here/tools/train_arith.py" --out "$model" --eval-dir "$evald" \
  --minutes 7 --time-budget-s "${TRAIN_ARITH_BUDGET_S:-510}" \
  --eval-reserve-s "${TRAIN_ARITH_EVAL_RESERVE_S:-120}" "${train_args[@]}" 2>&1 | tee "$out/train.log"
rc=${PIPESTATUS[0]}
if [[ $rc != 0 ]]; then
  echo "train_arith_tools: tools/train_arith.py exited with $rc (3: a check or an evaluation" \
    "section failed, the folder is saved; see train.log)" >&2
  status=1
fi

if [[ -n $osprey && -f $model/model.safetensors ]]; then
  limit=()
  [[ $smoke == 1 ]] && limit=(--limit 50)
  if timeout "${OSPREY_EVAL_TIMEOUT_S:-55}" "$osprey" eval --task arith --model "$model" \
      --device "$device" --batch 256 "${limit[@]}" --failures "$evald/eval_plain.failures.jsonl" \
      --report "$evald/eval_plain.json" >"$evald/eval_plain.log" 2>&1; then
    cp "$evald/eval_plain.json" "$out/eval_plain.json"
  else
    echo "train_arith_tools: osprey eval failed or ran past its timeout (see eval/eval_plain.log)" >&2
    status=1
  fi
  tail -3 "$evald/eval_plain.log"
fi

{
  python3 - "$model/train_report.json" "$evald/eval_plain.json" <<'PY'
import json, os, sys
if not os.path.exists(sys.argv[1]):
    sys.exit("no train_report.json (training did not finish)")
r = json.load(open(sys.argv[1]))
print(f"steps {r.get('steps')}, train {r.get('train_seconds')} s, total {r.get('total_seconds')} s, "
      f"final {r.get('final')}")
ev = r.get("eval") or {}
for k in ("sparse", "dense"):
    v = ev.get(k) or {}
    if "accuracy" in v:
        print(f"{k:>12}: {v['accuracy']:.4f} {v['ci95']} ({v['correct']}/{v['n']} of {v['of']})")
    elif v:
        print(f"{k:>12}: {v}")
for k, v in (ev.get("modes") or {}).items():
    if isinstance(v, dict) and "accuracy" in v:
        print(f"{k:>12}: {v['accuracy']:.4f} {v['ci95']} ({v['correct']}/{v['n']})")
acc = ev.get("mtp_acceptance") or {}
for k, v in (acc.get("k") or {}).items():
    print(f"   MTP K={k}: acceptance rate {v['acceptance_rate']:.4f}, mean acceptance length "
          f"{v['mean_acceptance_length']:.4f}, per position {[round(x, 4) for x in v['per_position_acceptance']]}")
if acc.get("check"):
    print(f"   MTP draft check: {acc['check']}")
if "error" in acc:
    print(f"   MTP acceptance: {acc['error']}")
if ev.get("padding_check"):
    print(f"padding check: {ev['padding_check']}")
if os.path.exists(sys.argv[2]):
    o = json.load(open(sys.argv[2]))
    print(f"osprey eval: {o['accuracy']:.4f} {o['ci95']} ({o['correct']}/{o['n']}) in {o['seconds']:.1f} s")
print("failures:", (r.get("failures") or []) or "none")
PY
  [[ -f $model/model.safetensors ]] && sha256sum "$model/model.safetensors" | sed "s|$work/||"
} 2>&1 | tee "$out/summary.txt"

# Pack: one archive (15 MiB parts if larger), plus the small files beside it.
if [[ -d $model ]]; then
  [[ -f $model/train_report.json ]] && cp "$model/train_report.json" "$out/train_report.json"
  cp "$out/train.log" "$out/summary.txt" "$evald/"
  tar -czf "$work/osprey-arith.tar.gz" -C "$work" osprey-arith eval
  size=$(stat -c %s "$work/osprey-arith.tar.gz")
  rm -f "$out"/osprey-arith.tar.gz "$out"/osprey-arith.tar.gz.[0-9][0-9]
  part_mib=${TRAIN_ARITH_PART_MIB:-15}
  if (( size > part_mib * 1024 * 1024 )); then
    split -b "${part_mib}M" -d -a 2 "$work/osprey-arith.tar.gz" "$out/osprey-arith.tar.gz."
  else
    mv "$work/osprey-arith.tar.gz" "$out/"
  fi
  echo "train_arith_tools: packed $size bytes into $(cd "$out" && ls osprey-arith.tar.gz* | tr '\n' ' ')"
  ls -la "$out"
fi
exit $status
