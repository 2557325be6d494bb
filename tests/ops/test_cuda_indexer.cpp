// CUDA lightning-indexer twins against the CPU twins: 64 heads × 128, top-2048, contexts to 16k.
// Top-k is compared as a set: every position in one result but not the other must be a near-tie
// with the k-th score (summation order differs between the twins).
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/indexer.h"

namespace osprey {
namespace {
using namespace testing;

constexpr int64_t IH = 64, ID = 128;
constexpr int kTopk = 2048;

// The exact indexer score of cached position j for token t of sequence s, in double:
//   Σ_h w[t, h] · relu(q[t, h] · key(row of j) · scale), key(row, d) as the cache holds it.
template <typename Key>
double exact_score(const Batch& b, const Buffer& q, const Buffer& w, float scale, const Key& key,
                   int64_t t, int s, int64_t j) {
  const int64_t max_blocks = b.block_table.shape()[1];
  const int64_t row = int64_t(b.block_table.ptr<int32_t>()[s * max_blocks + j / 64]) * 64 + j % 64;
  double acc = 0.0;
  for (int64_t h = 0; h < IH; ++h) {
    double dot = 0.0;
    for (int64_t d = 0; d < ID; ++d) dot += double(q.f32()[(t * IH + h) * ID + d]) * key(row, d);
    acc += w.f32()[t * IH + h] * std::max(dot * scale, 0.0);
  }
  return acc;
}

// Top-k of the GPU (got) against the CPU (ref), both I32 [n, kTopk]: the GPU's rows ascending,
// inside [0, position], padded with −1; as sets equal up to near-ties with the k-th exact score
// (score(t, s, j)). Prints a TWIN line with the mismatch count under `label`.
template <typename Score>
void expect_same_topk_sets(const Batch& b, const Buffer& ref, const Buffer& got, const Score& score,
                           const char* label) {
  int64_t mismatched = 0, near_ties = 0;
  double worst = 0.0;
  int s = 0;
  for (int64_t t = 0; t < b.host.n_tokens; ++t) {
    while (s + 1 < b.host.n_seqs && b.qsl.ptr<int32_t>()[s + 1] <= t) ++s;
    const int64_t p = b.positions.ptr<int32_t>()[t];
    const int32_t* r = ref.ptr<int32_t>() + t * kTopk;
    const int32_t* g = got.ptr<int32_t>() + t * kTopk;
    const int64_t n_sel = std::min<int64_t>(kTopk, p + 1);
    for (int64_t i = 0; i < kTopk; ++i) {
      if (i >= n_sel) {
        ASSERT_EQ(g[i], -1) << "token " << t << " padding " << i;
        continue;
      }
      ASSERT_TRUE(g[i] >= 0 && g[i] <= p) << "token " << t << " entry " << i << " = " << g[i];
      if (i > 0) {
        ASSERT_LT(g[i - 1], g[i]) << "token " << t << ": not ascending";
      }
    }
    std::set<int32_t> rs(r, r + n_sel), gs(g, g + n_sel);
    if (rs == gs) continue;
    double kth = INFINITY, smax = 0.0;
    for (int32_t j : rs) {
      const double v = score(t, s, j);
      kth = std::min(kth, v);
      smax = std::max(smax, std::fabs(v));
    }
    for (int32_t j : gs)
      if (!rs.count(j)) {
        ++mismatched;
        const double v = score(t, s, j);
        worst = std::max(worst, std::fabs(v - kth) / smax);
        EXPECT_NEAR(v, kth, 1e-5 * smax) << "token " << t << " position " << j << " is no tie";
        ++near_ties;
      }
  }
  std::printf("TWIN %-44s mismatches %lld (all near-ties: %lld, worst |dI|/max %.2e)  %s\n", label,
              static_cast<long long>(mismatched), static_cast<long long>(near_ties), worst,
              ::testing::Test::HasFailure() ? "FAIL" : "ok");
}

TEST(CudaOps, IndexerCacheWriteTopk) {
  OSPREY_REQUIRE_GPU();
  Batch b = make_batch({16384, 9000, 2049, 2048, 100, 3000}, {1, 2, 1, 1, 100, 4});
  const int64_t n = b.host.n_tokens;
  const float scale = 1.0f / std::sqrt(float(ID));
  Buffer cache = rand_f32({b.n_blocks, 64, ID}), k = rand_f32({n, ID});
  Buffer q = rand_f32({n, IH, ID}), w = rand_f32({n, IH}, -0.125f, 0.125f);
  DeviceBuffer d_cache = upload(cache), dk = upload(k), dq = upload(q), dw = upload(w);
  ops::indexer_cache_write(cache, k, b.host);
  ops::indexer_cache_write(d_cache, dk, b.dev);
  expect_close("indexer_cache_write [n_blocks,64,128] F32", download(d_cache), cache, 0.0);

  Buffer ref(DType::I32, {n, kTopk});
  ops::indexer_topk(ref, q, w, cache, b.host, scale);
  DeviceBuffer d_topk(DType::I32, {n, kTopk});
  cuda::fill_bytes(d_topk, 0x7f);  // garbage positions
  ops::indexer_topk(d_topk, dq, dw, d_cache, b.dev, scale);
  cuda::synchronize();
  Buffer got = cuda::to_host(d_topk);

  auto key = [&](int64_t row, int64_t d) { return double(cache.f32()[row * ID + d]); };
  expect_same_topk_sets(
      b, ref, got,
      [&](int64_t t, int s, int64_t j) { return exact_score(b, q, w, scale, key, t, s, j); },
      "indexer_topk top-2048 ctx<=16384 (sets)");
}

// The FP8 indexer cache (U8 [n_blocks, 64 · 132], ops/indexer.h), CUDA twin vs CPU twin: the
// quantized bytes must be identical (same amax, power-of-two scale, RNE e4m3), and top-k as sets
// up to near-ties of the (dequantized) score.
TEST(CudaOps, IndexerFp8CacheWriteTopk) {
  OSPREY_REQUIRE_GPU();
  Batch b = make_batch({16384, 9000, 2049, 2048, 100, 3000}, {1, 2, 1, 1, 100, 4});
  const int64_t n = b.host.n_tokens, TB = ID + 4;
  const float scale = 1.0f / std::sqrt(float(ID));
  // Every slot holds a quantized random key (rows of varied magnitude) before the step.
  const int64_t n_slots = b.n_blocks * 64;
  Buffer all_k = rand_f32({n_slots, ID});
  for (int64_t r = 0; r < n_slots; ++r)
    for (int64_t d = 0; d < ID; ++d) all_k.f32()[r * ID + d] *= float(1 + r % 7) * 0.5f;
  Buffer all_slots(DType::I64, {n_slots});
  for (int64_t r = 0; r < n_slots; ++r) all_slots.ptr<int64_t>()[r] = r;
  AttentionMeta fill{1, int(n_slots), 64, {}, {}, {}, {}, all_slots, {}};
  Buffer cache = Buffer::zeros(DType::U8, {b.n_blocks, 64 * TB});
  ops::indexer_cache_write(cache, all_k, fill);
  Buffer k = rand_f32({n, ID}, -3.0f, 3.0f);
  Buffer q = rand_f32({n, IH, ID}), w = rand_f32({n, IH}, -0.125f, 0.125f);
  DeviceBuffer d_cache = upload(cache), dk = upload(k), dq = upload(q), dw = upload(w);
  ops::indexer_cache_write(cache, k, b.host);
  ops::indexer_cache_write(d_cache, dk, b.dev);
  cuda::synchronize();
  Buffer got_cache = cuda::to_host(d_cache);
  int64_t bad_bytes = 0;
  for (int64_t i = 0; i < cache.numel(); ++i)
    bad_bytes += got_cache.ptr<uint8_t>()[i] != cache.ptr<uint8_t>()[i];
  EXPECT_EQ(bad_bytes, 0) << "FP8 cache bytes differ between the twins";
  std::printf("TWIN %-44s differing bytes %lld of %lld  %s\n",
              "indexer_cache_write FP8 [n_blocks,64*132] U8", static_cast<long long>(bad_bytes),
              static_cast<long long>(cache.numel()), bad_bytes ? "FAIL" : "ok");

  Buffer ref(DType::I32, {n, kTopk});
  ops::indexer_topk(ref, q, w, cache, b.host, scale);
  DeviceBuffer d_topk(DType::I32, {n, kTopk});
  cuda::fill_bytes(d_topk, 0x7f);
  ops::indexer_topk(d_topk, dq, dw, d_cache, b.dev, scale);
  cuda::synchronize();
  Buffer got = cuda::to_host(d_topk);

  auto key = [&](int64_t row, int64_t d) {  // the dequantized key (CPU cache)
    const uint8_t* blk = cache.ptr<uint8_t>() + (row / 64) * 64 * TB;
    float sc;
    std::memcpy(&sc, blk + 64 * ID + 4 * (row % 64), 4);
    return double(e4m3_to_f32(blk[(row % 64) * ID + d])) * sc;
  };
  expect_same_topk_sets(
      b, ref, got,
      [&](int64_t t, int s, int64_t j) { return exact_score(b, q, w, scale, key, t, s, j); },
      "indexer_topk FP8 top-2048 ctx<=16384 (sets)");
}

}  // namespace
}  // namespace osprey
