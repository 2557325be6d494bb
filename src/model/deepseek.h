// The DeepSeek forward pass (V2 / V3 / V3.2 / Kimi-K2), written once against the ops interface:
//   embed → layers × [RMSNorm → MLA (+ V3.2 indexer) → add+RMSNorm → MLP | MoE] → RMSNorm →
//   lm_head on the requested rows only.
// Attention runs on the paged latent cache. Two paths compute the same function:
//   Expanded (prefill): K/V decompressed from the cached latent by kv_b_proj, then MHA.
//   Absorbed (decode):  q_nope folded through W_UK, MQA over the 576-wide latent, W_UV after.
// Auto picks Expanded when some sequence brings more than one token, else Absorbed.
//
// The model runs where its weights are (Device::CPU or Device::CUDA); every op dispatches on its
// output's device, so this one code path serves both. On the GPU:
//   - the step's metadata (a host ForwardBatch) is packed into one staging buffer and copied to the
//     device once per step; the cache must be on the device (PagedKVCache(..., Device::CUDA));
//   - activations live in a per-model Workspace (one arena sized by the first steps, then reused):
//     all F32, like the CPU's. The residual stream must be F32 (it accumulates 2 adds per layer);
//     the others are small next to the weights a decode step reads, and each GEMM converts its
//     input to its weight's dtype (BF16, or FP8 with 1×128 scales) itself — except where the op
//     producing the input writes that dtype too: the RMSNorms write each block's input also in
//     BF16 (the indexer's weights_proj, the MoE router, lm_head) and FP8 (the FP8 linears), as
//     their consumers read them (ops::rms_norm_multi; block_input below), and attention's o_lat is
//     written in BF16 for the BF16 unabsorb GEMM. The same roundings, no kernel of their own.
//     BF16 activations are the next step for prefill bandwidth.
//   - logits may be a host tensor: they are computed on the device and copied back once.
#pragma once

#include <vector>

#include "config/model_config.h"
#include "core/storage.h"
#include "dist/communicator.h"
#include "dist/timed_comm.h"
#include "kv/kv_cache_dtype.h"
#include "kv/paged_cache.h"
#include "model/ablation.h"
#include "model/dump.h"
#include "model/forward_batch.h"
#include "model/shard.h"
#include "model/weights.h"
#include "ops/norm.h"

namespace osprey {

enum class AttentionPath { Auto, Expanded, Absorbed };

class StepPublisher;  // model/lockstep.h

struct ForwardOptions {
  AttentionPath path = AttentionPath::Auto;
  TensorDump* dump = nullptr;  // named intermediates, when set
  // Diffing aid (V3.2): per layer [n_tokens, index_topk] I32 positions that attention uses instead
  // of the indexer's own choice (the indexer still runs and fills its cache). Lets a test hold the
  // selection equal to a reference's when near-ties make either choice valid.
  const std::vector<Tensor>* forced_topk = nullptr;
  // When set: [n_tokens, D] F32 on the model's device gets the final-normed hidden state of every
  // token of the batch (model.norm applied; what the MTP layer reads as h). Not with a parallel
  // model.
  Tensor hidden_out = {};
};

// The largest |value| RMSNorm with weight w writes into a latent of kv_lora values, over the
// norm weights given (kv_a_layernorm of every layer): sqrt(kv_lora) · max |w| (a normalised value
// x_i / sqrt(mean(x²) + eps) is at most sqrt(kv_lora) in magnitude). BF16 or F32 weights, on
// either device; +inf for another dtype (no bound known). The bound ops/mla.h's
// set_mla_latent_bound takes; DeepseekModel registers it at load.
float mla_latent_bound_of(int64_t kv_lora, const std::vector<Tensor>& norm_weights);

class DeepseekModel {
 public:
  DeepseekModel(ModelConfig config, ModelWeights weights);

  const ModelConfig& config() const { return config_; }
  Device device() const { return device_; }
  // A paged cache of n_blocks on the model's device; with_mtp adds the MTP layer's cache (layer
  // num_hidden_layers; the model must have the layer).
  PagedKVCache make_cache(int64_t n_blocks, bool with_mtp = false) const {
    check_mtp(with_mtp);
    return PagedKVCache(config_, n_blocks, kBlockSize, device_, fp8_index_keys_, fp8_latent_,
                        with_mtp ? 1 : 0);
  }
  // Bytes one cache block takes across all layers in the formats make_cache uses.
  int64_t kv_bytes_per_block(bool with_mtp = false) const {
    return PagedKVCache::bytes_per_block(config_, kBlockSize, device_, fp8_index_keys_, fp8_latent_,
                                         with_mtp ? 1 : 0);
  }
  // Whether the weights hold the MTP layer (model_math.md §2.8).
  bool has_mtp() const { return weights_.has_mtp; }
  // CUDA: the indexer key cache in the FP8 format (default, as DeepSeek deploys it) or in BF16
  // (as transformers computes the indexer, for comparisons with it). Caches made afterwards use it.
  void set_fp8_index_keys(bool on) { fp8_index_keys_ = on; }
  bool fp8_index_keys() const { return fp8_index_keys_; }
  // AttentionPath::Auto takes the expanded (prefill) path only while the step's Σ seq_lens is at
  // most this many rows (0: no bound): it decompresses K/V for every cached position of every
  // sequence in the step, so a mixed step of many long sequences would need memory without bound.
  // Above it the absorbed path runs (the same math, tested equal; memory by new tokens only).
  // The server sets it to max_model_len, the widest single sequence its profile step measures.
  void set_max_expanded_kv_rows(int64_t rows) { max_expanded_kv_rows_ = rows; }
  int64_t max_expanded_kv_rows() const { return max_expanded_kv_rows_; }
  // The latent cache's format (kv/kv_cache_dtype.h, `--kv-cache-dtype`): Fp8 is DeepSeek's FP8
  // format on either device; Auto and Bf16 the default (Bf16 is refused on the CPU). Fails
  // (osprey::Error) where the model cannot use it. Caches made afterwards use it.
  void set_kv_cache_dtype(KvCacheDtype d) {
    check_kv_cache_dtype(d, config_, device_);
    fp8_latent_ = d == KvCacheDtype::Fp8;
  }
  bool fp8_latent_cache() const { return fp8_latent_; }
  // Negative controls for `osprey eval` (model/ablation.h); every forward uses them until reset.
  void set_ablation(const ModelAblation& a) { ablation_ = a; }
  const ModelAblation& ablation() const { return ablation_; }
  // logits [n_logits, vocab] F32 for batch.logits_indices; writes this step's cache entries.
  // On rank 0 of a parallel model this first publishes the step to the other ranks (lockstep).
  void forward(const ForwardBatch& batch, PagedKVCache& cache, Tensor logits,
               const ForwardOptions& opts = {}) const;

  // The MTP layer over `batch` (model_math.md §2.8, DeepSeek-V3's multi-token prediction):
  //   x = eh_proj(cat[enorm(embed(token_ids)), hnorm(hidden)]) (the embedding zeroed at position
  //   0, as vLLM does), then the MTP decoder layer on its own cache layer (num_hidden_layers;
  //   same slots as the main layers), then shared_head.norm and shared_head.head.
  // A token at position p brings the token of position p + 1 and the main model's hidden state
  // at p (ForwardOptions::hidden_out), or the MTP's own output hidden state for later draft
  // steps; its logits predict the token at p + 2.
  //   hidden     [n_tokens, D] F32 on the model's device
  //   logits     [n_logits, V] F32 for batch.logits_indices (on either device)
  //   mtp_hidden [n_logits, D] F32 on the model's device, or empty: the decoder layer's output
  //              (before shared_head.norm) at the logits rows, the next draft step's `hidden`.
  // Fails (osprey::Error) without the MTP layer, with a parallel model or a cache without the
  // MTP layer.
  void forward_mtp(const ForwardBatch& batch, Tensor hidden, PagedKVCache& cache, Tensor logits,
                   Tensor mtp_hidden) const;

  // Parallel models (model/shard.h): this model holds `shard`'s weights and talks to the other
  // ranks through `comm` (on the model's device); `publisher` (rank 0 only) sends each step to
  // the other ranks before rank 0 runs it. The model does not own them.
  void set_parallel(const RankShard& shard, dist::Communicator* comm, StepPublisher* publisher);
  const RankShard& shard() const { return shard_; }
  bool parallel() const { return comm_ != nullptr; }
  // Seconds this rank has spent inside its collectives since set_parallel (dist/timed_comm.h:
  // host wall time around each call, the peers' skew included); 0 for a model that is not
  // parallel. The engine's StepRecord::comm_seconds is its difference over a step.
  double comm_seconds() const { return timed_comm_ ? timed_comm_->seconds() : 0.0; }
  // The step as every rank runs it (no publishing): what forward() calls, and what the other
  // ranks' lockstep loop calls with the published step.
  void forward_rank(const ForwardBatch& batch, PagedKVCache& cache, Tensor logits,
                    const ForwardOptions& opts) const;

  // CUDA graphs (engine/cuda_graph_runner.h) capture forward() over a device batch, so every
  // address the step touches must stay put between capture and replay. The activation arena's
  // generation (bumped when a reset replaces it: graphs captured before read freed memory), and a
  // reset outside any step, so that the reset at the start of a captured forward allocates nothing.
  uint64_t workspace_generation() const { return ws_.generation(); }
  void settle_workspace() const { ws_.reset(); }

 private:
  // x [n_tokens, D] (a block's normalised input) with the extras of it that block `ffn` (false:
  // attention) of layer l reads on this device (NormOutputs: xb [n_tokens, D] BF16 where a BF16
  // GEMM reads x, x8 where FP8 linears do; the CPU: none). xb, x8 empty: none.
  ops::NormOutputs block_input(int l, bool ffn, Tensor x, Tensor xb, const ops::Fp8Act& x8) const;
  // An FP8 activation of n rows of width `in` in the layout this device's FP8 linears read, in
  // the workspace (empty on the CPU or where none reads one).
  ops::Fp8Act alloc_fp8_act(int64_t n, int64_t in) const;
  // out [n_tokens, D] = attention of layer l over x = in.out [n_tokens, D] (in's extras: its BF16
  // and FP8 copies, where given).
  // kv_rows = Σ seq_lens (host value: sizes the expanded path's K/V).
  void attention(int l, const ops::NormOutputs& in, Tensor out, const ForwardBatch& b,
                 int64_t kv_rows, PagedKVCache& cache, const ForwardOptions& o) const;
  // The indexer of layer l (V3.2) in two halves, from x [n_tokens, D] and the indexer's
  // projections attention() computed beside its own: iq = q_lat · wq_bᵀ [n_tokens, IH, ID] and
  // k_raw = x · wkᵀ [n_tokens, ID] (both before norm and rope). indexer_keys: the per-head weights
  // [n_tokens, IH] F32 = x · weights_projᵀ and the keys' norm, rope and cache write (`fused`: one
  // op; else the stages apart, the roped key left in ik [n_tokens, 1, ID]); it allocates nothing
  // (attention() runs it on a fork's side). indexer_select: q's rope and scaling, the scores and
  // topk_indices [n_tokens, index_topk].
  void indexer_keys(int l, Tensor x, Tensor k_raw, Tensor weights, Tensor ik, bool fused,
                    const ForwardBatch& b, PagedKVCache& cache) const;
  void indexer_select(int l, Tensor iq, Tensor weights, Tensor ik, Tensor topk, bool fused,
                      const ForwardBatch& b, PagedKVCache& cache, const ForwardOptions& o) const;
  void ffn(int l, const ops::NormOutputs& in, Tensor out, const ForwardOptions& o) const;
  void mlp(const MlpWeights& w, const ops::NormOutputs& in, Tensor out) const;
  // The forward over a batch that is all this rank's: logits [n_logits, V] (TP: gathered from
  // the vocab parts).
  void forward_local(const ForwardBatch& b, PagedKVCache& cache, Tensor logits,
                     const ForwardOptions& o) const;
  // A DP rank's step without tokens: only its part in the experts' all-to-alls.
  void idle_step() const;
  // out [n, V] = normed · lm_headᵀ, the vocab parts of the TP ranks gathered.
  void lm_head(Tensor out, Tensor normed) const;
  void check_mtp(bool needed) const;
  // The fingerprinted batch, staged (forward_local / forward_mtp).
  ForwardBatch prepare_batch(const ForwardBatch& hb) const;
  // The batch with its metadata on the model's device (one host→device copy), or b itself.
  ForwardBatch stage_batch(const ForwardBatch& b) const;
  Tensor alloc(DType t, Shape s) const { return ws_.alloc(t, std::move(s)); }

  ModelConfig config_;
  ModelWeights weights_;
  Device device_;
  Storage inv_freq_;  // [qk_rope_head_dim / 2] F32
  // Per layer kv_b_proj [H·(nope+v), kv_lora] as the absorption GEMMs read it (F32 / BF16): the
  // checkpoint's tensor, or a BF16 dequantized copy when it is FP8 (made once at load).
  std::vector<Tensor> kv_b_absorb_;
  std::vector<Storage> kv_b_owned_;
  mutable Workspace ws_;  // activations of one step
  int64_t max_expanded_kv_rows_ = 0;
  mutable Storage stage_host_, stage_dev_;  // U8: the packed step metadata, host and device
  float rope_attention_factor_;
  float softmax_scale_;
  ModelAblation ablation_;
  bool fp8_index_keys_ = true;
  bool fp8_latent_ = false;
  RankShard shard_;  // one rank holding everything unless set_parallel
  std::unique_ptr<dist::TimedCommunicator> timed_comm_;  // wraps set_parallel's comm
  dist::Communicator* comm_ = nullptr;  // the ranks' data plane (null: not parallel)
  StepPublisher* publisher_ = nullptr;  // rank 0 of a parallel model
};

}  // namespace osprey
