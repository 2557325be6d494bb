// `osprey bench kernels --op mla`: each fast kernel alone on DeepSeek-V3.2's shapes, its FLOPs and
// bytes counted (BENCHMARKS.md, "Kernels alone"), timed with CUDA events (L2 flushed before each
// call, median), beside the card's ceilings measured in the same run, the CUDA-core kernels it
// replaces, and FlashMLA's figures on our H200 (../shared/reference/performance.md §8). Every
// shape's output is also checked against the CUDA-core kernel (itself tested against the CPU twin).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace osprey::bench {

struct KernelOptions {
  std::string op = "mla";
  int warmup = 5;
  int iters = 30;
  uint64_t seed = 1;
  bool baseline = true;     // also time the CUDA-core kernels on a few shapes
  bool quick = false;       // a few shapes only (smoke runs)
  std::vector<int64_t> ms;  // gemm, moe: the token counts (empty: each op's list)
  std::string mla_kernel;   // mla: only this kernel's shapes ("dense decode" ...; empty: all)
};

void run_kernel_benchmark(const KernelOptions& o);

}  // namespace osprey::bench
