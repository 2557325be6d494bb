// The latent KV cache's format as `--kv-cache-dtype` names it (vLLM's flag and values):
//   auto  the default: F32 on the CPU (the oracle), BF16 on CUDA
//   bf16  BF16 (CUDA; the CPU twin keeps the latent in F32, so it is refused there)
//   fp8   DeepSeek's FP8 latent format, vLLM's "fp8_ds_mla" (accepted as an alias): per token the
//         latent as e4m3 with an fp32 scale per 128 values, the rope key in bf16 (ops/mla.h);
//         656 B/token at 512 + 64 against BF16's 1152. Needs kv_lora a multiple of 128.
// The indexer key cache (V3.2) has its own switch (PagedKVCache's fp8_index_keys).
#pragma once

#include <string>
#include <string_view>

#include "config/model_config.h"
#include "core/tensor.h"

namespace osprey {

enum class KvCacheDtype { Auto, Bf16, Fp8 };

// "auto" | "bf16" | "bfloat16" | "fp8" | "fp8_ds_mla"; anything else fails saying what is accepted.
KvCacheDtype parse_kv_cache_dtype(std::string_view s);
std::string_view kv_cache_dtype_name(KvCacheDtype d);
// Fails (osprey::Error, a user error) when a model with config c on `device` cannot use d.
void check_kv_cache_dtype(KvCacheDtype d, const ModelConfig& c, Device device);

}  // namespace osprey
