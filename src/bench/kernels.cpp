#include "bench/kernels.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/kernels_gemm.h"
#include "bench/kernels_indexer.h"
#include "core/error.h"

#ifdef OSPREY_WITH_CUDA
#include "bench/decode_batch.h"
#include "core/device_buffer.h"
#include "ops/ceilings.h"
#include "ops/cuda/mla/hooks.h"
#include "ops/mla.h"
#include "ops/mla_plan.h"
#include "ops/tensor_ops.h"
#endif

namespace osprey::bench {

#ifndef OSPREY_WITH_CUDA
void run_kernel_benchmark(const KernelOptions&) {
  fail("osprey bench kernels needs the CUDA backend: rebuild where nvcc is installed");
}
#else

double rel_l2_bf16(const Buffer& a, const Buffer& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = bf16_to_f32(a.ptr<uint16_t>()[i]), y = bf16_to_f32(b.ptr<uint16_t>()[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

namespace {
constexpr int64_t kHeads = 128, kLora = 512, kRope = 64, kWidth = kLora + kRope;
constexpr int kBlock = 64, kTopk = 2048;
constexpr float kScale = 0.135f;  // V3.2's softmax scale: 192^-0.5 · mscale² (yarn, factor 40)
constexpr int64_t kFillRows = 1 << 18;  // FP8 cache rows quantised per fill call

// One attention shape: n_seqs sequences at context ctx, s_q query tokens each at the last s_q
// positions (q_first > 0: every sequence's queries are positions q_first .. ctx − 1 instead).
struct MlaShape {
  const char* kernel;  // "sparse decode", "dense decode", "sparse prefill"
  int n_seqs, s_q, ctx;
  bool sparse, fp8;
  double flashmla_us;  // FlashMLA on our H200 (performance.md §8), 0 = not measured
  bool baseline;       // also time the CUDA-core kernel
};

std::vector<MlaShape> mla_shapes(bool quick) {
  std::vector<MlaShape> v = {
      {"sparse decode", 1, 1, 5000, true, true, 21.6, false},
      {"sparse decode", 16, 1, 5000, true, true, 42.6, false},
      {"sparse decode", 64, 1, 5000, true, true, 102.0, true},
      {"sparse decode", 64, 2, 5000, true, true, 190.2, false},
      {"sparse decode", 128, 1, 5000, true, true, 190.7, false},
      {"sparse decode", 128, 2, 5000, true, true, 367.2, false},
      {"sparse decode", 64, 1, 2048, true, true, 0, false},
      {"sparse decode", 64, 1, 16384, true, true, 100.5, false},
      {"sparse decode", 64, 1, 65536, true, true, 0, false},
      {"sparse decode", 64, 1, 5000, true, false, 0, true},
      {"sparse decode", 16, 1, 5000, true, false, 0, false},
      {"sparse decode", 128, 1, 5000, true, false, 0, false},
      {"dense decode", 1, 1, 2048, false, false, 22.2, false},
      {"dense decode", 1, 1, 5000, false, false, 26.3, false},
      {"dense decode", 1, 1, 16384, false, false, 42.1, false},
      {"dense decode", 1, 1, 65536, false, false, 0, false},
      {"dense decode", 16, 1, 5000, false, false, 55.2, false},
      {"dense decode", 64, 1, 2048, false, false, 67.3, false},
      {"dense decode", 64, 1, 5000, false, false, 152.2, true},
      {"dense decode", 64, 1, 16384, false, false, 454.4, false},
      {"dense decode", 128, 1, 5000, false, false, 288.8, false},
      {"dense decode", 128, 1, 16384, false, false, 886.1, false},
      {"dense decode", 64, 1, 5000, false, true, 0, false},
      {"sparse prefill", 1, 2048, 5000, true, false, 1780.0, false},  // all 2048 rows valid
      {"sparse prefill", 1, 5000, 5000, true, false, 4340.0, true},   // a whole prompt, causal
      {"sparse prefill", 1, 8192, 16384, true, false, 0, false},
      {"sparse prefill", 1, 2048, 5000, true, true, 0, false},
      // Serving chunks: 1440 queries at context 1900 (causal, every row < 2048 keys) and a fresh
      // 1440-token prompt (rows of 1..1440 keys: the short rows of a first chunk).
      {"sparse prefill", 1, 1440, 1900, true, false, 0, false},
      {"sparse prefill", 1, 1440, 1440, true, false, 0, false},
  };
  // --quick: FP8 sparse decode B=64, dense decode B=64 (BF16), the causal 5000-token prefill.
  if (quick) v = {v[2], v[18], v[24]};
  return v;
}

// Host metadata + its device copy for a shape, blocks shuffled over the cache.
struct MlaInputs : DecodeBatch {
  Buffer topk;
  DeviceBuffer d_topk, cache, q;
  double flops = 0, bytes = 0;
};

MlaInputs make_inputs(const MlaShape& s, std::mt19937_64& rng, uint64_t seed) {
  MlaInputs in;
  static_cast<DecodeBatch&>(in) = make_decode_batch(s.n_seqs, s.s_q, s.ctx, kBlock, rng);
  const int64_t token_bytes = s.fp8 ? ops::mla_fp8_token_bytes(kLora, kRope) : kWidth * 2;
  if (s.sparse) {
    // Per token: min(2048, p + 1) distinct positions ≤ p in random order, then −1.
    in.topk = Buffer(DType::I32, {in.n_tokens, kTopk});
    std::vector<int32_t> js;
    for (int64_t t = 0; t < in.n_tokens; ++t) {
      const int p = in.positions.ptr<int32_t>()[t];
      int32_t* row = in.topk.ptr<int32_t>() + t * kTopk;
      const int L = std::min(kTopk, p + 1);
      if (p + 1 <= kTopk) {
        for (int i = 0; i < kTopk; ++i) row[i] = i <= p ? i : -1;
        std::shuffle(row, row + L, rng);
      } else {
        js.resize(size_t(p) + 1);
        std::iota(js.begin(), js.end(), 0);
        for (int i = 0; i < L; ++i) {  // partial Fisher–Yates: L distinct picks
          std::uniform_int_distribution<int> d(i, p);
          std::swap(js[size_t(i)], js[size_t(d(rng))]);
          row[i] = js[size_t(i)];
        }
      }
    }
  }
  for (int64_t t = 0; t < in.n_tokens; ++t) {
    const int64_t p = in.positions.ptr<int32_t>()[t];
    const double L = s.sparse ? double(std::min<int64_t>(kTopk, p + 1)) : double(p + 1);
    in.flops += 2.0 * kHeads * L * double(kWidth + kLora);
    in.bytes += L * double(token_bytes);
  }
  in.bytes += double(in.n_tokens) * kHeads * double(kWidth + kLora) * 2;  // q + out, BF16
  if (s.sparse) in.d_topk = cuda::to_device(in.topk);
  in.dev.fingerprint = attention_fingerprint(in.host, s.sparse ? kTopk : INT32_MAX);
  // Random cache rows (never time on zeros); FP8 rows quantised by the CUDA twin.
  const int64_t n_slots = in.n_blocks * kBlock;
  if (!s.fp8) {
    in.cache = DeviceBuffer(DType::BF16, {in.n_blocks, kBlock, kWidth});
    ops::cuda::fill_uniform(in.cache, seed + 1, -1.0f, 1.0f);
  } else {
    in.cache = DeviceBuffer(DType::U8, {in.n_blocks, kBlock, token_bytes});
    DeviceBuffer lat(DType::F32, {kFillRows, kLora}), pe(DType::F32, {kFillRows, kRope});
    Buffer slots(DType::I64, {kFillRows});
    for (int64_t r0 = 0; r0 < n_slots; r0 += kFillRows) {
      const int64_t n = std::min(kFillRows, n_slots - r0);
      for (int64_t r = 0; r < n; ++r) slots.ptr<int64_t>()[r] = r0 + r;
      DeviceBuffer d_slots = cuda::to_device(slots.view().rows(0, n));
      ops::cuda::fill_uniform(lat, seed + 2 + uint64_t(r0), -1.0f, 1.0f);
      ops::cuda::fill_uniform(pe, seed + 3 + uint64_t(r0), -1.0f, 1.0f);
      AttentionMeta w{1, int(n), kBlock, {}, {}, {}, {}, d_slots, {}};
      ops::mla_cache_write(in.cache, lat.view().rows(0, n), pe.view().rows(0, n), w);
    }
  }
  in.q = DeviceBuffer(DType::BF16, {in.n_tokens, kHeads, kWidth});
  ops::cuda::fill_uniform(in.q, seed + 4, -1.0f, 1.0f);
  return in;
}

void run_mla(const KernelOptions& o, double copy_gbs, double bf16_tf) {
  std::mt19937_64 rng(o.seed);
  std::vector<MlaShape> shapes;
  for (const MlaShape& s : mla_shapes(o.quick))
    if (o.mla_kernel.empty() || o.mla_kernel == s.kernel) shapes.push_back(s);
  if (shapes.empty())
    fail("--mla-kernel '", o.mla_kernel,
         "' names no shape: 'sparse decode', 'dense decode' or 'sparse prefill'");
  std::printf("\nseesaw kernel, dense BF16 cache tiles: %s\n",
              ops::cuda::mla_dense_tma_enabled() ? "TMA boxes (OSPREY_MLA_DENSE_TMA=1)"
                                                 : "cp.async gathers (OSPREY_MLA_DENSE_TMA=0)");
  std::printf("\n%-15s %-5s %4s %4s %6s %10s %8s %6s %7s %6s %10s %9s %9s\n", "kernel", "cache",
              "B", "s_q", "ctx", "time_us", "TFLOP/s", "%bf16", "GB/s", "%copy", "FlashMLA",
              "core_us", "rel_err");
  for (const MlaShape& s : shapes) {
    MlaInputs in = make_inputs(s, rng, o.seed);
    Tensor topk = s.sparse ? in.d_topk.view() : Tensor{};
    // The CUDA-core kernels on the same inputs: the check, and the time it replaces.
    const bool was = ops::cuda::set_mla_sm90_enabled(false);
    DeviceBuffer ref(DType::BF16, {in.n_tokens, kHeads, kLora});
    ops::mla_attention_absorbed(ref, in.q, in.cache, in.dev, topk, kScale);
    double core_us = 0;
    if (o.baseline && s.baseline)
      core_us = ops::cuda::time_events(
                    [&] { ops::mla_attention_absorbed(ref, in.q, in.cache, in.dev, topk, kScale); },
                    1, 3, kKernelFlushBytes)
                    .median_ms *
                1e3;
    ops::cuda::set_mla_sm90_enabled(was);
    cuda::synchronize();
    const Buffer want = cuda::to_host(ref);
    // A BF16 sparse prefill runs with each prefill kernel (the prefill variant, the default, its
    // overlapped issue order, then the seesaw kernel as for decode: rows "sparse prefill",
    // "  overlapped" and "  seesaw"), then the variant with
    // other per-token costs in the split-KV plan ("  cost N": ops/mla_plan.h, default
    // kMlaPrefillTokenCost); other shapes with the kernel they take.
    using ops::cuda::MlaPrefillKernel;
    // A BF16 sparse decode row (one token a sequence) runs the prefill variant (the default for
    // decode batches too), then its overlapped order and the seesaw kernel on the same batch
    // ("  overlapped", "  seesaw": OSPREY_MLA_SPARSE_DECODE).
    // An FP8 row runs the lockstep kernel, then the crossover kernels ("  crossover": the two
    // head groups of a part in a cluster of two CTAs, each dequantising half of every tile for
    // both; "  pipelined": the prefill variant's consumers over those tiles; "  f16": the
    // lockstep kernel with an f16 latent tile; OSPREY_MLA_FP8).
    using ops::cuda::MlaFp8Kernel;
    struct Variant {
      MlaPrefillKernel kernel;
      int cost;
      std::string label;
      MlaFp8Kernel fp8 = MlaFp8Kernel::Lockstep;
    };
    const int cost0 = ops::cuda::mla_prefill_token_cost();
    std::vector<Variant> variants = {{ops::cuda::mla_prefill_kernel(), cost0, s.kernel}};
    if (s.fp8)
      variants = {{ops::cuda::mla_prefill_kernel(), cost0, s.kernel, MlaFp8Kernel::Lockstep},
                  {ops::cuda::mla_prefill_kernel(), cost0, "  crossover", MlaFp8Kernel::Crossover},
                  {ops::cuda::mla_prefill_kernel(), cost0, "  pipelined", MlaFp8Kernel::Pipelined},
                  {ops::cuda::mla_prefill_kernel(), cost0, "  f16", MlaFp8Kernel::F16}};
    const bool bf16_prefill = std::string_view(s.kernel) == "sparse prefill" && !s.fp8;
    const bool bf16_decode = std::string_view(s.kernel) == "sparse decode" && !s.fp8 && s.s_q == 1;
    if (bf16_decode)
      variants = {{MlaPrefillKernel::Pipelined, cost0, s.kernel},
                  {MlaPrefillKernel::Overlapped, cost0, "  overlapped"},
                  {MlaPrefillKernel::Seesaw, cost0, "  seesaw"}};
    if (bf16_prefill) {
      variants = {{MlaPrefillKernel::Pipelined, cost0, s.kernel},
                  {MlaPrefillKernel::Overlapped, cost0, "  overlapped"},
                  {MlaPrefillKernel::Seesaw, cost0, "  seesaw"}};
      for (int c : {0, 2, 8})
        if (c != cost0)
          variants.push_back({MlaPrefillKernel::Pipelined, c, "  cost " + std::to_string(c)});
    }
    for (const Variant& v : variants) {
      const MlaPrefillKernel pk = v.kernel;
      const MlaPrefillKernel pk_was =
          ops::cuda::set_mla_prefill_kernel(bf16_decode ? MlaPrefillKernel::Pipelined : pk);
      const MlaPrefillKernel dk_was =
          ops::cuda::set_mla_sparse_decode_kernel(bf16_decode ? pk : MlaPrefillKernel::Seesaw);
      const int cost_was = ops::cuda::set_mla_prefill_token_cost(v.cost);
      const MlaFp8Kernel fp8_was = ops::cuda::set_mla_fp8_kernel(v.fp8);
      const int64_t cross0 = ops::cuda::mla_fp8_crossover_calls();
      DeviceBuffer out(DType::BF16, {in.n_tokens, kHeads, kLora});
      auto call = [&] { ops::mla_attention_absorbed(out, in.q, in.cache, in.dev, topk, kScale); };
      const int64_t calls0 = ops::cuda::mla_sm90_calls();
      const int64_t variant0 = ops::cuda::mla_prefill_variant_calls();
      const ops::cuda::Timing t =
          ops::cuda::time_events(call, o.warmup, o.iters, kKernelFlushBytes);
      OSPREY_CHECK(ops::cuda::mla_sm90_calls() > calls0, "the sm90 kernel did not take ", s.kernel);
      const bool variant = ops::cuda::mla_prefill_variant_calls() > variant0;
      // A BF16 sparse call with s_q = 2 is a prefill-variant call (several tokens a sequence).
      const bool bf16_multi = std::string_view(s.kernel) == "sparse decode" && !s.fp8 &&
                              s.s_q > 1 && pk != MlaPrefillKernel::Seesaw;
      OSPREY_CHECK(variant == (((bf16_prefill || bf16_decode) && pk != MlaPrefillKernel::Seesaw) ||
                               bf16_multi),
                   s.kernel, ": the prefill variant ", variant ? "took" : "did not take", " it");
      const bool cross = v.fp8 == MlaFp8Kernel::Crossover || v.fp8 == MlaFp8Kernel::Pipelined;
      OSPREY_CHECK((ops::cuda::mla_fp8_crossover_calls() > cross0) == cross, s.kernel,
                   ": the crossover ", cross ? "did not take" : "took", " it");
      call();
      cuda::synchronize();
      ops::cuda::set_mla_prefill_kernel(pk_was);
      ops::cuda::set_mla_sparse_decode_kernel(dk_was);
      ops::cuda::set_mla_prefill_token_cost(cost_was);
      ops::cuda::set_mla_fp8_kernel(fp8_was);
      const double err = rel_l2_bf16(cuda::to_host(out), want);
      const double sec = t.median_ms * 1e-3;
      const double tf = in.flops / sec / 1e12, gbs = in.bytes / sec / 1e9;
      char fm[32] = "-", core[32] = "-";
      if (s.flashmla_us > 0) std::snprintf(fm, sizeof fm, "%.1f", s.flashmla_us);
      if (core_us > 0) std::snprintf(core, sizeof core, "%.0f", core_us);
      const char* name = v.label.c_str();
      std::printf("%-15s %-5s %4d %4d %6d %10.1f %8.1f %5.1f%% %7.0f %5.1f%% %10s %9s %9.2e%s\n",
                  name, s.fp8 ? "FP8" : "BF16", s.n_seqs, s.s_q, s.ctx, t.median_ms * 1e3, tf,
                  100 * tf / bf16_tf, gbs, 100 * gbs / copy_gbs, fm, core, err,
                  err <= 1e-2 ? "" : "  CHECK FAILED");
      OSPREY_CHECK(err <= 1e-2, name, ": the sm90 output differs from the CUDA-core kernel's (",
                   err, ")");
      std::fflush(stdout);
    }
  }
  // The plan kernel's own cost: the same call with the fingerprint unknown (rebuilt every call).
  MlaInputs in = make_inputs(mla_shapes(true)[0], rng, o.seed);
  DeviceBuffer out(DType::BF16, {in.n_tokens, kHeads, kLora});
  AttentionMeta fresh = in.dev;
  fresh.fingerprint = 0;
  const double cached =
      ops::cuda::time_events(
          [&] { ops::mla_attention_absorbed(out, in.q, in.cache, in.dev, in.d_topk, kScale); },
          o.warmup, o.iters, kKernelFlushBytes)
          .median_ms;
  const double rebuilt =
      ops::cuda::time_events(
          [&] { ops::mla_attention_absorbed(out, in.q, in.cache, fresh, in.d_topk, kScale); },
          o.warmup, o.iters, kKernelFlushBytes)
          .median_ms;
  std::printf(
      "\nsparse decode FP8 B=64: %.1f us with the cached plan, %.1f us rebuilding it every call "
      "(the plan kernel: %.1f us, paid once per step)\n",
      cached * 1e3, rebuilt * 1e3, (rebuilt - cached) * 1e3);
  std::printf(
      "(median of %d calls after %d warm-up, L2 flushed before each; FLOPs = 2·h·Σ attended·"
      "(576 + 512), bytes = attended cache rows + q + out; core_us = the CUDA-core kernel; "
      "rel_err = sm90 vs the CUDA-core kernel; FlashMLA = its time on our H200, 2026-12-01, "
      "sparse prefill there on a BF16 kv; BF16 'sparse prefill' rows = the prefill variant (the "
      "default), '  overlapped' = the variant with WG0's next S queued behind its last P·V "
      "(OSPREY_MLA_PREFILL=overlapped), '  seesaw' = the same call on the seesaw decode kernel, "
      "OSPREY_MLA_PREFILL=seesaw; '  cost N' = the prefill variant with the split-KV plan "
      "charging N blocks a query token, default %d; BF16 'sparse decode' rows likewise: the "
      "prefill variant (the default), '  overlapped', '  seesaw' = OSPREY_MLA_SPARSE_DECODE; FP8 "
      "rows: the lockstep kernel, then '  crossover', '  pipelined' and '  f16' = "
      "OSPREY_MLA_FP8)\n",
      o.iters, o.warmup, int(ops::kMlaPrefillTokenCost));
}
}  // namespace

void run_kernel_benchmark(const KernelOptions& o) {
  if (cuda::device_count() == 0) fail("osprey bench kernels: no CUDA device");
  if (o.op != "mla" && o.op != "gemm" && o.op != "moe" && o.op != "indexer")
    fail("osprey bench kernels: --op ", o.op, " has no kernels (mla, gemm, moe or indexer)");
  const double copy_gbs = ops::cuda::copy_bandwidth_gbs(size_t(4) << 30);
  const double bf16_tf = ops::cuda::bf16_gemm_tflops(8192);
  std::printf(
      "ceilings: device copy %.0f GB/s (read + write, 4 GiB), BF16 GEMM 8192^3 %.0f TFLOP/s\n",
      copy_gbs, bf16_tf);
  if (o.op == "mla")
    run_mla(o, copy_gbs, bf16_tf);
  else if (o.op == "indexer")
    run_indexer_benchmark(o, copy_gbs);
  else
    run_gemm_benchmarks(o, copy_gbs);
}

#endif

}  // namespace osprey::bench
