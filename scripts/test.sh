#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every test ctest knows; then the
# sanitizer runs (scripts/sanitizer_test.sh: ASan + UBSan over the whole suite with the fuzz
# targets, TSan over the concurrency tests), unless OSPREY_SKIP_SANITIZERS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
if [[ ${OSPREY_SKIP_SANITIZERS:-} != 1 ]]; then
  bash scripts/sanitizer_test.sh all
fi
