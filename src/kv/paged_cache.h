// The paged caches of one model: per layer a latent cache and (V3.2) an indexer key cache, in
// blocks of block_size tokens. Slot = block · block_size + offset.
//   latent(layer)     normalised latent | rotated k_pe, per token:
//     default  [n_blocks, block_size, kv_lora + rope]  F32 on the CPU (the oracle), BF16 on CUDA
//              (half the bytes a decode step reads; the kernels compute in F32)
//     FP8      U8 [n_blocks, block_size, kv_lora + 4·kv_lora/128 + 2·rope]   (fp8_latent; either
//              device) DeepSeek's fp8_ds_mla format of ops/mla.h: the latent as e4m3 with an fp32
//              scale per 128 values, k_pe in bf16: 656 B/token at 512 + 64 (BF16: 1152)
//   index_keys(layer) indexer keys after LayerNorm + rope:
//     CPU  F32 [n_blocks, block_size, index_head_dim]              (the oracle)
//     CUDA U8  [n_blocks, block_size · (index_head_dim + 4)]       the FP8 format of ops/indexer.h:
//          per block, block_size × ID e4m3 values then block_size fp32 scales (132 B/token at
//          ID = 128, DeepSeek/vLLM's layout)
// Which blocks a sequence owns is the block allocator's business.
#pragma once

#include <vector>

#include "config/model_config.h"
#include "core/error.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace osprey {

constexpr int kBlockSize = 64;

class PagedKVCache {
 public:
  // fp8_index_keys (CUDA only): the FP8 indexer key format (default), else BF16 keys.
  // fp8_latent (either device): the FP8 latent format; fails (osprey::Error) when kv_lora is not
  // a multiple of 128 or rope is odd.
  // mtp_layers: caches for that many MTP layers after the main ones (layer indices
  // num_hidden_layers...), sharing the main layers' block table and slots.
  PagedKVCache(const ModelConfig& c, int64_t n_blocks, int block_size = kBlockSize,
               Device device = Device::CPU, bool fp8_index_keys = true, bool fp8_latent = false,
               int mtp_layers = 0);

  Tensor latent(int layer) const {
    OSPREY_CHECK(size_t(layer) < latent_.size(), "the cache has no layer ", layer);
    return latent_[size_t(layer)].view();
  }
  int n_layers() const { return int(latent_.size()); }
  Tensor index_keys(int layer) const;
  int64_t n_blocks() const { return n_blocks_; }
  int block_size() const { return block_size_; }
  Device device() const { return device_; }
  // The latent cache's dtype: F32 on the CPU, BF16 on CUDA; U8 (the FP8 format) when asked.
  static DType dtype_for(Device d, bool fp8_latent = false) {
    return fp8_latent ? DType::U8 : d == Device::CPU ? DType::F32 : DType::BF16;
  }
  // The indexer cache's dtype: F32 on the CPU; on CUDA U8 (the FP8 format), or BF16 when asked.
  static DType index_dtype_for(Device d, bool fp8 = true) {
    return d == Device::CPU ? DType::F32 : fp8 ? DType::U8 : DType::BF16;
  }
  // Bytes one token takes in one layer's latent cache (656 FP8 / 1152 BF16 / 2304 F32 at 512 + 64).
  static int64_t latent_token_bytes(const ModelConfig& c, Device device = Device::CPU,
                                    bool fp8_latent = false);

  // Bytes one block takes across all layers (latent + indexer keys, in the formats above): what
  // the engine divides the KV memory by.
  static int64_t bytes_per_block(const ModelConfig& c, int block_size = kBlockSize,
                                 Device device = Device::CPU, bool fp8_index_keys = true,
                                 bool fp8_latent = false, int mtp_layers = 0);

 private:
  int64_t n_blocks_;
  int block_size_;
  Device device_;
  std::vector<Storage> latent_;
  std::vector<Storage> index_keys_;
};

}  // namespace osprey
