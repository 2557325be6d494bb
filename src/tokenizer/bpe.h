// The BPE model of tokenizer.json over raw bytes. Every vocabulary entry is kept as the bytes it
// stands for (the byte-level alphabet is undone at load), so a piece of text is merged from its
// bytes directly and decoding is a concatenation.
//
// Merging follows Hugging Face's rule: repeatedly merge the adjacent pair of lowest rank, the
// leftmost one on ties. Short words use a linear scan over a rank array; long words a heap with a
// linked list, so a 100 kB run of one character stays O(n log n).
#pragma once

#include <array>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/merge_table.h"
#include "tokenizer/token_id.h"

namespace osprey::tokenizer {

class BpeModel {
 public:
  // Per-thread cache of merged words: piece bytes -> ids.
  class WordCache {
   public:
    // Words longer than this are merged every time (rarely repeated; keeps the cache small).
    static constexpr size_t kMaxWordBytes = 64;
    // The cache is emptied when it holds this many words.
    static constexpr size_t kMaxWords = 1 << 17;

   private:
    friend class BpeModel;
    struct Hash {
      using is_transparent = void;
      size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    struct Entry {
      uint32_t offset, length;
    };
    std::unordered_map<std::string, Entry, Hash, std::equal_to<>> words_;
    std::vector<TokenId> ids_;
    // Scratch for the merge loops.
    std::vector<TokenId> symbols_;
    std::vector<MergeTable::Merge> pairs_;
  };

  // Reads the `model` field of tokenizer.json (type BPE). Throws osprey::Error when it is not a
  // BPE model, or vocab/merges are malformed.
  explicit BpeModel(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized piece (raw bytes) to `out`.
  void encode_piece(std::string_view piece, WordCache& cache, std::vector<TokenId>& out) const;

  // Raw bytes of vocabulary entry `id`, or nullopt when `id` is not in the model's vocabulary.
  std::optional<std::string_view> token_bytes(TokenId id) const;
  // The vocabulary entry whose raw bytes are `bytes`.
  std::optional<TokenId> bytes_to_id(std::string_view bytes) const;
  // One past the largest id in the vocabulary.
  TokenId id_limit() const { return static_cast<TokenId>(token_offsets_.size()) - 1; }
  size_t merge_count() const { return merges_.size(); }

 private:
  void merge_linear(std::vector<TokenId>& symbols, std::vector<MergeTable::Merge>& pairs) const;
  void merge_heap(std::vector<TokenId>& symbols) const;
  void merge_bytes(std::string_view piece, WordCache& cache, std::vector<TokenId>& out) const;

  // Token bytes, all in one buffer: id's bytes are token_data_[token_offsets_[id] ..
  // token_offsets_[id + 1]); an id absent from the vocab has has_token_[id] false.
  std::string token_data_;
  std::vector<uint32_t> token_offsets_;
  std::vector<bool> has_token_;
  std::unordered_map<std::string, TokenId, WordCache::Hash, std::equal_to<>> bytes_to_id_;
  std::array<TokenId, 256> byte_ids_{};
  MergeTable merges_;
  std::optional<TokenId> unk_id_;
  bool ignore_merges_ = false;
};

}  // namespace osprey::tokenizer
