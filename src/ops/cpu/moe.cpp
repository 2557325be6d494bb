// CPU MoE: routing per token in F32, then each expert runs once over the tokens routed to it.
// router_logits F32 (the CPU model's: its weights are F32) or BF16 (the CUDA model's dtype): a BF16
// row is widened to F32 (exact) and routed as an F32 row, so routing BF16 logits is the same as
// rounding F32 logits to BF16 and routing those.
#include "ops/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/activation.h"
#include "ops/tensor_ops.h"

namespace osprey::ops::cpu {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Indices of the k largest values (ties: lower index first), largest first.
std::vector<int> top_indices(const std::vector<float>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return v[size_t(a)] != v[size_t(b)] ? v[size_t(a)] > v[size_t(b)] : a < b;
  });
  idx.resize(size_t(k));
  return idx;
}
}  // namespace

void moe_route(Tensor topk_ids, Tensor topk_weights, Tensor router_logits, Tensor correction_bias,
               const RouterParams& p) {
  const int64_t n = router_logits.size(0);
  const int E = p.n_experts, K = p.top_k, G = p.n_group, per_group = E / G;
  OSPREY_CHECK(router_logits.size(1) == E && topk_ids.size(1) == K && topk_weights.size(1) == K,
               "moe_route shapes");
  OSPREY_CHECK(router_logits.dtype == DType::F32 || router_logits.dtype == DType::BF16,
               "moe_route: router_logits must be F32 or BF16, got ",
               dtype_name(router_logits.dtype));
  const bool use_bias = p.method == TopkMethod::NoauxTc;
  OSPREY_CHECK(!use_bias || correction_bias.numel() == E, "noaux_tc needs the correction bias");
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E)),
      group_score(static_cast<size_t>(G)), widened(static_cast<size_t>(E));  // [E] each
  for (int64_t t = 0; t < n; ++t) {
    const float* l = nullptr;  // [E] token t's logits in F32
    if (router_logits.dtype == DType::F32) {
      l = router_logits.f32() + t * E;
    } else {
      const uint16_t* b = router_logits.ptr<uint16_t>() + t * E;
      for (int e = 0; e < E; ++e) widened[size_t(e)] = bf16_to_f32(b[e]);
      l = widened.data();
    }
    if (p.scoring == ScoringFunc::Softmax) {
      float mx = kNegInf;
      for (int e = 0; e < E; ++e) mx = std::max(mx, l[e]);
      double sum = 0.0;
      for (int e = 0; e < E; ++e) sum += std::exp(double(l[e] - mx));
      for (int e = 0; e < E; ++e) s[size_t(e)] = float(std::exp(double(l[e] - mx)) / sum);
    } else {
      for (int e = 0; e < E; ++e) s[size_t(e)] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    for (int e = 0; e < E; ++e)
      choice[size_t(e)] = s[size_t(e)] + (use_bias ? correction_bias.f32()[e] : 0.0f);
    if (p.method != TopkMethod::Greedy && G > 1) {
      for (int g = 0; g < G; ++g) {
        const float* c = choice.data() + g * per_group;
        if (p.method == TopkMethod::NoauxTc) {
          float a = kNegInf, b = kNegInf;  // the two largest
          for (int i = 0; i < per_group; ++i) {
            if (c[i] > a) {
              b = a;
              a = c[i];
            } else if (c[i] > b) {
              b = c[i];
            }
          }
          group_score[size_t(g)] = a + b;
        } else {
          group_score[size_t(g)] = *std::max_element(c, c + per_group);
        }
      }
      std::vector<bool> keep(size_t(G), false);
      for (int g : top_indices(group_score, p.topk_group)) keep[size_t(g)] = true;
      for (int e = 0; e < E; ++e)
        if (!keep[size_t(e / per_group)]) choice[size_t(e)] = kNegInf;
    }
    const std::vector<int> chosen = top_indices(choice, K);
    float* w = topk_weights.f32() + t * K;
    int32_t* ids = topk_ids.ptr<int32_t>() + t * K;
    double sum = 0.0;
    for (int i = 0; i < K; ++i) {
      ids[i] = chosen[size_t(i)];
      w[i] = s[size_t(chosen[size_t(i)])];
      sum += w[i];
    }
    for (int i = 0; i < K; ++i) {
      if (p.norm_topk_prob) w[i] = float(w[i] / (sum + 1e-20));
      w[i] *= p.routed_scaling_factor;
    }
  }
}

void moe_experts(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights,
                 const std::vector<MlpWeights>& experts, Tensor addend) {
  const int64_t n = x.size(0), D = x.size(1), K = topk_ids.size(1);
  OSPREY_CHECK(out.size(0) == n && out.size(1) == D, "moe_experts shapes");
  OSPREY_CHECK(addend.data == nullptr || (addend.numel() == n * D && addend.dtype == DType::F32),
               "moe_experts: addend ", shape_str(addend.shape), " for out ", shape_str(out.shape));
  std::fill_n(out.f32(), n * D, 0.0f);
  const int32_t* ids = topk_ids.ptr<int32_t>();
  const float* w = topk_weights.f32();
  for (size_t e = 0; e < experts.size(); ++e) {
    std::vector<int64_t> rows;  // (token, slot) pairs routed to e, as t*K + slot
    for (int64_t i = 0; i < n * K; ++i)
      if (ids[i] == int32_t(e)) rows.push_back(i);
    if (rows.empty()) continue;
    const int64_t m = int64_t(rows.size()), I = experts[e].gate.out();
    Buffer xs(DType::F32, {m, D}), g(DType::F32, {m, I}), u(DType::F32, {m, I}),
        y(DType::F32, {m, D});
    for (int64_t r = 0; r < m; ++r)
      std::copy_n(x.f32() + (rows[size_t(r)] / K) * D, D, xs.f32() + r * D);
    linear(g, xs, experts[e].gate);
    linear(u, xs, experts[e].up);
    silu_mul(g, g, u);
    linear(y, g, experts[e].down);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = rows[size_t(r)] / K;
      const float wt = w[rows[size_t(r)]];
      for (int64_t d = 0; d < D; ++d) out.f32()[t * D + d] += wt * y.f32()[r * D + d];
    }
  }
  if (addend.data) add(out, out, addend);
}

}  // namespace osprey::ops::cpu
