#include "eval/interval.h"

#include <algorithm>
#include <cmath>

namespace osprey::eval {

Interval wilson_interval(int64_t successes, int64_t n, double z) {
  if (n <= 0) return {0.0, 1.0};
  const double nn = double(n), p = double(successes) / nn, z2 = z * z;
  const double denom = 1.0 + z2 / nn;
  const double centre = (p + z2 / (2 * nn)) / denom;
  const double half = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / denom;
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

}  // namespace osprey::eval
