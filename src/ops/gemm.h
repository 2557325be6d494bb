// Linear layers: y = x · Wᵀ, W stored [out, in] row-major as in the checkpoint.
// W is F32 or BF16, or F8_E4M3 with block scales: W[r, c] = e4m3(W8[r, c]) · scale_inv[r/128,
// c/128] (scale_inv: F32 [ceil(out/128), ceil(in/128)], DeepSeek's `weight_scale_inv`).
#pragma once

#include <initializer_list>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/fp8_act.h"

namespace osprey {

struct LinearWeight {
  Tensor weight;     // [out, in]
  Tensor scale_inv;  // [ceil(out/128), ceil(in/128)] F32 when weight is F8_E4M3, else empty
  int64_t out() const { return weight.size(0); }
  int64_t in() const { return weight.size(1); }
};

constexpr int kFp8BlockSize = 128;

// One output of linears(): y [n, w->out()] = x · Wᵀ.
struct LinearOut {
  Tensor y;
  const LinearWeight* w;
};

namespace ops {
// y [n, out] F32 = x [n, in] F32 · Wᵀ.
void linear(Tensor y, Tensor x, const LinearWeight& w);
// Several linears of one input: outs[i].y = x · outs[i].wᵀ, the values of a linear() each. On
// CUDA, FP8 weights that the swap-AB kernel serves (decode: few tokens) share one quantisation of
// x and one launch (q_a_proj + kv_a_proj + the indexer's wk, q_b_proj + wq_b, an MLP's gate + up:
// their row blocks on one grid, whose split-K choice may differ from a launch each, so the F32
// sums may be ordered differently). Outputs must not alias x.
void linears(Tensor x, std::initializer_list<LinearOut> outs);
// The same with x's FP8 quantisation already made by x's producer (ops/fp8_act.h; empty: as
// above): every FP8 linear whose CUDA path reads xq's layout reads xq instead of quantising x (the
// same values); any other reads x. x_bf16 (or empty): x rounded to BF16 by its producer, read where
// a CUDA linear would convert x to BF16 itself (a BF16 weight; an FP8 weight outside both FP8
// paths, the dequantize fallback: the indexer's wk past 32 tokens), the same values. On the CPU, xq
// and x_bf16 are not read.
void linears(Tensor x, const Fp8Act& xq, std::initializer_list<LinearOut> outs, Tensor x_bf16 = {});
// out [out, in] = W dequantized (F32 on the CPU, BF16 on CUDA), on out's device.
void dequantize(Tensor out, const LinearWeight& w);
namespace cpu {
void linear(Tensor y, Tensor x, const LinearWeight& w);
void linears(Tensor x, std::span<const LinearOut> outs);  // a linear() each
// Dequantizes any supported weight to F32 rows [out, in] (the CPU backend's resident form).
void dequantize(Tensor out_f32, const LinearWeight& w);
// Rows [r0, r1) of W (F32, BF16, F16, or F8_E4M3 with its scales) as F32 into out [(r1 − r0), in].
void dequantize_rows(float* out, const LinearWeight& w, int64_t r0, int64_t r1);
// DeepSeek's W8A8 block-scaled arithmetic (the twin of the CUDA swap-AB FP8 kernel,
// ops/cuda/gemm/fp8_swapab.cuh): x quantised per 1×128 group (s = amax/448, 1 for a zero group;
// q = e4m3(x/s)), y[t, r] = Σ_g (Σ_{c∈g} q·W8) · (scale_inv[r/128, g] · s[t, g]).
// y [n, out] F32, x [n, in] F32, W F8_E4M3 with in a multiple of 128.
void linear_w8a8(Tensor y, Tensor x, const LinearWeight& w);
// The quantisation alone: q [n, in] (the e4m3 values as F32), s [n, in/128].
void quantize_act_rows(float* q, float* s, const float* x, int64_t n, int64_t in);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void linear(Tensor y, Tensor x, const LinearWeight& w);
void linears(Tensor x, std::span<const LinearOut> outs);
void linears(Tensor x, const Fp8Act& xq, Tensor x_bf16, std::span<const LinearOut> outs);
// out [out, in] BF16 = W (F8_E4M3 + scales, or BF16/F32) as BF16.
void dequantize(Tensor out_bf16, const LinearWeight& w);
// FP8 weights: whether cuBLASLt's block-scaled FP8 matmul may be tried (default true; false forces
// the dequantize + BF16 fallback), and which path the last FP8 linear took:
// "swapab-fp8" (osprey's sm_90a kernel, few tokens), "cublasLt-fp8-blockscaled" or "dequant-bf16".
void set_fp8_block_scaled(bool allow);
const char* last_fp8_gemm_path();
// FP8 weights with few tokens: whether osprey's sm_90a W8A8 weight-streaming kernel
// (ops/cuda/gemm/fp8_swapab.cu) serves the dense linears (n ≤ 128) and the routed experts
// (n ≤ 128 tokens); default true unless OSPREY_FP8_SWAPAB=0. Its CPU twin is cpu::linear_w8a8.
void set_fp8_swapab(bool allow);
// FP8 routed experts past 128 tokens (prefill chunks): the same W8A8 swap-AB kernel with tiles of
// 64 rows of an expert (each expert's weights streamed once per 64 of its rows) instead of the
// WMMA W8A16 grouped GEMM. On by default: 3.3x faster than WMMA at 2048 and 5000 tokens on the
// H200 (bench kernels --op moe times both); OSPREY_MOE_PREFILL=wmma turns it off.
void set_fp8_moe_prefill_swapab(bool on);
bool fp8_moe_prefill_swapab();
// The token counts T at which the CUDA linears change kernels between a step of ≤ T tokens and one
// of more (the dense swap-AB limit, the routed experts' decode limit, 16 where the dense path's
// stages change with its token tile), ascending: a step padded
// across one computes its real rows with other arithmetic than the unpadded step
// (engine/cuda_graph_runner.h runs such steps eagerly).
std::vector<int64_t> token_path_thresholds();
}  // namespace cuda
}  // namespace ops
}  // namespace osprey
