// CUDA normalisations, one block per row (rows = everything before the last dimension, width d):
//   rms_norm:     out = w ⊙ x / sqrt(mean(x²) + eps)
//   add_rms_norm: residual += x (stored in residual's dtype); out = rms_norm(residual)
//   layer_norm:   out = w ⊙ (x − mean) / sqrt(var + eps) + b (biased variance, two passes)
// Dtypes: x, residual, out one of F32 / BF16 (all the same); w, b F32 or BF16. Statistics in F32.
// Grid: [rows], 256 threads striding over d; out may alias x.
#include "ops/cuda/common.cuh"
#include "ops/norm.h"

namespace osprey::ops::cuda {

namespace {
constexpr int kThreads = 256;

template <typename T, typename W>
__global__ void rms_norm_kernel(T* out, T* residual, const T* x, const W* __restrict__ w,
                                int64_t d, float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  T* rr = residual ? residual + row * d : nullptr;
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
  const float r = rsqrtf(block_sum(ss, red) / float(d) + eps);
  const T* src = rr ? rr : xr;
  T* o = out + row * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    o[i] = from_f32<T>(to_f32(w[i]) * (to_f32(src[i]) * r));
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

void launch_rms(Tensor out, Tensor residual, Tensor x, Tensor w, float eps) {
  const int64_t d = x.size(-1), n = x.numel() / d;
  OSPREY_CHECK(w.numel() == d && out.numel() == x.numel() && out.dtype == x.dtype, "rms_norm shapes");
  OSPREY_CHECK(residual.data == nullptr ||
                   (residual.numel() == x.numel() && residual.dtype == x.dtype),
               "add_rms_norm residual");
  if (n == 0) return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, OSPREY_DISPATCH_FLOAT(w.dtype, W, {
    rms_norm_kernel<T, W><<<unsigned(n), kThreads, 0, stream()>>>(
        static_cast<T*>(out.data), static_cast<T*>(residual.data), static_cast<const T*>(x.data),
        static_cast<const W*>(w.data), d, eps);
  }));
  OSPREY_CUDA_LAUNCH_CHECK();
}
}  // namespace

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
        static_cast<T*>(out.data), static_cast<const T*>(x.data), static_cast<const W*>(w.data),
        static_cast<const W*>(b.data), d, eps);
  }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
