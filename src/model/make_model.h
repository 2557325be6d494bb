// make-model: writes a model folder (config.json + safetensors) with random weights for any
// config, deterministic by seed (each tensor's values depend only on the seed and its name).
// Optionally FP8 block-quantized (e4m3 + 128×128 weight_scale_inv, ue8m0 scales when asked).
//
// Value scales keep activations O(1) through the depth so that logits, routing and the indexer's
// choices have clear margins (goldens must not sit on near-ties):
//   linear W ~ U(±sqrt(3/in)) (unit output variance), embedding ~ U(±sqrt(3)), norm weights
//   ~ U(0.8, 1.2), LayerNorm bias and the router's correction bias ~ U(±0.1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "core/dtype.h"

namespace osprey {

struct MakeModelOptions {
  uint64_t seed = 0;
  DType dtype = DType::BF16;  // of unquantized tensors: BF16 or F32
  bool fp8 = false;           // quantize the linear weights to e4m3 with block scales
  bool ue8m0 = false;         // round scales up to powers of two (V3.1/V3.2 scale_fmt)
  int64_t max_shard_bytes = int64_t(4) << 30;
};

// The named configs: v2-tiny, v3-tiny, v32-tiny (test models exercising every routing and rope
// branch), dsv32 (DeepSeek-V3.2's full shapes; set num_hidden_layers for fewer layers).
std::vector<std::string> preset_names();
ModelConfig preset_config(const std::string& name);

// Writes config.json and the weights into `dir` (created if needed).
void make_model(const ModelConfig& config, const std::string& dir, const MakeModelOptions& opts);

}  // namespace osprey
