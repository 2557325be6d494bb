// CUDA twins of ops/tensor_ops.h, grid-stride elementwise kernels (256 threads):
//   copy_columns_kernel: element (r, i) of the [R, width] block; F32/BF16 in any mix.
//   add_kernel, scale_kernel: F32 or BF16 (one dtype).
//   fill_uniform_kernel: splitmix64(seed ^ index) → uniform [lo, hi) → F32 / BF16 / e4m3.
#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/tensor_ops.h"

namespace osprey::ops::cuda {

namespace {
int grid_for(int64_t n) {
  return int(std::min<int64_t>((n + 255) / 256, 65536));
}

template <typename Td, typename Ts>
__global__ void copy_columns_kernel(Td* __restrict__ dst, int64_t wd, int64_t dst_col,
                                    const Ts* __restrict__ src, int64_t ws, int64_t src_col,
                                    int64_t width, int64_t rows, int64_t repeat) {
  pdl_wait();
  pdl_trigger();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < rows * width;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / width, i = e % width;
    dst[r * wd + dst_col + i] = from_f32<Td>(to_f32(src[(r / repeat) * ws + src_col + i]));
  }
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f32<T>(to_f32(x[i]) * s);
}

__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t i) {
  uint64_t z = seed ^ (i * 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__device__ __forceinline__ T from_f32_any(float x);
template <>
__device__ __forceinline__ float from_f32_any<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32_any<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_f32_any<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);
}

template <typename T>
__global__ void fill_uniform_kernel(T* x, int64_t n, uint64_t seed, float lo, float hi) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f32_any<T>(lo + (hi - lo) * uniform01(seed, uint64_t(i)));
}
}  // namespace

void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t width) {
  check_device(dst, "copy_columns", "dst");
  check_device(src, "copy_columns", "src");
  const int64_t wd = dst.size(-1), ws = src.size(-1);
  const int64_t rd = dst.numel() / wd, rs = src.numel() / ws;
  OSPREY_CHECK(rs > 0 && rd % rs == 0 && dst_col + width <= wd && src_col + width <= ws,
               "copy_columns: dst ", shape_str(dst.shape), " col ", dst_col, ", src ",
               shape_str(src.shape), " col ", src_col, ", width ", width);
  if (rd * width == 0) return;
  OSPREY_DISPATCH_FLOAT(dst.dtype, Td, OSPREY_DISPATCH_FLOAT(src.dtype, Ts, {
                          launch_pdl(copy_columns_kernel<Td, Ts>, grid_for(rd * width), 256, 0,
                                     static_cast<Td*>(dst.data), wd, dst_col,
                                     static_cast<const Ts*>(src.data), ws, src_col, width, rd,
                                     rd / rs);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

void add(Tensor out, Tensor a, Tensor b) {
  check_device(a, "add", "a");
  check_device(b, "add", "b");
  OSPREY_CHECK(out.numel() == a.numel() && a.numel() == b.numel() && out.dtype == a.dtype &&
                   a.dtype == b.dtype,
               "add shapes/dtypes");
  const int64_t n = out.numel();
  if (n == 0) return;
  OSPREY_DISPATCH_FLOAT(out.dtype, T, {
    launch_pdl(add_kernel<T>, grid_for(n), 256, 0, static_cast<T*>(out.data),
               static_cast<const T*>(a.data), static_cast<const T*>(b.data), n);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void scale(Tensor x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, {
    launch_pdl(scale_kernel<T>, grid_for(n), 256, 0, static_cast<T*>(x.data), s, n);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void fill_uniform(Tensor t, uint64_t seed, float lo, float hi) {
  check_device(t, "fill_uniform", "t");
  const int64_t n = t.numel();
  if (n == 0) return;
  if (t.dtype == DType::F8_E4M3) {
    launch_pdl(fill_uniform_kernel<__nv_fp8_e4m3>, grid_for(n), 256, 0,
               static_cast<__nv_fp8_e4m3*>(t.data), n, seed, lo, hi);
  } else {
    OSPREY_DISPATCH_FLOAT(t.dtype, T, {
      launch_pdl(fill_uniform_kernel<T>, grid_for(n), 256, 0, static_cast<T*>(t.data), n, seed, lo,
                 hi);
    });
  }
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
