#include "model/dp_batch.h"

#include <algorithm>

#include "ops/tensor_ops.h"

namespace osprey {

namespace {
// A host copy of t (t itself when it is on the host).
Tensor on_host(Tensor t, std::vector<Buffer>& keep) {
  if (t.device == Device::CPU || t.numel() == 0) return t;
  keep.emplace_back(t.dtype, t.shape);
  ops::copy(keep.back(), t);
  return keep.back().view();
}
}  // namespace

DpBatch::DpBatch(const ForwardBatch& full, int rank, int world) : world_(world) {
  std::vector<Buffer> keep;
  const AttentionMeta& a = full.attn;
  const int32_t* qsl = on_host(a.query_start_loc, keep).ptr<int32_t>();
  const int32_t* lens = on_host(a.seq_lens, keep).ptr<int32_t>();
  const Tensor bt = on_host(a.block_table, keep);
  const int32_t* tok = on_host(full.token_ids, keep).ptr<int32_t>();
  const int32_t* pos = on_host(a.positions, keep).ptr<int32_t>();
  const int64_t* slot = on_host(a.slot_mapping, keep).ptr<int64_t>();
  const Tensor li_t = on_host(full.logits_indices, keep);
  const int32_t* li = li_t.numel() ? li_t.ptr<int32_t>() : nullptr;
  const int64_t mb = a.n_seqs ? bt.size(1) : 0;
  auto owner = [&](int s) { return a.n_seqs && mb ? int(bt.ptr<int32_t>()[s * mb] % world) : 0; };

  std::vector<int> seq_owner(static_cast<size_t>(a.n_seqs)),
      local_seq(static_cast<size_t>(a.n_seqs), -1);
  std::vector<int32_t> local_token(size_t(a.n_tokens), -1);
  std::vector<int> mine;
  int64_t n_tok = 0;
  for (int s = 0; s < a.n_seqs; ++s) {
    seq_owner[size_t(s)] = owner(s);
    if (seq_owner[size_t(s)] != rank) continue;
    local_seq[size_t(s)] = int(mine.size());
    mine.push_back(s);
    for (int t = qsl[s]; t < qsl[s + 1]; ++t) local_token[size_t(t)] = int32_t(n_tok++);
  }
  const int S = int(mine.size());
  token_ids_ = Buffer(DType::I32, {n_tok});
  positions_ = Buffer(DType::I32, {n_tok});
  slots_ = Buffer(DType::I64, {n_tok});
  req_ids_ = Buffer(DType::I32, {n_tok});
  qsl_ = Buffer(DType::I32, {S + 1});
  seq_lens_ = Buffer(DType::I32, {S});
  block_table_ = Buffer(DType::I32, {S, mb});
  int max_q = 0;
  qsl_.ptr<int32_t>()[0] = 0;
  for (int j = 0; j < S; ++j) {
    const int s = mine[size_t(j)];
    const int32_t at = qsl_.ptr<int32_t>()[j];
    for (int t = qsl[s]; t < qsl[s + 1]; ++t) {
      const int32_t i = at + (t - qsl[s]);
      token_ids_.ptr<int32_t>()[i] = tok[t];
      positions_.ptr<int32_t>()[i] = pos[t];
      slots_.ptr<int64_t>()[i] = slot[t];
      req_ids_.ptr<int32_t>()[i] = j;
    }
    qsl_.ptr<int32_t>()[j + 1] = at + (qsl[s + 1] - qsl[s]);
    max_q = std::max(max_q, qsl[s + 1] - qsl[s]);
    seq_lens_.ptr<int32_t>()[j] = lens[s];
    std::copy_n(bt.ptr<int32_t>() + s * mb, mb, block_table_.ptr<int32_t>() + j * mb);
  }
  // Logits rows: which rank computes each, and where it lands in the gather.
  full_logits_ = li_t.numel();
  rows_per_rank_.assign(size_t(world), 0);
  std::vector<int> row_owner(static_cast<size_t>(full_logits_)),
      row_local(static_cast<size_t>(full_logits_));
  std::vector<int32_t> mine_li;
  for (int64_t i = 0; i < full_logits_; ++i) {
    const int32_t t = li[i];
    int s = 0;
    while (s + 1 <= a.n_seqs && qsl[s + 1] <= t) ++s;  // the sequence of token row t
    const int r = seq_owner[size_t(s)];
    row_owner[size_t(i)] = r;
    row_local[size_t(i)] = int(rows_per_rank_[size_t(r)]++);
    if (r == rank) {
      global_row_.push_back(i);
      mine_li.push_back(local_token[size_t(t)]);
    }
  }
  const int64_t most = *std::max_element(rows_per_rank_.begin(), rows_per_rank_.end());
  source_row_.resize(size_t(full_logits_));
  for (int64_t i = 0; i < full_logits_; ++i)
    source_row_[size_t(i)] = int32_t(row_owner[size_t(i)] * most + row_local[size_t(i)]);
  logits_indices_ = Buffer(DType::I32, {int64_t(mine_li.size())});
  std::copy(mine_li.begin(), mine_li.end(), logits_indices_.ptr<int32_t>());

  batch_.token_ids = token_ids_;
  batch_.attn.n_seqs = S;
  batch_.attn.n_tokens = int(n_tok);
  batch_.attn.block_size = a.block_size;
  batch_.attn.query_start_loc = qsl_;
  batch_.attn.seq_lens = seq_lens_;
  batch_.attn.positions = positions_;
  batch_.attn.block_table = block_table_;
  batch_.attn.slot_mapping = slots_;
  batch_.attn.req_id_per_token = req_ids_;
  batch_.logits_indices = logits_indices_;
  batch_.max_query_len = max_q;
}

void DpBatch::gather_logits(dist::Communicator& comm, Tensor local, Tensor logits,
                            Workspace& ws) const {
  const int64_t most = *std::max_element(rows_per_rank_.begin(), rows_per_rank_.end());
  if (most == 0) return;
  Workspace::Scope scope(ws);
  const int64_t V = local.size(1);
  const Device dev = comm.device();
  Tensor padded = ws.alloc(DType::F32, {most, V});                 // [max rows, V]
  Tensor all = ws.alloc(DType::F32, {int64_t(world_) * most, V});  // [world · max rows, V]
  if (n_logits() > 0) ops::copy(padded.rows(0, n_logits()), local);
  comm.all_gather(all, padded);
  if (full_logits_ == 0) return;
  Buffer idx(DType::I32, {full_logits_});
  std::copy(source_row_.begin(), source_row_.end(), idx.ptr<int32_t>());
  const Storage idx_dev = to_device_storage(idx, dev);
  Tensor out = logits.device == dev ? logits : ws.alloc(DType::F32, {full_logits_, V});
  ops::gather_rows(out, all, idx_dev.view());
  if (out.data != logits.data) ops::copy(logits, out);
}

}  // namespace osprey
