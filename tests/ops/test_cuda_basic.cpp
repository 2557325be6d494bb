// CUDA twins of the elementwise and row ops against their CPU twins, DeepSeek-V3.2 widths
// (hidden 7168, q_lora 1536, kv_lora 512, indexer 128, dense FFN 18432), F32 and BF16.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "ops/activation.h"
#include "ops/embedding.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace osprey {
namespace {
using namespace testing;

const char* name(DType d) {
  return d == DType::F32 ? "F32" : "BF16";
}
double tol(DType d) {
  return d == DType::F32 ? 1e-6 : 8e-3;
}

TEST(CudaOps, Embedding) {
  OSPREY_REQUIRE_GPU();
  const int64_t V = 16384, D = 7168, n = 67;
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
      expect_close(std::string("embedding table ") + name(tdt) + " out " + name(odt), download(out),
                   ref, 0.0);
    }
}

TEST(CudaOps, RmsNorm) {
  OSPREY_REQUIRE_GPU();
  for (int64_t D : {7168, 1536, 512})
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
