#include "model/step_cost.h"

#include <algorithm>
#include <cmath>

namespace osprey {

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
  p.router_bytes = 2.0 * double(c.n_routed_experts) * double(D);  // BF16 router (moe_router.h)
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

// Σ_{u=a}^{b} min(u, cap) for 1 <= a, a - 1 <= b (cap <= 0: no cap).
double sum_min(int64_t a, int64_t b, int64_t cap) {
  if (b < a) return 0;
  auto arith = [](int64_t lo, int64_t hi) { return double(lo + hi) * double(hi - lo + 1) / 2.0; };
  if (cap <= 0 || b <= cap) return arith(a, b);
  if (a > cap) return double(b - a + 1) * double(cap);
  return arith(a, cap) + double(b - cap) * double(cap);
}

}  // namespace

int64_t StepShape::num_tokens() const {
  int64_t n = int64_t(decode_contexts.size());
  for (const PrefillChunk& c : chunks) n += c.tokens;
  return n;
}

double expected_experts(int n_experts, int top_k, int64_t tokens) {
  return double(n_experts) * (1.0 - std::pow(1.0 - double(top_k) / n_experts, double(tokens)));
}

StepCost step_cost(const ModelConfig& c, const StepShape& shape, const StepCostOptions& o) {
  StepCost s;
  const double row_bytes = o.latent_token_bytes > 0
                               ? double(o.latent_token_bytes)
                               : double(c.kv_lora_rank + c.qk_rope_head_dim) * 2.0;
  const double key_bytes = double(c.index_head_dim) * 2.0;
  const LayerParts p = parts(c, o.fp8);
  const int64_t tokens = shape.num_tokens();
  const double n_decodes = double(shape.decode_contexts.size());
  s.experts_touched = expected_experts(c.n_routed_experts, c.num_experts_per_tok, tokens);
  const int64_t cap = c.has_indexer ? c.index_topk : 0;  // DSA: rows attended per query
  const double H = c.num_attention_heads;
  const double absorbed_row = 2.0 * H * (2.0 * c.kv_lora_rank + c.qk_rope_head_dim);
  const double absorb_per_token = 2.0 * H * c.qk_nope_head_dim * c.kv_lora_rank * 2.0;
  const double indexer_key = 2.0 * c.index_n_heads * c.index_head_dim;
  // Per layer, the same for every layer: cache bytes and attention FLOPs.
  double cache = 0, attn = 0;
  for (int64_t ctx : shape.decode_contexts) {
    const double attended = double(cap > 0 ? std::min<int64_t>(ctx, cap) : ctx);
    cache += attended * row_bytes;
    attn += attended * absorbed_row + absorb_per_token;
    if (c.has_indexer) {
      cache += double(ctx) * key_bytes;
      attn += double(ctx) * indexer_key;
    }
  }
  for (const PrefillChunk& ch : shape.chunks) {
    if (ch.tokens <= 0) continue;
    const double pairs = sum_min(ch.start + 1, ch.start + ch.tokens, cap);
    const double scored = sum_min(ch.start + 1, ch.start + ch.tokens, 0);
    cache += double(ch.start) * row_bytes;  // the earlier context, read once
    if (o.prefill_attention == PrefillAttention::Absorbed)
      attn += pairs * absorbed_row + double(ch.tokens) * absorb_per_token;
    else
      attn += pairs * 2.0 * H * (c.qk_head_dim() + c.v_head_dim);
    if (c.has_indexer) {
      cache += double(ch.start) * key_bytes;
      attn += scored * indexer_key;
    }
  }
  double active = 0;  // per token, the layers'
  for (int l = 0; l < c.num_hidden_layers; ++l)
    add_layer_weights(c, p, l, s.experts_touched, &s.weight_bytes, &active);
  s.cache_bytes = cache * c.num_hidden_layers;
  s.attn_flops = attn * c.num_hidden_layers;
  s.weight_bytes += head_bytes(c);
  // lm_head runs on the sampled rows: every decode and (at most) one row per chunk.
  const double sampled = n_decodes + double(shape.chunks.size());
  s.gemm_flops =
      2.0 * active * double(tokens) + 2.0 * double(c.vocab_size) * c.hidden_size * sampled;
  s.flops = s.gemm_flops + s.attn_flops;
  return s;
}

StepCost decode_cost(const ModelConfig& c, bool fp8, int batch, int64_t context,
                     int64_t latent_token_bytes) {
  StepShape shape;
  shape.decode_contexts.assign(size_t(batch), context);
  return step_cost(c, shape, {fp8, latent_token_bytes, PrefillAttention::Absorbed});
}

StepCost prefill_cost(const ModelConfig& c, bool fp8, int64_t tokens) {
  StepShape shape;
  shape.chunks.push_back({0, tokens});
  return step_cost(c, shape, {fp8, 0, PrefillAttention::Expanded});
}

double roofline_seconds(const StepCost& cost, const DeviceRates& r, bool fp8) {
  const double mem = cost.bytes() / (r.copy_gbs * 1e9);
  const double gemm_rate = (fp8 ? r.fp8_tflops : r.bf16_tflops) * 1e12;
  const double compute = cost.gemm_flops / gemm_rate + cost.attn_flops / (r.bf16_tflops * 1e12);
  return std::max(mem, compute);
}

}  // namespace osprey
