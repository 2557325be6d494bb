// The KV block pool: which physical cache blocks are free, held, or cached for prefix reuse.
//
// Every block has a reference count (the sequences holding it). A block whose tokens are all
// known can be registered under its prefix hash, the chained hash of all tokens from the start of
// the sequence to its end (xxh64 of the parent's hash and the block's token ids), so that another
// request with the same prefix reuses it instead of recomputing. A cached block that no sequence
// holds stays in the cache on an LRU list and is evicted only when a fresh block is needed.
//
// Capacity questions ("do n more blocks fit?") are answered here; what runs is the scheduler's
// call.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace osprey {

using BlockHash = uint64_t;

// The chained hash of one full block of tokens.
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);

class BlockPool {
 public:
  explicit BlockPool(int64_t n_blocks);

  int64_t n_blocks() const { return int64_t(ref_.size()); }
  // Blocks obtainable now: free ones plus cached ones no sequence holds.
  int64_t n_available() const { return int64_t(free_.size() + lru_.size()); }
  bool can_allocate(int64_t n) const { return n <= n_available(); }

  // A fresh block with one reference (evicting the least recently used unheld cached block if no
  // free block is left). Precondition: can_allocate(1).
  int32_t allocate();
  // Drops one reference per block; a block reaching zero goes to the LRU list if it is cached,
  // else back to the free list.
  void release(std::span<const int32_t> blocks);

  // Prefix cache.
  std::optional<int32_t> lookup(BlockHash h) const;
  // Takes one reference on a cached block (reviving it from the LRU list if unheld).
  void acquire_cached(int32_t block);
  // Registers a held block under its hash (no-op if that hash is already cached).
  void register_cached(int32_t block, BlockHash h);

  int ref_count(int32_t block) const { return ref_[size_t(block)]; }
  int64_t n_cached() const { return int64_t(hash_to_block_.size()); }
  // Counters for metrics: prompt tokens looked up in the prefix cache, and tokens found.
  int64_t query_tokens = 0, hit_tokens = 0;
  // Blocks held by at least one sequence.
  int64_t n_held() const { return n_blocks() - n_available(); }

 private:
  void evict_one();

  std::vector<int> ref_;
  std::vector<int32_t> free_;  // stack of free, uncached blocks
  std::list<int32_t> lru_;     // cached blocks with no holder, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<bool> in_lru_;
  std::vector<std::optional<BlockHash>> block_hash_;
  std::unordered_map<BlockHash, int32_t> hash_to_block_;
};

}  // namespace osprey
