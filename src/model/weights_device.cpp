// The GPU weight loaders (contracts in weights.h). Without the CUDA backend they fail with a
// message.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "model/weight_slice.h"
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
// The router's gate is BF16 on the GPU, so its logits are BF16 too (the gate GEMM writes them,
// moe_route reads them: model/moe_router.h); the default since the GPU goldens passed with it
// on the H200 (16/16, 2026-12). OSPREY_ROUTER_BF16=0 keeps the gate F32 (F32 logits, as
// before), for before/after figures.
bool router_bf16() {
  static const bool bf16 = [] {
    const char* e = std::getenv("OSPREY_ROUTER_BF16");
    return !(e && e[0] == '0');
  }();
  return bf16;
}
bool stays_f32(WeightKind k) {
  return k == WeightKind::Norm || k == WeightKind::NormBias || k == WeightKind::CorrectionBias ||
         (k == WeightKind::Router && !router_bf16());
}
}  // namespace

ModelWeights load_weights_cuda(const Checkpoint& ckpt, const ModelConfig& c,
                               const std::vector<WeightSpec>& specs, const std::string& label) {
  ModelWeights mw;
  std::map<std::string, LinearWeight> t;
  auto keep = [&](Storage s) {
    mw.device_owned.push_back(s);
    return s.view();
  };
  LoadProgress progress(label, int(ckpt.n_files()));
  for (const WeightSpec& spec : in_checkpoint_order(ckpt, specs)) {
    std::vector<Buffer> scratch;  // column slices' copies, until they are on the device
    const WeightRead read = read_weight(ckpt, spec, scratch);
    progress.add(int(ckpt.file_index(spec.name)), read.bytes);
    Tensor src = read.value;
    const Shape local = spec.local_shape();
    if (src.dtype == DType::F8_E4M3) {
      t[spec.name] = LinearWeight{keep(to_device_storage(src, Device::CUDA)),
                                  keep(to_device_storage(read.scale_inv, Device::CUDA))};
      continue;
    }
    // Everything else through its F32 value (the CPU loader's conversion), then to the device
    // dtype.
    Buffer f(DType::F32, local);
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
      Buffer b(DType::BF16, local);
      for (int64_t i = 0; i < f.numel(); ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(f.f32()[i]);
      t[spec.name] = LinearWeight{keep(to_device_storage(b, Device::CUDA)), {}};
    }
  }
  progress.done();
  assemble_weights(c, t, mw);
  return mw;
}

ModelWeights load_weights_cuda(const Checkpoint& ckpt, const ModelConfig& c) {
  return load_weights_cuda(ckpt, c, weight_specs_for(ckpt, c), "osprey: loading weights");
}

ModelWeights make_dummy_weights_cuda(const ModelConfig& c, uint64_t seed, bool fp8) {
  return make_dummy_weights_cuda(c, seed, fp8, weight_specs(c));
}

ModelWeights make_dummy_weights_cuda(const ModelConfig& c, uint64_t seed, bool fp8,
                                     const std::vector<WeightSpec>& specs) {
  ModelWeights mw;
  std::map<std::string, LinearWeight> t;
  uint64_t n = 0;
  auto random = [&](DType d, Shape s, float lo, float hi) {
    Storage st(Device::CUDA, d, std::move(s));
    ops::cuda::fill_uniform(st.view(), seed + 0x1000193ull * ++n, lo, hi);
    mw.device_owned.push_back(st);
    return st.view();
  };
  for (const WeightSpec& full : specs) {
    // The same values whatever the sharding is not promised: each rank's slice is drawn anew.
    WeightSpec spec = full;
    spec.shape = full.local_shape();
    const float in = float(full.shape.back());
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
        t[spec.name] = {random(router_bf16() ? DType::BF16 : DType::F32, spec.shape, -a, a), {}};
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
ModelWeights load_weights_cuda(const Checkpoint&, const ModelConfig&,
                               const std::vector<WeightSpec>&, const std::string&) {
  fail("this build has no CUDA backend: rebuild where nvcc is installed to run on the GPU");
}
ModelWeights make_dummy_weights_cuda(const ModelConfig&, uint64_t, bool) {
  fail("this build has no CUDA backend: rebuild where nvcc is installed to run on the GPU");
}
ModelWeights make_dummy_weights_cuda(const ModelConfig&, uint64_t, bool,
                                     const std::vector<WeightSpec>&) {
  fail("this build has no CUDA backend: rebuild where nvcc is installed to run on the GPU");
}

#endif

}  // namespace osprey
