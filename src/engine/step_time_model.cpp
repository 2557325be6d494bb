#include "engine/step_time_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace osprey {

namespace {
// How fast old measurements fade: each new step multiplies the weight of the earlier ones by
// this (a half-life of ~140 steps: a few hundred steps of history, so the model follows a change
// of load or of context length within one wave of requests).
constexpr double kForget = 0.995;
// The prior counts as this many steps of average size (ridge toward the multipliers' 1).
constexpr double kPriorSteps = 1;
// Multipliers stay within this range of the prior (a safety net against a degenerate fit).
constexpr double kMinMultiplier = 0.02, kMaxMultiplier = 50;

// Solves a·x = b (kParts × kParts, symmetric positive definite after the ridge) by Gaussian
// elimination with partial pivoting; false when singular.
bool solve(std::array<std::array<double, StepTimeModel::kParts>, StepTimeModel::kParts> a,
           std::array<double, StepTimeModel::kParts> b,
           std::array<double, StepTimeModel::kParts>& x) {
  constexpr int n = StepTimeModel::kParts;
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c + 1; r < n; ++r)
      if (std::abs(a[size_t(r)][size_t(c)]) > std::abs(a[size_t(p)][size_t(c)])) p = r;
    if (std::abs(a[size_t(p)][size_t(c)]) < 1e-300) return false;
    std::swap(a[size_t(p)], a[size_t(c)]);
    std::swap(b[size_t(p)], b[size_t(c)]);
    for (int r = c + 1; r < n; ++r) {
      const double f = a[size_t(r)][size_t(c)] / a[size_t(c)][size_t(c)];
      for (int k = c; k < n; ++k) a[size_t(r)][size_t(k)] -= f * a[size_t(c)][size_t(k)];
      b[size_t(r)] -= f * b[size_t(c)];
    }
  }
  for (int r = n - 1; r >= 0; --r) {
    double v = b[size_t(r)];
    for (int k = r + 1; k < n; ++k) v -= a[size_t(r)][size_t(k)] * x[size_t(k)];
    x[size_t(r)] = v / a[size_t(r)][size_t(r)];
  }
  return true;
}
}  // namespace

StepTimePrior cuda_step_time_prior() {
  StepTimePrior p;
  p.rates = kH200Rates;
  // Fitted to the steps the server measured on the H200 (bench/RESULTS.md, issue 14, 2026-12-01,
  // sixth session: the dsv32 proxy, CUDA graphs, async scheduling): decode-only 2.80 ms at B=2,
  // 4.55 at B=13, 6.98 at B=42, 7.55 at B=54 (context ~5250); mixed 47.3 ms (B=32 + a 1440-token
  // chunk) and 47.2 (B=56 + 1435); `bench step` prefill 5000 143 ms mean, 120 median. The parts
  // add, so a decode's GEMM FLOPs (hidden under its bytes on the GPU) count twice: the memory
  // factor below 1 is that overlap, not a step beating its floor. The fixed 1.75 ms a step is
  // mostly the ~240 kernels' launch and ramp (host work is 22 µs at B=64, issue 13).
  p.memory_factor = 0.75;
  p.compute_factor = 3.0;
  p.per_step_s = 1.75e-3;
  p.per_seq_s = 1e-6;
  return p;
}

StepTimePrior cpu_step_time_prior() {
  StepTimePrior p;
  p.rates = DeviceRates{20, 0.2, 0.2};
  p.per_step_s = 1.75e-3;
  p.per_seq_s = 1e-6;
  return p;
}

StepTimeModel::StepTimeModel(const ModelConfig& config, const StepCostOptions& cost,
                             const StepTimePrior& prior)
    : config_(config), cost_(cost), prior_(prior) {
  OSPREY_CHECK(prior.rates.copy_gbs > 0 && prior.rates.fp8_tflops > 0 &&
                   prior.rates.bf16_tflops > 0 && prior.memory_factor > 0 &&
                   prior.compute_factor > 0 && prior.per_step_s > 0 && prior.per_seq_s > 0,
               "step-time prior: rates and factors must be positive");
}

std::array<double, StepTimeModel::kParts> StepTimeModel::parts(const StepShape& shape) const {
  const StepCost c = step_cost(config_, shape, cost_);
  const DeviceRates& r = prior_.rates;
  const double gemm_rate = (cost_.fp8 ? r.fp8_tflops : r.bf16_tflops) * 1e12;
  const double seqs = double(shape.decode_contexts.size() + shape.chunks.size());
  return {
      prior_.memory_factor * c.bytes() / (r.copy_gbs * 1e9),
      prior_.compute_factor * (c.gemm_flops / gemm_rate + c.attn_flops / (r.bf16_tflops * 1e12)),
      prior_.per_step_s, prior_.per_seq_s * seqs};
}

double StepTimeModel::predict(const StepShape& shape) const {
  const auto z = parts(shape);
  double t = 0;
  for (int i = 0; i < kParts; ++i) t += m_[size_t(i)] * z[size_t(i)];
  return t;
}

void StepTimeModel::calibrate(const StepShape& shape, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return;  // a clock glitch is not a measurement
  // Relative errors count, not absolute ones (a 5 ms decode step matters as much as a 500 ms
  // chunk): each part is divided by the measured time, so the fit is of 1 ≈ Σ m_i z_i / y.
  auto z = parts(shape);
  for (double& v : z) v /= seconds;
  for (int i = 0; i < kParts; ++i) {
    for (int j = 0; j < kParts; ++j)
      zz_[size_t(i)][size_t(j)] = kForget * zz_[size_t(i)][size_t(j)] + z[size_t(i)] * z[size_t(j)];
    zy_[size_t(i)] = kForget * zy_[size_t(i)] + z[size_t(i)];
    z2_[size_t(i)] = kForget * z2_[size_t(i)] + z[size_t(i)] * z[size_t(i)];
  }
  w_ = kForget * w_ + 1;
  ++n_;
  // Ridge toward m = 1: (Σ z zᵀ + Λ) m = Σ z y + Λ·1, Λ_ii = kPriorSteps · mean(z_i²).
  auto a = zz_;
  auto b = zy_;
  for (int i = 0; i < kParts; ++i) {
    const double lambda = kPriorSteps * z2_[size_t(i)] / w_;
    a[size_t(i)][size_t(i)] += lambda;
    b[size_t(i)] += lambda;
  }
  std::array<double, kParts> m{};
  if (!solve(a, b, m)) return;
  for (int i = 0; i < kParts; ++i) {
    if (!std::isfinite(m[size_t(i)])) return;
    m[size_t(i)] = std::clamp(m[size_t(i)], kMinMultiplier, kMaxMultiplier);
  }
  m_ = m;
}

int StepTimeModel::prefill_budget(const std::vector<int64_t>& decode_contexts, int64_t chunk_start,
                                  int min_tokens, int max_tokens, int align,
                                  double target_s) const {
  if (max_tokens <= 0) return 0;
  min_tokens = std::clamp(min_tokens, 1, max_tokens);
  if (decode_contexts.empty()) return max_tokens;
  StepShape shape;
  shape.decode_contexts = decode_contexts;
  shape.chunks.push_back({chunk_start, 0});
  auto fits = [&](int n) {
    shape.chunks[0].tokens = n;
    return predict(shape) <= target_s;
  };
  if (!fits(min_tokens)) return min_tokens;
  if (fits(max_tokens)) return max_tokens;
  int lo = min_tokens, hi = max_tokens;  // fits(lo), !fits(hi): the predicted time grows with n
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  if (align > 1 && lo >= align) lo -= lo % align;
  return std::max(lo, min_tokens);
}

}  // namespace osprey
