#include "model/forward_batch.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace osprey {

namespace {
// The metadata tensors of a batch, in packing order.
template <typename B>  // ForwardBatch or const ForwardBatch
auto metadata_parts(B& b) {
  return std::array{&b.token_ids,      &b.attn.query_start_loc, &b.attn.seq_lens,
                    &b.attn.positions, &b.attn.block_table,     &b.attn.slot_mapping,
                    &b.logits_indices, &b.attn.req_id_per_token};
}
bool absent(const Tensor& t) {
  return t.data == nullptr && t.shape.empty();
}
size_t aligned(size_t n) {
  return (n + kMetadataAlign - 1) / kMetadataAlign * kMetadataAlign;
}
}  // namespace

size_t packed_metadata_bytes(const ForwardBatch& b) {
  size_t total = 0;
  for (const Tensor* t : metadata_parts(b))
    if (!absent(*t)) total += aligned(t->nbytes());
  return total;
}

ForwardBatch pack_metadata(const ForwardBatch& b, void* host, void* dev, Device device) {
  ForwardBatch d = b;
  size_t offset = 0;
  for (Tensor* t : metadata_parts(d)) {
    if (absent(*t)) continue;
    OSPREY_CHECK(t->device == Device::CPU, "step metadata must be host tensors");
    // (memcpy from an empty view's pointer, possibly null, is undefined even for 0 bytes.)
    if (t->nbytes() > 0) std::memcpy(static_cast<char*>(host) + offset, t->data, t->nbytes());
    t->data = static_cast<char*>(dev) + offset;
    t->device = device;
    offset += aligned(t->nbytes());
  }
  return d;
}

OwnedBatch::OwnedBatch(const std::vector<SeqStep>& seqs, int block_size) {
  int64_t n_tokens = 0, n_logits = 0, max_blocks = 1;
  for (const SeqStep& s : seqs) {
    OSPREY_CHECK(!s.tokens.empty(), "a sequence step needs at least one token");
    OSPREY_CHECK(s.logit_row < int(s.tokens.size()), "logit row ", s.logit_row, " of ",
                 s.tokens.size(), " tokens");
    n_tokens += int64_t(s.tokens.size());
    n_logits += s.all_logits ? int64_t(s.tokens.size()) : 1;
    max_blocks = std::max<int64_t>(max_blocks, int64_t(s.blocks.size()));
    const int64_t ctx = s.start_pos + int64_t(s.tokens.size());
    OSPREY_CHECK(int64_t(s.blocks.size()) * block_size >= ctx, "sequence of ", ctx,
                 " tokens given ", s.blocks.size(), " blocks");
  }
  const int64_t n_seqs = int64_t(seqs.size());
  token_ids_ = Buffer(DType::I32, {n_tokens});
  positions_ = Buffer(DType::I32, {n_tokens});
  qsl_ = Buffer(DType::I32, {n_seqs + 1});
  seq_lens_ = Buffer(DType::I32, {n_seqs});
  block_table_ = Buffer::zeros(DType::I32, {n_seqs, max_blocks});
  slots_ = Buffer(DType::I64, {n_tokens});
  req_ids_ = Buffer(DType::I32, {n_tokens});
  logits_indices_ = Buffer(DType::I32, {n_logits});
  int64_t t = 0, li = 0;
  int max_q = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const SeqStep& q = seqs[size_t(s)];
    qsl_.ptr<int32_t>()[s] = int32_t(t);
    seq_lens_.ptr<int32_t>()[s] = q.start_pos + int32_t(q.tokens.size());
    std::copy(q.blocks.begin(), q.blocks.end(), block_table_.ptr<int32_t>() + s * max_blocks);
    max_q = std::max(max_q, int(q.tokens.size()));
    for (size_t i = 0; i < q.tokens.size(); ++i, ++t) {
      const int32_t pos = q.start_pos + int32_t(i);
      token_ids_.ptr<int32_t>()[t] = q.tokens[i];
      req_ids_.ptr<int32_t>()[t] = int32_t(s);
      positions_.ptr<int32_t>()[t] = pos;
      slots_.ptr<int64_t>()[t] =
          int64_t(q.blocks[size_t(pos / block_size)]) * block_size + pos % block_size;
      const size_t logit_row = q.logit_row < 0 ? q.tokens.size() - 1 : size_t(q.logit_row);
      if (q.all_logits || i == logit_row) logits_indices_.ptr<int32_t>()[li++] = int32_t(t);
    }
  }
  qsl_.ptr<int32_t>()[n_seqs] = int32_t(t);
  batch_.token_ids = token_ids_;
  batch_.attn = AttentionMeta{int(n_seqs), int(n_tokens), block_size, qsl_,    seq_lens_,
                              positions_,  block_table_,  slots_,     req_ids_};
  batch_.logits_indices = logits_indices_;
  batch_.max_query_len = max_q;
}

}  // namespace osprey
