// The V3.2 lightning indexer's scoring and top-k (DeepSeek Sparse Attention).
//   index_cache [n_blocks, block_size, index_head_dim]: per token the indexer key (after
//   LayerNorm and half-split rope), paged like the latent cache.
//   For token t at position p of sequence s and every context position j ≤ p:
//     I[t, j] = Σ_h weights[t, h] · relu(scale · q[t, h]·k_j)
//   topk_indices[t] = the min(index_topk, p + 1) positions j with the largest I (ties: lower j
//   first), in ascending order of j, padded with −1 to index_topk.
//   q [n_tokens, IH, ID] F32, weights [n_tokens, IH] F32 (already × IH^-0.5), scale = ID^-0.5.
#pragma once

#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey::ops {
// index_cache[slot_mapping[t]] = k[t].  k [n_tokens, ID].
void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m);
void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale);
namespace cpu {
void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m);
void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m);
void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale);
}  // namespace cuda
}  // namespace osprey::ops
