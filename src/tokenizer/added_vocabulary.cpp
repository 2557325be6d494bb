#include "tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;

// The code point that ends at text[end - 1] (text valid UTF-8, end > 0).
char32_t code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t len;
  return decode_utf8(text.substr(start), len);
}

size_t code_point_start_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

bool is_word_char(char32_t cp) {
  return cp == '_' || u_isalnum(static_cast<UChar32>(cp));
}
bool is_space(char32_t cp) {
  return u_isUWhiteSpace(static_cast<UChar32>(cp));
}

}  // namespace

AddedVocabulary::AddedVocabulary(const json& added_tokens, const Normalizer* normalizer) {
  if (added_tokens.is_null()) return;
  if (!added_tokens.is_array()) fail("added_tokens must be an array");
  for (const json& t : added_tokens) {
    AddedToken token;
    token.id = t.at("id").get<TokenId>();
    token.content = t.at("content").get<std::string>();
    token.special = t.value("special", false);
    token.lstrip = t.value("lstrip", false);
    token.rstrip = t.value("rstrip", false);
    token.single_word = t.value("single_word", false);
    token.normalized = t.value("normalized", !token.special);
    if (token.id < 0) fail("added token '", token.content, "' has a negative id");
    if (token.content.empty()) fail("added token ", token.id, " has empty content");
    if (!utf8_is_valid(token.content)) fail("added token ", token.id, " is not valid UTF-8");
    const size_t index = tokens_.size();
    by_id_[token.id] = index;            // a later entry with the same id replaces the earlier
    by_content_[token.content] = index;  // and likewise for the same content
    tokens_.push_back(std::move(token));
  }
  for (const auto& [content, index] : by_content_) {
    const AddedToken& token = tokens_[index];
    if (token.normalized && normalizer != nullptr) {
      std::string key = token.content;
      normalizer->normalize(key);
      if (!key.empty()) insert(normalized_, key, static_cast<int32_t>(index));
    } else {
      insert(raw_, token.content, static_cast<int32_t>(index));
    }
  }
}

void AddedVocabulary::insert(Trie& trie, std::string_view key, int32_t token) {
  if (trie.nodes.empty()) trie.nodes.push_back(-1);
  int32_t node = 0;
  for (char c : key) {
    const uint64_t edge = static_cast<uint64_t>(node) * 256 + static_cast<unsigned char>(c);
    auto it = trie.children.find(edge);
    if (it == trie.children.end()) {
      it = trie.children.emplace(edge, static_cast<int32_t>(trie.nodes.size())).first;
      trie.nodes.push_back(-1);
    }
    node = it->second;
  }
  trie.nodes[node] = token;
  trie.first_bytes.set(static_cast<unsigned char>(key[0]));
}

void AddedVocabulary::split(std::string_view text, Stage stage, std::vector<Segment>& out) const {
  const Trie& t = trie(stage);
  size_t text_start = 0;  // start of the plain text not yet emitted
  size_t i = 0;
  while (i < text.size()) {
    if (t.nodes.empty() || !t.first_bytes.test(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t node = 0, found = -1;
    size_t found_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      auto it =
          t.children.find(static_cast<uint64_t>(node) * 256 + static_cast<unsigned char>(text[j]));
      if (it == t.children.end()) break;
      node = it->second;
      if (t.nodes[node] >= 0) {
        found = t.nodes[node];
        found_end = j + 1;
      }
    }
    // A token match starts on a character boundary (tokens are valid UTF-8).
    if (found < 0 || (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) {
      ++i;
      continue;
    }
    const AddedToken& token = tokens_[found];
    size_t begin = i, end = found_end;
    if (token.single_word) {
      const bool word_before = begin > 0 && is_word_char(code_point_before(text, begin));
      size_t len = 0;
      const bool word_after = end < text.size() && is_word_char(decode_utf8(text.substr(end), len));
      if (word_before || word_after) {
        ++i;
        continue;
      }
    }
    if (token.lstrip) {
      while (begin > text_start && is_space(code_point_before(text, begin))) {
        begin = code_point_start_before(text, begin);
      }
    }
    if (token.rstrip) {
      size_t len = 0;
      while (end < text.size() && is_space(decode_utf8(text.substr(end), len))) end += len;
    }
    if (begin > text_start) out.push_back({text_start, begin, -1});
    out.push_back({begin, end, token.id});
    text_start = i = end;
  }
  if (text_start < text.size()) out.push_back({text_start, text.size(), -1});
}

const AddedToken* AddedVocabulary::find(TokenId id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace osprey::tokenizer
