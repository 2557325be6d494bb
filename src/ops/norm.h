// Normalisations, row-wise over the last dimension (rows = everything before it).
//   rms_norm:      out = w ⊙ x / sqrt(mean(x²) + eps)            (computed in F32)
//   add_rms_norm:  residual += x;  out = rms_norm(residual)       (the fused pre-norm residual)
//   layer_norm:    out = w ⊙ (x − mean) / sqrt(var + eps) + b      (biased variance)
//   rms_norm_multi / add_rms_norm_multi: the same, and from the very values written to `out` the
//     casts and quantisations its consumers would otherwise launch themselves (NormOutputs).
#pragma once

#include "core/tensor.h"
#include "ops/fp8_act.h"

namespace osprey::ops {
// The outputs of a normalisation: `out` always; each other one only when given (non-empty).
//   bf16: out rounded to BF16 (round to nearest even): the input of a BF16 GEMM, whose own
//         conversion of out this replaces (the same rounding, moved);
//   fp8:  out quantised per 1×128 group (ops/fp8_act.h, the width a multiple of 128): the input of
//         the FP8 linears (ops::linears with an Fp8Act), whose own quantisation this replaces.
// The CPU twin is the composition: rms_norm / add_rms_norm, then the rounding of out, then
// cpu::quantize_act_rows of out (F32) laid out as fp8.layout says.
struct NormOutputs {
  Tensor out;   // [rows, d] F32 / BF16, as rms_norm's out
  Tensor bf16;  // [rows, d] BF16, or empty
  Fp8Act fp8;   // rows × d quantised, or empty
};
void rms_norm_multi(const NormOutputs& o, Tensor x, Tensor w, float eps);
void add_rms_norm_multi(const NormOutputs& o, Tensor residual, Tensor x, Tensor w, float eps);
void rms_norm(Tensor out, Tensor x, Tensor w, float eps);
void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps);
void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps);
namespace cpu {
void rms_norm(Tensor out, Tensor x, Tensor w, float eps);
void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps);
void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps);
void rms_norm_multi(const NormOutputs& o, Tensor x, Tensor w, float eps);
void add_rms_norm_multi(const NormOutputs& o, Tensor residual, Tensor x, Tensor w, float eps);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void rms_norm(Tensor out, Tensor x, Tensor w, float eps);
void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps);
void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps);
void rms_norm_multi(const NormOutputs& o, Tensor x, Tensor w, float eps);
void add_rms_norm_multi(const NormOutputs& o, Tensor residual, Tensor x, Tensor w, float eps);
}  // namespace cuda
}  // namespace osprey::ops
