#include "model/deepseek.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "model/dp_batch.h"
#include "model/lockstep.h"
#include "model/moe_dispatch.h"
#include "model/moe_router.h"
#include "ops/activation.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/indexer.h"
#include "ops/mla.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/stream_fork.h"
#include "ops/tensor_ops.h"

namespace osprey {

namespace {
std::string stage(int layer, const char* name) {
  return "layers." + std::to_string(layer) + "." + name;
}
// The indexer_recent control on either device (a host round trip: a diagnostic, not a hot path).
void recent_positions(Tensor topk, Tensor positions) {
  if (topk.device == Device::CPU && positions.device == Device::CPU)
    return select_recent_positions(topk, positions);
  Buffer t(DType::I32, topk.shape), p(DType::I32, positions.shape);
  ops::copy(p, positions);
  select_recent_positions(t, p);
  ops::copy(topk, t);
}
// Whether the decode path's small byte-moving kernels are fused (q's rope into the absorption,
// the indexer's key and query chains: issue 13). On unless OSPREY_ROPE_FUSION=0 (read once), which
// runs the unfused composition, the same arithmetic in more kernels: the A/B of `bench step`.
bool rope_fusion_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("OSPREY_ROPE_FUSION");
    if (e == nullptr || std::string(e) == "1") return true;
    OSPREY_CHECK(std::string(e) == "0", "OSPREY_ROPE_FUSION must be 0 or 1, got '", e, "'");
    return false;
  }();
  return on;
}
}  // namespace

float mla_latent_bound_of(int64_t kv_lora, const std::vector<Tensor>& norm_weights) {
  float w_max = 0.0f;
  for (Tensor w : norm_weights) {
    if (w.dtype != DType::BF16 && w.dtype != DType::F32) return INFINITY;
    Buffer host;
    if (w.device != Device::CPU) {
      host = Buffer(w.dtype, w.shape);
      ops::copy(host, w);
      w = host.view();
    }
    for (int64_t i = 0; i < w.numel(); ++i) {
      const float v =
          w.dtype == DType::F32 ? w.f32()[i] : bf16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
      w_max = std::max(w_max, std::fabs(v));
    }
  }
  return float(std::sqrt(double(kv_lora)) * double(w_max));
}

DeepseekModel::DeepseekModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      device_(weights_.embed.device),
      ws_(device_) {
  const std::vector<float> f = rope_inv_freq(config_);
  Buffer inv(DType::F32, {int64_t(f.size())});
  std::copy(f.begin(), f.end(), inv.f32());
  inv_freq_ = to_device_storage(inv, device_);
  for (const LayerWeights& lw : weights_.layers) {
    const LinearWeight& kvb = lw.attn.kv_b_proj;
    if (kvb.weight.dtype != DType::F8_E4M3) {
      kv_b_absorb_.push_back(kvb.weight);
      continue;
    }
    kv_b_owned_.emplace_back(device_, device_ == Device::CPU ? DType::F32 : DType::BF16,
                             kvb.weight.shape);
    ops::dequantize(kv_b_owned_.back(), kvb);
    kv_b_absorb_.push_back(kv_b_owned_.back());
  }
  // The latent cache's bound, for the FP8 decode's f16 variant (ops/mla.h).
  std::vector<Tensor> kv_norms;
  for (const LayerWeights& lw : weights_.layers) kv_norms.push_back(lw.attn.kv_a_norm);
  ops::set_mla_latent_bound(mla_latent_bound_of(config_.kv_lora_rank, kv_norms));
  rope_attention_factor_ = float(config_.rope.attention_factor());
  softmax_scale_ = float(config_.softmax_scale());
  shard_.head_end = config_.num_attention_heads;
  shard_.vocab_end = shard_.vocab_stride = config_.vocab_size;
  shard_.expert_end = config_.n_routed_experts;
}

void DeepseekModel::set_parallel(const RankShard& shard, dist::Communicator* comm,
                                 StepPublisher* publisher) {
  OSPREY_CHECK(comm && comm->size() == shard.world && comm->rank() == shard.rank,
               "communicator of rank ", shard.rank, " of ", shard.world);
  OSPREY_CHECK(comm->device() == device_, "the communicator is not on the model's device");
  OSPREY_CHECK(shard.expert_begin == weights_.first_expert, "weights of another shard");
  shard_ = shard;
  timed_comm_ = std::make_unique<dist::TimedCommunicator>(*comm);
  comm_ = timed_comm_.get();
  publisher_ = publisher;
}

ForwardBatch DeepseekModel::stage_batch(const ForwardBatch& b) const {
  // CUDA graphs: this copy is synchronous on the legacy stream and may grow stage_dev_, so it
  // cannot be captured; a graph's batch is already on the device (the runner's persistent
  // region, one copy per step before the replay) and passes through here untouched.
  // req_id_per_token is staged with the rest when the batch has it (the engine's): the sm90
  // indexer logits kernel reads it on the device (the graph runner's batches carry it there).
  if (device_ == Device::CPU || b.token_ids.device == device_) return b;
  // Every metadata tensor packed into one host buffer (forward_batch.h), copied once.
  const size_t total = packed_metadata_bytes(b);
  if (stage_host_.empty() || size_t(stage_host_.view().numel()) < total) {
    stage_host_ = Storage(Device::CPU, DType::U8, {int64_t(total)});
    stage_dev_ = Storage(device_, DType::U8, {int64_t(total)});
  }
  const ForwardBatch d = pack_metadata(b, stage_host_.view().data, stage_dev_.view().data, device_);
  if (total > 0)
    ops::copy(stage_dev_.view().rows(0, int64_t(total)),
              stage_host_.view().rows(0, int64_t(total)));
  return d;
}

void DeepseekModel::check_mtp(bool needed) const {
  if (!needed) return;
  if (!weights_.has_mtp)
    fail("this model has no MTP layer (config.json num_nextn_predict_layers ",
         config_.num_nextn_predict_layers, ", and the checkpoint must hold model.layers.",
         config_.num_hidden_layers,
         ".eh_proj.weight and the rest of the layer): MTP speculative decoding needs one");
  if (comm_) fail("MTP speculative decoding is not supported with a parallel model yet");
}

ForwardBatch DeepseekModel::prepare_batch(const ForwardBatch& hb) const {
  // The attention's split-KV plan is keyed by this (built once per step, reused across layers
  // and across steps whose clamped lengths repeat). CUDA graphs: a device batch keeps the
  // fingerprint its builder gave it (the graph runner: one of its capture; layer 0's plan kernel
  // is captured and rebuilds the plan from the device positions in every replay).
  ForwardBatch hf = hb;
  if (hf.attn.positions.device == Device::CPU && hf.attn.query_start_loc.device == Device::CPU) {
    const bool sparse = config_.has_indexer && !ablation_.dense_attention;
    hf.attn.fingerprint =
        attention_fingerprint(hf.attn, sparse ? int64_t(config_.index_topk) : int64_t(INT32_MAX));
  }
  return stage_batch(hf);
}

void DeepseekModel::forward_mtp(const ForwardBatch& hb, Tensor hidden, PagedKVCache& cache,
                                Tensor logits, Tensor mtp_hidden) const {
  check_mtp(true);
  const ModelConfig& c = config_;
  const int l = c.num_hidden_layers;  // the MTP decoder layer's weights and cache layer
  const int64_t T = hb.attn.n_tokens, D = c.hidden_size;
  const int64_t n_logits = hb.logits_indices.numel();
  OSPREY_CHECK(cache.n_layers() > l, "the KV cache has no MTP layer (make_cache(n, true))");
  OSPREY_CHECK(cache.device() == device_, "the KV cache is not on the model's device");
  OSPREY_CHECK(hidden.device == device_ && hidden.size(0) == T && hidden.size(1) == D,
               "mtp hidden ", shape_str(hidden.shape));
  OSPREY_CHECK(logits.size(0) == n_logits && logits.size(1) == c.vocab_size, "logits shape ",
               shape_str(logits.shape));
  OSPREY_CHECK(mtp_hidden.data == nullptr ||
                   (mtp_hidden.device == device_ && mtp_hidden.shape == Shape({n_logits, D})),
               "mtp_hidden ", shape_str(mtp_hidden.shape));
  OSPREY_CHECK(hb.attn.positions.device == Device::CPU, "forward_mtp takes a host batch");
  int64_t kv_rows = 0;  // Σ seq_lens
  for (int s = 0; s < hb.attn.n_seqs; ++s) kv_rows += hb.attn.seq_lens.ptr<int32_t>()[s];
  ws_.reset();
  const ForwardBatch b = prepare_batch(hb);
  const MtpWeights& m = weights_.mtp;
  const LayerWeights& lw = weights_.layers[size_t(l)];
  const float eps = float(c.rms_norm_eps);
  Tensor emb = alloc(DType::F32, {T, D});  // [n_tokens, D] embedding of the next tokens
  ops::embedding(emb, b.token_ids, weights_.embed);
  // Position 0 has no previous token for the MTP to pair with: its embedding is zeroed (vLLM).
  // (Host branching on host positions, one launch per such token: the MTP step is not graphed.)
  const int32_t* pos = hb.attn.positions.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t)
    if (pos[t] == 0) ops::scale(emb.rows(t, t + 1), 0.0f);
  Tensor cat = alloc(DType::F32, {T, 2 * D});  // [n_tokens, 2·D]: enorm(emb) | hnorm(hidden)
  Tensor half = alloc(DType::F32, {T, D});
  ops::rms_norm(half, emb, m.enorm, eps);
  ops::copy_columns(cat, 0, half, 0, D);
  ops::rms_norm(half, hidden, m.hnorm, eps);
  ops::copy_columns(cat, D, half, 0, D);
  Tensor residual = alloc(DType::F32, {T, D});  // [n_tokens, D] the MTP layer's residual stream
  Tensor x = alloc(DType::F32, {T, D});
  Tensor y = alloc(DType::F32, {T, D});
  ops::linear(residual, cat, m.eh_proj);
  ops::rms_norm(x, residual, lw.input_norm, eps);
  ForwardOptions o;
  attention(l, {x, {}, {}}, y, b, kv_rows, cache, o);
  ops::add_rms_norm(x, residual, y, lw.post_attn_norm, eps);
  ffn(l, {x, {}, {}}, y, o);
  ops::add(residual, residual, y);
  Tensor rows = mtp_hidden.data ? mtp_hidden : alloc(DType::F32, {n_logits, D});  // [n_logits, D]
  ops::gather_rows(rows, residual, b.logits_indices);
  Tensor normed = alloc(DType::F32, {n_logits, D});
  ops::rms_norm(normed, rows, m.head_norm, eps);
  Tensor out = logits.device == device_ ? logits : alloc(DType::F32, {n_logits, c.vocab_size});
  ops::linear(out, normed, m.head);
  if (out.data != logits.data) ops::copy(logits, out);
}

void DeepseekModel::forward(const ForwardBatch& hb, PagedKVCache& cache, Tensor logits,
                            const ForwardOptions& o) const {
  if (o.hidden_out.data && comm_) fail("hidden states out are not supported with a parallel model");
  if (publisher_) {
    if (o.forced_topk) fail("forced top-k positions are not supported with a parallel model");
    publisher_->publish(*this, hb, cache, o);
  }
  forward_rank(hb, cache, logits, o);
}

void DeepseekModel::forward_rank(const ForwardBatch& hb, PagedKVCache& cache, Tensor logits,
                                 const ForwardOptions& o) const {
  if (!shard_.data_parallel()) return forward_local(hb, cache, logits, o);
  // DP attention: this rank's sequences only; the logits of every rank gathered in batch order.
  const DpBatch mine(hb, shard_.rank, shard_.world);
  ws_.reset();
  Workspace::Scope scope(ws_);
  Tensor local = alloc(DType::F32, {mine.n_logits(), config_.vocab_size});
  if (mine.batch().attn.n_tokens > 0)
    forward_local(mine.batch(), cache, local, o);
  else
    idle_step();
  mine.gather_logits(*comm_, local, logits, ws_);
}

void DeepseekModel::forward_local(const ForwardBatch& hb, PagedKVCache& cache, Tensor logits,
                                  const ForwardOptions& o) const {
  const ModelConfig& c = config_;
  const int64_t T = hb.attn.n_tokens, D = c.hidden_size;
  const int64_t n_logits = hb.logits_indices.numel();
  OSPREY_CHECK(logits.size(0) == n_logits && logits.size(1) == c.vocab_size, "logits shape ",
               shape_str(logits.shape));
  OSPREY_CHECK(cache.device() == device_, "the KV cache is not on the model's device");
  // Σ seq_lens, read on the host before staging. CUDA graphs: a device batch leaves it 0; it only
  // sizes the expanded (prefill) path, and graphs run decode steps (absorbed).
  int64_t kv_rows = 0;
  if (hb.attn.seq_lens.device == Device::CPU)
    for (int s = 0; s < hb.attn.n_seqs; ++s) kv_rows += hb.attn.seq_lens.ptr<int32_t>()[s];
  // CUDA graphs: a reset that replaces the arena frees memory (synchronising): never inside a
  // capture (the runner settles the workspace after its eager warm-up); the arena's generation
  // tells the runner its graphs are stale. Every alloc below is a host-side bump of a pointer.
  if (!shard_.data_parallel()) ws_.reset();  // (DP: forward_rank holds the local logits)
  const ForwardBatch b = prepare_batch(hb);
  Tensor residual = alloc(DType::F32, {T, D});  // [n_tokens, D] the residual stream
  Tensor x = alloc(DType::F32, {T, D});         // [n_tokens, D] normalised input of the next block
  Tensor y = alloc(DType::F32, {T, D});         // [n_tokens, D] output of the current block
  // CUDA: x's extra forms, written by the norm that writes x, one set reused by every block's
  // input (block_input: each block is given the ones it reads; none on the CPU).
  Tensor xb;  // [n_tokens, D] BF16: x for the BF16 GEMMs (weights_proj, the router)
  if (device_ == Device::CUDA) xb = alloc(DType::BF16, {T, D});
  const ops::Fp8Act x8 = alloc_fp8_act(T, D);  // x quantised for the FP8 linears
  ops::embedding(residual, b.token_ids, weights_.embed);
  if (o.dump) o.dump->put("embed", residual);
  ops::rms_norm_multi(block_input(0, false, x, xb, x8), residual, weights_.layers[0].input_norm,
                      float(c.rms_norm_eps));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = weights_.layers[size_t(l)];
    if (o.dump) o.dump->put(stage(l, "attn_in"), x);
    attention(l, block_input(l, false, x, xb, x8), y, b, kv_rows, cache, o);
    if (o.dump) o.dump->put(stage(l, "attn_out"), y);
    const ops::NormOutputs ffn_in = block_input(l, true, x, xb, x8);
    ops::add_rms_norm_multi(ffn_in, residual, y, lw.post_attn_norm, float(c.rms_norm_eps));
    if (o.dump) o.dump->put(stage(l, "ffn_in"), x);
    ffn(l, ffn_in, y, o);
    if (o.dump) o.dump->put(stage(l, "ffn_out"), y);
    if (l + 1 < c.num_hidden_layers) {
      ops::add_rms_norm_multi(block_input(l + 1, false, x, xb, x8), residual, y,
                              weights_.layers[size_t(l) + 1].input_norm, float(c.rms_norm_eps));
    } else {
      ops::add(residual, residual, y);
    }
    if (o.dump) o.dump->put(stage(l, "hidden"), residual);
  }
  if (o.hidden_out.data) {
    OSPREY_CHECK(o.hidden_out.device == device_ && o.hidden_out.shape == Shape({T, D}),
                 "hidden_out ", shape_str(o.hidden_out.shape), " for ", T, " tokens");
    ops::rms_norm(o.hidden_out, residual, weights_.final_norm, float(c.rms_norm_eps));
  }
  // Only the rows that are sampled go through the final norm and lm_head.
  Tensor rows = alloc(DType::F32, {n_logits, D});  // [n_logits, D]
  ops::gather_rows(rows, residual, b.logits_indices);
  Tensor normed = alloc(DType::F32, {n_logits, D});
  // CUDA with a BF16 lm_head: normed in BF16 too, from the norm (the GEMM's input conversion).
  Tensor normed_b;  // [n_logits, D] BF16
  if (device_ == Device::CUDA && weights_.lm_head.weight.dtype == DType::BF16)
    normed_b = alloc(DType::BF16, {n_logits, D});
  ops::rms_norm_multi({normed, normed_b, {}}, rows, weights_.final_norm, float(c.rms_norm_eps));
  if (o.dump) o.dump->put("final_norm", normed);
  // [n_logits, vocab]: straight into `logits` when it is on the model's device, else copied once
  // (a device→host read: CUDA graphs take device logits only). Dumps (o.dump) read every stage
  // back to the host: never with a graph.
  Tensor out = logits.device == device_ ? logits : alloc(DType::F32, {n_logits, c.vocab_size});
  lm_head(out, normed_b.data ? normed_b : normed);
  if (out.data != logits.data) ops::copy(logits, out);
  if (o.dump) o.dump->put("logits", logits);
}

void DeepseekModel::idle_step() const {
  // A DP rank without sequences this step still serves its experts to the others' tokens.
  if (!shard_.expert_parallel()) return;
  Workspace::Scope scope(ws_);
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, K = c.num_experts_per_tok;
  Tensor x = alloc(DType::F32, {0, D}), out = alloc(DType::F32, {0, D});  // [0, D]
  Buffer ids(DType::I32, {0, K}), wts(DType::F32, {0, K});
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (weights_.layers[size_t(l)].moe)
      moe_expert_parallel(out, x, ids, wts, weights_.layers[size_t(l)].experts, shard_, *comm_, 0,
                          0, 0, ws_);
}

ops::Fp8Act DeepseekModel::alloc_fp8_act(int64_t n, int64_t in) const {
  const ops::Fp8ActShape sh = ops::fp8_act_shape(device_, n, in);
  if (sh.layout == ops::Fp8Layout::None) return {};
  return {alloc(DType::U8, sh.q), alloc(DType::F32, sh.s), sh.layout};
}

ops::NormOutputs DeepseekModel::block_input(int l, bool ffn, Tensor x, Tensor xb,
                                            const ops::Fp8Act& x8) const {
  // Only what a consumer reads: a BF16 copy for a BF16 GEMM of x (its own conversion moved), an
  // FP8 quantisation for FP8 linears of x (each linear's own, or ops::linears' shared one, moved).
  const LayerWeights& lw = weights_.layers[size_t(l)];
  const auto fp8 = [](const LinearWeight& w) { return w.weight.dtype == DType::F8_E4M3; };
  bool bf16 = false, q8 = false;
  if (!ffn) {
    const AttentionWeights& w = lw.attn;
    bf16 = config_.has_indexer && w.indexer.weights_proj.weight.dtype == DType::BF16;
    q8 = config_.q_lora_rank ? fp8(w.q_a_proj) || fp8(w.kv_a_proj) : fp8(w.q_proj);
  } else if (!lw.moe) {
    q8 = fp8(lw.mlp.gate) || fp8(lw.mlp.up);
  } else {
    bf16 = lw.router.dtype == DType::BF16;
    q8 = lw.has_shared && (fp8(lw.shared.gate) || fp8(lw.shared.up));
  }
  return {x, bf16 ? xb : Tensor{}, q8 ? x8 : ops::Fp8Act{}};
}

void DeepseekModel::lm_head(Tensor out, Tensor normed) const {
  if (!shard_.split_tp()) return ops::linear(out, normed, weights_.lm_head);
  // Vocab parallel: this rank's rows [vocab_begin, vocab_end), padded to vocab_stride columns,
  // gathered rank-major, then each rank's part placed at its columns.
  Workspace::Scope scope(ws_);
  const int64_t n = normed.size(0), stride = shard_.vocab_stride, tp = shard_.tp;
  const int64_t mine = shard_.vocab_end - shard_.vocab_begin;
  Tensor part = alloc(DType::F32, {n, mine});       // [n_logits, V / tp]
  Tensor padded = alloc(DType::F32, {n, stride});   // [n_logits, ceil(V / tp)]
  Tensor all = alloc(DType::F32, {tp, n, stride});  // [tp, n_logits, ceil(V / tp)]
  if (mine > 0) {
    ops::linear(part, normed, weights_.lm_head);
    ops::copy_columns(padded, 0, part, 0, mine);
  }
  comm_->all_gather(all, padded);
  for (int64_t q = 0; q < tp; ++q) {
    const int64_t begin = std::min<int64_t>(config_.vocab_size, q * stride);
    const int64_t width = std::min<int64_t>(config_.vocab_size, begin + stride) - begin;
    if (width > 0) ops::copy_columns(out, begin, all.rows(q, q + 1).reshape({n, stride}), 0, width);
  }
}

void DeepseekModel::attention(int l, const ops::NormOutputs& in, Tensor out, const ForwardBatch& b,
                              int64_t kv_rows, PagedKVCache& cache, const ForwardOptions& o) const {
  Workspace::Scope scope(ws_);
  const Tensor x = in.out;
  const ModelConfig& c = config_;
  const AttentionWeights& w = weights_.layers[size_t(l)].attn;
  const int64_t T = b.attn.n_tokens, H = shard_.heads();  // this rank's heads (all unless TP)
  const int nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, qk = c.qk_head_dim();
  const int kv_lora = c.kv_lora_rank, vd = c.v_head_dim;
  const DType f32 = DType::F32;

  Tensor q = alloc(f32, {T, H, qk});            // [n_tokens, H, nope + rope]
  Tensor kv = alloc(f32, {T, kv_lora + rope});  // [n_tokens, kv_lora + rope] before norm and rope
  // The indexer's projections (V3.2) of x and of q_lat run beside attention's own, so that each
  // input is quantised once for all the FP8 linears that read it (ops::linears, at decode).
  const bool has_indexer = c.has_indexer;
  const IndexerWeights& iw = w.indexer;
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
  // Fused unless a dump wants the stages apart or OSPREY_ROPE_FUSION=0 (issue 13): the indexer
  // key's norm, rope and cache write in one op; with the FP8 key cache, q's rope, the weights'
  // scale and q's quantisation in one.
  const bool index_fused = !o.dump && rope_fusion_enabled();
  Tensor iq;        // [n_tokens, IH, ID] the indexer's queries (before rope)
  Tensor ik_raw;    // [n_tokens, ID] the indexer's keys (before norm and rope)
  Tensor iweights;  // [n_tokens, IH] F32 the indexer's per-head weights
  Tensor ik;        // [n_tokens, 1, ID] the roped key (the unfused path's; a dump's stage)
  Tensor topk;      // [n_tokens, index_topk] I32 (V3.2)
  if (has_indexer) {
    OSPREY_CHECK(c.q_lora_rank > 0, "the indexer reads the q latent: q_lora_rank must be > 0");
    iq = alloc(f32, {T, IH, ID});
    ik_raw = alloc(f32, {T, ID});
    iweights = alloc(f32, {T, IH});
    if (!index_fused) ik = alloc(f32, {T, 1, ID});
    topk = alloc(DType::I32, {T, c.index_topk});
  }
  // Two branches where they do not read each other's outputs (ops/stream_fork.h; CUDA): the
  // latent's cache write and the indexer's keys and weights beside q's chain (q_a_norm, q_b), then
  // q's absorption beside the indexer's scoring. Not with a dump or the eval controls, which read
  // tensors back to the host between ops.
  const bool fork_ok = !o.dump && !o.forced_topk && !ablation_.indexer_recent;
  const Tensor x_for_indexer = in.bf16.data ? in.bf16 : x;
  Tensor q_lat;  // [n_tokens, q_lora] normalised q latent (q LoRA models)
  if (c.q_lora_rank) {
    Tensor qa = alloc(f32, {T, c.q_lora_rank});
    q_lat = alloc(f32, {T, c.q_lora_rank});
    // q_lat quantised by its norm for q_b_proj (and wq_b) when FP8 (CUDA; the CPU: none).
    const ops::Fp8Act q8 =
        w.q_b_proj.weight.dtype == DType::F8_E4M3 ? alloc_fp8_act(T, c.q_lora_rank) : ops::Fp8Act{};
    if (has_indexer)
      ops::linears(x, in.fp8, {{qa, &w.q_a_proj}, {kv, &w.kv_a_proj}, {ik_raw, &iw.wk}},
                   in.bf16);  // (wk past 32 tokens: the dequantize fallback, on x's BF16 copy)
    else
      ops::linears(x, in.fp8, {{qa, &w.q_a_proj}, {kv, &w.kv_a_proj}});
    ops::Fork keys(device_, fork_ok);
    {
      const auto on = keys.side();
      // kv_a's split, kv_a_norm, k_pe's rope and the cache write in one op (one kernel on CUDA);
      // a dump writes the stages apart below.
      if (!o.dump)
        ops::mla_kv_write(cache.latent(l), kv, w.kv_a_norm, float(c.rms_norm_eps), inv_freq_,
                          rope_attention_factor_, c.rope_interleave, b.attn);
      if (has_indexer) indexer_keys(l, x_for_indexer, ik_raw, iweights, ik, index_fused, b, cache);
    }
    ops::rms_norm_multi({q_lat, {}, q8}, qa, w.q_a_norm, float(c.rms_norm_eps));
    if (has_indexer)
      ops::linears(q_lat, q8,
                   {{q.reshape({T, H * qk}), &w.q_b_proj}, {iq.reshape({T, IH * ID}), &iw.wq_b}});
    else
      ops::linears(q_lat, q8, {{q.reshape({T, H * qk}), &w.q_b_proj}});
    keys.join();  // the indexer's keys and weights and the latent cache, read below
    if (o.dump) o.dump->put(stage(l, "q_lat"), q_lat);
  } else {
    ops::linears(x, in.fp8, {{q.reshape({T, H * qk}), &w.q_proj}, {kv, &w.kv_a_proj}});
    if (!o.dump)
      ops::mla_kv_write(cache.latent(l), kv, w.kv_a_norm, float(c.rms_norm_eps), inv_freq_,
                        rope_attention_factor_, c.rope_interleave, b.attn);
  }
  const bool interleaved = c.rope_interleave;
  // q's rope goes into the absorption's kernel (ops::mla_absorb_q_rope) unless a dump wants the
  // roped q apart; the expanded path ropes it alone below.
  const bool rope_in_absorb = !o.dump && rope_fusion_enabled();
  if (!rope_in_absorb)
    ops::rope(q, nope, rope, b.attn.positions, inv_freq_, rope_attention_factor_, interleaved);
  if (o.dump) {  // the stages apart, to be dumped: the composition mla_kv_write fuses
    Tensor latent = alloc(f32, {T, kv_lora});  // [n_tokens, kv_lora]
    Tensor k_pe = alloc(f32, {T, 1, rope});    // [n_tokens, 1, rope]
    ops::copy_columns(latent, 0, kv, 0, kv_lora);
    ops::copy_columns(k_pe, 0, kv, kv_lora, rope);
    Tensor latent_n = alloc(f32, {T, kv_lora});
    ops::rms_norm(latent_n, latent, w.kv_a_norm, float(c.rms_norm_eps));
    ops::rope(k_pe, 0, rope, b.attn.positions, inv_freq_, rope_attention_factor_, interleaved);
    o.dump->put(stage(l, "q"), q);
    o.dump->put(stage(l, "latent"), latent_n);
    o.dump->put(stage(l, "k_pe"), k_pe);
    ops::mla_cache_write(cache.latent(l), latent_n, k_pe.reshape({T, rope}), b.attn);
  }

  // Sparse attention over the indexer's choice unless the dense control is on (topk empty then:
  // every causal position).
  const bool sparse = has_indexer && !ablation_.dense_attention;
  Tensor attn = alloc(f32, {T, H, vd});  // [n_tokens, H, v]
  // Sparse prompt chunks go absorbed where the device's absorbed kernel is the fast one (sm90):
  // the chosen top-k rows in latent space, no decompression of the context through kv_b.
  const bool absorbed_prefill =
      sparse && ops::mla_absorbed_prefill_preferred(device_, H, kv_lora, rope, true);
  // Host branching on host values only (the path, max_query_len, kv_rows): fixed for a graph's
  // bucket (a decode: absorbed).
  const bool expanded =
      o.path == AttentionPath::Expanded ||
      (o.path == AttentionPath::Auto && !absorbed_prefill && b.max_query_len > 1 &&
       !b.spec_decode && (max_expanded_kv_rows_ <= 0 || kv_rows <= max_expanded_kv_rows_));
  // The absorbed path's q: [n_tokens, H, kv_lora + rope], made beside the indexer's scoring.
  Tensor q_abs;
  ops::Fork absorb(device_, fork_ok && !expanded);
  if (!expanded) {
    q_abs = alloc(f32, {T, H, kv_lora + rope});
    const auto on = absorb.side();
    if (rope_in_absorb)
      ops::mla_absorb_q_rope(q_abs, q, kv_b_absorb_[size_t(l)], nope, vd, b.attn.positions,
                             inv_freq_, rope_attention_factor_, interleaved);
    else
      ops::mla_absorb_q(q_abs, q, kv_b_absorb_[size_t(l)], nope, vd);
  }
  if (has_indexer) {
    indexer_select(l, iq, iweights, ik, topk, index_fused, b, cache, o);
    if (o.forced_topk) {
      const Tensor& f = (*o.forced_topk)[size_t(l)];
      OSPREY_CHECK(f.shape == topk.shape, "forced topk of layer ", l, " has shape ",
                   shape_str(f.shape));
      ops::copy(topk, f);
    }
    // Both controls copy through the host (synchronous): eval diagnostics, never under a graph.
    if (ablation_.indexer_recent) recent_positions(topk, b.attn.positions);
    if (!sparse) topk = Tensor{};  // the dense control: every causal position
  }
  absorb.join();

  if (expanded) {
    if (rope_in_absorb)
      ops::rope(q, nope, rope, b.attn.positions, inv_freq_, rope_attention_factor_, interleaved);
    // Decompress K/V for every cached position of every sequence in the batch.
    const int64_t L = kv_rows;
    Tensor ctx = alloc(f32, {L, kv_lora + rope});  // [Σ seq_lens, kv_lora + rope]
    ops::mla_cache_gather(ctx, cache.latent(l), b.attn);
    Tensor ctx_lat = alloc(f32, {L, kv_lora});
    ops::copy_columns(ctx_lat, 0, ctx, 0, kv_lora);
    Tensor kvb = alloc(f32, {L, H, nope + vd});  // [Σ seq_lens, H, nope + v]
    ops::linear(kvb.reshape({L, H * (nope + vd)}), ctx_lat, w.kv_b_proj);
    Tensor k = alloc(f32, {L, H, qk});               // [Σ seq_lens, H, nope + rope]
    Tensor v = alloc(f32, {L, H, vd});               // [Σ seq_lens, H, v]
    ops::copy_columns(k, 0, kvb, 0, nope);           // per head: k_nope
    ops::copy_columns(k, nope, ctx, kv_lora, rope);  // the shared k_pe, broadcast over heads
    ops::copy_columns(v, 0, kvb, nope, vd);
    ops::mla_attention_expanded(attn, q, k, v, b.attn, topk, softmax_scale_);
  } else {
    // [n_tokens, H, kv_lora]; CUDA: in the unabsorb GEMM's dtype (BF16 for a BF16 kv_b), written
    // so by the attention kernel (the rounding the GEMM's input conversion made, moved there).
    const DType o_lat_type =
        device_ == Device::CUDA && kv_b_absorb_[size_t(l)].dtype == DType::BF16 ? DType::BF16 : f32;
    Tensor o_lat = alloc(o_lat_type, {T, H, kv_lora});
    ops::mla_attention_absorbed(o_lat, q_abs, cache.latent(l), b.attn, topk, softmax_scale_);
    ops::mla_unabsorb_out(attn, o_lat, kv_b_absorb_[size_t(l)], nope);
  }
  if (o.dump) o.dump->put(stage(l, "attn_heads"), attn);
  ops::linear(out, attn.reshape({T, H * vd}), w.o_proj);
  if (shard_.split_tp()) comm_->all_reduce_sum(out);               // Σ over the ranks' heads
  if (l == ablation_.zero_attention_layer) ops::scale(out, 0.0f);  // negative control (eval)
}

void DeepseekModel::indexer_keys(int l, Tensor x, Tensor k_raw, Tensor weights, Tensor ik,
                                 bool fused, const ForwardBatch& b, PagedKVCache& cache) const {
  const IndexerWeights& w = weights_.layers[size_t(l)].attn.indexer;
  const int rope = config_.qk_rope_head_dim;
  const int64_t T = b.attn.n_tokens, ID = config_.index_head_dim;
  Tensor index_keys = cache.index_keys(l);
  ops::linear(weights, x, w.weights_proj);  // [n_tokens, IH]
  if (fused) {
    ops::indexer_k_write(index_keys, k_raw, w.k_norm_weight, w.k_norm_bias, 1e-6f, rope, inv_freq_,
                         rope_attention_factor_, b.attn);
  } else {
    ops::layer_norm(ik, k_raw, w.k_norm_weight, w.k_norm_bias, 1e-6f);
    ops::rope(ik, 0, rope, b.attn.positions, inv_freq_, rope_attention_factor_,
              /*interleaved=*/false);
    ops::indexer_cache_write(index_keys, ik.reshape({T, ID}), b.attn);
  }
}

void DeepseekModel::indexer_select(int l, Tensor iq, Tensor weights, Tensor ik, Tensor topk,
                                   bool fused, const ForwardBatch& b, PagedKVCache& cache,
                                   const ForwardOptions& o) const {
  Workspace::Scope scope(ws_);
  const ModelConfig& c = config_;
  const int64_t T = b.attn.n_tokens, IH = c.index_n_heads, ID = c.index_head_dim;
  const int rope = c.qk_rope_head_dim;
  Tensor index_keys = cache.index_keys(l);
  const float w_scale = 1.0f / std::sqrt(float(IH));
  const bool fp8_keys = index_keys.dtype == DType::U8;
  const bool q_fused = fused && fp8_keys;
  if (!q_fused) {
    // iq [n_tokens, IH, ID]: rope dims first, then the rest
    ops::rope(iq, 0, rope, b.attn.positions, inv_freq_, rope_attention_factor_,
              /*interleaved=*/false);
    ops::scale(weights, w_scale);
  }
  if (fp8_keys) {
    // The FP8 key cache (CUDA): q in e4m3 too, its per-head scales folded into the weights, as
    // DeepSeek's reference indexer (q8 · k8 on FP8 tensor cores).
    Tensor iq8 = alloc(DType::U8, {T, IH, ID});  // [n_tokens, IH, ID] e4m3
    Tensor w8 = alloc(DType::F32, {T, IH});      // [n_tokens, IH] weights × IH^-0.5 × q scales
    if (q_fused)
      ops::indexer_q_prep(iq8, w8, iq, weights, w_scale, rope, b.attn.positions, inv_freq_,
                          rope_attention_factor_);
    else
      ops::indexer_quantize_q(iq8, w8, iq, weights);
    ops::indexer_topk(topk, iq8, w8, index_keys, b.attn, 1.0f / std::sqrt(float(ID)));
  } else {
    ops::indexer_topk(topk, iq, weights, index_keys, b.attn, 1.0f / std::sqrt(float(ID)));
  }
  if (o.dump) {
    o.dump->put(stage(l, "index_q"), iq);
    o.dump->put(stage(l, "index_k"), ik);
    o.dump->put(stage(l, "index_weights"), weights);
    o.dump->put(stage(l, "topk_indices"), topk);
  }
}

void DeepseekModel::mlp(const MlpWeights& w, const ops::NormOutputs& in, Tensor out) const {
  Workspace::Scope scope(ws_);
  const Tensor x = in.out;
  const int64_t T = x.size(0), I = w.gate.out();
  Tensor g = alloc(DType::F32, {T, I}), u = alloc(DType::F32, {T, I});  // [n_tokens, I]
  ops::linears(x, in.fp8, {{g, &w.gate}, {u, &w.up}});
  // h = silu(g)·u quantised by the activation for an FP8 down (CUDA; the CPU: none).
  const ops::Fp8Act h8 =
      w.down.weight.dtype == DType::F8_E4M3 ? alloc_fp8_act(T, I) : ops::Fp8Act{};
  ops::silu_mul_multi(g, h8, g, u);
  ops::linears(g, h8, {{out, &w.down}});
}

void DeepseekModel::ffn(int l, const ops::NormOutputs& in, Tensor out,
                        const ForwardOptions& o) const {
  Workspace::Scope scope(ws_);
  const Tensor x = in.out;
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_.layers[size_t(l)];
  if (!lw.moe) {
    mlp(lw.mlp, in, out);
    if (shard_.split_tp()) comm_->all_reduce_sum(out);  // Σ over the intermediate's parts
    return;
  }
  const int64_t T = x.size(0), D = c.hidden_size, E = c.n_routed_experts, K = c.num_experts_per_tok;
  // [n_tokens, E] in the gate weight's dtype: BF16 on CUDA, F32 on the CPU (model/moe_router.h)
  Tensor router_logits = alloc(router_logits_dtype(lw.router), {T, E});
  Tensor ids = alloc(DType::I32, {T, K});  // [n_tokens, K]
  Tensor wts = alloc(DType::F32, {T, K});  // [n_tokens, K]
  moe_router(ids, wts, router_logits, in.bf16.data ? in.bf16 : x, lw.router, lw.correction_bias,
             RouterParams::from_config(c));
  if (o.dump) {
    o.dump->put(stage(l, "router_logits"), router_logits);
    o.dump->put(stage(l, "topk_ids"), ids);
    o.dump->put(stage(l, "topk_weights"), wts);
  }
  // The shared expert first: without EP the routed combine adds its output (routed + shared, one
  // F32 addition, as ops::add after it; issue 13: the add kernel gone).
  Tensor shared;  // [n_tokens, D]
  if (lw.has_shared) {
    shared = alloc(DType::F32, {T, D});
    mlp(lw.shared, in, shared);
    if (shard_.expert_parallel() && shard_.split_tp()) comm_->all_reduce_sum(shared);
  }
  const bool combine_adds = shared.data && !shard_.expert_parallel() && out.dtype == DType::F32;
  if (shard_.expert_parallel()) {
    // Experts partitioned: tokens dispatched to their experts' ranks and combined back (TP:
    // each rank dispatches its share of the tokens; the shares are gathered after).
    const int64_t chunk = shard_.split_tp() ? (T + shard_.world - 1) / shard_.world : T;
    const int64_t begin = shard_.split_tp() ? std::min<int64_t>(T, shard_.rank * chunk) : 0;
    const int64_t end = shard_.split_tp() ? std::min<int64_t>(T, begin + chunk) : T;
    moe_expert_parallel(out, x, ids, wts, lw.experts, shard_, *comm_, begin, end, chunk, ws_);
  } else {
    // TP: a partial sum over I / tp (the shared one too)
    ops::moe_experts(out, x, ids, wts, lw.experts, combine_adds ? shared : Tensor{});
  }
  if (shared.data && !combine_adds) ops::add(out, out, shared);
  // TP without EP: routed and shared partial sums reduced together, one all-reduce.
  if (shard_.split_experts_tp()) comm_->all_reduce_sum(out);
}

}  // namespace osprey
