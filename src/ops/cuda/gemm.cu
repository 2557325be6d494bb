// CUDA linear layers: y [n, out] = x [n, in] · Wᵀ, W [out, in] row-major, through cuBLASLt.
// In cuBLASLt's column-major terms: yᵀ [out, n] = op_T(W) · xᵀ, so A = W (transposed, ld = in),
// B = x (ld = in), D = y (ld = out): no copies or transposes.
//   W F32:  F32 GEMM (x converted to F32 if BF16).
//   W BF16: BF16 GEMM, F32 accumulation (x converted to BF16 if F32).
//   W F8_E4M3 + scale_inv [ceil(out/128), ceil(in/128)] F32 (DeepSeek's 128×128 block scales):
//     x is quantized by quantize_act_kernel per 1×128 group: s = amax/448, q = e4m3(x / s), scales
//     stored [in/128, n] (n contiguous, cuBLASLt's VEC128 layout); then cuBLASLt's block-scaled FP8
//     matmul (A scale mode BLK128x128_32F, B scale mode VEC128_32F, Hopper only).
//     The token count is padded to a multiple of 16 (zero rows with scale 1, written by
//     quantize_act_kernel itself: no memset), which cuBLASLt needs for this mode. If cuBLASLt
//     refuses that mode (no algorithm), or the shape is outside the verified set (see
//     fp8_block_scaled), the fallback dequantizes W to BF16 (dequant_kernel) and runs the BF16
//     GEMM. last_fp8_gemm_path() says which ran. Few tokens (n ≤ 32, K a multiple of 128, on
//     sm_90; fp8_swapab_serves): osprey's own weight-streaming W8A8 kernel (gemm/fp8_swapab.cu)
//     instead: x quantised per 1×128 (scales [n, K/128], row-major), y written directly in its
//     dtype, no padding.
// x, y: F32 or BF16.
// A pre-quantised x (Fp8Act, ops/fp8_act.h, written by x's producer: ops::rms_norm_multi): where
// the FP8 path taken reads its layout (Rows: the swap-AB kernel; Cols: the block-scaled matmul),
// its q and scales replace the quantize kernel above, which computes the same bytes from x.
// Grids: quantize_act_kernel [n_pad, ceil(in/128/8)] × 256 threads (a warp per 128-group, 4 values
// a lane); dequant_vec_kernel [ceil(in/16/256), out] (16 values a thread; dequant_kernel,
// grid-stride over W's elements, where in % 16 or an address is off).
#include <algorithm>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm/fp8_swapab.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/gemm.h"

namespace osprey::ops::cuda {

namespace {
bool g_allow_block_scaled = true;
const char* g_last_path = "none";

constexpr int kGroupsPerBlock = 8;   // warps per block in quantize_act_kernel
constexpr int64_t kTokenAlign = 16;  // token-count multiple the block-scaled FP8 matmul accepts

// Rows [n, n_pad) are cuBLASLt's token padding: written here, in the same pass, as zero values with
// scale 1, so the padding needs no memset node. Output token j reads only token j's column and
// scales, so the padding never reaches y (its outputs are dropped); writing it keeps those columns
// finite whatever the scratch held before (tests/ops/test_cuda_gemm fills the scratch with NaN).
template <typename T>
__global__ void quantize_act_kernel(__nv_fp8_e4m3* __restrict__ q, float* __restrict__ scales,
                                    const T* __restrict__ x, int64_t n, int64_t n_pad, int64_t in) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const int64_t g = int64_t(blockIdx.y) * kGroupsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int64_t n_groups = (in + kFp8BlockSize - 1) / kFp8BlockSize;
  if (g >= n_groups) return;
  const bool pad = row >= n;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = g * kFp8BlockSize + i * 32 + lane;
    v[i] = !pad && c < in ? to_f32(x[row * in + c]) : 0.0f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  const float s = act_fp8_scale(amax);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = g * kFp8BlockSize + i * 32 + lane;
    if (c < in) q[row * in + c] = __nv_fp8_e4m3(v[i] / s);  // saturating (satfinite) conversion
  }
  if (lane == 0) scales[g * n_pad + row] = s;
}

__global__ void dequant_kernel(bf16* __restrict__ out, const __nv_fp8_e4m3* __restrict__ w,
                               const float* __restrict__ scale_inv, int64_t rows, int64_t cols) {
  pdl_wait();
  pdl_trigger();
  const int64_t cb = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] =
        __float2bfloat16_rn(float(w[i]) * scale_inv[(r / kFp8BlockSize) * cb + c / kFp8BlockSize]);
  }
}

// dequant_kernel's values, 16 consecutive columns a thread (one 16-byte load of e4m3, two 16-byte
// stores of BF16; a 128-column scale block holds whole chunks), grid [ceil(cols/16/256), rows] so
// that no thread divides. Why: the element-wise kernel's 64-bit divisions cost ~20 µs for V3.2's
// indexer wk [128, 7168] on the H100, dequantised on every call past 32 tokens. Preconditions:
// cols % 16 == 0, w and out 16-byte aligned (launch_dequant checks, else dequant_kernel).
constexpr int kDequantThreads = 256, kDequantChunk = 16;
__global__ void __launch_bounds__(kDequantThreads)
    dequant_vec_kernel(bf16* __restrict__ out, const uint8_t* __restrict__ w,
                       const float* __restrict__ scale_inv, int64_t cols) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = blockIdx.y;
  const int64_t c = (int64_t(blockIdx.x) * kDequantThreads + threadIdx.x) * kDequantChunk;
  if (c >= cols) return;
  const int64_t cb = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  const float sc = scale_inv[(r / kFp8BlockSize) * cb + c / kFp8BlockSize];
  const uint4 q = *reinterpret_cast<const uint4*>(w + r * cols + c);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  uint4 o[2];
  uint32_t* ow = reinterpret_cast<uint32_t*>(o);
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // values 2k, 2k + 1
    const uint32_t word = words[k / 2] >> (16 * (k % 2));
    const float a = e4m3_to_f32_dev(uint8_t(word & 0xffu)) * sc;
    const float b = e4m3_to_f32_dev(uint8_t((word >> 8) & 0xffu)) * sc;
    const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    ow[k] = *reinterpret_cast<const uint32_t*>(&v);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + r * cols + c);
  dst[0] = o[0];
  dst[1] = o[1];
}

// out [rows, cols] BF16 = W e4m3 · its 128×128 block scales.
void launch_dequant(bf16* out, const void* w, const float* scale_inv, int64_t rows, int64_t cols) {
  if (cols % kDequantChunk == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0 && rows <= 65535) {
    const int64_t chunks = cols / kDequantChunk;
    const dim3 grid(unsigned((chunks + kDequantThreads - 1) / kDequantThreads), unsigned(rows));
    launch_pdl(dequant_vec_kernel, grid, kDequantThreads, 0, out, static_cast<const uint8_t*>(w),
               scale_inv, cols);
  } else {
    launch_pdl(dequant_kernel, int(std::min<int64_t>((rows * cols + 255) / 256, 65536)), 256, 0,
               out, static_cast<const __nv_fp8_e4m3*>(w), scale_inv, rows, cols);
  }
  OSPREY_CUDA_LAUNCH_CHECK();
}

cudaDataType_t lt_type(DType d) {
  switch (d) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F8_E4M3:
      return CUDA_R_8F_E4M3;
    default:
      OSPREY_CHECK(false, "no cuBLASLt type for ", dtype_name(d));
  }
  return CUDA_R_32F;
}

// x in dtype `want` (converted into scratch when it differs); xb: x's BF16 copy from its producer
// (or empty), taken for want = BF16 instead of converting.
const void* x_as(Tensor x, DType want, Tensor xb = {}) {
  if (x.dtype == want) return x.data;
  if (want == DType::BF16 && xb.data) {
    OSPREY_CHECK(xb.dtype == DType::BF16 && xb.numel() == x.numel() && xb.device == Device::CUDA,
                 "linear: x's BF16 copy ", shape_str(xb.shape), " for x ", shape_str(x.shape));
    return xb.data;
  }
  void* buf = scratch(kScratchGemmX, size_t(x.numel()) * dtype_size(want));
  convert(buf, want, x.data, x.dtype, x.numel());
  return buf;
}

// D = op(A)·B into y, trying y's dtype directly, else F32 scratch + conversion.
void matmul_into(Tensor y, int64_t m, int64_t n, int64_t k, const LtOperand& a,
                 const LtOperand& b) {
  if (lt_matmul(m, n, k, a, b, y.data, lt_type(y.dtype), m, 0, 1)) return;
  OSPREY_CHECK(y.dtype != DType::F32, "cuBLASLt has no algorithm for linear [", n, ", ", k, "] x [",
               m, ", ", k, "]ᵀ");
  void* tmp = scratch(kScratchGemmY, size_t(m * n) * sizeof(float));
  OSPREY_CHECK(lt_matmul(m, n, k, a, b, tmp, CUDA_R_32F, m, 0, 1), "cuBLASLt has no algorithm");
  convert(y.data, y.dtype, tmp, DType::F32, m * n);
}

// The block-scaled matmul's own shape class (below) for a weight [out, in]: the Cols layout of an
// Fp8Act is made for the in of it.
bool block_scaled_in(int64_t in) {
  return g_allow_block_scaled && in % kFp8BlockSize == 0 && in >= 4 * kFp8BlockSize;
}

// xq: x already quantised in the Cols layout (nullptr: quantised here).
bool fp8_block_scaled(Tensor y, Tensor x, const Fp8Act* xq, const LinearWeight& w, int64_t n) {
  const int64_t in = w.in(), out = w.out();
  // Only shapes like those where cuBLASLt 13.1's block-scaled mode gave right answers on the H200
  // (tests/ops test_cuda_gemm, 2026-11-29): in a multiple of 128 and at least 512 (the V3/V3.2
  // projections: 512, 1536, 2048, 7168, 16384), out a multiple of 64 and at least 512. It returned
  // wrong values, with no error, for [out 144, in 256] and [out 256, in 128], and the small test
  // models' FP8 linears (in 256 / 384) went wrong inside the model too; so did [out 256, in 768]
  // (the bundled arithmetic model's MLP down projection: 400× off, and its FP8 accuracy fell
  // from 99.7% to 98.2%). Every verified shape has out ≥ 512 as well: everything outside that class
  // takes the dequantize + BF16 path.
  if (!block_scaled_in(in) || out < 4 * kFp8BlockSize || out % 64 != 0) return false;
  // cuBLASLt's block-scaled mode refuses token counts that are not a multiple of 16 (seen on the
  // H200 with n = 5, 37): the quantisation pads the rows with zeros (scale 1) in its own pass, and
  // the padded outputs are dropped.
  const int64_t n_pad = (n + kTokenAlign - 1) / kTokenAlign * kTokenAlign;
  static_assert(kTokenAlign == kFp8ColsTokenAlign, "the Cols layout is this path's padding");
  const int64_t n_groups = in / kFp8BlockSize;
  const void* q = nullptr;   // [n_pad, in] e4m3, rows ≥ n zero
  const float* s = nullptr;  // [in/128, n_pad], pad 1
  if (xq) {
    OSPREY_CHECK(fp8_act_rows(*xq, n, in, "linear") == n_pad && xq->layout == Fp8Layout::Cols,
                 "linear: a Cols FP8 activation");
    q = xq->q.data;
    s = xq->s.f32();
  } else {
    auto* qw = static_cast<__nv_fp8_e4m3*>(scratch(kScratchGemmX, size_t(n_pad * in)));
    auto* sw =
        static_cast<float*>(scratch(kScratchGemmXScale, size_t(n_groups * n_pad) * sizeof(float)));
    OSPREY_DISPATCH_FLOAT(x.dtype, T, {
      const dim3 grid(unsigned(n_pad),
                      unsigned((n_groups + kGroupsPerBlock - 1) / kGroupsPerBlock));
      launch_pdl(quantize_act_kernel<T>, grid, 32 * kGroupsPerBlock, 0, qw, sw,
                 static_cast<const T*>(x.data), n, n_pad, in);
    });
    OSPREY_CUDA_LAUNCH_CHECK();
    q = qw;
    s = sw;
  }
  LtOperand a{w.weight.data,
              CUDA_R_8F_E4M3,
              true,
              in,
              0,
              w.scale_inv.f32(),
              int(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)};
  LtOperand b{q, CUDA_R_8F_E4M3, false, in, 0, s, int(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)};
  // D is y itself when no padding is needed, else a scratch [n_pad, out] whose first n rows are y.
  for (DType d_type : {y.dtype, DType::BF16}) {
    if (d_type != y.dtype && y.dtype == DType::BF16) break;
    void* d = (n_pad == n && d_type == y.dtype)
                  ? y.data
                  : scratch(kScratchGemmY, size_t(out * n_pad) * dtype_size(d_type));
    if (!lt_matmul(out, n_pad, in, a, b, d, lt_type(d_type), out, 0, 1)) continue;
    if (d != y.data) convert(y.data, y.dtype, d, d_type, out * n);
    return true;
  }
  return false;
}
}  // namespace

Fp8ActShape fp8_act_shape(int64_t n, int64_t in) {
  if (n <= 0 || in % kFp8BlockSize != 0) return {};
  const int64_t groups = in / kFp8BlockSize;
  // The swap-AB kernel's decision depends on n and in alone (any weight height N ≥ 1).
  if (fp8_swapab_serves(n, 1, in)) return {Fp8Layout::Rows, {n, in}, {n, groups}};
  if (!block_scaled_in(in)) return {};
  const int64_t n_pad = (n + kTokenAlign - 1) / kTokenAlign * kTokenAlign;
  return {Fp8Layout::Cols, {n_pad, in}, {groups, n_pad}};
}

void dequantize(Tensor out, const LinearWeight& w) {
  check_device(out, "dequantize", "out");
  check_device(w.weight, "dequantize", "weight");
  OSPREY_CHECK(out.dtype == DType::BF16 && out.numel() == w.weight.numel(), "dequantize to BF16");
  const int64_t rows = w.out(), cols = w.in();
  if (w.weight.dtype != DType::F8_E4M3) {
    convert(out.data, DType::BF16, w.weight.data, w.weight.dtype, rows * cols);
    return;
  }
  launch_dequant(static_cast<bf16*>(out.data), w.weight.data, w.scale_inv.f32(), rows, cols);
}

void set_fp8_block_scaled(bool allow) {
  g_allow_block_scaled = allow;
}
const char* last_fp8_gemm_path() {
  return g_last_path;
}

namespace {
// FP8 weights carry device block scales [ceil(out/128), ceil(in/128)] F32 (a clear error if not).
void check_fp8_scales(const LinearWeight& w) {
  const int64_t rb = (w.out() + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t cb = (w.in() + kFp8BlockSize - 1) / kFp8BlockSize;
  OSPREY_CHECK(w.scale_inv.dtype == DType::F32 && w.scale_inv.shape == Shape({rb, cb}) &&
                   w.scale_inv.device == Device::CUDA,
               "fp8 weight ", shape_str(w.weight.shape), " needs device scales [", rb, ", ", cb,
               "]");
}

// x [n, in] → e4m3 x8 [n, in] and its 1×128 scales, in the swap-AB kernel's scratch (which its
// launches only read, so several weights may share one quantisation).
struct QuantizedX {
  uint8_t* q;
  float* s;
};
QuantizedX quantize_for_swapab(Tensor x, int64_t n, int64_t in) {
  auto* q = static_cast<uint8_t*>(scratch(kScratchGemmX, size_t(n * in)));
  auto* s = static_cast<float*>(
      scratch(kScratchGemmXScale, size_t(n * (in / kFp8BlockSize)) * sizeof(float)));
  launch_quantize_rows(q, s, x.data, x.dtype, n, in);
  return {q, s};
}
void swapab_linear(Tensor y, const QuantizedX& x8, const LinearWeight& w, int64_t n) {
  launch_fp8_swapab_linear(y.data, y.dtype, x8.q, x8.s, w.weight.ptr<uint8_t>(), w.scale_inv.f32(),
                           n, w.out(), w.in());
  g_last_path = "swapab-fp8";
}

}  // namespace

namespace {
// y = x · Wᵀ; xq: x's producer-made FP8 quantisation (nullptr or empty: none), read where this
// linear's FP8 path reads its layout; xb: x's producer-made BF16 copy (or empty), read where this
// linear would convert x to BF16.
void linear_impl(Tensor y, Tensor x, const Fp8Act* xq, Tensor xb, const LinearWeight& w) {
  check_device(x, "linear", "x");
  check_device(w.weight, "linear", "weight");
  const int64_t in = w.in(), out = w.out();
  const int64_t n = x.numel() / std::max<int64_t>(x.size(-1), 1);
  OSPREY_CHECK(x.size(-1) == in && y.numel() == n * out && is_f32_or_bf16(x.dtype) &&
                   is_f32_or_bf16(y.dtype),
               "linear: x ", shape_str(x.shape), " W ", shape_str(w.weight.shape), " y ",
               shape_str(y.shape));
  if (n == 0) return;
  if (xq && xq->empty()) xq = nullptr;
  switch (w.weight.dtype) {
    case DType::F32:
    case DType::BF16: {
      const DType t = w.weight.dtype;
      LtOperand a{w.weight.data, lt_type(t), true, in};
      LtOperand b{x_as(x, t, xb), lt_type(t), false, in};
      matmul_into(y, out, n, in, a, b);
      return;
    }
    case DType::F8_E4M3: {
      check_fp8_scales(w);
      if (fp8_swapab_serves(n, out, in)) {
        if (xq && xq->layout == Fp8Layout::Rows) {
          fp8_act_rows(*xq, n, in, "linear");
          swapab_linear(y, QuantizedX{xq->q.ptr<uint8_t>(), xq->s.f32()}, w, n);
        } else {
          swapab_linear(y, quantize_for_swapab(x, n, in), w, n);
        }
        return;
      }
      if (fp8_block_scaled(y, x, xq && xq->layout == Fp8Layout::Cols ? xq : nullptr, w, n)) {
        g_last_path = "cublasLt-fp8-blockscaled";
        return;
      }
      auto* wb = static_cast<bf16*>(scratch(kScratchGemmW, size_t(out * in) * sizeof(bf16)));
      launch_dequant(wb, w.weight.data, w.scale_inv.f32(), out, in);
      LtOperand a{wb, CUDA_R_16BF, true, in};
      LtOperand b{x_as(x, DType::BF16, xb), CUDA_R_16BF, false, in};
      matmul_into(y, out, n, in, a, b);
      g_last_path = "dequant-bf16";
      return;
    }
    default:
      OSPREY_CHECK(false, "linear: unsupported weight dtype on CUDA ", dtype_name(w.weight.dtype));
  }
}

void linears_impl(Tensor x, const Fp8Act* xq, Tensor xb, std::span<const LinearOut> outs) {
  // Every weight FP8 and served by the swap-AB kernel: one quantisation of x (the producer's, xq
  // in either layout — Cols past the token limits, under the wide limit: its scales read by
  // stride — or one made here: it depends on x alone, the same x8 and scales as each linear's own)
  // and the linears in one launch (launch_fp8_swapab_linears: their row blocks on one grid), a
  // launch for each output dtype. Else a linear() each, a producer-made quantisation serving every
  // linear whose path reads its layout. The x8 made here lives in kScratchGemmX, which the swap-AB
  // launches only read.
  check_device(x, "linears", "x");
  if (xq && xq->empty()) xq = nullptr;
  const int64_t in = x.size(-1);
  const int64_t n = x.numel() / std::max<int64_t>(in, 1);
  bool shared = outs.size() > 1 && n > 0 && is_f32_or_bf16(x.dtype);
  for (const LinearOut& o : outs) {
    const LinearWeight& w = *o.w;
    shared = shared && w.weight.dtype == DType::F8_E4M3 && w.weight.device == Device::CUDA &&
             w.in() == in && fp8_swapab_group_serves(n, w.out(), in);
  }
  if (!shared) {
    for (const LinearOut& o : outs) linear_impl(o.y, x, xq, xb, *o.w);
    return;
  }
  for (const LinearOut& o : outs) {
    const LinearWeight& w = *o.w;
    check_device(o.y, "linears", "y");
    OSPREY_CHECK(o.y.numel() == n * w.out() && is_f32_or_bf16(o.y.dtype) && o.y.data != x.data,
                 "linears: x ", shape_str(x.shape), " W ", shape_str(w.weight.shape), " y ",
                 shape_str(o.y.shape));
    check_fp8_scales(w);
  }
  QuantizedX x8{};
  int64_t xs_cols = 0;  // the Cols layout's scale rows (past the token limits, the wide limit's)
  if (xq) {
    const int64_t rows = fp8_act_rows(*xq, n, in, "linears");
    x8 = QuantizedX{xq->q.ptr<uint8_t>(), xq->s.f32()};
    if (xq->layout == Fp8Layout::Cols) xs_cols = rows;
  } else {
    x8 = quantize_for_swapab(x, n, in);
  }
  for (const DType t : {DType::F32, DType::BF16}) {
    std::vector<DenseLinear> group;
    for (const LinearOut& o : outs) {
      if (o.y.dtype != t) continue;
      const LinearWeight& w = *o.w;
      group.push_back(DenseLinear{o.y.data, w.weight.ptr<uint8_t>(), w.scale_inv.f32(), w.out()});
    }
    if (!group.empty()) launch_fp8_swapab_linears(group, t, x8.q, x8.s, n, in, xs_cols);
  }
  g_last_path = "swapab-fp8";
}
}  // namespace

void linears(Tensor x, std::span<const LinearOut> outs) {
  linears_impl(x, nullptr, Tensor{}, outs);
}

void linears(Tensor x, const Fp8Act& xq, Tensor x_bf16, std::span<const LinearOut> outs) {
  linears_impl(x, &xq, x_bf16, outs);
}

void linear(Tensor y, Tensor x, const LinearWeight& w) {
  linear_impl(y, x, nullptr, Tensor{}, w);
}

std::vector<int64_t> token_path_thresholds() {
  // dense, single and grouped; MoE decode (moe.cu); the dense stages' 4 k-blocks at 16-token tiles
  // (4 or auto; 2 past 16 tokens: other split-K sums)
  std::vector<int64_t> t{fp8_swapab_max_tokens(), fp8_swapab_group_max_tokens(), kSwapAbMaxTokens};
  if (fp8_swapab_wide_max_bytes() > 0) t.push_back(kSwapAbWideMaxTokens);
  const int groups = fp8_swapab_dense_groups();
  if (groups == 4 || groups == kDenseGroupsAuto) t.push_back(kSwapAbDeepStageMaxTokens);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

}  // namespace osprey::ops::cuda
