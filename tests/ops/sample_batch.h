// A batch for ops::sample built on the host (row parameters, token lists, penalty state), the
// draw's distance to its nearest decision boundary (to judge a CPU/CUDA difference), shared by the
// CPU and CUDA sampling tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/tensor.h"
#include "ops/sample.h"

namespace osprey::testing {

// One row: its parameters (list offsets are filled by SampleBatch::add) and token lists.
struct SampleCase {
  SampleRowParams p;
  std::vector<int32_t> suppress;  // min_tokens' ids
  std::vector<int32_t> prompt;    // marked when the slot is new and repetition ≠ 1
  std::vector<int32_t> counted;   // added to the slot's counts
  bool penalised() const {
    return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
           p.presence_penalty != 0.0f;
  }
  bool greedy() const { return p.temperature < kGreedyTemperature; }
};

struct SampleBatch {
  int vocab = 0;
  std::vector<SampleRowParams> rows;  // [n_rows]
  std::vector<int32_t> lists;         // [n_list]
  int n_lp = 0, n_slots = 0;

  // Appends a row; a penalised row gets slot `slot` (or the next one when −1), reset if `reset`.
  void add(SampleCase c, bool reset, int slot = -1) {
    SampleRowParams& p = c.p;
    if (p.logprobs >= 0) p.logprob_row = n_lp++;
    p.suppress_begin = int32_t(lists.size());
    p.suppress_count = int32_t(c.suppress.size());
    lists.insert(lists.end(), c.suppress.begin(), c.suppress.end());
    if (c.penalised()) {
      p.penalty_slot = slot >= 0 ? slot : n_slots;
      n_slots = std::max(n_slots, p.penalty_slot + 1);
      p.reset_slot = reset;
      if (reset && p.repetition_penalty != 1.0f) {
        p.prompt_begin = int32_t(lists.size());
        p.prompt_count = int32_t(c.prompt.size());
        lists.insert(lists.end(), c.prompt.begin(), c.prompt.end());
      }
      p.count_begin = int32_t(lists.size());
      p.count_count = int32_t(c.counted.size());
      lists.insert(lists.end(), c.counted.begin(), c.counted.end());
    }
    rows.push_back(p);
  }
  // Host tensors: rows [n_rows, sizeof(SampleRowParams)] U8 and token lists [n_list] I32.
  Buffer rows_tensor() const {
    Buffer b(DType::U8, {int64_t(rows.size()), int64_t(sizeof(SampleRowParams))});
    std::memcpy(b.view().data, rows.data(), rows.size() * sizeof(SampleRowParams));
    return b;
  }
  Buffer lists_tensor() const {
    Buffer b(DType::I32, {int64_t(lists.size())});
    std::copy(lists.begin(), lists.end(), b.ptr<int32_t>());
    return b;
  }
};

inline bool mask_bit(const int32_t* mask_row, int i) {
  return (static_cast<uint32_t>(mask_row[i >> 5]) >> (i & 31)) & 1u;
}

// For a sampled row, the relative distance (over Σ e) of the CPU twin's decisions to their nearest
// boundary: u · Σ e to the nearest edge of the inverse CDF, the top-p mass to the mass ahead of
// the last kept and first dropped token, and (relative to min_p) e_i to min_p. A CUDA token that
// differs from the CPU's is a rounding case only when this is tiny. `state` mask_row / counts_row
// are the slot after the call (what the call sampled with).
inline double boundary_margin(const float* raw, int vocab, const SampleRowParams& p,
                              const int32_t* lists, const int32_t* mask_row,
                              const int32_t* counts_row) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<float> x(raw, raw + vocab);
  ops::cpu::apply_logits_processors(x.data(), vocab, p, lists, mask_row, counts_row);
  float m = -std::numeric_limits<float>::infinity();
  for (float& v : x) {
    v /= p.temperature;
    m = std::max(m, v);
  }
  double margin = kInf;
  std::vector<float> e(size_t(vocab), 0.0f);
  std::vector<int> cand;
  for (int i = 0; i < vocab; ++i) {
    e[size_t(i)] = std::exp(x[size_t(i)] - m);
    if (e[size_t(i)] > 0.0f && p.min_p > 0.0f)
      margin = std::min(margin, std::fabs(double(e[size_t(i)]) - p.min_p) / p.min_p);
    if (e[size_t(i)] > 0.0f && e[size_t(i)] >= p.min_p) cand.push_back(i);
  }
  std::sort(cand.begin(), cand.end(), [&](int a, int b) {
    return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b);
  });
  size_t n = cand.size();
  if (p.top_k > 0 && p.top_k < vocab && size_t(p.top_k) < n) {
    const float cut = x[size_t(cand[size_t(p.top_k) - 1])];
    while (n > 0 && x[size_t(cand[n - 1])] < cut) --n;
  }
  if (p.top_p < 1.0f && n > 1) {
    double z = 0.0;
    for (size_t j = 0; j < n; ++j) z += e[size_t(cand[j])];
    const double mass = double(p.top_p) * z;
    double before = 0.0;
    size_t keep = 0;
    while (keep < n && (keep == 0 || before < mass)) before += e[size_t(cand[keep++])];
    if (keep > 1)
      margin = std::min(margin, std::fabs(before - e[size_t(cand[keep - 1])] - mass) / z);
    if (keep < n) margin = std::min(margin, std::fabs(before - mass) / z);
    const float cut = x[size_t(cand[keep - 1])];
    while (n > keep && x[size_t(cand[n - 1])] < cut) --n;
  }
  std::vector<int> kept(cand.begin(), cand.begin() + long(n));
  std::sort(kept.begin(), kept.end());
  double z = 0.0;
  for (int i : kept) z += e[size_t(i)];
  const double target = sampling_uniform(p.seed, p.step) * z;
  double cum = 0.0;
  for (int i : kept) {
    cum += e[size_t(i)];
    margin = std::min(margin, std::fabs(cum - target) / z);
  }
  return margin;
}

}  // namespace osprey::testing
