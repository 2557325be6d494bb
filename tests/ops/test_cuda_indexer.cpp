// CUDA lightning-indexer twins against the CPU twins: 64 heads × 128, top-2048, contexts to 16k.
// Top-k is compared as a set: every position in one result but not the other must be a near-tie
// with the k-th score (summation order differs between the twins).
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "ops/cuda/indexer/logits_sm90.cuh"
#include "ops/indexer.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/tensor_ops.h"

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
                           const char* label, double tie_rel = 1e-5) {
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
        EXPECT_NEAR(v, kth, tie_rel * smax) << "token " << t << " position " << j << " is no tie";
        ++near_ties;
      }
  }
  std::printf("TWIN %-44s mismatches %lld (near-ties within %.0e: %lld, worst |dI|/max %.2e)  %s\n",
              label, static_cast<long long>(mismatched), tie_rel, static_cast<long long>(near_ties),
              worst, ::testing::Test::HasFailure() ? "FAIL" : "ok");
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

// An FP8 cache (U8 [n_blocks, 64 · 132]) whose every slot holds a quantized random key, rows of
// varied magnitude (so the per-token scales differ), written by the CPU twin.
Buffer random_fp8_cache(const Batch& b) {
  const int64_t n_slots = b.n_blocks * 64;
  Buffer all_k = rand_f32({n_slots, ID});
  for (int64_t r = 0; r < n_slots; ++r)
    for (int64_t d = 0; d < ID; ++d) all_k.f32()[r * ID + d] *= float(1 + r % 7) * 0.5f;
  Buffer all_slots(DType::I64, {n_slots});
  for (int64_t r = 0; r < n_slots; ++r) all_slots.ptr<int64_t>()[r] = r;
  AttentionMeta fill{1, int(n_slots), 64, {}, {}, {}, {}, all_slots, {}};
  Buffer cache = Buffer::zeros(DType::U8, {b.n_blocks, 64 * (ID + 4)});
  ops::indexer_cache_write(cache, all_k, fill);
  return cache;
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
  Buffer cache = random_fp8_cache(b);
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

// Random q [n, 64, 128] with heads of varied magnitude (one head all zeros: the amax floor).
Buffer random_q(int64_t n) {
  Buffer q = rand_f32({n, IH, ID});
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < IH; ++h)
      for (int64_t d = 0; d < ID; ++d)
        q.f32()[(t * IH + h) * ID + d] *= h == 5 ? 0.0f : std::ldexp(1.0f, int(h % 9) - 4);
  return q;
}

// indexer_quantize_q: the e4m3 bytes and the folded weights bit-identical between the twins.
TEST(CudaOps, IndexerQuantizeQ) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 77;
  Buffer q = random_q(n), w = rand_f32({n, IH}, -0.125f, 0.125f);
  Buffer q8(DType::U8, {n, IH, ID}), w8(DType::F32, {n, IH});
  ops::indexer_quantize_q(q8, w8, q, w);
  DeviceBuffer dq = upload(q), dw = upload(w);
  DeviceBuffer d_q8(DType::U8, {n, IH, ID}), d_w8(DType::F32, {n, IH});
  cuda::fill_bytes(d_q8, 0x5a);
  cuda::fill_bytes(d_w8, 0x7f);
  ops::indexer_quantize_q(d_q8, d_w8, dq, dw);
  cuda::synchronize();
  Buffer g8 = cuda::to_host(d_q8), gw = cuda::to_host(d_w8);
  int64_t bad = 0, nonzero = 0;
  for (int64_t i = 0; i < q8.numel(); ++i) {
    bad += g8.ptr<uint8_t>()[i] != q8.ptr<uint8_t>()[i];
    nonzero += (q8.ptr<uint8_t>()[i] & 0x7f) != 0;
  }
  EXPECT_EQ(bad, 0) << "e4m3 bytes differ between the twins";
  EXPECT_GT(nonzero, q8.numel() / 2);  // real values, not a zero buffer
  for (int64_t i = 0; i < w8.numel(); ++i)
    ASSERT_EQ(gw.f32()[i], w8.f32()[i]) << "folded weight " << i;
  // The fold is right: w8 / w is the power-of-two scale amax / 448 rounded up.
  const float s0 = w8.f32()[0] / w.f32()[0];
  float amax = 0.0f;
  for (int64_t d = 0; d < ID; ++d) amax = std::max(amax, std::fabs(q.f32()[d]));
  EXPECT_GE(s0 * 448.0f, amax);
  EXPECT_LT(s0 * 448.0f, 2.0f * amax);
  std::printf("TWIN %-44s differing bytes %lld of %lld  %s\n", "indexer_quantize_q [77,64,128]",
              static_cast<long long>(bad), static_cast<long long>(q8.numel()), bad ? "FAIL" : "ok");
}

// The indexer's rope frequencies (64 rope dims of the 128) and the YaRN-like factor.
Buffer index_inv_freq() {
  Buffer f(DType::F32, {32});
  for (int64_t i = 0; i < 32; ++i) f.f32()[i] = std::pow(10000.0f, -float(i) / 32.0f);
  return f;
}
constexpr float kRopeFactor = 1.25f;

// Dequantized FP8 indexer cache values of two caches compared: the bytes may differ by one e4m3
// step (the twins' layer_norm and cosf round differently), the scales by at most a factor of 2 at
// a power-of-two boundary; returns the share of differing value bytes and the worst difference
// relative to the token's amax.
std::pair<double, double> fp8_cache_diff(const Buffer& a, const Buffer& b, const Batch& bt) {
  int64_t differ = 0, total = 0;
  double worst = 0.0;
  for (int64_t t = 0; t < bt.host.n_tokens; ++t) {
    const int64_t slot = bt.slot_mapping.ptr<int64_t>()[t];
    const int64_t off = (slot / 64) * 64 * (ID + 4);
    float sa, sb;
    std::memcpy(&sa, a.ptr<uint8_t>() + off + 64 * ID + 4 * (slot % 64), 4);
    std::memcpy(&sb, b.ptr<uint8_t>() + off + 64 * ID + 4 * (slot % 64), 4);
    const double amax = 448.0 * std::max(sa, sb);
    for (int64_t d = 0; d < ID; ++d) {
      const uint8_t va = a.ptr<uint8_t>()[off + (slot % 64) * ID + d];
      const uint8_t vb = b.ptr<uint8_t>()[off + (slot % 64) * ID + d];
      differ += va != vb || sa != sb;
      ++total;
      worst = std::max(
          worst, std::fabs(double(e4m3_to_f32(va)) * sa - double(e4m3_to_f32(vb)) * sb) / amax);
    }
  }
  return {double(differ) / double(total), worst};
}

// indexer_k_write (layer_norm + half-split rope + cache write fused, the decode step's path): the
// CUDA twin's cache bit for bit the unfused CUDA composition's (ops::layer_norm, ops::rope,
// ops::indexer_cache_write), for the FP8 and the F32 key caches; against the CPU twin (double
// layer_norm, glibc cosf) within one e4m3 step. Decode and prefill tokens at positions to 16k; a
// padding slot (−1) writes nothing.
TEST(CudaOps, IndexerKWriteFusedEqualsUnfused) {
  OSPREY_REQUIRE_GPU();
  Batch b = make_batch({16384, 9000, 2049, 100, 3000}, {1, 2, 1, 100, 4});
  const int64_t n = b.host.n_tokens;
  Buffer k = rand_f32({n, ID}, -3.0f, 3.0f);
  for (int64_t t = 0; t < n; ++t)  // tokens of varied magnitude and offset
    for (int64_t d = 0; d < ID; ++d)
      k.f32()[t * ID + d] = k.f32()[t * ID + d] * std::ldexp(1.0f, int(t % 7) - 3) + float(t % 3);
  Buffer nw = rand_f32({ID}, 0.5f, 1.5f), nb = rand_f32({ID}, -0.2f, 0.2f);
  Buffer freq = index_inv_freq();
  DeviceBuffer dk = upload(k), dnw = upload(nw), dnb = upload(nb), dfreq = upload(freq);
  // FP8 cache
  Buffer cache = random_fp8_cache(b);
  DeviceBuffer fused = cuda::to_device(cache), plain = cuda::to_device(cache);
  ops::indexer_k_write(fused, dk, dnw, dnb, 1e-6f, 64, dfreq, kRopeFactor, b.dev);
  DeviceBuffer dkn(DType::F32, {n, 1, ID});
  ops::layer_norm(dkn, dk, dnw, dnb, 1e-6f);
  ops::rope(dkn, 0, 64, b.d_positions, dfreq, kRopeFactor, false);
  ops::indexer_cache_write(plain, dkn.view().reshape({n, ID}), b.dev);
  const Buffer gf = download(fused), gp = download(plain);
  EXPECT_EQ(std::memcmp(gf.ptr<uint8_t>(), gp.ptr<uint8_t>(), size_t(gf.numel())), 0)
      << "FP8 key cache: fused differs from layer_norm, rope, cache_write";
  Buffer ref = cuda::to_host(cuda::to_device(cache));
  ops::indexer_k_write(ref, k, nw, nb, 1e-6f, 64, freq, kRopeFactor, b.host);
  const auto [share, worst] = fp8_cache_diff(gf, ref, b);
  EXPECT_LT(share, 0.02) << "FP8 key cache bytes against the CPU twin";
  EXPECT_LT(worst, 1.0 / 16.0) << "FP8 key cache values against the CPU twin";
  int64_t changed = 0;  // the written slots hold the new keys, not the old random ones
  for (int64_t i = 0; i < cache.numel(); ++i)
    changed += gf.ptr<uint8_t>()[i] != cache.ptr<uint8_t>()[i];
  EXPECT_GT(changed, n * ID / 2);
  std::printf("TWIN %-44s vs CPU: differing %.4f, worst %.3e of amax  %s\n",
              "indexer_k_write FP8 (fused = unfused bytes)", share, worst,
              share < 0.02 && worst < 1.0 / 16.0 ? "ok" : "FAIL");
  // F32 cache, and a padding slot that writes nothing
  Buffer fcache = rand_f32({b.n_blocks * 64, ID});
  DeviceBuffer ff = cuda::to_device(fcache), fp = cuda::to_device(fcache);
  Buffer slots_pad = cuda::to_host(b.d_slot_mapping);
  slots_pad.ptr<int64_t>()[0] = -1;
  DeviceBuffer d_slots_pad = cuda::to_device(slots_pad);
  AttentionMeta padded = b.dev;
  padded.slot_mapping = d_slots_pad;
  ops::indexer_k_write(ff, dk, dnw, dnb, 1e-6f, 64, dfreq, kRopeFactor, padded);
  ops::indexer_cache_write(fp, dkn.view().reshape({n, ID}), padded);
  const Buffer gff = download(ff), gfp = download(fp);
  // The F32 keys: within 2 F32 ulps of their row's largest value of the unfused kernels' (an H100
  // run found them not bit for bit equal: a rotated pair's x0·c − x1·s may contract into an FMA in
  // one kernel and not the other; the FP8 bytes above are equal), with the count that differ.
  int64_t f32_differ = 0;
  double f32_worst = 0.0;
  for (int64_t row = 0; row < gff.numel() / ID; ++row) {
    double amax = 0.0;
    for (int64_t d = 0; d < ID; ++d)
      amax = std::max(amax, double(std::fabs(gfp.f32()[row * ID + d])));
    for (int64_t d = 0; d < ID; ++d) {
      const double a = gff.f32()[row * ID + d], c = gfp.f32()[row * ID + d];
      f32_differ += a != c;
      if (a != c) f32_worst = std::max(f32_worst, std::fabs(a - c) / amax);
    }
  }
  EXPECT_LT(f32_worst, 2.4e-7) << "F32 key cache: fused against unfused";
  std::printf("TWIN %-44s %lld of %lld values differ, worst %.2e of the row's amax  %s\n",
              "indexer_k_write F32 (fused vs unfused)", static_cast<long long>(f32_differ),
              static_cast<long long>(n * ID), f32_worst, f32_worst < 2.4e-7 ? "ok" : "FAIL");
  const int64_t slot0 = b.slot_mapping.ptr<int64_t>()[0];
  EXPECT_EQ(std::memcmp(gff.f32() + slot0 * ID, fcache.f32() + slot0 * ID, ID * 4), 0)
      << "the padding slot's row was written";
  Buffer fref(DType::F32, {b.n_blocks * 64, ID});
  std::memcpy(fref.f32(), fcache.f32(), size_t(fcache.numel()) * 4);
  ops::indexer_k_write(fref, k, nw, nb, 1e-6f, 64, freq, kRopeFactor, b.host);
  double fworst = 0.0;
  for (int64_t t = 1; t < n; ++t) {
    const int64_t sl = b.slot_mapping.ptr<int64_t>()[t];
    for (int64_t d = 0; d < ID; ++d)
      fworst =
          std::max(fworst, double(std::fabs(gff.f32()[sl * ID + d] - fref.f32()[sl * ID + d])));
  }
  EXPECT_LT(fworst, 1e-4) << "F32 key cache against the CPU twin";
}

// indexer_q_prep (q's rope, the weights' × IH^-1/2 and q's quantisation fused): q8 and the folded
// weights bit for bit the unfused CUDA composition's (ops::rope in place, ops::scale,
// ops::indexer_quantize_q), q and weights left as given; against the CPU twin: the folded weights
// within one power-of-two scale step, the e4m3 bytes within one step.
TEST(CudaOps, IndexerQPrepFusedEqualsUnfused) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 37;
  Buffer q = random_q(n), w = rand_f32({n, IH}, -2.0f, 2.0f), freq = index_inv_freq();
  Buffer pos(DType::I32, {n});
  for (int64_t t = 0; t < n; ++t) pos.ptr<int32_t>()[t] = int32_t((t * 4099) % 16384);
  DeviceBuffer dq = upload(q), dw = upload(w), dpos = upload(pos), dfreq = upload(freq);
  const float ws = 1.0f / std::sqrt(float(IH));
  DeviceBuffer f8(DType::U8, {n, IH, ID}), fw(DType::F32, {n, IH});
  cuda::fill_bytes(f8, 0x5a);
  cuda::fill_bytes(fw, 0x7f);
  ops::indexer_q_prep(f8, fw, dq, dw, ws, 64, dpos, dfreq, kRopeFactor);
  const Buffer gf8 = download(f8), gfw = download(fw);
  const Buffer gq = download(dq), gw = download(dw);
  EXPECT_EQ(std::memcmp(gq.f32(), q.f32(), size_t(q.numel()) * 4), 0) << "q was written";
  EXPECT_EQ(std::memcmp(gw.f32(), w.f32(), size_t(w.numel()) * 4), 0) << "weights were written";
  DeviceBuffer dq2 = upload(q), dw2 = upload(w), p8(DType::U8, {n, IH, ID}),
               pw(DType::F32, {n, IH});
  ops::rope(dq2, 0, 64, dpos, dfreq, kRopeFactor, false);
  ops::scale(dw2, ws);
  ops::indexer_quantize_q(p8, pw, dq2, dw2);
  const Buffer gp8 = download(p8), gpw = download(pw);
  EXPECT_EQ(std::memcmp(gf8.ptr<uint8_t>(), gp8.ptr<uint8_t>(), size_t(gf8.numel())), 0)
      << "q8: fused differs from rope, scale, quantize";
  EXPECT_EQ(std::memcmp(gfw.f32(), gpw.f32(), size_t(gfw.numel()) * 4), 0)
      << "folded weights: fused differs from rope, scale, quantize";
  Buffer r8(DType::U8, {n, IH, ID}), rw(DType::F32, {n, IH});
  ops::indexer_q_prep(r8, rw, q, w, ws, 64, pos, freq, kRopeFactor);
  int64_t differ = 0, nonzero = 0;
  double worst = 0.0;
  for (int64_t r = 0; r < n * IH; ++r) {
    const double sg = gfw.f32()[r] / (double(w.f32()[r]) * ws),
                 sr = rw.f32()[r] / (double(w.f32()[r]) * ws);
    for (int64_t d = 0; d < ID; ++d) {
      const uint8_t a = gf8.ptr<uint8_t>()[r * ID + d], b8 = r8.ptr<uint8_t>()[r * ID + d];
      differ += a != b8;
      nonzero += (b8 & 0x7f) != 0;
      worst = std::max(worst, std::fabs(e4m3_to_f32(a) * sg - e4m3_to_f32(b8) * sr) / (448.0 * sr));
    }
  }
  EXPECT_LT(double(differ) / double(n * IH * ID), 0.02) << "q8 bytes against the CPU twin";
  EXPECT_LT(worst, 1.0 / 16.0) << "q8 values against the CPU twin";
  EXPECT_GT(nonzero, n * IH * ID / 2);
  std::printf("TWIN %-44s vs CPU: differing %.4f, worst %.3e of amax  %s\n",
              "indexer_q_prep [37,64,128] (fused = unfused)", double(differ) / double(n * IH * ID),
              worst, worst < 1.0 / 16.0 ? "ok" : "FAIL");
}

// The exact score of the FP8 path in double: Σ_h w8[t, h] · relu(scale · q8[t, h] · k_j), and the
// bound on its FP8 tensor-core rounding: Σ_h |w8| · scale · Σ_d |q8_d · k_jd|.
struct Fp8Exact {
  const Batch& b;
  const Buffer& q8;
  const Buffer& w8;
  const Buffer& cache;
  float scale;
  void operator()(int64_t t, int s, int64_t j, double& score, double& mag) const {
    const int64_t max_blocks = b.block_table.shape()[1];
    const int64_t row =
        int64_t(b.block_table.ptr<int32_t>()[s * max_blocks + j / 64]) * 64 + j % 64;
    const uint8_t* blk = cache.ptr<uint8_t>() + (row / 64) * 64 * (ID + 4);
    float ks;
    std::memcpy(&ks, blk + 64 * ID + 4 * (row % 64), 4);
    double k[ID];
    for (int64_t d = 0; d < ID; ++d) k[d] = double(e4m3_to_f32(blk[(row % 64) * ID + d])) * ks;
    score = 0.0;
    mag = 0.0;
    for (int64_t h = 0; h < IH; ++h) {
      double dot = 0.0, abs_dot = 0.0;
      const uint8_t* qh = q8.ptr<uint8_t>() + (t * IH + h) * ID;
      for (int64_t d = 0; d < ID; ++d) {
        const double v = double(e4m3_to_f32(qh[d])) * k[d];
        dot += v;
        abs_dot += std::fabs(v);
      }
      const double wh = w8.f32()[t * IH + h];
      score += wh * std::max(dot * scale, 0.0);
      mag += std::fabs(wh) * abs_dot * scale;
    }
  }
};

// The FP8 path end to end (indexer_quantize_q, then indexer_topk with U8 q on the FP8 cache) on
// the real shapes: a decode batch (one token a sequence, contexts to 16k), a prefill chunk (700
// new tokens over 3000 cached: groups of 4 tokens) and a mixed batch whose groups straddle
// sequences. On sm_90 the scores come from the tensor-core kernel; they are checked directly
// (every written entry against the exact score within the FP8 bound, the entries past each
// token's position left alone), then the top-k against the CPU twin as sets up to near-ties.
TEST(CudaOps, IndexerFp8QueryLogitsTopk) {
  OSPREY_REQUIRE_GPU();
  struct Case {
    const char* label;
    std::vector<int> ctx, n_new;
  };
  std::vector<Case> cases;
  {
    Case d{"decode B=64 ctx<=16384", {}, {}};
    for (int s = 0; s < 64; ++s) {
      static const int lens[] = {1, 2, 63, 64, 65, 127, 128, 129, 2047, 2048, 2049, 16384};
      d.ctx.push_back(s < 12 ? lens[s] : 3000 + 97 * s);
      d.n_new.push_back(1);
    }
    cases.push_back(d);
  }
  cases.push_back({"prefill chunk 700 over 3000", {3700}, {700}});
  cases.push_back(
      {"mixed: chunk + decodes, odd runs", {5, 2100, 130, 9000, 70}, {1, 3, 1, 517, 2}});
  for (const Case& c : cases) {
    Batch b = make_batch(c.ctx, c.n_new);
    const int64_t n = b.host.n_tokens;
    const float scale = 1.0f / std::sqrt(float(ID));
    Buffer cache = random_fp8_cache(b);
    Buffer q = random_q(n), w = rand_f32({n, IH}, -0.125f, 0.125f);
    Buffer q8(DType::U8, {n, IH, ID}), w8(DType::F32, {n, IH});
    ops::indexer_quantize_q(q8, w8, q, w);
    DeviceBuffer d_cache = upload(cache), d_q8 = upload(q8), d_w8 = upload(w8);

    const bool sm90 = ops::cuda::device_is_sm90();
    const int64_t ld = b.block_table.shape()[1] * 64;
    if (!sm90) std::printf("not an sm_90 device: the tensor-core logits kernel is not checked\n");
    if (sm90) {
      ASSERT_TRUE(ops::cuda::indexer_logits_sm90_supported(d_q8, d_w8, d_cache, b.dev));
      DeviceBuffer d_scores(DType::F32, {n, ld});
      cuda::fill_bytes(d_scores, 0xff);  // NaN: entries the kernel must not write stay NaN
      ops::cuda::indexer_logits_sm90(d_scores.view().f32(), ld, d_q8, d_w8, d_cache, b.dev, scale);
      cuda::synchronize();
      Buffer sc = cuda::to_host(d_scores);
      {  // The engine's metadata names each token's sequence (req_id_per_token): the same scores.
        Buffer req(DType::I32, {n});
        for (int s = 0; s < b.host.n_seqs; ++s)
          for (int32_t t = b.qsl.ptr<int32_t>()[s]; t < b.qsl.ptr<int32_t>()[s + 1]; ++t)
            req.ptr<int32_t>()[t] = s;
        DeviceBuffer d_req = cuda::to_device(req);
        AttentionMeta with_req = b.dev;
        with_req.req_id_per_token = d_req;
        DeviceBuffer d_sc2(DType::F32, {n, ld});
        cuda::fill_bytes(d_sc2, 0xff);
        ops::cuda::indexer_logits_sm90(d_sc2.view().f32(), ld, d_q8, d_w8, d_cache, with_req,
                                       scale);
        cuda::synchronize();
        Buffer sc2 = cuda::to_host(d_sc2);
        EXPECT_EQ(std::memcmp(sc.f32(), sc2.f32(), size_t(n * ld) * 4), 0)
            << c.label << ": req_id_per_token changed the scores";
      }
      Fp8Exact exact{b, q8, w8, cache, scale};
      int64_t checked = 0, bad = 0, unwritten = 0, overwritten = 0;
      double worst = 0.0;
      int s = 0;
      for (int64_t t = 0; t < n; ++t) {
        while (s + 1 < b.host.n_seqs && b.qsl.ptr<int32_t>()[s + 1] <= t) ++s;
        const int64_t p = b.positions.ptr<int32_t>()[t];
        for (int64_t j = 0; j < ld; ++j) {
          const float got = sc.f32()[t * ld + j];
          if (j > p) {
            overwritten += !std::isnan(got);
            continue;
          }
          if (std::isnan(got)) {
            ++unwritten;
            continue;
          }
          // every position of the first and last stages, a stride elsewhere
          if (j >= 128 && j + 128 <= p && j % 29 != 0) continue;
          double ref, mag;
          exact(t, s, j, ref, mag);
          const double err = std::fabs(double(got) - ref);
          worst = std::max(worst, err / (mag + 1e-30));
          bad += err > 2e-3 * mag + 1e-12;
          ++checked;
        }
      }
      EXPECT_EQ(unwritten, 0) << c.label;
      EXPECT_EQ(overwritten, 0) << c.label;
      EXPECT_EQ(bad, 0) << c.label;
      EXPECT_GT(checked, n);
      std::printf("TWIN %-44s logits checked %lld, off %lld, worst err/bound %.2e  %s\n", c.label,
                  static_cast<long long>(checked), static_cast<long long>(bad), worst,
                  unwritten || overwritten || bad ? "FAIL" : "ok");
    }

    Buffer ref(DType::I32, {n, kTopk});
    ops::indexer_topk(ref, q8, w8, cache, b.host, scale);
    DeviceBuffer d_topk(DType::I32, {n, kTopk});
    cuda::fill_bytes(d_topk, 0x7f);
    ops::indexer_topk(d_topk, d_q8, d_w8, d_cache, b.dev, scale);
    cuda::synchronize();
    Buffer got = cuda::to_host(d_topk);
    Fp8Exact exact{b, q8, w8, cache, scale};
    expect_same_topk_sets(
        b, ref, got,
        [&](int64_t t, int s, int64_t j) {
          double v, mag;
          exact(t, s, j, v, mag);
          return v;
        },
        c.label, 1e-3);
  }
}

}  // namespace
}  // namespace osprey
