// CUDA sampling against the CPU twin on DeepSeek-V3's vocabulary (129,280): batches of 1, 16 and
// 64 rows mixing greedy, temperature, top-k 1 / 50, top-p 0.9, min-p 0.1, penalties, min_tokens,
// logprobs 3 / 5 / 20 and seeds; fresh random logits with exact ties, −inf entries and ±0; every
// output poisoned before the run and the penalty state garbage before its reset. Each batch runs
// twice: a first step that builds the penalty slots, then a step that only adds one token per slot.
//   greedy tokens: identical;
//   sampled tokens: identical except where the CPU draw lies within 1e-5 (relative) of a decision
//     boundary (an inverse-CDF bin edge, the top-p mass, min_p); each difference is printed with
//     its margin and the count is reported (TWIN line);
//   logprobs: the same top ids (ties → lower id), values within 1e-4, NaN / −1 past n;
//   penalty state: identical after each step.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "cuda_test_util.h"
#include "ops/sample.h"
#include "sample_batch.h"

namespace osprey {
namespace {
using namespace testing;

constexpr int kVocab = 129280;
constexpr int kKinds = 12;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Logits of one row, by kind: N(0, 2²); ties (N(0, 2²) rounded to 0.5); peaked (N(0, 1), a few at
// +8..12); flat (±0); mostly masked (100 finite). All but the mostly-masked kind get 1 % −inf.
enum class Logits { Normal, Ties, Peaked, Flat, MostlyMasked };

void fill_logits(float* row, Logits kind) {
  std::normal_distribution<float> normal(0.0f, kind == Logits::Peaked ? 1.0f : 2.0f);
  std::uniform_int_distribution<int> id(0, kVocab - 1);
  for (int i = 0; i < kVocab; ++i) {
    switch (kind) {
      case Logits::Normal:
      case Logits::Peaked:
        row[i] = normal(rng());
        break;
      case Logits::Ties:
        row[i] = std::round(normal(rng()) * 2.0f) / 2.0f;
        break;
      case Logits::Flat:
        row[i] = (i & 1) ? -0.0f : 0.0f;
        break;
      case Logits::MostlyMasked:
        row[i] = kNegInf;
        break;
    }
  }
  if (kind == Logits::Peaked)
    for (int j = 0; j < 5; ++j) row[id(rng())] = 8.0f + float(j);
  if (kind == Logits::MostlyMasked)
    for (int j = 0; j < 100; ++j) row[id(rng())] = normal(rng());
  else
    for (int j = 0; j < kVocab / 100; ++j) row[id(rng())] = kNegInf;
}

std::vector<int32_t> random_ids(int n, const float* row) {
  std::uniform_int_distribution<int> id(0, kVocab - 1);
  std::vector<int32_t> v;
  for (int j = 0; j < n; ++j) v.push_back(id(rng()));
  // and the row's best few, so that the penalties matter
  std::vector<int32_t> all(kVocab);
  std::iota(all.begin(), all.end(), 0);
  std::partial_sort(all.begin(), all.begin() + 3, all.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  v.insert(v.end(), {all[0], all[1], all[1], all[2]});
  return v;
}

// Row kind k's parameters (and its logits, written to `row`).
SampleCase make_case(int k, float* row) {
  static const Logits kLogits[kKinds] = {Logits::Normal, Logits::Normal, Logits::Ties,
                                         Logits::Normal, Logits::Peaked, Logits::Normal,
                                         Logits::Normal, Logits::Ties,   Logits::Ties,
                                         Logits::Normal, Logits::Flat,   Logits::MostlyMasked};
  fill_logits(row, kLogits[k]);
  SampleCase c;
  SampleRowParams& p = c.p;
  p.seed = rng()();
  p.step = rng()() % 1000;
  switch (k) {
    case 0:
      p.temperature = 0.0f;
      break;
    case 1:
      p.temperature = 0.8f;
      break;
    case 2:
      p.top_k = 1;
      break;
    case 3:
      p.top_k = 50;
      p.temperature = 0.7f;
      break;
    case 4:
      p.top_p = 0.9f;
      break;
    case 5:
      p.min_p = 0.1f;
      break;
    case 6:
      p.repetition_penalty = 1.3f;
      p.frequency_penalty = 0.5f;
      p.presence_penalty = 0.4f;
      p.top_k = 50;
      p.top_p = 0.9f;
      c.prompt = random_ids(200, row);
      c.counted = random_ids(30, row);
      break;
    case 7:
      p.logprobs = 5;
      p.top_p = 0.9f;
      break;
    case 8:
      p.temperature = 0.0f;
      p.repetition_penalty = 0.8f;
      p.frequency_penalty = 0.3f;
      p.logprobs = kMaxTopLogprobs;
      c.prompt = random_ids(50, row);
      c.counted = random_ids(10, row);
      break;
    case 9:
      p.temperature = 1.1f;
      p.top_p = 0.95f;
      c.suppress = random_ids(2, row);  // two random ids and the best three
      break;
    case 10:
      p.top_k = 7;
      break;
    case 11:
      p.min_p = 0.05f;
      p.top_p = 0.8f;
      p.presence_penalty = 1.0f;
      p.logprobs = 3;
      c.counted = random_ids(5, row);
      break;
  }
  return c;
}

struct Tally {
  int greedy = 0, greedy_equal = 0, sampled = 0, differing = 0, unexplained = 0, logprob_rows = 0;
  double max_margin = 0.0;  // largest boundary margin among the differing draws
  double max_lp_err = 0.0;
};

// Runs the batch on both twins from the same penalty state and compares everything; returns the
// CPU's tokens. host_mask / host_counts and dev_mask / dev_counts hold that state (in place).
std::vector<int32_t> run_and_compare(const SampleBatch& b, const Buffer& logits,
                                     const DeviceBuffer& d_logits, Buffer& host_mask,
                                     Buffer& host_counts, DeviceBuffer& dev_mask,
                                     DeviceBuffer& dev_counts, const char* what, Tally* t) {
  const int64_t n = int64_t(b.rows.size()), n_lp = b.n_lp;
  Buffer rows = b.rows_tensor(), lists = b.lists_tensor();
  SampleMeta hm{int(n), rows, lists, host_mask, host_counts};
  Buffer tok(DType::I32, {n}), lp(DType::F32, {n_lp, 1 + kMaxTopLogprobs}),
      ids(DType::I32, {n_lp, kMaxTopLogprobs});
  std::memset(tok.view().data, 0x7f, tok.view().nbytes());
  std::memset(lp.view().data, 0x7f, lp.view().nbytes());
  std::memset(ids.view().data, 0x7f, ids.view().nbytes());
  ops::sample(tok, lp, ids, logits, hm);

  DeviceBuffer d_rows = cuda::to_device(rows), d_lists = cuda::to_device(lists);
  SampleMeta dm{int(n), d_rows, d_lists, dev_mask, dev_counts};
  DeviceBuffer d_tok(DType::I32, {n}), d_lp(DType::F32, {n_lp, 1 + kMaxTopLogprobs}),
      d_ids(DType::I32, {n_lp, kMaxTopLogprobs});
  cuda::fill_bytes(d_tok, 0x7f);
  if (n_lp > 0) {
    cuda::fill_bytes(d_lp, 0x7f);
    cuda::fill_bytes(d_ids, 0x7f);
  }
  ops::sample(d_tok, d_lp, d_ids, d_logits, dm);
  cuda::synchronize();
  Buffer g_tok = cuda::to_host(d_tok), g_lp = cuda::to_host(d_lp), g_ids = cuda::to_host(d_ids);

  const int64_t words = sample_mask_words(kVocab);
  for (int64_t r = 0; r < n; ++r) {
    const SampleRowParams& p = b.rows[size_t(r)];
    const int32_t ct = tok.ptr<int32_t>()[r], gt = g_tok.ptr<int32_t>()[r];
    EXPECT_GE(ct, 0) << what << " row " << r;
    EXPECT_TRUE(gt >= 0 && gt < kVocab) << what << " row " << r << ": " << gt;
    if (ct < 0 || gt < 0 || gt >= kVocab) continue;
    if (p.temperature < kGreedyTemperature) {
      ++t->greedy;
      t->greedy_equal += gt == ct;
      EXPECT_EQ(gt, ct) << what << " greedy row " << r;
    } else {
      ++t->sampled;
      if (gt != ct) {
        ++t->differing;
        const int32_t* mask_row =
            p.penalty_slot >= 0 ? host_mask.ptr<int32_t>() + p.penalty_slot * words : nullptr;
        const int32_t* counts_row =
            p.penalty_slot >= 0 ? host_counts.ptr<int32_t>() + p.penalty_slot * kVocab : nullptr;
        const double margin = boundary_margin(logits.f32() + r * kVocab, kVocab, p, b.lists.data(),
                                              mask_row, counts_row);
        t->max_margin = std::max(t->max_margin, margin);
        const bool explained = margin < 1e-5;
        t->unexplained += !explained;
        std::printf("SAMPLEDIFF %s row %lld: cpu %d cuda %d, boundary margin %.3e (%s)\n", what,
                    static_cast<long long>(r), ct, gt, margin,
                    explained ? "rounding at a boundary" : "NOT a boundary case");
      }
    }
    if (p.logprobs < 0) continue;
    ++t->logprob_rows;
    const float* cl = lp.f32() + p.logprob_row * (1 + kMaxTopLogprobs);
    const float* gl = g_lp.f32() + p.logprob_row * (1 + kMaxTopLogprobs);
    const int32_t* ci = ids.ptr<int32_t>() + p.logprob_row * kMaxTopLogprobs;
    const int32_t* gi = g_ids.ptr<int32_t>() + p.logprob_row * kMaxTopLogprobs;
    // The sampled token's logprob: compare at the GPU's token with the CPU's normaliser.
    const double lse = double(logits.f32()[r * kVocab + ct]) - cl[0];
    const double want0 = double(logits.f32()[r * kVocab + gt]) - lse;
    EXPECT_TRUE(std::isfinite(gl[0])) << what << " row " << r;
    t->max_lp_err = std::max(t->max_lp_err, std::fabs(gl[0] - want0));
    EXPECT_NEAR(gl[0], want0, 1e-4) << what << " row " << r;
    for (int j = 0; j < kMaxTopLogprobs; ++j) {
      if (j < p.logprobs) {
        EXPECT_EQ(gi[j], ci[j]) << what << " row " << r << " top " << j;
        EXPECT_TRUE(std::isfinite(gl[1 + j])) << what << " row " << r << " top " << j;
        t->max_lp_err = std::max(t->max_lp_err, double(std::fabs(gl[1 + j] - cl[1 + j])));
        EXPECT_NEAR(gl[1 + j], cl[1 + j], 1e-4) << what << " row " << r << " top " << j;
      } else {
        EXPECT_EQ(gi[j], -1) << what << " row " << r << " col " << j;
        EXPECT_TRUE(std::isnan(gl[1 + j])) << what << " row " << r << " col " << j;
      }
    }
  }
  // The penalty state of the slots in use.
  if (b.n_slots > 0) {
    Buffer g_mask = cuda::to_host(dev_mask), g_counts = cuda::to_host(dev_counts);
    EXPECT_EQ(0, std::memcmp(g_mask.view().data, host_mask.view().data,
                             size_t(b.n_slots * words) * sizeof(int32_t)))
        << what << " prompt masks";
    EXPECT_EQ(0, std::memcmp(g_counts.view().data, host_counts.view().data,
                             size_t(b.n_slots) * kVocab * sizeof(int32_t)))
        << what << " output counts";
  }
  return std::vector<int32_t>(tok.ptr<int32_t>(), tok.ptr<int32_t>() + n);
}

TEST(CudaOps, SampleMatchesCpuOnTheRealVocabulary) {
  OSPREY_REQUIRE_GPU();
  struct Size {
    int rows, reps;
  };
  for (const Size s : {Size{1, 48}, Size{16, 12}, Size{64, 6}}) {
    Tally t;
    char what[64];
    std::snprintf(what, sizeof what, "sample n_rows=%d", s.rows);
    for (int rep = 0; rep < s.reps; ++rep) {
      Buffer logits(DType::F32, {s.rows, kVocab});
      std::vector<SampleCase> cases;
      for (int r = 0; r < s.rows; ++r)
        cases.push_back(make_case((r + rep) % kKinds, logits.f32() + int64_t(r) * kVocab));
      DeviceBuffer d_logits = upload(logits);
      SampleBatch first;
      for (const SampleCase& c : cases) first.add(c, /*reset=*/true);
      const int64_t n_slots = std::max(first.n_slots, 1);
      // Garbage state: the first step's resets must clear it.
      Buffer host_mask(DType::I32, {n_slots, sample_mask_words(kVocab)}),
          host_counts(DType::I32, {n_slots, kVocab});
      std::memset(host_mask.view().data, 0x5a, host_mask.view().nbytes());
      std::memset(host_counts.view().data, 0x5a, host_counts.view().nbytes());
      DeviceBuffer dev_mask = poisoned(DType::I32, {n_slots, sample_mask_words(kVocab)}),
                   dev_counts = poisoned(DType::I32, {n_slots, kVocab});
      const std::vector<int32_t> tokens = run_and_compare(
          first, logits, d_logits, host_mask, host_counts, dev_mask, dev_counts, what, &t);
      // Step 2: the row appended the CPU's token; each slot is kept and counts that one token.
      // Same logits: the next step number gives a new uniform.
      SampleBatch second;
      for (size_t r = 0; r < cases.size(); ++r) {
        SampleCase c = cases[r];
        c.p.step += 1;
        c.counted = {std::max(tokens[r], 0)};
        second.add(c, /*reset=*/false, first.rows[r].penalty_slot);
      }
      run_and_compare(second, logits, d_logits, host_mask, host_counts, dev_mask, dev_counts, what,
                      &t);
    }
    std::printf(
        "TWIN %-44s greedy identical %d/%d, sampled differing %d of %d (largest boundary "
        "margin %.1e), logprob rows %d max err %.2e\n",
        what, t.greedy_equal, t.greedy, t.differing, t.sampled, t.max_margin, t.logprob_rows,
        t.max_lp_err);
    EXPECT_EQ(t.unexplained, 0) << what;
    // Rounding cases are rare (an ulp of e_i against a random uniform): more than 1 % of the
    // draws would mean a systematic difference even if each looked like a boundary.
    EXPECT_LE(t.differing, std::max(1, t.sampled / 100)) << what;
    EXPECT_GT(t.sampled, 0);
    EXPECT_GT(t.greedy, 0);
  }
}

// Error codes are the same on both twins.
TEST(CudaOps, SampleErrorCodes) {
  OSPREY_REQUIRE_GPU();
  const int64_t vocab = 1000;
  Buffer logits = rand_f32({3, vocab}, -2, 2);
  logits.f32()[5] = std::numeric_limits<float>::quiet_NaN();              // row 0: NaN
  for (int64_t i = 0; i < vocab; ++i) logits.f32()[vocab + i] = kNegInf;  // row 1: all −inf
  SampleBatch b;
  b.vocab = int(vocab);
  SampleCase c;
  b.add(c, false);
  b.add(c, false);
  c.suppress = {int32_t(vocab)};  // row 2: an id outside the vocabulary
  b.add(c, false);
  Buffer rows = b.rows_tensor(), lists = b.lists_tensor();
  Buffer tok(DType::I32, {3});
  ops::sample(tok, Buffer(DType::F32, {0, 1 + kMaxTopLogprobs}),
              Buffer(DType::I32, {0, kMaxTopLogprobs}), logits, SampleMeta{3, rows, lists, {}, {}});
  DeviceBuffer d_logits = upload(logits), d_rows = cuda::to_device(rows),
               d_lists = cuda::to_device(lists), d_tok = poisoned(DType::I32, {3});
  DeviceBuffer d_lp(DType::F32, {0, 1 + kMaxTopLogprobs}), d_ids(DType::I32, {0, kMaxTopLogprobs});
  ops::sample(d_tok, d_lp, d_ids, d_logits, SampleMeta{3, d_rows, d_lists, {}, {}});
  Buffer g = download(d_tok);
  const int32_t want[3] = {kSampleErrorNonFinite, kSampleErrorAllSuppressed, kSampleErrorBadInput};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(tok.ptr<int32_t>()[r], want[r]) << "cpu row " << r;
    EXPECT_EQ(g.ptr<int32_t>()[r], want[r]) << "cuda row " << r;
  }
}

// Time per call on the real vocabulary (informational: PERF lines).
TEST(CudaOps, SamplePerf) {
  OSPREY_REQUIRE_GPU();
  for (int n : {1, 16, 64}) {
    Buffer logits(DType::F32, {n, kVocab});
    SampleBatch b;
    for (int r = 0; r < n; ++r)
      b.add(make_case(r % kKinds, logits.f32() + int64_t(r) * kVocab), true);
    DeviceBuffer d_logits = upload(logits);
    Buffer rows = b.rows_tensor(), lists = b.lists_tensor();
    DeviceBuffer d_rows = cuda::to_device(rows), d_lists = cuda::to_device(lists);
    const int64_t n_slots = std::max(b.n_slots, 1);
    DeviceBuffer mask(DType::I32, {n_slots, sample_mask_words(kVocab)}),
        counts(DType::I32, {n_slots, kVocab});
    DeviceBuffer tok(DType::I32, {n}), lp(DType::F32, {b.n_lp, 1 + kMaxTopLogprobs}),
        ids(DType::I32, {b.n_lp, kMaxTopLogprobs});
    const SampleMeta m{n, d_rows, d_lists, mask, counts};
    ops::sample(tok, lp, ids, d_logits, m);  // warm-up (scratch)
    cuda::synchronize();
    constexpr int kIters = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) ops::sample(tok, lp, ids, d_logits, m);
    cuda::synchronize();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        kIters;
    std::printf("PERF sample n_rows=%-3d vocab %d (mixed kinds): %.1f us per call\n", n, kVocab,
                us);
    EXPECT_GT(us, 0.0);
  }
}

}  // namespace
}  // namespace osprey
