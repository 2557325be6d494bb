#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "config/model_config.h"
#include "core/error.h"
#include "model/model_writer.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "ops/gemm.h"

namespace osprey {

namespace {

// A tensor of any rank as the rows [numel / last dim, last dim] that the row reader takes.
LinearWeight as_rows(const Tensor& t) {
  const int64_t cols = t.shape.back();
  return LinearWeight{t.reshape({t.numel() / cols, cols}), {}};
}

}  // namespace

QuantizeStats quantize_model_fp8(const std::string& src_dir, const std::string& dst_dir, bool ue8m0,
                                 int64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  if (fs::exists(dst_dir) && fs::equivalent(src_dir, dst_dir))
    fail("quantize: the output folder must differ from the source '", src_dir, "'");
  const ModelConfig c = ModelConfig::from_file((fs::path(src_dir) / "config.json").string());
  if (c.quant.fp8)
    fail("quantize: '", src_dir, "' is already FP8 (its config.json has a quantization_config)");
  const Checkpoint src(src_dir);
  // Every tensor present with its shape and a dtype we can read, before anything is written.
  for (const WeightSpec& s : weight_specs(c)) {
    const Tensor t = src.get(s.name, s.shape);
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
      fail("quantize: ", s.name, " in ", src.file_of(s.name), " is ", dtype_name(t.dtype),
           "; the source must be F32, BF16 or F16");
  }
  ModelWriteOptions wo;
  wo.fp8 = true;
  wo.ue8m0 = ue8m0;
  wo.max_shard_bytes = max_shard_bytes;
  write_model_folder(
      c, dst_dir, wo,
      [&](const WeightSpec& s) {
        return src.get(s.name).dtype == DType::BF16 ? DType::BF16 : DType::F32;
      },
      [&](const WeightSpec& s, int64_t r0, int64_t r1, float* out) {
        ops::cpu::dequantize_rows(out, as_rows(src.get(s.name)), r0, r1);
      });
  // The other files of the folder (tokenizer, generation config, ...).
  for (const auto& e : fs::directory_iterator(src_dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.ends_with(".safetensors") ||
        name == "model.safetensors.index.json")
      continue;
    fs::copy_file(e.path(), fs::path(dst_dir) / name, fs::copy_options::overwrite_existing);
  }
  // Read the result back: every quantized weight dequantised against its source.
  QuantizeStats st;
  const Checkpoint dst(dst_dir);
  for (const WeightSpec& s : weight_specs(c)) {
    const Tensor w = dst.get(s.name, s.shape);
    if (w.dtype != DType::F8_E4M3) {
      ++st.kept_tensors;
      continue;
    }
    ++st.quantized_tensors;
    LinearWeight lw{w, dst.get(s.name + "_scale_inv")};
    std::vector<float> dq(size_t(w.numel()));
    ops::cpu::dequantize(Tensor{dq.data(), DType::F32, s.shape, Device::CPU}, lw);
    std::vector<float> ref(size_t(w.numel()));
    ops::cpu::dequantize(Tensor{ref.data(), DType::F32, s.shape, Device::CPU},
                         LinearWeight{src.get(s.name), {}});
    double amax = 0.0, err = 0.0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double v = ref[size_t(i)];
      amax = std::max(amax, std::fabs(v));
      err = std::max(err, std::fabs(v - double(dq[size_t(i)])));
    }
    st.max_abs_error = std::max(st.max_abs_error, err);
    if (amax > 0) st.max_rel_error = std::max(st.max_rel_error, err / amax);
  }
  return st;
}

}  // namespace osprey
