#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace osprey {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Index of the largest value; ties → the lowest index.
int32_t argmax(const float* x, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace

void Sampler::reserve(int vocab) {
  if (x_.size() >= static_cast<size_t>(vocab)) return;
  // New elements are value-initialised: counts_ and seen_ start (and stay, between rows) zero.
  x_.resize(static_cast<size_t>(vocab));
  candidates_.resize(static_cast<size_t>(vocab));
  counts_.resize(static_cast<size_t>(vocab));
  seen_.resize(static_cast<size_t>(vocab));
}

void Sampler::sample(Tensor logits, const std::vector<SamplingRow>& rows,
                     std::vector<SampleResult>* out) {
  OSPREY_CHECK(logits.device == Device::CPU && logits.dim() == 2, "logits ",
               shape_str(logits.shape), " must be [n_rows, vocab] on the CPU");
  const int64_t n_rows = logits.size(0);
  const int64_t vocab64 = logits.size(1);
  OSPREY_CHECK(static_cast<int64_t>(rows.size()) == n_rows, rows.size(), " rows for logits ",
               shape_str(logits.shape));
  OSPREY_CHECK(vocab64 > 0 && vocab64 <= std::numeric_limits<int32_t>::max(), "vocab ", vocab64);
  const int vocab = static_cast<int>(vocab64);
  const float* data = logits.f32();
  reserve(vocab);
  out->resize(rows.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    const SamplingRow& row = rows[static_cast<size_t>(r)];
    OSPREY_CHECK(row.params && row.prompt_tokens && row.output_tokens, "row ", r, " incomplete");
    const float* raw = data + r * vocab64;
    SampleResult& res = (*out)[static_cast<size_t>(r)];
    res.token = sample_row(raw, vocab, row);
    if (row.params->logprobs >= 0) {
      fill_logprobs(raw, vocab, row.params->logprobs, res.token, &res);
    } else {
      res.logprob = std::numeric_limits<float>::quiet_NaN();
      res.top_logprobs.clear();
    }
  }
}

void Sampler::apply_logits_processors(float* x, int vocab, const SamplingRow& row) {
  reserve(vocab);
  const SamplingParams& p = *row.params;
  const std::vector<int32_t>& prompt = *row.prompt_tokens;
  const std::vector<int32_t>& output = *row.output_tokens;
  auto check_id = [vocab](int32_t t) {
    OSPREY_CHECK(t >= 0 && t < vocab, "token id ", t, " outside the vocabulary of ", vocab);
  };

  // min_tokens: no stop before min_tokens outputs. With ignore_eos, EOS does not stop, so it stays.
  if (static_cast<int64_t>(output.size()) < p.min_tokens) {
    for (int32_t t : p.stop_token_ids) {
      check_id(t);
      x[t] = -kInf;
    }
    if (!p.ignore_eos && row.eos_token_id >= 0) {
      check_id(row.eos_token_id);
      x[row.eos_token_id] = -kInf;
    }
  }

  // Repetition: once per distinct token of prompt ∪ output.
  if (p.repetition_penalty != 1.0f) {
    const float rp = p.repetition_penalty;
    auto penalise = [&](int32_t t) {
      check_id(t);
      if (seen_[static_cast<size_t>(t)]) return;
      seen_[static_cast<size_t>(t)] = 1;
      x[t] = x[t] > 0.0f ? x[t] / rp : x[t] * rp;
    };
    for (int32_t t : prompt) penalise(t);
    for (int32_t t : output) penalise(t);
    for (int32_t t : prompt) seen_[static_cast<size_t>(t)] = 0;
    for (int32_t t : output) seen_[static_cast<size_t>(t)] = 0;
  }

  // Frequency and presence, over the output only. The second loop applies each distinct token
  // once (at its first occurrence) and zeroes its count, leaving counts_ clean for the next row.
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (int32_t t : output) {
      check_id(t);
      ++counts_[static_cast<size_t>(t)];
    }
    for (int32_t t : output) {
      int32_t& c = counts_[static_cast<size_t>(t)];
      if (c == 0) continue;
      x[t] -= p.frequency_penalty * static_cast<float>(c);
      x[t] -= p.presence_penalty;
      c = 0;
    }
  }
}

int32_t Sampler::sample_row(const float* raw, int vocab, const SamplingRow& row) {
  const SamplingParams& p = *row.params;
  float* x = x_.data();  // [vocab]
  for (int i = 0; i < vocab; ++i) {
    OSPREY_CHECK(!std::isnan(raw[i]) && raw[i] != kInf, "logit ", i, " is ", raw[i]);
    x[i] = raw[i];
  }
  apply_logits_processors(x, vocab, row);

  if (p.temperature < kGreedyTemperature) return argmax(x, vocab);

  float m = -kInf;
  for (int i = 0; i < vocab; ++i) {
    x[i] /= p.temperature;
    m = std::max(m, x[i]);
  }
  OSPREY_CHECK(m > -kInf, "every token of the row is suppressed");
  const float min_p = p.min_p;

  // Top-k and top-p give a cut on x; both are measured on what min-p keeps.
  float cut = -kInf;
  const bool use_top_k = p.top_k > 0 && p.top_k < vocab;
  const bool use_top_p = p.top_p < 1.0f;
  if (use_top_k || use_top_p) {
    Candidate* cand = candidates_.data();
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
  const double target = sampling_uniform(row.seed, row.output_tokens->size()) * z;
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

void Sampler::fill_logprobs(const float* raw, int vocab, int n, int32_t token, SampleResult* r) {
  float m = -kInf;
  for (int i = 0; i < vocab; ++i) m = std::max(m, raw[i]);
  double s = 0.0;
  for (int i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(raw[i]) - m);
  const double lse = m + std::log(s);
  r->logprob = static_cast<float>(raw[token] - lse);

  // The n largest raw logits, kept sorted descending; scanning ids upwards and inserting after
  // equal values puts ties in ascending id order.
  auto& top = r->top_logprobs;
  top.clear();
  n = std::min(n, vocab);
  for (int i = 0; i < vocab && n > 0; ++i) {
    if (static_cast<int>(top.size()) == n && !(raw[i] > top.back().second)) continue;
    auto pos =
        std::upper_bound(top.begin(), top.end(), raw[i],
                         [](float v, const std::pair<int32_t, float>& e) { return v > e.second; });
    top.insert(pos, {i, raw[i]});
    if (static_cast<int>(top.size()) > n) top.pop_back();
  }
  for (auto& e : top) e.second = static_cast<float>(e.second - lse);
}

}  // namespace osprey
