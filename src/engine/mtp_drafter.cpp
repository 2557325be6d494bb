#include "engine/mtp_drafter.h"

#include <algorithm>

#include "core/error.h"
#include "model/forward_batch.h"
#include "ops/tensor_ops.h"

namespace osprey {

MtpDrafter::MtpDrafter(const DeepseekModel& model, int num_speculative_tokens,
                       int max_num_batched_tokens, int max_num_seqs)
    : model_(model), k_(num_speculative_tokens) {
  OSPREY_CHECK(k_ >= 1, "MtpDrafter with ", k_, " speculative tokens");
  const int64_t D = model.config().hidden_size;
  main_hidden_ = Storage(model.device(), DType::F32, {max_num_batched_tokens, D});
  if (k_ >= 2) {
    state_ = Storage(model.device(), DType::F32, {max_num_seqs, D});
    for (int i = max_num_seqs - 1; i >= 0; --i) free_slots_.push_back(i);
  }
  greedy_params_.temperature = 0.0f;
  greedy_params_.max_tokens = 1;
}

Tensor MtpDrafter::main_hidden(int64_t n_tokens) const {
  return main_hidden_.view().rows(0, n_tokens);
}

int MtpDrafter::slot_of(const Sequence& seq) {
  auto it = slots_.find(seq.arrival);
  if (it != slots_.end()) return it->second;
  if (free_slots_.empty()) {
    // More live sequences than max_num_seqs hold state (preempted ones keep theirs): grow.
    const int64_t n = state_.view().size(0), D = state_.view().size(1);
    Storage bigger(model_.device(), DType::F32, {2 * n, D});
    ops::copy(bigger.view().rows(0, n), state_.view());
    state_ = bigger;
    for (int64_t i = 2 * n - 1; i >= n; --i) free_slots_.push_back(int(i));
  }
  const int s = free_slots_.back();
  free_slots_.pop_back();
  slots_[seq.arrival] = s;
  return s;
}

void MtpDrafter::release(const Sequence& seq) {
  auto it = slots_.find(seq.arrival);
  if (it == slots_.end()) return;
  free_slots_.push_back(it->second);
  slots_.erase(it);
}

Tensor MtpDrafter::device_indices(const std::vector<int32_t>& idx) {
  const int64_t n = int64_t(idx.size());
  if (index_host_.empty() || index_host_.view().numel() < n) {
    const int64_t cap = std::max<int64_t>(n, 256);
    index_host_ = Storage(Device::CPU, DType::I32, {cap});
    index_dev_ =
        model_.device() == Device::CPU ? index_host_ : Storage(model_.device(), DType::I32, {cap});
  }
  std::copy(idx.begin(), idx.end(), index_host_.view().ptr<int32_t>());
  const Tensor dev = index_dev_.view().rows(0, n);
  if (model_.device() != Device::CPU) ops::copy(dev, index_host_.view().rows(0, n));
  return dev;
}

std::vector<int32_t> MtpDrafter::argmax(Tensor logits) {
  std::vector<SamplingRow> rows(size_t(logits.size(0)));
  for (SamplingRow& r : rows) r = {&greedy_params_, &no_tokens_, &no_tokens_, 0, -1, 0};
  std::vector<SampleResult> res;
  greedy_.sample(logits, rows, &res);
  std::vector<int32_t> out;
  for (const SampleResult& r : res) out.push_back(r.token);
  return out;
}

std::vector<int32_t> MtpDrafter::catch_up(const std::vector<Kept>& kept, PagedKVCache& cache) {
  std::vector<int32_t> drafts(kept.size(), -1);
  if (kept.empty()) return drafts;
  const int64_t D = model_.config().hidden_size, V = model_.config().vocab_size;
  std::vector<SeqStep> steps;
  std::vector<int32_t> rows;  // main_hidden row of each MTP token
  for (const Kept& k : kept) {
    OSPREY_CHECK(!k.next_tokens.empty(), "catch_up entry without tokens");
    SeqStep st;
    st.tokens = k.next_tokens;
    st.start_pos = k.start;
    st.blocks = k.seq->blocks;
    steps.push_back(std::move(st));
    for (size_t i = 0; i < k.next_tokens.size(); ++i) rows.push_back(k.row + int32_t(i));
  }
  const OwnedBatch batch(steps, kBlockSize);
  const int64_t T = int64_t(rows.size()), n = int64_t(kept.size());
  Storage hidden(model_.device(), DType::F32, {T, D});  // [n_tokens, D] main hidden, gathered
  ops::gather_rows(hidden.view(), main_hidden_.view(), device_indices(rows));
  Storage logits(model_.device(), DType::F32, {n, V});  // [n_seqs, V] (last kept position)
  Storage out_hidden(model_.device(), DType::F32, {n, D});
  model_.forward_mtp(batch.batch(), hidden.view(), cache, logits.view(), out_hidden.view());
  const std::vector<int32_t> best = argmax(logits.view());
  for (size_t i = 0; i < kept.size(); ++i) {
    if (!kept[i].propose) continue;
    drafts[i] = best[i];
    if (k_ >= 2) {
      const int s = slot_of(*kept[i].seq);
      ops::copy(state_.view().rows(s, s + 1), out_hidden.view().rows(int64_t(i), int64_t(i) + 1));
    }
  }
  return drafts;
}

void MtpDrafter::extend(const std::vector<Sequence*>& seqs, const std::vector<int>& want,
                        PagedKVCache& cache) {
  OSPREY_CHECK(seqs.size() == want.size(), "extend: ", seqs.size(), " sequences, ", want.size(),
               " lengths");
  const int64_t D = model_.config().hidden_size, V = model_.config().vocab_size;
  // Depth j (draft index j, 1-based d_{j+1}): the sequences still needing more; `prev` holds the
  // MTP hidden state each of them continues from.
  std::vector<size_t> live;
  std::vector<int32_t> prev_rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    OSPREY_CHECK(want[i] <= k_ && !seqs[i]->draft.empty(), "extend of sequence ", seqs[i]->id);
    if (int(seqs[i]->draft.size()) >= want[i]) {
      seqs[i]->draft.resize(size_t(want[i]));
      continue;
    }
    OSPREY_CHECK(slots_.count(seqs[i]->arrival), "sequence ", seqs[i]->id, " has no MTP state");
    live.push_back(i);
    prev_rows.push_back(slots_.at(seqs[i]->arrival));
  }
  if (live.empty()) return;
  Storage prev(model_.device(), DType::F32, {int64_t(live.size()), D});
  ops::gather_rows(prev.view(), state_.view(), device_indices(prev_rows));
  while (!live.empty()) {
    const int64_t n = int64_t(live.size());
    std::vector<SeqStep> steps;
    for (size_t i : live) {
      const Sequence& s = *seqs[i];
      SeqStep st;
      // The last draft d_j sits at position num_tokens − 1 + j; the MTP step at the position
      // before it pairs it with the hidden state there and predicts the token after it.
      const int j = int(s.draft.size());
      st.tokens = {s.draft.back()};
      st.start_pos = s.num_tokens() - 2 + j;
      st.blocks = s.blocks;
      steps.push_back(std::move(st));
    }
    const OwnedBatch batch(steps, kBlockSize);
    Storage logits(model_.device(), DType::F32, {n, V});
    Storage out_hidden(model_.device(), DType::F32, {n, D});
    model_.forward_mtp(batch.batch(), prev.view(), cache, logits.view(), out_hidden.view());
    const std::vector<int32_t> best = argmax(logits.view());
    std::vector<size_t> next;
    std::vector<int32_t> keep_rows;
    for (size_t r = 0; r < live.size(); ++r) {
      Sequence& s = *seqs[live[r]];
      s.draft.push_back(best[r]);
      if (int(s.draft.size()) < want[live[r]]) {
        next.push_back(live[r]);
        keep_rows.push_back(int32_t(r));
      }
    }
    if (!next.empty()) {
      Storage p(model_.device(), DType::F32, {int64_t(next.size()), D});
      ops::gather_rows(p.view(), out_hidden.view(), device_indices(keep_rows));
      prev = p;
    }
    live = std::move(next);
  }
}

}  // namespace osprey
