// Chat encoding, written natively (no template engine) for the formats osprey serves:
//
//   deepseek-v3   (V3, R1)
//   <bos>{system}<｜User｜>{user}<｜Assistant｜>{answer}<｜end▁of▁sentence｜>…
//                            generation prompt: <｜Assistant｜>
//                            tool calls (content null): <｜Assistant｜><｜tool▁calls▁begin｜>
//                            <｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}
//                            \n```<｜tool▁call▁end｜>…; tool results <｜tool▁outputs▁begin｜>
//                            <｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜>…<｜tool▁outputs▁end｜>
//                            (the template of the DeepSeek-V3 tokenizer_config.json, quirks
//                            included: see render_v3 in chat.cpp). The tool list is not rendered.
//   deepseek-v3.1 (V3.1: the thinking switch)
//                            <bos>{system}<｜User｜>{user}<｜Assistant｜></think>{answer}<eos>…
//                            generation prompt (after a user turn): <｜Assistant｜><think> when
//                            thinking, else <｜Assistant｜></think>. An earlier answer loses the
//                            reasoning before its first </think>; an assistant message that does
//                            not follow a user turn gets no tag. Tool calls: <｜tool▁calls▁begin｜>
//                            <｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>…
//                            <｜tool▁calls▁end｜><eos>; results <｜tool▁output▁begin｜>{result}
//                            <｜tool▁output▁end｜>. (DeepSeek-V3.1's template; the tool list is not
//                            rendered by it.)
//   deepseek-v3.2 (V3.2: DeepSeek's encoding/encoding_dsv32.py, which replaces a template)
//                            <bos>{system}<｜User｜>{user}<｜Assistant｜></think>{answer}<eos>…
//                            every user turn ends in <｜Assistant｜> and </think> (<think> for the
//                            last one when thinking); in thinking mode an answer after the last
//                            user turn is {reasoning_content}</think>{content}. Tools: a system
//                            block "## Tools …<functions>{schemas}</functions>" first; calls
//                            \n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="…">\n
//                            <｜DSML｜parameter name="…"
//                            string="true|false">…</｜DSML｜parameter>…; results
//                            \n\n<function_results>\n<result>…</result>\n
//                            </function_results>\n\n</think> (<think> when thinking).
//   simple    (models that bring no format)
//                            <bos>System: {system}\n\nUser: {user}\n\nAssistant: {answer}<eos>\n\n
//                            generation prompt: Assistant:
//
// System messages are gathered and joined with "\n\n" at the start (as DeepSeek's templates do).
// Special tokens are looked up by their text in the tokenizer's added tokens; the ids are never
// written here. (<think> / </think> are encoded as text by a tokenizer that lacks them, as the
// original V3 tokenizer does.) Text in messages is encoded like any text (added-token text inside
// it is recognised, as when a rendered template is tokenized), so encode(messages) equals
// tokenizer.encode(render(messages)).
#pragma once

#include <deque>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {

enum class ChatFormat { kDeepSeekV3, kDeepSeekV31, kDeepSeekV32, kSimple };

// "deepseek-v3" (alias "deepseek-r1"), "deepseek-v3.1", "deepseek-v3.2", "simple".
std::optional<ChatFormat> parse_chat_format(std::string_view name);
std::string_view chat_format_name(ChatFormat format);

// One call of an assistant message (OpenAI's tool_calls[i]).
struct ChatToolCall {
  std::string id;
  std::string type = "function";
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role_, std::string content_)
      : role(std::move(role_)), content(std::move(content_)) {}

  std::string role;  // system | user | assistant | tool
  std::string content;
  bool content_is_null = false;   // "content": null (an assistant message that only calls tools)
  std::string reasoning_content;  // assistant; rendered by deepseek-v3.2 in thinking mode
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool thinking = false;  // deepseek-v3.1 and v3.2
  // The tools offered (each OpenAI tools[i].function, as JSON text written as Python's json.dumps
  // writes it). Only deepseek-v3.2 renders them; the V3 and V3.1 templates ignore the tool list.
  std::vector<std::string> tools;
};

// Chooses the format from a model folder: config.json (model_type deepseek_v32 -> v3.2)
// and tokenizer_config.json's chat_template (DeepSeek markers, with or without </think>); else
// deepseek-v3 when the tokenizer has <｜User｜> and <｜Assistant｜>; else simple. Missing files are
// fine.
ChatFormat detect_chat_format(const std::filesystem::path& model_dir, const Tokenizer& tokenizer);
ChatFormat detect_chat_format(const nlohmann::json& model_config,
                              const nlohmann::json& tokenizer_config, const Tokenizer& tokenizer);

// Parses [{"role": ..., "content": ...}, ...] (and tool_calls, tool_call_id, reasoning_content);
// throws osprey::Error.
std::vector<ChatMessage> parse_chat_messages(const nlohmann::json& messages);

class ChatEncoder {
 public:
  // Throws osprey::Error when the tokenizer lacks a special token the format needs.
  ChatEncoder(const Tokenizer& tokenizer, ChatFormat format);

  std::vector<TokenId> encode(std::span<const ChatMessage> messages,
                              const ChatOptions& options = {}) const;
  // The prompt as text (what a template engine would produce).
  std::string render(std::span<const ChatMessage> messages, const ChatOptions& options = {}) const;
  ChatFormat format() const { return format_; }

 private:
  struct Part {
    enum class Kind { kText, kToken } kind;
    std::string_view text;
  };
  // Appends to a prompt's parts: text (nothing when empty), text built here (kept alive in
  // `storage`, which the parts point into), special tokens.
  struct PartWriter {
    std::vector<Part>& out;
    std::deque<std::string>& storage;
    void text(std::string_view t) {
      if (!t.empty()) out.push_back({Part::Kind::kText, t});
    }
    void owned(std::string t) {
      storage.push_back(std::move(t));
      text(storage.back());
    }
    void token(std::string_view t) { out.push_back({Part::Kind::kToken, t}); }
  };
  std::vector<Part> parts(std::span<const ChatMessage> messages, const ChatOptions& options,
                          std::deque<std::string>& storage) const;
  void render_v32(std::span<const ChatMessage> messages, const ChatOptions& options,
                  PartWriter& w) const;
  void require(std::string_view token) const;

  const Tokenizer& tokenizer_;
  ChatFormat format_;
};

}  // namespace osprey::tokenizer
