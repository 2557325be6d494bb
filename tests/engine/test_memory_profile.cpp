// The profile step (engine/memory_profile.h) runs the largest step the scheduler can form on a
// temporary cache, and leaves the model as it was: greedy tokens before and after it are the same.
#include <gtest/gtest.h>

#include "engine/memory_profile.h"
#include "model/greedy.h"

using namespace osprey;

TEST(MemoryProfile, LargestStepRunsAndLeavesTheModelAsItWas) {
  auto m = load_model_cpu(std::string(OSPREY_TEST_DATA) + "/models/v32-tiny");
  const std::vector<int32_t> prompt = {5, 17, 99, 250, 3, 8, 42, 42, 7};
  GreedyOptions g;
  g.max_new_tokens = 12;
  g.stop_at_eos = false;
  const std::vector<int32_t> before = greedy_generate(*m, prompt, g);
  const StepProfile p = profile_step_memory(*m, /*max_num_batched_tokens=*/300,
                                            /*max_model_len=*/500, /*max_num_seqs=*/4);
  EXPECT_EQ(p.tokens, 300);
  EXPECT_EQ(p.context, 500);
  EXPECT_GT(p.seconds, 0.0);
  // A budget above the model length: one chunk of max_model_len tokens.
  EXPECT_EQ(profile_step_memory(*m, 4096, 200, 64).tokens, 200);
  EXPECT_EQ(greedy_generate(*m, prompt, g), before);
  EXPECT_THROW(profile_step_memory(*m, 0, 200, 4), Error);
}
