#include "kv/kv_cache_dtype.h"

#include "core/error.h"
#include "ops/mla.h"

namespace osprey {

KvCacheDtype parse_kv_cache_dtype(std::string_view s) {
  if (s == "auto") return KvCacheDtype::Auto;
  if (s == "bf16" || s == "bfloat16") return KvCacheDtype::Bf16;
  if (s == "fp8" || s == "fp8_ds_mla") return KvCacheDtype::Fp8;
  if (s == "fp8_e4m3" || s == "fp8_e5m2")
    fail("--kv-cache-dtype ", s,
         ": osprey's FP8 latent cache is DeepSeek's fp8_ds_mla format (e4m3, a scale per 128 "
         "values); give fp8");
  fail("--kv-cache-dtype must be auto, bf16 or fp8 (fp8_ds_mla), got '", s, "'");
}

std::string_view kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::Auto:
      return "auto";
    case KvCacheDtype::Bf16:
      return "bf16";
    case KvCacheDtype::Fp8:
      return "fp8";
  }
  return "?";
}

void check_kv_cache_dtype(KvCacheDtype d, const ModelConfig& c, Device device) {
  if (d == KvCacheDtype::Bf16 && device == Device::CPU)
    fail(
        "--kv-cache-dtype bf16 applies to --device cuda (the CPU keeps the latent cache in F32); "
        "on the CPU give auto or fp8");
  if (d == KvCacheDtype::Fp8 && !ops::mla_fp8_supported(c.kv_lora_rank, c.qk_rope_head_dim))
    fail("--kv-cache-dtype fp8 needs kv_lora_rank a multiple of ", ops::kMlaFp8Tile,
         " and an even qk_rope_head_dim (one fp32 scale per ", ops::kMlaFp8Tile,
         " latent values); this model has kv_lora_rank ", c.kv_lora_rank, " and qk_rope_head_dim ",
         c.qk_rope_head_dim, ": use --kv-cache-dtype auto");
}

}  // namespace osprey
