#include "tokenizer/merge_table.h"

#include "core/error.h"

namespace osprey::tokenizer {

void MergeTable::reserve(size_t count) {
  OSPREY_CHECK(size_ == 0, "MergeTable::reserve after insert");
  size_t capacity = 16;
  int bits = 4;
  while (capacity < count * 2) {  // load factor <= 0.5
    capacity *= 2;
    ++bits;
  }
  entries_.assign(capacity, Entry{});
  mask_ = capacity - 1;
  shift_ = 64 - bits;
}

bool MergeTable::insert(TokenId left, TokenId right, Merge merge) {
  OSPREY_CHECK(size_ * 2 < entries_.size(), "MergeTable is full; reserve more");
  const uint64_t key = pack(left, right);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.key == key) {  // a repeated pair: the later rank wins, as in Hugging Face's loader
      e.merge = merge;
      return false;
    }
    if (e.key == kEmpty) {
      e.key = key;
      e.merge = merge;
      ++size_;
      return true;
    }
  }
}

}  // namespace osprey::tokenizer
