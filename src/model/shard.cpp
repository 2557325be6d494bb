#include "model/shard.h"

#include "core/error.h"

namespace osprey {

RankShard make_rank_shard(const ModelConfig& c, const dist::ParallelConfig& p, int rank) {
  p.validate();
  RankShard s;
  s.rank = rank;
  s.world = p.world_size();
  s.tp = p.tensor_parallel_size;
  s.dp = p.data_parallel_size;
  s.ep = p.enable_expert_parallel;
  OSPREY_CHECK(rank >= 0 && rank < s.world, "rank ", rank, " of ", s.world);
  const int64_t H = c.num_attention_heads, V = c.vocab_size;
  auto divides = [&](int64_t n, int by, const char* what) {
    if (n % by)
      fail("the model's ", what, " (", n, ") does not divide by --tensor-parallel-size ", by,
           ": pick a size that divides it");
  };
  if (s.split_tp()) {
    divides(H, s.tp, "num_attention_heads");
    divides(c.intermediate_size, s.tp, "intermediate_size");
    if (c.n_routed_experts > 0 && c.n_shared_experts > 0)
      divides(int64_t(c.n_shared_experts) * c.moe_intermediate_size, s.tp,
              "shared experts' intermediate size");
    if (s.split_experts_tp()) divides(c.moe_intermediate_size, s.tp, "moe_intermediate_size");
  }
  const int64_t hp = H / s.tp;
  s.head_begin = s.split_tp() ? rank * hp : 0;
  s.head_end = s.split_tp() ? s.head_begin + hp : H;
  s.vocab_stride = (V + s.tp - 1) / s.tp;
  s.vocab_begin = s.split_tp() ? std::min<int64_t>(V, rank * s.vocab_stride) : 0;
  s.vocab_end = s.split_tp() ? std::min<int64_t>(V, s.vocab_begin + s.vocab_stride) : V;
  s.expert_begin = 0;
  s.expert_end = c.n_routed_experts;
  if (s.expert_parallel() && c.n_routed_experts > 0) {
    if (c.n_routed_experts % s.world)
      fail("the model's n_routed_experts (", c.n_routed_experts, ") does not divide over ", s.world,
           " expert-parallel ranks: pick a world size that divides it");
    const int per = c.n_routed_experts / s.world;
    s.expert_begin = rank * per;
    s.expert_end = s.expert_begin + per;
  }
  return s;
}

std::vector<WeightSpec> shard_weight_specs(const ModelConfig& c, const RankShard& s) {
  std::vector<WeightSpec> out;
  const int64_t qk = c.qk_head_dim(), kvb = c.qk_nope_head_dim + c.v_head_dim, vd = c.v_head_dim;
  auto ends_with = [](const std::string& n, const std::string& t) {
    return n.size() >= t.size() && n.compare(n.size() - t.size(), t.size(), t) == 0;
  };
  // gate/up rows and down columns: part `rank` of `tp` of the intermediate.
  auto split_mlp = [&](WeightSpec& w) {
    if (ends_with(w.name, "down_proj.weight")) {
      const int64_t part = w.shape[1] / s.tp;
      w.slice = {1, s.rank * part, (s.rank + 1) * part};
    } else {
      const int64_t part = w.shape[0] / s.tp;
      w.slice = {0, s.rank * part, (s.rank + 1) * part};
    }
  };
  for (WeightSpec w : main_weight_specs(c)) {  // (no MTP layer: MTP is single-rank)
    const std::string& n = w.name;
    int expert = -1;
    const size_t at = n.find(".mlp.experts.");
    if (at != std::string::npos) expert = std::stoi(n.substr(at + 13));
    if (expert >= 0 && (expert < s.expert_begin || expert >= s.expert_end)) continue;
    if (s.split_tp()) {
      if (ends_with(n, "self_attn.q_b_proj.weight") || ends_with(n, "self_attn.q_proj.weight"))
        w.slice = {0, s.head_begin * qk, s.head_end * qk};
      else if (ends_with(n, "self_attn.kv_b_proj.weight"))
        w.slice = {0, s.head_begin * kvb, s.head_end * kvb};
      else if (ends_with(n, "self_attn.o_proj.weight"))
        w.slice = {1, s.head_begin * vd, s.head_end * vd};
      else if (n == "lm_head.weight")
        w.slice = {0, s.vocab_begin, s.vocab_end};
      else if (expert >= 0
                   ? s.split_experts_tp()
                   : (n.find(".mlp.shared_experts.") != std::string::npos ||
                      (ends_with(n, "_proj.weight") && n.find(".mlp.") != std::string::npos)))
        split_mlp(w);
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace osprey
