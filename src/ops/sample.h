// Sampling: one token per row of logits, each row under its own parameters (vLLM v1's order).
//
// Per row r, raw = logits[r] ([vocab] F32, finite or −inf; NaN and +inf are errors), p = rows[r]:
//   0 penalty state (p.penalty_slot ≥ 0; the slot belongs to this row alone in the batch):
//     if p.reset_slot, prompt_mask[slot] and output_counts[slot] are zeroed; then every id of
//     token_lists[p.prompt_begin, + p.prompt_count) is marked in prompt_mask[slot] and every id of
//     token_lists[p.count_begin, + p.count_count) adds 1 to output_counts[slot] (the caller sends
//     only what changed since the slot was last used: a prompt once, then the new output tokens).
//   1 raw logprobs (p.logprobs ≥ 0): lse = m + log Σ exp(raw − m) (m = max raw, the sum in double);
//     the sampled token's raw − lse and the p.logprobs largest raw − lse (descending, ties → lower
//     id) go to row p.logprob_row of logprobs / top_ids.
//   2 min_tokens: x = raw, with −inf at the ids token_lists[p.suppress_begin, + p.suppress_count)
//     (the caller lists the stop ids and EOS while the output is shorter than min_tokens).
//   3 penalties (p.penalty_slot ≥ 0), with c = output_counts[slot][i] and s = prompt bit of i:
//     repetition (r ≠ 1): if s or c > 0, x = x > 0 ? x / r : x · r;
//     then if c > 0: x −= frequency · c; x −= presence (two roundings, no fused multiply-add).
//   4 p.temperature < kGreedyTemperature: token = argmax x (ties → the lowest id). Done.
//   5 x = x / temperature; m = max x (−inf: every token suppressed, an error); e_i = exp(x_i − m).
//   6 min-p: candidates are {e_i > 0, e_i ≥ min_p}.
//   7 top-k (0 < k < vocab, k < #candidates): cut = the k-th largest candidate x; keep x ≥ cut.
//   8 top-p (< 1, more than one kept): over the kept tokens sorted by x descending (ties → the
//     lower id) with mass = top_p · Σ e, a token stays iff the e ahead of it sums to < mass (the
//     first always stays); cut = the x of the last one that stays; every kept x ≥ cut stays.
//   9 draw: u = sampling_uniform(p.seed, p.step); walk the kept tokens in ascending id order and
//     return the first whose cumulative e (in double) exceeds u · Σ e; the last kept if none does.
// Steps 6–8 each keep the tokens above a threshold, so the kept set is {e_i > 0, e_i ≥ min_p,
// x_i ≥ cut}: the CUDA twin finds the cuts by a k-ary search over the values (block reductions
// at 15 split points per pass) instead of sorting the vocabulary.
//
// Shapes (all on one device):
//   tokens        [n_rows] I32 out: the sampled ids; a negative value is an error code (below)
//   logprobs      [n_logprob_rows, 1 + kMaxTopLogprobs] F32 out: column 0 the sampled token's
//                 logprob, columns 1..n the top-n (n = p.logprobs); the rest NaN
//   top_ids       [n_logprob_rows, kMaxTopLogprobs] I32 out: the top-n ids, the rest −1
//                 (rows of logprobs / top_ids are written only for rows with p.logprobs ≥ 0, at
//                 p.logprob_row: the caller numbers those rows 0, 1, ... and copies back that many)
//   logits        [n_rows, vocab] F32, read only
//   m.rows        [n_rows, sizeof(SampleRowParams)] U8: SampleRowParams, 8-byte aligned
//   m.token_lists [n_list] I32: the suppressed / prompt / new-output ids the rows point into
//   m.prompt_mask [n_slots, ceil(vocab / 32)] I32 in/out: bit i % 32 of word i / 32 of a slot is
//                 set iff token i is in the prompt (only marked for rows with repetition ≠ 1)
//   m.output_counts [n_slots, vocab] I32 in/out: occurrences of each token in the output
//   (prompt_mask / output_counts may be empty when no row has a penalty slot.)
//
// Both twins give the same draw for the same inputs up to rounding: the CPU twin computes e_i
// with the C library's expf and sums in id order, the CUDA twin computes e_i as exp in double
// rounded to float and sums in a tree. A token can differ only when u · Σ e falls within a few
// ulps of a bin edge, an e_i within an ulp of min_p, or the top-p mass within rounding of its
// boundary; greedy tokens, top-k cuts and logprob rankings compare values exactly and agree.
// tests/ops/test_cuda_sample.cpp counts the differing draws and checks each is such a case.
#pragma once

#include <cstdint>

#include "core/tensor.h"

#if defined(__CUDACC__)
#define OSPREY_SAMPLE_HD __host__ __device__
#else
#define OSPREY_SAMPLE_HD
#endif

namespace osprey {

// Below this temperature a row is sampled greedily (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;
// The most top logprobs a row may ask for (SamplingParams::kMaxLogprobs).
inline constexpr int kMaxTopLogprobs = 20;

// Error codes in `tokens`.
inline constexpr int32_t kSampleErrorNonFinite = -1;      // a NaN or +inf logit in the row
inline constexpr int32_t kSampleErrorAllSuppressed = -2;  // every token of the row is −inf
inline constexpr int32_t kSampleErrorBadInput = -3;  // an id outside the vocabulary, a bad slot

// The counter-based random stream: a uniform in [0, 1) from (seed, step). It is element `step`
// of the splitmix64 sequence started at mix64(seed); 53 random bits.
OSPREY_SAMPLE_HD inline uint64_t splitmix64_mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z;
}
OSPREY_SAMPLE_HD inline double sampling_uniform(uint64_t seed, uint64_t step) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  const uint64_t h = splitmix64_mix(splitmix64_mix(seed) + (step + 1) * kGolden);
  return double(h >> 11) * 0x1.0p-53;
}

// One row's parameters as the device reads them (88 bytes).
struct SampleRowParams {
  uint64_t seed = 0;
  uint64_t step = 0;  // output tokens so far: the uniform's counter
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t top_k = 0;          // ≤ 0: off
  int32_t logprobs = -1;      // −1: none; else n top logprobs (≤ kMaxTopLogprobs)
  int32_t logprob_row = -1;   // the row of logprobs / top_ids (when logprobs ≥ 0)
  int32_t penalty_slot = -1;  // −1: no penalties (repetition 1, frequency 0, presence 0)
  int32_t reset_slot = 0;     // 1: zero the slot before the updates
  int32_t suppress_begin = 0, suppress_count = 0;  // into token_lists
  int32_t prompt_begin = 0, prompt_count = 0;
  int32_t count_begin = 0, count_count = 0;
  int32_t pad = 0;
};
static_assert(sizeof(SampleRowParams) == 88, "SampleRowParams is read as a packed struct");

struct SampleMeta {
  int n_rows = 0;
  Tensor rows;           // [n_rows, sizeof(SampleRowParams)] U8
  Tensor token_lists;    // [n_list] I32
  Tensor prompt_mask;    // [n_slots, ceil(vocab / 32)] I32
  Tensor output_counts;  // [n_slots, vocab] I32
};

inline int64_t sample_mask_words(int64_t vocab) {
  return (vocab + 31) / 32;
}

// The shapes both twins need, checked (fails naming what is wrong): logits [n_rows, vocab] F32,
// tokens [n_rows] I32, m.rows n_rows SampleRowParams, logprobs [n_lp, 1 + kMaxTopLogprobs] with
// top_ids [n_lp, kMaxTopLogprobs] (n_lp may be 0), the penalty state [n_slots, vocab] and
// [n_slots, ceil(vocab / 32)] (n_slots may be 0).
struct SampleShapes {
  int64_t n_rows = 0, vocab = 0, n_lp = 0, n_slots = 0;
};
SampleShapes check_sample_shapes(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits,
                                 const SampleMeta& m);

namespace ops {
void sample(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits, const SampleMeta& m);
namespace cpu {
void sample(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits, const SampleMeta& m);
// Steps 2 and 3 on one row in place: x [vocab]; lists = token_lists; mask_row [ceil(vocab / 32)]
// and counts_row [vocab] the row's slot (unused when p.penalty_slot < 0). Does not update the slot.
// For the engine's Sampler::apply_logits_processors (a test hook).
void apply_logits_processors(float* x, int vocab, const SampleRowParams& p, const int32_t* lists,
                             const int32_t* mask_row, const int32_t* counts_row);
}  // namespace cpu
namespace cuda {
void sample(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits, const SampleMeta& m);
}  // namespace cuda
}  // namespace ops
}  // namespace osprey
