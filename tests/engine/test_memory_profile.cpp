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
  EXPECT_EQ(p.sequences, 1);
  EXPECT_EQ(p.context, 500);
  EXPECT_GT(p.seconds, 0.0);
  // A budget above the model length is spent on several prompts' chunks at once: the profiled
  // step holds the whole budget over sequences of max_model_len (the last one shorter), capped
  // by max_num_seqs sequences.
  const StepProfile wide = profile_step_memory(*m, 1000, 200, 64);
  EXPECT_EQ(wide.tokens, 1000);
  EXPECT_EQ(wide.sequences, 5);
  const StepProfile ragged = profile_step_memory(*m, 450, 200, 64);
  EXPECT_EQ(ragged.tokens, 450);
  EXPECT_EQ(ragged.sequences, 3);
  const StepProfile capped = profile_step_memory(*m, 4096, 200, 3);
  EXPECT_EQ(capped.tokens, 600);
  EXPECT_EQ(capped.sequences, 3);
  EXPECT_EQ(greedy_generate(*m, prompt, g), before);
  EXPECT_THROW(profile_step_memory(*m, 0, 200, 4), Error);
}

// The profile leaves the workspace settled at its peak: steps no larger than the profiled one
// allocate nothing (the arena is not replaced: its generation stays), so the memory measured
// after the profile is what the steps hold.
TEST(MemoryProfile, LeavesTheWorkspaceSettledAtItsPeak) {
  auto m = load_model_cpu(std::string(OSPREY_TEST_DATA) + "/models/v32-tiny");
  profile_step_memory(*m, 450, 200, 8);
  const uint64_t gen = m->workspace_generation();
  const std::vector<int32_t> prompt = {5, 17, 99, 250, 3, 8, 42, 42, 7};
  GreedyOptions g;
  g.max_new_tokens = 4;
  g.stop_at_eos = false;
  greedy_generate(*m, prompt, g);
  EXPECT_EQ(m->workspace_generation(), gen);
  // A step larger than the profiled one grows it (the check above can fail).
  std::vector<int32_t> longer;
  for (int i = 0; i < 600; ++i) longer.push_back(int32_t(3 + (i * 37) % 500));
  g.max_new_tokens = 1;
  greedy_generate(*m, longer, g);
  m->settle_workspace();
  EXPECT_GT(m->workspace_generation(), gen);
}

// Above the expanded-path bound, Auto prefills through the absorbed path: the same tokens.
TEST(MemoryProfile, BoundedExpandedPathGivesTheSameTokens) {
  auto m = load_model_cpu(std::string(OSPREY_TEST_DATA) + "/models/v32-tiny");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(int32_t(3 + (i * 37) % 500));
  GreedyOptions g;
  g.max_new_tokens = 16;
  g.stop_at_eos = false;
  g.prefill_chunk = 40;  // chunks with earlier context: Σ seq_lens grows past the bound
  const std::vector<int32_t> unbounded = greedy_generate(*m, prompt, g);
  m->set_max_expanded_kv_rows(64);
  const std::vector<int32_t> bounded = greedy_generate(*m, prompt, g);
  EXPECT_EQ(bounded, unbounded);
  // And the forced expanded path (the reference) agrees with both.
  g.prefill_path = AttentionPath::Expanded;
  EXPECT_EQ(greedy_generate(*m, prompt, g), unbounded);
}
