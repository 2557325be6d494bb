// The block pool: reference counts, the prefix cache, LRU eviction of cached blocks nobody holds.
#include <gtest/gtest.h>

#include "kv/block_pool.h"

using namespace osprey;

TEST(BlockPool, AllocateAndRelease) {
  BlockPool p(4);
  EXPECT_EQ(p.n_available(), 4);
  const int32_t a = p.allocate(), b = p.allocate();
  EXPECT_NE(a, b);
  EXPECT_EQ(p.n_available(), 2);
  EXPECT_EQ(p.n_held(), 2);
  const int32_t blocks[] = {a, b};
  p.release(blocks);
  EXPECT_EQ(p.n_available(), 4);
  EXPECT_EQ(p.n_held(), 0);
}

TEST(BlockPool, SharedBlocksFreeOnLastRelease) {
  BlockPool p(2);
  const int32_t a = p.allocate();
  const BlockHash h = hash_block(0, std::vector<int32_t>{1, 2, 3});
  p.register_cached(a, h);
  p.acquire_cached(a);  // a second holder
  EXPECT_EQ(p.ref_count(a), 2);
  const int32_t one[] = {a};
  p.release(one);
  EXPECT_EQ(p.ref_count(a), 1);
  EXPECT_EQ(p.n_available(), 1);
  p.release(one);
  EXPECT_EQ(p.ref_count(a), 0);
  EXPECT_EQ(p.n_available(), 2);  // cached but unheld counts as available
  EXPECT_EQ(p.lookup(h), a);      // and still findable
}

TEST(BlockPool, EvictsLeastRecentlyUsedCachedBlockOnlyWhenNeeded) {
  BlockPool p(3);
  const int32_t a = p.allocate(), b = p.allocate();
  const BlockHash ha = hash_block(0, std::vector<int32_t>{1}),
                  hb = hash_block(0, std::vector<int32_t>{2});
  p.register_cached(a, ha);
  p.register_cached(b, hb);
  const int32_t ra[] = {a}, rb[] = {b};
  p.release(ra);  // a becomes unheld first: least recently used
  p.release(rb);
  const int32_t c = p.allocate();  // the free block, no eviction yet
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_TRUE(p.lookup(ha) && p.lookup(hb));
  const int32_t d = p.allocate();  // evicts a
  EXPECT_EQ(d, a);
  EXPECT_FALSE(p.lookup(ha));
  EXPECT_EQ(p.lookup(hb), b);
  p.acquire_cached(b);  // revived from the LRU list
  EXPECT_EQ(p.n_available(), 0);
  EXPECT_FALSE(p.can_allocate(1));
}

TEST(BlockPool, ChainedHashDependsOnTheWholePrefix) {
  const std::vector<int32_t> blk = {5, 6, 7};
  EXPECT_NE(hash_block(1, blk), hash_block(2, blk));
  EXPECT_EQ(hash_block(1, blk), hash_block(1, blk));
  EXPECT_NE(hash_block(1, blk), hash_block(1, std::vector<int32_t>{5, 6, 8}));
}
