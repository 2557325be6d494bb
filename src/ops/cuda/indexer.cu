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
// Other IH × ID (the small test models) take indexer_score_generic_kernel (a thread per key).
// Dtypes: q F32 or BF16; weights F32; k F32 or BF16; index_cache F32, BF16 or U8 = the FP8 format
// of ops/indexer.h (per token ID e4m3 values + an fp32 power-of-two scale, values then scales per
// block). FP8: index_write_fp8_kernel (grid [n_tokens], 128 threads) takes amax|k| over the token,
// the scale and the RNE saturating e4m3 values, bit-identical to the CPU twin; the score kernels
// read keys through an accessor (PlainKeys / Fp8Keys) that dequantizes to F32 on load (value · s,
// exact), so the scoring arithmetic is the same for every format.
#include <cub/block/block_scan.cuh>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/indexer/logits_sm90.cuh"
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
  float amax = 0.0f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(k[t * d + c])));
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) amax = fmaxf(amax, red[w]);
  const float s = fp8_scale(amax);
  const int64_t b = slots[t] / bs, o = slots[t] % bs;
  uint8_t* blk = cache + b * bs * int64_t(d + 4);
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    blk[o * d + c] = uint8_t(
        __nv_cvt_float_to_fp8(__fdiv_rn(to_f32(k[t * d + c]), s), __NV_SATFINITE, __NV_E4M3));
  if (threadIdx.x == 0) *reinterpret_cast<float*>(blk + int64_t(bs) * d + 4 * o) = s;
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
