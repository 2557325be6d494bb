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

void silu_mul_multi(Tensor out, const Fp8Act& q8, Tensor gate, Tensor up) {
  silu_mul(out, gate, up);
  if (q8.empty()) return;
  const int64_t I = out.size(-1);
  write_fp8_act(q8, out.f32(), out.numel() / I, I);
}

}  // namespace osprey::ops::cpu
