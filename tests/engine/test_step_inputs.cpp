// The metadata builder: the right values, only the changed extent written, the shrink-tail rule;
// what it builds for a pure decode step is one the CUDA graph runner replays; its batches pack
// for the device copy with every tensor moved (an empty one too).
#include <gtest/gtest.h>

#include <cstring>

#include "engine/cuda_graph_runner.h"
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

// The engine's pure decode steps (one known token a sequence, every one sampled) are plain
// decodes, not verify steps: the CUDA graph runner takes them. (A verify flag on them made the
// runner refuse every engine decode: 0 captures in 27 steps on the H200.)
TEST(StepInputs, PureDecodeStepsAreGraphEligible) {
  StepInputs in(64, 4, 8, 4);
  Sequence a = make_seq(1, 6, {7, 2}), b = make_seq(2, 3, {5}), c = make_seq(3, 5, {1, 3});
  a.output = {9};
  b.output = {8};
  c.output = {7, 6};
  StepPlan plan;
  plan.seqs = {{&a, 6, 1, true}, {&b, 3, 1, true}, {&c, 6, 1, true}};
  plan.num_tokens = 3;
  plan.num_sampled = 3;
  const ForwardBatch& fb = in.build(plan);
  EXPECT_EQ(fb.max_query_len, 1);
  EXPECT_FALSE(fb.spec_decode);
  EXPECT_EQ(cuda_graph_ineligible(fb), "");
  // A decode with a draft to verify beside plain decodes (1 + 1 tokens, both rows sampled): a
  // verify step, but of uneven runs: eager.
  a.draft = {4};
  plan.seqs[0].num_tokens = 2;
  plan.seqs[0].num_draft = 1;
  plan.num_tokens = 4;
  plan.num_sampled = 4;
  const ForwardBatch& vb = in.build(plan);
  EXPECT_TRUE(vb.spec_decode);
  EXPECT_EQ(vb.max_query_len, 2);
  EXPECT_NE(cuda_graph_ineligible(vb), "");
  // A prompt chunk beside the decodes (mixed): neither a verify step nor eligible.
  a.draft.clear();
  plan.seqs = {{&b, 3, 1, true}, {&a, 0, 4, false}};
  plan.num_tokens = 5;
  plan.num_sampled = 1;
  const ForwardBatch& mb = in.build(plan);
  EXPECT_FALSE(mb.spec_decode);
  EXPECT_NE(cuda_graph_ineligible(mb), "");
}

// The engine's verify steps where every sequence brings its known token and K drafts (all rows
// sampled) are what the CUDA graph runner replays, keyed by (bucket, 1 + K); one sequence with
// fewer drafts makes the step uneven (eager).
TEST(StepInputs, UniformVerifyStepsAreGraphEligible) {
  StepInputs in(64, 4, 8, 64, /*max_logit_rows=*/4 * 3);
  Sequence a = make_seq(1, 6, {7}), b = make_seq(2, 3, {5}), c = make_seq(3, 5, {1});
  a.output = {9};
  b.output = {8};
  c.output = {7, 6};
  a.draft = {4, 5};
  b.draft = {6, 7};
  c.draft = {8, 9};
  StepPlan plan;
  plan.seqs = {{&a, 6, 3, true, 2}, {&b, 3, 3, true, 2}, {&c, 6, 3, true, 2}};
  plan.num_tokens = 9;
  plan.num_sampled = 9;
  const ForwardBatch& ub = in.build(plan);
  EXPECT_TRUE(ub.spec_decode);
  EXPECT_EQ(ub.max_query_len, 3);
  EXPECT_EQ(cuda_graph_ineligible(ub), "");
  EXPECT_EQ(cuda_graph_tokens_per_seq(ub), 3);
  EXPECT_EQ(cuda_graph_key({1, 2, 4}, ub), (GraphKey{4, 3}));
  EXPECT_EQ(cuda_graph_key({1, 2}, ub).bucket, 0);  // larger than every bucket
  // b verifies one draft only: 3 + 2 + 3 tokens, uneven.
  plan.seqs[1].num_tokens = 2;
  plan.seqs[1].num_draft = 1;
  plan.num_tokens = 8;
  plan.num_sampled = 8;
  const ForwardBatch& vb = in.build(plan);
  EXPECT_TRUE(vb.spec_decode);
  const std::string why = cuda_graph_ineligible(vb);
  EXPECT_NE(why.find("different numbers of tokens"), std::string::npos) << why;
  EXPECT_EQ(cuda_graph_key({1, 2, 4}, vb).bucket, 0);
}

// Staging for the device (DeepseekModel::stage_batch): a prompt chunk that samples no row (the
// first chunk of a long prompt alone in its step) has an empty logits_indices; it must move to
// the device with the rest (the CUDA row gather checks its ids' device: `bench step
// --engine-loop` on the H200 stopped at its first step). The "device" here is host memory
// labelled CUDA: only pointers and devices are checked, and the bytes after one copy.
TEST(StepInputs, PackedMetadataMovesEveryTensorEmptyOnesToo) {
  StepInputs in(64, 4, 8, 4);
  Sequence a = make_seq(1, 20, {7, 2, 4, 6, 0});
  StepPlan plan;
  plan.seqs = {{&a, 0, 8, false}};  // tokens 0..7 of 20: nothing to sample
  plan.num_tokens = 8;
  plan.num_sampled = 0;
  const ForwardBatch& fb = in.build(plan);
  ASSERT_EQ(fb.logits_indices.numel(), 0);
  const size_t bytes = packed_metadata_bytes(fb);
  // token_ids, positions, slot_mapping (I64), req_id_per_token: 8 tokens; qsl 2, seq_lens 1,
  // block_table [1, 8]; logits_indices empty: each a 256-byte piece, the empty one none.
  EXPECT_EQ(bytes, 7 * kMetadataAlign);
  std::vector<char> host(bytes, 0), dev(bytes, 0);
  const ForwardBatch d = pack_metadata(fb, host.data(), dev.data(), Device::CUDA);
  const std::pair<const Tensor*, const Tensor*> parts[] = {
      {&fb.token_ids, &d.token_ids},
      {&fb.attn.query_start_loc, &d.attn.query_start_loc},
      {&fb.attn.seq_lens, &d.attn.seq_lens},
      {&fb.attn.positions, &d.attn.positions},
      {&fb.attn.block_table, &d.attn.block_table},
      {&fb.attn.slot_mapping, &d.attn.slot_mapping},
      {&fb.logits_indices, &d.logits_indices},
      {&fb.attn.req_id_per_token, &d.attn.req_id_per_token}};
  std::memcpy(dev.data(), host.data(), bytes);  // the one host→device copy
  for (const auto& [h, t] : parts) {
    EXPECT_EQ(t->device, Device::CUDA);
    EXPECT_EQ(t->shape, h->shape);
    EXPECT_EQ(t->dtype, h->dtype);
    const char* p = static_cast<const char*>(t->data);
    EXPECT_TRUE(p >= dev.data() && p + t->nbytes() <= dev.data() + bytes);
    EXPECT_EQ(std::memcmp(p, h->data, h->nbytes()), 0);
  }
  // The host batch is untouched.
  EXPECT_EQ(fb.token_ids.device, Device::CPU);
  EXPECT_EQ(fb.logits_indices.device, Device::CPU);
  // A hand-built batch without req_id_per_token: it stays absent, the rest moves.
  ForwardBatch no_req = fb;
  no_req.attn.req_id_per_token = Tensor{};
  EXPECT_EQ(packed_metadata_bytes(no_req), 6 * kMetadataAlign);
  const ForwardBatch d2 = pack_metadata(no_req, host.data(), dev.data(), Device::CUDA);
  EXPECT_EQ(d2.attn.req_id_per_token.data, nullptr);
  EXPECT_EQ(d2.logits_indices.device, Device::CUDA);
  // A device tensor handed in as host metadata is a caller bug, refused.
  ForwardBatch bad = fb;
  bad.attn.positions.device = Device::CUDA;
  EXPECT_DEATH(pack_metadata(bad, host.data(), dev.data(), Device::CUDA),
               "step metadata must be host tensors");
}
