// Internal interface of the CUDA grouped experts: moe.cu (moe_experts) drives moe_permute.cu (the
// routing permutation and tile schedule, ops/moe_schedule.h) and moe_gemm.cu (the grouped GEMMs).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "ops/moe_schedule.h"

namespace osprey::ops::cuda {

// One expert's weights on the device, in a device array [E] built once per expert list (moe.cu).
// BF16 weights have null scales.
struct MoeExpertPtrs {
  const void* gate;         // [I, D] BF16 or F8_E4M3
  const void* up;           // [I, D]
  const void* down;         // [D, I]
  const float* gate_scale;  // [ceil(I/128), ceil(D/128)] F32 (F8_E4M3 only)
  const float* up_scale;    // [ceil(I/128), ceil(D/128)]
  const float* down_scale;  // [ceil(D/128), ceil(I/128)]
  // F8_E4M3 weights: device CUtensorMaps of gate, up and down (hopper/tma_map.h
  // tma_map_u8_2d_sw128, boxes of 128 rows × 128 bytes) for the swap-AB kernels' TMA weight loads;
  // null for BF16 weights. Derived from the pointers above (moe.cu builds them with the table).
  const void* gate_map = nullptr;
  const void* up_map = nullptr;
  const void* down_map = nullptr;
  bool operator==(const MoeExpertPtrs&) const = default;
};

// moe_permute_kernel (one block): ids [rows] → perm [rows], inv [rows], offsets [E + 1],
// tiles [max_tiles] (max_tiles = moe_max_tiles(rows, E, tile_rows)). 1 ≤ E ≤ 1024.
void launch_moe_permute(int32_t* perm, int32_t* inv, int32_t* offsets, MoeTile* tiles,
                        const int32_t* ids, int rows, int n_experts, int max_tiles,
                        int tile_rows = kMoeTileRows);

// h [rows, I] BF16 = silu(xs · gateᵀ) ⊙ (xs · upᵀ), xs[r] = x[perm[r] / top_k] (x [n_tokens, D]
// F32 or BF16), each tile with its expert's gate and up. weight_type BF16 or F8_E4M3.
void launch_moe_gate_up(void* h, const void* x, DType x_type, DType weight_type,
                        const MoeTile* tiles, int max_tiles, const MoeExpertPtrs* experts,
                        const int32_t* perm, int top_k, int64_t D, int64_t I);

// y [rows, D] F32 = h · downᵀ, each tile with its expert's down.
void launch_moe_down(float* y, const void* h, DType weight_type, const MoeTile* tiles,
                     int max_tiles, const MoeExpertPtrs* experts, int64_t D, int64_t I);

}  // namespace osprey::ops::cuda
