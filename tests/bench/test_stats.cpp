// Statistics (numpy-style percentiles), the arrival process, and the metrics derived from
// per-request results, on data whose answers are worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "bench/arrivals.h"
#include "bench/metrics.h"
#include "bench/stats.h"
#include "core/error.h"

namespace osprey::bench {
namespace {

TEST(Stats, PercentilesInterpolateLikeNumpy) {
  const std::vector<double> v = {10, 1, 9, 2, 8, 3, 7, 4, 6, 5};  // 1..10, unsorted
  const std::vector<double> ps = {0, 25, 50, 90, 99, 100};
  const Summary s = summarize(v, ps);
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_NEAR(s.stddev, std::sqrt(8.25), 1e-12);  // population std
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  // numpy.percentile(range(1, 11), [0, 25, 50, 90, 99, 100])
  EXPECT_DOUBLE_EQ(s.percentiles[0], 1.0);
  EXPECT_DOUBLE_EQ(s.percentiles[1], 3.25);
  EXPECT_DOUBLE_EQ(s.percentiles[2], 5.5);
  EXPECT_NEAR(s.percentiles[3], 9.1, 1e-12);
  EXPECT_NEAR(s.percentiles[4], 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(s.percentiles[5], 10.0);
}

TEST(Stats, SkewedSampleAndEdgeCases) {
  // numpy.percentile([1, 2, 3, 100], 99) = 3 + 0.97 * 97 = 97.09; median 2.5; mean 26.5
  const Summary s = summarize(std::vector<double>{100, 1, 3, 2}, std::vector<double>{99});
  EXPECT_NEAR(s.percentiles[0], 97.09, 1e-9);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.mean, 26.5);
  const Summary one = summarize(std::vector<double>{7}, std::vector<double>{99});
  EXPECT_DOUBLE_EQ(one.percentiles[0], 7);
  EXPECT_DOUBLE_EQ(one.stddev, 0);
  const Summary none = summarize(std::vector<double>{}, std::vector<double>{99});
  EXPECT_EQ(none.count, 0u);
  EXPECT_DOUBLE_EQ(none.percentiles[0], 0);
}

double mean_gap(const std::vector<double>& t) {
  return (t.back() - t.front()) / double(t.size() - 1);
}

double gap_cv(const std::vector<double>& t) {
  std::vector<double> g;
  for (size_t i = 1; i < t.size(); ++i) g.push_back(t[i] - t[i - 1]);
  const Summary s = summarize(g, std::vector<double>{});
  return s.stddev / s.mean;
}

TEST(Arrivals, PoissonHasTheAskedMeanRate) {
  constexpr double kRate = 50;
  const std::vector<double> t = arrival_times(20000, {kRate, 1.0, 42});
  EXPECT_DOUBLE_EQ(t[0], 0.0);
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  // Mean gap 1/rate: the standard error is 0.7% of it for 20,000 gaps; allow 3%.
  EXPECT_NEAR(1.0 / mean_gap(t), kRate, kRate * 0.03);
  // Exponential gaps: coefficient of variation 1 (a fixed-interval process would give 0).
  EXPECT_NEAR(gap_cv(t), 1.0, 0.05);
  // The same seed gives the same schedule; another seed another.
  EXPECT_EQ(t, arrival_times(20000, {kRate, 1.0, 42}));
  EXPECT_NE(t, arrival_times(20000, {kRate, 1.0, 43}));
}

TEST(Arrivals, BurstinessShapesTheGapsNotTheRate) {
  const std::vector<double> t = arrival_times(20000, {10, 4.0, 7});
  EXPECT_NEAR(1.0 / mean_gap(t), 10, 10 * 0.03);
  EXPECT_NEAR(gap_cv(t), 0.5, 0.05);  // gamma shape k: CV = 1/sqrt(k)
}

TEST(Arrivals, InfiniteRateSendsAllAtOnceAndBadRatesAreRefused) {
  const std::vector<double> t = arrival_times(5, {INFINITY, 1.0, 0});
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
  EXPECT_THROW(arrival_times(5, {0.0, 1.0, 0}), Error);
  EXPECT_THROW(arrival_times(5, {1.0, 0.0, 0}), Error);
}

RequestResult ok(double start, double ttft, std::vector<double> itl, int prompt, int out) {
  RequestResult r;
  r.success = true;
  r.start = start;
  r.ttft = ttft;
  r.itl = std::move(itl);
  r.latency = ttft + std::accumulate(r.itl.begin(), r.itl.end(), 0.0);
  r.prompt_len = prompt;
  r.output_tokens = out;
  r.content_chunks = int(r.itl.size()) + 1;
  return r;
}

TEST(Metrics, ThroughputsAndLatenciesFromRequests) {
  std::vector<RequestResult> rs;
  rs.push_back(ok(0.0, 0.100, {0.010, 0.020, 0.030}, 100, 4));  // latency 0.160, TPOT 20 ms
  rs.push_back(ok(0.5, 0.300, {0.040}, 50, 5));                 // latency 0.340, TPOT 10 ms
  RequestResult failed;
  failed.error = "HTTP 500";
  failed.prompt_len = 1000;
  rs.push_back(failed);
  rs.push_back(ok(0.05, 0.200, {}, 10, 1));  // one token: no TPOT, no ITL
  const ServeMetrics m = compute_metrics(rs, 2.0, {50, 99});
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.failed, 1u);
  EXPECT_EQ(m.total_input, 160);  // failed requests' prompts are not counted
  EXPECT_EQ(m.total_output, 10);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 5.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 85.0);
  EXPECT_NEAR(m.ttft_ms.mean, 200, 1e-9);
  EXPECT_EQ(m.tpot_ms.count, 2u);
  EXPECT_NEAR(m.tpot_ms.mean, 15, 1e-9);
  EXPECT_EQ(m.itl_ms.count, 4u);  // all gaps of all requests together
  EXPECT_NEAR(m.itl_ms.mean, 25, 1e-9);
  EXPECT_NEAR(m.itl_ms.median, 25, 1e-9);
  EXPECT_NEAR(m.e2el_ms.max, 340, 1e-9);
  // Requests 0 [0, 0.16] and 3 [0.05, 0.25] overlap; 1 [0.5, 0.84] does not.
  EXPECT_EQ(m.peak_concurrency, 2);

  const std::string report = format_report(m, {64, INFINITY});
  EXPECT_NE(report.find("Successful requests:                     3"), std::string::npos) << report;
  EXPECT_NE(report.find("Failed requests:                         1"), std::string::npos);
  EXPECT_NE(report.find("Maximum request concurrency:             64"), std::string::npos);
  EXPECT_NE(report.find("Mean TPOT (ms):                          15.00"), std::string::npos);
  EXPECT_NE(report.find("P99 ITL (ms):"), std::string::npos);
  EXPECT_NE(report.find("Output token throughput (tok/s):         5.00"), std::string::npos);
  EXPECT_EQ(report.find("Request rate configured"), std::string::npos);  // inf: not shown
  EXPECT_EQ(report.find("Step"), std::string::npos);  // no server step time given
}

}  // namespace
}  // namespace osprey::bench
