// The bytes and FLOPs one model step must move and compute, counted from the config
// (BENCHMARKS.md's roofline), for `osprey bench step`, the serving roofline of `osprey bench serve`
// and the scheduler's step-time model (engine/step_time_model.h).
//   Weights: every tensor at the dtype it is stored in on the GPU (FP8: 1 byte + 4 bytes per
//   128×128 block; BF16, the router too: 2; norms F32: 4); per MoE layer the router, the shared
//   expert and the experts the step's tokens touch (uniform expectation 256·(1 − (1 −
//   k/256)^tokens)). Caches (osprey's GPU format, BF16): latent rows attended, (kv_lora + rope)·2
//   bytes per token per layer (or latent_token_bytes when given: 656 for the FP8 latent cache at
//   512 + 64), min(context, index_topk) per decoding sequence with DSA; indexer keys scored,
//   index_head_dim·2 bytes per token per layer, the whole context; a prompt chunk reads its
//   earlier context once (latent rows and indexer keys).
//   FLOPs: 2 · active parameters · tokens (gemm_flops), plus attention (absorbed: 2·H·(2·kv_lora +
//   rope) per attended row, with the q absorption and output unabsorption; expanded prompt chunks:
//   2·H·(qk + v) per attended pair), plus the indexer (2·IH·ID per scored key) (attn_flops).
#pragma once

#include <cstdint>
#include <vector>

#include "config/model_config.h"

namespace osprey {

struct StepCost {
  double weight_bytes = 0;     // all weights the step reads
  double cache_bytes = 0;      // latent rows + indexer keys read
  double gemm_flops = 0;       // the linears (FP8 rate with FP8 weights)
  double attn_flops = 0;       // attention + indexer scores (BF16 rate)
  double flops = 0;            // gemm_flops + attn_flops
  double experts_touched = 0;  // per MoE layer
  double bytes() const { return weight_bytes + cache_bytes; }
};

// How a step's prompt chunks run attention (V3.2 chunks take the absorbed kernel on the GPU,
// ops::mla_absorbed_prefill_preferred; the CPU and short dense prompts the expanded one).
enum class PrefillAttention { Expanded, Absorbed };

struct PrefillChunk {
  int64_t start = 0;   // first position computed (tokens already in the cache)
  int64_t tokens = 0;  // positions [start, start + tokens)
};

// One engine step: decoding sequences (each one token at `context` = cached + the new one) and
// prompt chunks, run together (weights read once for all of them).
struct StepShape {
  std::vector<int64_t> decode_contexts;  // [num_decodes]
  std::vector<PrefillChunk> chunks;      // [num_chunks]
  int64_t num_tokens() const;
};

struct StepCostOptions {
  bool fp8 = true;                 // FP8 linears (block scales)
  int64_t latent_token_bytes = 0;  // one cached latent row's bytes (0: BF16, 2·(kv_lora + rope))
  PrefillAttention prefill_attention = PrefillAttention::Expanded;
};

// Expected distinct experts touched by `tokens` routed tokens (uniform routing).
double expected_experts(int n_experts, int top_k, int64_t tokens);

StepCost step_cost(const ModelConfig& c, const StepShape& shape, const StepCostOptions& o);

// `batch` sequences each decoding one token at context `context` (cached + the new token).
// latent_token_bytes: one cached latent row's bytes (0: BF16, 2·(kv_lora + rope)).
StepCost decode_cost(const ModelConfig& c, bool fp8, int batch, int64_t context,
                     int64_t latent_token_bytes = 0);
// One sequence prefilling `tokens` tokens from position 0 (expanded attention).
StepCost prefill_cost(const ModelConfig& c, bool fp8, int64_t tokens);

// A card's ceilings, for the time floor of a step.
struct DeviceRates {
  double copy_gbs = 0;     // device copy bandwidth, GB/s
  double fp8_tflops = 0;   // FP8 block-scaled GEMM, TFLOP/s
  double bf16_tflops = 0;  // BF16 GEMM (and attention), TFLOP/s
};
// The H200's, measured on our machine (GPU_WORKFLOW.md: copy 4.30 TB/s, cuBLASLt FP8 block-scaled
// 1299 TFLOP/s at a prefill shape, BF16 8192³ 787–805 TFLOP/s).
inline constexpr DeviceRates kH200Rates{4300, 1299, 790};

// The roofline floor of a step on `r`: max(bytes / copy bandwidth, GEMM FLOPs / the GEMM rate
// (FP8 rate with FP8 weights) + attention FLOPs / the BF16 rate). Seconds.
double roofline_seconds(const StepCost& cost, const DeviceRates& r, bool fp8);

}  // namespace osprey
