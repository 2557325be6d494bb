#include "bench/server_steps.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench/prometheus.h"
#include "core/error.h"
#include "kv/paged_cache.h"

namespace osprey::bench {

namespace {

constexpr const char* kKinds[] = {"decode", "mixed", "prefill"};
constexpr const char* kKindLabel = "step_kind";

double counter_delta(std::string_view before, std::string_view after, std::string_view name,
                     std::string_view kind) {
  const double a = find_sample(after, name, kKindLabel, kind).value_or(0);
  const double b = find_sample(before, name, kKindLabel, kind).value_or(0);
  return a - b;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

std::vector<StepKindStats> server_step_stats(std::string_view before, std::string_view after) {
  std::vector<StepKindStats> out;
  for (const char* kind : kKinds) {
    const auto a = find_histogram_series(after, kStepHistogram, kKindLabel, kind);
    if (!a) continue;
    const auto b = find_histogram_series(before, kStepHistogram, kKindLabel, kind);
    const HistogramSeries d = histogram_delta(*a, b.value_or(HistogramSeries{}));
    if (!(d.count > 0)) continue;
    StepKindStats s;
    s.kind = kind;
    s.steps = d.count;
    s.mean_ms = d.sum / d.count * 1e3;
    s.median_ms = histogram_quantile(0.5, d) * 1e3;
    s.p99_ms = histogram_quantile(0.99, d) * 1e3;
    if (find_sample(after, "osprey_step_predicted_seconds_total", kKindLabel, kind))
      s.predicted_mean_ms =
          counter_delta(before, after, "osprey_step_predicted_seconds_total", kind) / d.count * 1e3;
    const double seqs = counter_delta(before, after, "osprey_step_decode_seqs_total", kind);
    const double ctx =
        counter_delta(before, after, "osprey_step_decode_context_tokens_total", kind);
    const double chunks = counter_delta(before, after, "osprey_step_prefill_chunks_total", kind);
    const double tokens = counter_delta(before, after, "osprey_step_prefill_tokens_total", kind);
    const double start =
        counter_delta(before, after, "osprey_step_prefill_start_tokens_total", kind);
    s.decodes = seqs / d.count;
    s.decode_context = seqs > 0 ? ctx / seqs : 0;
    s.chunks = chunks / d.count;
    s.chunk_tokens = chunks > 0 ? tokens / chunks : 0;
    s.chunk_start = chunks > 0 ? start / chunks : 0;
    out.push_back(s);
  }
  return out;
}

StepShape mean_step_shape(const StepKindStats& s) {
  StepShape shape;
  const auto decodes = std::llround(s.decodes);
  shape.decode_contexts.assign(size_t(std::max<long long>(decodes, 0)),
                               std::llround(s.decode_context));
  if (s.chunk_tokens > 0) {
    const long long n = std::max<long long>(1, std::llround(s.chunks));
    for (long long i = 0; i < n; ++i)
      shape.chunks.push_back(
          {std::llround(s.chunk_start), std::max<long long>(1, std::llround(s.chunk_tokens))});
  }
  return shape;
}

StepCostOptions roofline_cost_options(const ModelConfig& c, const RooflineOptions& o) {
  StepCostOptions co;
  co.fp8 = c.quant.fp8;
  co.latent_token_bytes = PagedKVCache::latent_token_bytes(c, Device::CUDA, o.fp8_latent_cache);
  co.prefill_attention = c.has_indexer ? PrefillAttention::Absorbed : PrefillAttention::Expanded;
  return co;
}

StepCost mean_step_cost(const ModelConfig& c, const StepKindStats& s, const StepCostOptions& co) {
  const double d = std::max(0.0, s.decodes);
  const double n = s.chunk_tokens > 0 ? std::max(1.0, s.chunks) : 0.0;
  const double d0 = std::floor(d), n0 = std::floor(n);
  const double fd = d - d0, fn = n - n0;  // the weights of the shapes with one more
  const int64_t ctx = std::llround(s.decode_context);
  const int64_t start = std::llround(s.chunk_start);
  const int64_t tokens = std::max<long long>(1, std::llround(s.chunk_tokens));
  StepCost sum;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const double w = (i ? fd : 1.0 - fd) * (j ? fn : 1.0 - fn);
      if (w == 0.0) continue;
      StepShape shape;
      shape.decode_contexts.assign(size_t(d0) + size_t(i), ctx);
      shape.chunks.assign(size_t(n0) + size_t(j), PrefillChunk{start, tokens});
      const StepCost x = step_cost(c, shape, co);
      sum.weight_bytes += w * x.weight_bytes;
      sum.cache_bytes += w * x.cache_bytes;
      sum.gemm_flops += w * x.gemm_flops;
      sum.attn_flops += w * x.attn_flops;
      sum.flops += w * x.flops;
      sum.experts_touched += w * x.experts_touched;
    }
  return sum;
}

std::optional<double> steps_roofline_sum_s(const std::vector<StepKindStats>& kinds) {
  if (kinds.empty()) return std::nullopt;
  double sum = 0;
  for (const StepKindStats& k : kinds) {
    if (!k.roofline_ms) return std::nullopt;
    sum += k.steps * *k.roofline_ms * 1e-3;
  }
  return sum;
}

void add_roofline(std::vector<StepKindStats>& kinds, const ModelConfig& c,
                  const RooflineOptions& o) {
  const StepCostOptions co = roofline_cost_options(c, o);
  for (StepKindStats& k : kinds)
    k.roofline_ms = roofline_seconds(mean_step_cost(c, k, co), o.rates, co.fp8) * 1e3;
}

FullModelEstimate estimate_full_model_decode(const ModelConfig& proxy, const StepKindStats& decode,
                                             const RooflineOptions& o, int layers, int gpus) {
  if (layers < 1 || gpus < 1) fail("the full-model estimate needs layers >= 1 and gpus >= 1");
  if (!(decode.steps > 0 && decode.decodes >= 1))
    fail("the full-model estimate needs measured decode-only steps");
  FullModelEstimate e;
  e.layers = layers;
  e.gpus = gpus;
  e.proxy_ms = decode.mean_ms;
  const StepCostOptions co = roofline_cost_options(proxy, o);
  StepKindStats shape_of = decode;
  shape_of.chunk_tokens = 0;
  const StepShape shape = mean_step_shape(shape_of);
  auto cost_with = [&](int n_layers) {
    ModelConfig c = proxy;
    c.num_hidden_layers = n_layers;
    return step_cost(c, shape, co);
  };
  const StepCost p = cost_with(proxy.num_hidden_layers), f = cost_with(layers);
  e.proxy_weight_gb = p.weight_bytes / 1e9;
  e.proxy_cache_gb = p.cache_bytes / 1e9;
  e.full_weight_gb = f.weight_bytes / 1e9;
  e.full_cache_gb = f.cache_bytes / 1e9;
  e.ms_per_gb = e.proxy_ms / (p.bytes() / 1e9);
  // One layer of each kind, by difference (layer i < first_k_dense_replace is dense).
  const int k = std::min(proxy.first_k_dense_replace, proxy.num_hidden_layers);
  const double head_gb = cost_with(0).bytes() / 1e9;
  e.head_ms = head_gb * e.ms_per_gb;
  if (k >= 1) e.dense_layer_ms = (cost_with(1).bytes() / 1e9 - head_gb) * e.ms_per_gb;
  e.moe_layer_ms = (cost_with(k + 1).bytes() - cost_with(k).bytes()) / 1e9 * e.ms_per_gb;
  e.one_gpu_ms = f.bytes() / 1e9 * e.ms_per_gb;
  e.per_gpu_bytes_ms = (e.full_weight_gb / gpus + e.full_cache_gb) * e.ms_per_gb;
  e.all_reduce_ms = gpus > 1 ? 2.0 * layers * kAssumedAllReduceUs * 1e-3 : 0;
  e.estimate_ms = e.per_gpu_bytes_ms + e.all_reduce_ms;

  const int dense_full = std::min(proxy.first_k_dense_replace, layers);
  std::string& t = e.text;
  t += "ESTIMATE (not a measurement): full DeepSeek-V3.2 decode step, " + std::to_string(layers) +
       " layers on " + std::to_string(gpus) + " GPUs, against vLLM #42982\n";
  t += "  measured: proxy (" + std::to_string(proxy.num_hidden_layers) +
       " layers) mean decode-only step " + fmt("%.2f ms", e.proxy_ms) +
       " at B=" + fmt("%.1f", decode.decodes) + ", context " + fmt("%.0f", decode.decode_context) +
       "\n";
  t += "  its roofline bytes: weights " + fmt("%.2f GB", e.proxy_weight_gb) + " + caches " +
       fmt("%.3f GB", e.proxy_cache_gb) + " -> " + fmt("%.3f ms per GB", e.ms_per_gb) +
       " (every byte assumed to cost the proxy's measured time per byte)\n";
  t += "  per layer (the measured step split by bytes): dense " + fmt("%.3f ms", e.dense_layer_ms) +
       ", MoE " + fmt("%.3f ms", e.moe_layer_ms) + ", embedding + lm_head " +
       fmt("%.3f ms", e.head_ms) + "\n";
  t += "  " + std::to_string(layers) + " layers (" + std::to_string(dense_full) + " dense + " +
       std::to_string(layers - dense_full) + " MoE) on 1 GPU: " + fmt("%.2f GB", e.full_weight_gb) +
       " + " + fmt("%.3f GB", e.full_cache_gb) + " -> " + fmt("%.2f ms", e.one_gpu_ms) + "\n";
  t += "  on " + std::to_string(gpus) + " GPUs: weights split " + std::to_string(gpus) +
       " ways (TP attention/dense/lm_head, experts split), latent and indexer caches replicated "
       "(MLA's one KV head): (" +
       fmt("%.2f", e.full_weight_gb) + " / " + std::to_string(gpus) + " + " +
       fmt("%.3f", e.full_cache_gb) + ") GB x " + fmt("%.3f", e.ms_per_gb) +
       " ms/GB = " + fmt("%.2f ms", e.per_gpu_bytes_ms) + "\n";
  t += "  + 2 all-reduces per layer at an assumed " + fmt("%.0f us", kAssumedAllReduceUs) +
       " each (not measured): " + fmt("%.2f ms", e.all_reduce_ms) + "\n";
  t += "  estimate " + fmt("%.2f ms", e.estimate_ms) + " per decode step vs vLLM #42982 " +
       fmt("%.1f ms", kVllm42982DecodeStepMs) +
       " (MI355X TP4): " + fmt("%.2fx", e.estimate_ms / kVllm42982DecodeStepMs) + "\n";
  return e;
}

std::string format_step_table(const std::vector<StepKindStats>& kinds) {
  std::string out;
  char b[256];
  std::snprintf(b, sizeof b, "%-8s %7s %9s %9s %9s %9s %10s %7s %13s\n", "kind", "steps", "mean_ms",
                "median_ms", "p99_ms", "pred_ms", "roofline", "x_roof", "mean shape");
  out += b;
  for (const StepKindStats& k : kinds) {
    std::string shape;
    if (k.decodes > 0) shape += fmt("B=%.1f", k.decodes) + fmt(" ctx %.0f", k.decode_context);
    if (k.chunk_tokens > 0)
      shape += (shape.empty() ? "" : " + ") + fmt("%.2f chunks", k.chunks) +
               fmt(" of %.0f", k.chunk_tokens) + fmt(" at %.0f", k.chunk_start);
    std::snprintf(b, sizeof b, "%-8s %7.0f %9.2f %9.2f %9.2f %9s %10s %7s %s\n", k.kind.c_str(),
                  k.steps, k.mean_ms, k.median_ms, k.p99_ms,
                  k.predicted_mean_ms ? fmt("%.2f", *k.predicted_mean_ms).c_str() : "-",
                  k.roofline_ms ? fmt("%.3f", *k.roofline_ms).c_str() : "-",
                  k.roofline_ms && *k.roofline_ms > 0
                      ? fmt("%.2fx", k.mean_ms / *k.roofline_ms).c_str()
                      : "-",
                  shape.c_str());
    out += b;
  }
  return out;
}

}  // namespace osprey::bench
