#include "ops/cuda/hopper/tma_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "core/cuda_driver.h"
#include "core/error.h"

namespace osprey::ops::cuda::hopper {

namespace {
// cuTensorMapEncodeTiled through the runtime's driver entry point (CUDA 12.0's signature).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const auto f = osprey::cuda::driver_entry<PFN_cuTensorMapEncodeTiled_v12000>(
      "cuTensorMapEncodeTiled", 12000);
  OSPREY_CHECK(f, "TMA: the driver has no cuTensorMapEncodeTiled (CUDA 12.0 ABI)");
  return f;
}
}  // namespace

CUtensorMap tma_map_bf16_3d_sw128(const void* base, uint64_t d0, uint64_t d1, uint64_t d2,
                                  uint64_t row_bytes, uint64_t slab_bytes, uint32_t b0, uint32_t b1,
                                  uint32_t b2) {
  OSPREY_CHECK(b0 * 2 == 128, "TMA SW128 map: the inner box is ", b0, " BF16, not 64 (128 bytes)");
  CUtensorMap map{};
  const cuuint64_t dims[3] = {d0, d1, d2};
  const cuuint64_t strides[2] = {row_bytes, slab_bytes};  // bytes, dimensions 1 and 2
  const cuuint32_t box[3] = {b0, b1, b2};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  // L2 promotion of 256 bytes: a box row (128 bytes) brings its 256-byte-aligned neighbour into
  // L2 with it, which the next box along d0 (the same rows' next 64 columns) reads.
  const CUresult r = encode_tiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  OSPREY_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for [", d2,
               ", ", d1, ", ", d0, "] BF16 at ", base, ", strides ", row_bytes, " / ", slab_bytes,
               " bytes, box [", b2, ", ", b1, ", ", b0, "]");
  return map;
}

CUtensorMap tma_map_u8_2d_sw128(const void* base, uint64_t cols, uint64_t rows, uint64_t row_bytes,
                                uint32_t box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {128, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  // L2 promotion of 256 bytes: a weight row's next K group (the next stage's box) comes with it.
  const CUresult r =
      encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                     box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  OSPREY_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for [",
               rows, ", ", cols, "] bytes at ", base, ", row stride ", row_bytes, ", box [",
               box_rows, ", 128]");
  return map;
}

}  // namespace osprey::ops::cuda::hopper
