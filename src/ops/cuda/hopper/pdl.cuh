// Programmatic dependent launch (PDL, sm_90): a kernel launched with programmatic stream
// serialisation may start while the kernel before it in the stream is still running, so its
// launch, block scheduling and prologue overlap the predecessor's tail instead of following it.
//
// The contract every osprey kernel keeps (a kernel's first statements):
//   pdl_wait();     // griddepcontrol.wait: blocks until every grid this one depends on has
//                   // completed and its memory is visible; nothing of the predecessor's output is
//                   // read, and nothing it might still read is written, before this.
//   pdl_trigger();  // griddepcontrol.launch_dependents: the next kernel may be scheduled now.
// Triggering only after waiting keeps at most one kernel ahead of the running one, and makes the
// chain transitive: kernel N+2 waits for N+1, which could not pass its own wait before N completed.
// Work that reads only constants (weights) may come before pdl_wait (an L2 prefetch of a GEMM's
// first weight tiles, fp8_swapab.cu); it must not write memory.
//
// Without the launch attribute (OSPREY_PDL=0, a kernel after a cuBLASLt call or a copy) both
// instructions are no-ops and the stream orders kernels as always. Stream capture records the
// attribute as a programmatic edge of the graph (CUDA ≥ 12.3), so graph replays keep the overlap.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "ops/cuda/common.cuh"
#include "ops/pdl.h"

namespace osprey::ops::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream()>>>(args...) with programmatic stream serialisation allowed
// (when ops/pdl.h pdl_enabled()), then the launch check. The arguments convert to the kernel's
// parameter types as in a <<<>>> launch.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  OSPREY_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, Params(std::forward<Args>(args))...));
}

// launch_pdl in thread-block clusters of `cluster` CTAs (each grid dimension a multiple of the
// cluster's).
template <typename... Params, typename... Args>
void launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, dim3 cluster,
                        Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster.x;
  attr[0].val.clusterDim.y = cluster.y;
  attr[0].val.clusterDim.z = cluster.z;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  OSPREY_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, Params(std::forward<Args>(args))...));
}

}  // namespace osprey::ops::cuda
