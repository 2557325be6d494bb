#!/usr/bin/env bash
# Installs what osprey needs to build and test on Debian 12: compilers and CMake, the C++ libraries
# (all from Debian's packages) and Node.js/npm for the reference-tokenizer tests.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libcli11-dev libopenblas-dev libpcre2-dev libxxhash-dev
      libgtest-dev libgmock-dev libboost-dev clang libclang-rt-14-dev nodejs npm)
pkgs+=(libicu-dev)  # tokenizer: Unicode normalization forms (NFC, NFKC) and character classes
pkgs+=(python3)     # the arithmetic data check (tools/arith/check_data.py)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from elsewhere than Debian (a newer release): accept any node + npm on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
