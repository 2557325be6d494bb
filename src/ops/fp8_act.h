// An activation quantised for the FP8 linears by the op that produces it (a normalisation:
// ops/norm.h rms_norm_multi), so that the linears that read it launch no quantisation of their own.
// The arithmetic is DeepSeek's W8A8 activation quantisation, the one ops::linear applies to x
// itself (cpu::quantize_act_rows): per token t and 1×128 group g of the in columns,
//   s[t, g] = amax_g(|x[t, :]|) / 448 (1 for an all-zero group),  q[t, c] = e4m3(x[t, c] / s[t,
//   g]).
// Two layouts, one per CUDA FP8 GEMM path (ops/cuda/gemm.cu):
//   Rows (the swap-AB kernel, few tokens): q [n, in], s [n, in/128] row-major;
//   Cols (cuBLASLt's block-scaled FP8 matmul): q [n_pad, in], s [in/128, n_pad] (tokens
//   contiguous),
//     n_pad = n rounded up to 16; rows ≥ n are zeros with scale 1 (cuBLASLt's token padding).
// A linear whose path does not match the layout (another weight shape, a refused cuBLASLt mode, a
// non-FP8 weight) quantises x as before: the layout only ever saves a kernel, never changes a
// value.
#pragma once

#include "core/tensor.h"

namespace osprey::ops {

enum class Fp8Layout { None, Rows, Cols };

struct Fp8Act {
  Tensor q;  // [n, in] (Rows) or [n_pad, in] (Cols) U8: e4m3 bytes
  Tensor s;  // [n, in/128] (Rows) or [in/128, n_pad] (Cols) F32 group scales
  Fp8Layout layout = Fp8Layout::None;
  bool empty() const { return layout == Fp8Layout::None || q.data == nullptr; }
};

// The layout the FP8 linears on `device` read for n tokens of width in, and its tensors' shapes:
// None on the CPU (its linears quantise x themselves; the CPU path keeps its arithmetic), and on
// CUDA where no FP8 path takes a pre-quantised input (in not a multiple of 128, no token).
struct Fp8ActShape {
  Fp8Layout layout = Fp8Layout::None;
  Shape q, s;
};
Fp8ActShape fp8_act_shape(Device device, int64_t n, int64_t in);
// Checks that a (non-empty) holds n rows of width in in its layout (a clear error naming `op` if
// not) and returns its q rows: n (Rows) or n rounded up to 16 (Cols).
int64_t fp8_act_rows(const Fp8Act& a, int64_t n, int64_t in, const char* op);
// The token multiple of the Cols layout (cuBLASLt's block-scaled FP8 matmul takes no other).
constexpr int64_t kFp8ColsTokenAlign = 16;

namespace cpu {
// a (CPU tensors) = x [n, in] F32 quantised as above (cpu::quantize_act_rows) in a's layout.
void write_fp8_act(const Fp8Act& a, const float* x, int64_t n, int64_t in);
}  // namespace cpu
namespace cuda {
Fp8ActShape fp8_act_shape(int64_t n, int64_t in);
}  // namespace cuda
}  // namespace osprey::ops
