// The MoE router of one layer: router_logits [n_tokens, E] = x [n_tokens, D] · W_gateᵀ, written by
// the gate GEMM in the dtype the gate weight has, then ops::moe_route reads them as they are.
//   CUDA: the gate weight is BF16 (as DeepSeek's checkpoints store it; load_weights_cuda and the
//         dummy weights keep it so), the GEMM writes BF16 logits and moe_route's one fused kernel
//         widens them to F32 for the scoring, the bias and the grouped top-k: no cast kernel
//         between the two (ARCHITECTURE.md principle 2; tests/ops/test_cuda_graph counts the
//         kernels). OSPREY_ROUTER_BF16=0 keeps the gate F32 on the GPU (F32 logits, as before).
//   CPU:  the oracle's weights are all F32 (load_weights_cpu) and cpu::linear writes F32, so its
//         logits stay F32; cpu::moe_route also takes BF16 logits (widened exactly), which is how
//         the tests build the CUDA path's twin: round the logits to BF16, then route.
#pragma once

#include "core/tensor.h"
#include "ops/moe.h"

namespace osprey {

// The dtype of the logits the gate GEMM writes for this gate weight: BF16 for a BF16 weight, F32
// otherwise.
DType router_logits_dtype(const Tensor& router_weight);

// topk_ids [n_tokens, K] I32, topk_weights [n_tokens, K] F32; router_logits [n_tokens, E] of
// router_logits_dtype(router_weight) is overwritten (the caller owns it; dumps read it after);
// router_weight [E, D]; correction_bias [E] (noaux_tc only). All on one device.
void moe_router(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor x,
                Tensor router_weight, Tensor correction_bias, const RouterParams& p);

}  // namespace osprey
