// `osprey bench kernels --op indexer`: the lightning indexer alone (kernels_indexer.h). CUDA only.
#include "bench/kernels_indexer.h"

#ifdef OSPREY_WITH_CUDA
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "bench/decode_batch.h"
#include "bench/kernels_gemm.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "ops/attention_meta.h"
#include "ops/ceilings.h"
#include "ops/cuda/indexer/logits_sm90.cuh"
#include "ops/indexer.h"
#include "ops/tensor_ops.h"

namespace osprey::bench {

namespace {
constexpr int64_t kIH = 64, kID = 128, kTopk = 2048;
constexpr int kBlock = 64;
constexpr int64_t kFillRows = 16384;  // cache rows written per fill call

struct IndexerShape {
  const char* label;
  int n_seqs, ctx, s_q;  // s_q new tokens a sequence, the last at position ctx − 1
};

struct IndexerInputs : DecodeBatch {
  DeviceBuffer d_req, cache, q, w, q8, w8, topk, topk_old;
  double keys = 0;  // Σ attended keys over the tokens
};

IndexerInputs make_inputs(const IndexerShape& s, std::mt19937_64& rng, uint64_t seed) {
  IndexerInputs in;
  static_cast<DecodeBatch&>(in) = make_decode_batch(s.n_seqs, s.s_q, s.ctx, kBlock, rng);
  for (int64_t t = 0; t < in.n_tokens; ++t) in.keys += double(in.positions.ptr<int32_t>()[t] + 1);
  Buffer req(DType::I32, {in.n_tokens});  // the engine's req_id_per_token
  for (int64_t t = 0; t < in.n_tokens; ++t) req.ptr<int32_t>()[t] = int32_t(t / s.s_q);
  in.d_req = cuda::to_device(req);
  in.dev.req_id_per_token = in.d_req;
  // Random keys (never time on zeros), quantised into the FP8 cache by the CUDA twin.
  const int64_t n_slots = in.n_blocks * kBlock;
  in.cache = DeviceBuffer(DType::U8, {in.n_blocks, kBlock * ops::indexer_fp8_token_bytes(kID)});
  DeviceBuffer k(DType::F32, {kFillRows, kID});
  Buffer slots(DType::I64, {kFillRows});
  for (int64_t r0 = 0; r0 < n_slots; r0 += kFillRows) {
    const int64_t n = std::min(kFillRows, n_slots - r0);
    for (int64_t r = 0; r < n; ++r) slots.ptr<int64_t>()[r] = r0 + r;
    DeviceBuffer d_slots = cuda::to_device(slots.view().rows(0, n));
    ops::cuda::fill_uniform(k, seed + 2 + uint64_t(r0), -1.0f, 1.0f);
    AttentionMeta wm{1, int(n), kBlock, {}, {}, {}, {}, d_slots, {}};
    ops::indexer_cache_write(in.cache, k.view().rows(0, n), wm);
  }
  in.q = DeviceBuffer(DType::F32, {in.n_tokens, kIH, kID});
  in.w = DeviceBuffer(DType::F32, {in.n_tokens, kIH});
  ops::cuda::fill_uniform(in.q, seed + 4, -1.0f, 1.0f);
  ops::cuda::fill_uniform(in.w, seed + 5, -0.125f, 0.125f);
  in.q8 = DeviceBuffer(DType::U8, {in.n_tokens, kIH, kID});
  in.w8 = DeviceBuffer(DType::F32, {in.n_tokens, kIH});
  in.topk = DeviceBuffer(DType::I32, {in.n_tokens, kTopk});
  in.topk_old = DeviceBuffer(DType::I32, {in.n_tokens, kTopk});
  return in;
}

// Share of tokens whose two top-k rows hold the same set, and the mean overlap of the others.
void compare_sets(const Buffer& a, const Buffer& b, int64_t n, double* same, double* overlap) {
  int64_t equal = 0;
  double ov = 0;
  int64_t others = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::set<int32_t> sa, sb;
    for (int64_t i = 0; i < kTopk; ++i) {
      if (a.ptr<int32_t>()[t * kTopk + i] >= 0) sa.insert(a.ptr<int32_t>()[t * kTopk + i]);
      if (b.ptr<int32_t>()[t * kTopk + i] >= 0) sb.insert(b.ptr<int32_t>()[t * kTopk + i]);
    }
    if (sa == sb) {
      ++equal;
      continue;
    }
    int64_t common = 0;
    for (int32_t j : sa) common += sb.count(j);
    ov += double(common) / double(std::max<size_t>(1, sa.size()));
    ++others;
  }
  *same = double(equal) / double(n);
  *overlap = others ? ov / double(others) : 1.0;
}
}  // namespace

void run_indexer_benchmark(const KernelOptions& o, double copy_gbs) {
  const double fp8_tf = ops::cuda::fp8_gemm_tflops(8192);
  std::printf("ceiling: FP8 GEMM 8192^3 (cuBLASLt, per-tensor scales) %.0f TFLOP/s\n", fp8_tf);
  if (!ops::cuda::device_is_sm90())
    std::printf("not an sm_90 device: the tensor-core logits kernel does not run here\n");
  std::vector<IndexerShape> shapes = {
      {"decode B=64 ctx 5000", 64, 5000, 1},   {"decode B=16 ctx 5000", 16, 5000, 1},
      {"decode B=1 ctx 5000", 1, 5000, 1},     {"decode B=64 ctx 2048", 64, 2048, 1},
      {"decode B=64 ctx 16384", 64, 16384, 1}, {"decode B=64 MTP s_q=2", 64, 5000, 2},
      {"prefill 5000 tokens", 1, 5000, 5000},  {"prefill chunk 2048 @ 16384", 1, 16384, 2048},
  };
  if (o.quick) shapes = {shapes[0], shapes[6]};
  std::printf("\n%-27s %7s %9s %8s %6s %8s %6s %9s %9s %9s %7s %8s\n", "shape", "tokens",
              "logit_us", "GB/s", "%copy", "TFLOP/s", "%fp8", "quant_us", "op_us", "old_us", "same",
              "overlap");
  std::mt19937_64 rng(o.seed);
  uint64_t seed = o.seed * 1000;
  const float scale = 1.0f / std::sqrt(float(kID));
  for (const IndexerShape& s : shapes) {
    IndexerInputs in = make_inputs(s, rng, seed += 100);
    const int64_t ld = in.host.block_table.size(1) * kBlock;
    DeviceBuffer scores(DType::F32, {in.n_tokens, ld});
    auto quant = [&] { ops::indexer_quantize_q(in.q8, in.w8, in.q, in.w); };
    quant();
    const bool sm90 = ops::cuda::indexer_logits_sm90_supported(in.q8, in.w8, in.cache, in.dev);
    auto logits = [&] {
      ops::cuda::indexer_logits_sm90(scores.view().f32(), ld, in.q8, in.w8, in.cache, in.dev,
                                     scale);
    };
    auto op = [&] {
      quant();
      ops::indexer_topk(in.topk, in.q8, in.w8, in.cache, in.dev, scale);
    };
    auto old = [&] { ops::indexer_topk(in.topk_old, in.q, in.w, in.cache, in.dev, scale); };
    const int iters_old = s.s_q > 64 ? std::min(o.iters, 3) : o.iters;
    const double t_logits =
        sm90 ? ops::cuda::time_events(logits, o.warmup, o.iters, kKernelFlushBytes).median_ms : 0;
    const double t_quant =
        ops::cuda::time_events(quant, o.warmup, o.iters, kKernelFlushBytes).median_ms;
    const double t_op = ops::cuda::time_events(op, o.warmup, o.iters, kKernelFlushBytes).median_ms;
    const double t_old = o.baseline ? ops::cuda::time_events(old, std::min(o.warmup, 1), iters_old,
                                                             kKernelFlushBytes)
                                          .median_ms
                                    : 0;
    op();
    old();
    cuda::synchronize();
    double same = 0, overlap = 0;
    compare_sets(cuda::to_host(in.topk), cuda::to_host(in.topk_old), in.n_tokens, &same, &overlap);
    // Bytes the logits kernel must read: the attended keys once per sequence (prefill tokens of
    // a sequence share them), 132 B each, + q8 and the scores written.
    double key_bytes = 0;
    for (int q = 0; q < s.n_seqs; ++q) key_bytes += double(s.ctx) * 132.0;
    const double bytes = key_bytes + double(in.n_tokens) * (kIH * kID + kIH * 4) + in.keys * 4;
    const double flops = 2.0 * kIH * kID * in.keys;
    const double gbs = t_logits > 0 ? bytes / (t_logits * 1e-3) / 1e9 : 0;
    const double tf = t_logits > 0 ? flops / (t_logits * 1e-3) / 1e12 : 0;
    std::printf("%-27s %7lld %9.1f %8.0f %5.1f%% %8.1f %5.1f%% %9.1f %9.1f %9.1f %6.1f%% %7.4f\n",
                s.label, static_cast<long long>(in.n_tokens), t_logits * 1e3, gbs,
                100.0 * gbs / copy_gbs, tf, 100.0 * tf / fp8_tf, t_quant * 1e3, t_op * 1e3,
                t_old * 1e3, 100.0 * same, overlap);
    std::fflush(stdout);
  }
  std::printf(
      "(V3.2's indexer: 64 heads × 128, FP8 keys 132 B/token, top-2048; logit_us = the tensor-core "
      "logits kernel alone; bytes = the keys once a sequence + q8 + the scores written; FLOPs = "
      "2·64·128 per attended key; op_us = q quantisation + logits + radix top-2048 (the step's "
      "cost); old_us = the CUDA-core path on F32 q; same = tokens whose top-2048 set is identical "
      "between the two (FP8 vs F32 q), overlap = the mean shared fraction of the others; median of "
      "%d after %d warm-up, L2 flushed)\n",
      o.iters, o.warmup);
}

}  // namespace osprey::bench
#endif
