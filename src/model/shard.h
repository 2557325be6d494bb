// What one rank of a parallel model holds (dist/parallel_config.h says the modes), and the
// checkpoint slices it reads:
//   TP: q_b_proj / q_proj rows and kv_b_proj rows of its heads [head_begin, head_end), o_proj's
//       columns of those heads; dense MLP, shared experts and (without EP) every routed expert:
//       gate/up rows and down columns of its part of the intermediate; lm_head rows of its vocab
//       part [vocab_begin, vocab_end). Replicated: the embedding, norms, q_a/kv_a, the router and
//       the V3.2 indexer (every rank computes the same top-k: its 64 heads are cheap next to
//       attention's, and a split would need one more all-reduce per layer).
//   EP: routed experts [expert_begin, expert_end) whole (contiguous, E / world each).
//   DP: attention, dense MLP, shared experts and lm_head whole on every rank.
// Sizes that do not divide (heads by TP, experts by the world, intermediates by TP) are refused
// with an error naming the model's number; the vocabulary may be uneven (the last rank's part is
// shorter; gathers pad to vocab_stride rows).
#pragma once

#include <vector>

#include "config/model_config.h"
#include "dist/parallel_config.h"
#include "model/weights.h"

namespace osprey {

struct RankShard {
  int rank = 0, world = 1;
  int tp = 1, dp = 1;
  bool ep = false;
  int64_t head_begin = 0, head_end = 0;    // attention heads of this rank
  int64_t vocab_begin = 0, vocab_end = 0;  // lm_head rows of this rank
  int64_t vocab_stride = 0;                // rows per rank in the logits gather (ceil(V / tp))
  int expert_begin = 0, expert_end = 0;    // routed experts held (global ids)
  int64_t heads() const { return head_end - head_begin; }
  bool split_tp() const { return tp > 1; }                 // heads, MLPs, lm_head split
  bool split_experts_tp() const { return tp > 1 && !ep; }  // each expert's intermediate split
  bool data_parallel() const { return dp > 1; }
  bool expert_parallel() const { return ep; }  // (one rank too: the dispatch path on one GPU)
};

// The shard of `rank`; fails (osprey::Error) when the model's sizes do not divide.
RankShard make_rank_shard(const ModelConfig& c, const dist::ParallelConfig& p, int rank);
// weight_specs(c) with each spec's slice set for the shard; experts it does not hold left out.
std::vector<WeightSpec> shard_weight_specs(const ModelConfig& c, const RankShard& s);

}  // namespace osprey
