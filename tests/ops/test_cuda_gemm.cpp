// CUDA linear against the CPU twin on DeepSeek-V3.2 projection shapes: BF16 and F32 weights, and
// FP8 e4m3 weights with 128×128 block scales through both CUDA paths (cuBLASLt block-scaled FP8,
// and the dequantize + BF16 fallback), and that the block-scaled path's token padding does not
// depend on what its scratch held.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda_test_util.h"
#include "ops/gemm.h"
#include "ops/tensor_ops.h"

namespace osprey {
namespace {
using namespace testing;

uint8_t random_e4m3() {
  std::uniform_int_distribution<int> b(0, 255);
  for (;;) {
    const int v = b(rng());
    if ((v & 0x7f) != 0x7f) return uint8_t(v);  // no NaN
  }
}

struct Fp8Weight {
  Buffer w, scale;
};
Fp8Weight random_fp8(int64_t out, int64_t in) {
  Fp8Weight f{Buffer(DType::F8_E4M3, {out, in}),
              rand_f32({(out + 127) / 128, (in + 127) / 128}, 0.5e-3f, 2e-3f)};
  for (int64_t i = 0; i < out * in; ++i) f.w.ptr<uint8_t>()[i] = random_e4m3();
  return f;
}

// x whose per-1×128 quantization is exact: e4m3 values times 2^e, with one element at 448·2^e.
Buffer quantizable_x(int64_t n, int64_t in) {
  Buffer x(DType::F32, {n, in});
  std::uniform_int_distribution<int> ex(-4, 2), pos(0, 127);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < in / 128; ++g) {
      const float s = std::ldexp(1.0f, ex(rng()));
      float* v = x.f32() + r * in + g * 128;
      for (int i = 0; i < 128; ++i) v[i] = e4m3_to_f32(random_e4m3()) * s;
      v[pos(rng())] = (pos(rng()) & 1 ? 448.0f : -448.0f) * s;
    }
  return x;
}

struct Shape3 {
  int64_t n, out, in;
  const char* what;
};
const Shape3 kShapes[] = {{64, 1536, 7168, "q_a_proj"},
                          {37, 24576, 1536, "q_b_proj"},
                          {64, 576, 7168, "kv_a_proj"},
                          {5, 7168, 16384, "o_proj"},
                          {16, 2048, 7168, "expert gate"},
                          {16, 7168, 2048, "expert down"},
                          // The small test models' shapes (out < 128, out % 128 != 0, in = 128).
                          {13, 96, 256, "tiny q_a"},
                          {13, 144, 256, "tiny kv_a"},
                          {13, 32, 256, "tiny expert gate"},
                          {13, 256, 128, "tiny o_proj"},
                          {40, 256, 384, "tiny mlp down"},
                          // The bundled arithmetic model's dense MLP down projection: in the
                          // block-scaled class (in 768), where its FP8 gate row lost accuracy.
                          {40, 256, 768, "arith mlp down"},
                          {13, 768, 256, "arith mlp gate"},
                          {37, 32768, 512, "kv_b_proj"}};

std::string label(const char* kind, const Shape3& s) {
  return std::string(kind) + " " + s.what + " [" + std::to_string(s.n) + "x" +
         std::to_string(s.in) + "]x[" + std::to_string(s.out) + "]";
}

TEST(CudaOps, LinearBf16) {
  OSPREY_REQUIRE_GPU();
  for (const Shape3& s : kShapes) {
    Buffer w = rand_f32({s.out, s.in}, -0.05f, 0.05f);
    round_bf16(w);
    Buffer x = rand_f32({s.n, s.in});
    Buffer ref(DType::F32, {s.n, s.out});
    ops::linear(ref, x, LinearWeight{w, {}});
    DeviceBuffer dw = upload(w, DType::BF16);
    for (DType xdt : {DType::F32, DType::BF16}) {
      DeviceBuffer dx = upload(x, xdt), y = poisoned(DType::F32, {s.n, s.out});
      ops::linear(y, dx, LinearWeight{dw, {}});
      expect_close(label(xdt == DType::F32 ? "linear bf16 W, F32 x" : "linear bf16 W, BF16 x", s),
                   download(y), ref, 1e-2);
    }
  }
}

TEST(CudaOps, LinearF32Router) {
  OSPREY_REQUIRE_GPU();
  const int64_t n = 64, E = 256, D = 7168;
  Buffer w = rand_f32({E, D}, -0.05f, 0.05f), x = rand_f32({n, D});
  Buffer ref(DType::F32, {n, E});
  ops::linear(ref, x, LinearWeight{w, {}});
  DeviceBuffer dw = upload(w), dx = upload(x), y = poisoned(DType::F32, {n, E});
  ops::linear(y, dx, LinearWeight{dw, {}});
  expect_close("linear F32 W router [64x7168]x[256]", download(y), ref, 1e-5);
}

// cuBLASLt's block-scaled path and the fallback, with osprey's swap-AB kernel (which would take
// every n ≤ 128 here) off: test_cuda_fp8_gemm checks that one.
void run_fp8(bool block_scaled) {
  ops::cuda::set_fp8_block_scaled(block_scaled);
  ops::cuda::set_fp8_swapab(false);
  for (const Shape3& s : kShapes) {
    Fp8Weight f = random_fp8(s.out, s.in);
    DeviceBuffer dw = cuda::to_device(f.w), ds = cuda::to_device(f.scale);
    const LinearWeight hw{f.w, f.scale}, dwt{dw, ds};
    for (bool exact : {true, false}) {
      Buffer x = exact ? quantizable_x(s.n, s.in) : rand_f32({s.n, s.in});
      Buffer ref(DType::F32, {s.n, s.out});
      ops::linear(ref, x, hw);
      for (DType ydt : {DType::F32, DType::BF16}) {
        DeviceBuffer dx = upload(x), y = poisoned(ydt, {s.n, s.out});
        ops::linear(y, dx, dwt);
        const std::string path = ops::cuda::last_fp8_gemm_path();
        std::printf("FP8PATH %s %s\n", s.what, path.c_str());
        if (!block_scaled) {
          EXPECT_EQ(path, "dequant-bf16");
        }
        const bool lt = path == "cublasLt-fp8-blockscaled";
        // Exact: only accumulation (and the output rounding) differ. Random x: e4m3 activations
        // (3 mantissa bits) on the block-scaled path, BF16 activations on the fallback.
        const double tol = !lt ? 1e-2 : !exact ? 6e-2 : ydt == DType::F32 ? 2e-3 : 1e-2;
        expect_close(label(lt ? (exact ? "fp8 lt exact-x" : "fp8 lt random-x")
                              : (exact ? "fp8 dequant exact-x" : "fp8 dequant random-x"),
                           s) +
                         (ydt == DType::F32 ? " y F32" : " y BF16"),
                     download(y), ref, tol);
      }
    }
  }
  ops::cuda::set_fp8_block_scaled(true);
  ops::cuda::set_fp8_swapab(true);
}

TEST(CudaOps, LinearFp8BlockScaled) {
  OSPREY_REQUIRE_GPU();
  run_fp8(true);
}

TEST(CudaOps, LinearFp8DequantFallback) {
  OSPREY_REQUIRE_GPU();
  run_fp8(false);
}

// cuBLASLt's block-scaled path pads the token count to a multiple of 16 in its scratch; the
// quantisation kernel writes the padding rows itself (no memset), so the result cannot depend on
// what the scratch held: with every scratch byte 0xff (NaN) before the call, and again with 0x00,
// the outputs are bit-identical and match the CPU twin. Token counts 37, 100 and 1001 (padded to
// 48, 112, 1008), and 64 (no padding) as a control.
TEST(CudaOps, LinearFp8BlockScaledIgnoresScratchGarbage) {
  OSPREY_REQUIRE_GPU();
  ops::cuda::set_fp8_swapab(false);  // the swap-AB kernel (no padding) would take small n
  const Shape3 shapes[] = {{37, 1536, 7168, "q_a_proj"},
                           {100, 2048, 7168, "expert gate"},
                           {1001, 7168, 2048, "expert down"},
                           {37, 7168, 16384, "o_proj"},
                           {64, 576, 7168, "kv_a_proj"}};
  for (const Shape3& s : shapes) {
    Fp8Weight f = random_fp8(s.out, s.in);
    DeviceBuffer dw = cuda::to_device(f.w), ds = cuda::to_device(f.scale);
    const Buffer x = quantizable_x(s.n, s.in);
    Buffer ref(DType::F32, {s.n, s.out});
    ops::linear(ref, x, LinearWeight{f.w, f.scale});
    for (DType ydt : {DType::F32, DType::BF16}) {
      DeviceBuffer dx = upload(x, DType::BF16), y = poisoned(ydt, {s.n, s.out});
      ops::linear(y, dx, LinearWeight{dw, ds});  // grows the scratch to this shape
      Buffer runs[2];
      for (int byte : {0xff, 0x00}) {
        ops::cuda::fill_scratch(byte);
        cuda::fill_bytes(y, 0xff);
        ops::linear(y, dx, LinearWeight{dw, ds});
        ASSERT_STREQ(ops::cuda::last_fp8_gemm_path(), "cublasLt-fp8-blockscaled") << s.what;
        runs[byte ? 0 : 1] = download(y);
      }
      const bool same =
          runs[0].view().nbytes() == runs[1].view().nbytes() &&
          std::memcmp(runs[0].view().data, runs[1].view().data, runs[0].view().nbytes()) == 0;
      EXPECT_TRUE(same) << label("scratch 0xff vs 0x00", s);
      // Exact x: only the accumulation order and the output rounding differ from the CPU.
      expect_close(label("fp8 lt garbage-scratch", s) + (ydt == DType::F32 ? " y F32" : " y BF16"),
                   runs[0], ref, ydt == DType::F32 ? 2e-3 : 1e-2);
    }
  }
  ops::cuda::set_fp8_swapab(true);
}

}  // namespace
}  // namespace osprey
