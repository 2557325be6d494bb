// The two attention paths and the paged cache compute one function:
//  - prefill (expanded, non-absorbed) logits of every position equal those of token-by-token
//    decode (absorbed, reading the paged latent cache and the indexer key cache);
//  - chunked prefill, a scattered block table and several sequences in one batch change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "model/greedy.h"
#include "test_util.h"

using namespace osprey;
using namespace osprey::testing;

namespace {

constexpr double kTol = 1e-4;

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(vocab - 3)) + 3;
  return t;
}

class PathsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model_ = load_model_cpu(model_dir(GetParam())); }
  std::unique_ptr<DeepseekModel> model_;
};

}  // namespace

TEST_P(PathsTest, PrefillLogitsEqualDecodeLogits) {
  const ModelConfig& c = model_->config();
  const int n = 75;  // crosses a block boundary; beyond index_topk for V3.2
  const std::vector<int32_t> tokens = random_tokens(n, c.vocab_size, 7);
  Buffer prefill = prefill_logits(*model_, tokens, {AttentionPath::Expanded, nullptr, nullptr});

  // Token-by-token decode through the absorbed path; blocks scattered over a larger cache.
  std::vector<int32_t> blocks = {5, 2};
  PagedKVCache cache(c, 8);
  Buffer row(DType::F32, {1, c.vocab_size});
  double worst = 0.0;
  for (int t = 0; t < n; ++t) {
    OwnedBatch b({SeqStep{{tokens[size_t(t)]}, t, blocks, false}}, kBlockSize);
    model_->forward(b.batch(), cache, row, {AttentionPath::Absorbed, nullptr, nullptr});
    worst = std::max(worst,
                     rel_error(row.f32(), prefill.f32() + int64_t(t) * c.vocab_size, c.vocab_size));
  }
  EXPECT_LT(worst, kTol);
  // And the two paths are not trivially equal because nothing was attended: logits vary by
  // position.
  EXPECT_GT(rel_error(prefill.f32(), prefill.f32() + int64_t(n - 1) * c.vocab_size, c.vocab_size),
            0.01);
}

TEST_P(PathsTest, ChunkedPrefillAndMixedBatchesMatchOneShotPrefill) {
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> a = random_tokens(70, c.vocab_size, 11);
  const std::vector<int32_t> b = random_tokens(23, c.vocab_size, 12);
  Buffer ref_a = prefill_logits(*model_, a);
  Buffer ref_b = prefill_logits(*model_, b);

  // Step 1: a's first 30 tokens and all of b in one batch; steps 2 and 3: the rest of a in chunks.
  // Physical blocks are out of order and shared out between the two sequences.
  PagedKVCache cache(c, 6);
  const std::vector<int32_t> blocks_a = {4, 0}, blocks_b = {3};
  auto run = [&](const std::vector<SeqStep>& steps) {
    OwnedBatch ob(steps, kBlockSize);
    Buffer l(DType::F32, {ob.n_logits(), c.vocab_size});
    model_->forward(ob.batch(), cache, l);
    return l;
  };
  auto slice = [](const std::vector<int32_t>& v, int s, int e) {
    return std::vector<int32_t>(v.begin() + s, v.begin() + e);
  };
  Buffer l1 = run({SeqStep{slice(a, 0, 30), 0, blocks_a, true}, SeqStep{b, 0, blocks_b, true}});
  Buffer l2 = run({SeqStep{slice(a, 30, 55), 30, blocks_a, true}});
  Buffer l3 = run({SeqStep{slice(a, 55, 70), 55, blocks_a, true}});
  const int64_t V = c.vocab_size;
  EXPECT_LT(rel_error(l1.f32(), ref_a.f32(), 30 * V), kTol);
  EXPECT_LT(rel_error(l1.f32() + 30 * V, ref_b.f32(), 23 * V), kTol);
  EXPECT_LT(rel_error(l2.f32(), ref_a.f32() + 30 * V, 25 * V), kTol);
  EXPECT_LT(rel_error(l3.f32(), ref_a.f32() + 55 * V, 15 * V), kTol);
}

TEST_P(PathsTest, GreedyIsTheSameWhicheverPathRunsPrefill) {
  const std::vector<int32_t> prompt = random_tokens(20, model_->config().vocab_size, 3);
  GreedyOptions o;
  o.max_new_tokens = 12;
  o.stop_at_eos = false;
  o.prefill_path = AttentionPath::Expanded;
  const auto expanded = greedy_generate(*model_, prompt, o);
  o.prefill_path = AttentionPath::Absorbed;
  o.prefill_chunk = 7;
  EXPECT_EQ(greedy_generate(*model_, prompt, o), expanded);
}

TEST_P(PathsTest, DumpHoldsEveryStageOfEveryLayer) {
  const ModelConfig& c = model_->config();
  TensorDump dump;
  prefill_logits(*model_, random_tokens(9, c.vocab_size, 5), {AttentionPath::Auto, &dump, nullptr});
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (const char* s : {"attn_in", "q", "latent", "k_pe", "attn_heads", "attn_out", "ffn_in",
                          "ffn_out", "hidden"})
      EXPECT_TRUE(dump.find("layers." + std::to_string(l) + "." + s)) << l << " " << s;
  EXPECT_TRUE(dump.find("logits"));
  EXPECT_EQ(dump.find("layers.0.latent")->shape, Shape({9, c.kv_lora_rank}));
  EXPECT_TRUE(dump.find("layers.1.topk_ids"));  // layer 1 is MoE in every test model
  if (c.has_indexer) {
    EXPECT_EQ(dump.find("layers.0.topk_indices")->shape, Shape({9, c.index_topk}));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PathsTest, ::testing::Values("v2-tiny", "v3-tiny", "v32-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });
