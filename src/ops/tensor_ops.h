// Data-movement and elementwise ops the forward pass needs between the model's kernels, so that
// one code path serves both devices (no host loops over activations in the model).
//   copy_columns: dst[r, dst_col + i] = src[r / repeat, src_col + i], i < width, every row r of
//   dst,
//                 where dst is viewed as [R, dst.size(-1)] and src as [R / repeat, src.size(-1)]
//                 (repeat = R / src rows ≥ 1: a source row broadcast to `repeat` consecutive rows).
//                 Splits a packed row ([latent | k_pe]) and assembles per-head K from a shared rope
//                 part. dst and src F32 (CPU); F32 or BF16 in any mix (CUDA).
//   gather_rows:  out [n, C] = src[indices[i]] (indices [n] I32 on out's device, 0 ≤ index < rows).
//   add:          out = a + b, elementwise (out may alias a or b).
//   scale:        x *= s, in place.
//   copy:         dst = src, any devices (equal dtype and element count).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace osprey::ops {
void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t width);
void gather_rows(Tensor out, Tensor src, Tensor indices);
void add(Tensor out, Tensor a, Tensor b);
void scale(Tensor x, float s);
void copy(Tensor dst, Tensor src);
namespace cpu {
void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t width);
void add(Tensor out, Tensor a, Tensor b);
void scale(Tensor x, float s);
}  // namespace cpu
// The CUDA twins (ops/cuda/tensor_ops.cu), built with OSPREY_WITH_CUDA.
namespace cuda {
void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t width);
void add(Tensor out, Tensor a, Tensor b);
void scale(Tensor x, float s);
// Fills t (F32, BF16 or F8_E4M3) with values uniform in [lo, hi) from a counter-based hash of
// (seed, index): the same seed gives the same tensor. For dummy weights and benchmark inputs.
void fill_uniform(Tensor t, uint64_t seed, float lo, float hi);
// Fills every scratch slot allocated so far (ops/cuda/common.cuh's arena; not cuBLASLt's
// workspace, whose contents cuBLASLt owns) with `byte`, synchronously. Tests: an op's result must
// not depend on what its scratch held before (0xff = NaN in F32 and BF16, and in e4m3).
void fill_scratch(int byte);
}  // namespace cuda
}  // namespace osprey::ops
