// The engine end to end on the CPU with a tiny V3.2 model: batched, chunked, preempted and
// prefix-cached runs give exactly the tokens each prompt gives alone; nothing leaks; bad requests
// are refused without disturbing the others; seeds, stop strings, abort and the async API work.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "engine/async_engine.h"
#include "engine/engine.h"
#include "model/greedy.h"

using namespace osprey;

namespace {

const DeepseekModel& model() {
  static std::unique_ptr<DeepseekModel> m =
      load_model_cpu(std::string(OSPREY_TEST_DATA) + "/models/v32-tiny");
  return *m;
}
// The same model with the FP8 latent cache (--kv-cache-dtype fp8).
const DeepseekModel& fp8_model() {
  static std::unique_ptr<DeepseekModel> m = [] {
    auto p = load_model_cpu(std::string(OSPREY_TEST_DATA) + "/models/v32-tiny");
    p->set_kv_cache_dtype(KvCacheDtype::Fp8);
    return p;
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

// Prompts of 1 to several blocks; 3 and 4 share a 130-token prefix with 2.
std::vector<std::vector<int32_t>> mixed_prompts() {
  std::vector<std::vector<int32_t>> p = {tokens(1, 1), tokens(7, 2), tokens(150, 3), tokens(64, 4)};
  std::vector<int32_t> shared = p[2];
  shared.resize(130);
  for (uint32_t s : {5u, 6u}) {
    auto q = shared;
    auto tail = tokens(20 + int(s), s);
    q.insert(q.end(), tail.begin(), tail.end());
    p.push_back(q);
  }
  return p;
}

std::vector<int32_t> alone(const std::vector<int32_t>& prompt, int n,
                           const DeepseekModel& m = model()) {
  GreedyOptions o;
  o.max_new_tokens = n;
  o.stop_at_eos = false;
  return greedy_generate(m, prompt, o);
}

void expect_matches_alone(const EngineConfig& cfg, const DeepseekModel& m = model()) {
  Engine e(m, cfg);
  const auto prompts = mixed_prompts();
  std::vector<SamplingParams> params(prompts.size(), greedy(12));
  const auto results = e.generate(prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(results[i].tokens, alone(prompts[i], 12, m)) << "prompt " << i;
  EXPECT_EQ(e.block_pool().n_held(), 0) << "leaked blocks";
  EXPECT_FALSE(e.has_unfinished());
}

}  // namespace

// The server's default token budget is vLLM's: 8192 on a GPU of 70 GiB or more other than an
// A100, 2048 on smaller GPUs, on A100s of any size and on the CPU.
TEST(Engine, ServerDefaultTokenBudgetIsVllms) {
  const size_t GiB = size_t(1) << 30;
  EXPECT_EQ(server_default_max_num_batched_tokens(true, 141 * GiB, "NVIDIA H200"), 8192);
  EXPECT_EQ(server_default_max_num_batched_tokens(true, 79 * GiB, "NVIDIA H100 80GB HBM3"), 8192);
  EXPECT_EQ(server_default_max_num_batched_tokens(true, 70 * GiB, "NVIDIA H100"), 8192);
  EXPECT_EQ(server_default_max_num_batched_tokens(true, 70 * GiB - 1, "NVIDIA H100"), 2048);
  EXPECT_EQ(server_default_max_num_batched_tokens(true, 80 * GiB, "NVIDIA A100-SXM4-80GB"), 2048);
  EXPECT_EQ(server_default_max_num_batched_tokens(true, 24 * GiB, "NVIDIA L4"), 2048);
  EXPECT_EQ(server_default_max_num_batched_tokens(false, 0, ""), 2048);
}

TEST(Engine, MixedBatchMatchesEachPromptAlone) {
  EngineConfig cfg;
  cfg.num_blocks = 64;
  cfg.max_model_len = 512;
  expect_matches_alone(cfg);
}

TEST(Engine, SmallChunksMatch) {
  EngineConfig cfg;
  cfg.num_blocks = 64;
  cfg.max_model_len = 512;
  cfg.max_num_batched_tokens = 13;  // prompts prefilled in many chunks, beside decodes
  expect_matches_alone(cfg);
}

// The step-time token budget: prompt chunks sized by the predicted step time (a target tight enough
// to cut chunks beside decodes) give every prompt its own greedy tokens, and the step records
// name each step's kind and shape.
TEST(Engine, StepTimeBudgetMatchesAloneAndRecordsSteps) {
  EngineConfig cfg;
  cfg.num_blocks = 64;
  cfg.max_model_len = 512;
  cfg.token_budget_policy = TokenBudgetPolicy::StepTime;
  cfg.target_step_ms = 1e-3;  // below any step: chunks of one block beside decodes
  expect_matches_alone(cfg);

  // The record of each step() call's own step: the synchronous loop (with async scheduling a
  // step is recorded by the call after it: test_async_scheduling.cpp).
  cfg.async_scheduling = false;
  Engine e(model(), cfg);
  e.add_request(1, tokens(40, 7), greedy(4));
  e.step();  // prefill alone: the whole prompt (nothing waits on it)
  EngineStats s = e.stats();
  EXPECT_EQ(s.last_step.kind, StepKind::Prefill);
  EXPECT_EQ(s.last_step.prefill_tokens, 40);
  EXPECT_EQ(s.last_step.num_decodes, 0);
  EXPECT_GT(s.last_step.seconds, 0);
  EXPECT_GT(s.last_step.predicted_seconds, 0);
  e.add_request(2, tokens(200, 8), greedy(4));
  e.step();  // request 1 decodes beside one block of request 2's prompt
  s = e.stats();
  EXPECT_EQ(s.last_step.kind, StepKind::Mixed);
  EXPECT_EQ(s.last_step.num_decodes, 1);
  EXPECT_EQ(s.last_step.decode_context_tokens, 41);
  EXPECT_EQ(s.last_step.prefill_tokens, kBlockSize);
  EXPECT_EQ(s.last_step.prefill_start_tokens, 0);
  e.step();
  s = e.stats();
  EXPECT_EQ(s.last_step.prefill_start_tokens, kBlockSize);
  EXPECT_EQ(e.step_time_model().calibrations(), 3);
  while (e.has_unfinished()) e.step();
  EXPECT_EQ(e.block_pool().n_held(), 0);
  EXPECT_EQ(s.steps, 3);
}

// The FP8 latent cache: batched and chunked runs still give each prompt's own greedy tokens (the
// quantization of a token does not depend on its batch), and the same KV memory holds more blocks.
TEST(Engine, Fp8LatentCacheMatchesAloneAndHoldsMoreBlocks) {
  EngineConfig cfg;
  cfg.num_blocks = 64;
  cfg.max_model_len = 512;
  cfg.max_num_batched_tokens = 29;
  expect_matches_alone(cfg, fp8_model());

  EngineConfig by_bytes;
  by_bytes.max_model_len = 512;
  by_bytes.kv_cache_bytes = int64_t(64) << 20;
  const ModelConfig& c = model().config();
  const int64_t f32_blocks = Engine(model(), by_bytes).stats().kv_blocks_total;
  const int64_t fp8_blocks = Engine(fp8_model(), by_bytes).stats().kv_blocks_total;
  // CPU: the F32 latent row is 4·(kv_lora + rope) bytes, the FP8 one kv_lora + kv_lora/32 + 2·rope.
  const int64_t index = c.index_head_dim * 4;
  const int64_t per_block_f32 =
      (4 * (c.kv_lora_rank + c.qk_rope_head_dim) + index) * kBlockSize * c.num_hidden_layers;
  const int64_t per_block_fp8 =
      (c.kv_lora_rank + c.kv_lora_rank / 32 + 2 * c.qk_rope_head_dim + index) * kBlockSize *
      c.num_hidden_layers;
  EXPECT_EQ(f32_blocks, by_bytes.kv_cache_bytes / per_block_f32);
  EXPECT_EQ(fp8_blocks, by_bytes.kv_cache_bytes / per_block_fp8);
  EXPECT_GT(fp8_blocks, 2 * f32_blocks);
}

TEST(Engine, PreemptionMatches) {
  EngineConfig cfg;
  // Six prompts just under one block each: all are admitted (6 of 8 blocks), then each needs a
  // second block a few tokens later and only two are left, so some must be preempted.
  cfg.num_blocks = 8;
  cfg.max_model_len = 256;
  cfg.max_num_batched_tokens = 512;
  Engine e(model(), cfg);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(tokens(57 + i, 40 + uint32_t(i)));
  std::vector<SamplingParams> params(prompts.size(), greedy(12));
  const auto results = e.generate(prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(results[i].tokens, alone(prompts[i], 12)) << "prompt " << i;
  EXPECT_GT(e.stats().num_preemptions, 0) << "the test did not force a preemption";
  EXPECT_EQ(e.block_pool().n_held(), 0);
}

TEST(Engine, PrefixHitGivesTheColdLogits) {
  EngineConfig cfg;
  cfg.num_blocks = 32;
  cfg.max_model_len = 512;
  Engine e(model(), cfg);
  const auto prompt = tokens(140, 9);
  SamplingParams p = greedy(4);
  p.logprobs = 20;
  e.add_request(1, prompt, p);
  std::vector<RequestOutput> cold, warm;
  while (e.has_unfinished())
    for (auto& o : e.step()) cold.push_back(o);
  e.add_request(2, prompt, p);
  while (e.has_unfinished())
    for (auto& o : e.step()) warm.push_back(o);
  ASSERT_EQ(warm.back().cached_tokens, 128);  // two full blocks reused
  EXPECT_EQ(cold.back().cached_tokens, 0);
  std::vector<TokenLogprob> lc, lw;
  for (auto& o : cold) lc.insert(lc.end(), o.logprobs.begin(), o.logprobs.end());
  for (auto& o : warm) lw.insert(lw.end(), o.logprobs.begin(), o.logprobs.end());
  ASSERT_EQ(lc.size(), 4u);
  ASSERT_EQ(lw.size(), 4u);
  for (size_t i = 0; i < lc.size(); ++i) {
    EXPECT_EQ(lc[i].token, lw[i].token);
    ASSERT_EQ(lc[i].top.size(), 20u);
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(lc[i].top[k].first, lw[i].top[k].first);
      EXPECT_NEAR(lc[i].top[k].second, lw[i].top[k].second, 1e-4);
    }
  }
  EXPECT_EQ(e.block_pool().n_held(), 0);
  EXPECT_GT(e.stats().prefix_hit_tokens, 0);
}

TEST(Engine, RefusesBadRequestsWithoutHarmingOthers) {
  EngineConfig cfg;
  cfg.num_blocks = 32;
  cfg.max_model_len = 200;
  Engine e(model(), cfg);
  const auto good = tokens(20, 3);
  e.add_request(1, good, greedy(6));
  try {
    e.add_request(2, tokens(200, 4), greedy(4));
    FAIL() << "an oversize prompt was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("200 tokens"), std::string::npos) << err.what();
  }
  SamplingParams bad = greedy(4);
  bad.temperature = -1;
  EXPECT_THROW(e.add_request(3, good, bad), Error);
  EXPECT_THROW(e.add_request(4, {}, greedy(4)), Error);
  EXPECT_THROW(e.add_request(5, {1, 999999}, greedy(4)), Error);
  EXPECT_THROW(e.add_request(1, good, greedy(4)), Error);  // id in use
  std::vector<int32_t> got;
  while (e.has_unfinished())
    for (auto& o : e.step()) got.insert(got.end(), o.new_tokens.begin(), o.new_tokens.end());
  EXPECT_EQ(got, alone(good, 6));
  EXPECT_EQ(e.block_pool().n_held(), 0);
}

TEST(Engine, SeededSamplingIsTheSameInAnyBatch) {
  EngineConfig cfg;
  cfg.num_blocks = 64;
  cfg.max_model_len = 512;
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.max_tokens = 10;
  p.ignore_eos = true;
  p.seed = 1234;
  const auto prompt = tokens(30, 8);
  Engine solo(model(), cfg);
  const auto a = solo.generate({prompt}, {p})[0].tokens;
  Engine batch(model(), cfg);
  auto others = mixed_prompts();
  std::vector<SamplingParams> ps(others.size(), p);
  for (size_t i = 0; i < ps.size(); ++i) ps[i].seed = 99 + i;
  others.insert(others.begin() + 2, prompt);
  ps.insert(ps.begin() + 2, p);
  const auto b = batch.generate(others, ps)[2].tokens;
  EXPECT_EQ(a, b);
  p.seed = 4321;
  Engine other(model(), cfg);
  EXPECT_NE(other.generate({prompt}, {p})[0].tokens, a);
}

namespace {
// Token t decodes to the letter 'a' + t % 26 (enough to test stop strings without a tokenizer).
class LetterDecoder : public TextDecoder {
 public:
  std::string push(int32_t t) override { return std::string(1, char('a' + t % 26)); }
  std::string finish() override { return ""; }
};
}  // namespace

TEST(Engine, StopStringsCutTheText) {
  EngineConfig cfg;
  cfg.num_blocks = 32;
  cfg.max_model_len = 512;
  const auto prompt = tokens(12, 21);
  // The greedy text, then a stop string taken from its middle.
  Engine e(model(), cfg, [](bool) { return std::make_unique<LetterDecoder>(); });
  const auto full = e.generate({prompt}, {greedy(20)})[0];
  ASSERT_EQ(full.text.size(), 20u);
  SamplingParams p = greedy(20);
  p.stop = {full.text.substr(8, 3)};
  const size_t cut = full.text.find(p.stop[0]);
  std::string streamed;
  e.add_request(7, prompt, p);
  RequestOutput last;
  while (e.has_unfinished())
    for (auto& o : e.step()) {
      streamed += o.text;
      last = o;
    }
  EXPECT_EQ(streamed, full.text.substr(0, cut));
  EXPECT_EQ(last.finish_reason, FinishReason::Stop);
  EXPECT_EQ(last.stop_string, p.stop[0]);
  EXPECT_EQ(e.block_pool().n_held(), 0);
}

TEST(Engine, AbortFreesBlocksAndLeavesOthersIntact) {
  EngineConfig cfg;
  cfg.num_blocks = 32;
  cfg.max_model_len = 512;
  Engine e(model(), cfg);
  const auto keep = tokens(40, 31), drop = tokens(90, 32);
  e.add_request(1, keep, greedy(10));
  e.add_request(2, drop, greedy(50));
  std::vector<int32_t> kept;
  bool dropped = false;
  for (int step = 0; e.has_unfinished(); ++step) {
    if (step == 3) e.abort(2);
    for (auto& o : e.step()) {
      if (o.id == 1) kept.insert(kept.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.id == 2 && o.finished) {
        EXPECT_EQ(o.finish_reason, FinishReason::Abort);
        dropped = true;
      }
    }
  }
  EXPECT_TRUE(dropped);
  EXPECT_EQ(kept, alone(keep, 10));
  EXPECT_EQ(e.block_pool().n_held(), 0);
}

TEST(AsyncEngine, ManyThreadsSubmitStreamAndAbort) {
  EngineConfig cfg;
  cfg.num_blocks = 48;
  cfg.max_model_len = 512;
  AsyncEngine ae(model(), cfg);
  const auto prompts = mixed_prompts();
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] {
      auto st = ae.submit(prompts[i], greedy(8));
      RequestOutput o;
      while (st->next(&o)) got[i].insert(got[i].end(), o.new_tokens.begin(), o.new_tokens.end());
    });
  // One more request, aborted right away: its stream still ends.
  auto st = ae.submit(tokens(100, 77), greedy(100));
  ae.abort(st->id());
  RequestOutput o;
  FinishReason last = FinishReason::None;
  while (st->next(&o)) last = o.finish_reason;
  EXPECT_EQ(last, FinishReason::Abort);
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], alone(prompts[i], 8)) << i;
  EXPECT_THROW(ae.submit({}, greedy(3)), Error);
  for (int i = 0; i < 100 && ae.num_unfinished(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ae.num_unfinished(), 0u);
  EXPECT_EQ(ae.stats().kv_blocks_used, 0);
}
