// The sampler: one token per row of logits, each row under its own request's SamplingParams.
//
// Per row (the order of vLLM v1's sampler):
//   1 raw logprobs (only when params.logprobs ≥ 0): log_softmax of the raw logits; the sampled
//     token's logprob and the params.logprobs most likely tokens come from here.
//   2 min_tokens: while len(output) < min_tokens, stop_token_ids (and eos_token_id unless
//     ignore_eos, as then EOS is no stop token) get −inf.
//   3 penalties: repetition over the distinct tokens of prompt ∪ output (logit > 0 ? logit / r :
//     logit · r), then logit −= frequency · count_in_output + presence · [count_in_output > 0].
//   4 temperature < kGreedyTemperature: argmax (ties → the lowest id). Done.
//   5 x = logit / temperature; m = max x; e_i = exp(x_i − m) (so p_i / p_max = e_i).
//   6 min-p: keep e_i ≥ min_p. (vLLM v1 runs min-p before top-k/top-p; min-p and top-k commute,
//     and top-p is measured on what min-p kept.)
//   7 top-k (k ≥ 1): keep x_i ≥ the k-th largest x (ties at the boundary are kept).
//   8 top-p (< 1): sort the kept tokens by x descending, keep the smallest prefix whose mass
//     (renormalised over the kept tokens) reaches top_p — a token stays iff the mass strictly
//     before it is < top_p — at least one token; ties with the last kept x are kept.
//   9 draw: u = sampling_uniform(seed, len(output)); walk the kept tokens in ascending id order
//     and return the first whose cumulative e exceeds u · Σ e (inverse CDF).
// Steps 6–8 each keep all tokens above a threshold, so the kept set is {x_i ≥ cut, e_i ≥ min_p}:
// the same rule lets a GPU twin find it without a full sort.
//
// Determinism: the uniform depends only on (seed, number of output tokens so far), never on the
// batch, the row's position in it or the other rows, so a seeded request gives the same tokens in
// any batch. The logits must be finite or −inf (NaN and +inf are internal errors).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "engine/sampling_params.h"

namespace osprey {

// One row of the batch to sample. The pointers are borrowed for the call.
struct SamplingRow {
  const SamplingParams* params = nullptr;
  const std::vector<int32_t>* prompt_tokens = nullptr;  // for the repetition penalty
  const std::vector<int32_t>* output_tokens = nullptr;  // generated so far; its size is the step
  uint64_t seed = 0;      // the request's effective seed (params.seed, or drawn at submission)
  int eos_token_id = -1;  // −1: the model has none
};

struct SampleResult {
  int32_t token = -1;
  // log_softmax of the raw logits at `token`; NaN unless params.logprobs ≥ 0.
  float logprob = 0.0f;
  // The params.logprobs most likely tokens (raw log_softmax), descending, ties → lower id first.
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// Below this temperature a row is sampled greedily (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;

// The counter-based random stream: a uniform in [0, 1) from (seed, step). It is element `step`
// of the splitmix64 sequence started at mix64(seed); 53 random bits.
inline uint64_t splitmix64_mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}
inline double sampling_uniform(uint64_t seed, uint64_t step) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  const uint64_t h = splitmix64_mix(splitmix64_mix(seed) + (step + 1) * kGolden);
  return double(h >> 11) * 0x1.0p-53;
}

// The CPU sampler. Holds only scratch reused across calls (sized to the vocabulary once), so a
// step allocates nothing proportional to the vocabulary. Not thread-safe: one per engine thread.
class Sampler {
 public:
  // logits [n_rows, vocab] F32 on the CPU, read only. rows.size() == n_rows; out gets n_rows.
  void sample(Tensor logits, const std::vector<SamplingRow>& rows, std::vector<SampleResult>* out);

  // Steps 2 and 3 on one row in place: logits [vocab]. Exposed for tests and the GPU twin's test.
  void apply_logits_processors(float* logits, int vocab, const SamplingRow& row);

 private:
  struct Candidate {
    float x;  // logit after penalties and temperature
    float e;  // exp(x − max x) = p / p_max
    int32_t id;
  };
  void reserve(int vocab);
  int32_t sample_row(const float* raw, int vocab, const SamplingRow& row);
  static void fill_logprobs(const float* raw, int vocab, int n, int32_t token, SampleResult* r);

  std::vector<float> x_;               // [vocab] the row being processed
  std::vector<Candidate> candidates_;  // [vocab] tokens still kept by min-p / top-k / top-p
  std::vector<int32_t> counts_;        // [vocab] output-token counts; zero between rows
  std::vector<uint8_t> seen_;          // [vocab] prompt ∪ output marks; zero between rows
};

}  // namespace osprey
