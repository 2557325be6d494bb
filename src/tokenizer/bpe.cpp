#include "tokenizer/bpe.h"

#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace osprey::tokenizer {
namespace {

using nlohmann::json;

// Words of up to this many symbols merge by linear scan; longer ones through a heap.
constexpr size_t kLinearMergeMaxSymbols = 64;

bool is_empty_string_or_null(const json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return true;
  return j.at(key).is_string() && j.at(key).get<std::string>().empty();
}

}  // namespace

BpeModel::BpeModel(const json& model) {
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    fail("model type '", type, "' is not supported: osprey loads byte-level BPE tokenizers");
  }
  if (!is_empty_string_or_null(model, "continuing_subword_prefix") ||
      !is_empty_string_or_null(model, "end_of_word_suffix")) {
    fail(
        "BPE continuing_subword_prefix / end_of_word_suffix are not supported (byte-level BPE "
        "tokenizers leave them empty)");
  }
  if (model.value("byte_fallback", false)) {
    fail(
        "BPE byte_fallback is not supported (it belongs to SentencePiece-style tokenizers, not "
        "byte-level BPE)");
  }
  if (model.contains("dropout") && model.at("dropout").is_number() &&
      model.at("dropout").get<double>() > 0.0) {
    fail("BPE dropout is a training option; load a tokenizer.json with dropout null");
  }
  ignore_merges_ = model.value("ignore_merges", false);

  const json& vocab = model.at("vocab");
  if (!vocab.is_object() || vocab.empty()) fail("model.vocab must be a non-empty object");
  TokenId max_id = -1;
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int64_t>();
    if (id < 0 || id > INT32_MAX - 1) fail("model.vocab: id ", id, " of '", token, "' is invalid");
    max_id = std::max(max_id, static_cast<TokenId>(id));
  }
  std::vector<std::string> bytes(max_id + 1);
  has_token_.assign(max_id + 1, false);
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<TokenId>();
    if (has_token_[id]) fail("model.vocab: id ", id, " is used by two tokens");
    has_token_[id] = true;
    bytes[id] = byte_level_to_bytes(token);
  }
  token_offsets_.reserve(max_id + 2);
  for (TokenId id = 0; id <= max_id; ++id) {
    token_offsets_.push_back(static_cast<uint32_t>(token_data_.size()));
    token_data_ += bytes[id];
    if (has_token_[id]) bytes_to_id_.emplace(bytes[id], id);  // the lowest id wins on a clash
  }
  token_offsets_.push_back(static_cast<uint32_t>(token_data_.size()));

  if (!is_empty_string_or_null(model, "unk_token")) {
    const auto unk = model.at("unk_token").get<std::string>();
    auto it = vocab.find(unk);
    if (it == vocab.end()) fail("model.unk_token '", unk, "' is not in the vocabulary");
    unk_id_ = it->get<TokenId>();
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = it != bytes_to_id_.end() ? it->second : -1;
  }

  const json& merges = model.at("merges");
  if (!merges.is_array()) fail("model.merges must be an array");
  merges_.reserve(merges.size());
  // Token text -> id, hashed (the JSON object is an ordered tree: slow for 3 lookups per merge).
  std::unordered_map<std::string_view, TokenId> text_to_id;
  text_to_id.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    text_to_id.emplace(it.key(), it.value().get<TokenId>());
  }
  auto lookup = [&](const std::string& token, const std::string& where) {
    auto it = text_to_id.find(token);
    if (it == text_to_id.end()) {
      fail("model.merges: '", where, "' uses '", token, "', not in the vocab");
    }
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {  // "a b"
      const auto& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        fail("model.merges[", rank, "]: '", s, "' is not two tokens separated by one space");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {  // ["a", "b"]
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      fail("model.merges[", rank, "] must be \"a b\" or [\"a\", \"b\"]");
    }
    const std::string where = left + " " + right;
    const TokenId left_id = lookup(left, where), right_id = lookup(right, where);
    merges_.insert(left_id, right_id, {static_cast<uint32_t>(rank), lookup(left + right, where)});
  }
}

std::optional<std::string_view> BpeModel::token_bytes(TokenId id) const {
  if (id < 0 || id >= id_limit() || !has_token_[id]) return std::nullopt;
  return std::string_view(token_data_)
      .substr(token_offsets_[id], token_offsets_[id + 1] - token_offsets_[id]);
}

std::optional<TokenId> BpeModel::bytes_to_id(std::string_view bytes) const {
  auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_piece(std::string_view piece, WordCache& cache,
                            std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(piece[0])];
    if (id >= 0) {
      out.push_back(id);
    } else if (unk_id_) {
      out.push_back(*unk_id_);
    }
    return;
  }
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(piece);
    if (it != bytes_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > WordCache::kMaxWordBytes) {
    merge_bytes(piece, cache, out);
    return;
  }
  auto it = cache.words_.find(piece);
  if (it != cache.words_.end()) {
    const TokenId* ids = cache.ids_.data() + it->second.offset;
    out.insert(out.end(), ids, ids + it->second.length);
    return;
  }
  const size_t start = out.size();
  merge_bytes(piece, cache, out);
  if (cache.words_.size() >= WordCache::kMaxWords) {
    cache.words_.clear();
    cache.ids_.clear();
  }
  const auto offset = static_cast<uint32_t>(cache.ids_.size());
  cache.ids_.insert(cache.ids_.end(), out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
  cache.words_.emplace(std::string(piece),
                       WordCache::Entry{offset, static_cast<uint32_t>(out.size() - start)});
}

void BpeModel::merge_bytes(std::string_view piece, WordCache& cache,
                           std::vector<TokenId>& out) const {
  auto& symbols = cache.symbols_;
  symbols.clear();
  for (char c : piece) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) {
      symbols.push_back(id);
    } else if (unk_id_) {
      symbols.push_back(*unk_id_);
    }
  }
  if (symbols.size() <= kLinearMergeMaxSymbols) {
    merge_linear(symbols, cache.pairs_);
  } else {
    merge_heap(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeModel::merge_linear(std::vector<TokenId>& symbols,
                            std::vector<MergeTable::Merge>& pairs) const {
  if (symbols.size() < 2) return;
  // pairs[i]: the merge of (symbols[i], symbols[i + 1]).
  pairs.resize(symbols.size() - 1);
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    pairs[i] = merges_.find(symbols[i], symbols[i + 1]);
  while (!pairs.empty()) {
    uint32_t best = MergeTable::kNoRank;
    size_t at = 0;
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (pairs[i].rank < best) {
        best = pairs[i].rank;
        at = i;
      }
    }
    if (best == MergeTable::kNoRank) break;
    symbols[at] = pairs[at].merged;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(at));
    if (at > 0) pairs[at - 1] = merges_.find(symbols[at - 1], symbols[at]);
    if (at < pairs.size()) pairs[at] = merges_.find(symbols[at], symbols[at + 1]);
  }
}

void BpeModel::merge_heap(std::vector<TokenId>& symbols) const {
  const size_t n = symbols.size();
  // A doubly linked list over positions; a merged-away position gets symbol -1.
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i) + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    TokenId left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t nx = next[pos];
    if (nx < 0) return;
    const MergeTable::Merge m = merges_.find(symbols[pos], symbols[nx]);
    if (m.rank == MergeTable::kNoRank) return;
    heap.push({m.rank, static_cast<uint32_t>(pos), symbols[pos], symbols[nx], m.merged});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t nx = next[c.pos];
    // Stale: the left symbol changed, or its right neighbour is no longer the pair's right.
    if (symbols[c.pos] != c.left || nx < 0 || symbols[nx] != c.right) continue;
    symbols[c.pos] = c.merged;
    symbols[nx] = -1;
    next[c.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = static_cast<int32_t>(c.pos);
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(static_cast<int32_t>(c.pos));
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbols[w++] = symbols[i];
  symbols.resize(w);
}

}  // namespace osprey::tokenizer
