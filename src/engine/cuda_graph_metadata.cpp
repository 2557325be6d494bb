#include "engine/cuda_graph_metadata.h"

#include <cstring>

#include "core/error.h"

namespace osprey {

std::string cuda_graph_ineligible(const ForwardBatch& b) {
  const AttentionMeta& m = b.attn;
  if (m.n_seqs < 1) return "no sequences";
  for (const Tensor* t : {&b.token_ids, &m.positions, &m.seq_lens, &m.block_table, &m.slot_mapping,
                          &b.logits_indices, &m.query_start_loc})
    if (t->device != Device::CPU) return "metadata not on the host";
  const int q = m.n_tokens / m.n_seqs;
  if (q < 1 || m.n_tokens != m.n_seqs * q || b.max_query_len != q)
    return "not a pure decode or verify (the sequences bring different numbers of tokens)";
  if (q > 1 && !b.spec_decode)
    return "not a pure decode or verify (a sequence brings more than one token)";
  if (q == 1 && b.spec_decode) return "a verify step without drafts";
  if (q > kMaxGraphTokensPerSeq) return "a verify step of more drafts than graphs are kept for";
  if (m.query_start_loc.numel() != m.n_seqs + 1) return "query_start_loc not of n_seqs + 1";
  const int32_t* qsl = m.query_start_loc.ptr<int32_t>();
  for (int r = 0; r <= m.n_seqs; ++r)
    if (qsl[r] != r * q) return "the sequences' tokens not in uniform runs";
  if (b.logits_indices.numel() != m.n_tokens) return "not every token is sampled";
  const int32_t* li = b.logits_indices.ptr<int32_t>();
  for (int t = 0; t < m.n_tokens; ++t)
    if (li[t] != t) return "sample rows out of batch order";
  const int32_t* lens = m.seq_lens.ptr<int32_t>();
  for (int r = 0; r < m.n_seqs; ++r)
    if (lens[r] < q) return "a sequence with a context shorter than its step";
  return "";
}

int64_t cuda_graph_crossed_threshold(int64_t real, int64_t padded,
                                     const std::vector<int64_t>& thresholds) {
  for (int64_t t : thresholds)
    if (real <= t && t < padded) return t;
  return 0;
}

int cuda_graph_tokens_per_seq(const ForwardBatch& b) {
  return b.attn.n_seqs > 0 ? b.attn.n_tokens / b.attn.n_seqs : 0;
}

void init_graph_metadata(GraphMetadataHost& m) {
  const int q = m.tokens_per_seq;
  for (int r = 0; r <= m.size; ++r) m.query_start_loc[r] = r * q;
  for (int t = 0; t < m.size * q; ++t) {
    m.req_id_per_token[t] = t / q;
    m.logits_indices[t] = t;
  }
}

int64_t stage_graph_metadata(GraphMetadataHost& m, const ForwardBatch& b) {
  const int B = b.attn.n_seqs, Bp = m.size, q = m.tokens_per_seq, bs = b.attn.block_size;
  const int64_t W = m.table_width, src_w = b.attn.block_table.size(1);
  OSPREY_CHECK(B >= 1 && B <= Bp && b.attn.n_tokens == B * q && src_w <= W, "a step of ", B,
               " sequences, ", b.attn.n_tokens, " tokens, table width ", src_w,
               " staged into a graph bucket of ", Bp, " × ", q, " tokens, width ", W);
  const int64_t n = int64_t(B) * q;
  std::memcpy(m.token_ids, b.token_ids.data, size_t(n) * sizeof(int32_t));
  std::memcpy(m.positions, b.attn.positions.data, size_t(n) * sizeof(int32_t));
  std::memcpy(m.slot_mapping, b.attn.slot_mapping.data, size_t(n) * sizeof(int64_t));
  std::memcpy(m.seq_lens, b.attn.seq_lens.data, size_t(B) * sizeof(int32_t));
  // Real rows: the table entries their context covers (entries past it are never read, as in the
  // eager step's table).
  const int32_t* src_table = b.attn.block_table.ptr<int32_t>();
  for (int r = 0; r < B; ++r) {
    const int64_t used = (int64_t(m.seq_lens[r]) + bs - 1) / bs;
    std::memcpy(m.block_table + r * W, src_table + r * src_w, size_t(used) * sizeof(int32_t));
  }
  // Padding rows: the rows that were real last time (the tail that shrank) are reset; rows that
  // were padding already keep their values but entry 0, when row 0's first block moved.
  const int32_t pad_block = m.block_table[0];
  const int was_real = m.prev_real < 0 ? Bp : m.prev_real;  // never staged: every row is reset
  int64_t rewrites = 0;
  for (int r = B; r < Bp; ++r) {
    if (r < was_real) {
      for (int i = 0; i < q; ++i) {
        const int64_t t = int64_t(r) * q + i;
        m.token_ids[t] = 0;
        m.positions[t] = i;
        m.slot_mapping[t] = -1;
      }
      m.seq_lens[r] = q;
      m.block_table[r * W] = pad_block;
      ++rewrites;
    } else if (pad_block != m.pad_block) {
      m.block_table[r * W] = pad_block;
      ++rewrites;
    }
  }
  m.prev_real = B;
  m.pad_block = pad_block;
  return rewrites;
}

}  // namespace osprey
