// Shared pieces of the CUDA twins: error checks, F32/BF16/e4m3 element access, dtype dispatch, the
// grow-only scratch arena, and a cuBLASLt matmul helper (runtime.cu).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/device_buffer.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/cuda/graph_hooks.h"

#define OSPREY_CUDA_CHECK(expr)                                           \
  do {                                                                    \
    const cudaError_t e_ = (expr);                                        \
    OSPREY_CHECK(e_ == cudaSuccess, #expr, ": ", cudaGetErrorString(e_)); \
  } while (0)
// After every launch: a launch-configuration error fails here, at the launch site.
#define OSPREY_CUDA_LAUNCH_CHECK() OSPREY_CUDA_CHECK(cudaGetLastError())

namespace osprey::ops::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(bf16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// An e4m3 byte (OCP e4m3fn, as core/dtype.h) as F32, exact.
__device__ __forceinline__ float e4m3_to_f32_dev(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(v), __NV_E4M3)));
}
// F32 → e4m3 byte, round to nearest even, saturating to ±448 (bit-identical to f32_to_e4m3).
__device__ __forceinline__ uint8_t f32_to_e4m3_dev(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// The scale of a 1×128 FP8 activation group from its largest |value|: amax / 448 (e4m3's largest
// finite value), 1 for an all-zero group; the CPU twin's rule (cpu::quantize_act_rows).
__device__ __forceinline__ float act_fp8_scale(float amax) {
  return amax > 0.0f ? amax / 448.0f : 1.0f;
}

// Four consecutive values as one aligned load / store (F32: 16 bytes, BF16: 8 bytes), in F32; a
// store rounds to the destination's type (exact where the values are that type's already).
__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
}
__device__ __forceinline__ void load4(const bf16* p, float (&v)[4]) {
  const uint2 t = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&t.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&t.y));
  v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(bf16* p, const float (&v)[4]) {
  uint2 t;
  *reinterpret_cast<__nv_bfloat162*>(&t.x) = __floats2bfloat162_rn(v[0], v[1]);
  *reinterpret_cast<__nv_bfloat162*>(&t.y) = __floats2bfloat162_rn(v[2], v[3]);
  *reinterpret_cast<uint2*>(p) = t;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
// `red` is 32 floats of shared memory; the call contains two barriers.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = lane < n_warps ? red[lane] : 0.0f;
  return warp_sum(s);
}

// Index of token t's sequence: the s with qsl[s] ≤ t < qsl[s + 1] (binary search).
__device__ __forceinline__ int seq_of_token(const int32_t* qsl, int n_seqs, int t) {
  int lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (qsl[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Host side ---------------------------------------------------------------------------------------

inline void check_device(const Tensor& t, const char* op, const char* name) {
  OSPREY_CHECK(t.device == Device::CUDA, op, ": ", name, " is not a CUDA tensor");
}
inline bool is_f32_or_bf16(DType d) {
  return d == DType::F32 || d == DType::BF16;
}
// Whether p's rows of d values of elem bytes each start on a `bytes` boundary (p itself, and
// d · elem a multiple); a null p (an absent operand) is.
inline bool rows_aligned(const void* p, int64_t d, int64_t elem, int64_t bytes) {
  return p == nullptr ||
         (reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0 && (d * elem) % bytes == 0);
}

// Runs `body` with T = float or bf16 according to dtype (anything else fails).
#define OSPREY_DISPATCH_FLOAT(dtype, T, ...)                                             \
  do {                                                                                   \
    if ((dtype) == ::osprey::DType::F32) {                                               \
      using T = float;                                                                   \
      __VA_ARGS__;                                                                       \
    } else if ((dtype) == ::osprey::DType::BF16) {                                       \
      using T = ::osprey::ops::cuda::bf16;                                               \
      __VA_ARGS__;                                                                       \
    } else {                                                                             \
      OSPREY_CHECK(false, "dtype ", ::osprey::dtype_name(dtype), " is not F32 or BF16"); \
    }                                                                                    \
  } while (0)

// The current device is a Hopper sm_90 part (the sm_90a kernels run on it), and its SM count.
bool device_is_sm90();
int sm_count();

// The stream every op runs on: the legacy default stream unless a cuda::StreamScope on this thread
// names another (core/device_buffer.h; a CUDA graph capture runs the ops on its own stream).
inline cudaStream_t stream() {
  return static_cast<cudaStream_t>(::osprey::cuda::current_stream());
}

// Scratch memory: one grow-only device allocation per slot, reused across calls. Growing
// synchronises the device (it frees the old allocation). Slots keep concurrent users apart.
enum ScratchSlot : int {
  kScratchGemmX,       // converted / quantized activations
  kScratchGemmXScale,  // per 1×128 activation scales
  kScratchGemmW,       // dequantized weights (fallback path)
  kScratchGemmY,       // GEMM output before conversion
  kScratchGemmSplit,   // split-K partial accumulators of the FP8 swap-AB GEMM
  kScratchMoeX8,       // experts' input quantised to e4m3 [n, D] | scales [n, D/128]
  kScratchMoeH8,       // experts' e4m3 silu(gate) ⊙ up [n·K, I] | scales [n·K, I/128]
  kScratchLtWorkspace,
  kScratchAttnPartO,   // split-KV partial outputs
  kScratchAttnPartML,  // split-KV partial (max, sum)
  kScratchIndexScores,
  kScratchGather,     // cumulative sequence starts
  kScratchMoeHidden,  // experts' silu(gate) ⊙ up [n·K, I] BF16
  kScratchMoeY,       // experts' outputs [n·K, D] F32, before the weighted combine
  kScratchMoeIndex,   // routing permutation, inverse, offsets, tile schedule
  // sampling: per-row keys and weights, [n_rows, vocab] each
  kScratchSampleKeys,
  kScratchSampleWeights,
  kScratchCount
};
void* scratch(ScratchSlot slot, size_t bytes);

cublasLtHandle_t lt_handle();

// One (optionally strided-batched) matmul in cuBLASLt's column-major terms:
//   D [m, n] = op(A) [m, k] · op(B) [k, n], F32 accumulation.
struct LtOperand {
  const void* ptr = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  bool trans = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  const float* scale = nullptr;  // block scales (FP8 only)
  int scale_mode = -1;           // cublasLtMatmulMatrixScale_t, −1 = none
};
// Returns false when cuBLASLt has no algorithm for the combination (nothing was launched).
bool lt_matmul(int64_t m, int64_t n, int64_t k, const LtOperand& a, const LtOperand& b, void* d,
               cudaDataType_t d_type, int64_t ldd, int64_t d_batch_stride, int batch);

// dst[i] = src[i] converted (F32 ↔ BF16, or a plain copy when the dtypes match), n elements.
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);

}  // namespace osprey::ops::cuda
