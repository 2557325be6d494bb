// Internal interface of the sm_90a FP8 weight-streaming GEMM (fp8_swapab.cu): W8A8 block-scaled
// products for few tokens, where the weights' bytes set the time — the dense linear layers at
// decode and the routed experts' grouped GEMMs at decode.
//
// Arithmetic (DeepSeek's reference fp8_gemm): activations quantised per 1×128 group
//   s_x[t, g] = amax_g(|x[t, :]|) / 448 (1 for an all-zero group), x8[t, c] = e4m3(x[t, c] / s_x),
// weights W8 [N, K] e4m3 with scale_inv [ceil(N/128), K/128];
//   y[t, r] = Σ_g s_x[t, g] · scale_inv[r/128, g] · Σ_{c in g} x8[t, c] · W8[r, c]
// the inner sum on the tensor cores (F32 accumulation), the promotion per 128-wide group in F32
// registers. The CPU twin is ops::cpu::linear_w8a8 (ops/gemm.h).
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "ops/cuda/moe_experts.cuh"
#include "ops/moe_schedule.h"

namespace osprey::ops::cuda {

// Rows of one expert per tile of the decode MoE path (the swap-AB kernel's token tile, BN).
constexpr int kSwapAbMoeTileRows = 16;
// The same for prefill-sized calls (ops/gemm.h set_fp8_moe_prefill_swapab): 64 rows a tile, so an
// expert's weights are streamed once per 64 of its rows (a 2048-token chunk gives V3.2's 256
// experts 64 rows each on average) and a block's wgmma is m64n64k32.
constexpr int kSwapAbMoePrefillTileRows = 64;
// Largest token count the dense swap-AB launcher takes (tiles of 32 tokens past 32). The dispatch
// uses it up to 32 tokens (fp8_swapab.cu g_max_tokens says why); above, cuBLASLt's block-scaled
// FP8 GEMM runs.
constexpr int64_t kSwapAbMaxTokens = 128;

// x [n, K] F32 or BF16 → x8 [n, K] e4m3 and s [n, K/128] F32 as above. K a multiple of 128.
void launch_quantize_rows(uint8_t* x8, float* s, const void* x, DType x_type, int64_t n, int64_t K);

// Whether the dense path serves y = x · Wᵀ with n tokens, W [N, K] e4m3 (an sm_90 device, K a
// multiple of 128, 1 ≤ n ≤ 32 — or the set_fp8_swapab_max_tokens value — and not disabled by
// OSPREY_FP8_SWAPAB=0).
bool fp8_swapab_serves(int64_t n, int64_t N, int64_t K);
// The same for a launch of several linears of one input (launch_fp8_swapab_linears), whose token
// limit is its own: OSPREY_FP8_SWAPAB_GROUP_MAX_TOKENS / set_fp8_swapab_group_max_tokens (default
// 32; never below the single limit).
bool fp8_swapab_group_serves(int64_t n, int64_t N, int64_t K);
void set_fp8_swapab_group_max_tokens(int64_t n);
int64_t fp8_swapab_group_max_tokens();
// Past that limit, up to kSwapAbWideMaxTokens, a linear of at most fp8_swapab_wide_max_bytes()
// weight bytes (N · K) is served by the grouped launch too (OSPREY_FP8_SWAPAB_WIDE_MAX_MB, default
// 48; 0 turns it off). The single-linear path and the producers' quantisation layout
// (fp8_act_shape) keep the token limit alone.
constexpr int64_t kSwapAbWideMaxTokens = 64;
void set_fp8_swapab_wide_max_bytes(int64_t bytes);
int64_t fp8_swapab_wide_max_bytes();
// Whether the swap-AB paths (dense and MoE) are on (ops/gemm.h set_fp8_swapab).
bool fp8_swapab_enabled();
// The dense path's k-blocks a pipeline stage: 4, the default (4 at every 16-token tile, 2 past 16
// tokens), or the variants 1, 2 and kDenseGroupsAuto (dense_stage_groups: 4 or 2 by the launch's
// shape at 16-token tiles, 2 past 16 tokens) that the benchmark compares (bench kernels --op gemm;
// OSPREY_FP8_DENSE_KGROUPS=auto|1|2|4). The split-K sums differ between depths, so 16 is one of
// token_path_thresholds under auto and 4. set_ returns the previous value.
constexpr int kDenseGroupsAuto = 0;
int set_fp8_swapab_dense_groups(int groups);
int fp8_swapab_dense_groups();
// Under auto, a 16-token launch takes 4 k-blocks a stage when each of its K splits keeps at least
// this many k-blocks (4 stages of 4): in shorter runs a stage of 64 KB per 128 rows leaves too
// little to overlap (the first stage's wait and the last stage's MMAs are a larger share).
constexpr int kDeepStageMinKBlocks = 16;
// The k-blocks a stage of a dense launch of n tokens over `row_blocks` 128-row blocks of weights
// (summed over its linears) and K columns takes on `sms` SMs (the waves or persistent grid's split
// choice), under `setting` (kDenseGroupsAuto, 1, 2 or 4). Host only.
int dense_stage_groups(int setting, int64_t n, int64_t row_blocks, int64_t K, int64_t sms,
                       bool persistent);
// The most tokens a dense launch takes 4 k-blocks a stage for (its 16-token tile).
constexpr int64_t kSwapAbDeepStageMaxTokens = 16;
// The dense path's weight tiles by TMA through each linear's map (on, the default) or by the
// producer's cp.async copies (off); the same bytes in shared memory, the same results bit for bit
// (OSPREY_FP8_DENSE_TMA=0 for off). Returns the previous setting.
bool set_fp8_swapab_dense_tma(bool on);
bool fp8_swapab_dense_tma();
// The dispatch's token limit (default 32, at most kSwapAbMaxTokens): a benchmark variant.
void set_fp8_swapab_max_tokens(int64_t n);
int64_t fp8_swapab_max_tokens();

// y [n, N] (F32 or BF16) = x8 · W8ᵀ block-scaled as above; x8 [n, K], xs [n, K/128].
void launch_fp8_swapab_linear(void* y, DType y_type, const uint8_t* x8, const float* xs,
                              const uint8_t* w8, const float* w_scale, int64_t n, int64_t N,
                              int64_t K);
// One linear of launch_fp8_swapab_linears: y [n, N] = x8 · W8ᵀ, W8 [N, K] e4m3 with its scales
// [ceil(N/128), K/128].
struct DenseLinear {
  void* y;
  const uint8_t* w8;
  const float* w_scale;
  int64_t N;
};
// Several linears of one x (x8 [n, K], xs [n, K/128]; every y of y_type) in one launch (up to 4;
// more go in launches of 4): their row blocks laid end to end, one grid. The same per-item
// arithmetic as a launch each, whose split-K choice may differ (set_fp8_swapab_dense_group).
// xs_cols > 0: xs is instead the Cols layout's [K/128, xs_cols] (ops/fp8_act.h; xs_cols = n_pad
// ≥ n, x8's rows past n unread), read in place.
void launch_fp8_swapab_linears(std::span<const DenseLinear> outs, DType y_type, const uint8_t* x8,
                               const float* xs, int64_t n, int64_t K, int64_t xs_cols = 0);
// The dense grid: kWaves (the default: one block an item, the waves' split choice) or persistent
// (a variant, measured no faster: min(items, SMs) blocks walking the items by static strides,
// splits chosen for the busiest block); OSPREY_FP8_DENSE_GRID=waves|persistent. Returns the
// previous setting.
enum class DenseGrid { kWaves, kPersistent };
DenseGrid set_fp8_swapab_dense_grid(DenseGrid g);
// Whether launch_fp8_swapab_linears puts its linears in one launch (default;
// OSPREY_FP8_DENSE_GROUP=0 launches each alone). Returns the previous setting.
bool set_fp8_swapab_dense_group(bool on);

// Grouped experts over a schedule of tile_rows-row tiles (moe_schedule.h with that tile size;
// tile_rows kSwapAbMoeTileRows or kSwapAbMoePrefillTileRows):
// h8 [rows, I] e4m3, hs [rows, I/128] = quantised silu(xs·gateᵀ) ⊙ (xs·upᵀ), xs[r] = the
// quantised x row perm[r] / top_k (x8 [n_tokens, D], xs [n_tokens, D/128]). I, D multiples of 128.
void launch_fp8_swapab_moe_gate_up(uint8_t* h8, float* hs, const uint8_t* x8, const float* xs,
                                   const MoeTile* tiles, int max_tiles,
                                   const MoeExpertPtrs* experts, const int32_t* perm, int top_k,
                                   int64_t D, int64_t I, int tile_rows, bool weight_maps);
// y [rows, D] F32 = h8 · downᵀ block-scaled, per tile with its expert's down.
void launch_fp8_swapab_moe_down(float* y, const uint8_t* h8, const float* hs, const MoeTile* tiles,
                                int max_tiles, const MoeExpertPtrs* experts, int64_t D, int64_t I,
                                int tile_rows, bool weight_maps);
// weight_maps: every expert of the table has its TMA maps (MoeExpertPtrs::gate_map ..); the
// kernels then load the weight tiles by TMA unless set_fp8_moe_weight_tma(false) /
// OSPREY_MOE_WEIGHT_TMA=0. Returns the previous setting.
bool set_fp8_moe_weight_tma(bool on);
// The MoE launches' grid: one block a work item (kItems), or persistent, one block an SM walking
// the items by static strides (kStrided) or claiming the next one from a counter (kClaimed, the
// default); OSPREY_MOE_GRID=items|strided|claimed. The same arithmetic, bit for bit. Returns the
// previous setting.
enum class MoeGrid { kItems, kStrided, kClaimed };
MoeGrid set_fp8_moe_grid(MoeGrid g);
// K groups a pipeline stage of the prefill (64-row) down projection: 2 (default) or 1, a benchmark
// variant; the same bits either way. Returns the previous value.
int set_fp8_moe_down_groups(int groups);
// Prefill gate/up: gate and up committed as two wgmma groups, gate's partial promoted while up's
// run (on), or one group and one wait (off, the default); the same bits either way. Returns the
// previous setting.
bool set_fp8_moe_split_waits(bool on);

}  // namespace osprey::ops::cuda
