// The server's engine steps during a benchmark run, as vLLM #42982 reports them: mean, median and
// P99 of decode-only steps and of mixed steps (decodes + prompt chunks; prompt-only steps apart),
// from two snapshots of osprey's /metrics (server/metrics.h), beside the roofline of the run's
// mean step of each kind computed from the model's config (model/step_cost.h: bytes / copy
// bandwidth for decode, FLOPs / the matrix rates for prompt chunks), and the estimate of a full
// 61-layer DeepSeek-V3.2 decode step on 4 GPUs set against vLLM #42982's 40.2 ms.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_config.h"
#include "model/step_cost.h"

namespace osprey::bench {

struct StepKindStats {
  std::string kind;  // decode | mixed | prefill
  double steps = 0;
  double mean_ms = 0, median_ms = 0, p99_ms = 0;  // median and P99 from the histogram's buckets
  std::optional<double> predicted_mean_ms;        // the server's step-time model
  // The mean step's shape.
  double decodes = 0, decode_context = 0;                // sequences; their mean context
  double chunks = 0, chunk_tokens = 0, chunk_start = 0;  // per step; per chunk; per chunk
  std::optional<double> roofline_ms;                     // of the mean step (add_roofline)
};

// The step kinds with at least one step between `before` and `after` (/metrics texts), in the
// order decode, mixed, prefill; empty when the server exports no per-kind step histogram.
std::vector<StepKindStats> server_step_stats(std::string_view before, std::string_view after);

// The mean step of a kind as a shape: round(decodes) sequences at the mean context, round(chunks)
// chunks (at least one when the kind has prompt tokens) of the mean length at the mean start.
StepShape mean_step_shape(const StepKindStats& s);

struct RooflineOptions {
  DeviceRates rates = kH200Rates;
  bool fp8_latent_cache = false;  // the server's --kv-cache-dtype fp8 (else BF16 rows on the GPU)
};
// The cost options the roofline counts with: FP8 linears when the config says so, the GPU's latent
// rows (kv/paged_cache.h), V3.2 prompt chunks through absorbed attention (as osprey runs them on
// the GPU).
StepCostOptions roofline_cost_options(const ModelConfig& c, const RooflineOptions& o);
// The cost of the mean step of a kind with its fractional counts kept: step_cost is linear in the
// decodes and in the chunks (but for the experts touched), so the mean of steps holding d decodes
// and n chunks is interpolated between the shapes of ⌊d⌋, ⌊d⌋ + 1 decodes and ⌊n⌋, ⌊n⌋ + 1 chunks
// (bilinearly; an integral count takes its shape as it is). Rounding the counts instead
// (mean_step_shape) counted the 5000/500/64 wave's mixed steps, 1.40 chunks of 1440, as one chunk:
// 29% of their prompt tokens left out of the roofline.
StepCost mean_step_cost(const ModelConfig& c, const StepKindStats& s, const StepCostOptions& co);
// The run's floor: Σ over the kinds of steps × the roofline of the kind's mean step, in seconds
// (issue 14 judges a run's duration against it); empty when a kind has no roofline.
std::optional<double> steps_roofline_sum_s(const std::vector<StepKindStats>& kinds);
// Fills roofline_ms of every kind: the roofline of mean_step_cost.
void add_roofline(std::vector<StepKindStats>& kinds, const ModelConfig& c,
                  const RooflineOptions& o);

// vLLM #42982: DeepSeek-V3.2, 61 layers, MI355X TP4, 5000 in / 500 out / 64 concurrent, 956
// profiled decode steps: 40.234 ms per decode step after the PR (41.522 before).
inline constexpr double kVllm42982DecodeStepMs = 40.234;
// An all-reduce of a decode step's activations between 4 GPUs of one host: an assumption (not
// measured here), the order of NCCL's small-message latency over NVLink.
inline constexpr double kAssumedAllReduceUs = 15;

struct FullModelEstimate {
  int layers = 0, gpus = 0;
  double proxy_ms = 0;                             // measured: the proxy's mean decode-only step
  double proxy_weight_gb = 0, proxy_cache_gb = 0;  // its roofline bytes
  double full_weight_gb = 0, full_cache_gb = 0;    // the full model's at the same shape
  double ms_per_gb = 0;                            // the proxy's measured time per roofline byte
  double dense_layer_ms = 0, moe_layer_ms = 0, head_ms = 0;  // the proxy step split by bytes
  double one_gpu_ms = 0;                                     // the full model on one GPU
  double per_gpu_bytes_ms = 0;  // on `gpus`: weights split, latent/indexer caches replicated
  double all_reduce_ms = 0;     // 2 per layer at kAssumedAllReduceUs
  double estimate_ms = 0;       // per_gpu_bytes_ms + all_reduce_ms
  std::string text;             // the printout, the scaling written out
};
// Scales the proxy's measured mean decode-only step (`decode`, with its mean shape) to `layers`
// layers (the proxy's first_k_dense_replace dense, the rest MoE) on `gpus` GPUs. An estimate.
FullModelEstimate estimate_full_model_decode(const ModelConfig& proxy, const StepKindStats& decode,
                                             const RooflineOptions& o, int layers = 61,
                                             int gpus = 4);

// The table printed by `bench serve` (one row per kind) and, with a roofline, the ratios.
std::string format_step_table(const std::vector<StepKindStats>& kinds);

}  // namespace osprey::bench
