// The gated MLP activation: out [n, I] = silu(gate) ⊙ up, silu(g) = g / (1 + e^-g).
#pragma once

#include "core/tensor.h"

namespace osprey::ops {
void silu_mul(Tensor out, Tensor gate, Tensor up);
namespace cpu {
void silu_mul(Tensor out, Tensor gate, Tensor up);
}
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void silu_mul(Tensor out, Tensor gate, Tensor up);
}  // namespace cuda
}  // namespace osprey::ops
