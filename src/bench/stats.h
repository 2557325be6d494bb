// Summary statistics of a sample (latencies in any unit): mean, median, standard deviation and
// percentiles with linear interpolation between order statistics (numpy.percentile's default,
// which `vllm bench serve` reports), so figures compare one to one with vLLM's.
#pragma once

#include <span>
#include <vector>

namespace osprey::bench {

// The p-th percentile (0 <= p <= 100) of `sorted` (ascending): rank p/100 · (n − 1), linearly
// interpolated between its neighbours. 0 for an empty sample.
double percentile_sorted(std::span<const double> sorted, double p);

struct Summary {
  size_t count = 0;
  double mean = 0, median = 0, stddev = 0, min = 0, max = 0;
  std::vector<double> percentiles;  // [n_percentiles], in the order asked for
};

// Population standard deviation (numpy.std's default). All zeros for an empty sample.
Summary summarize(std::span<const double> values, std::span<const double> percentiles);

}  // namespace osprey::bench
