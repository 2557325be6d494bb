#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every test ctest knows.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
