// CUDA embedding lookup: out [n_tokens, D] = table[ids[t]], converted to out's dtype.
//   ids [n_tokens] I32 (device); table [V, D] F32 or BF16; out F32 or BF16.
//   Precondition: 0 ≤ ids[t] < V (a caller bug otherwise: the kernel traps).
//   Grid: embedding_vec_kernel, [n_tokens, ceil(D / 4 / 128)] × 128 threads, four consecutive
//   values a thread (one 16-byte F32 / 8-byte BF16 load), so every load of a row is in flight at
//   once; where D % 4 ≠ 0 or a row is not so aligned, embedding_kernel: one block per token, 256
//   threads striding over D. Why: striding waited out a load latency per 256 values (28 for D =
//   7168): 13.4 µs a call at one token on the H100 (Nsight Compute, bench step B = 1), twice a step
//   (the embedding, and the logits rows' gather that reuses this kernel). The values are the same.
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
constexpr int kVecThreads = 128;
template <typename To, typename Ti>
__global__ void __launch_bounds__(kVecThreads)
    embedding_vec_kernel(To* __restrict__ out, const int32_t* __restrict__ ids,
                         const Ti* __restrict__ table, int64_t vocab, int64_t d) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t c = 4 * (int64_t(blockIdx.y) * kVecThreads + threadIdx.x);  // first column
  const int32_t id = ids[t];
  if (id < 0 || id >= vocab) __trap();
  if (c >= d) return;
  float v[4];
  load4(table + int64_t(id) * d + c, v);
  store4(out + t * d + c, v);
}
}  // namespace

void embedding(Tensor out, Tensor ids, Tensor table) {
  check_device(ids, "embedding", "ids");
  check_device(table, "embedding", "table");
  const int64_t n = ids.numel(), d = table.size(1), v = table.size(0);
  OSPREY_CHECK(out.numel() == n * d && ids.dtype == DType::I32, "embedding shapes");
  if (n == 0) return;
  const int64_t eo = int64_t(dtype_size(out.dtype)), et = int64_t(dtype_size(table.dtype));
  const bool vec = rows_aligned(out.data, d, eo, 4 * eo) && rows_aligned(table.data, d, et, 4 * et);
  const unsigned col_blocks = unsigned((d / 4 + kVecThreads - 1) / kVecThreads);
  OSPREY_DISPATCH_FLOAT(
      out.dtype, To, OSPREY_DISPATCH_FLOAT(table.dtype, Ti, {
        if (vec)
          launch_pdl(embedding_vec_kernel<To, Ti>, dim3(unsigned(n), col_blocks), kVecThreads, 0,
                     static_cast<To*>(out.data), ids.ptr<int32_t>(),
                     static_cast<const Ti*>(table.data), v, d);
        else
          launch_pdl(embedding_kernel<To, Ti>, unsigned(n), 256, 0, static_cast<To*>(out.data),
                     ids.ptr<int32_t>(), static_cast<const Ti*>(table.data), v, d);
      }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
