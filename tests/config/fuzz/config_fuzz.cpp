// libFuzzer target for config.json → ModelConfig: the input is the file's bytes. Any input must be
// refused with osprey::Error (invalid JSON, a missing or out-of-range field) or give a config
// whose numbers the model code can use: positive dimensions, experts and groups that divide, a
// finite positive softmax scale; and to_json() of it must parse back to the same config.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "config/model_config.h"
#include "core/error.h"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "config_fuzz: %s\n", what);
  std::abort();
}

void check(const osprey::ModelConfig& c) {
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.num_hidden_layers <= 0 ||
      c.num_attention_heads <= 0 || c.kv_lora_rank <= 0 || c.qk_nope_head_dim <= 0 ||
      c.qk_rope_head_dim <= 0 || c.v_head_dim <= 0 || c.intermediate_size <= 0)
    die("a required dimension is not positive");
  if (c.qk_rope_head_dim % 2) die("odd qk_rope_head_dim accepted");
  if (c.n_routed_experts > 0) {
    if (c.num_experts_per_tok <= 0 || c.moe_intermediate_size <= 0) die("bad MoE sizes");
    if (c.n_group <= 0 || c.n_routed_experts % c.n_group) die("n_group does not divide");
    if (c.topk_group > c.n_group) die("topk_group > n_group");
    if (c.num_experts_per_tok > c.n_routed_experts) die("more experts per token than experts");
  }
  if (c.max_position_embeddings <= 0) die("max_position_embeddings not positive");
  const double s = c.softmax_scale();
  if (!std::isfinite(s) || s <= 0) die("softmax scale not finite and positive");
  for (int l = 0; l < std::min(c.num_hidden_layers, 64); ++l) (void)c.is_moe_layer(l);
  if (c.has_indexer && (c.index_topk <= 0 || c.index_head_dim < c.qk_rope_head_dim))
    die("bad indexer sizes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;  // from_file refuses it with the parse error
  }
  osprey::ModelConfig c;
  try {
    c = osprey::ModelConfig::from_json(j, "fuzz/config.json");
  } catch (const osprey::Error&) {
    return 0;
  }
  check(c);
  osprey::ModelConfig back;
  try {
    back = osprey::ModelConfig::from_json(c.to_json(), "to_json");
  } catch (const osprey::Error& e) {
    std::fprintf(stderr, "config_fuzz: to_json() is refused: %s\n", e.what());
    std::abort();
  }
  if (back.to_json() != c.to_json()) die("to_json() does not round-trip");
  return 0;
}
