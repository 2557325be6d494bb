// The bytes and FLOPs one model step must move and compute, counted from the config
// (BENCHMARKS.md's roofline), for `osprey bench step`.
//   Weights: every tensor at the dtype it is stored in on the GPU (FP8: 1 byte + 4 bytes per
//   128×128 block; BF16: 2; norms and the router F32: 4); per MoE layer the router, the shared
//   expert and the experts the batch touches (uniform expectation 256·(1 − (1 − k/256)^tokens)).
//   Caches (osprey's GPU format, BF16): latent rows attended, (kv_lora + rope)·2 bytes per token
//   per layer (or latent_token_bytes when given: 656 for the FP8 latent cache at 512 + 64),
//   min(context, index_topk) per sequence with DSA; indexer keys scored,
//   index_head_dim·2 bytes per token per layer, the whole context.
//   FLOPs: 2 · active parameters · tokens, plus attention (absorbed decode: 2·H·(2·kv_lora + rope)
//   per attended row; expanded prefill: 2·H·(qk + v) per attended pair, plus kv_b decompression),
//   plus the indexer (2·IH·ID per scored key).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace osprey::bench {

struct StepCost {
  double weight_bytes = 0;  // all weights the step reads
  double cache_bytes = 0;   // latent rows + indexer keys read
  double flops = 0;
  double experts_touched = 0;  // per MoE layer
  double bytes() const { return weight_bytes + cache_bytes; }
};

// Expected distinct experts touched by `tokens` routed tokens (uniform routing).
double expected_experts(int n_experts, int top_k, int64_t tokens);

// `batch` sequences each decoding one token at context `context` (cached + the new token).
// latent_token_bytes: one cached latent row's bytes (0: BF16, 2·(kv_lora + rope)).
StepCost decode_cost(const ModelConfig& c, bool fp8, int batch, int64_t context,
                     int64_t latent_token_bytes = 0);
// One sequence prefilling `tokens` tokens from position 0.
StepCost prefill_cost(const ModelConfig& c, bool fp8, int64_t tokens);

}  // namespace osprey::bench
