#include "server/chat_output.h"

namespace osprey::server {

using nlohmann::json;

ChatOutput::ChatOutput(const ChatOutputOptions& options, std::function<std::string()> make_call_id)
    : make_call_id_(std::move(make_call_id)) {
  if (options.reasoning_parser) reasoning_.emplace(*options.reasoning_parser, options.thinking);
  if (options.tool_parser) {
    tools_.emplace(*options.tool_parser);
    if (!options.assumed_prefix.empty()) tools_->assume_prefix(options.assumed_prefix);
  }
}

ChatDelta ChatOutput::route(ReasoningDelta r, bool final) {
  ChatDelta d;
  d.reasoning = std::move(r.reasoning);
  ToolParseDelta t;
  if (tools_) {
    t = tools_->feed(r.content);
    if (final) {
      ToolParseDelta rest = tools_->finish();
      t.content += rest.content;
      for (auto& c : rest.calls) t.calls.push_back(std::move(c));
    }
  } else {
    t.content = std::move(r.content);
  }
  d.content = std::move(t.content);
  for (ParsedToolCall& c : t.calls) {
    ToolCallOut o;
    o.index = int(calls_.size());
    o.id = make_call_id_();
    o.name = std::move(c.name);
    o.arguments = std::move(c.arguments);
    calls_.push_back(o);
    d.calls.push_back(std::move(o));
  }
  reasoning_text_ += d.reasoning;
  content_ += d.content;
  return d;
}

ChatDelta ChatOutput::feed(std::string_view text) {
  if (!reasoning_) return route({"", std::string(text)}, false);
  return route(reasoning_->feed(text), false);
}

ChatDelta ChatOutput::finish() {
  if (!reasoning_) return route({}, true);
  return route(reasoning_->finish(), true);
}

std::vector<json> ChatOutput::delta_json(const ChatDelta& d) const {
  std::vector<json> out;
  if (!d.reasoning.empty() || !d.content.empty()) {
    json x = json::object();
    if (!d.reasoning.empty()) x["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) x["content"] = d.content;
    out.push_back(std::move(x));
  }
  for (const ToolCallOut& c : d.calls) {
    out.push_back({{"tool_calls",
                    {{{"index", c.index},
                      {"id", c.id},
                      {"type", "function"},
                      {"function", {{"name", c.name}, {"arguments", ""}}}}}}});
    out.push_back(
        {{"tool_calls", {{{"index", c.index}, {"function", {{"arguments", c.arguments}}}}}}});
  }
  return out;
}

json ChatOutput::message_json() const {
  json m = {{"role", "assistant"}};
  m["content"] = content_.empty() && !calls_.empty() ? json(nullptr) : json(content_);
  if (reasoning_active())
    m["reasoning_content"] = reasoning_text_.empty() ? json(nullptr) : json(reasoning_text_);
  if (!calls_.empty()) {
    json calls = json::array();
    for (const ToolCallOut& c : calls_)
      calls.push_back({{"id", c.id},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = calls;
  }
  return m;
}

}  // namespace osprey::server
