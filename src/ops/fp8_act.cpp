#include "ops/fp8_act.h"

#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/gemm.h"

namespace osprey::ops {

int64_t fp8_act_rows(const Fp8Act& a, int64_t n, int64_t in, const char* op) {
  constexpr int64_t kGroup = 128;  // the 1×128 quantisation group (ops/gemm.h kFp8BlockSize)
  OSPREY_CHECK(a.layout != Fp8Layout::None && in % kGroup == 0, op, ": an FP8 activation of width ",
               in, " (a multiple of 128)");
  const int64_t rows = a.layout == Fp8Layout::Rows
                           ? n
                           : (n + kFp8ColsTokenAlign - 1) / kFp8ColsTokenAlign * kFp8ColsTokenAlign;
  const Shape s = a.layout == Fp8Layout::Rows ? Shape{n, in / kGroup} : Shape{in / kGroup, rows};
  OSPREY_CHECK(a.q.dtype == DType::U8 && a.q.numel() == rows * in && a.s.dtype == DType::F32 &&
                   a.s.shape == s && a.q.device == a.s.device,
               op, ": FP8 activation q ", shape_str(a.q.shape), " s ", shape_str(a.s.shape),
               " for ", n, " rows of ", in, " (", a.layout == Fp8Layout::Rows ? "Rows" : "Cols",
               ", scales ", shape_str(s), ")");
  return rows;
}

namespace cpu {
void write_fp8_act(const Fp8Act& a, const float* x, int64_t n, int64_t in) {
  const int64_t rows = fp8_act_rows(a, n, in, "write_fp8_act");
  const int64_t groups = in / kFp8BlockSize;
  std::vector<float> q(size_t(n * in)), s(size_t(n * groups));
  quantize_act_rows(q.data(), s.data(), x, n, in);
  auto* q8 = a.q.ptr<uint8_t>();
  float* sc = a.s.f32();
  for (int64_t i = 0; i < n * in; ++i) q8[i] = f32_to_e4m3(q[size_t(i)]);  // exact: e4m3 values
  for (int64_t i = n * in; i < rows * in; ++i) q8[i] = 0;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const float v = t < n ? s[size_t(t * groups + g)] : 1.0f;
      if (a.layout == Fp8Layout::Rows)
        sc[t * groups + g] = v;
      else
        sc[g * rows + t] = v;
    }
}
}  // namespace cpu

}  // namespace osprey::ops
