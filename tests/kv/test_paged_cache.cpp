// The paged cache's formats and sizes: the latent row in bytes for each --kv-cache-dtype (F32 on
// the CPU, BF16 on CUDA, DeepSeek's FP8 format on either), the block size the engine divides its
// KV memory by, and the errors a user gets for a value or a model that cannot work.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "kv/kv_cache_dtype.h"
#include "kv/paged_cache.h"
#include "model/make_model.h"

namespace osprey {
namespace {

// The message of the osprey::Error that f throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PagedCache, LatentBytesPerTokenOfEachFormat) {
  const ModelConfig c = preset_config("dsv32");  // 512 + 64, 128-wide indexer keys
  ASSERT_EQ(c.kv_lora_rank, 512);
  ASSERT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(PagedKVCache::latent_token_bytes(c, Device::CPU), 576 * 4);
  EXPECT_EQ(PagedKVCache::latent_token_bytes(c, Device::CUDA), 1152);
  EXPECT_EQ(PagedKVCache::latent_token_bytes(c, Device::CUDA, true), 656);
  EXPECT_EQ(PagedKVCache::latent_token_bytes(c, Device::CPU, true), 656);
  // Per block over all layers, with the FP8 indexer keys (132 B/token) on CUDA.
  const int64_t L = c.num_hidden_layers;
  EXPECT_EQ(PagedKVCache::bytes_per_block(c, 64, Device::CUDA, true, false), (1152 + 132) * 64 * L);
  EXPECT_EQ(PagedKVCache::bytes_per_block(c, 64, Device::CUDA, true, true), (656 + 132) * 64 * L);
  EXPECT_EQ(PagedKVCache::bytes_per_block(c, 64, Device::CUDA, false, true), (656 + 256) * 64 * L);
  // The latent alone takes 1152/656 = 1.76x fewer bytes; with the indexer keys 1284/788 = 1.63x.
  const double ratio = double(PagedKVCache::bytes_per_block(c, 64, Device::CUDA)) /
                       double(PagedKVCache::bytes_per_block(c, 64, Device::CUDA, true, true));
  EXPECT_NEAR(ratio, 1284.0 / 788.0, 1e-12);
}

TEST(PagedCache, Fp8LatentTensorsAreU8Rows) {
  const ModelConfig c = preset_config("v32-tiny");
  PagedKVCache f32(c, 3);
  PagedKVCache fp8(c, 3, kBlockSize, Device::CPU, true, true);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_EQ(f32.latent(l).dtype, DType::F32);
    EXPECT_EQ(f32.latent(l).shape, Shape({3, kBlockSize, c.kv_lora_rank + c.qk_rope_head_dim}));
    EXPECT_EQ(fp8.latent(l).dtype, DType::U8);
    EXPECT_EQ(fp8.latent(l).shape,
              Shape({3, kBlockSize,
                     c.kv_lora_rank + c.kv_lora_rank / 32 + 2 * int64_t(c.qk_rope_head_dim)}));
    EXPECT_EQ(fp8.index_keys(l).dtype, DType::F32);  // the CPU's indexer keys stay F32
  }
}

TEST(PagedCache, KvCacheDtypeValuesAndErrors) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::Auto);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), KvCacheDtype::Bf16);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16"), KvCacheDtype::Bf16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KvCacheDtype::Fp8);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_ds_mla"), KvCacheDtype::Fp8);
  EXPECT_NE(error_of([] { parse_kv_cache_dtype("fp16"); }).find("auto, bf16 or fp8"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_kv_cache_dtype("fp8_e5m2"); }).find("fp8_ds_mla"),
            std::string::npos);

  ModelConfig c = preset_config("v32-tiny");
  EXPECT_EQ(error_of([&] { check_kv_cache_dtype(KvCacheDtype::Fp8, c, Device::CPU); }), "");
  EXPECT_EQ(error_of([&] { check_kv_cache_dtype(KvCacheDtype::Bf16, c, Device::CUDA); }), "");
  EXPECT_NE(error_of([&] {
              check_kv_cache_dtype(KvCacheDtype::Bf16, c, Device::CPU);
            }).find("--device cuda"),
            std::string::npos);
  c.kv_lora_rank = 96;  // no whole 128-value tiles
  const std::string e = error_of([&] { check_kv_cache_dtype(KvCacheDtype::Fp8, c, Device::CPU); });
  EXPECT_NE(e.find("multiple of 128"), std::string::npos) << e;
  EXPECT_NE(e.find("kv_lora_rank 96"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { PagedKVCache(c, 2, kBlockSize, Device::CPU, true, true); }), "");
  EXPECT_EQ(error_of([&] { PagedKVCache(c, 2); }), "");  // the default format still works
}

}  // namespace
}  // namespace osprey
