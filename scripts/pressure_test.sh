#!/usr/bin/env bash
# KV cache pressure end to end (tests/server/pressure.mjs): N prompts of PROMPT_LEN tokens, first
# one at a time on a server with a roomy KV cache, then all at once on a server whose cache holds
# only BLOCKS blocks (forcing preemption); the greedy outputs must be equal, preemptions > 0, no
# block held afterwards.
# PRESSURE_CLIENT=python runs tools/pressure_client.py (the GPU machine's client, which also judges
# an unequal output as vLLM's check_logprobs_close does; PRESSURE_COMPARE=close passes on that)
# instead of the Node.js one, so that the CPU suite checks the GPU script's client too.
#   scripts/pressure_test.sh OSPREY_BINARY LOG_DIR N PROMPT_LEN MAX_TOKENS VOCAB BLOCKS [serve args...]
# The serve args (model, device, ...) go to both servers; logs and the summary go to LOG_DIR.
set -euo pipefail
osprey=$1 logdir=$2 n=$3 len=$4 max=$5 vocab=$6 blocks=$7
shift 7
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$logdir"
client() {  # MODE: the command line (quoted for bash -c) of PRESSURE_CLIENT's client for one run
  if [[ ${PRESSURE_CLIENT:-node} == python ]]; then  # it takes the URL, known inside server_test.sh
    printf '%q ' python3 "$here/tools/pressure_client.py" "$1"
    printf '"$OSPREY_URL" '
  else
    printf '%q ' node "$here/tests/server/pressure.mjs" "$1"
  fi
  printf '%q ' "$n" "$len" "$max" "$vocab" "$logdir/uncontended.json"
}
ctx=$((len + max + 64))
common=(--max-model-len "$ctx" --max-num-seqs "$n" --max-num-batched-tokens 8192 "$@")
OSPREY_SERVER_LOG=$logdir/uncontended.server.log "$here/scripts/server_test.sh" "$osprey" "${common[@]}" -- \
  bash -c "$(client uncontended)" \
  2>&1 | tee "$logdir/uncontended.log"
OSPREY_SERVER_LOG=$logdir/contended.server.log "$here/scripts/server_test.sh" "$osprey" "${common[@]}" \
  --num-gpu-blocks-override "$blocks" -- \
  bash -c "$(client contended)" \
  2>&1 | tee "$logdir/contended.log"
