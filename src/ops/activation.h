// The gated MLP activation: out [n, I] = silu(gate) ⊙ up, silu(g) = g / (1 + e^-g).
// silu_mul_multi: the same, and out quantised per 1×128 group for the FP8 down projection that
// reads it (ops/fp8_act.h; ops::linears with that Fp8Act launches no quantisation of its own);
// q8 empty: silu_mul. The CPU twin is the composition: silu_mul, then cpu::write_fp8_act of out.
#pragma once

#include "core/tensor.h"
#include "ops/fp8_act.h"

namespace osprey::ops {
void silu_mul(Tensor out, Tensor gate, Tensor up);
void silu_mul_multi(Tensor out, const Fp8Act& q8, Tensor gate, Tensor up);
namespace cpu {
void silu_mul(Tensor out, Tensor gate, Tensor up);
void silu_mul_multi(Tensor out, const Fp8Act& q8, Tensor gate, Tensor up);
}  // namespace cpu
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void silu_mul(Tensor out, Tensor gate, Tensor up);
void silu_mul_multi(Tensor out, const Fp8Act& q8, Tensor gate, Tensor up);
}  // namespace cuda
}  // namespace osprey::ops
