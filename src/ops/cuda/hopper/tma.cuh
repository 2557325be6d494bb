// Hopper TMA (the Tensor Memory Accelerator) on the device side: tiled bulk loads of a box of a
// tensor described by a CUtensorMap (encoded on the host, hopper/tma_map.h) into shared memory,
// completing their bytes on an mbarrier, and the arrive that announces those bytes. One thread
// issues a whole box; elements of the box outside the tensor (coordinates below 0 or past a
// dimension's end) are written as zeros and still count toward the bytes the barrier expects.
// With CU_TENSOR_MAP_SWIZZLE_128B and a 128-byte inner box row the box lands in the SW128 layout
// of hopper/wgmma.cuh (the destination 1024-byte aligned).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: nothing here calls the driver)

#include <cstdint>

#include "ops/cuda/hopper/wgmma.cuh"

namespace osprey::ops::cuda::hopper {

// Arrives on the barrier (one of its expected arrivals) and raises the bytes its current phase
// waits for by `bytes`: the phase completes once every arrival is in and those bytes have landed.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// Fetches the tensor map (a __grid_constant__ kernel parameter) into the TMA unit's cache ahead
// of the first load.
__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Brings global [p, p + bytes) into L2 with one bulk request (no destination, nothing to wait
// for): p 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// Loads the 3D box whose first element is at (x, y, z) (x innermost, in elements; any of them may
// be negative or past the end: those elements are zero) into shared memory at dst, its bytes
// completing on bar (which the caller armed with mbar_arrive_expect_tx).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t x, int32_t y, int32_t z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar))
      : "memory");
}

// The same for a 2D box whose first element is at (x, y) (x innermost, in elements). `map` may be
// a __grid_constant__ parameter or a map in global memory written before the launch.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, uint64_t* bar, int32_t x,
                                            int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_u32(bar))
      : "memory");
}

}  // namespace osprey::ops::cuda::hopper
