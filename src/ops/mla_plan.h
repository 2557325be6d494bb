// The split-KV work plan of the sm90 MLA kernels (ops/cuda/mla/split_kv.cuh builds it on the
// device): how a batch's attended blocks are cut into n_parts runs, one CTA (per head group) a
// run, with a fixed cost charged for every query token a run starts.
//
// Token t attends L_t = min(positions[t] + 1, clamp) entries in nb_t = ceil(L_t / 64) blocks
// (nb_t ≥ 1), laid end to end in token order: cum [n + 1] is their exclusive prefix sum, total =
// cum[n]. Each token also costs F blocks' worth of fixed work wherever it is processed (staging
// its Q, the softmax epilogue, writing out: about one cache tile's bytes each), so the runs are cut
// at equal *cost*: on the cost line token t occupies [C_t, C_t + F + nb_t), C_t = cum[t] + F·t,
// its F fixed units first. With T = total + F·n and payload = max(1, ceil(T / n_parts)), run p
// starts at cost x_p = min(p·payload, T), mapped back to a block:
//   part_start[p] = cum[t] + max(0, x_p − C_t − F)   for the token t with C_t ≤ x_p < C_{t+1}
// (a cut inside a token's fixed units starts the run at that token's first block), and
// part_start[n_parts] = total. F = 0 gives part_start[p] = min(p·payload, total): equal runs of
// blocks (FlashMLA's "SM parts"), what decode batches use. Runs can be empty (part_start[p] =
// part_start[p + 1]) only at a token's first block, so every token's blocks lie in consecutive
// non-empty runs: first_part[t] = part_of(cum[t]), n_splits[t] = part_of(cum[t + 1] − 1) −
// first_part[t] + 1, part_of(b) = the largest p < n_parts with part_start[p] ≤ b.
#pragma once

#include <cstdint>
#include <vector>

#include "core/host_device.h"

namespace osprey::ops {

constexpr int kMlaPlanBlockN = 64;  // attended entries a block (the kernels' pipeline tile)
// The per-token cost of prompt chunks, in blocks (`fixed` above): a token's Q staging
// (64 heads × 576 BF16 = 72 KB, one cache tile's bytes), its softmax epilogue and its output
// (64 KB) cost about what a few of its 64-entry blocks do. Without it, the run holding a causal
// chunk's first ~130 tokens (1 or 2 blocks each) took far longer than the run of 5 long ones
// (H200: 1440 queries over 1440 rows ran 30% longer than 1440 queries over 1900 rows, which
// attend 64% more entries). `osprey bench kernels --op mla` compares values
// (ops/cuda/mla/hooks.h set_mla_prefill_token_cost).
constexpr int32_t kMlaPrefillTokenCost = 4;

// L_t = min(p + 1, clamp): the entries a token at position p attends (clamp = the sparse top-k;
// no clamp, INT64_MAX, for dense attention), and nb_t = ceil(L_t / 64), its blocks in the plan.
// The plan (host and device) and the kernels' per-token loops take both from here.
OSPREY_HOST_DEVICE inline int64_t mla_token_entries(int64_t position, int64_t clamp) {
  return position + 1 < clamp ? position + 1 : clamp;
}
OSPREY_HOST_DEVICE inline int32_t mla_token_blocks(int64_t position, int64_t clamp) {
  return int32_t((mla_token_entries(position, clamp) + kMlaPlanBlockN - 1) / kMlaPlanBlockN);
}

OSPREY_HOST_DEVICE inline int32_t mla_plan_payload(int32_t total, int n_tokens, int32_t fixed,
                                                   int n_parts) {
  const int64_t T = int64_t(total) + int64_t(fixed) * n_tokens;
  const int64_t pl = (T + n_parts - 1) / n_parts;
  return int32_t(pl > 1 ? pl : 1);
}

// part_start[p] for 0 ≤ p ≤ n_parts, from cum [n_tokens + 1] (see above).
OSPREY_HOST_DEVICE inline int32_t mla_part_start(int p, const int32_t* cum, int n_tokens,
                                                 int32_t fixed, int n_parts, int32_t payload) {
  const int32_t total = cum[n_tokens];
  const int64_t T = int64_t(total) + int64_t(fixed) * n_tokens;
  const int64_t x = int64_t(p) * payload < T ? int64_t(p) * payload : T;
  if (p >= n_parts || x >= T) return total;
  int lo = 0, hi = n_tokens - 1;  // the largest t with C_t ≤ x (C_0 = 0 ≤ x)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (int64_t(cum[mid]) + int64_t(fixed) * mid <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t off = x - (int64_t(cum[lo]) + int64_t(fixed) * lo) - fixed;
  return cum[lo] + int32_t(off > 0 ? off : 0);
}

// The run holding block b (0 ≤ b < total): the largest p < n_parts with part_start[p] ≤ b.
OSPREY_HOST_DEVICE inline int mla_part_of(const int32_t* part_start, int n_parts, int32_t b) {
  int lo = 0, hi = n_parts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (part_start[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The whole plan on the host: the reference the device plan must equal exactly.
struct MlaPlanReference {
  std::vector<int32_t> cum;           // [n + 1]
  std::vector<int32_t> part_start;    // [n_parts + 1]
  std::vector<int32_t> first_part;    // [n]
  std::vector<int32_t> n_splits;      // [n]
  std::vector<int32_t> split_base;    // [n + 1] first partial slot of each split token
  std::vector<int32_t> split_tokens;  // the tokens with n_splits > 1, in order (≤ n_parts − 1)
};
MlaPlanReference mla_plan_reference(const std::vector<int32_t>& positions, int64_t clamp,
                                    int n_parts, int32_t fixed);

}  // namespace osprey::ops
