// CUDA rotary embedding, in place on x[t, h, offset : offset + rope_dim]:
//   angle_i = float(pos[t]) · inv_freq[i] (F32 product, as the CPU twin); c, s = cos, sin · factor
//   interleaved: (x[2i], x[2i+1]) rotate by angle_i;  half-split: (x[i], x[i + rope_dim/2]).
// x: [n_tokens, n_heads, head_dim] (or [n_tokens, head_dim]) F32 or BF16; positions [n_tokens] I32;
// inv_freq [rope_dim/2] F32 (all device tensors). Rotation in F32, one rounding on the store.
// Grid: one block per token, threads over (head, pair); precise cosf/sinf (no fast math).
#include "ops/cuda/common.cuh"
#include "ops/rope.h"

namespace osprey::ops::cuda {

namespace {
template <typename T>
__global__ void rope_kernel(T* x, const int32_t* __restrict__ pos, const float* __restrict__ inv_freq,
                            int64_t n_heads, int64_t head_dim, int offset, int half, float factor,
                            bool interleaved) {
  const int64_t t = blockIdx.x;
  const float p = float(pos[t]);
  for (int64_t k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
    const int64_t h = k / half;
    const int i = int(k % half);
    const float angle = p * inv_freq[i];
    const float c = cosf(angle) * factor, s = sinf(angle) * factor;
    T* v = x + (t * n_heads + h) * head_dim + offset;
    const int a = interleaved ? 2 * i : i;
    const int b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = to_f32(v[a]), x1 = to_f32(v[b]);
    v[a] = from_f32<T>(x0 * c - x1 * s);
    v[b] = from_f32<T>(x1 * c + x0 * s);
  }
}
}  // namespace

void rope(Tensor x, int offset, int rope_dim, Tensor positions, Tensor inv_freq,
          float attention_factor, bool interleaved) {
  check_device(positions, "rope", "positions");
  check_device(inv_freq, "rope", "inv_freq");
  const int64_t n_tokens = x.size(0);
  const int64_t n_heads = x.dim() == 3 ? x.size(1) : 1;
  const int64_t head_dim = x.size(-1);
  const int half = rope_dim / 2;
  OSPREY_CHECK(offset + rope_dim <= head_dim && inv_freq.numel() == half &&
                   positions.numel() == n_tokens && inv_freq.dtype == DType::F32,
               "rope shapes");
  if (n_tokens == 0) return;
  OSPREY_DISPATCH_FLOAT(x.dtype, T, {
    rope_kernel<T><<<unsigned(n_tokens), 256, 0, stream()>>>(
        static_cast<T*>(x.data), positions.ptr<int32_t>(), inv_freq.f32(), n_heads, head_dim,
        offset, half, attention_factor, interleaved);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
