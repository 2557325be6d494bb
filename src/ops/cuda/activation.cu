// CUDA gated activation: out [n, I] = silu(gate) ⊙ up, silu(g) = g / (1 + e^-g), in F32.
//   gate, up, out: F32 or BF16, all one dtype; out may alias gate or up (elementwise).
//   Grid: grid-stride over elements, 256 threads.
// silu_mul_multi: the same values, and their FP8 quantisation for the down projection
//   (silu_mul_quant_kernel below: the quantize kernel of the FP8 linear that reads out, fused).
#include "ops/activation.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/gemm.h"

namespace osprey::ops::cuda {

namespace {
template <typename T>
__global__ void silu_mul_kernel(T* out, const T* gate, const T* up, int64_t n) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]);
    out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(up[i]));
  }
}
// out [n, I] = silu(gate) ⊙ up (silu_mul_kernel's expression: the same values), and
// q [rows_q, I] e4m3, s: out per 1×128 group, s = amax/448 (1 for a zero group), q = e4m3(out/s)
// (f32_to_e4m3_dev, as the GEMM paths' quantize kernels), the scale of (t, g) at
// s[t·s_row + g·s_group] (Rows: I/128, 1; Cols: 1, rows_q). Rows t ≥ n (Cols padding): zero bytes,
// scale 1. I a multiple of 128. Grid: [rows_q, ceil(I/128 / 8)] × 256 threads, a warp per group
// (4 values a lane). out may alias gate or up (each element read and written by one thread).
constexpr int kQuantGroupsPerBlock = 8;
template <typename T>
__global__ void silu_mul_quant_kernel(T* out, uint8_t* __restrict__ q, float* __restrict__ s,
                                      int64_t s_row, int64_t s_group, const T* gate, const T* up,
                                      int64_t n, int64_t I) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const int64_t g = int64_t(blockIdx.y) * kQuantGroupsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (g >= I / kFp8BlockSize) return;
  const int64_t c0 = row * I + g * kFp8BlockSize + lane;
  if (row >= n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) q[c0 + i * 32] = 0;
    if (lane == 0) s[row * s_row + g * s_group] = 1.0f;
    return;
  }
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float gv = to_f32(gate[c0 + i * 32]);
    const T h = from_f32<T>(gv / (1.0f + expf(-gv)) * to_f32(up[c0 + i * 32]));
    out[c0 + i * 32] = h;
    v[i] = to_f32(h);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  const float sc = act_fp8_scale(amax);
#pragma unroll
  for (int i = 0; i < 4; ++i) q[c0 + i * 32] = f32_to_e4m3_dev(v[i] / sc);
  if (lane == 0) s[row * s_row + g * s_group] = sc;
}
}  // namespace

void silu_mul_multi(Tensor out, const Fp8Act& q8, Tensor gate, Tensor up) {
  if (q8.empty()) return silu_mul(out, gate, up);
  check_device(gate, "silu_mul_multi", "gate");
  check_device(up, "silu_mul_multi", "up");
  check_device(q8.q, "silu_mul_multi", "q8");
  OSPREY_CHECK(out.numel() == gate.numel() && gate.numel() == up.numel() &&
                   out.dtype == gate.dtype && gate.dtype == up.dtype,
               "silu_mul shapes/dtypes");
  const int64_t I = out.size(-1), n = out.numel() / std::max<int64_t>(I, 1);
  const int64_t rows = fp8_act_rows(q8, n, I, "silu_mul_multi");
  if (rows == 0) return;
  const bool by_rows = q8.layout == Fp8Layout::Rows;
  const int64_t groups = I / kFp8BlockSize;
  const dim3 grid(unsigned(rows),
                  unsigned((groups + kQuantGroupsPerBlock - 1) / kQuantGroupsPerBlock));
  OSPREY_DISPATCH_FLOAT(out.dtype, T, {
    launch_pdl(silu_mul_quant_kernel<T>, grid, 32 * kQuantGroupsPerBlock, 0,
               static_cast<T*>(out.data), q8.q.ptr<uint8_t>(), q8.s.f32(), by_rows ? groups : 1,
               by_rows ? 1 : rows, static_cast<const T*>(gate.data), static_cast<const T*>(up.data),
               n, I);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void silu_mul(Tensor out, Tensor gate, Tensor up) {
  check_device(gate, "silu_mul", "gate");
  check_device(up, "silu_mul", "up");
  OSPREY_CHECK(out.numel() == gate.numel() && gate.numel() == up.numel() &&
                   out.dtype == gate.dtype && gate.dtype == up.dtype,
               "silu_mul shapes/dtypes");
  const int64_t n = out.numel();
  if (n == 0) return;
  const int blocks = int(std::min<int64_t>((n + 255) / 256, 65536));
  OSPREY_DISPATCH_FLOAT(out.dtype, T, {
    launch_pdl(silu_mul_kernel<T>, blocks, 256, 0, static_cast<T*>(out.data),
               static_cast<const T*>(gate.data), static_cast<const T*>(up.data), n);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
