// The tool-calling part of a /v1/chat/completions request, as OpenAI (and vLLM) define it:
// `tools`, `tool_choice`, `parallel_tool_calls`, and the messages with their tool fields
// (assistant `tool_calls` and `reasoning_content`, `role: "tool"` with `tool_call_id`), checked
// field by field (ApiError 400 naming the field) and turned into chat-encoder input.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/chat.h"

namespace osprey::server {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ChatTools {
  std::vector<std::string> schemas;  // each tools[i].function as Python's json.dumps writes it
  std::vector<std::string> names;
  ToolChoice choice = ToolChoice::kNone;  // "auto" when tools are given and no choice is
  std::string named;                      // the function tool_choice names
};

// `raw_body`, when given, is the request text: the tool schemas keep the client's key order
// (what DeepSeek-V3.2's prompt shows the model), which a parsed nlohmann::json has lost.
ChatTools parse_chat_tools(const nlohmann::json& body, const std::string* raw_body);

// messages[i] → ChatMessage: roles system / developer (as system) / user / assistant / tool.
std::vector<tokenizer::ChatMessage> parse_api_messages(const nlohmann::json& messages);

}  // namespace osprey::server
