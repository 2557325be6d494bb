#include "ops/rope.h"

#include <algorithm>
#include <cmath>

namespace osprey {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  // In F32 as transformers builds it: base^(2i/d) in float, then 1/x.
  const int dim = c.qk_rope_head_dim;
  const float base = float(c.rope.theta);
  std::vector<float> inv(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i)
    inv[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(dim));
  if (!c.rope.yarn) return inv;
  // YaRN: blend interpolated (÷factor) and original frequencies over a linear ramp between the
  // dims whose wavelengths complete beta_fast and beta_slow rotations in the original context.
  const double L0 = double(c.rope.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(L0 / (rotations * 2 * M_PI)) / (2 * std::log(c.rope.theta));
  };
  double low = std::floor(correction_dim(c.rope.beta_fast));
  double high = std::ceil(correction_dim(c.rope.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  float lo = float(low), hi = float(high);
  if (lo == hi) hi += 0.001f;
  const float factor = float(c.rope.factor);
  for (int i = 0; i < dim / 2; ++i) {
    const float ramp = std::clamp((float(i) - lo) / (hi - lo), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    const float pos_freq = std::pow(base, float(2 * i) / float(dim));
    const float inv_extra = 1.0f / pos_freq;
    const float inv_inter = 1.0f / (factor * pos_freq);
    inv[size_t(i)] = inv_inter * (1.0f - extrapolation_factor) + inv_extra * extrapolation_factor;
  }
  return inv;
}

}  // namespace osprey
