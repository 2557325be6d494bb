#include "bench/prometheus.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/error.h"

namespace osprey::bench {

std::optional<HistogramTotals> find_histogram(std::string_view text, std::string_view name) {
  HistogramTotals t;
  bool found = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line.front() == '#' || !line.starts_with(name)) continue;
    std::string_view rest = line.substr(name.size());
    double* into = nullptr;
    if (rest.starts_with("_sum")) {
      into = &t.sum;
      rest.remove_prefix(4);
    } else if (rest.starts_with("_count")) {
      into = &t.count;
      rest.remove_prefix(6);
    } else {
      continue;
    }
    if (rest.starts_with("{")) {
      const size_t close = rest.find('}');
      if (close == std::string_view::npos) continue;
      rest.remove_prefix(close + 1);
    }
    if (rest.empty() || (rest.front() != ' ' && rest.front() != '\t')) continue;
    const std::string value(rest.substr(rest.find_first_not_of(" \t")));
    char* parse_end = nullptr;
    const double v = std::strtod(value.c_str(), &parse_end);
    if (parse_end == value.c_str()) continue;
    *into += v;
    found = true;
  }
  if (!found) return std::nullopt;
  return t;
}

namespace {

// One sample line: `metric{labels} value`.
struct Sample {
  std::string_view metric, labels;  // labels without the braces
  double value = 0;
};

std::optional<Sample> parse_line(std::string_view line) {
  if (line.empty() || line.front() == '#') return std::nullopt;
  Sample s;
  const size_t brace = line.find('{');
  const size_t space = line.find_first_of(" \t");
  if (space == std::string_view::npos) return std::nullopt;
  std::string_view rest;
  if (brace != std::string_view::npos && brace < space) {
    const size_t close = line.find('}', brace);
    if (close == std::string_view::npos) return std::nullopt;
    s.metric = line.substr(0, brace);
    s.labels = line.substr(brace + 1, close - brace - 1);
    rest = line.substr(close + 1);
  } else {
    s.metric = line.substr(0, space);
    rest = line.substr(space);
  }
  const size_t v = rest.find_first_not_of(" \t");
  if (v == std::string_view::npos) return std::nullopt;
  const std::string value(rest.substr(v, rest.find_first_of(" \t", v) - v));
  if (value == "+Inf") {
    s.value = std::numeric_limits<double>::infinity();
    return s;
  }
  char* end = nullptr;
  s.value = std::strtod(value.c_str(), &end);
  if (end == value.c_str()) return std::nullopt;
  return s;
}

// The value of label `key` in `labels` (`a="x",b="y"`); nullopt when absent.
std::optional<std::string_view> label_value(std::string_view labels, std::string_view key) {
  size_t pos = 0;
  while (pos < labels.size()) {
    const size_t eq = labels.find('=', pos);
    if (eq == std::string_view::npos || eq + 1 >= labels.size() || labels[eq + 1] != '"')
      return std::nullopt;
    const size_t close = labels.find('"', eq + 2);
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view k = labels.substr(pos, eq - pos);
    while (!k.empty() && (k.front() == ' ' || k.front() == ',')) k.remove_prefix(1);
    if (k == key) return labels.substr(eq + 2, close - eq - 2);
    pos = close + 1;
  }
  return std::nullopt;
}

template <typename F>
void for_each_sample(std::string_view text, F&& f) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    if (auto s = parse_line(text.substr(pos, end - pos))) f(*s);
    pos = end + 1;
  }
}

}  // namespace

std::optional<HistogramSeries> find_histogram_series(std::string_view text, std::string_view name,
                                                     std::string_view label,
                                                     std::string_view value) {
  HistogramSeries h;
  bool found = false;
  const std::string bucket = std::string(name) + "_bucket", sum = std::string(name) + "_sum",
                    count = std::string(name) + "_count";
  for_each_sample(text, [&](const Sample& s) {
    if (s.metric != bucket && s.metric != sum && s.metric != count) return;
    if (label_value(s.labels, label) != value) return;
    found = true;
    if (s.metric == sum) {
      h.sum = s.value;
    } else if (s.metric == count) {
      h.count = s.value;
    } else {
      const auto le = label_value(s.labels, "le");
      if (!le) return;
      const std::string b(*le);
      const double bound =
          b == "+Inf" ? std::numeric_limits<double>::infinity() : std::strtod(b.c_str(), nullptr);
      h.buckets.emplace_back(bound, s.value);
    }
  });
  if (!found) return std::nullopt;
  std::sort(h.buckets.begin(), h.buckets.end());
  return h;
}

std::optional<double> find_sample(std::string_view text, std::string_view name,
                                  std::string_view label, std::string_view value) {
  std::optional<double> out;
  for_each_sample(text, [&](const Sample& s) {
    if (s.metric == name && label_value(s.labels, label) == value) out = s.value;
  });
  return out;
}

HistogramSeries histogram_delta(const HistogramSeries& after, const HistogramSeries& before) {
  HistogramSeries d;
  d.sum = after.sum - before.sum;
  d.count = after.count - before.count;
  if (before.buckets.empty()) {
    d.buckets = after.buckets;
    return d;
  }
  if (before.buckets.size() != after.buckets.size())
    fail("the server's histogram changed its buckets between two reads of /metrics (",
         before.buckets.size(), " then ", after.buckets.size(), ")");
  for (size_t i = 0; i < after.buckets.size(); ++i) {
    if (after.buckets[i].first != before.buckets[i].first)
      fail("the server's histogram changed its buckets between two reads of /metrics");
    d.buckets.emplace_back(after.buckets[i].first,
                           after.buckets[i].second - before.buckets[i].second);
  }
  return d;
}

double histogram_quantile(double q, const HistogramSeries& h) {
  if (h.buckets.empty()) return 0;
  const double total = h.buckets.back().second;
  if (!(total > 0)) return 0;
  const double rank = q * total;
  double lower = 0, below = 0;
  for (const auto& [le, cum] : h.buckets) {
    if (cum >= rank && cum > below) {
      if (std::isinf(le)) return lower;  // the last finite bound
      return lower + (le - lower) * (rank - below) / (cum - below);
    }
    if (!std::isinf(le)) lower = le;
    below = cum;
  }
  return lower;
}

std::optional<double> find_counter(std::string_view text, std::string_view name) {
  double total = 0;
  bool found = false;
  for_each_sample(text, [&](const Sample& s) {
    if (s.metric != name) return;
    total += s.value;
    found = true;
  });
  if (!found) return std::nullopt;
  return total;
}

}  // namespace osprey::bench
