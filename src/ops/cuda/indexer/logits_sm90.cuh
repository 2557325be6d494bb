// The sm_90a tensor-core indexer logits (logits_sm90.cu): the entry points for ops/cuda/indexer.cu.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey::ops::cuda {

bool device_is_sm90();  // (ops/cuda/common.cuh) for callers without the CUDA headers

// Whether indexer_logits_sm90 takes this call: an sm_90 device, q8 U8 [n, 64, 128] (e4m3),
// weights F32 [n, 64], the FP8 cache U8 [n_blocks, 64 · 132] with block_size 64.
bool indexer_logits_sm90_supported(Tensor q8, Tensor weights, Tensor index_cache,
                                   const AttentionMeta& m);
// scores[t · ld + j] = Σ_h weights[t, h] · relu(scale · q8[t, h] · k_j) for every j ≤ positions[t]
// (k_j = the cache's e4m3 values × its per-token scale); other entries are not written.
//   scores [n_tokens, ld] F32, ld ≥ max positions + 1.
void indexer_logits_sm90(float* scores, int64_t ld, Tensor q8, Tensor weights, Tensor index_cache,
                         const AttentionMeta& m, float scale);

}  // namespace osprey::ops::cuda
