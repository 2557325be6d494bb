// When each request is sent: a renewal process with gamma-distributed gaps of mean 1/rate (shape
// `burstiness`; 1 = exponential gaps = Poisson arrivals, as `vllm bench serve`); rate = inf sends
// everything at time 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace osprey::bench {

struct ArrivalOptions {
  double request_rate = 0;  // requests per second; +inf (or <= 0 is refused) for all at once
  double burstiness = 1.0;  // gamma shape; < 1 burstier, > 1 more regular
  uint64_t seed = 0;
};

// [n] send times in seconds from the start, non-decreasing; the first request goes at 0.
// Throws osprey::Error for a non-positive rate or burstiness.
std::vector<double> arrival_times(size_t n, const ArrivalOptions& options);

}  // namespace osprey::bench
