#include "model/make_model.h"

#include <cmath>

#include "core/error.h"
#include "model/model_writer.h"
#include "model/weights.h"

namespace osprey {

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_name(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, mixed with the seed
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return splitmix64(h);
}

// Uniform values in [lo, hi) from a per-tensor stream.
class Stream {
 public:
  explicit Stream(uint64_t state) : s_(state) {}
  float uniform(float lo, float hi) {
    const uint64_t r = splitmix64(s_);
    return lo + (hi - lo) * float(double(r >> 40) * (1.0 / double(1ull << 24)));
  }

 private:
  uint64_t s_;
};

void value_range(const WeightSpec& s, float* lo, float* hi) {
  switch (s.kind) {
    case WeightKind::Embedding:
      *lo = -std::sqrt(3.0f), *hi = std::sqrt(3.0f);
      return;
    case WeightKind::Norm:
      *lo = 0.8f, *hi = 1.2f;
      return;
    case WeightKind::NormBias:
    case WeightKind::CorrectionBias:
      *lo = -0.1f, *hi = 0.1f;
      return;
    case WeightKind::Linear:
    case WeightKind::Router: {
      const float a = std::sqrt(3.0f / float(s.shape.back()));
      *lo = -a, *hi = a;
      return;
    }
  }
}

ModelConfig tiny_base(ModelType type, const char* name) {
  ModelConfig c;
  c.model_type = type;
  c.model_type_name = name;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 384;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.kv_lora_rank = 128;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.first_k_dense_replace = 1;
  c.max_position_embeddings = 2560;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.rope.yarn = true;
  c.rope.beta_fast = 32;
  c.rope.beta_slow = 1;
  return c;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"v2-tiny", "v3-tiny", "v32-tiny", "dsv32"};
}

ModelConfig preset_config(const std::string& name) {
  if (name == "v2-tiny") {
    // V2-Lite's scheme: no q LoRA, softmax gating, group-limited greedy, two shared experts,
    // unnormalised weights, YaRN mscale 0.707.
    ModelConfig c = tiny_base(ModelType::DeepseekV2, "deepseek_v2");
    c.q_lora_rank = 0;
    c.n_shared_experts = 2;
    c.n_group = 4;
    c.topk_group = 2;
    c.scoring_func = ScoringFunc::Softmax;
    c.topk_method = TopkMethod::GroupLimitedGreedy;
    c.norm_topk_prob = false;
    c.routed_scaling_factor = 1.5;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.rope.factor = 40;
    c.rope.original_max_position_embeddings = 64;
    c.rope.mscale = 0.707;
    c.rope.mscale_all_dim = 0.707;
    return c;
  }
  if (name == "v3-tiny") {
    ModelConfig c = tiny_base(ModelType::DeepseekV3, "deepseek_v3");
    c.q_lora_rank = 96;
    c.n_shared_experts = 1;
    c.n_group = 4;
    c.topk_group = 2;
    c.scoring_func = ScoringFunc::Sigmoid;
    c.topk_method = TopkMethod::NoauxTc;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.rope.factor = 4;
    c.rope.original_max_position_embeddings = 16;
    c.rope.mscale = 1.0;
    c.rope.mscale_all_dim = 1.0;
    return c;
  }
  if (name == "v32-tiny") {
    ModelConfig c = tiny_base(ModelType::DeepseekV32, "deepseek_v32");
    c.q_lora_rank = 96;
    c.n_shared_experts = 1;
    c.n_group = 2;
    c.topk_group = 1;
    c.scoring_func = ScoringFunc::Sigmoid;
    c.topk_method = TopkMethod::NoauxTc;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.has_indexer = true;
    c.index_n_heads = 4;
    c.index_head_dim = 32;
    c.index_topk = 8;
    c.rope.factor = 40;
    c.rope.original_max_position_embeddings = 32;
    c.rope.mscale = 1.0;
    c.rope.mscale_all_dim = 1.0;
    return c;
  }
  if (name == "dsv32") {
    // DeepSeek-V3.2's published shapes (config.json of deepseek-ai/DeepSeek-V3.2), 5 layers:
    // 3 dense + 2 MoE.
    ModelConfig c;
    c.model_type = ModelType::DeepseekV32;
    c.model_type_name = "deepseek_v32";
    c.vocab_size = 129280;
    c.hidden_size = 7168;
    c.intermediate_size = 18432;
    c.moe_intermediate_size = 2048;
    c.num_hidden_layers = 5;
    c.num_attention_heads = 128;
    c.num_key_value_heads = 128;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.n_routed_experts = 256;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 8;
    c.n_group = 8;
    c.topk_group = 4;
    c.first_k_dense_replace = 3;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5;
    c.scoring_func = ScoringFunc::Sigmoid;
    c.topk_method = TopkMethod::NoauxTc;
    c.max_position_embeddings = 163840;
    c.bos_token_id = 0;
    c.eos_token_id = 1;
    c.has_indexer = true;
    c.index_n_heads = 64;
    c.index_head_dim = 128;
    c.index_topk = 2048;
    c.rope.yarn = true;
    c.rope.factor = 40;
    c.rope.original_max_position_embeddings = 4096;
    c.rope.mscale = 1.0;
    c.rope.mscale_all_dim = 1.0;
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown preset '", name, "' (known: ", known, ")");
}

void make_model(const ModelConfig& config, const std::string& dir, const MakeModelOptions& opts) {
  OSPREY_CHECK(opts.dtype == DType::BF16 || opts.dtype == DType::F32, "make-model dtype");
  ModelWriteOptions wo;
  wo.fp8 = opts.fp8;
  wo.ue8m0 = opts.ue8m0;
  wo.max_shard_bytes = opts.max_shard_bytes;
  // One stream per tensor, drawn panel after panel (the writer asks for rows in order).
  Stream rng(0);
  write_model_folder(
      config, dir, wo, [&](const WeightSpec&) { return opts.dtype; },
      [&](const WeightSpec& spec, int64_t r0, int64_t r1, float* out) {
        if (r0 == 0) rng = Stream(hash_name(opts.seed, spec.name));
        float lo = 0.0f, hi = 0.0f;
        value_range(spec, &lo, &hi);
        const int64_t n = (r1 - r0) * spec.shape.back();
        for (int64_t k = 0; k < n; ++k) out[k] = rng.uniform(lo, hi);
      });
}

}  // namespace osprey
