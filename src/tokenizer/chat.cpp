#include "tokenizer/chat.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/python_json.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;

// DeepSeek's special tokens, by their text (full-width ｜ U+FF5C, ▁ U+2581).
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEndOfSentence = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThink = "<think>";
constexpr std::string_view kEndThink = "</think>";
constexpr std::string_view kSystemSeparator = "\n\n";
constexpr std::string_view kToolCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kToolCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kToolCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kToolCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
constexpr std::string_view kToolOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kToolOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kToolOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kToolOutputEnd = "<｜tool▁output▁end｜>";
// V3.2's markup is text, not special tokens: "｜DSML｜" (full-width bars).
constexpr std::string_view kDsml = "｜DSML｜";

// TOOLS_SYSTEM_TEMPLATE of DeepSeek-V3.2's encoding_dsv32.py, as vLLM
// (vllm/tokenizers/deepseek_v32_encoding.py), SGLang (entrypoints/openai/encoding_dsv32.py) and
// TensorRT-LLM copy it from the model repository: no blank lines between its paragraphs.
std::string v32_tools_prompt(const std::string& schemas) {
  const std::string d(kDsml);
  return "## Tools\n"
         "You have access to a set of tools you can use to answer the user's question.\n"
         "You can invoke functions by writing a \"<" +
         d +
         "function_calls>\" block like the "
         "following as part of your reply to the user:\n"
         "<" +
         d +
         "function_calls>\n"
         "<" +
         d +
         "invoke name=\"$FUNCTION_NAME\">\n"
         "<" +
         d + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + d +
         "parameter>\n"
         "...\n"
         "</" +
         d +
         "invoke>\n"
         "<" +
         d +
         "invoke name=\"$FUNCTION_NAME2\">\n"
         "...\n"
         "</" +
         d +
         "invoke>\n"
         "</" +
         d +
         "function_calls>\n"
         "String and scalar parameters should be specified as is without any escaping or quotes, "
         "while lists and objects should use JSON format. The \"string\" attribute should be set "
         "to \"true\" for string type parameters and \"false\" for other types (numbers, "
         "booleans, arrays, objects).\n"
         "If the thinking_mode is enabled, then after function results you should strongly "
         "consider outputting a thinking block. Here is an example:\n"
         "<" +
         d +
         "function_calls>\n"
         "...\n"
         "</" +
         d +
         "function_calls>\n"
         "<function_results>\n"
         "...\n"
         "</function_results>\n"
         "<think>...thinking about results</think>\n"
         "Here are the functions available in JSONSchema format:\n"
         "<functions>\n" +
         schemas + "\n</functions>\n";
}

// One call as encode_arguments_to_dsml + tool_call_template write it: string values as they are,
// other values as JSON (Python's json.dumps), in the arguments' own key order.
std::string v32_invoke(const ChatToolCall& call, size_t message) {
  nlohmann::ordered_json args;
  try {
    args = nlohmann::ordered_json::parse(call.arguments);
  } catch (const nlohmann::json::exception&) {
    fail("chat message ", message, ": tool call '", call.name,
         "' has arguments that are not valid JSON");
  }
  if (!args.is_object())
    fail("chat message ", message, ": tool call '", call.name, "' arguments must be a JSON object");
  const std::string d(kDsml);
  std::string out = "<" + d + "invoke name=\"" + call.name + "\">\n";
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out += "\n";
    first = false;
    const bool is_str = it.value().is_string();
    out += "<" + d + "parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") +
           "\">";
    out += is_str ? it.value().get<std::string>() : python_json_dumps(it.value());
    out += "</" + d + "parameter>";
  }
  out += "\n</" + d + "invoke>";
  return out;
}

json read_json_if_present(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return json::object();
  std::ifstream in(path, std::ios::binary);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("'", path.string(), "' is not valid JSON (", e.what(), ")");
  }
}

}  // namespace

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  if (name == "deepseek-v3" || name == "deepseek-r1") return ChatFormat::kDeepSeekV3;
  if (name == "deepseek-v3.1") return ChatFormat::kDeepSeekV31;
  if (name == "deepseek-v3.2") return ChatFormat::kDeepSeekV32;
  if (name == "simple") return ChatFormat::kSimple;
  return std::nullopt;
}

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kDeepSeekV3:
      return "deepseek-v3";
    case ChatFormat::kDeepSeekV31:
      return "deepseek-v3.1";
    case ChatFormat::kDeepSeekV32:
      return "deepseek-v3.2";
    case ChatFormat::kSimple:
      return "simple";
  }
  return "?";
}

ChatFormat detect_chat_format(const json& model_config, const json& tokenizer_config,
                              const Tokenizer& tokenizer) {
  if (model_config.is_object() && model_config.value("model_type", "") == "deepseek_v32") {
    return ChatFormat::kDeepSeekV32;
  }
  if (tokenizer_config.is_object() && tokenizer_config.contains("chat_template") &&
      tokenizer_config.at("chat_template").is_string()) {
    const auto& tmpl = tokenizer_config.at("chat_template").get_ref<const std::string&>();
    if (tmpl.find(kAssistant) != std::string::npos) {
      return tmpl.find(kEndThink) != std::string::npos ? ChatFormat::kDeepSeekV31
                                                       : ChatFormat::kDeepSeekV3;
    }
  }
  const auto& added = tokenizer.added_vocabulary();
  if (added.find(kUser) && added.find(kAssistant)) return ChatFormat::kDeepSeekV3;
  return ChatFormat::kSimple;
}

ChatFormat detect_chat_format(const std::filesystem::path& model_dir, const Tokenizer& tokenizer) {
  return detect_chat_format(read_json_if_present(model_dir / "config.json"),
                            read_json_if_present(model_dir / "tokenizer_config.json"), tokenizer);
}

std::vector<ChatMessage> parse_chat_messages(const json& messages) {
  if (!messages.is_array()) fail("chat messages must be a JSON array of {role, content} objects");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m.at("role").is_string()) {
      fail("chat message ", i, ": expected an object with a string \"role\"");
    }
    ChatMessage msg;
    msg.role = m.at("role").get<std::string>();
    if (m.contains("content") && !m.at("content").is_null()) {
      if (!m.at("content").is_string()) fail("chat message ", i, ": \"content\" must be a string");
      msg.content = m.at("content").get<std::string>();
    } else {
      msg.content_is_null = true;
    }
    for (const char* key : {"reasoning_content", "reasoning"}) {
      if (m.contains(key) && m.at(key).is_string() && msg.reasoning_content.empty())
        msg.reasoning_content = m.at(key).get<std::string>();
    }
    if (m.contains("tool_call_id") && m.at("tool_call_id").is_string())
      msg.tool_call_id = m.at("tool_call_id").get<std::string>();
    if (m.contains("tool_calls") && !m.at("tool_calls").is_null()) {
      const json& calls = m.at("tool_calls");
      if (!calls.is_array()) fail("chat message ", i, ": \"tool_calls\" must be a list");
      for (size_t c = 0; c < calls.size(); ++c) {
        const json& x = calls[c];
        if (!x.is_object() || !x.contains("function") || !x.at("function").is_object() ||
            !x.at("function").contains("name") || !x.at("function").at("name").is_string())
          fail("chat message ", i, ": tool_calls[", c, "] needs function.name");
        ChatToolCall call;
        call.id = x.value("id", "");
        call.type = x.value("type", "function");
        call.name = x.at("function").at("name").get<std::string>();
        const json& args = x.at("function").value("arguments", json("{}"));
        call.arguments = args.is_string() ? args.get<std::string>() : args.dump();
        msg.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

ChatEncoder::ChatEncoder(const Tokenizer& tokenizer, ChatFormat format)
    : tokenizer_(tokenizer), format_(format) {
  if (format_ == ChatFormat::kSimple) return;
  require(kUser);
  require(kAssistant);
  require(kEndOfSentence);
  // <think> and </think> are added tokens from V3.1 on; with an older tokenizer they are text.
}

void ChatEncoder::require(std::string_view token) const {
  if (!tokenizer_.added_vocabulary().find(token)) {
    fail("chat format ", chat_format_name(format_), " needs the special token ", token,
         ", which this tokenizer does not have; choose another chat format");
  }
}

std::vector<ChatEncoder::Part> ChatEncoder::parts(std::span<const ChatMessage> messages,
                                                  const ChatOptions& options,
                                                  std::deque<std::string>& storage) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string& role = m.role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      fail("chat message ", i, ": unknown role '", role,
           "' (expected system, user, assistant or tool)");
    }
    if (!m.tool_calls.empty() && role != "assistant")
      fail("chat message ", i, ": only assistant messages carry tool_calls");
  }
  std::vector<Part> out;
  PartWriter w{out, storage};
  const std::string& bos = tokenizer_.bos_token();
  if (!bos.empty() && tokenizer_.added_vocabulary().find(bos)) w.token(bos);

  if (format_ == ChatFormat::kSimple) {
    const std::string& eos = tokenizer_.eos_token();
    const bool has_eos = !eos.empty() && tokenizer_.added_vocabulary().find(eos);
    for (const ChatMessage& m : messages) {
      w.text(m.role == "system" ? "System: "
             : m.role == "user" ? "User: "
             : m.role == "tool" ? "Tool: "
                                : "Assistant: ");
      w.text(m.content);
      for (const ChatToolCall& c : m.tool_calls) w.owned("\n" + c.name + "(" + c.arguments + ")");
      if (m.role == "assistant" && has_eos) w.token(eos);
      w.text("\n\n");
    }
    if (options.add_generation_prompt) w.text("Assistant:");
    return out;
  }
  if (format_ == ChatFormat::kDeepSeekV32) {
    render_v32(messages, options, w);
    return out;
  }

  bool first_system = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!first_system) w.text(kSystemSeparator);
    w.text(m.content);
    first_system = false;
  }
  if (format_ == ChatFormat::kDeepSeekV3) {
    // DeepSeek-V3's template, statement by statement, with its quirks: tool calls are rendered
    // only when "content" is null; "is_first" is never reset, so only the first call of the whole
    // conversation opens <｜Assistant｜><｜tool▁calls▁begin｜>; <｜tool▁calls▁end｜><eos> follow a
    // second or later call only; "is_output_first" is never reset either.
    bool is_first = false, is_tool = false, is_output_first = true;
    for (const ChatMessage& m : messages) {
      if (m.role == "user") {
        is_tool = false;
        w.token(kUser);
        w.text(m.content);
      } else if (m.role == "assistant" && m.content_is_null) {
        is_tool = false;
        for (const ChatToolCall& c : m.tool_calls) {
          const bool opens = !is_first;
          if (opens) {
            w.token(kAssistant);
            w.token(kToolCallsBegin);
            is_first = true;
          } else {
            w.text("\n");
          }
          w.token(kToolCallBegin);
          w.text(c.type);
          w.token(kToolSep);
          w.owned(c.name + "\n```json\n" + c.arguments + "\n```");
          w.token(kToolCallEnd);
          if (!opens) {
            w.token(kToolCallsEnd);
            w.token(kEndOfSentence);
          }
        }
      } else if (m.role == "assistant") {
        if (is_tool) {
          w.token(kToolOutputsEnd);
          is_tool = false;
        } else {
          w.token(kAssistant);
        }
        w.text(m.content);
        w.token(kEndOfSentence);
      } else if (m.role == "tool") {
        is_tool = true;
        if (is_output_first) {
          w.token(kToolOutputsBegin);
          is_output_first = false;
        } else {
          w.text("\n");
        }
        w.token(kToolOutputBegin);
        w.text(m.content);
        w.token(kToolOutputEnd);
      }
    }
    if (is_tool) w.token(kToolOutputsEnd);
    if (options.add_generation_prompt && !is_tool) w.token(kAssistant);
    return out;
  }
  // deepseek-v3.1 (DeepSeek-V3.1's template): the assistant tag (with </think>) opens only an
  // answer to a user turn; the reasoning part of an earlier answer (up to the first </think>) is
  // dropped, except in an answer that follows tool results.
  bool is_last_user = false, is_tool = false;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      is_tool = false;
      is_last_user = true;
      w.token(kUser);
      w.text(m.content);
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      if (is_last_user) {
        w.token(kAssistant);
        w.token(kEndThink);
      }
      is_last_user = false;
      is_tool = false;
      if (!m.content_is_null) w.text(m.content);
      w.token(kToolCallsBegin);
      for (const ChatToolCall& c : m.tool_calls) {
        w.token(kToolCallBegin);
        w.text(c.name);
        w.token(kToolSep);
        w.text(c.arguments);
        w.token(kToolCallEnd);
      }
      w.token(kToolCallsEnd);
      w.token(kEndOfSentence);
    } else if (m.role == "assistant") {
      if (is_last_user) {
        w.token(kAssistant);
        w.token(kEndThink);
      }
      is_last_user = false;
      std::string_view content = m.content;
      if (is_tool) {
        is_tool = false;
      } else if (const size_t end = content.find(kEndThink); end != std::string_view::npos) {
        content.remove_prefix(end + kEndThink.size());
      }
      w.text(content);
      w.token(kEndOfSentence);
    } else if (m.role == "tool") {
      is_last_user = false;
      is_tool = true;
      w.token(kToolOutputBegin);
      w.text(m.content);
      w.token(kToolOutputEnd);
    }
  }
  if (options.add_generation_prompt && is_last_user && !is_tool) {
    w.token(kAssistant);
    w.token(options.thinking ? kThink : kEndThink);
  }
  return out;
}

void ChatEncoder::render_v32(std::span<const ChatMessage> messages, const ChatOptions& options,
                             PartWriter& w) const {
  // DeepSeek-V3.2's encoding_dsv32.py (encode_messages / render_message), with the tools given
  // as vLLM's DeepSeek-V3.2 tokenizer gives them: a system message holding only the tools, put
  // first. The script always adds bos and ignores add_generation_prompt (a user turn always ends
  // in the assistant opener).
  const bool thinking = options.thinking;
  if (!options.tools.empty()) {
    std::string schemas;
    for (const std::string& t : options.tools) {
      if (!schemas.empty()) schemas += "\n";
      schemas += t;
    }
    w.owned("\n\n" + v32_tools_prompt(schemas));
  }
  ptrdiff_t last_user = -1;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == "user") last_user = ptrdiff_t(i);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const ptrdiff_t index = ptrdiff_t(i);
    if (m.role == "system") {
      w.text(m.content);
    } else if (m.role == "user") {
      w.token(kUser);
      w.text(m.content);
      w.token(kAssistant);
      w.token(index == last_user && thinking ? kThink : kEndThink);
    } else if (m.role == "tool") {
      size_t prev = i;
      while (prev > 0 && messages[prev - 1].role == "tool") --prev;
      // prev: the first tool message of this group; the assistant is just before it.
      if (prev == 0 || messages[prev - 1].role != "assistant")
        fail("chat message ", i,
             ": a tool message must follow an assistant message with tool_calls");
      const size_t order = i - prev + 1;
      const size_t calls = messages[prev - 1].tool_calls.size();
      if (calls < order)
        fail("chat message ", i, ": more tool results than the assistant's ", calls, " tool calls");
      if (order == 1) w.text("\n\n<function_results>");
      w.text("\n<result>");
      w.text(m.content);
      w.text("</result>");
      if (order == calls) {
        w.text("\n</function_results>\n\n");
        w.token(index >= last_user && thinking ? kThink : kEndThink);
      }
    } else {  // assistant
      if (thinking && index > last_user) {
        if (m.reasoning_content.empty() && m.tool_calls.empty())
          fail("chat message ", i,
               ": in thinking mode an assistant message after the last user message needs "
               "reasoning_content or tool_calls");
        w.text(m.reasoning_content);
        w.token(kEndThink);
      }
      if (!m.content_is_null) w.text(m.content);
      if (!m.tool_calls.empty()) {
        std::string calls = "\n\n<" + std::string(kDsml) + "function_calls>\n";
        for (size_t c = 0; c < m.tool_calls.size(); ++c) {
          if (c) calls += "\n";
          calls += v32_invoke(m.tool_calls[c], i);
        }
        calls += "\n</" + std::string(kDsml) + "function_calls>";
        w.owned(std::move(calls));
      }
      w.token(kEndOfSentence);
    }
  }
}

std::string ChatEncoder::render(std::span<const ChatMessage> messages,
                                const ChatOptions& options) const {
  std::deque<std::string> storage;
  std::string out;
  for (const Part& p : parts(messages, options, storage)) out += p.text;
  return out;
}

std::vector<TokenId> ChatEncoder::encode(std::span<const ChatMessage> messages,
                                         const ChatOptions& options) const {
  // Text between two special tokens is encoded as one string, exactly as when the rendered
  // prompt is tokenized whole (a message boundary is no pre-tokenizer boundary).
  std::vector<TokenId> ids;
  std::string pending;
  std::deque<std::string> storage;
  for (const Part& p : parts(messages, options, storage)) {
    const AddedToken* token =
        p.kind == Part::Kind::kToken ? tokenizer_.added_vocabulary().find(p.text) : nullptr;
    if (token == nullptr) {
      pending += p.text;
      continue;
    }
    tokenizer_.encode_into(pending, ids);
    pending.clear();
    ids.push_back(token->id);
  }
  tokenizer_.encode_into(pending, ids);
  return ids;
}

}  // namespace osprey::tokenizer
