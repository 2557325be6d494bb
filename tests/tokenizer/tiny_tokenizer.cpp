#include "tiny_tokenizer.h"

#include "tokenizer/byte_level.h"

namespace osprey::tokenizer::testing {

using nlohmann::json;

json tiny_tokenizer(const TinySpec& spec) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[bytes_to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  json merges = json::array();
  int next = 256;
  for (const auto& [left, right] : spec.merges) {
    const std::string l = bytes_to_byte_level(left), r = bytes_to_byte_level(right);
    if (!vocab.contains(l + r)) vocab[l + r] = next++;
    if (spec.merges_as_pairs) {
      merges.push_back(json::array({l, r}));
    } else {
      merges.push_back(l + " " + r);
    }
  }
  return {
      {"version", "1.0"},
      {"added_tokens", spec.added_tokens},
      {"normalizer", spec.normalizer},
      {"pre_tokenizer", spec.pre_tokenizer},
      {"post_processor", spec.post_processor},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"ignore_merges", spec.ignore_merges},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

json added_token(int id, const std::string& content, bool special, bool lstrip, bool rstrip) {
  return {{"id", id},         {"content", content},   {"special", special},    {"lstrip", lstrip},
          {"rstrip", rstrip}, {"single_word", false}, {"normalized", !special}};
}

}  // namespace osprey::tokenizer::testing
