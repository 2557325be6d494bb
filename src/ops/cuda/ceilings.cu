// Ceilings (contract in ops/ceilings.h).
//   copy_kernel: dst[i] = src[i] as 16-byte int4 loads/stores, grid-stride (132·8 blocks × 256);
//   the copy ceiling is the faster of it and cudaMemcpyAsync device to device.
//   bf16_gemm_tflops: cuBLASLt D = A·B, all BF16, F32 accumulation, uniform ±1 inputs.
//   fp8_gemm_tflops: the same with e4m3 A and B (per-tensor scales 1), BF16 D.
#include <algorithm>
#include <vector>

#include "ops/ceilings.h"
#include "ops/cuda/common.cuh"
#include "ops/tensor_ops.h"

namespace osprey::ops::cuda {

namespace {
__global__ void copy_kernel(int4* __restrict__ dst, const int4* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
}  // namespace

Timing time_events(const std::function<void()>& fn, int warmup, int iters, size_t flush_bytes) {
  void* flush = nullptr;
  if (flush_bytes) OSPREY_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  for (int i = 0; i < warmup; ++i) fn();
  OSPREY_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  OSPREY_CUDA_CHECK(cudaEventCreate(&a));
  OSPREY_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    // Evicts the inputs from L2 (a write over more than the L2), outside the timed region.
    if (flush) OSPREY_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream()));
    OSPREY_CUDA_CHECK(cudaEventRecord(a, stream()));
    fn();
    OSPREY_CUDA_CHECK(cudaEventRecord(b, stream()));
    OSPREY_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    OSPREY_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  OSPREY_CUDA_CHECK(cudaEventDestroy(a));
  OSPREY_CUDA_CHECK(cudaEventDestroy(b));
  if (flush) OSPREY_CUDA_CHECK(cudaFree(flush));
  std::sort(ms.begin(), ms.end());
  Timing r;
  r.iters = iters;
  r.median_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  r.min_ms = ms.empty() ? 0 : ms.front();
  r.max_ms = ms.empty() ? 0 : ms.back();
  return r;
}

double copy_bandwidth_gbs(size_t bytes) {
  const int64_t n = int64_t(bytes / sizeof(int4));
  int4 *src = nullptr, *dst = nullptr;
  OSPREY_CUDA_CHECK(cudaMalloc(&src, size_t(n) * sizeof(int4)));
  OSPREY_CUDA_CHECK(cudaMalloc(&dst, size_t(n) * sizeof(int4)));
  fill_uniform(Tensor{src, DType::F32, {n * 4}, Device::CUDA}, 7, -1.0f, 1.0f);
  const Timing t = time_events(
      [&] {
        copy_kernel<<<132 * 8, 256, 0, stream()>>>(dst, src, n);
        OSPREY_CUDA_LAUNCH_CHECK();
      },
      3, 20);
  const Timing m = time_events(
      [&] {
        OSPREY_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(int4),
                                          cudaMemcpyDeviceToDevice, stream()));
      },
      3, 20);
  OSPREY_CUDA_CHECK(cudaFree(src));
  OSPREY_CUDA_CHECK(cudaFree(dst));
  // The faster of the copy kernel and the driver's device-to-device copy (BENCHMARKS.md).
  return 2.0 * double(n) * sizeof(int4) / (std::min(t.median_ms, m.median_ms) * 1e-3) / 1e9;
}

void memory_info(size_t* free_bytes, size_t* total_bytes) {
  OSPREY_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

std::string device_name() {
  int dev = 0;
  OSPREY_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  OSPREY_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

double bf16_gemm_tflops(int n) {
  const int64_t nn = int64_t(n) * n;
  bf16 *a = nullptr, *b = nullptr, *d = nullptr;
  OSPREY_CUDA_CHECK(cudaMalloc(&a, size_t(nn) * sizeof(bf16)));
  OSPREY_CUDA_CHECK(cudaMalloc(&b, size_t(nn) * sizeof(bf16)));
  OSPREY_CUDA_CHECK(cudaMalloc(&d, size_t(nn) * sizeof(bf16)));
  fill_uniform(Tensor{a, DType::BF16, {nn}, Device::CUDA}, 11, -1.0f, 1.0f);
  fill_uniform(Tensor{b, DType::BF16, {nn}, Device::CUDA}, 13, -1.0f, 1.0f);
  const LtOperand oa{a, CUDA_R_16BF, true, n}, ob{b, CUDA_R_16BF, false, n};
  const Timing t = time_events(
      [&] {
        OSPREY_CHECK(lt_matmul(n, n, n, oa, ob, d, CUDA_R_16BF, n, 0, 1), "cuBLASLt BF16 GEMM");
      },
      3, 20);
  OSPREY_CUDA_CHECK(cudaFree(a));
  OSPREY_CUDA_CHECK(cudaFree(b));
  OSPREY_CUDA_CHECK(cudaFree(d));
  return 2.0 * double(n) * double(n) * double(n) / (t.median_ms * 1e-3) / 1e12;
}

double fp8_gemm_tflops(int n) {
  const int64_t nn = int64_t(n) * n;
  void *a = nullptr, *b = nullptr, *d = nullptr;
  OSPREY_CUDA_CHECK(cudaMalloc(&a, size_t(nn)));
  OSPREY_CUDA_CHECK(cudaMalloc(&b, size_t(nn)));
  OSPREY_CUDA_CHECK(cudaMalloc(&d, size_t(nn) * sizeof(bf16)));
  fill_uniform(Tensor{a, DType::F8_E4M3, {nn}, Device::CUDA}, 17, -1.0f, 1.0f);
  fill_uniform(Tensor{b, DType::F8_E4M3, {nn}, Device::CUDA}, 19, -1.0f, 1.0f);
  const LtOperand oa{a, CUDA_R_8F_E4M3, true, n}, ob{b, CUDA_R_8F_E4M3, false, n};
  const Timing t = time_events(
      [&] {
        OSPREY_CHECK(lt_matmul(n, n, n, oa, ob, d, CUDA_R_16BF, n, 0, 1), "cuBLASLt FP8 GEMM");
      },
      3, 20);
  OSPREY_CUDA_CHECK(cudaFree(a));
  OSPREY_CUDA_CHECK(cudaFree(b));
  OSPREY_CUDA_CHECK(cudaFree(d));
  return 2.0 * double(n) * double(n) * double(n) / (t.median_ms * 1e-3) / 1e12;
}

}  // namespace osprey::ops::cuda
