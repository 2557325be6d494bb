// The gated MLP activation: out [n, I] = silu(gate) ⊙ up, silu(g) = g / (1 + e^-g).
#pragma once

#include "core/tensor.h"

namespace osprey::ops {
void silu_mul(Tensor out, Tensor gate, Tensor up);
namespace cpu {
void silu_mul(Tensor out, Tensor gate, Tensor up);
}
}  // namespace osprey::ops
