// The split-KV plan kernel, its fingerprint cache, and the combine kernel (math in split_kv.cuh).
//
// mla_plan_kernel: one block of kPlanThreads; a block-wide scan over the tokens in chunks of
//   kPlanThreads (the blocks per token), the runs' first blocks (a thread a run, a binary search
//   over the tokens' costs: ops/mla_plan.h, also the host reference), then a second scan (each
//   token's runs, by binary search over part_start in shared memory, and the partial slots).
// mla_combine_kernel: grid [min(n_tokens, n_parts − 1), H / heads], heads × 128 threads; block
//   (k, y) merges split token split_list[1 + k] (blocks past the count split_list[0] return at
//   once), heads y·heads .. of it, 128 threads a head, 4 of the kv_lora = 512 columns a thread.
//   out = Σ_s 2^(lse_s − M) · o_s / Σ_s 2^(lse_s − M), M = max_s lse_s (each warp of a head
//   reduces M and the sum over the ≤ n_parts splits itself), lse = (M + log2 Σ_s 2^(lse_s − M))
//   · ln 2. The partials are summed in split order. A token of at most kUnroll splits (a decode
//   batch of many sequences: 2–3) is merged in one round of loads, M and the sum in each thread;
//   more (B = 1: up to n_parts) in rounds of kUnroll loads after the warps' reductions of M and
//   the sum. kUnroll = kCombineFewSplits for batches of more than kCombineFewTokens tokens,
//   kCombineUnroll otherwise.
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hopper/pdl.cuh"
#include "ops/cuda/mla/hooks.h"
#include "ops/cuda/mla/split_kv.cuh"

namespace osprey::ops::cuda {

namespace {
constexpr int kPlanThreads = 1024;
// Heads a combine block: 1 when few tokens can be split (B = 1 decode: 128 blocks over the one
// token's 8 MB of partials instead of 32), 4 otherwise (fewer blocks that exit at once).
constexpr int kCombineFewTokens = 16;
constexpr int kCombineMaxHeads = 4;
constexpr int kCombineThreadsPerHead = 128;  // 4 of the 512 latent columns a thread
// Splits whose partial loads a thread has in flight at once (predicated past ns). B = 1: 32
// splits × 128 heads × 512 F32 = 8 MB just written (in L2); 16K threads × 4 loads of 16 B in
// flight took 11.1 µs (H200, Nsight Compute: 8 rounds of L2 latency a thread), so 16: 2 rounds.
constexpr int kCombineUnroll = 16;
// Many split tokens (a decode batch of B > kCombineFewTokens sequences over n_parts runs): each
// token has 2–3 splits, so the blocks are 4 heads of 128 threads whose one round of loads holds
// up to kCombineFewSplits splits; at kCombineUnroll's 128 registers a thread only one 512-thread
// block fits an SM (H100, B = 56: 1,792 blocks in 14 waves, 32 µs a layer, Nsight Compute), so
// the launch bound asks for kCombineFewSplitsBlocks blocks an SM (≤ 42 registers a thread).
constexpr int kCombineFewSplits = 4;
constexpr int kCombineFewSplitsBlocks = 3;
constexpr float kLn2 = 0.6931471805599453f;

__global__ void __launch_bounds__(kPlanThreads)
    mla_plan_kernel(int32_t* __restrict__ cum, int32_t* __restrict__ split_base,
                    int32_t* __restrict__ part_start_out, int32_t* __restrict__ first_part,
                    int32_t* __restrict__ n_splits, int32_t* __restrict__ split_list,
                    const int32_t* __restrict__ positions, int n_tokens, int32_t clamp, int n_parts,
                    int32_t fixed) {
  pdl_wait();
  pdl_trigger();
  using Scan = cub::BlockScan<int32_t, kPlanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int32_t carry, carry_split, pl;
  __shared__ int32_t part_start[kMlaMaxParts + 1];
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < n_tokens; base += kPlanThreads) {
    const int t = base + int(threadIdx.x);
    int32_t nb = 0;
    if (t < n_tokens) nb = mla_token_blocks(positions[t], clamp);
    int32_t excl = 0, sum = 0;
    Scan(tmp).ExclusiveSum(nb, excl, sum);
    if (t < n_tokens) cum[t] = carry + excl;
    __syncthreads();
    if (threadIdx.x == 0) carry += sum;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    cum[n_tokens] = carry;
    pl = ops::mla_plan_payload(carry, n_tokens, fixed, n_parts);
    carry = 0;
  }
  __syncthreads();  // cum (global, this block's writes) and pl are visible to every thread now
  for (int p = int(threadIdx.x); p <= n_parts; p += kPlanThreads) {
    const int32_t s0 = ops::mla_part_start(p, cum, n_tokens, fixed, n_parts, pl);
    part_start[p] = s0;
    part_start_out[p] = s0;
  }
  __syncthreads();
  if (threadIdx.x == 0) carry_split = 0;
  for (int base = 0; base < n_tokens; base += kPlanThreads) {
    const int t = base + int(threadIdx.x);
    int32_t slots = 0;
    if (t < n_tokens) {
      const int f = ops::mla_part_of(part_start, n_parts, cum[t]);
      const int l = ops::mla_part_of(part_start, n_parts, cum[t + 1] - 1);
      first_part[t] = f;
      n_splits[t] = l - f + 1;
      slots = l > f ? l - f + 1 : 0;
    }
    int32_t excl = 0, sum = 0;
    Scan(tmp).ExclusiveSum(slots, excl, sum);
    if (t < n_tokens) split_base[t] = carry + excl;
    __syncthreads();  // tmp is reused by the next scan
    // The split tokens in order: split_list[1 + j] = the j-th token with more than one run.
    const int32_t is_split = slots > 0 ? 1 : 0;
    int32_t sexcl = 0, ssum = 0;
    Scan(tmp).ExclusiveSum(is_split, sexcl, ssum);
    if (is_split) split_list[1 + carry_split + sexcl] = t;
    __syncthreads();
    if (threadIdx.x == 0) {
      carry += sum;
      carry_split += ssum;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    split_base[n_tokens] = carry;
    split_list[0] = carry_split;
  }
}

// One head's merge, 4 latent columns a thread (kv_lora = 4 · kCombineThreadsPerHead).
// acc += w · v, column by column.
__device__ __forceinline__ void axpy4(float4& acc, float w, const float4& v) {
  acc.x += w * v.x;
  acc.y += w * v.y;
  acc.z += w * v.z;
  acc.w += w * v.w;
}
// The thread's 4 output columns at o, and the head's lse (base e) from its first thread.
template <typename To>
__device__ __forceinline__ void write_merged(To* o, float4 a, float* lse, int64_t lse_at,
                                             bool first, float lse_e) {
  o[0] = from_f32<To>(a.x);
  o[1] = from_f32<To>(a.y);
  o[2] = from_f32<To>(a.z);
  o[3] = from_f32<To>(a.w);
  if (lse && first) lse[lse_at] = lse_e;
}

template <typename To, int kUnroll>
__global__ void __launch_bounds__(kCombineMaxHeads* kCombineThreadsPerHead,
                                  kUnroll <= kCombineFewSplits ? kCombineFewSplitsBlocks : 1)
    mla_combine_kernel(To* __restrict__ out, float* __restrict__ lse,
                       const float* __restrict__ part_o, const float* __restrict__ part_lse,
                       const int32_t* __restrict__ n_splits, const int32_t* __restrict__ split_base,
                       const int32_t* __restrict__ split_list, int H, int kv_lora) {
  pdl_wait();
  pdl_trigger();
  const int k = int(blockIdx.x);
  if (k >= split_list[0]) return;
  const int t = split_list[1 + k];
  const int heads = int(blockDim.x) / kCombineThreadsPerHead;
  const int h = int(blockIdx.y) * heads + int(threadIdx.x) / kCombineThreadsPerHead;
  const int ht = int(threadIdx.x) % kCombineThreadsPerHead, lane = int(threadIdx.x) & 31;
  if (h >= H) return;
  const int ns = n_splits[t];
  const int slot0 = split_base[t];
  const float* lse_s = part_lse + int64_t(slot0) * H + h;  // split s at lse_s[s·H]
  const int64_t o_stride = int64_t(H) * kv_lora;  // floats between one split's partial and the next
  const float* po = part_o + (int64_t(slot0) * H + h) * kv_lora + ht * 4;
  To* o = out + (int64_t(t) * H + h) * kv_lora + ht * 4;
  const int64_t lse_at = int64_t(t) * H + h;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  if (ns <= kUnroll) {
    // Every split's partial and lse loaded in one round (a decode batch of many sequences: 2–3
    // splits a token), M and the sum over them in split order in each thread.
    float4 v[kUnroll];
    float w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool ok = u < ns;
      v[u] = ok ? __ldcg(reinterpret_cast<const float4*>(po + int64_t(u) * o_stride)) : zero;
      w[u] = ok ? lse_s[int64_t(u) * H] : -INFINITY;
    }
    float M = -INFINITY;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) M = fmaxf(M, w[u]);
    if (M == -INFINITY) {  // nothing attended in any split
      write_merged(o, zero, lse, lse_at, ht == 0, -INFINITY);
      return;
    }
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      w[u] = u < ns ? exp2f(w[u] - M) : 0.0f;
      sum += w[u];
    }
    const float inv = 1.0f / sum;
    float4 acc = zero;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) axpy4(acc, w[u] * inv, v[u]);
    write_merged(o, acc, lse, lse_at, ht == 0, (M + log2f(sum)) * kLn2);
    return;
  }
  // More splits than one round holds (B = 1: up to n_parts): M and Σ 2^(lse_s − M), each warp on
  // its own (lanes over the splits, then a warp reduction), then the partials kUnroll at a time.
  float M = -INFINITY;
  for (int s = lane; s < ns; s += 32) M = fmaxf(M, lse_s[int64_t(s) * H]);
  M = warp_max(M);
  if (M == -INFINITY) {
    write_merged(o, zero, lse, lse_at, ht == 0, -INFINITY);
    return;
  }
  float part = 0.0f;
  for (int s = lane; s < ns; s += 32) part += exp2f(lse_s[int64_t(s) * H] - M);
  // the same total in every lane, and in every warp of the head (the same lane order)
  const float wsum = warp_sum(part);
  const float inv = 1.0f / wsum;
  // Loads in flight a round: kUnroll, or 2 in the few-splits variant (whose register bound
  // leaves no room for 4 more float4s here: 92 bytes spilled).
  constexpr int kRound = kUnroll <= kCombineFewSplits ? 2 : kUnroll;
  float4 acc = zero;
#pragma unroll 1
  for (int s = 0; s < ns; s += kRound) {
    float4 v[kRound];
    float w[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const bool ok = s + u < ns;
      v[u] = ok ? __ldcg(reinterpret_cast<const float4*>(po + int64_t(s + u) * o_stride)) : zero;
      w[u] = ok ? lse_s[int64_t(s + u) * H] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      if (s + u >= ns) break;
      axpy4(acc, exp2f(w[u] - M) * inv, v[u]);
    }
  }
  write_merged(o, acc, lse, lse_at, ht == 0, (M + log2f(wsum)) * kLn2);
}

// The cached plan: one grow-only device allocation and the key it was built for.
struct PlanCache {
  // [cum: n + 1 | split_base: n + 1 | first_part: n | n_splits: n | part_start: n_parts + 1 |
  //  split_list: n_parts (the count, then the split tokens: at most n_parts − 1)]
  int32_t* buf = nullptr;
  int64_t capacity = 0;  // int32 entries
  bool valid = false;
  uint64_t fingerprint = 0;
  int n_tokens = 0, n_parts = 0;
  int64_t clamp = 0;
  int32_t fixed = 0;
};
PlanCache g_plan;
int64_t g_plan_builds = 0;
bool g_combine_few_splits = [] {
  const char* e = std::getenv("OSPREY_MLA_COMBINE");
  if (!e || !*e || std::strcmp(e, "one-round") == 0) return true;
  OSPREY_CHECK(std::strcmp(e, "rounds") == 0,
               "OSPREY_MLA_COMBINE must be one-round or rounds, not '", e, "'");
  return false;
}();
}  // namespace

bool set_mla_combine_few_splits(bool enabled) {
  const bool was = g_combine_few_splits;
  g_combine_few_splits = enabled;
  return was;
}
bool mla_combine_few_splits() {
  return g_combine_few_splits;
}

int64_t mla_plan_builds() {
  return g_plan_builds;
}

void invalidate_mla_plan_cache() {
  g_plan.valid = false;
}

MlaPlan mla_split_plan(const AttentionMeta& m, int64_t clamp, int n_parts, int32_t fixed) {
  const int n = m.n_tokens;
  OSPREY_CHECK(n_parts >= 1 && n_parts <= kMlaMaxParts && fixed >= 0, "MLA split plan: ", n_parts,
               " parts (1..", kMlaMaxParts, "), per-token cost ", fixed);
  const int64_t need = 4 * int64_t(n) + 2 + 2 * int64_t(n_parts) + 1;
  PlanCache& c = g_plan;
  // CUDA graphs: the runner forgets the cache before a capture, so layer 0 captures the plan
  // kernel (a node rebuilding the plan from device positions each replay); growth only in the eager
  // warm-up of a bucket (never inside a capture) and bumps the epoch (ops/cuda/graph_hooks.h).
  if (need > c.capacity) {
    bump_device_memory_epoch();
    if (c.buf) OSPREY_CUDA_CHECK(cudaFree(c.buf));  // synchronises: no kernel still reads it
    c.capacity = std::max<int64_t>(need, 2 * c.capacity);
    OSPREY_CUDA_CHECK(cudaMalloc(&c.buf, size_t(c.capacity) * sizeof(int32_t)));
    c.valid = false;
  }
  int32_t* const cum = c.buf;
  int32_t* const split_base = cum + n + 1;
  int32_t* const first_part = split_base + n + 1;
  int32_t* const n_splits = first_part + n;
  int32_t* const part_start = n_splits + n;
  int32_t* const split_list = part_start + n_parts + 1;
  const bool hit = c.valid && m.fingerprint != 0 && c.fingerprint == m.fingerprint &&
                   c.n_tokens == n && c.n_parts == n_parts && c.clamp == clamp && c.fixed == fixed;
  if (!hit) {
    launch_pdl(mla_plan_kernel, 1, kPlanThreads, 0, cum, split_base, part_start, first_part,
               n_splits, split_list, m.positions.ptr<int32_t>(), n,
               int32_t(std::min<int64_t>(clamp, INT32_MAX)), n_parts, fixed);
    OSPREY_CUDA_LAUNCH_CHECK();
    ++g_plan_builds;
    c.valid = true;
    c.fingerprint = m.fingerprint;
    c.n_tokens = n;
    c.n_parts = n_parts;
    c.clamp = clamp;
    c.fixed = fixed;
  }
  MlaPlan p;
  p.cum = cum;
  p.split_base = split_base;
  p.part_start = part_start;
  p.first_part = first_part;
  p.n_splits = n_splits;
  p.split_list = split_list;
  p.n_tokens = n;
  p.n_parts = n_parts;
  p.max_slots = std::max(1, 2 * (n_parts - 1));
  return p;
}

void mla_combine_splits(void* out, bool out_bf16, float* lse, const float* part_o,
                        const float* part_lse, const MlaPlan& plan, int H, int kv_lora) {
  if (plan.n_tokens == 0 || plan.n_parts <= 1) return;  // one part: no token is ever split
  OSPREY_CHECK(kv_lora == kCombineThreadsPerHead * 4, "MLA combine: kv_lora ", kv_lora,
               " (the kernel takes 512)");
  // At most n_parts − 1 tokens are split (each holds a run boundary inside its blocks).
  const int split_tokens = std::min(plan.n_tokens, plan.n_parts - 1);
  const int heads = split_tokens <= kCombineFewTokens ? 1 : kCombineMaxHeads;
  const dim3 grid(unsigned(split_tokens), unsigned((H + heads - 1) / heads));
  const unsigned threads = unsigned(heads * kCombineThreadsPerHead);
  const bool few_splits = heads == kCombineMaxHeads && g_combine_few_splits;
#define OSPREY_COMBINE(To, U)                                                                 \
  launch_pdl(mla_combine_kernel<To, U>, grid, threads, 0, static_cast<To*>(out), lse, part_o, \
             part_lse, plan.n_splits, plan.split_base, plan.split_list, H, kv_lora)
  if (out_bf16) {
    if (few_splits)
      OSPREY_COMBINE(bf16, kCombineFewSplits);
    else
      OSPREY_COMBINE(bf16, kCombineUnroll);
  } else {
    if (few_splits)
      OSPREY_COMBINE(float, kCombineFewSplits);
    else
      OSPREY_COMBINE(float, kCombineUnroll);
  }
#undef OSPREY_COMBINE
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
