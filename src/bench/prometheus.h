// The few numbers the benchmark reads from a server's Prometheus text exposition (GET /metrics):
// the step-time histogram `osprey_step_duration_seconds` (_sum, _count), summed over label sets;
// one label set's histogram with its buckets (to take quantiles of a run from two snapshots, as
// Prometheus' histogram_quantile does) and one label set's counter.
#pragma once

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey::bench {

struct HistogramTotals {
  double sum = 0;    // seconds
  double count = 0;  // observations (steps)
};

// The totals of histogram `name` in `text`; nullopt when neither `name`_sum nor `name`_count is
// there.
std::optional<HistogramTotals> find_histogram(std::string_view text, std::string_view name);

inline constexpr std::string_view kStepHistogram = "osprey_step_duration_seconds";

// The value of counter or gauge `name` in `text` (summed over label sets); nullopt when absent.
std::optional<double> find_counter(std::string_view text, std::string_view name);

// The speculative-decoding counters (server/metrics.h).
inline constexpr std::string_view kSpecDrafts = "osprey_spec_decode_num_drafts_total";
inline constexpr std::string_view kSpecDraftTokens = "osprey_spec_decode_num_draft_tokens_total";
inline constexpr std::string_view kSpecAccepted = "osprey_spec_decode_num_accepted_tokens_total";
struct HistogramSeries {
  double sum = 0, count = 0;
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative count), ascending; +Inf last
};

// The series of histogram `name` carrying label `label`="`value`" (other labels of the series
// ignored); nullopt when there is none.
std::optional<HistogramSeries> find_histogram_series(std::string_view text, std::string_view name,
                                                     std::string_view label,
                                                     std::string_view value);
// Sample `name` carrying label `label`="`value`" (a counter or gauge); nullopt when absent.
std::optional<double> find_sample(std::string_view text, std::string_view name,
                                  std::string_view label, std::string_view value);

// after − before, bucket by bucket (the observations between two snapshots of one server).
// Throws osprey::Error when the buckets differ (not the same histogram).
HistogramSeries histogram_delta(const HistogramSeries& after, const HistogramSeries& before);

// The q-quantile (0 <= q <= 1) of the observations, by linear interpolation inside the bucket
// that holds it (Prometheus' histogram_quantile: the first bucket starts at 0; a quantile in the
// +Inf bucket is the last finite bound). 0 for an empty histogram.
double histogram_quantile(double q, const HistogramSeries& h);

}  // namespace osprey::bench
