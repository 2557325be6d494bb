// The DeepSeek forward pass (V2 / V3 / V3.2 / Kimi-K2), written once against the ops interface:
//   embed → layers × [RMSNorm → MLA (+ V3.2 indexer) → add+RMSNorm → MLP | MoE] → RMSNorm →
//   lm_head on the requested rows only.
// Attention runs on the paged latent cache. Two paths compute the same function:
//   Expanded (prefill): K/V decompressed from the cached latent by kv_b_proj, then MHA.
//   Absorbed (decode):  q_nope folded through W_UK, MQA over the 576-wide latent, W_UV after.
// Auto picks Expanded when some sequence brings more than one token, else Absorbed.
#pragma once

#include <vector>

#include "kv/paged_cache.h"
#include "model/ablation.h"
#include "model/config.h"
#include "model/dump.h"
#include "model/forward_batch.h"
#include "model/weights.h"

namespace osprey {

enum class AttentionPath { Auto, Expanded, Absorbed };

struct ForwardOptions {
  AttentionPath path = AttentionPath::Auto;
  TensorDump* dump = nullptr;  // named intermediates, when set
  // Diffing aid (V3.2): per layer [n_tokens, index_topk] I32 positions that attention uses instead
  // of the indexer's own choice (the indexer still runs and fills its cache). Lets a test hold the
  // selection equal to a reference's when near-ties make either choice valid.
  const std::vector<Tensor>* forced_topk = nullptr;
};

class DeepseekModel {
 public:
  DeepseekModel(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  // Negative controls for `osprey eval` (model/ablation.h); every forward uses them until reset.
  void set_ablation(const ModelAblation& a) { ablation_ = a; }
  const ModelAblation& ablation() const { return ablation_; }
  // logits [n_logits, vocab] F32 for batch.logits_indices; writes this step's cache entries.
  void forward(const ForwardBatch& batch, PagedKVCache& cache, Tensor logits,
               const ForwardOptions& opts = {}) const;

 private:
  // out [n_tokens, D] = attention of layer l over x [n_tokens, D].
  void attention(int l, Tensor x, Tensor out, const ForwardBatch& b, PagedKVCache& cache,
                 const ForwardOptions& o) const;
  // topk_indices [n_tokens, index_topk] of layer l (V3.2).
  void indexer(int l, Tensor x, Tensor q_lat, Tensor topk, const ForwardBatch& b,
               PagedKVCache& cache, const ForwardOptions& o) const;
  void ffn(int l, Tensor x, Tensor out, const ForwardOptions& o) const;
  void mlp(const MlpWeights& w, Tensor x, Tensor out) const;

  ModelConfig config_;
  ModelWeights weights_;
  Buffer inv_freq_;  // [qk_rope_head_dim / 2]
  float rope_attention_factor_;
  float softmax_scale_;
  ModelAblation ablation_;
};

}  // namespace osprey
