// `osprey bench step`: times one model's prefill and decode steps on the GPU (CUDA events, warm-up,
// median of many) and prints achieved GB/s and TFLOP/s beside the card's ceilings measured in the
// same run (BENCHMARKS.md); --engine-loop adds the engine loop's host time and idle gap per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace osprey::bench {

struct StepOptions {
  std::string model_dir;  // a model folder, or
  std::string preset;     // a make-model preset (dsv32) with random weights made on the GPU
  std::string load_format = "auto";  // auto (from files) | dummy (random device weights)
  std::vector<int> batches = {1};
  int64_t context = 5000;
  int64_t prefill = 0;  // > 0: also time a prefill of this many tokens
  int warmup = 3, iters = 20, prefill_iters = 5;
  uint64_t seed = 0;
  bool fp8 = true;  // dummy weights: FP8 linears (as the checkpoint would have them)
  std::string kv_cache_dtype = "auto";  // the latent cache: auto (BF16) | bf16 | fp8
  // > 0: also time, at each batch size, a speculative verify step: every sequence brings its
  // token + spec_tokens drafts (s_q = 1 + K on the decode path, logits of every row).
  int spec_tokens = 0;
  // With spec_tokens: the MTP layer's draft steps are timed too (a dummy model gets DeepSeek's one
  // MTP layer when its config has none), and > 0 prints the speedup MTP decoding gives at this
  // mean accepted length (tokens a sequence per verify step, 1 .. 1 + spec_tokens).
  double accepted_length = 0;
  // Also run the decode steps through the engine loop with async scheduling on and off
  // (bench/engine_loop.h): host time per step, the device's idle gap, identical tokens. The one
  // part that runs without CUDA (with --model, on the CPU).
  bool engine_loop = false;
  // Also time each decode batch as a CUDA graph replay (engine/cuda_graph_runner.h), its kernels
  // per step counted from the captured graph.
  bool cuda_graph = false;
};

void run_step_benchmark(const StepOptions& o);

}  // namespace osprey::bench
