#include "ops/moe.h"

namespace osprey {

RouterParams RouterParams::from_config(const ModelConfig& c) {
  RouterParams p;
  p.n_experts = c.n_routed_experts;
  p.top_k = c.num_experts_per_tok;
  p.n_group = c.n_group;
  p.topk_group = c.topk_group;
  p.scoring = c.scoring_func;
  p.method = c.topk_method;
  p.norm_topk_prob = c.norm_topk_prob;
  p.routed_scaling_factor = float(c.routed_scaling_factor);
  return p;
}

}  // namespace osprey
