// The sm_90a tensor-core absorbed MLA kernel (decode_sm90.cu): entry points for ops/cuda/mla.cu.
#pragma once

#include "core/tensor.h"
#include "ops/attention_meta.h"

namespace osprey::ops::cuda {

// Whether mla_decode_sm90 takes this call: an sm_90 device, q [n, H, 576] F32/BF16, out
// [n, H, 512] F32/BF16, the cache BF16 [.., 576] or FP8 [.., 656], H ≤ 64 or a multiple of 64.
bool mla_decode_sm90_supported(Tensor out, Tensor q, Tensor cache, const AttentionMeta& m);
// ops::mla_attention_absorbed on tensor cores (contract in ops/mla.h).
void mla_decode_sm90(Tensor out, Tensor q, Tensor cache, const AttentionMeta& m,
                     Tensor topk_indices, float scale, Tensor lse);

}  // namespace osprey::ops::cuda
