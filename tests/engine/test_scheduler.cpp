// The scheduler alone (no model): budgets, decode-first order, chunked prefill, FCFS admission,
// prefix reuse, preemption by recompute, abort, and no leaked block.
#include <gtest/gtest.h>

#include <memory>

#include "engine/scheduler.h"

using namespace osprey;

namespace {

struct Harness {
  explicit Harness(SchedulerConfig c, int64_t blocks) : pool(blocks), sched(c, pool) {}
  Sequence* add(int prompt_len, int max_tokens = 100, int32_t base = 10) {
    auto s = std::make_unique<Sequence>();
    s->id = seqs.size();
    s->arrival = seqs.size();
    for (int i = 0; i < prompt_len; ++i) s->prompt.push_back(base + i);
    s->params.max_tokens = max_tokens;
    sched.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  // Runs one step, "sampling" token 3 for every sampled row.
  StepPlan step() {
    StepPlan p = sched.schedule();
    sched.commit(p, std::vector<int32_t>(size_t(p.num_sampled), 3));
    return p;
  }
  BlockPool pool;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
};

SchedulerConfig cfg(int tokens, int seqs = 8) {
  SchedulerConfig c;
  c.max_num_batched_tokens = tokens;
  c.max_num_seqs = seqs;
  c.block_size = 4;
  c.max_model_len = 1000;
  c.eos_token_id = 1;
  return c;
}

}  // namespace

TEST(Scheduler, ChunkedPrefillUnderTheTokenBudget) {
  Harness h(cfg(8), 32);
  Sequence* a = h.add(20);
  StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].num_tokens, 8);
  EXPECT_FALSE(p.seqs[0].sample);
  EXPECT_EQ(a->num_computed, 8);
  EXPECT_EQ(a->blocks.size(), 2u);
  h.step();
  p = h.step();  // last 4 prompt tokens
  EXPECT_EQ(p.seqs[0].num_tokens, 4);
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(a->output.size(), 1u);
  p = h.step();  // decode
  EXPECT_EQ(p.seqs[0].num_tokens, 1);
  EXPECT_EQ(p.seqs[0].start, 20);  // the position of the token sampled last step
}

TEST(Scheduler, DecodesFirstThenPrefillsFcfs) {
  Harness h(cfg(6), 64);
  Sequence* a = h.add(3);
  h.step();  // a prefilled, sampled
  Sequence* b = h.add(10);
  Sequence* c = h.add(2);
  StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].seq, a);  // the decode first
  EXPECT_EQ(p.seqs[0].num_tokens, 1);
  EXPECT_EQ(p.seqs[1].seq, b);  // then b's first chunk: 5 tokens fill the budget
  EXPECT_EQ(p.seqs[1].num_tokens, 5);
  EXPECT_EQ(c->status, SeqStatus::Waiting);  // FCFS: c waits behind b
}

TEST(Scheduler, MaxNumSeqs) {
  Harness h(cfg(100, 2), 64);
  h.add(3);
  h.add(3);
  Sequence* c = h.add(3);
  StepPlan p = h.step();
  EXPECT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(c->status, SeqStatus::Waiting);
}

TEST(Scheduler, PreemptsTheLatestAndResumesIt) {
  Harness h(cfg(64), 6);       // 6 blocks of 4 tokens
  Sequence* a = h.add(8, 12);  // each needs 5 blocks at the end: both cannot fit at once
  Sequence* b = h.add(8, 12);
  h.step();  // both prefilled: 3 + 3 blocks held
  int preempted_at = -1;
  for (int i = 0; i < 12 && preempted_at < 0; ++i) {
    h.step();
    if (b->num_preemptions > 0) preempted_at = i;
  }
  ASSERT_GE(preempted_at, 0) << "the cache never ran out";
  EXPECT_EQ(a->num_preemptions, 0);  // the earlier arrival keeps running
  EXPECT_EQ(b->status, SeqStatus::Waiting);
  EXPECT_EQ(b->num_computed, 0);
  const size_t b_out = b->output.size();
  EXPECT_GT(b_out, 0u);  // generated tokens are kept for the recompute
  while (!a->finished() || !b->finished()) h.step();
  EXPECT_EQ(a->output.size(), 12u);
  EXPECT_EQ(b->output.size(), 12u);
  EXPECT_EQ(h.pool.n_held(), 0);
}

TEST(Scheduler, PrefixBlocksAreReused) {
  Harness h(cfg(64), 32);
  Sequence* a = h.add(13, 1);
  h.step();
  ASSERT_TRUE(a->finished());
  Sequence* b = h.add(13, 1);  // same prompt: 3 full blocks cached, 1 token left to compute
  StepPlan p = h.step();
  EXPECT_EQ(b->num_prefix_hit_tokens, 12);
  EXPECT_EQ(p.seqs[0].start, 12);
  EXPECT_EQ(p.seqs[0].num_tokens, 1);
  Sequence* c = h.add(13, 1, 50);  // a different prompt hits nothing
  h.step();
  EXPECT_EQ(c->num_prefix_hit_tokens, 0);
  EXPECT_EQ(h.pool.n_held(), 0);
}

TEST(Scheduler, StopTokensAndLength) {
  Harness h(cfg(64), 32);
  Sequence* a = h.add(3, 5);
  a->params.stop_token_ids = {3};
  h.step();
  EXPECT_TRUE(a->finished());
  EXPECT_EQ(a->finish, FinishReason::Stop);
  EXPECT_EQ(a->stop_token, 3);
  Sequence* b = h.add(3, 2);
  h.step();
  h.step();
  EXPECT_EQ(b->finish, FinishReason::Length);
  EXPECT_EQ(b->output.size(), 2u);
}

TEST(Scheduler, AbortFreesEverything) {
  Harness h(cfg(4), 32);
  Sequence* a = h.add(20);
  Sequence* b = h.add(5);
  h.step();
  h.sched.finish(a, FinishReason::Abort);
  h.sched.finish(b, FinishReason::Abort);  // still waiting
  EXPECT_EQ(h.pool.n_held(), 0);
  EXPECT_TRUE(h.sched.schedule().empty());
  EXPECT_EQ(a->finish, FinishReason::Abort);
}
