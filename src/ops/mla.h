// Multi-head latent attention (MLA) and its paged latent cache.
//
// Cache layout: latent_cache [n_blocks, block_size, kv_lora + rope]: per token the normalised
// latent (kv_lora) then the rotated shared rope key (rope). Row of position j of sequence s:
// block_table[s, j / block_size] · block_size + j % block_size.
//
// Absorbed (decode; any query over cached context):
//   q [n_tokens, H, kv_lora + rope] = [q_nope·W_UK | q_pe];  for token t at position p in seq s:
//   score_j = scale · q·cache_j, j ≤ p (and j ∈ topk_indices[t] when given);
//   out [n_tokens, H, kv_lora] = Σ_j softmax(score)_j · cache_j[:kv_lora]
// Expanded (prefill, non-absorbed): per sequence, K [L, H, nope + rope] and V [L, H, v]
// decompressed from the latent by kv_b_proj, rows kv_start_loc[s] .. + seq_lens[s]:
//   out [n_tokens, H, v] = softmax(scale · q·K_j, j ≤ p, j ∈ topk) · V_j
// topk_indices [n_tokens, topk] I32: context positions to attend, −1 for unused entries; an empty
// tensor means dense (all causal positions).
#pragma once

#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey::ops {

// Weight absorption with kv_b [H·(nope + v), kv_lora] (per head: nope rows W_UK, then v rows W_UV):
//   q_abs [n, H, kv_lora + rope] = [q_nope·W_UK_h | q_pe]      from q [n, H, nope + rope]
//   out   [n, H, v]              = o_lat·W_UV_hᵀ                 from o_lat [n, H, kv_lora]
void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v);
void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope);
// cache[slot_mapping[t]] = [latent[t] | k_pe[t]].  latent [n_tokens, kv_lora], k_pe [n_tokens,
// rope].
void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m);
// out [Σ seq_lens, C] = the cached rows of every sequence, in order (kv_start_loc = cumsum).
void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m);
void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
namespace cpu {
void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v);
void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope);
void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m);
void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m);
void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v);
void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope);
void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m);
void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m);
void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
}  // namespace cuda
}  // namespace osprey::ops
