#!/usr/bin/env bash
# Configures and builds osprey (Release, CPU backend; CUDA ops too when nvcc is present and
# OSPREY_CUDA=ON) into build/. Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
