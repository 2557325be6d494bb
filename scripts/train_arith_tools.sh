#!/usr/bin/env bash
# Issues #16 and #17 on the GPU machine, in one call of under 10 minutes or in a run of N calls: retrains
# the bundled arithmetic model with its MTP layer and its chat modes (plain, thinking, the calculator
# tool; tools/train_arith.py: training capped at 7 minutes and the whole script at a wall-clock
# budget), evaluates it under transformers (the chat modes on 300 test problems, plain accuracy sparse
# and dense on the 1,000, the MTP draft acceptance for K = 1, 2, 3), then, given an osprey binary, runs
# osprey's accuracy gate on the new folder (`osprey eval --task arith`, plain prompts: it must
# stay within the old interval), and packs everything into OUT.
#
# Usage: scripts/train_arith_tools.sh [--phase K/N] [--resume DIR] OUT [OSPREY_BINARY [--device cuda|cpu]]
#                                     [-- train args...]
#   smoke, ~2-3 min (every code path on tiny data; osprey eval on 50 problems):
#     scripts/train_arith_tools.sh $OUT build/osprey --device cuda -- --smoke
#   full, one call, < 10 min:
#     scripts/train_arith_tools.sh $OUT build/osprey --device cuda
#   full, a run of N calls (each < 10 min; the learning-rate schedule, the dense/sparse stages and
#   the MTP weight follow the run's planned training time, fixed by call 1, continuously):
#     call 1:      scripts/train_arith_tools.sh --phase 1/3 $OUT
#     call 2:      scripts/train_arith_tools.sh --phase 2/3 --resume gpucarry/arith-state $OUT
#     call 3 (=N): scripts/train_arith_tools.sh --phase 3/3 --resume gpucarry/arith-state $OUT build/osprey --device cuda
#   between calls, unpack the state where the next call reads it (and carry that folder in):
#     rm -rf gpucarry/arith-state && mkdir -p gpucarry/arith-state &&
#       cat OUT/arith-state.tar.* | tar -x -C gpucarry/arith-state
# Budgets (environment): TRAIN_ARITH_BUDGET_S (the whole training script: 510 for the last call,
# evaluation included; 555 for a call K < N), TRAIN_ARITH_EVAL_RESERVE_S (120: of it, kept for saving
# and evaluating), TRAIN_ARITH_STATE_RESERVE_S (20: kept for saving the state, calls K < N),
# OSPREY_EVAL_TIMEOUT_S (55), TRAIN_ARITH_PART_MIB (15: the archives' part size).
#
# OUT of a call K < N (5-6 files; a device call returns 8, each at most 16 MiB):
#   arith-state.tar.00, .01, ... (15 MiB parts): state.json, tensors.bin (~43 MiB: weights, Adam's
#   moments, data order, RNG, counters); train.log, summary.txt
# OUT of the last (or only) call receives at most 6 files:
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
usage="usage: train_arith_tools.sh [--phase K/N] [--resume DIR] OUT [OSPREY_BINARY [--device cuda|cpu]] [-- train args]"
phase=1/1 resume=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --phase) phase=${2:?$usage}; shift 2 ;;
    --resume) resume=${2:?$usage}; shift 2 ;;
    *) break ;;
  esac
done
if [[ ! $phase =~ ^([0-9]+)/([0-9]+)$ ]] || (( BASH_REMATCH[1] < 1 || BASH_REMATCH[1] > BASH_REMATCH[2] )); then
  echo "train_arith_tools: --phase $phase: expected K/N with 1 <= K <= N" >&2
  exit 2
fi
intermediate=0
(( BASH_REMATCH[1] < BASH_REMATCH[2] )) && intermediate=1
if [[ -n $resume && ! -f $resume/state.json ]]; then
  echo "train_arith_tools: --resume $resume has no state.json (unpack the previous call's arith-state.tar.*)" >&2
  exit 2
fi
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

phase_args=(--phase "$phase")
[[ -n $resume ]] && phase_args+=(--resume "$resume")
if [[ $intermediate == 1 ]]; then
  phase_args+=(--save-state "$work/state" --minutes 9.5 --time-budget-s "${TRAIN_ARITH_BUDGET_S:-555}"
               --state-reserve-s "${TRAIN_ARITH_STATE_RESERVE_S:-20}")
else
  phase_args+=(--minutes 7 --time-budget-s "${TRAIN_ARITH_BUDGET_S:-510}")
fi
PYTHONUNBUFFERED=1 python3 "$here/tools/train_arith.py" --out "$model" --eval-dir "$evald" \
  --eval-reserve-s "${TRAIN_ARITH_EVAL_RESERVE_S:-120}" "${phase_args[@]}" "${train_args[@]}" 2>&1 |
  tee "$out/train.log"
rc=${PIPESTATUS[0]}
if [[ $rc != 0 ]]; then
  echo "train_arith_tools: tools/train_arith.py exited with $rc (3: a check or an evaluation" \
    "section failed, the folder is saved; see train.log)" >&2
  status=1
fi

if [[ $intermediate == 1 ]]; then
  # A call K < N: the training state, in parts, for the next call's --resume.
  rm -f "$out"/arith-state.tar.[0-9][0-9]
  if [[ -f $work/state/state.json ]]; then
    tar -cf "$work/arith-state.tar" -C "$work/state" state.json tensors.bin
    split -b "${TRAIN_ARITH_PART_MIB:-15}M" -d -a 2 "$work/arith-state.tar" "$out/arith-state.tar."
    python3 - "$work/state/state.json" <<'PY' 2>&1 | tee "$out/summary.txt"
import json, sys
m = json.load(open(sys.argv[1]))
c = m["calls"][-1]
print(f"call {m['phase']}/{m['phases']}: {c['steps']} steps in {c['train_seconds']} s ({c['steps_per_second']} "
      f"steps/s, {c['shared_prefix_steps']} of {c['tool_steps']} tool steps with the prefix shared), setup "
      f"{c['setup_seconds']} s; run: {m['step']} steps, {m['train_seconds']:.0f} s, schedule at {m['frac']:.3f} "
      f"of {m['plan_s']:.0f} s; last {m['history'][-1] if m['history'] else None}")
print("shared-prefix check:", c.get("shared_prefix_check"))
PY
    echo "train_arith_tools: state packed into $(cd "$out" && ls arith-state.tar.* | tr '\n' ' ')" \
      "($(stat -c %s "$work/arith-state.tar") bytes); next: unpack them into the folder the next call's" \
      "--resume names"
  else
    echo "train_arith_tools: no training state was saved (see train.log)" >&2
    status=1
  fi
  ls -la "$out"
  exit $status
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
