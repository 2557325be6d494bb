// CUDA embedding lookup: out [n_tokens, D] = table[ids[t]], converted to out's dtype.
//   ids [n_tokens] I32 (device); table [V, D] F32 or BF16; out F32 or BF16.
//   Precondition: 0 ≤ ids[t] < V (a caller bug otherwise: the kernel traps).
//   Grid: one block per token, 256 threads striding over D (coalesced row copy).
#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/embedding.h"

namespace osprey::ops::cuda {

namespace {
template <typename To, typename Ti>
__global__ void embedding_kernel(To* __restrict__ out, const int32_t* __restrict__ ids,
                                 const Ti* __restrict__ table, int64_t vocab, int64_t d) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0 || id >= vocab) __trap();
  const Ti* row = table + int64_t(id) * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    out[t * d + i] = from_f32<To>(to_f32(row[i]));
}
}  // namespace

void embedding(Tensor out, Tensor ids, Tensor table) {
  check_device(ids, "embedding", "ids");
  check_device(table, "embedding", "table");
  const int64_t n = ids.numel(), d = table.size(1), v = table.size(0);
  OSPREY_CHECK(out.numel() == n * d && ids.dtype == DType::I32, "embedding shapes");
  if (n == 0) return;
  OSPREY_DISPATCH_FLOAT(out.dtype, To, OSPREY_DISPATCH_FLOAT(table.dtype, Ti, {
                          launch_pdl(embedding_kernel<To, Ti>, unsigned(n), 256, 0,
                                     static_cast<To*>(out.data), ids.ptr<int32_t>(),
                                     static_cast<const Ti*>(table.data), v, d);
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
