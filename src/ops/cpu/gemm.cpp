// CPU linear: dequantize the weight to F32 if needed (in row panels, so memory stays bounded),
// then one BLAS sgemm per panel.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/gemm.h"

namespace osprey::ops::cpu {

namespace {

void check_scales(const LinearWeight& w) {
  const int64_t rb = (w.out() + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t cb = (w.in() + kFp8BlockSize - 1) / kFp8BlockSize;
  OSPREY_CHECK(w.scale_inv.dtype == DType::F32 && w.scale_inv.shape == Shape({rb, cb}),
               "fp8 weight ", shape_str(w.weight.shape), " needs scales [", rb, ", ", cb, "], got ",
               shape_str(w.scale_inv.shape));
}

}  // namespace

void dequantize_rows(float* out, const LinearWeight& w, int64_t r0, int64_t r1) {
  const int64_t in = w.in();
  switch (w.weight.dtype) {
    case DType::F32: {
      const float* src = w.weight.f32() + r0 * in;
      std::copy(src, src + (r1 - r0) * in, out);
      break;
    }
    case DType::BF16: {
      const uint16_t* src = w.weight.ptr<uint16_t>() + r0 * in;
      for (int64_t i = 0; i < (r1 - r0) * in; ++i) out[i] = bf16_to_f32(src[i]);
      break;
    }
    case DType::F16: {
      const uint16_t* src = w.weight.ptr<uint16_t>() + r0 * in;
      for (int64_t i = 0; i < (r1 - r0) * in; ++i) out[i] = f16_to_f32(src[i]);
      break;
    }
    case DType::F8_E4M3: {
      check_scales(w);
      const uint8_t* src = w.weight.ptr<uint8_t>();
      const float* s = w.scale_inv.f32();
      const int64_t cb = w.scale_inv.size(1);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < in; ++c)
          out[(r - r0) * in + c] =
              e4m3_to_f32(src[r * in + c]) * s[(r / kFp8BlockSize) * cb + c / kFp8BlockSize];
      break;
    }
    default:
      OSPREY_CHECK(false, "unsupported weight dtype ", dtype_name(w.weight.dtype));
  }
}

void dequantize(Tensor out_f32, const LinearWeight& w) {
  OSPREY_CHECK(out_f32.shape == w.weight.shape, "dequantize shape");
  dequantize_rows(out_f32.f32(), w, 0, w.out());
}

void linear(Tensor y, Tensor x, const LinearWeight& w) {
  const int64_t n = x.numel() / std::max<int64_t>(x.size(-1), 1);
  const int64_t in = w.in(), out = w.out();
  OSPREY_CHECK(x.size(-1) == in && y.numel() == n * out, "linear: x ", shape_str(x.shape), " W ",
               shape_str(w.weight.shape), " y ", shape_str(y.shape));
  if (n == 0) return;
  float* yp = y.f32();
  const float* xp = x.f32();
  if (w.weight.dtype == DType::F32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(out), int(in), 1.0f, xp,
                int(in), w.weight.f32(), int(in), 0.0f, yp, int(out));
    return;
  }
  constexpr int64_t kPanelRows = 512;
  std::vector<float> panel(size_t(std::min(out, kPanelRows) * in));
  for (int64_t r0 = 0; r0 < out; r0 += kPanelRows) {
    const int64_t r1 = std::min(out, r0 + kPanelRows);
    dequantize_rows(panel.data(), w, r0, r1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(r1 - r0), int(in), 1.0f, xp,
                int(in), panel.data(), int(in), 0.0f, yp + r0, int(out));
  }
}

void quantize_act_rows(float* q, float* s, const float* x, int64_t n, int64_t in) {
  OSPREY_CHECK(in % kFp8BlockSize == 0, "quantize_act_rows: in ", in, " is not a multiple of ",
               kFp8BlockSize);
  const int64_t groups = in / kFp8BlockSize;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + t * in + g * kFp8BlockSize;
      float amax = 0.0f;
      for (int64_t c = 0; c < kFp8BlockSize; ++c) amax = std::max(amax, std::fabs(xg[c]));
      const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
      for (int64_t c = 0; c < kFp8BlockSize; ++c)
        q[t * in + g * kFp8BlockSize + c] = e4m3_to_f32(f32_to_e4m3(xg[c] / sc));
      s[t * groups + g] = sc;
    }
  }
}

void linears(Tensor x, std::span<const LinearOut> outs) {
  for (const LinearOut& o : outs) linear(o.y, x, *o.w);
}

void linear_w8a8(Tensor y, Tensor x, const LinearWeight& w) {
  const int64_t n = x.numel() / std::max<int64_t>(x.size(-1), 1);
  const int64_t in = w.in(), out = w.out();
  OSPREY_CHECK(w.weight.dtype == DType::F8_E4M3 && in % kFp8BlockSize == 0 && x.size(-1) == in &&
                   y.numel() == n * out && x.dtype == DType::F32 && y.dtype == DType::F32,
               "linear_w8a8: x ", shape_str(x.shape), " ", dtype_name(x.dtype), ", W ",
               shape_str(w.weight.shape), " ", dtype_name(w.weight.dtype), ", y ",
               shape_str(y.shape), " (F32 x and y, e4m3 W with in a multiple of 128)");
  check_scales(w);
  if (n == 0) return;
  const int64_t groups = in / kFp8BlockSize;
  std::vector<float> q(size_t(n * in)), sx(size_t(n * groups));
  quantize_act_rows(q.data(), sx.data(), x.f32(), n, in);
  const auto* w8 = w.weight.ptr<uint8_t>();
  const float* sw = w.scale_inv.f32();
  std::vector<float> wg(size_t(out * kFp8BlockSize)), yg(size_t(n * out));
  float* yp = y.f32();
  std::fill(yp, yp + n * out, 0.0f);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < kFp8BlockSize; ++c)
        wg[size_t(r * kFp8BlockSize + c)] = e4m3_to_f32(w8[r * in + g * kFp8BlockSize + c]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(out), int(kFp8BlockSize), 1.0f,
                q.data() + g * kFp8BlockSize, int(in), wg.data(), int(kFp8BlockSize), 0.0f,
                yg.data(), int(out));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < out; ++r)
        yp[t * out + r] +=
            yg[size_t(t * out + r)] * (sw[(r / kFp8BlockSize) * groups + g] * sx[t * groups + g]);
  }
}

}  // namespace osprey::ops::cpu
