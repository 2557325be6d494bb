#include "bench/prometheus.h"

#include <cstdlib>
#include <string>

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

std::optional<double> find_counter(std::string_view text, std::string_view name) {
  double total = 0;
  bool found = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line.front() == '#' || !line.starts_with(name)) continue;
    std::string_view rest = line.substr(name.size());
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
    total += v;
    found = true;
  }
  if (!found) return std::nullopt;
  return total;
}

}  // namespace osprey::bench
