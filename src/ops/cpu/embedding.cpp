#include "ops/embedding.h"
#include "core/error.h"

namespace osprey::ops::cpu {

void embedding(Tensor out, Tensor ids, Tensor table) {
  const int64_t n = ids.numel(), d = table.size(1), v = table.size(0);
  OSPREY_CHECK(out.numel() == n * d, "embedding shapes");
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    OSPREY_CHECK(id[t] >= 0 && id[t] < v, "token id ", id[t], " outside the vocabulary of ", v);
    float* o = out.f32() + t * d;
    if (table.dtype == DType::F32) {
      const float* r = table.f32() + int64_t(id[t]) * d;
      for (int64_t i = 0; i < d; ++i) o[i] = r[i];
    } else {
      OSPREY_CHECK(table.dtype == DType::BF16, "embedding table dtype ", dtype_name(table.dtype));
      const uint16_t* r = table.ptr<uint16_t>() + int64_t(id[t]) * d;
      for (int64_t i = 0; i < d; ++i) o[i] = bf16_to_f32(r[i]);
    }
  }
}

}  // namespace osprey::ops::cpu
