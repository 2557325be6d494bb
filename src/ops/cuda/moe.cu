// CUDA mixture of experts (contract in ops/moe.h).
// moe_route: one fused kernel, one block per token (threads = E rounded up to a warp, E ≤ 1024):
//   logits (F32 or BF16, the router weight's dtype: no separate cast) → softmax/sigmoid in F32 →
//   + correction bias (noaux_tc) → group scores (top-2 sum or max; thread g scans group g) →
//   topk_group groups kept (thread 0) → k block-wide argmax rounds (value desc, index asc, as the CPU
//   twin's stable top-k) → weights s[chosen], renormalised (+1e-20), × routed_scaling_factor.
//   topk_ids [n, k] I32, topk_weights [n, k] F32; correction_bias [E] F32 or BF16.
// moe_experts (first version, grouped over routed tokens): the routed (token, slot) pairs are sorted
//   by expert on the host (one device→host copy of topk_ids: not graph-capturable yet); one gather
//   kernel copies the rows; per active expert, ops linear (cuBLASLt; FP8 block-scaled when the
//   weights are FP8) runs gate and up over its contiguous rows, silu_mul, then down into an F32
//   buffer [n·k, D]; moe_combine_kernel (grid [n], 256 threads) sums out[t] = Σ_i w_i · y[(t, i)] in
//   slot order (deterministic, no atomics). x, out: F32 or BF16.
#include <algorithm>
#include <vector>

#include "core/device_buffer.h"
#include "ops/activation.h"
#include "ops/cuda/common.cuh"
#include "ops/moe.h"

namespace osprey::ops::cuda {

void linear(Tensor y, Tensor x, const LinearWeight& w);
void silu_mul(Tensor out, Tensor gate, Tensor up);

namespace {
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopk = 32;

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
  extern __shared__ float sh[];
  float* s = sh;              // [E] scores
  float* choice = sh + E;     // [E] selection values
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

template <typename T>
__global__ void moe_gather_kernel(T* __restrict__ xs, const T* __restrict__ x,
                                  const int32_t* __restrict__ perm, int K, int64_t D) {
  const int64_t r = blockIdx.x, t = perm[r] / K;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) xs[r * D + d] = x[t * D + d];
}

template <typename To>
__global__ void moe_combine_kernel(To* __restrict__ out, const float* __restrict__ y,
                                   const int32_t* __restrict__ inv, const float* __restrict__ w,
                                   int K, int64_t D) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < K; ++i) acc += w[t * K + i] * y[int64_t(inv[t * K + i]) * D + d];
    out[t * D + d] = from_f32<To>(acc);
  }
}
}  // namespace

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
  OSPREY_CHECK(!use_bias || (correction_bias.numel() == E && correction_bias.device == Device::CUDA),
               "noaux_tc needs the correction bias on the device");
  if (n == 0) return;
  const int threads = (E + 31) / 32 * 32;
  const size_t smem = size_t(2 * E) * sizeof(float);
  const DType bias_type = use_bias ? correction_bias.dtype : DType::F32;
  OSPREY_DISPATCH_FLOAT(router_logits.dtype, Tl, OSPREY_DISPATCH_FLOAT(bias_type, Tb, {
    moe_route_kernel<Tl, Tb><<<unsigned(n), threads, smem, stream()>>>(
        topk_ids.ptr<int32_t>(), topk_weights.f32(), static_cast<const Tl*>(router_logits.data),
        use_bias ? static_cast<const Tb*>(correction_bias.data) : nullptr, E, K, G, p.topk_group,
        p.scoring == ScoringFunc::Softmax, int(p.method), p.norm_topk_prob,
        p.routed_scaling_factor);
  }));
  OSPREY_CUDA_LAUNCH_CHECK();
}

void moe_experts(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                 const std::vector<MlpWeights>& experts) {
  check_device(x, "moe_experts", "x");
  check_device(topk_ids, "moe_experts", "topk_ids");
  check_device(topk_weights, "moe_experts", "topk_weights");
  const int64_t n = x.size(0), D = x.size(1), K = topk_ids.size(1);
  OSPREY_CHECK(out.size(0) == n && out.size(1) == D && !experts.empty(), "moe_experts shapes");
  if (n == 0) return;
  const int64_t rows = n * K, I = experts[0].gate.out();
  // Sort the routed (token, slot) pairs by expert on the host.
  std::vector<int32_t> ids(size_t(rows), 0);
  OSPREY_CUDA_CHECK(cudaMemcpy(ids.data(), topk_ids.data, size_t(rows) * sizeof(int32_t),
                               cudaMemcpyDeviceToHost));
  std::vector<int64_t> count(experts.size() + 1, 0);
  for (int32_t e : ids) {
    OSPREY_CHECK(e >= 0 && size_t(e) < experts.size(), "expert id ", e);
    ++count[size_t(e) + 1];
  }
  for (size_t e = 0; e < experts.size(); ++e) count[e + 1] += count[e];
  std::vector<int32_t> index(size_t(2 * rows));  // perm (sorted row → t·K + slot), then its inverse
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = fill[size_t(ids[size_t(i)])]++;
    index[size_t(r)] = int32_t(i);
    index[size_t(rows + i)] = int32_t(r);
  }
  auto* dev_index = static_cast<int32_t*>(scratch(kScratchMoeIndex, index.size() * sizeof(int32_t)));
  OSPREY_CUDA_CHECK(cudaMemcpy(dev_index, index.data(), index.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
  const size_t xsz = dtype_size(x.dtype);
  Tensor xs{scratch(kScratchMoeRows, size_t(rows * D) * xsz), x.dtype, {rows, D}, Device::CUDA};
  Tensor g{scratch(kScratchMoeGate, size_t(rows * I) * sizeof(float)), DType::F32, {rows, I}, Device::CUDA};
  Tensor u{scratch(kScratchMoeUp, size_t(rows * I) * sizeof(float)), DType::F32, {rows, I}, Device::CUDA};
  Tensor y{scratch(kScratchMoeY, size_t(rows * D) * sizeof(float)), DType::F32, {rows, D}, Device::CUDA};
  OSPREY_DISPATCH_FLOAT(x.dtype, T, {
    moe_gather_kernel<T><<<unsigned(rows), 256, 0, stream()>>>(
        static_cast<T*>(xs.data), static_cast<const T*>(x.data), dev_index, int(K), D);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
  for (size_t e = 0; e < experts.size(); ++e) {
    const int64_t r0 = count[e], r1 = count[e + 1];
    if (r0 == r1) continue;
    OSPREY_CHECK(experts[e].gate.out() == I, "experts of different widths");
    Tensor ge = g.rows(r0, r1), ue = u.rows(r0, r1);
    linear(ge, xs.rows(r0, r1), experts[e].gate);
    linear(ue, xs.rows(r0, r1), experts[e].up);
    silu_mul(ge, ge, ue);
    linear(y.rows(r0, r1), ge, experts[e].down);
  }
  OSPREY_DISPATCH_FLOAT(out.dtype, To, {
    moe_combine_kernel<To><<<unsigned(n), 256, 0, stream()>>>(
        static_cast<To*>(out.data), y.f32(), dev_index + rows, topk_weights.f32(), int(K), D);
  });
  OSPREY_CUDA_LAUNCH_CHECK();
}

}  // namespace osprey::ops::cuda
