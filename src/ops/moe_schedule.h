// The routing permutation and tile schedule of the grouped MoE experts (ops/moe.h's moe_experts).
//
// The routed pairs i = t·K + slot (rows = n_tokens·K of them, expert ids[i] = topk_ids[t, slot])
// are sorted by expert, stably (ties keep ascending i), so that each expert's rows are contiguous:
//   count[e]        = #{i : ids[i] = e}
//   offsets [E + 1] : offsets[e] = Σ_{e' < e} count[e'];  offsets[E] = rows
//   perm    [rows]  : sorted row r → i; expert e owns r ∈ [offsets[e], offsets[e + 1]), i
//   ascending,
//                     so r = offsets[ids[i]] + #{j < i : ids[j] = ids[i]}
//   inv     [rows]  : i → r (perm[inv[i]] = i)
// Tile schedule of the grouped GEMMs: each expert's rows cut into tiles of kMoeTileRows rows,
// numbered expert by expert:
//   tile_start [E + 1] : tile_start[e] = Σ_{e' < e} ceil(count[e'] / kMoeTileRows)
//   tiles [max_tiles]  : tiles[j] = {expert e, row0, row1} for the tile j ∈ [tile_start[e],
//                        tile_start[e + 1]) of e: row0 = offsets[e] + (j − tile_start[e])·BM,
//                        row1 = min(row0 + BM, offsets[e + 1]); expert −1 for j ≥ tile_start[E].
//   max_tiles = moe_max_tiles(rows, E) = ceil(rows / BM) + min(E, rows) ≥ Σ_e ceil(count[e] / BM)
//   for every routing (Σ_e ceil(c_e/BM) ≤ Σ_{c_e>0} (c_e/BM + 1) ≤ rows/BM + #{e : c_e > 0}): the
//   host sizes the GEMM grids from n_tokens and E alone, and the blocks past the real tile count
//   find expert −1 and exit. No device → host copy, so a step can be captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <vector>

#include "core/host_device.h"
#include "core/tensor.h"

namespace osprey {

constexpr int kMoeTileRows = 64;  // BM: rows of one expert per GEMM tile

struct alignas(16) MoeTile {
  int32_t expert;  // −1: no tile (past the real tile count)
  int32_t row0;    // sorted rows [row0, row1), all of `expert`
  int32_t row1;
  int32_t pad;  // 16-byte entries: one vector load per block
};

// BM = tile_rows: kMoeTileRows for the WMMA grouped GEMMs, kSwapAbMoeTileRows (16) for the FP8
// decode path (ops/cuda/gemm/fp8_swapab.cuh); the bound below holds for any BM ≥ 1.
OSPREY_HOST_DEVICE inline int64_t moe_max_tiles(int64_t rows, int64_t n_experts,
                                                int64_t tile_rows = kMoeTileRows) {
  return (rows + tile_rows - 1) / tile_rows + (rows < n_experts ? rows : n_experts);
}

// Tile j of the schedule, from tile_start [E + 1] and offsets [E + 1] (see above).
OSPREY_HOST_DEVICE inline MoeTile moe_tile_at(int j, const int32_t* tile_start,
                                              const int32_t* offsets, int n_experts,
                                              int tile_rows = kMoeTileRows) {
  if (j >= tile_start[n_experts]) return MoeTile{-1, 0, 0, 0};
  int lo = 0, hi = n_experts - 1;  // the last e with tile_start[e] ≤ j: the expert that owns j
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_start[mid] <= j)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int row0 = offsets[lo] + (j - tile_start[lo]) * tile_rows;
  const int end = offsets[lo + 1];
  return MoeTile{lo, row0, row0 + tile_rows < end ? row0 + tile_rows : end, 0};
}

// The whole permutation and schedule, computed on the host (the reference the CUDA twin's
// moe_permute must equal exactly, and what the CPU tests check the properties of).
struct MoeSchedule {
  std::vector<int32_t> offsets;     // [E + 1]
  std::vector<int32_t> perm;        // [rows]
  std::vector<int32_t> inv;         // [rows]
  std::vector<int32_t> tile_start;  // [E + 1]
  std::vector<MoeTile> tiles;       // [moe_max_tiles(rows, E, tile_rows)]
};
MoeSchedule moe_schedule_reference(const int32_t* ids, int64_t rows, int n_experts,
                                   int tile_rows = kMoeTileRows);

namespace ops::cuda {
// The device computation of the above, one kernel (ops/cuda/moe_permute.cu), as moe_experts runs
// it; exposed for the twin test. topk_ids [n_tokens, K] I32 on the device; outputs I32 device
// tensors: perm [rows], inv [rows], offsets [E + 1], tiles [moe_max_tiles(rows, E, tile_rows), 4].
void moe_permute(Tensor perm, Tensor inv, Tensor offsets, Tensor tiles, Tensor topk_ids,
                 int n_experts, int tile_rows = kMoeTileRows);
}  // namespace ops::cuda

}  // namespace osprey
