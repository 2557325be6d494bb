// CPU-only unit tests of op contracts that the twin tests take for granted: the indexer's tie rule
// and padding, the router's group restriction, the grouped experts' routing permutation and tile
// schedule, and the two rope layouts being one rotation.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "ops/activation.h"
#include "ops/gemm.h"
#include "ops/indexer.h"
#include "ops/mla_plan.h"
#include "ops/moe.h"
#include "ops/moe_schedule.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/tensor_ops.h"

namespace osprey {
namespace {

TEST(OpsCpu, IndexerTopkTiesTakeLowerPositionsAndPad) {
  // 1 sequence, 6 context positions, token at position 5; all keys equal → all scores equal.
  const int64_t ID = 4, IH = 2, topk = 8;
  Buffer cache(DType::F32, {1, 64, ID});
  for (int64_t i = 0; i < 64 * ID; ++i) cache.f32()[i] = 1.0f;
  Buffer q(DType::F32, {1, IH, ID}), w(DType::F32, {1, IH});
  for (int64_t i = 0; i < IH * ID; ++i) q.f32()[i] = 0.5f;
  w.f32()[0] = w.f32()[1] = 1.0f;
  Buffer qsl(DType::I32, {2}), seq_lens(DType::I32, {1}), pos(DType::I32, {1}),
      bt(DType::I32, {1, 1}), slots(DType::I64, {1});
  qsl.ptr<int32_t>()[0] = 0;
  qsl.ptr<int32_t>()[1] = 1;
  seq_lens.ptr<int32_t>()[0] = 6;
  pos.ptr<int32_t>()[0] = 5;
  bt.ptr<int32_t>()[0] = 0;
  slots.ptr<int64_t>()[0] = 5;
  AttentionMeta m{1, 1, 64, qsl, seq_lens, pos, bt, slots, {}};
  Buffer out(DType::I32, {1, topk});
  ops::indexer_topk(out, q, w, cache, m, 1.0f);
  const std::vector<int32_t> want = {0, 1, 2, 3, 4, 5, -1, -1};
  EXPECT_EQ(std::vector<int32_t>(out.ptr<int32_t>(), out.ptr<int32_t>() + topk), want);
  // top-3 of 6 equal scores: the three lowest positions.
  Buffer out3(DType::I32, {1, 3});
  ops::indexer_topk(out3, q, w, cache, m, 1.0f);
  EXPECT_EQ(std::vector<int32_t>(out3.ptr<int32_t>(), out3.ptr<int32_t>() + 3),
            (std::vector<int32_t>{0, 1, 2}));
}

// indexer_quantize_q (ops/indexer.h): per (t, h) the power-of-two scale of the cache keys' rule,
// e4m3 values within their rounding, the scale folded into the weights; then indexer_topk with U8
// q equals indexer_topk with the dequantized values as F32 q and the folded weights.
TEST(OpsCpu, IndexerQuantizeQFoldsScalesAndTopkReadsE4m3) {
  const int64_t n = 3, IH = 4, ID = 128, BS = 64, L = 200, topk = 16;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Buffer q(DType::F32, {n, IH, ID}), w(DType::F32, {n, IH});
  for (int64_t r = 0; r < n * IH; ++r)
    for (int64_t d = 0; d < ID; ++d)
      q.f32()[r * ID + d] = r == 1 ? 0.0f : u(rng) * std::ldexp(1.0f, int(r % 5) * 3 - 6);
  for (int64_t i = 0; i < n * IH; ++i) w.f32()[i] = 0.5f * u(rng);
  Buffer q8(DType::U8, {n, IH, ID}), w8(DType::F32, {n, IH});
  ops::indexer_quantize_q(q8, w8, q, w);
  Buffer qd(DType::F32, {n, IH, ID});  // dequantized values (no scale)
  for (int64_t r = 0; r < n * IH; ++r) {
    float amax = 0.0f;
    for (int64_t d = 0; d < ID; ++d) amax = std::max(amax, std::fabs(q.f32()[r * ID + d]));
    const float s = w8.f32()[r] / w.f32()[r];
    EXPECT_EQ(s, ops::indexer_fp8_scale(amax)) << "row " << r;
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "row " << r << ": not a power of two";
    EXPECT_GE(s * 448.0f, std::max(amax, 1e-4f));
    for (int64_t d = 0; d < ID; ++d) {
      const float v = e4m3_to_f32(q8.ptr<uint8_t>()[r * ID + d]);
      qd.f32()[r * ID + d] = v;
      const float x = q.f32()[r * ID + d];
      ASSERT_LE(std::fabs(v * s - x), std::max(std::fabs(x) / 16.0f, s * std::ldexp(1.0f, -10)))
          << "row " << r << " value " << d;
    }
  }
  // One sequence of L cached tokens, the last n new.
  const int64_t n_blocks = (L + BS - 1) / BS;
  Buffer qsl(DType::I32, {2}), seq_lens(DType::I32, {1}), pos(DType::I32, {n}),
      bt(DType::I32, {1, n_blocks}), slots(DType::I64, {L});
  qsl.ptr<int32_t>()[0] = 0;
  qsl.ptr<int32_t>()[1] = int32_t(n);
  seq_lens.ptr<int32_t>()[0] = int32_t(L);
  for (int64_t b = 0; b < n_blocks; ++b) bt.ptr<int32_t>()[b] = int32_t(b);
  for (int64_t t = 0; t < n; ++t) pos.ptr<int32_t>()[t] = int32_t(L - n + t);
  for (int64_t j = 0; j < L; ++j) slots.ptr<int64_t>()[j] = j;
  Buffer k(DType::F32, {L, ID});
  for (int64_t i = 0; i < L * ID; ++i) k.f32()[i] = u(rng);
  Buffer cache = Buffer::zeros(DType::U8, {n_blocks, BS * (ID + 4)});
  ops::indexer_cache_write(cache, k, AttentionMeta{1, int(L), int(BS), {}, {}, {}, {}, slots, {}});
  AttentionMeta m{1, int(n), int(BS), qsl, seq_lens, pos, bt, {}, {}};
  const float scale = 1.0f / std::sqrt(float(ID));
  Buffer r8(DType::I32, {n, topk}), rd(DType::I32, {n, topk});
  ops::indexer_topk(r8, q8, w8, cache, m, scale);
  ops::indexer_topk(rd, qd, w8, cache, m, scale);
  EXPECT_EQ(std::vector<int32_t>(r8.ptr<int32_t>(), r8.ptr<int32_t>() + n * topk),
            std::vector<int32_t>(rd.ptr<int32_t>(), rd.ptr<int32_t>() + n * topk));
  EXPECT_GE(r8.ptr<int32_t>()[topk - 1], 0);  // a full row of positions, not padding
}

// The FP8 indexer cache (ops/indexer.h): layout (values then scales per block), the ue8m0 scale
// rule and the round-trip error; bytes of other tokens are left alone.
TEST(OpsCpu, IndexerFp8CacheLayoutAndRoundTrip) {
  const int64_t ID = 128, BS = 64, TB = ID + 4, n_blocks = 3;
  Buffer cache(DType::U8, {n_blocks, BS * TB});
  std::memset(cache.ptr<uint8_t>(), 0xAA, size_t(n_blocks * BS * TB));
  const std::vector<int64_t> slot = {5, 64 + 7, 127, 128, 191};
  const int64_t n = int64_t(slot.size());
  Buffer k(DType::F32, {n, ID});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float mag[5] = {1.0f, 37.5f, 0.0f, 3e-6f, 1000.0f};  // token 2: zeros (amax floor)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < ID; ++c) k.f32()[t * ID + c] = mag[t] * u(rng);
  k.f32()[4 * ID + 3] = -1000.0f;  // an exact amax
  Buffer slots(DType::I64, {n}), empty(DType::I32, {1});
  for (int64_t t = 0; t < n; ++t) slots.ptr<int64_t>()[t] = slot[size_t(t)];
  AttentionMeta m{1, int(n), int(BS), empty, empty, empty, empty, slots, {}};
  ops::indexer_cache_write(cache, k, m);
  std::vector<bool> written(size_t(n_blocks * BS * TB), false);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t b = slot[size_t(t)] / BS, o = slot[size_t(t)] % BS;
    const int64_t vals = b * BS * TB + o * ID, sc = b * BS * TB + BS * ID + 4 * o;
    float s;
    std::memcpy(&s, cache.ptr<uint8_t>() + sc, 4);
    float amax = 0.0f;
    for (int64_t c = 0; c < ID; ++c) amax = std::max(amax, std::fabs(k.f32()[t * ID + c]));
    // s = amax/448 (amax ≥ 1e-4) rounded up to a power of two.
    int e;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "token " << t << ": scale " << s << " not a power of 2";
    const float s0 = std::max(amax, 1e-4f) / 448.0f;
    EXPECT_GE(s, s0);
    EXPECT_LT(s, 2.0f * s0);
    EXPECT_EQ(s, ops::indexer_fp8_scale(amax));
    for (int64_t c = 0; c < ID; ++c) {
      const float x = k.f32()[t * ID + c];
      const uint8_t v = cache.ptr<uint8_t>()[vals + c];
      EXPECT_EQ(v, f32_to_e4m3(x / s)) << "token " << t << " c " << c;
      // e4m3: relative error ≤ 2^-4 in the normal range, absolute ≤ 2^-10 (× s) below it.
      const float err = std::fabs(e4m3_to_f32(v) * s - x);
      EXPECT_LE(err, std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f)) << "token " << t << " c " << c;
      written[size_t(vals + c)] = true;
    }
    for (int i = 0; i < 4; ++i) written[size_t(sc + i)] = true;
  }
  for (size_t i = 0; i < written.size(); ++i)
    if (!written[i]) {
      ASSERT_EQ(cache.ptr<uint8_t>()[i], 0xAA) << "byte " << i << " overwritten";
    }
}

// CPU FP8 top-k against CPU F32 top-k on random data: the sets agree except for positions whose
// exact F32 score lies within 2·δ of the F32 k-th score, δ = max_j Σ_h |w_h|·scale·|q_h·(k_j −
// k̂_j)| (the largest score change quantization can make; relu is 1-Lipschitz).
TEST(OpsCpu, IndexerFp8TopkMatchesF32UpToQuantization) {
  const int64_t IH = 8, ID = 128, BS = 64, L = 400, topk = 64;
  const int64_t n_blocks = (L + BS - 1) / BS + 1;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Buffer k(DType::F32, {L, ID}), q(DType::F32, {L, IH, ID}), w(DType::F32, {L, IH});
  for (int64_t i = 0; i < L * ID; ++i) k.f32()[i] = u(rng) * (1.0f + float(i / ID % 5));
  for (int64_t i = 0; i < L * IH * ID; ++i) q.f32()[i] = u(rng);
  for (int64_t i = 0; i < L * IH; ++i) w.f32()[i] = 0.25f * u(rng);
  // One sequence of L tokens (a prefill), blocks in reverse order.
  Buffer qsl(DType::I32, {2}), seq_lens(DType::I32, {1}), pos(DType::I32, {L}),
      bt(DType::I32, {1, n_blocks}), slots(DType::I64, {L});
  qsl.ptr<int32_t>()[0] = 0;
  qsl.ptr<int32_t>()[1] = int32_t(L);
  seq_lens.ptr<int32_t>()[0] = int32_t(L);
  for (int64_t b = 0; b < n_blocks; ++b) bt.ptr<int32_t>()[b] = int32_t(n_blocks - 1 - b);
  for (int64_t t = 0; t < L; ++t) {
    pos.ptr<int32_t>()[t] = int32_t(t);
    slots.ptr<int64_t>()[t] = int64_t(bt.ptr<int32_t>()[t / BS]) * BS + t % BS;
  }
  AttentionMeta m{1, int(L), int(BS), qsl, seq_lens, pos, bt, slots, {}};
  Buffer c32 = Buffer::zeros(DType::F32, {n_blocks, BS, ID});
  Buffer c8 = Buffer::zeros(DType::U8, {n_blocks, BS * (ID + 4)});
  ops::indexer_cache_write(c32, k, m);
  ops::indexer_cache_write(c8, k, m);
  const float scale = 1.0f / std::sqrt(float(ID));
  Buffer r32(DType::I32, {L, topk}), r8(DType::I32, {L, topk});
  ops::indexer_topk(r32, q, w, c32, m, scale);
  ops::indexer_topk(r8, q, w, c8, m, scale);
  // Dequantized keys k̂ (by position).
  std::vector<float> kh(size_t(L * ID));
  for (int64_t j = 0; j < L; ++j) {
    const int64_t sl = slots.ptr<int64_t>()[j], b = sl / BS, o = sl % BS;
    const uint8_t* blk = c8.ptr<uint8_t>() + b * BS * (ID + 4);
    float s;
    std::memcpy(&s, blk + BS * ID + 4 * o, 4);
    for (int64_t d = 0; d < ID; ++d) kh[size_t(j * ID + d)] = e4m3_to_f32(blk[o * ID + d]) * s;
  }
  int64_t mismatched = 0, tokens_differing = 0;
  double worst = 0.0;  // max |I_j − kth| / (2δ) over swapped positions
  for (int64_t t = 0; t < L; ++t) {
    const int64_t n_sel = std::min<int64_t>(topk, t + 1);
    const int32_t* a = r32.ptr<int32_t>() + t * topk;
    const int32_t* g = r8.ptr<int32_t>() + t * topk;
    for (int64_t i = n_sel; i < topk; ++i) ASSERT_EQ(g[i], -1);
    std::set<int32_t> as(a, a + n_sel), gs(g, g + n_sel);
    if (as == gs) continue;
    ++tokens_differing;
    auto exact = [&](int64_t j) {
      double acc = 0.0;
      for (int64_t h = 0; h < IH; ++h) {
        double dot = 0.0;
        for (int64_t d = 0; d < ID; ++d)
          dot += double(q.f32()[(t * IH + h) * ID + d]) * k.f32()[j * ID + d];
        acc += w.f32()[t * IH + h] * std::max(dot * scale, 0.0);
      }
      return acc;
    };
    double delta = 0.0;
    for (int64_t j = 0; j <= t; ++j) {
      double dj = 0.0;
      for (int64_t h = 0; h < IH; ++h) {
        double dot = 0.0;
        for (int64_t d = 0; d < ID; ++d)
          dot += double(q.f32()[(t * IH + h) * ID + d]) *
                 (double(k.f32()[j * ID + d]) - kh[size_t(j * ID + d)]);
        dj += std::fabs(w.f32()[t * IH + h]) * scale * std::fabs(dot);
      }
      delta = std::max(delta, dj);
    }
    double kth = INFINITY, smax = 0.0;
    for (int32_t j : as) {
      const double v = exact(j);
      kth = std::min(kth, v);
      smax = std::max(smax, std::fabs(v));
    }
    for (const auto& [x, y] : {std::pair{&gs, &as}, std::pair{&as, &gs}})
      for (int32_t j : *x)
        if (!y->count(j)) {
          ++mismatched;
          const double v = exact(j);
          worst = std::max(worst, std::fabs(v - kth) / (2.0 * delta));
          EXPECT_NEAR(v, kth, 2.0 * delta + 1e-5 * smax)
              << "token " << t << " position " << j << " differs beyond the quantization bound";
        }
  }
  std::printf(
      "FP8 vs F32 indexer top-%lld (L=%lld): %lld tokens differ, %lld positions swapped "
      "(worst |I - kth| = %.2f of the 2*delta bound)\n",
      static_cast<long long>(topk), static_cast<long long>(L),
      static_cast<long long>(tokens_differing), static_cast<long long>(mismatched), worst);
}

TEST(OpsCpu, MoeRouteNoauxTcKeepsOnlyTheBestGroups) {
  // 8 experts in 4 groups of 2, keep 2 groups, top-2. Group sums (top-2 of s + bias) decide.
  RouterParams p{8, 2, 4, 2, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.0f};
  Buffer logits(DType::F32, {1, 8}), bias = Buffer::zeros(DType::F32, {8});
  const float l[8] = {3.0f, -3.0f, 1.0f, 1.0f, 0.5f, 0.5f, 2.5f, -5.0f};
  std::copy(l, l + 8, logits.f32());
  // Group sums: g0 σ(3)+σ(-3)=1.0, g1 2σ(1)=1.46, g2 2σ(.5)=1.25, g3 σ(2.5)+σ(-5)=0.93.
  // Kept: g1, g2 → the best experts there are 2 and 3 (expert 0, the best overall, is excluded).
  Buffer ids(DType::I32, {1, 2}), w(DType::F32, {1, 2});
  ops::moe_route(ids, w, logits, bias, p);
  EXPECT_EQ(ids.ptr<int32_t>()[0], 2);
  EXPECT_EQ(ids.ptr<int32_t>()[1], 3);
  EXPECT_NEAR(w.f32()[0], 1.0f, 1e-6f);  // equal scores, renormalised, × 2
  EXPECT_NEAR(w.f32()[1], 1.0f, 1e-6f);
}

// BF16 router logits (the CUDA model's gate output) route exactly as the same values in F32: the
// CPU twin of BF16 routing is "round the logits to BF16, then the F32 routing". V3.2's router
// (256 experts, 8 groups, top-4 groups, top-8, sigmoid + bias, × 2.5), Kimi-K2's (384 experts,
// one group, top-8, × 2.827) and V2-Lite's (64, greedy softmax top-6).
TEST(OpsCpu, MoeRouteBf16LogitsRouteAsTheirF32Values) {
  const RouterParams routers[] = {
      {256, 8, 8, 4, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.5f},
      {384, 8, 1, 1, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.827f},
      {64, 6, 1, 1, ScoringFunc::Softmax, TopkMethod::Greedy, false, 1.0f}};
  std::mt19937 gen(13);
  std::uniform_real_distribution<float> logit(-4.0f, 4.0f), bias_d(-0.1f, 0.1f);
  for (const RouterParams& p : routers) {
    SCOPED_TRACE(p.n_experts);
    const int64_t n = 64, E = p.n_experts, K = p.top_k;
    Buffer b16(DType::BF16, {n, E}), f32(DType::F32, {n, E}), bias(DType::F32, {E});
    for (int64_t i = 0; i < n * E; ++i) {
      b16.ptr<uint16_t>()[i] = f32_to_bf16(logit(gen));
      f32.f32()[i] = bf16_to_f32(b16.ptr<uint16_t>()[i]);
    }
    for (int64_t e = 0; e < E; ++e) bias.f32()[e] = bias_d(gen);
    Buffer ids_a(DType::I32, {n, K}), w_a(DType::F32, {n, K});
    Buffer ids_b(DType::I32, {n, K}), w_b(DType::F32, {n, K});
    ops::moe_route(ids_a, w_a, b16, bias, p);
    ops::moe_route(ids_b, w_b, f32, bias, p);
    EXPECT_EQ(std::memcmp(ids_a.view().data, ids_b.view().data, size_t(n * K) * sizeof(int32_t)),
              0);
    EXPECT_EQ(std::memcmp(w_a.view().data, w_b.view().data, size_t(n * K) * sizeof(float)), 0);
    // The weights are real routing weights: each token's sum is routed_scaling_factor when
    // renormalised, and the ids are distinct experts in range.
    for (int64_t t = 0; t < n; ++t) {
      std::set<int32_t> distinct(ids_a.ptr<int32_t>() + t * K, ids_a.ptr<int32_t>() + (t + 1) * K);
      EXPECT_EQ(int64_t(distinct.size()), K);
      EXPECT_GE(*distinct.begin(), 0);
      EXPECT_LT(*distinct.rbegin(), E);
      if (p.norm_topk_prob) {
        double sum = 0.0;
        for (int64_t i = 0; i < K; ++i) sum += w_a.f32()[t * K + i];
        EXPECT_NEAR(sum, p.routed_scaling_factor, 1e-5);
      }
    }
  }
  // Any other logit dtype is refused with a message.
  Buffer i32(DType::I32, {1, 64}), ids(DType::I32, {1, 6}), w(DType::F32, {1, 6});
  const RouterParams lite{64, 6, 1, 1, ScoringFunc::Softmax, TopkMethod::Greedy, false, 1.0f};
  EXPECT_DEATH(ops::moe_route(ids, w, i32, Tensor{}, lite), "router_logits must be F32 or BF16");
}

// Checks the properties moe_schedule.h promises, computed here without the reference's code.
void check_moe_schedule(const std::vector<int32_t>& ids, int E, const char* what,
                        int tile_rows = kMoeTileRows) {
  SCOPED_TRACE(what);
  const int64_t rows = int64_t(ids.size());
  const MoeSchedule s = moe_schedule_reference(ids.data(), rows, E, tile_rows);
  std::vector<int64_t> count(size_t(E), 0);
  for (int32_t e : ids) ++count[size_t(e)];
  ASSERT_EQ(s.offsets.size(), size_t(E) + 1);
  EXPECT_EQ(s.offsets[0], 0);
  EXPECT_EQ(s.offsets[size_t(E)], rows);
  int64_t real_tiles = 0;
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(s.offsets[size_t(e) + 1] - s.offsets[size_t(e)], count[size_t(e)]) << "expert " << e;
    EXPECT_EQ(s.tile_start[size_t(e)], real_tiles) << "expert " << e;
    real_tiles += (count[size_t(e)] + tile_rows - 1) / tile_rows;
  }
  // perm: a permutation, sorted by expert, ascending i within an expert; inv its inverse.
  ASSERT_EQ(s.perm.size(), size_t(rows));
  ASSERT_EQ(s.inv.size(), size_t(rows));
  std::vector<int> seen(size_t(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t i = s.perm[size_t(r)];
    ASSERT_TRUE(i >= 0 && i < rows);
    ++seen[size_t(i)];
    EXPECT_EQ(s.inv[size_t(i)], r);
    if (r > 0) {
      const int32_t p = s.perm[size_t(r) - 1];
      EXPECT_TRUE(ids[size_t(p)] < ids[size_t(i)] || (ids[size_t(p)] == ids[size_t(i)] && p < i))
          << "rows " << r - 1 << ", " << r << " out of order";
    }
  }
  for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(seen[size_t(i)], 1) << "pair " << i;
  // Tiles: the real ones first, in (expert, row) order, each within one expert and at most BM
  // rows, covering every sorted row once; then expert −1 up to the host's bound.
  ASSERT_EQ(int64_t(s.tiles.size()),
            (rows + tile_rows - 1) / tile_rows + std::min<int64_t>(E, rows));
  EXPECT_LE(real_tiles, int64_t(s.tiles.size()));
  std::vector<int> covered(size_t(rows), 0);
  for (size_t j = 0; j < s.tiles.size(); ++j) {
    const MoeTile& t = s.tiles[j];
    if (int64_t(j) >= real_tiles) {
      EXPECT_EQ(t.expert, -1) << "tile " << j;
      continue;
    }
    ASSERT_TRUE(t.expert >= 0 && t.expert < E) << "tile " << j;
    EXPECT_GE(t.row0, s.offsets[size_t(t.expert)]);
    EXPECT_LE(t.row1, s.offsets[size_t(t.expert) + 1]);
    EXPECT_TRUE(t.row1 > t.row0 && t.row1 - t.row0 <= tile_rows) << "tile " << j;
    if (j > 0) {
      EXPECT_LE(s.tiles[j - 1].expert, t.expert);
      if (s.tiles[j - 1].expert == t.expert) {
        EXPECT_EQ(s.tiles[j - 1].row1, t.row0);
      }
    }
    for (int32_t r = t.row0; r < t.row1; ++r) ++covered[size_t(r)];
  }
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(covered[size_t(r)], 1) << "row " << r;
}

// The split-KV plan of the sm90 MLA kernels (ops/mla_plan.h). The cost of run p, counting
// `fixed` for each token it touches.
std::vector<int64_t> mla_run_costs(const ops::MlaPlanReference& r, int32_t fixed) {
  const size_t n = r.cum.size() - 1, parts = r.part_start.size() - 1;
  std::vector<int64_t> cost(parts, 0);
  for (size_t p = 0; p < parts; ++p) {
    const int32_t a = r.part_start[p], b = r.part_start[p + 1];
    if (a >= b) continue;
    cost[p] = b - a;
    for (size_t t = 0; t < n; ++t)
      if (r.cum[t] < b && r.cum[t + 1] > a) cost[p] += fixed;
  }
  return cost;
}

// Every token's blocks lie in runs first_part .. first_part + n_splits − 1, all non-empty and
// consecutive; empty runs only at a token's first block; the partial slots as the kernel counts
// them.
void expect_mla_plan_consistent(const ops::MlaPlanReference& r) {
  const size_t n = r.cum.size() - 1, parts = r.part_start.size() - 1;
  ASSERT_EQ(r.part_start.front(), 0);
  ASSERT_EQ(r.part_start.back(), r.cum.back());
  std::set<int32_t> starts(r.cum.begin(), r.cum.end());
  for (size_t p = 0; p < parts; ++p) {
    ASSERT_LE(r.part_start[p], r.part_start[p + 1]) << p;
    if (r.part_start[p] == r.part_start[p + 1]) {
      EXPECT_TRUE(starts.count(r.part_start[p])) << p;
    }
  }
  int32_t slots = 0;
  for (size_t t = 0; t < n; ++t) {
    const int f = r.first_part[t], ns = r.n_splits[t];
    ASSERT_GE(ns, 1);
    EXPECT_LE(r.part_start[size_t(f)], r.cum[t]);
    EXPECT_GT(r.part_start[size_t(f) + 1], r.cum[t]);
    EXPECT_LE(r.part_start[size_t(f + ns - 1)], r.cum[t + 1] - 1);
    EXPECT_GE(r.part_start[size_t(f + ns)], r.cum[t + 1]);
    for (int p = f; p < f + ns; ++p)
      EXPECT_LT(r.part_start[size_t(p)], r.part_start[size_t(p) + 1]);
    EXPECT_EQ(r.split_base[t], slots) << t;
    slots += ns > 1 ? ns : 0;
  }
  EXPECT_EQ(r.split_base[n], slots);
  EXPECT_LE(slots, std::max<int32_t>(1, 2 * (int32_t(parts) - 1)));
  // The combine kernel's grid: at most parts − 1 split tokens, listed in order.
  std::vector<int32_t> split;
  for (size_t t = 0; t < n; ++t)
    if (r.n_splits[t] > 1) split.push_back(int32_t(t));
  EXPECT_EQ(r.split_tokens, split);
  EXPECT_LE(r.split_tokens.size(), parts - 1);
}

// Without a per-token cost the plan is the equal runs of blocks the kernels used before (decode
// batches keep it): part_start[p] = min(p·payload, total), the token's first run cum[t] / payload.
TEST(OpsCpu, MlaPlanWithoutTokenCostCutsEqualRunsOfBlocks) {
  std::mt19937 g(5);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int32_t> pos(size_t(1 + g() % 200));
    for (auto& p : pos) p = int32_t(g() % 9000);
    const int parts = 1 + int(g() % 132);
    const ops::MlaPlanReference r = ops::mla_plan_reference(pos, 2048, parts, 0);
    expect_mla_plan_consistent(r);
    const int32_t total = r.cum.back();
    const int32_t pl = std::max(1, (total + parts - 1) / parts);
    for (int p = 0; p <= parts; ++p)
      EXPECT_EQ(r.part_start[size_t(p)], std::min(p * pl, total)) << p;
    for (size_t t = 0; t < pos.size(); ++t) {
      const int32_t c0 = r.cum[t], c1 = r.cum[t + 1];
      EXPECT_EQ(r.first_part[t], c0 / pl);
      EXPECT_EQ(r.n_splits[t], (c1 - 1) / pl - c0 / pl + 1);
    }
  }
}

// A causal 1440-token chunk on 66 runs: with each token charged 4 blocks the costliest run costs
// at most payload + 4, where the equal-blocks cut leaves a run of the first ~130 short tokens
// costing 2.5× the mean; ragged batches and dense lengths stay consistent at every cost.
TEST(OpsCpu, MlaPlanChargesEachTokenItsFixedCost) {
  std::vector<int32_t> causal(1440);
  std::iota(causal.begin(), causal.end(), 0);
  const int32_t F = ops::kMlaPrefillTokenCost;
  const ops::MlaPlanReference even = ops::mla_plan_reference(causal, 2048, 66, 0);
  const ops::MlaPlanReference fair = ops::mla_plan_reference(causal, 2048, 66, F);
  expect_mla_plan_consistent(even);
  expect_mla_plan_consistent(fair);
  const std::vector<int64_t> ce = mla_run_costs(even, F), cf = mla_run_costs(fair, F);
  const int64_t max_e = *std::max_element(ce.begin(), ce.end());
  const int64_t max_f = *std::max_element(cf.begin(), cf.end());
  const int32_t payload = ops::mla_plan_payload(fair.cum.back(), 1440, F, 66);
  EXPECT_LE(max_f, payload + F);
  EXPECT_GT(max_e, 2 * max_f) << "the equal-blocks cut overloads the run of short tokens";
  // The first run of the equal-blocks cut holds more than 100 tokens; the charged cut's fewer
  // than 80.
  EXPECT_EQ(even.first_part[100], 0);
  EXPECT_GT(fair.first_part[80], 0);
  std::mt19937 g(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int32_t> pos;
    const int seqs = 1 + int(g() % 6);
    for (int s = 0; s < seqs; ++s) {
      const int ctx = 1 + int(g() % 5000), n_new = 1 + int(g() % std::min(ctx, 700));
      for (int i = 0; i < n_new; ++i) pos.push_back(ctx - n_new + i);
    }
    const int parts = 1 + int(g() % 132);
    for (int32_t fixed : {1, 4, 9}) {
      for (int64_t clamp : {int64_t(2048), int64_t(INT32_MAX)}) {
        const ops::MlaPlanReference r = ops::mla_plan_reference(pos, clamp, parts, fixed);
        expect_mla_plan_consistent(r);
        const std::vector<int64_t> c = mla_run_costs(r, fixed);
        EXPECT_LE(*std::max_element(c.begin(), c.end()),
                  ops::mla_plan_payload(r.cum.back(), int(pos.size()), fixed, parts) + fixed);
      }
    }
  }
}

TEST(OpsCpu, MoeSchedulePermutationAndTiles) {
  std::mt19937_64 g(7);
  auto routed = [&](int64_t n, int K, int E) {  // K distinct experts per token, uniform
    std::vector<int32_t> ids, all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t t = 0; t < n; ++t) {
      std::shuffle(all.begin(), all.end(), g);
      ids.insert(ids.end(), all.begin(), all.begin() + K);
    }
    return ids;
  };
  check_moe_schedule(routed(1, 8, 256), 256, "1 token, 256 experts top-8");
  check_moe_schedule(routed(64, 8, 256), 256, "64 tokens, 256 experts top-8");
  check_moe_schedule(routed(5000, 8, 256), 256, "5000 tokens, 256 experts top-8");
  check_moe_schedule(routed(300, 4, 16), 16, "300 tokens, 16 experts top-4");
  // Skewed: expert 3 in every token's first slot, experts 0, 1 and 13..15 never chosen.
  std::vector<int32_t> skew = routed(700, 6, 10);
  for (int32_t& e : skew) e = e == 0 ? 2 : e + 3;  // 0..9 → 2, 4..12
  for (size_t t = 0; t < skew.size() / 6; ++t) skew[t * 6] = 3;
  check_moe_schedule(skew, 16, "700 tokens, one expert in every token, six idle");
  check_moe_schedule(std::vector<int32_t>(130, 0), 1, "1 expert, 130 rows (3 tiles)");
  check_moe_schedule(std::vector<int32_t>(64, 5), 8, "one full tile");
  // Every row its own expert: as many tiles as rows.
  std::vector<int32_t> each(200);
  std::iota(each.begin(), each.end(), 0);
  check_moe_schedule(each, 256, "200 experts with one row each");
  EXPECT_EQ(moe_max_tiles(0, 256), 0);
  EXPECT_EQ(moe_max_tiles(8, 256), 1 + 8);
  EXPECT_EQ(moe_max_tiles(40000, 256), 625 + 256);
  // The FP8 decode path's 16-row tiles (ops/cuda/gemm/fp8_swapab.cuh).
  check_moe_schedule(routed(64, 8, 256), 256, "64 tokens, 256 experts top-8, 16-row tiles", 16);
  check_moe_schedule(skew, 16, "700 tokens skewed, 16-row tiles", 16);
  check_moe_schedule(std::vector<int32_t>(130, 0), 1, "1 expert, 130 rows (9 tiles of 16)", 16);
  EXPECT_EQ(moe_max_tiles(512, 256, 16), 32 + 256);
  EXPECT_EQ(moe_max_tiles(8, 256, 16), 1 + 8);
}

TEST(OpsCpu, LinearW8A8IsDeepSeeksBlockScaledArithmetic) {
  std::mt19937_64 g(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t n = 5, in = 384, out = 200;  // 3 groups; out not a multiple of 128
  Buffer w(DType::F8_E4M3, {out, in}), sc(DType::F32, {2, 3});
  for (int64_t i = 0; i < out * in; ++i) {
    int v = byte(g);
    if ((v & 0x7f) == 0x7f) v -= 1;  // no NaN
    w.ptr<uint8_t>()[i] = uint8_t(v);
  }
  for (int i = 0; i < 6; ++i) sc.f32()[i] = 1e-3f * (1.0f + 0.25f * float(i));
  const LinearWeight lw{w, sc};
  // x whose 1×128 quantisation is exact: e4m3 values × 2^-3, each group's amax 448 × 2^-3.
  Buffer xe(DType::F32, {n, in}), xr(DType::F32, {n, in});
  for (int64_t i = 0; i < n * in; ++i) {
    int v = byte(g);
    if ((v & 0x7f) == 0x7f) v -= 1;
    xe.f32()[i] = e4m3_to_f32(uint8_t(v)) / 8.0f;
    xr.f32()[i] = u(g);
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t gi = 0; gi < 3; ++gi) xe.f32()[t * in + gi * 128 + 7] = 448.0f / 8.0f;
  xr.f32()[1 * in + 128 + 3] = 0.0f;
  for (int64_t c = 0; c < 128; ++c) xr.f32()[2 * in + c] = 0.0f;  // an all-zero group: scale 1
  // The quantisation itself: the group's amax lands on ±448; a zero group has scale 1.
  std::vector<float> q(size_t(n * in)), s(size_t(n * 3));
  ops::cpu::quantize_act_rows(q.data(), s.data(), xe.f32(), n, in);
  EXPECT_FLOAT_EQ(s[0], 448.0f / 8.0f / 448.0f);
  EXPECT_FLOAT_EQ(q[7], 448.0f);
  ops::cpu::quantize_act_rows(q.data(), s.data(), xr.f32(), n, in);
  EXPECT_EQ(s[2 * 3 + 0], 1.0f);
  EXPECT_EQ(q[size_t(2 * in + 5)], 0.0f);
  // Exactly quantisable x: the same as the F32 product of the dequantised weight (no rounding
  // but the F32 sums'). Random x: e4m3's 3 mantissa bits make it differ by ~1e-2 relative.
  auto rel = [&](const Buffer& x) {
    Buffer a(DType::F32, {n, out}), b(DType::F32, {n, out});
    ops::cpu::linear_w8a8(a, x, lw);
    ops::cpu::linear(b, x, lw);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n * out; ++i) {
      num += double(a.f32()[i] - b.f32()[i]) * double(a.f32()[i] - b.f32()[i]);
      den += double(b.f32()[i]) * double(b.f32()[i]);
    }
    return std::sqrt(num / den);
  };
  EXPECT_LT(rel(xe), 1e-5);
  const double r = rel(xr);
  EXPECT_GT(r, 3e-3) << "random x must be quantised to e4m3";
  EXPECT_LT(r, 6e-2);
  Buffer bad(DType::F32, {n, 200});
  Buffer y(DType::F32, {n, out});
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(ops::cpu::linear_w8a8(y, bad, lw), "linear_w8a8: x \\[5, 200\\]");
}

// cpu::rms_norm_multi / add_rms_norm_multi (the CPU twin of the norms that write their consumers'
// BF16 and FP8 inputs) is the composition: the plain norm's out, its BF16 rounding, and
// quantize_act_rows of out in either layout (Cols: 5 rows padded to 16, zero bytes, scale 1).
TEST(OpsCpu, RmsNormMultiIsTheComposition) {
  const int64_t n = 5, D = 384, G = 3;
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Buffer x(DType::F32, {n, D}), res(DType::F32, {n, D}), w(DType::F32, {D});
  for (int64_t i = 0; i < n * D; ++i) x.f32()[i] = u(g), res.f32()[i] = u(g);
  for (int64_t i = 0; i < D; ++i) w.f32()[i] = 1.0f + 0.25f * u(g);
  for (bool add : {false, true})
    for (ops::Fp8Layout layout : {ops::Fp8Layout::Rows, ops::Fp8Layout::Cols}) {
      const int64_t rows = layout == ops::Fp8Layout::Rows ? n : 16;
      Buffer out(DType::F32, {n, D}), ob(DType::BF16, {n, D}), q(DType::U8, {rows, D}),
          sc(DType::F32, layout == ops::Fp8Layout::Rows ? Shape{n, G} : Shape{G, rows});
      std::memset(q.view().data, 0x5a, q.view().nbytes());
      Buffer r1(DType::F32, {n, D}), r2(DType::F32, {n, D}), plain(DType::F32, {n, D});
      std::memcpy(r1.f32(), res.f32(), size_t(n * D) * 4);
      std::memcpy(r2.f32(), res.f32(), size_t(n * D) * 4);
      const ops::NormOutputs no{out, ob, ops::Fp8Act{q, sc, layout}};
      if (add) {
        ops::add_rms_norm_multi(no, r1, x, w, 1e-6f);
        ops::add_rms_norm(plain, r2, x, w, 1e-6f);
        EXPECT_EQ(std::memcmp(r1.f32(), r2.f32(), size_t(n * D) * 4), 0);
      } else {
        ops::rms_norm_multi(no, x, w, 1e-6f);
        ops::rms_norm(plain, x, w, 1e-6f);
      }
      EXPECT_EQ(std::memcmp(out.f32(), plain.f32(), size_t(n * D) * 4), 0);
      std::vector<float> wq(size_t(n * D)), ws(size_t(n * G));
      ops::cpu::quantize_act_rows(wq.data(), ws.data(), plain.f32(), n, D);
      for (int64_t i = 0; i < n * D; ++i) {
        ASSERT_EQ(ob.ptr<uint16_t>()[i], f32_to_bf16(plain.f32()[i])) << i;
        ASSERT_EQ(e4m3_to_f32(q.ptr<uint8_t>()[i]), wq[size_t(i)]) << i;
      }
      for (int64_t i = n * D; i < rows * D; ++i) ASSERT_EQ(q.ptr<uint8_t>()[i], 0) << i;
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t gi = 0; gi < G; ++gi) {
          const float v = sc.f32()[layout == ops::Fp8Layout::Rows ? t * G + gi : gi * rows + t];
          EXPECT_EQ(v, t < n ? ws[size_t(t * G + gi)] : 1.0f) << t << "," << gi;
        }
    }
  // No extras: the plain norm, nothing else touched; a wrong FP8 shape is a clear error.
  Buffer out(DType::F32, {n, D}), plain(DType::F32, {n, D});
  ops::rms_norm_multi({out, {}, {}}, x, w, 1e-6f);
  ops::rms_norm(plain, x, w, 1e-6f);
  EXPECT_EQ(std::memcmp(out.f32(), plain.f32(), size_t(n * D) * 4), 0);
  Buffer q(DType::U8, {n, D}), sc(DType::F32, {G, n});
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      ops::rms_norm_multi({out, {}, ops::Fp8Act{q, sc, ops::Fp8Layout::Rows}}, x, w, 1e-6f),
      "FP8 activation");
  EXPECT_EQ(ops::fp8_act_shape(Device::CPU, n, D).layout, ops::Fp8Layout::None);
}

// cpu::silu_mul_multi is the composition: silu_mul, then quantize_act_rows of its out (Rows).
TEST(OpsCpu, SiluMulMultiIsTheComposition) {
  const int64_t n = 3, I = 256;
  std::mt19937 g(4);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  Buffer gate(DType::F32, {n, I}), up(DType::F32, {n, I});
  for (int64_t i = 0; i < n * I; ++i) gate.f32()[i] = u(g), up.f32()[i] = u(g);
  Buffer out(DType::F32, {n, I}), plain(DType::F32, {n, I}), q(DType::U8, {n, I}),
      sc(DType::F32, {n, 2});
  ops::silu_mul_multi(out, ops::Fp8Act{q, sc, ops::Fp8Layout::Rows}, gate, up);
  ops::silu_mul(plain, gate, up);
  EXPECT_EQ(std::memcmp(out.f32(), plain.f32(), size_t(n * I) * 4), 0);
  std::vector<float> wq(size_t(n * I)), ws(size_t(n * 2));
  ops::cpu::quantize_act_rows(wq.data(), ws.data(), plain.f32(), n, I);
  for (int64_t i = 0; i < n * I; ++i) ASSERT_EQ(e4m3_to_f32(q.ptr<uint8_t>()[i]), wq[size_t(i)]);
  for (int64_t i = 0; i < n * 2; ++i) EXPECT_EQ(sc.f32()[i], ws[size_t(i)]);
}

TEST(OpsCpu, RopeLayoutsAreTheSameRotation) {
  // Interleaved pairs (2i, 2i+1) and half-split pairs (i, i + 32) rotate identically once permuted.
  const int64_t n = 3, D = 64;
  Buffer a(DType::F32, {n, D}), b(DType::F32, {n, D}), pos(DType::I32, {n}), inv(DType::F32, {32});
  for (int i = 0; i < 32; ++i) inv.f32()[i] = std::pow(10000.0f, -float(i) / 32.0f);
  for (int64_t t = 0; t < n; ++t) {
    pos.ptr<int32_t>()[t] = int32_t(t * 977 + 5);
    for (int i = 0; i < 32; ++i) {
      const float x0 = std::sin(float(t * 64 + i)), x1 = std::cos(float(t * 31 + i));
      a.f32()[t * D + 2 * i] = x0;
      a.f32()[t * D + 2 * i + 1] = x1;
      b.f32()[t * D + i] = x0;
      b.f32()[t * D + i + 32] = x1;
    }
  }
  ops::rope(a, 0, 64, pos, inv, 1.0f, true);
  ops::rope(b, 0, 64, pos, inv, 1.0f, false);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(a.f32()[t * D + 2 * i], b.f32()[t * D + i]);
      EXPECT_EQ(a.f32()[t * D + 2 * i + 1], b.f32()[t * D + i + 32]);
    }
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(OpsCpu, CopyColumnsSplitsAndBroadcasts) {
  // src [2, 5] = 0..9; dst [2·3, 4]: cols 1..2 from src cols 3..4, each src row repeated 3 times.
  Buffer src(DType::F32, {2, 5}), dst(DType::F32, {6, 4});
  for (int i = 0; i < 10; ++i) src.f32()[i] = float(i);
  for (int i = 0; i < 24; ++i) dst.f32()[i] = -1.0f;
  ops::copy_columns(dst, 1, src, 3, 2);
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(dst.f32()[r * 4 + 0], -1.0f);
    EXPECT_EQ(dst.f32()[r * 4 + 1], float((r / 3) * 5 + 3));
    EXPECT_EQ(dst.f32()[r * 4 + 2], float((r / 3) * 5 + 4));
    EXPECT_EQ(dst.f32()[r * 4 + 3], -1.0f);
  }
}

TEST(OpsCpu, AddScaleGatherRows) {
  Buffer a(DType::F32, {3, 2}), b(DType::F32, {3, 2}), idx(DType::I32, {2}), g(DType::F32, {2, 2});
  for (int i = 0; i < 6; ++i) {
    a.f32()[i] = float(i);
    b.f32()[i] = float(10 * i);
  }
  ops::add(a, a, b);
  ops::scale(a, 0.5f);
  idx.ptr<int32_t>()[0] = 2;
  idx.ptr<int32_t>()[1] = 0;
  ops::gather_rows(g, a, idx);
  EXPECT_EQ(g.f32()[0], 11.0f * 4 * 0.5f);
  EXPECT_EQ(g.f32()[1], 11.0f * 5 * 0.5f);
  EXPECT_EQ(g.f32()[2], 0.0f);
  EXPECT_EQ(g.f32()[3], 11.0f * 0.5f);
}

TEST(Workspace, SecondStepReusesOneArena) {
  Workspace ws(Device::CPU);
  auto step = [&]() {
    ws.reset();
    Tensor a = ws.alloc(DType::F32, {1000});
    void* inner = nullptr;
    {
      Workspace::Scope s(ws);
      inner = ws.alloc(DType::F32, {3000}).data;
    }
    Tensor c = ws.alloc(DType::F32, {10});
    return std::vector<void*>{a.data, inner, c.data};
  };
  step();  // overflows: separate allocations
  step();  // its reset made one arena of the high-water size
  const size_t cap = ws.capacity();
  EXPECT_GE(cap, size_t(4000 * 4));
  const std::vector<void*> p1 = step(), p2 = step();
  EXPECT_EQ(ws.capacity(), cap);  // no growth in the steady state
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(p1[1], p1[2]);  // the released scope's memory is reused
}

}  // namespace
}  // namespace osprey
