// Compares osprey's tokenizer with reference encodings: reads the JSON lines written by
// tools/tokenizer/reference_encode.mjs ({"category", "text", "ids", "decoded"}) and requires, for
// every line, identical ids from Tokenizer::encode and identical text from Tokenizer::decode, and
// that the streaming detokenizer's deltas add up to the same text. Lines written by
// reference_chat.mjs ({"format", "thinking", "add_generation_prompt", "messages", "text", "ids"};
// optional "tools": ChatOptions::tools; without "ids" only the rendered text is compared)
// are conversations: ChatEncoder must render the same text and encode the same ids.
//
//   reference_check TOKENIZER_JSON_OR_DIR REFERENCE.jsonl [MIN_STRINGS]
//
// Prints each mismatch (the first 20 in full), a per-category count, and "N passed, M failed".
// Exits 1 on any mismatch or when fewer than MIN_STRINGS lines were read.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tk = osprey::tokenizer;
using nlohmann::json;

namespace {

std::string ids_to_string(const std::vector<tk::TokenId>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  s += ']';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER REFERENCE.jsonl [MIN_STRINGS]\n", argv[0]);
    return 2;
  }
  const size_t min_strings = argc > 3 ? std::stoul(argv[3]) : 1;
  try {
    const tk::Tokenizer tokenizer = tk::Tokenizer::load(argv[1]);
    std::ifstream in(argv[2]);
    if (!in) osprey::fail("cannot open ", argv[2]);
    std::string line;
    size_t passed = 0, failed = 0;
    std::map<std::string, std::pair<size_t, size_t>> by_category;  // passed, total
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const json j = json::parse(line);
      const std::string text = j.at("text").get<std::string>();
      const std::string category = j.at("category").get<std::string>();
      // A line without "ids" (a rendering made without a tokenizer) checks the text only.
      auto expected_ids = j.contains("ids") ? j.at("ids").get<std::vector<tk::TokenId>>()
                                            : std::vector<tk::TokenId>{};
      const bool is_chat = j.contains("messages");
      // A chat line: the rendered prompt must equal the reference's, and decode back to it.
      const std::string expected_text = is_chat ? text : j.at("decoded").get<std::string>();

      std::vector<tk::TokenId> ids;
      std::string rendered;
      if (is_chat) {
        const tk::ChatEncoder chat(tokenizer,
                                   *tk::parse_chat_format(j.at("format").get<std::string>()));
        const auto messages = tk::parse_chat_messages(j.at("messages"));
        tk::ChatOptions options;
        options.thinking = j.at("thinking").get<bool>();
        options.add_generation_prompt = j.at("add_generation_prompt").get<bool>();
        if (j.contains("tools")) options.tools = j.at("tools").get<std::vector<std::string>>();
        ids = chat.encode(messages, options);
        rendered = chat.render(messages, options);
        if (!j.contains("ids")) expected_ids = ids;
      }
      if (!is_chat) ids = tokenizer.encode(text);
      const std::string decoded = tokenizer.decode(expected_ids);
      tk::IncrementalDetokenizer detok(tokenizer);
      std::string streamed;
      for (tk::TokenId id : expected_ids) streamed += detok.step(id);
      streamed += detok.finish();

      const bool ok = ids == expected_ids && decoded == expected_text && streamed == decoded &&
                      (!is_chat || rendered == text);
      auto& cat = by_category[category];
      ++cat.second;
      if (ok) {
        ++passed;
        ++cat.first;
        continue;
      }
      if (++failed <= 20) {
        std::cout << "MISMATCH [" << category << "] text " << json(text).dump() << "\n";
        if (ids != expected_ids) {
          std::cout << "  osprey    ids " << ids_to_string(ids) << "\n"
                    << "  reference ids " << ids_to_string(expected_ids) << "\n";
        }
        if (decoded != expected_text) {
          std::cout << "  osprey    decode " << json(decoded).dump() << "\n"
                    << "  reference decode " << json(expected_text).dump() << "\n";
        }
        if (streamed != decoded) std::cout << "  streamed " << json(streamed).dump() << "\n";
        if (is_chat && rendered != text) {
          std::cout << "  osprey    render " << json(rendered).dump() << "\n";
        }
      }
    }
    for (const auto& [name, counts] : by_category) {
      std::cout << "  " << name << ": " << counts.first << "/" << counts.second << " identical\n";
    }
    const size_t total = passed + failed;
    std::cout << "reference_check: " << total << " strings, " << passed
              << " identical (ids and decode)\n";
    std::cout << passed << " passed, " << failed << " failed\n";
    if (total < min_strings) {
      std::cout << "reference_check: expected at least " << min_strings << " strings\n";
      return 1;
    }
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reference_check: %s\n", e.what());
    return 1;
  }
}
