// CUDA normalisations, one block per row (rows = everything before the last dimension, width d):
//   rms_norm:     out = w ⊙ x / sqrt(mean(x²) + eps)
//   add_rms_norm: residual += x (stored in residual's dtype); out = rms_norm(residual)
//   layer_norm:   out = w ⊙ (x − mean) / sqrt(var + eps) + b (biased variance, two passes)
// Dtypes: x, residual, out one of F32 / BF16 (all the same); w, b F32 or BF16. Statistics in F32.
// Grid: [rows], 256 threads striding over d; out may alias x.
//   rms_norm_multi / add_rms_norm_multi (NormOutputs, ops/norm.h): the same norm, and from each
//   value written to out also its BF16 rounding and/or its FP8 quantisation (rms_norm_multi_kernel
//   below): the BF16 GEMM's convert kernel and the FP8 linears' quantize kernel of out, fused into
//   the norm.
#include "ops/cuda/common.cuh"
#include "ops/gemm.h"
#include "ops/norm.h"

namespace osprey::ops::cuda {

namespace {
constexpr int kThreads = 256;

// The first pass of both RMS norms over one row of d values: with a residual row rr, rr += xr (the
// sum rounded to T is what is stored and what is normalised); returns r = 1/sqrt(mean(src²) + eps)
// and sets src to the row the second pass reads (rr after the add, else xr). block_sum's barriers
// order this block's residual stores before any thread's second-pass reads.
template <typename T>
__device__ __forceinline__ float rms_first_pass(const T*& src, T* rr, const T* xr, int64_t d,
                                                float eps, float* red) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float v = to_f32(xr[i]);
    if (rr) {
      const T sum = from_f32<T>(to_f32(rr[i]) + v);
      rr[i] = sum;
      v = to_f32(sum);
    }
    ss += v * v;
  }
  src = rr ? rr : xr;
  return rsqrtf(block_sum(ss, red) / float(d) + eps);
}

template <typename T, typename W>
__global__ void rms_norm_kernel(T* out, T* residual, const T* x, const W* __restrict__ w, int64_t d,
                                float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* src = nullptr;
  const float r =
      rms_first_pass(src, residual ? residual + row * d : nullptr, x + row * d, d, eps, red);
  T* o = out + row * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    o[i] = from_f32<T>(to_f32(w[i]) * (to_f32(src[i]) * r));
}

// rms_norm_kernel with the extras of NormOutputs.
//   out [n, d] = w ⊙ src / sqrt(mean(src²) + eps), src = x, or residual after residual += x (as
//   rms_norm_kernel, the same expressions: the same values); ob [n, d] BF16 = RN(out) when given;
//   q [rows_q, d] e4m3, s: out per 1×128 group, s = amax/448 (1 for a zero group), q = e4m3(out/s)
//   (satfinite RN: f32_to_e4m3_dev, as both GEMM paths' quantize kernels), the scale of (t, g) at
//   s[t·s_row + g·s_group] (Rows: s_row = d/128, s_group = 1; Cols: 1, rows_q).
// Grid: [rows_q] × 256 threads (8 warps). Rows t ≥ n (the Cols layout's token padding, rows_q ≥ n)
// write zero bytes and scale 1 only. With q the second pass is a warp per 128-group, 4 values a
// lane (d a multiple of 128); without q it strides over d as rms_norm_kernel. out may alias x.
template <typename T, typename W>
__global__ void rms_norm_multi_kernel(T* out, bf16* __restrict__ ob, uint8_t* __restrict__ q,
                                      float* __restrict__ s, int64_t s_row, int64_t s_group,
                                      T* residual, const T* x, const W* __restrict__ w, int64_t n,
                                      int64_t d, float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int64_t groups = d / kFp8BlockSize;
  if (row >= n) {  // padding (q only): the whole block takes this branch, no barrier follows
    for (int64_t g = warp; g < groups; g += n_warps) {
#pragma unroll
      for (int i = 0; i < 4; ++i) q[row * d + g * kFp8BlockSize + i * 32 + lane] = 0;
      if (lane == 0) s[row * s_row + g * s_group] = 1.0f;
    }
    return;
  }
  const T* src = nullptr;
  const float r =
      rms_first_pass(src, residual ? residual + row * d : nullptr, x + row * d, d, eps, red);
  T* o = out + row * d;
  if (q == nullptr) {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T v = from_f32<T>(to_f32(w[i]) * (to_f32(src[i]) * r));
      o[i] = v;
      if (ob) ob[row * d + i] = __float2bfloat16_rn(to_f32(v));
    }
    return;
  }
  for (int64_t g = warp; g < groups; g += n_warps) {
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t c = g * kFp8BlockSize + i * 32 + lane;
      const T y = from_f32<T>(to_f32(w[c]) * (to_f32(src[c]) * r));
      o[c] = y;
      v[i] = to_f32(y);
      if (ob) ob[row * d + c] = __float2bfloat16_rn(v[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = warp_max(amax);
    const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      q[row * d + g * kFp8BlockSize + i * 32 + lane] = f32_to_e4m3_dev(v[i] / sc);
    if (lane == 0) s[row * s_row + g * s_group] = sc;
  }
}

template <typename T, typename W>
__global__ void layer_norm_kernel(T* out, const T* x, const W* __restrict__ w,
                                  const W* __restrict__ b, int64_t d, float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += to_f32(xr[i]);
  const float mean = block_sum(s, red) / float(d);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = to_f32(xr[i]) - mean;
    v += c * c;
  }
  const float r = rsqrtf(block_sum(v, red) / float(d) + eps);
  T* o = out + row * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    o[i] = from_f32<T>((to_f32(xr[i]) - mean) * r * to_f32(w[i]) + to_f32(b[i]));
}

// The shapes both launches take: w [d], out and residual (when given) as x.
void check_rms(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& w) {
  OSPREY_CHECK(w.numel() == x.size(-1) && out.numel() == x.numel() && out.dtype == x.dtype,
               "rms_norm shapes");
  OSPREY_CHECK(
      residual.data == nullptr || (residual.numel() == x.numel() && residual.dtype == x.dtype),
      "add_rms_norm residual");
}

void launch_rms(Tensor out, Tensor residual, Tensor x, Tensor w, float eps) {
  const int64_t d = x.size(-1), n = x.numel() / d;
  check_rms(out, residual, x, w);
  if (n == 0) return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, OSPREY_DISPATCH_FLOAT(w.dtype, W, {
                          rms_norm_kernel<T, W><<<unsigned(n), kThreads, 0, stream()>>>(
                              static_cast<T*>(out.data), static_cast<T*>(residual.data),
                              static_cast<const T*>(x.data), static_cast<const W*>(w.data), d, eps);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}
void launch_rms_multi(const NormOutputs& no, Tensor residual, Tensor x, Tensor w, float eps) {
  if (no.bf16.data == nullptr && no.fp8.empty()) return launch_rms(no.out, residual, x, w, eps);
  const Tensor& out = no.out;
  const int64_t d = x.size(-1), n = x.numel() / d;
  check_rms(out, residual, x, w);
  if (no.bf16.data) {
    check_device(no.bf16, "rms_norm_multi", "bf16");
    OSPREY_CHECK(no.bf16.dtype == DType::BF16 && no.bf16.numel() == n * d, "rms_norm_multi bf16 ",
                 shape_str(no.bf16.shape));
  }
  int64_t rows = n, s_row = 0, s_group = 0;
  if (!no.fp8.empty()) {
    check_device(no.fp8.q, "rms_norm_multi", "fp8.q");
    rows = fp8_act_rows(no.fp8, n, d, "rms_norm_multi");
    const bool by_rows = no.fp8.layout == Fp8Layout::Rows;
    s_row = by_rows ? d / kFp8BlockSize : 1;
    s_group = by_rows ? 1 : rows;
  }
  if (rows == 0) return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, OSPREY_DISPATCH_FLOAT(w.dtype, W, {
                          rms_norm_multi_kernel<T, W><<<unsigned(rows), kThreads, 0, stream()>>>(
                              static_cast<T*>(out.data), static_cast<bf16*>(no.bf16.data),
                              static_cast<uint8_t*>(no.fp8.empty() ? nullptr : no.fp8.q.data),
                              no.fp8.empty() ? nullptr : no.fp8.s.f32(), s_row, s_group,
                              static_cast<T*>(residual.data), static_cast<const T*>(x.data),
                              static_cast<const W*>(w.data), n, d, eps);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}
}  // namespace

void rms_norm_multi(const NormOutputs& o, Tensor x, Tensor w, float eps) {
  check_device(x, "rms_norm_multi", "x");
  check_device(w, "rms_norm_multi", "w");
  launch_rms_multi(o, Tensor{}, x, w, eps);
}

void add_rms_norm_multi(const NormOutputs& o, Tensor residual, Tensor x, Tensor w, float eps) {
  check_device(x, "add_rms_norm_multi", "x");
  check_device(residual, "add_rms_norm_multi", "residual");
  check_device(w, "add_rms_norm_multi", "w");
  launch_rms_multi(o, residual, x, w, eps);
}

void rms_norm(Tensor out, Tensor x, Tensor w, float eps) {
  check_device(x, "rms_norm", "x");
  check_device(w, "rms_norm", "w");
  launch_rms(out, Tensor{}, x, w, eps);
}

void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps) {
  check_device(x, "add_rms_norm", "x");
  check_device(residual, "add_rms_norm", "residual");
  check_device(w, "add_rms_norm", "w");
  launch_rms(out, residual, x, w, eps);
}

void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps) {
  check_device(x, "layer_norm", "x");
  check_device(w, "layer_norm", "w");
  check_device(b, "layer_norm", "b");
  const int64_t d = x.size(-1), n = x.numel() / d;
  OSPREY_CHECK(w.numel() == d && b.numel() == d && b.dtype == w.dtype && out.numel() == x.numel() &&
                   out.dtype == x.dtype,
               "layer_norm shapes");
  if (n == 0) return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, OSPREY_DISPATCH_FLOAT(w.dtype, W, {
                          layer_norm_kernel<T, W><<<unsigned(n), kThreads, 0, stream()>>>(
                              static_cast<T*>(out.data), static_cast<const T*>(x.data),
                              static_cast<const W*>(w.data), static_cast<const W*>(b.data), d, eps);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
