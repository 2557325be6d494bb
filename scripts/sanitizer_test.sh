#!/usr/bin/env bash
# The sanitizer runs of CI (clang; the main build is g++):
#   asan  everything built with AddressSanitizer + UndefinedBehaviorSanitizer (every report fatal)
#         and libFuzzer coverage into build-asan/; the whole ctest suite there, the fuzz targets
#         included (each for OSPREY_FUZZ_SECONDS, default 30; tests/CMakeLists.txt).
#   tsan  the engine and the server built with ThreadSanitizer into build-tsan/; the concurrency
#         tests there: AsyncEngine's threads test, the async-scheduling tests (the forward on the
#         step executor's worker), the HTTP connection tests (clients that go away while a write
#         is blocked) and every live-server test (io threads, the engine thread, streams, aborts,
#         shutdown).
#   scripts/sanitizer_test.sh [asan|tsan|all (default)]
# Each build is configured once and reused by its tests (and by a later run, incrementally).
# Prints the time each phase took. Needs clang++ and libclang-rt-14-dev (scripts/install_deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
jobs=$(nproc)
cxx=$(command -v clang++-14 || command -v clang++)
cc=$(command -v clang-14 || command -v clang)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# -O1: fast enough for the model tests, and ASan's reports keep their lines.
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g"
        -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc"
        -DOSPREY_CUDA=OFF "${launcher[@]}")
# One OpenBLAS thread: its own threads are not instrumented (TSan cannot see their
# synchronisation) and the tests run in parallel anyway.
export OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:history_size=4

phase() {
  local name=$1
  shift
  local t0=$SECONDS
  "$@"
  echo "sanitizer_test: $name took $((SECONDS - t0)) s"
}

if [[ $what == asan || $what == all ]]; then
  phase "asan configure+build" bash -c '
    cmake -S . -B build-asan "$@" -DOSPREY_SANITIZE=address -DOSPREY_FUZZ=ON >/dev/null
    cmake --build build-asan -j'"$jobs" _ "${common[@]}"
  # tokenizer_fuzz builds its own ASan+UBSan fuzzer and already runs in the main build.
  rm -f build-asan/fuzz/fuzz_summary.txt
  phase "asan ctest" ctest --test-dir build-asan --output-on-failure -j"$jobs" -E '^tokenizer_fuzz$'
  cat build-asan/fuzz/fuzz_summary.txt 2>/dev/null | tail -n 4 || true
fi

if [[ $what == tsan || $what == all ]]; then
  phase "tsan configure+build" bash -c '
    cmake -S . -B build-tsan "$@" -DOSPREY_SANITIZE=thread >/dev/null
    cmake --build build-tsan -j'"$jobs"' --target osprey test_engine test_async_scheduling test_http_server' _ "${common[@]}"
  phase "tsan ctest" ctest --test-dir build-tsan --output-on-failure -j"$jobs" \
    -R '^(AsyncEngine\.|Devices/AsyncScheduling\.|HttpServerTest\.|server_)'
fi
