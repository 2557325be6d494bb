#include "bench/stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace osprey::bench {

double percentile_sorted(std::span<const double> sorted, double p) {
  OSPREY_CHECK(p >= 0 && p <= 100, "percentile ", p);
  if (sorted.empty()) return 0;
  const double rank = p / 100.0 * double(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - double(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary summarize(std::span<const double> values, std::span<const double> percentiles) {
  Summary s;
  s.count = values.size();
  s.percentiles.assign(percentiles.size(), 0.0);
  if (values.empty()) return s;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double v : sorted) sum += v;
  s.mean = sum / double(sorted.size());
  double sq = 0;
  for (double v : sorted) sq += (v - s.mean) * (v - s.mean);
  s.stddev = std::sqrt(sq / double(sorted.size()));
  s.min = sorted.front();
  s.max = sorted.back();
  s.median = percentile_sorted(sorted, 50);
  for (size_t i = 0; i < percentiles.size(); ++i)
    s.percentiles[i] = percentile_sorted(sorted, percentiles[i]);
  return s;
}

}  // namespace osprey::bench
