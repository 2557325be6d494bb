// The split-KV work plan of the sm90 MLA decode kernel, and the combine of split partials.
//
// Work is counted in blocks of kMlaBlockN attended entries. Token t attends
//   L_t = min(positions[t] + 1, clamp) entries (clamp = top-k for sparse attention, else no clamp),
// so it has nb_t = ceil(L_t / kMlaBlockN) blocks. The tokens' blocks, laid end to end in token
// order, are cut into n_parts equal runs of `payload` blocks (FlashMLA's "SM parts"): part p works
// on global blocks [p·payload, min((p + 1)·payload, total)). A token whose blocks fall in one part
// is finished by that part (its output written directly); a token cut across parts has
//   n_splits_t = (cum[t+1] − 1)/payload − cum[t]/payload + 1
// partials, combined afterwards. The plan is three device arrays built by one kernel:
//   cum        [n_tokens + 1] I32  exclusive prefix sum of nb_t (cum[n_tokens] = total)
//   split_base [n_tokens + 1] I32  first partial slot of token t: prefix sum of n_splits_t over
//                                  the split tokens (n_splits_t > 1) before t
//   payload    [1] I32             blocks per part, max(1, ceil(total / n_parts))
// Everything else (a part's tokens, a token's split index) follows from these by arithmetic.
// The plan depends only on (n_tokens, each L_t, n_parts): the batch fingerprint of ops/
// attention_meta.h. mla_split_plan() keeps the last plan and rebuilds it only when the fingerprint
// changes (or is unknown, 0), so a step builds it once for all its layers, and decode steps whose
// clamped lengths repeat (every V3.2 sequence past top-k) reuse it across steps.
#pragma once

#include <cstdint>

#include "ops/attention_meta.h"

namespace osprey::ops::cuda {

constexpr int kMlaBlockN = 64;  // attended entries per block: the decode kernel's pipeline tile

struct MlaPlan {
  const int32_t* cum = nullptr;         // [n_tokens + 1]
  const int32_t* split_base = nullptr;  // [n_tokens + 1]
  const int32_t* payload = nullptr;     // [1]
  int n_tokens = 0;
  int n_parts = 0;
  int max_slots = 0;  // partial slots a plan can need: ≤ 2·(n_parts − 1), at least 1
};

// The plan for m's tokens (positions on the device) with L_t clamped at `clamp`, cached by
// m.fingerprint. The returned pointers stay valid until the next call.
MlaPlan mla_split_plan(const AttentionMeta& m, int64_t clamp, int n_parts);

// Merges the partials of every split token into out [n_tokens, H, kv_lora] (To = F32 or BF16)
// and, when lse is given, lse [n_tokens, H] (natural log); unsplit tokens are left as the decode
// kernel wrote them. part_o [max_slots, H, kv_lora] F32 normalised partial outputs, part_lse
// [max_slots, H] F32 base-2 log-sum-exp of the scaled scores (−inf: nothing attended).
void mla_combine_splits(void* out, bool out_bf16, float* lse, const float* part_o,
                        const float* part_lse, const MlaPlan& plan, int H, int kv_lora);

__device__ __forceinline__ int mla_n_splits(const int32_t* cum, int32_t payload, int t) {
  const int32_t c0 = cum[t], c1 = cum[t + 1];
  return c1 > c0 ? (c1 - 1) / payload - c0 / payload + 1 : 1;
}

}  // namespace osprey::ops::cuda
