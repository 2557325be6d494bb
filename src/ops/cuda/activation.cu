// CUDA gated activation: out [n, I] = silu(gate) ⊙ up, silu(g) = g / (1 + e^-g), in F32.
//   gate, up, out: F32 or BF16, all one dtype; out may alias gate or up (elementwise).
//   Grid: grid-stride over elements, 256 threads.
#include "ops/activation.h"
#include "ops/cuda/common.cuh"

namespace osprey::ops::cuda {

namespace {
template <typename T>
__global__ void silu_mul_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]);
    out[i] = from_f32<T>(g / (1.0f + expf(-g)) * to_f32(up[i]));
  }
}
}  // namespace

void silu_mul(Tensor out, Tensor gate, Tensor up) {
  check_device(gate, "silu_mul", "gate");
  check_device(up, "silu_mul", "up");
  OSPREY_CHECK(out.numel() == gate.numel() && gate.numel() == up.numel() &&
                   out.dtype == gate.dtype && gate.dtype == up.dtype,
               "silu_mul shapes/dtypes");
  const int64_t n = out.numel();
  if (n == 0) return;
  const int blocks = int(std::min<int64_t>((n + 255) / 256, 65536));
  OSPREY_DISPATCH_FLOAT(out.dtype, T, {
    silu_mul_kernel<T><<<blocks, 256, 0, stream()>>>(static_cast<T*>(out.data),
                                                    static_cast<const T*>(gate.data),
                                                    static_cast<const T*>(up.data), n);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
