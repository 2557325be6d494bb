// The CUDA graph runner (`--cuda-graph`; the default on the GPU): a pure decode step (every
// sequence brings one token and is sampled) and a speculative verify step (every sequence brings
// its known token and K drafts, every token sampled) run as the replay of a graph captured for
// the padded batch size, the bucket, and the tokens each sequence brings (GraphKey: (Bp, 1) for a
// decode, (Bp, 1 + K) for a verify); prefill and mixed steps run eagerly, and so do the MTP
// drafter's own forwards (engine/mtp_drafter.h) and verify steps whose sequences bring different
// numbers of drafts (the scheduler gives fewer to a sequence within K tokens of its max_tokens or
// of max_model_len: one such sequence makes its whole step eager).
//
// Buckets are vLLM's capture sizes up to max_num_seqs: 1, 2, 4, then every 8 (and max_num_seqs
// itself). A step of B sequences takes the smallest bucket Bp ≥ B; rows [B, Bp) are padding
// sequences of as many tokens as the real ones (engine/cuda_graph_metadata.h: the layout, the
// padding and the shrink-tail rule). A step whose padding would cross a token count where the
// linears change kernels (ops::cuda::token_path_thresholds: the swap-AB limit 32, the experts'
// decode limit 128, the dense stages' 16) runs eagerly: the padded step would compute its real rows
// with other arithmetic (measured on the H200: 27 verify tokens padded to 48, logits 0.11 apart and
// a greedy token changed; on an H100, 15 verify tokens padded to 24 across 16: 0.12). Decode
// buckets never cross them (16, 32 and 128 are capture sizes); some verify buckets do (9
// sequences of 3 tokens in the bucket of 16, 5 of 3 in the bucket of 8).
//
// Per key the runner owns one persistent device region, the metadata at fixed addresses (the
// graph's kernel arguments point there), and its host staging twin (q tokens a sequence):
//   token_ids        [Bp·q] I32
//   positions        [Bp·q] I32
//   seq_lens         [Bp] I32
//   query_start_loc  [Bp + 1] I32   = 0, q, .., Bp·q (written once, never again)
//   req_id_per_token [Bp·q] I32     = t / q (once)
//   logits_indices   [Bp·q] I32     = 0..Bp·q-1 (once: every token is sampled)
//   slot_mapping     [Bp·q] I64
//   block_table      [Bp, max_blocks] I32 (max_blocks: the engine's table width, so every kernel
//                    sees the shapes the eager step would)
//   sample_rows      [Bp, sizeof(SampleRowParams)] U8: the step's sampling parameters
//   (ops/sample.h:
//                    temperature, top-k, top-p, min-p, seed and step counter, penalties' slots,
//                    logprobs), as the engine's Sampler prepared them (Sampler::prepare)
//   token_lists      [Bp · kGraphSampleListPerRow] I32: the ids those rows point into (min_tokens'
//                    suppressed ids, a penalty slot's new output tokens); only the used extent is
//                    written and copied
// and an output region: sampled_ids [Bp] I32 | logprobs [Bp, 1 + kMaxTopLogprobs] F32 | top_ids
// [Bp, kMaxTopLogprobs] I32 (the sampling pieces serve decode keys only; a verify key has them
// too, unused).
//
// A step writes the real rows into the staging (the block-table entries a row's context covers,
// the sampling rows and lists), then one host→device copy of the region up to the last byte the
// step uses, then the replay (both on the legacy default stream: ordered with the eager steps like
// an eager step). A graph per key and kind:
//   - with sampling (the engine's decode steps, GraphSampling given): the forward, then
//     ops::sample's kernel over the bucket's logits, sample_rows and token_lists and the Sampler's
//     penalty state (its pointers are part of what the graph was captured over). Only sampled_ids
//     [B] come back to the host (and the logprob rows of the rows that asked, when any did); the
//     logits stay on the device. The seed and step counter are per-step values in sample_rows, not
//     constants of the graph: a seeded request draws the same tokens as in an eager step.
//   - logits only (a caller without GraphSampling, a step the in-graph sampler cannot take, and
//     every verify step): the forward alone into the caller's logits buffer, [Bp·q, vocab]; the
//     caller samples rows [0, B·q) after the replay. Verify steps are sampled on the host as
//     before graphs (their draft rows see outputs with the drafts appended, which the in-graph
//     sampler's rows do not describe), so their acceptance (engine/spec_verify.h) is unchanged.
// A graph may also write the final-normed hidden states of its tokens (ForwardOptions::
// hidden_out; the MTP drafter reads them) into a caller's buffer [≥ Bp·q, D], rows [0, B·q) the
// real tokens'; the buffer is part of what the graph was captured over.
// A step the in-graph sampler cannot take (cuda_graph_sampling_unsupported: token lists beyond the
// bucket's capacity, e.g. a new penalty slot's prompt) replays the logits-only graph and is
// counted by reason (host_sampling_reasons); the engine then samples the logits with its Sampler.
//
// Padding rows (shrink-tail rule, engine/cuda_graph_metadata.h): a row that was real last step
// and is padding now gets tokens 0, positions 0..q-1, seq_len q, slots −1 (the cache writes skip
// it), a table row whose entry 0 is the first block of real row 0 (so its attention and indexer
// read finite, already-written cache entries, in bounds) and the padding sampling row (greedy, no
// logprobs, no penalty slot, no token list: it reads and writes no sampler state). Rows already
// padding are not rewritten (only entry 0 when row 0's first block changes); the sampling rows
// follow the same rule over the steps that sampled in the graph. Padding rows are computed like
// any row and their ids, logits and hidden states are never read back; every op of the step is
// row-independent, so they change no real row's result, and they write no cache and no penalty
// state.
//
// Capture is lazy: the first step of a key (and kind) runs eagerly on the padded device batch
// (it grows the scratch arenas, the sampler's among them, sets kernel attributes and builds the
// expert tables: nothing of that may happen inside a capture), which gives this step's logits
// and ids; then the same forward (and sampling) is captured. A graph is re-captured when what it
// points at moved: the model's Workspace arena (its generation), the CUDA twins' persistent
// allocations (ops/cuda/graph_hooks.h's epoch), the logits buffer, the hidden-state buffer, the
// cache, or the Sampler's penalty state. A capture that fails (a call inside the step that cannot
// be captured) is reported on stderr and counted; that key's steps then run eagerly.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/storage.h"
#include "engine/cuda_graph_metadata.h"
#include "kv/paged_cache.h"
#include "model/deepseek.h"
#include "model/forward_batch.h"
#include "ops/sample.h"

#ifdef OSPREY_WITH_CUDA
#include "core/cuda_graph.h"
#endif

namespace osprey {

// vLLM's default capture sizes up to max_num_seqs: 1, 2, 4, 8, 16, 24, ... and max_num_seqs.
std::vector<int> cuda_graph_capture_sizes(int max_num_seqs);
// The smallest of `sizes` (ascending) ≥ n; 0 when n is larger than all (the step runs eagerly).
int cuda_graph_bucket(const std::vector<int>& sizes, int n);
// The key of the graph that would replay `b` (host metadata) among `sizes`, or bucket 0 when
// none would: b ineligible (cuda_graph_ineligible), or larger than every size.
GraphKey cuda_graph_key(const std::vector<int>& sizes, const ForwardBatch& b);

// The in-graph sampler's token-list capacity per bucket row: a row lists at most min_tokens'
// suppressed ids (the server takes ≤ 64 stop_token_ids, + EOS) and the output tokens its penalty
// slot lacks (1 in decode); a fresh slot's prompt (repetition penalty) usually goes with the
// prefill step that samples the first token. A step that needs more samples on the host path.
inline constexpr int kGraphSampleListPerRow = 72;

// A decode step's sampling inside the graph: the rows the engine's Sampler prepared
// (Sampler::prepare) and, once forward() returns, where the ids are.
struct GraphSampling {
  // In. rows [n_seqs] (one per sequence, in batch order), lists [n_list]; borrowed for forward().
  const std::vector<SampleRowParams>* rows = nullptr;
  const std::vector<int32_t>* lists = nullptr;
  int n_logprob_rows = 0;  // rows with logprobs ≥ 0 (numbered 0.. by logprob_row)
  // The Sampler's penalty state on the GPU: [n_slots, ceil(vocab / 32)] I32, [n_slots, vocab] I32
  // (empty while no request has had penalties).
  Tensor prompt_mask, output_counts;
  // Out. sampled: the step was sampled in the graph and the host arrays below hold its results
  // (valid until the runner's next forward): tokens [n_seqs] I32, logprobs [n_logprob_rows,
  // 1 + kMaxTopLogprobs] F32, top_ids [n_logprob_rows, kMaxTopLogprobs] I32 (null when
  // n_logprob_rows is 0), as ops::sample wrote them (Sampler::finish reads them). Not sampled:
  // the caller samples the logits (Sampler::run_prepared).
  bool sampled = false;
  const int32_t* tokens = nullptr;
  const float* logprobs = nullptr;
  const int32_t* top_ids = nullptr;
};

// Why the prepared sampling `s` of a pure decode step of n_seqs rows cannot run inside a graph of
// `bucket` rows, or "" when it can: one row per sequence, the token lists within the bucket's
// capacity (bucket · kGraphSampleListPerRow), the penalty state on the GPU where a row uses it,
// logprob rows numbered within the batch.
std::string cuda_graph_sampling_unsupported(const GraphSampling& s, int n_seqs, int bucket);
// The sampling row of a padding row: greedy, no logprobs, no penalty slot, no token list.
SampleRowParams graph_padding_sample_row();
// Writes a step's sampling rows into a bucket's staging `staged` [bucket]: rows [0, n) from
// `rows`; of the padding rows [n, bucket), those that were real at the last staging (prev_real;
// −1: never staged, every row) get graph_padding_sample_row(), the others are left as they are
// (the shrink-tail rule). Returns the padding rows written.
int stage_graph_sample_rows(SampleRowParams* staged, int bucket, int prev_real,
                            const std::vector<SampleRowParams>& rows);

class CudaGraphRunner {
 public:
  // Fails (osprey::Error) unless the model is on the GPU, not parallel, and the build has CUDA.
  CudaGraphRunner(const DeepseekModel& model, std::vector<int> capture_sizes);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // Runs the step as a graph replay (or its key's capture) when it is eligible and returns
  // true; returns false having done nothing otherwise (the caller runs the model eagerly, and
  // samples as after any eager step).
  //   batch     host metadata (StepInputs::build or OwnedBatch): a pure decode or a verify step
  //   logits    [≥ bucket · q, vocab] F32 on the device; rows [0, n_tokens) get the step's logits
  //             (rows up to bucket · q are written too: padding)
  //   sampling  null: logits only. Else the step's prepared sampling: sampled inside the graph
  //             when cuda_graph_sampling_unsupported allows (sampling->sampled then true, the ids
  //             read back), else the logits-only graph runs and the reason is counted. A verify
  //             step (q > 1) is never sampled inside the graph: logits only, reason counted.
  //   hidden    empty, or [≥ bucket · q, D] F32 on the device: rows [0, n_tokens) get the
  //             tokens' final-normed hidden states (ForwardOptions::hidden_out)
  bool forward(const ForwardBatch& batch, PagedKVCache& cache, Tensor logits,
               GraphSampling* sampling = nullptr, Tensor hidden = {});
  // The rows of logits (and of hidden states) a graph step of `batch` writes, bucket · q; 0 when
  // forward() would leave the step to the caller by its metadata alone.
  int64_t graph_rows(const ForwardBatch& batch) const;

  const std::vector<int>& capture_sizes() const { return sizes_; }
  // Read from the engine thread while a step may run on the executor's worker: atomics.
  int64_t replays() const { return replays_.load(); }
  int64_t captures() const { return captures_.load(); }
  // Captures that failed (their bucket then runs eagerly; a warning is printed once per bucket).
  int64_t capture_failures() const { return capture_failures_.load(); }
  // Steps forward() left to the caller (run eagerly), by reason: cuda_graph_ineligible's, or
  // "batch larger than every capture size", "logits buffer smaller than the bucket", "the
  // bucket's capture failed", ... A copy (guarded: read from the engine thread while a step may
  // run on the executor's worker).
  std::map<std::string, int64_t> eager_reasons() const;
  // Replayed (or captured) steps that were sampled inside the graph.
  int64_t graph_sampled_steps() const { return graph_sampled_.load(); }
  // Steps forward() ran as a graph with GraphSampling given but whose sampling the graph could not
  // take (the logits-only graph ran, the caller sampled), by cuda_graph_sampling_unsupported's
  // reason. A copy (guarded like eager_reasons).
  std::map<std::string, int64_t> host_sampling_reasons() const;

  // For tests: the padded device batch of a key run before (null if none; q: tokens a
  // sequence), its device sample_rows [Bp, sizeof(SampleRowParams)] U8 and sampled_ids [Bp] I32
  // (empty if none), and counters of the last forward: padding rows rewritten (shrink-tail;
  // sampling rows apart), bytes copied to the device, bytes copied back (0 unless it sampled in
  // the graph).
  const ForwardBatch* device_batch(int bucket, int q = 1) const;
  Tensor device_sample_rows(int bucket) const;
  Tensor device_sampled_ids(int bucket) const;
  int64_t last_padding_rewrites = 0;
  int64_t last_sample_row_rewrites = 0;
  int64_t last_copy_bytes = 0;
  int64_t last_download_bytes = 0;
#ifdef OSPREY_WITH_CUDA
  // The key's graph of the kind (with sampling or logits only); null if none was captured.
  const cuda::CudaGraph* graph(int bucket, bool with_sampling = false, int q = 1) const;
#endif

 private:
  struct Bucket;
  Bucket& bucket(GraphKey key, int max_blocks, int block_size);
  // Stages the step (and its sampling when given) and copies the region up to what it used.
  void stage(Bucket& k, const ForwardBatch& b, const GraphSampling* sampling);
  // The sampled ids (and logprob rows) of n rows back to the host, into *s.
  void read_back(Bucket& k, int n, GraphSampling* s);

  const DeepseekModel& model_;
  std::vector<int> sizes_;
  std::map<GraphKey, std::unique_ptr<Bucket>> buckets_;
  int max_blocks_ = 0;  // the table width the buckets were laid out for
  // Counts an eager step under `why`; returns false (forward's answer for it).
  bool eager(const std::string& why);

  std::atomic<int64_t> replays_{0}, captures_{0}, capture_failures_{0}, graph_sampled_{0};
  mutable std::mutex eager_mu_;
  std::map<std::string, int64_t> eager_reasons_;          // guarded by eager_mu_
  std::map<std::string, int64_t> host_sampling_reasons_;  // guarded by eager_mu_
};

}  // namespace osprey
