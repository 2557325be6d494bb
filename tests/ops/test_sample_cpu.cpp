// The CPU sampling op's own contract (the math itself is tested through the engine's Sampler in
// tests/engine/test_sampler.cpp): the penalty-state updates, the compacted logprob rows, the error
// codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "ops/sample.h"
#include "sample_batch.h"

namespace osprey {
namespace {
using namespace testing;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Outputs {
  Buffer tokens, logprobs, top_ids;
  Outputs(int64_t n, int64_t n_lp)
      : tokens(DType::I32, {n}),
        logprobs(DType::F32, {n_lp, 1 + kMaxTopLogprobs}),
        top_ids(DType::I32, {n_lp, kMaxTopLogprobs}) {
    std::memset(tokens.view().data, 0x7f, tokens.view().nbytes());
    std::memset(logprobs.view().data, 0x7f, logprobs.view().nbytes());
    std::memset(top_ids.view().data, 0x7f, top_ids.view().nbytes());
  }
};

Buffer random_logits(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  Buffer b(DType::F32, {n, vocab});
  for (int64_t i = 0; i < n * vocab; ++i) b.f32()[i] = normal(g);
  return b;
}

// Runs a batch against a penalty state (mask [n_slots, words], counts [n_slots, vocab]).
Outputs run(const SampleBatch& b, const Buffer& logits, Buffer& mask, Buffer& counts) {
  Outputs o(int64_t(b.rows.size()), b.n_lp);
  Buffer rows = b.rows_tensor(), lists = b.lists_tensor();
  ops::sample(o.tokens, o.logprobs, o.top_ids, logits,
              SampleMeta{int(b.rows.size()), rows, lists, mask, counts});
  return o;
}

TEST(OpsCpuSample, PenaltyStateResetMarksPromptAndCountsOutput) {
  const int vocab = 100;
  const int64_t words = sample_mask_words(vocab);
  Buffer mask(DType::I32, {2, words}), counts(DType::I32, {2, vocab});
  std::memset(mask.view().data, 0x5a, mask.view().nbytes());  // garbage: the reset must clear
  std::memset(counts.view().data, 0x5a, counts.view().nbytes());
  Buffer logits = random_logits(1, vocab, 1);
  SampleCase c;
  c.p.repetition_penalty = 1.5f;
  c.p.frequency_penalty = 0.5f;
  c.prompt = {3, 3, 40, 99};
  c.counted = {7, 40, 7};
  SampleBatch first;
  first.add(c, /*reset=*/true, /*slot=*/1);
  run(first, logits, mask, counts);
  for (int i = 0; i < vocab; ++i) {
    EXPECT_EQ(mask_bit(mask.ptr<int32_t>() + words, i), i == 3 || i == 40 || i == 99) << i;
    EXPECT_EQ(counts.ptr<int32_t>()[vocab + i], i == 7 ? 2 : i == 40 ? 1 : 0) << i;
  }
  EXPECT_EQ(counts.ptr<int32_t>()[0], 0x5a5a5a5a);  // slot 0 untouched
  // Without a reset only the new tokens are added; the prompt list is not resent.
  c.counted = {7, 8};
  SampleBatch second;
  second.add(c, /*reset=*/false, /*slot=*/1);
  EXPECT_EQ(second.rows[0].prompt_count, 0);
  run(second, logits, mask, counts);
  EXPECT_EQ(counts.ptr<int32_t>()[vocab + 7], 3);
  EXPECT_EQ(counts.ptr<int32_t>()[vocab + 8], 1);
  EXPECT_EQ(counts.ptr<int32_t>()[vocab + 40], 1);
  EXPECT_TRUE(mask_bit(mask.ptr<int32_t>() + words, 99));
}

TEST(OpsCpuSample, IncrementalStateSamplesLikeARebuiltOne) {
  // A 40-step generation with all three penalties: the slot kept and fed one token per step gives
  // the tokens a slot rebuilt from the whole output each step gives.
  const int vocab = 300;
  SampleCase c;
  c.p.seed = 42;
  c.p.temperature = 0.9f;
  c.p.top_k = 40;
  c.p.repetition_penalty = 1.4f;
  c.p.frequency_penalty = 0.6f;
  c.p.presence_penalty = 0.3f;
  c.prompt = {1, 2, 3, 250};
  Buffer mask_a(DType::I32, {1, sample_mask_words(vocab)}), counts_a(DType::I32, {1, vocab});
  Buffer mask_b(DType::I32, {1, sample_mask_words(vocab)}), counts_b(DType::I32, {1, vocab});
  std::vector<int32_t> output, unpenalised;
  for (int step = 0; step < 40; ++step) {
    Buffer logits = random_logits(1, vocab, 100 + uint32_t(step % 3));  // few distinct rows
    c.p.step = output.size();
    SampleCase rebuilt = c;
    rebuilt.counted = output;
    SampleBatch a;
    a.add(rebuilt, /*reset=*/true, 0);
    SampleCase incremental = c;
    incremental.counted = step == 0 ? std::vector<int32_t>{} : std::vector<int32_t>{output.back()};
    SampleBatch b;
    b.add(incremental, /*reset=*/step == 0, 0);
    SampleCase plain = c;  // the control: no penalties
    plain.p.repetition_penalty = 1.0f;
    plain.p.frequency_penalty = plain.p.presence_penalty = 0.0f;
    SampleBatch p;
    p.add(plain, false);
    const int32_t ta = run(a, logits, mask_a, counts_a).tokens.ptr<int32_t>()[0];
    const int32_t tb = run(b, logits, mask_b, counts_b).tokens.ptr<int32_t>()[0];
    ASSERT_EQ(ta, tb) << "step " << step;
    output.push_back(ta);
    unpenalised.push_back(run(p, logits, mask_a, counts_a).tokens.ptr<int32_t>()[0]);
  }
  EXPECT_NE(output, unpenalised);  // the penalties were live
}

TEST(OpsCpuSample, LogprobRowsAreCompactedAndPadded) {
  const int vocab = 50;
  Buffer logits = random_logits(4, vocab, 3);
  SampleBatch b;
  SampleCase plain, two, none;
  two.p.logprobs = 2;
  none.p.logprobs = 0;
  b.add(plain, false);
  b.add(two, false);
  b.add(plain, false);
  b.add(none, false);
  ASSERT_EQ(b.n_lp, 2);
  Outputs o(4, 2);
  Buffer rows = b.rows_tensor(), lists = b.lists_tensor();
  ops::sample(o.tokens, o.logprobs, o.top_ids, logits, SampleMeta{4, rows, lists, {}, {}});
  const float* lp = o.logprobs.f32();
  const int32_t* ids = o.top_ids.ptr<int32_t>();
  // Row 1 → logprob row 0 with two alternatives; row 3 → logprob row 1 with none.
  const float* raw1 = logits.f32() + vocab;
  double lse = 0;
  for (int i = 0; i < vocab; ++i) lse += std::exp(double(raw1[i]));
  lse = std::log(lse);
  const int32_t t1 = o.tokens.ptr<int32_t>()[1];
  EXPECT_NEAR(lp[0], raw1[t1] - lse, 1e-5);
  EXPECT_GE(ids[0], 0);
  EXPECT_GE(ids[1], 0);
  EXPECT_GE(raw1[ids[0]], raw1[ids[1]]);
  EXPECT_NEAR(lp[1], raw1[ids[0]] - lse, 1e-5);
  for (int j = 2; j < kMaxTopLogprobs; ++j) {
    EXPECT_EQ(ids[j], -1);
    EXPECT_TRUE(std::isnan(lp[1 + j]));
  }
  const float* lp3 = lp + 1 + kMaxTopLogprobs;
  EXPECT_TRUE(std::isfinite(lp3[0]));
  for (int j = 0; j < kMaxTopLogprobs; ++j) {
    EXPECT_EQ(ids[kMaxTopLogprobs + j], -1);
    EXPECT_TRUE(std::isnan(lp3[1 + j]));
  }
}

TEST(OpsCpuSample, ErrorCodes) {
  const int vocab = 20;
  Buffer logits = random_logits(5, vocab, 4);
  logits.f32()[3] = std::numeric_limits<float>::quiet_NaN();            // row 0
  logits.f32()[vocab + 4] = kInf;                                       // row 1
  for (int i = 0; i < vocab; ++i) logits.f32()[2 * vocab + i] = -kInf;  // row 2
  SampleBatch b;
  SampleCase c;
  b.add(c, false);
  b.add(c, false);
  b.add(c, false);
  SampleCase bad_id = c;
  bad_id.suppress = {vocab};  // row 3
  b.add(bad_id, false);
  SampleCase bad_slot = c;  // row 4: a penalty slot that does not exist
  bad_slot.p.presence_penalty = 1.0f;
  b.add(bad_slot, true, 5);
  Buffer mask(DType::I32, {1, sample_mask_words(vocab)}), counts(DType::I32, {1, vocab});
  const Outputs o = run(b, logits, mask, counts);
  const int32_t want[5] = {kSampleErrorNonFinite, kSampleErrorNonFinite, kSampleErrorAllSuppressed,
                           kSampleErrorBadInput, kSampleErrorBadInput};
  for (int r = 0; r < 5; ++r) EXPECT_EQ(o.tokens.ptr<int32_t>()[r], want[r]) << "row " << r;
}

}  // namespace
}  // namespace osprey
