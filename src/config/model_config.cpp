#include "config/model_config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace osprey {

using nlohmann::json;

namespace {

double yarn_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

// Reads typed fields of one JSON object and names the file and field in every error.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  [[noreturn]] void bad(const char* key, const std::string& why) const {
    fail(source_, ": field '", prefix_, key, "' ", why);
  }

  int64_t integer(const char* key) const {
    if (!has(key)) bad(key, "is missing (it has no default)");
    const json& v = j_.at(key);
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      bad(key, "is " + v.dump() + ", beyond any size a model has");
    if (v.is_number_integer()) return v.get<int64_t>();
    // 4096.0 is an integer too (some writers emit floats); one outside int64 is not converted
    // (that would be undefined), it is refused.
    constexpr double kInt64Bound = 9223372036854775808.0;  // 2^63
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::floor(d) == d && d >= -kInt64Bound && d < kInt64Bound) return int64_t(d);
    }
    bad(key, "must be an integer, got " + v.dump());
  }
  int64_t integer(const char* key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  int positive(const char* key) const {
    const int64_t v = integer(key);
    if (v <= 0 || v > (int64_t(1) << 30))
      bad(key, "must be a positive integer, got " + std::to_string(v));
    return int(v);
  }
  int positive(const char* key, int dflt) const { return has(key) ? positive(key) : dflt; }
  int non_negative(const char* key, int dflt) const {
    const int64_t v = integer(key, dflt);
    if (v < 0 || v > (int64_t(1) << 30)) bad(key, "must be >= 0, got " + std::to_string(v));
    return int(v);
  }
  double number(const char* key) const {
    if (!has(key)) bad(key, "is missing (it has no default)");
    const json& v = j_.at(key);
    if (!v.is_number()) bad(key, "must be a number, got " + v.dump());
    return v.get<double>();
  }
  double number(const char* key, double dflt) const { return has(key) ? number(key) : dflt; }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) bad(key, "must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_string()) bad(key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }

 private:
  const json& j_;
  std::string source_;
  std::string prefix_;
};

void parse_rope(const json& j, const std::string& source, ModelConfig& c) {
  // Published checkpoints: rope_theta + rope_scaling. transformers 5 writes rope_parameters.
  Fields f(j, source);
  c.rope.theta = f.number("rope_theta", 10000.0);
  const char* key = nullptr;
  if (f.has("rope_parameters")) key = "rope_parameters";
  if (f.has("rope_scaling")) key = "rope_scaling";
  if (!key) return;
  const json& r = j.at(key);
  if (!r.is_object()) f.bad(key, "must be an object, got " + r.dump());
  Fields rf(r, source, std::string(key) + ".");
  if (rf.has("rope_theta")) c.rope.theta = rf.number("rope_theta");
  std::string type = rf.string("rope_type", rf.string("type", "default"));
  if (type == "default") return;
  if (type != "yarn")
    rf.bad(rf.has("rope_type") ? "rope_type" : "type",
           "is '" + type + "': osprey supports rope types 'default' and 'yarn'");
  c.rope.yarn = true;
  c.rope.factor = rf.number("factor");
  if (c.rope.factor <= 0) rf.bad("factor", "must be positive");
  c.rope.original_max_position_embeddings = rf.integer("original_max_position_embeddings");
  if (c.rope.original_max_position_embeddings <= 0)
    rf.bad("original_max_position_embeddings", "must be positive");
  c.rope.beta_fast = rf.number("beta_fast", 32.0);
  c.rope.beta_slow = rf.number("beta_slow", 1.0);
  c.rope.mscale = rf.number("mscale", 0.0);
  c.rope.mscale_all_dim = rf.number("mscale_all_dim", 0.0);
  if (rf.has("attention_factor"))
    rf.bad("attention_factor", "is not supported (DeepSeek configs derive it from mscale)");
}

void parse_quant(const json& j, const std::string& source, ModelConfig& c) {
  Fields f(j, source);
  if (!f.has("quantization_config")) return;
  const json& q = j.at("quantization_config");
  if (!q.is_object()) f.bad("quantization_config", "must be an object");
  Fields qf(q, source, "quantization_config.");
  const std::string method = qf.string("quant_method", "");
  if (method != "fp8")
    qf.bad("quant_method", "is '" + method + "': osprey reads fp8 block-quantized checkpoints");
  const std::string fmt = qf.string("fmt", "e4m3");
  if (fmt != "e4m3") qf.bad("fmt", "is '" + fmt + "': only e4m3 is supported");
  const std::string act = qf.string("activation_scheme", "dynamic");
  if (act != "dynamic") qf.bad("activation_scheme", "is '" + act + "': only dynamic is supported");
  if (!qf.has("weight_block_size")) qf.bad("weight_block_size", "is missing (it has no default)");
  const json& b = q.at("weight_block_size");
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer())
    qf.bad("weight_block_size", "must be [rows, cols], got " + b.dump());
  c.quant.block_n = b[0].get<int>();
  c.quant.block_k = b[1].get<int>();
  if (c.quant.block_n != 128 || c.quant.block_k != 128)
    qf.bad("weight_block_size", "is " + b.dump() + ": osprey supports 128x128 blocks");
  const std::string scale_fmt = qf.string("scale_fmt", "");
  if (!scale_fmt.empty() && scale_fmt != "ue8m0")
    qf.bad("scale_fmt", "is '" + scale_fmt + "': expected ue8m0 or nothing");
  c.quant.fp8 = true;
  c.quant.ue8m0 = scale_fmt == "ue8m0";
}

}  // namespace

double RopeConfig::attention_factor() const {
  if (!yarn) return 1.0;
  if (mscale != 0.0 && mscale_all_dim != 0.0)
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
  return yarn_mscale(factor, 1.0);
}

double RopeConfig::softmax_scale_factor() const {
  if (!yarn || mscale_all_dim == 0.0) return 1.0;
  const double m = yarn_mscale(factor, mscale_all_dim);
  return m * m;
}

bool ModelConfig::is_moe_layer(int layer) const {
  return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

double ModelConfig::softmax_scale() const {
  return std::pow(double(qk_head_dim()), -0.5) * rope.softmax_scale_factor();
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) fail(source, ": a config.json must hold a JSON object");
  Fields f(j, source);
  ModelConfig c;
  c.model_type_name = f.string("model_type", "");
  if (c.model_type_name == "deepseek_v2")
    c.model_type = ModelType::DeepseekV2;
  else if (c.model_type_name == "deepseek_v3" || c.model_type_name == "kimi_k2")
    c.model_type = ModelType::DeepseekV3;
  else if (c.model_type_name == "deepseek_v32")
    c.model_type = ModelType::DeepseekV32;
  else if (c.model_type_name.empty())
    f.bad("model_type", "is missing: osprey serves deepseek_v2, deepseek_v3 and deepseek_v32");
  else
    f.bad("model_type", "is '" + c.model_type_name +
                            "': osprey serves deepseek_v2, deepseek_v3 and deepseek_v32");
  const bool v2 = c.model_type == ModelType::DeepseekV2;
  const bool v32 = c.model_type == ModelType::DeepseekV32;

  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.intermediate_size = f.positive("intermediate_size");
  c.num_hidden_layers = f.positive("num_hidden_layers");
  c.num_attention_heads = f.positive("num_attention_heads");
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
  if (c.num_key_value_heads != c.num_attention_heads)
    f.bad("num_key_value_heads", "must equal num_attention_heads for MLA");
  if (j.contains("q_lora_rank") && j.at("q_lora_rank").is_null())
    c.q_lora_rank = 0;
  else
    c.q_lora_rank = f.positive("q_lora_rank", 1536);
  c.kv_lora_rank = f.positive("kv_lora_rank");
  c.qk_nope_head_dim = f.positive("qk_nope_head_dim");
  c.qk_rope_head_dim = f.positive("qk_rope_head_dim");
  if (c.qk_rope_head_dim % 2) f.bad("qk_rope_head_dim", "must be even");
  c.v_head_dim = f.positive("v_head_dim");

  c.n_routed_experts = f.non_negative("n_routed_experts", 0);
  if (c.n_routed_experts > 0) {
    c.num_experts_per_tok = f.positive("num_experts_per_tok");
    c.moe_intermediate_size = f.positive("moe_intermediate_size");
  }
  c.n_shared_experts = f.non_negative("n_shared_experts", v2 ? 2 : 1);
  c.n_group = f.positive("n_group", 1);
  c.topk_group = f.positive("topk_group", v2 ? 1 : c.n_group);
  c.first_k_dense_replace = f.non_negative("first_k_dense_replace", v2 ? 0 : 3);
  c.moe_layer_freq = f.positive("moe_layer_freq", 1);
  c.norm_topk_prob = f.boolean("norm_topk_prob", !v2);
  c.routed_scaling_factor = f.number("routed_scaling_factor", v2 ? 1.0 : 2.5);
  if (!(c.routed_scaling_factor > 0)) f.bad("routed_scaling_factor", "must be positive");

  const std::string scoring = f.string("scoring_func", v2 ? "softmax" : "sigmoid");
  if (scoring == "softmax")
    c.scoring_func = ScoringFunc::Softmax;
  else if (scoring == "sigmoid")
    c.scoring_func = ScoringFunc::Sigmoid;
  else
    f.bad("scoring_func", "is '" + scoring + "': expected softmax or sigmoid");
  const std::string method = f.string("topk_method", v2 ? "greedy" : "noaux_tc");
  if (method == "greedy")
    c.topk_method = TopkMethod::Greedy;
  else if (method == "group_limited_greedy")
    c.topk_method = TopkMethod::GroupLimitedGreedy;
  else if (method == "noaux_tc")
    c.topk_method = TopkMethod::NoauxTc;
  else
    f.bad("topk_method", "is '" + method + "': expected greedy, group_limited_greedy or noaux_tc");

  if (c.n_routed_experts > 0) {
    if (c.n_routed_experts % c.n_group)
      f.bad("n_group", "must divide n_routed_experts (" + std::to_string(c.n_routed_experts) +
                           "), got " + std::to_string(c.n_group));
    if (c.topk_group > c.n_group)
      f.bad("topk_group", "(" + std::to_string(c.topk_group) + ") exceeds n_group (" +
                              std::to_string(c.n_group) + ")");
    const int per_group = c.n_routed_experts / c.n_group;
    const bool grouped = c.topk_method != TopkMethod::Greedy;
    const int reachable = grouped ? c.topk_group * per_group : c.n_routed_experts;
    if (c.num_experts_per_tok > reachable)
      f.bad("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) +
                                       ") exceeds the experts the groups allow (topk_group " +
                                       std::to_string(c.topk_group) + " x " +
                                       std::to_string(per_group) +
                                       " per group = " + std::to_string(reachable) + ")");
    if (c.topk_method == TopkMethod::NoauxTc && per_group < 2)
      f.bad("n_group",
            "leaves fewer than 2 experts per group; noaux_tc scores a group by its top 2");
  }

  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.integer("max_position_embeddings", v32 ? 163840 : 4096);
  if (c.max_position_embeddings <= 0) f.bad("max_position_embeddings", "must be positive");
  c.bos_token_id = int(f.integer("bos_token_id", v2 ? 1 : 0));
  if (f.has("eos_token_id") && j.at("eos_token_id").is_array()) {
    const json& e = j.at("eos_token_id");
    if (e.empty() || !e[0].is_number_integer())
      f.bad("eos_token_id", "must be an id or a list of ids");
    c.eos_token_id = e[0].get<int>();
  } else {
    c.eos_token_id = int(f.integer("eos_token_id", v2 ? 2 : 1));
  }
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.rope_interleave = f.boolean("rope_interleave", true);
  c.num_nextn_predict_layers = f.non_negative("num_nextn_predict_layers", 0);

  if (v32) {
    c.has_indexer = true;
    c.index_n_heads = f.positive("index_n_heads", 64);
    c.index_head_dim = f.positive("index_head_dim", 128);
    c.index_topk = f.positive("index_topk", 2048);
    if (c.index_head_dim < c.qk_rope_head_dim)
      f.bad("index_head_dim",
            "must be at least qk_rope_head_dim (its first qk_rope_head_dim "
            "dims carry rope)");
    if (c.q_lora_rank == 0) f.bad("q_lora_rank", "is null, but deepseek_v32 needs q LoRA");
    c.rope_interleave = true;
  }
  parse_rope(j, source, c);
  parse_quant(j, source, c);
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream in(p);
  if (!in) fail("cannot open model config ", p.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(p.string(), ": not valid JSON (", e.what(), ")");
  }
  return from_json(j, p.string());
}

json ModelConfig::to_json() const {
  json j;
  static const char* kArch[] = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                                "DeepseekV32ForCausalLM"};
  static const char* kType[] = {"deepseek_v2", "deepseek_v3", "deepseek_v32"};
  j["architectures"] = {kArch[int(model_type)]};
  j["model_type"] = kType[int(model_type)];
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["q_lora_rank"] = q_lora_rank ? json(q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  j["n_routed_experts"] = n_routed_experts;
  j["n_shared_experts"] = n_shared_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["n_group"] = n_group;
  j["topk_group"] = topk_group;
  j["first_k_dense_replace"] = first_k_dense_replace;
  j["moe_layer_freq"] = moe_layer_freq;
  j["norm_topk_prob"] = norm_topk_prob;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["scoring_func"] = scoring_func == ScoringFunc::Softmax ? "softmax" : "sigmoid";
  static const char* kMethod[] = {"greedy", "group_limited_greedy", "noaux_tc"};
  j["topk_method"] = kMethod[int(topk_method)];
  j["rms_norm_eps"] = rms_norm_eps;
  j["max_position_embeddings"] = max_position_embeddings;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["num_nextn_predict_layers"] = num_nextn_predict_layers;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["rope_theta"] = rope.theta;
  if (model_type != ModelType::DeepseekV32) j["rope_interleave"] = rope_interleave;
  if (rope.yarn) {
    json r = {{"type", "yarn"},
              {"rope_type", "yarn"},
              {"factor", rope.factor},
              {"original_max_position_embeddings", rope.original_max_position_embeddings},
              {"beta_fast", rope.beta_fast},
              {"beta_slow", rope.beta_slow}};
    if (rope.mscale != 0.0) r["mscale"] = rope.mscale;
    if (rope.mscale_all_dim != 0.0) r["mscale_all_dim"] = rope.mscale_all_dim;
    j["rope_scaling"] = r;
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (has_indexer) {
    j["index_n_heads"] = index_n_heads;
    j["index_head_dim"] = index_head_dim;
    j["index_topk"] = index_topk;
  }
  if (quant.fp8) {
    json q = {{"quant_method", "fp8"},
              {"fmt", "e4m3"},
              {"activation_scheme", "dynamic"},
              {"weight_block_size", {quant.block_n, quant.block_k}}};
    if (quant.ue8m0) q["scale_fmt"] = "ue8m0";
    j["quantization_config"] = q;
  }
  return j;
}

}  // namespace osprey
