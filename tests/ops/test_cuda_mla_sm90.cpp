// The sm_90a tensor-core absorbed MLA kernel (ops/cuda/mla/decode_sm90.cu) against the CPU twin on
// DeepSeek-V3.2's shapes: 128 heads (and 64, 16: per-GPU head counts under TP), latent 512 +
// rope 64, BF16 and FP8 (656 B/token) caches, top-2048 sparse with −1 padding and repeated
// indices, dense contexts across block boundaries up to 64k, several query tokens per sequence,
// ragged batches; the lse output; and the split-KV plan cache (a repeated batch fingerprint builds
// no plan, a changed one does).
#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <string>

#include "cuda_test_util.h"
#include "ops/cuda/mla/hooks.h"
#include "ops/mla.h"

namespace osprey {
namespace {
using namespace testing;

constexpr int64_t kLora = 512, kRope = 64, kWidth = 576;
constexpr float kScale = 0.3f;  // larger than 192^-0.5 so that the softmax is peaked

// A cache with every slot holding a random row: BF16 values (as F32 for the CPU twin) or the FP8
// format written by the CPU twin.
Buffer random_cache(int64_t n_blocks, bool fp8) {
  const int64_t n_slots = n_blocks * 64;
  Buffer latent = rand_f32({n_slots, kLora}), k_pe = rand_f32({n_slots, kRope}, -2.0f, 2.0f);
  if (!fp8) {
    Buffer c(DType::F32, {n_blocks, 64, kWidth});
    for (int64_t r = 0; r < n_slots; ++r) {
      std::copy_n(latent.f32() + r * kLora, kLora, c.f32() + r * kWidth);
      std::copy_n(k_pe.f32() + r * kRope, kRope, c.f32() + r * kWidth + kLora);
    }
    round_bf16(c);
    return c;
  }
  Buffer slots(DType::I64, {n_slots});
  for (int64_t r = 0; r < n_slots; ++r) slots.ptr<int64_t>()[r] = r;
  AttentionMeta fill{1, int(n_slots), 64, {}, {}, {}, {}, slots, {}};
  Buffer cache(DType::U8, {n_blocks, 64, ops::mla_fp8_token_bytes(kLora, kRope)});
  ops::mla_cache_write(cache, latent, k_pe, fill);
  return cache;
}

struct Case {
  std::vector<int> ctx, n_new;
  int64_t heads = 128;
  int topk = 2048;  // 0 = dense
  bool fp8 = false;
  bool repeats = false;
  DType q_dt = DType::BF16, out_dt = DType::BF16;
};

void run_case(const Case& c) {
  Batch b = make_batch(c.ctx, c.n_new);
  const int64_t n = b.host.n_tokens, H = c.heads;
  const bool sparse = c.topk > 0;
  Buffer cache = random_cache(b.n_blocks, c.fp8), q = rand_f32({n, H, kWidth});
  round_bf16(q);
  Buffer topk = sparse ? random_topk(b, c.topk, c.repeats) : Buffer();
  Buffer ref(DType::F32, {n, H, kLora}), ref_lse(DType::F32, {n, H});
  ops::mla_attention_absorbed(ref, q, cache, b.host, sparse ? topk.view() : Tensor{}, kScale,
                              ref_lse);
  DeviceBuffer d_cache = c.fp8 ? upload(cache) : upload(cache, DType::BF16), dq = upload(q, c.q_dt),
               d_out = poisoned(c.out_dt, {n, H, kLora}), d_lse = poisoned(DType::F32, {n, H});
  DeviceBuffer d_topk = sparse ? cuda::to_device(topk) : DeviceBuffer();
  const int64_t calls = ops::cuda::mla_sm90_calls();
  ops::mla_attention_absorbed(d_out, dq, d_cache, b.dev, sparse ? d_topk.view() : Tensor{}, kScale,
                              d_lse);
  EXPECT_EQ(ops::cuda::mla_sm90_calls(), calls + 1) << "the call did not take the sm90 kernel";
  int max_ctx = 0;
  for (int x : c.ctx) max_ctx = std::max(max_ctx, x);
  const std::string name =
      strf("sm90 %s %s H%lld n%lld ctx<=%d%s q%s out%s", sparse ? "top-2048" : "dense",
           c.fp8 ? "FP8" : "BF16", static_cast<long long>(H), static_cast<long long>(n), max_ctx,
           c.repeats ? " rep" : "", c.q_dt == DType::F32 ? "F32" : "BF16",
           c.out_dt == DType::F32 ? "F32" : "BF16");
  // BF16 operands (P rounded to BF16 too): ~3e-3 measured class; the output rounding adds ~2e-3.
  expect_close(name, download(d_out), ref, 1e-2);
  // lse: exact up to F32 rounding on a BF16 cache (~2e-7); an FP8 cache's rows are dequantised to
  // BF16 in the kernel (the CPU twin keeps the F32 product), ~2e-4 measured.
  expect_close(name + " lse", download(d_lse), ref_lse, c.fp8 ? 1e-3 : 1e-5);
}

TEST(CudaMlaSm90, SparseDecodeBf16) {
  OSPREY_REQUIRE_GPU();
  run_case({{5000, 4000, 2048, 2047, 300, 1, 6000, 9000}, {1, 1, 1, 1, 1, 1, 1, 1}});
}

TEST(CudaMlaSm90, SparseDecodeFp8) {
  OSPREY_REQUIRE_GPU();
  Case c{{5000, 4000, 2048, 2047, 300, 1, 6000, 9000}, {1, 1, 1, 1, 1, 1, 1, 1}};
  c.fp8 = true;
  run_case(c);
}

TEST(CudaMlaSm90, SparseRepeatedIndicesAndSq2) {
  OSPREY_REQUIRE_GPU();
  Case c{{5000, 3000, 70, 2100}, {2, 2, 2, 2}};  // s_q = 2 (MTP verify shape)
  c.repeats = true;
  run_case(c);
  c.fp8 = true;
  run_case(c);
}

TEST(CudaMlaSm90, SparsePrefillChunk) {
  OSPREY_REQUIRE_GPU();
  // A 300-token chunk at context 2500 and a fresh 40-token prompt: the absorbed sparse prefill.
  Case c{{2500, 40}, {300, 40}};
  c.fp8 = true;
  c.q_dt = DType::F32;
  c.out_dt = DType::F32;
  run_case(c);
}

TEST(CudaMlaSm90, DenseDecodeBlockBoundariesTo64k) {
  OSPREY_REQUIRE_GPU();
  Case c{{65536, 16384, 4097, 4096, 64, 65, 1, 5000}, {1, 1, 1, 1, 1, 1, 1, 2}};
  c.topk = 0;
  run_case(c);
  c.fp8 = true;
  c.q_dt = DType::F32;
  run_case(c);
}

TEST(CudaMlaSm90, HeadCountsUnderTensorParallel) {
  OSPREY_REQUIRE_GPU();
  for (int64_t heads : {64, 16}) {
    Case c{{5000, 700, 3}, {1, 2, 1}};
    c.heads = heads;
    c.fp8 = heads == 16;
    run_case(c);
  }
}

// The plan kernel runs once per fingerprint: the same fingerprint again (the next layer of the
// step, or a decode step whose clamped lengths repeat) builds nothing; a changed one builds.
TEST(CudaMlaSm90, PlanBuiltOncePerFingerprint) {
  OSPREY_REQUIRE_GPU();
  Batch b = make_batch({5000, 3000, 2500}, {1, 1, 1});
  Buffer cache = random_cache(b.n_blocks, true), q = rand_f32({3, 128, kWidth});
  Buffer topk = random_topk(b, 2048, false);
  DeviceBuffer d_cache = upload(cache), dq = upload(q, DType::BF16),
               d_out = poisoned(DType::BF16, {3, 128, kLora}), d_topk = cuda::to_device(topk);
  AttentionMeta m = b.dev;
  m.fingerprint = attention_fingerprint(b.host, 2048);
  const int64_t before = ops::cuda::mla_plan_builds();
  for (int layer = 0; layer < 5; ++layer)
    ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 1) << "five layers, one fingerprint";
  // The next decode step: every context grew by one but all stay past top-2048, so the clamped
  // lengths (and the fingerprint) repeat.
  Buffer next_pos(DType::I32, {3});
  for (int t = 0; t < 3; ++t) next_pos.ptr<int32_t>()[t] = b.positions.ptr<int32_t>()[t] + 1;
  AttentionMeta next_host = b.host;
  next_host.positions = next_pos;
  EXPECT_EQ(attention_fingerprint(next_host, 2048), m.fingerprint);
  EXPECT_NE(attention_fingerprint(next_host, INT32_MAX), attention_fingerprint(b.host, INT32_MAX))
      << "dense lengths grew: the dense fingerprint must change";
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 1);
  // A changed fingerprint (another batch shape) rebuilds, once.
  m.fingerprint ^= 0x9e3779b97f4a7c15ull;
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 2);
  // Unknown (0): rebuilt every call.
  m.fingerprint = 0;
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  ops::mla_attention_absorbed(d_out, dq, d_cache, m, d_topk, kScale);
  EXPECT_EQ(ops::cuda::mla_plan_builds(), before + 4);
  // And the result with a cached plan is still right.
  Buffer ref(DType::F32, {3, 128, kLora});
  ops::mla_attention_absorbed(ref, q, cache, b.host, topk, kScale);
  expect_close("sm90 top-2048 FP8 H128 n3 (cached plan)", download(d_out), ref, 1e-2);
}

}  // namespace
}  // namespace osprey
