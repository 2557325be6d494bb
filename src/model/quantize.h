// osprey quantize: a bf16/f32 checkpoint folder → the same model with its linear weights
// FP8 e4m3 block-quantized (128×128 block scales, `weight_scale_inv`), as DeepSeek publishes
// V3/V3.1/V3.2 — what `osprey make-model --fp8` writes for random weights, applied to trained ones
// (the FP8 row of the accuracy gate). Tensors that stay unquantized (embeddings, norms, routers,
// the correction bias, lm_head, ...) keep their stored dtype bit for bit; every other file of the
// folder (tokenizer.json, tokenizer_config.json, ...) is copied. The source must hold every tensor
// the config names with its shape, in F32 or BF16 (F16 is widened to F32); an FP8 source is
// refused.
#pragma once

#include <cstdint>
#include <string>

namespace osprey {

struct QuantizeStats {
  int64_t quantized_tensors = 0, kept_tensors = 0;
  // Read back from the written folder: max |W − dequant(W8)| over every quantized weight, and the
  // largest such error relative to its tensor's max |W|.
  double max_abs_error = 0.0, max_rel_error = 0.0;
};

QuantizeStats quantize_model_fp8(const std::string& src_dir, const std::string& dst_dir, bool ue8m0,
                                 int64_t max_shard_bytes = int64_t(4) << 30);

}  // namespace osprey
