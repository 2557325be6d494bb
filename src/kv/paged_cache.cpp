#include "kv/paged_cache.h"

#include "kv/kv_cache_dtype.h"
#include "ops/indexer.h"
#include "ops/mla.h"

namespace osprey {

PagedKVCache::PagedKVCache(const ModelConfig& c, int64_t n_blocks, int block_size, Device device,
                           bool fp8_index_keys, bool fp8_latent, int mtp_layers)
    : n_blocks_(n_blocks), block_size_(block_size), device_(device) {
  const DType t = dtype_for(device);
  OSPREY_CHECK(n_blocks > 0 && block_size > 0, "cache of ", n_blocks, " blocks");
  if (fp8_latent) check_kv_cache_dtype(KvCacheDtype::Fp8, c, device);
  OSPREY_CHECK(mtp_layers >= 0, "mtp_layers ", mtp_layers);
  for (int l = 0; l < c.num_hidden_layers + mtp_layers; ++l) {
    if (fp8_latent)
      latent_.emplace_back(device, DType::U8,
                           Shape{n_blocks, block_size, latent_token_bytes(c, device, true)});
    else
      latent_.emplace_back(device, t,
                           Shape{n_blocks, block_size, c.kv_lora_rank + c.qk_rope_head_dim});
    if (!c.has_indexer) continue;
    if (index_dtype_for(device, fp8_index_keys) == DType::U8)
      index_keys_.emplace_back(
          device, DType::U8,
          Shape{n_blocks, block_size * ops::indexer_fp8_token_bytes(c.index_head_dim)});
    else
      index_keys_.emplace_back(device, t, Shape{n_blocks, block_size, c.index_head_dim});
  }
}

Tensor PagedKVCache::index_keys(int layer) const {
  OSPREY_CHECK(size_t(layer) < index_keys_.size(), "this model has no indexer cache");
  return index_keys_[size_t(layer)].view();
}

int64_t PagedKVCache::latent_token_bytes(const ModelConfig& c, Device device, bool fp8_latent) {
  if (fp8_latent) return ops::mla_fp8_token_bytes(c.kv_lora_rank, c.qk_rope_head_dim);
  return (c.kv_lora_rank + c.qk_rope_head_dim) * int64_t(dtype_size(dtype_for(device)));
}

int64_t PagedKVCache::bytes_per_block(const ModelConfig& c, int block_size, Device device,
                                      bool fp8_index_keys, bool fp8_latent, int mtp_layers) {
  const int64_t latent = latent_token_bytes(c, device, fp8_latent);
  int64_t index = 0;
  if (c.has_indexer)
    index = index_dtype_for(device, fp8_index_keys) == DType::U8
                ? ops::indexer_fp8_token_bytes(c.index_head_dim)
                : c.index_head_dim * int64_t(dtype_size(index_dtype_for(device, fp8_index_keys)));
  return (latent + index) * block_size * (c.num_hidden_layers + mtp_layers);
}

}  // namespace osprey
