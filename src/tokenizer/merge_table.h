// The BPE merge table: (left id, right id) -> (rank, merged id), an open-addressing hash table
// keyed by the packed pair. Looked up once per adjacent pair in every merge step, so it is kept
// flat: one probe on a hit in the common case, no pointer chasing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tokenizer/token_id.h"

namespace osprey::tokenizer {

class MergeTable {
 public:
  struct Merge {
    uint32_t rank;
    TokenId merged;
  };
  static constexpr uint32_t kNoRank = UINT32_MAX;

  // Sizes the table for `count` merges.
  void reserve(size_t count);
  // Adds a merge; a pair already present is overwritten (returns false).
  bool insert(TokenId left, TokenId right, Merge merge);
  // The merge of (left, right), or {kNoRank, -1}.
  Merge find(TokenId left, TokenId right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return e.merge;
      if (e.key == kEmpty) return {kNoRank, -1};
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = UINT64_MAX;
  struct Entry {
    uint64_t key = kEmpty;
    Merge merge{kNoRank, -1};
  };
  static uint64_t pack(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  size_t slot(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_) & mask_;
  }

  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace osprey::tokenizer
