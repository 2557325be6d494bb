// sm_90a FP8 weight-streaming GEMM, "swap AB": the weights are wgmma's A operand (64 weight rows a
// warpgroup = the M side) and the few tokens its B operand (N = BN = 16, 32 or 64), so a decode
// step's handful of tokens does not waste a 64-row tile and the kernel's time is the weights'
// bytes. Arithmetic and the host interface: fp8_swapab.cuh (W8A8, 1×128 activation groups,
// 128×128 weight blocks, promotion per group in F32 registers).
//
// Shapes: W8 [N, K] e4m3 row-major (the checkpoint's layout; K-major, as FP8 wgmma needs for A),
//   scale_inv [ceil(N/128), K/128] F32; x8 [n_x, K] e4m3 (K-major B), xs [n_x, K/128] F32.
// Modes:
//   kDense:  up to kMaxDenseSegs linears of one x (q_a, kv_a and the indexer's wk; gate and up)
//            in one launch, y_i [n, N_i] F32/BF16 = x · W_iᵀ; an item = (BN-token tile, 128-row
//            block of one W_i, K split), item = (split · row blocks + row block) · token tiles +
//            tile, row blocks counted over the linears end to end.
//   kGateUp: an item = (128-row block of I, one tile of one expert's sorted rows); gate and up
//            in one pass (two A tiles a stage), h = silu(g)·u in F32, quantised per 1×128 in the
//            epilogue (the block holds all 128 columns of its group): h8 [rows, I], hs [rows,
//            I/128].
//   kDown:   y [rows, D] F32 = h8 · downᵀ; an item = (128-row block of D, one tile).
//   MoE grid: 1-D over the items (item = tile · row blocks + row block), one block an item or a
//   persistent grid of one block an SM, each block starting at item blockIdx.x and then taking
//   items by static strides or claiming the next from a counter (the stages run on across
//   items: the next item's loads overlap the last one's epilogue). Dense grid: 1-D, one block an
//   item (waves, the default: choose_splits) or persistent (OSPREY_FP8_DENSE_GRID=persistent, a
//   variant: min(items, SMs) blocks by static strides, the split count chosen for the fewest
//   stages on the busiest SM: choose_persistent_splits).
// Block: 384 threads, 1 block an SM (the stages take ~200 KB of shared memory).
//   Warpgroup 0, the producer: per stage of kG consecutive 128-wide K groups ("k-blocks"; kG = 2
//   for the dense path and down, 1 for gate/up, whose stage already holds two weights) it waits
//   for a free stage and issues 16-byte cp.async copies of the 128 weight rows' kG·128 bytes (×2
//   for gate/up; rows past N and k-blocks past K zero-fill) — in the MoE modes, with the experts'
//   TMA maps (MoeExpertPtrs::gate_map ..), thread 0 loads them instead as kNW·kG boxes
//   [128 rows × 128 bytes] on the stage's `full` barrier (expect_tx) —
//   the BN token rows (gathered through perm for gate/up; columns past the tile's rows zero-fill,
//   their scale 0) and the scales, all into the 128-byte swizzled layout (hopper/wgmma.cuh: an
//   e4m3 row of 128 values is one SW128 row), then cp.async.mbarrier.arrive.noinc on the stage's
//   `full` barrier: the copies of up to kStages k-blocks are in flight at once.
//   Warpgroups 1 and 2, the consumers, take weight rows [64·c, 64·c + 64) of the block: per
//   k-block, 4 wgmma m64nBNk32 into a fresh F32 partial, then acc += partial · s_w · s_x[col]
//   (the promotion: the tensor cores' FP8 accumulation never spans more than one group), then
//   arrive on the stage's `empty` barrier.
//   Split K (kDense only, for matrices with too few row blocks to fill the SMs): each split writes
//   its accumulators to a workspace in register order, and the last split of a tile to arrive
//   (a per-tile counter, reset by that block, so the buffer is never refilled) sums them in split
//   order (deterministic) and stores y.
// Preconditions (host-checked): K a multiple of 128; for the MoE modes D and I multiples of 128;
//   16-byte aligned rows (K multiple of 16 follows); n ≥ 1.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm/fp8_swapab.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/hopper/sync.cuh"
#include "ops/cuda/hopper/tma.cuh"
#include "ops/cuda/hopper/tma_map.h"
#include "ops/cuda/stream_fork.h"

namespace osprey::ops::cuda {

namespace {
namespace hw = hopper;

constexpr int kGroup = 128;                 // K group = one scale column = one SW128 row of e4m3
constexpr int kBM = 128;                    // weight rows a block: one scale row block
constexpr int kWgRows = 64;                 // weight rows a consumer warpgroup (wgmma M)
constexpr int kThreads = 384;               // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumers = 256;             // consumer threads
constexpr int kATileBytes = kBM * kGroup;   // 16 KB: one weight tile [128 rows × 128 e4m3]
constexpr int kMaxStages = 8;               // enough in flight to cover the DRAM latency (~1 µs at
                                            // ~30 GB/s an SM is ~32 KB; 8 × 16 KB is 4× that)
constexpr size_t kSmemBudget = 220 * 1024;  // of the 227 KB an sm_90 block may opt into
constexpr int kSplitOverheadKb = 4;         // a block's pipeline fill, in k-blocks (split choice)
constexpr int kMaxSplits = 32;
// The persistent dense grid's cost of an item's split-K partial (written, then read by the last
// split: 256 × BN/2 F32 each way, 16 KB at BN = 16 against a stage's 32 KB of weights), in stages.
constexpr int kSplitItemCostStages = 1;
// Bytes of each of its weight rows a dense block asks L2 for before its PDL wait
// (hopper/pdl.cuh): 1 KB a row (4 stages of 2 k-blocks), 128 KB a block, enough to cover the
// launch-to-first-load gap without crowding the L2 that the predecessor's last blocks still use.
constexpr int kPdlPrefetchRowBytes = 1024;
// Gate/up at 64-row tiles: setmaxnreg moves registers from the producer warpgroup (TMA/cp.async
// issue, the item walk) to the consumers (2 × 32 accumulators + 2 × 32 partials), within the
// 384 × 168 pool the entry cap gives: 128·112 + 256·192 = 63488. ptxas -v: at the entry cap the
// persistent kernel spilled (232 bytes of spill loads); intermediate builds with a producer of 96
// or 104 registers spilled 28–100 bytes (in one, a value reloaded inside the consumers' k-loop:
// Nsight counted 18.5 M local requests, gate/up 12% slower); 112 / 192 spills nothing (the
// consumers read the stage's scales after the wgmma wait, see load_scales).
constexpr int kMoeProducerRegs = 112, kMoeConsumerRegs = 192;
static_assert(128 * kMoeProducerRegs + 256 * kMoeConsumerRegs <= 384 * 168, "setmaxnreg pool");

enum Mode : int { kDense = 0, kGateUp = 1, kDown = 2 };

// A stage holds kG consecutive k-blocks ("groups"): each weight row is read kG·128 contiguous bytes
// at a time (one k-block alone measured 55% of the copy rate on o_proj at n = 1; the MoE path's
// 32 KB stages 86%).
template <int BN, int kMode, int kG>
struct Layout {
  static constexpr int kNW = kMode == kGateUp ? 2 : 1;  // weights a stage
  // A tiles [kNW][kG] of 16 KB each; token tiles [kG] of [BN × 128 e4m3]
  static constexpr int kBOff = kNW * kG * kATileBytes;
  static constexpr int kSaOff = kBOff + kG * BN * kGroup;  // token scales [kG][BN] F32
  static constexpr int kSwOff = kSaOff + kG * BN * 4;      // weight scales [kNW][kG] F32
  static constexpr int kStageBytes = (kSwOff + kNW * kG * 4 + 1023) / 1024 * 1024;
  static constexpr int kStages = int(std::min<size_t>(kMaxStages, kSmemBudget / kStageBytes));
  static constexpr int kBarOff = kStages * kStageBytes;      // full [kStages], empty [kStages]
  static constexpr int kRedOff = kBarOff + 2 * kStages * 8;  // [8 warps][BN] F32 (gate/up), flag
  // MoE: the item whose first stage a stage holds [kStages] (−1: no more items), and the
  // producer's broadcast of its next item
  static constexpr int kItemOff = kRedOff + 8 * BN * 4 + 16;
  static constexpr size_t kSmem = size_t(kItemOff) + (kStages + 1) * 4 + 1024;  // + align slack
  static_assert(kStages >= 2);
  static_assert(BN == 16 || BN == 32 || BN == 64);
  static_assert(kG == 1 || kG == 2 || (kG == 4 && BN == 16 && kMode == kDense));
  static_assert(BN * kG <= 128);  // the scale copies: one thread each
};

// One linear of a dense launch: y [n, N] = x · W8ᵀ with W8 [N, K] e4m3, scales [ceil(N/128),
// K/128]; its row blocks are the launch's rb0 .. rb0 + ceil(N/128) − 1. map: W8's TMA map (boxes
// of 128 rows × 128 K bytes) when Params::weight_tma, read in the kernel's parameter space (the
// kernel's Params is __grid_constant__).
struct DenseSeg {
  CUtensorMap map;
  void* y;
  const uint8_t* w8;
  const float* w_scale;
  int64_t N;
  int rb0;
};
constexpr int kMaxDenseSegs = 4;

struct Params {
  DenseSeg segs[kMaxDenseSegs];  // kDense: [n_segs]
  int n_segs;                    // kDense
  int ttiles;                    // kDense: token tiles of BN
  int rbs;                       // kDense: row blocks of all the linears
  const MoeExpertPtrs* experts;  // MoE: [E]
  const MoeTile* tiles;          // MoE: [max_tiles]
  const int32_t* perm;           // kGateUp: sorted row → t·top_k + slot
  int top_k;
  const uint8_t* x8;  // [n_x, K]
  const float* xs;    // [n_x, K/128] (xs_tok = K/128, xs_grp = 1), or kDense's [K/128, n_pad]
  int64_t xs_tok, xs_grp;  // strides of xs between tokens and between groups
  int64_t n;          // kDense: tokens
  int64_t N, K;       // N: MoE modes (kDense: per linear, DenseSeg::N)
  void* y;            // kDense [n, N] F32/BF16; kDown [rows, N] F32
  uint8_t* h8;        // kGateUp [rows, N]
  float* hs;          // kGateUp [rows, N/128]
  float* ws;          // split-K partials [tiles = rbs · ttiles, splits, 256, BN/2]
  int* counters;      // [tiles], zero between launches
  int splits;
  bool weight_tma;  // the weight tiles come by TMA: the experts' maps (MoE), DenseSeg::map
  int row_blks;     // MoE: N / 128, the row blocks of a tile
  int n_items;      // MoE: max_tiles · row_blks work items, item = tile · row_blks + row_blk;
                    // kDense: splits · rbs · ttiles
  int* sched;       // MoE, persistent with dynamic claims: [next item − gridDim.x, blocks done],
                    // zero between launches; nullptr: static strides
};

// One work item of a block: a weight row block against one token tile.
template <int kNW>
struct Item {
  int row_blk;   // within its weight
  int64_t tok0;  // the item's token columns [tok0, tok0 + ncols)
  int ncols;
  int64_t N;     // its weight's rows
  void* y;       // kDense: its linear's output; kDown: p.y
  int tile;      // kDense: row block (over the launch) · ttiles + token tile (split-K counters)
  int split;     // kDense: its K split
  int sb0, sb1;  // its stages of kG k-blocks [sb0, sb1)
  const uint8_t* w[kNW];
  const float* wsc[kNW];
  const void* wmap[kNW];  // the weights' TMA maps (with p.weight_tma)
};

// Item `item`: kDense, (split · rbs + row block) · ttiles + token tile, the row block's linear
// found among the launch's (unrolled selects: no run-time index into the parameters); MoE, item
// = tile · row_blks + row_blk of the schedule. False past the schedule's real tiles (every later
// item is past them too: the tiles are in order, real ones first).
template <int BN, int kMode, int kNW, int kG>
__device__ __forceinline__ bool item_at(const Params& p, int item, Item<kNW>& it) {
  const int nsb = int((p.K / kGroup + kG - 1) / kG);
  if constexpr (kMode == kDense) {
    const int per_split = p.rbs * p.ttiles;
    it.split = item / per_split;
    const int r = item - it.split * per_split;
    const int rb = r / p.ttiles, tt = r - rb * p.ttiles;
    // (a pointer into the parameters, selected unrolled: no copy of a segment and its map)
    const DenseSeg* S = &p.segs[0];
#pragma unroll
    for (int i = 1; i < kMaxDenseSegs; ++i)
      if (i < p.n_segs && rb >= p.segs[i].rb0) S = &p.segs[i];
    it.row_blk = rb - S->rb0;
    it.tile = r;
    it.tok0 = int64_t(tt) * BN;
    it.ncols = int(min(int64_t(BN), p.n - it.tok0));
    it.N = S->N;
    it.y = S->y;
    it.w[0] = S->w8;
    it.wsc[0] = S->w_scale;
    it.wmap[0] = &S->map;
    const int sb_per = (nsb + p.splits - 1) / p.splits;
    it.sb0 = it.split * sb_per;
    it.sb1 = min(nsb, it.sb0 + sb_per);
    return true;
  } else {
    it.N = p.N;
    it.y = p.y;
    it.tile = 0;
    it.split = 0;
    it.sb0 = 0;
    it.sb1 = nsb;
    const int tile = item / p.row_blks;
    it.row_blk = item - tile * p.row_blks;
    const MoeTile t = p.tiles[tile];
    if (t.expert < 0) return false;
    it.tok0 = t.row0;
    it.ncols = t.row1 - t.row0;
    const MoeExpertPtrs& e = p.experts[t.expert];
    if constexpr (kMode == kGateUp) {
      it.w[0] = static_cast<const uint8_t*>(e.gate);
      it.wsc[0] = e.gate_scale;
      it.w[kNW - 1] = static_cast<const uint8_t*>(e.up);
      it.wsc[kNW - 1] = e.up_scale;
      it.wmap[0] = e.gate_map;
      it.wmap[kNW - 1] = e.up_map;
    } else {
      it.w[0] = static_cast<const uint8_t*>(e.down);
      it.wsc[0] = e.down_scale;
      it.wmap[0] = e.down_map;
    }
    return true;
  }
}

template <int BN>
__device__ __forceinline__ void mma_k32(float (&d)[BN / 2], uint64_t a, uint64_t b, bool acc) {
  if constexpr (BN == 16)
    hw::wgmma_m64n16k32_e4m3_ss(d, a, b, acc);
  else if constexpr (BN == 32)
    hw::wgmma_m64n32k32_e4m3_ss(d, a, b, acc);
  else
    hw::wgmma_m64n64k32_e4m3_ss(d, a, b, acc);
}

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + __expf(-g));
}

// kSplit: prefill gate/up only, gate and up as two wgmma groups (set_fp8_moe_split_waits).
template <int BN, int kMode, int kG, typename Ty, bool kSplit = false>
__global__ void __launch_bounds__(kThreads, 1) fp8_swapab_kernel(const __grid_constant__ Params p) {
  using L = Layout<BN, kMode, kG>;
  if constexpr (kMode == kDense) {
    // The weights are constants: before waiting for the previous kernel (hopper/pdl.cuh), pull
    // the first kPdlPrefetchRowBytes of each row of this block's first item into L2, so under PDL
    // the stream of weight bytes starts during the predecessor's tail. Row tid of the block's
    // 128: one contiguous range.
    if (threadIdx.x < kBM && int(blockIdx.x) < p.n_items) {
      Item<1> I;
      item_at<BN, kMode, 1, kG>(p, int(blockIdx.x), I);
      const int64_t row = int64_t(I.row_blk) * kBM + threadIdx.x;
      const int64_t k0 = int64_t(I.sb0) * kG * kGroup;
      const int64_t k1 =
          min(p.K, k0 + min(int64_t(I.sb1 - I.sb0) * kG * kGroup, int64_t(kPdlPrefetchRowBytes)));
      if (row < I.N && k1 > k0) hw::bulk_prefetch_l2(I.w[0] + row * p.K + k0, uint32_t(k1 - k0));
    }
  }
  pdl_wait();
  pdl_trigger();
  constexpr int kNW = L::kNW;
  constexpr int kR = BN / 2;  // accumulator registers a thread, per weight
  constexpr bool kRealloc = kMode == kGateUp && BN == 64;  // prefill gate/up (kMoeConsumerRegs)
  static_assert(!kSplit || kRealloc);
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarOff);
  uint64_t* empty = full + L::kStages;
  float* red = reinterpret_cast<float*>(smem + L::kRedOff);  // [8][BN]
  int* flag = reinterpret_cast<int*>(red + 8 * BN);
  int* stage_item = reinterpret_cast<int*>(smem + L::kItemOff);  // [kStages]
  int* next_item = stage_item + L::kStages;

  const int tid = threadIdx.x;
  // kDense: a 1-D grid, block b taking items b + j·gridDim.x (the token tiles of one row block
  // are consecutive items: run side by side, they read its weights once from DRAM; one block an
  // item when gridDim.x = n_items). MoE: a 1-D grid over the items, block
  // b starting with item b; then (a persistent grid of one block an SM) items b + j·gridDim.x, or
  // with p.sched the next unclaimed one (an atomic counter: the blocks take the items in order as
  // they free up, as the hardware hands out the blocks of a grid of one block an item, so the
  // items running at once stay a window of consecutive ones and share their weights in L2). The
  // producer fills the next item's stages while the consumers finish the last one, and tells
  // them each item in stage_item[] of its first stage (−1 after the last).
  // The block's geometry, computed in each role after its setmaxnreg (computed once before it,
  // two of these values were spilled and reloaded inside the consumers' k-loop).
#define OSPREY_SWAPAB_GEOMETRY                       \
  const int64_t K = p.K;                             \
  const int nkb = int(K / kGroup);                   \
  const int item0 = int(blockIdx.x);                 \
  const int item_step = int(gridDim.x);              \
  const int n_items = p.n_items;                     \
  const bool tma = p.weight_tma; /* block-uniform */ \
  (void)nkb, (void)item_step, (void)tma

  if (tid == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      // every producer thread's noinc arrival, and thread 0's arrival (expect_tx with TMA; in the
      // MoE modes it also publishes stage_item)
      hw::mbar_init(&full[s], kMode != kDense || p.weight_tma ? 129 : 128);
      hw::mbar_init(&empty[s], kConsumers);  // every consumer thread
    }
    hw::mbar_init_fence();
  }
  __syncthreads();

  // `it` counts the block's stages over all its items (stage it % kStages, its phase
  // (it / kStages) & 1): the producer and the consumers walk the same items and stages.
  if (tid < 128) {
    if constexpr (kRealloc) hw::regs_dealloc<kMoeProducerRegs>();
    OSPREY_SWAPAB_GEOMETRY;
    // Producer. A weight row's kG·128 bytes of a stage are 8·kG chunks of 16 B: thread tid copies
    // chunk cc = tid % (8·kG) (group cc / 8, chunk cc % 8) of rows tid / (8·kG) + (16 / kG)·i.
    constexpr int kRowStep = 16 / kG;
    const int cc = tid % (8 * kG), gi = cc >> 3, c = cc & 7, r0 = tid / (8 * kG);
    constexpr int kBRowsPer = BN * kG / 16;  // token rows a thread
    // Scale copies: thread t < kG·BN the token scale of group t / BN, column t % BN; threads
    // 64 + (wi·kG + g) the weight scales.
    const int sa_g = tid / BN, sa_col = tid % BN;
    const int sw_i = tid - 64, sw_w = sw_i / kG, sw_g = sw_i % kG;
    int it = 0;
    for (int item = item0; item < n_items;) {
      Item<kNW> I;
      if (!item_at<BN, kMode, kNW, kG>(p, item, I)) break;
      const int row_blk = I.row_blk, ncols = I.ncols, sb0 = I.sb0, sb1 = I.sb1;
      const int64_t tok0 = I.tok0, N = I.N;
      if (tma && tid == 0)
#pragma unroll
        for (int wi = 0; wi < kNW; ++wi) hw::tma_prefetch_map(I.wmap[wi]);
      const uint8_t* xrow[kBRowsPer];
      bool xvalid[kBRowsPer];
#pragma unroll
      for (int j = 0; j < kBRowsPer; ++j) {
        const int r = r0 + kRowStep * j;
        xvalid[j] = r < ncols;
        int64_t src = tok0 + r;
        if constexpr (kMode == kGateUp) src = xvalid[j] ? p.perm[tok0 + r] / p.top_k : 0;
        xrow[j] = p.x8 + (xvalid[j] ? src : 0) * K;
      }
      const bool sa_valid = tid < kG * BN && sa_col < ncols;
      int64_t sa_row = 0;
      if (sa_valid) {
        sa_row = tok0 + sa_col;
        if constexpr (kMode == kGateUp) sa_row = p.perm[tok0 + sa_col] / p.top_k;
      }
      for (int sb = sb0; sb < sb1; ++sb, ++it) {
        const int stage = it % L::kStages;
        hw::mbar_wait(&empty[stage], ((it / L::kStages) & 1) ^ 1);
        uint8_t* st = smem + stage * L::kStageBytes;
        const int kb = sb * kG + gi;  // this thread's k-block; past nkb: zero-filled
        const bool kb_ok = kb < nkb;
        if (kMode != kDense && tid == 0 && sb == sb0) stage_item[stage] = item;
        if (tma) {
          // One thread: the stage's kNW·kG weight boxes [128 rows × 128 K bytes] (rows past N and
          // k-blocks past K arrive as zeros, their bytes counted).
          if (tid == 0) {
            hw::mbar_arrive_expect_tx(&full[stage], uint32_t(kNW * kG * kATileBytes));
#pragma unroll
            for (int wi = 0; wi < kNW; ++wi)
#pragma unroll
              for (int g = 0; g < kG; ++g)
                hw::tma_load_2d(st + (wi * kG + g) * kATileBytes, I.wmap[wi], &full[stage],
                                (sb * kG + g) * kGroup, row_blk * kBM);
          }
        } else {
          if (kMode != kDense && tid == 0) hw::mbar_arrive(&full[stage]);  // stage_item's release
#pragma unroll
          for (int wi = 0; wi < kNW; ++wi) {
#pragma unroll
            for (int i = 0; i < 8 * kG; ++i) {
              const int r = r0 + kRowStep * i;
              const int64_t row = int64_t(row_blk) * kBM + r;
              const bool ok = row < N && kb_ok;
              const uint8_t* src = I.w[wi] + (ok ? row * K + int64_t(kb) * kGroup + c * 16 : 0);
              hw::cp_async_16(st + (wi * kG + gi) * kATileBytes + r * 128 + (((c ^ r) & 7) << 4),
                              src, ok ? 16u : 0u);
            }
          }
        }
#pragma unroll
        for (int j = 0; j < kBRowsPer; ++j) {
          const int r = r0 + kRowStep * j;
          const bool ok = xvalid[j] && kb_ok;
          hw::cp_async_16(st + L::kBOff + gi * BN * kGroup + r * 128 + (((c ^ r) & 7) << 4),
                          xrow[j] + (ok ? int64_t(kb) * kGroup + c * 16 : 0), ok ? 16u : 0u);
        }
        if (tid < kG * BN) {
          const int kbs = sb * kG + sa_g;
          const bool ok = sa_valid && kbs < nkb;
          hw::cp_async_4(st + L::kSaOff + tid * 4,
                         p.xs + (ok ? sa_row * p.xs_tok + kbs * p.xs_grp : 0), ok ? 4u : 0u);
        }
        if (sw_i >= 0 && sw_i < kNW * kG) {
          const int kbs = sb * kG + sw_g;
          const bool ok = kbs < nkb;
          // (no run-time index into I: the item stays in registers)
          const float* wsc = sw_w == 0 ? I.wsc[0] : I.wsc[kNW - 1];
          hw::cp_async_4(st + L::kSwOff + sw_i * 4, wsc + (ok ? int64_t(row_blk) * nkb + kbs : 0),
                         ok ? 4u : 0u);
        }
        hw::cp_async_arrive_noinc(&full[stage]);
      }
      if (kMode != kDense && p.sched) {
        // The next unclaimed item (the first gridDim.x went to the blocks' first items).
        if (tid == 0) *next_item = atomicAdd(p.sched, 1) + int(gridDim.x);
        hw::named_barrier(2, 128);
        item = *next_item;
        hw::named_barrier(2, 128);  // read by all before thread 0 writes the next one
      } else {
        item += item_step;
      }
    }
    if constexpr (kMode != kDense) {
      // The end: one more stage, no data, stage_item −1 (every producer thread arrives).
      const int stage = it % L::kStages;
      hw::mbar_wait(&empty[stage], ((it / L::kStages) & 1) ^ 1);
      if (tid == 0) {
        stage_item[stage] = -1;
        hw::mbar_arrive(&full[stage]);
      }
      hw::mbar_arrive(&full[stage]);
      // The last block to stop claiming items zeroes the counters for the next launch (so the
      // buffer is never refilled; stream order makes the next launch see the zeros).
      if (p.sched && tid == 0 && atomicAdd(p.sched + 1, 1) == int(gridDim.x) - 1) {
        atomicExch(p.sched, 0);
        atomicExch(p.sched + 1, 0);
      }
    }
    hw::cp_async_wait_all();  // nothing of this thread's may land after it has exited
    return;
  }

  // Consumers.
  if constexpr (kRealloc) hw::regs_alloc<kMoeConsumerRegs>();
  OSPREY_SWAPAB_GEOMETRY;
  const int ct = tid - 128, cw = ct >> 7, warp = (ct >> 5) & 3, lane = ct & 31;
  int it = 0;
  for (int item = item0; item < n_items;) {
    if constexpr (kMode != kDense) {
      // The item the producer started at this stage (the wait is the k-loop's first one).
      const int stage = it % L::kStages;
      hw::mbar_wait(&full[stage], (it / L::kStages) & 1);
      item = stage_item[stage];
      if (item < 0) break;
    }
    Item<kNW> I;
    if (!item_at<BN, kMode, kNW, kG>(p, item, I)) break;
    const int row_blk = I.row_blk, ncols = I.ncols, sb0 = I.sb0, sb1 = I.sb1;
    const int64_t tok0 = I.tok0, N = I.N;
    float acc[kNW][kR];
#pragma unroll
    for (int wi = 0; wi < kNW; ++wi)
#pragma unroll
      for (int i = 0; i < kR; ++i) acc[wi][i] = 0.0f;
    for (int sb = sb0; sb < sb1; ++sb, ++it) {
      const int stage = it % L::kStages;
      hw::mbar_wait(&full[stage], (it / L::kStages) & 1);
      hw::fence_proxy_async();  // the cp.async (generic proxy) bytes, read next by wgmma
      const uint8_t* st = smem + stage * L::kStageBytes;
      float part[kG][kNW][kR];
      hw::wgmma_fence();
#pragma unroll
      for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int wi = 0; wi < kNW; ++wi) {
#pragma unroll
          for (int k = 0; k < kGroup / 32; ++k) {
            const uint64_t da = hw::sw128_desc(
                st + (wi * kG + g) * kATileBytes + cw * kWgRows * 128 + k * 32, 16, 1024);
            const uint64_t db = hw::sw128_desc(st + L::kBOff + g * BN * kGroup + k * 32, 16, 1024);
            mma_k32<BN>(part[g][wi], da, db, k > 0);
          }
          if constexpr (kSplit) hw::wgmma_commit();  // gate and up: one group each
        }
      }
      if constexpr (!kSplit) hw::wgmma_commit();
      float sw[kG][kNW];
      float sa[kG][kR / 2];  // the thread's columns: 8·j + 2·(lane % 4) + b, index 2j + b
      // The stage's scales, read before the stage is released: while the wgmma run, or (prefill
      // gate/up, kRealloc) after them, so that they are not live beside the accumulators and
      // partials at the wait (with them the consumers' 200 registers spilled inside the k-loop).
      auto load_scales = [&] {
#pragma unroll
        for (int g = 0; g < kG; ++g) {
#pragma unroll
          for (int wi = 0; wi < kNW; ++wi)
            sw[g][wi] = reinterpret_cast<const float*>(st + L::kSwOff)[wi * kG + g];
          const float* s_a = reinterpret_cast<const float*>(st + L::kSaOff) + g * BN;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            sa[g][2 * j] = s_a[8 * j + 2 * (lane & 3)];
            sa[g][2 * j + 1] = s_a[8 * j + 2 * (lane & 3) + 1];
          }
        }
      };
      if constexpr (kRealloc) {
        if constexpr (kSplit) {
          // Gate's partial promoted while up's wgmma still run (the same sums in the same order).
          static_assert(kG == 1 && kNW == 2);
          hw::wgmma_wait<1>();
          hw::fence_regs(part[0][0]);
          load_scales();
#pragma unroll
          for (int i = 0; i < kR; ++i)
            acc[0][i] += part[0][0][i] * (sw[0][0] * sa[0][(i >> 2) * 2 + (i & 1)]);
          hw::wgmma_wait<0>();
          hw::fence_regs(part[0][1]);
          hw::mbar_arrive(&empty[stage]);
#pragma unroll
          for (int i = 0; i < kR; ++i)
            acc[1][i] += part[0][1][i] * (sw[0][1] * sa[0][(i >> 2) * 2 + (i & 1)]);
          continue;
        }
      }
      if constexpr (!kRealloc) load_scales();
      hw::wgmma_wait<0>();
#pragma unroll
      for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int wi = 0; wi < kNW; ++wi) hw::fence_regs(part[g][wi]);
      if constexpr (kRealloc) load_scales();
      hw::mbar_arrive(&empty[stage]);
#pragma unroll
      for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int wi = 0; wi < kNW; ++wi)
#pragma unroll
          for (int i = 0; i < kR; ++i)
            acc[wi][i] += part[g][wi][i] * (sw[g][wi] * sa[g][(i >> 2) * 2 + (i & 1)]);
    }

    // Fragment coordinates: register i holds weight row rbase + 8·((i/2) % 2), column
    // 8·(i/4) + 2·(lane % 4) + i % 2.
    const int rbase = cw * kWgRows + 16 * warp + (lane >> 2);
    auto col_of = [&](int i) { return 8 * (i >> 2) + 2 * (lane & 3) + (i & 1); };
    auto row_of = [&](int i) { return int64_t(row_blk) * kBM + rbase + 8 * ((i >> 1) & 1); };

    if constexpr (kMode == kDense) {
      bool store = true;
      if (p.splits > 1) {
        float* base = p.ws + (size_t(I.tile) * p.splits) * kConsumers * kR;
        float4* mine = reinterpret_cast<float4*>(base + (size_t(I.split) * kConsumers + ct) * kR);
#pragma unroll
        for (int i = 0; i < kR; i += 4)
          __stcg(mine + i / 4, make_float4(acc[0][i], acc[0][i + 1], acc[0][i + 2], acc[0][i + 3]));
        __threadfence();
        hw::named_barrier(1, kConsumers);
        if (ct == 0) {
          const int old = atomicAdd(&p.counters[I.tile], 1);
          const bool last = old == p.splits - 1;
          if (last) p.counters[I.tile] = 0;  // ready for the next launch (stream-ordered)
          *flag = last;
        }
        hw::named_barrier(1, kConsumers);
        // (read by all before ct 0 writes the next item's flag, after that item's first barrier)
        store = *flag != 0;
        if (store) {
          __threadfence();
          // The sum in split order whoever arrives last (its own partial read back too): the
          // same bits on every run.
#pragma unroll
          for (int i = 0; i < kR; ++i) acc[0][i] = 0.0f;
            // (unrolled: 8 splits' loads in flight, not one L2 round trip a split)
#pragma unroll 8
          for (int sp = 0; sp < p.splits; ++sp) {
            const float4* other =
                reinterpret_cast<const float4*>(base + (size_t(sp) * kConsumers + ct) * kR);
#pragma unroll
            for (int i = 0; i < kR; i += 4) {
              const float4 v = __ldcg(other + i / 4);
              acc[0][i] += v.x;
              acc[0][i + 1] += v.y;
              acc[0][i + 2] += v.z;
              acc[0][i + 3] += v.w;
            }
          }
        }
      }
      if (store) {
        Ty* y = static_cast<Ty*>(I.y);
#pragma unroll
        for (int i = 0; i < kR; ++i) {
          const int col = col_of(i);
          const int64_t row = row_of(i);
          if (col < ncols && row < N) y[(tok0 + col) * N + row] = from_f32<Ty>(acc[0][i]);
        }
      }
    } else if constexpr (kMode == kGateUp) {
      float h[kR];
#pragma unroll
      for (int i = 0; i < kR; ++i) h[i] = silu(acc[0][i]) * acc[1][i];
        // amax of each column over the block's 128 rows: the thread's 2 rows, the 8 lanes of its
        // column (lane / 4), the 4 warps and the 2 warpgroups (shared memory).
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          float m = fmaxf(fabsf(h[4 * j + b]), fabsf(h[4 * j + 2 + b]));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
          if (lane < 4) red[(cw * 4 + warp) * BN + 8 * j + 2 * lane + b] = m;
        }
      }
      hw::named_barrier(1, kConsumers);
      const int64_t ngroups = N / kGroup;
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const int col = col_of(i);
        if (col >= ncols) continue;
        float amax = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; ++q) amax = fmaxf(amax, red[q * BN + col]);
        const float s = act_fp8_scale(amax);
        const int64_t r = tok0 + col;
        p.h8[r * N + row_of(i)] = f32_to_e4m3_dev(h[i] / s);
        if (ct < 4 && ((i >> 1) & 1) == 0) p.hs[r * ngroups + row_blk] = s;
      }
      hw::named_barrier(1, kConsumers);  // red is read by all before the next item writes it
    } else {
      float* y = static_cast<float*>(p.y);
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const int col = col_of(i);
        const int64_t row = row_of(i);
        if (col < ncols && row < N) y[(tok0 + col) * N + row] = acc[0][i];
      }
    }
    if constexpr (kMode == kDense) item += item_step;  // MoE: the next from stage_item
  }                                                    // items
#undef OSPREY_SWAPAB_GEOMETRY
}

// Quantisation of activation rows: one warp a 128-wide group (4 values a lane), 8 groups a block.
constexpr int kQuantGroupsPerBlock = 8;
template <typename T>
__global__ void quantize_rows_kernel(uint8_t* __restrict__ q, float* __restrict__ s,
                                     const T* __restrict__ x, int64_t K) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const int64_t ng = K / kGroup;
  const int64_t g = int64_t(blockIdx.y) * kQuantGroupsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (g >= ng) return;
  float v[4];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = to_f32(x[row * K + g * kGroup + i * 32 + lane]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  const float sc = act_fp8_scale(amax);
#pragma unroll
  for (int i = 0; i < 4; ++i) q[row * K + g * kGroup + i * 32 + lane] = f32_to_e4m3_dev(v[i] / sc);
  if (lane == 0) s[row * ng + g] = sc;
}

// K-blocks a stage on the dense path: 4 (the default: 4 at every 16-token tile; wider tiles take
// 2), or the variants 1, 2 and auto (kDenseGroupsAuto: 4 at 16-token tiles only where each split of
// the launch keeps at least kDeepStageMinKBlocks k-blocks, else 2) for whole runs
// (OSPREY_FP8_DENSE_KGROUPS=auto|1|2|4). With weight tiles by TMA and the attention's stream
// forks, 4 took the dsv32 B = 1 graph step from 2.262 to 2.231 ms (H100, 2026-12-06, three
// rounds: bench/RESULTS.md run 18), but the launches whose splits hold few k-blocks lost (Nsight
// Compute: q_b + wq_b, K = 1536 in 3 stages of 4, 22.4 → 23.5 us; q_a + kv_a + wk, 8 k-blocks a
// split, 13.3 → 14.1 us). auto gives those two launches 2 and the others 4; it has not run on a
// GPU yet (no device could be started on 2026-12-07), so it stays a variant until measured.
int g_dense_groups = [] {
  const char* e = std::getenv("OSPREY_FP8_DENSE_KGROUPS");
  if (!e || !*e) return 4;
  const std::string v = e;
  OSPREY_CHECK(v == "auto" || v == "1" || v == "2" || v == "4",
               "OSPREY_FP8_DENSE_KGROUPS must be auto, 1, 2 or 4, not '", v, "'");
  return v == "auto" ? kDenseGroupsAuto : std::stoi(v);
}();
// The dense path's weight tiles by TMA (one thread a stage: kG boxes [128 rows × 128 bytes]
// through each linear's map, encoded on the host and passed in the kernel's parameters) rather than
// the producer warpgroup's 16-byte cp.async copies; the token tiles stay cp.async either way. The
// default (the same bits; dsv32 graph step B = 1 2.28 → 2.26 ms, B = 16 5.63 → 5.57 ms with the
// stream forks, H100, run 18); OSPREY_FP8_DENSE_TMA=0 keeps cp.async.
bool g_dense_tma = [] {
  const char* e = std::getenv("OSPREY_FP8_DENSE_TMA");
  return !(e && e[0] == '0');
}();
// Most tokens the dense path takes. 32: at 64 and 128 tokens cuBLASLt's block-scaled GEMM was
// faster on most V3.2 shapes (H200, 2026-12-01, bench kernels --op gemm: e.g. q_a_proj at 64
// tokens 21.9 us against 37.6, kv_a_proj 20.3 against 40.4); at 1 and 16 this kernel was faster
// or equal on every shape. The bench raises it to compare. With one 64-token tile past 32 (the
// weights streamed once) cuBLASLt still wins at 64 tokens (H200, 2026-12-03: q_a_proj 24.0 against
// 39.5 us; the whole dsv32 B=64 graph step 9.89 ms with 32 here against 10.34 ms with 64), so 32
// stays. OSPREY_FP8_SWAPAB_MAX_TOKENS=N (0..128) sets it for A/B runs of whole steps.
int64_t int_from_env(const char* name, int64_t fallback, int64_t max) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(e, &end, 10);
  OSPREY_CHECK(*end == 0 && x >= 0 && x <= max, name, " must be an integer in 0..", max, ", not '",
               e, "'");
  return x;
}
int64_t tokens_from_env(const char* name, int64_t fallback) {
  return int_from_env(name, fallback, kSwapAbMaxTokens);
}
int64_t g_max_tokens = -1;  // -1: not read yet (max_tokens() reads the environment once)
int64_t max_tokens() {
  if (g_max_tokens < 0) g_max_tokens = tokens_from_env("OSPREY_FP8_SWAPAB_MAX_TOKENS", 32);
  return g_max_tokens;
}
// Most tokens a launch of several linears of one input (launch_fp8_swapab_linears from
// ops::linears) takes, where one launch streams all their weights against a cuBLASLt GEMM each.
// OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS=N (0..128) for A/B runs; never below the single limit.
int64_t g_group_max_tokens = -1;
int64_t group_max_tokens() {
  if (g_group_max_tokens < 0)
    g_group_max_tokens = tokens_from_env("OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS", 32);
  return std::max(g_group_max_tokens, max_tokens());
}

// Past the grouped limit, up to kSwapAbWideMaxTokens, a linear of at most this many weight bytes
// still takes the grouped launch (one 64-token tile): the small matrices of a decode step
// (q_a + kv_a + wk, q_b + wq_b, the shared expert's gate + up) pay a cuBLASLt GEMM's fixed latency
// each, where one grouped launch streams them together. The default, 48 MB, takes those three on
// V3.2 and leaves the dense MLP's gate + up (2 × 18432 × 7168 = 132 MB a group; it lost alone,
// 153.7 against 148.8 µs) on cuBLASLt. Measured in `bench step --preset dsv32 --batch 56,64
// --cuda-graph` (2026-12-07): graph step B = 64 10.940 / 10.830 ms against 10.995 / 11.017 (H100,
// two alternated rounds), 8.792 against 8.941 (H200); B = 56 faster in all three; 143 kernels a
// step against 184. OSPREY_FP8_SWAPAB_WIDE_MAX_MB=N (0: off) for A/B runs.
constexpr int kWideMaxMbDefault = 48;
int64_t g_wide_max_bytes = -1;  // -1: not read yet
int64_t wide_max_bytes() {
  if (g_wide_max_bytes < 0)
    g_wide_max_bytes = int_from_env("OSPREY_FP8_SWAPAB_WIDE_MAX_MB", kWideMaxMbDefault, 4096) << 20;
  return g_wide_max_bytes;
}

bool g_enabled = [] {
  const char* e = std::getenv("OSPREY_FP8_SWAPAB");
  return !(e && e[0] == '0');
}();

// The MoE modes' weight tiles by TMA (one thread a stage, boxes through the experts' maps) rather
// than the producer warpgroup's 16-byte cp.async copies, whose address arithmetic made the integer
// pipe the busiest of the prefill gate/up kernel (H200, Nsight Compute, 2048 tokens: ALU 44.9%,
// issue slots 50.7% busy, 1.07 G instructions). OSPREY_MOE_WEIGHT_TMA=0 keeps cp.async.
bool g_moe_weight_tma = [] {
  const char* e = std::getenv("OSPREY_MOE_WEIGHT_TMA");
  return !(e && e[0] == '0');
}();

// The MoE modes' grid (fp8_swapab.cuh MoeGrid): on a persistent grid, one block an SM walking the
// items (tile, row block), the producer fills the next item's stages while the consumers run the
// last one's epilogue, so an item's pipeline fill (a DRAM latency, ~2.7k cycles against the 4k of
// a down item's 16 k-blocks) is not paid each time. With static strides the blocks drift apart
// and the items running at once stop sharing their experts' weights in L2 (H200, Nsight Compute,
// 5000 tokens, gate/up: L2 hit rate 69% → 53%, DRAM 29% → 60% of peak); claimed items keep the
// window. OSPREY_MOE_GRID=items|strided|claimed.
MoeGrid g_moe_grid = [] {
  const char* e = std::getenv("OSPREY_MOE_GRID");
  if (!e || !*e) return MoeGrid::kClaimed;
  const std::string v = e;
  OSPREY_CHECK(v == "items" || v == "strided" || v == "claimed",
               "OSPREY_MOE_GRID must be items, strided or claimed, not '", v, "'");
  return v == "items" ? MoeGrid::kItems : v == "strided" ? MoeGrid::kStrided : MoeGrid::kClaimed;
}();

// K-groups a pipeline stage of the prefill down projection: 2 (the default: 48 KB stages, 4 of
// them) or 1 (24 KB, 8 stages: more loads in flight per byte of shared memory), a benchmark
// variant (bench kernels --op moe); the same arithmetic in the same order either way.
int g_moe_down_groups = 2;

// Prefill gate/up: the gate and up wgmma of a k-block committed as two groups, the gate partial
// promoted while up's still run (wgmma_wait<1>), instead of one group and one wait: a benchmark
// variant (bench kernels --op moe; OSPREY_MOE_SPLIT_WAITS=1 for whole runs); the same bits either
// way.
bool g_moe_split_waits = [] {
  const char* e = std::getenv("OSPREY_MOE_SPLIT_WAITS");
  return e && e[0] == '1';
}();

// The claimed grid's counters [2] (Params::sched), zeroed once at allocation (as split_counters
// below); every launch leaves them zero.
int* moe_sched_counters() {
  static std::mutex mu;
  static int* buf = nullptr;
  const std::lock_guard<std::mutex> lock(mu);
  if (!buf) {
    OSPREY_CUDA_CHECK(cudaMalloc(&buf, 2 * sizeof(int)));
    OSPREY_CUDA_CHECK(cudaMemset(buf, 0, 2 * sizeof(int)));
  }
  return buf;
}

// The split-K tile counters: zeroed once when (re)allocated; every launch leaves them zero. The
// cudaMemset below is that one-time fill at allocation, outside any step: it runs on the first call
// of a shape needing more counters than allocated (an eager call, as every growth of the scratch
// arena is; a CUDA graph is captured after its shapes ran once), never as a node of a step.
// One buffer a scratch lane (common.cuh): launches on an ops::Fork's two streams may run at once.
int* split_counters(size_t n) {
  static std::mutex mu;
  static int* bufs[kScratchLanes] = {};
  static size_t caps[kScratchLanes] = {};
  const std::lock_guard<std::mutex> lock(mu);
  int*& buf = bufs[scratch_lane()];
  size_t& cap = caps[scratch_lane()];
  if (n > cap) {
    bump_device_memory_epoch();  // a graph captured before holds the old buffer
    if (buf) {
      OSPREY_CUDA_CHECK(cudaDeviceSynchronize());
      OSPREY_CUDA_CHECK(cudaFree(buf));
    }
    cap = std::max<size_t>(n, 4096);
    OSPREY_CUDA_CHECK(cudaMalloc(&buf, cap * sizeof(int)));
    OSPREY_CUDA_CHECK(cudaMemset(buf, 0, cap * sizeof(int)));
  }
  return buf;
}

template <int BN, int kMode, int kG, typename Ty, bool kSplit = false>
void launch(const Params& p, const dim3& grid) {
  using L = Layout<BN, kMode, kG>;
  static const bool attr = [] {
    OSPREY_CUDA_CHECK(cudaFuncSetAttribute(fp8_swapab_kernel<BN, kMode, kG, Ty, kSplit>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(L::kSmem)));
    return true;
  }();
  (void)attr;
  launch_pdl(fp8_swapab_kernel<BN, kMode, kG, Ty, kSplit>, grid, kThreads, L::kSmem, p);
  OSPREY_CUDA_LAUNCH_CHECK();
}

template <int kG, typename Ty>
void launch_dense(const Params& p, const dim3& grid, int bn) {
  static_assert(kSwapAbDeepStageMaxTokens == 16, "4 k-blocks a stage: the 16-token tile");
  if constexpr (kG == 4) {  // 16-token tiles only (launch_fp8_swapab_linears)
    (void)bn;
    launch<16, kDense, 4, Ty>(p, grid);
  } else if (bn == 16) {
    launch<16, kDense, kG, Ty>(p, grid);
  } else if (bn == 32) {
    launch<32, kDense, kG, Ty>(p, grid);
  } else {
    launch<64, kDense, kG, Ty>(p, grid);
  }
}

// Splits of K for `tiles` blocks of nkb stages each: the fewest waves × (stages a split + the
// pipeline fill), at most kMaxSplits and at least 2 stages a split.
int choose_splits(int64_t tiles, int nkb, int64_t sms) {
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= std::min(kMaxSplits, std::max(1, nkb / 2)); ++s) {
    const int per = (nkb + s - 1) / s;
    const int real = (nkb + per - 1) / per;  // splits that get work
    if (real != s) continue;
    const int64_t waves = (tiles * s + sms - 1) / sms;
    const int64_t cost = waves * (per + kSplitOverheadKb);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

// The persistent dense grid's splits: min(tiles · s, SMs) blocks walk tiles · s items by static
// strides, so the busiest block runs ceil(tiles · s / SMs) items of ceil(nkb / s) stages, each
// split item also paying its partial (kSplitItemCostStages); the pipeline fills once a block.
// The fewest such stages, fewest splits on ties; at most kMaxSplits and at least 2 stages a split.
// E.g. V3.2's dense gate + up at one token (288 row blocks, 28 stages): 4 splits, 9 items of 7
// (+1) on the busiest SM = 72, against 3 waves of 2 splits' 14 (+4 fill) = 54 for gate alone.
int choose_persistent_splits(int64_t tiles, int nkb, int64_t sms) {
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= std::min(kMaxSplits, std::max(1, nkb / 2)); ++s) {
    const int per = (nkb + s - 1) / s;
    const int real = (nkb + per - 1) / per;
    if (real != s) continue;
    const int64_t items = (tiles * s + sms - 1) / sms;
    const int64_t cost = items * (per + (s > 1 ? kSplitItemCostStages : 0));
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

int dense_splits(int64_t tiles, int nsb, int64_t sms, bool persistent) {
  return persistent ? choose_persistent_splits(tiles, nsb, sms) : choose_splits(tiles, nsb, sms);
}

// The dense grid (OSPREY_FP8_DENSE_GRID=waves|persistent; waves, the default). The persistent
// grid measured no faster (H100, bench kernels --op gemm --m 1,16,32, 2026-12-06: within 1% on
// every group and linear at 1 and 16 tokens, 5% slower on the dense gate + up and down at 32;
// H200 bench step graph B = 1 / 16: 1.971 / 4.766 ms against 1.959 / 4.626 with waves), so it
// stays a variant.
DenseGrid g_dense_grid = [] {
  const char* e = std::getenv("OSPREY_FP8_DENSE_GRID");
  if (!e || !*e) return DenseGrid::kWaves;
  const std::string v = e;
  OSPREY_CHECK(v == "waves" || v == "persistent",
               "OSPREY_FP8_DENSE_GRID must be waves or persistent, not '", v, "'");
  return v == "waves" ? DenseGrid::kWaves : DenseGrid::kPersistent;
}();
// Several linears of one x in one launch (OSPREY_FP8_DENSE_GROUP=0: a launch each).
bool g_dense_group = [] {
  const char* e = std::getenv("OSPREY_FP8_DENSE_GROUP");
  return !(e && e[0] == '0');
}();
// The TMA map of a dense weight W8 [N, K] e4m3 (boxes of 128 rows × 128 K bytes), encoded once per
// (pointer, shape) and kept: a host-only encode (legal inside a graph capture), whose result
// travels in the launch's parameters. Weights live as long as the model; a freed pointer reused
// by another weight of the same shape has the same map.
CUtensorMap dense_weight_map(const uint8_t* w8, int64_t N, int64_t K) {
  struct Key {
    const uint8_t* w;
    int64_t N, K;
    bool operator==(const Key&) const = default;
  };
  struct Hash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.w) ^ (size_t(k.N) * 0x9e3779b97f4a7c15ull) ^ size_t(k.K);
    }
  };
  static std::mutex mu;
  static std::unordered_map<Key, CUtensorMap, Hash> maps;
  const std::lock_guard<std::mutex> lock(mu);
  const Key key{w8, N, K};
  auto it = maps.find(key);
  if (it == maps.end())
    it = maps.emplace(key, hopper::tma_map_u8_2d_sw128(w8, uint64_t(K), uint64_t(N), uint64_t(K),
                                                       uint32_t(kBM)))
             .first;
  return it->second;
}
}  // namespace

int dense_stage_groups(int setting, int64_t n, int64_t row_blocks, int64_t K, int64_t sms,
                       bool persistent) {
  OSPREY_CHECK(n >= 1 && row_blocks >= 1 && K >= kGroup && K % kGroup == 0 && sms >= 1,
               "dense_stage_groups: n ", n, ", row blocks ", row_blocks, ", K ", K, ", SMs ", sms);
  if (n > kSwapAbDeepStageMaxTokens) return setting == 1 ? 1 : 2;
  if (setting != kDenseGroupsAuto) return setting;
  const int nkb = int(K / kGroup), nsb = (nkb + 3) / 4;  // k-blocks, stages of 4
  const int splits = dense_splits(row_blocks, nsb, sms, persistent);  // one 16-token tile
  const int per = (nsb + splits - 1) / splits;
  return 4 * per >= kDeepStageMinKBlocks ? 4 : 2;
}

void set_fp8_swapab(bool allow) {
  g_enabled = allow;
}
bool set_fp8_moe_split_waits(bool on) {
  const bool was = g_moe_split_waits;
  g_moe_split_waits = on;
  return was;
}
int set_fp8_moe_down_groups(int groups) {
  OSPREY_CHECK(groups == 1 || groups == 2, "fp8 swap-AB MoE down: 1 or 2 K groups a stage, not ",
               groups);
  const int was = g_moe_down_groups;
  g_moe_down_groups = groups;
  return was;
}
MoeGrid set_fp8_moe_grid(MoeGrid g) {
  const MoeGrid was = g_moe_grid;
  g_moe_grid = g;
  return was;
}
bool set_fp8_moe_weight_tma(bool on) {
  const bool was = g_moe_weight_tma;
  g_moe_weight_tma = on;
  return was;
}
void set_fp8_swapab_max_tokens(int64_t n) {
  OSPREY_CHECK(n >= 0 && n <= kSwapAbMaxTokens, "fp8 swap-AB: at most ", kSwapAbMaxTokens,
               " tokens, not ", n);
  g_max_tokens = n;
}
int set_fp8_swapab_dense_groups(int groups) {
  OSPREY_CHECK(groups == kDenseGroupsAuto || groups == 1 || groups == 2 || groups == 4,
               "fp8 swap-AB: auto (0), 1, 2 or 4 k-blocks a stage, not ", groups);
  const int was = g_dense_groups;
  g_dense_groups = groups;
  return was;
}
int fp8_swapab_dense_groups() {
  return g_dense_groups;
}
bool fp8_swapab_dense_tma() {
  return g_dense_tma;
}
bool set_fp8_swapab_dense_tma(bool on) {
  const bool was = g_dense_tma;
  g_dense_tma = on;
  return was;
}
int64_t fp8_swapab_max_tokens() {
  return max_tokens();
}
void set_fp8_swapab_group_max_tokens(int64_t n) {
  OSPREY_CHECK(n >= 0 && n <= kSwapAbMaxTokens, "fp8 swap-AB: at most ", kSwapAbMaxTokens,
               " tokens, not ", n);
  g_group_max_tokens = n;
}
int64_t fp8_swapab_group_max_tokens() {
  return group_max_tokens();
}
bool fp8_swapab_enabled() {
  return g_enabled;
}

bool fp8_swapab_serves(int64_t n, int64_t N, int64_t K) {
  return g_enabled && device_is_sm90() && n >= 1 && n <= max_tokens() && N >= 1 &&
         K % kGroup == 0 && K > 0;
}
bool fp8_swapab_group_serves(int64_t n, int64_t N, int64_t K) {
  const bool wide = n <= kSwapAbWideMaxTokens && N * K <= wide_max_bytes();
  return g_enabled && device_is_sm90() && n >= 1 && (n <= group_max_tokens() || wide) && N >= 1 &&
         K % kGroup == 0 && K > 0;
}
void set_fp8_swapab_wide_max_bytes(int64_t bytes) {
  OSPREY_CHECK(bytes >= 0, "fp8 swap-AB: wide limit ", bytes, " bytes");
  g_wide_max_bytes = bytes;
}
int64_t fp8_swapab_wide_max_bytes() {
  return wide_max_bytes();
}

void launch_quantize_rows(uint8_t* x8, float* s, const void* x, DType x_type, int64_t n,
                          int64_t K) {
  OSPREY_CHECK(K % kGroup == 0 && n >= 0 && n < (int64_t(1) << 31), "quantize_rows: K ", K,
               " is not a multiple of 128");
  if (n == 0) return;
  const int64_t ng = K / kGroup;
  const dim3 grid(unsigned(n), unsigned((ng + kQuantGroupsPerBlock - 1) / kQuantGroupsPerBlock));
  OSPREY_DISPATCH_FLOAT(x_type, T, {
    launch_pdl(quantize_rows_kernel<T>, grid, 32 * kQuantGroupsPerBlock, 0, x8, s,
               static_cast<const T*>(x), K);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void launch_fp8_swapab_linears(std::span<const DenseLinear> outs, DType y_type, const uint8_t* x8,
                               const float* xs, int64_t n, int64_t K, int64_t xs_cols) {
  OSPREY_CHECK(K % kGroup == 0 && n >= 1 && n <= kSwapAbMaxTokens && is_f32_or_bf16(y_type) &&
                   !outs.empty() && (xs_cols == 0 || xs_cols >= n),
               "fp8_swapab_linear: n ", n, ", K ", K, ", ", outs.size(), " linears, xs_cols ",
               xs_cols);
  if (!g_dense_group && outs.size() > 1) {
    for (const DenseLinear& o : outs)
      launch_fp8_swapab_linears({&o, 1}, y_type, x8, xs, n, K, xs_cols);
    return;
  }
  if (outs.size() > size_t(kMaxDenseSegs)) {  // launches of kMaxDenseSegs linears
    launch_fp8_swapab_linears(outs.first(kMaxDenseSegs), y_type, x8, xs, n, K, xs_cols);
    launch_fp8_swapab_linears(outs.subspan(kMaxDenseSegs), y_type, x8, xs, n, K, xs_cols);
    return;
  }
  // One token tile of 16, 32 or 64 (the weights stream from DRAM once); past 64, a bench variant,
  // tiles of 64 side by side (consecutive items), so their weight reads after the first come from
  // L2.
  const int bn = n <= 16 ? 16 : n <= 32 ? 32 : 64;
  const bool persistent = g_dense_grid == DenseGrid::kPersistent;
  Params p{};
  // TMA needs 16-byte aligned bases (the rows are: K is a multiple of 128).
  p.weight_tma = g_dense_tma && std::all_of(outs.begin(), outs.end(), [](const DenseLinear& o) {
                   return reinterpret_cast<uintptr_t>(o.w8) % 16 == 0;
                 });
  int64_t rbs = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const DenseLinear& o = outs[i];
    OSPREY_CHECK(o.N >= 1 && o.N < (int64_t(1) << 31), "fp8_swapab_linear: N ", o.N);
    p.segs[i].y = o.y;
    p.segs[i].w8 = o.w8;
    p.segs[i].w_scale = o.w_scale;
    p.segs[i].N = o.N;
    p.segs[i].rb0 = int(rbs);
    if (p.weight_tma) p.segs[i].map = dense_weight_map(o.w8, o.N, K);
    rbs += (o.N + kBM - 1) / kBM;
  }
  const int64_t ttiles = (n + bn - 1) / bn, tiles = rbs * ttiles;
  OSPREY_CHECK(tiles * kMaxSplits < (int64_t(1) << 31), "fp8_swapab_linear: ", tiles, " tiles");
  const int kg = dense_stage_groups(g_dense_groups, n, rbs, K, sm_count(), persistent);
  const int nsb = int((K / kGroup + kg - 1) / kg);  // stages of K
  const int splits = dense_splits(tiles, nsb, sm_count(), persistent);
  p.n_segs = int(outs.size());
  p.ttiles = int(ttiles);
  p.rbs = int(rbs);
  p.n_items = int(tiles * splits);
  p.x8 = x8;
  p.xs = xs;
  p.xs_tok = xs_cols > 0 ? 1 : K / kGroup;
  p.xs_grp = xs_cols > 0 ? xs_cols : 1;
  p.n = n;
  p.K = K;
  p.splits = splits;
  if (splits > 1) {
    p.ws = static_cast<float*>(scratch(
        kScratchGemmSplit, size_t(tiles) * splits * kConsumers * size_t(bn / 2) * sizeof(float)));
    p.counters = split_counters(size_t(tiles));
  }
  const dim3 grid{unsigned(persistent ? std::min<int64_t>(p.n_items, sm_count()) : p.n_items), 1u,
                  1u};
  if (kg == 1) {
    if (y_type == DType::F32)
      launch_dense<1, float>(p, grid, bn);
    else
      launch_dense<1, bf16>(p, grid, bn);
  } else if (kg == 4) {
    if (y_type == DType::F32)
      launch_dense<4, float>(p, grid, bn);
    else
      launch_dense<4, bf16>(p, grid, bn);
  } else {
    if (y_type == DType::F32)
      launch_dense<2, float>(p, grid, bn);
    else
      launch_dense<2, bf16>(p, grid, bn);
  }
}

void launch_fp8_swapab_linear(void* y, DType y_type, const uint8_t* x8, const float* xs,
                              const uint8_t* w8, const float* w_scale, int64_t n, int64_t N,
                              int64_t K) {
  const DenseLinear one{y, w8, w_scale, N};
  launch_fp8_swapab_linears({&one, 1}, y_type, x8, xs, n, K);
}

DenseGrid set_fp8_swapab_dense_grid(DenseGrid g) {
  const DenseGrid was = g_dense_grid;
  g_dense_grid = g;
  return was;
}

bool set_fp8_swapab_dense_group(bool on) {
  const bool was = g_dense_group;
  g_dense_group = on;
  return was;
}

namespace {
// The grouped (MoE) launches' common parameters: the tile schedule of moe_permute, the experts'
// weights, the input x8 [rows, K] e4m3 with its scales xs, N output columns (N, K multiples of
// 128).
Params moe_params(const MoeTile* tiles, const MoeExpertPtrs* experts, const uint8_t* x8,
                  const float* xs, int64_t N, int64_t K) {
  OSPREY_CHECK(N % kGroup == 0 && K % kGroup == 0, "fp8_swapab_moe: N ", N, ", K ", K,
               " are not multiples of 128");
  Params p{};
  p.experts = experts;
  p.tiles = tiles;
  p.x8 = x8;
  p.xs = xs;
  p.xs_tok = K / kGroup;
  p.xs_grp = 1;
  p.N = N;
  p.K = K;
  p.splits = 1;
  p.row_blks = int(N / kBM);
  return p;
}
// The MoE grid over max_tiles · row_blks items: one block an item, or one an SM (persistent).
dim3 moe_grid(Params& p, int max_tiles) {
  const int64_t items = int64_t(max_tiles) * p.row_blks;
  OSPREY_CHECK(items < (int64_t(1) << 30), "fp8_swapab_moe: ", items, " work items");
  p.n_items = int(items);
  p.sched = g_moe_grid == MoeGrid::kClaimed ? moe_sched_counters() : nullptr;
  const bool persistent = g_moe_grid != MoeGrid::kItems;
  return dim3(unsigned(persistent ? std::min<int64_t>(items, sm_count()) : items), 1, 1);
}
void check_moe_tile_rows(int tile_rows) {
  OSPREY_CHECK(tile_rows == kSwapAbMoeTileRows || tile_rows == kSwapAbMoePrefillTileRows,
               "fp8_swapab_moe: tiles of ", kSwapAbMoeTileRows, " or ", kSwapAbMoePrefillTileRows,
               " rows, not ", tile_rows);
}
}  // namespace

void launch_fp8_swapab_moe_gate_up(uint8_t* h8, float* hs, const uint8_t* x8, const float* xs,
                                   const MoeTile* tiles, int max_tiles,
                                   const MoeExpertPtrs* experts, const int32_t* perm, int top_k,
                                   int64_t D, int64_t I, int tile_rows, bool weight_maps) {
  Params p = moe_params(tiles, experts, x8, xs, I, D);
  p.weight_tma = weight_maps && g_moe_weight_tma;
  check_moe_tile_rows(tile_rows);
  if (max_tiles == 0) return;
  p.perm = perm;
  p.top_k = top_k;
  p.h8 = h8;
  p.hs = hs;
  const dim3 grid = moe_grid(p, max_tiles);
  if (tile_rows == kSwapAbMoeTileRows)
    launch<kSwapAbMoeTileRows, kGateUp, 1, float>(p, grid);
  else if (g_moe_split_waits)
    launch<kSwapAbMoePrefillTileRows, kGateUp, 1, float, true>(p, grid);
  else
    launch<kSwapAbMoePrefillTileRows, kGateUp, 1, float>(p, grid);
}

void launch_fp8_swapab_moe_down(float* y, const uint8_t* h8, const float* hs, const MoeTile* tiles,
                                int max_tiles, const MoeExpertPtrs* experts, int64_t D, int64_t I,
                                int tile_rows, bool weight_maps) {
  Params p = moe_params(tiles, experts, h8, hs, D, I);
  p.weight_tma = weight_maps && g_moe_weight_tma;
  check_moe_tile_rows(tile_rows);
  if (max_tiles == 0) return;
  p.y = y;
  const dim3 grid = moe_grid(p, max_tiles);
  if (tile_rows == kSwapAbMoeTileRows)
    launch<kSwapAbMoeTileRows, kDown, 2, float>(p, grid);
  else if (g_moe_down_groups == 1)
    launch<kSwapAbMoePrefillTileRows, kDown, 1, float>(p, grid);
  else
    launch<kSwapAbMoePrefillTileRows, kDown, 2, float>(p, grid);
}

}  // namespace osprey::ops::cuda
