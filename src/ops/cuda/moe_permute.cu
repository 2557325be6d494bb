// CUDA routing permutation and tile schedule of the grouped experts (contract and math in
// ops/moe_schedule.h; the host reference moe_schedule_reference must equal it exactly).
// moe_permute_kernel: one block of kPermuteThreads = 1024 threads; E ≤ 1024 (thread e owns
// expert e in the scans); rows < 2^31. Shared memory: 4 int arrays of [E (+1)] ≈ 16 KB.
//   1. count[e]: shared-memory atomicAdd over the rows (a count does not depend on the order).
//   2. Two block-wide exclusive scans, one expert per thread: count → offsets, and
//      ceil(count / BM) → tile_start.
//   3. tiles[j] = moe_tile_at(j) for j < max_tiles (binary search of tile_start; −1 past the end).
//   4. Stable placement, 1024 pairs a round: each warp ranks its lanes among the lanes with the
//      same expert (__match_any_sync; rank = such lanes below), then the 32 warps in turn take
//      rows from cursor[e] (initialised to offsets[e]), so that pair i lands at
//      offsets[e] + #{j < i : ids[j] = e}: sorted by expert, then by i. One barrier per warp turn
//      (32 a round; a 5,000-token prefill with K = 8 takes 40 rounds).
// An expert id outside [0, E) traps the kernel (moe_route never writes one; the old host path
// checked it there).
#include <cstdio>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/moe_experts.cuh"

namespace osprey::ops::cuda {

namespace {
constexpr int kPermuteThreads = 1024;
constexpr int kPermuteWarps = kPermuteThreads / 32;
constexpr int kMaxPermuteExperts = kPermuteThreads;

// Exclusive prefix sum of v over the block (blockDim.x = kPermuteThreads); *total = the sum.
// warp_sums: 32 ints of shared memory. Two barriers; safe to call back to back (each warp only
// rewrites its own warp_sums slot before the first barrier, after reading it in the last call).
__device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int s = warp_sums[lane];
    int si = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, si, o);
      if (lane >= o) si += u;
    }
    warp_sums[lane] = si - s;
    if (lane == 31) *total = si;
  }
  __syncthreads();
  return warp_sums[warp] + incl - v;
}

__global__ void __launch_bounds__(kPermuteThreads)
    moe_permute_kernel(int32_t* __restrict__ perm, int32_t* __restrict__ inv,
                       int32_t* __restrict__ offsets, MoeTile* __restrict__ tiles,
                       const int32_t* __restrict__ ids, int rows, int E, int max_tiles,
                       int tile_rows) {
  pdl_wait();
  pdl_trigger();
  __shared__ int32_t count[kMaxPermuteExperts];           // [E]
  __shared__ int32_t start[kMaxPermuteExperts + 1];       // [E + 1] offsets
  __shared__ int32_t tile_start[kMaxPermuteExperts + 1];  // [E + 1]
  __shared__ int32_t cursor[kMaxPermuteExperts];          // [E] next free sorted row
  __shared__ int warp_sums[32];
  __shared__ int total_rows, total_tiles;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < E) count[tid] = 0;
  __syncthreads();
  for (int i = tid; i < rows; i += kPermuteThreads) {
    const int e = ids[i];
    if (e < 0 || e >= E) {
      printf("moe_permute: pair %d has expert id %d, not in [0, %d)\n", i, e, E);
      __trap();
    }
    atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int c = tid < E ? count[tid] : 0;
  const int row_begin = block_exclusive_scan(c, warp_sums, &total_rows);
  const int tile_begin =
      block_exclusive_scan((c + tile_rows - 1) / tile_rows, warp_sums, &total_tiles);
  if (tid < E) {
    start[tid] = row_begin;
    cursor[tid] = row_begin;
    tile_start[tid] = tile_begin;
    offsets[tid] = row_begin;
  }
  if (tid == 0) {  // total_* were written before the scan's last barrier
    start[E] = total_rows;
    tile_start[E] = total_tiles;
    offsets[E] = total_rows;
    if (total_tiles > max_tiles) {
      printf("moe_permute: %d tiles over the bound %d\n", total_tiles, max_tiles);
      __trap();
    }
  }
  __syncthreads();
  for (int j = tid; j < max_tiles; j += kPermuteThreads)
    tiles[j] = moe_tile_at(j, tile_start, start, E, tile_rows);
  for (int base = 0; base < rows; base += kPermuteThreads) {
    const int i = base + tid;
    const bool valid = i < rows;
    const int e = valid ? ids[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int n_same = __popc(peers);
    for (int w = 0; w < kPermuteWarps && base + w * 32 < rows; ++w) {  // block-uniform bound
      if (warp == w) {
        const int first = valid ? cursor[e] : 0;
        __syncwarp();  // every lane has read cursor[] before a group's first lane moves it
        if (valid) {
          if (rank == 0) cursor[e] = first + n_same;
          perm[first + rank] = i;
          inv[i] = first + rank;
        }
      }
      __syncthreads();
    }
  }
}
}  // namespace

void launch_moe_permute(int32_t* perm, int32_t* inv, int32_t* offsets, MoeTile* tiles,
                        const int32_t* ids, int rows, int n_experts, int max_tiles, int tile_rows) {
  OSPREY_CHECK(n_experts >= 1 && n_experts <= kMaxPermuteExperts && rows >= 0 && tile_rows >= 1 &&
                   max_tiles == moe_max_tiles(rows, n_experts, tile_rows),
               "moe_permute: ", rows, " rows, ", n_experts, " experts (at most ",
               kMaxPermuteExperts, "), ", max_tiles, " tiles");
  launch_pdl(moe_permute_kernel, 1, kPermuteThreads, 0, perm, inv, offsets, tiles, ids, rows,
             n_experts, max_tiles, tile_rows);
  OSPREY_CUDA_LAUNCH_CHECK();
}

void moe_permute(Tensor perm, Tensor inv, Tensor offsets, Tensor tiles, Tensor topk_ids,
                 int n_experts, int tile_rows) {
  check_device(topk_ids, "moe_permute", "topk_ids");
  const int64_t rows = topk_ids.numel(), max_tiles = moe_max_tiles(rows, n_experts, tile_rows);
  for (const Tensor* t : {&perm, &inv, &offsets, &tiles}) check_device(*t, "moe_permute", "output");
  OSPREY_CHECK(topk_ids.dtype == DType::I32 && perm.dtype == DType::I32 &&
                   inv.dtype == DType::I32 && offsets.dtype == DType::I32 &&
                   tiles.dtype == DType::I32 && perm.numel() == rows && inv.numel() == rows &&
                   offsets.numel() == n_experts + 1 && tiles.numel() == max_tiles * 4 &&
                   rows < (int64_t(1) << 31),
               "moe_permute shapes");
  launch_moe_permute(perm.ptr<int32_t>(), inv.ptr<int32_t>(), offsets.ptr<int32_t>(),
                     static_cast<MoeTile*>(tiles.data), topk_ids.ptr<int32_t>(), int(rows),
                     n_experts, int(max_tiles), tile_rows);
}

}  // namespace osprey::ops::cuda
