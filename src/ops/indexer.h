// The V3.2 lightning indexer's scoring and top-k (DeepSeek Sparse Attention).
//   index_cache [n_blocks, block_size, index_head_dim]: per token the indexer key (after
//   LayerNorm and half-split rope), paged like the latent cache.
//   For token t at position p of sequence s and every context position j ≤ p:
//     I[t, j] = Σ_h weights[t, h] · relu(scale · q[t, h]·k_j)
//   topk_indices[t] = the min(index_topk, p + 1) positions j with the largest I (ties: lower j
//   first), in ascending order of j, padded with −1 to index_topk.
//   q [n_tokens, IH, ID] F32, weights [n_tokens, IH] F32 (already × IH^-0.5), scale = ID^-0.5.
//   q may also be U8: e4m3 values from indexer_quantize_q, whose per-(t, h) scales are folded into
//   the weights (as DeepSeek's reference indexer: q8 · k8 on FP8 tensor cores); the scores are
//   then those of the dequantized q8 values with the folded weights.
//
// indexer_quantize_q: per (t, h), s = indexer_fp8_scale(amax_d |q[t, h, d]|) (the cache keys'
// power-of-two rule), q8[t, h, d] = e4m3_rne(q[t, h, d] / s) (saturating; exact division),
// weights_out[t, h] = weights[t, h] · s.  q8 U8 [n_tokens, IH, ID], weights_out F32 [n_tokens, IH].
//
// Two cache formats, told apart by the cache's dtype:
//   F32 / BF16  [n_blocks, block_size, ID]: the key itself (CPU F32 = the oracle).
//   U8 (FP8)    [n_blocks, block_size · (ID + 4)] bytes: DeepSeek/vLLM's 132 bytes per token
//     (ID = 128). Within a block: block_size · ID e4m3 values (token-major, ID per token), then
//     block_size fp32 scales (one per token). Token at offset o of block b:
//       values  bytes [b·BS·(ID+4) + o·ID, + ID)
//       scale   fp32 at byte b·BS·(ID+4) + BS·ID + 4·o
//     The scale is s = ue8m0(max(amax|k|, 1e-4) / 448): amax floored as DeepSeek's act_quant,
//     divided by the e4m3 maximum, then rounded UP to a power of two (ue8m0, as V3.2's
//     scale_fmt="ue8m0"), so every |k/s| ≤ 448 and k/s is exact; value = e4m3_rne(k / s)
//     (saturating). Scoring reads k ≈ e4m3_to_f32(value) · s (exact product, s a power of two).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey::ops {
// Bytes one token takes in the FP8 indexer cache: ID e4m3 values + one fp32 scale.
constexpr int64_t indexer_fp8_token_bytes(int64_t id) {
  return id + 4;
}
// The per-token FP8 scale from amax|k| (see above): the bit-exact rule both twins use.
inline float indexer_fp8_scale(float amax) {
  const float s = (amax > 1e-4f ? amax : 1e-4f) / 448.0f;
  uint32_t u;
  std::memcpy(&u, &s, 4);
  if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x800000u;  // round up to a power of two
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}
// index_cache[slot_mapping[t]] = k[t].  k [n_tokens, ID]. A slot of −1 (a padding row of a CUDA
// graph bucket) writes nothing on CUDA; the CPU twin refuses it.
void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m);
void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale);
void indexer_quantize_q(Tensor q8, Tensor weights_out, Tensor q, Tensor weights);
// The indexer's key, fused (issue 13: one kernel for three that only move bytes): with k_raw
// [n_tokens, ID] (wk's output, F32 or BF16), k = layer_norm(k_raw, norm_w, norm_b, eps), then
// rope(k, 0, rope_dim, m.positions, inv_freq, attention_factor, half-split) (ops/rope.h), then
// indexer_cache_write(index_cache, k, m). The CPU twin is that composition of CPU ops. A slot of
// −1 writes nothing on CUDA (the CPU twin refuses it).
void indexer_k_write(Tensor index_cache, Tensor k_raw, Tensor norm_w, Tensor norm_b, float eps,
                     int rope_dim, Tensor inv_freq, float attention_factor, const AttentionMeta& m);
// The indexer's FP8 query, fused (issue 13): with q [n_tokens, IH, ID] (wq_b's output before its
// rope, F32 or BF16) and weights [n_tokens, IH] F32 (weights_proj's output), q' = rope(q, 0,
// rope_dim, positions, inv_freq, attention_factor, half-split), w' = weights · weights_scale (F32
// product, as ops::scale), then indexer_quantize_q(q8, weights_out, q', w'). q and weights are not
// written. The CPU twin is that composition (on copies).
void indexer_q_prep(Tensor q8, Tensor weights_out, Tensor q, Tensor weights, float weights_scale,
                    int rope_dim, Tensor positions, Tensor inv_freq, float attention_factor);
namespace cpu {
void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m);
void indexer_k_write(Tensor index_cache, Tensor k_raw, Tensor norm_w, Tensor norm_b, float eps,
                     int rope_dim, Tensor inv_freq, float attention_factor, const AttentionMeta& m);
void indexer_q_prep(Tensor q8, Tensor weights_out, Tensor q, Tensor weights, float weights_scale,
                    int rope_dim, Tensor positions, Tensor inv_freq, float attention_factor);
void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale);
void indexer_quantize_q(Tensor q8, Tensor weights_out, Tensor q, Tensor weights);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m);
void indexer_k_write(Tensor index_cache, Tensor k_raw, Tensor norm_w, Tensor norm_b, float eps,
                     int rope_dim, Tensor inv_freq, float attention_factor, const AttentionMeta& m);
void indexer_q_prep(Tensor q8, Tensor weights_out, Tensor q, Tensor weights, float weights_scale,
                    int rope_dim, Tensor positions, Tensor inv_freq, float attention_factor);
void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale);
void indexer_quantize_q(Tensor q8, Tensor weights_out, Tensor q, Tensor weights);
}  // namespace cuda
}  // namespace osprey::ops
