// Kernel budgets of a decode step's pieces, read from a captured CUDA graph (cuda_graph_util.h):
//   - the router: moe_route on BF16 logits is one kernel; the gate GEMM writing BF16 logits and
//     moe_route reading them (model/moe_router.h, as DeepseekModel::ffn calls it) launch the
//     GEMM's kernels + 1 and nothing else: no cast kernel, no memset, no copy;
//   - the FP8 linear on cuBLASLt's block-scaled path with a token count that needs padding (37):
//     no memset node (the quantisation kernel writes the padding itself);
//   - every cuBLASLt GEMM of a DeepSeek-V3.2 decode step at its real widths (lm_head, router gate,
//     the indexer's weights_proj; the FP8 projections past the swap-AB kernel's 32 tokens) at
//     1, 16 and 64 tokens: kernel nodes only (lt_matmul takes the first heuristic candidate that
//     holds no memset: the dsv32 decode graphs at B=1 and B=16 held a 4-byte one).
// Each graph is replayed and must give the eager call's result bit for bit, and the CPU twin's.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "cuda_graph_util.h"
#include "cuda_test_util.h"
#include "model/moe_router.h"
#include "ops/cuda/graph_hooks.h"
#include "ops/gemm.h"
#include "ops/moe.h"
#include "ops/tensor_ops.h"

namespace osprey {
namespace {
using namespace testing;

struct Router {
  RouterParams p;
  int64_t hidden;
  const char* what;
};
// V3.2 (and V3/R1), Kimi-K2, V2 and V2-Lite routers with their hidden widths.
const Router kRouters[] = {
    {{256, 8, 8, 4, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.5f}, 7168, "V3.2"},
    {{384, 8, 1, 1, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.827f}, 7168, "Kimi-K2"},
    {{160, 6, 8, 3, ScoringFunc::Softmax, TopkMethod::GroupLimitedGreedy, false, 16.0f},
     5120,
     "V2"},
    {{64, 6, 1, 1, ScoringFunc::Softmax, TopkMethod::Greedy, false, 1.0f}, 2048, "V2-Lite"}};

// A host BF16 tensor of uniform values in [lo, hi).
Buffer rand_bf16(Shape s, float lo, float hi) {
  Buffer f = rand_f32(s, lo, hi), b(DType::BF16, std::move(s));
  for (int64_t i = 0; i < f.numel(); ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(f.f32()[i]);
  return b;
}
Buffer widen(const Buffer& b16) {
  Buffer f(DType::F32, b16.shape());
  for (int64_t i = 0; i < b16.numel(); ++i) f.f32()[i] = bf16_to_f32(b16.ptr<uint16_t>()[i]);
  return f;
}
bool same_bytes(const Buffer& a, const Buffer& b) {
  return a.view().nbytes() == b.view().nbytes() &&
         std::memcmp(a.view().data, b.view().data, a.view().nbytes()) == 0;
}
int64_t tokens_with_other_sets(const Buffer& a, const Buffer& b, int64_t n, int64_t K) {
  int64_t d = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::set<int32_t> x(a.ptr<int32_t>() + t * K, a.ptr<int32_t>() + (t + 1) * K);
    std::set<int32_t> y(b.ptr<int32_t>() + t * K, b.ptr<int32_t>() + (t + 1) * K);
    d += x != y;
  }
  return d;
}

TEST(CudaGraph, MoeRouteIsOneKernel) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 64;
  for (const Router& r : kRouters) {
    for (DType dt : {DType::BF16, DType::F32}) {
      const RouterParams& p = r.p;
      SCOPED_TRACE(std::string(r.what) + (dt == DType::BF16 ? " BF16 logits" : " F32 logits"));
      Buffer logits = rand_bf16({n, p.n_experts}, -4, 4), bias = rand_f32({p.n_experts}, -.1f, .1f);
      Buffer host_logits = dt == DType::BF16 ? std::move(logits) : widen(logits);
      DeviceBuffer dl = cuda::to_device(host_logits), db = cuda::to_device(bias);
      DeviceBuffer ids = poisoned(DType::I32, {n, p.top_k}), w = poisoned(DType::F32, {n, p.top_k});
      ops::moe_route(ids, w, dl, db, p);
      const Buffer eager_ids = cuda::to_host(ids), eager_w = download(w);
      CapturedGraph g;
      g.capture([&] { ops::moe_route(ids, w, dl, db, p); });
      ASSERT_FALSE(HasFatalFailure());
      const GraphNodes nodes = g.nodes();
      std::printf("GRAPH moe_route %-8s %s logits: %s\n", r.what,
                  std::string(dtype_name(dt)).c_str(), nodes.summary().c_str());
      EXPECT_EQ(nodes.kernels, 1) << nodes.summary();
      EXPECT_EQ(nodes.memsets + nodes.memcpys + nodes.hosts + nodes.others, 0) << nodes.summary();
      if (nodes.names_known()) {
        EXPECT_EQ(nodes.kernels_named("moe_route_kernel"), 1) << nodes.summary();
      }
      cuda::fill_bytes(ids, 0xff);
      cuda::fill_bytes(w, 0xff);
      g.replay();
      const Buffer g_ids = cuda::to_host(ids), g_w = download(w);
      EXPECT_TRUE(same_bytes(g_ids, eager_ids));
      EXPECT_TRUE(same_bytes(g_w, eager_w));
      // The CPU twin on the same logits (BF16 ones widened exactly): the same experts, in order.
      Buffer c_ids(DType::I32, {n, p.top_k}), c_w(DType::F32, {n, p.top_k});
      ops::moe_route(c_ids, c_w, host_logits, bias, p);
      EXPECT_TRUE(same_bytes(g_ids, c_ids));
      expect_close(
          strf("graph moe_route %s %s logits weights", r.what, std::string(dtype_name(dt)).c_str()),
          g_w, c_w, 1e-5);
    }
  }
}

// The router as the model runs it: BF16 x (the BF16-activation dataflow; an F32 x adds the GEMM's
// own conversion of x, which that item removes) · BF16 gate → BF16 logits → moe_route.
TEST(CudaGraph, RouterGemmFeedsBf16LogitsToTheRouteKernelDirectly) {
  OSPREY_REQUIRE_GPU();
  for (const Router& r : kRouters)
    for (int64_t n : {int64_t(1), int64_t(64)}) {
      const RouterParams& p = r.p;
      const int64_t E = p.n_experts, D = r.hidden, K = p.top_k;
      SCOPED_TRACE(strf("%s router, %lld tokens", r.what, static_cast<long long>(n)));
      const Buffer x = rand_bf16({n, D}, -1, 1), wt = rand_bf16({E, D}, -0.05f, 0.05f);
      const Buffer bias = rand_f32({E}, -0.1f, 0.1f);
      DeviceBuffer dx = cuda::to_device(x), dw = cuda::to_device(wt), db = cuda::to_device(bias);
      ASSERT_EQ(router_logits_dtype(dw), DType::BF16);
      DeviceBuffer logits = poisoned(DType::BF16, {n, E});
      DeviceBuffer ids = poisoned(DType::I32, {n, K}), w = poisoned(DType::F32, {n, K});
      moe_router(ids, w, logits, dx, dw, db, p);  // eager: warms cuBLASLt and the scratch
      cuda::synchronize();
      CapturedGraph gemm, router;
      gemm.capture([&] { ops::linear(logits, dx, LinearWeight{dw, {}}); });
      ASSERT_FALSE(HasFatalFailure());
      router.capture([&] { moe_router(ids, w, logits, dx, dw, db, p); });
      ASSERT_FALSE(HasFatalFailure());
      const GraphNodes gn = gemm.nodes(), rn = router.nodes();
      std::printf("GRAPH router %-8s n=%-3lld gate GEMM alone: %s\n  router: %s\n", r.what,
                  static_cast<long long>(n), gn.summary().c_str(), rn.summary().c_str());
      // The budget: the GEMM's kernels (cuBLASLt's choice: one, or a split-K pair) + moe_route.
      EXPECT_EQ(rn.kernels, gn.kernels + 1) << rn.summary();
      EXPECT_LE(gn.kernels, 2) << gn.summary();
      EXPECT_EQ(rn.memsets, gn.memsets) << rn.summary();
      EXPECT_EQ(rn.memcpys, gn.memcpys) << rn.summary();
      EXPECT_EQ(rn.memsets + rn.memcpys + rn.hosts + rn.others, 0)
          << "the router graph holds more than kernels (a memset here with the GEMM's equal "
             "count comes from cuBLASLt's split-K)\n"
          << rn.summary();
      if (rn.names_known()) {
        EXPECT_EQ(rn.kernels_named("moe_route_kernel"), 1) << rn.summary();
        EXPECT_EQ(rn.kernels_named("convert_kernel"), 0) << rn.summary();
      } else {
        std::printf("GRAPH (kernel names not available from the driver: counts only)\n");
      }
      cuda::fill_bytes(logits, 0xff);
      cuda::fill_bytes(ids, 0xff);
      cuda::fill_bytes(w, 0xff);
      router.replay();
      const Buffer g_logits = cuda::to_host(logits), g_ids = cuda::to_host(ids), g_w = download(w);
      // The CPU twin of the logits: the F32 GEMM on the same BF16 values, rounded to BF16.
      Buffer c_logits(DType::F32, {n, E});
      ops::linear(c_logits, widen(x), LinearWeight{widen(wt), {}});
      Buffer c_logits16(DType::BF16, {n, E});
      for (int64_t i = 0; i < n * E; ++i)
        c_logits16.ptr<uint16_t>()[i] = f32_to_bf16(c_logits.f32()[i]);
      expect_close(strf("router %s n=%lld BF16 logits", r.what, static_cast<long long>(n)),
                   widen(g_logits), widen(c_logits16), 8e-3);
      // Routing: the CPU twin on the GPU's own BF16 logits gives the same experts, in order.
      Buffer c_ids(DType::I32, {n, K}), c_w(DType::F32, {n, K});
      ops::moe_route(c_ids, c_w, g_logits, bias, p);
      EXPECT_TRUE(same_bytes(g_ids, c_ids));
      expect_close(strf("router %s n=%lld weights", r.what, static_cast<long long>(n)), g_w, c_w,
                   1e-5);
      // And on the CPU's own logits: a logit one BF16 step apart may swap a near-tie (reported).
      Buffer o_ids(DType::I32, {n, K}), o_w(DType::F32, {n, K});
      ops::moe_route(o_ids, o_w, c_logits16, bias, p);
      std::printf(
          "TWIN router %-8s n=%-3lld tokens whose experts differ from the CPU chain: %lld\n",
          r.what, static_cast<long long>(n),
          static_cast<long long>(tokens_with_other_sets(g_ids, o_ids, n, K)));
    }
}

uint8_t random_e4m3() {
  std::uniform_int_distribution<int> b(0, 255);
  for (;;) {
    const int v = b(rng());
    if ((v & 0x7f) != 0x7f) return uint8_t(v);  // no NaN
  }
}

// An FP8 linear on cuBLASLt's block-scaled path with 37 tokens (padded to 48 for cuBLASLt): no
// memset node; the graph replays the eager result.
TEST(CudaGraph, Fp8LinearPaddingHasNoMemset) {
  OSPREY_REQUIRE_GPU();
  ops::cuda::set_fp8_swapab(false);  // the swap-AB kernel would take small n; this is about Lt's
  const int64_t n = 37, out = 2048, in = 7168;  // V3.2's expert gate / up shape
  Buffer w8(DType::F8_E4M3, {out, in});
  for (int64_t i = 0; i < out * in; ++i) w8.ptr<uint8_t>()[i] = random_e4m3();
  const Buffer scale = rand_f32({out / 128, in / 128}, 0.5e-3f, 2e-3f);
  DeviceBuffer dw = cuda::to_device(w8), ds = cuda::to_device(scale);
  const LinearWeight lw{dw, ds};
  for (DType xdt : {DType::BF16, DType::F32})
    for (DType ydt : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(strf("x %s, y %s", std::string(dtype_name(xdt)).c_str(),
                        std::string(dtype_name(ydt)).c_str()));
      const Buffer x = rand_f32({n, in});
      DeviceBuffer dx = upload(x, xdt), y = poisoned(ydt, {n, out});
      ops::linear(y, dx, lw);
      ASSERT_STREQ(ops::cuda::last_fp8_gemm_path(), "cublasLt-fp8-blockscaled");
      const Buffer eager = cuda::to_host(y);
      CapturedGraph g;
      g.capture([&] { ops::linear(y, dx, lw); });
      ASSERT_FALSE(HasFatalFailure());
      const GraphNodes nodes = g.nodes();
      std::printf("GRAPH fp8 linear [%lldx%lld]x[%lld] x %s y %s: %s\n", static_cast<long long>(n),
                  static_cast<long long>(in), static_cast<long long>(out),
                  std::string(dtype_name(xdt)).c_str(), std::string(dtype_name(ydt)).c_str(),
                  nodes.summary().c_str());
      EXPECT_EQ(nodes.memsets, 0) << nodes.summary();
      EXPECT_EQ(nodes.hosts, 0) << nodes.summary();
      if (nodes.names_known()) {
        EXPECT_EQ(nodes.kernels_named("quantize_act_kernel"), 1) << nodes.summary();
      }
      cuda::fill_bytes(y, 0xff);
      ops::cuda::fill_scratch(0xff);  // the padding rows must not come from an earlier call
      g.replay();
      EXPECT_TRUE(same_bytes(cuda::to_host(y), eager));
    }
  ops::cuda::set_fp8_swapab(true);
}

// The GEMMs of a V3.2 decode step that cuBLASLt runs, at the model's own widths (D 7168, V 129280),
// as the model calls them (x F32; y F32, the router's logits BF16): each captures as kernel nodes
// only, and the replay is the eager result bit for bit. The bench's dsv32 decode graphs at B=1 and
// B=16 held one 4-byte memset node (B=64 none) that none of osprey's own ops issues.
TEST(CudaGraph, Dsv32CublasLtGemmsHoldNoMemset) {
  OSPREY_REQUIRE_GPU();
  struct Gemm {
    const char* what;
    int64_t out, in;
    DType w, y;
    std::vector<int64_t> tokens;
  };
  const std::vector<int64_t> decode = {1, 16, 64};
  const Gemm gemms[] = {
      {"lm_head", 129280, 7168, DType::BF16, DType::F32, decode},
      {"router gate", 256, 7168, DType::BF16, DType::BF16, decode},
      {"indexer weights_proj", 64, 7168, DType::BF16, DType::F32, decode},
      // FP8 past the swap-AB kernel's tokens: cuBLASLt's block-scaled GEMM.
      {"q_a_proj", 1536, 7168, DType::F8_E4M3, DType::F32, {64}},
      {"q_b_proj", 24576, 1536, DType::F8_E4M3, DType::F32, {64}},
      {"o_proj", 7168, 16384, DType::F8_E4M3, DType::F32, {64}},
      {"dense down_proj", 7168, 18432, DType::F8_E4M3, DType::F32, {64}},
  };
  const ops::cuda::LtAlgoStats before = ops::cuda::lt_algo_stats();
  uint64_t seed = 1;
  for (const Gemm& gm : gemms) {
    DeviceBuffer w(gm.w, {gm.out, gm.in});
    ops::cuda::fill_uniform(w, seed++, -0.05f, 0.05f);
    DeviceBuffer scale;
    if (gm.w == DType::F8_E4M3) {
      scale = DeviceBuffer(DType::F32, {(gm.out + 127) / 128, (gm.in + 127) / 128});
      ops::cuda::fill_uniform(scale, seed++, 0.5e-3f, 2e-3f);
    }
    const LinearWeight lw{w, scale.view()};
    for (int64_t n : gm.tokens) {
      SCOPED_TRACE(strf("%s [%lld, %lld] at %lld tokens", gm.what, static_cast<long long>(gm.out),
                        static_cast<long long>(gm.in), static_cast<long long>(n)));
      DeviceBuffer x(DType::F32, {n, gm.in});
      ops::cuda::fill_uniform(x, seed++, -1.0f, 1.0f);
      DeviceBuffer y = poisoned(gm.y, {n, gm.out});
      ops::linear(y, x, lw);  // eager: the algorithm choice, the scratch
      if (gm.w == DType::F8_E4M3) {
        ASSERT_STREQ(ops::cuda::last_fp8_gemm_path(), "cublasLt-fp8-blockscaled");
      }
      const Buffer eager = cuda::to_host(y);
      CapturedGraph g;
      g.capture([&] { ops::linear(y, x, lw); });
      ASSERT_FALSE(HasFatalFailure());
      const GraphNodes nodes = g.nodes();
      std::printf("GRAPH %s [%lld, %lld] n=%lld: %s\n", gm.what, static_cast<long long>(gm.out),
                  static_cast<long long>(gm.in), static_cast<long long>(n),
                  nodes.summary().c_str());
      EXPECT_EQ(nodes.memsets, 0) << nodes.summary();
      EXPECT_EQ(nodes.memcpys + nodes.hosts + nodes.others, 0) << nodes.summary();
      EXPECT_GE(nodes.kernels, 1) << nodes.summary();
      cuda::fill_bytes(y, 0xff);
      g.replay();
      EXPECT_TRUE(same_bytes(cuda::to_host(y), eager)) << "replay differs from the eager call";
    }
  }
  const ops::cuda::LtAlgoStats after = ops::cuda::lt_algo_stats();
  std::printf(
      "GRAPH cuBLASLt choices: %lld GEMMs, %lld took a later candidate than the heuristic's first "
      "(a memset node in it), %lld had none without\n",
      static_cast<long long>(after.gemms - before.gemms),
      static_cast<long long>(after.later_choice - before.later_choice),
      static_cast<long long>(after.no_clean_choice - before.no_clean_choice));
  EXPECT_EQ(after.no_clean_choice, before.no_clean_choice);
  EXPECT_EQ(after.unkept_in_capture, before.unkept_in_capture);
}

}  // namespace
}  // namespace osprey
