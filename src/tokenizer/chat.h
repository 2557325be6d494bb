// Chat encoding, written natively (no template engine) for the formats osprey serves:
//
//   deepseek-v3   (V3, R1)
//   <bos>{system}<｜User｜>{user}<｜Assistant｜>{answer}<｜end▁of▁sentence｜>…
//                            generation prompt: <｜Assistant｜>
//   deepseek-v3.1 (V3.1, V3.2: the thinking switch)
//                            <bos>{system}<｜User｜>{user}<｜Assistant｜></think>{answer}<eos>…
//                            generation prompt (after a user turn): <｜Assistant｜><think> when
//                            thinking, else <｜Assistant｜></think>. An earlier answer loses the
//                            reasoning before its first </think>; an assistant message that does
//                            not follow a user turn gets no tag. (As DeepSeek-V3.1's template;
//                            V3.2's encoding script gives the same for these roles.)
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

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace osprey::tokenizer {

enum class ChatFormat { kDeepSeekV3, kDeepSeekV31, kSimple };

// "deepseek-v3" (alias "deepseek-r1"), "deepseek-v3.1" (alias "deepseek-v3.2"), "simple".
std::optional<ChatFormat> parse_chat_format(std::string_view name);
std::string_view chat_format_name(ChatFormat format);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool thinking = false;  // deepseek-v3.1 only
};

// Chooses the format from a model folder: config.json (model_type deepseek_v32 -> v3.1 style)
// and tokenizer_config.json's chat_template (DeepSeek markers, with or without </think>); else
// deepseek-v3 when the tokenizer has <｜User｜> and <｜Assistant｜>; else simple. Missing files are
// fine.
ChatFormat detect_chat_format(const std::filesystem::path& model_dir, const Tokenizer& tokenizer);
ChatFormat detect_chat_format(const nlohmann::json& model_config,
                              const nlohmann::json& tokenizer_config, const Tokenizer& tokenizer);

// Parses [{"role": ..., "content": ...}, ...]; throws osprey::Error.
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
  std::vector<Part> parts(std::span<const ChatMessage> messages, const ChatOptions& options) const;
  void require(std::string_view token) const;

  const Tokenizer& tokenizer_;
  ChatFormat format_;
};

}  // namespace osprey::tokenizer
