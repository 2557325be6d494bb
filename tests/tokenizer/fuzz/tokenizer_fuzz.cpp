// libFuzzer target for encode and decode (built with clang by scripts/tokenizer_fuzz.sh, not by
// the main g++ build). The tokenizer is OSPREY_FUZZ_TOKENIZER (a tokenizer.json or its folder).
// The first input byte picks what to do with the rest:
//   0: encode as text; valid UTF-8 must round-trip (decode(encode(s)) == s) and stream to the
//      same text; invalid UTF-8 must be refused with osprey::Error.
//   1: the same with added-token text treated as plain text.
//   2: decode the bytes read as little-endian 24-bit ids (some past the vocabulary): unknown ids
//      must raise osprey::Error; otherwise the text is valid UTF-8 and streaming agrees.
//   3: a chat (DeepSeek-V3 format when the tokenizer has its tokens, else simple) whose messages
//      are the text split at '\x01': encode must equal encoding the rendered prompt.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tk = osprey::tokenizer;

namespace {

const tk::Tokenizer* g_tokenizer = nullptr;
const tk::ChatEncoder* g_chat = nullptr;

[[noreturn]] void die(const char* what, std::string_view input) {
  std::fprintf(stderr, "tokenizer_fuzz: %s (input of %zu bytes)\n", what, input.size());
  std::abort();
}

std::string stream(const std::vector<tk::TokenId>& ids) {
  tk::IncrementalDetokenizer detok(*g_tokenizer);
  std::string out;
  for (tk::TokenId id : ids) {
    std::string delta = detok.step(id);
    if (!tk::utf8_is_valid(delta)) die("a streamed delta is not valid UTF-8", "");
    out += delta;
  }
  return out + detok.finish();
}

void check_text(std::string_view text, bool parse_added) {
  tk::EncodeOptions options;
  options.parse_added_tokens = parse_added;
  const bool valid = tk::utf8_is_valid(text);
  std::vector<tk::TokenId> ids;
  try {
    ids = g_tokenizer->encode(text, options);
  } catch (const osprey::Error&) {
    if (valid) die("valid UTF-8 was refused", text);
    return;
  }
  if (!valid) die("invalid UTF-8 was accepted", text);
  const std::string decoded = g_tokenizer->decode(ids);
  if (decoded != text) die("decode(encode(s)) != s", text);
  if (stream(ids) != decoded) die("streamed text != decode", text);
}

void check_ids(std::string_view bytes) {
  std::vector<tk::TokenId> ids;
  bool all_known = true;
  const uint32_t range = static_cast<uint32_t>(g_tokenizer->id_limit()) + 64;
  for (size_t i = 0; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) | static_cast<uint8_t>(bytes[i + 1]) << 8 |
                       static_cast<uint8_t>(bytes[i + 2]) << 16;
    ids.push_back(static_cast<tk::TokenId>(v % range));
    all_known &= g_tokenizer->is_known(ids.back());
  }
  std::string decoded;
  try {
    decoded = g_tokenizer->decode(ids);
  } catch (const osprey::Error&) {
    if (all_known) die("decode refused known ids", bytes);
    return;
  }
  if (!all_known) die("decode accepted an unknown id", bytes);
  if (!tk::utf8_is_valid(decoded)) die("decode produced invalid UTF-8", bytes);
  if (stream(ids) != decoded) die("streamed text != decode (ids)", bytes);
}

void check_chat(std::string_view text) {
  if (!tk::utf8_is_valid(text)) return;
  std::vector<tk::ChatMessage> messages;
  const char* roles[] = {"system", "user", "assistant"};
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\x01') {
      messages.push_back({roles[messages.size() % 3], std::string(text.substr(start, i - start))});
      start = i + 1;
    }
  }
  tk::ChatOptions options;
  options.add_generation_prompt = text.size() % 2 == 0;
  if (g_chat->encode(messages, options) != g_tokenizer->encode(g_chat->render(messages, options))) {
    die("chat encode != encode(render)", text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("OSPREY_FUZZ_TOKENIZER");
  if (path == nullptr) {
    std::fprintf(stderr, "tokenizer_fuzz: set OSPREY_FUZZ_TOKENIZER to a tokenizer.json\n");
    std::exit(2);
  }
  try {
    g_tokenizer = new tk::Tokenizer(tk::Tokenizer::load(path));
    const bool deepseek = g_tokenizer->added_vocabulary().find("<｜User｜>") != nullptr;
    g_chat = new tk::ChatEncoder(*g_tokenizer,
                                 deepseek ? tk::ChatFormat::kDeepSeekV3 : tk::ChatFormat::kSimple);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", e.what());
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      check_text(rest, true);
      break;
    case 1:
      check_text(rest, false);
      break;
    case 2:
      check_ids(rest);
      break;
    default:
      check_chat(rest);
      break;
  }
  return 0;
}
