#include "server/reasoning_parser.h"

#include <algorithm>

namespace osprey::server {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::optional<ReasoningFormat> parse_reasoning_format(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (name == "deepseek_v3") return ReasoningFormat::kDeepSeekV3;
  return std::nullopt;
}

std::string_view reasoning_format_name(ReasoningFormat format) {
  return format == ReasoningFormat::kDeepSeekR1 ? "deepseek_r1" : "deepseek_v3";
}

ReasoningParser::ReasoningParser(ReasoningFormat format, bool thinking)
    : state_(format == ReasoningFormat::kDeepSeekV3 && !thinking ? State::kContent : State::kStart),
      active_(state_ == State::kStart) {}

ReasoningDelta ReasoningParser::feed(std::string_view text) {
  ReasoningDelta out;
  buf_ += text;
  run(out, false);
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  run(out, true);
  return out;
}

void ReasoningParser::run(ReasoningDelta& out, bool final) {
  while (true) {
    switch (state_) {
      case State::kStart: {
        // A leading <think> (after nothing) is the tag, not reasoning.
        if (starts_with(buf_, kThinkStart)) {
          buf_.erase(0, kThinkStart.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && starts_with(kThinkStart, buf_)) return;  // could still be <think>
        state_ = State::kReasoning;
        continue;
      }
      case State::kReasoning: {
        const size_t p = buf_.find(kThinkEnd);
        if (p != std::string::npos) {
          out.reasoning += buf_.substr(0, p);
          buf_.erase(0, p + kThinkEnd.size());
          state_ = State::kContent;
          continue;
        }
        const size_t keep = final ? 0 : partial_suffix(buf_, kThinkEnd);
        out.reasoning += buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case State::kContent:
        out.content += buf_;
        buf_.clear();
        return;
    }
  }
}

}  // namespace osprey::server
