// DeepSeek-V3/V3.2's FP8 linear projections at TP1, [out, in] as in the checkpoint: the shapes the
// FP8 GEMM twin tests (tests/ops/test_cuda_fp8_gemm) and `osprey bench kernels --op gemm` run.
#pragma once

#include <cstdint>

namespace osprey {

struct Fp8Projection {
  int64_t out, in;
  const char* what;
};
inline constexpr Fp8Projection kV32Fp8Projections[] = {{1536, 7168, "q_a_proj"},
                                                       {24576, 1536, "q_b_proj"},
                                                       {576, 7168, "kv_a_proj"},
                                                       {32768, 512, "kv_b_proj"},
                                                       {7168, 16384, "o_proj"},
                                                       {18432, 7168, "dense mlp gate"},
                                                       {7168, 18432, "dense mlp down"},
                                                       {2048, 7168, "shared expert gate"},
                                                       {7168, 2048, "shared expert down"},
                                                       {8192, 1536, "indexer wq_b"},
                                                       {128, 7168, "indexer wk"}};

}  // namespace osprey
