// The assistant message of one chat choice, built from the generated text as it streams: the
// reasoning parser splits off reasoning_content, the tool-call parser takes tool calls out of the
// content (each given an id), and what is left is the content. The deltas to stream and the final
// message are written here as OpenAI's JSON.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_parser.h"

namespace osprey::server {

struct ChatOutputOptions {
  std::optional<ToolCallFormat> tool_parser;        // none: tool markup stays content
  std::optional<ReasoningFormat> reasoning_parser;  // none: reasoning stays content
  bool thinking = false;                            // chat_template_kwargs.thinking
  std::string
      assumed_prefix;  // tool-call markup already in the prompt (tool_choice required/named)
};

struct ToolCallOut {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallOut> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class ChatOutput {
 public:
  ChatOutput(const ChatOutputOptions& options, std::function<std::string()> make_call_id);

  ChatDelta feed(std::string_view text);
  ChatDelta finish();

  // The streamed chunks' "delta" objects for this piece, in order: reasoning / content first,
  // then per tool call one delta with index, id, type and name (arguments "") and one with its
  // arguments.
  std::vector<nlohmann::json> delta_json(const ChatDelta& d) const;
  // The final "message" (after finish()).
  nlohmann::json message_json() const;
  bool has_tool_calls() const { return !calls_.empty(); }
  bool reasoning_active() const { return reasoning_ && reasoning_->active(); }

 private:
  ChatDelta route(ReasoningDelta r, bool final);

  std::optional<ReasoningParser> reasoning_;
  std::optional<ToolCallParser> tools_;
  std::function<std::string()> make_call_id_;
  std::string reasoning_text_, content_;
  std::vector<ToolCallOut> calls_;
};

}  // namespace osprey::server
