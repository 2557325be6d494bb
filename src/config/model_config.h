// ModelConfig: a Hugging Face config.json of the DeepSeek family turned into the numbers the math
// needs. model_type deepseek_v2 (V2, V2-Lite), deepseek_v3 (V3, R1, V3.1, Kimi-K2) and
// deepseek_v32. It sits in src/config, below ops and kv (which read it) and model: it depends on
// core only.
//
// Required (no default; a config without them is refused, naming the field): vocab_size,
// hidden_size, num_hidden_layers, num_attention_heads, kv_lora_rank, qk_nope_head_dim,
// qk_rope_head_dim, v_head_dim, intermediate_size; with routed experts (n_routed_experts > 0) also
// num_experts_per_tok and moe_intermediate_size.
//
// Documented defaults (those of transformers' config classes for the model_type):
//   q_lora_rank 1536 (null: a plain q_proj), rms_norm_eps 1e-6, rope_theta 10000, no rope scaling,
//   max_position_embeddings 4096 (v32: 163840), n_routed_experts 0 (a dense model),
//   n_shared_experts 2 (v2) / 1, n_group 1, topk_group 1 (v2) / n_group,
//   first_k_dense_replace 0 (v2) / 3, moe_layer_freq 1, norm_topk_prob false (v2) / true,
//   routed_scaling_factor 1.0 (v2) / 2.5, scoring_func softmax (v2) / sigmoid,
//   topk_method greedy (v2) / noaux_tc, rope_interleave true, bos 1 / 0, eos 2 / 1 (v2 / v3),
//   num_nextn_predict_layers 0, tie_word_embeddings false; v32: index_n_heads 64,
//   index_head_dim 128, index_topk 2048.
// YaRN (rope_scaling or rope_parameters with type "yarn"): factor and
// original_max_position_embeddings are required; beta_fast 32, beta_slow 1. mscale and
// mscale_all_dim follow transformers: the cos/sin factor is mscale(F, mscale) / mscale(F,
// mscale_all_dim) when both are set and non-zero, else 0.1·ln F + 1; the softmax scale gains
// mscale(F, mscale_all_dim)² when mscale_all_dim is set and non-zero.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace osprey {

enum class ModelType { DeepseekV2, DeepseekV3, DeepseekV32 };
enum class ScoringFunc { Softmax, Sigmoid };
enum class TopkMethod { Greedy, GroupLimitedGreedy, NoauxTc };

struct RopeConfig {
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;          // 0 = not given
  double mscale_all_dim = 0.0;  // 0 = not given
  // Derived: the factor on cos/sin, and the factor on the softmax scale.
  double attention_factor() const;
  double softmax_scale_factor() const;
};

struct QuantConfig {
  bool fp8 = false;  // quant_method "fp8", fmt "e4m3", 128x128 weight blocks
  int block_n = 128;
  int block_k = 128;
  bool ue8m0 = false;  // scale_fmt "ue8m0": scales are powers of two
};

struct ModelConfig {
  ModelType model_type = ModelType::DeepseekV3;
  std::string model_type_name;

  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int moe_intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;

  int q_lora_rank = 0;  // 0: no q LoRA (q_proj)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int n_group = 1;
  int topk_group = 1;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  ScoringFunc scoring_func = ScoringFunc::Softmax;
  TopkMethod topk_method = TopkMethod::Greedy;

  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 4096;
  int bos_token_id = 0;
  int eos_token_id = 1;
  bool tie_word_embeddings = false;
  bool rope_interleave = true;
  int num_nextn_predict_layers = 0;

  // V3.2 lightning indexer (has_indexer only for deepseek_v32).
  bool has_indexer = false;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;

  RopeConfig rope;
  QuantConfig quant;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int layer) const;
  // qk_head_dim^-0.5 times the YaRN mscale² factor.
  double softmax_scale() const;

  // source names the file in error messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_file(const std::string& path);  // a config.json or a folder holding one
  nlohmann::json to_json() const;  // the Hugging Face form (rope_scaling + rope_theta)
};

}  // namespace osprey
