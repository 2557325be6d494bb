// CPU sampling (contract in ops/sample.h): the rows one after another with plain loops; top-k by
// nth_element, top-p by a sort of the tokens that can still be in the nucleus; e_i by expf, sums in
// double in id order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/sample.h"

namespace osprey::ops::cpu {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Candidate {
  float x;  // logit after penalties and temperature
  float e;  // exp(x − max x) = p / p_max
  int32_t id;
};

// Scratch reused across calls on this thread, sized to the vocabulary once: a step allocates
// nothing proportional to the vocabulary.
struct Scratch {
  std::vector<float> x;               // [vocab] the row being processed
  std::vector<Candidate> candidates;  // [vocab] tokens still kept by min-p / top-k / top-p
};
Scratch& scratch(int vocab) {
  thread_local Scratch s;
  if (s.x.size() < static_cast<size_t>(vocab)) {
    s.x.resize(static_cast<size_t>(vocab));
    s.candidates.resize(static_cast<size_t>(vocab));
  }
  return s;
}

// Index of the largest value; ties → the lowest index.
int32_t argmax(const float* x, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

bool in_mask(const int32_t* mask_row, int i) {
  return (static_cast<uint32_t>(mask_row[i >> 5]) >> (i & 31)) & 1u;
}

// The row's token-list ranges and penalty slot are valid.
bool row_input_ok(const SampleRowParams& p, const int32_t* lists, int64_t n_list, int vocab,
                  int64_t n_slots) {
  auto range_ok = [&](int32_t begin, int32_t count) {
    if (begin < 0 || count < 0 || int64_t(begin) + count > n_list) return false;
    for (int32_t j = begin; j < begin + count; ++j)
      if (lists[j] < 0 || lists[j] >= vocab) return false;
    return true;
  };
  if (!range_ok(p.suppress_begin, p.suppress_count)) return false;
  if (p.penalty_slot < 0) return true;
  return p.penalty_slot < n_slots && range_ok(p.prompt_begin, p.prompt_count) &&
         range_ok(p.count_begin, p.count_count);
}

// Step 0: the slot's reset, prompt marks and new output counts.
void update_slot(const SampleRowParams& p, const int32_t* lists, int vocab, int32_t* mask_row,
                 int32_t* counts_row) {
  if (p.reset_slot) {
    std::fill_n(mask_row, sample_mask_words(vocab), 0);
    std::fill_n(counts_row, vocab, 0);
  }
  for (int32_t j = p.prompt_begin; j < p.prompt_begin + p.prompt_count; ++j) {
    const int32_t t = lists[j];
    mask_row[t >> 5] =
        static_cast<int32_t>(static_cast<uint32_t>(mask_row[t >> 5]) | (1u << (t & 31)));
  }
  for (int32_t j = p.count_begin; j < p.count_begin + p.count_count; ++j) ++counts_row[lists[j]];
}

// Steps 4–9 on x [vocab] (after steps 2–3); x is overwritten.
int32_t sample_processed(float* x, int vocab, const SampleRowParams& p, Candidate* cand) {
  if (p.temperature < kGreedyTemperature) return argmax(x, vocab);

  float m = -kInf;
  for (int i = 0; i < vocab; ++i) {
    x[i] /= p.temperature;
    m = std::max(m, x[i]);
  }
  if (!(m > -kInf)) return kSampleErrorAllSuppressed;
  const float min_p = p.min_p;

  // Top-k and top-p give a cut on x; both are measured on what min-p keeps.
  float cut = -kInf;
  const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
  const bool use_top_p = p.top_p < 1.0f;
  if (use_top_k || use_top_p) {
    int n = 0;
    for (int i = 0; i < vocab; ++i) {
      const float e = std::exp(x[i] - m);
      if (e > 0.0f && e >= min_p) cand[n++] = Candidate{x[i], e, i};
    }
    auto by_x_desc = [](const Candidate& a, const Candidate& b) {
      return a.x > b.x || (a.x == b.x && a.id < b.id);
    };
    if (use_top_k && p.top_k < n) {
      std::nth_element(cand, cand + p.top_k - 1, cand + n, by_x_desc);
      cut = cand[p.top_k - 1].x;
      n = static_cast<int>(
          std::partition(cand, cand + n, [cut](const Candidate& c) { return c.x >= cut; }) - cand);
    }
    if (use_top_p && n > 1) {
      double z = 0.0;
      for (int j = 0; j < n; ++j) z += cand[j].e;
      const double mass = static_cast<double>(p.top_p) * z;
      // Exact pre-filter before the sort: if n · e_j ≤ (1 − top_p) · z, the tokens with e ≤ e_j
      // weigh at most (1 − top_p) · z, so the mass ahead of j is ≥ top_p · z and j is dropped.
      // On a peaked distribution over a large vocabulary this leaves a few hundred to sort.
      const double floor_e = (z - mass) / n;
      n = static_cast<int>(
          std::partition(cand, cand + n, [&](const Candidate& c) { return c.e > floor_e; }) - cand);
      std::sort(cand, cand + n, by_x_desc);
      double before = 0.0;  // mass of the tokens ahead of cand[keep]
      int keep = 0;
      while (keep < n && (keep == 0 || before < mass)) before += cand[keep++].e;
      cut = std::max(cut, cand[keep - 1].x);
    }
  }

  // Weights e_i of the kept tokens, in place of x; then the inverse CDF in ascending id order.
  double z = 0.0;
  for (int i = 0; i < vocab; ++i) {
    const float e = std::exp(x[i] - m);
    x[i] = (e > 0.0f && e >= min_p && x[i] >= cut) ? e : 0.0f;
    z += x[i];
  }
  const double target = sampling_uniform(p.seed, p.step) * z;
  double cum = 0.0;
  int32_t last = -1;
  for (int i = 0; i < vocab; ++i) {
    if (x[i] == 0.0f) continue;
    cum += x[i];
    last = i;
    if (cum > target) return i;
  }
  OSPREY_CHECK(last >= 0, "no token kept");
  return last;  // target rounded up to z
}

// Step 1 for one row: lp_row [1 + kMaxTopLogprobs], id_row [kMaxTopLogprobs].
void fill_logprobs(const float* raw, int vocab, int n, int32_t token, float* lp_row,
                   int32_t* id_row) {
  std::fill_n(lp_row, 1 + kMaxTopLogprobs, std::numeric_limits<float>::quiet_NaN());
  std::fill_n(id_row, kMaxTopLogprobs, -1);
  if (token < 0) return;
  float m = -kInf;
  for (int i = 0; i < vocab; ++i) m = std::max(m, raw[i]);
  double s = 0.0;
  for (int i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(raw[i]) - m);
  const double lse = m + std::log(s);
  lp_row[0] = static_cast<float>(raw[token] - lse);

  // The n largest raw logits, kept sorted descending; scanning ids upwards and inserting after
  // equal values puts ties in ascending id order.
  std::vector<std::pair<int32_t, float>> top;
  n = std::min(n, vocab);
  top.reserve(static_cast<size_t>(n) + 1);
  for (int i = 0; i < vocab && n > 0; ++i) {
    if (static_cast<int>(top.size()) == n && !(raw[i] > top.back().second)) continue;
    auto pos =
        std::upper_bound(top.begin(), top.end(), raw[i],
                         [](float v, const std::pair<int32_t, float>& e) { return v > e.second; });
    top.insert(pos, {i, raw[i]});
    if (static_cast<int>(top.size()) > n) top.pop_back();
  }
  for (size_t j = 0; j < top.size(); ++j) {
    id_row[j] = top[j].first;
    lp_row[1 + j] = static_cast<float>(top[j].second - lse);
  }
}

}  // namespace

void apply_logits_processors(float* x, int vocab, const SampleRowParams& p, const int32_t* lists,
                             const int32_t* mask_row, const int32_t* counts_row) {
  // min_tokens: the listed stop ids (and EOS) are −inf.
  for (int32_t j = p.suppress_begin; j < p.suppress_begin + p.suppress_count; ++j) {
    const int32_t t = lists[j];
    OSPREY_CHECK(t >= 0 && t < vocab, "token id ", t, " outside the vocabulary of ", vocab);
    x[t] = -kInf;
  }
  if (p.penalty_slot < 0) return;
  // Repetition: once per token of prompt ∪ output.
  if (p.repetition_penalty != 1.0f) {
    const float rp = p.repetition_penalty;
    for (int i = 0; i < vocab; ++i) {
      if (counts_row[i] > 0 || in_mask(mask_row, i)) x[i] = x[i] > 0.0f ? x[i] / rp : x[i] * rp;
    }
  }
  // Frequency and presence, over the output only.
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (int i = 0; i < vocab; ++i) {
      const int32_t c = counts_row[i];
      if (c == 0) continue;
      x[i] -= p.frequency_penalty * static_cast<float>(c);
      x[i] -= p.presence_penalty;
    }
  }
}

void sample(Tensor tokens, Tensor logprobs, Tensor top_ids, Tensor logits, const SampleMeta& m) {
  OSPREY_CHECK(logits.device == Device::CPU, "sample (CPU twin): logits on ",
               logits.device == Device::CUDA ? "CUDA" : "?");
  const SampleShapes sh = check_sample_shapes(tokens, logprobs, top_ids, logits, m);
  const int64_t n_rows = sh.n_rows, n_lp = sh.n_lp, n_slots = sh.n_slots;
  const int vocab = static_cast<int>(sh.vocab);
  const auto* params = static_cast<const SampleRowParams*>(m.rows.data);
  const int32_t* lists = m.token_lists.numel() > 0 ? m.token_lists.ptr<int32_t>() : nullptr;
  const int64_t n_list = m.token_lists.numel();
  const float* data = logits.f32();
  int32_t* out = tokens.ptr<int32_t>();
  Scratch& s = scratch(vocab);

  for (int64_t r = 0; r < n_rows; ++r) {
    const SampleRowParams& p = params[r];
    const float* raw = data + r * int64_t(vocab);
    int32_t* mask_row = nullptr;
    int32_t* counts_row = nullptr;
    int32_t error = 0;  // an error code, or 0
    if (!row_input_ok(p, lists, n_list, vocab, n_slots) ||
        (p.logprobs >= 0 &&
         (p.logprobs > kMaxTopLogprobs || p.logprob_row < 0 || p.logprob_row >= n_lp))) {
      error = kSampleErrorBadInput;
    } else {
      if (p.penalty_slot >= 0) {
        mask_row =
            m.prompt_mask.ptr<int32_t>() + p.penalty_slot * sample_mask_words(int64_t(vocab));
        counts_row = m.output_counts.ptr<int32_t>() + p.penalty_slot * int64_t(vocab);
        update_slot(p, lists, vocab, mask_row, counts_row);
      }
      for (int i = 0; i < vocab; ++i) {
        if (std::isnan(raw[i]) || raw[i] == kInf) error = kSampleErrorNonFinite;
      }
    }
    int32_t token = error;
    if (error == 0) {
      float* x = s.x.data();  // [vocab]
      std::copy_n(raw, vocab, x);
      apply_logits_processors(x, vocab, p, lists, mask_row, counts_row);
      token = sample_processed(x, vocab, p, s.candidates.data());
    }
    out[r] = token;
    if (p.logprobs >= 0 && p.logprob_row >= 0 && p.logprob_row < n_lp) {
      fill_logprobs(raw, vocab, p.logprobs, token,
                    logprobs.f32() + p.logprob_row * (1 + kMaxTopLogprobs),
                    top_ids.ptr<int32_t>() + p.logprob_row * kMaxTopLogprobs);
    }
  }
}

}  // namespace osprey::ops::cpu
