#include "server/tool_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/partial_marker.h"
#include "tokenizer/python_json.h"

namespace osprey::server {
namespace {

struct Markup {
  std::string_view block_begin, block_end, call_begin, call_end;
};

// V3 and V3.1 use special tokens; V3.2's DSML markup is text (full-width bars).
constexpr Markup kSpecialTokenMarkup = {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                        "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"};
constexpr Markup kDsmlMarkup = {"<｜DSML｜function_calls>", "</｜DSML｜function_calls>",
                                "<｜DSML｜invoke", "</｜DSML｜invoke>"};
constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
constexpr std::string_view kV3Type = "function";
constexpr std::string_view kJsonFenceOpen = "```json";
constexpr std::string_view kJsonFenceClose = "```";
constexpr std::string_view kDsmlParamOpen = "<｜DSML｜parameter";
constexpr std::string_view kDsmlParamClose = "</｜DSML｜parameter>";

const Markup& markup(ToolCallFormat f) {
  return f == ToolCallFormat::kDeepSeekV32 ? kDsmlMarkup : kSpecialTokenMarkup;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool valid_name(std::string_view n) {
  if (n.empty()) return false;
  return std::none_of(n.begin(), n.end(),
                      [](char c) { return is_space(c) || c == '<' || c == '"'; });
}

bool json_object(std::string_view s) {
  if (!nlohmann::json::accept(s)) return false;
  return nlohmann::json::parse(s).is_object();
}

// body: what lies between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>.
std::optional<ParsedToolCall> parse_v3(std::string_view body) {
  const size_t sep = body.find(kToolSep);
  if (sep == std::string_view::npos || trim(body.substr(0, sep)) != kV3Type) return std::nullopt;
  std::string_view rest = body.substr(sep + kToolSep.size());
  const size_t nl = rest.find('\n');
  if (nl == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(rest.substr(0, nl));
  std::string_view fenced = trim(rest.substr(nl + 1));
  if (!fenced.starts_with(kJsonFenceOpen) ||
      fenced.size() < kJsonFenceOpen.size() + kJsonFenceClose.size() ||
      fenced.substr(fenced.size() - kJsonFenceClose.size()) != kJsonFenceClose)
    return std::nullopt;
  fenced.remove_prefix(kJsonFenceOpen.size());
  fenced.remove_suffix(kJsonFenceClose.size());
  const std::string_view args = trim(fenced);
  if (!valid_name(name) || !json_object(args)) return std::nullopt;
  return ParsedToolCall{std::string(name), std::string(args)};
}

std::optional<ParsedToolCall> parse_v31(std::string_view body) {
  const size_t sep = body.find(kToolSep);
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(body.substr(0, sep));
  const std::string_view args = trim(body.substr(sep + kToolSep.size()));
  if (!valid_name(name) || !json_object(args)) return std::nullopt;
  return ParsedToolCall{std::string(name), std::string(args)};
}

// Reads `attr="value"` at the front of s (after optional spaces); advances s past it.
std::optional<std::string_view> attribute(std::string_view& s, std::string_view attr) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  if (!s.starts_with(attr) || s.substr(attr.size(), 2) != "=\"") return std::nullopt;
  s.remove_prefix(attr.size() + 2);
  const size_t q = s.find('"');
  if (q == std::string_view::npos) return std::nullopt;
  const std::string_view v = s.substr(0, q);
  s.remove_prefix(q + 1);
  return v;
}

// body: what lies between "<｜DSML｜invoke" and "</｜DSML｜invoke>".
std::optional<ParsedToolCall> parse_v32(std::string_view body) {
  const auto name = attribute(body, "name");
  if (!name || !valid_name(*name) || !body.starts_with(">")) return std::nullopt;
  body.remove_prefix(1);
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  while (true) {
    body = trim(body);
    if (body.empty()) break;
    if (!body.starts_with(kDsmlParamOpen)) return std::nullopt;
    body.remove_prefix(kDsmlParamOpen.size());
    const auto key = attribute(body, "name");
    const auto is_string = attribute(body, "string");
    if (!key || key->empty() || !is_string || (*is_string != "true" && *is_string != "false") ||
        !body.starts_with(">"))
      return std::nullopt;
    body.remove_prefix(1);
    const size_t close = body.find(kDsmlParamClose);
    if (close == std::string_view::npos) return std::nullopt;
    const std::string value(body.substr(0, close));
    body.remove_prefix(close + kDsmlParamClose.size());
    const std::string k(*key);
    if (args.contains(k)) return std::nullopt;
    if (*is_string == "true" || !nlohmann::ordered_json::accept(value))
      args[k] = value;
    else
      args[k] = nlohmann::ordered_json::parse(value);
  }
  return ParsedToolCall{std::string(*name), tokenizer::python_json_dumps(args)};
}

}  // namespace

std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  if (name == "deepseek_v31") return ToolCallFormat::kDeepSeekV31;
  if (name == "deepseek_v32") return ToolCallFormat::kDeepSeekV32;
  return std::nullopt;
}

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kDeepSeekV31:
      return "deepseek_v31";
    case ToolCallFormat::kDeepSeekV32:
      return "deepseek_v32";
  }
  return "?";
}

ToolCallParser::ToolCallParser(ToolCallFormat format) : format_(format) {}

std::string ToolCallParser::forced_prefix(ToolCallFormat format, const std::string* name) {
  const Markup& m = markup(format);
  std::string p;
  switch (format) {
    case ToolCallFormat::kDeepSeekV3:
      p = std::string(m.block_begin) + std::string(m.call_begin) + std::string(kV3Type) +
          std::string(kToolSep);
      if (name) p += *name + "\n" + std::string(kJsonFenceOpen) + "\n";
      break;
    case ToolCallFormat::kDeepSeekV31:
      p = std::string(m.block_begin) + std::string(m.call_begin);
      if (name) p += *name + std::string(kToolSep);
      break;
    case ToolCallFormat::kDeepSeekV32:
      p = "\n\n" + std::string(m.block_begin) + "\n" + std::string(m.call_begin) + " name=\"";
      if (name) p += *name + "\">\n";
      break;
  }
  return p;
}

void ToolCallParser::assume_prefix(std::string_view prefix) {
  ToolParseDelta ignored;
  silent_ = true;
  buf_ += prefix;
  run(ignored, false);
  silent_ = false;
  hidden_end_ = consumed_ + buf_.size();
}

void ToolCallParser::emit(ToolParseDelta& out, size_t at, std::string_view text) {
  if (silent_) return;
  if (at < hidden_end_) {
    const size_t skip = std::min(text.size(), hidden_end_ - at);
    text.remove_prefix(skip);
  }
  out.content += text;
}

void ToolCallParser::consume(size_t n, bool to_pending) {
  if (to_pending) {
    if (pending_.empty()) pending_at_ = consumed_;
    pending_.append(buf_, 0, n);
  }
  buf_.erase(0, n);
  consumed_ += n;
}

void ToolCallParser::give_back(ToolParseDelta& out) {
  emit(out, pending_at_, pending_);
  pending_.clear();
  state_ = State::kText;
}

ToolParseDelta ToolCallParser::feed(std::string_view text) {
  ToolParseDelta out;
  buf_ += text;
  run(out, false);
  return out;
}

ToolParseDelta ToolCallParser::finish() {
  ToolParseDelta out;
  run(out, true);
  // Whatever is left is an unfinished block: it is content.
  if (!buf_.empty()) consume(buf_.size(), true);
  give_back(out);
  return out;
}

void ToolCallParser::run(ToolParseDelta& out, bool final) {
  const Markup& m = markup(format_);
  while (true) {
    if (state_ == State::kText) {
      const size_t p = buf_.find(m.block_begin);
      if (p == std::string::npos) {
        size_t keep = final ? 0 : partial_suffix(buf_, m.block_begin);
        if (!final && format_ == ToolCallFormat::kDeepSeekV32)  // the "\n\n" before the markup
          while (keep < buf_.size() && is_space(buf_[buf_.size() - keep - 1])) ++keep;
        const size_t n = buf_.size() - keep;
        emit(out, consumed_, std::string_view(buf_).substr(0, n));
        consume(n, false);
        return;
      }
      size_t content_end = p;
      if (format_ == ToolCallFormat::kDeepSeekV32)
        while (content_end > 0 && is_space(buf_[content_end - 1])) --content_end;
      emit(out, consumed_, std::string_view(buf_).substr(0, content_end));
      consume(content_end, false);
      consume(p - content_end + m.block_begin.size(), true);
      state_ = State::kBlock;
      continue;
    }
    if (!step_block(out, final)) return;
  }
}

bool ToolCallParser::step_block(ToolParseDelta& out, bool final) {
  const Markup& m = markup(format_);
  size_t ws = 0;
  while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
  consume(ws, true);
  const std::string_view b = buf_;
  if (b.empty()) return false;
  if (b.starts_with(m.block_end)) {
    consume(m.block_end.size(), true);
    pending_.clear();  // a finished block: its markup is not content
    state_ = State::kText;
    return true;
  }
  if (b.starts_with(m.call_begin)) {
    const size_t end = b.find(m.call_end, m.call_begin.size());
    if (end == std::string_view::npos) return false;  // wait for the rest of the call
    const std::string_view body = b.substr(m.call_begin.size(), end - m.call_begin.size());
    std::optional<ParsedToolCall> call = format_ == ToolCallFormat::kDeepSeekV3 ? parse_v3(body)
                                         : format_ == ToolCallFormat::kDeepSeekV31
                                             ? parse_v31(body)
                                             : parse_v32(body);
    consume(end + m.call_end.size(), true);
    if (!call) {
      give_back(out);  // malformed: the markup is content; what follows is read as text again
      return true;
    }
    pending_.clear();
    ++num_calls_;
    if (!silent_) out.calls.push_back(std::move(*call));
    return true;
  }
  const bool could_become = m.call_begin.starts_with(b) || m.block_end.starts_with(b);
  if (could_become && !final) return false;
  give_back(out);  // unexpected text inside the block
  return true;
}

}  // namespace osprey::server
