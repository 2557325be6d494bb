// CUDA grouped GEMMs of the routed experts, on tensor cores (WMMA, BF16 16×16×16, F32
// accumulation). The rows are the routed pairs sorted by expert (ops/moe_schedule.h: perm, tiles);
// a block computes one tile [BM rows of one expert, BN output columns] with that expert's weights,
// so one launch covers every expert and the grid does not depend on the routing.
//
// moe_gate_up (kGateUp): for sorted row r of expert e = tile.expert, xs[r] = x[perm[r] / K]:
//   h [rows, I] BF16 = silu(xs · gate_eᵀ) ⊙ (xs · up_eᵀ),   silu(g) = g / (1 + e^-g)
//   gate_e, up_e [I, D]; the block holds a gate and an up accumulator for the same 64×128 outputs
//   and multiplies them in registers (the two WMMA accumulators have one type, so one layout).
// moe_down: y [rows, D] F32 = h · down_eᵀ, down_e [D, I].
// Weights: BF16, or F8_E4M3 with 128×128 block scales (W[n, k] = e4m3(W8[n, k]) ·
//   scale_inv[n/128, k/128], scale_inv [ceil(N/128), ceil(K/128)] F32), dequantised as the tiles
//   are stored to shared memory: bf16(float(e4m3) · scale), the CPU oracle's F32 product rounded
//   once to BF16 (e4m3 → F32 is exact). Activations: x F32 or BF16 (F32 rounded to BF16 in the
//   tile store), h BF16 (the one rounding of the intermediate), y F32.
// Tiles: BM = kMoeTileRows = 64 rows × BN = 128 columns, BK = 64 per stage; 256 threads = 8 warps
//   as 2 (rows) × 4 (columns), each warp 32×32 outputs = 2×2 WMMA accumulators (×2 for gate/up).
//   Global → registers (16-byte __ldg: 8 BF16, 16 e4m3, or 2×4 F32 activations a load; a warp
//   reads whole 128-byte or 64-byte row segments) → shared memory (BF16 rows padded to 72 elements,
//   144 B: rows start on different banks, and 16-row fragment starts stay 32-byte aligned as WMMA
//   requires); two shared stages: the next slice's global loads are in flight while the tensor
//   cores work on the current one. Epilogue: accumulators → shared F32 [64, 132] → 16-byte stores
//   of the tile's real rows [row0, row1) and columns < N.
//   Shared memory: gate/up 2 × (64 + 2·128)·72·2 B = 90 KB, down 2 × (64 + 128)·72·2 B = 54 KB
//   (dynamic, opted in per kernel).
// Grid: [max_tiles = moe_max_tiles(rows, E), ceil(N / 128)] with N = I (gate/up) or D (down);
//   blocks whose tile entry has expert −1 (past the real tile count) return at once.
// Preconditions (checked by moe_experts on the host): D and I multiples of 16, so that a 16-byte
//   load (8 BF16 or 16 e4m3 elements, starting at a multiple of 8 or 16) never straddles the end
//   of a row (nor, since 128 is a multiple of 16, an FP8 scale block) and every row starts
//   16-byte aligned; x, h, y and the weights 16-byte aligned; E ≤ 1024;
//   every expert of one dtype and shape. N need not be a multiple of 128 and K need not be a
//   multiple of 64 (V2-Lite's I = 1408, the test models' I = 32): out-of-range weight rows and
//   reduction columns load as zeros, out-of-range outputs are not stored. There is no fallback
//   path: F32 weights (which no CUDA weight loader produces for experts) and other shapes fail
//   on the host with a message.
#include <mma.h>

#include <cstring>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/moe_experts.cuh"
#include "ops/gemm.h"

namespace osprey::ops::cuda {

namespace {
namespace wmma = nvcuda::wmma;

constexpr int kBM = kMoeTileRows;  // rows of one expert per tile
constexpr int kBN = 128;           // output columns per block
constexpr int kBK = 64;            // reduction slice per shared-memory stage
constexpr int kThreads = 256;      // 8 warps
constexpr int kWarpsN = 4;         // warps along the columns (2 along the rows)
constexpr int kWarpM = 32, kWarpN = 32;
constexpr int kLd = kBK + 8;       // BF16 row stride of the A and B tiles (144 B)
constexpr int kLdC = kBN + 4;      // F32 row stride of the output staging tile (528 B)
constexpr int kATile = kBM * kLd;  // elements of one stage's activation tile [BM, kLd]
constexpr int kBTile = kBN * kLd;  // elements of one stage's weight tile [BN, kLd]
static_assert(kBM == 2 * kWarpM && kBN == kWarpsN * kWarpN && kThreads == 32 * 2 * kWarpsN);
static_assert(kBM * kBK / 8 % kThreads == 0 && kBN * kBK / 16 % kThreads == 0);
static_assert(kLd % 8 == 0 && (16 * kLd * 2) % 32 == 0 && (16 * kLdC * 4) % 32 == 0);
static_assert(kBM * kBN / 8 % kThreads == 0 && kBM * kBN / 4 % kThreads == 0);

constexpr size_t smem_bytes(int n_weights) {
  const size_t pipe = 2 * size_t(kATile + n_weights * kBTile) * sizeof(bf16);
  const size_t staging = size_t(kBM) * kLdC * sizeof(float);
  return pipe > staging ? pipe : staging;
}

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  uint32_t u;
  memcpy(&u, &b, sizeof(u));
  return u;
}

// Two e4m3 bytes (the lower-addressed one in the low byte) times the block scale → BF16 × 2.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two, float scale) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(raw));  // e4m3 → F16 → F32, exact
  return bf16x2_bits(f.x * scale, f.y * scale);
}

__device__ __forceinline__ uint4 ldg16(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

// The weight slice W[n0 : n0 + BN, k0 : k0 + BK] of W [N, Kd] (row-major) → registers → shared
// memory as BF16 [BN, kLd]. Load j of thread tid is chunk q = tid + j·kThreads of the slice.
template <bool kFp8>
struct WeightSlice {
  static constexpr int kChunk = kFp8 ? 16 : 8;  // elements per 16-byte load
  static constexpr int kPerRow = kBK / kChunk;  // chunks per slice row
  static constexpr int kLoads = kBN * kBK / kChunk / kThreads;
  uint4 v[kLoads];
  float scale[kLoads];  // FP8 only

  __device__ __forceinline__ void load(const void* w, const float* scale_inv, int N, int Kd, int n0,
                                       int k0) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int q = threadIdx.x + j * kThreads, n = n0 + q / kPerRow, k = k0 + q % kPerRow * kChunk;
      const bool in = n < N && k < Kd;
      const size_t at = size_t(n) * size_t(Kd) + size_t(k);  // element index = byte index for FP8
      v[j] = in ? ldg16(static_cast<const char*>(w) + at * (kFp8 ? 1 : sizeof(bf16)))
                : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (kFp8) {
        const int kb = (Kd + kFp8BlockSize - 1) / kFp8BlockSize;
        scale[j] = in ? __ldg(scale_inv + (n / kFp8BlockSize) * kb + k / kFp8BlockSize) : 0.0f;
      }
    }
  }
  __device__ __forceinline__ void store(bf16* s) const {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int q = threadIdx.x + j * kThreads;
      bf16* dst = s + (q / kPerRow) * kLd + q % kPerRow * kChunk;
      if constexpr (kFp8) {
        const uint4 w = v[j];
        const float sc = scale[j];
        *reinterpret_cast<uint4*>(dst) =
            make_uint4(e4m3x2_to_bf16x2(w.x & 0xffffu, sc), e4m3x2_to_bf16x2(w.x >> 16, sc),
                       e4m3x2_to_bf16x2(w.y & 0xffffu, sc), e4m3x2_to_bf16x2(w.y >> 16, sc));
        *reinterpret_cast<uint4*>(dst + 8) =
            make_uint4(e4m3x2_to_bf16x2(w.z & 0xffffu, sc), e4m3x2_to_bf16x2(w.z >> 16, sc),
                       e4m3x2_to_bf16x2(w.w & 0xffffu, sc), e4m3x2_to_bf16x2(w.w >> 16, sc));
      } else {
        *reinterpret_cast<uint4*>(dst) = v[j];
      }
    }
  }
};

// The activation slice A[tile rows, k0 : k0 + BK] → registers → shared memory as BF16 [BM, kLd].
// Row pointers are fixed per block: null for the tile's rows past row1 (loaded as zeros).
// Chunks of 8 elements: 16 bytes of BF16 or 2 × 16 bytes of F32.
template <typename TA>
struct ActSlice {
  static constexpr int kPerRow = kBK / 8;
  static constexpr int kLoads = kBM * kBK / 8 / kThreads;
  static constexpr int kWords = sizeof(TA) == 4 ? 2 : 1;  // uint4 per chunk
  const TA* row[kLoads];
  uint4 v[kLoads][kWords];

  __device__ __forceinline__ void load(int Kd, int k0) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int k = k0 + (threadIdx.x + j * kThreads) % kPerRow * 8;
      const bool in = row[j] != nullptr && k < Kd;
#pragma unroll
      for (int w = 0; w < kWords; ++w)
        v[j][w] = in ? ldg16(row[j] + k + w * 4) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __device__ __forceinline__ void store(bf16* s) const {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int q = threadIdx.x + j * kThreads;
      uint4* dst = reinterpret_cast<uint4*>(s + (q / kPerRow) * kLd + q % kPerRow * 8);
      if constexpr (kWords == 2) {
        float f[8];
        memcpy(f, v[j], sizeof(f));
        *dst = make_uint4(bf16x2_bits(f[0], f[1]), bf16x2_bits(f[2], f[3]), bf16x2_bits(f[4], f[5]),
                          bf16x2_bits(f[6], f[7]));
      } else {
        *dst = v[j][0];
      }
    }
  }
};

struct GemmArgs {
  const MoeTile* tiles;          // [max_tiles]
  const MoeExpertPtrs* experts;  // [E]
  const int32_t* perm;           // [rows] sorted row → t·K + slot (gate/up only)
  const void* a;                 // gate/up: x [n_tokens, D] F32 or BF16; down: h [rows, I] BF16
  void* out;                     // gate/up: h [rows, I] BF16; down: y [rows, D] F32
  int top_k;                     // K
  int n;                         // output columns N: I (gate/up) or D (down)
  int k;                         // reduction length: D (gate/up) or I (down)
};

template <typename TA, bool kFp8, bool kGateUp>
__global__ void __launch_bounds__(kThreads) moe_gemm_kernel(const GemmArgs p) {
  pdl_wait();
  pdl_trigger();
  constexpr int kW = kGateUp ? 2 : 1;  // weights per block: gate and up, or down
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const MoeTile tile = p.tiles[blockIdx.x];
  if (tile.expert < 0) return;  // past the real tile count (block-uniform, before any barrier)
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);  // 2 stages of [A tile, kW B tiles]
  const int warp = threadIdx.x >> 5, wm = warp / kWarpsN, wn = warp % kWarpsN;
  const int n0 = blockIdx.y * kBN;
  const MoeExpertPtrs ex = p.experts[tile.expert];
  const void* w[kW];
  const float* ws[kW];
  if constexpr (kGateUp) {
    w[0] = ex.gate;
    ws[0] = ex.gate_scale;
    w[1] = ex.up;
    ws[1] = ex.up_scale;
  } else {
    w[0] = ex.down;
    ws[0] = ex.down_scale;
  }

  ActSlice<TA> a;
#pragma unroll
  for (int j = 0; j < ActSlice<TA>::kLoads; ++j) {
    const int r = tile.row0 + (threadIdx.x + j * kThreads) / ActSlice<TA>::kPerRow;
    int64_t src = r;  // down: h's sorted row r; gate/up: x's token perm[r] / K
    if constexpr (kGateUp) {
      if (r < tile.row1) src = p.perm[r] / p.top_k;
    }
    a.row[j] = r < tile.row1 ? static_cast<const TA*>(p.a) + src * p.k : nullptr;
  }
  WeightSlice<kFp8> b[kW];
  FragC acc[kW][2][2];
#pragma unroll
  for (int i = 0; i < kW; ++i)
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 2; ++ni) wmma::fill_fragment(acc[i][mi][ni], 0.0f);

  auto a_tile = [&](int stage) { return smem + stage * (kATile + kW * kBTile); };
  auto b_tile = [&](int stage, int i) { return a_tile(stage) + kATile + i * kBTile; };

  const int n_slices = (p.k + kBK - 1) / kBK;
  a.load(p.k, 0);
#pragma unroll
  for (int i = 0; i < kW; ++i) b[i].load(w[i], ws[i], p.n, p.k, n0, 0);
  a.store(a_tile(0));
#pragma unroll
  for (int i = 0; i < kW; ++i) b[i].store(b_tile(0, i));
  __syncthreads();
  for (int s = 0; s < n_slices; ++s) {
    const int cur = s & 1;
    const bool more = s + 1 < n_slices;
    if (more) {  // the next slice's loads fly while the tensor cores work on this one
      a.load(p.k, (s + 1) * kBK);
#pragma unroll
      for (int i = 0; i < kW; ++i) b[i].load(w[i], ws[i], p.n, p.k, n0, (s + 1) * kBK);
    }
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      FragA fa[2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        wmma::load_matrix_sync(fa[mi], a_tile(cur) + (wm * kWarpM + mi * 16) * kLd + kk, kLd);
#pragma unroll
      for (int i = 0; i < kW; ++i) {
        FragB fb[2];
#pragma unroll
        for (int ni = 0; ni < 2; ++ni)  // B (k, n) = W[n, k]: column-major with stride kLd
          wmma::load_matrix_sync(fb[ni], b_tile(cur, i) + (wn * kWarpN + ni * 16) * kLd + kk, kLd);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int ni = 0; ni < 2; ++ni)
            wmma::mma_sync(acc[i][mi][ni], fa[mi], fb[ni], acc[i][mi][ni]);
      }
    }
    if (more) {  // the other stage was last read in step s − 1, before that step's barrier
      a.store(a_tile(cur ^ 1));
#pragma unroll
      for (int i = 0; i < kW; ++i) b[i].store(b_tile(cur ^ 1, i));
    }
    __syncthreads();
  }

  // Epilogue: silu(gate) ⊙ up (gate/up), staged through shared memory (the stages are free: the
  // loop ended with a barrier), then the tile's real rows and columns stored with 16-byte writes.
  float* staging = reinterpret_cast<float*>(smem_raw);  // [BM, kLdC]
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 2; ++ni) {
      if constexpr (kGateUp) {
#pragma unroll
        for (int t = 0; t < acc[0][mi][ni].num_elements; ++t) {
          const float g = acc[0][mi][ni].x[t];
          acc[0][mi][ni].x[t] = g / (1.0f + expf(-g)) * acc[1][mi][ni].x[t];
        }
      }
      wmma::store_matrix_sync(staging + (wm * kWarpM + mi * 16) * kLdC + wn * kWarpN + ni * 16,
                              acc[0][mi][ni], kLdC, wmma::mem_row_major);
    }
  __syncthreads();
  constexpr int kChunk = kGateUp ? 8 : 4;  // output elements per 16-byte store
  constexpr int kPerRow = kBN / kChunk;
#pragma unroll
  for (int j = 0; j < kBM * kPerRow / kThreads; ++j) {
    const int q = threadIdx.x + j * kThreads, r = q / kPerRow, c = q % kPerRow * kChunk;
    const int row = tile.row0 + r, col = n0 + c;
    if (row >= tile.row1 || col >= p.n) continue;
    const float* src = staging + r * kLdC + c;
    const size_t at = size_t(row) * size_t(p.n) + size_t(col);
    if constexpr (kGateUp) {
      const float4 lo = *reinterpret_cast<const float4*>(src);
      const float4 hi = *reinterpret_cast<const float4*>(src + 4);
      *reinterpret_cast<uint4*>(static_cast<bf16*>(p.out) + at) =
          make_uint4(bf16x2_bits(lo.x, lo.y), bf16x2_bits(lo.z, lo.w), bf16x2_bits(hi.x, hi.y),
                     bf16x2_bits(hi.z, hi.w));
    } else {
      *reinterpret_cast<float4*>(static_cast<float*>(p.out) + at) =
          *reinterpret_cast<const float4*>(src);
    }
  }
}

template <typename TA, bool kFp8, bool kGateUp>
void launch(const GemmArgs& args, int max_tiles) {
  constexpr size_t smem = smem_bytes(kGateUp ? 2 : 1);
  static const bool opted_in = [] {  // once per kernel: more than the default 48 KB
    OSPREY_CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_kernel<TA, kFp8, kGateUp>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)opted_in;
  const dim3 grid(unsigned(max_tiles), unsigned((args.n + kBN - 1) / kBN));
  launch_pdl(moe_gemm_kernel<TA, kFp8, kGateUp>, grid, kThreads, smem, args);
  OSPREY_CUDA_LAUNCH_CHECK();
}

bool is_fp8(DType weight_type) {
  OSPREY_CHECK(weight_type == DType::BF16 || weight_type == DType::F8_E4M3,
               "moe experts: weight dtype ", dtype_name(weight_type), " is not BF16 or F8_E4M3");
  return weight_type == DType::F8_E4M3;
}
}  // namespace

void launch_moe_gate_up(void* h, const void* x, DType x_type, DType weight_type,
                        const MoeTile* tiles, int max_tiles, const MoeExpertPtrs* experts,
                        const int32_t* perm, int top_k, int64_t D, int64_t I) {
  const GemmArgs args{tiles, experts, perm, x, h, top_k, int(I), int(D)};
  const bool fp8 = is_fp8(weight_type);
  OSPREY_DISPATCH_FLOAT(x_type, T, {
    if (fp8)
      launch<T, true, true>(args, max_tiles);
    else
      launch<T, false, true>(args, max_tiles);
  });
}

void launch_moe_down(float* y, const void* h, DType weight_type, const MoeTile* tiles,
                     int max_tiles, const MoeExpertPtrs* experts, int64_t D, int64_t I) {
  const GemmArgs args{tiles, experts, nullptr, h, y, 0, int(D), int(I)};
  if (is_fp8(weight_type))
    launch<bf16, true, false>(args, max_tiles);
  else
    launch<bf16, false, false>(args, max_tiles);
}

}  // namespace osprey::ops::cuda
