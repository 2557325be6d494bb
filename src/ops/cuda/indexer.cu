// CUDA lightning indexer (contract in ops/indexer.h).
//   indexer_cache_write: index_cache[slot_mapping[t]] = k[t]; grid [n_tokens] × 128 threads.
//   indexer_topk, two kernels:
//   1. indexer_score_kernel: I[t, j] = Σ_h w[t, h] · relu(scale · q[t, h]·k_j) for j ≤ p into an
//   F32
//      scratch [n_tokens, max_blocks · block_size]. Grid [n_tokens, ceil(max_len / 64)], 256
//      threads: q[t] (IH × ID, F32) and a tile of 64 keys (rows padded to ID + 1 floats: no bank
//      conflicts) in shared memory; thread (j = tid % 64, head group tid / 64) sums IH/4 heads,
//      then the four groups are added. IH = 64, ID = 128 (V3.2) are compile-time.
//   2. indexer_topk_kernel: per token (grid [n_tokens], 1024 threads), a 4-pass 8-bit radix select
//      over the order-preserving integer keys of the scores (shared-memory histogram, the bin
//      found by one warp's prefix sum) finds the k-th largest key T and how many ties at T to take;
//      an ordered block-scan compaction then writes the positions with key > T and the first
//      (lowest-j) ties, ascending in j. When p + 1 ≤ k: 0..p, then −1 padding.
//   With q U8 (e4m3 from indexer_quantize_q) and the FP8 cache at 64 × 128, block 64, on sm_90
//   the scores come from the tensor-core kernel of indexer/logits_sm90.cu instead of step 1.
//   indexer_quantize_q: grid [ceil(n_tokens · IH / 4)], 128 threads, a warp per (t, h) row.
//   indexer_q_prep: the same grid, q's rope and the weights' scale before the quantisation.
//   indexer_k_write: grid [n_tokens] × 128 threads, layer_norm + rope + the cache write of a key.
// Other IH × ID (the small test models) take indexer_score_generic_kernel (a thread per key).
// Dtypes: q F32 or BF16; weights F32; k F32 or BF16; index_cache F32, BF16 or U8 = the FP8 format
// of ops/indexer.h (per token ID e4m3 values + an fp32 power-of-two scale, values then scales per
// block). FP8: index_write_fp8_kernel (grid [n_tokens], 128 threads) takes amax|k| over the token,
// the scale and the RNE saturating e4m3 values, bit-identical to the CPU twin; the score kernels
// read keys through an accessor (PlainKeys / Fp8Keys) that dequantizes to F32 on load (value · s,
// exact), so the scoring arithmetic is the same for every format.
#include <cub/block/block_scan.cuh>

#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/indexer/logits_sm90.cuh"
#include "ops/cuda/layer_norm.cuh"
#include "ops/cuda/rope.cuh"
#include "ops/indexer.h"

namespace osprey::ops::cuda {

namespace {
constexpr int kIH = 64, kID = 128;
constexpr int kScoreTile = 64;      // key positions per block
constexpr int kScoreThreads = 256;  // 4 head groups × 64 positions
constexpr int kTopkThreads = 1024;

// q element as F32: F32, BF16, or an e4m3 byte (U8 q of indexer_quantize_q).
template <typename T>
__device__ __forceinline__ float q_f32(T v) {
  return to_f32(v);
}
template <>
__device__ __forceinline__ float q_f32<uint8_t>(uint8_t v) {
  return e4m3_to_f32_dev(v);
}

// indexer_quantize_q (ops/indexer.h): a warp per (t, h) row of ID values, bit-identical to the CPU.
// indexer_fp8_scale (ops/indexer.h), bit for bit: max(amax, 1e-4) / 448 rounded up to a power of
// two (q's rows and the key cache's tokens alike).
__device__ __forceinline__ float fp8_scale(float amax) {
  const float s0 = __fdiv_rn(amax > 1e-4f ? amax : 1e-4f, 448.0f);
  uint32_t u = __float_as_uint(s0);
  if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x800000u;
  return __uint_as_float(u);
}

// One token's key into its slot of the FP8 cache (ops/indexer.h's format) by the whole block:
// amax over the d values value(c) (a block max through red, 32 floats of shared memory), the
// power-of-two scale, the RNE saturating e4m3 values, then the scale after the block's values.
template <typename V>
__device__ __forceinline__ void store_key_fp8(uint8_t* __restrict__ cache, int64_t slot, int bs,
                                              int d, float* red, V value) {
  float amax = 0.0f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) amax = fmaxf(amax, fabsf(value(c)));
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) amax = fmaxf(amax, red[i]);
  const float s = fp8_scale(amax);
  const int64_t b = slot / bs, o = slot % bs;
  uint8_t* blk = cache + b * bs * int64_t(d + 4);
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    blk[o * d + c] = f32_to_e4m3_dev(__fdiv_rn(value(c), s));
  if (threadIdx.x == 0) *reinterpret_cast<float*>(blk + int64_t(bs) * d + 4 * o) = s;
}

template <typename Tq>
__global__ void indexer_quantize_q_kernel(uint8_t* __restrict__ q8, float* __restrict__ w_out,
                                          const Tq* __restrict__ q, const float* __restrict__ w,
                                          int64_t rows, int id) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const Tq* x = q + r * id;
  float amax = 0.0f;
  for (int c = lane; c < id; c += 32) amax = fmaxf(amax, fabsf(to_f32(x[c])));
  amax = warp_max(amax);
  const float s = fp8_scale(amax);
  for (int c = lane; c < id; c += 32) q8[r * id + c] = f32_to_e4m3_dev(__fdiv_rn(to_f32(x[c]), s));
  if (lane == 0) w_out[r] = w[r] * s;
}

template <typename Tc, typename Tk>
__global__ void index_write_kernel(Tc* cache, const Tk* k, const int64_t* __restrict__ slots,
                                   int d) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  if (slots[t] < 0) return;  // a padding row (CUDA graph bucket): writes nothing
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    cache[slots[t] * d + c] = from_f32<Tc>(to_f32(k[t * d + c]));
}

// indexer_k_write (ops/indexer.h): one block of kKWriteThreads a token. The row of d values in
// shared memory as F32: layer_norm (layer_norm_kernel's arithmetic: mean, then the biased variance
// of x − mean, two block sums), the half-split rope on [0, rope) (rope.cuh), then the write: FP8
// (Tc = uint8_t: amax over the row, the power-of-two scale, RNE e4m3 values, as
// index_write_fp8_kernel) or plain (Tc F32/BF16). A padding slot (−1) writes nothing.
constexpr int kKWriteThreads = 128;
template <typename Tc, typename Tk, typename W>
__global__ void __launch_bounds__(kKWriteThreads)
    index_k_write_kernel(Tc* __restrict__ cache, const Tk* __restrict__ k, const W* __restrict__ w,
                         const W* __restrict__ b, const int64_t* __restrict__ slots,
                         const int32_t* __restrict__ pos, const float* __restrict__ inv_freq, int d,
                         int rope, float eps, float factor, int bs) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float row[];  // [d]
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  if (slots[t] < 0) return;  // the whole block leaves before any barrier
  layer_norm_row(k + t * d, w, b, d, eps, red, [&](int64_t c, float y) { row[c] = y; });
  __syncthreads();
  const int half = rope / 2;
  const float p = float(pos[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    rope_rotate(row[i], row[i + half], rope_cs(p, inv_freq[i], factor));
  __syncthreads();
  if constexpr (std::is_same_v<Tc, uint8_t>) {
    store_key_fp8(cache, slots[t], bs, d, red, [&](int c) { return row[c]; });
  } else {
    for (int c = threadIdx.x; c < d; c += blockDim.x)
      cache[slots[t] * d + c] = from_f32<Tc>(row[c]);
  }
}

// indexer_q_prep (ops/indexer.h): a warp per (t, h) row of id ≤ kQPrepMaxId values, kQPrepRows
// rows a block; the row in the warp's shared memory as F32, the half-split rope on [0, rope), then
// indexer_quantize_q_kernel's arithmetic with the weight w[r] · weights_scale (F32 product).
constexpr int kQPrepRows = 4, kQPrepMaxId = 256;
template <typename Tq>
__global__ void __launch_bounds__(32 * kQPrepRows)
    indexer_q_prep_kernel(uint8_t* __restrict__ q8, float* __restrict__ w_out,
                          const Tq* __restrict__ q, const float* __restrict__ w, float w_scale,
                          const int32_t* __restrict__ pos, const float* __restrict__ inv_freq,
                          int64_t rows, int ih, int id, int rope, float factor) {
  pdl_wait();
  pdl_trigger();
  __shared__ float buf[kQPrepRows][kQPrepMaxId];
  const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kQPrepRows + wi;
  if (r >= rows) return;  // whole warps; no block barrier below
  float* v = buf[wi];
  const Tq* x = q + r * id;
  for (int c = lane; c < id; c += 32) v[c] = to_f32(x[c]);
  __syncwarp();
  const int half = rope / 2;
  const float p = float(pos[r / ih]);
  for (int i = lane; i < half; i += 32)
    rope_rotate(v[i], v[i + half], rope_cs(p, inv_freq[i], factor));
  __syncwarp();
  float amax = 0.0f;
  for (int c = lane; c < id; c += 32) amax = fmaxf(amax, fabsf(v[c]));
  amax = warp_max(amax);
  const float s = fp8_scale(amax);
  for (int c = lane; c < id; c += 32) q8[r * id + c] = f32_to_e4m3_dev(__fdiv_rn(v[c], s));
  if (lane == 0) w_out[r] = (w[r] * w_scale) * s;
}

// Key accessors: element c of cache row `row` (= block · block_size + offset) as F32.
template <typename T>
struct PlainKeys {
  const T* __restrict__ p;
  int id;
  __device__ __forceinline__ float operator()(int64_t row, int c) const {
    return to_f32(p[row * id + c]);
  }
};
struct Fp8Keys {
  const uint8_t* __restrict__ p;
  int bs, id;
  __device__ __forceinline__ float operator()(int64_t row, int c) const {
    const int64_t b = row / bs, o = row % bs;
    const uint8_t* blk = p + b * bs * int64_t(id + 4);
    const float s = *reinterpret_cast<const float*>(blk + int64_t(bs) * id + 4 * o);
    return e4m3_to_f32_dev(blk[o * id + c]) * s;
  }
};

// FP8 write: one block of 128 threads per token (d any width).
template <typename Tk>
__global__ void index_write_fp8_kernel(uint8_t* __restrict__ cache, const Tk* __restrict__ k,
                                       const int64_t* __restrict__ slots, int d, int bs) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  // A padding row (CUDA graph bucket) writes nothing: the whole block leaves before any barrier.
  if (slots[t] < 0) return;
  store_key_fp8(cache, slots[t], bs, d, red, [&](int c) { return to_f32(k[t * d + c]); });
}

template <typename Tq, typename KC>
__global__ void __launch_bounds__(kScoreThreads)
    indexer_score_kernel(float* __restrict__ scores, int64_t ld, const Tq* __restrict__ q,
                         const float* __restrict__ weights, KC keys,
                         const int32_t* __restrict__ qsl, const int32_t* __restrict__ positions,
                         const int32_t* __restrict__ block_table, int64_t max_blocks,
                         int block_size, int n_seqs, float scale) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float smem[];
  float* qs = smem;                           // [kIH][kID]
  float* ks = smem + kIH * kID;               // [kScoreTile][kID + 1]
  float* part = ks + kScoreTile * (kID + 1);  // [4][kScoreTile]
  const int t = blockIdx.x;
  const int64_t base = int64_t(blockIdx.y) * kScoreTile;
  const int64_t p = positions[t];
  if (base > p) return;
  const int s = seq_of_token(qsl, n_seqs, t);
  for (int e = threadIdx.x; e < kIH * kID; e += blockDim.x)
    qs[e] = q_f32(q[int64_t(t) * kIH * kID + e]);
  for (int e = threadIdx.x; e < kScoreTile * kID; e += blockDim.x) {
    const int r = e / kID, c = e % kID;
    const int64_t j = base + r;
    float val = 0.0f;
    if (j <= p) {
      const int64_t row =
          int64_t(block_table[s * max_blocks + j / block_size]) * block_size + j % block_size;
      val = keys(row, c);
    }
    ks[r * (kID + 1) + c] = val;
  }
  __syncthreads();
  const int pj = threadIdx.x % kScoreTile, hg = threadIdx.x / kScoreTile;
  const float* kr = ks + pj * (kID + 1);
  float acc = 0.0f;
  for (int h = hg; h < kIH; h += kScoreThreads / kScoreTile) {
    const float* qh = qs + h * kID;
    float dot = 0.0f;
#pragma unroll 16
    for (int d = 0; d < kID; ++d) dot += qh[d] * kr[d];
    acc += weights[int64_t(t) * kIH + h] * fmaxf(dot * scale, 0.0f);
  }
  part[hg * kScoreTile + pj] = acc;
  __syncthreads();
  if (threadIdx.x < kScoreTile) {
    const int64_t j = base + threadIdx.x;
    float sum = 0.0f;
    for (int g = 0; g < kScoreThreads / kScoreTile; ++g) sum += part[g * kScoreTile + threadIdx.x];
    if (j <= p) scores[int64_t(t) * ld + j] = sum;
  }
}

// Generic-shape scoring (any IH × ID: the small test models): a thread per key position.
// Grid [n_tokens, ceil(max_len / 128)], 128 threads.
template <typename Tq, typename KC>
__global__ void indexer_score_generic_kernel(
    float* __restrict__ scores, int64_t ld, const Tq* __restrict__ q,
    const float* __restrict__ weights, KC keys, const int32_t* __restrict__ qsl,
    const int32_t* __restrict__ positions, const int32_t* __restrict__ block_table,
    int64_t max_blocks, int block_size, int n_seqs, int IH, int ID, float scale) {
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  const int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t p = positions[t];
  if (j > p) return;
  const int s = seq_of_token(qsl, n_seqs, t);
  const int64_t row =
      int64_t(block_table[s * max_blocks + j / block_size]) * block_size + j % block_size;
  float acc = 0.0f;
  for (int h = 0; h < IH; ++h) {
    const Tq* qh = q + (int64_t(t) * IH + h) * ID;
    float dot = 0.0f;
    for (int d = 0; d < ID; ++d) dot += q_f32(qh[d]) * keys(row, d);
    acc += weights[int64_t(t) * IH + h] * fmaxf(dot * scale, 0.0f);
  }
  scores[int64_t(t) * ld + j] = acc;
}

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads)
    indexer_topk_kernel(int32_t* __restrict__ out, int k, const float* __restrict__ scores,
                        int64_t ld, const int32_t* __restrict__ positions) {
  pdl_wait();
  pdl_trigger();
  using Scan = cub::BlockScan<uint32_t, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_remaining;
  const int t = blockIdx.x;
  const int64_t n = int64_t(positions[t]) + 1;
  int32_t* o = out + int64_t(t) * k;
  const float* sc = scores + int64_t(t) * ld;
  if (n <= k) {
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) o[i] = i < n ? int32_t(i) : -1;
    return;
  }
  uint32_t prefix = 0, mask = 0, remaining = uint32_t(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint32_t key = order_key(sc[j]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // The bin where the count from the top reaches `remaining`, found by warp 0: lane l holds
      // bins 255 − 8l − i (i < 8, descending), a warp prefix sum over the lanes' totals picks the
      // one lane whose range holds it (a serial scan of 256 bins cost ~4 µs a pass).
      const int lane = int(threadIdx.x);
      uint32_t c[8], local = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        c[i] = hist[255 - 8 * lane - i];
        local += c[i];
      }
      uint32_t incl = local;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      uint32_t cum = incl - local;
      if (cum < remaining && incl >= remaining) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (cum + c[i] >= remaining) {
            s_prefix = prefix | (uint32_t(255 - 8 * lane - i) << shift);
            s_remaining = remaining - cum;
            break;
          }
          cum += c[i];
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }
  const uint32_t threshold = prefix,
                 need_eq = remaining;  // take all keys > T, the first need_eq == T
  uint32_t run_gt = 0, run_eq = 0;
  for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) {
    const int64_t j = j0 + threadIdx.x;
    uint32_t gt = 0, eq = 0;
    if (j < n) {
      const uint32_t key = order_key(sc[j]);
      gt = key > threshold;
      eq = key == threshold;
    }
    uint32_t pre, total;
    Scan(scan_tmp).ExclusiveSum(gt | (eq << 16), pre, total);
    const uint32_t eq_before = run_eq + (pre >> 16);
    const uint32_t slot = run_gt + (pre & 0xffffu) + min(eq_before, need_eq);
    if (gt || (eq && eq_before < need_eq)) o[slot] = int32_t(j);
    run_gt += total & 0xffffu;
    run_eq += total >> 16;
    __syncthreads();  // scan_tmp is reused
  }
}
}  // namespace

void indexer_cache_write(Tensor index_cache, Tensor k, const AttentionMeta& m) {
  check_device(index_cache, "indexer_cache_write", "index_cache");
  check_device(k, "indexer_cache_write", "k");
  check_device(m.slot_mapping, "indexer_cache_write", "slot_mapping");
  const int64_t d = k.size(-1);
  if (index_cache.dtype == DType::U8) {
    OSPREY_CHECK(index_cache.size(-1) == m.block_size * indexer_fp8_token_bytes(d),
                 "FP8 indexer cache width ", index_cache.size(-1));
    if (m.n_tokens == 0) return;
    OSPREY_DISPATCH_FLOAT(k.dtype, Tk, {
      launch_pdl(index_write_fp8_kernel<Tk>, m.n_tokens, 128, 0, index_cache.ptr<uint8_t>(),
                 static_cast<const Tk*>(k.data), m.slot_mapping.ptr<int64_t>(), int(d),
                 m.block_size);
    });
    OSPREY_CUDA_LAUNCH_CHECK();
    return;
  }
  OSPREY_CHECK(index_cache.size(-1) == d, "indexer cache width");
  if (m.n_tokens == 0) return;
  OSPREY_DISPATCH_FLOAT(index_cache.dtype, Tc, OSPREY_DISPATCH_FLOAT(k.dtype, Tk, {
                          launch_pdl(index_write_kernel<Tc, Tk>, m.n_tokens, 128, 0,
                                     static_cast<Tc*>(index_cache.data),
                                     static_cast<const Tk*>(k.data), m.slot_mapping.ptr<int64_t>(),
                                     int(d));
                        }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

// Runs body with Tq the C++ type of q's dtype: F32, BF16, or U8 (e4m3).
#define OSPREY_DISPATCH_Q(dtype, Tq, ...)            \
  do {                                               \
    if ((dtype) == DType::U8) {                      \
      using Tq = uint8_t;                            \
      __VA_ARGS__;                                   \
    } else {                                         \
      OSPREY_DISPATCH_FLOAT(dtype, Tq, __VA_ARGS__); \
    }                                                \
  } while (0)

void indexer_quantize_q(Tensor q8, Tensor weights_out, Tensor q, Tensor weights) {
  check_device(q8, "indexer_quantize_q", "q8");
  check_device(weights_out, "indexer_quantize_q", "weights_out");
  check_device(q, "indexer_quantize_q", "q");
  check_device(weights, "indexer_quantize_q", "weights");
  OSPREY_CHECK(q.dim() == 3 && q8.dtype == DType::U8 && weights.dtype == DType::F32 &&
                   weights_out.dtype == DType::F32,
               "indexer_quantize_q: q [n, IH, ID] F32/BF16, U8 q8, F32 weights and weights_out");
  const int64_t n = q.size(0), IH = q.size(1), ID = q.size(2), rows = n * IH;
  OSPREY_CHECK(q8.numel() == rows * ID && weights.numel() == rows && weights_out.numel() == rows,
               "indexer_quantize_q shapes");
  if (rows == 0) return;
  constexpr int kRowsPerBlock = 4;  // 128 threads: a warp per row
  OSPREY_DISPATCH_FLOAT(q.dtype, Tq, {
    launch_pdl(indexer_quantize_q_kernel<Tq>, unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock),
               32 * kRowsPerBlock, 0, q8.ptr<uint8_t>(), weights_out.f32(),
               static_cast<const Tq*>(q.data), weights.f32(), rows, int(ID));
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void indexer_k_write(Tensor index_cache, Tensor k_raw, Tensor norm_w, Tensor norm_b, float eps,
                     int rope_dim, Tensor inv_freq, float attention_factor,
                     const AttentionMeta& m) {
  check_device(index_cache, "indexer_k_write", "index_cache");
  check_device(k_raw, "indexer_k_write", "k_raw");
  check_device(norm_w, "indexer_k_write", "norm_w");
  check_device(norm_b, "indexer_k_write", "norm_b");
  check_device(inv_freq, "indexer_k_write", "inv_freq");
  check_device(m.slot_mapping, "indexer_k_write", "slot_mapping");
  check_device(m.positions, "indexer_k_write", "positions");
  const int64_t d = k_raw.size(-1);
  OSPREY_CHECK(k_raw.dim() == 2 && k_raw.size(0) == m.n_tokens && norm_w.numel() == d &&
                   norm_b.numel() == d && norm_b.dtype == norm_w.dtype && rope_dim > 0 &&
                   rope_dim % 2 == 0 && rope_dim <= d && inv_freq.numel() * 2 == rope_dim &&
                   inv_freq.dtype == DType::F32 && is_f32_or_bf16(k_raw.dtype) &&
                   is_f32_or_bf16(norm_w.dtype) && d <= 8192,
               "indexer_k_write: k_raw ", shape_str(k_raw.shape), " ", dtype_name(k_raw.dtype),
               " for ", m.n_tokens, " tokens, norm of ", norm_w.numel(), ", rope ", rope_dim,
               ", inv_freq of ", inv_freq.numel());
  const bool fp8 = index_cache.dtype == DType::U8;
  if (fp8)
    OSPREY_CHECK(index_cache.size(-1) == m.block_size * indexer_fp8_token_bytes(d),
                 "FP8 indexer cache width ", index_cache.size(-1));
  else
    OSPREY_CHECK(index_cache.size(-1) == d, "indexer cache width ", index_cache.size(-1),
                 " for keys of ", d);
  if (m.n_tokens == 0) return;
  const size_t smem = size_t(d) * sizeof(float);
  auto go = [&](auto* cache) {
    using Tc = std::remove_pointer_t<decltype(cache)>;
    OSPREY_DISPATCH_FLOAT(
        k_raw.dtype, Tk, OSPREY_DISPATCH_FLOAT(norm_w.dtype, W, {
          launch_pdl(index_k_write_kernel<Tc, Tk, W>, unsigned(m.n_tokens), kKWriteThreads, smem,
                     cache, static_cast<const Tk*>(k_raw.data), static_cast<const W*>(norm_w.data),
                     static_cast<const W*>(norm_b.data), m.slot_mapping.ptr<int64_t>(),
                     m.positions.ptr<int32_t>(), inv_freq.f32(), int(d), rope_dim, eps,
                     attention_factor, m.block_size);
        }));
  };
  if (fp8)
    go(index_cache.ptr<uint8_t>());
  else
    OSPREY_DISPATCH_FLOAT(index_cache.dtype, Tc, { go(static_cast<Tc*>(index_cache.data)); });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void indexer_q_prep(Tensor q8, Tensor weights_out, Tensor q, Tensor weights, float weights_scale,
                    int rope_dim, Tensor positions, Tensor inv_freq, float attention_factor) {
  check_device(q8, "indexer_q_prep", "q8");
  check_device(weights_out, "indexer_q_prep", "weights_out");
  check_device(q, "indexer_q_prep", "q");
  check_device(weights, "indexer_q_prep", "weights");
  check_device(positions, "indexer_q_prep", "positions");
  check_device(inv_freq, "indexer_q_prep", "inv_freq");
  OSPREY_CHECK(q.dim() == 3 && q8.dtype == DType::U8 && weights.dtype == DType::F32 &&
                   weights_out.dtype == DType::F32 && is_f32_or_bf16(q.dtype),
               "indexer_q_prep: q [n, IH, ID] F32/BF16, U8 q8, F32 weights and weights_out");
  const int64_t n = q.size(0), IH = q.size(1), ID = q.size(2), rows = n * IH;
  OSPREY_CHECK(q8.numel() == rows * ID && weights.numel() == rows && weights_out.numel() == rows &&
                   positions.numel() == n && positions.dtype == DType::I32 && rope_dim > 0 &&
                   rope_dim % 2 == 0 && rope_dim <= ID && inv_freq.numel() * 2 == rope_dim &&
                   inv_freq.dtype == DType::F32 && ID <= kQPrepMaxId,
               "indexer_q_prep: q ", shape_str(q.shape), ", ", positions.numel(),
               " positions, rope ", rope_dim, ", inv_freq of ", inv_freq.numel(), " (ID ≤ ",
               kQPrepMaxId, ")");
  if (rows == 0) return;
  OSPREY_DISPATCH_FLOAT(q.dtype, Tq, {
    launch_pdl(indexer_q_prep_kernel<Tq>, unsigned((rows + kQPrepRows - 1) / kQPrepRows),
               32 * kQPrepRows, 0, q8.ptr<uint8_t>(), weights_out.f32(),
               static_cast<const Tq*>(q.data), weights.f32(), weights_scale,
               positions.ptr<int32_t>(), inv_freq.f32(), rows, int(IH), int(ID), rope_dim,
               attention_factor);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

void indexer_topk(Tensor topk_indices, Tensor q, Tensor weights, Tensor index_cache,
                  const AttentionMeta& m, float scale) {
  check_device(q, "indexer_topk", "q");
  check_device(weights, "indexer_topk", "weights");
  check_device(index_cache, "indexer_topk", "index_cache");
  const int64_t topk = topk_indices.size(1);
  const bool fast = q.size(1) == kIH && q.size(2) == kID;
  const bool fp8 = index_cache.dtype == DType::U8;
  OSPREY_CHECK(weights.size(1) == q.size(1) && weights.dtype == DType::F32 &&
                   index_cache.size(-1) ==
                       (fp8 ? m.block_size * indexer_fp8_token_bytes(q.size(2)) : q.size(2)) &&
                   topk_indices.size(0) == m.n_tokens && topk_indices.dtype == DType::I32,
               "indexer shapes (CUDA: 64 heads × 128, F32 weights)");
  if (m.n_tokens == 0) return;
  const int64_t max_len = m.block_table.size(1) * m.block_size;
  auto* scores = static_cast<float*>(
      scratch(kScratchIndexScores, size_t(m.n_tokens * max_len) * sizeof(float)));
  const size_t smem =
      (size_t(kIH) * kID + size_t(kScoreTile) * (kID + 1) + 4 * kScoreTile) * sizeof(float);
  auto score = [&](auto keys) {
    using KC = decltype(keys);
    if (!fast) {
      const dim3 g(unsigned(m.n_tokens), unsigned((max_len + 127) / 128));
      OSPREY_DISPATCH_Q(q.dtype, Tq, {
        launch_pdl(indexer_score_generic_kernel<Tq, KC>, g, 128, 0, scores, max_len,
                   static_cast<const Tq*>(q.data), weights.f32(), keys,
                   m.query_start_loc.ptr<int32_t>(), m.positions.ptr<int32_t>(),
                   m.block_table.ptr<int32_t>(), m.block_table.size(1), m.block_size, m.n_seqs,
                   int(q.size(1)), int(q.size(2)), scale);
      });
      return;
    }
    const dim3 grid(unsigned(m.n_tokens), unsigned((max_len + kScoreTile - 1) / kScoreTile));
    OSPREY_DISPATCH_Q(q.dtype, Tq, {
      // One-time attribute on the first (eager) call; a graph is captured after its warm-up.
      static bool configured = false;
      if (!configured) {
        OSPREY_CUDA_CHECK(cudaFuncSetAttribute(
            indexer_score_kernel<Tq, KC>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        configured = true;
      }
      launch_pdl(indexer_score_kernel<Tq, KC>, grid, kScoreThreads, smem, scores, max_len,
                 static_cast<const Tq*>(q.data), weights.f32(), keys,
                 m.query_start_loc.ptr<int32_t>(), m.positions.ptr<int32_t>(),
                 m.block_table.ptr<int32_t>(), m.block_table.size(1), m.block_size, m.n_seqs,
                 scale);
    });
  };
  if (indexer_logits_sm90_supported(q, weights, index_cache, m))
    indexer_logits_sm90(scores, max_len, q, weights, index_cache, m, scale);
  else if (fp8)
    score(Fp8Keys{index_cache.ptr<uint8_t>(), m.block_size, int(q.size(2))});
  else
    OSPREY_DISPATCH_FLOAT(
        index_cache.dtype, Tc,
        score(PlainKeys<Tc>{static_cast<const Tc*>(index_cache.data), int(q.size(2))}));
  OSPREY_CUDA_LAUNCH_CHECK();
  launch_pdl(indexer_topk_kernel, unsigned(m.n_tokens), kTopkThreads, 0,
             topk_indices.ptr<int32_t>(), int(topk), scores, max_len, m.positions.ptr<int32_t>());
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
