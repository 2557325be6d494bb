// `osprey bench kernels --op gemm` and `--op moe` (BENCHMARKS.md, "Kernels alone"):
//   gemm: every FP8 projection of V3/V3.2 at M ∈ {1, 16, 64, 128, 256, 4096, 16384}, the path
//         osprey runs (its swap-AB kernel for M ≤ 128, else cuBLASLt) beside cuBLASLt's
//         block-scaled FP8 GEMM on the same call, GB/s and TFLOP/s beside the copy and FP8
//         ceilings measured in the same run, and the two outputs compared;
//   moe:  V3.2's routed-expert layer (256 experts, top-8 by its router) at decode (1–128 tokens)
//         and a 5,000-token prefill, osprey's path beside the WMMA grouped GEMMs.
// CUDA only; called from kernels.cpp.
#pragma once

#include "bench/kernels.h"

namespace osprey::bench {
void run_gemm_benchmarks(const KernelOptions& o, double copy_gbs);
}  // namespace osprey::bench
