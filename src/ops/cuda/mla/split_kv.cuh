// The split-KV work plan of the sm90 MLA decode kernel, and the combine of split partials.
//
// The plan's arithmetic is ops/mla_plan.h: the tokens' 64-entry blocks laid end to end in token
// order and cut into n_parts runs of equal cost, a token costing its blocks plus `fixed` blocks'
// worth of per-token work (0 for decode batches: equal runs of blocks, FlashMLA's "SM parts";
// ops::kMlaPrefillTokenCost for prompt chunks, whose early tokens attend a block or two each). A
// token whose blocks fall in one run is finished by that part (its output written directly); a
// token cut across runs has n_splits[t] partials, combined afterwards. The plan is device arrays
// built by one kernel:
//   cum        [n_tokens + 1] I32  exclusive prefix sum of the tokens' blocks (cum[n] = total)
//   split_base [n_tokens + 1] I32  first partial slot of token t: prefix sum of n_splits over
//                                  the split tokens (n_splits > 1) before t
//   part_start [n_parts + 1]  I32  first block of each run (part_start[n_parts] = total); a run
//                                  may be empty only at a token's first block
//   first_part [n_tokens]     I32  the run holding token t's first block
//   n_splits   [n_tokens]     I32  runs holding token t's blocks (consecutive, all non-empty)
//   split_list [n_parts]      I32  the number of split tokens (n_splits > 1; at most n_parts − 1,
//                                  each holds a run boundary), then those tokens in order
// The plan depends only on (n_tokens, each L_t, n_parts, fixed): the batch fingerprint of ops/
// attention_meta.h with the call's constants. mla_split_plan() keeps the last plan and rebuilds it
// only when these change (or the fingerprint is unknown, 0), so a step builds it once for all its
// layers, and decode steps whose clamped lengths repeat (every V3.2 sequence past top-k) reuse it
// across steps.
#pragma once

#include <cstdint>

#include "ops/attention_meta.h"
#include "ops/mla_plan.h"

namespace osprey::ops::cuda {

constexpr int kMlaBlockN = kMlaPlanBlockN;  // attended entries per block: the kernels' tile
// Most runs a plan cuts (the plan kernel keeps part_start in shared memory; ≥ any SM count).
constexpr int kMlaMaxParts = 1024;

struct MlaPlan {
  const int32_t* cum = nullptr;         // [n_tokens + 1]
  const int32_t* split_base = nullptr;  // [n_tokens + 1]
  const int32_t* part_start = nullptr;  // [n_parts + 1]
  const int32_t* first_part = nullptr;  // [n_tokens]
  const int32_t* n_splits = nullptr;    // [n_tokens]
  const int32_t* split_list = nullptr;  // [n_parts]: count, then the split tokens
  int n_tokens = 0;
  int n_parts = 0;
  int max_slots = 0;  // partial slots a plan can need: ≤ 2·(n_parts − 1), at least 1
};

// The plan for m's tokens (positions on the device) with L_t clamped at `clamp`, each token
// costing `fixed` blocks more (ops/mla_plan.h), cached by m.fingerprint. 1 ≤ n_parts ≤
// kMlaMaxParts. The returned pointers stay valid until the next call.
MlaPlan mla_split_plan(const AttentionMeta& m, int64_t clamp, int n_parts, int32_t fixed);

// Merges the partials of every split token into out [n_tokens, H, kv_lora] (To = F32 or BF16)
// and, when lse is given, lse [n_tokens, H] (natural log); unsplit tokens are left as the decode
// kernel wrote them. part_o [max_slots, H, kv_lora] F32 normalised partial outputs, part_lse
// [max_slots, H] F32 base-2 log-sum-exp of the scaled scores (−inf: nothing attended).
void mla_combine_splits(void* out, bool out_bf16, float* lse, const float* part_o,
                        const float* part_lse, const MlaPlan& plan, int H, int kv_lora);

}  // namespace osprey::ops::cuda
