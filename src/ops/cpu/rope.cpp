#include "ops/rope.h"

#include <cmath>

#include "core/error.h"

namespace osprey::ops::cpu {

void rope(Tensor x, int offset, int rope_dim, Tensor positions, Tensor inv_freq,
          float attention_factor, bool interleaved) {
  const int64_t n_tokens = x.size(0);
  const int64_t n_heads = x.dim() == 3 ? x.size(1) : 1;
  const int64_t head_dim = x.size(-1);
  const int half = rope_dim / 2;
  OSPREY_CHECK(
      offset + rope_dim <= head_dim && inv_freq.numel() == half && positions.numel() == n_tokens,
      "rope shapes");
  const int32_t* pos = positions.ptr<int32_t>();
  const float* f = inv_freq.f32();
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = float(pos[t]) * f[i];
      c[size_t(i)] = std::cos(angle) * attention_factor;
      s[size_t(i)] = std::sin(angle) * attention_factor;
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x.f32() + (t * n_heads + h) * head_dim + offset;
      for (int i = 0; i < half; ++i) {
        const int a = interleaved ? 2 * i : i;
        const int b = interleaved ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c[size_t(i)] - x1 * s[size_t(i)];
        v[b] = x1 * c[size_t(i)] + x0 * s[size_t(i)];
      }
    }
  }
}

}  // namespace osprey::ops::cpu
