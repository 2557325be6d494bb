#!/usr/bin/env bash
# osprey serve's start-up checks and osprey --version (no server stays up):
#   startup_test.sh OSPREY_BINARY
# A KV cache too small for one max_model_len sequence, --device cuda without the CUDA backend
# (or without a device), and bad flag values each exit 1 with a message naming the numbers;
# --cuda-graph (or --cuda-graph-sizes) where graphs cannot run, or with --enforce-eager, exits 1
# naming why.
set -euo pipefail
osprey=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
# Runs osprey with the arguments; sets $out (stdout + stderr) and $rc. A server that comes up
# instead of failing is stopped after 60 s (rc 124), failing the check.
run() { rc=0; out=$(timeout 60 "$osprey" "$@" 2>&1) || rc=$?; }

run --version
[[ $rc == 0 ]] || fail "--version exit status $rc: $out"
[[ $out =~ ^osprey\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ [0-9a-f]{7,}(\+dirty)?\) || $out == *"(commit unknown)"* ]] ||
  fail "--version does not give version and commit: $out"
[[ $out == *"CUDA backend: built in"* || $out == *"CUDA backend: not built"* ]] || fail "--version: no CUDA line: $out"
cuda_built=0
[[ $out == *"CUDA backend: built in"* ]] && cuda_built=1

# The bundled model: 180224-byte blocks of 64 tokens; max_model_len 2048 (its max_position_embeddings)
# needs 32 blocks.
run serve --port 0 --kv-cache-memory 0.001
[[ $rc == 1 ]] || fail "a too small KV cache: exit status $rc: $out"
[[ $out == *"cannot hold one sequence of max_model_len 2048 tokens, which needs 32 blocks"* &&
   $out == *"5 blocks of 64 tokens at 180224 bytes each"* ]] || fail "KV cache message: $out"
run serve --port 0 --kv-cache-memory 0.0005 --max-model-len 256
[[ $rc == 1 && $out == *"(0.34375 MiB: 2 blocks of 64 tokens"*"max_model_len 256 tokens, which needs 4 blocks (0.6875 MiB)"* ]] ||
  fail "KV cache message at max_model_len 256: $out"

if [[ $cuda_built == 0 ]]; then
  run serve --port 0 --device cuda
  [[ $rc == 1 && $out == *"built without the CUDA backend"*"--device cpu"* ]] || fail "--device cuda without CUDA: $out"
elif ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  run serve --port 0 --device cuda
  [[ $rc == 1 && $out == *"no CUDA device is visible"* ]] || fail "--device cuda without a device: $out"
  # eval and generate load through the same bundle: the same message, not a cudaMalloc error.
  run eval --task arith --limit 1 --device cuda --report /dev/null --failures /dev/null
  [[ $rc == 1 && $out == *"no CUDA device is visible"* ]] || fail "eval --device cuda without a device: $out"
  run generate --tokens 1,2,3 --max-tokens 2 --device cuda
  [[ $rc == 1 && $out == *"no CUDA device is visible"* ]] || fail "generate --device cuda without a device: $out"
fi

run serve --port 0 --shutdown-timeout -1
[[ $rc == 1 && $out == *"--shutdown-timeout must be a number of seconds >= 0, got -1"* ]] || fail "bad --shutdown-timeout: $out"
run serve --port 0 --kv-cache-memory 0
[[ $rc == 1 && $out == *"--kv-cache-memory must be a positive number of GiB, got 0"* ]] || fail "bad --kv-cache-memory: $out"
run serve --port 0 --device tpu
[[ $rc == 1 && $out == *"--device must be cpu or cuda, got 'tpu'"* ]] || fail "bad --device: $out"
# CUDA graphs: on by default on the GPU only; --cuda-graph insists (a CPU model refuses it), and
# it contradicts --enforce-eager.
run serve --port 0 --cuda-graph --enforce-eager
[[ $rc == 1 && $out == *"--cuda-graph and --enforce-eager contradict each other"* ]] || fail "--cuda-graph with --enforce-eager: $out"
run generate --tokens 1,2,3 --max-tokens 2 --cuda-graph
[[ $rc == 1 && $out == *"CUDA graphs (--cuda-graph) need"* ]] || fail "--cuda-graph on the CPU: $out"
run generate --tokens 1,2,3 --max-tokens 2 --enforce-eager
[[ $rc == 0 ]] || fail "generate --enforce-eager on the CPU: exit status $rc: $out"
# --cuda-graph-sizes: contradicts --enforce-eager; refused where no graph runs (the CPU).
run serve --port 0 --cuda-graph-sizes 8,16 --enforce-eager
[[ $rc == 1 && $out == *"--cuda-graph-sizes and --enforce-eager contradict each other"* ]] || fail "--cuda-graph-sizes with --enforce-eager: $out"
run generate --tokens 1,2,3 --max-tokens 2 --cuda-graph-sizes 1,2
[[ $rc == 1 && $out == *"--cuda-graph-sizes needs CUDA graphs"*"on the CPU"* ]] || fail "--cuda-graph-sizes on the CPU: $out"
echo "startup_test: all checks passed"
