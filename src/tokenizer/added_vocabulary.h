// The added tokens of tokenizer.json (special tokens such as <｜User｜>, and plain added words):
// text is cut on them before normalization and pre-tokenization, so they always encode to their
// own id. Matching is leftmost-longest over a byte trie, as in Hugging Face's AddedVocabulary;
// lstrip / rstrip take the whitespace beside a match into it; single_word only matches whole
// words. Tokens with normalized=false are matched on the raw text, the others on normalized text.
#pragma once

#include <array>
#include <bitset>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/token_id.h"

namespace osprey::tokenizer {

class Normalizer;

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
};

class AddedVocabulary {
 public:
  enum class Stage { kRaw, kNormalized };

  // A stretch of text: either plain text [begin, end) or the added token `id`.
  struct Segment {
    size_t begin, end;
    TokenId id;  // -1: plain text
  };

  AddedVocabulary() = default;
  // Reads `added_tokens`; `normalizer` (may be null) is used for normalized tokens' trie.
  AddedVocabulary(const nlohmann::json& added_tokens, const Normalizer* normalizer);

  // Cuts `text` into segments on the tokens matched at `stage`; appends to `out`.
  void split(std::string_view text, Stage stage, std::vector<Segment>& out) const;
  bool has_tokens(Stage stage) const { return !trie(stage).nodes.empty(); }

  const AddedToken* find(TokenId id) const;
  const AddedToken* find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Trie {
    // Node 0 is the root; children keyed by node * 256 + byte.
    std::vector<int32_t> nodes;  // per node: index into tokens_ ending here, or -1
    std::unordered_map<uint64_t, int32_t> children;
    std::bitset<256> first_bytes;
  };
  const Trie& trie(Stage stage) const { return stage == Stage::kRaw ? raw_ : normalized_; }
  static void insert(Trie& trie, std::string_view key, int32_t token);

  std::vector<AddedToken> tokens_;
  std::unordered_map<TokenId, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace osprey::tokenizer
