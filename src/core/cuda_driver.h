// A CUDA driver entry point reached through the runtime (osprey links cudart, not libcuda).
// Built only with the CUDA backend (src/core/CMakeLists.txt adds cuda_graph.cpp and links cudart).
#pragma once

#include <cuda_runtime.h>

namespace osprey::cuda {

// The driver function `symbol` at ABI `version` (e.g. 12000 for CUDA 12.0's signature) as F, or
// nullptr when the driver has none; callers that need it say so with their own error.
template <typename F>
F driver_entry(const char* symbol, unsigned version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(symbol, &f, version, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(f);
}

}  // namespace osprey::cuda
