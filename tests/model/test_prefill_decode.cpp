// The two attention paths and the paged cache compute one function:
//  - prefill (expanded, non-absorbed) logits of every position equal those of token-by-token
//    decode (absorbed, reading the paged latent cache and the indexer key cache);
//  - chunked prefill, a scattered block table and several sequences in one batch change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "model/deepseek.h"
#include "model/dump.h"
#include "model/greedy.h"
#include "ops/mla.h"
#include "ops/norm.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace osprey;
using namespace osprey::testing;

namespace {

constexpr double kTol = 1e-4;
// FP8 latent cache: decode vs prefill (a rare rounding flip, see below), and FP8 vs F32 outputs
// (e4m3 keeps 3 mantissa bits: ~2^-3/√12 ≈ 3.6% RMS rounding of each latent value).
constexpr double kFp8PathTol = 2e-3, kFp8Tol = 0.1;

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
  Buffer prefill = prefill_logits(*model_, tokens, {AttentionPath::Expanded, nullptr, nullptr, {}});

  // Token-by-token decode through the absorbed path; blocks scattered over a larger cache.
  std::vector<int32_t> blocks = {5, 2};
  PagedKVCache cache(c, 8);
  Buffer row(DType::F32, {1, c.vocab_size});
  double worst = 0.0;
  for (int t = 0; t < n; ++t) {
    OwnedBatch b({SeqStep{{tokens[size_t(t)]}, t, blocks, false}}, kBlockSize);
    model_->forward(b.batch(), cache, row, {AttentionPath::Absorbed, nullptr, nullptr, {}});
    worst = std::max(worst,
                     rel_error(row.f32(), prefill.f32() + int64_t(t) * c.vocab_size, c.vocab_size));
  }
  EXPECT_LT(worst, kTol);
  // And the two paths are not trivially equal because nothing was attended: logits vary by
  // position.
  EXPECT_GT(rel_error(prefill.f32(), prefill.f32() + int64_t(n - 1) * c.vocab_size, c.vocab_size),
            0.01);
}

// The FP8 latent cache (--kv-cache-dtype fp8, ops/mla.h). Both paths read the same quantized
// bytes (prefill dequantizes them for kv_b_proj, decode reads them in the absorbed attention), so
// they agree nearly as well as with the F32 cache: only a latent value that lies within F32 noise
// of an e4m3 rounding boundary can round the other way in one path (the two paths compute the
// latent with differently shaped GEMMs), moving that value by one e4m3 step.
// Against the F32 cache: layer 0's attention output, where the cache quantization is the only
// change, moves by the order of e4m3's rounding (3 mantissa bits). Later layers of these random
// models then amplify it through discrete choices (MoE routing, the indexer's top-k), so their
// logits are compared on the trained model below instead.
TEST_P(PathsTest, Fp8LatentCachePrefillEqualsDecode) {
  const ModelConfig& c = model_->config();
  const int n = 75;
  const std::vector<int32_t> tokens = random_tokens(n, c.vocab_size, 7);
  TensorDump d32, d8;
  prefill_logits(*model_, tokens, {AttentionPath::Expanded, &d32, nullptr});
  model_->set_kv_cache_dtype(KvCacheDtype::Fp8);
  const Buffer prefill = prefill_logits(*model_, tokens, {AttentionPath::Expanded, &d8, nullptr});
  PagedKVCache cache = model_->make_cache(8);
  ASSERT_EQ(cache.latent(0).dtype, DType::U8);
  ASSERT_EQ(cache.latent(0).size(-1),
            c.kv_lora_rank + c.kv_lora_rank / 32 + 2 * int64_t(c.qk_rope_head_dim));
  std::vector<int32_t> blocks = {5, 2};
  Buffer row(DType::F32, {1, c.vocab_size});
  double worst = 0.0;
  for (int t = 0; t < n; ++t) {
    OwnedBatch b({SeqStep{{tokens[size_t(t)]}, t, blocks, false}}, kBlockSize);
    model_->forward(b.batch(), cache, row, {AttentionPath::Absorbed, nullptr, nullptr, {}});
    worst = std::max(worst,
                     rel_error(row.f32(), prefill.f32() + int64_t(t) * c.vocab_size, c.vocab_size));
  }
  const double layer0 =
      rel_error(*d8.find("layers.0.attn_heads"), *d32.find("layers.0.attn_heads"));
  std::printf(
      "%s FP8 latent cache: decode vs prefill logits %.2e; layer 0 attention FP8 vs F32 "
      "%.2e\n",
      GetParam().c_str(), worst, layer0);
  EXPECT_LT(worst, kFp8PathTol);
  EXPECT_EQ(rel_error(*d8.find("layers.0.latent"), *d32.find("layers.0.latent")), 0.0);
  EXPECT_LT(layer0, kFp8Tol);
  EXPECT_GT(layer0, 1e-3) << "the FP8 cache changed nothing: is it quantizing?";
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

// A step without a dump runs the fused ops (issue 13: q's rope inside ops::mla_absorb_q_rope, the
// indexer's ops::indexer_k_write and, with an FP8 key cache, ops::indexer_q_prep); a dump runs the
// stages apart (ops::rope, layer_norm, indexer_cache_write, scale). On the CPU the fused ops' twins
// are those compositions, so the logits of every decode step must be equal bit for bit: a wrong
// argument in the fused calls (rope width, pair layout, positions, the weights' scale) shows here.
TEST_P(PathsTest, FusedDecodeOpsEqualTheStagesApart) {
  const ModelConfig& c = model_->config();
  const int n = 20;
  const std::vector<int32_t> tokens = random_tokens(n, c.vocab_size, 11);
  const std::vector<int32_t> blocks = {5, 2};
  PagedKVCache fused_cache(c, 8), apart_cache(c, 8);
  Buffer fused(DType::F32, {1, c.vocab_size}), apart(DType::F32, {1, c.vocab_size});
  int differing_steps = 0;
  for (int t = 0; t < n; ++t) {
    OwnedBatch b({SeqStep{{tokens[size_t(t)]}, t, blocks, false}}, kBlockSize);
    model_->forward(b.batch(), fused_cache, fused, {AttentionPath::Absorbed, nullptr, nullptr, {}});
    TensorDump dump;
    model_->forward(b.batch(), apart_cache, apart, {AttentionPath::Absorbed, &dump, nullptr, {}});
    ASSERT_TRUE(dump.find("layers.0.q"));  // the stages apart did run
    differing_steps += std::memcmp(fused.f32(), apart.f32(), size_t(c.vocab_size) * 4) != 0;
  }
  EXPECT_EQ(differing_steps, 0);
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

// The bundled trained model (models/osprey-arith, kv_lora 128) with the FP8 latent cache: logits
// of every position stay close to the F32 cache's (it is not chaotic like the random test models),
// on random tokens and on its own text; on its own text (a test problem's chat prompt and the F32
// run's greedy answer, where the model is confident) every position picks the same next token,
// and the FP8 cache's greedy answer is the F32 one. (Random tokens are out of its distribution:
// there its top logits can nearly tie, and the argmax is only reported.)
TEST(TrainedModel, Fp8LatentCacheLogitsTrackF32) {
  const std::string dir = std::string(OSPREY_SOURCE_DIR) + "/models/osprey-arith";
  auto m = load_model_cpu(dir);
  const ModelConfig& c = m->config();
  auto compare = [&](const std::vector<int32_t>& tokens, int from, const char* what) {
    m->set_kv_cache_dtype(KvCacheDtype::Auto);
    const Buffer ref = prefill_logits(*m, tokens);
    m->set_kv_cache_dtype(KvCacheDtype::Fp8);
    const Buffer fp8 = prefill_logits(*m, tokens);
    const int n = int(tokens.size());
    std::vector<double> err;
    int same_argmax = 0;
    for (int t = from; t < n; ++t) {
      const float* a = fp8.f32() + int64_t(t) * c.vocab_size;
      const float* b = ref.f32() + int64_t(t) * c.vocab_size;
      err.push_back(rel_error(a, b, c.vocab_size));
      same_argmax +=
          std::max_element(a, a + c.vocab_size) - a == std::max_element(b, b + c.vocab_size) - b;
    }
    std::sort(err.begin(), err.end());
    std::printf(
        "osprey-arith FP8 vs F32 latent cache logits, %s: median %.2e, max %.2e; same argmax "
        "%d/%d\n",
        what, err[err.size() / 2], err.back(), same_argmax, n - from);
    EXPECT_LT(err[err.size() / 2], 0.05) << what;
    EXPECT_LT(err.back(), 0.25) << what;
    EXPECT_GT(err.back(), 1e-4) << what << ": the FP8 cache changed nothing: is it quantizing?";
    return same_argmax;
  };
  compare(random_tokens(75, c.vocab_size, 7), 0, "75 random tokens");

  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(dir);
  std::ifstream problems(std::string(OSPREY_TEST_DATA) + "/arith/test.jsonl");
  std::string line;
  for (int i = 0; i < 3 && std::getline(problems, line); ++i) {
    const std::string q = nlohmann::json::parse(line)["question"].get<std::string>();
    std::vector<int32_t> tokens =
        tok.encode("<｜begin▁of▁sentence｜><｜User｜>" + q + "<｜Assistant｜></think>");
    const int prompt = int(tokens.size());
    GreedyOptions g;
    g.max_new_tokens = 64;
    m->set_kv_cache_dtype(KvCacheDtype::Auto);
    const std::vector<int32_t> answer = greedy_generate(*m, tokens, g);
    m->set_kv_cache_dtype(KvCacheDtype::Fp8);
    EXPECT_EQ(greedy_generate(*m, tokens, g), answer) << q;
    ASSERT_GT(answer.size(), 8u) << q;
    tokens.insert(tokens.end(), answer.begin(), answer.end() - 1);
    const std::string what = "problem " + std::to_string(i) + "'s answer";
    // Position t predicts token t + 1: from the prompt's last token on, the answer's tokens.
    EXPECT_EQ(compare(tokens, prompt - 1, what.c_str()), int(tokens.size()) - prompt + 1) << q;
  }
  m->set_kv_cache_dtype(KvCacheDtype::Auto);
}

// mla_latent_bound_of (model/deepseek.h) is a true and tight bound on what the model's kv write
// puts in the latent cache: RMSNorm (the op the write applies) of a latent with one nonzero value,
// at the largest weight, reaches it up to the eps term; random latents stay below it; BF16 weights
// give the same bound, another dtype none (+inf). Loading a model registers it (ops/mla.h), which
// the FP8 decode's f16 variant reads.
TEST(LatentBound, BoundsTheNormalisedLatentAndIsReached) {
  const int64_t n = 512;
  Buffer w(DType::F32, {n});
  for (int64_t i = 0; i < n; ++i)
    w.f32()[i] = (i % 2 ? -1.0f : 1.0f) * (0.5f + 0.01f * float(i % 97));
  w.f32()[301] = -3.25f;
  const float bound = mla_latent_bound_of(n, {w.view()});
  EXPECT_FLOAT_EQ(bound, float(std::sqrt(512.0) * 3.25));

  Buffer x(DType::F32, {1, n}), out(DType::F32, {1, n});
  std::fill_n(x.f32(), n, 0.0f);
  x.f32()[301] = 1000.0f;
  ops::rms_norm(out, x, w, 1e-6f);
  EXPECT_LE(std::fabs(out.f32()[301]), bound);
  EXPECT_GT(std::fabs(out.f32()[301]), 0.999f * bound) << "the bound is not tight";

  const int64_t rows = 64;
  Buffer xr(DType::F32, {rows, n}), outr(DType::F32, {rows, n});
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t i = 0; i < rows * n; ++i) xr.f32()[i] = nd(rng);
  ops::rms_norm(outr, xr, w, 1e-6f);
  float seen = 0.0f;
  for (int64_t i = 0; i < rows * n; ++i) seen = std::max(seen, std::fabs(outr.f32()[i]));
  EXPECT_LE(seen, bound);
  EXPECT_GT(seen, 0.02f * bound);  // the rows were normalised, not zeroed

  Buffer wb(DType::BF16, {n});
  for (int64_t i = 0; i < n; ++i) wb.ptr<uint16_t>()[i] = f32_to_bf16(w.f32()[i]);
  EXPECT_FLOAT_EQ(mla_latent_bound_of(n, {w.view(), wb.view()}), bound);
  Buffer wh(DType::F16, {n});
  EXPECT_EQ(mla_latent_bound_of(n, {wh.view()}), INFINITY);
}

TEST(LatentBound, LoadingAModelRegistersIt) {
  ops::set_mla_latent_bound(0.0f);
  auto m = load_model_cpu(std::string(OSPREY_SOURCE_DIR) + "/models/osprey-arith");
  const float b = ops::mla_latent_bound();
  EXPECT_GT(b, 0.0f);
  EXPECT_TRUE(std::isfinite(b));
  EXPECT_LT(b, ops::kMlaF16LatentLimit) << "the bundled model's latent fits f16";
  ops::set_mla_latent_bound(0.0f);
}
