// The sampler: one token per row of logits, each row under its own request's SamplingParams,
// sampled on the device the logits are on (ops::sample; the math and its order are in
// ops/sample.h: raw logprobs, min_tokens, repetition / frequency / presence penalties, greedy below
// kGreedyTemperature with ties → the lowest id, temperature, min-p, top-k, top-p, and the draw from
// sampling_uniform(seed, number of output tokens so far)).
//
// Determinism: the uniform depends only on (seed, number of output tokens so far), never on the
// batch, the row's position in it or the other rows, so a seeded request gives the same tokens in
// any batch. The logits must be finite or −inf (NaN and +inf are internal errors).
//
// What this class adds to the op: the per-row SampleRowParams and token lists of each call, and the
// penalty state (per request: prompt bitmask [ceil(vocab / 32)] I32 and output token counts [vocab]
// I32) kept in slots on the logits' device between calls. A row with a state_key keeps its slot
// while it is sampled, so a decode step sends only the token it appended last step; a slot not used
// by the current call may be given to another row (its request then starts afresh when it returns).
//
// Traffic per call (CUDA logits): host→device, one copy of 88 B per row (SampleRowParams) + 4 B per
// listed token: min_tokens' suppressed ids (while the output is shorter than min_tokens), and for a
// row with penalties only what its slot lacks: on a new slot the prompt (repetition ≠ 1 only) and
// the output so far, else the tokens appended since the slot's last use (1 in decode). Rows without
// penalties send no tokens and read no state. Device→host, one copy: the sampled ids (4 B per row)
// followed by the logprob rows of the rows that asked (84 + 80 B each); the logits stay on the
// device.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/storage.h"
#include "core/tensor.h"
#include "engine/sampling_params.h"
#include "ops/sample.h"

namespace osprey {

// One row of the batch to sample. The pointers are borrowed for the call.
struct SamplingRow {
  const SamplingParams* params = nullptr;
  const std::vector<int32_t>* prompt_tokens = nullptr;  // for the repetition penalty
  const std::vector<int32_t>* output_tokens = nullptr;  // generated so far; its size is the step
  uint64_t seed = 0;      // the request's effective seed (params.seed, or drawn at submission)
  int eos_token_id = -1;  // −1: the model has none
  // Nonzero: the request's identity for this sampler (never reused for another request): its
  // penalty state stays on the device between calls. 0: rebuilt from the token lists each call.
  uint64_t state_key = 0;
  // ≥ 0: a token already sampled for this request but not yet in output_tokens (with async
  // scheduling, the step in flight's token when the next step's rows are prepared at its launch,
  // before the commit): counted as output_tokens' last element (step counter, min_tokens,
  // penalties). −1: none.
  int32_t pending_token = -1;
};

struct SampleResult {
  int32_t token = -1;
  // log_softmax of the raw logits at `token`; NaN unless params.logprobs ≥ 0.
  float logprob = 0.0f;
  // The params.logprobs most likely tokens (raw log_softmax), descending, ties → lower id first.
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// Not thread-safe: one per engine thread.
class Sampler {
 public:
  // logits [n_rows, vocab] F32 on the CPU or a CUDA device, read only. rows.size() == n_rows; out
  // gets n_rows. The same as prepare(logits.device, vocab, rows) then run_prepared(logits, out).
  void sample(Tensor logits, const std::vector<SamplingRow>& rows, std::vector<SampleResult>* out);
  // Frees the penalty slot of a request that is done (its state_key).
  void release(uint64_t state_key);

  // The two halves of sample(), for a caller that samples inside a CUDA graph
  // (engine/cuda_graph_runner.h): prepare() builds the rows' SampleRowParams and token lists and
  // assigns their penalty slots (on `device`, for `vocab`); then exactly one of: run_prepared()
  // (upload, ops::sample, read back, as sample() does), or the caller runs ops::sample itself over
  // prepared_rows() / prepared_lists() / the penalty state and hands the ids it read back to
  // finish(). A prepared call must be finished before the next prepare() or sample().
  void prepare(Device device, int vocab, const std::vector<SamplingRow>& rows);
  void run_prepared(Tensor logits, std::vector<SampleResult>* out);
  // tokens [n_rows] I32, logprobs [n_lp, 1 + kMaxTopLogprobs] F32 and top_ids [n_lp,
  // kMaxTopLogprobs] I32 on the host, as ops::sample wrote them (n_lp = prepared_logprob_rows();
  // the logprob pointers may be null when it is 0). Fails on an error code in tokens.
  void finish(const int32_t* tokens, const float* logprobs, const int32_t* top_ids,
              std::vector<SampleResult>* out) const;
  const std::vector<SampleRowParams>& prepared_rows() const { return params_; }  // [n_rows]
  const std::vector<int32_t>& prepared_lists() const { return lists_; }          // [n_list]
  int prepared_logprob_rows() const { return n_lp_; }
  // The penalty state on the prepared device: [n_slots, ceil(vocab / 32)] I32 and [n_slots,
  // vocab] I32 (empty views while no row has had penalties).
  Tensor prompt_mask() const;
  Tensor output_counts() const;
  // At least n penalty slots on `device` for `vocab` from now on (so that a CUDA graph's pointers
  // to the state stay valid while the batch stays within n penalised rows).
  void reserve(Device device, int vocab, int n) { reserve_slots(device, vocab, n); }

  // Steps 2 and 3 on one row in place: logits [vocab] on the CPU. For tests.
  void apply_logits_processors(float* logits, int vocab, const SamplingRow& row);

  // Bytes copied host→device and device→host by the last sample() (0 when it ran on the CPU).
  size_t last_upload_bytes() const { return last_upload_bytes_; }
  size_t last_download_bytes() const { return last_download_bytes_; }
  // Tokens the last sample() put into the token lists (suppressed, prompt and output ids).
  size_t last_listed_tokens() const { return lists_.size(); }

 private:
  struct Slot {
    uint64_t key = 0;  // 0: free, or held for one call by a row without a state_key
    size_t prompt_size = 0;
    size_t counted = 0;  // output tokens already in the slot's counts
    bool prompt_marked = false;
    uint64_t used = 0;  // the call that last used it
  };
  // The penalty slots on `device` for `vocab`, at least `n` of them (growing forgets all state).
  void reserve_slots(Device device, int vocab, int n);
  // Fills the penalty fields of p for `row` (a row with penalties), appending to lists_.
  void assign_slot(const SamplingRow& row, SampleRowParams* p);

  Device device_ = Device::CPU;
  int vocab_ = 0;
  Storage prompt_mask_;    // [n_slots, ceil(vocab / 32)] I32 on device_
  Storage output_counts_;  // [n_slots, vocab] I32 on device_
  std::vector<Slot> slots_;
  uint64_t calls_ = 0;

  std::vector<SampleRowParams> params_;  // [n_rows] this call's rows
  std::vector<int32_t> lists_;           // [n_list] this call's token lists
  int32_t n_lp_ = 0;                     // rows of this call that asked for logprobs
  int prepared_vocab_ = 0;
  Storage stage_host_, stage_dev_;  // [bytes] U8: params_, then lists_ (one upload)
  Storage out_host_, out_dev_;  // [bytes] U8: tokens [n_rows] I32 | logprobs | top_ids (one copy)
  size_t last_upload_bytes_ = 0, last_download_bytes_ = 0;
};

}  // namespace osprey
