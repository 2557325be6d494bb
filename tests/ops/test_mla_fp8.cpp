// The FP8 latent cache format of ops/mla.h on the CPU twin (the reference the CUDA twin must match
// byte for byte): the byte layout and scale rule, the round-trip error bound of e4m3, and that the
// absorbed attention reading the FP8 cache computes exactly what it computes on an F32 cache
// holding the dequantized rows. On DeepSeek's shape (512 + 64, 656 B/token) and the test models'
// (128 + 16, 164 B/token).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "ops/mla.h"

namespace osprey {
namespace {

constexpr int kBS = 64;

struct Dims {
  int64_t kv_lora, rope;
  int64_t width() const { return kv_lora + rope; }
  int64_t bytes() const { return ops::mla_fp8_token_bytes(kv_lora, rope); }
};

TEST(MlaFp8, TokenBytesAndRopeSplit) {
  EXPECT_EQ(ops::mla_fp8_token_bytes(512, 64), 656);  // FlashMLA / vLLM fp8_ds_mla
  EXPECT_EQ(ops::mla_fp8_token_bytes(128, 16), 164);
  EXPECT_EQ(ops::mla_fp8_rope_dim(656, 576), 64);
  EXPECT_EQ(ops::mla_fp8_rope_dim(164, 144), 16);
  EXPECT_EQ(ops::mla_fp8_rope_dim(657, 576), -1);
  EXPECT_EQ(ops::mla_fp8_rope_dim(1152, 576), -1);
  EXPECT_TRUE(ops::mla_fp8_supported(512, 64));
  EXPECT_FALSE(ops::mla_fp8_supported(96, 64));   // kv_lora not a multiple of 128
  EXPECT_FALSE(ops::mla_fp8_supported(512, 63));  // odd rope: misaligned scales of later tokens
  // The scale is amax / 448 itself, not a power of two; zero tiles take the FLT_MIN floor.
  EXPECT_EQ(ops::mla_fp8_scale(3.0f), 3.0f / 448.0f);
  EXPECT_EQ(ops::mla_fp8_scale(0.0f), FLT_MIN);
}

// One sequence over every slot of an n_blocks cache: meta for writing rows 0..n-1 (slot = row)
// and for gathering them back in order.
struct WholeCache {
  Buffer qsl{DType::I32, {2}}, seq_lens{DType::I32, {1}}, positions, block_table, slots;
  AttentionMeta meta;
  WholeCache(int64_t n_blocks, int n_tokens) {
    positions = Buffer(DType::I32, {n_tokens});
    block_table = Buffer(DType::I32, {1, n_blocks});
    slots = Buffer(DType::I64, {n_tokens});
    qsl.ptr<int32_t>()[0] = 0;
    qsl.ptr<int32_t>()[1] = n_tokens;
    seq_lens.ptr<int32_t>()[0] = n_tokens;
    for (int64_t b = 0; b < n_blocks; ++b) block_table.ptr<int32_t>()[b] = int32_t(b);
    for (int t = 0; t < n_tokens; ++t) {
      positions.ptr<int32_t>()[t] = t;
      slots.ptr<int64_t>()[t] = t;
    }
    meta = AttentionMeta{1, n_tokens, kBS, qsl, seq_lens, positions, block_table, slots, {}};
  }
};

class MlaFp8Layout : public ::testing::TestWithParam<Dims> {};

// Written bytes: e4m3_rne(x / s) per value, s = mla_fp8_scale(tile amax) at kv_lora + 4·tile,
// k_pe as RNE bf16 after the scales; other slots untouched. Read back (mla_cache_gather): each
// latent value within half an e4m3 step (≤ |x|/16, or s·2^-10 among the subnormals, hence ≤ the
// tile amax/16), the rope part exactly its bf16 rounding.
TEST_P(MlaFp8Layout, CacheWriteGatherRoundTrip) {
  const Dims d = GetParam();
  const int64_t n_blocks = 3, n_tiles = d.kv_lora / 128, B = d.bytes();
  const std::vector<int64_t> slot = {5, 64 + 7, 127, 128, 191};
  const int n = int(slot.size());
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Buffer latent(DType::F32, {n, d.kv_lora}), k_pe(DType::F32, {n, d.rope});
  // Tiles of very different magnitude within a token; token 2's first tile all zero.
  const float mag[5] = {1.0f, 37.5f, 1.0f, 3e-6f, 1000.0f};
  for (int t = 0; t < n; ++t) {
    for (int64_t c = 0; c < d.kv_lora; ++c)
      latent.f32()[t * d.kv_lora + c] = mag[t] * float(1 + (c / 128) * 7) * u(rng);
    for (int64_t c = 0; c < d.rope; ++c) k_pe.f32()[t * d.rope + c] = 3.0f * u(rng);
  }
  std::fill_n(latent.f32() + 2 * d.kv_lora, 128, 0.0f);
  latent.f32()[4 * d.kv_lora + 3] = -7000.0f;  // an exact amax
  Buffer slots(DType::I64, {n}), empty(DType::I32, {1});
  for (int t = 0; t < n; ++t) slots.ptr<int64_t>()[t] = slot[size_t(t)];
  AttentionMeta m{1, n, kBS, empty, empty, empty, empty, slots, {}};
  Buffer cache(DType::U8, {n_blocks, kBS, B});
  std::memset(cache.ptr<uint8_t>(), 0xAA, size_t(cache.numel()));
  ops::mla_cache_write(cache, latent, k_pe, m);

  for (int t = 0; t < n; ++t) {
    const uint8_t* row = cache.ptr<uint8_t>() + slot[size_t(t)] * B;
    for (int64_t i = 0; i < n_tiles; ++i) {
      const float* x = latent.f32() + t * d.kv_lora + i * 128;
      float amax = 0.0f;
      for (int c = 0; c < 128; ++c) amax = std::max(amax, std::fabs(x[c]));
      float s;
      std::memcpy(&s, row + d.kv_lora + 4 * i, 4);
      ASSERT_EQ(s, amax > 0 ? amax / 448.0f : FLT_MIN) << "token " << t << " tile " << i;
      for (int c = 0; c < 128; ++c)
        ASSERT_EQ(row[i * 128 + c], f32_to_e4m3(x[c] / s)) << "token " << t << " c " << i * 128 + c;
    }
    for (int64_t c = 0; c < d.rope; ++c) {
      uint16_t b;
      std::memcpy(&b, row + d.kv_lora + 4 * n_tiles + 2 * c, 2);
      ASSERT_EQ(b, f32_to_bf16(k_pe.f32()[t * d.rope + c])) << "token " << t << " rope " << c;
    }
  }
  // Bytes of the other slots are left alone.
  std::vector<bool> written(size_t(cache.numel()), false);
  for (int64_t sl : slot) std::fill_n(written.begin() + sl * B, B, true);
  for (size_t i = 0; i < written.size(); ++i)
    if (!written[i]) {
      ASSERT_EQ(cache.ptr<uint8_t>()[i], 0xAA) << "byte " << i << " overwritten";
    }

  // Gather every slot of the cache as one sequence, then compare the written slots.
  WholeCache all(n_blocks, int(n_blocks * kBS));
  Buffer back(DType::F32, {n_blocks * kBS, d.width()});
  ops::mla_cache_gather(back, cache, all.meta);
  double worst_rel_amax = 0.0;
  for (int t = 0; t < n; ++t) {
    const float* got = back.f32() + slot[size_t(t)] * d.width();
    const uint8_t* row = cache.ptr<uint8_t>() + slot[size_t(t)] * B;
    for (int64_t c = 0; c < d.kv_lora; ++c) {
      const float x = latent.f32()[t * d.kv_lora + c];
      float s, amax = 0.0f;
      std::memcpy(&s, row + d.kv_lora + 4 * (c / 128), 4);
      for (int64_t k = c / 128 * 128; k < c / 128 * 128 + 128; ++k)
        amax = std::max(amax, std::fabs(latent.f32()[t * d.kv_lora + k]));
      const float err = std::fabs(got[c] - x);
      ASSERT_LE(err, std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f) * (1.0f + 1e-6f))
          << "token " << t << " c " << c << ": " << got[c] << " for " << x;
      ASSERT_LE(err, amax / 16.0f) << "token " << t << " c " << c;
      if (amax > 0) worst_rel_amax = std::max(worst_rel_amax, double(err / amax));
    }
    for (int64_t c = 0; c < d.rope; ++c)
      ASSERT_EQ(got[d.kv_lora + c], bf16_to_f32(f32_to_bf16(k_pe.f32()[t * d.rope + c])));
  }
  std::printf("FP8 latent %lld + %lld: worst |x - x^| / tile amax %.4f (bound 1/16 = 0.0625)\n",
              static_cast<long long>(d.kv_lora), static_cast<long long>(d.rope), worst_rel_amax);
  EXPECT_GT(worst_rel_amax, 0.0) << "nothing was rounded: is the cache quantizing?";
}

// Absorbed attention on the FP8 cache equals, bit for bit, the same attention on an F32 cache that
// holds the dequantized rows (the twin dequantizes as it reads, then runs the F32 arithmetic),
// dense and with top-k indices; and it stays close to the attention on the unquantized values.
TEST_P(MlaFp8Layout, AbsorbedAttentionReadsTheDequantizedRows) {
  const Dims d = GetParam();
  const int64_t H = 4, n_blocks = 4, L = n_blocks * kBS - 9, topk = 40;
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Buffer latent(DType::F32, {L, d.kv_lora}), k_pe(DType::F32, {L, d.rope});
  for (int64_t i = 0; i < latent.numel(); ++i) latent.f32()[i] = u(rng);
  for (int64_t i = 0; i < k_pe.numel(); ++i) k_pe.f32()[i] = u(rng);
  // The cache: physical blocks reversed, one sequence of L positions.
  Buffer fp8(DType::U8, {n_blocks, kBS, d.bytes()});
  Buffer exact(DType::F32, {n_blocks, kBS, d.width()});
  WholeCache w(n_blocks, int(L));
  for (int64_t b = 0; b < n_blocks; ++b)
    w.block_table.ptr<int32_t>()[b] = int32_t(n_blocks - 1 - b);
  for (int64_t j = 0; j < L; ++j)
    w.slots.ptr<int64_t>()[j] = int64_t(n_blocks - 1 - j / kBS) * kBS + j % kBS;
  ops::mla_cache_write(fp8, latent, k_pe, w.meta);
  ops::mla_cache_write(exact, latent, k_pe, w.meta);
  // An F32 cache with the dequantized rows at the same slots.
  Buffer rows(DType::F32, {L, d.width()});
  ops::mla_cache_gather(rows, fp8, w.meta);
  Buffer deq = Buffer::zeros(DType::F32, {n_blocks, kBS, d.width()});
  for (int64_t j = 0; j < L; ++j)
    std::copy_n(rows.f32() + j * d.width(), d.width(),
                deq.f32() + w.slots.ptr<int64_t>()[j] * d.width());

  // Queries: the last 3 positions (decode-like) and position 10.
  const std::vector<int32_t> qpos = {10, int32_t(L - 3), int32_t(L - 2), int32_t(L - 1)};
  const int nq = int(qpos.size());
  Buffer qsl(DType::I32, {2}), seq_lens(DType::I32, {1}), pos(DType::I32, {nq}),
      qslots(DType::I64, {nq});
  qsl.ptr<int32_t>()[0] = 0;
  qsl.ptr<int32_t>()[1] = nq;
  seq_lens.ptr<int32_t>()[0] = int32_t(L);
  for (int i = 0; i < nq; ++i) pos.ptr<int32_t>()[i] = qpos[size_t(i)];
  AttentionMeta m{1, nq, kBS, qsl, seq_lens, pos, w.block_table, qslots, {}};
  Buffer q(DType::F32, {nq, H, d.width()});
  for (int64_t i = 0; i < q.numel(); ++i) q.f32()[i] = 2.0f * u(rng);
  Buffer topk_idx(DType::I32, {nq, topk});
  for (int i = 0; i < nq; ++i) {
    std::vector<int32_t> js(size_t(qpos[size_t(i)]) + 1);
    std::iota(js.begin(), js.end(), 0);
    std::shuffle(js.begin(), js.end(), rng);
    for (int64_t k = 0; k < topk; ++k)
      topk_idx.ptr<int32_t>()[i * topk + k] = k < int64_t(js.size()) ? js[size_t(k)] : -1;
  }
  const float scale = 0.3f;
  for (bool sparse : {false, true}) {
    const Tensor tk = sparse ? topk_idx.view() : Tensor{};
    Buffer o8(DType::F32, {nq, H, d.kv_lora}), od(DType::F32, {nq, H, d.kv_lora}),
        oe(DType::F32, {nq, H, d.kv_lora});
    ops::mla_attention_absorbed(o8, q, fp8, m, tk, scale);
    ops::mla_attention_absorbed(od, q, deq, m, tk, scale);
    ops::mla_attention_absorbed(oe, q, exact, m, tk, scale);
    for (int64_t i = 0; i < o8.numel(); ++i)
      ASSERT_EQ(o8.f32()[i], od.f32()[i]) << (sparse ? "sparse " : "dense ") << "element " << i;
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < o8.numel(); ++i) {
      num += double(o8.f32()[i] - oe.f32()[i]) * double(o8.f32()[i] - oe.f32()[i]);
      den += double(oe.f32()[i]) * double(oe.f32()[i]);
    }
    const double rel = std::sqrt(num / den);
    std::printf("FP8 vs F32 cache, absorbed %s: rel L2 %.3e\n", sparse ? "top-k" : "dense", rel);
    // e4m3 keeps 3 mantissa bits: a value's relative rounding error is ~2^-3/√12 ≈ 3.6% RMS, and
    // the output (values and softmax weights both rounded) moves by that order, not more.
    EXPECT_LT(rel, 0.1);
    EXPECT_GT(rel, 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaFp8Layout, ::testing::Values(Dims{512, 64}, Dims{128, 16}),
                         [](const auto& info) {
                           return "lora" + std::to_string(info.param.kv_lora) + "_rope" +
                                  std::to_string(info.param.rope);
                         });

}  // namespace
}  // namespace osprey
