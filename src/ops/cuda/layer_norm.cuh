// LayerNorm of one row by one block (ops/norm.h's layer_norm: biased variance, two passes), shared
// by the layer_norm kernel (norm.cu) and the indexer's fused key write (indexer.cu), so both round
// alike: mean = Σ x / d, var = Σ (x − mean)² / d (block sums), r = rsqrtf(var + eps), and
// y_c = (x_c − mean) · r · w_c + b_c in F32, handed to out(c, y_c). Every thread of the block calls
// it (it holds block barriers); red is 32 floats of shared memory.
#pragma once

#include "ops/cuda/common.cuh"

namespace osprey::ops::cuda {

template <typename T, typename W, typename Out>
__device__ __forceinline__ void layer_norm_row(const T* x, const W* __restrict__ w,
                                               const W* __restrict__ b, int64_t d, float eps,
                                               float* red, Out out) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += to_f32(x[i]);
  const float mean = block_sum(s, red) / float(d);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = to_f32(x[i]) - mean;
    v += c * c;
  }
  const float r = rsqrtf(block_sum(v, red) / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    out(i, (to_f32(x[i]) - mean) * r * to_f32(w[i]) + to_f32(b[i]));
}

}  // namespace osprey::ops::cuda
