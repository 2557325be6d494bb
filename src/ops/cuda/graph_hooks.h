// What a CUDA graph runner (engine/cuda_graph_runner.h) must know about the CUDA twins' own device
// state, in plain C++ (no CUDA types), and what a bench reports of it.
//
// A captured graph holds raw device pointers: the scratch arena's slots (common.cuh), the split-KV
// plan buffer (mla/split_kv.cu), the MoE expert tables (moe.cu) and the FP8 swap-AB split-K
// counters (gemm/fp8_swapab.cu). Each is grow-only: a larger eager call (a prefill) frees the old
// allocation and takes a bigger one, and a graph captured before would then read freed memory.
// Every such reallocation bumps device_memory_epoch(); a runner compares it with the epoch of its
// captures before each replay and re-captures when it changed (rare: the arenas only grow).
#pragma once

#include <cstdint>

namespace osprey::ops::cuda {

// Bumped whenever one of the twins' persistent device allocations is replaced.
uint64_t device_memory_epoch();
void bump_device_memory_epoch();  // for the twins' growth sites

// The split-KV plan cache (mla/split_kv.cu) is keyed on the host batch fingerprint. A graph
// replay rebuilds the plan on the device into the same buffer (the runner forgets the cache
// before each capture, so layer 0's plan kernel is a node of the graph); after a replay the cached
// key no longer describes the buffer's contents, so the runner forgets it here too.
void invalidate_mla_plan_cache();

// cuBLASLt's algorithm choices (runtime.cu's lt_matmul: per GEMM, the first heuristic candidate
// whose matmul captures as kernel nodes only, no memset).
struct LtAlgoStats {
  int64_t gemms = 0;              // distinct GEMMs chosen for (and kept)
  int64_t later_choice = 0;       // of them, where the heuristic's first held a memset (or other)
                                  // node and a later candidate was taken
  int64_t no_clean_choice = 0;    // of them, where no candidate captured as kernels only (the
                                  // heuristic's first is used: a memset node in any graph of it)
  int64_t unkept_in_capture = 0;  // first seen inside a capture: the heuristic's first, unkept
};
LtAlgoStats lt_algo_stats();

}  // namespace osprey::ops::cuda
