#include "server/metrics.h"

#include <cstdio>
#include <iterator>

namespace osprey::server {

namespace {
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
// Counters that outgrow 9 digits (context tokens summed over a server's life).
std::string count(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}
}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  render_samples(out, name, "");
}

void Histogram::render_samples(std::string& out, const std::string& name,
                               const std::string& labels) const {
  const std::string pre = labels.empty() ? "{" : "{" + labels + ",";
  const std::string own = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket" + pre + "le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket" + pre + "le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum" + own + " " + num(sum_) + "\n";
  out += name + "_count" + own + " " + std::to_string(count_) + "\n";
}

namespace {
// `n` bucket bounds from `low`, each `ratio` times the one before.
std::vector<double> geometric_buckets(double low, double ratio, int n) {
  std::vector<double> b;
  double v = low;
  for (int i = 0; i < n; ++i, v *= ratio) b.push_back(v);
  return b;
}
// Step-time buckets: 10% apart from 0.5 ms to past 100 s (130 bounds), so a quantile read back by
// linear interpolation inside a bucket is within a few percent of the sample's.
constexpr double kStepBucketLow = 0.5e-3, kStepBucketRatio = 1.1;
constexpr int kStepBuckets = 130;
std::vector<double> step_buckets() {
  return geometric_buckets(kStepBucketLow, kStepBucketRatio, kStepBuckets);
}
// Host-time and idle-gap buckets: 10% apart from 1 µs to past 1 s (150 bounds).
constexpr double kHostBucketLow = 1e-6;
constexpr int kHostBuckets = 150;
std::vector<double> host_buckets() {
  return geometric_buckets(kHostBucketLow, kStepBucketRatio, kHostBuckets);
}
constexpr StepKind kStepKinds[] = {StepKind::Decode, StepKind::Mixed, StepKind::Prefill};
}  // namespace

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
             20, 40, 80}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
            0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1,    2.5}),
      e2e_({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120}) {
  for (size_t i = 0; i < std::size(kStepKinds); ++i)
    steps_.push_back({Histogram(step_buckets()), Histogram(host_buckets()),
                      Histogram(host_buckets()), Histogram(host_buckets())});
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  ttft_.observe(s);
}
void Metrics::observe_itl(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(s);
}
void Metrics::observe_e2e(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  e2e_.observe(s);
}
void Metrics::observe_step(const StepRecord& r) {
  std::lock_guard<std::mutex> lk(mu_);
  StepFamily& f = steps_[size_t(r.kind)];
  f.seconds.observe(r.seconds);
  f.host.observe(r.host_seconds);
  if (r.device_idle_seconds >= 0) f.idle.observe(r.device_idle_seconds);
  if (r.comm_seconds > 0) f.comm.observe(r.comm_seconds);  // parallel models only
  f.predicted_s += r.predicted_seconds;
  f.decode_seqs += r.num_decodes;
  f.decode_context += double(r.decode_context_tokens);
  f.chunks += r.num_chunks;
  f.prefill_tokens += double(r.prefill_tokens);
  f.prefill_start += double(r.prefill_start_tokens);
}
void Metrics::request_finished(const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  ++success_[reason];
}
void Metrics::request_failed() {
  std::lock_guard<std::mutex> lk(mu_);
  ++failures_;
}

std::string Metrics::render(const EngineStats& s) const {
  std::string o;
  auto gauge = [&](const char* name, const char* help, double v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " +
         num(v) + "\n";
  };
  auto counter = [&](const char* name, const char* help, double v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name +
         " " + num(v) + "\n";
  };
  gauge("osprey_num_requests_running", "Requests in the running batch.", s.num_running);
  gauge("osprey_num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting);
  gauge("osprey_kv_cache_usage_perc", "Fraction of KV cache blocks held by requests (0 to 1).",
        s.kv_blocks_total ? double(s.kv_blocks_used) / double(s.kv_blocks_total) : 0.0);
  gauge("osprey_prefix_cache_hit_rate",
        "Prompt tokens served from the prefix cache / tokens looked up.",
        s.prefix_query_tokens ? double(s.prefix_hit_tokens) / double(s.prefix_query_tokens) : 0.0);
  counter("osprey_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          double(s.prefix_query_tokens));
  counter("osprey_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
          double(s.prefix_hit_tokens));
  counter("osprey_prompt_tokens_total", "Prompt tokens computed.", double(s.prompt_tokens_total));
  counter("osprey_generation_tokens_total", "Tokens generated.", double(s.generation_tokens_total));
  counter("osprey_num_preemptions_total", "Preemptions by recompute.", double(s.num_preemptions));
  counter("osprey_cuda_graph_replays_total", "Decode steps run as CUDA graph replays.",
          double(s.cuda_graph_replays));
  counter("osprey_cuda_graph_captures_total",
          "CUDA graphs captured (one per bucket, again when "
          "the memory a graph points at moved).",
          double(s.cuda_graph_captures));
  counter("osprey_cuda_graph_capture_failures_total",
          "Buckets whose capture failed (their steps run eagerly).",
          double(s.cuda_graph_capture_failures));
  counter("osprey_cuda_graph_sampled_steps_total",
          "Graph-replayed decode steps sampled inside the graph (ids-only read-back).",
          double(s.cuda_graph_sampled_steps));
  double host_sampled = 0;
  for (const auto& [why, n] : s.cuda_graph_host_sampling_steps) host_sampled += double(n);
  counter("osprey_cuda_graph_host_sampling_steps_total",
          "Graph-replayed decode steps sampled on the host path after the replay (in-graph "
          "sampling on, but the step did not fit it).",
          host_sampled);
  // Speculative decoding (vLLM's spec_decode_* counters, and the two ratios they give).
  counter("osprey_spec_decode_num_drafts_total",
          "Verify steps: sequences that verified draft tokens, per step.", double(s.spec_verifies));
  counter("osprey_spec_decode_num_draft_tokens_total", "Draft tokens verified.",
          double(s.spec_draft_tokens));
  counter("osprey_spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
          double(s.spec_accepted_tokens));
  gauge("osprey_spec_decode_acceptance_rate", "Accepted / verified draft tokens (0 without any).",
        spec_acceptance_rate(s));
  gauge("osprey_spec_decode_mean_accepted_length",
        "Tokens a verify step emits per sequence: 1 + accepted / verifies (0 without any).",
        spec_mean_accepted_length(s));
  std::lock_guard<std::mutex> lk(mu_);
  o += "# HELP osprey_request_success_total Requests finished, by reason.\n# TYPE "
       "osprey_request_success_total counter\n";
  for (const char* r : {"stop", "length", "abort"}) {
    auto it = success_.find(r);
    o += std::string("osprey_request_success_total{finished_reason=\"") + r + "\"} " +
         std::to_string(it == success_.end() ? 0 : it->second) + "\n";
  }
  counter("osprey_request_failure_total", "Requests refused or failed (4xx/5xx).",
          double(failures_));
  ttft_.render(o, "osprey_time_to_first_token_seconds", "Time from arrival to the first token.");
  itl_.render(o, "osprey_inter_token_latency_seconds",
              "Time between successive outputs of a request.");
  e2e_.render(o, "osprey_e2e_request_latency_seconds", "Time from arrival to the last token.");
  const std::string step = "osprey_step_duration_seconds";
  o += "# HELP " + step +
       " Duration of one engine step, by kind: decode (decodes only), mixed (decodes and prompt "
       "chunks), prefill (prompt chunks only).\n# TYPE " +
       step + " histogram\n";
  for (StepKind k : kStepKinds)
    steps_[size_t(k)].seconds.render_samples(
        o, step, std::string("step_kind=\"") + step_kind_name(k) + "\"");
  auto histogram_by_kind = [&](const std::string& name, const char* help,
                               Histogram StepFamily::*field) {
    o += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (StepKind k : kStepKinds)
      (steps_[size_t(k)].*field)
          .render_samples(o, name, std::string("step_kind=\"") + step_kind_name(k) + "\"");
  };
  histogram_by_kind("osprey_step_host_seconds",
                    "Host time on the critical path before each step's launch (schedule and "
                    "step-input build; with async scheduling also writing the pending inputs and "
                    "the hand-over), by kind.",
                    &StepFamily::host);
  histogram_by_kind("osprey_step_device_idle_seconds",
                    "The device's idle gap before each step: from the previous step's sampled ids "
                    "arriving to this step's forward starting (steps that followed another), by "
                    "kind.",
                    &StepFamily::idle);
  histogram_by_kind("osprey_step_comm_seconds",
                    "A parallel model: rank 0's time inside each step's collectives (all-reduce, "
                    "all-gather, all-to-all; host wall time around each call, waiting for the "
                    "other ranks included), by kind.",
                    &StepFamily::comm);
  auto by_kind = [&](const char* name, const char* help, double StepFamily::*field) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n";
    for (StepKind k : kStepKinds)
      o += std::string(name) + "{step_kind=\"" + step_kind_name(k) + "\"} " +
           count(steps_[size_t(k)].*field) + "\n";
  };
  by_kind("osprey_step_predicted_seconds_total",
          "Step time the scheduler's step-time model predicted, summed.", &StepFamily::predicted_s);
  by_kind("osprey_step_decode_seqs_total", "Decoding sequences in the steps.",
          &StepFamily::decode_seqs);
  by_kind("osprey_step_decode_context_tokens_total",
          "Context tokens of the decoding sequences (cached + the new one), summed.",
          &StepFamily::decode_context);
  by_kind("osprey_step_prefill_chunks_total", "Prompt chunks in the steps.", &StepFamily::chunks);
  by_kind("osprey_step_prefill_tokens_total", "Prompt-chunk tokens computed in the steps.",
          &StepFamily::prefill_tokens);
  by_kind("osprey_step_prefill_start_tokens_total",
          "First positions of the prompt chunks (tokens already cached), summed.",
          &StepFamily::prefill_start);
  return o;
}

double spec_acceptance_rate(const EngineStats& s) {
  return s.spec_draft_tokens ? double(s.spec_accepted_tokens) / double(s.spec_draft_tokens) : 0.0;
}

double spec_mean_accepted_length(const EngineStats& s) {
  return s.spec_verifies ? 1.0 + double(s.spec_accepted_tokens) / double(s.spec_verifies) : 0.0;
}

}  // namespace osprey::server
