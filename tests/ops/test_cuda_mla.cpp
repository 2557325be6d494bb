// CUDA MLA twins against the CPU twins on DeepSeek-V3.2 shapes: 128 heads, latent 512 + rope 64,
// nope 128, v 128, paged cache of 64-token blocks, contexts up to 16k, DSA top-2048 indices; the
// cache in F32, BF16 and DeepSeek's FP8 format (656 B/token, identical bytes from both twins).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "cuda_test_util.h"
#include "ops/cuda/mla/hooks.h"
#include "ops/mla.h"
#include "ops/rope.h"

namespace osprey {
namespace {
using namespace testing;

constexpr int64_t H = 128, kNope = 128, kRopeDim = 64, kV = 128, kLora = 512, kWidth = 576;
constexpr int kTopk = 2048;
constexpr float kScale = 0.3f;  // larger than 192^-0.5 so that the softmax is peaked

TEST(CudaOps, MlaAbsorbUnabsorb) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 19;
  Buffer kv_b = rand_f32({H * (kNope + kV), kLora}, -0.05f, 0.05f);
  round_bf16(kv_b);
  Buffer q = rand_f32({n, H, kNope + kRopeDim}), o_lat = rand_f32({n, H, kLora});
  Buffer q_abs(DType::F32, {n, H, kWidth}), out(DType::F32, {n, H, kV});
  ops::mla_absorb_q(q_abs, q, kv_b, int(kNope), int(kV));
  ops::mla_unabsorb_out(out, o_lat, kv_b, int(kNope));
  for (DType wdt : {DType::F32, DType::BF16}) {
    DeviceBuffer d_kvb = upload(kv_b, wdt), dq = upload(q), dl = upload(o_lat);
    DeviceBuffer d_qabs = poisoned(DType::F32, {n, H, kWidth}),
                 d_out = poisoned(DType::F32, {n, H, kV});
    ops::mla_absorb_q(d_qabs, dq, d_kvb, int(kNope), int(kV));
    ops::mla_unabsorb_out(d_out, dl, d_kvb, int(kNope));
    const double tol = wdt == DType::F32 ? 1e-5 : 1e-2;
    const std::string w = wdt == DType::F32 ? " kv_b F32" : " kv_b BF16";
    expect_close("mla_absorb_q [19,128,192]->[19,128,576]" + w, download(d_qabs), q_abs, tol);
    expect_close("mla_unabsorb_out [19,128,512]->[19,128,128]" + w, download(d_out), out, tol);
  }
}

// q's rope fused into the absorption (ops::mla_absorb_q_rope, the decode step's path): on the
// split kernel (BF16 kv_b, F32 q) q_abs equals, bit for bit, the unfused CUDA composition (rope in
// place, then mla_absorb_q) — interleaved (V3) and half-split pairs, positions to 16k, F32 and BF16
// q_abs — and q is left as given; against the CPU twin within the BF16 GEMM's tolerance, the rope
// part within F32 rounding. An F32 kv_b takes the composition on CUDA too.
TEST(CudaOps, MlaAbsorbQRopeFusedEqualsRopeThenAbsorb) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 21;
  Buffer kv_b = rand_f32({H * (kNope + kV), kLora}, -0.05f, 0.05f);
  round_bf16(kv_b);
  Buffer q = rand_f32({n, H, kNope + kRopeDim}, -2.0f, 2.0f);
  Buffer pos(DType::I32, {n}), inv_freq(DType::F32, {kRopeDim / 2});
  for (int64_t t = 0; t < n; ++t) pos.ptr<int32_t>()[t] = int32_t((t * 7919) % 16384);
  for (int64_t i = 0; i < kRopeDim / 2; ++i)
    inv_freq.f32()[i] = std::pow(10000.0f, -2.0f * float(i) / float(kRopeDim));
  DeviceBuffer d_pos = upload(pos), d_freq = upload(inv_freq);
  const float factor = 1.25f;
  for (bool inter : {true, false})
    for (DType wdt : {DType::BF16, DType::F32})
      for (DType odt : {DType::F32, DType::BF16}) {
        if (wdt == DType::F32 && odt == DType::BF16) continue;  // (a BF16 q_abs needs a BF16 kv_b)
        const std::string label =
            strf("mla_absorb_q_rope [21,128,192] %s kv_b %s q_abs %s",
                 inter ? "interleaved" : "half-split", wdt == DType::BF16 ? "BF16" : "F32",
                 odt == DType::BF16 ? "BF16" : "F32");
        DeviceBuffer d_kvb = upload(kv_b, wdt), dq = upload(q), dq2 = upload(q);
        DeviceBuffer fused = poisoned(odt, {n, H, kWidth}), plain = poisoned(odt, {n, H, kWidth});
        ops::mla_absorb_q_rope(fused, dq, d_kvb, int(kNope), int(kV), d_pos, d_freq, factor, inter);
        ops::rope(dq2, int(kNope), int(kRopeDim), d_pos, d_freq, factor, inter);
        ops::mla_absorb_q(plain, dq2, d_kvb, int(kNope), int(kV));
        const Buffer gf = download(fused), gp = download(plain);
        EXPECT_EQ(std::memcmp(gf.f32(), gp.f32(), size_t(gf.numel()) * 4), 0)
            << label << ": fused differs from rope then absorb";
        if (wdt == DType::BF16) {  // the split kernel's path leaves q as given
          const Buffer gq = download(dq);
          EXPECT_EQ(std::memcmp(gq.f32(), q.f32(), size_t(q.numel()) * 4), 0) << label;
        }
        Buffer qc(DType::F32, {n, H, kNope + kRopeDim});
        std::memcpy(qc.f32(), q.f32(), size_t(q.numel()) * 4);
        Buffer ref(DType::F32, {n, H, kWidth});
        ops::mla_absorb_q_rope(ref, qc, kv_b, int(kNope), int(kV), pos, inv_freq, factor, inter);
        expect_close(label, gf, ref, odt == DType::BF16 ? 1e-2 : (wdt == DType::F32 ? 1e-5 : 1e-2));
        // The rope part alone: rotated (not q's own values) and within F32 (BF16) rounding.
        double worst = 0.0;
        int64_t moved = 0;
        for (int64_t r = 0; r < n * H; ++r)
          for (int64_t c = 0; c < kRopeDim; ++c) {
            const float g = gf.f32()[r * kWidth + kLora + c], e = ref.f32()[r * kWidth + kLora + c];
            worst = std::max(worst, double(std::fabs(g - e)) / (1.0 + std::fabs(e)));
            moved +=
                ref.f32()[r * kWidth + kLora + c] != q.f32()[r * (kNope + kRopeDim) + kNope + c];
          }
        EXPECT_LT(worst, odt == DType::BF16 ? 8e-3 : 2e-5) << label << " rope part";
        EXPECT_GT(moved, n * H * kRopeDim / 2) << label << ": the rope part was not rotated";
      }
}

// The model's dataflow on CUDA (model/deepseek.cpp): with a BF16 kv_b and F32 queries, absorb_q
// writes q's nope part as BF16 and its rope part into q_abs in one kernel (no conversion of q):
// its GEMM reads the bits a BF16 q gives (the nope part bit for bit as from a BF16 upload of q),
// and the rope part is q's F32 values exactly. And o_lat written BF16 by the attention unabsorbs
// bit for bit as an F32 o_lat of the same BF16 values.
TEST(CudaOps, MlaAbsorbQF32QueriesReadAsBf16) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 19;
  Buffer kv_b = rand_f32({H * (kNope + kV), kLora}, -0.05f, 0.05f);
  Buffer q = rand_f32({n, H, kNope + kRopeDim}), o_lat = rand_f32({n, H, kLora});
  round_bf16(o_lat);
  DeviceBuffer d_kvb = upload(kv_b, DType::BF16), dq = upload(q), dq16 = upload(q, DType::BF16);
  DeviceBuffer a = poisoned(DType::F32, {n, H, kWidth}), b = poisoned(DType::F32, {n, H, kWidth});
  ops::mla_absorb_q(a, dq, d_kvb, int(kNope), int(kV));
  ops::mla_absorb_q(b, dq16, d_kvb, int(kNope), int(kV));
  const Buffer ga = download(a), gb = download(b);
  int64_t nope_diff = 0, rope_diff = 0;
  for (int64_t r = 0; r < n * H; ++r) {
    for (int64_t c = 0; c < kLora; ++c)
      nope_diff += std::memcmp(ga.f32() + r * kWidth + c, gb.f32() + r * kWidth + c, 4) != 0;
    for (int64_t c = 0; c < kRopeDim; ++c)
      rope_diff += ga.f32()[r * kWidth + kLora + c] != q.f32()[r * (kNope + kRopeDim) + kNope + c];
  }
  EXPECT_EQ(nope_diff, 0) << "absorbed q_nope differs from the BF16 q's";
  EXPECT_EQ(rope_diff, 0) << "q_abs's rope part is not q's F32 rope part";
  DeviceBuffer l32 = upload(o_lat), l16 = upload(o_lat, DType::BF16);
  DeviceBuffer o1 = poisoned(DType::F32, {n, H, kV}), o2 = poisoned(DType::F32, {n, H, kV});
  ops::mla_unabsorb_out(o1, l32, d_kvb, int(kNope));
  ops::mla_unabsorb_out(o2, l16, d_kvb, int(kNope));
  const Buffer g1 = download(o1), g2 = download(o2);
  EXPECT_EQ(std::memcmp(g1.f32(), g2.f32(), size_t(n * H * kV) * 4), 0)
      << "unabsorb of a BF16 o_lat differs from its F32 copy's";
}

TEST(CudaOps, MlaCacheWriteGather) {
  OSPREY_REQUIRE_GPU();
  Batch b = make_batch({16384, 300, 1, 1000}, {2, 300, 1, 7});
  const int64_t n = b.host.n_tokens;
  for (DType cdt : {DType::F32, DType::BF16}) {
    Buffer cache = rand_f32({b.n_blocks, 64, kWidth}), latent = rand_f32({n, kLora}),
           k_pe = rand_f32({n, kRopeDim});
    if (cdt == DType::BF16) {
      round_bf16(cache);
      round_bf16(latent);
      round_bf16(k_pe);
    }
    DeviceBuffer d_cache = upload(cache, cdt), d_lat = upload(latent), d_pe = upload(k_pe);
    ops::mla_cache_write(cache, latent, k_pe, b.host);
    ops::mla_cache_write(d_cache, d_lat, d_pe, b.dev);
    const std::string c = cdt == DType::F32 ? " cache F32" : " cache BF16";
    expect_close("mla_cache_write" + c, download(d_cache), cache, 0.0);
    Buffer ref(DType::F32, {b.total_ctx, kWidth});
    ops::mla_cache_gather(ref, cache, b.host);
    DeviceBuffer d_out = poisoned(DType::F32, {b.total_ctx, kWidth});
    ops::mla_cache_gather(d_out, d_cache, b.dev);
    expect_close("mla_cache_gather [17685,576]" + c, download(d_out), ref, 0.0);
  }
}

void absorbed_case(bool sparse, DType dt) {
  Batch b = make_batch({16384, 4000, 777, 1, 2048}, {1, 1, 1, 1, 3});
  const int64_t n = b.host.n_tokens;
  Buffer cache = rand_f32({b.n_blocks, 64, kWidth}), q = rand_f32({n, H, kWidth});
  if (dt == DType::BF16) {
    round_bf16(cache);
    round_bf16(q);
  }
  Buffer topk = sparse ? random_topk(b, kTopk) : Buffer();
  Buffer ref(DType::F32, {n, H, kLora});
  ops::mla_attention_absorbed(ref, q, cache, b.host, sparse ? topk.view() : Tensor{}, kScale);
  DeviceBuffer d_cache = upload(cache, dt), dq = upload(q, dt), d_out = poisoned(dt, {n, H, kLora});
  DeviceBuffer d_topk = sparse ? cuda::to_device(topk) : DeviceBuffer();
  ops::mla_attention_absorbed(d_out, dq, d_cache, b.dev, sparse ? d_topk.view() : Tensor{}, kScale);
  expect_close(std::string("mla_attention_absorbed ") + (sparse ? "top-2048" : "dense") +
                   " ctx<=16384 " + (dt == DType::F32 ? "F32" : "BF16"),
               download(d_out), ref, dt == DType::F32 ? 1e-5 : 1e-2);
}

TEST(CudaOps, MlaAttentionAbsorbedDense) {
  OSPREY_REQUIRE_GPU();
  absorbed_case(false, DType::F32);
  absorbed_case(false, DType::BF16);
}

TEST(CudaOps, MlaAttentionAbsorbedSparse) {
  OSPREY_REQUIRE_GPU();
  absorbed_case(true, DType::F32);
  absorbed_case(true, DType::BF16);
}

// The FP8 latent cache (U8 [n_blocks, 64, kv_lora + 4·kv_lora/128 + 2·rope], ops/mla.h): the CUDA
// twin must write the CPU twin's bytes exactly (same tile amax, amax/448 scale, RNE e4m3, RNE bf16
// rope) and read them the same way. Every slot first holds a quantized random row (tiles of varied
// magnitude), so reads of rows this step did not write are checked too.

// A random latent [n, kv_lora] whose 128-value tiles differ in magnitude (×0.5 .. ×3.5, and one
// tile in 11 all zero: the FLT_MIN scale floor), and k_pe [n, rope].
void fp8_inputs(Buffer& latent, Buffer& k_pe, int64_t n, int64_t lora, int64_t rope) {
  latent = rand_f32({n, lora});
  k_pe = rand_f32({n, rope}, -2.0f, 2.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < lora; ++c) {
      const int64_t tile = r * (lora / 128) + c / 128;
      latent.f32()[r * lora + c] *= tile % 11 == 3 ? 0.0f : float(1 + tile % 7) * 0.5f;
    }
}

// A CPU FP8 cache [n_blocks, 64, bytes] with every slot written.
Buffer filled_fp8_cache(int64_t n_blocks, int64_t lora, int64_t rope) {
  const int64_t n_slots = n_blocks * 64;
  Buffer latent, k_pe;
  fp8_inputs(latent, k_pe, n_slots, lora, rope);
  Buffer slots(DType::I64, {n_slots});
  for (int64_t r = 0; r < n_slots; ++r) slots.ptr<int64_t>()[r] = r;
  AttentionMeta fill{1, int(n_slots), 64, {}, {}, {}, {}, slots, {}};
  Buffer cache(DType::U8, {n_blocks, 64, ops::mla_fp8_token_bytes(lora, rope)});
  ops::mla_cache_write(cache, latent, k_pe, fill);
  return cache;
}

// Bytes that differ between the device cache and the host one; prints a TWIN line.
int64_t expect_same_bytes(const std::string& name, const Tensor& dev, const Buffer& host) {
  cuda::synchronize();
  Buffer got = cuda::to_host(dev);
  int64_t bad = 0;
  for (int64_t i = 0; i < host.numel(); ++i) bad += got.ptr<uint8_t>()[i] != host.ptr<uint8_t>()[i];
  std::printf("TWIN %-44s differing bytes %lld of %lld  %s\n", name.c_str(),
              static_cast<long long>(bad), static_cast<long long>(host.numel()),
              bad ? "FAIL" : "ok");
  EXPECT_EQ(bad, 0) << name << ": FP8 cache bytes differ between the twins";
  return bad;
}

void fp8_write_gather_case(int64_t lora, int64_t rope, const std::vector<int>& ctx,
                           const std::vector<int>& n_new) {
  Batch b = make_batch(ctx, n_new);
  const int64_t n = b.host.n_tokens, width = lora + rope;
  const std::string shape =
      strf("[%lld+%lld]", static_cast<long long>(lora), static_cast<long long>(rope));
  for (DType in : {DType::F32, DType::BF16}) {
    Buffer cache = filled_fp8_cache(b.n_blocks, lora, rope);
    Buffer latent, k_pe;
    fp8_inputs(latent, k_pe, n, lora, rope);
    if (in == DType::BF16) {  // the same values reach both twins
      round_bf16(latent);
      round_bf16(k_pe);
    }
    DeviceBuffer d_cache = upload(cache), d_lat = upload(latent, in), d_pe = upload(k_pe, in);
    ops::mla_cache_write(cache, latent, k_pe, b.host);
    ops::mla_cache_write(d_cache, d_lat, d_pe, b.dev);
    expect_same_bytes(
        strf("mla_cache_write FP8 %s in %s", shape.c_str(), in == DType::F32 ? "F32" : "BF16"),
        d_cache, cache);
    if (in == DType::BF16) continue;
    Buffer ref(DType::F32, {b.total_ctx, width});
    ops::mla_cache_gather(ref, cache, b.host);
    DeviceBuffer d_out = poisoned(DType::F32, {b.total_ctx, width});
    ops::mla_cache_gather(d_out, d_cache, b.dev);
    expect_close(strf("mla_cache_gather FP8 %s ->F32 [%lld]", shape.c_str(),
                      static_cast<long long>(b.total_ctx)),
                 download(d_out), ref, 0.0);
  }
}

TEST(CudaOps, MlaFp8CacheWriteGather) {
  OSPREY_REQUIRE_GPU();
  fp8_write_gather_case(kLora, kRopeDim, {16384, 300, 1, 1000}, {2, 300, 1, 7});
  fp8_write_gather_case(128, 16, {700, 65, 3}, {1, 65, 2});  // the test models' latent
}

// mla_kv_write (kv_a's split + kv_a_norm + k_pe's rope + the cache write in one kernel) against
// its CPU twin, the composition of the CPU ops, on the written cache read back (gathered, FP8
// dequantised): F32, BF16 and FP8 caches, V3.2's 512 + 64 and the test models' 128 + 16, both
// rope layouts, F32 and BF16 norm weights. F32 cache: the same F32 arithmetic up to the order of
// the sum of squares (~1e-7). BF16 cache: the CPU reference is an F32 cache (the twin keeps F32),
// so the difference is the BF16 rounding itself, ~1.1e-3 relative RMS. FP8: both write e4m3 from
// the same F32 values; a value on a rounding boundary may round the other way (one e4m3 step,
// 6e-2 relative, in a few of ~10^5 values). A wrong norm, rope angle or layout is O(1).
void kv_write_case(int64_t lora, int64_t rope, DType cache_dt, DType w_dt, bool interleaved) {
  Batch b = make_batch({3000, 300, 1, 70}, {2, 300, 1, 7});
  const int64_t n = b.host.n_tokens, width = lora + rope;
  Buffer kv = rand_f32({n, width}, -3.0f, 3.0f), w = rand_f32({lora}, 0.5f, 1.5f);
  if (w_dt == DType::BF16) round_bf16(w);
  Buffer inv_freq(DType::F32, {rope / 2});
  for (int64_t i = 0; i < rope / 2; ++i)
    inv_freq.f32()[i] = std::pow(10000.0f, -2.0f * float(i) / float(rope));
  const float eps = 1e-6f, factor = 1.25f;
  Buffer cache = cache_dt == DType::U8 ? filled_fp8_cache(b.n_blocks, lora, rope)
                                       : rand_f32({b.n_blocks, 64, width});
  DeviceBuffer d_cache = cache_dt == DType::U8 ? upload(cache) : upload(cache, cache_dt);
  if (cache_dt == DType::BF16) round_bf16(cache);
  ops::mla_kv_write(cache, kv, w, eps, inv_freq, factor, interleaved, b.host);
  DeviceBuffer dkv = upload(kv), dw = upload(w, w_dt), dfreq = upload(inv_freq);
  ops::mla_kv_write(d_cache, dkv, dw, eps, dfreq, factor, interleaved, b.dev);
  Buffer ref(DType::F32, {b.total_ctx, width});
  ops::mla_cache_gather(ref, cache, b.host);
  DeviceBuffer d_out = poisoned(DType::F32, {b.total_ctx, width});
  ops::mla_cache_gather(d_out, d_cache, b.dev);
  const double tol = cache_dt == DType::F32 ? 1e-6 : cache_dt == DType::BF16 ? 5e-3 : 1e-2;
  expect_close(strf("mla_kv_write [%lld+%lld] cache %s w %s %s", static_cast<long long>(lora),
                    static_cast<long long>(rope), std::string(dtype_name(cache_dt)).c_str(),
                    std::string(dtype_name(w_dt)).c_str(), interleaved ? "interleaved" : "half"),
               download(d_out), ref, tol);
}

TEST(CudaOps, MlaKvWriteFusedMatchesTheComposition) {
  OSPREY_REQUIRE_GPU();
  for (DType cdt : {DType::F32, DType::BF16, DType::U8}) {
    kv_write_case(kLora, kRopeDim, cdt, DType::F32, true);
    kv_write_case(128, 16, cdt, DType::BF16, cdt != DType::BF16);
  }
}

// Absorbed attention over an FP8 cache, GPU vs the CPU twin reading the same bytes. lora + rope:
// 512 + 64 with H = 128 takes the split-KV decode kernel; 128 + 16 with 4 heads the generic one.
void absorbed_fp8_case(bool sparse, DType dt, int64_t lora, int64_t rope, int64_t heads,
                       const std::vector<int>& ctx, const std::vector<int>& n_new, int topk_k) {
  Batch b = make_batch(ctx, n_new);
  const int64_t n = b.host.n_tokens, width = lora + rope;
  Buffer cache = filled_fp8_cache(b.n_blocks, lora, rope), q = rand_f32({n, heads, width});
  if (dt == DType::BF16) round_bf16(q);
  Buffer topk = sparse ? random_topk(b, topk_k) : Buffer();
  Buffer ref(DType::F32, {n, heads, lora});
  ops::mla_attention_absorbed(ref, q, cache, b.host, sparse ? topk.view() : Tensor{}, kScale);
  DeviceBuffer d_cache = upload(cache), dq = upload(q, dt), d_out = poisoned(dt, {n, heads, lora});
  DeviceBuffer d_topk = sparse ? cuda::to_device(topk) : DeviceBuffer();
  // F32 queries check the CUDA-core kernel at F32 precision (the sm90 tensor-core kernel, which
  // rounds q and the dequantised rows to BF16, is covered by test_cuda_mla_sm90).
  const bool was = ops::cuda::set_mla_sm90_enabled(dt != DType::F32);
  ops::mla_attention_absorbed(d_out, dq, d_cache, b.dev, sparse ? d_topk.view() : Tensor{}, kScale);
  ops::cuda::set_mla_sm90_enabled(was);
  int max_ctx = 0;
  for (int c : ctx) max_ctx = std::max(max_ctx, c);
  const std::string attended = sparse ? strf("top-%d", topk_k) : std::string("dense");
  expect_close(strf("mla_attention_absorbed FP8 [%lld+%lld] %s ctx<=%d %s",
                    static_cast<long long>(lora), static_cast<long long>(rope), attended.c_str(),
                    max_ctx, dt == DType::F32 ? "F32" : "BF16"),
               download(d_out), ref, dt == DType::F32 ? 1e-5 : 1e-2);
}

// The model writes o_lat in BF16 on CUDA (the unabsorb GEMM's dtype): the attention's BF16 output
// must be its F32 output rounded to nearest, bit for bit (the rounding the unabsorb's conversion
// made, moved into the attention kernel), on V3.2's shapes (128 heads, 512 + 64) with the BF16 and
// the FP8 cache, dense and top-2048, F32 queries (q_abs is F32 in the model).
TEST(CudaOps, MlaAttentionAbsorbedBf16OutIsTheRoundedF32Out) {
  OSPREY_REQUIRE_GPU();
  Batch b = make_batch({16384, 4000, 777, 1, 2048}, {1, 1, 1, 1, 3});
  const int64_t n = b.host.n_tokens;
  for (bool fp8 : {false, true})
    for (bool sparse : {false, true}) {
      Buffer cache =
          fp8 ? filled_fp8_cache(b.n_blocks, kLora, kRopeDim) : rand_f32({b.n_blocks, 64, kWidth});
      const Buffer q = rand_f32({n, H, kWidth});
      DeviceBuffer d_cache = fp8 ? upload(cache) : upload(cache, DType::BF16), dq = upload(q);
      const Buffer topk = sparse ? random_topk(b, kTopk) : Buffer();
      DeviceBuffer d_topk = sparse ? cuda::to_device(topk) : DeviceBuffer();
      DeviceBuffer o32 = poisoned(DType::F32, {n, H, kLora}),
                   o16 = poisoned(DType::BF16, {n, H, kLora});
      const Tensor tk = sparse ? d_topk.view() : Tensor{};
      ops::mla_attention_absorbed(o32, dq, d_cache, b.dev, tk, kScale);
      ops::mla_attention_absorbed(o16, dq, d_cache, b.dev, tk, kScale);
      const Buffer g32 = download(o32), g16 = download(o16);
      int64_t diff = 0;
      for (int64_t i = 0; i < n * H * kLora; ++i)
        diff += g16.f32()[i] != bf16_to_f32(f32_to_bf16(g32.f32()[i]));
      EXPECT_EQ(diff, 0) << (fp8 ? "FP8" : "BF16") << " cache, " << (sparse ? "top-2048" : "dense")
                         << ": BF16 out is not the rounded F32 out";
    }
}

TEST(CudaOps, MlaFp8AttentionAbsorbedDense) {
  OSPREY_REQUIRE_GPU();
  const std::vector<int> ctx = {16384, 4000, 777, 1, 2048}, n_new = {1, 1, 1, 1, 3};
  absorbed_fp8_case(false, DType::F32, kLora, kRopeDim, H, ctx, n_new, 0);
  absorbed_fp8_case(false, DType::BF16, kLora, kRopeDim, H, ctx, n_new, 0);
  absorbed_fp8_case(false, DType::F32, 128, 16, 4, {300, 70, 5}, {1, 2, 5}, 0);
}

TEST(CudaOps, MlaFp8AttentionAbsorbedSparse) {
  OSPREY_REQUIRE_GPU();
  const std::vector<int> ctx = {16384, 4000, 777, 1, 2048}, n_new = {1, 1, 1, 1, 3};
  absorbed_fp8_case(true, DType::F32, kLora, kRopeDim, H, ctx, n_new, kTopk);
  absorbed_fp8_case(true, DType::BF16, kLora, kRopeDim, H, ctx, n_new, kTopk);
  absorbed_fp8_case(true, DType::F32, 128, 16, 4, {300, 70, 5}, {1, 2, 5}, 32);
}

void expanded_case(bool sparse) {
  Batch b = make_batch({2560, 200}, {8, 200});
  const int64_t n = b.host.n_tokens, L = b.total_ctx;
  Buffer q = rand_f32({n, H, kNope + kRopeDim}), k = rand_f32({L, H, kNope + kRopeDim}),
         v = rand_f32({L, H, kV});
  Buffer topk = sparse ? random_topk(b, kTopk) : Buffer();
  Buffer ref(DType::F32, {n, H, kV});
  ops::mla_attention_expanded(ref, q, k, v, b.host, sparse ? topk.view() : Tensor{}, kScale);
  DeviceBuffer dq = upload(q), dk = upload(k), dv = upload(v),
               d_out = poisoned(DType::F32, {n, H, kV});
  DeviceBuffer d_topk = sparse ? cuda::to_device(topk) : DeviceBuffer();
  ops::mla_attention_expanded(d_out, dq, dk, dv, b.dev, sparse ? d_topk.view() : Tensor{}, kScale);
  expect_close(std::string("mla_attention_expanded ") + (sparse ? "top-2048" : "causal") +
                   " ctx 2560+200 F32",
               download(d_out), ref, 1e-5);
}

TEST(CudaOps, MlaAttentionExpandedCausal) {
  OSPREY_REQUIRE_GPU();
  expanded_case(false);
}

TEST(CudaOps, MlaAttentionExpandedSparse) {
  OSPREY_REQUIRE_GPU();
  expanded_case(true);
}

}  // namespace
}  // namespace osprey
