// `osprey bench serve`: the serving benchmark against any OpenAI-compatible server, after
// `vllm bench serve`. Builds the random dataset, sends the requests (Poisson arrivals, a
// concurrency cap), streams and times them, reads the server's step-time histogram from /metrics
// before and after when it has one, prints the report and writes the JSON result and the plot.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench/metrics.h"
#include "bench/request_result.h"

namespace osprey::bench {

struct ServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;                         // empty: the first of GET /v1/models
  std::string tokenizer;                     // tokenizer.json or its folder; empty: approximate
  std::string dataset = "random";
  int input_len = 1024, output_len = 128;
  double range_ratio = 0;
  int num_prompts = 1000;
  int max_concurrency = 0;  // 0: no cap
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  uint64_t seed = 0;
  std::string api_key;
  std::vector<double> percentiles = {99};
  double request_timeout_s = 6 * 3600.0;
  std::string extra_body;  // JSON object merged into every request body
  std::string result_json, plot;
  bool progress = true;      // a progress line on stderr while running (only when it is a terminal)
  std::string model_dir;     // config.json for the step roofline and the full-model estimate
  RooflineOptions roofline;  // the card's ceilings and the latent row size for it
};

// A named workload: sets lengths, concurrency and prompt count.
struct Preset {
  const char* name;
  const char* description;
  int input_len, output_len, max_concurrency, num_prompts;
};
const std::vector<Preset>& presets();
// Throws osprey::Error for an unknown name (the message lists the known ones).
const Preset& find_preset(const std::string& name);

struct ServeResult {
  ServeMetrics metrics;
  std::vector<RequestResult> requests;
  std::string model;
  std::string report;  // the printed table
};

// Runs the benchmark, printing progress and the report on stdout. Throws osprey::Error for bad
// options or when the server cannot be reached at all; failed requests are counted, not thrown.
ServeResult run_serve_benchmark(const ServeOptions& options);

// One run per request rate, in order (`--request-rate 1,4,16,inf`), each printing its report;
// --result-json and --plot get "-rate<R>" before their extension when there is more than one
// rate, and run i uses --seed + i (fresh prompts: no run hits the prefix cache an earlier one
// filled). Prints a table of the runs at the end; returns them in order.
std::vector<ServeResult> run_serve_sweep(const ServeOptions& options,
                                         const std::vector<double>& request_rates);
// "in.json" → "in-rate4.json" (the sweep's per-rate file names; "inf" for infinity).
std::string with_rate_suffix(const std::string& path, double rate);

// The request body for one prompt (exposed for tests).
std::string request_body(const ServeOptions& o, const std::string& model, const std::string& prompt,
                         int max_tokens);

}  // namespace osprey::bench
