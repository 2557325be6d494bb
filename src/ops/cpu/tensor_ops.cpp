#include <algorithm>

#include "core/error.h"
#include "ops/tensor_ops.h"

namespace osprey::ops::cpu {

void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t width) {
  const int64_t wd = dst.size(-1), ws = src.size(-1);
  const int64_t rd = dst.numel() / wd, rs = src.numel() / ws;
  OSPREY_CHECK(rs > 0 && rd % rs == 0 && dst_col + width <= wd && src_col + width <= ws,
               "copy_columns: dst ", shape_str(dst.shape), " col ", dst_col, ", src ",
               shape_str(src.shape), " col ", src_col, ", width ", width);
  const int64_t repeat = rd / rs;
  const float* s = src.f32();
  float* d = dst.f32();
  for (int64_t r = 0; r < rd; ++r)
    std::copy_n(s + (r / repeat) * ws + src_col, width, d + r * wd + dst_col);
}

void add(Tensor out, Tensor a, Tensor b) {
  OSPREY_CHECK(out.numel() == a.numel() && a.numel() == b.numel(), "add sizes");
  const float *pa = a.f32(), *pb = b.f32();
  float* o = out.f32();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = pa[i] + pb[i];
}

void scale(Tensor x, float s) {
  float* p = x.f32();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] *= s;
}

}  // namespace osprey::ops::cpu
