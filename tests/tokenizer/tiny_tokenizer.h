// Small tokenizer.json files built in memory for unit tests: the 256 byte tokens have ids 0..255
// (id = byte value), and each merge adds the next id (the first merge is 256, ...).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace osprey::tokenizer::testing {

struct TinySpec {
  // Merges in raw bytes, e.g. {"a", "b"}; written in the byte-level alphabet.
  std::vector<std::pair<std::string, std::string>> merges;
  bool merges_as_pairs = false;  // [a, b] arrays instead of "a b" strings
  bool ignore_merges = false;
  nlohmann::json pre_tokenizer = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  nlohmann::json normalizer = nullptr;
  nlohmann::json added_tokens = nlohmann::json::array();
  nlohmann::json post_processor = nullptr;
};

nlohmann::json tiny_tokenizer(const TinySpec& spec);

// An added_tokens entry.
nlohmann::json added_token(int id, const std::string& content, bool special = true,
                           bool lstrip = false, bool rstrip = false);

}  // namespace osprey::tokenizer::testing
