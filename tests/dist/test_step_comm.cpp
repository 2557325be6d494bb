// The engine's per-step communication time (StepRecord::comm_seconds, /metrics'
// osprey_step_comm_seconds{step_kind}): positive on every step of a TP2 model on the CPU twin,
// never above the step's own time, and 0 (no samples) for one rank. The TimedCommunicator under
// it counts a peer's lateness as time in the collective.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "dist/thread_comm.h"
#include "dist/timed_comm.h"
#include "engine/engine.h"
#include "model/greedy.h"
#include "model/rank_group.h"
#include "model/test_util.h"
#include "server/metrics.h"

namespace osprey {
namespace {

struct Steps {
  std::vector<StepRecord> records;
  std::string metrics;
};

// Two requests through an engine on `m`, step by step; every model step's record and /metrics.
Steps run_engine(const DeepseekModel& m) {
  EngineConfig cfg;
  cfg.num_blocks = 64;
  cfg.max_model_len = 256;
  Engine e(m, cfg);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  e.add_request(1, {5, 17, 300, 42, 7, 99, 250, 3}, sp);
  e.add_request(2, {11, 200, 1, 77}, sp);
  Steps out;
  server::Metrics metrics;
  while (e.has_unfinished()) {
    const int64_t before = e.stats().steps;
    e.step();
    if (e.stats().steps == before) continue;
    out.records.push_back(e.stats().last_step);
    metrics.observe_step(out.records.back());
  }
  out.metrics = metrics.render(e.stats());
  return out;
}

int sample_count(const std::string& text, const std::string& kind) {
  const std::string key = "osprey_step_comm_seconds_count{step_kind=\"" + kind + "\"} ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stoi(text.substr(at + key.size()));
}

TEST(StepComm, PositiveOnEveryStepOfTp2) {
  dist::ParallelConfig p;
  p.tensor_parallel_size = 2;
  RankGroup g(testing::model_dir("v32-tiny"), p);
  const Steps s = run_engine(g.leader());
  ASSERT_GE(s.records.size(), 4u);  // a prefill, then decodes
  int decodes = 0, prefills = 0;
  for (const StepRecord& r : s.records) {
    EXPECT_GT(r.comm_seconds, 0) << step_kind_name(r.kind);
    EXPECT_LE(r.comm_seconds, r.seconds) << step_kind_name(r.kind);
    decodes += r.kind == StepKind::Decode;
    prefills += r.kind == StepKind::Prefill;
  }
  EXPECT_EQ(sample_count(s.metrics, "decode"), decodes);
  EXPECT_EQ(sample_count(s.metrics, "prefill"), prefills);
  EXPECT_GT(decodes, 0);
}

TEST(StepComm, ZeroOnOneRank) {
  const auto m = load_model_cpu(testing::model_dir("v32-tiny"));
  const Steps s = run_engine(*m);
  ASSERT_GE(s.records.size(), 4u);
  for (const StepRecord& r : s.records) EXPECT_EQ(r.comm_seconds, 0);
  EXPECT_EQ(sample_count(s.metrics, "decode"), 0);
  EXPECT_EQ(sample_count(s.metrics, "prefill"), 0);
}

// Rank 1 arrives 50 ms late at an all-reduce: rank 0's timed seconds include the wait, one call
// counted, the sum still right.
TEST(StepComm, TimedCommunicatorCountsTheWaitForPeers) {
  auto group = dist::make_thread_group(2);
  dist::TimedCommunicator timed(*group[0]);
  Buffer a(DType::F32, {3}), b(DType::F32, {3});
  for (int i = 0; i < 3; ++i) a.f32()[i] = 1, b.f32()[i] = 2;
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    group[1]->all_reduce_sum(b.view());
  });
  timed.all_reduce_sum(a.view());
  late.join();
  EXPECT_EQ(a.f32()[0], 3.0f);
  EXPECT_EQ(timed.calls(), 1u);
  EXPECT_GE(timed.seconds(), 0.045);
  EXPECT_LT(timed.seconds(), 5.0);
}

}  // namespace
}  // namespace osprey
