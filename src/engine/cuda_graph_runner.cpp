#include "engine/cuda_graph_runner.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "ops/sample.h"

#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#include "ops/cuda/graph_hooks.h"
#include "ops/gemm.h"
#endif

namespace osprey {

namespace {
// vLLM's capture sizes: 1, 2, 4, then every kSizeStep up to max_num_seqs. (Multiples of 16 past
// 32 — the FP8 block-scaled GEMMs' token padding, whose outputs a bucket of 40 or 56 copies out
// of a padded scratch: 40 memcpy nodes in the dsv32 B = 56 graph — measured no faster on the
// 5000/500/64 wave, H100 2026-12-06: bench/RESULTS.md; `--cuda-graph-sizes` chooses others.)
constexpr int kSizeStep = 8;
}  // namespace

std::vector<int> cuda_graph_capture_sizes(int max_num_seqs) {
  std::vector<int> s;
  for (int b : {1, 2, 4})
    if (b <= max_num_seqs) s.push_back(b);
  for (int b = kSizeStep; b <= max_num_seqs; b += kSizeStep) s.push_back(b);
  if (max_num_seqs > 0 && (s.empty() || s.back() != max_num_seqs)) s.push_back(max_num_seqs);
  return s;
}

int cuda_graph_bucket(const std::vector<int>& sizes, int n) {
  const auto it = std::lower_bound(sizes.begin(), sizes.end(), n);
  return it == sizes.end() ? 0 : *it;
}

GraphKey cuda_graph_key(const std::vector<int>& sizes, const ForwardBatch& b) {
  if (!cuda_graph_ineligible(b).empty()) return {0, 1};
  return {cuda_graph_bucket(sizes, b.attn.n_seqs), cuda_graph_tokens_per_seq(b)};
}

std::string cuda_graph_sampling_unsupported(const GraphSampling& s, int n_seqs, int bucket) {
  if (!s.rows || !s.lists) return "no prepared sampling rows";
  if (int64_t(s.rows->size()) != n_seqs) return "not one prepared sampling row per sequence";
  if (s.n_logprob_rows < 0 || s.n_logprob_rows > n_seqs) return "logprob rows beyond the batch";
  if (int64_t(s.lists->size()) > int64_t(bucket) * kGraphSampleListPerRow)
    return "token lists beyond the bucket's capacity (a new penalty slot's prompt, or many stop "
           "ids "
           "under min_tokens)";
  bool slots = false;
  for (const SampleRowParams& p : *s.rows) {
    slots |= p.penalty_slot >= 0;
    if (p.logprobs >= 0 && (p.logprob_row < 0 || p.logprob_row >= s.n_logprob_rows))
      return "logprob rows beyond the batch";
  }
  if (slots && (s.output_counts.device != Device::CUDA || s.prompt_mask.device != Device::CUDA ||
                s.output_counts.dim() != 2))
    return "the penalty state is not on the GPU";
  return "";
}

SampleRowParams graph_padding_sample_row() {
  SampleRowParams p;
  p.temperature = 0.0f;  // greedy: one argmax pass, no draw
  p.logprobs = -1;
  p.penalty_slot = -1;
  return p;
}

int stage_graph_sample_rows(SampleRowParams* staged, int bucket, int prev_real,
                            const std::vector<SampleRowParams>& rows) {
  const int n = int(rows.size());
  OSPREY_CHECK(n >= 1 && n <= bucket, n, " sampling rows for a bucket of ", bucket);
  std::memcpy(staged, rows.data(), size_t(n) * sizeof(SampleRowParams));
  const int was_real = prev_real < 0 ? bucket : prev_real;
  int rewritten = 0;
  for (int r = n; r < std::min(was_real, bucket); ++r) {
    staged[r] = graph_padding_sample_row();
    ++rewritten;
  }
  return rewritten;
}

bool CudaGraphRunner::eager(const std::string& why) {
  const std::lock_guard<std::mutex> lock(eager_mu_);
  ++eager_reasons_[why];
  return false;
}

std::map<std::string, int64_t> CudaGraphRunner::eager_reasons() const {
  const std::lock_guard<std::mutex> lock(eager_mu_);
  return eager_reasons_;
}

std::map<std::string, int64_t> CudaGraphRunner::host_sampling_reasons() const {
  const std::lock_guard<std::mutex> lock(eager_mu_);
  return host_sampling_reasons_;
}

#ifndef OSPREY_WITH_CUDA

struct CudaGraphRunner::Bucket {};

CudaGraphRunner::CudaGraphRunner(const DeepseekModel& model, std::vector<int> capture_sizes)
    : model_(model), sizes_(std::move(capture_sizes)) {
  fail("CUDA graphs (--cuda-graph) need the CUDA backend: this build has none");
}
CudaGraphRunner::~CudaGraphRunner() = default;
bool CudaGraphRunner::forward(const ForwardBatch&, PagedKVCache&, Tensor, GraphSampling*, Tensor) {
  return false;
}
int64_t CudaGraphRunner::graph_rows(const ForwardBatch&) const {
  return 0;
}
const ForwardBatch* CudaGraphRunner::device_batch(int, int) const {
  return nullptr;
}
Tensor CudaGraphRunner::device_sample_rows(int) const {
  return {};
}
Tensor CudaGraphRunner::device_sampled_ids(int) const {
  return {};
}

#else

namespace {
// High bits of a graph batch's split-KV fingerprint (never one a host batch hashes to in practice;
// the plan cache is forgotten around every capture and replay anyway).
constexpr uint64_t kGraphFingerprint = 0x6f73707265796772ull;
// Pieces of a bucket's region start at the eager staging's alignment (model/forward_batch.h).
size_t aligned(size_t n) {
  return (n + kMetadataAlign - 1) / kMetadataAlign * kMetadataAlign;
}
}  // namespace

namespace {
// One captured graph of a bucket and what it was captured over (a change means re-capture).
struct GraphOf {
  cuda::CudaGraph graph;
  uint64_t epoch = 0, ws_generation = 0;
  const void* logits = nullptr;
  const void* cache = nullptr;
  const void* prompt_mask = nullptr;  // the Sampler's penalty state (the sampling graph only)
  const void* output_counts = nullptr;
  const void* hidden = nullptr;  // the hidden-state buffer (null: captured without hidden_out)
};
}  // namespace

struct CudaGraphRunner::Bucket {
  int size = 0;  // Bp
  int q = 1;     // tokens a sequence
  Buffer host;   // U8 [bytes] the staging twin of dev
  Storage dev;   // U8 [bytes] on the device: the metadata (and sampling rows) the graph reads
  size_t bytes = 0;
  size_t sample_at = 0, lists_at = 0;  // byte offsets of sample_rows and token_lists in the region
  ForwardBatch host_view, dev_batch;   // the same pieces in host and device memory
  Tensor host_rows, dev_rows;          // [size, sizeof(SampleRowParams)] U8: sample_rows
  Tensor host_lists, dev_lists;        // [size · kGraphSampleListPerRow] I32: token_lists
  // The output region: sampled_ids [size] I32 | logprobs [size, 1 + K] F32 | top_ids [size, K] I32.
  Buffer out_host;
  Storage out_dev;
  Tensor host_ids, dev_ids, host_lp, dev_lp, host_top, dev_top;
  GraphMetadataHost meta;     // the metadata pieces of `host`, and the shrink-tail state
  int prev_sample_real = -1;  // real rows of the last step that sampled in the graph
  bool uncapturable = false;  // a capture failed: this bucket's steps run eagerly
  GraphOf plain, sampled;     // the logits-only graph and the graph with sampling
};

CudaGraphRunner::CudaGraphRunner(const DeepseekModel& model, std::vector<int> capture_sizes)
    : model_(model), sizes_(std::move(capture_sizes)) {
  if (model.device() != Device::CUDA)
    fail("CUDA graphs (--cuda-graph) need the model on the GPU (--device cuda)");
  if (model.parallel())
    fail("CUDA graphs (--cuda-graph) are not supported with a parallel model yet");
  std::sort(sizes_.begin(), sizes_.end());
  sizes_.erase(std::unique(sizes_.begin(), sizes_.end()), sizes_.end());
  OSPREY_CHECK(!sizes_.empty() && sizes_.front() >= 1, "CUDA graph capture sizes must be ≥ 1");
}

CudaGraphRunner::~CudaGraphRunner() = default;

CudaGraphRunner::Bucket& CudaGraphRunner::bucket(GraphKey key, int max_blocks, int block_size) {
  if (max_blocks != max_blocks_) {  // another table width: every region is laid out anew
    buckets_.clear();
    max_blocks_ = max_blocks;
  }
  std::unique_ptr<Bucket>& slot = buckets_[key];
  if (slot) return *slot;
  slot = std::make_unique<Bucket>();
  Bucket& k = *slot;
  const int size = key.bucket, q = key.tokens_per_seq;
  k.size = size;
  k.q = q;
  const int64_t n = size;    // sequences (and sampling rows)
  const int64_t nt = n * q;  // tokens
  struct Piece {
    Tensor* host;
    Tensor* dev;
    DType dtype;
    Shape shape;
  };
  ForwardBatch& h = k.host_view;
  ForwardBatch& d = k.dev_batch;
  Piece pieces[] = {
      {&h.token_ids, &d.token_ids, DType::I32, {nt}},
      {&h.attn.positions, &d.attn.positions, DType::I32, {nt}},
      {&h.attn.seq_lens, &d.attn.seq_lens, DType::I32, {n}},
      {&h.attn.query_start_loc, &d.attn.query_start_loc, DType::I32, {n + 1}},
      {&h.attn.req_id_per_token, &d.attn.req_id_per_token, DType::I32, {nt}},
      {&h.logits_indices, &d.logits_indices, DType::I32, {nt}},
      {&h.attn.slot_mapping, &d.attn.slot_mapping, DType::I64, {nt}},
      {&h.attn.block_table, &d.attn.block_table, DType::I32, {n, max_blocks}},
  };
  size_t offsets[std::size(pieces)];
  for (size_t i = 0; i < std::size(pieces); ++i) {
    offsets[i] = k.bytes;
    k.bytes += aligned(size_t(shape_numel(pieces[i].shape)) * dtype_size(pieces[i].dtype));
  }
  // The sampling pieces last: a logits-only step copies the region up to sample_at, a sampling
  // step up to the token lists it uses.
  const int64_t row_bytes = int64_t(sizeof(SampleRowParams));
  const int64_t list_cap = n * kGraphSampleListPerRow;
  k.sample_at = k.bytes;
  k.bytes += aligned(size_t(n * row_bytes));
  k.lists_at = k.bytes;
  k.bytes += aligned(size_t(list_cap) * sizeof(int32_t));
  k.host = Buffer::zeros(DType::U8, {int64_t(k.bytes)});  // once, at creation: no stale bytes
  k.dev = Storage(Device::CUDA, DType::U8, {int64_t(k.bytes)});
  auto* hb = static_cast<char*>(k.host.view().data);
  auto* db = static_cast<char*>(k.dev.view().data);
  for (size_t i = 0; i < std::size(pieces); ++i) {
    *pieces[i].host = Tensor{hb + offsets[i], pieces[i].dtype, pieces[i].shape, Device::CPU};
    *pieces[i].dev = Tensor{db + offsets[i], pieces[i].dtype, pieces[i].shape, Device::CUDA};
  }
  k.host_rows = Tensor{hb + k.sample_at, DType::U8, {n, row_bytes}, Device::CPU};
  k.dev_rows = Tensor{db + k.sample_at, DType::U8, {n, row_bytes}, Device::CUDA};
  k.host_lists = Tensor{hb + k.lists_at, DType::I32, {list_cap}, Device::CPU};
  k.dev_lists = Tensor{db + k.lists_at, DType::I32, {list_cap}, Device::CUDA};
  // Every row starts as a padding row (so that a sampling graph never reads an unstaged row).
  auto* staged = reinterpret_cast<SampleRowParams*>(k.host_rows.data);
  for (int r = 0; r < size; ++r) staged[r] = graph_padding_sample_row();
  // The output region (written by the sampling kernel only: never filled).
  const size_t lp_at = aligned(size_t(n) * sizeof(int32_t));
  const size_t top_at = lp_at + aligned(size_t(n) * (1 + kMaxTopLogprobs) * sizeof(float));
  const size_t out_bytes = top_at + aligned(size_t(n) * kMaxTopLogprobs * sizeof(int32_t));
  k.out_host = Buffer(DType::U8, {int64_t(out_bytes)});
  k.out_dev = Storage(Device::CUDA, DType::U8, {int64_t(out_bytes)});
  auto* ho = static_cast<char*>(k.out_host.view().data);
  auto* dout = static_cast<char*>(k.out_dev.view().data);
  k.host_ids = Tensor{ho, DType::I32, {n}, Device::CPU};
  k.dev_ids = Tensor{dout, DType::I32, {n}, Device::CUDA};
  k.host_lp = Tensor{ho + lp_at, DType::F32, {n, 1 + kMaxTopLogprobs}, Device::CPU};
  k.dev_lp = Tensor{dout + lp_at, DType::F32, {n, 1 + kMaxTopLogprobs}, Device::CUDA};
  k.host_top = Tensor{ho + top_at, DType::I32, {n, kMaxTopLogprobs}, Device::CPU};
  k.dev_top = Tensor{dout + top_at, DType::I32, {n, kMaxTopLogprobs}, Device::CUDA};
  for (ForwardBatch* b : {&h, &d}) {
    b->attn.n_seqs = size;
    b->attn.n_tokens = int(nt);
    b->attn.block_size = block_size;
    // The split-KV plan: a fingerprint of this capture alone, so that layer 0's plan kernel is
    // captured (the cache is forgotten before each capture) and layers 1.. reuse its buffer; in a
    // replay that kernel rebuilds the plan from the step's device positions.
    b->attn.fingerprint = kGraphFingerprint ^ (uint64_t(size) | uint64_t(q) << 32);
    b->max_query_len = q;
    b->spec_decode = q > 1;  // a verify: the absorbed (decode) path with s_q = q, as eagerly
  }
  // The pieces fixed for the key (query_start_loc, req_id_per_token, logits_indices): written
  // once, never again.
  GraphMetadataHost& m = k.meta;
  m.size = size;
  m.tokens_per_seq = q;
  m.table_width = max_blocks;
  m.token_ids = h.token_ids.ptr<int32_t>();
  m.positions = h.attn.positions.ptr<int32_t>();
  m.seq_lens = h.attn.seq_lens.ptr<int32_t>();
  m.query_start_loc = h.attn.query_start_loc.ptr<int32_t>();
  m.req_id_per_token = h.attn.req_id_per_token.ptr<int32_t>();
  m.logits_indices = h.logits_indices.ptr<int32_t>();
  m.slot_mapping = h.attn.slot_mapping.ptr<int64_t>();
  m.block_table = h.attn.block_table.ptr<int32_t>();
  init_graph_metadata(m);
  return k;
}

void CudaGraphRunner::stage(Bucket& k, const ForwardBatch& b, const GraphSampling* sampling) {
  const int B = b.attn.n_seqs, Bp = k.size;
  last_padding_rewrites = stage_graph_metadata(k.meta, b);
  // The sampling rows (shrink-tail over the steps that sampled in the graph) and the lists.
  size_t copy_bytes = k.sample_at;
  last_sample_row_rewrites = 0;
  if (sampling) {
    last_sample_row_rewrites =
        stage_graph_sample_rows(reinterpret_cast<SampleRowParams*>(k.host_rows.data), Bp,
                                k.prev_sample_real, *sampling->rows);
    k.prev_sample_real = B;
    const std::vector<int32_t>& lists = *sampling->lists;
    if (!lists.empty())
      std::memcpy(k.host_lists.data, lists.data(), lists.size() * sizeof(int32_t));
    copy_bytes = k.lists_at + lists.size() * sizeof(int32_t);
  }
  // One host→device copy of the region up to what the step uses (synchronous like the eager
  // step's metadata copy).
  cuda::copy(k.dev.view().rows(0, int64_t(copy_bytes)), k.host.view().rows(0, int64_t(copy_bytes)));
  last_copy_bytes = int64_t(copy_bytes);
}

void CudaGraphRunner::read_back(Bucket& k, int n, GraphSampling* s) {
  // Only the ids of the real rows, and the logprob rows of the rows that asked.
  cuda::copy(k.host_ids.rows(0, n), k.dev_ids.rows(0, n));
  last_download_bytes = int64_t(n) * int64_t(sizeof(int32_t));
  const int n_lp = s->n_logprob_rows;
  if (n_lp > 0) {
    cuda::copy(k.host_lp.rows(0, n_lp), k.dev_lp.rows(0, n_lp));
    cuda::copy(k.host_top.rows(0, n_lp), k.dev_top.rows(0, n_lp));
    last_download_bytes += int64_t(n_lp) * (1 + 2 * kMaxTopLogprobs) * 4;
  }
  s->sampled = true;
  s->tokens = k.host_ids.ptr<int32_t>();
  s->logprobs = n_lp > 0 ? k.host_lp.f32() : nullptr;
  s->top_ids = n_lp > 0 ? k.host_top.ptr<int32_t>() : nullptr;
  ++graph_sampled_;
}

int64_t CudaGraphRunner::graph_rows(const ForwardBatch& batch) const {
  const GraphKey key = cuda_graph_key(sizes_, batch);
  return int64_t(key.bucket) * key.tokens_per_seq;
}

bool CudaGraphRunner::forward(const ForwardBatch& batch, PagedKVCache& cache, Tensor logits,
                              GraphSampling* sampling, Tensor hidden) {
  if (sampling) sampling->sampled = false;
  if (std::string why = cuda_graph_ineligible(batch); !why.empty()) return eager(why);
  // The indexer_recent control copies through the host (an eval diagnostic): eager.
  if (model_.ablation().indexer_recent) return eager("the indexer_recent ablation");
  const int B = batch.attn.n_seqs;
  const int q = cuda_graph_tokens_per_seq(batch);
  const int Bp = cuda_graph_bucket(sizes_, B);
  if (Bp == 0) return eager("batch larger than every capture size");
  const int64_t rows = int64_t(Bp) * q;  // tokens of the padded step: logits and hidden rows
  if (cuda_graph_crossed_threshold(int64_t(B) * q, rows, ops::cuda::token_path_thresholds()) != 0)
    return eager("padding would cross a linear's kernel threshold (other arithmetic than eager)");
  if (logits.device != Device::CUDA || logits.dtype != DType::F32)
    return eager("logits not F32 on the GPU");
  if (logits.size(0) < rows) return eager("logits buffer smaller than the bucket");
  if (cache.device() != Device::CUDA) return eager("KV cache not on the GPU");
  if (hidden.data) {
    if (hidden.device != Device::CUDA || hidden.dtype != DType::F32 || hidden.dim() != 2 ||
        hidden.size(1) != model_.config().hidden_size)
      return eager("hidden-state buffer not [n, D] F32 on the GPU");
    if (hidden.size(0) < rows) return eager("hidden-state buffer smaller than the bucket");
  }
  Bucket& k = bucket({Bp, q}, int(batch.attn.block_table.size(1)), batch.attn.block_size);
  if (k.uncapturable) return eager("the bucket's capture failed");
  bool in_graph = false;
  if (sampling) {
    const std::string why = q > 1 ? "a verify step (sampled on the host: its draft rows)"
                                  : cuda_graph_sampling_unsupported(*sampling, B, Bp);
    if (why.empty()) {
      in_graph = true;
    } else {
      const std::lock_guard<std::mutex> lock(eager_mu_);
      ++host_sampling_reasons_[why];
    }
  }
  stage(k, batch, in_graph ? sampling : nullptr);
  last_download_bytes = 0;
  const Tensor out = logits.rows(0, rows);  // [Bp·q, vocab]: the padding rows' logits too
  ForwardOptions fo;
  if (hidden.data) fo.hidden_out = hidden.rows(0, rows);  // [Bp·q, D]
  GraphOf& g = in_graph ? k.sampled : k.plain;
  // The sampling kernel over the bucket's rows (padding rows included: greedy, stateless).
  SampleMeta meta;
  if (in_graph) {
    meta.n_rows = Bp;
    meta.rows = k.dev_rows;
    meta.token_lists = k.dev_lists;
    meta.prompt_mask = sampling->prompt_mask;
    meta.output_counts = sampling->output_counts;
  }
  auto step = [&] {
    model_.forward(k.dev_batch, cache, out, fo);
    if (in_graph) ops::sample(k.dev_ids, k.dev_lp, k.dev_top, out, meta);
  };
  const bool stale = g.graph.empty() || g.epoch != ops::cuda::device_memory_epoch() ||
                     g.ws_generation != model_.workspace_generation() || g.logits != out.data ||
                     g.cache != cache.latent(0).data || g.hidden != fo.hidden_out.data ||
                     (in_graph && (g.prompt_mask != meta.prompt_mask.data ||
                                   g.output_counts != meta.output_counts.data));
  if (!stale) {
    g.graph.launch();
    ops::cuda::invalidate_mla_plan_cache();  // the replay rewrote the plan buffer
    ++replays_;
    if (in_graph) read_back(k, B, sampling);
    return true;
  }
  // The eager warm-up on the padded batch: this step's logits, ids and cache writes, and every
  // allocation, attribute and table the capture must find in place.
  ops::cuda::invalidate_mla_plan_cache();
  step();
  model_.settle_workspace();  // a reset now, so that the capture's own reset allocates nothing
  ops::cuda::invalidate_mla_plan_cache();  // the warm-up's plan key must not hit in the capture
  const uint64_t epoch = ops::cuda::device_memory_epoch();
  try {
    g.graph.capture(step);
    OSPREY_CHECK(epoch == ops::cuda::device_memory_epoch(),
                 "the capture reallocated device memory");
  } catch (const Error& e) {
    // The warm-up gave this step's logits (and ids); the key's later steps run eagerly. A bug
    // to report (the step budget tests capture every layer kind), not a reason to stop serving.
    ops::cuda::invalidate_mla_plan_cache();
    k.plain.graph = cuda::CudaGraph();
    k.sampled.graph = cuda::CudaGraph();
    k.uncapturable = true;
    ++capture_failures_;
    std::fprintf(stderr,
                 "osprey: CUDA graph capture of batch size %d (%d tokens a sequence) failed, it "
                 "runs eagerly: %s\n",
                 Bp, q, e.what());
    if (in_graph) read_back(k, B, sampling);
    return true;
  }
  ops::cuda::invalidate_mla_plan_cache();
  g.epoch = epoch;
  g.ws_generation = model_.workspace_generation();
  g.logits = out.data;
  g.cache = cache.latent(0).data;
  g.hidden = fo.hidden_out.data;
  g.prompt_mask = meta.prompt_mask.data;
  g.output_counts = meta.output_counts.data;
  ++captures_;
  if (in_graph) read_back(k, B, sampling);
  return true;
}

const ForwardBatch* CudaGraphRunner::device_batch(int bucket, int q) const {
  const auto it = buckets_.find(GraphKey{bucket, q});
  return it == buckets_.end() ? nullptr : &it->second->dev_batch;
}

Tensor CudaGraphRunner::device_sample_rows(int bucket) const {
  const auto it = buckets_.find(GraphKey{bucket, 1});
  return it == buckets_.end() ? Tensor{} : it->second->dev_rows;
}

Tensor CudaGraphRunner::device_sampled_ids(int bucket) const {
  const auto it = buckets_.find(GraphKey{bucket, 1});
  return it == buckets_.end() ? Tensor{} : it->second->dev_ids;
}

const cuda::CudaGraph* CudaGraphRunner::graph(int bucket, bool with_sampling, int q) const {
  const auto it = buckets_.find(GraphKey{bucket, q});
  if (it == buckets_.end()) return nullptr;
  const GraphOf& g = with_sampling ? it->second->sampled : it->second->plain;
  return g.graph.empty() ? nullptr : &g.graph;
}

#endif

}  // namespace osprey
