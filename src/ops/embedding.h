// Token embedding lookup: out [n_tokens, D] F32 = table[ids[t]] (table [V, D] F32 or BF16).
// An id outside [0, V) is a caller bug (requests are validated before they reach the model).
#pragma once

#include "core/tensor.h"

namespace osprey::ops {
void embedding(Tensor out, Tensor ids, Tensor table);
namespace cpu {
void embedding(Tensor out, Tensor ids, Tensor table);
}
// The CUDA twins (ops/cuda/), built with OSPREY_WITH_CUDA; dtypes in each .cu file's header.
namespace cuda {
void embedding(Tensor out, Tensor ids, Tensor table);
}  // namespace cuda
}  // namespace osprey::ops
