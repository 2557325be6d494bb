// Deliberate damage to a model, for the negative controls of the accuracy gate (`osprey eval`):
// a gate that cannot fail proves nothing, so osprey can run the model with
//   zero_attention_layer L  layer L's attention output (after o_proj) set to zero;
//   indexer_recent          (V3.2) attention over the most recent index_topk positions instead of
//                           the indexer's choice (the indexer still runs and fills its cache);
//   dense_attention         (V3.2) attention over every causal position, as if index_topk were
//                           above the longest sequence (not damage: the sparsity-off figure).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/tensor.h"

namespace osprey {

struct ModelAblation {
  int zero_attention_layer = -1;  // -1: none
  bool indexer_recent = false;
  bool dense_attention = false;
};

// topk_indices [n_tokens, k] I32 = for the token at position p, the positions
// max(0, p - k + 1) .. p in ascending order, padded with -1 (the layout of ops::indexer_topk).
// positions [n_tokens] I32.
inline void select_recent_positions(Tensor topk_indices, Tensor positions) {
  const int64_t n = topk_indices.size(0), k = topk_indices.size(1);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = positions.ptr<int32_t>()[t];
    const int64_t first = std::max<int64_t>(0, p - k + 1);
    int32_t* row = topk_indices.ptr<int32_t>() + t * k;
    for (int64_t i = 0; i < k; ++i) row[i] = first + i <= p ? int32_t(first + i) : -1;
  }
}

}  // namespace osprey
