// Writes a model folder (config.json + safetensors shards, with model.safetensors.index.json when
// there are several) from any source of tensor values: make-model's random values or an existing
// checkpoint (quantize). Linear weights marked FP8-eligible (WeightSpec::fp8) are block-quantized
// when asked: W8[r, c] = e4m3(W[r, c] / s[r/128, c/128]), s = max(amax of the 128×128 block,
// 1e-4) / 448 (rounded up to a power of two with ue8m0), stored as `<name>_scale_inv` F32
// [ceil(rows/128), ceil(cols/128)] — DeepSeek's published FP8 format.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "config/model_config.h"
#include "core/dtype.h"
#include "model/weights.h"

namespace osprey {

struct ModelWriteOptions {
  bool fp8 = false;    // quantize the FP8-eligible linears
  bool ue8m0 = false;  // power-of-two scales (V3.1/V3.2 scale_fmt)
  int64_t max_shard_bytes = int64_t(4) << 30;
};

// Rows [r0, r1) of a tensor (viewed as [rows, cols], cols = its last dimension) as floats into
// out[(r1 − r0) · cols]. Called for each tensor in ascending, contiguous panels of ≤ 128 rows.
using TensorRowSource =
    std::function<void(const WeightSpec& spec, int64_t r0, int64_t r1, float* out)>;
// The dtype an unquantized tensor is stored in (F32 or BF16).
using StoredDType = std::function<DType(const WeightSpec& spec)>;

// Writes `config` (its quantization_config set from opts) and every tensor of
// weight_specs(config) into `dir` (created if needed).
void write_model_folder(const ModelConfig& config, const std::string& dir,
                        const ModelWriteOptions& opts, const StoredDType& stored_dtype,
                        const TensorRowSource& source);

// Writes only config.json (quantization_config from opts), as write_model_folder writes it: what
// `--load-format dummy` needs. Returns the config as loaders will read it.
ModelConfig write_model_config(const ModelConfig& config, const std::string& dir,
                               const ModelWriteOptions& opts);

}  // namespace osprey
