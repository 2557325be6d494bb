#include "model/make_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"
#include "ops/gemm.h"

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

float block_scale(float amax, bool ue8m0) {
  float s = std::max(amax, 1e-4f) / kE4M3Max;
  if (ue8m0) s = std::exp2(std::ceil(std::log2(s)));
  return s;
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
  namespace fs = std::filesystem;
  OSPREY_CHECK(opts.dtype == DType::BF16 || opts.dtype == DType::F32, "make-model dtype");
  ModelConfig c = config;
  c.quant.fp8 = opts.fp8;
  c.quant.ue8m0 = opts.fp8 && opts.ue8m0;
  // Round-trip through the JSON form so the written config is exactly what loaders will read.
  c = ModelConfig::from_json(c.to_json(), "make-model config");
  fs::create_directories(dir);

  struct Item {
    WeightSpec spec;
    bool quantize;
  };
  std::vector<Item> items;
  for (const WeightSpec& s : weight_specs(c)) items.push_back({s, opts.fp8 && s.fp8});
  auto tensor_bytes = [&](const Item& it) {
    const int64_t n = shape_numel(it.spec.shape);
    if (!it.quantize) return n * int64_t(dtype_size(opts.dtype));
    const int64_t blocks = ((it.spec.shape[0] + 127) / 128) * ((it.spec.shape[1] + 127) / 128);
    return n + blocks * 4;
  };
  // Shards of at most max_shard_bytes (a tensor never spans two).
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t b = tensor_bytes(items[i]);
    if (in_shard > 0 && in_shard + b > opts.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }
  nlohmann::ordered_json weight_map;
  int64_t total_bytes = 0;
  for (size_t sh = 0; sh < shards.size(); ++sh) {
    char fname[64];
    if (shards.size() == 1)
      std::snprintf(fname, sizeof fname, "model.safetensors");
    else
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", sh + 1, shards.size());
    std::vector<TensorDecl> decls;
    for (size_t i : shards[sh]) {
      const Item& it = items[i];
      if (it.quantize) {
        decls.push_back({it.spec.name, DType::F8_E4M3, it.spec.shape});
        decls.push_back({it.spec.name + "_scale_inv",
                         DType::F32,
                         {(it.spec.shape[0] + 127) / 128, (it.spec.shape[1] + 127) / 128}});
      } else {
        decls.push_back({it.spec.name, opts.dtype, it.spec.shape});
      }
    }
    for (const auto& d : decls) {
      weight_map[d.name] = fname;
      total_bytes += int64_t(d.nbytes());
    }
    SafetensorsWriter w((fs::path(dir) / fname).string(), decls, {{"format", "pt"}});
    for (size_t i : shards[sh]) {
      const Item& it = items[i];
      Stream rng(hash_name(opts.seed, it.spec.name));
      float lo = 0.0f, hi = 0.0f;
      value_range(it.spec, &lo, &hi);
      const int64_t cols = it.spec.shape.back();
      const int64_t rows = shape_numel(it.spec.shape) / cols;
      // Row panels of 128 (one FP8 scale block high).
      std::vector<float> panel;
      std::vector<float> scales;
      const int64_t col_blocks = (cols + 127) / 128;
      for (int64_t r0 = 0; r0 < rows; r0 += 128) {
        const int64_t r1 = std::min(rows, r0 + 128), n = (r1 - r0) * cols;
        panel.resize(size_t(n));
        for (auto& v : panel) v = rng.uniform(lo, hi);
        if (!it.quantize) {
          if (opts.dtype == DType::F32) {
            w.write(it.spec.name, panel.data(), size_t(n) * 4);
          } else {
            std::vector<uint16_t> out(static_cast<size_t>(n));
            for (int64_t k = 0; k < n; ++k) out[size_t(k)] = f32_to_bf16(panel[size_t(k)]);
            w.write(it.spec.name, out.data(), size_t(n) * 2);
          }
          continue;
        }
        std::vector<float> s(static_cast<size_t>(col_blocks));
        for (int64_t cb = 0; cb < col_blocks; ++cb) {
          float amax = 0.0f;
          for (int64_t r = 0; r < r1 - r0; ++r)
            for (int64_t cc = cb * 128; cc < std::min(cols, cb * 128 + 128); ++cc)
              amax = std::max(amax, std::fabs(panel[size_t(r * cols + cc)]));
          s[size_t(cb)] = block_scale(amax, opts.ue8m0);
        }
        std::vector<uint8_t> q(static_cast<size_t>(n));
        for (int64_t r = 0; r < r1 - r0; ++r)
          for (int64_t cc = 0; cc < cols; ++cc)
            q[size_t(r * cols + cc)] =
                f32_to_e4m3(panel[size_t(r * cols + cc)] / s[size_t(cc / 128)]);
        w.write(it.spec.name, q.data(), q.size());
        scales.insert(scales.end(), s.begin(), s.end());
      }
      if (it.quantize) w.write(it.spec.name + "_scale_inv", scales.data(), scales.size() * 4);
    }
    w.finish();
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = weight_map;
    std::ofstream(fs::path(dir) / "model.safetensors.index.json") << index.dump(2) << "\n";
  }
  std::ofstream cfg(fs::path(dir) / "config.json");
  cfg << c.to_json().dump(2) << "\n";
  if (!cfg) fail("cannot write ", (fs::path(dir) / "config.json").string());
}

}  // namespace osprey
