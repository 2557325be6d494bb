// `bench step --engine-loop` (bench/engine_loop.h) on the bundled model (CPU): with more prompt
// tokens than one step's budget, the prompts go in over many steps while the first requests
// already decode, and the loop still measures its decode steps of all B requests, sync and async,
// with the same tokens; a batch size that cannot reach them reports an error, not a row of zeros.
#include <gtest/gtest.h>

#include "bench/engine_loop.h"
#include "core/error.h"
#include "model/greedy.h"

namespace osprey::bench {
namespace {

DeepseekModel& arith() {
  static const auto m = load_model(OSPREY_BUNDLED_MODEL, Device::CPU);
  return *m;
}

TEST(EngineLoop, MeasuresDecodeStepsOfAllRequestsAfterChunkedPrefill) {
  EngineLoopOptions o;
  o.batches = {1, 4};
  o.context = 40;
  o.warmup = 2;
  o.iters = 3;
  o.max_num_batched_tokens = 16;  // B=4: 160 prompt tokens, ~12 steps, the first decoding by 3
  o.seed = 5;
  const std::vector<EngineLoopRow> rows = run_engine_loop(arith(), o);
  ASSERT_EQ(rows.size(), 4u);
  for (const EngineLoopRow& r : rows) {
    SCOPED_TRACE(std::to_string(r.batch) + (r.async ? " async" : " sync"));
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.measured_steps, o.iters);
    EXPECT_TRUE(r.tokens_identical);
    EXPECT_GT(r.busy_s, 0);
    EXPECT_GT(r.wall_per_step_s, 0);
    // The prompts took several steps before the decode steps of all B (B=4: ≥ 160 / 16).
    const int64_t prefill_steps =
        (r.batch * o.context + o.max_num_batched_tokens - 1) / o.max_num_batched_tokens;
    EXPECT_GE(r.engine_steps, prefill_steps + o.warmup + o.iters);
  }
  EXPECT_EQ(rows[2].batch, 4);
}

TEST(EngineLoop, ContextPastTheModelIsAnError) {
  EngineLoopOptions o;
  o.batches = {2};
  // A context 4 short of the model's positions: the decode steps pass them.
  o.context = int(arith().config().max_position_embeddings) - 4;
  try {
    run_engine_loop(arith(), o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace osprey::bench
