#include "bench/arrivals.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace osprey::bench {

std::vector<double> arrival_times(size_t n, const ArrivalOptions& o) {
  if (!(o.request_rate > 0)) fail("--request-rate must be > 0 (or inf), got ", o.request_rate);
  if (!(o.burstiness > 0)) fail("--burstiness must be > 0, got ", o.burstiness);
  std::vector<double> t(n, 0.0);
  if (std::isinf(o.request_rate)) return t;
  std::mt19937_64 rng(o.seed);
  // Gamma(k, θ) has mean kθ: θ = 1 / (rate · k) keeps the mean gap at 1 / rate.
  std::gamma_distribution<double> gap(o.burstiness, 1.0 / (o.request_rate * o.burstiness));
  double now = 0;
  for (size_t i = 0; i < n; ++i) {
    t[i] = now;
    now += gap(rng);
  }
  return t;
}

}  // namespace osprey::bench
