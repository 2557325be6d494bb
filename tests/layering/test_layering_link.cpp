// ops and kv on their own floor: this test links osprey_ops and osprey_kv (and through them
// osprey_config and osprey_core) but not osprey_model. If ops or kv came to need a symbol of the
// model layer again, it would fail to link; the values below show the config reached them intact.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "kv/kv_cache_dtype.h"
#include "kv/paged_cache.h"
#include "ops/moe.h"
#include "ops/rope.h"

namespace osprey {
namespace {

// v32-tiny: 3 layers, kv_lora 128 + rope 16, indexer keys of 32, 16 experts in 2 groups, YaRN
// factor 40 over an original context of 32.
ModelConfig tiny() {
  return ModelConfig::from_file(std::string(OSPREY_TEST_DATA) + "/models/v32-tiny/config.json");
}

TEST(LayeringLink, RouterParamsFromConfig) {
  const RouterParams p = RouterParams::from_config(tiny());
  EXPECT_EQ(p.n_experts, 16);
  EXPECT_EQ(p.top_k, 4);
  EXPECT_EQ(p.n_group, 2);
  EXPECT_EQ(p.topk_group, 1);
  EXPECT_EQ(p.scoring, ScoringFunc::Sigmoid);
  EXPECT_EQ(p.method, TopkMethod::NoauxTc);
  EXPECT_TRUE(p.norm_topk_prob);
  EXPECT_FLOAT_EQ(p.routed_scaling_factor, 2.5f);
}

TEST(LayeringLink, RopeInvFreqIsYarnCorrected) {
  const std::vector<float> inv = rope_inv_freq(tiny());
  ASSERT_EQ(inv.size(), 8u);  // qk_rope_head_dim / 2
  // The YaRN ramp over dims [0, 2]: dim 0 keeps the original frequency, dim 7 is interpolated
  // (÷ factor 40).
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[7], 1.0 / (40.0 * std::pow(10000.0, 14.0 / 16.0)), 1e-9);
}

TEST(LayeringLink, PagedCacheSizesFromConfig) {
  const ModelConfig c = tiny();
  // CPU: F32 latent (128 + 16) · 4 B and F32 indexer keys 32 · 4 B, per token, per layer.
  EXPECT_EQ(PagedKVCache::latent_token_bytes(c), 576);
  EXPECT_EQ(PagedKVCache::bytes_per_block(c), (576 + 128) * kBlockSize * 3);
  const PagedKVCache cache(c, 2);
  EXPECT_EQ(cache.n_layers(), 3);
  EXPECT_EQ(cache.latent(0).shape, (Shape{2, kBlockSize, 144}));
  EXPECT_EQ(cache.index_keys(2).shape, (Shape{2, kBlockSize, 32}));
  EXPECT_THROW(check_kv_cache_dtype(KvCacheDtype::Bf16, c, Device::CPU), Error);
}

}  // namespace
}  // namespace osprey
