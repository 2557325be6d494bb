// The figures of a serving run, as `vllm bench serve` reports them, from the per-request results:
// throughputs over the run's duration, and TTFT / TPOT / ITL / E2EL distributions over the
// completed requests (ITL: all gaps of all requests together; TPOT per request:
// (latency − TTFT) / (output tokens − 1), requests with one output token left out).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "bench/request_result.h"
#include "bench/server_steps.h"
#include "bench/stats.h"

namespace osprey::bench {

struct StepTimes {  // from the server's osprey_step_duration_seconds histogram over the run
  double steps = 0;
  double total_s = 0;
  double mean_ms() const { return steps > 0 ? total_s / steps * 1e3 : 0; }
};

// From the server's osprey_spec_decode_* counters over the run (speculative decoding on).
struct SpecDecodeCounts {
  double verifies = 0;      // sequence-steps that verified drafts
  double draft_tokens = 0;  // drafts verified
  double accepted = 0;      // drafts accepted
  double acceptance_rate() const { return draft_tokens > 0 ? accepted / draft_tokens : 0; }
  // Tokens per verify (the bonus token counted): 1 + accepted / verifies.
  double mean_accepted_length() const { return verifies > 0 ? 1 + accepted / verifies : 0; }
};

struct ServeMetrics {
  size_t completed = 0, failed = 0;
  double duration_s = 0;
  long long total_input = 0, total_output = 0;
  double request_throughput = 0;      // completed requests / s
  double output_throughput = 0;       // generated tokens / s
  double total_token_throughput = 0;  // (prompt + generated tokens) / s
  int peak_concurrency = 0;           // most requests in flight at once
  std::vector<double> percentiles;    // which percentiles the summaries hold, e.g. {99}
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::optional<StepTimes> step;
  std::optional<SpecDecodeCounts> spec;  // when the server verified drafts during the run
  std::vector<StepKindStats> step_kinds;        // per step kind (osprey servers), with the roofline
  std::optional<FullModelEstimate> full_model;  // the 61-layer, 4-GPU estimate (with --model-dir)
};

ServeMetrics compute_metrics(const std::vector<RequestResult>& results, double duration_s,
                             const std::vector<double>& percentiles);

struct ReportHeader {
  std::optional<int> max_concurrency;  // printed when set
  double request_rate = 0;             // inf when all at once
};

// The table, in vLLM's layout (labels padded to 40 columns).
std::string format_report(const ServeMetrics& m, const ReportHeader& header);

// "p99" for 99, "p99.9" for 99.9.
std::string percentile_label(double p);

}  // namespace osprey::bench
