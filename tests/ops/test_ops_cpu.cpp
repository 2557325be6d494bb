// CPU-only unit tests of op contracts that the twin tests take for granted: the indexer's tie rule
// and padding, the router's group restriction, and the two rope layouts being one rotation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/storage.h"
#include "core/tensor.h"
#include "ops/indexer.h"
#include "ops/moe.h"
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
