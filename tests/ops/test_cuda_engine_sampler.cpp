// The engine's Sampler with CUDA logits against the same Sampler with the same logits on the CPU,
// over a 10-step generation on the real vocabulary (129,280): the per-request penalty slots live
// on the device across calls (one request finishes, releases its slot and a new one takes it),
// and each call moves only the row parameters and new tokens up and the ids / logprob rows back.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "cuda_test_util.h"
#include "engine/sampler.h"

namespace osprey {
namespace {
using namespace testing;

constexpr int kVocab = 129280;

struct Request {
  SamplingParams params;
  std::vector<int32_t> prompt, output;
  uint64_t seed = 0, key = 0;
};

std::vector<int32_t> some_ids(int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t(rng()() % kVocab));
  return v;
}

Request make_request(int kind, uint64_t key) {
  Request r;
  r.key = key;
  r.seed = rng()();
  r.prompt = some_ids(100);
  SamplingParams& p = r.params;
  switch (kind % 6) {
    case 0:
      p.temperature = 0.0f;
      break;
    case 1:
      p.top_p = 0.9f;
      p.logprobs = 5;
      break;
    case 2:
      p.temperature = 0.7f;
      p.top_k = 50;
      p.repetition_penalty = 1.2f;
      p.frequency_penalty = 0.5f;
      p.presence_penalty = 0.5f;
      break;
    case 3:
      p.min_p = 0.1f;
      p.min_tokens = 4;
      p.stop_token_ids = some_ids(3);
      break;
    case 4:
      p.temperature = 0.0f;
      p.presence_penalty = 1.5f;
      p.logprobs = SamplingParams::kMaxLogprobs;
      break;
    case 5:
      p.top_k = 1;
      p.frequency_penalty = 1.0f;
      break;
  }
  return r;
}

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

TEST(CudaEngineSampler, SamplesOnTheDeviceLikeOnTheCpu) {
  OSPREY_REQUIRE_GPU();
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(make_request(i, uint64_t(i) + 1));
  Sampler cpu, gpu;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int sampled = 0, differing = 0, greedy = 0;
  double max_lp_err = 0.0;
  for (int step = 0; step < 10; ++step) {
    if (step == 5) {  // request 2 is done; a new one (kind 2 again) takes its place
      cpu.release(reqs[2].key);
      gpu.release(reqs[2].key);
      reqs[2] = make_request(2, 100);
    }
    const int64_t n = int64_t(reqs.size());
    Buffer logits(DType::F32, {n, kVocab});
    for (int64_t i = 0; i < n * kVocab; ++i) logits.f32()[i] = normal(rng());
    DeviceBuffer d_logits = upload(logits);
    std::vector<SamplingRow> rows;
    size_t new_tokens = 0, lp_rows = 0;
    for (const Request& r : reqs) {
      rows.push_back({&r.params, &r.prompt, &r.output, r.seed, 7, r.key});
      const SamplingParams& p = r.params;
      if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
        new_tokens += r.output.empty() ? (p.repetition_penalty != 1.0f ? r.prompt.size() : 0) : 1;
      if (int(r.output.size()) < p.min_tokens) new_tokens += p.stop_token_ids.size() + 1;
      lp_rows += p.logprobs >= 0;
    }
    std::vector<SampleResult> want, got;
    cpu.sample(logits, rows, &want);
    gpu.sample(d_logits, rows, &got);
    // Traffic: params + the new tokens up; ids + logprob rows back (never the logits).
    EXPECT_EQ(gpu.last_upload_bytes(),
              align16(size_t(n) * sizeof(SampleRowParams)) + new_tokens * sizeof(int32_t))
        << "step " << step;
    EXPECT_EQ(gpu.last_download_bytes(),
              align16(align16(size_t(n) * 4) + lp_rows * (1 + kMaxTopLogprobs) * 4) +
                  lp_rows * kMaxTopLogprobs * 4)
        << "step " << step;
    EXPECT_EQ(cpu.last_upload_bytes(), 0u);
    for (int64_t r = 0; r < n; ++r) {
      const Request& q = reqs[size_t(r)];
      const SampleResult &a = want[size_t(r)], &b = got[size_t(r)];
      if (q.params.temperature == 0.0f) {
        ++greedy;
        EXPECT_EQ(b.token, a.token) << "step " << step << " row " << r;
      } else {
        ++sampled;
        if (b.token != a.token) {
          ++differing;
          std::printf("SAMPLEDIFF engine sampler step %d row %lld: cpu %d cuda %d\n", step,
                      static_cast<long long>(r), a.token, b.token);
        }
      }
      if (q.params.logprobs < 0) {
        EXPECT_TRUE(std::isnan(b.logprob));
        EXPECT_TRUE(b.top_logprobs.empty());
        continue;
      }
      ASSERT_EQ(b.top_logprobs.size(), a.top_logprobs.size());
      for (size_t j = 0; j < a.top_logprobs.size(); ++j) {
        EXPECT_EQ(b.top_logprobs[j].first, a.top_logprobs[j].first);
        EXPECT_NEAR(b.top_logprobs[j].second, a.top_logprobs[j].second, 1e-4);
        max_lp_err = std::max(
            max_lp_err, double(std::fabs(b.top_logprobs[j].second - a.top_logprobs[j].second)));
      }
      if (b.token == a.token) {
        EXPECT_NEAR(b.logprob, a.logprob, 1e-4);
      }
    }
    // Both continue from the CPU's tokens, so that a rounding difference cannot fork the state.
    for (int64_t r = 0; r < n; ++r) reqs[size_t(r)].output.push_back(want[size_t(r)].token);
  }
  std::printf("TWIN %-44s greedy %d identical, sampled differing %d of %d, logprob max err %.2e\n",
              "engine Sampler CUDA vs CPU", greedy, differing, sampled, max_lp_err);
  EXPECT_LE(differing, 1);  // a rounding case at a bin edge is possible, a pattern is not
}

}  // namespace
}  // namespace osprey
