// The card's ceilings measured in the same run as a benchmark (BENCHMARKS.md), and event timing.
// CUDA only (ops/cuda/ceilings.cu); callers guard with OSPREY_WITH_CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace osprey::ops::cuda {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int iters = 0;
};
// Times fn with CUDA events around each call (after `warmup` untimed calls): median, min, max.
// flush_bytes > 0: a memset of that many bytes before each timed call (outside the events) evicts
// the inputs from L2, as FlashMLA's benchmarks do.
Timing time_events(const std::function<void()>& fn, int warmup, int iters, size_t flush_bytes = 0);

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written) over `bytes`-sized random
// buffers: the faster of a plain vectorised copy kernel and cudaMemcpyAsync; medians of 20.
double copy_bandwidth_gbs(size_t bytes);
// Free and total device memory in bytes.
void memory_info(size_t* free_bytes, size_t* total_bytes);
// The current device's name as CUDA reports it ("NVIDIA H200", "NVIDIA H100 80GB HBM3").
std::string device_name();
// BF16 matrix rate in TFLOP/s: n×n×n GEMM through cuBLASLt on random data; median of 20.
double bf16_gemm_tflops(int n);
// FP8 (e4m3) matrix rate in TFLOP/s: n×n×n through cuBLASLt, BF16 out; median of 20.
double fp8_gemm_tflops(int n);

}  // namespace osprey::ops::cuda
