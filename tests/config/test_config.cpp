// ModelConfig from config.json: the published configs of each family, both rope spellings, and a
// clear error naming the field for unknown types, missing fields and inconsistent values.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "config/model_config.h"
#include "core/error.h"

using namespace osprey;
using nlohmann::json;

namespace {

// deepseek-ai/DeepSeek-V3.2 config.json (the fields that matter).
json v32_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8,
    "topk_group": 4, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "norm_topk_prob": true, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "max_position_embeddings": 163840, "bos_token_id": 0, "eos_token_id": 1,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": false,
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}})");
}

// deepseek-ai/DeepSeek-V2-Lite config.json.
json v2_lite_config() {
  return json::parse(R"({
    "model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": null,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1,
    "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": false,
    "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "bos_token_id": 100000, "eos_token_id": 100001, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "max_position_embeddings": 163840})");
}

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, DeepSeekV32) {
  const ModelConfig c = ModelConfig::from_json(v32_config(), "config.json");
  EXPECT_EQ(c.model_type, ModelType::DeepseekV32);
  EXPECT_TRUE(c.has_indexer);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.topk_method, TopkMethod::NoauxTc);
  EXPECT_EQ(c.scoring_func, ScoringFunc::Sigmoid);
  EXPECT_TRUE(c.quant.fp8);
  EXPECT_TRUE(c.quant.ue8m0);
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  // 192^-0.5 · (0.1·ln 40 + 1)² = 0.135234 (the value model_math.md derives for V3).
  EXPECT_NEAR(c.softmax_scale(), 0.135234, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor(), 1.0);
}

TEST(Config, DeepSeekV2LiteWithoutQLora) {
  const ModelConfig c = ModelConfig::from_json(v2_lite_config(), "config.json");
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_FALSE(c.has_indexer);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.scoring_func, ScoringFunc::Softmax);
  EXPECT_EQ(c.topk_method, TopkMethod::Greedy);
  // (0.1·0.707·ln 40 + 1)² = 1.5896 on the softmax scale; cos/sin unscaled.
  EXPECT_NEAR(c.rope.softmax_scale_factor(), 1.5896, 1e-4);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor(), 1.0);
  EXPECT_EQ(c.bos_token_id, 100000);
}

TEST(Config, KimiK2IsDeepSeekV3WithOneGroup) {
  json j = v32_config();
  j["model_type"] = "deepseek_v3";
  j.erase("index_topk");
  j["n_routed_experts"] = 384;
  j["n_group"] = 1;
  j["topk_group"] = 1;
  j["num_attention_heads"] = 64;
  j["num_key_value_heads"] = 64;
  j["routed_scaling_factor"] = 2.827;
  j["first_k_dense_replace"] = 1;
  const ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(c.model_type, ModelType::DeepseekV3);
  EXPECT_FALSE(c.has_indexer);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.827);
}

TEST(Config, RopeParametersSpellingOfTransformers5) {
  json j = v32_config();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 50000.0},
                          {"factor", 8.0},       {"original_max_position_embeddings", 1024},
                          {"mscale", 1.0},       {"mscale_all_dim", 0.5}};
  const ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_TRUE(c.rope.yarn);
  EXPECT_DOUBLE_EQ(c.rope.theta, 50000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 1024);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  // mscale ≠ mscale_all_dim: cos/sin carry their ratio.
  EXPECT_NEAR(c.rope.attention_factor(), (0.1 * std::log(8.0) + 1) / (0.05 * std::log(8.0) + 1),
              1e-12);
}

TEST(Config, YarnWithoutMscaleFollowsTransformers) {
  json j = v32_config();
  j["rope_scaling"].erase("mscale");
  j["rope_scaling"].erase("mscale_all_dim");
  const ModelConfig c = ModelConfig::from_json(j, "config.json");
  EXPECT_NEAR(c.rope.attention_factor(), 0.1 * std::log(40.0) + 1, 1e-12);
  EXPECT_DOUBLE_EQ(c.rope.softmax_scale_factor(), 1.0);
}

TEST(Config, RoundTripsThroughJson) {
  const ModelConfig a = ModelConfig::from_json(v32_config(), "config.json");
  const ModelConfig b = ModelConfig::from_json(a.to_json(), "round trip");
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(b.index_n_heads, 64);
  EXPECT_TRUE(b.quant.ue8m0);
}

TEST(Config, ErrorsNameTheField) {
  json j = v32_config();
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("model_type"), std::string::npos);
  EXPECT_NE(error_of(j).find("llama"), std::string::npos);

  j = v32_config();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("'hidden_size' is missing"), std::string::npos) << error_of(j);

  j = v32_config();
  j["num_experts_per_tok"] = 160;  // 4 groups × 32 experts = 128 reachable
  EXPECT_NE(error_of(j).find("num_experts_per_tok"), std::string::npos) << error_of(j);

  j = v32_config();
  j["n_group"] = 7;
  EXPECT_NE(error_of(j).find("n_group"), std::string::npos) << error_of(j);

  j = v32_config();
  j["topk_group"] = 9;
  EXPECT_NE(error_of(j).find("topk_group"), std::string::npos) << error_of(j);

  j = v32_config();
  j["hidden_size"] = "7168";
  EXPECT_NE(error_of(j).find("'hidden_size' must be an integer"), std::string::npos) << error_of(j);

  j = v32_config();
  j["scoring_func"] = "relu";
  EXPECT_NE(error_of(j).find("scoring_func"), std::string::npos);

  j = v32_config();
  j["topk_method"] = "random";
  EXPECT_NE(error_of(j).find("topk_method"), std::string::npos);

  j = v32_config();
  j["quantization_config"]["weight_block_size"] = {64, 64};
  EXPECT_NE(error_of(j).find("weight_block_size"), std::string::npos);

  j = v32_config();
  j["quantization_config"]["quant_method"] = "awq";
  EXPECT_NE(error_of(j).find("quant_method"), std::string::npos);

  j = v32_config();
  j["rope_scaling"]["type"] = "longrope";
  EXPECT_NE(error_of(j).find("longrope"), std::string::npos);

  j = v32_config();
  j["rope_scaling"].erase("factor");
  EXPECT_NE(error_of(j).find("rope_scaling.factor"), std::string::npos) << error_of(j);

  j = v32_config();
  j["q_lora_rank"] = nullptr;
  EXPECT_NE(error_of(j).find("q_lora_rank"), std::string::npos);

  j = v32_config();
  j["num_key_value_heads"] = 8;
  EXPECT_NE(error_of(j).find("num_key_value_heads"), std::string::npos);

  j = v32_config();
  j["qk_rope_head_dim"] = 63;
  EXPECT_NE(error_of(j).find("qk_rope_head_dim"), std::string::npos);

  EXPECT_NE(error_of(json::array()).find("JSON object"), std::string::npos);
}

// Found by config_fuzz (corpus crash_float_dimension_overflows_int64): an integral float beyond
// int64 was converted with int64_t(double), which is undefined; now it is refused by name.
TEST(Config, IntegersBeyondInt64AreRefused) {
  json j = v32_config();
  j["intermediate_size"] = 3.84444e+38;
  EXPECT_NE(error_of(j).find("'intermediate_size' must be an integer, got 3.84444e+38"),
            std::string::npos)
      << error_of(j);
  j = v32_config();
  j["hidden_size"] = json::parse("18446744073709551615");
  EXPECT_NE(error_of(j).find("'hidden_size' is 18446744073709551615"), std::string::npos)
      << error_of(j);
  j = v32_config();
  j["hidden_size"] = 256.0;  // an integral float is still an integer
  EXPECT_EQ(ModelConfig::from_json(j, "x").hidden_size, 256);
}

TEST(Config, FromFileReportsBadJson) {
  const std::string path = ::testing::TempDir() + "/bad_config.json";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("{\"model_type\": ", f);
  std::fclose(f);
  try {
    ModelConfig::from_file(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  EXPECT_THROW(ModelConfig::from_file(::testing::TempDir() + "/nope"), Error);
}
