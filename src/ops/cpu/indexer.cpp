// CPU lightning indexer: exact F32 scores over every causal context position, then a stable
// top-k (score descending, position ascending on ties).
#include "ops/indexer.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace osprey::ops::cpu {

void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m) {
  const int64_t d = k.size(-1);
  OSPREY_CHECK(index_cache.size(-1) == d, "indexer cache width");
  const int64_t n_slots = index_cache.numel() / d;
  const int64_t* slots = m.slot_mapping.ptr<int64_t>();
  for (int64_t t = 0; t < m.n_tokens; ++t) {
    OSPREY_CHECK(slots[t] >= 0 && slots[t] < n_slots, "slot ", slots[t]);
    std::copy_n(k.f32() + t * d, d, index_cache.f32() + slots[t] * d);
  }
}

void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale) {
  const int64_t IH = q.size(1), ID = q.size(2), topk = topk_indices.size(1);
  OSPREY_CHECK(
      weights.size(1) == IH && index_cache.size(-1) == ID && topk_indices.size(0) == m.n_tokens,
      "indexer shapes");
  const int32_t* pos = m.positions.ptr<int32_t>();
  const int32_t* qsl = m.query_start_loc.ptr<int32_t>();
  const int64_t max_blocks = m.block_table.size(1);
  const int32_t* bt = m.block_table.ptr<int32_t>();
  std::vector<float> score;
  std::vector<int32_t> order;
  int s = 0;
  for (int64_t t = 0; t < m.n_tokens; ++t) {
    while (s + 1 < m.n_seqs && qsl[s + 1] <= t) ++s;
    const int64_t p = pos[t];
    score.assign(size_t(p + 1), 0.0f);
    const float* qt = q.f32() + t * IH * ID;
    const float* wt = weights.f32() + t * IH;
    for (int64_t j = 0; j <= p; ++j) {
      const int64_t row =
          int64_t(bt[s * max_blocks + j / m.block_size]) * m.block_size + j % m.block_size;
      const float* kj = index_cache.f32() + row * ID;
      float acc = 0.0f;
      for (int64_t h = 0; h < IH; ++h) {
        float dot = 0.0f;
        for (int64_t d = 0; d < ID; ++d) dot += qt[h * ID + d] * kj[d];
        acc += wt[h] * std::max(dot * scale, 0.0f);
      }
      score[size_t(j)] = acc;
    }
    const int64_t n_sel = std::min<int64_t>(topk, p + 1);
    order.resize(size_t(p + 1));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n_sel, order.end(), [&](int32_t a, int32_t b) {
      return score[size_t(a)] != score[size_t(b)] ? score[size_t(a)] > score[size_t(b)] : a < b;
    });
    std::sort(order.begin(), order.begin() + n_sel);
    int32_t* out = topk_indices.ptr<int32_t>() + t * topk;
    for (int64_t i = 0; i < topk; ++i) out[i] = i < n_sel ? order[size_t(i)] : -1;
  }
}

}  // namespace osprey::ops::cpu
