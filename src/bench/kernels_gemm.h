// `osprey bench kernels --op gemm` and `--op moe` (BENCHMARKS.md, "Kernels alone"):
//   gemm: every FP8 projection of V3/V3.2 at M ∈ {1, 16, 64, 128, 256, 4096, 16384}, the path
//         osprey runs (its swap-AB kernel for M ≤ 128, else cuBLASLt) beside cuBLASLt's
//         block-scaled FP8 GEMM on the same call, GB/s and TFLOP/s beside the copy and FP8
//         ceilings measured in the same run, and the two outputs compared;
//   moe:  V3.2's routed-expert layer (256 experts, top-8 by its router) at decode (1–128 tokens)
//         and a 5,000-token prefill, osprey's path beside the WMMA grouped GEMMs.
// CUDA only; called from kernels.cpp.
#pragma once

#include <cstddef>

#include "bench/kernels.h"
#include "core/tensor.h"

namespace osprey::bench {
// Written before every timed call (time_events' flush): more than the H200's 60 MB L2.
constexpr size_t kKernelFlushBytes = size_t(512) << 20;
// Relative L2 distance of two BF16 host tensors of one shape (infinite when a has a non-finite
// value): the benchmarks' check of one kernel's output against another's.
double rel_l2_bf16(const Buffer& a, const Buffer& b);

void run_gemm_benchmarks(const KernelOptions& o, double copy_gbs);
}  // namespace osprey::bench
