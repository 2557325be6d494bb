// The metadata builder: the right values, only the changed extent written, the shrink-tail rule.
#include <gtest/gtest.h>

#include "engine/step_inputs.h"

using namespace osprey;

namespace {
Sequence make_seq(uint64_t id, int n_prompt, std::vector<int32_t> blocks) {
  Sequence s;
  s.id = id;
  for (int i = 0; i < n_prompt; ++i) s.prompt.push_back(100 + int32_t(id) * 10 + i);
  s.blocks = std::move(blocks);
  return s;
}
}  // namespace

TEST(StepInputs, BuildsTheMetadata) {
  StepInputs in(64, 4, 8, 4);
  Sequence a = make_seq(1, 6, {7, 2}), b = make_seq(2, 3, {5});
  a.num_computed = 4;  // a: tokens 4..5 this step (a chunk ending the prompt)
  StepPlan plan;
  plan.seqs = {{&a, 4, 2, true}, {&b, 0, 2, false}};
  plan.num_tokens = 4;
  plan.num_sampled = 1;
  const ForwardBatch& fb = in.build(plan);
  EXPECT_EQ(fb.attn.n_tokens, 4);
  EXPECT_EQ(fb.attn.n_seqs, 2);
  const int32_t* tok = fb.token_ids.ptr<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(tok, tok + 4), (std::vector<int32_t>{114, 115, 120, 121}));
  const int32_t* pos = fb.attn.positions.ptr<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(pos, pos + 4), (std::vector<int32_t>{4, 5, 0, 1}));
  const int64_t* slot = fb.attn.slot_mapping.ptr<int64_t>();
  // a's positions 4, 5 live in its second block (2): slots 8, 9. b's 0, 1 in block 5: 20, 21.
  EXPECT_EQ(std::vector<int64_t>(slot, slot + 4), (std::vector<int64_t>{8, 9, 20, 21}));
  const int32_t* req = fb.attn.req_id_per_token.ptr<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(req, req + 4), (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(fb.attn.query_start_loc.ptr<int32_t>()[1], 2);
  EXPECT_EQ(fb.attn.query_start_loc.ptr<int32_t>()[2], 4);
  EXPECT_EQ(fb.attn.seq_lens.ptr<int32_t>()[0], 6);
  EXPECT_EQ(fb.attn.seq_lens.ptr<int32_t>()[1], 2);
  EXPECT_EQ(fb.attn.block_table.ptr<int32_t>()[0], 7);
  EXPECT_EQ(fb.attn.block_table.ptr<int32_t>()[1], 2);
  EXPECT_EQ(fb.attn.block_table.ptr<int32_t>()[8], 5);
  ASSERT_EQ(fb.logits_indices.numel(), 1);
  EXPECT_EQ(fb.logits_indices.ptr<int32_t>()[0], 1);
  EXPECT_EQ(fb.max_query_len, 2);
  EXPECT_EQ(in.last_table_writes, 3);
}

TEST(StepInputs, WritesOnlyWhatChangedAndResetsTheShrunkTail) {
  StepInputs in(64, 4, 8, 4);
  Sequence a = make_seq(1, 8, {3, 4}), b = make_seq(2, 4, {6});
  StepPlan p1;
  p1.seqs = {{&a, 0, 8, true}, {&b, 0, 4, true}};
  p1.num_tokens = 12;
  p1.num_sampled = 2;
  in.build(p1);
  EXPECT_EQ(in.last_table_writes, 3);
  // Next step: a decodes into a new block (one table write); b is gone (tail reset).
  a.output = {9};
  a.blocks.push_back(1);
  StepPlan p2;
  p2.seqs = {{&a, 8, 1, true}};
  p2.num_tokens = 1;
  p2.num_sampled = 1;
  const ForwardBatch& fb = in.build(p2);
  EXPECT_EQ(in.last_table_writes, 1);
  EXPECT_EQ(fb.attn.block_table.ptr<int32_t>()[2], 1);
  // 11 token slots and b's one table entry went out of use.
  EXPECT_EQ(in.last_tail_resets, 11 + 1);
  const int64_t* slot = fb.attn.slot_mapping.ptr<int64_t>();
  EXPECT_EQ(slot[0], 1 * 4 + 0);
  EXPECT_EQ(slot[1], -1);  // stale slots past the live extent cannot be written by a padded batch
  // Same shape again: nothing to write, nothing to reset.
  a.output.push_back(9);
  p2.seqs[0].start = 9;
  in.build(p2);
  EXPECT_EQ(in.last_table_writes, 0);
  EXPECT_EQ(in.last_tail_resets, 0);
  // A preemption rewrites the row (the block list changed in place).
  a.blocks = {0, 5, 2};
  ++a.blocks_epoch;
  in.build(p2);
  EXPECT_EQ(in.last_table_writes, 3);
}
