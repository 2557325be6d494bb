// Absorbed MLA attention on Hopper tensor cores (sm_90a): sparse (DSA top-k) and dense decode, and
// the absorbed sparse prefill (the same math for every query token of a chunk).
//
// Math (ops/mla.h, absorbed form): for query token t at position p of sequence s, over its
// attended entries i < L_t (sparse: j = topk[t, i], L_t = min(top-k, p + 1); dense: j = i,
// L_t = p + 1; entries with j < 0 or j > p are skipped),
//   S[h, i] = scale · q[t, h, :576] · row_j[:576]       row_j = latent cache row of position j
//   out[t, h, :512] = Σ_i softmax_i(S[h, :]) · row_j[:512],   lse[t, h] = log Σ_i e^S[h, i]
// Shapes: q [n_tokens, H, 576] F32 or BF16 (rounded to BF16 as it is staged); the cache
// [n_blocks, 64, 576] BF16 or the FP8 format [n_blocks, 64, 656] U8 (dequantised to BF16 in shared
// memory: e4m3 · tile scale, as the CPU twin reads it); out [n_tokens, H, 512] F32 or BF16; lse
// [n_tokens, H] F32 (optional). Both GEMMs run in BF16 with F32 accumulation.
//
// Grid [n_parts, ceil(H / 64)], 384 threads, one CTA per SM (≈ 226 KB of shared memory):
//   CTA (part, g) takes heads 64·g .. 64·g + 63 (rows past H are zero and never written) and the
//   part's run of 64-entry blocks from the split-KV plan (split_kv.cuh), token after token.
//   Warpgroup 2, the producer (setmaxnreg down to kProducerRegs), gathers the 64 cache rows of a
//   block into one of kStages shared-memory tiles (BF16: cp.async; FP8: 16-byte loads dequantised
//   to BF16; rows not attended are zero and flagged invalid), then arrives on the stage's `full`
//   mbarrier. Warpgroups 0 and 1, the consumers (setmaxnreg up to kConsumerRegs), share the 64
//   heads and the key block:
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
#include <cstdlib>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/sync.cuh"
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
constexpr int kBarQ = 1, kBarMax = 2, kBarP = 3, kBarSum = 4;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct Smem {  // every tile 1024-aligned: the base is, and each tile is a multiple of 1024 B
  uint8_t q[kTileBytes];              // [64 heads × 576] BF16, SW128
  uint8_t kv[kStages][kTileBytes];    // [64 keys × 576] BF16, SW128
  uint8_t p[kChunkBytes];             // [64 heads × 64 keys] BF16, SW128
  float row_max[2][2][kHeadsPerCta];  // [tile parity][warpgroup][head]
  float row_sum[2][kHeadsPerCta];     // [warpgroup][head]
  uint8_t valid[kStages][kBlockN];    // key r of the stage is attended
  uint64_t full[kStages], empty[kStages];
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
  float scale_log2;  // softmax scale · log2(e)
  const int32_t* cum;
  const int32_t* split_base;
  const int32_t* payload;
  int n_tokens;
};

// Attended entries of token t: L_t as in the plan.
template <bool kSparse>
__device__ __forceinline__ int entries_of(const Params& a, int64_t p) {
  return kSparse ? int(a.topk_k < p + 1 ? a.topk_k : p + 1) : int(p + 1);
}

__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 4 e4m3 bytes × s → 4 BF16 (two words), through f16 (exact) and F32 (the CPU twin's product).
__device__ __forceinline__ uint2 dequant4(uint32_t w, float s) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  return make_uint2(bf16x2(a.x * s, a.y * s), bf16x2(b.x * s, b.y * s));
}

// The producer's share of one stage: thread pt (0..127) fills half `half` of row r = pt / 2.
template <bool kFp8>
__device__ __forceinline__ void load_row_half(uint8_t* tile, const Params& a, int r, int half,
                                              int64_t row) {
  const bool ok = row >= 0;
  uint8_t* dst_row = tile + r * 128;  // + chunk · kChunkBytes
  const uint32_t sw = uint32_t(r & 7);
  if constexpr (!kFp8) {
    // 576 BF16 = 72 units of 8; this half takes units 36·half .. 36·half + 35.
    const uint8_t* src = a.cache + (ok ? row : 0) * a.token_bytes;
#pragma unroll 12
    for (int k = 0; k < 36; ++k) {
      const int u = half * 36 + k, chunk = u >> 3, uu = u & 7;
      hw::cp_async_16(dst_row + chunk * kChunkBytes + ((uint32_t(uu) ^ sw) << 4), src + u * 16,
                      ok ? 16u : 0u);
    }
  } else {
    // Latent: 512 e4m3 = 32 units of 16 values, this half takes 16 (tiles 2·half, 2·half + 1);
    // rope: 64 BF16 = 8 units of 8, this half takes 4.
    const uint8_t* src = a.cache + (ok ? row : 0) * a.token_bytes;
    float s[2] = {0.0f, 0.0f};
    if (ok) {
      const float2 sc = *reinterpret_cast<const float2*>(src + kLat + 8 * half);
      s[0] = sc.x;
      s[1] = sc.y;
    }
    // Rope (BF16, no conversion): straight to shared memory; zero-filled for an invalid row.
    const uint8_t* pe = src + kLat + 4 * (kLat / 128);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int ru = half * 4 + k;  // rope unit (8 BF16) → column 512 + 8·ru
      const int u = kLat / 8 + ru, chunk = u >> 3, uu = u & 7;
      hw::cp_async_16(dst_row + chunk * kChunkBytes + ((uint32_t(uu) ^ sw) << 4), pe + ru * 16,
                      ok ? 16u : 0u);
    }
    // The half's 16 latent units all in flight at once (one memory round trip per stage).
    uint4 v[16];
#pragma unroll
    for (int k = 0; k < 16; ++k)
      v[k] = ok ? hw::ld_stream_16(src + (half * 16 + k) * 16) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int vu = half * 16 + k;  // 16-value unit of the latent
      const float sk = s[k / 8];     // 128-value tile: 8 units each
      const uint2 a0 = dequant4(v[k].x, sk), a1 = dequant4(v[k].y, sk);
      const uint2 b0 = dequant4(v[k].z, sk), b1 = dequant4(v[k].w, sk);
      const int u0 = 2 * vu, chunk = u0 >> 3, uu = u0 & 7;  // two 8-value BF16 units
      uint8_t* d = dst_row + chunk * kChunkBytes;
      hw::st_shared_16(d + ((uint32_t(uu) ^ sw) << 4), make_uint4(a0.x, a0.y, a1.x, a1.y));
      hw::st_shared_16(d + ((uint32_t(uu + 1) ^ sw) << 4), make_uint4(b0.x, b0.y, b1.x, b1.y));
    }
  }
}

template <typename Tq, typename To, bool kFp8, bool kSparse>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_sm90_kernel(const Params a) {
  extern __shared__ uint8_t smem_raw[];
  Smem& sm =
      *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x;
  const int part = blockIdx.x, g = blockIdx.y;
  const int32_t payload = *a.payload, total = a.cum[a.n_tokens];
  const int32_t w0 = part * payload, w1 = min(w0 + payload, total);
  if (w0 >= w1) return;  // the whole CTA: no barrier was used yet
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      hw::mbar_init(&sm.full[s], kProducerThreads);
      hw::mbar_init(&sm.empty[s], kConsumerThreads);
    }
    hw::mbar_init_fence();
  }
  __syncthreads();
  // The part's first token: the largest t with cum[t] ≤ w0 (the search seq_of_token does).
  const int t_first = seq_of_token(a.cum, a.n_tokens, w0);

  if (tid >= kConsumerThreads) {  // ---- producer warpgroup ----
    hw::regs_dealloc<kProducerRegs>();
    const int pt = tid - kConsumerThreads, r = pt >> 1, half = pt & 1;
    int it = 0;
    for (int t = t_first; t < a.n_tokens && a.cum[t] < w1; ++t) {
      const int32_t c0 = a.cum[t];
      const int b0 = max(w0, c0) - c0, b1 = min(w1, a.cum[t + 1]) - c0;
      const int s = seq_of_token(a.qsl, a.n_seqs, t);
      const int64_t p = a.positions[t];
      const int L = entries_of<kSparse>(a, p);
      for (int b = b0; b < b1; ++b, ++it) {
        const int stage = it % kStages;
        hw::mbar_wait(&sm.empty[stage], ((it / kStages) & 1) ^ 1);
        const int i = b * kBlockN + r;
        int64_t j = -1;
        if (i < L) j = kSparse ? int64_t(a.topk[int64_t(t) * a.topk_k + i]) : int64_t(i);
        int64_t row = -1;
        if (j >= 0 && j <= p)
          row =
              int64_t(a.block_table[int64_t(s) * a.max_blocks + j / a.block_size]) * a.block_size +
              j % a.block_size;
        if (half == 0) sm.valid[stage][r] = row >= 0 ? 1 : 0;
        load_row_half<kFp8>(sm.kv[stage], a, r, half, row);
        hw::cp_async_wait_all();  // BF16 rows, or the FP8 rows' rope part
        hw::fence_proxy_async();
        hw::mbar_arrive(&sm.full[stage]);
      }
    }
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

    // Stage Q [64 heads × 576] as BF16 (rows past H zero).
    for (int u = tid; u < kHeadsPerCta * (kWidth / 8); u += kConsumerThreads) {
      const int hr = u / (kWidth / 8), cu = u % (kWidth / 8);
      const int h = g * kHeadsPerCta + hr;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (h < a.H) {
        const Tq* src = static_cast<const Tq*>(a.q) + (int64_t(t) * a.H + h) * kWidth + cu * 8;
        if constexpr (sizeof(Tq) == 4) {
          const float4 x = reinterpret_cast<const float4*>(src)[0];
          const float4 y = reinterpret_cast<const float4*>(src)[1];
          v = make_uint4(bf16x2(x.x, x.y), bf16x2(x.z, x.w), bf16x2(y.x, y.y), bf16x2(y.z, y.w));
        } else {
          v = *reinterpret_cast<const uint4*>(src);
        }
      }
      hw::st_shared_16(
          sm.q + (cu >> 3) * kChunkBytes + hr * 128 + ((uint32_t((cu & 7) ^ (hr & 7))) << 4), v);
    }
    hw::fence_proxy_async();
    hw::named_barrier(kBarQ, kConsumerThreads);

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int b = b0; b < b1; ++b, ++it, par ^= 1) {
      const int stage = it % kStages;
      hw::mbar_wait(&sm.full[stage], (it / kStages) & 1);
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
          if (c < kSplitChunk)
            hw::wgmma_m64n32k16_bf16_ss(sc, da, db, c > 0 || kk > 0);
          else
            hw::wgmma_m64n32k16_bf16_ss(sc2, da, db, c > kSplitChunk || kk > 0);
        }
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(sc);
      hw::fence_regs(sc2);
#pragma unroll
      for (int i = 0; i < 16; ++i) sc[i] += sc2[i];

      // Mask and scale; row maxima of this half, then of both halves.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int key = 32 * w + 8 * (i >> 2) + cq + (i & 1);
        sc[i] = sm.valid[stage][key] ? sc[i] * a.scale_log2 : -INFINITY;
        if (i & 2)
          mx1 = fmaxf(mx1, sc[i]);
        else
          mx0 = fmaxf(mx0, sc[i]);
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
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

        // P (BF16) into shared memory: this half's 32 key columns of the [64 × 64] tile.
#pragma unroll
      for (int n8 = 0; n8 < 4; ++n8) {
        const uint32_t uu = uint32_t(4 * w + n8);
        *reinterpret_cast<uint32_t*>(sm.p + r0 * 128 + (((uu ^ uint32_t(r0)) & 7u) << 4) + cq * 2) =
            bf16x2(sc[4 * n8], sc[4 * n8 + 1]);
        *reinterpret_cast<uint32_t*>(sm.p + r1 * 128 + (((uu ^ uint32_t(r1)) & 7u) << 4) + cq * 2) =
            bf16x2(sc[4 * n8 + 2], sc[4 * n8 + 3]);
      }
      hw::fence_proxy_async();
      hw::named_barrier(kBarP, kConsumerThreads);

      hw::fence_regs(o);
      hw::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk)
        hw::wgmma_m64n256k16_bf16_ss_tb(
            o, hw::sw128_desc(sm.p + kk * 32, 16, 1024),
            hw::sw128_desc(kv + 4 * w * kChunkBytes + kk * 16 * 128, kChunkBytes, 1024), true);
      hw::wgmma_commit();
      hw::wgmma_wait<0>();
      hw::fence_regs(o);
      hw::mbar_arrive(&sm.empty[stage]);
    }

    // Epilogue: full row sums (4 lanes, then both halves), normalise, write.
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, off);
      l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    if ((lane & 3) == 0) {
      sm.row_sum[w][r0] = l0;
      sm.row_sum[w][r1] = l1;
    }
    hw::named_barrier(kBarSum, kConsumerThreads);
    l0 += sm.row_sum[w ^ 1][r0];
    l1 += sm.row_sum[w ^ 1][r1];
    hw::named_barrier(kBarSum, kConsumerThreads);  // row_sum free for the next token
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    const float lse0 = l0 > 0.0f ? m0 + log2f(l0) : -INFINITY;
    const float lse1 = l1 > 0.0f ? m1 + log2f(l1) : -INFINITY;
    const int n_splits = mla_n_splits(a.cum, payload, t);
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
      const int slot = a.split_base[t] + (part - c0 / payload);
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
}

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

template <typename Tq, typename To, bool kFp8, bool kSparse>
void launch(const Params& a, dim3 grid) {
  auto* k = mla_decode_sm90_kernel<Tq, To, kFp8, kSparse>;
  static const bool configured = [&] {
    OSPREY_CUDA_CHECK(
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    return true;
  }();
  (void)configured;
  k<<<grid, kThreads, kSmemBytes, stream()>>>(a);
  OSPREY_CUDA_LAUNCH_CHECK();
}

template <typename Tq, typename To>
void launch_kind(const Params& a, dim3 grid, bool fp8, bool sparse) {
  if (fp8) {
    if (sparse)
      launch<Tq, To, true, true>(a, grid);
    else
      launch<Tq, To, true, false>(a, grid);
  } else {
    if (sparse)
      launch<Tq, To, false, true>(a, grid);
    else
      launch<Tq, To, false, false>(a, grid);
  }
}
}  // namespace

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
  const int n_parts = std::max(1, sm_count() / groups);
  const int64_t clamp = sparse ? topk_indices.size(1) : int64_t(INT32_MAX);
  const MlaPlan plan = mla_split_plan(m, clamp, n_parts);
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
  a.payload = plan.payload;
  a.n_tokens = m.n_tokens;
  const dim3 grid{unsigned(n_parts), unsigned(groups), 1u};
  const bool q_bf16 = q.dtype == DType::BF16, out_bf16 = out.dtype == DType::BF16;
  if (q_bf16) {
    if (out_bf16)
      launch_kind<bf16, bf16>(a, grid, fp8, sparse);
    else
      launch_kind<bf16, float>(a, grid, fp8, sparse);
  } else {
    if (out_bf16)
      launch_kind<float, bf16>(a, grid, fp8, sparse);
    else
      launch_kind<float, float>(a, grid, fp8, sparse);
  }
  mla_combine_splits(out.data, out_bf16, a.lse, a.part_o, a.part_lse, plan, int(H), kLat);
  ++g_sm90_calls;
}

}  // namespace osprey::ops::cuda
