// The GPU weight loaders (contracts in weights.h). Without the CUDA backend they fail with a
// message.
#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "model/weights.h"

#ifdef OSPREY_WITH_CUDA
#include "core/device_buffer.h"
#include "ops/tensor_ops.h"
#endif

namespace osprey {

#ifdef OSPREY_WITH_CUDA

namespace {
Shape scale_shape(const Shape& s) {
  return {(s[0] + kFp8BlockSize - 1) / kFp8BlockSize, (s[1] + kFp8BlockSize - 1) / kFp8BlockSize};
}
bool stays_f32(WeightKind k) {
  return k == WeightKind::Norm || k == WeightKind::NormBias || k == WeightKind::Router ||
         k == WeightKind::CorrectionBias;
}
}  // namespace

ModelWeights load_weights_cuda(const Checkpoint& ckpt, const ModelConfig& c) {
  ModelWeights mw;
  std::map<std::string, LinearWeight> t;
  auto keep = [&](Storage s) {
    mw.device_owned.push_back(s);
    return s.view();
  };
  for (const WeightSpec& spec : weight_specs(c)) {
    Tensor src = ckpt.get(spec.name, spec.shape);
    if (src.dtype == DType::F8_E4M3) {
      if (!spec.fp8)
        fail(ckpt.file_of(spec.name), ": tensor '", spec.name,
             "' is F8_E4M3, but osprey expects it unquantized");
      const std::string sname = spec.name + "_scale_inv";
      if (!ckpt.contains(sname))
        fail(ckpt.file_of(spec.name), ": FP8 tensor '", spec.name, "' has no '", sname, "'");
      Tensor s = ckpt.get(sname, scale_shape(spec.shape));
      if (s.dtype != DType::F32) fail(ckpt.file_of(sname), ": tensor '", sname, "' must be F32");
      t[spec.name] = LinearWeight{keep(to_device_storage(src, Device::CUDA)),
                                  keep(to_device_storage(s, Device::CUDA))};
      continue;
    }
    // Everything else through its F32 value (the CPU loader's conversion), then to the device
    // dtype.
    Buffer f(DType::F32, spec.shape);
    if (src.dtype == DType::F32) {
      std::copy_n(src.f32(), src.numel(), f.f32());
    } else if (src.dtype == DType::BF16 || src.dtype == DType::F16) {
      ops::cpu::dequantize(
          f.view().reshape({src.numel() / src.shape.back(), src.shape.back()}),
          LinearWeight{src.reshape({src.numel() / src.shape.back(), src.shape.back()}), {}});
    } else {
      fail(ckpt.file_of(spec.name), ": tensor '", spec.name, "' has dtype ", dtype_name(src.dtype),
           "; expected F32, BF16, F16 or F8_E4M3");
    }
    if (stays_f32(spec.kind)) {
      t[spec.name] = LinearWeight{keep(to_device_storage(f, Device::CUDA)), {}};
    } else {
      Buffer b(DType::BF16, spec.shape);
      for (int64_t i = 0; i < f.numel(); ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(f.f32()[i]);
      t[spec.name] = LinearWeight{keep(to_device_storage(b, Device::CUDA)), {}};
    }
  }
  assemble_weights(c, t, mw);
  return mw;
}

ModelWeights make_dummy_weights_cuda(const ModelConfig& c, uint64_t seed, bool fp8) {
  ModelWeights mw;
  std::map<std::string, LinearWeight> t;
  uint64_t n = 0;
  auto random = [&](DType d, Shape s, float lo, float hi) {
    Storage st(Device::CUDA, d, std::move(s));
    ops::cuda::fill_uniform(st.view(), seed + 0x1000193ull * ++n, lo, hi);
    mw.device_owned.push_back(st);
    return st.view();
  };
  for (const WeightSpec& spec : weight_specs(c)) {
    const float in = float(spec.shape.back());
    const float a = std::sqrt(3.0f / in);  // uniform ±a over `in` inputs: unit output variance
    switch (spec.kind) {
      case WeightKind::Norm:
        t[spec.name] = {random(DType::F32, spec.shape, 0.9f, 1.1f), {}};
        break;
      case WeightKind::NormBias:
      case WeightKind::CorrectionBias:
        t[spec.name] = {random(DType::F32, spec.shape, -0.01f, 0.01f), {}};
        break;
      case WeightKind::Router:
        t[spec.name] = {random(DType::F32, spec.shape, -a, a), {}};
        break;
      case WeightKind::Embedding:
        t[spec.name] = {random(DType::BF16, spec.shape, -1.0f, 1.0f), {}};
        break;
      case WeightKind::Linear:
        if (fp8 && spec.fp8) {
          Tensor w = random(DType::F8_E4M3, spec.shape, -1.0f, 1.0f);
          t[spec.name] = {w, random(DType::F32, scale_shape(spec.shape), 0.9f * a, 1.1f * a)};
        } else {
          t[spec.name] = {random(DType::BF16, spec.shape, -a, a), {}};
        }
        break;
    }
  }
  osprey::cuda::synchronize();
  assemble_weights(c, t, mw);
  return mw;
}

#else

ModelWeights load_weights_cuda(const Checkpoint&, const ModelConfig&) {
  fail("this build has no CUDA backend: rebuild where nvcc is installed to run on the GPU");
}
ModelWeights make_dummy_weights_cuda(const ModelConfig&, uint64_t, bool) {
  fail("this build has no CUDA backend: rebuild where nvcc is installed to run on the GPU");
}

#endif

}  // namespace osprey
