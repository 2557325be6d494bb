// Multi-head latent attention (MLA) and its paged latent cache.
//
// Cache layout: latent_cache [n_blocks, block_size, kv_lora + rope]: per token the normalised
// latent (kv_lora) then the rotated shared rope key (rope). Row of position j of sequence s:
// block_table[s, j / block_size] · block_size + j % block_size.
// Two cache formats, told apart by the cache's dtype:
//   F32 / BF16  [n_blocks, block_size, kv_lora + rope]: the values themselves (CPU F32 = oracle).
//   U8 (FP8)    [n_blocks, block_size, kv_lora + 4·kv_lora/128 + 2·rope] bytes: DeepSeek's
//     "fp8_ds_mla" (FlashMLA's FP8 sparse decode, vLLM --kv-cache-dtype fp8), 656 B per token at
//     512 + 64 (the BF16 row is 1152 B). Per token, bytes:
//       [0, kv_lora)                      the latent as e4m3, value c = e4m3_rne(x_c / s_{c/128})
//       [kv_lora, kv_lora + 4·n_tiles)    n_tiles = kv_lora/128 fp32 scales, tile i at + 4·i
//       [kv_lora + 4·n_tiles, + 2·rope)   k_pe as bf16 (round to nearest even), not quantized
//     Scale of tile i: s_i = max(amax_i / 448, FLT_MIN), amax_i = max |x_c| over its 128 values:
//     a plain fp32 quotient, NOT rounded to a power of two (FlashMLA's reference quantizer and
//     vLLM's concat_and_cache_ds_mla store amax/448; the FLT_MIN floor is vLLM's, for an all-zero
//     tile). e4m3 saturates at ±448 (amax / s can round to just above 448). Reading: latent c =
//     e4m3_to_f32(value) · s (one F32 product), rope = bf16 → F32. kv_lora must be a multiple of
//     128 and rope even (so every scale is 4-byte aligned). Both twins write identical bytes.
//
// Absorbed (decode; any query over cached context):
//   q [n_tokens, H, kv_lora + rope] = [q_nope·W_UK | q_pe];  for token t at position p in seq s:
//   score_j = scale · q·cache_j, j ≤ p (and j ∈ topk_indices[t] when given);
//   out [n_tokens, H, kv_lora] = Σ_j softmax(score)_j · cache_j[:kv_lora]
//   (cache_j: the row as read above, i.e. dequantized for an FP8 cache)
// Expanded (prefill, non-absorbed): per sequence, K [L, H, nope + rope] and V [L, H, v]
// decompressed from the latent by kv_b_proj, rows kv_start_loc[s] .. + seq_lens[s]:
//   out [n_tokens, H, v] = softmax(scale · q·K_j, j ≤ p, j ∈ topk) · V_j
// topk_indices [n_tokens, topk] I32: context positions to attend, −1 for unused entries; an empty
// tensor means dense (all causal positions). The valid entries of a row come first (the indexer's
// contract, ops/indexer.h): entries at i ≥ min(topk, p + 1) must be −1 (the CUDA twin skips them
// unread). Repeated positions are attended as often as they appear.
// lse (absorbed, optional) [n_tokens, H] F32: log Σ_j e^score_j, natural log, −inf when nothing
// is attended (the split-KV merge quantity, as FlashMLA returns it).
#pragma once

#include <cfloat>
#include <cstdint>

#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey::ops {

constexpr int64_t kMlaFp8Tile = 128;  // latent values per fp32 scale
// Bytes one token takes in the FP8 latent cache (656 at 512 + 64).
constexpr int64_t mla_fp8_token_bytes(int64_t kv_lora, int64_t rope) {
  return kv_lora + 4 * (kv_lora / kMlaFp8Tile) + 2 * rope;
}
// Whether the FP8 format can hold a kv_lora + rope latent (see above).
constexpr bool mla_fp8_supported(int64_t kv_lora, int64_t rope) {
  return kv_lora > 0 && kv_lora % kMlaFp8Tile == 0 && rope >= 0 && rope % 2 == 0;
}
// The rope dim of an FP8 cache row of token_bytes that holds width = kv_lora + rope values:
// token_bytes = 33·width/32 + 31·rope/32 solved for rope; −1 when no such split exists.
constexpr int64_t mla_fp8_rope_dim(int64_t token_bytes, int64_t width) {
  const int64_t r31 = 32 * token_bytes - 33 * width;
  if (r31 < 0 || r31 % 31 != 0) return -1;
  const int64_t rope = r31 / 31;
  return rope <= width && mla_fp8_supported(width - rope, rope) &&
                 mla_fp8_token_bytes(width - rope, rope) == token_bytes
             ? rope
             : -1;
}
// The tile scale from amax (see above): the bit-exact rule both twins use.
inline float mla_fp8_scale(float amax) {
  const float s = amax / 448.0f;
  return s > FLT_MIN ? s : FLT_MIN;
}

// Weight absorption with kv_b [H·(nope + v), kv_lora] (per head: nope rows W_UK, then v rows W_UV):
//   q_abs [n, H, kv_lora + rope] = [q_nope·W_UK_h | q_pe]      from q [n, H, nope + rope]
//   out   [n, H, v]              = o_lat·W_UV_hᵀ                 from o_lat [n, H, kv_lora]
void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v);
void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope);
// q's rope and the absorption fused (issue 13: the rope kernel on q is gone from a decode step):
// rope(q, nope, rope, positions, inv_freq, attention_factor, interleaved) (ops/rope.h), then
// mla_absorb_q(q_abs, q, kv_b, nope, v). q is an input the op may rope in place (the CPU twin, that
// composition, does; the CUDA twin's fused kernel for a BF16 kv_b and an F32 q rotates the rope
// part as it copies it and leaves q as given): a caller does not read q afterwards.
void mla_absorb_q_rope(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v, Tensor positions,
                       Tensor inv_freq, float attention_factor, bool interleaved);
// cache[slot_mapping[t]] = [latent[t] | k_pe[t]].  latent [n_tokens, kv_lora], k_pe [n_tokens,
// rope]. A U8 cache is written in the FP8 format (quantized here). A slot of −1 (a padding row of
// a CUDA graph bucket) writes nothing on CUDA; the CPU twin refuses it (no padded batch runs
// there).
void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m);
// The latent cache write of a layer from kv_a_proj's output, fused (issue 13: a kernel that only
// moves bytes is one kernel): with kv [n_tokens, kv_lora + rope] (F32 or BF16), latent =
// rms_norm(kv[:, :kv_lora], norm_w, eps) and k_pe = rope(kv[:, kv_lora:]) at m.positions
// (interleaved or half-split pairs, inv_freq [rope/2], attention_factor: ops/rope.h), then
// mla_cache_write(latent_cache, latent, k_pe, m). The CPU twin is that composition of CPU ops.
void mla_kv_write(Tensor latent_cache, Tensor kv, Tensor norm_w, float eps, Tensor inv_freq,
                  float attention_factor, bool interleaved, const AttentionMeta& m);
// out [Σ seq_lens, kv_lora + rope] = the cached rows of every sequence, in order (kv_start_loc =
// cumsum); an FP8 cache is dequantized (the prefill path).
void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m);
void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale, Tensor lse = {});
void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
// Whether a chunk of prompt tokens should take the absorbed form on this device: true where the
// sm90 tensor-core kernel serves sparse (top-k) attention at 512 + 64 with these heads, so a
// prefill chunk attends its chosen rows in latent space instead of decompressing every cached row
// through kv_b (the expanded path). The CPU twin: always false (the expanded form is cheaper
// there).
bool mla_absorbed_prefill_preferred(Device device, int64_t heads, int64_t kv_lora, int64_t rope,
                                    bool sparse);
// The largest |value| the loaded model can write into its MLA latent cache, or 0 when unknown (no
// model registered one). The latent is RMSNorm(c) ⊙ w (kv_a_layernorm), each normalised value at
// most sqrt(kv_lora) in magnitude, so the bound is sqrt(kv_lora) · max |w| over the layers
// (model/deepseek.h mla_latent_bound_of); DeepseekModel registers it at load. The FP8 decode's
// f16 variant (the default for calls of 16 query tokens or more, or OSPREY_MLA_FP8=f16) takes a
// call only while the bound is unknown or at most kMlaF16LatentLimit: f16's largest value, 65504,
// less 8% for the f16 rounding of the tile scale and of its product (2^-10 together) and the F32
// norm's. Past it the lockstep kernel serves.
constexpr float kMlaF16LatentLimit = 60000.0f;
void set_mla_latent_bound(float bound);  // bound ≥ 0 (+inf: a bound no kernel can rely on)
float mla_latent_bound();
namespace cuda {
bool mla_absorbed_prefill_preferred(int64_t heads, int64_t kv_lora, int64_t rope, bool sparse);
}  // namespace cuda

namespace cpu {
void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v);
void mla_absorb_q_rope(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v, Tensor positions,
                       Tensor inv_freq, float attention_factor, bool interleaved);
void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope);
void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m);
void mla_kv_write(Tensor latent_cache, Tensor kv, Tensor norm_w, float eps, Tensor inv_freq,
                  float attention_factor, bool interleaved, const AttentionMeta& m);
void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m);
void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale, Tensor lse = {});
void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v);
void mla_absorb_q_rope(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v, Tensor positions,
                       Tensor inv_freq, float attention_factor, bool interleaved);
void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope);
void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m);
void mla_kv_write(Tensor latent_cache, Tensor kv, Tensor norm_w, float eps, Tensor inv_freq,
                  float attention_factor, bool interleaved, const AttentionMeta& m);
void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m);
void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale, Tensor lse = {});
void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale);
}  // namespace cuda
}  // namespace osprey::ops
