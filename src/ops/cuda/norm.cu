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
// The RMS norms take rms_norm_vec_kernel where the row fits it (d a multiple of 4, at most
// kVecThreads · 4 · kMaxVecQuads values, every row pointer aligned to its 4-value load): the row
// held in registers, all of a thread's loads issued before the first is used. The strided kernels
// below it serve every other shape.
#include <cstdlib>
#include <string_view>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/layer_norm.cuh"
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
  pdl_wait();
  pdl_trigger();
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
  pdl_wait();
  pdl_trigger();
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
    const float sc = act_fp8_scale(amax);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      q[row * d + g * kFp8BlockSize + i * 32 + lane] = f32_to_e4m3_dev(v[i] / sc);
    if (lane == 0) s[row * s_row + g * s_group] = sc;
  }
}

// ---- the register-resident RMS norm ----
// Why: at decode a norm has few rows (B = 64 rows of 7168) and one block a row; the strided loops
// above issue one dependent 4-byte load per iteration and per pass, so each block waits out a DRAM
// latency ~28 times a pass (the H200 measured ~17 µs a launch at B = 64, 16 launches a step). Here
// a thread issues all its 16-byte loads (x, the residual, then w) at once and keeps its values in
// registers for the second pass: one latency a pass.
constexpr int kVecThreads = 256;  // 8 warps: a warp's 32 quads are one 128-value FP8 group
constexpr int kMaxVecQuads = 8;   // quads a thread: d ≤ 256 · 4 · 8 = 8192 (hidden 7168: 7)

// load4 / store4 (common.cuh): a thread's four consecutive values.

// rms_norm_multi_kernel's contract (out, ob, q/s, residual; the same expressions, so the same
// values up to the order of the sum of squares), for d a multiple of 4 with ⌈d/4/256⌉ ≤ K quads a
// thread. Thread t holds quads t, t + 256, ... (quad i = values 4i..4i+3): warp w's quads at step k
// are the 128-value group 8k + w, so with q a warp quantises its own group (d a multiple of 128).
// Grid: [rows_q] × kVecThreads; rows ≥ n are the Cols layout's padding (q zero, scale 1).
template <typename T, typename W, int K>
__global__ void __launch_bounds__(kVecThreads)
    rms_norm_vec_kernel(T* out, bf16* __restrict__ ob, uint8_t* __restrict__ q,
                        float* __restrict__ s, int64_t s_row, int64_t s_group, T* residual,
                        const T* x, const W* __restrict__ w, int64_t n, int64_t d, float eps) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31;
  const int quads = int(d / 4);
  if (row >= n) {  // padding (q only): the whole block takes this branch, no barrier follows
    for (int i = tid; i < quads; i += kVecThreads) {
      *reinterpret_cast<uint32_t*>(q + row * d + 4 * int64_t(i)) = 0u;
      if ((i & 31) == 0) s[row * s_row + (i >> 5) * s_group] = 1.0f;
    }
    return;
  }
  const T* xr = x + row * d;
  T* rr = residual ? residual + row * d : nullptr;
  float v[K][4];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = k * kVecThreads + tid;
    if (i < quads) load4(xr + 4 * i, v[k]);
  }
  if (rr) {  // rr += x, rounded to T: the stored sum is what is normalised
    float r4[K][4];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = k * kVecThreads + tid;
      if (i < quads) load4(rr + 4 * i, r4[k]);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = k * kVecThreads + tid;
      if (i >= quads) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) v[k][j] = to_f32(from_f32<T>(r4[k][j] + v[k][j]));
      store4(rr + 4 * i, v[k]);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (k * kVecThreads + tid < quads)
#pragma unroll
      for (int j = 0; j < 4; ++j) ss += v[k][j] * v[k][j];
  const float r = rsqrtf(block_sum(ss, red) / float(d) + eps);
  float wv[K][4];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = k * kVecThreads + tid;
    if (i < quads) load4(w + 4 * i, wv[k]);
  }
  T* o = out + row * d;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int i = k * kVecThreads + tid;
    if (i >= quads) continue;  // whole warps when d % 128 == 0 (the FP8 case)
    float y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) y[j] = to_f32(from_f32<T>(wv[k][j] * (v[k][j] * r)));
    store4(o + 4 * i, y);
    if (ob) store4(ob + row * d + 4 * i, y);
    if (q) {
      const float amax =
          warp_max(fmaxf(fmaxf(fabsf(y[0]), fabsf(y[1])), fmaxf(fabsf(y[2]), fabsf(y[3]))));
      const float sc = act_fp8_scale(amax);
      uint32_t packed = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) packed |= uint32_t(f32_to_e4m3_dev(y[j] / sc)) << (8 * j);
      *reinterpret_cast<uint32_t*>(q + row * d + 4 * int64_t(i)) = packed;
      if (lane == 0) s[row * s_row + (i >> 5) * s_group] = sc;
    }
  }
}

template <typename T, typename W>
__global__ void layer_norm_kernel(T* out, const T* x, const W* __restrict__ w,
                                  const W* __restrict__ b, int64_t d, float eps) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  T* o = out + row * d;
  layer_norm_row(x + row * d, w, b, d, eps, red,
                 [&](int64_t i, float y) { o[i] = from_f32<T>(y); });
}

// The shapes both launches take: w [d], out and residual (when given) as x.
void check_rms(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& w) {
  OSPREY_CHECK(w.numel() == x.size(-1) && out.numel() == x.numel() && out.dtype == x.dtype,
               "rms_norm shapes");
  OSPREY_CHECK(
      residual.data == nullptr || (residual.numel() == x.numel() && residual.dtype == x.dtype),
      "add_rms_norm residual");
}

// OSPREY_NORM_VEC=0 sends every RMS norm to the strided kernels (the A/B of `bench step`); read
// once, anything but 0 or 1 is an error.
bool vec_norms_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("OSPREY_NORM_VEC");
    if (e == nullptr || *e == 0) return true;
    const std::string_view v(e);
    OSPREY_CHECK(v == "0" || v == "1", "OSPREY_NORM_VEC must be 0 or 1, not '", v, "'");
    return v == "1";
  }();
  return on;
}

// The register-resident kernel where the shape and pointers allow it (see the file's comment);
// returns false, launching nothing, where they do not. q given: d is a multiple of 128 (checked).
bool launch_rms_vec(Tensor out, bf16* ob, uint8_t* q, float* s, int64_t s_row, int64_t s_group,
                    Tensor residual, Tensor x, Tensor w, int64_t n, int64_t rows, float eps) {
  const int64_t d = x.size(-1);
  if (!vec_norms_enabled() || d % 4 != 0 || d > int64_t(kVecThreads) * 4 * kMaxVecQuads)
    return false;
  const int64_t e = dtype_size(x.dtype), we = dtype_size(w.dtype);
  if (!rows_aligned(out.data, d, e, 4 * e) || !rows_aligned(residual.data, d, e, 4 * e) ||
      !rows_aligned(x.data, d, e, 4 * e) || !rows_aligned(w.data, d, we, 4 * we) ||
      !rows_aligned(ob, d, 2, 8) || !rows_aligned(q, d, 1, 4))
    return false;
  const int64_t per = (d / 4 + kVecThreads - 1) / kVecThreads;  // quads a thread, 1..8
  const int k = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 8;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, OSPREY_DISPATCH_FLOAT(w.dtype, W, {
                          auto* kern = k == 1   ? rms_norm_vec_kernel<T, W, 1>
                                       : k == 2 ? rms_norm_vec_kernel<T, W, 2>
                                       : k == 4 ? rms_norm_vec_kernel<T, W, 4>
                                                : rms_norm_vec_kernel<T, W, 8>;
                          launch_pdl(kern, unsigned(rows), kVecThreads, 0,
                                     static_cast<T*>(out.data), ob, q, s, s_row, s_group,
                                     static_cast<T*>(residual.data), static_cast<const T*>(x.data),
                                     static_cast<const W*>(w.data), n, d, eps);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
  return true;
}

void launch_rms(Tensor out, Tensor residual, Tensor x, Tensor w, float eps) {
  const int64_t d = x.size(-1), n = x.numel() / d;
  check_rms(out, residual, x, w);
  if (n == 0) return;
  if (launch_rms_vec(out, nullptr, nullptr, nullptr, 0, 0, residual, x, w, n, n, eps)) return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, OSPREY_DISPATCH_FLOAT(w.dtype, W, {
                          launch_pdl(rms_norm_kernel<T, W>, unsigned(n), kThreads, 0,
                                     static_cast<T*>(out.data), static_cast<T*>(residual.data),
                                     static_cast<const T*>(x.data), static_cast<const W*>(w.data),
                                     d, eps);
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
  if (launch_rms_vec(out, static_cast<bf16*>(no.bf16.data),
                     static_cast<uint8_t*>(no.fp8.empty() ? nullptr : no.fp8.q.data),
                     no.fp8.empty() ? nullptr : no.fp8.s.f32(), s_row, s_group, residual, x, w, n,
                     rows, eps))
    return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, OSPREY_DISPATCH_FLOAT(w.dtype, W, {
                          launch_pdl(
                              rms_norm_multi_kernel<T, W>, unsigned(rows), kThreads, 0,
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
                          launch_pdl(layer_norm_kernel<T, W>, unsigned(n), kThreads, 0,
                                     static_cast<T*>(out.data), static_cast<const T*>(x.data),
                                     static_cast<const W*>(w.data), static_cast<const W*>(b.data),
                                     d, eps);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
