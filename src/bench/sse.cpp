#include "bench/sse.h"

namespace osprey::bench {

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  size_t start = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != '\n') continue;
    std::string_view piece = bytes.substr(start, i - start);
    start = i + 1;
    if (!partial_line_.empty()) {
      partial_line_.append(piece);
      std::string l = std::move(partial_line_);
      partial_line_.clear();
      line(l, events);
    } else {
      line(piece, events);
    }
  }
  partial_line_.append(bytes.substr(start));
}

void SseParser::finish(std::vector<std::string>& events) {
  if (!partial_line_.empty()) {
    std::string l = std::move(partial_line_);
    partial_line_.clear();
    line(l, events);
  }
  line("", events);
}

void SseParser::line(std::string_view l, std::vector<std::string>& events) {
  if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
  if (l.empty()) {  // blank line: dispatch
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;  // comment
  const size_t colon = l.find(':');
  std::string_view field = l.substr(0, colon);
  std::string_view value =
      colon == std::string_view::npos ? std::string_view{} : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

}  // namespace osprey::bench
