#include "engine/step_inputs.h"

#include <algorithm>

#include "core/error.h"

namespace osprey {

StepInputs::StepInputs(int max_num_batched_tokens, int max_num_seqs, int max_blocks_per_seq,
                       int block_size, int max_logit_rows)
    : max_tokens_(max_num_batched_tokens),
      max_seqs_(max_num_seqs),
      max_blocks_(max_blocks_per_seq),
      block_size_(block_size),
      max_logit_rows_(max_logit_rows > 0 ? max_logit_rows : max_num_seqs),
      token_ids_(DType::I32, {max_num_batched_tokens}),
      positions_(DType::I32, {max_num_batched_tokens}),
      slot_mapping_(DType::I64, {max_num_batched_tokens}),
      req_id_per_token_(DType::I32, {max_num_batched_tokens}),
      query_start_loc_(DType::I32, {max_num_seqs + 1}),
      seq_lens_(DType::I32, {max_num_seqs}),
      block_table_(Buffer::zeros(DType::I32, {max_num_seqs, max_blocks_per_seq})),
      logits_indices_(DType::I32, {max_logit_rows_}),
      rows_(static_cast<size_t>(max_num_seqs)) {}

namespace {
// The id a pending input holds until set_token writes it (a valid id: a batch run with it by
// mistake computes garbage for that row, never reads out of bounds).
constexpr int32_t kPendingToken = 0;
}  // namespace

void StepInputs::set_token(int token_index, int32_t id) {
  OSPREY_CHECK(token_index >= 0 && token_index < prev_tokens_, "token index ", token_index,
               " outside the last batch of ", prev_tokens_);
  token_ids_.ptr<int32_t>()[token_index] = id;
}

const ForwardBatch& StepInputs::build(const StepPlan& plan) {
  const int n_seqs = int(plan.seqs.size());
  OSPREY_CHECK(
      plan.num_tokens <= max_tokens_ && n_seqs <= max_seqs_ && plan.num_sampled <= max_logit_rows_,
      "plan of ", plan.num_tokens, " tokens / ", n_seqs, " sequences / ", plan.num_sampled,
      " sampled rows exceeds the step budgets");
  int32_t* tok = token_ids_.ptr<int32_t>();
  int32_t* pos = positions_.ptr<int32_t>();
  int64_t* slot = slot_mapping_.ptr<int64_t>();
  int32_t* req = req_id_per_token_.ptr<int32_t>();
  int32_t* qsl = query_start_loc_.ptr<int32_t>();
  int32_t* lens = seq_lens_.ptr<int32_t>();
  int32_t* table = block_table_.ptr<int32_t>();
  int32_t* sample = logits_indices_.ptr<int32_t>();
  last_table_writes = 0;
  last_tail_resets = 0;
  pending_inputs_.clear();

  int t = 0, n_sample = 0, max_q = 0;
  bool spec_decode = n_seqs > 0;
  for (int r = 0; r < n_seqs; ++r) {
    const ScheduledSeq& e = plan.seqs[size_t(r)];
    const Sequence& s = *e.seq;
    OSPREY_CHECK(int(s.blocks.size()) <= max_blocks_, "sequence ", s.id, " holds ", s.blocks.size(),
                 " blocks; the table has room for ", max_blocks_);
    qsl[r] = t;
    lens[r] = e.start + e.num_tokens;
    max_q = std::max(max_q, e.num_tokens);
    const int known = s.num_known(), planned = s.num_tokens();  // planned: with the pending
    OSPREY_CHECK(
        e.num_draft <= int(s.draft.size()) && e.start + e.num_tokens - e.num_draft <= planned,
        "sequence ", s.id, ": ", e.num_draft, " drafts scheduled, ", s.draft.size(), " held");
    // A decode: the one token not yet computed, then the drafts.
    spec_decode = spec_decode && e.num_tokens == 1 + e.num_draft && e.start + 1 == planned;
    for (int i = 0; i < e.num_tokens; ++i, ++t) {
      const int p = e.start + i;
      if (p < known) {
        tok[t] = s.token(p);
      } else if (p < planned) {
        tok[t] = kPendingToken;
        pending_inputs_.push_back({t, &s});
      } else {
        tok[t] = s.draft[size_t(p - planned)];
      }
      pos[t] = p;
      req[t] = r;
      slot[t] = int64_t(s.blocks[size_t(p / block_size_)]) * block_size_ + p % block_size_;
    }
    if (e.sample)
      for (int j = e.num_draft; j >= 0; --j) sample[n_sample++] = t - 1 - j;
    // Block-table row r: rewrite only what changed since this row was last written.
    Row& row = rows_[size_t(r)];
    size_t from = 0;
    if (row.seq_id == s.id && row.epoch == s.blocks_epoch && row.n_blocks <= s.blocks.size())
      from = row.n_blocks;
    for (size_t b = from; b < s.blocks.size(); ++b)
      table[size_t(r) * max_blocks_ + b] = s.blocks[b];
    last_table_writes += int64_t(s.blocks.size() - from);
    row = {s.id, s.blocks_epoch, s.blocks.size()};
  }
  qsl[n_seqs] = t;
  // Shrink-tail rule: reset only what was live last step and is not now.
  for (int i = t; i < prev_tokens_; ++i, ++last_tail_resets) {
    tok[i] = 0;
    pos[i] = 0;
    slot[i] = -1;
    req[i] = 0;
  }
  for (int r = n_seqs; r < prev_seqs_; ++r) {
    std::fill_n(table + size_t(r) * max_blocks_, rows_[size_t(r)].n_blocks, 0);
    last_tail_resets += int64_t(rows_[size_t(r)].n_blocks);
    rows_[size_t(r)] = Row{};
    lens[r] = 0;
  }
  prev_tokens_ = t;
  prev_seqs_ = n_seqs;

  auto view = [](const Buffer& b, int64_t n) { return b.view().rows(0, n); };
  batch_.token_ids = view(token_ids_, t);
  batch_.attn.n_seqs = n_seqs;
  batch_.attn.n_tokens = t;
  batch_.attn.block_size = block_size_;
  batch_.attn.query_start_loc = view(query_start_loc_, n_seqs + 1);
  batch_.attn.seq_lens = view(seq_lens_, n_seqs);
  batch_.attn.positions = view(positions_, t);
  batch_.attn.block_table = block_table_.view().rows(0, n_seqs);
  batch_.attn.slot_mapping = view(slot_mapping_, t);
  batch_.attn.req_id_per_token = view(req_id_per_token_, t);
  batch_.logits_indices = view(logits_indices_, n_sample);
  batch_.max_query_len = max_q;
  // A verify step only when some sequence brings a draft: a step of one-token decodes is a plain
  // decode (the CUDA graph runner replays those, and refuses verify steps).
  batch_.spec_decode = spec_decode && max_q > 1;
  return batch_;
}

}  // namespace osprey
