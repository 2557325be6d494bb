#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/norm.h"

namespace osprey::ops::cpu {

namespace {
void rms_row(float* out, const float* x, const float* w, int64_t d, float eps) {
  double ss = 0.0;  // double accumulation: the oracle should carry no summation-order error
  for (int64_t i = 0; i < d; ++i) ss += double(x[i]) * x[i];
  const float r = float(1.0 / std::sqrt(ss / double(d) + double(eps)));
  for (int64_t i = 0; i < d; ++i) out[i] = w[i] * (x[i] * r);
}

// NormOutputs' extras from out (F32 [n, d]): the BF16 rounding, and cpu::quantize_act_rows laid out
// as o.fp8.layout says (Cols: rows ≥ n zero bytes with scale 1).
void write_extras(const NormOutputs& o, int64_t n, int64_t d) {
  const float* out = o.out.f32();
  if (o.bf16.data) {
    OSPREY_CHECK(o.bf16.dtype == DType::BF16 && o.bf16.numel() == n * d, "norm bf16 output ",
                 shape_str(o.bf16.shape));
    auto* b = static_cast<uint16_t*>(o.bf16.data);
    for (int64_t i = 0; i < n * d; ++i) b[i] = f32_to_bf16(out[i]);
  }
  if (!o.fp8.empty()) write_fp8_act(o.fp8, out, n, d);
}
}  // namespace

void rms_norm(Tensor out, Tensor x, Tensor w, float eps) {
  const int64_t d = x.size(-1), n = x.numel() / d;
  OSPREY_CHECK(w.numel() == d && out.numel() == x.numel(), "rms_norm shapes");
  for (int64_t t = 0; t < n; ++t) rms_row(out.f32() + t * d, x.f32() + t * d, w.f32(), d, eps);
}

void add_rms_norm(Tensor out, Tensor residual, Tensor x, Tensor w, float eps) {
  const int64_t d = x.size(-1), n = x.numel() / d;
  OSPREY_CHECK(w.numel() == d && out.numel() == x.numel() && residual.numel() == x.numel(),
               "add_rms_norm shapes");
  float* r = residual.f32();
  const float* xp = x.f32();
  for (int64_t i = 0; i < n * d; ++i) r[i] += xp[i];
  for (int64_t t = 0; t < n; ++t) rms_row(out.f32() + t * d, r + t * d, w.f32(), d, eps);
}

void rms_norm_multi(const NormOutputs& o, Tensor x, Tensor w, float eps) {
  rms_norm(o.out, x, w, eps);
  write_extras(o, x.numel() / x.size(-1), x.size(-1));
}

void add_rms_norm_multi(const NormOutputs& o, Tensor residual, Tensor x, Tensor w, float eps) {
  add_rms_norm(o.out, residual, x, w, eps);
  write_extras(o, x.numel() / x.size(-1), x.size(-1));
}

void layer_norm(Tensor out, Tensor x, Tensor w, Tensor b, float eps) {
  const int64_t d = x.size(-1), n = x.numel() / d;
  OSPREY_CHECK(w.numel() == d && b.numel() == d && out.numel() == x.numel(), "layer_norm shapes");
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x.f32() + t * d;
    float* o = out.f32() + t * d;
    double mean = 0.0;
    for (int64_t i = 0; i < d; ++i) mean += xr[i];
    mean /= double(d);
    double var = 0.0;
    for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(d);
    const float r = float(1.0 / std::sqrt(var + double(eps)));
    const float m = float(mean);
    for (int64_t i = 0; i < d; ++i) o[i] = (xr[i] - m) * r * w.f32()[i] + b.f32()[i];
  }
}

}  // namespace osprey::ops::cpu
