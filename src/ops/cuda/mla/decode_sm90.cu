// Absorbed MLA attention on Hopper tensor cores (sm_90a): sparse (DSA top-k) and dense decode, and
// the absorbed sparse prefill (the same math for every query token of a chunk). Two kernels, each
// the faster on its cache (bench/RESULTS.md): the lockstep kernel described here serves the FP8
// cache, the seesaw kernel further down (namespace seesaw) the BF16 cache.
//
// Math (ops/mla.h, absorbed form): for query token t at position p of sequence s, over its
// attended entries i < L_t (sparse: j = topk[t, i], L_t = min(top-k, p + 1); dense: j = i,
// L_t = p + 1; entries with j < 0 or j > p are skipped),
//   S[h, i] = scale · q[t, h, :576] · row_j[:576]       row_j = latent cache row of position j
//   out[t, h, :512] = Σ_i softmax_i(S[h, :]) · row_j[:512],   lse[t, h] = log Σ_i e^S[h, i]
// Shapes: q [n_tokens, H, 576] F32 or BF16 (rounded to BF16 as it is staged); the cache
// [n_blocks, 64, 576] BF16 or the FP8 format [n_blocks, 64, 656] U8 (dequantised to BF16 in shared
// memory: e4m3 · tile scale, as the CPU twin reads it); out [n_tokens, H, 512] F32 or BF16; lse
// [n_tokens, H] F32 (optional). Both GEMMs run in BF16 with F32 accumulation (the lockstep
// kernel's f16 variant, kF16, the default for FP8 calls of at least 16 query tokens: the latent
// part of both GEMMs in f16, the rope part in BF16; see stage_q_f16).
//
// Grid [n_parts, ceil(H / 64)], 384 threads, one CTA per SM (≈ 226 KB of shared memory):
//   CTA (part, g) takes heads 64·g .. 64·g + 63 (rows past H are zero and never written) and the
//   part's run of 64-entry blocks from the split-KV plan (split_kv.cuh), token after token.
//   Warpgroup 2, the producer (setmaxnreg down to kProducerRegs), gathers the 64 cache rows of a
//   block into one of kStages shared-memory tiles (BF16: cp.async; FP8: 16-byte loads dequantised
//   to BF16; rows not attended are zero and flagged invalid), then arrives on the stage's `full`
//   mbarrier. (The seesaw kernel's dense BF16 tiles can instead come by TMA, one thread issuing
//   9 boxes a tile through a CUtensorMap of the cache: seesaw::tma_producer, the default;
//   OSPREY_MLA_DENSE_TMA=0 keeps the cp.async gathers.)
//   (Prompt chunks on a BF16 cache take the seesaw kernel's prefill variant, the default;
//   OSPREY_MLA_PREFILL=seesaw keeps the decode kernel for them. The variant fills in release
//   order, with 8-thread row gathers, batched Q staging, Q's rope in shared memory and the next
//   token's Q prefetched; described before mla_seesaw_sm90_kernel.)
//   Warpgroups 0 and 1, the consumers (setmaxnreg up to kConsumerRegs), share the 64 heads and the
//   key block:
//     S_w = Q [64 × 576] · K[32 keys of half w]ᵀ     wgmma m64n32k16, 36 k-steps, both from smem
//     row max exchanged between the two (named barrier), online softmax in base 2,
//     P_w (BF16) written to shared memory, a second named barrier,
//     O_w [64 × 256] += P [64 × 64] · V[64 keys, columns 256·w ..]   wgmma m64n256k16, V read
//                                                                      MN-major from the same tile
//   then arrive on the stage's `empty` mbarrier. Both halves use the same running max, so their
//   row sums add at the end. A token finished inside one part writes out (and lse) directly;
//   a split token writes its normalised partial and base-2 lse to the split slots for
//   mla_combine_splits.
// Shared-memory layout: every tile is SW128 (hopper/wgmma.cuh): 9 chunks of 64 rows × 64 columns.
// Preconditions: kv_lora 512, rope 64; sparse rows list their valid entries first (the indexer's
//   contract: entries at i ≥ min(top-k, p + 1) are −1 and are not read); H ≤ 64 or H % 64 == 0.
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/cluster.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/hopper/sync.cuh"
#include "ops/cuda/hopper/tma.cuh"
#include "ops/cuda/hopper/tma_map.h"
#include "ops/cuda/hopper/wgmma.cuh"
#include "ops/cuda/mla/decode_sm90.cuh"
#include "ops/cuda/mla/hooks.h"
#include "ops/cuda/mla/split_kv.cuh"
#include "ops/mla.h"

namespace osprey::ops::cuda {

namespace {
namespace hw = hopper;

constexpr int kLat = 512, kRope = 64, kWidth = kLat + kRope;
constexpr int kHeadsPerCta = 64;  // wgmma M: one warpgroup's 64 rows
constexpr int kBlockN = kMlaBlockN;
constexpr int kStages = 2;                         // cache tiles in flight (smem holds Q + 2 tiles)
constexpr int kChunks = kWidth / 64;               // SW128 chunks of 64 columns per row
constexpr int kSplitChunk = 5;                     // S's second accumulator chain starts here
constexpr int kChunkBytes = kBlockN * 128;         // one chunk of 64 rows
constexpr int kTileBytes = kChunks * kChunkBytes;  // [64 rows × 576] BF16
constexpr int kThreads = 384, kConsumerThreads = 256, kProducerThreads = 128;
// setmaxnreg moves registers within the CTA's own pool (384 threads × the 168 the entry cap
// gives = 64512): 128·96 + 256·200 = 63488 fits; a larger consumer share would block forever.
constexpr int kProducerRegs = 96, kConsumerRegs = 200;
constexpr int kFp8Bytes = kLat + 4 * (kLat / 128) + 2 * kRope;  // 656
// Named barriers (0 is __syncthreads): consumers only, 256 threads.
constexpr int kBarQ = 1, kBarMax = 2, kBarP = 3, kBarSum = 4, kBarQMax = 5;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct Smem {  // every tile 1024-aligned: the base is, and each tile is a multiple of 1024 B
  uint8_t q[kTileBytes];              // [64 heads × 576] BF16, SW128
  uint8_t kv[kStages][kTileBytes];    // [64 keys × 576] BF16, SW128
  uint8_t p[kChunkBytes];             // [64 heads × 64 keys] BF16, SW128
  float row_max[2][2][kHeadsPerCta];  // [tile parity][warpgroup][head]
  float row_sum[2][kHeadsPerCta];     // [warpgroup][head]
  uint8_t valid[kStages][kBlockN];    // key r of the stage is attended
  uint64_t full[kStages], empty[kStages];
  uint64_t remote[kStages];  // kCross: the peer's half of the stage's rows has landed (bytes)
  float q_amax[kConsumerThreads / 32];  // kF16: max |q| of each consumer warp's share of Q
};
constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + alignment slack of the dynamic base
static_assert(kSmemBytes <= 232448, "shared memory over the sm_90 per-block limit");
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "setmaxnreg pool");

struct Params {
  const void* q;
  const uint8_t* cache;
  int64_t token_bytes;
  void* out;
  float* lse;
  float* part_o;    // [slots, H, 512]
  float* part_lse;  // [slots, H]
  const int32_t* positions;
  const int32_t* qsl;
  const int32_t* block_table;
  int64_t max_blocks;
  int block_size, n_seqs;
  const int32_t* topk;
  int64_t topk_k;
  int H;
  float scale_log2;           // softmax scale · log2(e)
  const int32_t* cum;         // the split-KV plan (split_kv.cuh): [n_tokens + 1]
  const int32_t* split_base;  // [n_tokens + 1]
  const int32_t* part_start;  // [n_parts + 1]
  const int32_t* first_part;  // [n_tokens]
  const int32_t* n_splits;    // [n_tokens]
  int n_tokens;
};

// Attended entries of token t: L_t as in the plan.
template <bool kSparse>
__device__ __forceinline__ int entries_of(const Params& a, int64_t p) {
  return int(mla_token_entries(p, kSparse ? int64_t(a.topk_k) : INT64_MAX));
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 4 e4m3 bytes → 4 f16 (exact, one instruction a pair): bytes 0–1 into lo, 2–3 into hi.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, __half2& lo, __half2& hi) {
  lo = __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xffffu), __NV_E4M3));
  hi = __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3));
}

// 4 e4m3 bytes × s → 4 BF16 (two words), through f16 (exact) and F32 (the CPU twin's product).
__device__ __forceinline__ uint2 dequant4(uint32_t w, float s) {
  __half2 lo, hi;
  e4m3x4_to_f16(w, lo, hi);
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  return make_uint2(bf16x2(a.x * s, a.y * s), bf16x2(b.x * s, b.y * s));
}

// The f16 variant (kF16): an f16 pair, and 4 e4m3 bytes × s → 4 f16 (two words): e4m3 → f16
// exact (one instruction a pair), then one f16 multiply a pair (s rounded to f16; the product
// rounded to f16, which keeps 11 bits where BF16 keeps 8: tools/mla_fp8_f16_numerics.py).
__device__ __forceinline__ uint32_t f16x2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint2 dequant4_f16(uint32_t w, __half2 s) {
  __half2 lo, hi;
  e4m3x4_to_f16(w, lo, hi);
  const __half2 a = __hmul2(lo, s), b = __hmul2(hi, s);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// The producer's share of one stage: thread pt (0..127) fills half `half` of row r = pt / 2.
// BF16 rows: cp.async of the half's 36 units of 8 values.
__device__ __forceinline__ void load_row_half_bf16(uint8_t* tile, const Params& a, int r, int half,
                                                   int64_t row) {
  const bool ok = row >= 0;
  uint8_t* dst_row = tile + r * 128;  // + chunk · kChunkBytes
  const uint32_t sw = uint32_t(r & 7);
  // 576 BF16 = 72 units of 8; this half takes units 36·half .. 36·half + 35.
  const uint8_t* src = a.cache + (ok ? row : 0) * a.token_bytes;
#pragma unroll 12
  for (int k = 0; k < 36; ++k) {
    const int u = half * 36 + k, chunk = u >> 3, uu = u & 7;
    hw::cp_async_16(dst_row + chunk * kChunkBytes + ((uint32_t(uu) ^ sw) << 4), src + u * 16,
                    ok ? 16u : 0u);
  }
}

// FP8 rows (656 bytes: 512 e4m3 latent values, 4 F32 scales of 128 values each, 64 BF16 rope):
// the lockstep kernel's rows come by rowwise_producer below, the crossover's by the helpers here.
// Half `half` of row r's rope (BF16, no conversion: 4 units of 8) straight to shared memory by
// cp.async; zero-filled for an invalid row.
__device__ __forceinline__ void copy_fp8_rope(uint8_t* tile, const Params& a, int r, int half,
                                              int64_t row) {
  const bool ok = row >= 0;
  uint8_t* dst_row = tile + r * 128;  // + chunk · kChunkBytes
  const uint32_t sw = uint32_t(r & 7);
  const uint8_t* pe = a.cache + (ok ? row : 0) * a.token_bytes + kLat + 4 * (kLat / 128);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int ru = half * 4 + k;  // rope unit (8 BF16) → column 512 + 8·ru
    const int u = kLat / 8 + ru, chunk = u >> 3, uu = u & 7;
    hw::cp_async_16(dst_row + chunk * kChunkBytes + ((uint32_t(uu) ^ sw) << 4), pe + ru * 16,
                    ok ? 16u : 0u);
  }
}

// The crossover (kCross: FP8 cache, 128 heads, the two head groups of a token in one cluster of
// two CTAs, after FlashMLA's FP8 sparse decode, docs/20250929-hopper-fp8-sparse-deep-dive.md; no
// code taken). Both CTAs of a cluster take the same key tiles; dequantising is the CUDA cores'
// bottleneck (e4m3 → f16 → F32, × scale, → BF16: ~64 cycles a key at 16 conversions a cycle
// against ~34 of MMA for 64 heads), so CTA rank c dequantises rows 32·c .. 32·c + 31 of each tile
// only, writes them to its own tile and, by st.async, to the peer's, whose `remote` barrier counts
// the bytes. Each CTA still copies the rope of all 64 rows (cp.async, no conversion) and sets its
// own valid flags. Producer thread pt: row 32·c + pt / 4, latent columns 128·(pt % 4) .. + 127
// (one scale tile: 8 loads of 16 e4m3, 16 stores of 8 BF16 each way).
constexpr int kCrossRows = kBlockN / 2;                  // rows a CTA dequantises per tile
constexpr uint32_t kCrossBytes = kCrossRows * kLat * 2;  // BF16 bytes the peer sends per tile
__device__ __forceinline__ float fetch_fp8_scale(const Params& a, int quarter, int64_t row) {
  if (row < 0) return 0.0f;
  return *reinterpret_cast<const float*>(a.cache + row * a.token_bytes + kLat + 4 * quarter);
}
// The quarter's 128 e4m3 values (8 loads of 16, all in flight; zero for a row not attended),
// loaded before the producer waits for the stage: 32 registers, so the loads' latency overlaps
// the consumers' work on the stage (the non-crossover producer's 64 would spill).
__device__ __forceinline__ void load_fp8_quarter(uint4 (&v)[8], const Params& a, int quarter,
                                                 int64_t row) {
  const bool ok = row >= 0;
  const uint8_t* src = a.cache + (ok ? row : 0) * a.token_bytes + quarter * 128;
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = ok ? hw::ld_nc_16(src + k * 16) : make_uint4(0u, 0u, 0u, 0u);
}
// Row r's quarter dequantised (× its tile scale) into this CTA's tile and, by st.async completing
// on the peer's `remote` barrier (peer_bar), into the peer's (peer_tile: mapa of the tile).
__device__ __forceinline__ void store_fp8_quarter_cross(uint8_t* tile, uint32_t peer_tile,
                                                        uint32_t peer_bar, const uint4 (&v)[8],
                                                        int r, int quarter, float scale) {
  const uint32_t sw = uint32_t(r & 7);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint2 a0 = dequant4(v[k].x, scale), a1 = dequant4(v[k].y, scale);
    const uint2 b0 = dequant4(v[k].z, scale), b1 = dequant4(v[k].w, scale);
    // 16 values = BF16 units u0, u0 + 1 of the row (8 values each): chunk 2·quarter + k / 4.
    const int u0 = 16 * quarter + 2 * k, chunk = u0 >> 3, uu = u0 & 7;
    const uint32_t off0 = uint32_t(chunk * kChunkBytes + r * 128) + ((uint32_t(uu) ^ sw) << 4);
    const uint32_t off1 = uint32_t(chunk * kChunkBytes + r * 128) + ((uint32_t(uu + 1) ^ sw) << 4);
    const uint4 lo = make_uint4(a0.x, a0.y, a1.x, a1.y), hi = make_uint4(b0.x, b0.y, b1.x, b1.y);
    hw::st_shared_16(tile + off0, lo);
    hw::st_shared_16(tile + off1, hi);
    hw::st_async_16(peer_tile + off0, lo, peer_bar);
    hw::st_async_16(peer_tile + off1, hi, peer_bar);
  }
}

// Masks S (N accumulators of an m64nNk16 fragment: invalid keys → −∞), scales it to base 2 and
// returns the row maxima of rows r0 / r0 + 8 over the quad. valid: the flags of S's first key.
template <int N>
__device__ __forceinline__ void mask_max(float (&s)[N], const uint8_t* valid, float scale_log2,
                                         int cq, float& mx0, float& mx1) {
  mx0 = -INFINITY;
  mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int key = 8 * (i >> 2) + cq + (i & 1);
    s[i] = valid[key] ? s[i] * scale_log2 : -INFINITY;
    if (i & 2)
      mx1 = fmaxf(mx1, s[i]);
    else
      mx0 = fmaxf(mx0, s[i]);
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
}

// The dynamic shared memory base rounded up to 1024 bytes (SW128 tiles; kSmemBytes has the slack).
template <typename S>
__device__ __forceinline__ S& aligned_smem(uint8_t* raw) {
  return *reinterpret_cast<S*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}
// The part's run [w0, w1) of the plan's 64-entry blocks; false if empty.
__device__ __forceinline__ bool part_run(const Params& a, int part, int32_t& w0, int32_t& w1) {
  w0 = a.part_start[part];
  w1 = a.part_start[part + 1];
  return w0 < w1;
}

// Token t's share of a part's run [w0, w1): its blocks b0 .. b1 − 1, its sequence, position and
// attended entries (the producer's walk).
struct TokenRun {
  int b0, b1, seq, L;
  int64_t p;
};
template <bool kSparse>
__device__ __forceinline__ TokenRun token_run(const Params& a, int t, int32_t w0, int32_t w1) {
  const int32_t c0 = a.cum[t];
  TokenRun r;
  r.b0 = max(w0, c0) - c0;
  r.b1 = min(w1, a.cum[t + 1]) - c0;
  r.seq = seq_of_token(a.qsl, a.n_seqs, t);
  r.p = a.positions[t];
  r.L = entries_of<kSparse>(a, r.p);
  return r;
}

// The latent cache row of entry i of token t (sequence s, position p, L attended entries), or −1
// for an entry not attended (i ≥ L, a −1 index, or past the position), in two lookups:
// attended_entry gives the entry's cache position j (the top-k load; −1 for i ≥ L), cache_row
// its row (the block-table load; −1 for j < 0 or j > p).
template <bool kSparse>
__device__ __forceinline__ int64_t attended_entry(const Params& a, int t, int L, int i) {
  if (i >= L) return -1;
  return kSparse ? int64_t(a.topk[int64_t(t) * a.topk_k + i]) : int64_t(i);
}
__device__ __forceinline__ int64_t cache_row(const Params& a, int s, int64_t p, int64_t j) {
  if (j < 0 || j > p) return -1;
  return int64_t(a.block_table[int64_t(s) * a.max_blocks + j / a.block_size]) * a.block_size +
         j % a.block_size;
}
template <bool kSparse>
__device__ __forceinline__ int64_t attended_row(const Params& a, int t, int s, int64_t p, int L,
                                                int i) {
  return cache_row(a, s, p, attended_entry<kSparse>(a, t, L, i));
}

// Q of token t, heads 64·g .. 64·g + 63, its first kUnits·8 columns as BF16 into the SW128 tile q
// (rows past H zero), by the 256 consumer threads.
// The Q tile's layout, for stage_q and stage_q_f16: unit (hr, cu), 8 values of head row hr and
// columns 8·cu .. 8·cu + 7, is the 16 bytes unit(h, cu) returns (h = 64·g + hr < H), else zeros,
// stored in chunk cu / 8 of q at its SW128 place; by the 256 consumer threads.
template <int kUnits, typename Unit>
__device__ __forceinline__ void store_q_units(uint8_t* q, const Params& a, int g, Unit unit) {
  for (int u = int(threadIdx.x); u < kHeadsPerCta * kUnits; u += kConsumerThreads) {
    const int hr = u / kUnits, cu = u % kUnits;
    const int h = g * kHeadsPerCta + hr;
    const uint4 v = h < a.H ? unit(h, cu) : make_uint4(0u, 0u, 0u, 0u);
    hw::st_shared_16(
        q + (cu >> 3) * kChunkBytes + hr * 128 + ((uint32_t((cu & 7) ^ (hr & 7))) << 4), v);
  }
}
template <typename Tq, int kUnits>
__device__ __forceinline__ void stage_q(uint8_t* q, const Params& a, int t, int g) {
  store_q_units<kUnits>(q, a, g, [&](int h, int cu) {
    const Tq* src = static_cast<const Tq*>(a.q) + (int64_t(t) * a.H + h) * kWidth + cu * 8;
    if constexpr (sizeof(Tq) == 4) {
      const float4 x = reinterpret_cast<const float4*>(src)[0];
      const float4 y = reinterpret_cast<const float4*>(src)[1];
      return make_uint4(bf16x2(x.x, x.y), bf16x2(x.z, x.w), bf16x2(y.x, y.y), bf16x2(y.z, y.w));
    } else {
      return *reinterpret_cast<const uint4*>(src);
    }
  });
}

// The f16 variant's Q (kF16): as stage_q (values rounded to BF16 first, as the CPU twin reads
// them), then × 2^−k, chunks 0–7 (the latent part) stored as f16 and chunk 8 (the rope) as BF16;
// k ≥ 0 is the least such that max |q| · 2^−k < 2^15 over the CTA's 64 heads, so that no f16
// value overflows (a power of two: exact in BF16, exact in f16 above 2^−14). Returns 2^k, which
// S's scale takes back. Two passes over q (the maximum, then the stores; the second an L2 hit),
// the 256 consumer threads meeting at named barrier kBarQMax between them.
template <typename Tq>
__device__ __forceinline__ void load_q_unit(const Params& a, int t, int h, int cu, float (&x)[8]) {
  const Tq* src = static_cast<const Tq*>(a.q) + (int64_t(t) * a.H + h) * kWidth + cu * 8;
  if constexpr (sizeof(Tq) == 4) {
    const float4 f0 = reinterpret_cast<const float4*>(src)[0];
    const float4 f1 = reinterpret_cast<const float4*>(src)[1];
    const float f[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __bfloat162float(__float2bfloat16_rn(f[i]));
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}
template <typename Tq, int kUnits>
__device__ __forceinline__ float stage_q_f16(uint8_t* q, float* warp_amax, const Params& a, int t,
                                             int g) {
  float amax = 0.0f;
  for (int u = int(threadIdx.x); u < kHeadsPerCta * kUnits; u += kConsumerThreads) {
    const int h = g * kHeadsPerCta + u / kUnits;
    if (h >= a.H) continue;
    float x[8];
    load_q_unit<Tq>(a, t, h, u % kUnits, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if ((threadIdx.x & 31) == 0) warp_amax[threadIdx.x >> 5] = amax;
  hw::named_barrier(kBarQMax, kConsumerThreads);
#pragma unroll
  for (int i = 0; i < kConsumerThreads / 32; ++i) amax = fmaxf(amax, warp_amax[i]);
  // amax < 2^15: k = 0; else 2^e ≤ amax < 2^(e + 1) and k = e − 14 (inf or NaN q: k capped).
  const int k = amax < 32768.0f ? 0 : min(ilogbf(amax) - 14, 120);
  const float down = ldexpf(1.0f, -k);
  store_q_units<kUnits>(q, a, g, [&](int h, int cu) {
    float x[8];
    load_q_unit<Tq>(a, t, h, cu, x);
    auto pack = [&](float lo, float hi) {
      return cu < kLat / 8 ? f16x2(lo * down, hi * down) : bf16x2(lo * down, hi * down);
    };
    return make_uint4(pack(x[0], x[1]), pack(x[2], x[3]), pack(x[4], x[5]), pack(x[6], x[7]));
  });
  return ldexpf(1.0f, k);
}

// A token's row sums l0, l1 (rows r0, r1): this thread's part summed over its quad, then over the
// two consumer warpgroups through row_sum [2][64] (named barrier `bar`, 256 threads). The caller
// passes the barrier once more before row_sum is written again.
__device__ __forceinline__ void sum_rows(float& l0, float& l1, float (*row_sum)[kHeadsPerCta],
                                         int w, int r0, int r1, int bar) {
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  if ((threadIdx.x & 3) == 0) {
    row_sum[w][r0] = l0;
    row_sum[w][r1] = l1;
  }
  hw::named_barrier(bar, kConsumerThreads);
  l0 += row_sum[w ^ 1][r0];
  l1 += row_sum[w ^ 1][r1];
}

// Writes a token's output rows r0, r1 (this thread's columns of half w) normalised by their row
// sums l (base-2 max m) and the lse: to out / lse when the token is finished inside this part,
// else to its split slot for mla_combine_splits (base-2 lse there).
template <typename To>
__device__ __forceinline__ void write_out(const Params& a, const float (&o)[128], int t, int part,
                                          int w, int r0, int r1, int cq, int g, float l0, float l1,
                                          float m0, float m1) {
  const int lane = threadIdx.x & 31;
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  const float lse0 = l0 > 0.0f ? m0 + log2f(l0) : -INFINITY;
  const float lse1 = l1 > 0.0f ? m1 + log2f(l1) : -INFINITY;
  const int n_splits = a.n_splits[t];
  const int h0 = g * kHeadsPerCta + r0, h1 = g * kHeadsPerCta + r1;
  if (n_splits == 1) {
    To* out = static_cast<To*>(a.out);
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
      const int row = (i & 2) ? h1 : h0;
      if (row >= a.H) continue;
      const float inv = (i & 2) ? inv1 : inv0;
      const int col = 256 * w + 8 * (i >> 2) + cq;
      To* d = out + (int64_t(t) * a.H + row) * kLat + col;
      if constexpr (sizeof(To) == 4) {
        *reinterpret_cast<float2*>(d) = make_float2(o[i] * inv, o[i + 1] * inv);
      } else {
        *reinterpret_cast<uint32_t*>(d) = bf16x2(o[i] * inv, o[i + 1] * inv);
      }
    }
    if (a.lse && w == 0 && (lane & 3) == 0) {
      if (h0 < a.H) a.lse[int64_t(t) * a.H + h0] = lse0 * kLn2;
      if (h1 < a.H) a.lse[int64_t(t) * a.H + h1] = lse1 * kLn2;
    }
  } else {
    const int slot = a.split_base[t] + (part - a.first_part[t]);
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
      const int row = (i & 2) ? h1 : h0;
      if (row >= a.H) continue;
      const float inv = (i & 2) ? inv1 : inv0;
      const int col = 256 * w + 8 * (i >> 2) + cq;
      *reinterpret_cast<float2*>(a.part_o + (int64_t(slot) * a.H + row) * kLat + col) =
          make_float2(o[i] * inv, o[i + 1] * inv);
    }
    if (w == 0 && (lane & 3) == 0) {
      if (h0 < a.H) a.part_lse[int64_t(slot) * a.H + h0] = lse0;
      if (h1 < a.H) a.part_lse[int64_t(slot) * a.H + h1] = lse1;
    }
  }
}

// The part's run is w1 − w0 tiles (one per plan block); a walker (token t, its tile b) yields
// the rows of the next tile to look up, −1 past the run, so a producer can look rows up tiles
// ahead of the one it fills. (A crossover producer that kept the next tile's latent in flight
// too, 104 registers, measured 15% slower than the per-tile one on the H200, 2026-12-07:
// 203.7 against 177.0 µs at B = 64; bench/RESULTS.md.)
struct TileWalk {
  int t, b;      // the next tile to look up: token t's tile b
  TokenRun run;  // token t's share of the part
};
// Moves the walker to the next token with a tile left in the part; false past the run.
template <bool kSparse>
__device__ __forceinline__ bool walk_next(const Params& a, TileWalk& w, int32_t w0, int32_t w1) {
  while (w.b >= w.run.b1 && w.t + 1 < a.n_tokens && a.cum[w.t + 1] < w1) {
    ++w.t;
    w.run = token_run<kSparse>(a, w.t, w0, w1);
    w.b = w.run.b0;
  }
  return w.b < w.run.b1;
}
template <bool kSparse>
__device__ __forceinline__ TileWalk walk_start(const Params& a, int t_first, int32_t w0,
                                               int32_t w1) {
  TileWalk w;
  w.t = t_first;
  w.run = token_run<kSparse>(a, t_first, w0, w1);
  w.b = w.run.b0;
  return w;
}
// attended_row's two lookups for a walker, so that neither load need be waited on in the
// iteration that issues it: walk_entry takes the next tile's row rr through attended_entry (the
// walker moved past the tile; j = −1 past the run) and keeps what entry_row, an iteration later,
// passes to cache_row.
struct RowEntry {
  int32_t j, seq, p;
};
template <bool kSparse>
__device__ __forceinline__ RowEntry walk_entry(const Params& a, TileWalk& w, int32_t w0, int32_t w1,
                                               int rr) {
  RowEntry e{-1, 0, 0};
  if (walk_next<kSparse>(a, w, w0, w1)) {
    e.j = int32_t(attended_entry<kSparse>(a, w.t, w.run.L, w.b * kBlockN + rr));
    e.seq = w.run.seq;
    e.p = int32_t(w.run.p);
    ++w.b;
  }
  return e;
}
__device__ __forceinline__ int32_t entry_row(const Params& a, RowEntry e) {
  return int32_t(cache_row(a, e.seq, e.p, e.j));
}

// The lockstep kernel's FP8 producer, by rows. Measured on the H200 (2026-12-07, Nsight Compute
// at B = 64): with a producer thread for each half row (256 contiguous bytes in 16 loads, so each
// warp-wide load touched 32 rows' lines, 32 L1 wavefronts a request) the L1/TEX pipe was 70%
// busy, the tensor pipe 20-30%. Here a warp takes 16 whole rows and a load instruction reads one
// row's 512 latent bytes, 16 a lane (4 lines a request): L1/TEX 50% busy (H100, ncu), and the
// kernel faster at every bench row (H100, beside the half-row producer in one binary: 173.4
// against 177.9 µs at B = 64, 23.9 / 24.3 at B = 1, 68.0 / 70.4 at B = 16; alone in the kernel,
// the next call: 163.7 at B = 64). Nsight Compute's source counters on this kernel (H100, B = 64)
// put a third of the consumers' samples on the wait for `full`: the producer is the bound. Its
// own samples: ~17% on the walker's top-k and block-table loads (then the chain of tile i + 2,
// waited on inside the iteration), ~15% on the latent loads' first use after the stage wait, and
// over half issuing (the conversion's ~3 instructions a value). So the lookup is now split across
// iterations (RowEntry): 164.4 -> 160.6 µs at B = 64, 1-2.5% at every B >= 16 row (H100, the two
// binaries alternated twice in one call, 2026-12-07). Layout:
// warp pw: tile rows 16·pw .. 16·pw + 15; lane l: the row's 16-value unit l (values 16·l ..,
// scale tile l / 8), written as BF16 units 2·l, 2·l + 1 of chunk l / 4. Lane j < 16 (and j + 16)
// holds row 16·pw + j's cache row; lane l gathers the scales of rows l / 4 and 8 + l / 4 (tile
// l % 4) in two loads; rows and scales reach the other lanes by shuffles. The rope goes by
// cp.async, 4 rows an instruction (lane: row 4·k + l / 8, unit l % 8). Lookups run ahead: while
// tile i is loaded and converted, tile i + 1's scales, tile i + 2's block-table entries and tile
// i + 3's top-k entries are in flight.
// Odd chunks store their two units in the opposite order, so a store instruction's 32 lanes fill
// all 8 16-byte slots of a 128-byte bank line (4 wavefronts, not 8).
__device__ __forceinline__ void rowwise_scales(const Params& a, int32_t row, int lane, float& s0,
                                               float& s1) {
  s0 = fetch_fp8_scale(a, lane & 3, __shfl_sync(0xffffffffu, row, lane >> 2));
  s1 = fetch_fp8_scale(a, lane & 3, __shfl_sync(0xffffffffu, row, 8 + (lane >> 2)));
}
template <bool kSparse, bool kF16>
__device__ __forceinline__ void rowwise_producer(Smem& sm, const Params& a, int pt, int t_first,
                                                 int32_t w0, int32_t w1) {
  const int pw = pt >> 5, lane = pt & 31, rbase = 16 * pw;
  const int my = rbase + (lane & 15);  // the tile row this lane looks up
  TileWalk w = walk_start<kSparse>(a, t_first, w0, w1);
  // Tile i's row and scales, tile i + 1's row, tile i + 2's top-k entry; in iteration i tile
  // i + 3's entry is loaded, tile i + 2's block-table entry and tile i + 1's scales, each first
  // used an iteration later.
  int32_t r0 = entry_row(a, walk_entry<kSparse>(a, w, w0, w1, my));
  int32_t r1 = entry_row(a, walk_entry<kSparse>(a, w, w0, w1, my));
  RowEntry e2 = walk_entry<kSparse>(a, w, w0, w1, my);
  float s0a, s0b;
  rowwise_scales(a, r0, lane, s0a, s0b);
  const int chunk = lane >> 2, uu0 = 2 * (lane & 3), flip = chunk & 1;
  const int n = w1 - w0;
  for (int it = 0; it < n; ++it) {
    const int stage = it % kStages;
    float s1a, s1b;
    rowwise_scales(a, r1, lane, s1a, s1b);
    const int32_t r2 = entry_row(a, e2);
    const RowEntry e3 = walk_entry<kSparse>(a, w, w0, w1, my);
    hw::mbar_wait(&sm.empty[stage], ((it / kStages) & 1) ^ 1);
    uint8_t* tile = sm.kv[stage];
    if (lane < 16) sm.valid[stage][my] = r0 >= 0 ? 1 : 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // rope: rows 4·k .. 4·k + 3, 8 lanes a row
      const int j = 4 * k + (lane >> 3), ru = lane & 7, r = rbase + j;
      const int32_t rj = __shfl_sync(0xffffffffu, r0, j);
      const uint8_t* pe =
          a.cache + int64_t(rj >= 0 ? rj : 0) * a.token_bytes + kLat + 4 * (kLat / 128) + 16 * ru;
      hw::cp_async_16(tile + 8 * kChunkBytes + r * 128 + ((uint32_t(ru) ^ uint32_t(r & 7)) << 4),
                      pe, rj >= 0 ? 16u : 0u);
    }
    uint4 v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int32_t rj = __shfl_sync(0xffffffffu, r0, j);
      v[j] = rj >= 0 ? hw::ld_nc_16(a.cache + int64_t(rj) * a.token_bytes + 16 * lane)
                     : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int r = rbase + j;
      const uint32_t sw = uint32_t(r & 7);
      const float sc = __shfl_sync(0xffffffffu, j < 8 ? s0a : s0b, (j & 7) * 4 + (lane >> 3));
      const uint4 x = flip ? make_uint4(v[j].z, v[j].w, v[j].x, v[j].y) : v[j];
      uint2 a0, a1, b0, b1;
      if constexpr (kF16) {
        const __half2 h = __float2half2_rn(sc);
        a0 = dequant4_f16(x.x, h);
        a1 = dequant4_f16(x.y, h);
        b0 = dequant4_f16(x.z, h);
        b1 = dequant4_f16(x.w, h);
      } else {
        a0 = dequant4(x.x, sc);
        a1 = dequant4(x.y, sc);
        b0 = dequant4(x.z, sc);
        b1 = dequant4(x.w, sc);
      }
      uint8_t* d = tile + chunk * kChunkBytes + r * 128;
      hw::st_shared_16(d + ((uint32_t(uu0 + flip) ^ sw) << 4), make_uint4(a0.x, a0.y, a1.x, a1.y));
      hw::st_shared_16(d + ((uint32_t(uu0 + 1 - flip) ^ sw) << 4),
                       make_uint4(b0.x, b0.y, b1.x, b1.y));
    }
    hw::cp_async_wait_all();  // the rope
    hw::fence_proxy_async();
    hw::mbar_arrive(&sm.full[stage]);
    r0 = r1;
    r1 = r2;
    e2 = e3;
    s0a = s1a;
    s0b = s1b;
  }
}

// kCross (FP8 cache, H a multiple of 128, launched in clusters of 1 × 2 CTAs: the two head
// groups of each part): the crossover above. Per stage, `full` counts the 128 local producer
// threads (their rows and rope landed), `remote` one local expect_tx arrival plus the peer's
// kCrossBytes, and `empty` the release of both CTAs' consumers (one arrival per warp on each
// CTA's barrier: 16), so that neither producer overwrites a tile either CTA still reads. The
// cluster synchronises after the barriers are initialised and before any CTA exits (a peer's
// arrivals and stores must find this CTA's shared memory).
template <typename Tq, typename To, bool kFp8, bool kSparse, bool kCross = false, bool kF16 = false>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_sm90_kernel(const Params a) {
  static_assert(kFp8 || !kCross, "the crossover shares dequantised FP8 rows");
  static_assert(!kF16 || (kFp8 && !kCross), "the f16 variant: the lockstep kernel, FP8 cache");
  pdl_wait();
  pdl_trigger();
  extern __shared__ uint8_t smem_raw[];
  Smem& sm = aligned_smem<Smem>(smem_raw);
  const int tid = threadIdx.x;
  const int part = blockIdx.x, g = blockIdx.y;
  int32_t w0, w1;
  // The whole CTA, and with kCross its peer too (the same part): no barrier was used yet.
  if (!part_run(a, part, w0, w1)) return;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      hw::mbar_init(&sm.full[s], kProducerThreads);
      hw::mbar_init(&sm.empty[s], kCross ? 2 * kConsumerThreads / 32 : kConsumerThreads);
      if constexpr (kCross) hw::mbar_init(&sm.remote[s], 1);
    }
    hw::mbar_init_fence();
  }
  if constexpr (kCross)
    hw::cluster_sync();  // the peer's barriers are initialised before this CTA arrives on them
  else
    __syncthreads();
  // kCross: this CTA's rank in its cluster (= g % 2) and its peer's.
  [[maybe_unused]] const uint32_t rank = kCross ? hw::cluster_ctarank() : 0u, peer = rank ^ 1u;
  // The part's first token: the largest t with cum[t] ≤ w0 (the search seq_of_token does).
  const int t_first = seq_of_token(a.cum, a.n_tokens, w0);

  if (tid >= kConsumerThreads) {  // ---- producer warpgroup ----
    hw::regs_dealloc<kProducerRegs>();
    const int pt = tid - kConsumerThreads, r = pt >> 1, half = pt & 1;
    if constexpr (kFp8 && !kCross) {
      rowwise_producer<kSparse, kF16>(sm, a, pt, t_first, w0, w1);
      return;
    }
    // kCross: this thread's dequantised row (in the CTA's half of the tile) and scale tile.
    [[maybe_unused]] const int rd = kCrossRows * int(rank) + (pt >> 2), quarter = pt & 3;
    int it = 0;
    for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
      const TokenRun run = token_run<kSparse>(a, t, w0, w1);
      const int b0 = run.b0, b1 = run.b1, s = run.seq, L = run.L;
      const int64_t p = run.p;
      for (int b = b0; b < b1; ++b, ++it) {
        const int stage = it % kStages;
        // The row's index (and the crossover's scale and latent) before the stage is free: the
        // top-k and block-table lookups overlap the consumers' use of it.
        const int64_t row = attended_row<kSparse>(a, t, s, p, L, b * kBlockN + r);
        if constexpr (kCross) {
          const int64_t row_d = attended_row<kSparse>(a, t, s, p, L, b * kBlockN + rd);
          const float scale = fetch_fp8_scale(a, quarter, row_d);
          uint4 v[8];
          load_fp8_quarter(v, a, quarter, row_d);
          hw::mbar_wait_cluster(&sm.empty[stage], ((it / kStages) & 1) ^ 1);
          if (pt == 0) hw::mbar_arrive_expect_tx(&sm.remote[stage], kCrossBytes);
          if (half == 0) sm.valid[stage][r] = row >= 0 ? 1 : 0;
          copy_fp8_rope(sm.kv[stage], a, r, half, row);
          store_fp8_quarter_cross(sm.kv[stage], hw::mapa(sm.kv[stage], peer),
                                  hw::mapa(&sm.remote[stage], peer), v, rd, quarter, scale);
        } else {
          hw::mbar_wait(&sm.empty[stage], ((it / kStages) & 1) ^ 1);
          if (half == 0) sm.valid[stage][r] = row >= 0 ? 1 : 0;
          load_row_half_bf16(sm.kv[stage], a, r, half, row);
        }
        hw::cp_async_wait_all();  // BF16 rows, or the crossover's rope
        hw::fence_proxy_async();
        hw::mbar_arrive(&sm.full[stage]);
      }
    }
    if constexpr (kCross) hw::cluster_sync();  // the consumers of both CTAs are done
    return;
  }

  // ---- consumer warpgroups ----
  hw::regs_alloc<kConsumerRegs>();
  const int w = tid >> 7, ct = tid & 127, lane = tid & 31;
  const int r0 = 16 * (ct >> 5) + (lane >> 2), r1 = r0 + 8;  // this thread's two head rows
  const int cq = 2 * (lane & 3);                             // its column offset in an 8-group
  int it = 0, par = 0;
  for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
    const int32_t c0 = a.cum[t];
    const int b0 = max(w0, c0) - c0, b1 = min(w1, a.cum[t + 1]) - c0;

    float scale_log2 = a.scale_log2;
    if constexpr (kF16)
      scale_log2 *= stage_q_f16<Tq, kWidth / 8>(sm.q, sm.q_amax, a, t, g);
    else
      stage_q<Tq, kWidth / 8>(sm.q, a, t, g);  // Q [64 heads × 576]
    hw::fence_proxy_async();
    hw::named_barrier(kBarQ, kConsumerThreads);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int b = b0; b < b1; ++b, ++it, par ^= 1) {
      const int stage = it % kStages;
      hw::mbar_wait(&sm.full[stage], (it / kStages) & 1);
      if constexpr (kCross) hw::mbar_wait_cluster(&sm.remote[stage], (it / kStages) & 1);
      const uint8_t* kv = sm.kv[stage];

      // Two independent accumulator chains (chunks 0–4 and 5–8) so that the tensor pipe overlaps
      // them instead of waiting out each dependent N = 32 step; summed after the wait.
      float sc[16], sc2[16];
      hw::wgmma_fence();
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint64_t da = hw::sw128_desc(sm.q + c * kChunkBytes + kk * 32, 16, 1024);
          const uint64_t db =
              hw::sw128_desc(kv + c * kChunkBytes + w * 32 * 128 + kk * 32, 16, 1024);
          // kF16: chunks 0–7 (the latent) in f16, chunk 8 (the rope) in BF16, one accumulator.
          if (c < kSplitChunk) {
            if constexpr (kF16)
              hw::wgmma_m64n32k16_f16_ss(sc, da, db, c > 0 || kk > 0);
            else
              hw::wgmma_m64n32k16_bf16_ss(sc, da, db, c > 0 || kk > 0);
          } else if (kF16 && c < kChunks - 1) {
            hw::wgmma_m64n32k16_f16_ss(sc2, da, db, c > kSplitChunk || kk > 0);
          } else {
            hw::wgmma_m64n32k16_bf16_ss(sc2, da, db, c > kSplitChunk || kk > 0);
          }
        }
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(sc);
      hw::fence_regs(sc2);
#pragma unroll
      for (int i = 0; i < 16; ++i) sc[i] += sc2[i];

      // Mask and scale; row maxima of this half, then of both halves.
      float mx0, mx1;
      mask_max(sc, sm.valid[stage] + 32 * w, scale_log2, cq, mx0, mx1);
      if ((lane & 3) == 0) {
        sm.row_max[par][w][r0] = mx0;
        sm.row_max[par][w][r1] = mx1;
      }
      hw::named_barrier(kBarMax, kConsumerThreads);
      const float n0 = fmaxf(m0, fmaxf(mx0, sm.row_max[par][w ^ 1][r0]));
      const float n1 = fmaxf(m1, fmaxf(mx1, sm.row_max[par][w ^ 1][r1]));
      const float ref0 = n0 == -INFINITY ? 0.0f : n0, ref1 = n1 == -INFINITY ? 0.0f : n1;
      const float corr0 = exp2f(m0 - ref0), corr1 = exp2f(m1 - ref1);
      m0 = n0;
      m1 = n1;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        sc[i] = exp2f(sc[i] - ((i & 2) ? ref1 : ref0));
        if (i & 2)
          s1 += sc[i];
        else
          s0 += sc[i];
      }
      l0 = l0 * corr0 + s0;
      l1 = l1 * corr1 + s1;
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? corr1 : corr0;

      // P (BF16; kF16: f16) into shared memory: this half's 32 key columns of the [64 × 64] tile.
      auto pack_p = [](float lo, float hi) { return kF16 ? f16x2(lo, hi) : bf16x2(lo, hi); };
#pragma unroll
      for (int n8 = 0; n8 < 4; ++n8) {
        const uint32_t uu = uint32_t(4 * w + n8);
        *reinterpret_cast<uint32_t*>(sm.p + r0 * 128 + (((uu ^ uint32_t(r0)) & 7u) << 4) + cq * 2) =
            pack_p(sc[4 * n8], sc[4 * n8 + 1]);
        *reinterpret_cast<uint32_t*>(sm.p + r1 * 128 + (((uu ^ uint32_t(r1)) & 7u) << 4) + cq * 2) =
            pack_p(sc[4 * n8 + 2], sc[4 * n8 + 3]);
      }
      hw::fence_proxy_async();
      hw::named_barrier(kBarP, kConsumerThreads);

      hw::fence_regs(o);
      hw::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t dp = hw::sw128_desc(sm.p + kk * 32, 16, 1024);
        const uint64_t dv =
            hw::sw128_desc(kv + 4 * w * kChunkBytes + kk * 16 * 128, kChunkBytes, 1024);
        if constexpr (kF16)
          hw::wgmma_m64n256k16_f16_ss_tb(o, dp, dv, true);
        else
          hw::wgmma_m64n256k16_bf16_ss_tb(o, dp, dv, true);
      }
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(o);
      if constexpr (kCross) {
        // The warp's reads of the stage are done (each lane's wgmma wait): one arrival per warp
        // on this CTA's barrier and on the peer's, whose producer writes rows into this tile.
        __syncwarp();
        if (lane == 0) {
          hw::mbar_arrive(&sm.empty[stage]);
          hw::mbar_arrive_cluster(hw::mapa(&sm.empty[stage], peer));
        }
      } else {
        hw::mbar_arrive(&sm.empty[stage]);
      }
    }

    // Epilogue: full row sums (4 lanes, then both halves), normalise, write.
    sum_rows(l0, l1, sm.row_sum, w, r0, r1, kBarSum);
    hw::named_barrier(kBarSum, kConsumerThreads);  // row_sum free for the next token
    write_out<To>(a, o, t, part, w, r0, r1, cq, g, l0, l1, m0, m1);
  }
  if constexpr (kCross) hw::cluster_sync();  // the peer's last arrivals on this CTA have landed
}

// ---- The seesaw kernel (FlashMLA's schedule of 2025-04, written here for osprey's paged and
// gathered caches): the two consumer warpgroups take the key blocks in pairs (a, b). WG0 owns the
// left half of O (columns 0–255), WG1 the right half (256–511); both hold the running max m in
// shared memory (sM). For a pair:
//   WG0: S_a = Q·K_aᵀ (64 × 64, m64n64k16);  m ← max(m, rowmax S_a), sc0 = e^(m_old − m);
//        P_a = e^(S_a − m); O_L = O_L·sc0 + P_a·V_aL                   (P_a from registers)
//   WG1: S_b = Q·K_bᵀ;  m ← max(m, rowmax S_b), sc1 = e^(m_old − m) (after WG0's update);
//        P_b = e^(S_b − m); O_R = O_R·sc0·sc1 + P_b·V_bR                (P_b from registers)
//   WG0: P_a ← P_a·sc1 to shared memory;  O_L = O_L·sc1 + P_b·V_bL       (P_b from shared memory)
//   WG1: O_R += P_a·V_aR                                                 (P_a from shared memory)
// so the softmax of one warpgroup overlaps the other's MMAs. Row sums follow the same scales; the
// two partial sums add at the end. An odd run is padded with a tile of no attended key.
// Each key tile is released in two halves on their own mbarriers: L (chunks 0–3: S and V_L) and R
// (chunks 4–8: S, V_R and the rope), so the producer refills a's L half while the pair still runs;
// it lands chunk by chunk (a full barrier per 64 columns), and S starts on the first chunk.
// BF16 caches only: on the FP8 cache the lockstep kernel above is faster (measured 2026-12-01:
// this schedule with an FP8 producer of half tiles took 481 µs at B = 64 against 246 µs;
// bench/RESULTS.md).
// Q's rope chunk (columns 512–575) lives in registers (wgmma with A from registers): its shared
// memory holds P_b. Named barriers hand off sM / sc0, sc1, P_a and P_b between the two warpgroups.
// Producers (template kTma): the 128 producer threads' cp.async gathers (row by row through
// block_table or top-k; every call), or for dense decode on a cache whose block_size is a
// multiple of 64, one thread's TMA boxes (tma_producer; the default since it measured faster at
// every dense shape on the H200, e.g. B=64 ctx 5000 213.5 vs 254.0 µs, 2026-12-03,
// bench/RESULTS.md; OSPREY_MLA_DENSE_TMA=0 keeps cp.async): the second kernel parameter is then the
// cache's CUtensorMap ([n_blocks, block_size, 576] BF16, box [1, 64, 64], SW128, built and cached
// on the host by dense_kv_map), passed by value
// (__grid_constant__) so that a captured graph keeps it; the cp.async variant gets an empty one.
// The TMA variant splits the register pool 24 / 240 instead of 56 / 224 (no consumer spills).
namespace seesaw {
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // 128·56 + 256·224 = 384·168
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "setmaxnreg pool");
// The TMA producer (one thread issuing boxes) fits in the minimum, 24 registers, and the consumers
// take the rest of the pool, 240: ptxas spills none of theirs there (at 224 the consumers spill
// 20–44 bytes, at 232 8 bytes; ptxas -v, CUDA 13.0).
constexpr int kTmaProducerRegs = 24, kTmaConsumerRegs = 240;  // 128·24 + 256·240 = 384·168
static_assert(128 * kTmaProducerRegs + 256 * kTmaConsumerRegs <= 384 * 168, "setmaxnreg pool");
constexpr int kLChunks = 4;  // chunks 0–3: the L half of a tile (V_L); 4–8 the R half
// Named barriers, 256 threads (one warpgroup arrives, the other waits), one use per pair each.
constexpr int kBarQ = 1, kBarScale0 = 2, kBarScale1 = 3, kBarP0 = 4, kBarP1 = 5, kBarSum = 6;

struct Smem {                 // every tile 1024-aligned
  uint8_t q[kTileBytes];      // [64 heads × 512] BF16 SW128 (chunks 0–7); chunk 8 = P_b
  uint8_t kv[2][kTileBytes];  // [64 keys × 576] BF16 SW128
  uint8_t p0[kChunkBytes];    // P_a [64 heads × 64 keys] BF16 SW128
  float m[kHeadsPerCta];      // running row max (base 2, scaled)
  float scale0[kHeadsPerCta], scale1[kHeadsPerCta];
  float row_sum[2][kHeadsPerCta];  // [warpgroup][head]
  uint8_t valid[2][kBlockN];       // key r of the tile is attended
  uint64_t full[2][kChunks];       // per 64-column chunk: S starts on the first to land
  uint64_t empty_l[2], empty_r[2];
};
constexpr size_t kSmemBytes = sizeof(Smem) + 1024;
static_assert(kSmemBytes <= 232448, "shared memory over the sm_90 per-block limit");

// The producer's share of one half of a tile (BF16 cache), for row r of the tile (thread
// pt = 2·r + hh): after the half's empty barrier (waited for by the caller), L = chunks 0–3 or
// R = chunks 4–8 (latent 256–511 and the rope), chunk by chunk: 4 cp.async of 8 BF16 a thread, then
// an arrival on the chunk's full barrier when they land (noinc: the producer goes on at once).
// row < 0: zeros (the consumers mask the row through `valid`).
template <bool kRight>
__device__ __forceinline__ void load_half(uint8_t* tile, const Params& a, int r, int hh,
                                          int64_t row, uint64_t* full) {
  const bool ok = row >= 0;
  uint8_t* dst_row = tile + r * 128;
  const uint32_t sw = uint32_t(r & 7);
  const uint8_t* src = a.cache + (ok ? row : 0) * a.token_bytes;
  constexpr int c0 = kRight ? kLChunks : 0, c1 = kRight ? kChunks : kLChunks;
#pragma unroll
  for (int c = c0; c < c1; ++c) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int uu = 4 * hh + k;
      hw::cp_async_16(dst_row + c * kChunkBytes + ((uint32_t(uu) ^ sw) << 4),
                      src + (8 * c + uu) * 16, ok ? 16u : 0u);
    }
    hw::cp_async_arrive_noinc(&full[c]);
  }
}

// S = Q · Kᵀ over one tile, chunk by chunk as each lands (its full barrier, phase ph): chunks 0–7
// with Q from shared memory, chunk 8 (the rope) with Q from the registers rq. kRightFirst takes
// the R half (chunks 4–8) before the L half (0–3): the prefill variant's WG1, whose tile b gets
// its R half first (see pipelined_producer). kRopeSmem: Q's rope chunk from shared memory too
// (the prefill variant, whose Q tile holds all 9 chunks).
// kClusterWait: the chunks' bytes come partly from a peer CTA (kFp8Cross): acquire at cluster
// scope.
template <bool kRightFirst = false, bool kRopeSmem = false, bool kClusterWait = false>
__device__ __forceinline__ void qk_tile(float (&s)[32], const uint8_t* q, const uint8_t* kv,
                                        const uint32_t (&rq)[4][4], uint64_t* full, uint32_t ph) {
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = kRightFirst ? (j + kLChunks) % kChunks : j;
    if constexpr (kClusterWait)
      hw::mbar_wait_cluster(&full[c], ph);
    else
      hw::mbar_wait(&full[c], ph);
    hw::fence_proxy_async();  // the chunk's cp.async bytes (generic proxy), read by wgmma next
    if (j == 0) hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t db = hw::sw128_desc(kv + c * kChunkBytes + kk * 32, 16, 1024);
      if (kRopeSmem || c < kChunks - 1)
        hw::wgmma_m64n64k16_bf16_ss(s, hw::sw128_desc(q + c * kChunkBytes + kk * 32, 16, 1024), db,
                                    j > 0 || kk > 0);
      else
        hw::wgmma_m64n64k16_bf16_rs(s, rq[kk], db, j > 0 || kk > 0);
    }
  }
}

// O (+)= P · V over one tile's 64 keys, V = the 256 columns from chunk 4·half; P from registers.
__device__ __forceinline__ void pv_regs(float (&o)[128], const uint32_t (&p)[4][4],
                                        const uint8_t* kv, int half) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
    hw::wgmma_m64n256k16_bf16_rs_tb(
        o, p[kk], hw::sw128_desc(kv + 4 * half * kChunkBytes + kk * 16 * 128, kChunkBytes, 1024),
        true);
}
// The same with P in shared memory (SW128 [64 × 64]).
__device__ __forceinline__ void pv_smem(float (&o)[128], const uint8_t* p, const uint8_t* kv,
                                        int half) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
    hw::wgmma_m64n256k16_bf16_ss_tb(
        o, hw::sw128_desc(p + kk * 32, 16, 1024),
        hw::sw128_desc(kv + 4 * half * kChunkBytes + kk * 16 * 128, kChunkBytes, 1024), true);
}

// S (+)= Q · Kᵀ over chunks [kC0, kC1) of one tile, each after its full barrier (phase ph), Q
// whole in shared memory (the prefill variant's tile): the overlapped variant issues a tile's two
// halves as two wgmma groups (kC0 = 0 starts the accumulation).
template <int kC0, int kC1>
__device__ __forceinline__ void qk_chunks(float (&s)[32], const uint8_t* q, const uint8_t* kv,
                                          uint64_t* full, uint32_t ph) {
#pragma unroll
  for (int c = kC0; c < kC1; ++c) {
    hw::mbar_wait(&full[c], ph);
    hw::fence_proxy_async();  // the chunk's cp.async bytes (generic proxy), read by wgmma next
    if (c == kC0) hw::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      hw::wgmma_m64n64k16_bf16_ss(s, hw::sw128_desc(q + c * kChunkBytes + kk * 32, 16, 1024),
                                  hw::sw128_desc(kv + c * kChunkBytes + kk * 32, 16, 1024),
                                  c > 0 || kk > 0);
  }
}

// P (F32 accumulator order) → the BF16 A fragments of the 4 K steps.
__device__ __forceinline__ void pack_p(const float (&s)[32], uint32_t (&p)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) p[kk][j] = bf16x2(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
}
// P_a · sc (sc per row) → shared memory from its BF16 fragments (pk[kk][j]: row r0 or r1 = r0 + 8
// for even / odd j, columns 8·(2·kk + j/2) + cq, + 1): the F32 P is not kept (registers).
__device__ __forceinline__ void store_p_scaled(uint8_t* dst, const uint32_t (&pk)[4][4], float sc0,
                                               float sc1, int r0, int cq) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = (j & 1) ? r0 + 8 : r0, n8 = 2 * kk + (j >> 1);
      const float sc = (j & 1) ? sc1 : sc0;
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pk[kk][j]));
      *reinterpret_cast<uint32_t*>(dst + r * 128 + (((uint32_t(n8) ^ uint32_t(r)) & 7u) << 4) +
                                   cq * 2) = bf16x2(v.x * sc, v.y * sc);
    }
}
// P → shared memory from its BF16 fragments (as store_p_scaled, unscaled): the overlapped
// variant's WG1 stores P_b while P_b·V_bR reads the same fragments (read-only: legal in flight),
// so the F32 S need not live across that MMA.
__device__ __forceinline__ void store_p_packed(uint8_t* dst, const uint32_t (&pk)[4][4], int r0,
                                               int cq) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = (j & 1) ? r0 + 8 : r0, n8 = 2 * kk + (j >> 1);
      *reinterpret_cast<uint32_t*>(dst + r * 128 + (((uint32_t(n8) ^ uint32_t(r)) & 7u) << 4) +
                                   cq * 2) = pk[kk][j];
    }
}
// P → shared memory, SW128 [64 heads × 64 keys]; rows r0, r1 = r0 + 8, columns 8·n8 + cq.
__device__ __forceinline__ void store_p(uint8_t* dst, const float (&s)[32], int r0, int cq) {
  const int r1 = r0 + 8;
#pragma unroll
  for (int n8 = 0; n8 < 8; ++n8) {
    *reinterpret_cast<uint32_t*>(dst + r0 * 128 + (((uint32_t(n8) ^ uint32_t(r0)) & 7u) << 4) +
                                 cq * 2) = bf16x2(s[4 * n8], s[4 * n8 + 1]);
    *reinterpret_cast<uint32_t*>(dst + r1 * 128 + (((uint32_t(n8) ^ uint32_t(r1)) & 7u) << 4) +
                                 cq * 2) = bf16x2(s[4 * n8 + 2], s[4 * n8 + 3]);
  }
}

// P = 2^(S − ref) in place; returns this thread's part of the row sums.
__device__ __forceinline__ void exp_rows(float (&s)[32], float ref0, float ref1, float& s0,
                                         float& s1) {
  s0 = 0.0f;
  s1 = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    s[i] = exp2f(s[i] - ((i & 2) ? ref1 : ref0));
    if (i & 2)
      s1 += s[i];
    else
      s0 += s[i];
  }
}
__device__ __forceinline__ void scale_o(float (&o)[128], float f0, float f1) {
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] *= (i & 2) ? f1 : f0;
}

// S = Q · Kᵀ over the tile in `stage` (phase ph), chunk by chunk as they land, then masked,
// scaled to base 2, and the row maxima of rows r0 / r0 + 8 (mask_max).
template <bool kRightFirst = false, bool kRopeSmem = false, bool kClusterWait = false>
__device__ __forceinline__ void score_tile(float (&s)[32], Smem& sm, int stage, uint32_t ph,
                                           const uint32_t (&rq)[4][4], float scale_log2, int cq,
                                           float& mx0, float& mx1) {
  qk_tile<kRightFirst, kRopeSmem, kClusterWait>(s, sm.q, sm.kv[stage], rq, sm.full[stage], ph);
  hw::wgmma_commit();
  hw::wgmma_wait<0>();
  hw::fence_regs(s);
  mask_max(s, sm.valid[stage], scale_log2, cq, mx0, mx1);
}

// The running max of rows r0, r0 + 8 raised by this tile's maxima: m_new = max(m, mx) written
// back, with the factor 2^(m_old − m_new) for the old terms into `scale` (the quad's first lane
// writes); ref = m_new, or 0 where it is −∞ (no key yet: then the factors and P are 0, not NaN).
__device__ __forceinline__ void raise_max(Smem& sm, float* scale, int r0, float mx0, float mx1,
                                          float& ref0, float& ref1, float& f0, float& f1) {
  const int r1 = r0 + 8;
  const float old0 = sm.m[r0], old1 = sm.m[r1];
  const float n0 = fmaxf(old0, mx0), n1 = fmaxf(old1, mx1);
  ref0 = n0 == -INFINITY ? 0.0f : n0;
  ref1 = n1 == -INFINITY ? 0.0f : n1;
  f0 = exp2f(old0 - ref0);
  f1 = exp2f(old1 - ref1);
  __syncwarp();  // every lane has read m before the quad's first lane writes it
  if ((threadIdx.x & 3) == 0) {
    sm.m[r0] = n0;
    sm.m[r1] = n1;
    scale[r0] = f0;
    scale[r1] = f1;
  }
}

// Q's rope chunk (columns 512–575) of heads g·64 + r0 and + 8 as the BF16 A fragments of its 4 K
// steps (its shared memory holds P_b).
template <typename Tq>
__device__ __forceinline__ void load_q_rope(const Params& a, int t, int g, int r0, int cq,
                                            uint32_t (&rq)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = g * kHeadsPerCta + r0 + 8 * (j & 1), col = kLat + 16 * kk + 8 * (j >> 1) + cq;
      uint32_t v = 0u;
      if (h < a.H) {
        const Tq* src = static_cast<const Tq*>(a.q) + (int64_t(t) * a.H + h) * kWidth + col;
        if constexpr (sizeof(Tq) == 4) {
          const float2 x = __ldg(reinterpret_cast<const float2*>(src));
          v = bf16x2(x.x, x.y);
        } else {
          v = __ldg(reinterpret_cast<const unsigned int*>(src));
        }
      }
      rq[kk][j] = v;
    }
}

// The dense TMA producer (kTma): one thread loads each tile as 9 boxes of [64 rows × 64 columns]
// through kv_map, the cache viewed as [n_blocks, block_size, 576] BF16 (box {64, 64, 1}, SW128).
// Tile b of token t holds entries 64·b .. 64·b + 63 of its sequence: block_size % 64 == 0, so
// they are 64 consecutive rows of one cache block, from row off = 64·b % block_size, of which
// nv = min(64, L − 64·b) are attended. The box starts at row off + nv − 64: the attended rows land
// at the bottom (tile rows 64 − nv .. 63, flagged valid) and the rows above are either
// out-of-range rows before the block (row < 0: zeros, from the TMA unit) or earlier rows of the
// same block (positions the sequence wrote: finite), flagged invalid. Rows past the context are
// never read, so a cache slot never written (an uninitialised allocation may hold NaN bit
// patterns, and 0 · NaN would poison P · V) cannot reach the MMAs; the softmax does not depend on
// the order of the keys. The padding tile of an odd run reloads the run's last tile with every key
// flagged invalid (finite data, P = 0). Each box arms its chunk's full barrier with
// kChunkBytes (mbar_arrive_expect_tx, count 1), so S still starts on the first chunk to land.
__device__ __forceinline__ void tma_producer(Smem& sm, const Params& a, const CUtensorMap* kv_map,
                                             int t_first, int32_t w0, int32_t w1) {
  hw::tma_prefetch_map(kv_map);
  int it = 0;
  for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
    const TokenRun run = token_run<false>(a, t, w0, w1);
    const int b_end = run.b0 + ((run.b1 - run.b0 + 1) & ~1);  // whole pairs, as the consumers
    const int32_t* bt = a.block_table + int64_t(run.seq) * a.max_blocks;
    for (int b = run.b0; b < b_end; ++b, ++it) {
      const int stage = it & 1;
      const uint32_t ph = uint32_t(it >> 1) & 1u;
      const int bl = b < run.b1 ? b : run.b1 - 1;  // the tile loaded (padding: the last one again)
      const int j0 = bl * kBlockN;                 // its first entry
      const int nv = min(kBlockN, run.L - j0);     // attended rows loaded
      const int nv_flag = b < run.b1 ? nv : 0;
      const int32_t z = bt[j0 / a.block_size];
      const int32_t y = j0 % a.block_size + nv - kBlockN;
      hw::mbar_wait(&sm.empty_l[stage], ph ^ 1u);
      // valid[r] = r ≥ 64 − nv_flag, 16 words of 4 flags (released by the arrive below).
      uint32_t* flags = reinterpret_cast<uint32_t*>(sm.valid[stage]);
#pragma unroll
      for (int k = 0; k < kBlockN / 4; ++k) {
        uint32_t wd = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) wd |= uint32_t(4 * k + j >= kBlockN - nv_flag) << (8 * j);
        flags[k] = wd;
      }
      for (int c = 0; c < kChunks; ++c) {
        if (c == kLChunks) hw::mbar_wait(&sm.empty_r[stage], ph ^ 1u);
        hw::mbar_arrive_expect_tx(&sm.full[stage][c], kChunkBytes);
        hw::tma_load_3d(sm.kv[stage] + c * kChunkBytes, kv_map, &sm.full[stage][c], 64 * c, y, z);
      }
    }
  }
}

// ---- The prefill variant (kPipelined; OSPREY_MLA_PREFILL=pipelined, BF16 sparse calls with more
// query tokens than sequences): the same math, consumers and barriers; four changes, after a
// reading of FlashMLA's SM90 sparse prefill schedule (docs/20250422-new-kernel-deep-dive.md,
// csrc/sm90/prefill/sparse/phase1.cuh):
//  1. Fill order = release order. The halves of a pair (a in stage 0, b in stage 1) are released
//     at a.L (WG0, after P_a·V_aL, ~40% into the pair), b.R (WG1, after P_b·V_bR, ~70%), a.R and
//     b.L (the pair's end). The default producer fills a.L, a.R, b.L, b.R, so after a.L it waits
//     for the pair's end and all of b is gathered after it: WG1's next S_b waits for a whole
//     tile. Here the producer fills a.L, b.R, a.R, b.L and WG1 scores b R half first
//     (qk_tile<true>), so at a pair boundary only a.R and b.L are still in flight and each
//     warpgroup starts its next S on a half that landed during the previous pair.
//  2. Coalesced gathers. Thread pt = 8·grp + u copies 16-byte unit u of each 128-byte chunk of
//     rows grp + 16·k (k = 0..3): a warp's cp.async covers 4 whole row chunks (16 full 32-byte
//     sectors) instead of 16 rows' half sectors (the default's thread pair per row, 4 consecutive
//     units each), and each copy prefetches its 256-byte L2 block (cp_async_16_pf256). A pair's
//     64·2 row lookups are one per producer thread (pair_row), before the first wait.
//  3. Q staged with every load of a batch in flight (stage_q_batched): stage_q issues one global
//     load per st.shared (an asm with a memory clobber, which no load crosses): 16 round trips a
//     token; here 2 (BF16 q) or 3 (F32 q).
//  4. Q's rope chunk stays in shared memory (the Q tile holds all 9 chunks; chunk 8 by wgmma ss
//     like the others) and P_a lives in tile a's rope chunk (stage 0, chunk 8: only WG0's S_a reads
//     it, and the producer refills it only after WG1 has released a's R half, after P_a·V_aR),
//     P_b in p0. The 16 registers of rq go, so the consumers fit 216 registers with no spill and
//     the producer gets 72.
//  5. The next token's Q and top-k row are prefetched into L2 (one bulk prefetch each, by the
//     producer as it starts a token), so the token boundary's Q staging and first lookups hit L2.
// Split partials, the padding tile of an odd run, the epilogue: as in the default kernel.
// Registers: the variant's consumers hold no Q rope (16 fewer than the default's) and fit in 216
// without spilling; its producer, 8 lookups and 4 rows a half, spills 12 bytes at 56 and none at
// 72 (ptxas -v, CUDA 13.0): 128·72 + 256·216 = 384·168.
constexpr int kPipeProducerRegs = 72, kPipeConsumerRegs = 216;
static_assert(128 * kPipeProducerRegs + 256 * kPipeConsumerRegs <= 384 * 168, "setmaxnreg pool");
// The overlapped order (kOverlap): the same split; see the kernel's comment for its spills.
constexpr int kOverlapProducerRegs = 72, kOverlapConsumerRegs = 216;
static_assert(128 * kOverlapProducerRegs + 256 * kOverlapConsumerRegs <= 384 * 168,
              "setmaxnreg pool");
constexpr int kGatherLanes = 8;  // threads per 128-byte row chunk: one 16-byte unit each
constexpr int kGatherGroups = kProducerThreads / kGatherLanes;  // 16 rows per copy instruction set
constexpr int kRowsPerThread = kBlockN / kGatherGroups;         // 4: rows grp + 16·k
static_assert(kGatherLanes * 16 == 128 && kRowsPerThread * kGatherGroups == kBlockN &&
                  2 * kRowsPerThread == kGatherLanes,
              "gather map: a group's 8 lanes look up the 2 × 4 rows of a pair");

// The rows of a pair (tiles b, b + 1; b + 1 ≥ the run's end: the padding tile, no row) are looked
// up once, one per lane: lane u of group grp finds the cache row of row grp + 16·(u & 3) of tile
// b + (u >> 2) (its top-k entry, then the block table), or −1 for an entry not attended. A half's
// gather takes the group's 4 rows of its tile from those lanes by shuffles: only this one value
// lives across the pair (8 rows kept in registers made the 56-register producer spill).
// 32-bit arithmetic: positions are I32, and a cache of 2^31 rows would be 2.4 TB.
template <bool kSparse>
__device__ __forceinline__ int32_t pair_row(const Params& a, int t, const TokenRun& run, int b,
                                            int grp, int u) {
  const int mb = b + (u >> 2), i = mb * kBlockN + grp + kGatherGroups * (u & 3);
  int32_t row = -1;
  if (mb < run.b1 && i < run.L) {
    const int32_t j = kSparse ? a.topk[int64_t(t) * a.topk_k + i] : int32_t(i);
    if (j >= 0 && j <= run.p) {
      const uint32_t bs = uint32_t(a.block_size), uj = uint32_t(j);
      row =
          a.block_table[int64_t(run.seq) * a.max_blocks + uj / bs] * int32_t(bs) + int32_t(uj % bs);
    }
  }
  return row;
}
// Chunks [kC0, kC1) of tile kB (0 = a, 1 = b) of the pair: per chunk 4 copies (one per row
// grp + 16·k) of this thread's unit u, then an arrival on the chunk's full barrier when they land
// (noinc, as load_half). kValid: first the tile's valid flags (the group's lane 0 writes its 4
// rows'), before its first copies; the consumers read them after every chunk's full barrier.
// An entry not attended reads 0 bytes (from the cache's first row) and zeroes its 16 bytes.
template <int kB, int kC0, int kC1, bool kValid>
__device__ __forceinline__ void gather_chunks(uint8_t* tile, uint8_t* valid, const Params& a,
                                              int32_t mine, int grp, int u, int lane,
                                              uint64_t* full) {
  const int src_lane = (lane & ~(kGatherLanes - 1)) + kB * kRowsPerThread;
  int32_t row[kRowsPerThread];
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) row[k] = __shfl_sync(0xffffffffu, mine, src_lane + k);
  if (kValid && u == 0) {
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) valid[grp + kGatherGroups * k] = row[k] >= 0 ? 1 : 0;
  }
  const uint32_t sw = uint32_t(grp & 7);  // (grp + 16·k) & 7: the SW128 row phase of every row
#pragma unroll
  for (int c = kC0; c < kC1; ++c) {
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) {
      const int r = grp + kGatherGroups * k;
      const bool ok = row[k] >= 0;
      const uint8_t* src = a.cache + int64_t(ok ? row[k] : 0) * a.token_bytes + c * 128 + u * 16;
      hw::cp_async_16_pf256(tile + c * kChunkBytes + r * 128 + ((uint32_t(u) ^ sw) << 4), src,
                            ok ? 16u : 0u);
    }
    hw::cp_async_arrive_noinc(&full[c]);
  }
}

// The next token's Q rows of this CTA's heads (heads 64·g .. , contiguous: [nh, 576] of Tq) and
// its top-k row into L2, by one thread as the producer starts token t: the consumers stage that
// Q about a token later, and the producer's first lookups of t + 1 read that row. Skipped where
// an address or size is not a multiple of 16 bytes (the bulk prefetch's requirement).
template <typename Tq, bool kSparse>
__device__ __forceinline__ void prefetch_next_token(const Params& a, int t, int g) {
  const int tn = t + 1;
  if (tn >= a.n_tokens) return;
  const int nh = min(kHeadsPerCta, a.H - g * kHeadsPerCta);
  const uint8_t* q = static_cast<const uint8_t*>(a.q) +
                     (int64_t(tn) * a.H + g * kHeadsPerCta) * kWidth * int64_t(sizeof(Tq));
  if ((reinterpret_cast<uintptr_t>(q) & 15u) == 0)  // rows are 1152 or 2304 bytes
    hw::bulk_prefetch_l2(q, uint32_t(nh * kWidth * int(sizeof(Tq))));
  if constexpr (kSparse) {
    const int32_t* row = a.topk + int64_t(tn) * a.topk_k;
    if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0 && (a.topk_k & 3) == 0)
      hw::bulk_prefetch_l2(row, uint32_t(a.topk_k * 4));
  }
}

// The variant's producer (128 threads): pair after pair (tile a = 2·i in stage 0, b = 2·i + 1 in
// stage 1; an odd run's last b is the padding tile, no row attended), halves in release order;
// at each token, thread 0 prefetches the next token's Q and top-k row (prefetch_next_token).
template <typename Tq, bool kSparse>
__device__ __forceinline__ void pipelined_producer(Smem& sm, const Params& a, int pt, int t_first,
                                                   int32_t w0, int32_t w1, int g) {
  const int grp = pt / kGatherLanes, u = pt % kGatherLanes, lane = pt % 32;
  uint32_t pair = 0;
  for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
    const TokenRun run = token_run<kSparse>(a, t, w0, w1);
    if (pt == 0 && a.cum[t + 1] < w1) prefetch_next_token<Tq, kSparse>(a, t, g);
    for (int b = run.b0; b < run.b1; b += 2, ++pair) {
      const uint32_t ph = (pair & 1u) ^ 1u;  // the empty barriers' phase to wait for
      const int32_t mine = pair_row<kSparse>(a, t, run, b, grp, u);
      hw::mbar_wait(&sm.empty_l[0], ph);  // a.L: WG0 is past P_a·V_aL of the previous pair
      gather_chunks<0, 0, kLChunks, true>(sm.kv[0], sm.valid[0], a, mine, grp, u, lane, sm.full[0]);
      hw::mbar_wait(&sm.empty_r[1], ph);  // b.R: WG1 is past P_b·V_bR
      gather_chunks<1, kLChunks, kChunks, true>(sm.kv[1], sm.valid[1], a, mine, grp, u, lane,
                                                sm.full[1]);
      hw::mbar_wait(&sm.empty_r[0], ph);  // a.R: WG1's last MMA of the pair
      gather_chunks<0, kLChunks, kChunks, false>(sm.kv[0], nullptr, a, mine, grp, u, lane,
                                                 sm.full[0]);
      hw::mbar_wait(&sm.empty_l[1], ph);  // b.L: WG0's last MMA of the pair
      gather_chunks<1, 0, kLChunks, false>(sm.kv[1], nullptr, a, mine, grp, u, lane, sm.full[1]);
    }
  }
}

// ---- The prefill variant on the FP8 cache with the crossover (kFp8Cross; the FP8 kernel
// setting 'pipelined'): the variant's consumers unchanged, the two head groups of a part in a
// cluster of two CTAs, and a producer that dequantises. Per half of a tile (L: chunks 0–3, R:
// chunks 4–7 of the latent, plus the rope chunk 8), CTA rank c dequantises rows 32·c .. 32·c + 31
// only: producer thread pt takes row 32·c + pt / 4 and chunk (4·half + pt % 4), 64 e4m3 (4 loads
// of 16, issued before the half's release is waited for) × their tile's scale, and writes the 8
// BF16 units to its own tile and by st.async to the peer's. Each latent chunk's full barrier thus
// counts the 128 local producer threads (each arrives on every chunk of the half once its stores
// are fenced) plus 4096 bytes from the peer (armed by local thread 0 after the release: a peer's
// bytes may land first, the phase cannot complete before the local arrivals). The rope chunk comes
// by cp.async from this CTA's own gathers of all 64 rows (thread pt: row pt / 2, 4 units), with
// the noinc arrivals as in the BF16 variant. The halves are filled in the variant's release order
// (a.L, b.R, a.R, b.L); the empty barriers count the local warpgroup's 128 threads and the peer
// warpgroup's 4 warps (kCrossEmptyRemote), so neither producer overwrites a half either CTA still
// reads. Valid flags: each CTA's own, at the first fill of each tile. Registers: the variant's
// 72 / 216 split; ptxas -v (CUDA 13.0) spills 68–76 bytes in this kernel (none with an empty
// producer but 4 bytes: the spills are the producer's, whose dequantising stores peak at 72).
constexpr int kCrossEmptyRemote = 4;                     // the peer warpgroup's warps
constexpr uint32_t kCrossChunkBytes = kCrossRows * 128;  // a chunk's rows from the peer
// Latent chunk `chunk` (0–7) of row `row`: 4 loads of 16 e4m3 (zero for a row not attended).
__device__ __forceinline__ void load_fp8_chunk(uint4 (&v)[4], const Params& a, int chunk,
                                               int64_t row) {
  const bool ok = row >= 0;
  const uint8_t* src = a.cache + (ok ? row : 0) * a.token_bytes + chunk * 64;
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = ok ? hw::ld_nc_16(src + k * 16) : make_uint4(0u, 0u, 0u, 0u);
}
// Those 64 values × scale into chunk `chunk` of row r of this CTA's tile and the peer's.
__device__ __forceinline__ void store_fp8_chunk_cross(uint8_t* tile, uint32_t peer_tile,
                                                      uint32_t peer_bar, const uint4 (&v)[4], int r,
                                                      int chunk, float scale) {
  const uint32_t sw = uint32_t(r & 7);
  const uint32_t base = uint32_t(chunk * kChunkBytes + r * 128);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint2 a0 = dequant4(v[k].x, scale), a1 = dequant4(v[k].y, scale);
    const uint2 b0 = dequant4(v[k].z, scale), b1 = dequant4(v[k].w, scale);
    const uint32_t off0 = base + ((uint32_t(2 * k) ^ sw) << 4);
    const uint32_t off1 = base + ((uint32_t(2 * k + 1) ^ sw) << 4);
    const uint4 lo = make_uint4(a0.x, a0.y, a1.x, a1.y), hi = make_uint4(b0.x, b0.y, b1.x, b1.y);
    hw::st_shared_16(tile + off0, lo);
    hw::st_shared_16(tile + off1, hi);
    hw::st_async_16(peer_tile + off0, lo, peer_bar);
    hw::st_async_16(peer_tile + off1, hi, peer_bar);
  }
}
// One half (kRight: R) of the tile in `stage`: waits for its release (both CTAs' consumers), arms
// the latent chunks' barriers with the peer's bytes, writes the valid flags (kValid: the tile's
// first fill) and the rope (R), dequantises this thread's chunk, then arrives on the latent chunks.
template <bool kRight, bool kValid>
// (The thread's indices are recomputed from threadIdx where used: the 72-register producer.)
__device__ __forceinline__ void fill_half_fp8_cross(Smem& sm, const Params& a, int stage,
                                                    uint32_t ph, int32_t row_r, int32_t row_d) {
  constexpr int c0 = kRight ? kLChunks : 0;
  const int pt = int(threadIdx.x) - kConsumerThreads;
  const int chunk = c0 + (pt & 3);
  const float scale = fetch_fp8_scale(a, chunk / 2, row_d);
  uint4 v[4];
  load_fp8_chunk(v, a, chunk, row_d);
  uint64_t* full = sm.full[stage];
  hw::mbar_wait_cluster(kRight ? &sm.empty_r[stage] : &sm.empty_l[stage], ph);
  if (pt == 0) {
#pragma unroll
    for (int c = c0; c < c0 + kLChunks; ++c) hw::mbar_expect_tx(&full[c], kCrossChunkBytes);
  }
  const int r = pt >> 1, hh = pt & 1;  // the rope / valid row of this thread
  if (kValid && hh == 0) sm.valid[stage][r] = row_r >= 0 ? 1 : 0;
  if constexpr (kRight) {
    copy_fp8_rope(sm.kv[stage], a, r, hh, row_r);
    hw::cp_async_arrive_noinc(&full[kChunks - 1]);
  }
  const uint32_t rank = hw::cluster_ctarank(), peer = rank ^ 1u;
  const int rd = kCrossRows * int(rank) + (pt >> 2);
  store_fp8_chunk_cross(sm.kv[stage], hw::mapa(sm.kv[stage], peer), hw::mapa(&full[chunk], peer), v,
                        rd, chunk, scale);
  hw::fence_proxy_async();
#pragma unroll
  for (int c = c0; c < c0 + kLChunks; ++c) hw::mbar_arrive(&full[c]);
}
// The producer: pair after pair (tile a in stage 0, b in stage 1; an odd run's last b is the
// padding tile, no row attended), halves in release order. Rows: r_* (rope and valid: row pt / 2)
// and d_* (dequantised: row 32·rank + pt / 4) of tiles a and b, looked up before the first wait.
template <bool kSparse>
__device__ __forceinline__ void fp8_cross_producer(Smem& sm, const Params& a, int t_first,
                                                   int32_t w0, int32_t w1) {
  const int pt = int(threadIdx.x) - kConsumerThreads;
  const int rr = pt >> 1, rd = kCrossRows * int(hw::cluster_ctarank()) + (pt >> 2);
  uint32_t pair = 0;
  for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
    const TokenRun run = token_run<kSparse>(a, t, w0, w1);
    for (int b = run.b0; b < run.b1; b += 2, ++pair) {
      const uint32_t ph = (pair & 1u) ^ 1u;  // the empty barriers' phase to wait for
      // 32-bit rows (a cache of 2^31 rows would be 1.4 TB): 4 registers, not 8, in a 72-register
      // producer.
      auto row_of = [&](int tile, int i) -> int32_t {
        return tile < run.b1
                   ? int32_t(attended_row<kSparse>(a, t, run.seq, run.p, run.L, tile * kBlockN + i))
                   : -1;
      };
      const int32_t ra = row_of(b, rr), da = row_of(b, rd);
      const int32_t rb = row_of(b + 1, rr), db = row_of(b + 1, rd);
      fill_half_fp8_cross<false, true>(sm, a, 0, ph, ra, da);   // a.L
      fill_half_fp8_cross<true, true>(sm, a, 1, ph, rb, db);    // b.R
      fill_half_fp8_cross<true, false>(sm, a, 0, ph, ra, da);   // a.R
      fill_half_fp8_cross<false, false>(sm, a, 1, ph, rb, db);  // b.L
    }
  }
}

// Q of token t, heads 64·g .. 64·g + 63, all 576 columns as BF16 into the SW128 tile q (rows past
// H zero), by the 256 consumer threads: as stage_q<Tq, 72>, with the loads of kBatch units in
// registers before their stores (BF16 q: 9 units = 36 registers, 2 round trips; F32: 6 units =
// 48 registers, 3 round trips).
template <typename Tq>
__device__ __forceinline__ void stage_q_batched(uint8_t* q, const Params& a, int t, int g) {
  constexpr int kUnits = kWidth / 8;                                    // 16-byte BF16 units
  constexpr int kPerThread = kHeadsPerCta * kUnits / kConsumerThreads;  // 18
  constexpr int kBatch = sizeof(Tq) == 4 ? kPerThread / 3 : kPerThread / 2;
  static_assert(kPerThread % kBatch == 0, "whole batches");
#pragma unroll
  for (int b0 = 0; b0 < kPerThread; b0 += kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int un = int(threadIdx.x) + (b0 + i) * kConsumerThreads;
      const int hr = un / kUnits, cu = un % kUnits, h = g * kHeadsPerCta + hr;
      v[i] = make_uint4(0u, 0u, 0u, 0u);
      if (h < a.H) {
        const Tq* src = static_cast<const Tq*>(a.q) + (int64_t(t) * a.H + h) * kWidth + cu * 8;
        if constexpr (sizeof(Tq) == 4) {
          const float4 x = __ldg(reinterpret_cast<const float4*>(src));
          const float4 y = __ldg(reinterpret_cast<const float4*>(src) + 1);
          v[i] = make_uint4(bf16x2(x.x, x.y), bf16x2(x.z, x.w), bf16x2(y.x, y.y), bf16x2(y.z, y.w));
        } else {
          v[i] = __ldg(reinterpret_cast<const uint4*>(src));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int un = int(threadIdx.x) + (b0 + i) * kConsumerThreads;
      const int hr = un / kUnits, cu = un % kUnits;
      hw::st_shared_16(
          q + (cu >> 3) * kChunkBytes + hr * 128 + ((uint32_t((cu & 7) ^ (hr & 7))) << 4), v[i]);
    }
  }
}

// kPipelined: the prefill variant above (its producer, WG1's R-first S_b, stage_q_batched).
// kOverlap (with kPipelined; OSPREY_MLA_PREFILL=overlapped): the variant with FlashMLA's issue
// order in both consumers (its SM90 sparse prefill, phase1.cuh; no code taken):
//  - WG0 issues the next pair's S_a behind its P_b·V_bL, L half then R half as two wgmma groups,
//    and waits for P_b·V_bL (wgmma_wait<1>, then releases b's L half) while S_a's L half runs:
//    the tensor pipe has WG0's next S queued instead of draining between the pairs. S_a's
//    accumulator then lives across the pair boundary (32 registers more over P_b·V_bL).
//  - WG1 issues P_b·V_bR before it stores P_b for WG0, so its MMAs start 16 stores earlier.
// A token's first S_a is issued before its pair loop, once Q is staged. Registers as the variant's,
// 72 / 216: there ptxas spills 76 bytes (19 registers; 0 at 240 consumer registers, which the pool
// cannot give with a 72-register producer; 224 / 56 still spills 56 bytes), so the bench decides.
// kFp8Cross (with kPipelined): the FP8 cache through the crossover producer (fp8_cross_producer),
// launched in clusters of 1 × 2 CTAs; the consumers also release each half to the peer's producer
// (one arrival per warp on the peer's empty barrier) and wait for chunks at cluster scope; the
// cluster synchronises after the barriers are initialised and before any CTA exits.
template <typename Tq, typename To, bool kSparse, bool kTma, bool kPipelined = false,
          bool kOverlap = false, bool kFp8Cross = false>
__global__ void __launch_bounds__(kThreads, 1)
    mla_seesaw_sm90_kernel(const Params a, const __grid_constant__ CUtensorMap kv_map) {
  pdl_wait();
  pdl_trigger();
  static_assert(!(kSparse && kTma), "TMA tiles are 64 consecutive rows: dense decode only");
  static_assert(!(kTma && kPipelined), "the prefill variant gathers with cp.async");
  static_assert(kPipelined || !kOverlap, "the overlapped order is the prefill variant's");
  static_assert(!kFp8Cross || (kPipelined && !kOverlap), "the FP8 crossover: pipelined order");
  extern __shared__ uint8_t smem_raw[];
  Smem& sm = aligned_smem<Smem>(smem_raw);
  const int tid = threadIdx.x;
  const int part = blockIdx.x, g = blockIdx.y;
  int32_t w0, w1;
  if (!part_run(a, part, w0, w1)) return;  // the whole CTA: no barrier was used yet
  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      // cp.async: every producer thread arrives once its copies land; TMA: one armed arrival.
      for (int c = 0; c < kChunks; ++c) hw::mbar_init(&sm.full[s][c], kTma ? 1 : kProducerThreads);
      // One warpgroup releases each half (see below); kFp8Cross: and the peer's 4 warps.
      hw::mbar_init(&sm.empty_l[s], 128 + (kFp8Cross ? kCrossEmptyRemote : 0));
      hw::mbar_init(&sm.empty_r[s], 128 + (kFp8Cross ? kCrossEmptyRemote : 0));
    }
    hw::mbar_init_fence();
  }
  if constexpr (kFp8Cross)
    hw::cluster_sync();  // the peer's barriers are initialised before this CTA uses them
  else
    __syncthreads();
  const int t_first = seq_of_token(a.cum, a.n_tokens, w0);
  // The warpgroup index through a shuffle, so that the compiler knows it is warp-uniform and
  // keeps the wgmma of each warpgroup's path pipelined (no serialising arrive on a divergent path).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);

  if (wg == 2) {  // ---- producer warpgroup ----
    hw::regs_dealloc<kOverlap     ? kOverlapProducerRegs
                     : kPipelined ? kPipeProducerRegs
                     : kTma       ? kTmaProducerRegs
                                  : kProducerRegs>();
    const int pt = tid - kConsumerThreads, r = pt >> 1, hh = pt & 1;
    if constexpr (kTma) {
      if (pt == 0) tma_producer(sm, a, &kv_map, t_first, w0, w1);
      return;  // the other 127 threads have nothing to do; the CTA lives on with the consumers
    }
    if constexpr (kFp8Cross) {
      fp8_cross_producer<kSparse>(sm, a, t_first, w0, w1);
      hw::cp_async_wait_all();  // nothing of this thread's may land after it has exited
      hw::cluster_sync();       // both CTAs' consumers are done with this CTA's stores
      return;
    } else if constexpr (kPipelined) {
      pipelined_producer<Tq, kSparse>(sm, a, pt, t_first, w0, w1, g);
      hw::cp_async_wait_all();  // nothing of this thread's may land after it has exited
      return;
    }
    int it = 0;
    for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
      const TokenRun run = token_run<kSparse>(a, t, w0, w1);
      const int b0 = run.b0, b1 = run.b1, s = run.seq, L = run.L;
      const int64_t p = run.p;
      // An odd run gets one more tile with no attended key (zero-filled, all invalid), so the
      // consumers always take whole pairs: no wgmma on a data-dependent path.
      const int b_end = b0 + ((b1 - b0 + 1) & ~1);
      for (int b = b0; b < b_end; ++b, ++it) {
        const int stage = it & 1;
        const uint32_t ph = uint32_t(it >> 1) & 1u;
        const int64_t row = b < b1 ? attended_row<kSparse>(a, t, s, p, L, b * kBlockN + r) : -1;
        hw::mbar_wait(&sm.empty_l[stage], ph ^ 1u);
        if (hh == 0) sm.valid[stage][r] = row >= 0 ? 1 : 0;
        load_half<false>(sm.kv[stage], a, r, hh, row, sm.full[stage]);
        hw::mbar_wait(&sm.empty_r[stage], ph ^ 1u);
        load_half<true>(sm.kv[stage], a, r, hh, row, sm.full[stage]);
      }
    }
    hw::cp_async_wait_all();  // nothing of this thread's may land after it has exited
    return;
  }

  // ---- consumer warpgroups ----
  hw::regs_alloc<kOverlap     ? kOverlapConsumerRegs
                 : kPipelined ? kPipeConsumerRegs
                 : kTma       ? kTmaConsumerRegs
                              : kConsumerRegs>();
  const int w = wg, ct = tid & 127, lane = tid & 31;
  const int r0 = 16 * (ct >> 5) + (lane >> 2), r1 = r0 + 8;  // this thread's two head rows
  const int cq = 2 * (lane & 3);
  // A half's release: this thread's arrival; kFp8Cross: the warp's on the peer's barrier too (its
  // producer writes rows into this half), after every lane's reads (its wgmma wait).
  auto release = [&](uint64_t* bar) {
    hw::mbar_arrive(bar);
    if constexpr (kFp8Cross) {
      __syncwarp();
      if (lane == 0) hw::mbar_arrive_cluster(hw::mapa(bar, hw::cluster_ctarank() ^ 1u));
    }
  };
  // P_a and P_b [64 × 64] BF16 SW128. Default: P_a in p0, P_b in Q's rope chunk (Q's rope lives
  // in registers, rq). Prefill variant: Q whole in shared memory, P_a in tile a's rope chunk
  // (stage 0, chunk 8: read by WG0's S_a only, and not refilled before WG1 releases a's R half
  // after P_a·V_aR), P_b in p0.
  uint8_t* const pa = kPipelined ? sm.kv[0] + (kChunks - 1) * kChunkBytes : sm.p0;
  uint8_t* const pb = kPipelined ? sm.p0 : sm.q + (kChunks - 1) * kChunkBytes;
  int it = 0;
  for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
    const int32_t c0 = a.cum[t];
    const int b0 = max(w0, c0) - c0, b1 = min(w1, a.cum[t + 1]) - c0;

    if constexpr (kPipelined)  // Q [64 heads × 576] (default: chunks 0–7); m = −∞ below
      stage_q_batched<Tq>(sm.q, a, t, g);
    else
      stage_q<Tq, kLat / 8>(sm.q, a, t, g);
    uint32_t rq[4][4] = {};  // Q's rope chunk, kept in registers for the token (default kernel)
    if constexpr (!kPipelined) load_q_rope<Tq>(a, t, g, r0, cq, rq);
    if (tid < kHeadsPerCta) sm.m[tid] = -INFINITY;
    hw::fence_proxy_async();
    hw::named_barrier(kBarQ, kConsumerThreads);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float l0 = 0.0f, l1 = 0.0f;  // this thread's part of the row sums (relative to sM)
    const int n = b1 - b0;       // whole pairs: the producer pads an odd run with an empty tile
    float s[32];  // S of the pair's tile (kOverlap, WG0: issued in the previous pair)
    if (kOverlap && w == 0 && n > 0) {  // the token's first S_a (tile a of pair `it`)
      qk_chunks<0, kChunks>(s, sm.q, sm.kv[it & 1], sm.full[it & 1], uint32_t(it >> 1) & 1u);
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
    }
    for (int pr = 0; pr < n; pr += 2, it += 2) {
      const int sa = it & 1, sb = sa ^ 1;
      const uint32_t pha = uint32_t(it >> 1) & 1u, phb = uint32_t((it + 1) >> 1) & 1u;
      uint32_t pk[4][4];
      if (w == 0) {
        // S_a = Q · K_aᵀ, half by half as they land (kOverlap: S_a came before the loop or with
        // the previous pair's P_b·V_bL, and is complete here).
        float mx0, mx1;
        if constexpr (kOverlap) {
          hw::fence_regs(s);
          mask_max(s, sm.valid[sa], a.scale_log2, cq, mx0, mx1);
        } else {
          score_tile<false, kPipelined, kFp8Cross>(s, sm, sa, pha, rq, a.scale_log2, cq, mx0, mx1);
        }
        float ref0, ref1, sc0_0, sc0_1;
        raise_max(sm, sm.scale0, r0, mx0, mx1, ref0, ref1, sc0_0, sc0_1);
        hw::named_arrive(kBarScale0, kConsumerThreads);
        float e0, e1;
        exp_rows(s, ref0, ref1, e0, e1);
        l0 = l0 * sc0_0 + e0;
        l1 = l1 * sc0_1 + e1;
        scale_o(o, sc0_0, sc0_1);
        pack_p(s, pk);
        hw::fence_regs(o);
        hw::wgmma_fence();
        pv_regs(o, pk, sm.kv[sa], 0);  // O_L += P_a · V_aL
        hw::wgmma_commit();
        hw::wgmma_wait<0>();
        hw::fence_regs(o);
        release(&sm.empty_l[sa]);  // a's L half: S_a and V_aL were its last readers
        hw::named_barrier(kBarScale1, kConsumerThreads);
        const float sc1_0 = sm.scale1[r0], sc1_1 = sm.scale1[r1];
        store_p_scaled(pa, pk, sc1_0, sc1_1, r0, cq);  // P_a · sc1, for WG1's V_aR
        hw::fence_proxy_async();
        hw::named_arrive(kBarP0, kConsumerThreads);
        l0 *= sc1_0;
        l1 *= sc1_1;
        scale_o(o, sc1_0, sc1_1);
        hw::named_barrier(kBarP1, kConsumerThreads);
        hw::fence_proxy_async();  // b's cp.async bytes (WG1 waited for them), read by wgmma here
        hw::fence_regs(o);
        hw::wgmma_fence();
        pv_smem(o, pb, sm.kv[sb], 0);  // O_L += P_b · V_bL
        hw::wgmma_commit();
        if (kOverlap && pr + 2 < n) {
          // The next pair's S_a (tile a: the same stage, the next phase) behind P_b·V_bL.
          qk_chunks<0, kLChunks>(s, sm.q, sm.kv[sa], sm.full[sa], pha ^ 1u);
          hw::wgmma_commit();
          hw::wgmma_wait<1>();  // P_b·V_bL done; S_a's L half may still run
          hw::fence_regs(o);
          release(&sm.empty_l[sb]);  // b's L half: S_b (WG1, earlier) and V_bL
          qk_chunks<kLChunks, kChunks>(s, sm.q, sm.kv[sa], sm.full[sa], pha ^ 1u);
          hw::wgmma_commit();
          hw::wgmma_wait<0>();
          hw::fence_regs(s);
        } else {
          hw::wgmma_wait<0>();
          hw::fence_regs(o);
          release(&sm.empty_l[sb]);  // b's L half: S_b (WG1, earlier) and V_bL
        }
      } else {
        float mx0, mx1;
        score_tile<kPipelined, kPipelined, kFp8Cross>(s, sm, sb, phb, rq, a.scale_log2, cq, mx0,
                                                      mx1);
        hw::named_barrier(kBarScale0, kConsumerThreads);
        hw::fence_proxy_async();  // a's cp.async bytes (WG0 waited for them), read by wgmma here
        float ref0, ref1, sc1_0, sc1_1;
        raise_max(sm, sm.scale1, r0, mx0, mx1, ref0, ref1, sc1_0, sc1_1);
        hw::named_arrive(kBarScale1, kConsumerThreads);
        const float f0 = sm.scale0[r0] * sc1_0, f1 = sm.scale0[r1] * sc1_1;
        float e0, e1;
        exp_rows(s, ref0, ref1, e0, e1);
        l0 = l0 * f0 + e0;
        l1 = l1 * f1 + e1;
        scale_o(o, f0, f1);
        if constexpr (!kOverlap) {
          store_p(pb, s, r0, cq);
          hw::fence_proxy_async();
        }
        pack_p(s, pk);
        hw::fence_regs(o);
        hw::wgmma_fence();
        pv_regs(o, pk, sm.kv[sb], 1);  // O_R += P_b · V_bR
        hw::wgmma_commit();
        if constexpr (kOverlap) {  // P_b for WG0 while P_b·V_bR runs
          store_p_packed(pb, pk, r0, cq);
          hw::fence_proxy_async();
        }
        hw::named_barrier(kBarP0, kConsumerThreads);
        pv_smem(o, pa, sm.kv[sa], 1);  // O_R += P_a · V_aR
        hw::wgmma_commit();
        hw::named_arrive(kBarP1, kConsumerThreads);
        hw::wgmma_wait<1>();
        release(&sm.empty_r[sb]);  // b's R half: S_b and V_bR
        hw::wgmma_wait<0>();
        hw::fence_regs(o);
        release(&sm.empty_r[sa]);  // a's R half: S_a (WG0, before P_a) and V_aR
      }
    }

    // Epilogue: full row sums (4 lanes, then both warpgroups), normalise, write.
    sum_rows(l0, l1, sm.row_sum, w, r0, r1, kBarSum);
    const float m0 = sm.m[r0], m1 = sm.m[r1];
    hw::named_barrier(kBarSum, kConsumerThreads);  // row_sum and m free for the next token
    write_out<To>(a, o, t, part, w, r0, r1, cq, g, l0, l1, m0, m1);
  }
  if constexpr (kFp8Cross) hw::cluster_sync();  // the peer's last arrivals on this CTA landed
}
}  // namespace seesaw

int64_t g_sm90_calls = 0;
// OSPREY_MLA_SM90=0 routes every call to the CUDA-core kernels (bench step's before/after).
bool g_sm90_enabled = [] {
  const char* e = std::getenv("OSPREY_MLA_SM90");
  return !(e && e[0] == '0');
}();

// The calls the kernel serves, on a device it runs on: latent kv_lora 512 + rope 64, and H ≤ 64
// or a multiple of 64. One predicate for the decode dispatch and the prefill path choice.
bool sm90_serves(int64_t heads, int64_t kv_lora, int64_t rope) {
  return g_sm90_enabled && device_is_sm90() && kv_lora == kLat && rope == kRope &&
         (heads <= kHeadsPerCta || heads % kHeadsPerCta == 0);
}

// OSPREY_MLA_SM90_KERNEL=lockstep runs the first kernel (both warpgroups on every key block,
// in lockstep) on BF16 caches too, instead of the seesaw one: the kernel benchmark's A/B.
bool g_seesaw = [] {
  const char* e = std::getenv("OSPREY_MLA_SM90_KERNEL");
  return !(e && std::string_view(e) == "lockstep");
}();

// The seesaw kernel's dense tiles come by TMA (one thread, 9 boxes a tile) unless
// OSPREY_MLA_DENSE_TMA=0 asks for the 128 producer threads' cp.async gathers (A/B runs);
// set_mla_dense_tma() for the tests.
bool g_dense_tma = [] {
  const char* e = std::getenv("OSPREY_MLA_DENSE_TMA");
  return !(e && e[0] == '0');
}();

// The kernel of FP8-cache calls with H a multiple of 128 (hooks.h MlaFp8Kernel): Auto (the
// default), the lockstep kernel, its crossover (kCross), the prefill variant with the crossover
// producer (kFp8Cross), or the lockstep kernel's f16 variant (kF16).
// OSPREY_MLA_FP8=auto|lockstep|crossover|pipelined|f16, or set_mla_fp8_kernel.
int g_fp8_kernel_set = -1;  // -1: not read yet, else a MlaFp8Kernel
MlaFp8Kernel fp8_kernel_setting() {
  if (g_fp8_kernel_set < 0) {
    const char* e = std::getenv("OSPREY_MLA_FP8");
    const std::string_view v = e ? e : "auto";
    OSPREY_CHECK(
        v == "auto" || v == "lockstep" || v == "crossover" || v == "pipelined" || v == "f16",
        "OSPREY_MLA_FP8 must be 'auto' (the default), 'lockstep', 'crossover', 'pipelined' or "
        "'f16', not '",
        v, "'");
    g_fp8_kernel_set = int(v == "crossover"   ? MlaFp8Kernel::Crossover
                           : v == "pipelined" ? MlaFp8Kernel::Pipelined
                           : v == "f16"       ? MlaFp8Kernel::F16
                           : v == "lockstep"  ? MlaFp8Kernel::Lockstep
                                              : MlaFp8Kernel::Auto);
  }
  return MlaFp8Kernel(g_fp8_kernel_set);
}
// Auto's choice: the f16 variant from kMlaF16MinTokens query tokens a call, the lockstep kernel
// below. Measured (bench kernels --op mla --mla-kernel 'sparse decode', H100, 2026-12-07, ctx
// 5000, µs lockstep / f16): B = 1 22.6 / 30.8, B = 16 67.1 / 66.1, B = 64 162.7 / 147.9,
// B = 128 322.7 / 307.5, B = 64 s_q = 2 316.4 / 300.4. Below 16 tokens the f16 variant's longer
// q staging (the max reduction and the pre-scale) is not repaid by its cheaper conversion.
constexpr int64_t kMlaF16MinTokens = 16;
MlaFp8Kernel resolve_fp8_kernel(MlaFp8Kernel k, int64_t n_tokens) {
  if (k != MlaFp8Kernel::Auto) return k;
  return n_tokens >= kMlaF16MinTokens ? MlaFp8Kernel::F16 : MlaFp8Kernel::Lockstep;
}
int64_t g_fp8_cross_calls = 0;
int64_t g_fp8_f16_calls = 0;
// The f16 variant's guard: the loaded model's latent bound (ops/mla.h) within what f16 holds, or
// unknown. Says once on stderr when it declines.
bool f16_holds_latent() {
  const float bound = mla_latent_bound();
  if (bound <= kMlaF16LatentLimit) return true;
  static std::once_flag said;
  std::call_once(said, [bound] {
    std::fprintf(
        stderr,
        "osprey: the f16 FP8 MLA kernel declined: the model's latent cache values reach %g, "
        "past what f16 holds (%g); the lockstep kernel serves FP8 attention\n",
        double(bound), double(kMlaF16LatentLimit));
  });
  return false;
}

// Both crossover kernels run one CTA per SM (each takes over half of the 227 KB an SM has), so
// the clusters of two that can be resident at once are the device's pairs of SMs in a GPC: the
// split plan takes at most that many parts, so that every cluster of the grid runs in one wave.
static_assert(2 * kSmemBytes > 232448 && 2 * seesaw::kSmemBytes > 232448,
              "the crossover kernels must run one CTA per SM");
template <typename K>
int max_cluster_pairs(K* k, size_t smem) {
  OSPREY_CUDA_CHECK(
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = 2;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(sm_count() / 2), 2u, 1u);
  cfg.blockDim = dim3(unsigned(kThreads), 1u, 1u);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  OSPREY_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, k, &cfg));
  OSPREY_CHECK(clusters > 0, "MLA FP8 crossover: no cluster of two CTAs of ", smem,
               " bytes of shared memory fits this device");
  return clusters;
}
int resident_cluster_pairs() {
  static const int n =
      max_cluster_pairs(mla_decode_sm90_kernel<bf16, bf16, true, true, true>, kSmemBytes);
  return n;
}

// The TMA map of a BF16 latent cache [n_blocks, block_size, 576] (rows 1152 bytes apart) in boxes
// of [1, 64, 64] (tma_producer), kept per (base, n_blocks, block_size): a model has one cache per
// layer, so a step encodes nothing after the first; a cache reallocated with another size gets a
// new map. Encoding is host-only (legal in a graph capture); the map travels by value as a kernel
// parameter, so a captured launch keeps its own copy.
struct KvMapKey {
  const void* base;
  int64_t n_blocks;
  int block_size;
  bool operator==(const KvMapKey&) const = default;
};
struct KvMapHash {
  size_t operator()(const KvMapKey& k) const {
    return std::hash<const void*>{}(k.base) ^ (size_t(k.n_blocks) * 0x9e3779b97f4a7c15ull) ^
           size_t(k.block_size);
  }
};
// More maps than caches any process holds (layers × models × tests); past it the table restarts.
constexpr size_t kMaxKvMaps = 4096;
std::mutex g_kv_maps_mu;
std::unordered_map<KvMapKey, CUtensorMap, KvMapHash> g_kv_maps;
int64_t g_kv_map_builds = 0;

CUtensorMap dense_kv_map(const void* base, int64_t n_blocks, int block_size) {
  const KvMapKey key{base, n_blocks, block_size};
  std::lock_guard<std::mutex> lock(g_kv_maps_mu);
  if (auto it = g_kv_maps.find(key); it != g_kv_maps.end()) return it->second;
  if (g_kv_maps.size() >= kMaxKvMaps) g_kv_maps.clear();
  const uint64_t row_bytes = uint64_t(kWidth) * 2;
  const CUtensorMap map =
      hw::tma_map_bf16_3d_sw128(base, kWidth, uint64_t(block_size), uint64_t(n_blocks), row_bytes,
                                row_bytes * uint64_t(block_size), 64, kBlockN, 1);
  ++g_kv_map_builds;
  g_kv_maps.emplace(key, map);
  return map;
}

// The kernel an environment variable names ('pipelined' (the default), 'overlapped' or
// 'seesaw'; unset or empty: Pipelined), read once into *set (-1: not read yet). A bad value is a
// clear error on the first call, not at static initialisation.
MlaPrefillKernel kernel_setting(int& set, const char* env) {
  if (set < 0) {
    const char* e = std::getenv(env);
    MlaPrefillKernel k = MlaPrefillKernel::Pipelined;
    if (e && *e) {
      const std::string_view v(e);
      OSPREY_CHECK(v == "pipelined" || v == "overlapped" || v == "seesaw", env,
                   " must be 'pipelined' (the default), 'overlapped' or 'seesaw', not '", v, "'");
      k = v == "seesaw"       ? MlaPrefillKernel::Seesaw
          : v == "overlapped" ? MlaPrefillKernel::Overlapped
                              : MlaPrefillKernel::Pipelined;
    }
    set = int(k);
  }
  return MlaPrefillKernel(set);
}
// The sparse prefill kernel (hooks.h: MlaPrefillKernel): BF16 sparse calls with more query tokens
// than sequences (prompt chunks; MTP verify steps too) take the seesaw kernel's prefill variant
// (the default since it measured 10-14% faster on every sparse prefill shape: H200, 2026-12-03,
// bench/RESULTS.md); OSPREY_MLA_PREFILL=seesaw sends them to the seesaw kernel as for decode.
int g_prefill_kernel_set = -1;  // -1: not read yet, else a MlaPrefillKernel
MlaPrefillKernel prefill_kernel_setting() {
  return kernel_setting(g_prefill_kernel_set, "OSPREY_MLA_PREFILL");
}
// The BF16 sparse decode calls (one query token a sequence) take the prefill variant
// (Pipelined) by default too: on the H100 it ran B=16 / 64 / 128 at context 5000 in 49.0 / 109.2
// / 223.1 µs against the seesaw kernel's 52.6 / 137.2 / 339.6 (bench kernels, 2026-12-05;
// bench/RESULTS.md). OSPREY_MLA_SPARSE_DECODE (or set_mla_sparse_decode_kernel, the bench) picks
// another: 'seesaw' (the decode kernel) or 'overlapped'.
int g_sparse_decode_kernel_set = -1;  // -1: not read yet, else a MlaPrefillKernel
MlaPrefillKernel sparse_decode_kernel_setting() {
  return kernel_setting(g_sparse_decode_kernel_set, "OSPREY_MLA_SPARSE_DECODE");
}
int64_t g_prefill_variant_calls = 0;
int32_t g_prefill_token_cost = ops::kMlaPrefillTokenCost;  // set_mla_prefill_token_cost (the bench)

// kv_map: the TMA map of a dense BF16 call taking the TMA producer, else null. prefill: a sparse
// BF16 call taking the prefill variant, 1 (pipelined) or 2 (overlapped); else 0.
// cross: an FP8 call taking a crossover kernel (grid.y even), Crossover or Pipelined, or the f16
// variant (F16).
template <typename Tq, typename To, bool kFp8, bool kSparse>
void launch(const Params& a, dim3 grid, const CUtensorMap* kv_map, int prefill,
            MlaFp8Kernel cross) {
  if constexpr (kFp8) {
    if (cross == MlaFp8Kernel::F16) {
      auto* k = mla_decode_sm90_kernel<Tq, To, true, kSparse, false, true>;
      static const bool configured = [&] {
        OSPREY_CUDA_CHECK(
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
        return true;
      }();
      (void)configured;
      launch_pdl(k, grid, kThreads, kSmemBytes, a);
      OSPREY_CUDA_LAUNCH_CHECK();
      ++g_fp8_f16_calls;
      return;
    }
    if (cross != MlaFp8Kernel::Lockstep) {
      if (cross == MlaFp8Kernel::Crossover) {
        auto* k = mla_decode_sm90_kernel<Tq, To, true, kSparse, true>;
        static const bool configured = [&] {
          OSPREY_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 int(kSmemBytes)));
          return true;
        }();
        (void)configured;
        launch_pdl_cluster(k, grid, kThreads, kSmemBytes, dim3(1u, 2u, 1u), a);
      } else {
        auto* k = seesaw::mla_seesaw_sm90_kernel<Tq, To, kSparse, false, true, false, true>;
        static const bool configured = [&] {
          OSPREY_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 int(seesaw::kSmemBytes)));
          return true;
        }();
        (void)configured;
        launch_pdl_cluster(k, grid, kThreads, seesaw::kSmemBytes, dim3(1u, 2u, 1u), a,
                           CUtensorMap{});
      }
      OSPREY_CUDA_LAUNCH_CHECK();
      ++g_fp8_cross_calls;
      return;
    }
  }
  auto* k = mla_decode_sm90_kernel<Tq, To, kFp8, kSparse>;
  static const bool configured = [&] {
    OSPREY_CUDA_CHECK(
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    if constexpr (!kFp8) {
      OSPREY_CUDA_CHECK(cudaFuncSetAttribute(seesaw::mla_seesaw_sm90_kernel<Tq, To, kSparse, false>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             int(seesaw::kSmemBytes)));
      if constexpr (!kSparse)
        OSPREY_CUDA_CHECK(cudaFuncSetAttribute(seesaw::mla_seesaw_sm90_kernel<Tq, To, false, true>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               int(seesaw::kSmemBytes)));
      else
        for (auto* f : {seesaw::mla_seesaw_sm90_kernel<Tq, To, true, false, true>,
                        seesaw::mla_seesaw_sm90_kernel<Tq, To, true, false, true, true>})
          OSPREY_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 int(seesaw::kSmemBytes)));
    }
    return true;
  }();
  (void)configured;
  // BF16 caches: the seesaw kernel; FP8 caches: the lockstep one (each measured the faster on
  // its cache, bench/RESULTS.md).
  if constexpr (!kFp8) {
    if (g_seesaw) {
      if constexpr (!kSparse) {
        if (kv_map) {
          launch_pdl(seesaw::mla_seesaw_sm90_kernel<Tq, To, false, true>, grid, kThreads,
                     seesaw::kSmemBytes, a, *kv_map);
          OSPREY_CUDA_LAUNCH_CHECK();
          return;
        }
      }
      if constexpr (kSparse) {
        if (prefill != 0) {
          if (prefill == 2)
            launch_pdl(seesaw::mla_seesaw_sm90_kernel<Tq, To, true, false, true, true>, grid,
                       kThreads, seesaw::kSmemBytes, a, CUtensorMap{});
          else
            launch_pdl(seesaw::mla_seesaw_sm90_kernel<Tq, To, true, false, true>, grid, kThreads,
                       seesaw::kSmemBytes, a, CUtensorMap{});
          OSPREY_CUDA_LAUNCH_CHECK();
          ++g_prefill_variant_calls;
          return;
        }
      }
      launch_pdl(seesaw::mla_seesaw_sm90_kernel<Tq, To, kSparse, false>, grid, kThreads,
                 seesaw::kSmemBytes, a, CUtensorMap{});
      OSPREY_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  launch_pdl(k, grid, kThreads, kSmemBytes, a);
  OSPREY_CUDA_LAUNCH_CHECK();
}

template <typename Tq, typename To>
void launch_kind(const Params& a, dim3 grid, bool fp8, bool sparse, const CUtensorMap* kv_map,
                 int prefill, MlaFp8Kernel cross) {
  if (fp8) {
    if (sparse)
      launch<Tq, To, true, true>(a, grid, nullptr, 0, cross);
    else
      launch<Tq, To, true, false>(a, grid, nullptr, 0, cross);
  } else {
    if (sparse)
      launch<Tq, To, false, true>(a, grid, nullptr, prefill, MlaFp8Kernel::Lockstep);
    else
      launch<Tq, To, false, false>(a, grid, kv_map, 0, MlaFp8Kernel::Lockstep);
  }
}
}  // namespace

MlaPrefillKernel set_mla_prefill_kernel(MlaPrefillKernel k) {
  const MlaPrefillKernel was = prefill_kernel_setting();
  g_prefill_kernel_set = int(k);
  return was;
}
int set_mla_prefill_token_cost(int blocks) {
  OSPREY_CHECK(blocks >= 0 && blocks <= 64, "MLA plan: a token's cost must be 0..64 blocks, not ",
               blocks);
  const int was = g_prefill_token_cost;
  g_prefill_token_cost = blocks;
  return was;
}
int mla_prefill_token_cost() {
  return g_prefill_token_cost;
}
MlaPrefillKernel mla_prefill_kernel() {
  return prefill_kernel_setting();
}
MlaPrefillKernel set_mla_sparse_decode_kernel(MlaPrefillKernel k) {
  const MlaPrefillKernel was = sparse_decode_kernel_setting();
  g_sparse_decode_kernel_set = int(k);
  return was;
}
MlaPrefillKernel mla_sparse_decode_kernel() {
  return sparse_decode_kernel_setting();
}
const char* mla_prefill_kernel_name(MlaPrefillKernel k) {
  return k == MlaPrefillKernel::Pipelined    ? "pipelined"
         : k == MlaPrefillKernel::Overlapped ? "overlapped"
                                             : "seesaw";
}
int64_t mla_prefill_variant_calls() {
  return g_prefill_variant_calls;
}

MlaFp8Kernel set_mla_fp8_kernel(MlaFp8Kernel k) {
  const MlaFp8Kernel was = fp8_kernel_setting();
  g_fp8_kernel_set = int(k);
  return was;
}
MlaFp8Kernel mla_fp8_kernel() {
  return fp8_kernel_setting();
}
const char* mla_fp8_kernel_name(MlaFp8Kernel k) {
  return k == MlaFp8Kernel::Crossover   ? "crossover"
         : k == MlaFp8Kernel::Pipelined ? "pipelined"
         : k == MlaFp8Kernel::F16       ? "f16"
         : k == MlaFp8Kernel::Auto      ? "auto"
                                        : "lockstep";
}
int64_t mla_fp8_crossover_calls() {
  return g_fp8_cross_calls;
}
int64_t mla_fp8_f16_calls() {
  return g_fp8_f16_calls;
}
bool set_mla_dense_tma(bool enabled) {
  const bool was = g_dense_tma;
  g_dense_tma = enabled;
  return was;
}
void forget_mla_dense_tma_maps() {
  std::lock_guard<std::mutex> lock(g_kv_maps_mu);
  g_kv_maps.clear();
}
bool mla_dense_tma_enabled() {
  return g_dense_tma;
}
int64_t mla_dense_tma_map_builds() {
  std::lock_guard<std::mutex> lock(g_kv_maps_mu);
  return g_kv_map_builds;
}

int64_t mla_sm90_calls() {
  return g_sm90_calls;
}
bool set_mla_sm90_enabled(bool enabled) {
  const bool was = g_sm90_enabled;
  g_sm90_enabled = enabled;
  return was;
}

bool mla_absorbed_prefill_preferred(int64_t heads, int64_t kv_lora, int64_t rope, bool sparse) {
  return sparse && sm90_serves(heads, kv_lora, rope);
}

bool mla_decode_sm90_supported(Tensor out, Tensor q, Tensor cache, const AttentionMeta& m) {
  const bool fp8 = cache.dtype == DType::U8;
  return sm90_serves(q.size(1), out.size(2), q.size(2) - out.size(2)) && is_f32_or_bf16(q.dtype) &&
         is_f32_or_bf16(out.dtype) &&
         (fp8 ? cache.size(-1) == kFp8Bytes
              : (cache.dtype == DType::BF16 && cache.size(-1) == kWidth)) &&
         m.block_size > 0;
}

void mla_decode_sm90(Tensor out, Tensor q, Tensor cache, const AttentionMeta& m,
                     Tensor topk_indices, float scale, Tensor lse) {
  const int64_t H = q.size(1);
  const bool sparse = topk_indices.data != nullptr, fp8 = cache.dtype == DType::U8;
  if (m.n_tokens == 0) return;
  const int groups = int((H + kHeadsPerCta - 1) / kHeadsPerCta);
  const bool q_bf16 = q.dtype == DType::BF16, out_bf16 = out.dtype == DType::BF16;
  // The crossover kernels pair head groups 2·i, 2·i + 1 of a part in one cluster.
  // The f16 variant takes any H.
  MlaFp8Kernel cross =
      fp8 ? resolve_fp8_kernel(fp8_kernel_setting(), m.n_tokens) : MlaFp8Kernel::Lockstep;
  const bool paired = cross == MlaFp8Kernel::Crossover || cross == MlaFp8Kernel::Pipelined;
  if (paired && groups % 2 != 0) cross = MlaFp8Kernel::Lockstep;
  if (cross == MlaFp8Kernel::F16 && !f16_holds_latent()) cross = MlaFp8Kernel::Lockstep;
  int n_parts = std::max(1, sm_count() / groups);
  if (paired && groups % 2 == 0)
    n_parts = std::max(1, std::min(n_parts, resident_cluster_pairs() * 2 / groups));
  const int64_t clamp = sparse ? topk_indices.size(1) : int64_t(INT32_MAX);
  // Prompt chunks (and MTP verify steps: several query tokens a sequence) cut their runs at equal
  // cost with a per-token charge; decode batches at equal blocks (split_kv.cuh).
  const MlaPlan plan =
      mla_split_plan(m, clamp, n_parts, m.n_tokens > m.n_seqs ? g_prefill_token_cost : 0);
  Params a{};
  a.q = q.data;
  a.cache = static_cast<const uint8_t*>(cache.data);
  a.token_bytes = fp8 ? kFp8Bytes : kWidth * 2;
  a.out = out.data;
  a.lse = lse.data ? lse.ptr<float>() : nullptr;
  a.part_o = static_cast<float*>(
      scratch(kScratchAttnPartO, size_t(plan.max_slots) * size_t(H) * kLat * sizeof(float)));
  a.part_lse = static_cast<float*>(
      scratch(kScratchAttnPartML, size_t(plan.max_slots) * size_t(H) * sizeof(float)));
  a.positions = m.positions.ptr<int32_t>();
  a.qsl = m.query_start_loc.ptr<int32_t>();
  a.block_table = m.block_table.ptr<int32_t>();
  a.max_blocks = m.block_table.size(1);
  a.block_size = m.block_size;
  a.n_seqs = m.n_seqs;
  a.topk = sparse ? topk_indices.ptr<int32_t>() : nullptr;
  a.topk_k = sparse ? topk_indices.size(1) : 0;
  a.H = int(H);
  a.scale_log2 = scale * kLog2e;
  a.cum = plan.cum;
  a.split_base = plan.split_base;
  a.part_start = plan.part_start;
  a.first_part = plan.first_part;
  a.n_splits = plan.n_splits;
  a.n_tokens = m.n_tokens;
  const dim3 grid{unsigned(n_parts), unsigned(groups), 1u};
  // The TMA producer: dense BF16 calls of the seesaw kernel whose 64-entry tiles are whole runs of
  // one cache block (block_size a multiple of 64); others keep the cp.async gathers.
  CUtensorMap kv_map;
  const CUtensorMap* map = nullptr;
  if (g_dense_tma && g_seesaw && !fp8 && !sparse && m.block_size % kBlockN == 0) {
    const int64_t rows = cache.numel() / kWidth;
    OSPREY_CHECK(rows % m.block_size == 0, "MLA dense decode: the BF16 cache's ", rows,
                 " rows are not whole blocks of ", m.block_size);
    kv_map = dense_kv_map(cache.data, rows / m.block_size, m.block_size);
    map = &kv_map;
  }
  // The prefill variant: chosen, and a BF16 sparse call with a sequence of several query tokens.
  // Decode batches (one token a sequence): the kernel OSPREY_MLA_SPARSE_DECODE names (default the
  // prefill variant too).
  const MlaPrefillKernel pk =
      m.n_tokens > m.n_seqs ? prefill_kernel_setting() : sparse_decode_kernel_setting();
  const int prefill = pk != MlaPrefillKernel::Seesaw && g_seesaw && sparse && !fp8
                          ? (pk == MlaPrefillKernel::Overlapped ? 2 : 1)
                          : 0;
  if (q_bf16) {
    if (out_bf16)
      launch_kind<bf16, bf16>(a, grid, fp8, sparse, map, prefill, cross);
    else
      launch_kind<bf16, float>(a, grid, fp8, sparse, map, prefill, cross);
  } else {
    if (out_bf16)
      launch_kind<float, bf16>(a, grid, fp8, sparse, map, prefill, cross);
    else
      launch_kind<float, float>(a, grid, fp8, sparse, map, prefill, cross);
  }
  mla_combine_splits(out.data, out_bf16, a.lse, a.part_o, a.part_lse, plan, int(H), kLat);
  ++g_sm90_calls;
}

}  // namespace osprey::ops::cuda
