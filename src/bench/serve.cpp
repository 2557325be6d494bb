#include "bench/serve.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/arrivals.h"
#include "bench/client.h"
#include "bench/plot.h"
#include "bench/prometheus.h"
#include "bench/random_dataset.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace osprey::bench {
namespace {

using nlohmann::json;

constexpr double kGetTimeoutS = 30;
constexpr int kV32HiddenSize = 7168, kV32RoutedExperts = 256;  // DeepSeek-V3.2's config.json

std::string served_model(const HttpTarget& target) {
  HttpResponse r;
  try {
    r = http_get(target, "/v1/models", kGetTimeoutS);
  } catch (const Error& e) {
    fail("cannot ask the server for its model (GET /v1/models): ", e.what(),
         ". Is the server running? Or pass --model");
  }
  if (r.status != 200)
    fail("GET /v1/models answered HTTP ", r.status, ": ", r.body.substr(0, 300), "; pass --model");
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    fail("GET /v1/models gave no model list (", r.body.substr(0, 200), "); pass --model");
  return j["data"][0]["id"].get<std::string>();
}

// The server's /metrics text now; empty when it has none.
std::string read_metrics(const HttpTarget& target) {
  try {
    HttpResponse r = http_get(target, "/metrics", kGetTimeoutS);
    return r.status == 200 ? r.body : std::string();
  } catch (const Error&) {
    return {};
  }
}

std::string now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

json summary_json(const Summary& s, const std::vector<double>& percentiles) {
  json j = {
      {"mean", s.mean}, {"median", s.median}, {"std", s.stddev}, {"min", s.min}, {"max", s.max}};
  for (size_t i = 0; i < percentiles.size(); ++i)
    j[percentile_label(percentiles[i])] = s.percentiles[i];
  return j;
}

// Flat keys as vLLM's result file has them (mean_ttft_ms, p99_itl_ms, ...).
void add_flat(json& j, const std::string& name, const Summary& s, const std::vector<double>& ps) {
  j["mean_" + name + "_ms"] = s.mean;
  j["median_" + name + "_ms"] = s.median;
  j["std_" + name + "_ms"] = s.stddev;
  for (size_t i = 0; i < ps.size(); ++i)
    j[percentile_label(ps[i]) + "_" + name + "_ms"] = s.percentiles[i];
}

json result_json(const ServeOptions& o, const ServeResult& r, size_t inexact_prompts) {
  const ServeMetrics& m = r.metrics;
  json j = {
      {"date", now_iso8601()},
      {"backend", "openai"},
      {"base_url", o.base_url},
      {"endpoint", o.endpoint},
      {"model_id", r.model},
      {"tokenizer_id", o.tokenizer},
      {"dataset", o.dataset},
      {"input_len", o.input_len},
      {"output_len", o.output_len},
      {"range_ratio", o.range_ratio},
      {"num_prompts", o.num_prompts},
      {"inexact_prompts", inexact_prompts},
      {"request_rate", std::isinf(o.request_rate) ? json("inf") : json(o.request_rate)},
      {"burstiness", o.burstiness},
      {"max_concurrency", o.max_concurrency > 0 ? json(o.max_concurrency) : json(nullptr)},
      {"seed", o.seed},
      {"duration", m.duration_s},
      {"completed", m.completed},
      {"failed", m.failed},
      {"total_input_tokens", m.total_input},
      {"total_output_tokens", m.total_output},
      {"request_throughput", m.request_throughput},
      {"output_throughput", m.output_throughput},
      {"total_token_throughput", m.total_token_throughput},
      {"max_concurrent_requests", m.peak_concurrency},
      {"ttft_ms", summary_json(m.ttft_ms, m.percentiles)},
      {"tpot_ms", summary_json(m.tpot_ms, m.percentiles)},
      {"itl_ms", summary_json(m.itl_ms, m.percentiles)},
      {"e2el_ms", summary_json(m.e2el_ms, m.percentiles)},
  };
  add_flat(j, "ttft", m.ttft_ms, m.percentiles);
  add_flat(j, "tpot", m.tpot_ms, m.percentiles);
  add_flat(j, "itl", m.itl_ms, m.percentiles);
  add_flat(j, "e2el", m.e2el_ms, m.percentiles);
  if (m.step)
    j["server_step"] = {
        {"steps", m.step->steps}, {"total_s", m.step->total_s}, {"mean_ms", m.step->mean_ms()}};
  if (m.spec)
    j["spec_decode"] = {{"verifies", m.spec->verifies},
                        {"draft_tokens", m.spec->draft_tokens},
                        {"accepted_tokens", m.spec->accepted},
                        {"acceptance_rate", m.spec->acceptance_rate()},
                        {"mean_accepted_length", m.spec->mean_accepted_length()}};
  if (!m.step_kinds.empty()) {
    json kinds = json::array();
    for (const StepKindStats& k : m.step_kinds) {
      json e = {{"kind", k.kind},
                {"steps", k.steps},
                {"mean_ms", k.mean_ms},
                {"median_ms", k.median_ms},
                {"p99_ms", k.p99_ms},
                {"mean_decodes", k.decodes},
                {"mean_decode_context", k.decode_context},
                {"mean_chunks", k.chunks},
                {"mean_chunk_tokens", k.chunk_tokens},
                {"mean_chunk_start", k.chunk_start}};
      if (k.predicted_mean_ms) e["predicted_mean_ms"] = *k.predicted_mean_ms;
      if (k.roofline_ms) e["roofline_ms"] = *k.roofline_ms;
      kinds.push_back(std::move(e));
    }
    j["server_steps"] = std::move(kinds);
    if (const std::optional<double> floor_s = steps_roofline_sum_s(m.step_kinds))
      j["steps_roofline_sum_s"] = *floor_s;
  }
  if (m.full_model) {
    const FullModelEstimate& e = *m.full_model;
    j["full_model_estimate"] = {{"layers", e.layers},
                                {"gpus", e.gpus},
                                {"proxy_decode_ms", e.proxy_ms},
                                {"ms_per_gb", e.ms_per_gb},
                                {"dense_layer_ms", e.dense_layer_ms},
                                {"moe_layer_ms", e.moe_layer_ms},
                                {"one_gpu_ms", e.one_gpu_ms},
                                {"estimate_ms", e.estimate_ms},
                                {"vllm_42982_ms", kVllm42982DecodeStepMs},
                                {"text", e.text}};
  }
  // vLLM's per-request lists (seconds), then ours with everything.
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), errors = json::array(), requests = json::array();
  for (const RequestResult& q : r.requests) {
    input_lens.push_back(q.prompt_len);
    output_lens.push_back(q.output_tokens);
    ttfts.push_back(q.ttft);
    itls.push_back(q.itl);
    errors.push_back(q.error);
    json rq = {{"success", q.success},
               {"error", q.error},
               {"prompt_len", q.prompt_len},
               {"max_tokens", q.output_len},
               {"output_tokens", q.output_tokens},
               {"content_chunks", q.content_chunks},
               {"start_s", q.start},
               {"ttft_s", q.ttft},
               {"latency_s", q.latency},
               {"itl_s", q.itl}};
    if (q.usage_prompt_tokens) rq["usage_prompt_tokens"] = *q.usage_prompt_tokens;
    if (q.usage_completion_tokens) rq["usage_completion_tokens"] = *q.usage_completion_tokens;
    requests.push_back(std::move(rq));
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = std::move(output_lens);
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["errors"] = std::move(errors);
  j["requests"] = std::move(requests);
  return j;
}

std::filesystem::path tokenizer_path(const ServeOptions& o) {
  if (!o.tokenizer.empty()) return o.tokenizer;
  // Like vLLM, the model name may be a local folder holding the tokenizer.
  std::error_code ec;
  if (!o.model.empty() &&
      std::filesystem::exists(std::filesystem::path(o.model) / "tokenizer.json", ec))
    return o.model;
  return {};
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"dsv32-5k", "DeepSeek-V3.2 serving workload: 5000 in / 500 out / 64 concurrent", 5000, 500,
       64, 320},
  };
  return p;
}

const Preset& find_preset(const std::string& name) {
  std::string known;
  for (const Preset& p : presets()) {
    if (p.name == name) return p;
    known += std::string(known.empty() ? "" : ", ") + p.name;
  }
  fail("unknown --preset '", name, "'; known presets: ", known);
}

std::string request_body(const ServeOptions& o, const std::string& model, const std::string& prompt,
                         int max_tokens) {
  json j = {{"model", model},     {"max_tokens", max_tokens},
            {"temperature", 0.0}, {"ignore_eos", true},
            {"stream", true},     {"stream_options", {{"include_usage", true}}}};
  if (o.endpoint.ends_with("/chat/completions"))
    j["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  else
    j["prompt"] = prompt;
  if (!o.extra_body.empty()) {
    json extra = json::parse(o.extra_body, nullptr, false);
    if (extra.is_discarded() || !extra.is_object())
      fail("--extra-body must be a JSON object, got '", o.extra_body, "'");
    j.update(extra);
  }
  return j.dump();
}

ServeResult run_serve_benchmark(const ServeOptions& o) {
  if (o.dataset != "random") fail("--dataset '", o.dataset, "' is not supported; use random");
  if (!o.endpoint.ends_with("/completions"))
    fail("--endpoint must be /v1/completions or /v1/chat/completions, got '", o.endpoint, "'");
  if (o.max_concurrency < 0) fail("--max-concurrency must be >= 0, got ", o.max_concurrency);
  for (double p : o.percentiles)
    if (!(p >= 0 && p <= 100)) fail("--metric-percentiles: ", p, " is not in [0, 100]");
  request_body(o, "", "", 1);  // validates --extra-body before anything runs
  HttpTarget target{parse_base_url(o.base_url), o.api_key};

  ServeResult result;
  result.model = o.model.empty() ? served_model(target) : o.model;

  // Dataset.
  RandomDatasetOptions d{o.num_prompts, o.input_len, o.output_len, o.range_ratio, o.seed};
  std::vector<DatasetPrompt> prompts;
  const std::filesystem::path tok_path = tokenizer_path(o);
  const auto t0 = std::chrono::steady_clock::now();
  bool exact = false;
  if (!tok_path.empty()) {
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(tok_path);
    prompts = random_prompts(tok, d);
    exact = true;
  } else {
    std::fprintf(stderr,
                 "osprey bench serve: no --tokenizer: prompts are random words, about one token "
                 "each; input token counts are taken from the server's usage when it sends them\n");
    prompts = random_prompts_approximate(d);
  }
  size_t inexact = 0;
  std::vector<PlannedRequest> planned;
  planned.reserve(prompts.size());
  for (const DatasetPrompt& p : prompts) {
    inexact += exact && p.encoded_len != p.prompt_len;
    planned.push_back({request_body(o, result.model, p.text, p.output_len),
                       exact ? p.encoded_len : 0, p.output_len});
  }
  std::printf("Built %zu random prompts (input %d, output %d, range ratio %g) in %.2f s%s\n",
              prompts.size(), o.input_len, o.output_len, o.range_ratio,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              exact
                  ? (inexact ? str_cat(", ", inexact, " not token-exact").c_str() : ", token-exact")
                  : ", approximate lengths");

  RunOptions run;
  run.endpoint = o.endpoint;
  run.send_times = arrival_times(planned.size(), {o.request_rate, o.burstiness, o.seed});
  run.max_concurrency = o.max_concurrency;
  run.request_timeout_s = o.request_timeout_s;
  if (o.progress && isatty(fileno(stderr)))
    run.on_progress = [](size_t done, size_t total) {
      std::fprintf(stderr, "\r%zu / %zu requests done", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  std::printf("Model %s at %s%s; request rate %s, burstiness %g, max concurrency %s\n",
              result.model.c_str(), o.base_url.c_str(), o.endpoint.c_str(),
              std::isinf(o.request_rate) ? "inf" : str_cat(o.request_rate).c_str(), o.burstiness,
              o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "none");
  std::fflush(stdout);

  std::optional<ModelConfig> config;  // read before the run: a bad folder fails at once
  if (!o.model_dir.empty()) config = ModelConfig::from_file(o.model_dir);
  const std::string metrics_before = read_metrics(target);
  RunOutcome outcome = run_requests(target, planned, run);
  const std::string metrics_after = metrics_before.empty() ? "" : read_metrics(target);

  result.requests = std::move(outcome.results);
  result.metrics = compute_metrics(result.requests, outcome.duration_s, o.percentiles);
  const auto steps_before = find_histogram(metrics_before, kStepHistogram);
  const auto steps_after = find_histogram(metrics_after, kStepHistogram);
  if (steps_before && steps_after && steps_after->count > steps_before->count)
    result.metrics.step =
        StepTimes{steps_after->count - steps_before->count, steps_after->sum - steps_before->sum};
  if (!metrics_after.empty()) {
    result.metrics.step_kinds = server_step_stats(metrics_before, metrics_after);
    if (config) {
      add_roofline(result.metrics.step_kinds, *config, o.roofline);
      // The 61-layer figure scales a proxy of V3.2's own width (hidden 7168, 256 experts, the
      // indexer), not any model.
      const bool v32_width = config->has_indexer && config->hidden_size == kV32HiddenSize &&
                             config->n_routed_experts == kV32RoutedExperts;
      for (const StepKindStats& k : result.metrics.step_kinds)
        if (v32_width && k.kind == "decode" && k.decodes >= 1)
          result.metrics.full_model = estimate_full_model_decode(*config, k, o.roofline);
    }
    // The speculative-decoding counters over the run, when the server verified drafts.
    auto spec_counts = [](const std::string& text) -> std::optional<SpecDecodeCounts> {
      const std::optional<double> v = find_counter(text, kSpecDrafts);
      const std::optional<double> d = find_counter(text, kSpecDraftTokens);
      const std::optional<double> a = find_counter(text, kSpecAccepted);
      if (v && d && a) return SpecDecodeCounts{*v, *d, *a};
      return std::nullopt;
    };
    const std::optional<SpecDecodeCounts> sb = spec_counts(metrics_before),
                                          sa = spec_counts(metrics_after);
    if (sb && sa && sa->verifies > sb->verifies)
      result.metrics.spec = SpecDecodeCounts{sa->verifies - sb->verifies,
                                             sa->draft_tokens - sb->draft_tokens,
                                             sa->accepted - sb->accepted};
  }

  ReportHeader header;
  if (o.max_concurrency > 0) header.max_concurrency = o.max_concurrency;
  header.request_rate = o.request_rate;
  result.report = format_report(result.metrics, header);
  std::fputs(result.report.c_str(), stdout);
  if (result.metrics.failed) {
    constexpr size_t kShownErrors = 5;
    size_t shown = 0;
    std::printf("First errors of the %zu failed requests:\n", result.metrics.failed);
    for (size_t i = 0; i < result.requests.size() && shown < kShownErrors; ++i)
      if (!result.requests[i].success) {
        std::printf("  request %zu: %s\n", i, result.requests[i].error.c_str());
        ++shown;
      }
  }

  if (!o.result_json.empty()) {
    std::ofstream f(o.result_json);
    if (!f) fail("cannot write --result-json '", o.result_json, "'");
    f << result_json(o, result, inexact).dump(2) << "\n";
    std::printf("Wrote %s\n", o.result_json.c_str());
  }
  if (!o.plot.empty()) {
    std::vector<double> ttft, itl, tpot;
    for (const RequestResult& q : result.requests)
      if (q.success) {
        ttft.push_back(q.ttft * 1e3);
        for (double g : q.itl) itl.push_back(g * 1e3);
        if (q.output_tokens > 1)
          tpot.push_back((q.latency - q.ttft) / double(q.output_tokens - 1) * 1e3);
      }
    write_histogram_png(o.plot, {{"TTFT (ms)", ttft}, {"TPOT (ms)", tpot}, {"ITL (ms)", itl}});
    std::printf("Wrote %s\n", o.plot.c_str());
  }
  std::fflush(stdout);
  return result;
}

std::string with_rate_suffix(const std::string& path, double rate) {
  const std::string tag = "-rate" + (std::isinf(rate) ? std::string("inf") : str_cat(rate));
  const std::filesystem::path p(path);
  if (!p.has_extension()) return path + tag;
  return (p.parent_path() / (p.stem().string() + tag + p.extension().string())).string();
}

std::vector<ServeResult> run_serve_sweep(const ServeOptions& options,
                                         const std::vector<double>& request_rates) {
  if (request_rates.empty()) fail("--request-rate: no rate given");
  std::vector<ServeResult> out;
  for (size_t i = 0; i < request_rates.size(); ++i) {
    const double rate = request_rates[i];
    ServeOptions o = options;
    o.request_rate = rate;
    o.seed = options.seed + i;  // new prompts per rate: no run is served from an earlier's cache
    if (request_rates.size() > 1) {
      if (!o.result_json.empty()) o.result_json = with_rate_suffix(o.result_json, rate);
      if (!o.plot.empty()) o.plot = with_rate_suffix(o.plot, rate);
      std::printf("\n=== request rate %s ===\n", std::isinf(rate) ? "inf" : str_cat(rate).c_str());
      std::fflush(stdout);
    }
    out.push_back(run_serve_benchmark(o));
  }
  if (request_rates.size() > 1) {
    std::printf("\n%-8s %6s %6s %10s %12s %12s %11s %11s %10s %12s\n", "rate", "ok", "failed",
                "duration_s", "out_tok/s", "total_tok/s", "mean_ttft", "median_tpot", "p99_itl",
                "decode_step");
    for (size_t i = 0; i < out.size(); ++i) {
      const ServeMetrics& m = out[i].metrics;
      std::string decode = "-";
      for (const StepKindStats& k : m.step_kinds)
        if (k.kind == "decode") decode = str_cat(std::round(k.mean_ms * 100) / 100, " ms");
      const double r = request_rates[i];
      const double p99_itl = m.itl_ms.percentiles.empty() ? 0 : m.itl_ms.percentiles.back();
      std::printf("%-8s %6zu %6zu %10.2f %12.1f %12.1f %9.1fms %9.1fms %8.1fms %12s\n",
                  std::isinf(r) ? "inf" : str_cat(r).c_str(), m.completed, m.failed, m.duration_s,
                  m.output_throughput, m.total_token_throughput, m.ttft_ms.mean, m.tpot_ms.median,
                  p99_itl, decode.c_str());
    }
    std::printf(
        "(p99_itl: the last of --metric-percentiles; decode_step: the server's mean "
        "decode-only step)\n");
    std::fflush(stdout);
  }
  return out;
}

}  // namespace osprey::bench
