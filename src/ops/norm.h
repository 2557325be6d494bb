// Normalisations, row-wise over the last dimension (rows = everything before it).
//   rms_norm:      out = w ⊙ x / sqrt(mean(x²) + eps)            (computed in F32)
//   add_rms_norm:  residual += x;  out = rms_norm(residual)       (the fused pre-norm residual)
//   layer_norm:    out = w ⊙ (x − mean) / sqrt(var + eps) + b      (biased variance)
#pragma once

#include "core/tensor.h"

namespace osprey::ops {
void rms_norm(Tensor out, Tensor x, Tensor w, float eps);
void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps);
void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps);
namespace cpu {
void rms_norm(Tensor out, Tensor x, Tensor w, float eps);
void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps);
void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void rms_norm(Tensor out, Tensor x, Tensor w, float eps);
void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps);
void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps);
}  // namespace cuda
}  // namespace osprey::ops
