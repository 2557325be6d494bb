// `osprey bench kernels --op indexer` (BENCHMARKS.md, "Kernels alone"): V3.2's lightning indexer
// (64 heads × 128, FP8 key cache, top-2048) at decode (B sequences of one token, context C) and
// over a prefill (P new tokens of one sequence):
//   logits: the tensor-core FP8 MQA logits kernel alone (indexer/logits_sm90.cu), GB/s on the key
//           bytes beside the copy ceiling, TFLOP/s (2 · 64 · 128 per attended key) beside the FP8
//           ceiling, both measured in the same run;
//   topk:   the whole op (q quantisation + logits + radix top-2048), and the CUDA-core path it
//           replaces (F32 q, indexer_score_kernel), with the two top-k results compared as sets.
// CUDA only; called from kernels.cpp.
#pragma once

#include "bench/kernels.h"

namespace osprey::bench {
void run_indexer_benchmark(const KernelOptions& o, double copy_gbs);
}  // namespace osprey::bench
