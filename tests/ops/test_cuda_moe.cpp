// CUDA MoE twins against the CPU twins: DeepSeek-V3.2 routing (256 experts, top-8, 8 groups, top-4
// groups, sigmoid + correction bias, noaux_tc, renormalised, × 2.5; F32 and BF16 logits), Kimi-K2
// (384 experts, one group) and the V2-style variants; the grouped experts' routing permutation
// and tile schedule (exactly the host reference); the grouped
// experts with BF16 and FP8 (e4m3, 128×128 block scales) weights at V3.2's widths (hidden 7168,
// expert FFN 2048; 16 distinct experts, top-8, 1, 64 and 4,999 tokens, uniform and skewed
// routing), 256 experts routed by V3.2's router at smaller widths, and widths that are not
// multiples of 128 (V2-Lite's 1408, the test models' 32); and that moe_experts never waits for the
// device (no host copy of the routing, no re-upload of the expert table).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "cuda_test_util.h"
#include "ops/gemm.h"
#include "ops/moe.h"
#include "ops/moe_schedule.h"
#include "ops/tensor_ops.h"

namespace osprey {
namespace {
using namespace testing;

// BF16 logits (the CUDA model's gate output): the CPU twin routes the same BF16 tensor (widened
// exactly: round to BF16, then the F32 routing). F32 logits: the CPU twin routes the F32 values.
void route_case(const RouterParams& p, DType logit_dt, const char* what, int64_t n = 200) {
  Buffer logits = rand_f32({n, p.n_experts}, -4, 4), bias = rand_f32({p.n_experts}, -0.1f, 0.1f);
  round_bf16(logits);
  Buffer host_logits(logit_dt, {n, p.n_experts});  // the values of `logits`, in logit_dt
  for (int64_t i = 0; i < logits.numel(); ++i) {
    if (logit_dt == DType::BF16)
      host_logits.ptr<uint16_t>()[i] = f32_to_bf16(logits.f32()[i]);
    else
      host_logits.f32()[i] = logits.f32()[i];
  }
  Buffer ids(DType::I32, {n, p.top_k}), wts(DType::F32, {n, p.top_k});
  ops::moe_route(ids, wts, host_logits, bias, p);
  DeviceBuffer dl = cuda::to_device(host_logits), db = upload(bias);
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
  route_case(v3, DType::BF16, "moe_route V3 noaux_tc BF16 logits, 1 token", 1);
  route_case(v3, DType::BF16, "moe_route V3 noaux_tc BF16 logits, 4999 tok", 4999);
  RouterParams kimi{384, 8, 1, 1, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.827f};
  route_case(kimi, DType::BF16, "moe_route Kimi-K2 noaux_tc BF16 logits");
  RouterParams v2{160, 6, 8, 3, ScoringFunc::Softmax, TopkMethod::GroupLimitedGreedy, false, 16.0f};
  route_case(v2, DType::BF16, "moe_route V2 group_limited softmax");
  RouterParams lite{64, 6, 1, 1, ScoringFunc::Softmax, TopkMethod::Greedy, false, 1.0f};
  route_case(lite, DType::BF16, "moe_route V2-Lite greedy softmax");
}

// ---- routing permutation and tile schedule ----------------------------------------------------

void permute_case(const Buffer& ids, int E, const char* what) {
  const int64_t rows = ids.numel(), max_tiles = moe_max_tiles(rows, E);
  const MoeSchedule ref = moe_schedule_reference(ids.ptr<int32_t>(), rows, E);
  DeviceBuffer d_ids = cuda::to_device(ids);
  DeviceBuffer perm = poisoned(DType::I32, {rows}), inv = poisoned(DType::I32, {rows});
  DeviceBuffer offsets = poisoned(DType::I32, {E + 1});
  DeviceBuffer tiles = poisoned(DType::I32, {max_tiles, 4});
  ops::cuda::moe_permute(perm, inv, offsets, tiles, d_ids, E);
  cuda::synchronize();
  Buffer g_perm = cuda::to_host(perm), g_inv = cuda::to_host(inv);
  Buffer g_off = cuda::to_host(offsets), g_tiles = cuda::to_host(tiles);
  int64_t perm_diff = 0, inv_diff = 0, off_diff = 0, tile_diff = 0;
  for (int64_t r = 0; r < rows; ++r) {
    perm_diff += g_perm.ptr<int32_t>()[r] != ref.perm[size_t(r)];
    inv_diff += g_inv.ptr<int32_t>()[r] != ref.inv[size_t(r)];
  }
  for (int e = 0; e <= E; ++e) off_diff += g_off.ptr<int32_t>()[e] != ref.offsets[size_t(e)];
  for (int64_t j = 0; j < max_tiles; ++j) {
    const int32_t* t = g_tiles.ptr<int32_t>() + 4 * j;
    const MoeTile& want = ref.tiles[size_t(j)];
    // The padding word is not part of the contract; row0/row1 only for real tiles.
    tile_diff +=
        t[0] != want.expert || (want.expert >= 0 && (t[1] != want.row0 || t[2] != want.row1));
  }
  std::printf(
      "PERMUTE %-48s rows %6lld tiles %4d/%4lld  differing: perm %lld inv %lld "
      "offsets %lld tiles %lld\n",
      what, static_cast<long long>(rows), ref.tile_start[size_t(E)],
      static_cast<long long>(max_tiles), static_cast<long long>(perm_diff),
      static_cast<long long>(inv_diff), static_cast<long long>(off_diff),
      static_cast<long long>(tile_diff));
  EXPECT_EQ(perm_diff, 0) << what;
  EXPECT_EQ(inv_diff, 0) << what;
  EXPECT_EQ(off_diff, 0) << what;
  EXPECT_EQ(tile_diff, 0) << what;
}

TEST(CudaOps, MoePermuteMatchesHostReference) {
  OSPREY_REQUIRE_GPU();
  const std::vector<int32_t> all256 = expert_range(0, 256);
  permute_case(route_ids(1, 8, all256), 256, "256 experts top-8, 1 token");
  permute_case(route_ids(64, 8, all256), 256, "256 experts top-8, 64 tokens");
  permute_case(route_ids(4999, 8, all256), 256, "256 experts top-8, 4999 tokens");
  // Expert 3 in every token (4999 rows, 79 tiles); experts 0..2 and 200..255 idle.
  permute_case(route_ids(4999, 8, expert_range(4, 200), 3), 256, "256 experts, one hot, 59 idle");
  permute_case(route_ids(3000, 8, expert_range(0, 16)), 16, "16 experts top-8, 3000 tokens");
  permute_case(route_ids(700, 1, expert_range(0, 1)), 1, "1 expert, 700 rows");
  permute_case(route_ids(200, 6, expert_range(0, 1024)), 1024, "1024 experts top-6, 200 tokens");
}

// ---- grouped experts -------------------------------------------------------------------------

// E experts' weights, BF16 or F8_E4M3 + F32 scales, on the host (the CPU oracle reads them as they
// are) and the same bytes on the device.
struct ExpertSet {
  std::vector<Buffer> host_owned;
  std::vector<DeviceBuffer> dev_owned;
  std::vector<MlpWeights> host, dev;
  DType dtype = DType::BF16;

  ExpertSet(int64_t E, int64_t D, int64_t I, DType dt) : dtype(dt) {
    SplitMix g{rng()()};
    host_owned.reserve(size_t(E) * 6);
    dev_owned.reserve(size_t(E) * 6);
    for (int64_t e = 0; e < E; ++e) {
      MlpWeights h, d;
      add(h.gate, d.gate, I, D, g);
      add(h.up, d.up, I, D, g);
      add(h.down, d.down, D, I, g);
      host.push_back(h);
      dev.push_back(d);
    }
  }

  void add(LinearWeight& h, LinearWeight& d, int64_t out, int64_t in, SplitMix& g) {
    Buffer w(dtype, {out, in});
    const int64_t count = out * in;
    if (dtype == DType::F8_E4M3) {
      uint8_t* p = w.ptr<uint8_t>();
      for (int64_t i = 0; i < count; i += 8) {
        const uint64_t r = g.next();
        for (int64_t b = 0; b < 8 && i + b < count; ++b) {
          const uint8_t v = uint8_t(r >> (8 * b));
          p[i + b] = (v & 0x7f) == 0x7f ? uint8_t(v - 1) : v;  // no NaN (0x7f, 0xff)
        }
      }
    } else {
      const float a = std::sqrt(3.0f / float(in));  // unit output variance for unit inputs
      uint16_t* p = w.ptr<uint16_t>();
      for (int64_t i = 0; i < count; i += 4) {
        const uint64_t r = g.next();
        for (int64_t b = 0; b < 4 && i + b < count; ++b)
          p[i + b] = f32_to_bf16((float((r >> (16 * b)) & 0xffff) / 32768.0f - 1.0f) * a);
      }
    }
    dev_owned.push_back(cuda::to_device(w));
    h.weight = w;
    d.weight = dev_owned.back();
    host_owned.push_back(std::move(w));
    if (dtype == DType::F8_E4M3) {
      // Random e4m3 bytes reach ±448 (rms ≈ 100): scales near 1/(100·√in) keep outputs near 1.
      const float base = 0.01f / std::sqrt(float(in));
      Buffer sc = rand_f32({(out + 127) / 128, (in + 127) / 128}, 0.5f * base, 1.5f * base);
      dev_owned.push_back(cuda::to_device(sc));
      h.scale_inv = sc;
      d.scale_inv = dev_owned.back();
      host_owned.push_back(std::move(sc));
    }
  }
};

// Rows `tokens` of a host tensor [n, ...] (the CPU oracle on a sample of a long prefill: each
// token's output depends on its own row only).
Buffer take_rows(const Buffer& b, const std::vector<int64_t>& tokens) {
  Shape s = b.shape();
  const int64_t width = b.numel() / s[0];
  s[0] = int64_t(tokens.size());
  Buffer out(b.dtype(), s);
  const size_t bytes = size_t(width) * dtype_size(b.dtype());
  for (size_t i = 0; i < tokens.size(); ++i)
    std::memcpy(static_cast<char*>(out.view().data) + i * bytes,
                static_cast<const char*>(b.view().data) + size_t(tokens[i]) * bytes, bytes);
  return out;
}

struct ExpertsCase {
  int64_t n;                        // tokens
  int64_t K;                        // experts per token
  DType x_type, out_type;           // activations in and out
  int32_t hot = -1;                 // an expert in every token's first slot (−1: none)
  std::vector<int32_t> pool = {};   // the experts the others are drawn from (empty: all)
  const Buffer* ids = nullptr;      // given routing [n, K] (else drawn)
  int64_t max_oracle_tokens = 256;  // the CPU oracle runs on at most this many tokens (spread)
};

// Runs one case against the CPU twin; tol is the relative L2 error allowed.
void experts_case(const ExpertSet& set, const ExpertsCase& c, double tol, const std::string& what) {
  const int64_t E = int64_t(set.dev.size()), D = set.dev[0].gate.in(), n = c.n, K = c.K;
  Buffer x = rand_f32({n, D});
  round_bf16(x);  // the BF16 upload is exact; with F32, the kernel's own BF16 rounding is exact too
  Buffer w = rand_f32({n, K}, 0.1f, 0.5f);
  Buffer drawn;
  if (!c.ids) drawn = route_ids(n, K, c.pool.empty() ? expert_range(0, int32_t(E)) : c.pool, c.hot);
  const Buffer& ids = c.ids ? *c.ids : drawn;
  DeviceBuffer dx = upload(x, c.x_type), d_ids = cuda::to_device(ids), dw = upload(w);
  DeviceBuffer out = poisoned(c.out_type, {n, D});
  ops::moe_experts(out, dx, d_ids, dw, set.dev);
  Buffer got = download(out);
  int64_t non_finite = 0;
  for (int64_t i = 0; i < got.numel(); ++i) non_finite += !std::isfinite(got.f32()[i]);
  EXPECT_EQ(non_finite, 0) << what << ": outputs left unwritten (poison) or broken";
  // The oracle's tokens: all, or an even spread including the first and the last.
  std::vector<int64_t> tokens;
  const int64_t m = std::min(n, c.max_oracle_tokens);
  for (int64_t i = 0; i < m; ++i) tokens.push_back(m == 1 ? 0 : i * (n - 1) / (m - 1));
  Buffer xs = take_rows(x, tokens), ids_s = take_rows(ids, tokens), ws = take_rows(w, tokens);
  Buffer ref(DType::F32, {m, D});
  ops::moe_experts(ref, xs, ids_s, ws, set.host);
  expect_close(what, take_rows(got, tokens), ref, tol);
}

std::string label(const char* weights, int64_t E, int64_t D, int64_t I, const ExpertsCase& c,
                  const char* routing) {
  return std::string("moe_experts ") + weights + " E" + std::to_string(E) + " [" +
         std::to_string(I) + "x" + std::to_string(D) + "] n=" + std::to_string(c.n) + " " +
         routing + " x " + std::string(dtype_name(c.x_type)) + " out " +
         std::string(dtype_name(c.out_type));
}

// Tolerances (relative L2 against the F32 CPU oracle on the same weights and BF16-exact inputs):
// the kernels round the intermediate h to BF16 (and, for FP8, each dequantised weight to BF16:
// bf16(e4m3 · scale)), each rounding ≈ 1.1e-3 rms relative; BF16 outputs add one more.
constexpr double kTolBf16 = 5e-3;
constexpr double kTolFp8 = 1e-2;

void real_width_cases(DType dt) {
  const int64_t E = 16, D = 7168, I = 2048, K = 8;
  const ExpertSet set(E, D, I, dt);
  const char* wname = dt == DType::F8_E4M3 ? "fp8" : "bf16";
  const double tol = dt == DType::F8_E4M3 ? kTolFp8 : kTolBf16;
  // Skewed: expert 3 in every token; experts 0, 1, 2 and 15 never chosen.
  const std::vector<int32_t> skew_pool = expert_range(4, 15);
  // The prefill is checked on 96 of its tokens (the CPU oracle's cost), all of them for poison.
  const std::vector<ExpertsCase> cases = {
      {1, K, DType::BF16, DType::F32},
      {64, K, DType::BF16, DType::F32},
      {64, K, DType::F32, DType::BF16},
      {64, K, DType::BF16, DType::F32, 3, skew_pool},
      {4999, K, DType::BF16, DType::F32, 3, skew_pool, nullptr, 96},
  };
  for (const ExpertsCase& c : cases)
    experts_case(set, c, tol, label(wname, E, D, I, c, c.hot >= 0 ? "skewed" : "uniform"));
}

TEST(CudaOps, MoeExpertsBf16RealWidths) {
  OSPREY_REQUIRE_GPU();
  real_width_cases(DType::BF16);
}

// The WMMA grouped GEMMs with FP8 weights (W8A16): the decode path (osprey's W8A8 swap-AB kernel,
// which takes n ≤ 128 when on) is off here and checked against its own twin in test_cuda_fp8_gemm.
struct SwapAbOff {
  SwapAbOff() { ops::cuda::set_fp8_swapab(false); }
  ~SwapAbOff() { ops::cuda::set_fp8_swapab(true); }
};

TEST(CudaOps, MoeExpertsFp8RealWidths) {
  OSPREY_REQUIRE_GPU();
  const SwapAbOff off;
  real_width_cases(DType::F8_E4M3);
}

TEST(CudaOps, MoeExperts256ExpertsV32Router) {
  OSPREY_REQUIRE_GPU();
  const SwapAbOff off;
  const int64_t E = 256, D = 1024, I = 256, K = 8;
  const RouterParams v3{256, 8, 8, 4, ScoringFunc::Sigmoid, TopkMethod::NoauxTc, true, 2.5f};
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    const ExpertSet set(E, D, I, dt);
    for (int64_t n : {1, 64, 600}) {
      Buffer logits = rand_f32({n, E}, -4, 4), bias = rand_f32({E}, -0.1f, 0.1f);
      Buffer ids(DType::I32, {n, K}), wts(DType::F32, {n, K});
      ops::moe_route(ids, wts, logits, bias, v3);
      const ExpertsCase c{n, K, DType::BF16, DType::F32, -1, {}, &ids};
      experts_case(set, c, dt == DType::F8_E4M3 ? kTolFp8 : kTolBf16,
                   label(dt == DType::F8_E4M3 ? "fp8" : "bf16", E, D, I, c, "v3.2-router"));
    }
  }
}

TEST(CudaOps, MoeExpertsWidthsNotMultiplesOf128) {
  OSPREY_REQUIRE_GPU();
  const SwapAbOff off;  // (D = 2048, I = 1408 would not take it; the others are not multiples)
  struct Shape3 {
    int64_t E, D, I, K;
  };
  // V2-Lite's expert widths (I = 1408 = 11·128: the last 128-column block of gate/up is half
  // empty); the test models' (I = 32: one partial tile and a reduction shorter than one slice);
  // and D, I multiples of 16 but not of 128 (partial FP8 scale blocks in both directions).
  for (const Shape3 s : {Shape3{8, 2048, 1408, 6}, Shape3{16, 256, 32, 4}, Shape3{8, 400, 144, 3}})
    for (DType dt : {DType::BF16, DType::F8_E4M3}) {
      const ExpertSet set(s.E, s.D, s.I, dt);
      for (int64_t n : {1, 37, 300}) {
        const ExpertsCase c{n, s.K, DType::BF16, DType::F32};
        experts_case(set, c, dt == DType::F8_E4M3 ? kTolFp8 : kTolBf16,
                     label(dt == DType::F8_E4M3 ? "fp8" : "bf16", s.E, s.D, s.I, c, "uniform"));
      }
    }
}

// moe_experts with an addend (the shared expert's output, added by the combine: the model's add
// kernel gone) equals moe_experts then ops::add bit for bit — on the FP8 swap-AB path (decode and
// prefill tiles), the WMMA path, the vector combine (D = 7168) and the strided one (D = 400) — and
// the CPU twin within the experts' tolerance.
TEST(CudaOps, MoeExpertsAddendEqualsCombineThenAdd) {
  OSPREY_REQUIRE_GPU();
  struct Case {
    int64_t E, D, I, K, n;
    DType dt;
    bool swapab;
  };
  for (const Case cs : {Case{16, 7168, 2048, 8, 1, DType::F8_E4M3, true},
                        Case{16, 7168, 2048, 8, 64, DType::F8_E4M3, true},
                        Case{16, 7168, 2048, 8, 300, DType::F8_E4M3, true},
                        Case{16, 7168, 2048, 8, 64, DType::BF16, false},
                        Case{8, 400, 144, 3, 37, DType::BF16, false}}) {
    ops::cuda::set_fp8_swapab(cs.swapab);
    const ExpertSet set(cs.E, cs.D, cs.I, cs.dt);
    Buffer x = rand_f32({cs.n, cs.D});
    round_bf16(x);
    Buffer w = rand_f32({cs.n, cs.K}, 0.1f, 0.5f), shared = rand_f32({cs.n, cs.D}, -3.0f, 3.0f);
    const Buffer ids = route_ids(cs.n, cs.K, expert_range(0, int32_t(cs.E)));
    DeviceBuffer dx = upload(x, DType::BF16), di = cuda::to_device(ids), dw = upload(w),
                 ds = upload(shared);
    DeviceBuffer fused = poisoned(DType::F32, {cs.n, cs.D}),
                 plain = poisoned(DType::F32, {cs.n, cs.D});
    ops::moe_experts(fused, dx, di, dw, set.dev, ds);
    ops::moe_experts(plain, dx, di, dw, set.dev);
    ops::add(plain, plain, ds);
    const Buffer gf = download(fused), gp = download(plain);
    const std::string what = strf(
        "moe_experts + addend %s D%lld n=%lld %s", cs.dt == DType::F8_E4M3 ? "fp8" : "bf16",
        static_cast<long long>(cs.D), static_cast<long long>(cs.n), cs.swapab ? "swap-AB" : "WMMA");
    EXPECT_EQ(std::memcmp(gf.f32(), gp.f32(), size_t(gf.numel()) * 4), 0)
        << what << ": the combine's addend differs from an add after it";
    const int64_t m = std::min<int64_t>(cs.n, 64);
    std::vector<int64_t> tokens;
    for (int64_t i = 0; i < m; ++i) tokens.push_back(m == 1 ? 0 : i * (cs.n - 1) / (m - 1));
    Buffer ref(DType::F32, {m, cs.D}), routed(DType::F32, {m, cs.D});
    const Buffer xs = take_rows(x, tokens), is = take_rows(ids, tokens),
                 wsub = take_rows(w, tokens), ss = take_rows(shared, tokens);
    ops::moe_experts(ref, xs, is, wsub, set.host, ss);
    ops::moe_experts(routed, xs, is, wsub, set.host);
    int64_t moved = 0;  // the addend is in the reference: it differs from the routed sum alone
    for (int64_t i = 0; i < ref.numel(); ++i) moved += ref.f32()[i] != routed.f32()[i];
    EXPECT_GT(moved, ref.numel() / 2) << what;
    expect_close(what, take_rows(gf, tokens), ref, cs.dt == DType::F8_E4M3 ? kTolFp8 : kTolBf16);
  }
  ops::cuda::set_fp8_swapab(true);
}

void sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

// No host synchronisation: with the stream held by a 500 ms host function, moe_experts (after a
// first call that sized the scratch and uploaded the expert table) must return at once. A device →
// host copy of the routing, or a re-upload of the table, would wait for the stream.
TEST(CudaOps, MoeExpertsDoNotWaitForTheDevice) {
  OSPREY_REQUIRE_GPU();
  const SwapAbOff off;
  const int64_t E = 32, D = 512, I = 128, K = 8, n = 64;
  const ExpertSet set(E, D, I, DType::F8_E4M3);
  Buffer x = rand_f32({n, D}), w = rand_f32({n, K}, 0.1f, 0.5f);
  round_bf16(x);
  Buffer ids = route_ids(n, K, expert_range(0, int32_t(E)));
  DeviceBuffer dx = upload(x, DType::BF16), d_ids = cuda::to_device(ids), dw = upload(w);
  DeviceBuffer out = poisoned(DType::F32, {n, D});
  ops::moe_experts(out, dx, d_ids, dw, set.dev);  // warm: scratch sized, table uploaded
  cuda::synchronize();
  cuda::fill_bytes(out, 0xff);
  cuda::synchronize();
  static int hold_ms = 500;
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, sleep_on_stream, &hold_ms), cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  ops::moe_experts(out, dx, d_ids, dw, set.dev);
  const double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("NOSYNC moe_experts returned after %.2f ms with the stream held for %d ms\n", host_ms,
              hold_ms);
  EXPECT_LT(host_ms, 250.0) << "moe_experts waited for the device";
  Buffer ref(DType::F32, {n, D});
  ops::moe_experts(ref, x, ids, w, set.host);
  expect_close("moe_experts fp8 after the held stream", download(out), ref, kTolFp8);
}

}  // namespace
}  // namespace osprey
