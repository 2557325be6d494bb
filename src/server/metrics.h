// Prometheus metrics of the server (text exposition format 0.0.4), under the osprey_ prefix:
//   gauges     osprey_num_requests_running, osprey_num_requests_waiting,
//   osprey_kv_cache_usage_perc,
//              osprey_prefix_cache_hit_rate
//   counters   osprey_prompt_tokens_total, osprey_generation_tokens_total,
//              osprey_prefix_cache_queries_total, osprey_prefix_cache_hits_total (tokens),
//              osprey_request_success_total{finished_reason}, osprey_request_failure_total,
//              osprey_num_preemptions_total, osprey_spec_decode_num_drafts_total,
//              osprey_spec_decode_num_draft_tokens_total,
//              osprey_spec_decode_num_accepted_tokens_total
//   spec gauges osprey_spec_decode_acceptance_rate, osprey_spec_decode_mean_accepted_length
//   histograms osprey_time_to_first_token_seconds, osprey_inter_token_latency_seconds,
//              osprey_e2e_request_latency_seconds,
//              osprey_step_duration_seconds{step_kind="decode"|"mixed"|"prefill"} (fine buckets,
//              10% apart, so a client can take medians and P99s of a run from two snapshots),
//              osprey_step_host_seconds{step_kind} (the host's time on the critical path before
//              each launch: schedule + build, engine.h StepRecord), and
//              osprey_step_device_idle_seconds{step_kind} (the device's idle gap before each
//              step: previous step's ids back → this forward's start), both 10% apart from 1 µs,
//              and osprey_step_comm_seconds{step_kind} (a parallel model: rank 0's time inside
//              the step's collectives, StepRecord::comm_seconds; no samples on one rank)
//   per step kind, counters of the steps' shapes (the roofline of the mean step, bench serve):
//              osprey_step_decode_seqs_total, osprey_step_decode_context_tokens_total,
//              osprey_step_prefill_chunks_total, osprey_step_prefill_tokens_total,
//              osprey_step_prefill_start_tokens_total, osprey_step_predicted_seconds_total
//              (the scheduler's step-time model, engine/step_time_model.h)
// Thread-safe: observations come from the I/O threads and the engine thread.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace osprey::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& help) const;
  // The sample lines alone, every one carrying `labels` (e.g. `step_kind="decode"`).
  void render_samples(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void observe_ttft(double s);
  void observe_itl(double s);
  void observe_e2e(double s);
  void observe_step(const StepRecord& step);
  void request_finished(const std::string& reason);
  void request_failed();
  std::string render(const EngineStats& stats) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_;
  struct StepFamily {  // one step kind
    Histogram seconds;
    Histogram host;  // host time before the launch (StepRecord::host_seconds)
    Histogram idle;  // the device's idle gap before the step (when it had one)
    Histogram comm;  // rank 0's time in the step's collectives (parallel models)
    double predicted_s = 0;
    double decode_seqs = 0, decode_context = 0, chunks = 0, prefill_tokens = 0, prefill_start = 0;
  };
  std::vector<StepFamily> steps_;  // [3], by StepKind
  std::map<std::string, uint64_t> success_;
  uint64_t failures_ = 0;
};

// The two ratios of speculative decoding (vLLM's spec_decode metrics), 0 before any verify:
// accepted / verified draft tokens, and the tokens a verify step emits per sequence,
// 1 + accepted / verifies. The gauges above, and what generate and eval report.
double spec_acceptance_rate(const EngineStats& s);
double spec_mean_accepted_length(const EngineStats& s);

}  // namespace osprey::server
