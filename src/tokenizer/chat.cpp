#include "tokenizer/chat.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

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
  if (name == "deepseek-v3.1" || name == "deepseek-v3.2") return ChatFormat::kDeepSeekV31;
  if (name == "simple") return ChatFormat::kSimple;
  return std::nullopt;
}

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::kDeepSeekV3:
      return "deepseek-v3";
    case ChatFormat::kDeepSeekV31:
      return "deepseek-v3.1";
    case ChatFormat::kSimple:
      return "simple";
  }
  return "?";
}

ChatFormat detect_chat_format(const json& model_config, const json& tokenizer_config,
                              const Tokenizer& tokenizer) {
  if (model_config.is_object() && model_config.value("model_type", "") == "deepseek_v32") {
    return ChatFormat::kDeepSeekV31;
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
                                                  const ChatOptions& options) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      fail("chat message ", i, ": unknown role '", role, "' (expected system, user or assistant)");
    }
  }
  std::vector<Part> out;
  auto text = [&](std::string_view t) {
    if (!t.empty()) out.push_back({Part::Kind::kText, t});
  };
  auto token = [&](std::string_view t) { out.push_back({Part::Kind::kToken, t}); };
  const std::string& bos = tokenizer_.bos_token();
  if (!bos.empty() && tokenizer_.added_vocabulary().find(bos)) token(bos);

  if (format_ == ChatFormat::kSimple) {
    const std::string& eos = tokenizer_.eos_token();
    const bool has_eos = !eos.empty() && tokenizer_.added_vocabulary().find(eos);
    for (const ChatMessage& m : messages) {
      text(m.role == "system" ? "System: " : m.role == "user" ? "User: " : "Assistant: ");
      text(m.content);
      if (m.role == "assistant" && has_eos) token(eos);
      text("\n\n");
    }
    if (options.add_generation_prompt) text("Assistant:");
    return out;
  }

  bool first_system = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!first_system) text(kSystemSeparator);
    text(m.content);
    first_system = false;
  }
  if (format_ == ChatFormat::kDeepSeekV3) {
    for (const ChatMessage& m : messages) {
      if (m.role == "user") {
        token(kUser);
        text(m.content);
      } else if (m.role == "assistant") {
        token(kAssistant);
        text(m.content);
        token(kEndOfSentence);
      }
    }
    if (options.add_generation_prompt) token(kAssistant);
    return out;
  }
  // deepseek-v3.1: the assistant tag (with </think>) opens only an answer to a user turn; the
  // reasoning part of an earlier answer (up to the first </think>) is dropped.
  bool after_user = false;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      token(kUser);
      text(m.content);
      after_user = true;
    } else if (m.role == "assistant") {
      if (after_user) {
        token(kAssistant);
        token(kEndThink);
      }
      after_user = false;
      std::string_view content = m.content;
      if (const size_t end = content.find(kEndThink); end != std::string_view::npos) {
        content.remove_prefix(end + kEndThink.size());
      }
      text(content);
      token(kEndOfSentence);
    }
  }
  if (options.add_generation_prompt && after_user) {
    token(kAssistant);
    token(options.thinking ? kThink : kEndThink);
  }
  return out;
}

std::string ChatEncoder::render(std::span<const ChatMessage> messages,
                                const ChatOptions& options) const {
  std::string out;
  for (const Part& p : parts(messages, options)) out += p.text;
  return out;
}

std::vector<TokenId> ChatEncoder::encode(std::span<const ChatMessage> messages,
                                         const ChatOptions& options) const {
  // Text between two special tokens is encoded as one string, exactly as when the rendered
  // prompt is tokenized whole (a message boundary is no pre-tokenizer boundary).
  std::vector<TokenId> ids;
  std::string pending;
  for (const Part& p : parts(messages, options)) {
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
