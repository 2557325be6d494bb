#include "bench/step_cost.h"

#include <algorithm>
#include <cmath>

namespace osprey::bench {

namespace {
// Stored bytes of a linear [out, in]: FP8 e4m3 + F32 block scales, or BF16.
double linear_bytes(int64_t out, int64_t in, bool fp8) {
  if (!fp8) return 2.0 * double(out) * double(in);
  const double blocks = double((out + 127) / 128) * double((in + 127) / 128);
  return double(out) * double(in) + 4.0 * blocks;
}

struct LayerParts {
  double attn_bytes = 0, attn_params = 0;  // MLA + indexer projections, norms
  double mlp_bytes = 0, mlp_params = 0;    // dense MLP
  double router_bytes = 0, router_params = 0, shared_bytes = 0, shared_params = 0;
  double expert_bytes = 0, expert_params = 0;  // one routed expert
};

LayerParts parts(const ModelConfig& c, bool fp8) {
  LayerParts p;
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  auto lin = [&](double& bytes, double& params, int64_t out, int64_t in, bool q = true) {
    bytes += linear_bytes(out, in, fp8 && q);
    params += double(out) * double(in);
  };
  if (c.q_lora_rank) {
    lin(p.attn_bytes, p.attn_params, c.q_lora_rank, D);
    lin(p.attn_bytes, p.attn_params, H * c.qk_head_dim(), c.q_lora_rank);
  } else {
    lin(p.attn_bytes, p.attn_params, H * c.qk_head_dim(), D);
  }
  lin(p.attn_bytes, p.attn_params, c.kv_lora_rank + c.qk_rope_head_dim, D);
  lin(p.attn_bytes, p.attn_params, H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  lin(p.attn_bytes, p.attn_params, D, H * c.v_head_dim);
  if (c.has_indexer) {
    lin(p.attn_bytes, p.attn_params, int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank);
    lin(p.attn_bytes, p.attn_params, c.index_head_dim, D);
    lin(p.attn_bytes, p.attn_params, c.index_n_heads, D, /*q=*/false);
  }
  p.attn_bytes += 4.0 * double(2 * D + c.q_lora_rank + c.kv_lora_rank);  // F32 norms
  lin(p.mlp_bytes, p.mlp_params, 3 * int64_t(c.intermediate_size), D);
  p.router_bytes = 4.0 * double(c.n_routed_experts) * double(D);  // F32 router
  p.router_params = double(c.n_routed_experts) * double(D);
  const int64_t I = c.moe_intermediate_size;
  lin(p.shared_bytes, p.shared_params, 3 * I * c.n_shared_experts, D);
  lin(p.expert_bytes, p.expert_params, 3 * I, D);
  return p;
}

double head_bytes(const ModelConfig& c) {
  return 2.0 * double(c.vocab_size) * double(c.hidden_size) + 4.0 * double(c.hidden_size);
}
// Layer l's weight bytes read (MoE: the experts the step touches) and active parameters per token.
void add_layer_weights(const ModelConfig& c, const LayerParts& p, int l, double experts_touched,
                       double* bytes, double* active) {
  *bytes += p.attn_bytes;
  *active += p.attn_params;
  if (c.is_moe_layer(l)) {
    *bytes += p.router_bytes + p.shared_bytes + experts_touched * p.expert_bytes;
    *active += p.router_params + p.shared_params + c.num_experts_per_tok * p.expert_params;
  } else {
    *bytes += p.mlp_bytes;
    *active += p.mlp_params;
  }
}

}  // namespace

double expected_experts(int n_experts, int top_k, int64_t tokens) {
  return double(n_experts) * (1.0 - std::pow(1.0 - double(top_k) / n_experts, double(tokens)));
}

StepCost decode_cost(const ModelConfig& c, bool fp8, int batch, int64_t context,
                     int64_t latent_token_bytes) {
  StepCost s;
  const double row_bytes = latent_token_bytes > 0
                               ? double(latent_token_bytes)
                               : double(c.kv_lora_rank + c.qk_rope_head_dim) * 2.0;
  const LayerParts p = parts(c, fp8);
  s.experts_touched = expected_experts(c.n_routed_experts, c.num_experts_per_tok, batch);
  const int64_t attended = c.has_indexer ? std::min<int64_t>(context, c.index_topk) : context;
  double active = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    add_layer_weights(c, p, l, s.experts_touched, &s.weight_bytes, &active);
    s.cache_bytes += double(batch) * double(attended) * row_bytes;
    if (c.has_indexer) s.cache_bytes += double(batch) * double(context) * c.index_head_dim * 2.0;
    const double H = c.num_attention_heads;
    s.flops += double(batch) * attended * 2.0 * H * (2.0 * c.kv_lora_rank + c.qk_rope_head_dim);
    s.flops +=
        double(batch) * 2.0 * H * c.qk_nope_head_dim * c.kv_lora_rank * 2.0;  // absorb+unabsorb
    if (c.has_indexer)
      s.flops += double(batch) * double(context) * 2.0 * c.index_n_heads * c.index_head_dim;
  }
  s.weight_bytes += head_bytes(c);
  active += double(c.vocab_size) * c.hidden_size;
  s.flops += 2.0 * active * batch;
  return s;
}

StepCost prefill_cost(const ModelConfig& c, bool fp8, int64_t tokens) {
  StepCost s;
  const LayerParts p = parts(c, fp8);
  s.experts_touched = expected_experts(c.n_routed_experts, c.num_experts_per_tok, tokens);
  // Σ over positions of the attended count (causal; capped at index_topk with DSA).
  double pairs = 0, scored = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    pairs += double(c.has_indexer ? std::min<int64_t>(t + 1, c.index_topk) : t + 1);
    scored += double(t + 1);
  }
  double active = 0;
  const double H = c.num_attention_heads;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    add_layer_weights(c, p, l, s.experts_touched, &s.weight_bytes, &active);
    s.flops += pairs * 2.0 * H * (c.qk_head_dim() + c.v_head_dim);
    if (c.has_indexer) s.flops += scored * 2.0 * c.index_n_heads * c.index_head_dim;
  }
  s.weight_bytes += head_bytes(c);
  // lm_head runs on the last row only.
  s.flops += 2.0 * active * double(tokens) + 2.0 * double(c.vocab_size) * c.hidden_size;
  return s;
}

}  // namespace osprey::bench
