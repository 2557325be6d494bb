#include "kv/paged_cache.h"

namespace osprey {

PagedKVCache::PagedKVCache(const ModelConfig& c, int64_t n_blocks, int block_size, Device device)
    : n_blocks_(n_blocks), block_size_(block_size), device_(device) {
  const DType t = dtype_for(device);
  OSPREY_CHECK(n_blocks > 0 && block_size > 0, "cache of ", n_blocks, " blocks");
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    latent_.emplace_back(device, t,
                         Shape{n_blocks, block_size, c.kv_lora_rank + c.qk_rope_head_dim});
    if (c.has_indexer)
      index_keys_.emplace_back(device, t, Shape{n_blocks, block_size, c.index_head_dim});
  }
}

Tensor PagedKVCache::index_keys(int layer) const {
  OSPREY_CHECK(size_t(layer) < index_keys_.size(), "this model has no indexer cache");
  return index_keys_[size_t(layer)].view();
}

int64_t PagedKVCache::bytes_per_block(const ModelConfig& c, int block_size, Device device) {
  const int64_t per_token =
      c.kv_lora_rank + c.qk_rope_head_dim + (c.has_indexer ? c.index_head_dim : 0);
  return per_token * block_size * int64_t(dtype_size(dtype_for(device))) * c.num_hidden_layers;
}

}  // namespace osprey
