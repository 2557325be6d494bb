#include "model/lockstep.h"

#include <cstring>

#include "ops/tensor_ops.h"

namespace osprey {

namespace {

enum : int64_t { kStop = 0, kStep = 1 };
// The header fields of a published step, in order.
enum Field : int {
  kKind,
  kSeqs,
  kTokens,
  kFieldBlockSize,
  kMaxBlocks,
  kMaxQueryLen,
  kLogits,
  kPath,
  kCacheId,
  kCacheBlocks,
  kFp8Latent,
  kFp8IndexKeys,
  kMaxExpandedRows,
  kZeroAttnLayer,
  kIndexerRecent,
  kDenseAttention,
  kHasReqIds,
  kNumFields
};

void put(std::vector<uint8_t>& out, Tensor t) {
  Buffer keep;
  if (t.device != Device::CPU && t.numel()) {
    keep = Buffer(t.dtype, t.shape);
    ops::copy(keep, t);
    t = keep.view();
  }
  const size_t at = out.size();
  out.resize(at + t.nbytes());
  if (t.nbytes()) std::memcpy(out.data() + at, t.data, t.nbytes());
}

Buffer take(const std::vector<uint8_t>& in, size_t& at, DType d, Shape s) {
  Buffer b(d, std::move(s));
  const size_t n = size_t(b.numel()) * dtype_size(d);
  OSPREY_CHECK(at + n <= in.size(), "published step is short");
  if (n) std::memcpy(b.view().data, in.data() + at, n);
  at += n;
  return b;
}

}  // namespace

void StepPublisher::publish(const DeepseekModel& m, const ForwardBatch& b,
                            const PagedKVCache& cache, const ForwardOptions& o) {
  OSPREY_CHECK(!stopped_, "publish after stop");
  const AttentionMeta& a = b.attn;
  int64_t h[kNumFields] = {};
  h[kKind] = kStep;
  h[kSeqs] = a.n_seqs;
  h[kTokens] = a.n_tokens;
  h[kFieldBlockSize] = a.block_size;
  h[kMaxBlocks] = a.n_seqs ? a.block_table.size(1) : 0;
  h[kMaxQueryLen] = b.max_query_len;
  h[kLogits] = b.logits_indices.numel();
  h[kPath] = int64_t(o.path);
  h[kCacheId] = int64_t(reinterpret_cast<intptr_t>(&cache));
  h[kCacheBlocks] = cache.n_blocks();
  h[kFp8Latent] = m.fp8_latent_cache();
  h[kFp8IndexKeys] = m.fp8_index_keys();
  h[kMaxExpandedRows] = m.max_expanded_kv_rows();
  h[kZeroAttnLayer] = m.ablation().zero_attention_layer;
  h[kIndexerRecent] = m.ablation().indexer_recent;
  h[kDenseAttention] = m.ablation().dense_attention;
  h[kHasReqIds] = a.req_id_per_token.numel() == a.n_tokens && a.n_tokens > 0;
  std::vector<uint8_t> msg(sizeof h);
  std::memcpy(msg.data(), h, sizeof h);
  put(msg, b.token_ids);
  put(msg, a.query_start_loc);
  put(msg, a.seq_lens);
  put(msg, a.positions);
  if (h[kMaxBlocks]) put(msg, a.block_table);
  put(msg, a.slot_mapping);
  if (h[kHasReqIds]) put(msg, a.req_id_per_token);
  put(msg, b.logits_indices);
  dist::broadcast_bytes(control_, msg, 0);
}

void StepPublisher::stop() {
  if (stopped_) return;
  stopped_ = true;
  std::vector<uint8_t> msg(sizeof(int64_t) * kNumFields, 0);  // kind kStop
  dist::broadcast_bytes(control_, msg, 0);
}

void run_lockstep_worker(DeepseekModel& m, dist::Communicator& control) {
  using CacheKey = std::tuple<int64_t, int64_t, bool, bool>;
  std::map<CacheKey, PagedKVCache> caches;
  while (true) {
    std::vector<uint8_t> msg;
    dist::broadcast_bytes(control, msg, 0);
    int64_t h[kNumFields];
    OSPREY_CHECK(msg.size() >= sizeof h, "published step header");
    std::memcpy(h, msg.data(), sizeof h);
    if (h[kKind] == kStop) return;
    size_t at = sizeof h;
    const int64_t S = h[kSeqs], T = h[kTokens];
    Buffer tok = take(msg, at, DType::I32, {T});
    Buffer qsl = take(msg, at, DType::I32, {S + 1});
    Buffer lens = take(msg, at, DType::I32, {S});
    Buffer pos = take(msg, at, DType::I32, {T});
    Buffer bt =
        h[kMaxBlocks] ? take(msg, at, DType::I32, {S, h[kMaxBlocks]}) : Buffer(DType::I32, {S, 0});
    Buffer slots = take(msg, at, DType::I64, {T});
    Buffer req = h[kHasReqIds] ? take(msg, at, DType::I32, {T}) : Buffer(DType::I32, {0});
    Buffer li = take(msg, at, DType::I32, {h[kLogits]});
    ForwardBatch b;
    b.token_ids = tok;
    b.attn.n_seqs = int(S);
    b.attn.n_tokens = int(T);
    b.attn.block_size = int(h[kFieldBlockSize]);
    b.attn.query_start_loc = qsl;
    b.attn.seq_lens = lens;
    b.attn.positions = pos;
    b.attn.block_table = bt;
    b.attn.slot_mapping = slots;
    b.attn.req_id_per_token = req;
    b.logits_indices = li;
    b.max_query_len = int(h[kMaxQueryLen]);

    m.set_fp8_index_keys(h[kFp8IndexKeys] != 0);
    m.set_kv_cache_dtype(h[kFp8Latent] ? KvCacheDtype::Fp8 : KvCacheDtype::Auto);
    m.set_max_expanded_kv_rows(h[kMaxExpandedRows]);
    ModelAblation ab;
    ab.zero_attention_layer = int(h[kZeroAttnLayer]);
    ab.indexer_recent = h[kIndexerRecent] != 0;
    ab.dense_attention = h[kDenseAttention] != 0;
    m.set_ablation(ab);
    const CacheKey key{h[kCacheId], h[kCacheBlocks], h[kFp8Latent] != 0, h[kFp8IndexKeys] != 0};
    auto it = caches.find(key);
    if (it == caches.end()) it = caches.emplace(key, m.make_cache(h[kCacheBlocks])).first;
    Storage logits(m.device(), DType::F32, {h[kLogits], m.config().vocab_size});
    ForwardOptions o;
    o.path = AttentionPath(h[kPath]);
    m.forward_rank(b, it->second, logits.view(), o);
  }
}

}  // namespace osprey
