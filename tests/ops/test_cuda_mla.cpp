// CUDA MLA twins against the CPU twins on DeepSeek-V3.2 shapes: 128 heads, latent 512 + rope 64,
// nope 128, v 128, paged cache of 64-token blocks, contexts up to 16k, DSA top-2048 indices.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "ops/mla.h"

namespace osprey {
namespace {
using namespace testing;

constexpr int64_t H = 128, kNope = 128, kRopeDim = 64, kV = 128, kLora = 512, kWidth = 576;
constexpr int kTopk = 2048;
constexpr float kScale = 0.3f;  // larger than 192^-0.5 so that the softmax is peaked

// Per token: k distinct attended positions ≤ p in random order, −1 padding when p + 1 < k.
Buffer random_topk(const Batch& b, int k) {
  Buffer t(DType::I32, {b.host.n_tokens, k});
  for (int i = 0; i < b.host.n_tokens; ++i) {
    const int p = b.positions.ptr<int32_t>()[i];
    std::vector<int32_t> js(size_t(p) + 1);
    std::iota(js.begin(), js.end(), 0);
    std::shuffle(js.begin(), js.end(), rng());
    for (int c = 0; c < k; ++c) t.ptr<int32_t>()[int64_t(i) * k + c] = c <= p ? js[size_t(c)] : -1;
  }
  return t;
}

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
