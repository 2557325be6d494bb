#include "model/moe_router.h"

#include "core/error.h"
#include "ops/gemm.h"

namespace osprey {

DType router_logits_dtype(const Tensor& router_weight) {
  return router_weight.dtype == DType::BF16 ? DType::BF16 : DType::F32;
}

void moe_router(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor x,
                Tensor router_weight, Tensor correction_bias, const RouterParams& p) {
  OSPREY_CHECK(router_logits.dtype == router_logits_dtype(router_weight),
               "moe_router: router_logits are ", dtype_name(router_logits.dtype), " for a ",
               dtype_name(router_weight.dtype), " gate weight; expected ",
               dtype_name(router_logits_dtype(router_weight)));
  ops::linear(router_logits, x, LinearWeight{router_weight, {}});
  ops::moe_route(topk_ids, topk_weights, router_logits, correction_bias, p);
}

}  // namespace osprey
