// CUDA mixture of experts (contract in ops/moe.h).
// moe_route: one fused kernel, one block per token (threads = E rounded up to a warp, E ≤ 1024):
//   logits (F32 or BF16, the router weight's dtype: no separate cast) → softmax/sigmoid in F32 →
//   + correction bias (noaux_tc) → group scores (top-2 sum or max; thread g scans group g) →
//   topk_group groups kept (thread 0) → k block-wide argmax rounds (value desc, index asc, as the
//   CPU twin's stable top-k) → weights s[chosen], renormalised (+1e-20), × routed_scaling_factor.
//   topk_ids [n, k] I32, topk_weights [n, k] F32; correction_bias [E] F32 or BF16.
// moe_experts: a fixed sequence of 4 launches whatever the routing, no host synchronisation and no
//   host copy of the routing, so a decode step can be captured in a CUDA graph:
//   1. moe_permute_kernel (moe_permute.cu; one block): the (token, slot) pairs sorted by expert,
//      stably, with the inverse and the tile schedule (ops/moe_schedule.h);
//   2. moe_gemm_kernel gate/up (moe_gemm.cu): h [n·K, I] BF16 = silu(x_e · gateᵀ) ⊙ (x_e · upᵀ)
//      per expert's rows, the rows read from x through perm (no gathered copy);
//   3. moe_gemm_kernel down: y [n·K, D] F32 = h · downᵀ;
//   4. moe_combine_vec_kernel (grid [n, D/512], 128 threads, 4 columns a thread; the strided
//      moe_combine_kernel, grid [n], where D or an address is not 4-aligned): out[t] = Σ_i w_i ·
//      y[inv[(t, i)]] in slot order (deterministic, no atomics), then + addend[t] when given (the
//      shared expert's output: the model's separate add kernel gone).
//   The experts' weight pointers reach the GEMMs through a device array [E] of MoeExpertPtrs,
//   uploaded once per expert list (expert_table: keyed by the list's address, rebuilt only when a
//   pointer changed; later calls compare pointers on the host and upload nothing).
//   FP8 experts with few tokens (n ≤ kSwapAbMoeMaxTokens, D and I multiples of 128, sm_90): the
//   decode path instead, W8A8 on osprey's weight-streaming kernel (gemm/fp8_swapab.cu), 5 launches:
//   x quantised per 1×128 once (x8 [n, D], xs [n, D/128]); the permutation with 16-row tiles;
//   gate/up with silu·mul and the 1×128 quantisation of h fused (h8 [n·K, I], hs [n·K, I/128]);
//   down (y [n·K, D] F32); the same combine. Its CPU twin is the composition of
//   ops::cpu::linear_w8a8 (gate, up, down) with silu·mul in F32 (tests/ops/test_cuda_fp8_gemm).
//   Past kSwapAbMoeMaxTokens (prefill chunks; ops/gemm.h set_fp8_moe_prefill_swapab, on by
//   default): the same 5 launches with tiles of kSwapAbMoePrefillTileRows (64) rows, the same twin.
//   It beat the WMMA W8A16 grouped GEMM on the H200 (bench kernels --op moe, 2026-12-01: 2048
//   tokens 4.0 vs 13.4 ms a layer, 5000 tokens 8.4 vs 27.9 ms); OSPREY_MOE_PREFILL=wmma keeps WMMA.
//   x [n, D], out [n, D]: F32 or BF16. Experts: BF16 or F8_E4M3 + 128×128 scales, all of one
//   dtype and shape, D and I multiples of 16 (moe_gemm.cu's preconditions); E ≤ 1024.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm/fp8_swapab.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/hopper/tma_map.h"
#include "ops/cuda/moe_experts.cuh"
#include "ops/gemm.h"
#include "ops/moe.h"

namespace osprey::ops::cuda {

namespace {
constexpr int kMaxExperts = 1024;
// Most tokens the FP8 decode path takes: past it the rows an expert gets fill the WMMA kernel's
// 64-row tiles and the routed experts become compute-bound.
constexpr int64_t kSwapAbMoeMaxTokens = 128;
static_assert(kSwapAbMoeMaxTokens == kSwapAbMaxTokens,
              "ops::cuda::token_path_thresholds (gemm.cu) names this limit as kSwapAbMaxTokens");
constexpr int kMaxTopk = 32;

bool g_moe_prefill_swapab = [] {
  const char* e = std::getenv("OSPREY_MOE_PREFILL");
  return !(e && std::string_view(e) == "wmma");
}();

struct ArgMax {
  float v;
  int i;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}
__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
    a = better(a, b);
  }
  return a;
}

template <typename Tl, typename Tb>
__global__ void moe_route_kernel(int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights,
                                 const Tl* __restrict__ logits, const Tb* __restrict__ bias, int E,
                                 int K, int G, int topk_group, bool softmax, int method,
                                 bool norm_topk_prob, float routed_scaling_factor) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float sh[];
  float* s = sh;           // [E] scores
  float* choice = sh + E;  // [E] selection values
  __shared__ float red[32];
  __shared__ float group_score[64];
  __shared__ bool keep[64];
  __shared__ bool taken[kMaxExperts];
  __shared__ ArgMax warp_best[32];
  __shared__ int chosen[kMaxTopk];
  const int t = blockIdx.x, e = threadIdx.x;
  const bool live = e < E;
  const float l = live ? to_f32(logits[int64_t(t) * E + e]) : -INFINITY;
  float sv;
  if (softmax) {
    float mx = warp_max(l);
    __syncthreads();
    if ((e & 31) == 0) red[e >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) mx = fmaxf(mx, red[w]);
    const float ex = live ? expf(l - mx) : 0.0f;
    sv = ex / block_sum(ex, red);
  } else {
    sv = 1.0f / (1.0f + expf(-l));
  }
  if (live) {
    s[e] = sv;
    choice[e] = sv + (method == int(TopkMethod::NoauxTc) ? to_f32(bias[e]) : 0.0f);
    taken[e] = false;
  }
  __syncthreads();
  if (method != int(TopkMethod::Greedy) && G > 1) {
    const int per = E / G;
    if (e < G) {
      float a = -INFINITY, b = -INFINITY;
      for (int i = 0; i < per; ++i) {
        const float c = choice[e * per + i];
        if (c > a) {
          b = a;
          a = c;
        } else if (c > b) {
          b = c;
        }
      }
      group_score[e] = method == int(TopkMethod::NoauxTc) ? a + b : a;
      keep[e] = false;
    }
    __syncthreads();
    if (e == 0)
      for (int r = 0; r < topk_group; ++r) {
        int best = -1;
        for (int g = 0; g < G; ++g)
          if (!keep[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
        keep[best] = true;
      }
    __syncthreads();
    if (live && !keep[e / per]) choice[e] = -INFINITY;
    __syncthreads();
  }
  for (int r = 0; r < K; ++r) {
    ArgMax a{-INFINITY, 0x7fffffff};
    if (live && !taken[e]) a = ArgMax{choice[e], e};
    a = warp_argmax(a);
    if ((e & 31) == 0) warp_best[e >> 5] = a;
    __syncthreads();
    if (e == 0) {
      ArgMax b = warp_best[0];
      for (int w = 1; w < int(blockDim.x >> 5); ++w) b = better(b, warp_best[w]);
      chosen[r] = b.i;
      taken[b.i] = true;
    }
    __syncthreads();
  }
  if (e == 0) {
    double sum = 0.0;
    for (int i = 0; i < K; ++i) sum += s[chosen[i]];
    for (int i = 0; i < K; ++i) {
      float w = s[chosen[i]];
      if (norm_topk_prob) w = float(w / (sum + 1e-20));
      topk_ids[int64_t(t) * K + i] = chosen[i];
      topk_weights[int64_t(t) * K + i] = w * routed_scaling_factor;
    }
  }
}

// addend (nullptr: none) [n, D] F32: out = acc + addend, one F32 addition after the slot sum.
template <typename To>
__global__ void moe_combine_kernel(To* __restrict__ out, const float* __restrict__ y,
                                   const int32_t* __restrict__ inv, const float* __restrict__ w,
                                   int K, int64_t D, const float* __restrict__ addend) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) acc += w[t * K + i] * y[int64_t(inv[t * K + i]) * D + d];
    if (addend) acc += addend[t * D + d];
    out[t * D + d] = from_f32<To>(acc);
  }
}

// The same sum, four consecutive columns a thread (16-byte loads of y), a 2-D grid [n, D/4/128]
// so that a decode batch (n = 64) fills the card, and the K slots' row indices and weights read
// once a thread: all of a slot group's loads issue before its FMAs. The per-value arithmetic and
// the slot order are moe_combine_kernel's (acc = 0, then acc += w_i · y_i for i = 0..K−1).
// Why: one block a token striding over D waited out a load latency per 256 columns; the H100
// measured 53 µs a layer at B = 64 (14.7 MB: ~5 µs at the copy rate), 222 µs at 2048 tokens.
// Preconditions: D % 4 == 0, y, addend and out rows 16- (F32) / 8-byte (BF16) aligned
// (launch_moe_combine checks, else moe_combine_kernel).
constexpr int kCombineThreads = 128;
template <typename To>
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_vec_kernel(To* __restrict__ out, const float* __restrict__ y,
                           const int32_t* __restrict__ inv, const float* __restrict__ w, int K,
                           int64_t D, const float* __restrict__ addend) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t c = 4 * (int64_t(blockIdx.y) * kCombineThreads + threadIdx.x);  // first column
  if (c >= D) return;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  constexpr int kSlotGroup = 8;  // slots whose loads are in flight together (V3's top-8: all)
  for (int i0 = 0; i0 < K; i0 += kSlotGroup) {
    float4 v[kSlotGroup];
    float wi[kSlotGroup];
#pragma unroll
    for (int j = 0; j < kSlotGroup; ++j)
      if (i0 + j < K) {
        wi[j] = w[t * K + i0 + j];
        v[j] = *reinterpret_cast<const float4*>(y + int64_t(inv[t * K + i0 + j]) * D + c);
      }
#pragma unroll
    for (int j = 0; j < kSlotGroup; ++j)
      if (i0 + j < K) {
        acc[0] += wi[j] * v[j].x;
        acc[1] += wi[j] * v[j].y;
        acc[2] += wi[j] * v[j].z;
        acc[3] += wi[j] * v[j].w;
      }
  }
  if (addend) {
    const float4 a = *reinterpret_cast<const float4*>(addend + t * D + c);
    acc[0] += a.x;
    acc[1] += a.y;
    acc[2] += a.z;
    acc[3] += a.w;
  }
  store4(out + t * D + c, acc);  // BF16 out: round to nearest even, as from_f32
}

// out [n, D] (F32 / BF16) = the combine of y [n·K, D] F32 through inv [n, K] and the weights
// [n, K] (+ addend [n, D] F32 when given): the vector kernel where its preconditions hold, else the
// strided one.
void launch_moe_combine(Tensor out, const float* y, const int32_t* inv, const float* w, int64_t n,
                        int64_t K, int64_t D, const float* addend) {
  const int64_t e = dtype_size(out.dtype);
  const bool vec = rows_aligned(y, D, 4, 16) && rows_aligned(out.data, D, e, 4 * e) &&
                   rows_aligned(addend, D, 4, 16);
  const unsigned col_blocks = unsigned((D / 4 + kCombineThreads - 1) / kCombineThreads);
  OSPREY_DISPATCH_FLOAT(out.dtype, To, {
    if (vec)
      launch_pdl(moe_combine_vec_kernel<To>, dim3(unsigned(n), col_blocks), kCombineThreads, 0,
                 static_cast<To*>(out.data), y, inv, w, int(K), D, addend);
    else
      launch_pdl(moe_combine_kernel<To>, unsigned(n), 256, 0, static_cast<To*>(out.data), y, inv, w,
                 int(K), D, addend);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

constexpr int64_t kMoeAlign = 16;  // bytes: the GEMMs' vector loads and stores

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kMoeAlign == 0;
}

// Checks one expert linear against the list's form and returns its scale pointer (null for BF16).
const float* check_expert_linear(const LinearWeight& w, DType type, int64_t out, int64_t in,
                                 size_t e, const char* name) {
  OSPREY_CHECK(w.weight.device == Device::CUDA && w.weight.dtype == type &&
                   w.weight.shape == Shape({out, in}) && aligned(w.weight.data),
               "moe_experts: expert ", e, " ", name, " is ", dtype_name(w.weight.dtype), " ",
               shape_str(w.weight.shape), "; every expert needs a 16-byte-aligned device ",
               dtype_name(type), " [", out, ", ", in, "]");
  if (type != DType::F8_E4M3) return nullptr;
  const Shape scales = {(out + kFp8BlockSize - 1) / kFp8BlockSize,
                        (in + kFp8BlockSize - 1) / kFp8BlockSize};
  OSPREY_CHECK(w.scale_inv.device == Device::CUDA && w.scale_inv.dtype == DType::F32 &&
                   w.scale_inv.shape == scales,
               "moe_experts: expert ", e, " ", name, " needs device F32 scales ", shape_str(scales),
               ", got ", shape_str(w.scale_inv.shape));
  return w.scale_inv.f32();
}

// The device array of an expert list's weight pointers, built on first use.
struct ExpertTable {
  std::vector<MoeExpertPtrs> host;  // [E] what dev holds
  MoeExpertPtrs* dev = nullptr;     // [E] on the device; never freed while the process lives,
  size_t capacity = 0;              //      like the scratch arena (one table per MoE layer)
  CUtensorMap* maps = nullptr;      // [E][3] gate, up, down of F8_E4M3 experts (capacity rows)
};

// Validates the list (host metadata only) and returns its device table, uploading it when the
// list is new or a pointer changed. Sets weight_type and I.
const MoeExpertPtrs* expert_table(const std::vector<MlpWeights>& experts, int64_t D,
                                  DType& weight_type, int64_t& I, bool& maps) {
  static std::mutex mu;
  static std::unordered_map<const MlpWeights*, ExpertTable> cache;  // key: the list's storage
  const std::lock_guard<std::mutex> lock(mu);
  weight_type = experts[0].gate.weight.dtype;
  I = experts[0].gate.out();
  OSPREY_CHECK(weight_type == DType::BF16 || weight_type == DType::F8_E4M3,
               "moe_experts on CUDA needs BF16 or F8_E4M3 expert weights, got ",
               dtype_name(weight_type));
  OSPREY_CHECK(
      D % 16 == 0 && I % 16 == 0 && I > 0,
      "moe_experts on CUDA needs hidden and expert widths that are multiples of 16, got D ", D,
      ", I ", I);
  auto ptrs_of = [&](size_t e) {  // validates expert e
    const MlpWeights& m = experts[e];
    return MoeExpertPtrs{m.gate.weight.data,
                         m.up.weight.data,
                         m.down.weight.data,
                         check_expert_linear(m.gate, weight_type, I, D, e, "gate"),
                         check_expert_linear(m.up, weight_type, I, D, e, "up"),
                         check_expert_linear(m.down, weight_type, D, I, e, "down")};
  };
  ExpertTable& t = cache[experts.data()];
  bool same = t.host.size() == experts.size();
  for (size_t e = 0; e < experts.size() && same; ++e) {
    MoeExpertPtrs p = ptrs_of(e);
    p.gate_map = t.host[e].gate_map;  // the maps follow from the pointers
    p.up_map = t.host[e].up_map;
    p.down_map = t.host[e].down_map;
    same = t.host[e] == p;
  }
  if (same) {
    maps = t.host[0].gate_map != nullptr;
    return t.dev;
  }
  t.host.clear();  // rebuilt only after every expert passed its checks
  for (size_t e = 0; e < experts.size(); ++e) t.host.push_back(ptrs_of(e));
  // CUDA graphs: built on the first (eager) call for a layer's experts, with a synchronous copy on
  // the legacy stream, so never inside a capture; a replacement bumps the epoch.
  if (t.capacity < experts.size()) {
    bump_device_memory_epoch();
    if (t.dev) {
      OSPREY_CUDA_CHECK(cudaDeviceSynchronize());  // an earlier launch may still read it
      OSPREY_CUDA_CHECK(cudaFree(t.dev));
    }
    OSPREY_CUDA_CHECK(cudaMalloc(&t.dev, experts.size() * sizeof(MoeExpertPtrs)));
    if (t.maps) OSPREY_CUDA_CHECK(cudaFree(t.maps));  // reallocated below at the new capacity
    t.maps = nullptr;                                 // if these experts take TMA maps
    t.capacity = experts.size();
  }
  // (TMA needs 16-byte aligned rows and bases; the kernels need D and I multiples of 128.)
  const bool tma =
      weight_type == DType::F8_E4M3 && D % 128 == 0 && I % 128 == 0 &&
      std::all_of(t.host.begin(), t.host.end(), [](const MoeExpertPtrs& p) {
        return (reinterpret_cast<uintptr_t>(p.gate) | reinterpret_cast<uintptr_t>(p.up) |
                reinterpret_cast<uintptr_t>(p.down)) %
                   16 ==
               0;
      });
  if (tma) {
    if (!t.maps) OSPREY_CUDA_CHECK(cudaMalloc(&t.maps, t.capacity * 3 * sizeof(CUtensorMap)));
    // The TMA maps of each expert's three e4m3 matrices (boxes of 128 rows × 128 K bytes, the
    // swap-AB kernels' weight tile), encoded on the host and uploaded with the table.
    std::vector<CUtensorMap> encoded(experts.size() * 3);
    for (size_t e = 0; e < experts.size(); ++e) {
      MoeExpertPtrs& p = t.host[e];
      encoded[3 * e] =
          hopper::tma_map_u8_2d_sw128(p.gate, uint64_t(D), uint64_t(I), uint64_t(D), 128);
      encoded[3 * e + 1] =
          hopper::tma_map_u8_2d_sw128(p.up, uint64_t(D), uint64_t(I), uint64_t(D), 128);
      encoded[3 * e + 2] =
          hopper::tma_map_u8_2d_sw128(p.down, uint64_t(I), uint64_t(D), uint64_t(I), 128);
      p.gate_map = t.maps + 3 * e;
      p.up_map = t.maps + 3 * e + 1;
      p.down_map = t.maps + 3 * e + 2;
    }
    OSPREY_CUDA_CHECK(cudaMemcpy(t.maps, encoded.data(), encoded.size() * sizeof(CUtensorMap),
                                 cudaMemcpyHostToDevice));
  }
  maps = tma;
  // Ordered after the earlier launches on the (legacy default) stream that read the old table.
  OSPREY_CUDA_CHECK(cudaMemcpy(t.dev, t.host.data(), experts.size() * sizeof(MoeExpertPtrs),
                               cudaMemcpyHostToDevice));
  return t.dev;
}
// moe_permute's outputs in one index allocation: perm [rows] | inv [rows] | offsets [E + 1] | pad |
// tiles [max_tiles] (16-byte aligned).
struct MoeIndex {
  int32_t* perm;     // [rows] sorted row → t·K + slot
  int32_t* inv;      // [rows] t·K + slot → sorted row
  int32_t* offsets;  // [E + 1]
  MoeTile* tiles;    // [max_tiles]
};
MoeIndex moe_index_scratch(int64_t rows, int64_t E, int64_t max_tiles) {
  const int64_t tiles_at = (2 * rows + E + 1 + 3) / 4 * 4;  // in int32: 16-byte aligned tiles
  auto* index = static_cast<int32_t*>(
      scratch(kScratchMoeIndex, size_t(tiles_at + 4 * max_tiles) * sizeof(int32_t)));
  return {index, index + rows, index + 2 * rows, reinterpret_cast<MoeTile*>(index + tiles_at)};
}
// The FP8 swap-AB path of moe_experts (see the header): same permutation contract with tiles of
// tile_rows rows (16 at decode, 64 for prefill chunks), the swap-AB kernels, the same combine.
void moe_experts_fp8_swapab(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                            const MoeExpertPtrs* table, bool maps, int64_t E, int64_t D, int64_t I,
                            int tile_rows, const float* addend) {
  const int64_t n = x.size(0), K = topk_ids.size(1), rows = n * K;
  const int64_t max_tiles = moe_max_tiles(rows, E, tile_rows);
  const MoeIndex ix = moe_index_scratch(rows, E, max_tiles);
  int32_t *perm = ix.perm, *inv = ix.inv, *offsets = ix.offsets;
  MoeTile* tiles = ix.tiles;
  const int64_t dg = D / kFp8BlockSize, ig = I / kFp8BlockSize;
  const size_t x8_bytes = size_t(n * D + 15) / 16 * 16;
  auto* x8 = static_cast<uint8_t*>(
      scratch(kScratchMoeX8, x8_bytes + size_t(n * dg) * sizeof(float)));  // [n, D] e4m3
  auto* xs = reinterpret_cast<float*>(x8 + x8_bytes);                      // [n, D/128]
  const size_t h8_bytes = size_t(rows * I + 15) / 16 * 16;
  auto* h8 = static_cast<uint8_t*>(
      scratch(kScratchMoeH8, h8_bytes + size_t(rows * ig) * sizeof(float)));  // [rows, I] e4m3
  auto* hs = reinterpret_cast<float*>(h8 + h8_bytes);                         // [rows, I/128]
  auto* y =
      static_cast<float*>(scratch(kScratchMoeY, size_t(rows * D) * sizeof(float)));  // [rows, D]
  launch_quantize_rows(x8, xs, x.data, x.dtype, n, D);
  launch_moe_permute(perm, inv, offsets, tiles, topk_ids.ptr<int32_t>(), int(rows), int(E),
                     int(max_tiles), tile_rows);
  launch_fp8_swapab_moe_gate_up(h8, hs, x8, xs, tiles, int(max_tiles), table, perm, int(K), D, I,
                                tile_rows, maps);
  launch_fp8_swapab_moe_down(y, h8, hs, tiles, int(max_tiles), table, D, I, tile_rows, maps);
  launch_moe_combine(out, y, inv, topk_weights.f32(), n, K, D, addend);
}
}  // namespace

void set_fp8_moe_prefill_swapab(bool on) {
  g_moe_prefill_swapab = on;
}
bool fp8_moe_prefill_swapab() {
  return g_moe_prefill_swapab;
}

void moe_route(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor correction_bias,
               const RouterParams& p) {
  check_device(router_logits, "moe_route", "router_logits");
  const int64_t n = router_logits.size(0);
  const int E = p.n_experts, K = p.top_k, G = p.n_group;
  const bool use_bias = p.method == TopkMethod::NoauxTc;
  OSPREY_CHECK(router_logits.size(1) == E && topk_ids.size(1) == K && topk_weights.size(1) == K &&
                   topk_ids.dtype == DType::I32 && topk_weights.dtype == DType::F32 &&
                   E <= kMaxExperts && K <= kMaxTopk && G <= 64 && E % G == 0 && K <= E,
               "moe_route shapes");
  OSPREY_CHECK(
      !use_bias || (correction_bias.numel() == E && correction_bias.device == Device::CUDA),
      "noaux_tc needs the correction bias on the device");
  if (n == 0) return;
  const int threads = (E + 31) / 32 * 32;
  const size_t smem = size_t(2 * E) * sizeof(float);
  const DType bias_type = use_bias ? correction_bias.dtype : DType::F32;
  OSPREY_DISPATCH_FLOAT(
      router_logits.dtype, Tl, OSPREY_DISPATCH_FLOAT(bias_type, Tb, {
        launch_pdl(moe_route_kernel<Tl, Tb>, unsigned(n), threads, smem, topk_ids.ptr<int32_t>(),
                   topk_weights.f32(), static_cast<const Tl*>(router_logits.data),
                   use_bias ? static_cast<const Tb*>(correction_bias.data) : nullptr, E, K, G,
                   p.topk_group, p.scoring == ScoringFunc::Softmax, int(p.method), p.norm_topk_prob,
                   p.routed_scaling_factor);
      }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

void moe_experts(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                 const std::vector<MlpWeights>& experts, Tensor addend) {
  check_device(x, "moe_experts", "x");
  if (addend.data) check_device(addend, "moe_experts", "addend");
  check_device(out, "moe_experts", "out");
  check_device(topk_ids, "moe_experts", "topk_ids");
  check_device(topk_weights, "moe_experts", "topk_weights");
  const int64_t n = x.size(0), D = x.size(1), K = topk_ids.size(1);
  const int64_t E = int64_t(experts.size()), rows = n * K;
  OSPREY_CHECK(out.size(0) == n && out.size(1) == D && topk_ids.size(0) == n &&
                   topk_weights.size(0) == n && topk_weights.size(1) == K &&
                   topk_ids.dtype == DType::I32 && topk_weights.dtype == DType::F32 &&
                   is_f32_or_bf16(x.dtype) && is_f32_or_bf16(out.dtype) && aligned(x.data) &&
                   E >= 1 && E <= kMaxExperts && rows < (int64_t(1) << 31),
               "moe_experts: x ", shape_str(x.shape), " ", dtype_name(x.dtype), ", out ",
               shape_str(out.shape), ", topk_ids ", shape_str(topk_ids.shape), ", ", E, " experts");
  OSPREY_CHECK(addend.data == nullptr || (addend.numel() == n * D && addend.dtype == DType::F32),
               "moe_experts: addend ", shape_str(addend.shape), " ", dtype_name(addend.dtype),
               " for out ", shape_str(out.shape), " (F32 [n, D])");
  const float* addend_f32 = addend.data ? addend.f32() : nullptr;
  if (n == 0) return;
  DType weight_type = DType::BF16;
  int64_t I = 0;
  bool maps = false;
  const MoeExpertPtrs* table = expert_table(experts, D, weight_type, I, maps);
  if (weight_type == DType::F8_E4M3 && fp8_swapab_enabled() && device_is_sm90() &&
      D % kFp8BlockSize == 0 && I % kFp8BlockSize == 0 &&
      (n <= kSwapAbMoeMaxTokens || g_moe_prefill_swapab)) {
    moe_experts_fp8_swapab(
        out, x, topk_ids, topk_weights, table, maps, E, D, I,
        n <= kSwapAbMoeMaxTokens ? kSwapAbMoeTileRows : kSwapAbMoePrefillTileRows, addend_f32);
    return;
  }
  const int64_t max_tiles = moe_max_tiles(rows, E);
  const MoeIndex ix = moe_index_scratch(rows, E, max_tiles);
  int32_t *perm = ix.perm, *inv = ix.inv, *offsets = ix.offsets;
  MoeTile* tiles = ix.tiles;
  void* h = scratch(kScratchMoeHidden, size_t(rows * I) * sizeof(bf16));  // [rows, I] BF16
  auto* y =
      static_cast<float*>(scratch(kScratchMoeY, size_t(rows * D) * sizeof(float)));  // [rows, D]
  launch_moe_permute(perm, inv, offsets, tiles, topk_ids.ptr<int32_t>(), int(rows), int(E),
                     int(max_tiles));
  launch_moe_gate_up(h, x.data, x.dtype, weight_type, tiles, int(max_tiles), table, perm, int(K), D,
                     I);
  launch_moe_down(y, h, weight_type, tiles, int(max_tiles), table, D, I);
  launch_moe_combine(out, y, inv, topk_weights.f32(), n, K, D, addend_f32);
}

}  // namespace osprey::ops::cuda
