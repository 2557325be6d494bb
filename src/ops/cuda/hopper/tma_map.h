// Host side of TMA (hopper/tma.cuh): encoding a CUtensorMap, the descriptor a kernel receives as a
// __grid_constant__ parameter. Encoding runs on the host only (no stream work, so it is legal
// inside a CUDA graph capture); the driver's cuTensorMapEncodeTiled is reached through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace osprey::ops::cuda::hopper {

// The map of a 3D BF16 tensor [d2, d1, d0] (d0 innermost, contiguous) at `base` (16-byte
// aligned), rows d1 `row_bytes` apart and slabs d2 `slab_bytes` apart (multiples of 16), loaded in
// boxes [b2, b1, b0] with the 128-byte swizzle (b0 · 2 = 128: one SW128 region per box and slab),
// out-of-range elements read as zero. Fails with the driver's error on an invalid geometry.
CUtensorMap tma_map_bf16_3d_sw128(const void* base, uint64_t d0, uint64_t d1, uint64_t d2,
                                  uint64_t row_bytes, uint64_t slab_bytes, uint32_t b0, uint32_t b1,
                                  uint32_t b2);

// The map of a 2D byte tensor (e4m3 weights) [rows, cols] at `base` (16-byte aligned), rows
// `row_bytes` apart (a multiple of 16), loaded in boxes [box_rows, 128 bytes] with the 128-byte
// swizzle: a box lands as box_rows SW128 rows (hopper/wgmma.cuh: one e4m3 K group a row), elements
// past either end read as zero. Fails with the driver's error on an invalid geometry.
CUtensorMap tma_map_u8_2d_sw128(const void* base, uint64_t cols, uint64_t rows, uint64_t row_bytes,
                                uint32_t box_rows);

}  // namespace osprey::ops::cuda::hopper
