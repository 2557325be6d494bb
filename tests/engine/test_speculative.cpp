// MTP speculative decoding on the CPU with a tiny V3.2 model that has an MTP layer (made here by
// make_model, as `osprey make-model --preset v32-tiny --mtp` writes it):
//   - the MTP layer loads (F32/BF16 and FP8), a model without one is refused with a clear error;
//   - greedy output with MTP on is token for token the output with MTP off, for K = 1, 2, 3,
//     batched, chunked, preempted and prefix-cached; stop tokens, stop strings, max_tokens and
//     logprobs come out as without MTP;
//   - with an MTP layer built to guess what the main model predicts (a "trained-like" layer) most
//     drafts are accepted, and the output is still the same;
//   - sampled output keeps the target distribution (chi-square against the model's own
//     probabilities, with a negative control: the distribution an always-accepting verifier
//     would give);
//   - --speculative-config parsing errors; acceptance metrics.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/spec_verify.h"
#include "engine/speculative_config.h"
#include "model/greedy.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "ops/sample.h"

using namespace osprey;
namespace fs = std::filesystem;

namespace {

// A v32-tiny with an MTP layer written to a temporary folder (once per process).
std::string mtp_model_dir(bool fp8) {
  const std::string dir = (fs::temp_directory_path() /
                           ("osprey_test_mtp_" + std::to_string(::getpid()) + (fp8 ? "_fp8" : "")))
                              .string();
  // Removed when the test process ends.
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  };
  static Cleanup plain_dir, fp8_dir;
  (fp8 ? fp8_dir : plain_dir).dir = dir;
  if (!fs::exists(fs::path(dir) / "config.json")) {
    ModelConfig c = preset_config("v32-tiny");
    c.num_nextn_predict_layers = 1;
    MakeModelOptions o;
    o.seed = 1616;
    o.dtype = DType::F32;
    o.fp8 = fp8;
    make_model(c, dir, o);
  }
  return dir;
}

const DeepseekModel& model() {
  static std::unique_ptr<DeepseekModel> m = load_model_cpu(mtp_model_dir(false));
  return *m;
}

// The same weights, the MTP layer rebuilt to predict what the main model would predict from the
// next token alone, and the main layers' outputs damped so that this is nearly what the main
// model predicts: eh_proj = [I | 0] (the embedding half only), the MTP decoder layer's output
// projections zeroed (it adds nothing), enorm = 1, shared_head = the final norm and lm_head; the
// main layers' o_proj and down projections × kDamp.
const DeepseekModel& copy_model() {
  static std::unique_ptr<DeepseekModel> m = [] {
    constexpr float kDamp = 0.05f;
    const std::string dir = mtp_model_dir(false);
    const ModelConfig c = ModelConfig::from_file(dir);
    Checkpoint ck(dir);
    ModelWeights w = load_weights_cpu(ck, c);
    EXPECT_TRUE(w.has_mtp);
    const int64_t D = c.hidden_size;
    auto scale = [](const LinearWeight& l, float s) {
      for (int64_t i = 0; i < l.weight.numel(); ++i) l.weight.f32()[i] *= s;
    };
    auto damp_ffn = [&](const LayerWeights& lw, float s) {
      scale(lw.attn.o_proj, s);
      if (!lw.moe) return scale(lw.mlp.down, s);
      for (const MlpWeights& e : lw.experts) scale(e.down, s);
      if (lw.has_shared) scale(lw.shared.down, s);
    };
    for (int l = 0; l < c.num_hidden_layers; ++l) damp_ffn(w.layers[size_t(l)], kDamp);
    damp_ffn(w.layers[size_t(c.num_hidden_layers)], 0.0f);
    float* eh = w.mtp.eh_proj.weight.f32();  // [D, 2·D]
    for (int64_t r = 0; r < D; ++r)
      for (int64_t k = 0; k < 2 * D; ++k) eh[r * 2 * D + k] = k == r ? 1.0f : 0.0f;
    for (int64_t i = 0; i < D; ++i) {
      w.mtp.enorm.f32()[i] = 1.0f;
      w.mtp.head_norm.f32()[i] = w.final_norm.f32()[i];
    }
    std::copy_n(w.lm_head.weight.f32(), w.lm_head.weight.numel(), w.mtp.head.weight.f32());
    return std::make_unique<DeepseekModel>(c, std::move(w));
  }();
  return *m;
}

std::vector<int32_t> tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t(3 + rng() % 500));
  return t;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

SpeculativeConfig mtp(int k) {
  return SpeculativeConfig::parse(R"({"method": "mtp", "num_speculative_tokens": )" +
                                  std::to_string(k) + "}");
}

// Prompts of 1 token to several blocks; the last two share a 130-token prefix.
std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> p = {tokens(1, 1), tokens(7, 2), tokens(150, 3), tokens(64, 4)};
  for (uint32_t s : {5u, 6u}) {
    std::vector<int32_t> q(p[2].begin(), p[2].begin() + 130);
    const auto tail = tokens(10 + int(s), s);
    q.insert(q.end(), tail.begin(), tail.end());
    p.push_back(q);
  }
  return p;
}

struct Outcome {
  std::vector<Engine::Result> results;
  EngineStats stats;
  int64_t held_blocks = 0;
};

Outcome run(const DeepseekModel& m, EngineConfig cfg, const std::vector<std::vector<int32_t>>& ps,
            const std::vector<SamplingParams>& params, TextDecoderFactory decoders = {}) {
  Engine e(m, cfg, std::move(decoders));
  Outcome r;
  r.results = e.generate(ps, params);
  r.stats = e.stats();
  r.held_blocks = e.block_pool().n_held();
  return r;
}

void expect_same_tokens(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.results.size(), b.results.size());
  for (size_t i = 0; i < a.results.size(); ++i) {
    EXPECT_EQ(a.results[i].tokens, b.results[i].tokens) << "prompt " << i;
    EXPECT_EQ(a.results[i].finish_reason, b.results[i].finish_reason) << "prompt " << i;
    EXPECT_EQ(a.results[i].text, b.results[i].text) << "prompt " << i;
  }
}

// Each token's text is " <id>" (so stop strings can span tokens).
std::string spaced(int32_t t) {
  std::string s = " ";
  s += std::to_string(t);
  return s;
}
class IdDecoder : public TextDecoder {
 public:
  std::string push(int32_t t) override { return spaced(t); }
  std::string finish() override { return ""; }
};
TextDecoderFactory id_decoders() {
  return [](bool) { return std::make_unique<IdDecoder>(); };
}

}  // namespace

// ---- configuration --------------------------------------------------------------------------

TEST(SpeculativeConfigParse, AcceptsVllmSpellings) {
  const SpeculativeConfig c = mtp(2);
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.method, "mtp");
  EXPECT_EQ(c.num_speculative_tokens, 2);
  EXPECT_EQ(SpeculativeConfig::parse(R"({"method":"deepseek_mtp","num_speculative_tokens":3})")
                .num_speculative_tokens,
            3);
  EXPECT_FALSE(SpeculativeConfig::parse("").enabled());
}

TEST(SpeculativeConfigParse, RefusesEachBadValueSayingWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{method: mtp}", "not valid JSON"},
      {"[1, 2]", "must be a JSON object"},
      {R"({"num_speculative_tokens": 1})", "needs \"method\""},
      {R"({"method": 1, "num_speculative_tokens": 1})", "must be a string"},
      {R"({"method": "ngram", "num_speculative_tokens": 1})", "'ngram' is not supported"},
      {R"({"method": "mtp"})", "needs \"num_speculative_tokens\""},
      {R"({"method": "mtp", "num_speculative_tokens": "2"})", "must be an integer"},
      {R"({"method": "mtp", "num_speculative_tokens": 1.5})", "must be an integer"},
      {R"({"method": "mtp", "num_speculative_tokens": 0})", "must be in [1, 3], got 0"},
      {R"({"method": "mtp", "num_speculative_tokens": 4})", "must be in [1, 3], got 4"},
      {R"({"method": "mtp", "num_speculative_tokens": 1, "model": "x"})", "unknown key 'model'"},
  };
  for (const auto& [text, why] : cases) {
    try {
      SpeculativeConfig::parse(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos)
          << text << " → " << e.what() << " (expected '" << why << "')";
    }
  }
}

TEST(SpeculativeConfigParse, AModelWithoutAnMtpLayerIsRefused) {
  auto plain = load_model_cpu(std::string(OSPREY_TEST_DATA) + "/models/v32-tiny");
  EngineConfig cfg;
  cfg.speculative = mtp(1);
  try {
    Engine e(*plain, cfg);
    ADD_FAILURE() << "an engine with MTP on a model without the layer was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no MTP layer"), std::string::npos) << e.what();
  }
}

// ---- the verify rule ------------------------------------------------------------------------

TEST(VerifyDrafts, EmitsTheMatchingPrefixAndTheTokenAfterIt) {
  using V = std::vector<int32_t>;
  EXPECT_EQ(verify_drafts(V{}, V{7}), V({7}));
  EXPECT_EQ(verify_drafts(V{5, 6, 7}, V{5, 6, 7, 8}), V({5, 6, 7, 8}));  // all + bonus
  EXPECT_EQ(verify_drafts(V{5, 6, 7}, V{5, 9, 7, 8}), V({5, 9}));        // stops at the miss
  EXPECT_EQ(verify_drafts(V{5, 6, 7}, V{4, 6, 7, 8}), V({4}));
}

// ---- loading --------------------------------------------------------------------------------

TEST(MtpLayer, LoadsWithItsShapesAndWritesItsOwnCacheLayer) {
  const DeepseekModel& m = model();
  const ModelConfig& c = m.config();
  ASSERT_TRUE(m.has_mtp());
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  // The MTP layer's cache adds one layer's bytes to a block.
  EXPECT_EQ(m.kv_bytes_per_block(true) * c.num_hidden_layers,
            m.kv_bytes_per_block(false) * (c.num_hidden_layers + 1));
  PagedKVCache cache = m.make_cache(4, true);
  EXPECT_EQ(cache.n_layers(), c.num_hidden_layers + 1);
  // The layer's weights are in the checkpoint under the published names.
  Checkpoint ck(mtp_model_dir(false));
  const std::string p = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  for (const char* n : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                        "shared_head.head.weight", "self_attn.indexer.wk.weight", "mlp.gate.weight",
                        "mlp.experts.0.down_proj.weight"})
    EXPECT_TRUE(ck.contains(p + n)) << p << n;
  EXPECT_EQ(ck.get(p + "eh_proj.weight").shape, Shape({c.hidden_size, 2 * c.hidden_size}));
}

TEST(MtpLayer, Fp8CheckpointLoadsAndDraftsLikeItsSource) {
  // FP8 as published: the decoder layer's linear weights e4m3 with block scales, eh_proj and
  // shared_head.head unquantized.
  const std::string dir = mtp_model_dir(true);
  Checkpoint ck(dir);
  const ModelConfig c = ModelConfig::from_file(dir);
  const std::string p = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  EXPECT_EQ(ck.get(p + "self_attn.kv_b_proj.weight").dtype, DType::F8_E4M3);
  EXPECT_TRUE(ck.contains(p + "self_attn.kv_b_proj.weight_scale_inv"));
  EXPECT_NE(ck.get(p + "eh_proj.weight").dtype, DType::F8_E4M3);
  auto m = load_model_cpu(dir);
  ASSERT_TRUE(m->has_mtp());
  // Greedy identity holds for the FP8 model too.
  EngineConfig cfg;
  const auto ps = prompts();
  const std::vector<SamplingParams> params(ps.size(), greedy(10));
  const Outcome off = run(*m, cfg, ps, params);
  cfg.speculative = mtp(2);
  const Outcome on = run(*m, cfg, ps, params);
  expect_same_tokens(off, on);
  EXPECT_GT(on.stats.spec_draft_tokens, 0);
}

TEST(MtpLayer, ForwardMtpPredictsFromTheNextTokenAndTheHiddenState) {
  // The MTP logits at position p depend on the hidden state at p and the token at p + 1: a
  // different next token changes them, and they match between a batch of two positions and the
  // positions run one after the other (the cache layer is read back correctly).
  const DeepseekModel& m = model();
  const int64_t D = m.config().hidden_size, V = m.config().vocab_size;
  PagedKVCache cache = m.make_cache(1, true);
  const std::vector<int32_t> prompt = tokens(3, 9);
  OwnedBatch main({SeqStep{prompt, 0, {0}, true}}, kBlockSize);
  Buffer logits(DType::F32, {3, V}), hidden(DType::F32, {3, D});
  ForwardOptions fo;
  fo.hidden_out = hidden.view();
  m.forward(main.batch(), cache, logits.view(), fo);
  auto mtp_logits = [&](std::vector<int32_t> next, int start, Tensor h) {
    OwnedBatch b({SeqStep{next, start, {0}, true}}, kBlockSize);
    Buffer out(DType::F32, {int64_t(next.size()), V});
    m.forward_mtp(b.batch(), h, cache, out.view(), Tensor{});
    return out;
  };
  const Buffer both = mtp_logits({prompt[1], prompt[2]}, 0, hidden.view().rows(0, 2));
  const Buffer first = mtp_logits({prompt[1]}, 0, hidden.view().rows(0, 1));
  const Buffer second = mtp_logits({prompt[2]}, 1, hidden.view().rows(1, 2));
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_NEAR(both.f32()[v], first.f32()[v], 1e-4);
    EXPECT_NEAR(both.f32()[V + v], second.f32()[v], 1e-4);
  }
  const Buffer other = mtp_logits({int32_t((prompt[2] + 1) % V)}, 1, hidden.view().rows(1, 2));
  double diff = 0;
  for (int64_t v = 0; v < V; ++v)
    diff = std::max(diff, double(std::fabs(other.f32()[v] - second.f32()[v])));
  EXPECT_GT(diff, 1e-2);
}

// ---- greedy identity ------------------------------------------------------------------------

class GreedyIdentity : public ::testing::TestWithParam<int> {};

TEST_P(GreedyIdentity, TokensAreTheSameAsWithoutMtp) {
  const int k = GetParam();
  const auto ps = prompts();
  const std::vector<SamplingParams> params(ps.size(), greedy(24));
  EngineConfig cfg;
  const Outcome off = run(model(), cfg, ps, params);
  cfg.speculative = mtp(k);
  const Outcome on = run(model(), cfg, ps, params);
  expect_same_tokens(off, on);
  // Each prompt alone, outside the engine, too.
  for (size_t i = 0; i < ps.size(); ++i) {
    GreedyOptions o;
    o.max_new_tokens = 24;
    o.stop_at_eos = false;
    EXPECT_EQ(on.results[i].tokens, greedy_generate(model(), ps[i], o)) << "prompt " << i;
  }
  EXPECT_EQ(on.held_blocks, 0) << "leaked blocks";
  // Every decode after the first token verified drafts: up to k per step.
  const EngineStats& s = on.stats;
  EXPECT_GT(s.spec_verifies, 0);
  EXPECT_GE(s.spec_draft_tokens, s.spec_verifies);
  EXPECT_LE(s.spec_draft_tokens, int64_t(k) * s.spec_verifies);
  EXPECT_LE(s.spec_accepted_tokens, s.spec_draft_tokens);
  EXPECT_EQ(s.generation_tokens_total, off.stats.generation_tokens_total);
  // Fewer steps exactly by the accepted drafts of sequences that ran alone... at least never more.
  EXPECT_LE(s.steps, off.stats.steps);
  EXPECT_EQ(off.stats.spec_draft_tokens, 0);
}

TEST_P(GreedyIdentity, TrainedLikeMtpIsMostlyAcceptedAndChangesNothing) {
  const int k = GetParam();
  const auto ps = prompts();
  const std::vector<SamplingParams> params(ps.size(), greedy(24));
  EngineConfig cfg;
  const Outcome off = run(copy_model(), cfg, ps, params);
  cfg.speculative = mtp(k);
  const Outcome on = run(copy_model(), cfg, ps, params);
  expect_same_tokens(off, on);
  const EngineStats& s = on.stats;
  const double rate = double(s.spec_accepted_tokens) / double(s.spec_draft_tokens);
  EXPECT_GT(rate, 0.5) << s.spec_accepted_tokens << " of " << s.spec_draft_tokens;
  // Accepted drafts are tokens that took no step of their own.
  EXPECT_LT(s.steps, off.stats.steps);
  std::printf("K=%d: acceptance %.3f, mean accepted length %.2f, steps %lld vs %lld\n", k, rate,
              1.0 + double(s.spec_accepted_tokens) / double(s.spec_verifies), (long long)s.steps,
              (long long)off.stats.steps);
}

INSTANTIATE_TEST_SUITE_P(K, GreedyIdentity, ::testing::Values(1, 2, 3));

// ---- rollback: chunked prefill, preemption, prefix caching ----------------------------------

TEST(SpeculativeRollback, ChunkedPreemptedAndPrefixCachedRunsMatch) {
  const auto ps = prompts();
  const std::vector<SamplingParams> params(ps.size(), greedy(40));
  for (const DeepseekModel* m : {&model(), &copy_model()}) {
    EngineConfig base;
    const Outcome ref = run(*m, base, ps, params);
    EngineConfig cfg;
    cfg.speculative = mtp(3);
    cfg.max_num_batched_tokens = 48;  // prompts prefilled in chunks; drafts squeezed by the budget
    cfg.num_blocks = 6;               // too few for all: preemption by recompute
    cfg.max_num_seqs = 4;
    cfg.max_model_len = 256;
    const Outcome on = run(*m, cfg, ps, params);
    expect_same_tokens(ref, on);
    EXPECT_GT(on.stats.num_preemptions, 0);
    EXPECT_GT(on.stats.prefix_hit_tokens, 0);
    EXPECT_EQ(on.held_blocks, 0);
  }
}

TEST(SpeculativeRollback, RejectedPositionsAreRewrittenBeforeTheyAreRead) {
  // The random MTP layer's drafts are nearly always rejected, so every verify leaves stale cache
  // entries behind num_computed; a second request that reuses the first one's cached prefix
  // (full blocks only, registered after rollback) must still decode exactly.
  const std::vector<int32_t> prompt = tokens(60, 77);
  EngineConfig cfg;
  cfg.speculative = mtp(3);
  Engine e(model(), cfg);
  const auto first = e.generate({prompt}, {greedy(70)})[0].tokens;  // crosses two block edges
  EXPECT_GT(e.stats().spec_draft_tokens, e.stats().spec_accepted_tokens);
  std::vector<int32_t> again = prompt;
  again.insert(again.end(), first.begin(), first.begin() + 66);  // 126 tokens: 1 cached block
  const auto second = e.generate({again}, {greedy(8)})[0].tokens;
  EXPECT_GT(e.stats().prefix_hit_tokens, 0);
  GreedyOptions o;
  o.max_new_tokens = 8;
  o.stop_at_eos = false;
  EXPECT_EQ(second, greedy_generate(model(), again, o));
  EXPECT_EQ(std::vector<int32_t>(first.begin() + 66, first.begin() + 70),
            std::vector<int32_t>(second.begin(), second.begin() + 4));
}

// ---- stop conditions and logprobs -----------------------------------------------------------

TEST(SpeculativeStops, StopTokensStopStringsAndMaxTokensCutWhereTheyWouldWithoutMtp) {
  const auto ps = prompts();
  EngineConfig base;
  const Outcome free_run =
      run(copy_model(), base, ps, std::vector<SamplingParams>(ps.size(), greedy(30)));
  std::vector<SamplingParams> params;
  for (size_t i = 0; i < ps.size(); ++i) {
    SamplingParams p = greedy(int(7 + i));  // max_tokens not a multiple of K + 1
    const auto& t = free_run.results[i].tokens;
    if (i % 3 == 0) p.stop_token_ids = {t[5]};                     // a stop id
    if (i % 3 == 1) p.stop = {spaced(t[3]).append(spaced(t[4]))};  // a string
    if (i % 3 == 2) {  // EOS counts (ignore_eos off) when the model's EOS is the stop token
      p.ignore_eos = false;
      p.stop_token_ids = {t[2], t[6]};
    }
    params.push_back(p);
  }
  const Outcome off = run(copy_model(), base, ps, params, id_decoders());
  for (int k = 1; k <= 3; ++k) {
    EngineConfig cfg;
    cfg.speculative = mtp(k);
    const Outcome on = run(copy_model(), cfg, ps, params, id_decoders());
    expect_same_tokens(off, on);
    EXPECT_GT(on.stats.spec_accepted_tokens, 0);
  }
  int stopped = 0;
  for (const auto& r : off.results) stopped += r.finish_reason == FinishReason::Stop;
  EXPECT_GE(stopped, 4);  // the stops did cut (the test is not only about max_tokens)
}

TEST(SpeculativeStops, LogprobsAreThoseOfThePlainRun) {
  const auto ps = prompts();
  SamplingParams p = greedy(12);
  p.logprobs = 3;
  auto collect = [&](const EngineConfig& cfg) {
    Engine e(copy_model(), cfg);
    std::map<uint64_t, std::vector<TokenLogprob>> lp;
    for (size_t i = 0; i < ps.size(); ++i) e.add_request(i, ps[i], p);
    while (e.has_unfinished())
      for (RequestOutput& o : e.step()) {
        EXPECT_EQ(o.logprobs.size(), o.new_tokens.size());
        lp[o.id].insert(lp[o.id].end(), o.logprobs.begin(), o.logprobs.end());
      }
    return lp;
  };
  EngineConfig base;
  const auto off = collect(base);
  EngineConfig cfg;
  cfg.speculative = mtp(3);
  const auto on = collect(cfg);
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(on.at(i).size(), off.at(i).size());
    for (size_t j = 0; j < off.at(i).size(); ++j) {
      EXPECT_EQ(on.at(i)[j].token, off.at(i)[j].token);
      EXPECT_NEAR(on.at(i)[j].logprob, off.at(i)[j].logprob, 1e-4);
      ASSERT_EQ(on.at(i)[j].top.size(), 3u);
      for (size_t a = 0; a < 3; ++a) {
        EXPECT_EQ(on.at(i)[j].top[a].first, off.at(i)[j].top[a].first);
        EXPECT_NEAR(on.at(i)[j].top[a].second, off.at(i)[j].top[a].second, 1e-4);
      }
    }
  }
}

// ---- sampling: the output distribution is the target's -------------------------------------

namespace {

// Upper 0.1% point of chi-square with df degrees of freedom (Wilson–Hilferty).
double chi2_critical_001(int df) {
  const double z = 3.090232;
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Probabilities of the sampler's steps 5–7 at temperature `t` and top-k `k` over raw logits.
std::vector<double> target_probs(const float* logits, int vocab, float t, int k) {
  std::vector<int> idx(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) idx[size_t(i)] = i;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> p(static_cast<size_t>(vocab), 0.0);
  const double m = logits[idx[0]] / t;
  double z = 0;
  for (int i = 0; i < k; ++i) z += std::exp(logits[idx[size_t(i)]] / t - m);
  for (int i = 0; i < k; ++i)
    p[size_t(idx[size_t(i)])] = std::exp(logits[idx[size_t(i)]] / t - m) / z;
  return p;
}

}  // namespace

TEST(SpeculativeSampling, ThreeTokenDistributionIsTheTargetsWithANegativeControl) {
  // Requests of one prompt, temperature 0.8, top-k 3, 3 new tokens (a, b, c), many seeds, K = 1
  // with the trained-like MTP layer: b is verified against a draft that is often but not always
  // the sampled token, and c comes from the verify's second row when the draft was accepted, else
  // from the next step; both branches run. Expected joint probabilities P(a) P(b | a) P(c | a, b)
  // come from the model's own logits.
  const DeepseekModel& m = copy_model();
  const int V = m.config().vocab_size;
  constexpr float kTemp = 0.8f;
  constexpr int kTopK = 3, kSamples = 4000;
  const std::vector<int32_t> prompt = tokens(9, 4242);
  auto next_probs = [&](const std::vector<int32_t>& ctx) {
    const Buffer l = prefill_logits(m, ctx);
    return target_probs(l.f32() + int64_t(ctx.size() - 1) * V, V, kTemp, kTopK);
  };
  using Cell = std::array<int, 3>;
  std::map<Cell, double> expected;
  std::map<Cell, double> accept_all;  // the negative control (below)
  const std::vector<double> p1 = next_probs(prompt);
  for (int a = 0; a < V; ++a) {
    if (p1[size_t(a)] == 0) continue;
    std::vector<int32_t> ca = prompt;
    ca.push_back(a);
    const std::vector<double> p2 = next_probs(ca);
    const int best_b = int(std::max_element(p2.begin(), p2.end()) - p2.begin());
    for (int b = 0; b < V; ++b) {
      if (p2[size_t(b)] == 0) continue;
      std::vector<int32_t> cab = ca;
      cab.push_back(b);
      const std::vector<double> p3 = next_probs(cab);
      for (int c = 0; c < V; ++c) {
        if (p3[size_t(c)] == 0) continue;
        expected[{a, b, c}] = p1[size_t(a)] * p2[size_t(b)] * p3[size_t(c)];
        // A verifier that always accepted the draft would emit the draft as b; the trained-like
        // MTP drafts the target's argmax, so that distribution puts P(a) on b = argmax P(b | a).
        if (b == best_b) accept_all[{a, b, c}] = p1[size_t(a)] * p3[size_t(c)];
      }
    }
  }
  ASSERT_EQ(expected.size(), size_t(kTopK * kTopK * kTopK));

  auto sample = [&](bool speculative) {
    EngineConfig cfg;
    cfg.max_num_seqs = 64;
    if (speculative) cfg.speculative = mtp(1);
    std::vector<std::vector<int32_t>> ps(kSamples, prompt);
    std::vector<SamplingParams> params(kSamples);
    for (int i = 0; i < kSamples; ++i) {
      params[size_t(i)].temperature = kTemp;
      params[size_t(i)].top_k = kTopK;
      params[size_t(i)].max_tokens = 3;
      params[size_t(i)].ignore_eos = true;
      params[size_t(i)].seed = uint64_t(1000 + i);
    }
    return run(m, cfg, ps, params);
  };
  const Outcome spec = sample(true), plain = sample(false);
  std::map<Cell, int> counts;
  int same = 0;
  for (int i = 0; i < kSamples; ++i) {
    const auto& t = spec.results[size_t(i)].tokens;
    ASSERT_EQ(t.size(), 3u);
    ++counts[{t[0], t[1], t[2]}];
    same += t == plain.results[size_t(i)].tokens;
  }
  // Both verify branches ran.
  EXPECT_GT(spec.stats.spec_accepted_tokens, kSamples / 10);
  EXPECT_LT(spec.stats.spec_accepted_tokens, spec.stats.spec_draft_tokens - kSamples / 10);
  auto chi2 = [&](const std::map<Cell, double>& probs, int* impossible) {
    double stat = 0;
    *impossible = 0;
    for (const auto& [cell, n] : counts)
      if (!probs.count(cell)) *impossible += n;
    for (const auto& [cell, p] : probs) {
      const double e = p * kSamples;
      const double o = counts.count(cell) ? counts.at(cell) : 0;
      stat += (o - e) * (o - e) / e;
    }
    return stat;
  };
  int impossible = 0;
  const double fit = chi2(expected, &impossible);
  EXPECT_EQ(impossible, 0);
  EXPECT_LT(fit, chi2_critical_001(int(expected.size()) - 1));
  int control_impossible = 0;
  const double control = chi2(accept_all, &control_impossible);
  EXPECT_GT(control_impossible, kSamples / 10);  // samples the always-accepting rule never gives
  EXPECT_GT(control, 10 * chi2_critical_001(int(accept_all.size()) - 1));
  std::printf("fit %.1f (critical %.1f), control %.1f with %d impossible; %d of %d as plain\n", fit,
              chi2_critical_001(int(expected.size()) - 1), control, control_impossible, same,
              kSamples);
  // Row j uses the uniform plain decoding uses at that output position: seeded requests come out
  // the same with and without MTP (up to rounding at a bin edge).
  EXPECT_GE(same, kSamples * 99 / 100) << same << " of " << kSamples;
}

// ---- metrics --------------------------------------------------------------------------------

TEST(SpeculativeMetrics, CountersAddUpOverSteps) {
  const auto ps = prompts();
  EngineConfig cfg;
  cfg.speculative = mtp(2);
  Engine e(copy_model(), cfg);
  for (size_t i = 0; i < ps.size(); ++i) e.add_request(i, ps[i], greedy(16));
  int64_t tokens_out = 0, steps = 0;
  while (e.has_unfinished()) {
    const EngineStats before = e.stats();
    for (const RequestOutput& o : e.step()) tokens_out += int64_t(o.new_tokens.size());
    ++steps;
    const EngineStats after = e.stats();
    // A step's drafts: at most 2 per running decode; accepted ≤ verified.
    EXPECT_LE(after.spec_draft_tokens - before.spec_draft_tokens,
              2 * (after.spec_verifies - before.spec_verifies));
    EXPECT_LE(after.spec_accepted_tokens - before.spec_accepted_tokens,
              after.spec_draft_tokens - before.spec_draft_tokens);
  }
  const EngineStats s = e.stats();
  EXPECT_EQ(tokens_out, int64_t(ps.size()) * 16);
  EXPECT_EQ(s.generation_tokens_total, tokens_out);
  EXPECT_EQ(s.steps, steps);
  EXPECT_GT(s.spec_accepted_tokens, 0);
  // Tokens out = one per sampled row that was not a rejected draft: every verify emits its
  // accepted drafts + 1, every plain decode or prompt end 1.
  const int64_t plain_samples = tokens_out - s.spec_verifies - s.spec_accepted_tokens;
  EXPECT_GE(plain_samples, int64_t(ps.size()));  // at least each prompt's first token
}

// Async scheduling does not overlap MTP steps (the drafts of step N+1 need step N's tokens on the
// host): the engine runs them synchronously, with the same tokens as the overlapped loop without
// MTP (GreedyIdentity compares the two).
TEST(SpeculativeAsync, AsyncSchedulingFallsBackToTheSynchronousLoop) {
  EngineConfig cfg;
  ASSERT_TRUE(cfg.async_scheduling);
  EXPECT_TRUE(Engine(model(), cfg).async_scheduling());
  cfg.speculative = mtp(2);
  EXPECT_FALSE(Engine(model(), cfg).async_scheduling());
}
