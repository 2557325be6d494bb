// The paged caches of one model: per layer a latent cache and (V3.2) an indexer key cache, in
// blocks of block_size tokens. Slot = block · block_size + offset.
//   latent(layer)     [n_blocks, block_size, kv_lora + rope]   normalised latent | rotated k_pe
//   index_keys(layer) indexer keys after LayerNorm + rope:
//     CPU  F32 [n_blocks, block_size, index_head_dim]              (the oracle)
//     CUDA U8  [n_blocks, block_size · (index_head_dim + 4)]       the FP8 format of ops/indexer.h:
//          per block, block_size × ID e4m3 values then block_size fp32 scales (132 B/token at
//          ID = 128, DeepSeek/vLLM's layout)
// The latent cache is F32 on the CPU and BF16 on CUDA (half the bytes a decode step reads; the
// kernels compute in F32). Which blocks a sequence owns is the block allocator's business.
#pragma once

#include <vector>

#include "core/storage.h"
#include "core/tensor.h"
#include "model/config.h"

namespace osprey {

constexpr int kBlockSize = 64;

class PagedKVCache {
 public:
  // fp8_index_keys (CUDA only): the FP8 indexer key format (default), else BF16 keys.
  PagedKVCache(const ModelConfig& c, int64_t n_blocks, int block_size = kBlockSize,
               Device device = Device::CPU, bool fp8_index_keys = true);

  Tensor latent(int layer) const { return latent_[size_t(layer)].view(); }
  Tensor index_keys(int layer) const;
  int64_t n_blocks() const { return n_blocks_; }
  int block_size() const { return block_size_; }
  Device device() const { return device_; }
  // The latent cache's dtype.
  static DType dtype_for(Device d) { return d == Device::CPU ? DType::F32 : DType::BF16; }
  // The indexer cache's dtype: F32 on the CPU; on CUDA U8 (the FP8 format), or BF16 when asked.
  static DType index_dtype_for(Device d, bool fp8 = true) {
    return d == Device::CPU ? DType::F32 : fp8 ? DType::U8 : DType::BF16;
  }

  // Bytes one block takes across all layers (latent + indexer keys, in the formats above).
  static int64_t bytes_per_block(const ModelConfig& c, int block_size = kBlockSize,
                                 Device device = Device::CPU, bool fp8_index_keys = true);

 private:
  int64_t n_blocks_;
  int block_size_;
  Device device_;
  std::vector<Storage> latent_;
  std::vector<Storage> index_keys_;
};

}  // namespace osprey
