#include "bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace osprey::bench {

ServeMetrics compute_metrics(const std::vector<RequestResult>& results, double duration_s,
                             const std::vector<double>& percentiles) {
  ServeMetrics m;
  m.duration_s = duration_s;
  m.percentiles = percentiles;
  std::vector<double> ttft, tpot, itl, e2el;
  std::vector<std::pair<double, int>> edges;  // (time, +1 start / −1 end) of every request
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input +=
        r.usage_prompt_tokens && r.prompt_len == 0 ? *r.usage_prompt_tokens : r.prompt_len;
    m.total_output += r.output_tokens;
    ttft.push_back(r.ttft * 1e3);
    e2el.push_back(r.latency * 1e3);
    if (r.output_tokens > 1) tpot.push_back((r.latency - r.ttft) / (r.output_tokens - 1) * 1e3);
    for (double g : r.itl) itl.push_back(g * 1e3);
    edges.push_back({r.start, +1});
    edges.push_back({r.start + r.latency, -1});
  }
  std::sort(edges.begin(), edges.end());  // an end before a start at the same instant
  int now = 0;
  for (const auto& e : edges) m.peak_concurrency = std::max(m.peak_concurrency, now += e.second);
  if (duration_s > 0) {
    m.request_throughput = double(m.completed) / duration_s;
    m.output_throughput = double(m.total_output) / duration_s;
    m.total_token_throughput = double(m.total_input + m.total_output) / duration_s;
  }
  m.ttft_ms = summarize(ttft, percentiles);
  m.tpot_ms = summarize(tpot, percentiles);
  m.itl_ms = summarize(itl, percentiles);
  m.e2el_ms = summarize(e2el, percentiles);
  return m;
}

std::string percentile_label(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "p%g", p);
  return buf;
}

namespace {

constexpr int kWidth = 50;  // the table's width, as vLLM's

void title(std::string& out, const std::string& text, char fill) {
  const int pad = std::max(0, kWidth - int(text.size()));
  out +=
      std::string(size_t(pad / 2), fill) + text + std::string(size_t(pad - pad / 2), fill) + "\n";
}

void row(std::string& out, const std::string& label, const std::string& value) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %-10s\n", label.c_str(), value.c_str());
  out += buf;
}

std::string num(double v, int decimals = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

void section(std::string& out, const std::string& heading, const std::string& name,
             const Summary& s, const std::vector<double>& percentiles) {
  title(out, heading, '-');
  row(out, "Mean " + name + " (ms):", num(s.mean));
  row(out, "Median " + name + " (ms):", num(s.median));
  for (size_t i = 0; i < percentiles.size(); ++i) {
    std::string label = percentile_label(percentiles[i]);
    label[0] = 'P';
    row(out, label + " " + name + " (ms):", num(s.percentiles[i]));
  }
}

}  // namespace

std::string format_report(const ServeMetrics& m, const ReportHeader& h) {
  std::string out;
  title(out, " Serving Benchmark Result ", '=');
  row(out, "Successful requests:", std::to_string(m.completed));
  row(out, "Failed requests:", std::to_string(m.failed));
  if (h.max_concurrency)
    row(out, "Maximum request concurrency:", std::to_string(*h.max_concurrency));
  if (!std::isinf(h.request_rate)) row(out, "Request rate configured (RPS):", num(h.request_rate));
  row(out, "Benchmark duration (s):", num(m.duration_s));
  row(out, "Total input tokens:", std::to_string(m.total_input));
  row(out, "Total generated tokens:", std::to_string(m.total_output));
  row(out, "Request throughput (req/s):", num(m.request_throughput));
  row(out, "Output token throughput (tok/s):", num(m.output_throughput));
  row(out, "Peak concurrent requests:", std::to_string(m.peak_concurrency));
  row(out, "Total token throughput (tok/s):", num(m.total_token_throughput));
  section(out, "Time to First Token", "TTFT", m.ttft_ms, m.percentiles);
  section(out, "Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms, m.percentiles);
  section(out, "Inter-token Latency", "ITL", m.itl_ms, m.percentiles);
  section(out, "End-to-end Latency", "E2EL", m.e2el_ms, m.percentiles);
  if (m.step) {
    title(out, "Server Step Time", '-');
    row(out, "Engine steps during the run:", num(m.step->steps, 0));
    row(out, "Mean step time (ms):", num(m.step->mean_ms()));
  }
  if (m.spec) {
    title(out, "Speculative Decoding", '-');
    row(out, "Verify steps (per sequence):", num(m.spec->verifies, 0));
    row(out, "Draft tokens verified:", num(m.spec->draft_tokens, 0));
    row(out, "Draft tokens accepted:", num(m.spec->accepted, 0));
    row(out, "Acceptance rate (%):", num(100 * m.spec->acceptance_rate()));
    row(out, "Mean accepted length:", num(m.spec->mean_accepted_length()));
  }
  if (!m.step_kinds.empty()) {
    title(out, "Server Steps by Kind (/metrics)", '-');
    out += format_step_table(m.step_kinds);
    out +=
        "(median and P99 from the server's histogram buckets, 10% apart; roofline of the mean "
        "step of the kind from the config: max(bytes / copy bandwidth, FLOPs / matrix rates))\n";
    if (const std::optional<double> floor_s = steps_roofline_sum_s(m.step_kinds);
        floor_s && *floor_s > 0) {
      char b[160];
      std::snprintf(b, sizeof b, "the run against its steps' rooflines: %.2f s / %.2f s = %.2fx\n",
                    m.duration_s, *floor_s, m.duration_s / *floor_s);
      out += b;
    }
  }
  if (m.full_model) {
    title(out, "Full V3.2 Decode Step (estimate)", '-');
    out += m.full_model->text;
  }
  out += std::string(kWidth, '=') + "\n";
  return out;
}

}  // namespace osprey::bench
