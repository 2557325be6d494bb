// The decode-step CUDA graph runner (`--cuda-graph`; off by default): a pure decode step (every
// sequence brings one token and is sampled) runs as the replay of a graph captured for its
// padded batch size, the bucket; prefill, mixed and speculative verify steps run eagerly.
//
// Buckets are vLLM's capture sizes up to max_num_seqs: 1, 2, 4, then every 8 (and max_num_seqs
// itself). A step of B sequences takes the smallest bucket Bp ≥ B; rows [B, Bp) are padding.
//
// Per bucket the runner owns one persistent device region, the bucket's metadata at fixed
// addresses (the graph's kernel arguments point there), and its host staging twin:
//   token_ids        [Bp] I32
//   positions        [Bp] I32
//   seq_lens         [Bp] I32
//   query_start_loc  [Bp + 1] I32   = 0..Bp  (one token a sequence: written once, never again)
//   req_id_per_token [Bp] I32       = 0..Bp-1 (once)
//   logits_indices   [Bp] I32       = 0..Bp-1 (once)
//   slot_mapping     [Bp] I64
//   block_table      [Bp, max_blocks] I32 (max_blocks: the engine's table width, so every kernel
//                    sees the shapes the eager step would)
// A step writes the real rows into the staging (the block-table entries a row's context covers),
// then one host→device copy of the whole region, then the replay (both on the legacy default
// stream: ordered with sampling and the eager steps like an eager step). Only the logits come
// back to the caller's buffer; the Sampler runs after the replay as after an eager step (sampling
// inside the graph is not done yet).
//
// Padding rows (shrink-tail rule): a row that was real last step and is padding now gets token 0,
// position 0, seq_len 1, slot −1 (the cache writes skip it) and a table row whose entry 0 is the
// first block of real row 0 (so its attention and indexer read one finite, already-written cache
// entry, in bounds). Rows already padding are not rewritten (only entry 0 when row 0's first block
// changes). Padding rows are computed like any row and their logits are never sampled; every op
// of the step is row-independent, so they change no real row's result, and they write no cache.
//
// Capture is lazy: the first step of a bucket runs eagerly on the padded device batch (it grows
// the scratch arenas, sets kernel attributes and builds the expert tables: nothing of that may
// happen inside a capture), which gives this step's logits; then the same forward is captured.
// A graph is re-captured when what it points at moved: the model's Workspace arena (its
// generation), the CUDA twins' persistent allocations (ops/cuda/graph_hooks.h's epoch), the logits
// buffer or the cache. A capture that fails (a call inside the step that cannot be captured) is
// reported on stderr and counted; that bucket's steps then run eagerly.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/storage.h"
#include "kv/paged_cache.h"
#include "model/deepseek.h"
#include "model/forward_batch.h"

#ifdef OSPREY_WITH_CUDA
#include "core/cuda_graph.h"
#endif

namespace osprey {

// vLLM's default capture sizes up to max_num_seqs: 1, 2, 4, 8, 16, 24, ... and max_num_seqs.
std::vector<int> cuda_graph_capture_sizes(int max_num_seqs);
// The smallest of `sizes` (ascending) ≥ n; 0 when n is larger than all (the step runs eagerly).
int cuda_graph_bucket(const std::vector<int>& sizes, int n);
// Why `b` (host metadata) cannot replay a decode graph, or "" when it can: it must be a pure
// decode (n_tokens == n_seqs ≥ 1, max_query_len 1, no drafts) sampling every row in order.
std::string cuda_graph_ineligible(const ForwardBatch& b);

class CudaGraphRunner {
 public:
  // Fails (osprey::Error) unless the model is on the GPU, not parallel, and the build has CUDA.
  CudaGraphRunner(const DeepseekModel& model, std::vector<int> capture_sizes);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // Runs the step as a graph replay (or its bucket's capture) when it is eligible and returns
  // true; returns false having done nothing otherwise (the caller runs the model eagerly).
  //   batch   host metadata (StepInputs::build or OwnedBatch)
  //   logits  [≥ bucket, vocab] F32 on the device; rows [0, n_seqs) get the step's logits (rows
  //           up to the bucket are written too: padding)
  bool forward(const ForwardBatch& batch, PagedKVCache& cache, Tensor logits);

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

  // For tests: the padded device batch of a bucket run before (null if none), and counters of
  // the last forward: padding-row fields rewritten (shrink-tail), bytes copied to the device.
  const ForwardBatch* device_batch(int bucket) const;
  int64_t last_padding_rewrites = 0;
  int64_t last_copy_bytes = 0;
#ifdef OSPREY_WITH_CUDA
  const cuda::CudaGraph* graph(int bucket) const;
#endif

 private:
  struct Bucket;
  Bucket& bucket(int size, int max_blocks, int block_size);
  void stage(Bucket& k, const ForwardBatch& b);

  const DeepseekModel& model_;
  std::vector<int> sizes_;
  std::map<int, std::unique_ptr<Bucket>> buckets_;
  int max_blocks_ = 0;  // the table width the buckets were laid out for
  // Counts an eager step under `why`; returns false (forward's answer for it).
  bool eager(const std::string& why);

  std::atomic<int64_t> replays_{0}, captures_{0}, capture_failures_{0};
  mutable std::mutex eager_mu_;
  std::map<std::string, int64_t> eager_reasons_;  // guarded by eager_mu_
};

}  // namespace osprey
