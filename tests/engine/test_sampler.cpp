#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"

using namespace osprey;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Chi-square critical values at p = 0.001, by degrees of freedom: a correct sampler fails a test
// with probability 0.001 per seed; with fixed seeds each test is deterministic.
double chi2_critical_001(int df) {
  static const double kTable[] = {0,      10.828, 13.816, 16.266, 18.467, 20.515, 22.458,
                                  24.322, 26.124, 27.877, 29.588, 31.264, 32.909, 34.528,
                                  36.123, 37.697, 39.252, 40.790, 42.312, 43.820, 45.315,
                                  46.797, 48.268, 49.728, 51.179};
  OSPREY_CHECK(df >= 1 && df <= 24, "df ", df);
  return kTable[df];
}

// One request as the engine would hold it.
struct Request {
  SamplingParams params;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  uint64_t seed = 0;
  int eos = -1;
  SamplingRow row() const { return SamplingRow{&params, &prompt, &output, seed, eos}; }
};

// Samples one row.
SampleResult sample_one(Sampler& s, const std::vector<float>& logits, const SamplingRow& row) {
  Buffer b(DType::F32, {1, static_cast<int64_t>(logits.size())});
  std::copy(logits.begin(), logits.end(), b.f32());
  std::vector<SampleResult> out;
  s.sample(b, {row}, &out);
  EXPECT_EQ(out.size(), 1u);
  return out[0];
}

// The distribution the sampler must draw from, computed independently in double in vLLM v1's
// order: temperature → min-p → top-k → top-p (each renormalised). Assumes distinct logits.
std::vector<double> expected_probs(const std::vector<float>& logits, float temperature, int top_k,
                                   float top_p, float min_p) {
  const size_t n = logits.size();
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(logits[i]) / temperature;
  const double mx = *std::max_element(x.begin(), x.end());
  std::vector<double> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = std::exp(x[i] - mx);  // p / p_max
  std::vector<bool> keep(n, true);
  for (size_t i = 0; i < n; ++i) keep[i] = p[i] >= min_p;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
  if (top_k > 0) {
    int rank = 0;
    for (size_t i : order) {
      if (keep[i] && ++rank > top_k) keep[i] = false;
    }
  }
  if (top_p < 1.0f) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += keep[i] ? p[i] : 0.0;
    double ahead = 0;
    for (size_t i : order) {
      if (!keep[i]) continue;
      if (ahead / total >= top_p) keep[i] = false;
      ahead += p[i];
    }
  }
  double z = 0;
  for (size_t i = 0; i < n; ++i) z += keep[i] ? p[i] : 0.0;
  for (size_t i = 0; i < n; ++i) p[i] = keep[i] ? p[i] / z : 0.0;
  return p;
}

// Draws n tokens as one generation (the counter is the output length) and returns the counts.
std::vector<int> draw_counts(const std::vector<float>& logits, Request req, int n) {
  Sampler s;
  std::vector<int> counts(logits.size(), 0);
  for (int k = 0; k < n; ++k) {
    const int32_t t = sample_one(s, logits, req.row()).token;
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    ++counts[static_cast<size_t>(t)];
    req.output.push_back(t);
  }
  return counts;
}

struct ChiSquare {
  double stat = 0;
  int df = 0;
  int impossible_draws = 0;  // draws of tokens whose expected probability is 0
};

ChiSquare chi_square(const std::vector<int>& counts, const std::vector<double>& probs) {
  ChiSquare r;
  double n = 0;
  for (int c : counts) n += c;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0.0) {
      r.impossible_draws += counts[i];
      continue;
    }
    const double e = n * probs[i];
    r.stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  r.df = cells - 1;
  return r;
}

constexpr int kDraws = 20000;
const std::vector<float> kLogits = {1.5f, 1.2f, 0.9f, 0.4f, 0.0f, -0.3f, -0.8f, -1.5f};

// The goodness-of-fit check plus the negative control: the same draws against a wrong
// distribution must fail the same threshold.
void expect_fit(const Request& req, const std::vector<double>& probs,
                const std::vector<double>& wrong_probs) {
  const std::vector<int> counts = draw_counts(kLogits, req, kDraws);
  const ChiSquare fit = chi_square(counts, probs);
  ASSERT_GE(fit.df, 1);
  EXPECT_EQ(fit.impossible_draws, 0) << "drew tokens the filters remove";
  EXPECT_LT(fit.stat, chi2_critical_001(fit.df)) << "df " << fit.df;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i;
    }
  }
  const ChiSquare control = chi_square(counts, wrong_probs);
  EXPECT_GT(control.stat, 10 * chi2_critical_001(control.df))
      << "the negative control would not have caught a wrong distribution";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The random stream.

TEST(SamplingUniform, IsUniformAndSeriallyIndependent) {
  constexpr int kBins = 20;
  std::vector<int> bins(kBins, 0);
  std::vector<int> pairs(25, 0);  // (u_k, u_k+1) on a 5 x 5 grid
  double prev = sampling_uniform(99, 0);
  for (int k = 0; k < kDraws; ++k) {
    const double u = sampling_uniform(99, static_cast<uint64_t>(k));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++bins[static_cast<size_t>(u * kBins)];
    if (k > 0) ++pairs[static_cast<size_t>(int(prev * 5) * 5 + int(u * 5))];
    prev = u;
  }
  const ChiSquare b = chi_square(bins, std::vector<double>(kBins, 1.0 / kBins));
  EXPECT_LT(b.stat, chi2_critical_001(b.df));
  const ChiSquare p = chi_square(pairs, std::vector<double>(25, 1.0 / 25));
  EXPECT_LT(p.stat, chi2_critical_001(p.df));

  // Across seeds at one step (the first token of many requests) too.
  std::fill(bins.begin(), bins.end(), 0);
  for (int s = 0; s < kDraws; ++s) {
    ++bins[static_cast<size_t>(sampling_uniform(static_cast<uint64_t>(s), 0) * kBins)];
  }
  const ChiSquare c = chi_square(bins, std::vector<double>(kBins, 1.0 / kBins));
  EXPECT_LT(c.stat, chi2_critical_001(c.df));
}

// ---------------------------------------------------------------------------------------------
// Distributions: goodness of fit against probabilities computed here, each with a control.

TEST(SamplerDistribution, Temperature) {
  Request req;
  req.seed = 12345;
  req.params.temperature = 0.7f;
  expect_fit(req, expected_probs(kLogits, 0.7f, 0, 1.0f, 0.0f),
             expected_probs(kLogits, 1.0f, 0, 1.0f, 0.0f));  // the untempered distribution
}

TEST(SamplerDistribution, TemperatureAboveOne) {
  Request req;
  req.seed = 777;
  req.params.temperature = 1.8f;
  expect_fit(req, expected_probs(kLogits, 1.8f, 0, 1.0f, 0.0f),
             expected_probs(kLogits, 1.0f, 0, 1.0f, 0.0f));
}

TEST(SamplerDistribution, TopK) {
  Request req;
  req.seed = 2024;
  req.params.temperature = 1.3f;
  req.params.top_k = 3;
  expect_fit(req, expected_probs(kLogits, 1.3f, 3, 1.0f, 0.0f),
             expected_probs(kLogits, 1.3f, 4, 1.0f, 0.0f));  // one token too many
}

TEST(SamplerDistribution, TopP) {
  Request req;
  req.seed = 31337;
  req.params.top_p = 0.75f;
  const std::vector<double> probs = expected_probs(kLogits, 1.0f, 0, 0.75f, 0.0f);
  // softmax(kLogits) has cumulative mass .316 .551 .724 .830: the three tokens ahead of the fourth
  // carry .724 < .75, those ahead of the fifth .830, so four are kept.
  EXPECT_EQ(std::count_if(probs.begin(), probs.end(), [](double p) { return p > 0; }), 4);
  expect_fit(req, probs, expected_probs(kLogits, 1.0f, 0, 1.0f, 0.0f));
}

TEST(SamplerDistribution, MinP) {
  Request req;
  req.seed = 4242;
  req.params.temperature = 0.9f;
  req.params.min_p = 0.2f;
  const std::vector<double> probs = expected_probs(kLogits, 0.9f, 0, 1.0f, 0.2f);
  // p_i / p_max = exp((x_i − 1.5) / 0.9) ≥ 0.2 ⇔ x_i ≥ 0.051: four tokens.
  EXPECT_EQ(std::count_if(probs.begin(), probs.end(), [](double p) { return p > 0; }), 4);
  expect_fit(req, probs, expected_probs(kLogits, 0.9f, 0, 1.0f, 0.0f));
}

TEST(SamplerDistribution, AllFiltersTogether) {
  Request req;
  req.seed = 8;
  req.params.temperature = 1.2f;
  req.params.min_p = 0.1f;
  req.params.top_k = 6;
  req.params.top_p = 0.8f;
  // min-p keeps 7 (p/p_max .082 < .1 for the last), top-k 6; top-p over those six: the mass
  // ahead of the 4th is .724 < .8, ahead of the 5th .845, so 4 remain.
  const std::vector<double> probs = expected_probs(kLogits, 1.2f, 6, 0.8f, 0.1f);
  EXPECT_EQ(std::count_if(probs.begin(), probs.end(), [](double p) { return p > 0; }), 4);
  expect_fit(req, probs, expected_probs(kLogits, 1.2f, 6, 1.0f, 0.1f));
}

TEST(SamplerDistribution, MinPRunsBeforeTopP) {
  // As vLLM v1: top-p measures mass over what min-p kept. At T = 1, min-p 0.2 keeps five tokens
  // (p/p_max 1 .741 .549 .333 .223); over those, the mass ahead of the 5th is .922 ≥ .88, so top-p
  // leaves four. Top-p first (over all eight) would keep five (mass ahead of the 6th is .900),
  // and min-p after it removes none of them: the control.
  Request req;
  req.seed = 99;
  req.params.min_p = 0.2f;
  req.params.top_p = 0.88f;
  const std::vector<double> probs = expected_probs(kLogits, 1.0f, 0, 0.88f, 0.2f);
  EXPECT_EQ(std::count_if(probs.begin(), probs.end(), [](double p) { return p > 0; }), 4);
  const std::vector<double> top_p_first = expected_probs(kLogits, 1.0f, 0, 0.88f, 0.0f);
  EXPECT_EQ(std::count_if(top_p_first.begin(), top_p_first.end(), [](double p) { return p > 0; }),
            5);
  expect_fit(req, probs, top_p_first);
}

TEST(SamplerDistribution, PenaltiesShiftTheSampledDistribution) {
  // Frequency/presence penalties change the logits every step as the output grows, so the check
  // uses fresh requests (one draw each, output fixed) that differ only in the seed.
  Request req;
  req.params.temperature = 1.0f;
  req.params.presence_penalty = 1.0f;
  req.params.frequency_penalty = 0.5f;
  req.output = {0, 0, 2};  // token 0: −0.5·2 − 1; token 2: −0.5 − 1
  std::vector<float> shifted = kLogits;
  shifted[0] -= 2.0f;
  shifted[2] -= 1.5f;
  Sampler s;
  std::vector<int> counts(kLogits.size(), 0);
  for (int k = 0; k < kDraws; ++k) {
    req.seed = static_cast<uint64_t>(k) * 7919u + 1;
    ++counts[static_cast<size_t>(sample_one(s, kLogits, req.row()).token)];
  }
  const ChiSquare fit = chi_square(counts, expected_probs(shifted, 1.0f, 0, 1.0f, 0.0f));
  EXPECT_LT(fit.stat, chi2_critical_001(fit.df));
  const ChiSquare control = chi_square(counts, expected_probs(kLogits, 1.0f, 0, 1.0f, 0.0f));
  EXPECT_GT(control.stat, 10 * chi2_critical_001(control.df));
}

TEST(SamplerDistribution, NeverDrawsFilteredTokensOnALargeVocabulary) {
  constexpr int kVocab = 5000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kVocab);
  for (float& v : logits) v = normal(rng);
  std::vector<int> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });

  struct Case {
    int top_k;
    float top_p;
    float min_p;
  };
  for (const Case& c :
       {Case{7, 1.0f, 0.0f}, Case{0, 0.3f, 0.0f}, Case{0, 1.0f, 0.05f}, Case{50, 0.5f, 0.05f}}) {
    SCOPED_TRACE(testing::Message()
                 << "top_k " << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p);
    const std::vector<double> probs = expected_probs(logits, 1.0f, c.top_k, c.top_p, c.min_p);
    const auto support = std::count_if(probs.begin(), probs.end(), [](double p) { return p > 0; });
    EXPECT_GT(support, 3);
    EXPECT_LT(support, kVocab / 10);
    Request req;
    req.seed = 1;
    req.params.top_k = c.top_k;
    req.params.top_p = c.top_p;
    req.params.min_p = c.min_p;
    const std::vector<int> counts = draw_counts(logits, req, 3000);
    int distinct = 0;
    for (int i = 0; i < kVocab; ++i) {
      if (probs[static_cast<size_t>(i)] == 0.0) {
        EXPECT_EQ(counts[static_cast<size_t>(i)], 0) << "token " << i << " k " << c.top_k;
      }
      distinct += counts[static_cast<size_t>(i)] > 0;
    }
    EXPECT_GT(distinct, 3);  // it does sample, not only take the argmax
    if (c.top_k == 7) {
      EXPECT_EQ(distinct, 7);
    }
  }
}

TEST(SamplerDistribution, TopPOnALargeVocabularyFitsTheNucleus) {
  // Many tokens below the nucleus: exercises the pre-filter that drops them before sorting.
  constexpr int kVocab = 2000;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> logits(kVocab);
  for (float& v : logits) v = normal(rng);
  const std::vector<double> probs = expected_probs(logits, 1.0f, 0, 0.5f, 0.0f);
  const auto support = std::count_if(probs.begin(), probs.end(), [](double p) { return p > 0; });
  ASSERT_GE(support, 5);
  ASSERT_LE(support, 25);
  Request req;
  req.seed = 606;
  req.params.top_p = 0.5f;
  const std::vector<int> counts = draw_counts(logits, req, kDraws);
  const ChiSquare fit = chi_square(counts, probs);
  EXPECT_EQ(fit.impossible_draws, 0);
  EXPECT_LT(fit.stat, chi2_critical_001(fit.df)) << "support " << support;
  // Control: the nucleus one token smaller.
  std::vector<double> smaller = probs;
  const auto weakest = std::min_element(smaller.begin(), smaller.end(), [](double a, double b) {
    return (a > 0 ? a : 2.0) < (b > 0 ? b : 2.0);
  });
  *weakest = 0.0;
  const double z = std::accumulate(smaller.begin(), smaller.end(), 0.0);
  for (double& p : smaller) p /= z;
  EXPECT_GT(chi_square(counts, smaller).impossible_draws, 0);
}

TEST(SamplerDistribution, TopKKeepsTiesAtTheBoundary) {
  // Top-2 of {3, 1, 1, 0}: the second-largest value is shared, so both 1s stay (as vLLM's
  // threshold mask does), each with the probability softmax gives it among the three.
  const std::vector<float> logits = {3.0f, 1.0f, 1.0f, 0.0f};
  Request req;
  req.seed = 3;
  req.params.top_k = 2;
  const std::vector<int> counts = draw_counts(logits, req, kDraws);
  EXPECT_EQ(counts[3], 0);
  const double z = std::exp(3.0) + 2 * std::exp(1.0);
  const std::vector<double> probs = {std::exp(3.0) / z, std::exp(1.0) / z, std::exp(1.0) / z, 0};
  const ChiSquare fit = chi_square(counts, probs);
  EXPECT_LT(fit.stat, chi2_critical_001(fit.df));
}

// ---------------------------------------------------------------------------------------------
// Greedy.

TEST(SamplerGreedy, PicksTheArgmaxWithTiesToTheLowestId) {
  Sampler s;
  Request req;
  req.params.temperature = 0.0f;
  req.params.top_k = 2;  // ignored by greedy
  EXPECT_EQ(sample_one(s, {0.1f, 2.0f, -1.0f, 1.9f}, req.row()).token, 1);
  EXPECT_EQ(sample_one(s, {0.5f, 3.0f, 3.0f, 3.0f}, req.row()).token, 1);
  EXPECT_EQ(sample_one(s, {-kInf, -5.0f, -4.0f}, req.row()).token, 2);
  // Below the greedy threshold counts as greedy; the seed plays no part.
  req.params.temperature = 1e-6f;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    req.seed = seed;
    EXPECT_EQ(sample_one(s, {0.1f, 2.0f, 1.99f, 1.9f}, req.row()).token, 1);
  }
}

TEST(SamplerGreedy, LowTemperatureSamplingConvergesToTheArgmax) {
  Sampler s;
  Request req;
  req.params.temperature = 0.01f;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    req.seed = seed;
    EXPECT_EQ(sample_one(s, kLogits, req.row()).token, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Seeds and batches.

namespace {

// Logits for step k of a fake model: a fixed function of (stream, step).
std::vector<float> fake_logits(int stream, int step, int vocab) {
  std::mt19937 rng(static_cast<uint32_t>(stream * 100003 + step));
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (float& x : v) x = normal(rng);
  return v;
}

// Runs `steps` decode steps of the requests as one batch in the given row order; the logits of a
// request depend only on its stream id and step. Returns each request's output.
std::vector<std::vector<int32_t>> generate(std::vector<Request> reqs,
                                           const std::vector<int>& streams,
                                           const std::vector<size_t>& row_order, int steps,
                                           int vocab) {
  Sampler s;
  Buffer logits(DType::F32, {static_cast<int64_t>(row_order.size()), vocab});
  std::vector<SampleResult> out;
  for (int step = 0; step < steps; ++step) {
    std::vector<SamplingRow> rows;
    for (size_t r = 0; r < row_order.size(); ++r) {
      const size_t q = row_order[r];
      const std::vector<float> l = fake_logits(streams[q], step, vocab);
      std::copy(l.begin(), l.end(), logits.f32() + r * static_cast<size_t>(vocab));
      rows.push_back(reqs[q].row());
    }
    s.sample(logits, rows, &out);
    for (size_t r = 0; r < row_order.size(); ++r) reqs[row_order[r]].output.push_back(out[r].token);
  }
  std::vector<std::vector<int32_t>> outputs;
  for (const Request& r : reqs) outputs.push_back(r.output);
  return outputs;
}

}  // namespace

TEST(SamplerSeed, SameSeedSameTokensInAnyBatch) {
  constexpr int kVocab = 300;
  constexpr int kSteps = 40;
  Request a;
  a.seed = 0xabcdef;
  a.params.temperature = 1.1f;
  a.params.top_p = 0.95f;
  a.params.repetition_penalty = 1.2f;
  a.prompt = {1, 2, 3};
  Request greedy;
  greedy.params.temperature = 0.0f;
  Request other;
  other.seed = 5;
  other.params.top_k = 20;
  other.params.frequency_penalty = 0.7f;
  Request same_seed_other_logits = a;  // same seed, another prompt's logits

  const auto alone = generate({a}, {0}, {0}, kSteps, kVocab);
  const auto batch = generate({greedy, other, a, same_seed_other_logits}, {1, 2, 0, 3},
                              {0, 1, 2, 3}, kSteps, kVocab);
  const auto reordered = generate({greedy, other, a, same_seed_other_logits}, {1, 2, 0, 3},
                                  {2, 3, 1, 0}, kSteps, kVocab);
  const auto smaller = generate({other, a}, {2, 0}, {1, 0}, kSteps, kVocab);
  EXPECT_EQ(alone[0], batch[2]);
  EXPECT_EQ(alone[0], reordered[2]);
  EXPECT_EQ(alone[0], smaller[1]);
  EXPECT_EQ(batch[1], smaller[0]);  // the other seeded request too
  EXPECT_NE(batch[2], batch[3]);    // the logits matter, not only the seed
  // It is not greedy in disguise: the sampled run leaves the argmax somewhere.
  const auto argmax_run = generate({greedy}, {0}, {0}, kSteps, kVocab);
  EXPECT_NE(alone[0], argmax_run[0]);
}

TEST(SamplerSeed, DifferentSeedsGiveDifferentTokens) {
  constexpr int kVocab = 50;
  Request a;
  a.seed = 1;
  Request b = a;
  b.seed = 2;
  const auto out = generate({a, b}, {0, 0}, {0, 1}, 40, kVocab);
  EXPECT_NE(out[0], out[1]);
  int same = 0;
  for (size_t k = 0; k < out[0].size(); ++k) same += out[0][k] == out[1][k];
  EXPECT_LT(same, 20);  // the two streams are not merely shifted copies
}

TEST(SamplerSeed, TheStepCounterIsTheOutputLength) {
  // The same request state gives the same token twice (no hidden state in the sampler), and a
  // different output length gives another uniform.
  Sampler s;
  Request req;
  req.seed = 77;
  const std::vector<float> flat(1000, 0.0f);
  const int32_t t0 = sample_one(s, flat, req.row()).token;
  EXPECT_EQ(sample_one(s, flat, req.row()).token, t0);
  EXPECT_EQ(t0, static_cast<int32_t>(sampling_uniform(77, 0) * 1000));
  req.output = {4};
  EXPECT_EQ(sample_one(s, flat, req.row()).token,
            static_cast<int32_t>(sampling_uniform(77, 1) * 1000));
}

// ---------------------------------------------------------------------------------------------
// Penalties and min_tokens.

TEST(SamplerPenalties, ChangeLogitsByTheExactAmounts) {
  Sampler s;
  Request req;
  req.params.repetition_penalty = 1.5f;
  req.params.frequency_penalty = 0.4f;
  req.params.presence_penalty = 0.3f;
  req.prompt = {0, 1, 0, 0};
  req.output = {1, 3, 3};
  std::vector<float> x = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  s.apply_logits_processors(x.data(), 5, req.row());
  EXPECT_EQ(x[0], 2.0f / 1.5f);                        // prompt only: repetition, once
  EXPECT_EQ(x[1], -1.0f * 1.5f - 0.4f * 1.0f - 0.3f);  // negative: × r; count 1
  EXPECT_EQ(x[2], 0.5f);                               // untouched
  EXPECT_EQ(x[3], 3.0f / 1.5f - 0.4f * 2.0f - 0.3f);   // count 2
  EXPECT_EQ(x[4], -2.0f);                              // untouched

  // Scratch is clean afterwards: the same call gives the same result, and a request without
  // penalties is untouched.
  std::vector<float> y = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  s.apply_logits_processors(y.data(), 5, req.row());
  EXPECT_EQ(x, y);
  Request plain;
  plain.output = {1, 3, 3};
  std::vector<float> z = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  s.apply_logits_processors(z.data(), 5, plain.row());
  EXPECT_EQ(z, (std::vector<float>{2.0f, -1.0f, 0.5f, 3.0f, -2.0f}));
}

TEST(SamplerPenalties, NegativePenaltiesRewardAndRepetitionBelowOneEncourages) {
  Sampler s;
  Request req;
  req.params.repetition_penalty = 0.5f;
  req.params.frequency_penalty = -1.0f;
  req.params.presence_penalty = -0.5f;
  req.output = {2};
  std::vector<float> x = {1.0f, 1.0f, 1.0f, -1.0f};
  req.prompt = {3};
  s.apply_logits_processors(x.data(), 4, req.row());
  EXPECT_EQ(x[2], 1.0f / 0.5f + 1.0f + 0.5f);
  EXPECT_EQ(x[3], -1.0f * 0.5f);
  EXPECT_EQ(x[0], 1.0f);
}

TEST(SamplerPenalties, FlipTheGreedyChoice) {
  Sampler s;
  Request req;
  req.params.temperature = 0.0f;
  req.params.presence_penalty = 0.5f;
  const std::vector<float> logits = {1.0f, 1.3f, 0.9f};
  EXPECT_EQ(sample_one(s, logits, req.row()).token, 1);
  req.output = {1};
  EXPECT_EQ(sample_one(s, logits, req.row()).token, 0);  // 1.3 − 0.5 < 1.0
  req.output = {1, 0};
  EXPECT_EQ(sample_one(s, logits, req.row()).token, 2);
  // The penalties read the whole batch row by row: a second row with no output is unaffected.
  Request fresh = req;
  fresh.output.clear();
  Buffer b(DType::F32, {2, 3});
  std::copy(logits.begin(), logits.end(), b.f32());
  std::copy(logits.begin(), logits.end(), b.f32() + 3);
  std::vector<SampleResult> out;
  s.sample(b, {req.row(), fresh.row()}, &out);
  EXPECT_EQ(out[0].token, 2);
  EXPECT_EQ(out[1].token, 1);
  // The logits are read, never written.
  EXPECT_EQ(std::vector<float>(b.f32(), b.f32() + 3), logits);
  EXPECT_EQ(std::vector<float>(b.f32() + 3, b.f32() + 6), logits);
}

TEST(SamplerMinTokens, SuppressesEosAndStopIdsUntilMinTokens) {
  Sampler s;
  Request req;
  req.params.temperature = 0.0f;
  req.params.min_tokens = 3;
  req.params.stop_token_ids = {4};
  req.eos = 0;
  // EOS (0) is the favourite, then stop id 4, then 2.
  const std::vector<float> logits = {5.0f, 1.0f, 2.0f, 0.0f, 4.0f};
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(sample_one(s, logits, req.row()).token, 2) << "output length " << k;
    req.output.push_back(2);
  }
  EXPECT_EQ(sample_one(s, logits, req.row()).token, 0);  // min_tokens reached

  // Sampled rows too: EOS and the stop id are never drawn before min_tokens.
  Request sampled;
  sampled.params.min_tokens = 1;
  sampled.params.stop_token_ids = {4};
  sampled.eos = 0;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    sampled.seed = seed;
    const int32_t t = sample_one(s, logits, sampled.row()).token;
    EXPECT_NE(t, 0);
    EXPECT_NE(t, 4);
  }
  // The suppression shows in the processed logits, and min_tokens 0 suppresses nothing.
  std::vector<float> x = logits;
  s.apply_logits_processors(x.data(), 5, sampled.row());
  EXPECT_EQ(x[0], -kInf);
  EXPECT_EQ(x[4], -kInf);
  EXPECT_EQ(x[2], 2.0f);
  sampled.params.min_tokens = 0;
  x = logits;
  s.apply_logits_processors(x.data(), 5, sampled.row());
  EXPECT_EQ(x, logits);
}

TEST(SamplerMinTokens, IgnoreEosLeavesEosAlone) {
  // With ignore_eos, EOS is no stop token, so min_tokens has no reason to hide it (as vLLM);
  // stop_token_ids are still suppressed.
  Sampler s;
  Request req;
  req.params.temperature = 0.0f;
  req.params.min_tokens = 2;
  req.params.ignore_eos = true;
  req.params.stop_token_ids = {1};
  req.eos = 0;
  EXPECT_EQ(sample_one(s, {5.0f, 6.0f, 2.0f}, req.row()).token, 0);
}

// ---------------------------------------------------------------------------------------------
// Logprobs.

TEST(SamplerLogprobs, AreTheLogSoftmaxOfTheRawLogitsSortedDescending) {
  Sampler s;
  Request req;
  req.seed = 11;
  req.params.logprobs = 3;
  req.params.temperature = 0.5f;  // neither temperature nor penalties touch the logprobs
  req.params.repetition_penalty = 1.7f;
  req.params.presence_penalty = 1.0f;
  req.prompt = {0};
  req.output = {2};
  const std::vector<float> logits = {0.3f, -1.0f, 2.5f, 2.0f, 0.3f, -4.0f};
  double lse = 0;
  for (float v : logits) lse += std::exp(static_cast<double>(v));
  lse = std::log(lse);
  const SampleResult r = sample_one(s, logits, req.row());
  EXPECT_NEAR(r.logprob, logits[static_cast<size_t>(r.token)] - lse, 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  const int32_t expected_ids[] = {2, 3, 0};  // 0 and 4 tie: the lower id wins the last place
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(r.top_logprobs[j].first, expected_ids[j]);
    EXPECT_NEAR(r.top_logprobs[j].second, logits[static_cast<size_t>(expected_ids[j])] - lse, 1e-6);
  }
  // Probabilities sum to one.
  double total = 0;
  for (float v : logits) total += std::exp(static_cast<double>(v) - lse);
  EXPECT_NEAR(total, 1.0, 1e-12);

  // logprobs 0: the sampled token's logprob only; −1: none.
  req.params.logprobs = 0;
  const SampleResult r0 = sample_one(s, logits, req.row());
  EXPECT_TRUE(r0.top_logprobs.empty());
  EXPECT_NEAR(r0.logprob, logits[static_cast<size_t>(r0.token)] - lse, 1e-6);
  req.params.logprobs = -1;
  const SampleResult rn = sample_one(s, logits, req.row());
  EXPECT_TRUE(std::isnan(rn.logprob));
  EXPECT_TRUE(rn.top_logprobs.empty());
}

TEST(SamplerLogprobs, TopTwentyOnALargeVocabulary) {
  constexpr int kVocab = 129280;  // DeepSeek-V3's
  const std::vector<float> logits = fake_logits(9, 0, kVocab);
  Sampler s;
  Request req;
  req.seed = 4;
  req.params.logprobs = SamplingParams::kMaxLogprobs;
  const SampleResult r = sample_one(s, logits, req.row());
  std::vector<int32_t> ids(kVocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  double lse = 0;
  const double mx = logits[static_cast<size_t>(ids[0])];
  for (float v : logits) lse += std::exp(v - mx);
  lse = mx + std::log(lse);
  ASSERT_EQ(r.top_logprobs.size(), 20u);
  for (size_t j = 0; j < 20; ++j) {
    EXPECT_EQ(r.top_logprobs[j].first, ids[j]);
    EXPECT_NEAR(r.top_logprobs[j].second, logits[static_cast<size_t>(ids[j])] - lse, 1e-5);
    if (j > 0) {
      EXPECT_GE(r.top_logprobs[j - 1].second, r.top_logprobs[j].second);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Validation.

namespace {

// Expects validate() to throw an osprey::Error whose message contains every one of `words`.
void expect_rejected(const std::function<void(SamplingParams&)>& mutate,
                     const std::vector<std::string>& words, int vocab = 1000) {
  SamplingParams p;
  mutate(p);
  try {
    p.validate(vocab);
    ADD_FAILURE() << "accepted; expected an error naming " << words[0];
  } catch (const Error& e) {
    for (const std::string& w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << w << "\"";
    }
  }
}

}  // namespace

TEST(SamplingParamsValidate, AcceptsDefaultsAndEdges) {
  SamplingParams p;
  EXPECT_NO_THROW(p.validate(1000));
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = 1000;
  p.min_p = 1.0f;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = -2.0f;
  p.presence_penalty = 2.0f;
  p.max_tokens = 1;
  p.min_tokens = 1;
  p.stop_token_ids = {0, 999};
  p.stop = std::vector<std::string>(SamplingParams::kMaxStopStrings, "x");
  p.logprobs = SamplingParams::kMaxLogprobs;
  p.seed = ~uint64_t{0};
  EXPECT_NO_THROW(p.validate(1000));
  p.top_k = -1;
  p.logprobs = -1;
  p.temperature = 2.0f;
  EXPECT_NO_THROW(p.validate(1000));
}

TEST(SamplingParamsValidate, RejectsEachBadFieldByName) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_rejected([](SamplingParams& p) { p.temperature = -0.1f; }, {"temperature", "[0, 2]"});
  expect_rejected([](SamplingParams& p) { p.temperature = 2.5f; }, {"temperature", "[0, 2]"});
  expect_rejected([&](SamplingParams& p) { p.temperature = nan; }, {"temperature", "nan"});
  expect_rejected([](SamplingParams& p) { p.top_p = 0.0f; }, {"top_p", "(0, 1]"});
  expect_rejected([](SamplingParams& p) { p.top_p = 1.01f; }, {"top_p", "(0, 1]"});
  expect_rejected([&](SamplingParams& p) { p.top_p = nan; }, {"top_p"});
  expect_rejected([](SamplingParams& p) { p.top_k = -2; }, {"top_k", "1000"});
  expect_rejected([](SamplingParams& p) { p.top_k = 1001; }, {"top_k", "1000", "1001"});
  expect_rejected([](SamplingParams& p) { p.min_p = -0.01f; }, {"min_p", "[0, 1]"});
  expect_rejected([](SamplingParams& p) { p.min_p = 1.5f; }, {"min_p", "[0, 1]"});
  expect_rejected([&](SamplingParams& p) { p.min_p = nan; }, {"min_p"});
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = 0.0f; },
                  {"repetition_penalty", "(0, 2]"});
  expect_rejected([](SamplingParams& p) { p.repetition_penalty = 2.1f; },
                  {"repetition_penalty", "(0, 2]"});
  expect_rejected([&](SamplingParams& p) { p.repetition_penalty = nan; }, {"repetition_penalty"});
  expect_rejected([](SamplingParams& p) { p.frequency_penalty = -2.5f; },
                  {"frequency_penalty", "[-2, 2]"});
  expect_rejected([&](SamplingParams& p) { p.frequency_penalty = nan; }, {"frequency_penalty"});
  expect_rejected([](SamplingParams& p) { p.presence_penalty = 3.0f; },
                  {"presence_penalty", "[-2, 2]"});
  expect_rejected([&](SamplingParams& p) { p.presence_penalty = nan; }, {"presence_penalty"});
  expect_rejected([](SamplingParams& p) { p.max_tokens = 0; }, {"max_tokens", "at least 1"});
  expect_rejected([](SamplingParams& p) { p.min_tokens = -1; }, {"min_tokens", "[0, "});
  expect_rejected([](SamplingParams& p) { p.min_tokens = 17; }, {"min_tokens", "16", "17"});
  expect_rejected(
      [](SamplingParams& p) {
        p.stop_token_ids = {3, 1000};
      },
      {"stop_token_ids[1]", "[0, 1000)"});
  expect_rejected([](SamplingParams& p) { p.stop_token_ids = {-1}; }, {"stop_token_ids[0]"});
  expect_rejected([](SamplingParams& p) { p.stop = std::vector<std::string>(17, "a"); },
                  {"stop", "16"});
  expect_rejected([](SamplingParams& p) { p.stop = {"a", ""}; }, {"stop[1]", "non-empty"});
  expect_rejected([](SamplingParams& p) { p.logprobs = 21; }, {"logprobs", "[-1, 20]"});
  expect_rejected([](SamplingParams& p) { p.logprobs = -2; }, {"logprobs", "[-1, 20]"});
}

// ---------------------------------------------------------------------------------------------
// Penalty state kept between calls (state keys).

namespace {

// `steps` decode steps of the requests as one batch each step, with or without state keys; the
// batch at step s holds the requests batch_of(s) (so requests leave and come back).
std::vector<std::vector<int32_t>> generate_keyed(
    std::vector<Request> reqs, bool keyed, int steps, int vocab,
    const std::function<std::vector<size_t>(int)>& batch_of, Sampler* s,
    std::vector<size_t>* listed = nullptr) {
  std::vector<SampleResult> out;
  for (int step = 0; step < steps; ++step) {
    const std::vector<size_t> batch = batch_of(step);
    Buffer logits(DType::F32, {static_cast<int64_t>(batch.size()), vocab});
    std::vector<SamplingRow> rows;
    for (size_t r = 0; r < batch.size(); ++r) {
      const size_t q = batch[r];
      const std::vector<float> l = fake_logits(int(q), int(reqs[q].output.size()), vocab);
      std::copy(l.begin(), l.end(), logits.f32() + r * static_cast<size_t>(vocab));
      SamplingRow row = reqs[q].row();
      row.state_key = keyed ? q + 1 : 0;
      rows.push_back(row);
    }
    s->sample(logits, rows, &out);
    if (listed) listed->push_back(s->last_listed_tokens());
    for (size_t r = 0; r < batch.size(); ++r) reqs[batch[r]].output.push_back(out[r].token);
  }
  std::vector<std::vector<int32_t>> outputs;
  for (const Request& r : reqs) outputs.push_back(r.output);
  return outputs;
}

std::vector<Request> penalised_requests(int n) {
  std::vector<Request> reqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Request& r = reqs[static_cast<size_t>(i)];
    r.seed = 1000 + static_cast<uint64_t>(i);
    r.params.temperature = 0.9f;
    r.params.repetition_penalty = 1.0f + 0.1f * static_cast<float>(i % 4);
    r.params.frequency_penalty = 0.5f;
    r.params.presence_penalty = i % 2 ? 0.3f : 0.0f;
    r.prompt = {1, 2, 3, 4, static_cast<int32_t>(10 + i)};
  }
  return reqs;
}

}  // namespace

TEST(SamplerState, KeyedRowsSendOnlyNewTokensAndSampleLikeKeyless) {
  constexpr int kVocab = 200;
  const std::vector<Request> reqs = penalised_requests(3);
  auto all = [](int) { return std::vector<size_t>{0, 1, 2}; };
  Sampler keyless, keyed;
  std::vector<size_t> listed_keyless, listed_keyed;
  const auto a = generate_keyed(reqs, false, 30, kVocab, all, &keyless, &listed_keyless);
  const auto b = generate_keyed(reqs, true, 30, kVocab, all, &keyed, &listed_keyed);
  EXPECT_EQ(a, b);
  // Keyed: the prompts of the rows with repetition ≠ 1 (requests 1 and 2) once, then one token per
  // row per step. Keyless: every prompt and the whole output every step.
  EXPECT_EQ(listed_keyed[0], 10u);
  for (size_t s = 1; s < listed_keyed.size(); ++s) EXPECT_EQ(listed_keyed[s], 3u) << "step " << s;
  EXPECT_EQ(listed_keyless[29], 10u + 3u * 29u);
}

TEST(SamplerState, EvictedAndReleasedSlotsAreRebuilt) {
  // Seven penalised requests, batches of four rotating through them: slots are taken over by
  // other requests while their owners wait, and the owners come back to a rebuilt slot.
  constexpr int kVocab = 150;
  const std::vector<Request> reqs = penalised_requests(7);
  auto rotate = [](int step) {
    std::vector<size_t> b;
    for (int j = 0; j < 4; ++j) b.push_back(static_cast<size_t>((step * 3 + j) % 7));
    return b;
  };
  Sampler keyless, keyed;
  EXPECT_EQ(generate_keyed(reqs, false, 40, kVocab, rotate, &keyless),
            generate_keyed(reqs, true, 40, kVocab, rotate, &keyed));

  // After release, a different request under the same key (prompt of the same length) starts
  // afresh rather than inheriting the counts.
  Request first = penalised_requests(1)[0];
  first.params.repetition_penalty = 1.3f;
  first.output = {5, 5, 5, 7};
  Request other = first;
  other.prompt = {9, 8, 7, 6, 5};
  other.output = {6, 6, 6, 6, 6};
  std::vector<SampleResult> out;
  std::vector<float> flat(kVocab, 0.0f);
  flat[5] = 3.0f;
  flat[6] = 2.5f;
  Buffer logits(DType::F32, {1, kVocab});
  std::copy(flat.begin(), flat.end(), logits.f32());
  Sampler s;
  SamplingRow row = first.row();
  row.state_key = 77;
  s.sample(logits, {row}, &out);
  s.release(77);
  row = other.row();
  row.state_key = 77;
  s.sample(logits, {row}, &out);
  Sampler fresh;
  std::vector<SampleResult> want;
  fresh.sample(logits, {other.row()}, &want);
  EXPECT_EQ(out[0].token, want[0].token);
  EXPECT_EQ(s.last_listed_tokens(), other.prompt.size() + other.output.size());
}

// ---------------------------------------------------------------------------------------------
// Prepared sampling (Sampler::prepare / run_prepared / finish): what the CUDA graph runner samples
// from inside a decode graph, and the pending token of async scheduling's launch-time rows.

namespace {

// Requests of every kind the prepared rows carry: greedy, seeded top-k/top-p, penalties (keyed
// state), min_tokens with stop ids and EOS, logprobs.
std::vector<Request> mixed_requests() {
  std::vector<Request> reqs(5);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].seed = 77 + i;
    reqs[i].prompt = {1, 2, 3, static_cast<int32_t>(20 + i)};
    reqs[i].eos = 2;
  }
  reqs[0].params.temperature = 0.0f;
  reqs[1].params.temperature = 0.8f;
  reqs[1].params.top_k = 20;
  reqs[1].params.top_p = 0.9f;
  reqs[1].params.logprobs = 3;
  reqs[2].params.repetition_penalty = 1.3f;
  reqs[2].params.frequency_penalty = 0.4f;
  reqs[2].params.presence_penalty = 0.2f;
  reqs[3].params.min_tokens = 6;
  reqs[3].params.stop_token_ids = {4, 5};
  reqs[3].params.min_p = 0.05f;
  reqs[4].params.temperature = 0.0f;
  reqs[4].params.frequency_penalty = 1.0f;
  reqs[4].params.logprobs = 0;
  return reqs;
}

bool same_row_params(const SampleRowParams& a, const SampleRowParams& b) {
  return std::memcmp(&a, &b, sizeof(SampleRowParams)) == 0;
}

}  // namespace

TEST(SamplerPrepared, PendingTokenCountsAsTheOutputsLastElement) {
  // Sampler `now` samples each step with the output committed (sample()); Sampler `early`
  // prepares the same step before the commit, the last token pending (prepare + run_prepared), as
  // async scheduling does at a graph step's launch. Same rows, lists, tokens and logprobs.
  constexpr int kVocab = 64;
  std::vector<Request> reqs = mixed_requests();
  Sampler now, early;
  int min_tokens_rows = 0, penalty_rows = 0;
  for (int step = 0; step < 12; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int64_t n = static_cast<int64_t>(reqs.size());
    Buffer logits(DType::F32, {n, kVocab});
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<float> l = fake_logits(int(r), step, kVocab);
      std::copy(l.begin(), l.end(), logits.f32() + r * kVocab);
    }
    std::vector<SamplingRow> committed, pending;
    std::vector<std::vector<int32_t>> before(reqs.size());  // the output without its last token
    for (size_t r = 0; r < reqs.size(); ++r) {
      SamplingRow row = reqs[r].row();
      row.state_key = r + 1;
      committed.push_back(row);
      before[r] = reqs[r].output;
      if (!before[r].empty()) before[r].pop_back();
    }
    for (size_t r = 0; r < reqs.size(); ++r) {
      SamplingRow row = committed[r];
      row.output_tokens = &before[r];
      if (!reqs[r].output.empty()) row.pending_token = reqs[r].output.back();
      pending.push_back(row);
    }
    std::vector<SampleResult> a, b;
    now.sample(logits, committed, &a);
    early.prepare(Device::CPU, kVocab, pending);
    ASSERT_EQ(early.prepared_rows().size(), now.prepared_rows().size());
    for (size_t r = 0; r < reqs.size(); ++r) {
      EXPECT_TRUE(same_row_params(early.prepared_rows()[r], now.prepared_rows()[r])) << "row " << r;
      EXPECT_EQ(early.prepared_rows()[r].step, reqs[r].output.size()) << "row " << r;
      min_tokens_rows += early.prepared_rows()[r].suppress_count > 0;
      penalty_rows += early.prepared_rows()[r].penalty_slot >= 0;
    }
    EXPECT_EQ(early.prepared_lists(), now.prepared_lists());
    EXPECT_EQ(early.prepared_logprob_rows(), 2);
    early.run_prepared(logits, &b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t r = 0; r < a.size(); ++r) {
      EXPECT_EQ(b[r].token, a[r].token) << "row " << r;
      EXPECT_EQ(b[r].top_logprobs, a[r].top_logprobs) << "row " << r;
      if (reqs[r].params.logprobs >= 0) {
        EXPECT_EQ(b[r].logprob, a[r].logprob) << "row " << r;
      }
    }
    for (size_t r = 0; r < reqs.size(); ++r) reqs[r].output.push_back(a[r].token);
  }
  EXPECT_EQ(min_tokens_rows, 6);    // request 3 until its sixth output token
  EXPECT_EQ(penalty_rows, 2 * 12);  // requests 2 and 4, every step
}

TEST(SamplerPrepared, FinishReadsIdsAndLogprobRowsAndRefusesErrorCodes) {
  constexpr int kVocab = 32;
  std::vector<Request> reqs(2);
  reqs[1].params.logprobs = 2;
  Sampler s;
  s.prepare(Device::CPU, kVocab, {reqs[0].row(), reqs[1].row()});
  ASSERT_EQ(s.prepared_logprob_rows(), 1);
  EXPECT_EQ(s.prepared_rows()[1].logprob_row, 0);
  // As ops::sample writes them: tokens [2], logprobs [1, 1 + K], top_ids [1, K].
  const int32_t tokens[2] = {5, 9};
  std::vector<float> lp(1 + kMaxTopLogprobs, std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> ids(kMaxTopLogprobs, -1);
  lp[0] = -0.5f;
  lp[1] = -0.25f;
  lp[2] = -1.5f;
  ids[0] = 9;
  ids[1] = 3;
  std::vector<SampleResult> out;
  s.finish(tokens, lp.data(), ids.data(), &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].token, 5);
  EXPECT_TRUE(std::isnan(out[0].logprob));
  EXPECT_TRUE(out[0].top_logprobs.empty());
  EXPECT_EQ(out[1].token, 9);
  EXPECT_EQ(out[1].logprob, -0.5f);
  EXPECT_EQ(out[1].top_logprobs, (std::vector<std::pair<int32_t, float>>{{9, -0.25f}, {3, -1.5f}}));
  // An error code or an id outside the vocabulary is an internal error that stops loudly (as in
  // sample()), never a token.
  const int32_t nonfinite[2] = {kSampleErrorNonFinite, 1};
  EXPECT_DEATH(s.finish(nonfinite, lp.data(), ids.data(), &out), "NaN or \\+inf");
  const int32_t outside[2] = {1, kVocab};
  EXPECT_DEATH(s.finish(outside, lp.data(), ids.data(), &out), "outside the vocabulary");
  // run_prepared refuses logits of another shape than the prepared rows.
  Buffer logits(DType::F32, {3, kVocab});
  EXPECT_DEATH(s.run_prepared(logits, &out), "rows prepared");
}
