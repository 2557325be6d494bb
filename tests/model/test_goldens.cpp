// The CPU forward pass against transformers' (float32, on the GPU machine; tools/make_goldens.py):
// logits of every position within 1e-4 relative, the greedy continuation identical, and for V3.2
// the indexer's selected positions equal to the reference's (up to exact ties in the index score),
// with the evidence that sparsity changes the result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "model/greedy.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace osprey;
using namespace osprey::testing;

namespace {

constexpr double kLogitTol = 1e-4;

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = load_model_cpu(model_dir(GetParam()));
    golden_ = std::make_unique<Checkpoint>(data_dir() + "/goldens/" + GetParam() + ".safetensors");
  }
  std::unique_ptr<DeepseekModel> model_;
  std::unique_ptr<Checkpoint> golden_;
};

// Index scores I[t, j] recomputed from the dumped indexer inputs (to tell ties apart).
std::vector<std::vector<float>> index_scores(const TensorDump& d, int layer, const ModelConfig& c) {
  const std::string p = "layers." + std::to_string(layer) + ".";
  const Tensor q = *d.find(p + "index_q"), k = *d.find(p + "index_k"),
               w = *d.find(p + "index_weights");
  const int64_t T = q.size(0), IH = c.index_n_heads, ID = c.index_head_dim;
  std::vector<std::vector<float>> s(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j <= t; ++j) {
      float acc = 0.0f;
      for (int64_t h = 0; h < IH; ++h) {
        float dot = 0.0f;
        for (int64_t e = 0; e < ID; ++e)
          dot += q.f32()[(t * IH + h) * ID + e] * k.f32()[j * ID + e];
        acc += w.f32()[t * IH + h] * std::max(dot / std::sqrt(float(ID)), 0.0f);
      }
      s[size_t(t)].push_back(acc);
    }
  return s;
}

// Our selection equals the reference's, except that where several positions tie exactly at the
// boundary score either may be chosen. Returns the number of rows that differed only by ties.
int compare_selection(const Tensor& ours, const Tensor& ref,
                      const std::vector<std::vector<float>>& s, const std::string& what) {
  const int64_t T = ours.size(0), K = ours.size(1);
  int tie_rows = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> a, b;
    for (int64_t i = 0; i < K; ++i) {
      if (ours.ptr<int32_t>()[t * K + i] >= 0) a.insert(ours.ptr<int32_t>()[t * K + i]);
      if (ref.ptr<int32_t>()[t * K + i] >= 0) b.insert(ref.ptr<int32_t>()[t * K + i]);
    }
    EXPECT_EQ(a.size(), b.size()) << what << " row " << t;
    if (a == b) continue;
    // The boundary score: the smallest score among our selected positions.
    float boundary = INFINITY;
    for (int32_t j : a) boundary = std::min(boundary, s[size_t(t)][size_t(j)]);
    for (int32_t j : a) {
      if (!b.count(j)) {
        EXPECT_EQ(s[size_t(t)][size_t(j)], boundary) << what << " row " << t << " pos " << j;
      }
    }
    for (int32_t j : b) {
      if (!a.count(j)) {
        EXPECT_EQ(s[size_t(t)][size_t(j)], boundary) << what << " row " << t << " pos " << j;
      }
    }
    ++tie_rows;
  }
  return tie_rows;
}

}  // namespace

TEST_P(GoldenTest, LogitsOfEveryPositionMatchTransformers) {
  const ModelConfig& c = model_->config();
  for (const char* s : {"a", "b"}) {
    const std::vector<int32_t> tokens = to_ids(golden_->get(std::string("tokens.") + s));
    const Tensor ref = golden_->get(std::string("logits.") + s);
    TensorDump dump;
    Buffer logits = prefill_logits(*model_, tokens, {AttentionPath::Auto, &dump, nullptr});
    std::printf("%s seq %s: logits rel error %.3g\n", GetParam().c_str(), s,
                rel_error(logits, ref));
    if (!c.has_indexer) {
      EXPECT_LT(rel_error(logits, ref), kLogitTol) << "sequence " << s;
      for (int l = 0; l < c.num_hidden_layers; ++l)
        EXPECT_LT(rel_error(*dump.find("layers." + std::to_string(l) + ".hidden"),
                            golden_->get("hidden." + std::string(s) + "." + std::to_string(l))),
                  kLogitTol)
            << "layer " << l;
      continue;
    }
    // V3.2: hold attention to the reference's selection, so every layer sees the reference's
    // inputs; then our own indexer's choice must equal the reference's up to exact ties.
    std::vector<Tensor> forced;
    for (int l = 0; l < c.num_hidden_layers; ++l)
      forced.push_back(golden_->get("topk." + std::string(s) + "." + std::to_string(l)));
    TensorDump fdump;
    Buffer flogits = prefill_logits(*model_, tokens, {AttentionPath::Auto, &fdump, &forced});
    EXPECT_LT(rel_error(flogits, ref), kLogitTol) << "sequence " << s << " (reference selection)";
    int tie_rows = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      // The dumped topk is the indexer's own choice (before the forced override).
      const std::string what = std::string("seq ") + s + " layer " + std::to_string(l);
      tie_rows += compare_selection(*fdump.find("layers." + std::to_string(l) + ".topk_indices"),
                                    forced[size_t(l)], index_scores(fdump, l, c), what);
    }
    // Where no exact tie split the choice, the free-running pass is the same computation.
    if (tie_rows == 0) {
      EXPECT_LT(rel_error(logits, ref), kLogitTol) << "sequence " << s;
    }
    std::printf(
        "%s seq %s: with the reference selection %.3g; rows chosen differently at exact ties: %d\n",
        GetParam().c_str(), s, rel_error(flogits, ref), tie_rows);
  }
}

TEST_P(GoldenTest, GreedyContinuationMatchesTransformers) {
  const std::vector<int32_t> prompt = to_ids(golden_->get("prompt.greedy"));
  const std::vector<int32_t> ref = to_ids(golden_->get("greedy"));
  ASSERT_GE(ref.size(), 32u);
  GreedyOptions o;
  o.max_new_tokens = int(ref.size());
  o.stop_at_eos = false;
  EXPECT_EQ(greedy_generate(*model_, prompt, o), ref);
}

using SparseGoldenTest = GoldenTest;

TEST_P(SparseGoldenTest, SparseAttentionChangesTheResult) {
  const ModelConfig& c = model_->config();
  ASSERT_TRUE(c.has_indexer);
  ModelConfig dense_cfg = c;
  dense_cfg.index_topk = 1 << 20;
  auto dense = load_model_cpu(model_dir(GetParam()), &dense_cfg);
  for (const char* s : {"a", "b"}) {
    const std::vector<int32_t> tokens = to_ids(golden_->get(std::string("tokens.") + s));
    ASSERT_GT(int(tokens.size()), c.index_topk);
    const Tensor ref_sparse = golden_->get(std::string("logits.") + s);
    const Tensor ref_dense = golden_->get(std::string("logits_dense.") + s);
    Buffer ours_dense = prefill_logits(*dense, tokens);
    // Dense attention matches transformers' dense run...
    EXPECT_LT(rel_error(ours_dense, ref_dense), kLogitTol);
    // ...and is far from the sparse reference: the selection really decides the result.
    EXPECT_GT(rel_error(ours_dense, ref_sparse), 100 * kLogitTol);
  }
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}
INSTANTIATE_TEST_SUITE_P(Models, GoldenTest,
                         ::testing::Values("v2-tiny", "v3-tiny", "v32-tiny", "v32-tiny-fp8"),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Models, SparseGoldenTest, ::testing::Values("v32-tiny", "v32-tiny-fp8"),
                         param_name);
