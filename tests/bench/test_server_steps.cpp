// The server's per-step metrics by kind: server::Metrics renders them, the bench reads them back
// from two snapshots (the delta of a run), takes medians and P99s from the buckets, and sets them
// beside the roofline of the mean step; the full-model estimate's scaling adds up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "bench/prometheus.h"
#include "bench/serve.h"
#include "bench/server_steps.h"
#include "bench/stats.h"
#include "core/error.h"
#include "model/make_model.h"
#include "server/metrics.h"

namespace osprey::bench {
namespace {

StepRecord decode_step(double seconds, int batch, int64_t context) {
  StepRecord r;
  r.kind = StepKind::Decode;
  r.seconds = seconds;
  r.predicted_seconds = seconds * 0.9;
  r.num_decodes = batch;
  r.decode_context_tokens = int64_t(batch) * context;
  return r;
}

TEST(ServerSteps, MetricsRoundTripGivesTheRunsStepsByKind) {
  server::Metrics m;
  for (int i = 0; i < 5; ++i) m.observe_step(decode_step(1.0, 8, 100));  // before the run
  const std::string before = m.render(EngineStats{});
  std::vector<double> decode_ms;
  for (int i = 0; i < 200; ++i) {
    const double ms = 20.0 + 0.1 * ((i * 37) % 200);  // 20.0 .. 39.9 ms, shuffled
    decode_ms.push_back(ms);
    m.observe_step(decode_step(ms * 1e-3, 64, 5000 + i));
  }
  for (int i = 0; i < 10; ++i) {
    StepRecord r;
    r.kind = StepKind::Mixed;
    r.seconds = 0.1 + 0.01 * i;
    r.num_decodes = 63;
    r.decode_context_tokens = 63 * 5100;
    r.num_chunks = 1;
    r.prefill_tokens = 512;
    r.prefill_start_tokens = 1024;
    m.observe_step(r);
  }
  const std::string after = m.render(EngineStats{});
  const std::vector<StepKindStats> k = server_step_stats(before, after);
  ASSERT_EQ(k.size(), 2u);  // no prefill-only steps
  const StepKindStats& d = k[0];
  EXPECT_EQ(d.kind, "decode");
  EXPECT_DOUBLE_EQ(d.steps, 200);
  std::sort(decode_ms.begin(), decode_ms.end());
  double mean = 0;
  for (double v : decode_ms) mean += v / 200;
  EXPECT_NEAR(d.mean_ms, mean, 1e-6);  // exact: _sum / _count
  // Quantiles from buckets 10% apart: within 5% of the sample's.
  EXPECT_NEAR(d.median_ms, percentile_sorted(decode_ms, 50), 0.05 * 30);
  EXPECT_NEAR(d.p99_ms, percentile_sorted(decode_ms, 99), 0.05 * 40);
  EXPECT_GT(d.p99_ms, d.median_ms);
  ASSERT_TRUE(d.predicted_mean_ms.has_value());
  EXPECT_NEAR(*d.predicted_mean_ms, 0.9 * mean, 1e-6);
  EXPECT_DOUBLE_EQ(d.decodes, 64);
  EXPECT_NEAR(d.decode_context, 5000 + 99.5, 1e-9);
  EXPECT_DOUBLE_EQ(d.chunk_tokens, 0);
  const StepKindStats& x = k[1];
  EXPECT_EQ(x.kind, "mixed");
  EXPECT_DOUBLE_EQ(x.steps, 10);
  EXPECT_NEAR(x.mean_ms, 145, 1e-6);
  EXPECT_DOUBLE_EQ(x.decodes, 63);
  EXPECT_DOUBLE_EQ(x.decode_context, 5100);
  EXPECT_DOUBLE_EQ(x.chunks, 1);
  EXPECT_DOUBLE_EQ(x.chunk_tokens, 512);
  EXPECT_DOUBLE_EQ(x.chunk_start, 1024);
  // The old total still reads (summed over kinds): the bench's "Mean step time".
  const auto total = find_histogram(after, kStepHistogram);
  ASSERT_TRUE(total.has_value());
  EXPECT_DOUBLE_EQ(total->count, 215);
  // A server without per-kind steps (another engine): nothing.
  EXPECT_TRUE(server_step_stats("", "vllm:num_requests_running 3\n").empty());
}

TEST(ServerSteps, HistogramQuantileInterpolatesInsideTheBucket) {
  HistogramSeries h;
  h.buckets = {{0.1, 10}, {0.2, 30}, {INFINITY, 40}};
  EXPECT_NEAR(histogram_quantile(0.1, h), 0.04, 1e-12);  // rank 4 in [0, 0.1]
  EXPECT_NEAR(histogram_quantile(0.5, h), 0.15, 1e-12);  // rank 20 in [0.1, 0.2]
  EXPECT_NEAR(histogram_quantile(0.9, h), 0.2, 1e-12);   // in +Inf: the last finite bound
  EXPECT_DOUBLE_EQ(histogram_quantile(0.5, HistogramSeries{}), 0);
  HistogramSeries other;
  other.buckets = {{0.1, 1}, {INFINITY, 1}};
  EXPECT_THROW(histogram_delta(h, other), Error);
  const HistogramSeries d = histogram_delta(h, h);
  EXPECT_DOUBLE_EQ(d.buckets.back().second, 0);
}

TEST(ServerSteps, SeriesAndSamplesByLabel) {
  const std::string text =
      "x_bucket{step_kind=\"decode\",le=\"0.5\"} 3\n"
      "x_bucket{step_kind=\"decode\",le=\"+Inf\"} 4\n"
      "x_bucket{step_kind=\"mixed\",le=\"0.5\"} 9\n"
      "x_sum{step_kind=\"decode\"} 1.25\n"
      "x_count{step_kind=\"decode\"} 4\n"
      "y_total{step_kind=\"mixed\"} 7\n"
      "y_total{step_kind=\"decode\"} 2.5e3\n";
  const auto s = find_histogram_series(text, "x", "step_kind", "decode");
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->sum, 1.25);
  EXPECT_DOUBLE_EQ(s->count, 4);
  ASSERT_EQ(s->buckets.size(), 2u);
  EXPECT_DOUBLE_EQ(s->buckets[0].first, 0.5);
  EXPECT_TRUE(std::isinf(s->buckets[1].first));
  EXPECT_FALSE(find_histogram_series(text, "x", "step_kind", "prefill"));
  EXPECT_EQ(find_sample(text, "y_total", "step_kind", "decode"), 2500);
  EXPECT_FALSE(find_sample(text, "y_total", "step_kind", "prefill"));
}

// BENCHMARKS.md's serving roofline on the dsv32 proxy: a decode step at B=64 reads ~24.9 GB
// (5.8 ms at 4.3 TB/s); a 2048-token chunk's GEMMs are ~12.2 TFLOP.
TEST(ServerSteps, RooflineOfTheMeanStep) {
  ModelConfig c = preset_config("dsv32");
  c.quant.fp8 = true;  // as `make-model --preset dsv32 --fp8` writes it
  StepKindStats d;
  d.kind = "decode";
  d.steps = 500;
  d.mean_ms = 25;
  d.decodes = 64;
  d.decode_context = 5000;
  StepKindStats x = d;
  x.kind = "mixed";
  x.chunks = 1;
  x.chunk_tokens = 2048;
  x.chunk_start = 2048;
  std::vector<StepKindStats> k = {d, x};
  add_roofline(k, c, RooflineOptions{});
  ASSERT_TRUE(k[0].roofline_ms.has_value());
  EXPECT_NEAR(*k[0].roofline_ms, 24.92 / 4300 * 1e3, 0.1);
  const StepCost chunk =
      step_cost(c, mean_step_shape(x), roofline_cost_options(c, RooflineOptions{}));
  EXPECT_NEAR(chunk.gemm_flops, 12.2e12 * (2048 + 64) / 2048, 0.06 * 12.2e12);
  EXPECT_GT(*k[1].roofline_ms, *k[0].roofline_ms);
  EXPECT_NEAR(*k[1].roofline_ms, roofline_seconds(chunk, kH200Rates, /*fp8=*/true) * 1e3, 1e-9);
  const std::string table = format_step_table(k);
  EXPECT_NE(table.find("decode"), std::string::npos);
  EXPECT_NE(table.find("4.32x"), std::string::npos) << table;  // 25 ms / 5.793 ms (BF16 router)
}

// The mean step keeps its fractional counts: the 5000/500/64 wave's mixed steps hold 32.1 decodes
// and 1.40 chunks of 1440 tokens on average, whose roofline counts 1.4 chunks' FLOPs (rounding
// to one chunk, as the roofline once did, left 29% of the prompt tokens out).
TEST(ServerSteps, RooflineOfTheMeanStepKeepsFractionalChunks) {
  ModelConfig c = preset_config("dsv32");
  c.quant.fp8 = true;
  const StepCostOptions co = roofline_cost_options(c, RooflineOptions{});
  StepKindStats x;
  x.kind = "mixed";
  x.steps = 156;
  x.mean_ms = 39;
  x.decodes = 32;
  x.decode_context = 5053;
  x.chunk_tokens = 1440;
  x.chunk_start = 1894;
  auto with_chunks = [&](double n) {
    StepKindStats y = x;
    y.chunks = n;
    std::vector<StepKindStats> k = {y};
    add_roofline(k, c, RooflineOptions{});
    return *k[0].roofline_ms;
  };
  const double r1 = with_chunks(1.0), r14 = with_chunks(1.4), r2 = with_chunks(2.0);
  EXPECT_GT(r14, r1 * 1.3);  // FLOP-bound: ~1.4 chunks' worth of prompt work
  EXPECT_LT(r14, r1 * 1.45);
  EXPECT_NEAR(r14, r1 + 0.4 * (r2 - r1), 1e-9 * r2);  // linear between the integral counts
  // Integral counts: the shape itself.
  StepKindStats y = x;
  y.chunks = 2;
  const StepCost whole = step_cost(c, mean_step_shape(y), co);
  const StepCost mean = mean_step_cost(c, y, co);
  EXPECT_DOUBLE_EQ(mean.gemm_flops, whole.gemm_flops);
  EXPECT_DOUBLE_EQ(mean.attn_flops, whole.attn_flops);
  EXPECT_DOUBLE_EQ(mean.bytes(), whole.bytes());
  // Fractional decodes: 32.5 decodes cost halfway between 32 and 33 (attention and cache bytes).
  y.decodes = 32.5;
  StepKindStats y32 = y, y33 = y;
  y32.decodes = 32;
  y33.decodes = 33;
  EXPECT_NEAR(mean_step_cost(c, y, co).attn_flops,
              0.5 * (mean_step_cost(c, y32, co).attn_flops + mean_step_cost(c, y33, co).attn_flops),
              1e-9 * whole.attn_flops);
  EXPECT_GT(mean_step_cost(c, y, co).cache_bytes, mean_step_cost(c, y32, co).cache_bytes);
}

// The report sets the run's duration against the sum of its steps' rooflines (steps × the
// roofline of their kind's mean step), in the text and the JSON's steps_roofline_sum_s.
TEST(ServerSteps, RunAgainstTheSumOfItsStepRooflines) {
  StepKindStats d, x;
  d.kind = "decode";
  d.steps = 500;
  d.mean_ms = 7;
  d.roofline_ms = 5.5;
  x.kind = "mixed";
  x.steps = 100;
  x.mean_ms = 30;
  x.roofline_ms = 17.5;
  ServeMetrics m;
  m.duration_s = 9.0;
  m.step_kinds = {d, x};
  const std::optional<double> sum = steps_roofline_sum_s(m.step_kinds);
  ASSERT_TRUE(sum.has_value());
  EXPECT_NEAR(*sum, 500 * 5.5e-3 + 100 * 17.5e-3, 1e-12);  // 4.50 s
  const std::string report = format_report(m, {64, INFINITY});
  EXPECT_NE(report.find("the run against its steps' rooflines: 9.00 s / 4.50 s = 2.00x"),
            std::string::npos)
      << report;
  // A kind without a roofline (no --model-dir): no sum, no line.
  m.step_kinds[1].roofline_ms.reset();
  EXPECT_FALSE(steps_roofline_sum_s(m.step_kinds).has_value());
  EXPECT_EQ(format_report(m, {64, INFINITY}).find("steps' rooflines"), std::string::npos);
}

TEST(ServerSteps, FullModelEstimateScalingAddsUp) {
  ModelConfig c = preset_config("dsv32");  // 3 dense + 2 MoE
  c.quant.fp8 = true;
  StepKindStats d;
  d.kind = "decode";
  d.steps = 500;
  d.mean_ms = 25;
  d.decodes = 64;
  d.decode_context = 5250;
  const FullModelEstimate e = estimate_full_model_decode(c, d, RooflineOptions{});
  // The proxy's step split back into its parts.
  EXPECT_NEAR(e.head_ms + 3 * e.dense_layer_ms + 2 * e.moe_layer_ms, 25, 1e-9);
  EXPECT_GT(e.moe_layer_ms, e.dense_layer_ms);  // 222 experts touched > a dense MLP
  // 61 layers on one GPU = the same parts with 58 MoE layers.
  EXPECT_NEAR(e.one_gpu_ms, e.head_ms + 3 * e.dense_layer_ms + 58 * e.moe_layer_ms, 1e-9);
  // 4 GPUs: the weights split, the caches not; 122 all-reduces at the assumed latency.
  EXPECT_NEAR(e.per_gpu_bytes_ms, (e.full_weight_gb / 4 + e.full_cache_gb) * e.ms_per_gb, 1e-9);
  EXPECT_NEAR(e.all_reduce_ms, 122 * kAssumedAllReduceUs * 1e-3, 1e-12);
  EXPECT_NEAR(e.estimate_ms, e.per_gpu_bytes_ms + e.all_reduce_ms, 1e-12);
  EXPECT_LT(e.estimate_ms, e.one_gpu_ms);
  EXPECT_NE(e.text.find("ESTIMATE"), std::string::npos);
  EXPECT_NE(e.text.find("40.2 ms"), std::string::npos);
  StepKindStats none = d;
  none.steps = 0;
  EXPECT_THROW(estimate_full_model_decode(c, none, RooflineOptions{}), Error);
}

TEST(ServerSteps, SweepFileNames) {
  EXPECT_EQ(with_rate_suffix("out/r.json", 4), "out/r-rate4.json");
  EXPECT_EQ(with_rate_suffix("r.png", INFINITY), "r-rateinf.png");
  EXPECT_EQ(with_rate_suffix("r", 0.5), "r-rate0.5");
}

}  // namespace
}  // namespace osprey::bench
