// The few numbers the benchmark reads from a server's Prometheus text exposition (GET /metrics):
// the step-time histogram `osprey_step_duration_seconds` (_sum, _count), summed over label sets.
#pragma once

#include <optional>
#include <string_view>

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

}  // namespace osprey::bench
