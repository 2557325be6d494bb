// sm_90a lightning-indexer logits on tensor cores (FP8 MQA logits, DeepSeek V3.2's indexer):
//   I[t, j] = Σ_h w[t, h] · relu(scale · q8[t, h] · k8_j · ks_j)
//           = ks_j · scale · Σ_h w[t, h] · relu(q8[t, h] · k8_j)          (ks_j > 0, scale > 0)
// for every context position j ≤ positions[t] of token t's sequence.
// Shapes: q8 [n_tokens, 64, 128] e4m3 (the per-(t, h) quantisation scale already folded into w,
//   ops/indexer.h), w [n_tokens, 64] F32, cache U8 [n_blocks, 64 · 132]: per block 64 × 128 e4m3
//   key values, then 64 F32 key scales; block_table [n_seqs, max_blocks]; scores [n_tokens, ld]
//   F32.
// The MMA: the keys are wgmma's A (M = 64 keys a warpgroup, K = 128: one SW128 row a key), the
//   group's query heads its B (N = QG · 64: QG tokens × 64 heads, K-major), so the sum over heads
//   runs along the accumulator's columns: 16 columns a token in a thread, then its quad.
// Grid [ceil(n_tokens / QG), splits]: block x takes the tokens [QG·g, QG·g + QG), g counted from
//   the last group down (a prefill chunk's longest contexts start first); block y the y-th range of
//   stages_per_split 128-key stages. A group's tokens may belong to several sequences (a mixed
//   batch): the block walks each run of one sequence in turn, over the stages the run's largest
//   position reaches, and writes only that run's tokens.
// Block: 384 threads.
//   Warpgroup 0, the producer: first the group's q8 (SW128) and w with cp.async on `qbar`, then
//   per stage, 16-byte cp.async copies of the 128 keys' 16 KB (two
//   cache blocks through block_table; keys past the run's last position zero-filled, their blocks
//   never looked up) into the SW128 layout, 4-byte copies of their scales, then
//   cp.async.mbarrier.arrive.noinc on the stage's `full` barrier: kStages stages in flight.
//   Warpgroups 1 and 2 take keys [64·c, 64·c + 64) of every stage: 4 wgmma m64n(QG·64)k32 into a
//   fresh F32 accumulator (one K = 128 group: the FP8 accumulation spans no more than DeepSeek's
//   own indexer's), then the ReLU-weighted sum over heads, × ks_j · scale, stored for the tokens
//   whose position reaches j.
// QG = 1 (decode: one token a sequence, memory-bound on the keys) or 4 (prefill chunks: a stage
//   read once for 4 tokens, N = 256).
// Preconditions (host-checked, indexer_logits_sm90_supported): IH = 64, ID = 128, block_size 64.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/hopper/sync.cuh"
#include "ops/cuda/hopper/wgmma.cuh"
#include "ops/cuda/indexer/logits_sm90.cuh"

namespace osprey::ops::cuda {

namespace {
namespace hw = hopper;

constexpr int kIH = 64, kID = 128, kBS = 64;
constexpr int64_t kBlockBytes = int64_t(kBS) * (kID + 4);  // 8448: one cache block
constexpr int kStageKeys = 128;                // two cache blocks: one 64-key tile a consumer WG
constexpr int kStageBytes = kStageKeys * kID;  // 16 KB of e4m3 keys
constexpr int kThreads = 384;                  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumers = 256;
constexpr int kMinStagesPerSplit = 4;  // a split shorter than this is mostly pipeline fill

template <int QG>
struct Cfg {
  // QG = 1: 5 stages (80 KB in flight a block, 2 blocks an SM: ~5× what covers the DRAM latency
  // at an SM's share of the bandwidth); QG = 4: 8 stages and the 32 KB of q, 1 block an SM.
  static constexpr int kStages = QG == 1 ? 5 : 8;
  static constexpr int kMinBlocks = QG == 1 ? 2 : 1;
  static constexpr int kN = QG * kIH;     // wgmma N: the group's heads
  static constexpr int kQOff = 0;         // q8 [kN rows][128 B] SW128
  static constexpr int kWOff = kN * kID;  // w [QG][64] F32
  static constexpr int kStageOff = (kWOff + kN * 4 + 1023) / 1024 * 1024;  // keys [kStages][16 KB]
  static constexpr int kScaleOff = kStageOff + kStages * kStageBytes;      // ks [kStages][128] F32
  // full, empty [kStages], then qbar
  static constexpr int kBarOff = kScaleOff + kStages * kStageKeys * 4;
  static constexpr size_t kSmem = size_t(kBarOff) + (2 * kStages + 1) * 8 + 1024;  // + align slack
  static_assert(QG == 1 || QG == 4);
};

struct Params {
  float* scores;  // [n_tokens, ld]
  int64_t ld;
  const uint8_t* q8;           // [n_tokens, 64, 128] e4m3
  const float* w;              // [n_tokens, 64]
  const uint8_t* cache;        // [n_blocks, 64 · 132]
  const int32_t* qsl;          // [n_seqs + 1]
  const int32_t* positions;    // [n_tokens]
  const int32_t* req_id;       // [n_tokens] the sequence of each token, or null (search qsl)
  const int32_t* block_table;  // [n_seqs, max_blocks]
  int64_t max_blocks;
  int n_seqs, n_tokens, stages_per_split;
  float scale;
};

template <int N>
__device__ __forceinline__ void mma_k32(float (&d)[N / 2], uint64_t a, uint64_t b, bool acc) {
  if constexpr (N == 64)
    hw::wgmma_m64n64k32_e4m3_ss(d, a, b, acc);
  else
    hw::wgmma_m64n256k32_e4m3_ss(d, a, b, acc);
}

// The runs of one sequence among the group's tokens, in order: [qa, qb) of sequence seq[qa],
// largest position pmax. Producer and consumers walk the same runs and stages.
template <int QG>
__device__ __forceinline__ int run_end(const int (&seq)[QG], int qa, int nt) {
  int qb = qa + 1;
  while (qb < nt && seq[qb] == seq[qa]) ++qb;
  return qb;
}
template <int QG>
__device__ __forceinline__ int run_pmax(const int (&pos)[QG], int qa, int qb) {
  int pm = pos[qa];
  for (int q = qa + 1; q < qb; ++q) pm = max(pm, pos[q]);
  return pm;
}

template <int QG>
__global__ void __launch_bounds__(kThreads, Cfg<QG>::kMinBlocks)
    indexer_logits_kernel(const Params p) {
  pdl_wait();
  pdl_trigger();
  using C = Cfg<QG>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* qs = smem + C::kQOff;
  float* ws = reinterpret_cast<float*>(smem + C::kWOff);
  float* kscale = reinterpret_cast<float*>(smem + C::kScaleOff);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kBarOff);
  uint64_t* empty = full + C::kStages;
  uint64_t* qbar = empty + C::kStages;  // the group's q8 and w have landed
  const int tid = threadIdx.x;
  const int g = int(gridDim.x) - 1 - int(blockIdx.x);
  const int t0 = g * QG, nt = min(QG, p.n_tokens - t0);

  // The group's positions and sequences, read by every thread (one round trip: no block barrier
  // waits on memory before the producer's first key copy).
  int pos[QG], seq[QG];
#pragma unroll
  for (int q = 0; q < QG; ++q) {
    const bool ok = q < nt;
    pos[q] = ok ? p.positions[t0 + q] : -1;
    seq[q] = !ok ? -1 : p.req_id ? p.req_id[t0 + q] : seq_of_token(p.qsl, p.n_seqs, t0 + q);
  }
  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      hw::mbar_init(&full[s], 128);          // every producer thread's noinc arrival
      hw::mbar_init(&empty[s], kConsumers);  // every consumer thread
    }
    hw::mbar_init(qbar, 128);
    hw::mbar_init_fence();
  }
  __syncthreads();
  const int s_begin = int(blockIdx.y) * p.stages_per_split, s_end = s_begin + p.stages_per_split;

  if (tid < 128) {
    // Thread tid copies 16-byte chunk c = tid % 8 of the stage's key rows tid / 8 + 16·i.
    const int c = tid & 7, r0 = tid >> 3;
    // First the group's q8 rows (zero past its last token) into SW128 and its w, on qbar.
#pragma unroll
    for (int i = 0; i < C::kN / 16; ++i) {
      const int r = r0 + 16 * i;
      const bool ok = r / kIH < nt;
      hw::cp_async_16(qs + r * 128 + (((c ^ r) & 7) << 4),
                      ok ? p.q8 + (int64_t(t0) * kIH + r) * kID + c * 16 : p.q8, ok ? 16u : 0u);
    }
    for (int e = tid; e < C::kN; e += 128) {
      const bool ok = e / kIH < nt;
      hw::cp_async_4(ws + e, ok ? p.w + int64_t(t0) * kIH + e : p.w, ok ? 4u : 0u);
    }
    hw::cp_async_arrive_noinc(qbar);
    int it = 0;
    for (int qa = 0; qa < nt;) {
      const int qb = run_end(seq, qa, nt), pmax = run_pmax(pos, qa, qb);
      const int32_t* bt = p.block_table + int64_t(seq[qa]) * p.max_blocks;
      const int last = min(s_end, pmax / kStageKeys + 1);
      for (int st = s_begin; st < last; ++st, ++it) {
        const int stage = it % C::kStages;
        hw::mbar_wait(&empty[stage], ((it / C::kStages) & 1) ^ 1);
        uint8_t* dst = smem + C::kStageOff + stage * kStageBytes;
        const int j0 = st * kStageKeys;
        const uint8_t* blk[2];
#pragma unroll
        for (int b = 0; b < 2; ++b)
          blk[b] =
              j0 + kBS * b <= pmax ? p.cache + int64_t(bt[j0 / kBS + b]) * kBlockBytes : p.cache;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int r = r0 + 16 * i;
          const bool ok = j0 + r <= pmax;
          const uint8_t* src = ok ? blk[r >> 6] + (r & 63) * kID + c * 16 : p.cache;
          hw::cp_async_16(dst + r * 128 + (((c ^ r) & 7) << 4), src, ok ? 16u : 0u);
        }
        const bool ok = j0 + tid <= pmax;
        hw::cp_async_4(kscale + stage * kStageKeys + tid,
                       ok ? blk[tid >> 6] + kBS * kID + 4 * (tid & 63) : p.cache, ok ? 4u : 0u);
        hw::cp_async_arrive_noinc(&full[stage]);
      }
      qa = qb;
    }
    hw::cp_async_wait_all();  // nothing of this thread's may land after it has exited
    return;
  }

  // Consumers.
  const int ct = tid - 128, cw = ct >> 7, warp = (ct >> 5) & 3, lane = ct & 31;
  const int rloc = cw * 64 + warp * 16 + (lane >> 2);  // the stage row of accumulator rows 0, +8
  float acc[C::kN / 2];
  hw::mbar_wait(qbar, 0);
  hw::fence_proxy_async();  // q8 landed through cp.async (generic proxy), read by wgmma
  int it = 0;
  for (int qa = 0; qa < nt;) {
    const int qb = run_end(seq, qa, nt), pmax = run_pmax(pos, qa, qb);
    const int last = min(s_end, pmax / kStageKeys + 1);
    for (int st = s_begin; st < last; ++st, ++it) {
      const int stage = it % C::kStages;
      hw::mbar_wait(&full[stage], (it / C::kStages) & 1);
      hw::fence_proxy_async();  // the cp.async (generic proxy) bytes, read next by wgmma
      const uint8_t* keys = smem + C::kStageOff + stage * kStageBytes + cw * 64 * 128;
      hw::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kID / 32; ++k)
        mma_k32<C::kN>(acc, hw::sw128_desc(keys + k * 32, 16, 1024),
                       hw::sw128_desc(qs + k * 32, 16, 1024), k > 0);
      hw::wgmma_commit();
      const float ks0 = kscale[stage * kStageKeys + rloc] * p.scale;
      const float ks1 = kscale[stage * kStageKeys + rloc + 8] * p.scale;
      hw::wgmma_wait<0>();
      hw::fence_regs(acc);
      hw::mbar_arrive(&empty[stage]);
      const int j = st * kStageKeys + rloc;
      // Accumulator i: key row rloc + 8·((i/2) % 2), head column 8·(i/4) + 2·(lane%4) + i%2 of
      // token (i/4) / 8.
#pragma unroll
      for (int q = 0; q < QG; ++q) {
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const float2 wv =
              *reinterpret_cast<const float2*>(ws + q * kIH + 8 * jj + 2 * (lane & 3));
          const int i = (q * 8 + jj) * 4;
          s0 += wv.x * fmaxf(acc[i], 0.0f) + wv.y * fmaxf(acc[i + 1], 0.0f);
          s1 += wv.x * fmaxf(acc[i + 2], 0.0f) + wv.y * fmaxf(acc[i + 3], 0.0f);
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        if ((lane & 3) == (q & 3) && q >= qa && q < qb) {
          float* row = p.scores + int64_t(t0 + q) * p.ld;
          if (j <= pos[q]) row[j] = s0 * ks0;
          if (j + 8 <= pos[q]) row[j + 8] = s1 * ks1;
        }
      }
    }
    qa = qb;
  }
}

template <int QG>
void launch(const Params& p, const dim3& grid) {
  using C = Cfg<QG>;
  static const bool attr = [] {
    OSPREY_CUDA_CHECK(cudaFuncSetAttribute(
        indexer_logits_kernel<QG>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmem)));
    return true;
  }();
  (void)attr;
  launch_pdl(indexer_logits_kernel<QG>, grid, kThreads, C::kSmem, p);
  OSPREY_CUDA_LAUNCH_CHECK();
}
}  // namespace

bool indexer_logits_sm90_supported(Tensor q8, Tensor weights, Tensor index_cache,
                                   const AttentionMeta& m) {
  return q8.dtype == DType::U8 && q8.dim() == 3 && q8.size(1) == kIH && q8.size(2) == kID &&
         weights.dtype == DType::F32 && index_cache.dtype == DType::U8 && m.block_size == kBS &&
         index_cache.size(-1) == kBlockBytes && device_is_sm90();
}

void indexer_logits_sm90(float* scores, int64_t ld, Tensor q8, Tensor weights, Tensor index_cache,
                         const AttentionMeta& m, float scale) {
  OSPREY_CHECK(indexer_logits_sm90_supported(q8, weights, index_cache, m),
               "indexer_logits_sm90: q8 U8 [n, 64, 128], F32 weights, the FP8 cache, block 64");
  if (m.n_tokens == 0) return;
  const int64_t max_len = m.block_table.size(1) * m.block_size;
  OSPREY_CHECK(ld >= max_len, "indexer_logits_sm90: ld ", ld, " < ", max_len);
  // Several tokens a sequence on average (prefill chunks): groups of 4 share every key stage.
  const int QG = int64_t(m.n_tokens) >= 4 * int64_t(m.n_seqs) ? 4 : 1;
  const int groups = (m.n_tokens + QG - 1) / QG;
  const int max_stages = int((max_len + kStageKeys - 1) / kStageKeys);
  const int per_sm = QG == 1 ? Cfg<1>::kMinBlocks : Cfg<4>::kMinBlocks;
  // As many splits as keep one wave of resident blocks (a second, partial wave would double a
  // decode step's time), each at least kMinStagesPerSplit stages long.
  int splits =
      std::clamp(sm_count() * per_sm / groups, 1, std::max(1, max_stages / kMinStagesPerSplit));
  const int sps = (max_stages + splits - 1) / splits;
  splits = (max_stages + sps - 1) / sps;
  Params p{scores, ld, q8.ptr<uint8_t>(), weights.f32(), index_cache.ptr<uint8_t>(),
           m.query_start_loc.ptr<int32_t>(), m.positions.ptr<int32_t>(),
           // on the device only (a host tensor here would be read through the host's pages)
           m.req_id_per_token.numel() == m.n_tokens && m.req_id_per_token.device == Device::CUDA
               ? m.req_id_per_token.ptr<int32_t>()
               : nullptr,
           m.block_table.ptr<int32_t>(), m.block_table.size(1), m.n_seqs, m.n_tokens, sps, scale};
  const dim3 grid{unsigned(groups), unsigned(splits)};
  if (QG == 4)
    launch<4>(p, grid);
  else
    launch<1>(p, grid);
}

}  // namespace osprey::ops::cuda
