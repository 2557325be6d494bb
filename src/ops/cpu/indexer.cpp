// CPU lightning indexer: F32 scores over every causal context position (the q·k products of a
// block of a sequence's tokens as one BLAS sgemm, the ReLU-weighted sum over heads in head order),
// then a stable top-k (score descending, position ascending on ties). The FP8 (U8) cache format of
// ops/indexer.h is written and read with plain loops: the reference for the CUDA twin.
#include "ops/indexer.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/tensor_ops.h"

namespace osprey::ops::cpu {

namespace {
// Tokens scored together: dots holds [kIndexerTokenBlock · heads, context] floats (64 heads at
// 8,192 positions: 32 MiB), large enough for the sgemm to run near the machine's peak.
constexpr int64_t kIndexerTokenBlock = 16;
// FP8 cache: the ID of a U8 cache [n_blocks, BS·(ID+4)] (checked against `id`).
void check_fp8_cache(const Tensor& c, int64_t id, int block_size) {
  OSPREY_CHECK(c.dtype == DType::U8 && c.size(-1) == block_size * indexer_fp8_token_bytes(id),
               "FP8 indexer cache width ", c.size(-1), " != ", block_size, " x (", id, " + 4)");
}
// Token `row` (= block · BS + offset) of an FP8 cache, dequantized into out[ID].
void fp8_key(const uint8_t* cache, int64_t row, int bs, int64_t id, float* out) {
  const int64_t b = row / bs, o = row % bs;
  const uint8_t* blk = cache + b * bs * indexer_fp8_token_bytes(id);
  float s;
  std::memcpy(&s, blk + bs * id + 4 * o, 4);
  for (int64_t d = 0; d < id; ++d) out[d] = e4m3_to_f32(blk[o * id + d]) * s;
}
}  // namespace

void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m) {
  const int64_t d = k.size(-1);
  const int64_t* slots = m.slot_mapping.ptr<int64_t>();
  OSPREY_CHECK(k.dtype == DType::F32, "indexer_cache_write (CPU): F32 keys");
  if (index_cache.dtype == DType::U8) {
    check_fp8_cache(index_cache, d, m.block_size);
    const int bs = m.block_size;
    const int64_t n_slots = index_cache.numel() / indexer_fp8_token_bytes(d);
    for (int64_t t = 0; t < m.n_tokens; ++t) {
      OSPREY_CHECK(slots[t] >= 0 && slots[t] < n_slots, "slot ", slots[t]);
      const float* kt = k.f32() + t * d;
      float amax = 0.0f;
      for (int64_t c = 0; c < d; ++c) amax = std::max(amax, std::fabs(kt[c]));
      const float s = indexer_fp8_scale(amax);
      const int64_t b = slots[t] / bs, o = slots[t] % bs;
      uint8_t* blk = index_cache.ptr<uint8_t>() + b * bs * indexer_fp8_token_bytes(d);
      for (int64_t c = 0; c < d; ++c) blk[o * d + c] = f32_to_e4m3(kt[c] / s);
      std::memcpy(blk + bs * d + 4 * o, &s, 4);
    }
    return;
  }
  OSPREY_CHECK(index_cache.size(-1) == d, "indexer cache width");
  const int64_t n_slots = index_cache.numel() / d;
  for (int64_t t = 0; t < m.n_tokens; ++t) {
    OSPREY_CHECK(slots[t] >= 0 && slots[t] < n_slots, "slot ", slots[t]);
    std::copy_n(k.f32() + t * d, d, index_cache.f32() + slots[t] * d);
  }
}

void indexer_quantize_q(Tensor q8, Tensor weights_out, Tensor q, Tensor weights) {
  OSPREY_CHECK(q.dtype == DType::F32 && q.dim() == 3 && weights.dtype == DType::F32 &&
                   q8.dtype == DType::U8 && weights_out.dtype == DType::F32,
               "indexer_quantize_q (CPU): F32 q [n, IH, ID] and weights, U8 q8, F32 weights_out");
  const int64_t n = q.size(0), IH = q.size(1), ID = q.size(2);
  OSPREY_CHECK(
      q8.numel() == n * IH * ID && weights.numel() == n * IH && weights_out.numel() == n * IH,
      "indexer_quantize_q shapes");
  for (int64_t r = 0; r < n * IH; ++r) {
    const float* x = q.f32() + r * ID;
    float amax = 0.0f;
    for (int64_t d = 0; d < ID; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float s = indexer_fp8_scale(amax);
    uint8_t* o = q8.ptr<uint8_t>() + r * ID;
    for (int64_t d = 0; d < ID; ++d) o[d] = f32_to_e4m3(x[d] / s);
    weights_out.f32()[r] = weights.f32()[r] * s;
  }
}

void indexer_k_write(Tensor index_cache, Tensor k_raw, Tensor norm_w, Tensor norm_b, float eps,
                     int rope_dim, Tensor inv_freq, float attention_factor,
                     const AttentionMeta& m) {
  OSPREY_CHECK(k_raw.dim() == 2 && k_raw.size(0) == m.n_tokens && k_raw.dtype == DType::F32,
               "indexer_k_write (CPU): F32 k_raw [n_tokens, ID], got ", shape_str(k_raw.shape));
  const int64_t T = k_raw.size(0), ID = k_raw.size(1);
  const Storage k(Device::CPU, DType::F32, {T, 1, ID});  // [T, 1, ID]
  layer_norm(k, k_raw, norm_w, norm_b, eps);
  rope(k, 0, rope_dim, m.positions, inv_freq, attention_factor, /*interleaved=*/false);
  indexer_cache_write(index_cache, k.view().reshape({T, ID}), m);
}

void indexer_q_prep(Tensor q8, Tensor weights_out, Tensor q, Tensor weights, float weights_scale,
                    int rope_dim, Tensor positions, Tensor inv_freq, float attention_factor) {
  OSPREY_CHECK(q.dtype == DType::F32 && q.dim() == 3 && weights.dtype == DType::F32,
               "indexer_q_prep (CPU): F32 q [n, IH, ID] and weights");
  const Storage qr(Device::CPU, DType::F32, q.shape), w(Device::CPU, DType::F32, weights.shape);
  ops::copy(qr, q);
  ops::copy(w, weights);
  rope(qr, 0, rope_dim, positions, inv_freq, attention_factor, /*interleaved=*/false);
  scale(w, weights_scale);
  indexer_quantize_q(q8, weights_out, qr, w);
}

void indexer_topk(Tensor topk_indices, Tensor q_in, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale) {
  // U8 q: the e4m3 values of indexer_quantize_q (their scales are in the weights), as F32.
  std::vector<float> q8_f32;
  Tensor q = q_in;
  if (q_in.dtype == DType::U8) {
    q8_f32.resize(size_t(q_in.numel()));
    for (int64_t i = 0; i < q_in.numel(); ++i)
      q8_f32[size_t(i)] = e4m3_to_f32(q_in.ptr<uint8_t>()[i]);
    q = Tensor{q8_f32.data(), DType::F32, q_in.shape, Device::CPU};
  }
  OSPREY_CHECK(q.dtype == DType::F32, "indexer_topk (CPU): q F32 or U8 (e4m3)");
  const int64_t IH = q.size(1), ID = q.size(2), topk = topk_indices.size(1);
  const bool fp8 = index_cache.dtype == DType::U8;
  if (fp8)
    check_fp8_cache(index_cache, ID, m.block_size);
  else
    OSPREY_CHECK(index_cache.size(-1) == ID, "indexer cache width");
  OSPREY_CHECK(weights.size(1) == IH && topk_indices.size(0) == m.n_tokens, "indexer shapes");
  const int32_t* pos = m.positions.ptr<int32_t>();
  const int32_t* qsl = m.query_start_loc.ptr<int32_t>();
  const int64_t max_blocks = m.block_table.size(1);
  const int32_t* bt = m.block_table.ptr<int32_t>();
  std::vector<float> keys;   // [P, ID] the sequence's keys in position order (FP8: dequantized)
  std::vector<float> dots;   // [n · IH, P] q·k of a block of the sequence's tokens
  std::vector<float> score;  // [p + 1] one token's index scores
  std::vector<int32_t> order;
  for (int s = 0; s < m.n_seqs; ++s) {
    const int64_t t_begin = qsl[s];
    const int64_t t_end = s + 1 < m.n_seqs ? std::min<int64_t>(qsl[s + 1], m.n_tokens) : m.n_tokens;
    if (t_begin >= t_end) continue;
    int64_t P = 0;  // context positions any of the sequence's tokens sees
    for (int64_t t = t_begin; t < t_end; ++t) P = std::max<int64_t>(P, pos[t] + 1);
    keys.resize(size_t(P * ID));
    for (int64_t j = 0; j < P; ++j) {
      const int64_t row =
          int64_t(bt[s * max_blocks + j / m.block_size]) * m.block_size + j % m.block_size;
      if (fp8)
        fp8_key(index_cache.ptr<uint8_t>(), row, m.block_size, ID, keys.data() + j * ID);
      else
        std::copy_n(index_cache.f32() + row * ID, ID, keys.data() + j * ID);
    }
    for (int64_t t0 = t_begin; t0 < t_end; t0 += kIndexerTokenBlock) {
      const int64_t t1 = std::min(t_end, t0 + kIndexerTokenBlock), n = t1 - t0;
      int64_t Pb = 0;
      for (int64_t t = t0; t < t1; ++t) Pb = std::max<int64_t>(Pb, pos[t] + 1);
      // dots[(t - t0) · IH + h, j] = q[t, h] · k[j]: one BLAS product for the block.
      dots.resize(size_t(n * IH * Pb));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n * IH), int(Pb), int(ID), 1.0f,
                  q.f32() + t0 * IH * ID, int(ID), keys.data(), int(ID), 0.0f, dots.data(),
                  int(Pb));
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t p = pos[t];
        score.assign(size_t(p + 1), 0.0f);
        const float* wt = weights.f32() + t * IH;
        for (int64_t h = 0; h < IH; ++h) {  // heads in order: the sum as a per-position loop
          const float* d = dots.data() + ((t - t0) * IH + h) * Pb;
          const float wh = wt[h];
          for (int64_t j = 0; j <= p; ++j) score[size_t(j)] += wh * std::max(d[j] * scale, 0.0f);
        }
        const int64_t n_sel = std::min<int64_t>(topk, p + 1);
        order.resize(size_t(p + 1));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(
            order.begin(), order.begin() + n_sel, order.end(), [&](int32_t a, int32_t b) {
              return score[size_t(a)] != score[size_t(b)] ? score[size_t(a)] > score[size_t(b)]
                                                          : a < b;
            });
        std::sort(order.begin(), order.begin() + n_sel);
        int32_t* out = topk_indices.ptr<int32_t>() + t * topk;
        for (int64_t i = 0; i < topk; ++i) out[i] = i < n_sel ? order[size_t(i)] : -1;
      }
    }
  }
}

}  // namespace osprey::ops::cpu
