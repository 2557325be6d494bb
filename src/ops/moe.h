// Mixture of experts: routing and the routed experts.
//
// Routing, per token (router_logits [n_tokens, E] = x·W_gateᵀ, F32 or BF16: the gate GEMM's output
// in the gate weight's dtype, read as it is; the arithmetic below is F32 in both twins, a BF16
// logit widened exactly; model/moe_router.h says which dtype each backend's model uses):
//   s = softmax(logits) or sigmoid(logits) (scoring_func)
//   greedy:               chosen = top-k of s
//   group_limited_greedy: group score = max of s in the group; keep the topk_group best groups;
//                         chosen = top-k of s within them
//   noaux_tc:             c = s + e_score_correction_bias; group score = sum of the group's top-2
//   of
//                         c; keep the topk_group best groups; chosen = top-k of c within them
//   weight_i = s[chosen_i]; if norm_topk_prob: weight /= Σ weight (+1e-20 for sigmoid, as
//   transformers); weight ×= routed_scaling_factor.
// topk_ids [n_tokens, k] I32, topk_weights [n_tokens, k] F32.
//
// Experts: out[t] = Σ_i topk_weights[t, i] · down_i(silu(gate_i(x[t])) ⊙ up_i(x[t])).
// The CUDA twin runs every expert at once as grouped GEMMs over the routed pairs sorted by expert
// (ops/moe_schedule.h), in a fixed number of launches and without host synchronisation.
#pragma once

#include <vector>

#include "config/model_config.h"
#include "core/tensor.h"
#include "ops/gemm.h"

namespace osprey {

struct RouterParams {
  int n_experts = 0;
  int top_k = 0;
  int n_group = 1;
  int topk_group = 1;
  ScoringFunc scoring = ScoringFunc::Softmax;
  TopkMethod method = TopkMethod::Greedy;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  static RouterParams from_config(const ModelConfig& c);
};

struct MlpWeights {
  LinearWeight gate;  // [I, D]
  LinearWeight up;    // [I, D]
  LinearWeight down;  // [D, I]
};

namespace ops {
void moe_route(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor correction_bias,
               const RouterParams& p);
// out [n_tokens, D] = Σ_i w_i · expert_{id_i}(x)   (out is overwritten);
// with addend [n_tokens, D] F32 (the shared expert's output): out = (Σ_i w_i · expert_{id_i}(x)) +
// addend, the sum then one F32 addition, as ops::add(out, out, addend) after it gives (issue 13:
// the add kernel is gone on CUDA, where the combine adds it).
void moe_experts(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                 const std::vector<MlpWeights>& experts, Tensor addend = {});
namespace cpu {
void moe_route(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor correction_bias,
               const RouterParams& p);
void moe_experts(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                 const std::vector<MlpWeights>& experts, Tensor addend = {});
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void moe_route(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor correction_bias,
               const RouterParams& p);
void moe_experts(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                 const std::vector<MlpWeights>& experts, Tensor addend = {});
}  // namespace cuda
}  // namespace ops
}  // namespace osprey
