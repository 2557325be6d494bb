#include <cmath>

#include "core/error.h"
#include "ops/activation.h"

namespace osprey::ops::cpu {

void silu_mul(Tensor out, Tensor gate, Tensor up) {
  OSPREY_CHECK(out.numel() == gate.numel() && gate.numel() == up.numel(), "silu_mul shapes");
  const float* g = gate.f32();
  const float* u = up.f32();
  float* o = out.f32();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace osprey::ops::cpu
