#include "engine/sampler.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "ops/sample.h"
#include "ops/tensor_ops.h"

namespace osprey {

static_assert(SamplingParams::kMaxLogprobs == kMaxTopLogprobs,
              "the op's logprob rows hold SamplingParams::kMaxLogprobs alternatives");

namespace {

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

void check_id(int32_t t, int vocab) {
  OSPREY_CHECK(t >= 0 && t < vocab, "token id ", t, " outside the vocabulary of ", vocab);
}

const char* error_text(int32_t code) {
  switch (code) {
    case kSampleErrorNonFinite:
      return "a logit is NaN or +inf";
    case kSampleErrorAllSuppressed:
      return "every token of the row is suppressed";
    case kSampleErrorBadInput:
      return "a token id outside the vocabulary or a bad penalty slot";
    default:
      return "unknown error";
  }
}

// A host staging Storage of at least `bytes` and its twin on `device` (the same memory on the CPU).
void reserve_bytes(Storage* host, Storage* dev, Device device, size_t bytes) {
  const size_t have = host->empty() ? 0 : size_t(host->view().numel());
  if (have >= bytes && !dev->empty() && dev->view().device == device) return;
  bytes = std::max({bytes, 2 * have, size_t(4096)});
  *host = Storage(Device::CPU, DType::U8, {int64_t(bytes)});
  *dev = device == Device::CPU ? *host : Storage(device, DType::U8, {int64_t(bytes)});
}

// A view of `s` from byte `offset` as dtype / shape.
Tensor view_at(const Storage& s, size_t offset, DType dtype, Shape shape) {
  Tensor t = s.view();
  t.data = static_cast<char*>(t.data) + offset;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

// The number of output tokens of a row, its pending token counted.
size_t output_size(const SamplingRow& row) {
  return row.output_tokens->size() + (row.pending_token >= 0 ? 1 : 0);
}
// Output token i of a row (i < output_size(row)): the pending token is the last.
int32_t output_token(const SamplingRow& row, size_t i) {
  return i < row.output_tokens->size() ? (*row.output_tokens)[i] : row.pending_token;
}

// The row's parameters without the penalty slot; min_tokens' suppressed ids go to `lists`.
SampleRowParams row_params(const SamplingRow& row, int vocab, std::vector<int32_t>* lists,
                           int32_t* n_logprob_rows) {
  const SamplingParams& sp = *row.params;
  SampleRowParams p;
  p.seed = row.seed;
  p.step = output_size(row);
  p.temperature = sp.temperature;
  p.top_p = sp.top_p;
  p.min_p = sp.min_p;
  p.repetition_penalty = sp.repetition_penalty;
  p.frequency_penalty = sp.frequency_penalty;
  p.presence_penalty = sp.presence_penalty;
  p.top_k = sp.top_k;
  p.logprobs = sp.logprobs;
  if (sp.logprobs >= 0) p.logprob_row = (*n_logprob_rows)++;
  // min_tokens: no stop before min_tokens outputs. With ignore_eos, EOS does not stop, so it stays.
  if (static_cast<int64_t>(output_size(row)) < sp.min_tokens) {
    p.suppress_begin = int32_t(lists->size());
    for (int32_t t : sp.stop_token_ids) {
      check_id(t, vocab);
      lists->push_back(t);
    }
    if (!sp.ignore_eos && row.eos_token_id >= 0) {
      check_id(row.eos_token_id, vocab);
      lists->push_back(row.eos_token_id);
    }
    p.suppress_count = int32_t(lists->size()) - p.suppress_begin;
  }
  return p;
}

}  // namespace

void Sampler::reserve_slots(Device device, int vocab, int n) {
  if (device != device_ || vocab != vocab_) {
    slots_.clear();
    prompt_mask_ = Storage();
    output_counts_ = Storage();
    device_ = device;
    vocab_ = vocab;
  }
  if (int(slots_.size()) >= n) return;
  const int n_slots = std::max({n, 2 * int(slots_.size()), 4});
  slots_.assign(size_t(n_slots), Slot{});
  prompt_mask_ = Storage(device, DType::I32, {n_slots, sample_mask_words(vocab)});
  output_counts_ = Storage(device, DType::I32, {n_slots, vocab});
}

void Sampler::assign_slot(const SamplingRow& row, SampleRowParams* p) {
  const std::vector<int32_t>& prompt = *row.prompt_tokens;
  const size_t n_out = output_size(row);
  const bool repetition = row.params->repetition_penalty != 1.0f;
  Slot* s = nullptr;
  if (row.state_key != 0) {
    for (Slot& c : slots_) {
      if (c.key == row.state_key) s = &c;
    }
  }
  bool fresh = true;
  if (s) {
    OSPREY_CHECK(s->used != calls_, "two rows of one call share the state key ", row.state_key);
    fresh = s->prompt_size != prompt.size() || s->counted > n_out || s->prompt_marked != repetition;
  } else {
    for (Slot& c : slots_) {  // the least recently used slot this call has not taken
      if (c.used != calls_ && (!s || c.used < s->used)) s = &c;
    }
    OSPREY_CHECK(s, "no free penalty slot among ", slots_.size());
  }
  p->penalty_slot = int32_t(s - slots_.data());
  size_t from = s->counted;
  if (fresh) {
    p->reset_slot = 1;
    from = 0;
    if (repetition) {
      p->prompt_begin = int32_t(lists_.size());
      for (int32_t t : prompt) {
        check_id(t, vocab_);
        lists_.push_back(t);
      }
      p->prompt_count = int32_t(prompt.size());
    }
  }
  p->count_begin = int32_t(lists_.size());
  for (size_t i = from; i < n_out; ++i) {
    const int32_t t = output_token(row, i);
    check_id(t, vocab_);
    lists_.push_back(t);
  }
  p->count_count = int32_t(lists_.size()) - p->count_begin;
  *s = Slot{row.state_key, prompt.size(), n_out, repetition, calls_};
}

void Sampler::release(uint64_t state_key) {
  if (state_key == 0) return;
  for (Slot& s : slots_) {
    if (s.key == state_key) s = Slot{};
  }
}

void Sampler::sample(Tensor logits, const std::vector<SamplingRow>& rows,
                     std::vector<SampleResult>* out) {
  OSPREY_CHECK(logits.dim() == 2 && logits.dtype == DType::F32, "logits ", shape_str(logits.shape),
               " must be [n_rows, vocab] F32");
  const int64_t vocab64 = logits.size(1);
  OSPREY_CHECK(vocab64 > 0 && vocab64 <= std::numeric_limits<int32_t>::max(), "vocab ", vocab64);
  prepare(logits.device, static_cast<int>(vocab64), rows);
  run_prepared(logits, out);
}

void Sampler::prepare(Device device, int vocab, const std::vector<SamplingRow>& rows) {
  OSPREY_CHECK(vocab > 0, "vocab ", vocab);
  ++calls_;
  params_.clear();
  lists_.clear();
  n_lp_ = 0;
  prepared_vocab_ = vocab;
  int n_penalised = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const SamplingRow& row = rows[r];
    OSPREY_CHECK(row.params && row.prompt_tokens && row.output_tokens, "row ", r, " incomplete");
    n_penalised += has_penalties(*row.params);
  }
  reserve_slots(device, vocab, n_penalised);
  for (const SamplingRow& row : rows) {
    SampleRowParams p = row_params(row, vocab, &lists_, &n_lp_);
    if (has_penalties(*row.params)) assign_slot(row, &p);
    params_.push_back(p);
  }
}

Tensor Sampler::prompt_mask() const {
  return prompt_mask_.empty() ? Tensor{} : prompt_mask_.view();
}
Tensor Sampler::output_counts() const {
  return output_counts_.empty() ? Tensor{} : output_counts_.view();
}

void Sampler::run_prepared(Tensor logits, std::vector<SampleResult>* out) {
  OSPREY_CHECK(logits.dim() == 2 && logits.dtype == DType::F32, "logits ", shape_str(logits.shape),
               " must be [n_rows, vocab] F32");
  const int64_t n_rows = logits.size(0);
  OSPREY_CHECK(static_cast<int64_t>(params_.size()) == n_rows, params_.size(),
               " rows prepared for logits ", shape_str(logits.shape));
  OSPREY_CHECK(logits.size(1) == prepared_vocab_ && logits.device == device_, "logits ",
               shape_str(logits.shape), " for rows prepared for vocab ", prepared_vocab_,
               " (or on another device than they were prepared for)");
  const Device device = logits.device;

  // Inputs: params then token lists, one upload.
  const size_t params_bytes = params_.size() * sizeof(SampleRowParams);
  const size_t lists_at = align16(params_bytes);
  const size_t stage_bytes = lists_at + lists_.size() * sizeof(int32_t);
  reserve_bytes(&stage_host_, &stage_dev_, device, stage_bytes);
  char* h = static_cast<char*>(stage_host_.view().data);
  // (memcpy from an empty vector's null data() is undefined even for 0 bytes: UBSan's find.)
  if (!params_.empty()) std::memcpy(h, params_.data(), params_bytes);
  if (!lists_.empty()) std::memcpy(h + lists_at, lists_.data(), lists_.size() * sizeof(int32_t));
  last_upload_bytes_ = 0;
  if (device != Device::CPU && n_rows > 0) {
    ops::copy(stage_dev_.view().rows(0, int64_t(stage_bytes)),
              stage_host_.view().rows(0, int64_t(stage_bytes)));
    last_upload_bytes_ = stage_bytes;
  }
  SampleMeta m;
  m.n_rows = int(n_rows);
  m.rows = view_at(stage_dev_, 0, DType::U8, {n_rows, int64_t(sizeof(SampleRowParams))});
  m.token_lists = view_at(stage_dev_, lists_at, DType::I32, {int64_t(lists_.size())});
  m.prompt_mask = prompt_mask();
  m.output_counts = output_counts();

  // Outputs: tokens | logprobs | top ids, one copy back.
  const int32_t n_lp = n_lp_;
  const size_t lp_at = align16(size_t(n_rows) * sizeof(int32_t));
  const size_t ids_at = align16(lp_at + size_t(n_lp) * (1 + kMaxTopLogprobs) * sizeof(float));
  const size_t out_bytes = ids_at + size_t(n_lp) * kMaxTopLogprobs * sizeof(int32_t);
  reserve_bytes(&out_host_, &out_dev_, device, out_bytes);
  ops::sample(view_at(out_dev_, 0, DType::I32, {n_rows}),
              view_at(out_dev_, lp_at, DType::F32, {n_lp, 1 + kMaxTopLogprobs}),
              view_at(out_dev_, ids_at, DType::I32, {n_lp, kMaxTopLogprobs}), logits, m);
  last_download_bytes_ = 0;
  if (device != Device::CPU && n_rows > 0) {
    const size_t back = n_lp > 0 ? out_bytes : size_t(n_rows) * sizeof(int32_t);
    ops::copy(out_host_.view().rows(0, int64_t(back)), out_dev_.view().rows(0, int64_t(back)));
    last_download_bytes_ = back;
  }
  const char* o = static_cast<const char*>(out_host_.view().data);
  finish(reinterpret_cast<const int32_t*>(o), reinterpret_cast<const float*>(o + lp_at),
         reinterpret_cast<const int32_t*>(o + ids_at), out);
}

void Sampler::finish(const int32_t* tokens, const float* lp, const int32_t* ids,
                     std::vector<SampleResult>* out) const {
  const int vocab = prepared_vocab_;
  out->resize(params_.size());
  for (size_t r = 0; r < params_.size(); ++r) {
    const SampleRowParams& p = params_[r];
    SampleResult& res = (*out)[r];
    res.token = tokens[r];
    OSPREY_CHECK(res.token >= 0, "sampling row ", r, ": ", error_text(res.token));
    OSPREY_CHECK(res.token < vocab, "sampling row ", r, ": token ", res.token,
                 " outside the vocabulary of ", vocab);
    res.top_logprobs.clear();
    if (p.logprobs < 0) {
      res.logprob = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float* lp_row = lp + size_t(p.logprob_row) * (1 + kMaxTopLogprobs);
    const int32_t* id_row = ids + size_t(p.logprob_row) * kMaxTopLogprobs;
    res.logprob = lp_row[0];
    for (int j = 0; j < std::min(p.logprobs, vocab); ++j)
      res.top_logprobs.emplace_back(id_row[j], lp_row[1 + j]);
  }
}

void Sampler::apply_logits_processors(float* x, int vocab, const SamplingRow& row) {
  std::vector<int32_t> lists;
  int32_t n_lp = 0;
  SampleRowParams p = row_params(row, vocab, &lists, &n_lp);
  std::vector<int32_t> mask, counts;  // [ceil(vocab / 32)], [vocab]: a one-slot penalty state
  if (has_penalties(*row.params)) {
    p.penalty_slot = 0;
    mask.assign(size_t(sample_mask_words(vocab)), 0);
    counts.assign(size_t(vocab), 0);
    if (row.params->repetition_penalty != 1.0f) {
      for (int32_t t : *row.prompt_tokens) {
        check_id(t, vocab);
        mask[size_t(t >> 5)] =
            static_cast<int32_t>(static_cast<uint32_t>(mask[size_t(t >> 5)]) | (1u << (t & 31)));
      }
    }
    for (size_t i = 0; i < output_size(row); ++i) {
      const int32_t t = output_token(row, i);
      check_id(t, vocab);
      ++counts[size_t(t)];
    }
  }
  ops::cpu::apply_logits_processors(x, vocab, p, lists.data(), mask.data(), counts.data());
}

}  // namespace osprey
