// The predicted time of an engine step, from the model's config (model/step_cost.h), for the
// scheduler's step-time token budget (scheduler.h, TokenBudgetPolicy::StepTime).
//
// A step is split into four parts, each the prior's guess in seconds:
//   z_memory  = memory_factor  · bytes / copy bandwidth            (what decode steps are made of)
//   z_compute = compute_factor · (GEMM FLOPs / GEMM rate + attention FLOPs / BF16 rate) (chunks)
//   z_step    = per_step_s                                          (launches, metadata, sync)
//   z_seq     = per_seq_s · sequences in the step                   (sampling, stop checks, output)
// and the prediction is Σ m_i · z_i with multipliers m (1 before any measurement). calibrate()
// refits m from measured step times by ridge regression toward 1 on relative errors (old steps
// forgotten by kForget per step, the prior weighing as kPriorSteps steps of average size), so a few
// odd steps move it little while many steps of one kind pin it. Pure arithmetic: no clock, no
// backend.
#pragma once

#include <array>
#include <cstdint>

#include "config/model_config.h"
#include "model/step_cost.h"

namespace osprey {

struct StepTimePrior {
  DeviceRates rates;
  double memory_factor = 1;   // measured / floor of memory-bound steps
  double compute_factor = 1;  // measured / floor of compute-bound steps
  double per_step_s = 0;
  double per_seq_s = 0;
};
// The H200 prior, from the 5000/500/64 wave on the dsv32 proxy (bench/RESULTS.md, issue 14,
// 2026-12-01, sixth session): decode steps 1.3× their bytes floor, chunks 3.6× their FLOPs floor,
// ~0.1 ms a step of launch and metadata, 5 µs a sequence (step_time_model.cpp).
StepTimePrior cuda_step_time_prior();
// The CPU prior: rates of a 2-core CI machine (20 GB/s, 0.2 TFLOP/s); calibration does the rest.
StepTimePrior cpu_step_time_prior();

class StepTimeModel {
 public:
  static constexpr int kParts = 4;  // memory, compute, per step, per sequence
  StepTimeModel(const ModelConfig& config, const StepCostOptions& cost, const StepTimePrior& prior);

  // Seconds the step is predicted to take.
  double predict(const StepShape& shape) const;
  // A measured step: refits the multipliers.
  void calibrate(const StepShape& shape, double seconds);

  // The most prompt tokens a step may add to the decodes `decode_contexts` (a chunk starting at
  // position `chunk_start`) while its predicted time stays within `target_s`: the largest n in
  // [min_tokens, max_tokens] with predict(decodes + chunk of n) <= target_s, rounded down to a
  // multiple of `align` when above it; min_tokens when even that is over the target (prefill
  // always progresses); max_tokens when there are no decodes (nothing waits on the chunk).
  int prefill_budget(const std::vector<int64_t>& decode_contexts, int64_t chunk_start,
                     int min_tokens, int max_tokens, int align, double target_s) const;

  const std::array<double, kParts>& multipliers() const { return m_; }
  int64_t calibrations() const { return n_; }
  const ModelConfig& config() const { return config_; }

 private:
  std::array<double, kParts> parts(const StepShape& shape) const;  // z, seconds

  ModelConfig config_;
  StepCostOptions cost_;
  StepTimePrior prior_;
  std::array<double, kParts> m_{1, 1, 1, 1};
  // Decayed sums of the normal equations: Σ z zᵀ, Σ z y, Σ z_i², Σ 1.
  std::array<std::array<double, kParts>, kParts> zz_{};
  std::array<double, kParts> zy_{}, z2_{};
  double w_ = 0;
  int64_t n_ = 0;
};

}  // namespace osprey
