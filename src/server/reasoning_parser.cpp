#include "server/reasoning_parser.h"

#include "server/partial_marker.h"

namespace osprey::server {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";

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
        if (buf_.starts_with(kThinkStart)) {
          buf_.erase(0, kThinkStart.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && kThinkStart.starts_with(buf_)) return;  // could still be <think>
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
