// CUDA MoE twins against the CPU twins: DeepSeek-V3.2 routing (256 experts, top-8, 8 groups, top-4
// groups, sigmoid + correction bias, noaux_tc, renormalised, × 2.5) and the V2-style variants; the
// experts (hidden 7168, expert FFN 2048, FP8 e4m3 with 128×128 block scales).
#include <gtest/gtest.h>

#include <set>

#include "cuda_test_util.h"
#include "ops/moe.h"

namespace osprey {
namespace {
using namespace testing;

void route_case(const RouterParams& p, DType logit_dt, const char* what) {
  const int64_t n = 200;
  Buffer logits = rand_f32({n, p.n_experts}, -4, 4), bias = rand_f32({p.n_experts}, -0.1f, 0.1f);
  round_bf16(logits);
  Buffer ids(DType::I32, {n, p.top_k}), wts(DType::F32, {n, p.top_k});
  ops::moe_route(ids, wts, logits, bias, p);
  DeviceBuffer dl = upload(logits, logit_dt), db = upload(bias);
  DeviceBuffer d_ids = poisoned(DType::I32, {n, p.top_k}), d_w = poisoned(DType::F32, {n, p.top_k});
  ops::moe_route(d_ids, d_w, dl, db, p);
  cuda::synchronize();
  Buffer g_ids = cuda::to_host(d_ids), g_w = download(d_w);
  int64_t set_diff = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::set<int32_t> a(ids.ptr<int32_t>() + t * p.top_k, ids.ptr<int32_t>() + (t + 1) * p.top_k);
    std::set<int32_t> b(g_ids.ptr<int32_t>() + t * p.top_k,
                        g_ids.ptr<int32_t>() + (t + 1) * p.top_k);
    if (a != b) ++set_diff;
  }
  // Random logits: no ties expected, so the chosen sets (and their order) must agree.
  EXPECT_EQ(set_diff, 0) << what;
  int64_t order_diff = 0;
  for (int64_t i = 0; i < n * p.top_k; ++i)
    order_diff += ids.ptr<int32_t>()[i] != g_ids.ptr<int32_t>()[i];
  EXPECT_EQ(order_diff, 0) << what;
  std::printf("TWIN %-44s token sets differing %lld\n", what, static_cast<long long>(set_diff));
  expect_close(std::string(what) + " weights", g_w, wts, 1e-5);
}

TEST(CudaOps, MoeRoute) {
  OSPREY_REQUIRE_GPU();
  RouterParams v3{256, 8, 8, 4, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.5f};
  route_case(v3, DType::F32, "moe_route V3 noaux_tc F32 logits");
  route_case(v3, DType::BF16, "moe_route V3 noaux_tc BF16 logits");
  RouterParams v2{160, 6, 8, 3, ScoringFunc::Softmax, TopkMethod::GroupLimitedGreedy, false, 16.0f};
  route_case(v2, DType::BF16, "moe_route V2 group_limited softmax");
  RouterParams lite{64, 6, 1, 1, ScoringFunc::Softmax, TopkMethod::Greedy, false, 1.0f};
  route_case(lite, DType::BF16, "moe_route V2-Lite greedy softmax");
}

void experts_case(bool block_scaled) {
  ops::cuda::set_fp8_block_scaled(block_scaled);
  const int64_t n = 5, D = 7168, I = 2048, E = 256, K = 8, n_sets = 6;
  // n_sets distinct expert weight sets; expert e uses set e % n_sets (keeps host memory modest).
  std::vector<Buffer> host_w;
  std::vector<DeviceBuffer> dev_w;
  std::vector<MlpWeights> hs(n_sets), ds(n_sets);
  auto fp8 = [&](int64_t out, int64_t in, LinearWeight& h, LinearWeight& d) {
    Buffer w(DType::F8_E4M3, {out, in});
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t i = 0; i < out * in; ++i) {
      int v;
      do v = byte(rng());
      while ((v & 0x7f) == 0x7f);
      w.ptr<uint8_t>()[i] = uint8_t(v);
    }
    Buffer sc = rand_f32({(out + 127) / 128, (in + 127) / 128}, 0.5e-3f, 2e-3f);
    dev_w.push_back(cuda::to_device(w));
    dev_w.push_back(cuda::to_device(sc));
    h = LinearWeight{w, sc};
    d = LinearWeight{dev_w[dev_w.size() - 2], dev_w.back()};
    host_w.push_back(std::move(w));
    host_w.push_back(std::move(sc));
  };
  dev_w.reserve(size_t(n_sets) * 6);
  for (int64_t i = 0; i < n_sets; ++i) {
    fp8(I, D, hs[size_t(i)].gate, ds[size_t(i)].gate);
    fp8(I, D, hs[size_t(i)].up, ds[size_t(i)].up);
    fp8(D, I, hs[size_t(i)].down, ds[size_t(i)].down);
  }
  std::vector<MlpWeights> h_experts, d_experts;
  for (int64_t e = 0; e < E; ++e) {
    h_experts.push_back(hs[size_t(e % n_sets)]);
    d_experts.push_back(ds[size_t(e % n_sets)]);
  }
  Buffer x = rand_f32({n, D}), ids(DType::I32, {n, K}), w = rand_f32({n, K}, 0.1f, 0.5f);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng());
    for (int64_t i = 0; i < K; ++i) ids.ptr<int32_t>()[t * K + i] = all[size_t(i)];
  }
  Buffer ref(DType::F32, {n, D});
  ops::moe_experts(ref, x, ids, w, h_experts);
  DeviceBuffer dx = upload(x, DType::BF16), d_ids = cuda::to_device(ids), dw = upload(w);
  DeviceBuffer out = poisoned(DType::F32, {n, D});
  ops::moe_experts(out, dx, d_ids, dw, d_experts);
  std::printf("FP8PATH moe_experts %s\n", ops::cuda::last_fp8_gemm_path());
  // Block-scaled: e4m3 activations into gate/up and down; fallback: BF16 activations.
  expect_close(std::string("moe_experts fp8 256x[2048x7168] top-8 ") +
                   (block_scaled ? "lt-blockscaled" : "dequant-bf16"),
               download(out), ref, block_scaled ? 8e-2 : 1.5e-2);
  ops::cuda::set_fp8_block_scaled(true);
}

TEST(CudaOps, MoeExpertsFp8) {
  OSPREY_REQUIRE_GPU();
  experts_case(true);
  experts_case(false);
}

}  // namespace
}  // namespace osprey
