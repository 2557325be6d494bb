// `osprey bench step --engine-loop`: decode steps through the whole engine loop (schedule, build,
// forward, sample, commit), with async scheduling on and off, at each batch size. Per decode step
// it prints the medians of the host's time before the launch (StepRecord::host_seconds: schedule
// start to launch, the wait for the previous step excluded), the device's idle gap between steps
// (previous step's ids back to this forward's start), the device's busy time and the wall time
// per step, and whether the two loops gave the same tokens (greedy). Runs on the model's device
// (CPU or CUDA). Sets the model's max_expanded_kv_rows to one request's length, as serve does.
//
// The B prompts go in through chunked prefill (max_num_batched_tokens a step): requests whose
// prompt is in decode meanwhile in mixed steps, so every request gets max_tokens enough to keep
// decoding until all B decode together; from there `warmup` pure decode steps of all B are
// skipped and `iters` measured, then the requests are aborted. A batch size that reaches no such
// step within its bound (the prefill steps the prompts need, twice, + warmup + iters) or whose
// requests stop early reports an error, never a row of zeros.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/deepseek.h"

namespace osprey::bench {

struct EngineLoopOptions {
  std::vector<int> batches = {1};
  int64_t context = 64;        // prompt tokens of every request (random ids)
  int warmup = 3, iters = 20;  // decode steps of all B requests skipped, then measured
  uint64_t seed = 0;
  int max_num_batched_tokens = 2048;  // the engine's token budget a step (the server's default)
};

// One batch size in one mode (medians over the measured steps).
struct EngineLoopRow {
  int batch = 0;
  bool async = false;
  int measured_steps = 0;      // == iters when it worked
  int64_t engine_steps = 0;    // every step the engine ran, prefill and mixed ones too
  int64_t worker_wakeups = 0;  // async: launches that woke a sleeping worker (EngineStats)
  double host_s = 0, idle_s = 0, busy_s = 0, wall_per_step_s = 0;
  bool tokens_identical = true;  // async rows: the same tokens as the synchronous loop's
  std::string error;             // non-empty: nothing measured, and why
};

// Prints the table and returns its rows (sync then async per batch size). Throws osprey::Error
// after printing when some batch size measured nothing.
std::vector<EngineLoopRow> run_engine_loop(DeepseekModel& model, const EngineLoopOptions& o);

}  // namespace osprey::bench
