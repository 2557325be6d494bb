// Binomial confidence intervals for an accuracy measured on n problems.
#pragma once

#include <cstdint>

namespace osprey::eval {

struct Interval {
  double lo = 0, hi = 0;
};

inline constexpr double kZ95 = 1.959963984540054;  // the standard normal's 97.5% quantile

// Wilson score interval of `successes` out of `n` at normal quantile z (default: 95%):
//   centre = (p + z²/2n) / (1 + z²/n),  half-width = z·sqrt(p(1−p)/n + z²/4n²) / (1 + z²/n).
// n = 0 gives [0, 1].
Interval wilson_interval(int64_t successes, int64_t n, double z = kZ95);

}  // namespace osprey::eval
