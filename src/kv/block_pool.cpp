#include "kv/block_pool.h"

#include <xxhash.h>

#include "core/error.h"

namespace osprey {

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  XXH64_state_t* s = XXH64_createState();
  XXH64_reset(s, 0);
  XXH64_update(s, &parent, sizeof parent);
  XXH64_update(s, tokens.data(), tokens.size_bytes());
  const BlockHash h = XXH64_digest(s);
  XXH64_freeState(s);
  return h;
}

BlockPool::BlockPool(int64_t n_blocks)
    : ref_(size_t(n_blocks), 0),
      lru_pos_(size_t(n_blocks)),
      in_lru_(size_t(n_blocks), false),
      block_hash_(size_t(n_blocks)) {
  OSPREY_CHECK(n_blocks > 0, "a block pool needs blocks");
  free_.reserve(size_t(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

void BlockPool::evict_one() {
  OSPREY_CHECK(!lru_.empty(), "no block to evict");
  const int32_t b = lru_.front();
  lru_.pop_front();
  in_lru_[size_t(b)] = false;
  hash_to_block_.erase(*block_hash_[size_t(b)]);
  block_hash_[size_t(b)].reset();
  free_.push_back(b);
}

int32_t BlockPool::allocate() {
  if (free_.empty()) evict_one();
  const int32_t b = free_.back();
  free_.pop_back();
  OSPREY_CHECK(ref_[size_t(b)] == 0, "allocating held block ", b);
  ref_[size_t(b)] = 1;
  return b;
}

void BlockPool::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    OSPREY_CHECK(ref_[size_t(b)] > 0, "releasing free block ", b);
    if (--ref_[size_t(b)] > 0) continue;
    if (block_hash_[size_t(b)]) {
      lru_pos_[size_t(b)] = lru_.insert(lru_.end(), b);
      in_lru_[size_t(b)] = true;
    } else {
      free_.push_back(b);
    }
  }
}

std::optional<int32_t> BlockPool::lookup(BlockHash h) const {
  auto it = hash_to_block_.find(h);
  if (it == hash_to_block_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::acquire_cached(int32_t b) {
  OSPREY_CHECK(block_hash_[size_t(b)].has_value(), "block ", b, " is not cached");
  if (in_lru_[size_t(b)]) {
    lru_.erase(lru_pos_[size_t(b)]);
    in_lru_[size_t(b)] = false;
  }
  ++ref_[size_t(b)];
}

void BlockPool::register_cached(int32_t b, BlockHash h) {
  OSPREY_CHECK(ref_[size_t(b)] > 0, "caching an unheld block ", b);
  if (block_hash_[size_t(b)] || hash_to_block_.count(h)) return;
  block_hash_[size_t(b)] = h;
  hash_to_block_[h] = b;
}

}  // namespace osprey
