// The roofline counts (model/step_cost.h) against numbers worked out by hand from
// DeepSeek-V3.2's shapes (BENCHMARKS.md, reference/performance.md).
#include <gtest/gtest.h>

#include <cmath>

#include "model/make_model.h"
#include "model/step_cost.h"

namespace osprey {
namespace {

TEST(StepCost, ExpectedExpertsMatchTheUniformFormula) {
  EXPECT_NEAR(expected_experts(256, 8, 1), 8.0, 1e-9);
  EXPECT_NEAR(expected_experts(256, 8, 16), 102.0, 1.0);
  EXPECT_NEAR(expected_experts(256, 8, 64), 222.0, 1.0);
}

TEST(StepCost, Dsv32DecodeBytes) {
  const ModelConfig c = preset_config("dsv32");  // 3 dense + 2 MoE layers, FP8
  const StepCost b1 = decode_cost(c, /*fp8=*/true, 1, 5000);
  // One expert is 3·7168·2048 = 44.04 M FP8 bytes; B=1 touches 8 per MoE layer.
  const double expert = 3.0 * 7168 * 2048;
  const StepCost b64 = decode_cost(c, true, 64, 5000);
  // From B=1 to B=64 the weights grow by (222.0 − 8) experts per MoE layer, 2 MoE layers
  // (± the block scales, 4 bytes per 128×128 block).
  const double extra = 2.0 * (expected_experts(256, 8, 64) - 8.0) * expert;
  EXPECT_NEAR(b64.weight_bytes - b1.weight_bytes, extra, extra * 1e-3);
  // lm_head (129280 × 7168 BF16 = 1.853 GB) is part of every step.
  EXPECT_GT(b1.weight_bytes, 2.0 * 129280.0 * 7168.0);
  // Cache: per layer 2048 latent rows (576 BF16) + 5000 indexer keys (128 BF16), per sequence.
  EXPECT_DOUBLE_EQ(b1.cache_bytes, 5.0 * (2048.0 * 576 * 2 + 5000.0 * 128 * 2));
  EXPECT_DOUBLE_EQ(b64.cache_bytes, 64 * b1.cache_bytes);
  // Context 1000 < 2048: every row attended.
  EXPECT_DOUBLE_EQ(decode_cost(c, true, 1, 1000).cache_bytes,
                   5.0 * (1000.0 * 576 * 2 + 1000.0 * 128 * 2));
  // The FP8 latent cache: 656-byte rows.
  EXPECT_DOUBLE_EQ(decode_cost(c, true, 1, 5000, 656).cache_bytes,
                   5.0 * (2048.0 * 656 + 5000.0 * 128 * 2));
}

TEST(StepCost, PrefillFlopsAreDominatedByTwiceTheActiveParameters) {
  const ModelConfig c = preset_config("dsv32");
  const StepCost p = prefill_cost(c, true, 5000);
  const StepCost p2 = prefill_cost(c, true, 10000);
  // More than 2 · tokens · (dense MLP of 3 layers) alone.
  EXPECT_GT(p.flops, 2.0 * 5000 * 3 * (3.0 * 18432 * 7168));
  // Past 2048 tokens DSA caps attention per token: doubling tokens roughly doubles FLOPs (< 2.2×).
  EXPECT_LT(p2.flops / p.flops, 2.2);
  EXPECT_GT(p2.flops / p.flops, 1.9);
}

}  // namespace
}  // namespace osprey
