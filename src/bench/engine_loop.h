// `osprey bench step --engine-loop`: decode steps through the whole engine loop (schedule, build,
// forward, sample, commit), with async scheduling on and off, at each batch size. Per decode step
// it prints the medians of the host's time before the launch (StepRecord::host_seconds: schedule
// start to launch, the wait for the previous step excluded), the device's idle gap between steps
// (previous step's ids back to this forward's start), the device's busy time and the wall time
// per step, and whether the two loops gave the same tokens (greedy). Runs on the model's device
// (CPU or CUDA). Sets the model's max_expanded_kv_rows to one request's length, as serve does.
#pragma once

#include <cstdint>
#include <vector>

#include "model/deepseek.h"

namespace osprey::bench {

struct EngineLoopOptions {
  std::vector<int> batches = {1};
  int64_t context = 64;        // prompt tokens of every request (random ids)
  int warmup = 3, iters = 20;  // decode steps skipped, then measured
  uint64_t seed = 0;
};

void run_engine_loop(DeepseekModel& model, const EngineLoopOptions& o);

}  // namespace osprey::bench
