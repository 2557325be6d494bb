// Async scheduling (engine/engine.h): the overlapped loop gives the synchronous loop's outputs
// token for token on the bundled model (models/osprey-arith, its tokenizer and chat prompts):
// greedy, seeded sampling with penalties and logprobs, staggered arrivals, stop tokens and stop
// strings, aborts, preemption on a small KV cache, prefix caching and length limits. A sequence
// that finishes while the next step holds it gets nothing from that step (counted, never emitted)
// and leaks no block. Runs on the CPU, and on the GPU too where there is one (a CUDA build).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device_buffer.h"  // cuda::device_count
#include "engine/engine.h"
#include "engine/tokenizer_decoder.h"
#include "model/greedy.h"
#include "tokenizer/tokenizer.h"

using namespace osprey;

namespace {

const tokenizer::Tokenizer& tok() {
  static const tokenizer::Tokenizer t = tokenizer::Tokenizer::load(OSPREY_BUNDLED_MODEL);
  return t;
}

const DeepseekModel& arith(Device d) {
  static std::map<Device, std::unique_ptr<DeepseekModel>> models;
  auto& m = models[d];
  if (!m) m = load_model(OSPREY_BUNDLED_MODEL, d);
  return *m;
}

// The model's chat prompt (train_report.json "prompt") around a question.
std::vector<int32_t> chat(const std::string& question) {
  return tok().encode("<｜begin▁of▁sentence｜><｜User｜>" + question + "<｜Assistant｜></think>");
}

// Word problems like the model's training set, of different lengths (their answers end at EOS
// after different numbers of tokens).
const std::vector<std::string>& questions() {
  static const std::vector<std::string> q = {
      "Ana's shop has 45 apples. It sells 12 apples in the morning and 9 apples in the "
      "afternoon. How many apples are left?",
      "Ben's school has 6 classrooms with 23 students in each classroom. 17 students are "
      "absent today.",
      "A bus travels 120 km in the morning and 85 km in the afternoon. How far does it travel?",
      "Cara's shop has 300 pens. It sells 45 pens. Then it gets 4 boxes with 25 pens in each "
      "box. How many pens does the shop have now?",
      "Dev's school has 8 classrooms with 30 students in each classroom. 12 students are absent "
      "today. The students who are present form 6 teams of equal size.",
      "Eli's shop has 78 books. It sells 19 books in the morning and 23 books in the afternoon. "
      "How many books are left?",
  };
  return q;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

SamplingParams seeded(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.max_tokens = max_tokens;
  p.seed = seed;
  return p;
}

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int arrive = 0;     // the step() call before which it is added
  int abort_at = -1;  // the step() call before which it is aborted (−1: never)
};

struct Out {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::None;
  std::string stop_string;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

struct Outcome {
  std::vector<Out> outs;
  EngineStats stats;
  bool async = false;
};

Outcome run(Device d, EngineConfig cfg, bool async, const std::vector<Request>& reqs) {
  cfg.async_scheduling = async;
  Engine e(arith(d), cfg, make_text_decoder_factory(tok()));
  Outcome r;
  r.async = e.async_scheduling();
  r.outs.resize(reqs.size());
  size_t finished = 0;
  for (int call = 0; finished < reqs.size(); ++call) {
    EXPECT_LT(call, 10000) << "the engine does not finish";
    if (call >= 10000) break;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i].arrive == call) e.add_request(i + 1, reqs[i].prompt, reqs[i].params);
      if (reqs[i].abort_at == call) e.abort(i + 1);
    }
    for (RequestOutput& o : e.step()) {
      Out& out = r.outs[o.id - 1];
      EXPECT_EQ(out.finish, FinishReason::None) << "output after the final one, request " << o.id;
      out.tokens.insert(out.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      out.logprobs.insert(out.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      out.text += o.text;
      out.completion_tokens = o.completion_tokens;
      out.cached_tokens = o.cached_tokens;
      if (o.finished) {
        out.finish = o.finish_reason;
        out.stop_string = o.stop_string;
        ++finished;
      }
    }
  }
  EXPECT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.block_pool().n_held(), 0) << "leaked blocks";
  r.stats = e.stats();
  return r;
}

void expect_same(const Outcome& a, const Outcome& b, const std::vector<Request>& reqs) {
  ASSERT_EQ(a.outs.size(), b.outs.size());
  for (size_t i = 0; i < a.outs.size(); ++i) {
    const Out &x = a.outs[i], &y = b.outs[i];
    EXPECT_EQ(x.tokens, y.tokens) << "request " << i;
    EXPECT_EQ(x.text, y.text) << "request " << i;
    EXPECT_EQ(x.finish, y.finish) << "request " << i;
    EXPECT_EQ(x.stop_string, y.stop_string) << "request " << i;
    EXPECT_EQ(x.completion_tokens, int(x.tokens.size())) << "request " << i;
    EXPECT_EQ(y.completion_tokens, int(y.tokens.size())) << "request " << i;
    EXPECT_LE(int(x.tokens.size()), reqs[i].params.max_tokens);
    ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << "request " << i;
    for (size_t j = 0; j < x.logprobs.size(); ++j) {
      EXPECT_EQ(x.logprobs[j].token, y.logprobs[j].token);
      EXPECT_NEAR(x.logprobs[j].logprob, y.logprobs[j].logprob, 1e-4f);
      ASSERT_EQ(x.logprobs[j].top.size(), y.logprobs[j].top.size());
      for (size_t k = 0; k < x.logprobs[j].top.size(); ++k)
        EXPECT_EQ(x.logprobs[j].top[k].first, y.logprobs[j].top[k].first);
    }
  }
}

EngineConfig plain_config() {
  EngineConfig cfg;
  cfg.num_blocks = 64;
  cfg.max_model_len = 512;
  cfg.seed = 7;
  return cfg;
}

// The loops compared on the CPU, on the GPU op by op, and on the GPU with pure decode steps
// replayed from CUDA graphs that sample inside the graph (EngineConfig::cuda_graph_sampling): the
// overlapped loop then takes its ids from the device, across preemption, aborts and stops too.
struct Variant {
  Device device = Device::CPU;
  bool graph_sampling = false;
};

class AsyncScheduling : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
#ifdef OSPREY_WITH_CUDA
    if (GetParam().device == Device::CUDA && cuda::device_count() == 0)
      GTEST_SKIP() << "no CUDA device";
#endif
  }
  Device device() const {
    return GetParam().device;
  }
  // The variant's engine config: plain_config() with its graph settings.
  EngineConfig base_config() const {
    EngineConfig cfg = plain_config();
    if (GetParam().graph_sampling) {
      cfg.cuda_graph = true;
      cfg.cuda_graph_sampling = true;
    }
    return cfg;
  }
};

// Greedy and seeded requests (one with penalties, one with logprobs), arriving over the first
// steps, ending at their EOS: the same tokens, text and logprobs in both loops; the overlapped
// loop dropped the tokens it sampled past an EOS (the discard path ran).
TEST_P(AsyncScheduling, GreedySeededPenaltiesAndLogprobsMatchSynchronous) {
  std::vector<Request> reqs;
  for (size_t i = 0; i < questions().size(); ++i) {
    Request r;
    r.prompt = chat(questions()[i]);
    r.params = i % 2 ? seeded(80, 100 + i) : greedy(80);
    r.arrive = int(i / 2) * 3;
    reqs.push_back(r);
  }
  reqs[1].params.repetition_penalty = 1.2f;
  reqs[1].params.frequency_penalty = 0.3f;
  reqs[2].params.logprobs = 3;
  reqs[3].params.min_tokens = 20;
  const Outcome sync = run(device(), base_config(), false, reqs);
  const Outcome async = run(device(), base_config(), true, reqs);
  EXPECT_FALSE(sync.async);
  EXPECT_TRUE(async.async);
  expect_same(sync, async, reqs);
  int eos_finishes = 0;
  for (const Out& o : sync.outs) {
    eos_finishes += o.finish == FinishReason::Stop;
    EXPECT_FALSE(o.text.empty());
  }
  EXPECT_GE(eos_finishes, 4) << "the prompts should mostly end at their EOS";
  EXPECT_GT(async.stats.async_discarded_tokens, 0) << "no token was sampled past a finish";
  EXPECT_EQ(sync.stats.async_discarded_tokens, 0);
  EXPECT_EQ(sync.stats.generation_tokens_total, async.stats.generation_tokens_total);
  EXPECT_EQ(sync.stats.prompt_tokens_total, async.stats.prompt_tokens_total);
}

// Stop strings cut from the middle of each greedy answer end the requests at the same text.
TEST_P(AsyncScheduling, StopStringsMatchSynchronous) {
  std::vector<Request> reqs;
  for (const std::string& q : questions()) reqs.push_back({chat(q), greedy(80), 0, -1});
  const Outcome plain = run(device(), base_config(), false, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string& t = plain.outs[i].text;
    ASSERT_GE(t.size(), 16u) << "request " << i;
    reqs[i].params.stop = {t.substr(t.size() / 2, 3)};
  }
  const Outcome sync = run(device(), base_config(), false, reqs);
  const Outcome async = run(device(), base_config(), true, reqs);
  expect_same(sync, async, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(async.outs[i].finish, FinishReason::Stop) << "request " << i;
    EXPECT_EQ(async.outs[i].stop_string, reqs[i].params.stop[0]);
    EXPECT_LT(async.outs[i].text.size(), plain.outs[i].text.size());
  }
  EXPECT_GT(async.stats.async_discarded_tokens, 0);
}

// Aborted requests end with a prefix of their full output (the overlapped loop may have one token
// fewer: the one in flight when the abort came); the others are untouched.
TEST_P(AsyncScheduling, AbortsLeaveTheOthersIdentical) {
  std::vector<Request> reqs;
  for (const std::string& q : questions()) reqs.push_back({chat(q), greedy(80), 0, -1});
  const Outcome full = run(device(), base_config(), false, reqs);
  reqs[1].abort_at = 4;
  reqs[4].abort_at = 9;
  reqs[5].abort_at = 1;  // while its prompt is being prefilled
  const Outcome sync = run(device(), base_config(), false, reqs);
  const Outcome async = run(device(), base_config(), true, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (const Outcome* r : {&sync, &async}) {
      const Out& o = r->outs[i];
      if (reqs[i].abort_at < 0) {
        EXPECT_EQ(o.tokens, full.outs[i].tokens) << "request " << i;
        continue;
      }
      EXPECT_EQ(o.finish, FinishReason::Abort) << "request " << i;
      ASSERT_LE(o.tokens.size(), full.outs[i].tokens.size());
      EXPECT_TRUE(std::equal(o.tokens.begin(), o.tokens.end(), full.outs[i].tokens.begin()))
          << "request " << i << " is no prefix of its full output";
    }
    if (reqs[i].abort_at >= 0) {
      EXPECT_LE(async.outs[i].tokens.size(), sync.outs[i].tokens.size());
      EXPECT_GE(async.outs[i].tokens.size() + 1, sync.outs[i].tokens.size());
    }
  }
  EXPECT_GT(sync.outs[1].tokens.size(), 0u) << "the abort came before any output";
}

// A KV cache too small for everyone: sequences are preempted (the overlapped loop preempts while
// the victim's step is in flight: its token stands, its cache goes) and the outputs still match.
TEST_P(AsyncScheduling, PreemptionOnASmallCacheMatchesSynchronous) {
  EngineConfig cfg = base_config();
  cfg.num_blocks = 8;  // 6 prompts of about a block each, each growing into its second block
  cfg.max_model_len = 256;
  std::vector<Request> reqs;
  for (size_t i = 0; i < questions().size(); ++i) {
    SamplingParams p = i % 2 ? seeded(90, 7 + i) : greedy(90);
    p.ignore_eos = true;  // everyone grows: preemption is certain
    reqs.push_back({chat(questions()[i]), p, 0, -1});
  }
  const Outcome sync = run(device(), cfg, false, reqs);
  const Outcome async = run(device(), cfg, true, reqs);
  expect_same(sync, async, reqs);
  EXPECT_GT(sync.stats.num_preemptions, 0) << "the test did not force a preemption";
  EXPECT_GT(async.stats.num_preemptions, 0) << "the test did not force a preemption";
  for (const Out& o : async.outs) EXPECT_EQ(o.tokens.size(), 90u);
}

// The same question again, after the first has cached its blocks: served from the prefix cache
// in both loops with the same tokens.
TEST_P(AsyncScheduling, PrefixCachingMatchesSynchronous) {
  std::vector<Request> reqs;
  const std::string q = questions()[4] + " " + questions()[3];  // over one block
  reqs.push_back({chat(q), greedy(40), 0, -1});
  reqs.push_back({chat(q), seeded(40, 5), 6, -1});
  reqs.push_back({chat(q), greedy(40), 12, -1});
  const Outcome sync = run(device(), base_config(), false, reqs);
  const Outcome async = run(device(), base_config(), true, reqs);
  expect_same(sync, async, reqs);
  EXPECT_EQ(async.outs[2].tokens, async.outs[0].tokens);
  EXPECT_GE(async.outs[1].cached_tokens, kBlockSize);
  EXPECT_EQ(async.outs[1].cached_tokens, sync.outs[1].cached_tokens);
  EXPECT_EQ(async.outs[2].cached_tokens, sync.outs[2].cached_tokens);
  EXPECT_GT(async.stats.prefix_hit_tokens, 0);
}

// max_tokens and max_model_len are known ahead: a sequence they end is not scheduled past its
// end, so nothing is sampled to be dropped, and the lengths are exact.
TEST_P(AsyncScheduling, LengthLimitsAreNotScheduledPastTheEnd) {
  EngineConfig cfg = base_config();
  const std::vector<int32_t> p0 = chat(questions()[0]);
  cfg.max_model_len = int(p0.size()) + 6;
  std::vector<Request> reqs;
  for (int n : {1, 2, 5}) {
    SamplingParams p = greedy(n);
    p.ignore_eos = true;
    reqs.push_back({p0, p, 0, -1});
  }
  SamplingParams to_the_end = greedy(100);
  to_the_end.ignore_eos = true;
  reqs.push_back({p0, to_the_end, 1, -1});  // ends at max_model_len: 6 tokens
  const Outcome sync = run(device(), cfg, false, reqs);
  const Outcome async = run(device(), cfg, true, reqs);
  expect_same(sync, async, reqs);
  EXPECT_EQ(async.outs[0].tokens.size(), 1u);
  EXPECT_EQ(async.outs[1].tokens.size(), 2u);
  EXPECT_EQ(async.outs[2].tokens.size(), 5u);
  EXPECT_EQ(async.outs[3].tokens.size(), 6u);
  for (const Out& o : async.outs) EXPECT_EQ(o.finish, FinishReason::Length);
  EXPECT_EQ(async.stats.async_discarded_tokens, 0);
}

// The overlapped loop returns a step's outputs and record from the call after the one that
// launched it; both loops record the host time before each launch and the device's idle gap; on
// CUDA the async loop's launches find the executor's worker awake.
TEST_P(AsyncScheduling, StepsAreRecordedOneCallLaterWithHostTimeAndIdleGap) {
  const std::vector<int32_t> prompt = chat(questions()[2]);
  SamplingParams p = greedy(12);
  p.ignore_eos = true;
  for (bool async : {false, true}) {
    EngineConfig cfg = base_config();
    cfg.async_scheduling = async;
    Engine e(arith(device()), cfg);
    e.add_request(1, prompt, p);
    std::vector<RequestOutput> first = e.step();
    EXPECT_EQ(e.stats().steps, async ? 0 : 1);
    EXPECT_EQ(first.empty(), async);
    std::vector<RequestOutput> second = e.step();
    EXPECT_EQ(e.stats().steps, async ? 1 : 2);
    ASSERT_EQ(second.size(), 1u);
    EXPECT_EQ(second[0].new_tokens.size(), 1u);
    EXPECT_EQ(e.stats().last_step.kind, async ? StepKind::Prefill : StepKind::Decode);
    if (async)
      EXPECT_EQ(e.stats().last_step.device_idle_seconds, -1.0) << "the first step followed none";
    else
      EXPECT_GE(e.stats().last_step.device_idle_seconds, 0.0) << "it followed the prefill";
    int decodes = 0;
    double idle_sum = 0, host_sum = 0;
    while (e.has_unfinished()) {
      e.step();
      const StepRecord& r = e.stats().last_step;
      if (r.kind != StepKind::Decode) continue;
      ++decodes;
      EXPECT_GT(r.host_seconds, 0);
      EXPECT_GE(r.device_idle_seconds, 0) << "a decode after a decode has an idle gap";
      EXPECT_GT(r.seconds, 0);
      idle_sum += r.device_idle_seconds;
      host_sum += r.host_seconds;
    }
    EXPECT_GE(decodes, 9);
    EXPECT_LT(idle_sum, 1.0) << "idle gaps of seconds";
    EXPECT_LT(host_sum, 1.0);
    EXPECT_EQ(e.stats().steps, 12);
    EXPECT_EQ(e.block_pool().n_held(), 0);
    if (!async) {
      EXPECT_EQ(e.stats().async_worker_wakeups, 0) << "no worker";
    }
    // On CUDA the engine keeps the worker awake for each launch that follows a wait (its wake-up
    // was the idle gap between steps): only the first launch, to an idle worker, may wake it.
    if (async && device() == Device::CUDA) {
      EXPECT_LE(e.stats().async_worker_wakeups, 1);
    }
  }
}

// Prompts longer than the step's token budget, prefilled in chunks: the first chunk of a prompt
// that is alone in its step samples no row (an empty logits_indices, which once stopped the GPU
// forward at its row gather: `bench step --engine-loop`). Both loops give the same tokens; on the
// CPU they are also the unchunked run's (test_engine's SmallChunksMatch shows that in general).
TEST_P(AsyncScheduling, ChunkedPromptsWithoutSampledRowsMatch) {
  constexpr int kBudget = 12;  // tokens a step: every prompt below takes 3 or more chunks
  std::vector<Request> reqs;
  for (size_t i = 0; i < 3; ++i) reqs.push_back({chat(questions()[i]), greedy(24), int(i) * 5, -1});
  for (const Request& r : reqs) ASSERT_GT(int(r.prompt.size()), 2 * kBudget);
  EngineConfig cfg = base_config();
  cfg.max_num_batched_tokens = kBudget;
  const Outcome sync = run(device(), cfg, false, reqs);
  const Outcome async = run(device(), cfg, true, reqs);
  expect_same(sync, async, reqs);
  for (const Out& o : sync.outs) EXPECT_EQ(o.tokens.size(), 24u);
  if (device() == Device::CPU) {
    const Outcome whole = run(device(), base_config(), false, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(sync.outs[i].tokens, whole.outs[i].tokens) << "request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, AsyncScheduling,
                         ::testing::Values(Variant{Device::CPU, false}
#ifdef OSPREY_WITH_CUDA
                                           ,
                                           Variant{Device::CUDA, false}, Variant{Device::CUDA, true}
#endif
                                           ),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           if (i.param.device == Device::CPU) return std::string("cpu");
                           return std::string(i.param.graph_sampling ? "cuda_graph_sampling"
                                                                     : "cuda");
                         });

}  // namespace
