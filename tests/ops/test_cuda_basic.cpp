// CUDA twins of the elementwise and row ops against their CPU twins, DeepSeek-V3.2 widths
// (hidden 7168, q_lora 1536, kv_lora 512, indexer 128, dense FFN 18432), F32 and BF16.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "ops/activation.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace osprey {
namespace {
using namespace testing;
using ops::Fp8Act;
using ops::Fp8Layout;
using ops::NormOutputs;

const char* name(DType d) {
  return d == DType::F32 ? "F32" : "BF16";
}
double tol(DType d) {
  return d == DType::F32 ? 1e-6 : 8e-3;
}

// D = 7168 and 100 take the vector kernel (the last column block of 100 partial), 1030 (not a
// multiple of 4) the strided one; the values exactly the CPU twin's.
TEST(CudaOps, Embedding) {
  OSPREY_REQUIRE_GPU();
  const int64_t V = 16384, n = 67;
  for (int64_t D : {7168, 1030, 100})
    for (DType tdt : {DType::F32, DType::BF16})
      for (DType odt : {DType::F32, DType::BF16}) {
        Buffer table = rand_f32({V, D});
        round_bf16(table);
        Buffer ids(DType::I32, {n});
        std::uniform_int_distribution<int> pick(0, int(V) - 1);
        for (int64_t i = 0; i < n; ++i) ids.ptr<int32_t>()[i] = pick(rng());
        Buffer ref(DType::F32, {n, D});
        ops::embedding(ref, ids, table);
        DeviceBuffer d_table = upload(table, tdt), d_ids = cuda::to_device(ids);
        DeviceBuffer out = poisoned(odt, {n, D});
        ops::embedding(out, d_ids, d_table);
        expect_close(std::string("embedding D ") + std::to_string(D) + " table " + name(tdt) +
                         " out " + name(odt),
                     download(out), ref, 0.0);
      }
}

// Widths 7168 / 1536 / 512 take the register-resident kernel (7, 1.5 and 0.5 quads a thread);
// 1030 (not a multiple of 4) the strided one.
TEST(CudaOps, RmsNorm) {
  OSPREY_REQUIRE_GPU();
  for (int64_t D : {7168, 1536, 512, 1030})
    for (DType dt : {DType::F32, DType::BF16}) {
      const int64_t n = 61;
      Buffer x = rand_f32({n, D}, -3, 3), w = rand_f32({D}, 0.5, 1.5);
      if (dt == DType::BF16) round_bf16(x);
      Buffer ref(DType::F32, {n, D});
      ops::rms_norm(ref, x, w, 1e-6f);
      DeviceBuffer dx = upload(x, dt), dw = upload(w), out = poisoned(dt, {n, D});
      ops::rms_norm(out, dx, dw, 1e-6f);
      expect_close("rms_norm D=" + std::to_string(D) + " " + name(dt), download(out), ref, tol(dt));
    }
}

TEST(CudaOps, AddRmsNorm) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 64, D = 7168;
  for (DType dt : {DType::F32, DType::BF16}) {
    Buffer x = rand_f32({n, D}, -3, 3), res = rand_f32({n, D}, -3, 3), w = rand_f32({D}, 0.5, 1.5);
    if (dt == DType::BF16) {
      round_bf16(x);
      round_bf16(res);
    }
    DeviceBuffer dx = upload(x, dt), dres = upload(res, dt), dw = upload(w),
                 out = poisoned(dt, {n, D});
    Buffer ref(DType::F32, {n, D});
    ops::add_rms_norm(ref, res, x, w, 1e-6f);  // res becomes res + x
    ops::add_rms_norm(out, dres, dx, dw, 1e-6f);
    expect_close(std::string("add_rms_norm out ") + name(dt), download(out), ref, tol(dt));
    expect_close(std::string("add_rms_norm residual ") + name(dt), download(dres), res, tol(dt));
  }
}

// ops::rms_norm_multi / add_rms_norm_multi (the norms that also write their consumers' BF16 and FP8
// inputs) on V3.2's widths: hidden 7168 (every block's input), q_lora 1536 (q_lat), kv_lora 512;
// at decode (4 tokens), B=64 (no padding) and 37 tokens (padded to 48 in the Cols layout), in both
// FP8 layouts (ops/fp8_act.h). Per case:
//   - out is bit for bit the plain CUDA norm's out (the same kernel arithmetic), and the CPU
//     twin's (the composition, cpu::rms_norm_multi) within F32 rounding; the residual likewise;
//   - bf16 is RN(out) bit for bit;
//   - q, s are bit for bit cpu::quantize_act_rows of the GPU's out (the existing quantisation's
//     arithmetic), laid out as the layout says; Cols padding rows are zero bytes with scale 1;
//   - against the CPU composition's q, s (from its own out): scales within 1e-6, and dequantised
//     values within an e4m3 step (out differs by F32 ulps, which can flip a rounding).
void norm_multi_case(int64_t n, int64_t D, Fp8Layout layout, bool add) {
  const std::string what =
      strf("%s n=%lld D=%lld %s", add ? "add_rms_norm_multi" : "rms_norm_multi",
           static_cast<long long>(n), static_cast<long long>(D),
           layout == Fp8Layout::Rows ? "Rows" : "Cols");
  SCOPED_TRACE(what);
  const int64_t G = D / 128;
  const int64_t rows = layout == Fp8Layout::Rows ? n : (n + 15) / 16 * 16;
  const Shape qs = {rows, D}, ss = layout == Fp8Layout::Rows ? Shape{n, G} : Shape{G, rows};
  Buffer x = rand_f32({n, D}, -3, 3), res = rand_f32({n, D}, -3, 3), w = rand_f32({D}, 0.5, 1.5);
  // A zero group (scale 1) in row 0 of the input of the plain norm: its output group is zero too.
  if (!add)
    for (int64_t c = 0; c < 128; ++c) x.f32()[128 + c] = 0.0f;
  DeviceBuffer dx = upload(x), dw = upload(w), dres = upload(res), dres2 = upload(res);
  DeviceBuffer out = poisoned(DType::F32, {n, D}), ob = poisoned(DType::BF16, {n, D});
  DeviceBuffer q = poisoned(DType::U8, qs), s = poisoned(DType::F32, ss);
  const NormOutputs no{out, ob, Fp8Act{q, s, layout}};
  if (add)
    ops::add_rms_norm_multi(no, dres, dx, dw, 1e-6f);
  else
    ops::rms_norm_multi(no, dx, dw, 1e-6f);
  DeviceBuffer plain = poisoned(DType::F32, {n, D});
  if (add)
    ops::add_rms_norm(plain, dres2, dx, dw, 1e-6f);
  else
    ops::rms_norm(plain, dx, dw, 1e-6f);
  const Buffer g_out = download(out), g_b = download(ob), g_plain = download(plain);
  const Buffer g_q = download(q), g_s = download(s);
  EXPECT_EQ(std::memcmp(g_out.f32(), g_plain.f32(), size_t(n * D) * 4), 0) << "out vs plain norm";
  if (add) {
    const Buffer r1 = download(dres), r2 = download(dres2);
    EXPECT_EQ(std::memcmp(r1.f32(), r2.f32(), size_t(n * D) * 4), 0) << "residual";
  }
  // The CPU twin: the composition.
  Buffer c_out(DType::F32, {n, D}), c_b(DType::BF16, {n, D}), c_q(DType::U8, qs),
      c_s(DType::F32, ss);
  const NormOutputs cn{c_out, c_b, Fp8Act{c_q, c_s, layout}};
  if (add) {
    ops::add_rms_norm_multi(cn, res, x, w, 1e-6f);  // res becomes res + x
    expect_close(what + " residual vs CPU", download(dres), res, 1e-7);
  } else {
    ops::rms_norm_multi(cn, x, w, 1e-6f);
  }
  expect_close(what + " out vs CPU", g_out, c_out, 1e-6);
  int64_t bad_b = 0, bad_q = 0, bad_s = 0, bad_pad = 0;
  for (int64_t i = 0; i < n * D; ++i)
    bad_b += f32_to_bf16(g_out.f32()[i]) != f32_to_bf16(g_b.f32()[i]) ||
             g_b.f32()[i] != bf16_to_f32(f32_to_bf16(g_out.f32()[i]));
  std::vector<float> wq(size_t(n * D)), ws(size_t(n * G));
  ops::cpu::quantize_act_rows(wq.data(), ws.data(), g_out.f32(), n, D);
  const auto at = [&](int64_t t, int64_t g) {
    return layout == Fp8Layout::Rows ? t * G + g : g * rows + t;
  };
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const float sc = g_s.f32()[at(t, g)];
      if (t >= n) {
        bad_pad += sc != 1.0f;
        for (int64_t c = 0; c < 128; ++c) bad_pad += g_q.ptr<uint8_t>()[t * D + g * 128 + c] != 0;
        continue;
      }
      bad_s += sc != ws[size_t(t * G + g)];
      for (int64_t c = 0; c < 128; ++c) {
        const int64_t i = t * D + g * 128 + c;
        bad_q += e4m3_to_f32(g_q.ptr<uint8_t>()[i]) != wq[size_t(i)];
      }
    }
  EXPECT_EQ(bad_b, 0) << "bf16 is not RN(out)";
  EXPECT_EQ(bad_q, 0) << "q is not the quantisation of out";
  EXPECT_EQ(bad_s, 0) << "s is not the quantisation's scales";
  EXPECT_EQ(bad_pad, 0) << "padding rows";
  if (!add) {
    EXPECT_EQ(g_s.f32()[at(0, 1)], 1.0f) << "a zero group's scale";
  }
  // Against the CPU composition's own quantisation.
  double num = 0, den = 0;
  int64_t far = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const float gs = g_s.f32()[at(t, g)], cs = c_s.f32()[at(t, g)];
      EXPECT_NEAR(gs, cs, 4e-6 * std::fabs(cs) + 1e-30) << "scale " << t << "," << g;
      for (int64_t c = 0; c < 128; ++c) {
        const int64_t i = t * D + g * 128 + c;
        const double a = e4m3_to_f32(g_q.ptr<uint8_t>()[i]) * gs;
        const double b = e4m3_to_f32(c_q.ptr<uint8_t>()[i]) * cs;
        num += (a - b) * (a - b);
        den += b * b;
        // more than one e4m3 step (relative 2^-3 for normals, 2^-9·s for subnormals)
        far += std::fabs(a - b) > 0.13 * std::fabs(b) + 0.0021 * cs;
      }
    }
  EXPECT_EQ(far, 0);
  EXPECT_LT(std::sqrt(num / den), 1e-3) << "GPU vs CPU composition, dequantised";
  Buffer cb(DType::F32, {n, D});
  for (int64_t i = 0; i < n * D; ++i) cb.f32()[i] = bf16_to_f32(c_b.ptr<uint16_t>()[i]);
  expect_close(what + " bf16 vs CPU", g_b, cb, 8e-3);
}

TEST(CudaOps, RmsNormMultiWritesTheConsumersInputs) {
  OSPREY_REQUIRE_GPU();
  for (int64_t D : {7168, 1536, 512})
    for (int64_t n : {4, 64, 37})
      for (Fp8Layout layout : {Fp8Layout::Rows, Fp8Layout::Cols})
        for (bool add : {false, true}) {
          if (add && D != 7168) continue;  // the add variant: the residual stream only
          norm_multi_case(n, D, layout, add);
        }
  // Without the FP8 output (the MoE router's and lm_head's BF16 only), and with none at all.
  const int64_t n = 5, D = 7168;
  Buffer x = rand_f32({n, D}, -3, 3), w = rand_f32({D}, 0.5, 1.5);
  DeviceBuffer dx = upload(x), dw = upload(w), out = poisoned(DType::F32, {n, D}),
               ob = poisoned(DType::BF16, {n, D}), plain = poisoned(DType::F32, {n, D});
  ops::rms_norm_multi({out, ob, {}}, dx, dw, 1e-6f);
  ops::rms_norm(plain, dx, dw, 1e-6f);
  const Buffer g = download(out), gb = download(ob), gp = download(plain);
  EXPECT_EQ(std::memcmp(g.f32(), gp.f32(), size_t(n * D) * 4), 0);
  int64_t bad = 0;
  for (int64_t i = 0; i < n * D; ++i) bad += gb.f32()[i] != bf16_to_f32(f32_to_bf16(g.f32()[i]));
  EXPECT_EQ(bad, 0);
}

TEST(CudaOps, LayerNorm) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 300, D = 128;  // the indexer key norm
  for (DType dt : {DType::F32, DType::BF16}) {
    Buffer x = rand_f32({n, D}, -2, 4), w = rand_f32({D}, 0.5, 1.5), b = rand_f32({D});
    if (dt == DType::BF16) round_bf16(x);
    Buffer ref(DType::F32, {n, D});
    ops::layer_norm(ref, x, w, b, 1e-6f);
    DeviceBuffer dx = upload(x, dt), dw = upload(w), db = upload(b), out = poisoned(dt, {n, D});
    ops::layer_norm(out, dx, dw, db, 1e-6f);
    expect_close(std::string("layer_norm D=128 ") + name(dt), download(out), ref,
                 dt == DType::F32 ? 2e-6 : 8e-3);
  }
}

TEST(CudaOps, Rope) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 40;
  struct Case {
    int64_t heads, head_dim;
    int offset;
    bool interleaved;
    const char* what;
  };
  for (const Case& c : {Case{128, 192, 128, true, "mla q (interleaved)"},
                        Case{1, 64, 0, true, "mla k_pe (interleaved)"},
                        Case{64, 128, 0, false, "indexer q (half-split)"}})
    for (DType dt : {DType::F32, DType::BF16}) {
      Buffer x = rand_f32({n, c.heads, c.head_dim}, -2, 2);
      if (dt == DType::BF16) round_bf16(x);
      Buffer pos(DType::I32, {n});
      std::uniform_int_distribution<int> pick(0, 16383);
      for (int64_t i = 0; i < n; ++i) pos.ptr<int32_t>()[i] = pick(rng());
      Buffer inv(DType::F32, {32});
      for (int i = 0; i < 32; ++i) inv.f32()[i] = std::pow(10000.0f, -float(i) / 32.0f) * 0.7f;
      DeviceBuffer dx = upload(x, dt), dpos = cuda::to_device(pos), dinv = cuda::to_device(inv);
      ops::rope(x, c.offset, 64, pos, inv, 1.1f, c.interleaved);
      ops::rope(dx, c.offset, 64, dpos, dinv, 1.1f, c.interleaved);
      expect_close(std::string("rope ") + c.what + " " + name(dt), download(dx), x,
                   dt == DType::F32 ? 1e-6 : 8e-3);
    }
}

TEST(CudaOps, SiluMul) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 33, I = 18432;
  for (DType dt : {DType::F32, DType::BF16}) {
    Buffer g = rand_f32({n, I}, -6, 6), u = rand_f32({n, I}, -2, 2);
    if (dt == DType::BF16) {
      round_bf16(g);
      round_bf16(u);
    }
    Buffer ref(DType::F32, {n, I});
    ops::silu_mul(ref, g, u);
    DeviceBuffer dg = upload(g, dt), du = upload(u, dt), out = poisoned(dt, {n, I});
    ops::silu_mul(out, dg, du);
    expect_close(std::string("silu_mul ") + name(dt), download(out), ref, tol(dt));
  }
}

// ops::silu_mul_multi (silu·mul writing the FP8 down projection's input) on V3.2's widths: the
// dense FFN's 18432 and the experts' 2048 (the shared expert's h), at 4, 64 and 37 tokens, both
// layouts, in place as the model calls it (out = gate): out is bit for bit silu_mul's; q, s are bit
// for bit cpu::quantize_act_rows of that out in the layout (Cols padding: zero bytes, scale 1); out
// within F32 rounding of the CPU composition (cpu::silu_mul_multi), its q·s within an e4m3 step.
TEST(CudaOps, SiluMulMultiQuantisesForTheDownProjection) {
  OSPREY_REQUIRE_GPU();
  for (int64_t I : {18432, 2048})
    for (int64_t n : {4, 64, 37})
      for (Fp8Layout layout : {Fp8Layout::Rows, Fp8Layout::Cols}) {
        SCOPED_TRACE(strf("silu_mul_multi n=%lld I=%lld %s", static_cast<long long>(n),
                          static_cast<long long>(I), layout == Fp8Layout::Rows ? "Rows" : "Cols"));
        const int64_t G = I / 128, rows = layout == Fp8Layout::Rows ? n : (n + 15) / 16 * 16;
        const Shape qs = {rows, I}, ss = layout == Fp8Layout::Rows ? Shape{n, G} : Shape{G, rows};
        Buffer g = rand_f32({n, I}, -6, 6), u = rand_f32({n, I}, -2, 2);
        for (int64_t c = 0; c < 128; ++c) u.f32()[c] = 0.0f;  // a zero group: scale 1
        DeviceBuffer dg = upload(g), du = upload(u), dg2 = upload(g);
        DeviceBuffer q = poisoned(DType::U8, qs), sc = poisoned(DType::F32, ss);
        ops::silu_mul_multi(dg, Fp8Act{q, sc, layout}, dg, du);  // in place, as the model
        DeviceBuffer plain = poisoned(DType::F32, {n, I});
        ops::silu_mul(plain, dg2, du);
        const Buffer g_out = download(dg), g_plain = download(plain), g_q = download(q),
                     g_s = download(sc);
        EXPECT_EQ(std::memcmp(g_out.f32(), g_plain.f32(), size_t(n * I) * 4), 0) << "out";
        std::vector<float> wq(size_t(n * I)), ws(size_t(n * G));
        ops::cpu::quantize_act_rows(wq.data(), ws.data(), g_out.f32(), n, I);
        const auto at = [&](int64_t t, int64_t gi) {
          return layout == Fp8Layout::Rows ? t * G + gi : gi * rows + t;
        };
        int64_t bad_q = 0, bad_s = 0, bad_pad = 0;
        for (int64_t t = 0; t < rows; ++t)
          for (int64_t gi = 0; gi < G; ++gi) {
            const float v = g_s.f32()[at(t, gi)];
            if (t >= n) {
              bad_pad += v != 1.0f;
              for (int64_t c = 0; c < 128; ++c)
                bad_pad += g_q.ptr<uint8_t>()[t * I + gi * 128 + c] != 0;
              continue;
            }
            bad_s += v != ws[size_t(t * G + gi)];
            for (int64_t c = 0; c < 128; ++c) {
              const int64_t i = t * I + gi * 128 + c;
              bad_q += e4m3_to_f32(g_q.ptr<uint8_t>()[i]) != wq[size_t(i)];
            }
          }
        EXPECT_EQ(bad_q, 0);
        EXPECT_EQ(bad_s, 0);
        EXPECT_EQ(bad_pad, 0);
        EXPECT_EQ(g_s.f32()[at(0, 0)], 1.0f) << "a zero group's scale";
        // The CPU twin (the composition).
        Buffer c_out(DType::F32, {n, I}), c_q(DType::U8, qs), c_s(DType::F32, ss);
        ops::silu_mul_multi(c_out, Fp8Act{c_q, c_s, layout}, g, u);
        expect_close("silu_mul_multi out vs CPU", g_out, c_out, 1e-6);
        double num = 0, den = 0;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t gi = 0; gi < G; ++gi) {
            const float gs = g_s.f32()[at(t, gi)], cs = c_s.f32()[at(t, gi)];
            EXPECT_NEAR(gs, cs, 4e-6 * std::fabs(cs)) << "scale " << t << "," << gi;
            for (int64_t c = 0; c < 128; ++c) {
              const int64_t i = t * I + gi * 128 + c;
              const double a = e4m3_to_f32(g_q.ptr<uint8_t>()[i]) * gs;
              const double b = e4m3_to_f32(c_q.ptr<uint8_t>()[i]) * cs;
              num += (a - b) * (a - b);
              den += b * b;
            }
          }
        EXPECT_LT(std::sqrt(num / den), 1e-3) << "GPU vs CPU composition, dequantised";
      }
}

}  // namespace
}  // namespace osprey

#include "ops/tensor_ops.h"

namespace osprey {
namespace {
using namespace testing;

TEST(CudaOps, CopyColumnsAddScale) {
  OSPREY_REQUIRE_GPU();
  // The expanded-attention K assembly at V3.2 widths: k [L·128, 192] ← kvb nope cols, ctx rope
  // cols.
  const int64_t L = 37, H = 128;
  for (DType dt : {DType::F32, DType::BF16}) {
    Buffer kvb = rand_f32({L * H, 256}), ctx = rand_f32({L, 576});
    round_bf16(kvb);
    round_bf16(ctx);
    Buffer ref(DType::F32, {L * H, 192});
    ops::copy_columns(ref, 0, kvb, 0, 128);
    ops::copy_columns(ref, 128, ctx, 512, 64);
    DeviceBuffer d_kvb = upload(kvb, dt), d_ctx = upload(ctx, dt);
    DeviceBuffer out = poisoned(dt, {L * H, 192});
    ops::copy_columns(out, 0, d_kvb, 0, 128);
    ops::copy_columns(out, 128, d_ctx, 512, 64);
    expect_close(std::string("copy_columns ") + (dt == DType::F32 ? "F32" : "BF16"), download(out),
                 ref, 0.0);
  }
  Buffer a = rand_f32({67, 7168}), b = rand_f32({67, 7168});
  Buffer ref(DType::F32, {67, 7168});
  ops::add(ref, a, b);
  ops::scale(ref, 0.125f);
  DeviceBuffer da = upload(a), db = upload(b), out = poisoned(DType::F32, {67, 7168});
  ops::add(out, da, db);
  ops::scale(out, 0.125f);
  expect_close("add+scale F32", download(out), ref, 1e-7);
}

}  // namespace
}  // namespace osprey
