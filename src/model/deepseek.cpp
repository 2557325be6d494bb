#include "model/deepseek.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ops/activation.h"
#include "ops/embedding.h"
#include "ops/indexer.h"
#include "ops/mla.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace osprey {

namespace {
std::string stage(int layer, const char* name) {
  return "layers." + std::to_string(layer) + "." + name;
}
Buffer f32(Shape s) { return Buffer(DType::F32, std::move(s)); }
}  // namespace

DeepseekModel::DeepseekModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  const std::vector<float> f = rope_inv_freq(config_);
  inv_freq_ = Buffer(DType::F32, {int64_t(f.size())});
  std::copy(f.begin(), f.end(), inv_freq_.f32());
  rope_attention_factor_ = float(config_.rope.attention_factor());
  softmax_scale_ = float(config_.softmax_scale());
}

void DeepseekModel::forward(const ForwardBatch& b, PagedKVCache& cache, Tensor logits,
                            const ForwardOptions& o) const {
  const ModelConfig& c = config_;
  const int64_t T = b.attn.n_tokens, D = c.hidden_size;
  const int64_t n_logits = b.logits_indices.numel();
  OSPREY_CHECK(logits.size(0) == n_logits && logits.size(1) == c.vocab_size, "logits shape ",
               shape_str(logits.shape));
  Buffer residual = f32({T, D});  // [n_tokens, D] the residual stream
  Buffer x = f32({T, D});         // [n_tokens, D] normalised input of the next block
  Buffer y = f32({T, D});         // [n_tokens, D] output of the current block
  ops::embedding(residual, b.token_ids, weights_.embed);
  if (o.dump) o.dump->put("embed", residual);
  ops::rms_norm(x, residual, weights_.layers[0].input_norm, float(c.rms_norm_eps));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = weights_.layers[size_t(l)];
    if (o.dump) o.dump->put(stage(l, "attn_in"), x);
    attention(l, x, y, b, cache, o);
    if (o.dump) o.dump->put(stage(l, "attn_out"), y);
    ops::add_rms_norm(x, residual, y, lw.post_attn_norm, float(c.rms_norm_eps));
    if (o.dump) o.dump->put(stage(l, "ffn_in"), x);
    ffn(l, x, y, o);
    if (o.dump) o.dump->put(stage(l, "ffn_out"), y);
    if (l + 1 < c.num_hidden_layers) {
      ops::add_rms_norm(x, residual, y, weights_.layers[size_t(l) + 1].input_norm,
                        float(c.rms_norm_eps));
    } else {
      const float* yp = y.f32();
      float* r = residual.f32();
      for (int64_t i = 0; i < T * D; ++i) r[i] += yp[i];
    }
    if (o.dump) o.dump->put(stage(l, "hidden"), residual);
  }
  // Only the rows that are sampled go through the final norm and lm_head.
  Buffer rows = f32({n_logits, D});  // [n_logits, D]
  for (int64_t i = 0; i < n_logits; ++i) {
    const int32_t t = b.logits_indices.ptr<int32_t>()[i];
    std::copy_n(residual.f32() + t * D, D, rows.f32() + i * D);
  }
  Buffer normed = f32({n_logits, D});
  ops::rms_norm(normed, rows, weights_.final_norm, float(c.rms_norm_eps));
  if (o.dump) o.dump->put("final_norm", normed);
  ops::linear(logits, normed, weights_.lm_head);
  if (o.dump) o.dump->put("logits", logits);
}

void DeepseekModel::attention(int l, Tensor x, Tensor out, const ForwardBatch& b,
                              PagedKVCache& cache, const ForwardOptions& o) const {
  const ModelConfig& c = config_;
  const AttentionWeights& w = weights_.layers[size_t(l)].attn;
  const int64_t T = b.attn.n_tokens, H = c.num_attention_heads;
  const int nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
  const int kv_lora = c.kv_lora_rank, vd = c.v_head_dim;

  Buffer q = f32({T, H, qk});  // [n_tokens, H, nope + rope]
  Buffer q_lat;                // [n_tokens, q_lora] normalised q latent (q LoRA models)
  if (c.q_lora_rank) {
    Buffer qa = f32({T, c.q_lora_rank});
    q_lat = f32({T, c.q_lora_rank});
    ops::linear(qa, x, w.q_a_proj);
    ops::rms_norm(q_lat, qa, w.q_a_norm, float(c.rms_norm_eps));
    ops::linear(q.view().reshape({T, H * qk}), q_lat, w.q_b_proj);
    if (o.dump) o.dump->put(stage(l, "q_lat"), q_lat);
  } else {
    ops::linear(q.view().reshape({T, H * qk}), x, w.q_proj);
  }
  Buffer kv = f32({T, kv_lora + rope});  // [n_tokens, kv_lora + rope] before norm and rope
  ops::linear(kv, x, w.kv_a_proj);
  Buffer latent = f32({T, kv_lora});  // [n_tokens, kv_lora]
  Buffer k_pe = f32({T, 1, rope});    // [n_tokens, 1, rope]
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(kv.f32() + t * (kv_lora + rope), kv_lora, latent.f32() + t * kv_lora);
    std::copy_n(kv.f32() + t * (kv_lora + rope) + kv_lora, rope, k_pe.f32() + t * rope);
  }
  Buffer latent_n = f32({T, kv_lora});
  ops::rms_norm(latent_n, latent, w.kv_a_norm, float(c.rms_norm_eps));
  const bool interleaved = c.rope_interleave;
  ops::rope(q, nope, rope, b.attn.positions, inv_freq_, rope_attention_factor_, interleaved);
  ops::rope(k_pe, 0, rope, b.attn.positions, inv_freq_, rope_attention_factor_, interleaved);
  if (o.dump) {
    o.dump->put(stage(l, "q"), q);
    o.dump->put(stage(l, "latent"), latent_n);
    o.dump->put(stage(l, "k_pe"), k_pe);
  }
  ops::mla_cache_write(cache.latent(l), latent_n, k_pe.view().reshape({T, rope}), b.attn);

  Buffer topk;  // [n_tokens, index_topk] I32 (V3.2)
  if (c.has_indexer) {
    topk = Buffer(DType::I32, {T, c.index_topk});
    indexer(l, x, q_lat, topk, b, cache, o);
    if (o.forced_topk) {
      const Tensor& f = (*o.forced_topk)[size_t(l)];
      OSPREY_CHECK(f.shape == topk.shape(), "forced topk of layer ", l, " has shape ",
                   shape_str(f.shape));
      std::copy_n(f.ptr<int32_t>(), f.numel(), topk.ptr<int32_t>());
    }
    if (ablation_.indexer_recent) select_recent_positions(topk, b.attn.positions);
    if (ablation_.dense_attention) topk = Buffer();  // empty: every causal position
  }

  Buffer attn = f32({T, H, vd});  // [n_tokens, H, v]
  const bool expanded = o.path == AttentionPath::Expanded ||
                        (o.path == AttentionPath::Auto && b.max_query_len > 1);
  if (expanded) {
    // Decompress K/V for every cached position of every sequence in the batch.
    int64_t L = 0;
    for (int s = 0; s < b.attn.n_seqs; ++s) L += b.attn.seq_lens.ptr<int32_t>()[s];
    Buffer ctx = f32({L, kv_lora + rope});  // [Σ seq_lens, kv_lora + rope]
    ops::mla_cache_gather(ctx, cache.latent(l), b.attn);
    Buffer ctx_lat = f32({L, kv_lora});
    for (int64_t j = 0; j < L; ++j)
      std::copy_n(ctx.f32() + j * (kv_lora + rope), kv_lora, ctx_lat.f32() + j * kv_lora);
    Buffer kvb = f32({L, H, nope + vd});  // [Σ seq_lens, H, nope + v]
    ops::linear(kvb.view().reshape({L, H * (nope + vd)}), ctx_lat, w.kv_b_proj);
    Buffer k = f32({L, H, qk});  // [Σ seq_lens, H, nope + rope]
    Buffer v = f32({L, H, vd});  // [Σ seq_lens, H, v]
    for (int64_t j = 0; j < L; ++j)
      for (int64_t h = 0; h < H; ++h) {
        const float* src = kvb.f32() + (j * H + h) * (nope + vd);
        std::copy_n(src, nope, k.f32() + (j * H + h) * qk);
        std::copy_n(ctx.f32() + j * (kv_lora + rope) + kv_lora, rope, k.f32() + (j * H + h) * qk + nope);
        std::copy_n(src + nope, vd, v.f32() + (j * H + h) * vd);
      }
    ops::mla_attention_expanded(attn, q, k, v, b.attn, topk, softmax_scale_);
  } else {
    Buffer q_abs = f32({T, H, kv_lora + rope});  // [n_tokens, H, kv_lora + rope]
    ops::mla_absorb_q(q_abs, q, w.kv_b_proj.weight, nope, vd);
    Buffer o_lat = f32({T, H, kv_lora});  // [n_tokens, H, kv_lora]
    ops::mla_attention_absorbed(o_lat, q_abs, cache.latent(l), b.attn, topk, softmax_scale_);
    ops::mla_unabsorb_out(attn, o_lat, w.kv_b_proj.weight, nope);
  }
  if (o.dump) o.dump->put(stage(l, "attn_heads"), attn);
  ops::linear(out, attn.view().reshape({T, H * vd}), w.o_proj);
  if (l == ablation_.zero_attention_layer) std::fill_n(out.f32(), out.numel(), 0.0f);
}

void DeepseekModel::indexer(int l, Tensor x, Tensor q_lat, Tensor topk, const ForwardBatch& b,
                            PagedKVCache& cache, const ForwardOptions& o) const {
  const ModelConfig& c = config_;
  const IndexerWeights& w = weights_.layers[size_t(l)].attn.indexer;
  const int64_t T = b.attn.n_tokens, IH = c.index_n_heads, ID = c.index_head_dim;
  const int rope = c.qk_rope_head_dim;
  Buffer iq = f32({T, IH, ID});  // [n_tokens, IH, ID]: rope dims first, then the rest
  ops::linear(iq.view().reshape({T, IH * ID}), q_lat, w.wq_b);
  ops::rope(iq, 0, rope, b.attn.positions, inv_freq_, rope_attention_factor_, /*interleaved=*/false);
  Buffer k_raw = f32({T, ID});
  Buffer ik = f32({T, 1, ID});  // [n_tokens, 1, ID]
  ops::linear(k_raw, x, w.wk);
  ops::layer_norm(ik, k_raw, w.k_norm_weight, w.k_norm_bias, 1e-6f);
  ops::rope(ik, 0, rope, b.attn.positions, inv_freq_, rope_attention_factor_, /*interleaved=*/false);
  ops::indexer_cache_write(cache.index_keys(l), ik.view().reshape({T, ID}), b.attn);
  Buffer weights = f32({T, IH});  // [n_tokens, IH] per-head weights × IH^-0.5
  ops::linear(weights, x, w.weights_proj);
  const float head_scale = 1.0f / std::sqrt(float(IH));
  for (int64_t i = 0; i < T * IH; ++i) weights.f32()[i] *= head_scale;
  ops::indexer_topk(topk, iq, weights, cache.index_keys(l), b.attn, 1.0f / std::sqrt(float(ID)));
  if (o.dump) {
    o.dump->put(stage(l, "index_q"), iq);
    o.dump->put(stage(l, "index_k"), ik);
    o.dump->put(stage(l, "index_weights"), weights);
    o.dump->put(stage(l, "topk_indices"), topk);
  }
}

void DeepseekModel::mlp(const MlpWeights& w, Tensor x, Tensor out) const {
  const int64_t T = x.size(0), I = w.gate.out();
  Buffer g = f32({T, I}), u = f32({T, I});  // [n_tokens, I]
  ops::linear(g, x, w.gate);
  ops::linear(u, x, w.up);
  ops::silu_mul(g, g, u);
  ops::linear(out, g, w.down);
}

void DeepseekModel::ffn(int l, Tensor x, Tensor out, const ForwardOptions& o) const {
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[size_t(l)];
  if (!lw.moe) {
    mlp(lw.mlp, x, out);
    return;
  }
  const int64_t T = x.size(0), D = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  Buffer router_logits = f32({T, E});  // [n_tokens, E]
  ops::linear(router_logits, x, LinearWeight{lw.router, {}});
  Buffer ids(DType::I32, {T, K});  // [n_tokens, K]
  Buffer wts = f32({T, K});        // [n_tokens, K]
  ops::moe_route(ids, wts, router_logits, lw.correction_bias, RouterParams::from_config(c));
  if (o.dump) {
    o.dump->put(stage(l, "router_logits"), router_logits);
    o.dump->put(stage(l, "topk_ids"), ids);
    o.dump->put(stage(l, "topk_weights"), wts);
  }
  ops::moe_experts(out, x, ids, wts, lw.experts);
  if (lw.has_shared) {
    Buffer shared = f32({T, D});
    mlp(lw.shared, x, shared);
    for (int64_t i = 0; i < T * D; ++i) out.f32()[i] += shared.f32()[i];
  }
}

}  // namespace osprey
