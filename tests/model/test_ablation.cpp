// The negative-control hooks of `osprey eval` (model/ablation.h) change what they claim to:
//  - zero_attention_layer changes the logits, and resetting the ablation restores them exactly;
//  - indexer_recent equals forcing the most recent index_topk positions, and differs from the
//    indexer's own choice once a sequence is longer than index_topk;
//  - dense_attention equals the same weights with index_topk above the sequence length.
#include <gtest/gtest.h>

#include <random>

#include "model/greedy.h"
#include "test_util.h"

using namespace osprey;
using namespace osprey::testing;

namespace {

constexpr int kLen = 40;  // > index_topk (8) of v32-tiny: sparse attention decides

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(vocab - 3)) + 3;
  return t;
}

Buffer logits_of(const DeepseekModel& m, const std::vector<int32_t>& tokens,
                 const ForwardOptions& o = {}) {
  return prefill_logits(m, tokens, o);
}

}  // namespace

TEST(Ablation, SelectRecentPositions) {
  Buffer topk(DType::I32, {3, 4});
  Buffer pos(DType::I32, {3});
  const int32_t p[] = {0, 2, 10};
  std::copy(p, p + 3, pos.ptr<int32_t>());
  select_recent_positions(topk, pos);
  EXPECT_EQ(to_ids(topk), (std::vector<int32_t>{0, -1, -1, -1, 0, 1, 2, -1, 7, 8, 9, 10}));
}

TEST(Ablation, ZeroAttentionLayerChangesLogitsAndResets) {
  auto m = load_model_cpu(model_dir("v32-tiny"));
  const auto tokens = random_tokens(kLen, m->config().vocab_size, 3);
  const Buffer base = logits_of(*m, tokens);
  for (int l = 0; l < m->config().num_hidden_layers; ++l) {
    ModelAblation a;
    a.zero_attention_layer = l;
    m->set_ablation(a);
    TensorDump dump;
    const Buffer z = logits_of(*m, tokens, {AttentionPath::Auto, &dump, nullptr});
    EXPECT_GT(rel_error(z, base), 0.01) << "layer " << l;
    const std::optional<Tensor> out_opt = dump.find("layers." + std::to_string(l) + ".attn_out");
    ASSERT_TRUE(out_opt.has_value());
    const Tensor out = *out_opt;
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.f32()[i], 0.0f) << "layer " << l;
  }
  m->set_ablation({});
  EXPECT_EQ(rel_error(logits_of(*m, tokens), base), 0.0);
}

TEST(Ablation, IndexerRecentEqualsForcedRecentPositions) {
  auto m = load_model_cpu(model_dir("v32-tiny"));
  const ModelConfig& c = m->config();
  ASSERT_TRUE(c.has_indexer);
  ASSERT_LT(c.index_topk, kLen);
  const auto tokens = random_tokens(kLen, c.vocab_size, 4);
  const Buffer base = logits_of(*m, tokens);
  // The recent window, forced through the existing diffing aid.
  Buffer pos(DType::I32, {kLen});
  for (int i = 0; i < kLen; ++i) pos.ptr<int32_t>()[i] = i;
  std::vector<Buffer> owned;
  std::vector<Tensor> forced;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    owned.emplace_back(DType::I32, Shape{kLen, c.index_topk});
    select_recent_positions(owned.back(), pos);
    forced.push_back(owned.back());
  }
  const Buffer want = logits_of(*m, tokens, {AttentionPath::Auto, nullptr, &forced});
  ModelAblation a;
  a.indexer_recent = true;
  m->set_ablation(a);
  const Buffer recent = logits_of(*m, tokens);
  EXPECT_EQ(rel_error(recent, want), 0.0);
  EXPECT_GT(rel_error(recent, base), 1e-3);
}

TEST(Ablation, DenseEqualsHugeIndexTopk) {
  auto m = load_model_cpu(model_dir("v32-tiny"));
  ModelConfig big = m->config();
  big.index_topk = 1 << 20;
  auto huge = load_model_cpu(model_dir("v32-tiny"), &big);
  const auto tokens = random_tokens(kLen, big.vocab_size, 5);
  const Buffer sparse = logits_of(*m, tokens);
  const Buffer want = logits_of(*huge, tokens);
  ModelAblation a;
  a.dense_attention = true;
  m->set_ablation(a);
  const Buffer dense = logits_of(*m, tokens);
  EXPECT_LT(rel_error(dense, want), 1e-6);
  EXPECT_GT(rel_error(dense, sparse), 1e-3);  // sparsity matters at this length
  // Decode (absorbed path) too: greedy continuations agree.
  GreedyOptions g;
  g.max_new_tokens = 8;
  g.stop_at_eos = false;
  EXPECT_EQ(greedy_generate(*m, tokens, g), greedy_generate(*huge, tokens, g));
}
