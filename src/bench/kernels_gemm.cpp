// `osprey bench kernels --op gemm|moe`: the FP8 linear layers and the routed experts alone, on
// DeepSeek-V3.2's shapes (kernels_gemm.h). CUDA only.
#include "bench/kernels_gemm.h"

#ifdef OSPREY_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "config/v32_projections.h"
#include "core/device_buffer.h"
#include "core/error.h"
#include "ops/ceilings.h"
#include "ops/cuda/gemm/fp8_swapab.cuh"
#include "ops/gemm.h"
#include "ops/moe.h"
#include "ops/tensor_ops.h"

namespace osprey::bench {

namespace {
// An FP8 weight on the device: random e4m3 and scales (never zeros).
struct DevFp8 {
  DeviceBuffer w, s;
  LinearWeight lw() const { return {w, s}; }
};
DevFp8 make_fp8(int64_t out, int64_t in, uint64_t seed) {
  DevFp8 f{DeviceBuffer(DType::F8_E4M3, {out, in}),
           DeviceBuffer(DType::F32, {(out + 127) / 128, (in + 127) / 128})};
  ops::cuda::fill_uniform(f.w, seed, -1.0f, 1.0f);
  ops::cuda::fill_uniform(f.s, seed + 1, 0.5e-3f, 2e-3f);
  return f;
}

void run_gemm(const KernelOptions& o, double copy_gbs, double fp8_tf) {
  std::vector<int64_t> ms = {1, 16, 32, 64, 128, 256, 4096, 16384};
  if (o.quick) ms = {1, 64, 4096};
  if (!o.ms.empty()) ms = o.ms;
  std::printf("\n%-19s %6s %6s %6s %-10s %9s %7s %6s %8s %6s %8s %9s %7s %6s %8s %9s\n", "shape",
              "M", "N", "K", "path", "time_us", "GB/s", "%copy", "TFLOP/s", "%fp8", "var_us",
              "lt_us", "lt_GB/s", "%copy", "lt_TF/s", "rel_diff");
  uint64_t seed = o.seed * 1000;
  for (const Fp8Projection& pr : kV32Fp8Projections) {
    const DevFp8 w = make_fp8(pr.out, pr.in, seed += 10);
    for (int64_t m : ms) {
      if (o.quick && m > 64 && pr.out * pr.in < 7168 * 16384) continue;
      DeviceBuffer x(DType::BF16, {m, pr.in}), y(DType::BF16, {m, pr.out}),
          y_lt(DType::BF16, {m, pr.out});
      ops::cuda::fill_uniform(x, seed + 5, -2.0f, 2.0f);
      auto ours = [&] { ops::linear(y, x, w.lw()); };
      ours();
      const std::string path = ops::cuda::last_fp8_gemm_path();
      const ops::cuda::Timing t =
          ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes);
      // Variants: one k-block a stage (the default takes 4 up to 16 tokens, 2 past); past 32
      // tokens, where cuBLASLt runs, osprey's kernel with one tile of 64 tokens (two side by side
      // at 65..128).
      double g1_us = 0, wide_us = 0;
      if (path == "swapab-fp8") {
        const int was = ops::cuda::set_fp8_swapab_dense_groups(1);
        g1_us = ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes).median_ms * 1e3;
        ops::cuda::set_fp8_swapab_dense_groups(was);
      } else if (m <= ops::cuda::kSwapAbMaxTokens) {
        ops::cuda::set_fp8_swapab_max_tokens(ops::cuda::kSwapAbMaxTokens);
        wide_us =
            ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes).median_ms * 1e3;
        ops::cuda::set_fp8_swapab_max_tokens(32);
      }
      // cuBLASLt's block-scaled FP8 GEMM on the same call (osprey's kernel off).
      ops::cuda::set_fp8_swapab(false);
      auto lt = [&] { ops::linear(y_lt, x, w.lw()); };
      lt();
      const std::string lt_path = ops::cuda::last_fp8_gemm_path();
      const ops::cuda::Timing tl = ops::cuda::time_events(lt, o.warmup, o.iters, kKernelFlushBytes);
      ops::cuda::set_fp8_swapab(true);
      cuda::synchronize();
      const double diff = rel_l2_bf16(cuda::to_host(y), cuda::to_host(y_lt));
      // Both W8A8 (the same quantised x): they agree to the sums' order. Where cuBLASLt's
      // block-scaled mode is not used (out < 512: the dequantise + BF16 fallback, W8A16) the
      // activations' e4m3 rounding separates them (~3e-2).
      const double max_diff = lt_path == "cublasLt-fp8-blockscaled" ? 2e-2 : 0.1;
      const double bytes = double(pr.out) * double(pr.in) +
                           double((pr.out + 127) / 128 * (pr.in / 128)) * 4 +
                           double(m) * double(pr.in + pr.out) * 2;
      const double flops = 2.0 * double(m) * double(pr.out) * double(pr.in);
      const double s = t.median_ms * 1e-3, sl = tl.median_ms * 1e-3;
      std::printf(
          "%-19s %6lld %6lld %6lld %-10s %9.1f %7.0f %5.1f%% %8.1f %5.1f%% %8.1f %9.1f %7.0f "
          "%5.1f%% %8.1f %9.2e%s%s\n",
          pr.what, static_cast<long long>(m), static_cast<long long>(pr.out),
          static_cast<long long>(pr.in), path == "swapab-fp8" ? "swapab" : "cublasLt",
          t.median_ms * 1e3, bytes / s / 1e9, 100 * bytes / s / 1e9 / copy_gbs, flops / s / 1e12,
          100 * flops / s / 1e12 / fp8_tf, path == "swapab-fp8" ? g1_us : wide_us,
          tl.median_ms * 1e3, bytes / sl / 1e9, 100 * bytes / sl / 1e9 / copy_gbs,
          flops / sl / 1e12, diff,
          lt_path == "cublasLt-fp8-blockscaled" ? "" : (" (lt path: " + lt_path + ")").c_str(),
          diff <= max_diff ? "" : "  CHECK FAILED");
      OSPREY_CHECK(diff <= max_diff, pr.what, " M ", m,
                   ": osprey's output differs from cuBLASLt's (", diff, ")");
      std::fflush(stdout);
    }
  }
  std::printf(
      "(median of %d calls after %d warm-up, L2 flushed before each; x, y BF16 [M, K], [M, N]; "
      "bytes = W (e4m3) + its scales + x + y; path = what osprey runs for the shape; lt = "
      "cuBLASLt's block-scaled FP8 GEMM (activation quantisation included in both); rel_diff = "
      "osprey vs cuBLASLt; var_us = a variant of osprey's kernel: on its rows, one k-block a "
      "pipeline stage instead of 4 (<= 16 tokens) or 2; on cuBLASLt's rows up to 128 tokens, "
      "osprey's kernel with "
      "token tiles of 64)\n",
      o.iters, o.warmup);
}

// The FP8 linears of one input at decode (ops::linears: one swap-AB launch for all): the mainline
// (whatever path the call takes: cuBLASLt past OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS), and the grouped
// swap-AB launch at every M up to 64 with its variants: weight tiles by TMA
// (OSPREY_FP8_DENSE_TMA), 4 k-blocks a stage (OSPREY_FP8_DENSE_KGROUPS; 16-token tiles), both,
// the persistent grid, and a launch each. V3.2's groups, and its single decode linears (o_proj,
// the dense and shared down).
void run_gemm_groups(const KernelOptions& o, double copy_gbs) {
  const bool def_tma = ops::cuda::fp8_swapab_dense_tma();
  const int def_groups = ops::cuda::fp8_swapab_dense_groups();
  struct Group {
    const char* what;
    int64_t in;
    std::vector<int64_t> outs;
  };
  const Group groups[] = {{"q_a+kv_a+wk", 7168, {1536, 576, 128}},
                          {"q_b+wq_b", 1536, {24576, 8192}},
                          {"gate+up dense", 7168, {18432, 18432}},
                          {"gate+up shared", 7168, {2048, 2048}},
                          {"o_proj", 16384, {7168}},
                          {"down dense", 18432, {7168}},
                          {"down shared", 2048, {7168}}};
  std::vector<int64_t> ms = {1, 16, 32};
  if (!o.ms.empty()) {
    ms.clear();
    for (int64_t m : o.ms)
      if (m <= 64) ms.push_back(m);
  }
  std::printf("\n%-15s %4s %6s %9s %7s %6s %9s %9s %9s %9s %9s %9s %9s %10s %s\n",
              "linears of one x", "M", "K", "main_us", "GB/s", "%copy", "sab_us", "tma_us", "g4_us",
              "g4tma_us", "auto_us", "pers_us", "each_us", "rel_diff", "main path");
  uint64_t seed = o.seed * 3000;
  for (const Group& g : groups) {
    std::vector<DevFp8> ws;
    std::vector<LinearWeight> lw;
    for (int64_t out : g.outs) ws.push_back(make_fp8(out, g.in, seed += 10));
    for (const DevFp8& w : ws) lw.push_back(w.lw());
    for (int64_t m : ms) {
      DeviceBuffer x(DType::BF16, {m, g.in});
      ops::cuda::fill_uniform(x, seed + 5, -2.0f, 2.0f);
      std::vector<DeviceBuffer> ys;
      std::vector<LinearOut> outs;
      double bytes = 0;
      for (size_t i = 0; i < ws.size(); ++i) {
        ys.emplace_back(DType::F32, Shape{m, g.outs[i]});
        bytes += double(g.outs[i]) * double(g.in) +
                 double((g.outs[i] + 127) / 128 * (g.in / 128)) * 4 + double(m) * g.outs[i] * 4;
      }
      bytes += double(m) * double(g.in) * 2;
      for (size_t i = 0; i < ws.size(); ++i) outs.push_back({ys[i], &lw[i]});
      auto run = [&] { ops::cuda::linears(x, std::span<const LinearOut>(outs)); };
      auto outputs = [&] {
        run();
        cuda::synchronize();
        std::vector<Buffer> got;
        for (const DeviceBuffer& y : ys) got.push_back(cuda::to_host(y));
        return got;
      };
      using ops::cuda::DenseGrid;
      // One variant: the settings applied, the call timed (and its outputs read), then restored.
      struct Variant {
        bool swapab_forced;  // the grouped limit raised to 64 (the swap-AB launch at every M)
        bool tma;
        int kgroups;
        DenseGrid grid;
        bool group;
      };
      auto with = [&](const Variant& v, std::vector<Buffer>* got, std::string* path) {
        const int64_t was_max = ops::cuda::fp8_swapab_group_max_tokens();
        const int64_t was_single = ops::cuda::fp8_swapab_max_tokens();
        if (v.swapab_forced) {  // (a single linear takes the single limit)
          ops::cuda::set_fp8_swapab_group_max_tokens(64);
          ops::cuda::set_fp8_swapab_max_tokens(std::max<int64_t>(was_single, m));
        }
        const bool was_tma = ops::cuda::set_fp8_swapab_dense_tma(v.tma);
        const int was_kg = ops::cuda::set_fp8_swapab_dense_groups(v.kgroups);
        const DenseGrid was_grid = ops::cuda::set_fp8_swapab_dense_grid(v.grid);
        const bool was_group = ops::cuda::set_fp8_swapab_dense_group(v.group);
        run();
        if (path) *path = ops::cuda::last_fp8_gemm_path();
        const double us =
            ops::cuda::time_events(run, o.warmup, o.iters, kKernelFlushBytes).median_ms * 1e3;
        if (got) *got = outputs();
        ops::cuda::set_fp8_swapab_max_tokens(was_single);
        ops::cuda::set_fp8_swapab_group_max_tokens(was_max);
        ops::cuda::set_fp8_swapab_dense_tma(was_tma);
        ops::cuda::set_fp8_swapab_dense_groups(was_kg);
        ops::cuda::set_fp8_swapab_dense_grid(was_grid);
        ops::cuda::set_fp8_swapab_dense_group(was_group);
        return us;
      };
      std::vector<Buffer> main_y, sab_y, tma_y, g4_y, g4tma_y, auto_y;
      std::string path, sab_path;
      // The mainline: every setting at its default (as the environment set it).
      const double t = with({false, def_tma, def_groups, DenseGrid::kWaves, true}, &main_y, &path);
      const double t_sab = with({true, false, 2, DenseGrid::kWaves, true}, &sab_y, &sab_path);
      const double t_tma = with({true, true, 2, DenseGrid::kWaves, true}, &tma_y, nullptr);
      double t_g4 = 0, t_g4tma = 0, t_auto = 0;
      if (m <= 16) {
        t_g4 = with({true, false, 4, DenseGrid::kWaves, true}, &g4_y, nullptr);
        t_g4tma = with({true, true, 4, DenseGrid::kWaves, true}, &g4tma_y, nullptr);
        t_auto = with({true, true, ops::cuda::kDenseGroupsAuto, DenseGrid::kWaves, true}, &auto_y,
                      nullptr);
      }
      const double t_pers = with({true, false, 2, DenseGrid::kPersistent, true}, nullptr, nullptr);
      const double t_each = with({false, false, 2, DenseGrid::kWaves, false}, nullptr, nullptr);
      OSPREY_CHECK(sab_path == "swapab-fp8", g.what, " M ", m, ": the forced swap-AB launch ran ",
                   sab_path);
      // TMA moves the same bytes: the same results, bit for bit. Other variants: the split-K sums
      // in another order (1e-5), or cuBLASLt against swap-AB (both W8A8: 2e-2, as run_gemm's rows).
      double diff = 0;
      for (size_t i = 0; i < ws.size(); ++i) {
        const size_t bytes_y = size_t(sab_y[i].numel()) * 4;
        OSPREY_CHECK(std::memcmp(sab_y[i].f32(), tma_y[i].f32(), bytes_y) == 0, g.what, " M ", m,
                     ": the TMA weight tiles changed the output");
        if (m <= 16)
          OSPREY_CHECK(std::memcmp(g4_y[i].f32(), g4tma_y[i].f32(), bytes_y) == 0, g.what, " M ", m,
                       ": the TMA weight tiles changed the 4-group output");
        auto rel = [&](const Buffer& a, const Buffer& b) {
          double num = 0, den = 0;
          for (int64_t k = 0; k < a.numel(); ++k) {
            const double d = double(a.f32()[k]) - double(b.f32()[k]);
            num += d * d;
            den += double(b.f32()[k]) * double(b.f32()[k]);
          }
          return std::sqrt(num / std::max(den, 1e-30));
        };
        const double dm = rel(main_y[i], sab_y[i]);
        // (cuBLASLt's rows: W8A8 block-scaled, 2e-2, or outside that class the dequantize
        // fallback, W8A16: ~3e-2, as run_gemm's rows)
        OSPREY_CHECK(dm <= (path == sab_path ? 1e-5 : 0.1), g.what, " M ", m,
                     ": the mainline differs from the grouped swap-AB launch (", dm, ")");
        diff = std::max(diff, dm);
        if (m <= 16) {
          const double d4 = rel(g4_y[i], sab_y[i]);
          OSPREY_CHECK(d4 <= 1e-5, g.what, " M ", m, ": 4 k-blocks a stage differ (", d4, ")");
          const double da = rel(auto_y[i], sab_y[i]);
          OSPREY_CHECK(da <= 1e-5, g.what, " M ", m, ": the stage depth by shape differs (", da,
                       ")");
          diff = std::max(diff, std::max(d4, da));
        }
      }
      const double gbs = bytes / (t * 1e-6) / 1e9;
      std::printf(
          "%-15s %4lld %6lld %9.1f %7.0f %5.1f%% %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.2e "
          "%s\n",
          g.what, static_cast<long long>(m), static_cast<long long>(g.in), t, gbs,
          100 * gbs / copy_gbs, t_sab, t_tma, t_g4, t_g4tma, t_auto, t_pers, t_each, diff,
          path.c_str());
      std::fflush(stdout);
    }
  }
  std::printf(
      "(median of %d after %d warm-up, L2 flushed before each; x BF16 quantised once (included), y "
      "F32; bytes = the weights (e4m3) + scales + x + y; main_us = the mainline call (GB/s and "
      "%%copy are its: default settings), whose path is the last column (past "
      "OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS, default 32, a cuBLASLt GEMM each); the grouped swap-AB "
      "launch at every M: sab_us (cp.async "
      "weight tiles, 2 k-blocks a stage, one block an item), tma_us (weight tiles by TMA), g4_us / "
      "g4tma_us (4 k-blocks a stage, M <= 16; 0 elsewhere), auto_us (TMA, the stage depth by the "
      "launch's shape: OSPREY_FP8_DENSE_KGROUPS=auto; M <= 16), pers_us (the persistent grid); "
      "each_us = the mainline with a launch a linear; rel_diff = the largest of mainline vs sab "
      "and g4 and "
      "auto vs sab (TMA checked equal bit for bit))\n",
      o.iters, o.warmup);
}

void run_moe(const KernelOptions& o, double copy_gbs, double fp8_tf) {
  const int64_t E = 256, D = 7168, I = 2048, K = 8;
  const RouterParams router{256, 8, 8, 4, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.5f};
  std::vector<DevFp8> owned;
  owned.reserve(size_t(3 * E));
  std::vector<MlpWeights> experts;
  uint64_t seed = o.seed * 7777;
  for (int64_t e = 0; e < E; ++e) {
    owned.push_back(make_fp8(I, D, seed += 10));
    owned.push_back(make_fp8(I, D, seed += 10));
    owned.push_back(make_fp8(D, I, seed += 10));
    const size_t b = owned.size() - 3;
    experts.push_back({owned[b].lw(), owned[b + 1].lw(), owned[b + 2].lw()});
  }
  // Past 128 tokens (prefill chunks: 2048 is the default chunk) the time_us column is the
  // swap-AB kernel with 64-row tiles (ops/gemm.h set_fp8_moe_prefill_swapab, the mainline),
  // wmma_us the WMMA grouped GEMM it replaced (OSPREY_MOE_PREFILL=wmma).
  std::vector<int64_t> ns = {1, 16, 64, 128, 512, 2048, 5000};
  if (o.quick) ns = {64, 2048};
  if (!o.ms.empty()) ns = o.ms;
  for (int64_t n : ns)
    OSPREY_CHECK(n >= 1 && n <= (int64_t(1) << 20),
                 "bench kernels --op moe: --m takes token counts in 1..2^20, not ", n);
  std::printf("\n%-26s %6s %7s %10s %7s %6s %8s %6s %10s %10s %10s %9s %9s %11s %8s %6s %9s\n",
              "moe layer (256 x [2048x7168])", "tokens", "experts", "time_us", "GB/s", "%copy",
              "TFLOP/s", "%fp8", "cpasync_us", "item_us", "strided_us", "down1_us", "split_us",
              "wmma_us", "GB/s", "%copy", "rel_diff");
  // Two routings: V3.2's router on random logits (which concentrates the tokens on fewer experts
  // than a trained router: 88 distinct for 64 tokens), and uniform (8 distinct experts a token
  // drawn uniformly: the ~222 of the B = 64 target).
  std::mt19937_64 rng(o.seed);
  std::vector<std::pair<int64_t, bool>> cases;
  for (int64_t n : ns) cases.push_back({n, false});
  for (int64_t n : ns)
    if (n <= 128) cases.push_back({n, true});
  for (auto [n, uniform] : cases) {
    DeviceBuffer logits(DType::F32, {n, E}), bias(DType::F32, {E}), x(DType::BF16, {n, D});
    ops::cuda::fill_uniform(logits, seed + 1, -4.0f, 4.0f);
    ops::cuda::fill_uniform(bias, seed + 2, -0.1f, 0.1f);
    ops::cuda::fill_uniform(x, seed + 3, -2.0f, 2.0f);
    DeviceBuffer ids(DType::I32, {n, K}), wts(DType::F32, {n, K});
    ops::moe_route(ids, wts, logits, bias, router);
    if (uniform) {
      Buffer u(DType::I32, {n, K});
      std::vector<int32_t> all(static_cast<size_t>(E));
      for (int32_t e = 0; e < int32_t(E); ++e) all[size_t(e)] = e;
      for (int64_t t = 0; t < n; ++t) {
        std::shuffle(all.begin(), all.end(), rng);
        std::copy(all.begin(), all.begin() + K, u.ptr<int32_t>() + t * K);
      }
      ids = cuda::to_device(u);
    }
    DeviceBuffer out(DType::BF16, {n, D}), out_w(DType::BF16, {n, D});
    cuda::synchronize();
    Buffer h_ids = cuda::to_host(ids);
    std::set<int32_t> touched(h_ids.ptr<int32_t>(), h_ids.ptr<int32_t>() + n * K);
    const double wbytes = double(touched.size()) * 3.0 * double(I) * double(D);
    const double bytes = wbytes + double(n) * double(D) * 4;
    const double flops = 2.0 * double(n * K) * 3.0 * double(I) * double(D);
    const bool prefill_variant = ops::cuda::fp8_moe_prefill_swapab();
    ops::cuda::set_fp8_moe_prefill_swapab(true);
    auto ours = [&] { ops::moe_experts(out, x, ids, wts, experts); };
    const ops::cuda::Timing t = ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes);
    // The same kernels with the weight tiles by the producer's cp.async copies instead of TMA.
    const bool tma_was = ops::cuda::set_fp8_moe_weight_tma(false);
    const ops::cuda::Timing tc = ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes);
    ops::cuda::set_fp8_moe_weight_tma(tma_was);
    // The same kernels on a grid of one block a work item, and persistent with static strides,
    // instead of the persistent grid claiming items.
    const ops::cuda::MoeGrid grid_was = ops::cuda::set_fp8_moe_grid(ops::cuda::MoeGrid::kItems);
    const ops::cuda::Timing tg = ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes);
    ops::cuda::set_fp8_moe_grid(ops::cuda::MoeGrid::kStrided);
    const ops::cuda::Timing ts = ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes);
    ops::cuda::set_fp8_moe_grid(grid_was);
    // Prefill: the down projection with one K group a stage (8 stages) instead of two (4).
    const int down_was = ops::cuda::set_fp8_moe_down_groups(1);
    const ops::cuda::Timing td =
        n > 128 ? ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes) : t;
    ops::cuda::set_fp8_moe_down_groups(down_was);
    // Prefill: gate/up with gate and up as two wgmma groups (gate promoted while up's run).
    const bool split_was = ops::cuda::set_fp8_moe_split_waits(true);
    const ops::cuda::Timing tp =
        n > 128 ? ops::cuda::time_events(ours, o.warmup, o.iters, kKernelFlushBytes) : t;
    ops::cuda::set_fp8_moe_split_waits(split_was);
    ops::cuda::set_fp8_moe_prefill_swapab(prefill_variant);
    ops::cuda::set_fp8_swapab(false);
    auto wmma = [&] { ops::moe_experts(out_w, x, ids, wts, experts); };
    const ops::cuda::Timing tw = ops::cuda::time_events(wmma, o.warmup, o.iters, kKernelFlushBytes);
    ops::cuda::set_fp8_swapab(true);
    cuda::synchronize();
    const double diff = rel_l2_bf16(cuda::to_host(out), cuda::to_host(out_w));
    const double s = t.median_ms * 1e-3, sw = tw.median_ms * 1e-3;
    std::printf(
        "%-26s %6lld %7zu %10.1f %7.0f %5.1f%% %8.1f %5.1f%% %10.1f %10.1f %10.1f %9.1f %9.1f "
        "%11.1f %8.0f %5.1f%% %9.2e%s\n",
        n > 128   ? "prefill: 64-row swap-AB"
        : uniform ? "decode, uniform routing"
                  : "decode, V3.2 router",
        static_cast<long long>(n), touched.size(), t.median_ms * 1e3, bytes / s / 1e9,
        100 * bytes / s / 1e9 / copy_gbs, flops / s / 1e12, 100 * flops / s / 1e12 / fp8_tf,
        tc.median_ms * 1e3, tg.median_ms * 1e3, ts.median_ms * 1e3, td.median_ms * 1e3,
        tp.median_ms * 1e3, tw.median_ms * 1e3, bytes / sw / 1e9, 100 * bytes / sw / 1e9 / copy_gbs,
        diff, diff <= 0.1 ? "" : "  CHECK FAILED");
    OSPREY_CHECK(diff <= 0.1, "moe n ", n, ": the two paths disagree (", diff, ")");
    std::fflush(stdout);
  }
  std::printf(
      "(V3.2's routed experts: 256 × gate/up/down e4m3 with 128×128 scales, top-8 of 8 groups by "
      "its router on random logits; bytes = the touched experts' weights + x + out; wmma = the "
      "WMMA grouped GEMMs, weights dequantised to BF16 in the kernel (OSPREY_MOE_PREFILL=wmma); "
      "prefill rows' time_us = the swap-AB kernel with 64-row tiles (the mainline past 128 "
      "tokens), weight tiles by TMA; cpasync_us = the same kernels with the weight tiles by "
      "cp.async copies (OSPREY_MOE_WEIGHT_TMA=0); item_us = the same kernels on a grid of one "
      "block a work item (OSPREY_MOE_GRID=items), strided_us on the persistent grid with static "
      "strides (OSPREY_MOE_GRID=strided), time_us claiming items (the default); down1_us "
      "(prefill rows; = time_us at decode) the down projection with one K group a pipeline "
      "stage instead of two, split_us (likewise) gate/up with gate and up as two wgmma groups, "
      "gate promoted while up's run; rel_diff = the "
      "two paths' outputs (W8A8 vs "
      "W8A16 arithmetic); median of %d after %d warm-up, L2 flushed)\n",
      o.iters, o.warmup);
}
}  // namespace

void run_gemm_benchmarks(const KernelOptions& o, double copy_gbs) {
  const double fp8_tf = ops::cuda::fp8_gemm_tflops(8192);
  std::printf("ceiling: FP8 GEMM 8192^3 (cuBLASLt, per-tensor scales) %.0f TFLOP/s\n", fp8_tf);
  if (o.op == "gemm") {
    run_gemm(o, copy_gbs, fp8_tf);
    run_gemm_groups(o, copy_gbs);
  }
  if (o.op == "moe") run_moe(o, copy_gbs, fp8_tf);
}

}  // namespace osprey::bench
#endif
