// CUDA multi-head latent attention (contracts in ops/mla.h).
//
// mla_absorb_q / mla_unabsorb_out: strided-batched cuBLASLt GEMMs, batch = heads, F32 accumulation.
//   absorb:   q_abs[:, h, :kv_lora] = q[:, h, :nope] · W_UK_h   (W_UK_h = kv_b rows h·(nope+v)
//   ..+nope)
//             q_abs[:, h, kv_lora:] = q[:, h, nope:]           (copy_rope_kernel)
//   unabsorb: out[:, h, :] = o_lat[:, h, :] · W_UV_hᵀ          (W_UV_h = the next v rows)
//   kv_b F32 or BF16; activations converted to kv_b's dtype; q_abs/out F32 (or BF16 when kv_b is).
//   A BF16 kv_b with an F32 q: one kernel (split_q_kernel) writes both q's nope part as BF16 (the
//   GEMM's operand: the rounding the conversion of q made, of the nope part only) and the rope part
//   into q_abs; the conversion kernel and copy_rope_kernel are not launched.
// mla_kv_write: mla_cache_write fused with the kv_a split, kv_a_norm and k_pe's rope (below).
// mla_cache_write / mla_cache_gather: row copies with dtype conversion; cache F32 or BF16, or U8 =
//   the FP8 format of ops/mla.h (per token kv_lora e4m3, kv_lora/128 fp32 tile scales, rope bf16).
//   Grids: write [n_tokens] × 128 threads (FP8: cache_write_fp8_kernel, a warp per 128-value tile);
//   gather [Σ seq_lens] × 128 threads (binary search of the row's sequence in the device cumsum of
//   seq_lens), dequantizing an FP8 cache.
// Every kernel that reads the cache reads it through a row reader (Rows<T> for F32/BF16, Fp8Rows
// for the FP8 format) that returns element c of a row as F32, so the attention arithmetic is the
// same for every format; Fp8Rows dequantizes on load (e4m3 · tile scale, the CPU twin's product).
// mla_attention_absorbed (decode; any query over the paged cache), split-KV flash decoding:
//   Each token's attended list (dense: 0..p; sparse: the topk row's valid entries ≤ p) is cut into
//   n_splits chunks. mla_decode_kernel: grid [n_tokens, H/8, n_splits], 8 warps = 8 heads per
//   block; a tile of kTile cache rows (576 wide, F32 in shared memory) is loaded once per block and
//   read by every head; per warp an online softmax (running max m, sum l) and a 512-wide F32
//   accumulator (16 values a lane). Partials (unnormalised o, m, l) go to scratch, then
//   mla_combine_kernel (grid [n_tokens·H], 128 threads) merges them: o = Σ e^{m_s−M} o_s / Σ
//   e^{m_s−M} l_s. Shapes fixed at kv_lora 512 + rope 64 (all DeepSeek MLA models). q, out: F32 or
//   BF16; cache F32, BF16 or FP8 (656 B/token; the tile is dequantized into shared memory as it is
//   loaded).
// mla_attention_expanded (prefill, causal, variable length): grid [n_tokens, H/8], a warp per head
//   walks its attended positions with an online softmax; K, V [Σ seq_lens, H, 192 | 128] F32/BF16.
// Other shapes (the small test models: latent 128 + rope 16, 4 heads) take mla_generic_kernel, a
// plain correctness-first version with the dims at run time (see its comment).
#include <algorithm>
#include <cfloat>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/mla/decode_sm90.cuh"
#include "ops/cuda/rope.cuh"
#include "ops/mla.h"
#include "ops/rope.h"

namespace osprey::ops::cuda {

namespace {
constexpr int kLat = 512, kRope = 64, kWidth = kLat + kRope;  // latent cache row
constexpr int kHeadsPerBlock = 8;
constexpr int kTile = 16;           // cache rows per shared-memory tile
constexpr int64_t kMinChunk = 256;  // attended positions per split, at least
constexpr int64_t kMaxSplits = 128;
constexpr size_t kMaxPartialBytes = size_t(1) << 30;
constexpr int kQk = 192, kV = 128;  // expanded attention head dims (nope 128 + rope 64, v 128)

cudaDataType_t lt_type(DType d) {
  return d == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

const void* as_dtype(Tensor x, DType want, ScratchSlot slot) {
  if (x.dtype == want) return x.data;
  void* buf = scratch(slot, size_t(x.numel()) * dtype_size(want));
  convert(buf, want, x.data, x.dtype, x.numel());
  return buf;
}

template <typename To, typename Ti>
__global__ void copy_rope_kernel(To* q_abs, const Ti* q, int64_t rows, int qk, int nope, int width,
                                 int kv_lora) {
  pdl_wait();
  pdl_trigger();
  const int rope = qk - nope;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * rope;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / rope;
    const int c = int(i % rope);
    q_abs[r * width + kv_lora + c] = from_f32<To>(to_f32(q[r * qk + nope + c]));
  }
}

// q [rows, qk] F32 (rows = n_tokens · H) → q_nope [rows, nope] BF16 (round to nearest even) and
// q_abs[r, kv_lora : kv_lora + rope] = q[r, nope:] (q_abs rows of `width`), rotated by rope
// (rope.cuh, token r / H at pos[r / H]) when pos is given (mla_absorb_q_rope: each thread computes
// its own element of the pair from both inputs; q is not written). Grid-stride over rows × qk, 256
// threads.
template <typename To>
__global__ void split_q_kernel(bf16* __restrict__ q_nope, To* __restrict__ q_abs,
                               const float* __restrict__ q, int64_t rows, int qk, int nope,
                               int width, int kv_lora, const int32_t* __restrict__ pos,
                               const float* __restrict__ inv_freq, int64_t H, float factor,
                               bool interleaved) {
  pdl_wait();
  pdl_trigger();
  const int half = (qk - nope) / 2;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * qk;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / qk;
    const int c = int(i % qk);
    if (c < nope) {
      q_nope[r * nope + c] = __float2bfloat16_rn(q[i]);
      continue;
    }
    const int j = c - nope;
    float y = q[i];
    if (pos) {
      bool first;
      const int pr = rope_pair_of(j, half, interleaved, first);
      const float* qr = q + r * qk + nope;
      float x0 = qr[rope_first(pr, half, interleaved)], x1 = qr[rope_second(pr, half, interleaved)];
      rope_rotate(x0, x1, rope_cs(float(pos[r / H]), inv_freq[pr], factor));
      y = first ? x0 : x1;
    }
    q_abs[r * width + kv_lora + j] = from_f32<To>(y);
  }
}

__device__ __forceinline__ int64_t cache_row(const int32_t* block_table, int64_t max_blocks,
                                             int block_size, int s, int64_t j) {
  return int64_t(block_table[s * max_blocks + j / block_size]) * block_size + j % block_size;
}

// Row readers: element c of cache / K / V row `row` (head h for per-head K and V) as F32.
// Rows<T>: F32 or BF16 rows of row_stride elements, head h at + h·head_stride (0 for the latent
// cache, shared by all heads).
template <typename T>
struct Rows {
  const T* __restrict__ p;
  int64_t row_stride, head_stride;
  __device__ __forceinline__ float operator()(int64_t row, int64_t h, int64_t c) const {
    return to_f32(p[row * row_stride + h * head_stride + c]);
  }
};
// Fp8Rows: the FP8 latent cache (ops/mla.h), token_bytes per row; every head reads the same row.
struct Fp8Rows {
  const uint8_t* __restrict__ p;
  int64_t token_bytes;
  int kv_lora;
  __device__ __forceinline__ float operator()(int64_t row, int64_t, int64_t c) const {
    const uint8_t* r = p + row * token_bytes;
    if (c < kv_lora)
      return e4m3_to_f32_dev(r[c]) *
             *reinterpret_cast<const float*>(r + kv_lora + 4 * (c / kMlaFp8Tile));
    const bf16* pe = reinterpret_cast<const bf16*>(r + kv_lora + 4 * (kv_lora / kMlaFp8Tile));
    return __bfloat162float(pe[c - kv_lora]);
  }
};

// Calls f(reader) with the latent cache's row reader (kv_lora values before the rope part).
template <typename F>
void with_latent_rows(Tensor cache, int64_t kv_lora, F&& f) {
  if (cache.dtype == DType::U8) {
    f(Fp8Rows{static_cast<const uint8_t*>(cache.data), cache.size(-1), int(kv_lora)});
    return;
  }
  OSPREY_DISPATCH_FLOAT(cache.dtype, Tc, {
    f(Rows<Tc>{static_cast<const Tc*>(cache.data), cache.size(-1), 0});
  });
}

// One token's slot of an FP8 latent cache (format in ops/mla.h), bit-identical to the CPU twin;
// shared by cache_write_fp8_kernel and kv_write_fp8_kernel. x(c) gives latent value c < kv_lora,
// pe(c) rope value c < rope, both as F32.
//   Per 128-value tile i: amax_i = max |x|, s_i = max(amax_i / 448, FLT_MIN) (IEEE division),
//   bytes e4m3_rne_sat(x / s_i); s_i as fp32 at kv_lora + 4·i; the rope values as bf16 (RNE) after
//   the scales. blockDim a multiple of 32: warp w quantizes tiles w, w + n_warps, ... (lane l holds
//   values l + 32·k, k < 4); the threads then write the rope part.
//   Preconditions: kv_lora % 128 == 0, rope even (scales 4-byte aligned, rope 2-byte aligned).
template <typename X, typename Pe>
__device__ __forceinline__ void store_fp8_slot(uint8_t* __restrict__ dst, X x, Pe pe, int kv_lora,
                                               int rope) {
  constexpr int kPerLane = int(kMlaFp8Tile) / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  const int n_tiles = kv_lora / int(kMlaFp8Tile);
  for (int tile = warp; tile < n_tiles; tile += n_warps) {
    const int c0 = tile * int(kMlaFp8Tile);
    float v[kPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      v[k] = x(c0 + lane + 32 * k);
      amax = fmaxf(amax, fabsf(v[k]));
    }
    amax = warp_max(amax);
    const float s0 = __fdiv_rn(amax, 448.0f);  // mla_fp8_scale (ops/mla.h), bit for bit
    const float s = s0 > FLT_MIN ? s0 : FLT_MIN;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      dst[c0 + lane + 32 * k] = f32_to_e4m3_dev(__fdiv_rn(v[k], s));
    if (lane == 0) *reinterpret_cast<float*>(dst + kv_lora + 4 * tile) = s;
  }
  bf16* out_pe = reinterpret_cast<bf16*>(dst + kv_lora + 4 * n_tiles);
  for (int c = threadIdx.x; c < rope; c += blockDim.x) out_pe[c] = from_f32<bf16>(pe(c));
}

// One token's slot of a BF16/F32 latent cache: [kv_lora latent values, rope values] as Tc, from
// value(c), c < kv_lora + rope, as F32 (block-strided). Shared by cache_write_kernel and
// kv_write_kernel.
template <typename Tc, typename V>
__device__ __forceinline__ void store_slot(Tc* __restrict__ dst, V value, int width) {
  for (int c = threadIdx.x; c < width; c += blockDim.x) dst[c] = from_f32<Tc>(value(c));
}

// FP8 cache write: latent [n_tokens, kv_lora], k_pe [n_tokens, rope] F32 or BF16; cache U8 rows of
// token_bytes at slot_mapping[t], written by store_fp8_slot. Grid [n_tokens], blockDim a multiple
// of 32. Preconditions as store_fp8_slot's.
template <typename Ti>
__global__ void cache_write_fp8_kernel(uint8_t* __restrict__ cache, const Ti* __restrict__ latent,
                                       const Ti* __restrict__ k_pe,
                                       const int64_t* __restrict__ slots, int kv_lora, int rope,
                                       int64_t token_bytes) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  if (slots[t] < 0) return;  // a padding row (CUDA graph bucket): writes nothing
  const Ti* x = latent + t * kv_lora;
  const Ti* pe = k_pe + t * rope;
  store_fp8_slot(
      cache + slots[t] * token_bytes, [&](int c) { return to_f32(x[c]); },
      [&](int c) { return to_f32(pe[c]); }, kv_lora, rope);
}

template <typename Tc, typename Ti>
__global__ void cache_write_kernel(Tc* cache, const Ti* latent, const Ti* k_pe,
                                   const int64_t* __restrict__ slots, int kv_lora, int rope) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  if (slots[t] < 0) return;  // a padding row (CUDA graph bucket): writes nothing
  store_slot(
      cache + slots[t] * (kv_lora + rope),
      [&](int c) {
        return to_f32(c < kv_lora ? latent[t * kv_lora + c] : k_pe[t * rope + c - kv_lora]);
      },
      kv_lora + rope);
}

// mla_kv_write (ops/mla.h): one block (128 threads) per token. The row [kv_lora + rope] of kv is
// staged in shared memory as F32; the latent part is RMS-normalised in place (the sum of squares
// by block_sum, as rms_norm_kernel; w ⊙ (x · r)), the rope part rotated in place (rope_kernel's
// F32 arithmetic: angle = p · inv_freq[i], precise cosf/sinf · factor), then the row is written to
// the slot as cache_write_kernel / cache_write_fp8_kernel write it (a tile of 128 latent values a
// warp for FP8). Dynamic shared memory: (kv_lora + rope) floats.
template <typename Ti, typename W>
__device__ __forceinline__ void kv_stage_row(float* row, const Ti* kv, const W* w, int kv_lora,
                                             int rope, float eps, float p, const float* inv_freq,
                                             float factor, bool interleaved) {
  __shared__ float red[32];
  float ss = 0.0f;
  for (int c = threadIdx.x; c < kv_lora + rope; c += blockDim.x) {
    const float v = to_f32(kv[c]);
    row[c] = v;
    if (c < kv_lora) ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, red) / float(kv_lora) + eps);  // syncs: row is complete
  const int half = rope / 2;
  for (int c = threadIdx.x; c < kv_lora + half; c += blockDim.x) {
    if (c < kv_lora) {
      row[c] = to_f32(w[c]) * (row[c] * r);
    } else {
      const int i = c - kv_lora;
      float* v = row + kv_lora;
      rope_rotate(v[rope_first(i, half, interleaved)], v[rope_second(i, half, interleaved)],
                  rope_cs(p, inv_freq[i], factor));
    }
  }
  __syncthreads();
}

template <typename Tc, typename Ti, typename W>
__global__ void kv_write_kernel(Tc* __restrict__ cache, const Ti* __restrict__ kv,
                                const W* __restrict__ w, const int64_t* __restrict__ slots,
                                const int32_t* __restrict__ pos, const float* __restrict__ inv_freq,
                                int kv_lora, int rope, float eps, float factor, bool interleaved) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float row[];  // [kv_lora + rope]
  const int64_t t = blockIdx.x;
  if (slots[t] < 0) return;  // a padding row (CUDA graph bucket): writes nothing
  const int width = kv_lora + rope;
  kv_stage_row(row, kv + t * width, w, kv_lora, rope, eps, float(pos[t]), inv_freq, factor,
               interleaved);
  store_slot(
      cache + slots[t] * width, [&](int c) { return row[c]; }, width);
}

template <typename Ti, typename W>
__global__ void kv_write_fp8_kernel(uint8_t* __restrict__ cache, const Ti* __restrict__ kv,
                                    const W* __restrict__ w, const int64_t* __restrict__ slots,
                                    const int32_t* __restrict__ pos,
                                    const float* __restrict__ inv_freq, int kv_lora, int rope,
                                    float eps, float factor, bool interleaved,
                                    int64_t token_bytes) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float row[];  // [kv_lora + rope]
  const int64_t t = blockIdx.x;
  if (slots[t] < 0) return;
  kv_stage_row(row, kv + t * (kv_lora + rope), w, kv_lora, rope, eps, float(pos[t]), inv_freq,
               factor, interleaved);
  store_fp8_slot(
      cache + slots[t] * token_bytes, [&](int c) { return row[c]; },
      [&](int c) { return row[kv_lora + c]; }, kv_lora, rope);
}

__global__ void cumsum_kernel(int64_t* starts, const int32_t* seq_lens, int n_seqs) {
  pdl_wait();
  pdl_trigger();
  int64_t acc = 0;
  for (int s = 0; s < n_seqs; ++s) {
    starts[s] = acc;
    acc += seq_lens[s];
  }
  starts[n_seqs] = acc;
}

int64_t* kv_starts(const AttentionMeta& m) {
  auto* starts =
      static_cast<int64_t*>(scratch(kScratchGather, size_t(m.n_seqs + 1) * sizeof(int64_t)));
  launch_pdl(cumsum_kernel, 1, 1, 0, starts, m.seq_lens.ptr<int32_t>(), m.n_seqs);
  OSPREY_CUDA_LAUNCH_CHECK();
  return starts;
}

__device__ __forceinline__ int seq_of_row(const int64_t* starts, int n_seqs, int64_t row) {
  int lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (starts[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// out [Σ seq_lens, width] = the cached rows of every sequence in order, read through `rows`
// (dequantized for FP8). Grid [Σ seq_lens], 128 threads over the width.
template <typename To, typename R>
__global__ void cache_gather_kernel(To* out, R rows, const int64_t* starts, int n_seqs,
                                    const int32_t* block_table, int64_t max_blocks, int block_size,
                                    int width) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const int s = seq_of_row(starts, n_seqs, row);
  const int64_t src = cache_row(block_table, max_blocks, block_size, s, row - starts[s]);
  for (int c = threadIdx.x; c < width; c += blockDim.x)
    out[row * width + c] = from_f32<To>(rows(src, 0, c));
}

template <typename Tq, typename R>
__global__ void __launch_bounds__(kHeadsPerBlock * 32)
    mla_decode_kernel(float* __restrict__ part_o, float2* __restrict__ part_ml,
                      const Tq* __restrict__ q, R cache, const int32_t* __restrict__ qsl,
                      const int32_t* __restrict__ positions,
                      const int32_t* __restrict__ block_table, int64_t max_blocks, int block_size,
                      int n_seqs, const int32_t* __restrict__ topk, int64_t topk_k, int64_t H,
                      int64_t chunk, float scale) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float tile[];  // [kTile][kWidth]
  __shared__ int64_t rows[kTile];
  const int t = blockIdx.x, split = blockIdx.z, n_splits = gridDim.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t h = int64_t(blockIdx.y) * kHeadsPerBlock + warp;
  const int s = seq_of_token(qsl, n_seqs, t);
  const int64_t p = positions[t];
  const int64_t len = topk ? topk_k : p + 1;
  const int64_t i0 = int64_t(split) * chunk, i1 = min(len, i0 + chunk);

  float qv[kWidth / 32];
#pragma unroll
  for (int i = 0; i < kWidth / 32; ++i)
    qv[i] = to_f32(q[(t * H + h) * kWidth + lane + 32 * i]) * scale;
  float acc[kLat / 32];
#pragma unroll
  for (int i = 0; i < kLat / 32; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  for (int64_t base = i0; base < i1; base += kTile) {
    __syncthreads();
    if (threadIdx.x < kTile) {
      const int64_t i = base + threadIdx.x;
      int64_t j = -1;
      if (i < i1) j = topk ? int64_t(topk[int64_t(t) * topk_k + i]) : i;
      rows[threadIdx.x] =
          (j >= 0 && j <= p) ? cache_row(block_table, max_blocks, block_size, s, j) : -1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTile * kWidth; e += blockDim.x) {
      const int r = e / kWidth, c = e % kWidth;
      const int64_t row = rows[r];
      tile[e] = row >= 0 ? cache(row, 0, c) : 0.0f;
    }
    __syncthreads();
    for (int r = 0; r < kTile; ++r) {
      if (rows[r] < 0) continue;
      const float* kr = tile + r * kWidth;
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kWidth / 32; ++i) dot += qv[i] * kr[lane + 32 * i];
      dot = warp_sum(dot);
      const float m_new = fmaxf(m, dot);
      const float corr = expf(m - m_new), pj = expf(dot - m_new);
      l = l * corr + pj;
#pragma unroll
      for (int i = 0; i < kLat / 32; ++i) acc[i] = acc[i] * corr + pj * kr[lane + 32 * i];
      m = m_new;
    }
  }
  const int64_t part = (int64_t(t) * H + h) * n_splits + split;
#pragma unroll
  for (int i = 0; i < kLat / 32; ++i) part_o[part * kLat + lane + 32 * i] = acc[i];
  if (lane == 0) part_ml[part] = make_float2(m, l);
}

template <typename To>
__global__ void mla_combine_kernel(To* __restrict__ out, const float* __restrict__ part_o,
                                   const float2* __restrict__ part_ml, int n_splits) {
  pdl_wait();
  pdl_trigger();
  const int64_t th = blockIdx.x;  // token · H + head
  const float2* ml = part_ml + th * n_splits;
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, ml[s].x);
  float L = 0.0f;
  float o[kLat / 128] = {};
  for (int s = 0; s < n_splits; ++s) {
    if (ml[s].x == -INFINITY) continue;
    const float w = expf(ml[s].x - M);
    L += w * ml[s].y;
#pragma unroll
    for (int i = 0; i < kLat / 128; ++i)
      o[i] += w * part_o[(th * n_splits + s) * kLat + threadIdx.x + 128 * i];
  }
#pragma unroll
  for (int i = 0; i < kLat / 128; ++i)
    out[th * kLat + threadIdx.x + 128 * i] = from_f32<To>(o[i] / L);
}

template <typename Tq, typename Tk, typename To>
__global__ void __launch_bounds__(kHeadsPerBlock * 32)
    mla_prefill_kernel(To* __restrict__ out, const Tq* __restrict__ q, const Tk* __restrict__ k,
                       const Tk* __restrict__ v, const int64_t* __restrict__ starts,
                       const int32_t* __restrict__ qsl, const int32_t* __restrict__ positions,
                       int n_seqs, const int32_t* __restrict__ topk, int64_t topk_k, int64_t H,
                       float scale) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t h = int64_t(blockIdx.y) * kHeadsPerBlock + warp;
  const int s = seq_of_token(qsl, n_seqs, t);
  const int64_t p = positions[t], kv0 = starts[s];
  const int64_t len = topk ? topk_k : p + 1;
  float qv[kQk / 32];
#pragma unroll
  for (int i = 0; i < kQk / 32; ++i) qv[i] = to_f32(q[(t * H + h) * kQk + lane + 32 * i]) * scale;
  float acc[kV / 32] = {};
  float m = -INFINITY, l = 0.0f;
  for (int64_t i = 0; i < len; ++i) {
    const int64_t j = topk ? int64_t(topk[int64_t(t) * topk_k + i]) : i;
    if (j < 0 || j > p) continue;
    const Tk* kr = k + ((kv0 + j) * H + h) * kQk;
    const Tk* vr = v + ((kv0 + j) * H + h) * kV;
    float dot = 0.0f;
#pragma unroll
    for (int d = 0; d < kQk / 32; ++d) dot += qv[d] * to_f32(kr[lane + 32 * d]);
    float vv[kV / 32];
#pragma unroll
    for (int d = 0; d < kV / 32; ++d) vv[d] = to_f32(vr[lane + 32 * d]);
    dot = warp_sum(dot);
    const float m_new = fmaxf(m, dot);
    const float corr = expf(m - m_new), pj = expf(dot - m_new);
    l = l * corr + pj;
#pragma unroll
    for (int d = 0; d < kV / 32; ++d) acc[d] = acc[d] * corr + pj * vv[d];
    m = m_new;
  }
#pragma unroll
  for (int d = 0; d < kV / 32; ++d)
    out[(t * H + h) * kV + lane + 32 * d] = from_f32<To>(acc[d] / l);
}

// Generic-shape attention (any latent / rope / head dims and head count: the small test models),
// correctness first. Grid [n_tokens, H], 128 threads. Scores go to an F32 scratch row per
// (token, head) of max_len entries (−inf for positions not attended): a warp per entry computes
// the dot product; then the block max and sum; then each thread owns output columns and sums
// softmax-weighted rows. Absorbed: K = V = the cache row (V its first `lat` columns).
// Expanded: K [Σ seq_lens, H, qk], V [Σ seq_lens, H, vd] rows of the sequence (starts = cumsum).
// K and V are read through row readers (Rows / Fp8Rows above).
constexpr int kGenericThreads = 128;

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return warp_max(lane < n_warps ? red[lane] : -INFINITY);
}

template <typename Tq, typename RK, typename RV, typename To>
__global__ void __launch_bounds__(kGenericThreads)
    mla_generic_kernel(To* __restrict__ out, float* __restrict__ scores, int64_t ld,
                       const Tq* __restrict__ q, RK k, RV v, int64_t qk, int64_t vd,
                       const int32_t* __restrict__ qsl, const int32_t* __restrict__ positions,
                       int n_seqs, const int32_t* __restrict__ block_table, int64_t max_blocks,
                       int block_size, const int64_t* __restrict__ starts,
                       const int32_t* __restrict__ topk, int64_t topk_k, int64_t H, float scale) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  const int t = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
  const int s = seq_of_token(qsl, n_seqs, t);
  const int64_t p = positions[t];
  const int64_t len = topk ? topk_k : p + 1;
  float* sc = scores + (int64_t(t) * H + h) * ld;
  const Tq* qr = q + (int64_t(t) * H + h) * qk;
  // Row of K/V for attended entry i, or −1. Paged (absorbed: block_table) or contiguous (starts).
  auto row_of = [&](int64_t i) -> int64_t {
    const int64_t j = topk ? int64_t(topk[int64_t(t) * topk_k + i]) : i;
    if (j < 0 || j > p) return -1;
    return block_table ? cache_row(block_table, max_blocks, block_size, s, j) : (starts[s] + j);
  };
  for (int64_t i = warp; i < len; i += n_warps) {
    const int64_t row = row_of(i);
    float dot = 0.0f;
    if (row >= 0)
      for (int64_t d = lane; d < qk; d += 32) dot += to_f32(qr[d]) * k(row, h, d);
    dot = warp_sum(dot);
    if (lane == 0) sc[i] = row >= 0 ? dot * scale : -INFINITY;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) mx = fmaxf(mx, sc[i]);
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
    sum += sc[i] == -INFINITY ? 0.0f : expf(sc[i] - mx);
  sum = block_sum(sum, red);
  for (int64_t c = threadIdx.x; c < vd; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < len; ++i) {
      if (sc[i] == -INFINITY) continue;
      const int64_t row = row_of(i);
      acc += expf(sc[i] - mx) * v(row, h, c);
    }
    out[(int64_t(t) * H + h) * vd + c] = from_f32<To>(acc / sum);
  }
}

template <typename Tq, typename RK, typename RV, typename To>
void launch_generic(Tensor out, Tensor q, RK k, RV v, int64_t vd, const AttentionMeta& m,
                    Tensor topk_indices, float scale, bool paged) {
  const int64_t H = q.size(1), qk = q.size(2);
  const bool sparse = topk_indices.data != nullptr;
  const int64_t topk_k = sparse ? topk_indices.size(1) : 0;
  const int64_t ld = sparse ? topk_k : m.block_table.size(1) * m.block_size;
  auto* scores =
      static_cast<float*>(scratch(kScratchAttnPartO, size_t(m.n_tokens * H * ld) * sizeof(float)));
  const int64_t* starts = paged ? nullptr : kv_starts(m);
  launch_pdl(mla_generic_kernel<Tq, RK, RV, To>, dim3(unsigned(m.n_tokens), unsigned(H)),
             kGenericThreads, 0, static_cast<To*>(out.data), scores, ld,
             static_cast<const Tq*>(q.data), k, v, qk, vd, m.query_start_loc.ptr<int32_t>(),
             m.positions.ptr<int32_t>(), m.n_seqs, paged ? m.block_table.ptr<int32_t>() : nullptr,
             m.block_table.size(1), m.block_size, starts,
             sparse ? topk_indices.ptr<int32_t>() : nullptr, topk_k, H, scale);
  OSPREY_CUDA_LAUNCH_CHECK();
}

void check_meta(const AttentionMeta& m, const char* op) {
  check_device(m.query_start_loc, op, "query_start_loc");
  check_device(m.positions, op, "positions");
  check_device(m.seq_lens, op, "seq_lens");
}

// q's rope for absorb_q_impl to apply as it splits q (pos == nullptr: none).
struct SplitRope {
  const int32_t* pos = nullptr;
  const float* inv_freq = nullptr;
  float factor = 1.0f;
  bool interleaved = false;
};
// Whether absorb_q_impl takes split_q_kernel (a BF16 kv_b with an F32 q).
bool absorb_splits_q(const Tensor& q, const Tensor& kv_b) {
  return kv_b.dtype == DType::BF16 && q.dtype == DType::F32;
}
// mla_absorb_q, with q's rope applied by split_q_kernel when rp.pos is given.
void absorb_q_impl(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v, SplitRope rp) {
  check_device(q, "mla_absorb_q", "q");
  check_device(kv_b, "mla_absorb_q", "kv_b");
  const int64_t n = q.size(0), H = q.size(1), qk = q.size(2), rope = qk - nope;
  const int64_t kv_lora = kv_b.size(1), width = q_abs.size(2);
  OSPREY_CHECK(width == kv_lora + rope && kv_b.size(0) == H * (nope + v) && q_abs.size(0) == n &&
                   q_abs.size(1) == H && is_f32_or_bf16(kv_b.dtype) && is_f32_or_bf16(q.dtype) &&
                   (q_abs.dtype == DType::F32 || kv_b.dtype == DType::BF16),
               "mla_absorb_q shapes/dtypes");
  if (n == 0) return;
  LtOperand a{kv_b.data, lt_type(kv_b.dtype), false, kv_lora, (nope + v) * kv_lora};
  if (absorb_splits_q(q, kv_b)) {
    auto* q_nope = static_cast<bf16*>(
        scratch(kScratchGemmX, size_t(n * H * nope) * sizeof(bf16)));  // [n, H, nope]
    OSPREY_DISPATCH_FLOAT(q_abs.dtype, To, {
      launch_pdl(split_q_kernel<To>, int(std::min<int64_t>((n * H * qk + 255) / 256, 65536)), 256,
                 0, q_nope, static_cast<To*>(q_abs.data), q.f32(), n * H, int(qk), nope, int(width),
                 int(kv_lora), rp.pos, rp.inv_freq, H, rp.factor, rp.interleaved);
    });
    OSPREY_CUDA_LAUNCH_CHECK();
    LtOperand b{q_nope, CUDA_R_16BF, false, H * nope, nope};
    OSPREY_CHECK(lt_matmul(kv_lora, n, nope, a, b, q_abs.data, lt_type(q_abs.dtype), H * width,
                           width, int(H)),
                 "cuBLASLt refused the batched absorb GEMM");
    return;
  }
  LtOperand b{as_dtype(q, kv_b.dtype, kScratchGemmX), lt_type(kv_b.dtype), false, H * qk, qk};
  OSPREY_CHECK(
      lt_matmul(kv_lora, n, nope, a, b, q_abs.data, lt_type(q_abs.dtype), H * width, width, int(H)),
      "cuBLASLt refused the batched absorb GEMM");
  OSPREY_DISPATCH_FLOAT(q_abs.dtype, To, OSPREY_DISPATCH_FLOAT(q.dtype, Ti, {
                          launch_pdl(copy_rope_kernel<To, Ti>,
                                     int(std::min<int64_t>((n * H * rope + 255) / 256, 65536)), 256,
                                     0, static_cast<To*>(q_abs.data),
                                     static_cast<const Ti*>(q.data), n * H, int(qk), nope,
                                     int(width), int(kv_lora));
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}
}  // namespace

void mla_absorb_q(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v) {
  absorb_q_impl(q_abs, q, kv_b, nope, v, {});
}

void mla_absorb_q_rope(Tensor q_abs, Tensor q, Tensor kv_b, int nope, int v, Tensor positions,
                       Tensor inv_freq, float attention_factor, bool interleaved) {
  check_device(positions, "mla_absorb_q_rope", "positions");
  check_device(inv_freq, "mla_absorb_q_rope", "inv_freq");
  const int64_t rope_dim = q.size(-1) - nope;
  OSPREY_CHECK(q.dim() == 3 && rope_dim > 0 && rope_dim % 2 == 0 &&
                   inv_freq.numel() * 2 == rope_dim && inv_freq.dtype == DType::F32 &&
                   positions.numel() == q.size(0) && positions.dtype == DType::I32,
               "mla_absorb_q_rope: q ", shape_str(q.shape), " with nope ", nope, ", inv_freq of ",
               inv_freq.numel(), ", ", positions.numel(), " positions");
  if (!absorb_splits_q(q, kv_b)) {  // no split kernel to rotate in: the composition
    cuda::rope(q, nope, int(rope_dim), positions, inv_freq, attention_factor, interleaved);
    absorb_q_impl(q_abs, q, kv_b, nope, v, {});
    return;
  }
  absorb_q_impl(q_abs, q, kv_b, nope, v,
                {positions.ptr<int32_t>(), inv_freq.f32(), attention_factor, interleaved});
}

void mla_unabsorb_out(Tensor out, Tensor o_lat, Tensor kv_b, int nope) {
  check_device(o_lat, "mla_unabsorb_out", "o_lat");
  check_device(kv_b, "mla_unabsorb_out", "kv_b");
  const int64_t n = o_lat.size(0), H = o_lat.size(1), kv_lora = o_lat.size(2), v = out.size(2);
  OSPREY_CHECK(kv_b.size(0) == H * (nope + v) && kv_b.size(1) == kv_lora &&
                   is_f32_or_bf16(kv_b.dtype) && is_f32_or_bf16(o_lat.dtype) &&
                   (out.dtype == DType::F32 || kv_b.dtype == DType::BF16),
               "mla_unabsorb shapes/dtypes");
  if (n == 0) return;
  const int64_t esz = int64_t(dtype_size(kv_b.dtype));
  LtOperand a{static_cast<const char*>(kv_b.data) + nope * kv_lora * esz, lt_type(kv_b.dtype), true,
              kv_lora, (nope + v) * kv_lora};
  LtOperand b{as_dtype(o_lat, kv_b.dtype, kScratchGemmX), lt_type(kv_b.dtype), false, H * kv_lora,
              kv_lora};
  OSPREY_CHECK(lt_matmul(v, n, kv_lora, a, b, out.data, lt_type(out.dtype), H * v, v, int(H)),
               "cuBLASLt refused the batched unabsorb GEMM");
}

void mla_cache_write(Tensor latent_cache, Tensor latent, Tensor k_pe, const AttentionMeta& m) {
  check_device(latent, "mla_cache_write", "latent");
  check_device(k_pe, "mla_cache_write", "k_pe");
  check_device(m.slot_mapping, "mla_cache_write", "slot_mapping");
  const int64_t kv_lora = latent.size(-1), rope = k_pe.size(-1), width = latent_cache.size(-1);
  if (latent_cache.dtype == DType::U8) {
    OSPREY_CHECK(mla_fp8_supported(kv_lora, rope) && width == mla_fp8_token_bytes(kv_lora, rope) &&
                     latent.dtype == k_pe.dtype,
                 "FP8 latent cache row of ", width, " bytes for ", kv_lora, " + ", rope);
    if (m.n_tokens == 0) return;
    OSPREY_DISPATCH_FLOAT(latent.dtype, Ti, {
      launch_pdl(cache_write_fp8_kernel<Ti>, m.n_tokens, 128, 0,
                 static_cast<uint8_t*>(latent_cache.data), static_cast<const Ti*>(latent.data),
                 static_cast<const Ti*>(k_pe.data), m.slot_mapping.ptr<int64_t>(), int(kv_lora),
                 int(rope), width);
    });
    OSPREY_CUDA_LAUNCH_CHECK();
    return;
  }
  OSPREY_CHECK(width == kv_lora + rope && latent.dtype == k_pe.dtype, "latent cache width ", width);
  if (m.n_tokens == 0) return;
  OSPREY_DISPATCH_FLOAT(latent_cache.dtype, Tc, OSPREY_DISPATCH_FLOAT(latent.dtype, Ti, {
                          launch_pdl(cache_write_kernel<Tc, Ti>, m.n_tokens, 128, 0,
                                     static_cast<Tc*>(latent_cache.data),
                                     static_cast<const Ti*>(latent.data),
                                     static_cast<const Ti*>(k_pe.data),
                                     m.slot_mapping.ptr<int64_t>(), int(kv_lora), int(rope));
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

void mla_kv_write(Tensor latent_cache, Tensor kv, Tensor norm_w, float eps, Tensor inv_freq,
                  float attention_factor, bool interleaved, const AttentionMeta& m) {
  check_device(kv, "mla_kv_write", "kv");
  check_device(norm_w, "mla_kv_write", "norm_w");
  check_device(inv_freq, "mla_kv_write", "inv_freq");
  check_device(m.slot_mapping, "mla_kv_write", "slot_mapping");
  check_device(m.positions, "mla_kv_write", "positions");
  const int64_t width = kv.size(-1), kv_lora = norm_w.numel(), rope = width - kv_lora;
  OSPREY_CHECK(kv.dim() == 2 && kv.size(0) == m.n_tokens && rope > 0 && rope % 2 == 0 &&
                   inv_freq.numel() * 2 == rope && inv_freq.dtype == DType::F32 &&
                   is_f32_or_bf16(kv.dtype) && is_f32_or_bf16(norm_w.dtype) && width <= 4096,
               "mla_kv_write: kv ", shape_str(kv.shape), " ", dtype_name(kv.dtype),
               ", norm weight of ", kv_lora, ", inv_freq of ", inv_freq.numel());
  const size_t smem = size_t(width) * sizeof(float);
  if (latent_cache.dtype == DType::U8) {
    const int64_t token_bytes = latent_cache.size(-1);
    OSPREY_CHECK(
        mla_fp8_supported(kv_lora, rope) && token_bytes == mla_fp8_token_bytes(kv_lora, rope),
        "FP8 latent cache row of ", token_bytes, " bytes for ", kv_lora, " + ", rope);
    if (m.n_tokens == 0) return;
    OSPREY_DISPATCH_FLOAT(
        kv.dtype, Ti, OSPREY_DISPATCH_FLOAT(norm_w.dtype, W, {
          launch_pdl(kv_write_fp8_kernel<Ti, W>, m.n_tokens, 128, smem,
                     static_cast<uint8_t*>(latent_cache.data), static_cast<const Ti*>(kv.data),
                     static_cast<const W*>(norm_w.data), m.slot_mapping.ptr<int64_t>(),
                     m.positions.ptr<int32_t>(), inv_freq.f32(), int(kv_lora), int(rope), eps,
                     attention_factor, interleaved, token_bytes);
        }));
    OSPREY_CUDA_LAUNCH_CHECK();
    return;
  }
  OSPREY_CHECK(latent_cache.size(-1) == width, "latent cache width ", latent_cache.size(-1),
               " for kv rows of ", width);
  if (m.n_tokens == 0) return;
  OSPREY_DISPATCH_FLOAT(
      latent_cache.dtype, Tc,
      OSPREY_DISPATCH_FLOAT(
          kv.dtype, Ti, OSPREY_DISPATCH_FLOAT(norm_w.dtype, W, {
            launch_pdl(kv_write_kernel<Tc, Ti, W>, m.n_tokens, 128, smem,
                       static_cast<Tc*>(latent_cache.data), static_cast<const Ti*>(kv.data),
                       static_cast<const W*>(norm_w.data), m.slot_mapping.ptr<int64_t>(),
                       m.positions.ptr<int32_t>(), inv_freq.f32(), int(kv_lora), int(rope), eps,
                       attention_factor, interleaved);
          })));
  OSPREY_CUDA_LAUNCH_CHECK();
}

void mla_cache_gather(Tensor out, Tensor latent_cache, const AttentionMeta& m) {
  check_device(latent_cache, "mla_cache_gather", "latent_cache");
  check_meta(m, "mla_cache_gather");
  const int64_t width = out.size(-1), rows = out.size(0);
  int64_t kv_lora = width;
  if (latent_cache.dtype == DType::U8) {
    const int64_t rope = mla_fp8_rope_dim(latent_cache.size(-1), width);
    OSPREY_CHECK(rope >= 0, "FP8 latent cache row of ", latent_cache.size(-1),
                 " bytes cannot hold ", width, " values");
    kv_lora = width - rope;
  } else {
    OSPREY_CHECK(latent_cache.size(-1) == width, "gather width");
  }
  if (rows == 0) return;
  const int64_t* starts = kv_starts(m);
  with_latent_rows(latent_cache, kv_lora, [&](auto reader) {
    OSPREY_DISPATCH_FLOAT(out.dtype, To, {
      launch_pdl(cache_gather_kernel<To, decltype(reader)>, unsigned(rows), 128, 0,
                 static_cast<To*>(out.data), reader, starts, m.n_seqs, m.block_table.ptr<int32_t>(),
                 m.block_table.size(1), m.block_size, int(width));
    });
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void mla_attention_absorbed(Tensor out, Tensor q, Tensor latent_cache, const AttentionMeta& m,
                            Tensor topk_indices, float scale, Tensor lse) {
  check_device(q, "mla_attention_absorbed", "q");
  check_device(latent_cache, "mla_attention_absorbed", "latent_cache");
  check_meta(m, "mla_attention_absorbed");
  const int64_t H = q.size(1), width = q.size(2), kv_lora = out.size(2);
  OSPREY_CHECK(out.size(0) == m.n_tokens && out.size(1) == H && kv_lora < width,
               "absorbed MLA shapes");
  if (latent_cache.dtype == DType::U8)
    OSPREY_CHECK(mla_fp8_supported(kv_lora, width - kv_lora) &&
                     latent_cache.size(-1) == mla_fp8_token_bytes(kv_lora, width - kv_lora),
                 "FP8 latent cache row of ", latent_cache.size(-1), " bytes for ", kv_lora, " + ",
                 width - kv_lora);
  else
    OSPREY_CHECK(latent_cache.size(-1) == width, "absorbed MLA cache width");
  if (lse.data) check_device(lse, "mla_attention_absorbed", "lse");
  OSPREY_CHECK(lse.data == nullptr || (lse.dtype == DType::F32 && lse.numel() == m.n_tokens * H),
               "absorbed MLA lse must be F32 [n_tokens, H]");
  if (mla_decode_sm90_supported(out, q, latent_cache, m)) {
    mla_decode_sm90(out, q, latent_cache, m, topk_indices, scale, lse);
    return;
  }
  // The CUDA-core kernels below (F32 caches, other shapes) do not produce the lse.
  OSPREY_CHECK(lse.data == nullptr,
               "absorbed MLA lse needs the sm90 kernel (BF16 or FP8 cache of 512 + 64)");
  if (width != kWidth || kv_lora != kLat || H % kHeadsPerBlock != 0) {
    if (m.n_tokens == 0) return;
    with_latent_rows(latent_cache, kv_lora, [&](auto reader) {
      using R = decltype(reader);
      OSPREY_DISPATCH_FLOAT(q.dtype, Tq, OSPREY_DISPATCH_FLOAT(out.dtype, To, {
                              launch_generic<Tq, R, R, To>(out, q, reader, reader, kv_lora, m,
                                                           topk_indices, scale,
                                                           /*paged=*/true);
                            }));
    });
    return;
  }
  if (m.n_tokens == 0) return;
  const bool sparse = topk_indices.data != nullptr;
  const int64_t topk_k = sparse ? topk_indices.size(1) : 0;
  const int64_t max_len = sparse ? topk_k : m.block_table.size(1) * m.block_size;
  int64_t chunk = std::max(kMinChunk, (max_len + kMaxSplits - 1) / kMaxSplits);
  int64_t n_splits = (max_len + chunk - 1) / chunk;
  const int64_t per_split = m.n_tokens * H * (kLat + 2) * int64_t(sizeof(float));
  while (n_splits > 1 && size_t(per_split * n_splits) > kMaxPartialBytes) {
    chunk *= 2;
    n_splits = (max_len + chunk - 1) / chunk;
  }
  chunk = (chunk + kTile - 1) / kTile * kTile;
  auto* part_o = static_cast<float*>(
      scratch(kScratchAttnPartO, size_t(m.n_tokens * H * n_splits * kLat) * sizeof(float)));
  auto* part_ml = static_cast<float2*>(
      scratch(kScratchAttnPartML, size_t(m.n_tokens * H * n_splits) * sizeof(float2)));
  const dim3 grid(unsigned(m.n_tokens), unsigned(H / kHeadsPerBlock), unsigned(n_splits));
  const size_t smem = size_t(kTile) * kWidth * sizeof(float);
  with_latent_rows(latent_cache, kv_lora, [&](auto reader) {
    OSPREY_DISPATCH_FLOAT(q.dtype, Tq, {
      launch_pdl(mla_decode_kernel<Tq, decltype(reader)>, grid, kHeadsPerBlock * 32, smem, part_o,
                 part_ml, static_cast<const Tq*>(q.data), reader, m.query_start_loc.ptr<int32_t>(),
                 m.positions.ptr<int32_t>(), m.block_table.ptr<int32_t>(), m.block_table.size(1),
                 m.block_size, m.n_seqs, sparse ? topk_indices.ptr<int32_t>() : nullptr, topk_k, H,
                 chunk, scale);
    });
  });
  OSPREY_CUDA_LAUNCH_CHECK();
  OSPREY_DISPATCH_FLOAT(out.dtype, To, {
    launch_pdl(mla_combine_kernel<To>, unsigned(m.n_tokens * H), 128, 0, static_cast<To*>(out.data),
               part_o, part_ml, int(n_splits));
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void mla_attention_expanded(Tensor out, Tensor q, Tensor k, Tensor v, const AttentionMeta& m,
                            Tensor topk_indices, float scale) {
  check_device(q, "mla_attention_expanded", "q");
  check_device(k, "mla_attention_expanded", "k");
  check_device(v, "mla_attention_expanded", "v");
  check_meta(m, "mla_attention_expanded");
  const int64_t H = q.size(1);
  if (q.size(2) != kQk || v.size(2) != kV || H % kHeadsPerBlock != 0) {
    const int64_t qk = q.size(2), vd = v.size(2);
    OSPREY_CHECK(k.size(1) == H && k.size(2) == qk && v.size(1) == H && out.size(2) == vd &&
                     k.dtype == v.dtype,
                 "expanded MLA shapes");
    if (m.n_tokens == 0) return;
    OSPREY_DISPATCH_FLOAT(
        q.dtype, Tq,
        OSPREY_DISPATCH_FLOAT(k.dtype, Tk, OSPREY_DISPATCH_FLOAT(out.dtype, To, {
                                launch_generic<Tq, Rows<Tk>, Rows<Tk>, To>(
                                    out, q, Rows<Tk>{static_cast<const Tk*>(k.data), H * qk, qk},
                                    Rows<Tk>{static_cast<const Tk*>(v.data), H * vd, vd}, vd, m,
                                    topk_indices, scale,
                                    /*paged=*/false);
                              })));
    return;
  }
  OSPREY_CHECK(q.size(2) == kQk && k.size(1) == H && k.size(2) == kQk && v.size(1) == H &&
                   v.size(2) == kV && out.size(2) == kV && k.dtype == v.dtype &&
                   H % kHeadsPerBlock == 0,
               "expanded MLA shapes (CUDA: qk 192, v 128, heads a multiple of 8)");
  if (m.n_tokens == 0) return;
  const bool sparse = topk_indices.data != nullptr;
  const int64_t* starts = kv_starts(m);
  const dim3 grid(unsigned(m.n_tokens), unsigned(H / kHeadsPerBlock));
  OSPREY_DISPATCH_FLOAT(
      q.dtype, Tq,
      OSPREY_DISPATCH_FLOAT(
          k.dtype, Tk, OSPREY_DISPATCH_FLOAT(out.dtype, To, {
            launch_pdl(mla_prefill_kernel<Tq, Tk, To>, grid, kHeadsPerBlock * 32, 0,
                       static_cast<To*>(out.data), static_cast<const Tq*>(q.data),
                       static_cast<const Tk*>(k.data), static_cast<const Tk*>(v.data), starts,
                       m.query_start_loc.ptr<int32_t>(), m.positions.ptr<int32_t>(), m.n_seqs,
                       sparse ? topk_indices.ptr<int32_t>() : nullptr,
                       sparse ? topk_indices.size(1) : 0, H, scale);
          })));
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
