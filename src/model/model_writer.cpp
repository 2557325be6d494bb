#include "model/model_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "model/safetensors_writer.h"
#include "ops/gemm.h"

namespace osprey {

namespace {

float block_scale(float amax, bool ue8m0) {
  float s = std::max(amax, 1e-4f) / kE4M3Max;
  if (ue8m0) s = std::exp2(std::ceil(std::log2(s)));
  return s;
}

}  // namespace

ModelConfig write_model_config(const ModelConfig& config, const std::string& dir,
                               const ModelWriteOptions& opts) {
  namespace fs = std::filesystem;
  ModelConfig c = config;
  c.quant.fp8 = opts.fp8;
  c.quant.ue8m0 = opts.fp8 && opts.ue8m0;
  // Round-trip through the JSON form so the written config is exactly what loaders will read.
  c = ModelConfig::from_json(c.to_json(), "written config");
  fs::create_directories(dir);
  std::ofstream cfg(fs::path(dir) / "config.json");
  cfg << c.to_json().dump(2) << "\n";
  if (!cfg) fail("cannot write ", (fs::path(dir) / "config.json").string());
  return c;
}

void write_model_folder(const ModelConfig& config, const std::string& dir,
                        const ModelWriteOptions& opts, const StoredDType& stored_dtype,
                        const TensorRowSource& source) {
  namespace fs = std::filesystem;
  // config.json first; its parsed form decides the tensors.
  const ModelConfig c = write_model_config(config, dir, opts);

  struct Item {
    WeightSpec spec;
    bool quantize;
    DType dtype;  // when not quantized
  };
  std::vector<Item> items;
  for (const WeightSpec& s : weight_specs(c)) {
    const bool q = opts.fp8 && s.fp8;
    const DType d = q ? DType::F8_E4M3 : stored_dtype(s);
    OSPREY_CHECK(d == DType::F8_E4M3 || d == DType::F32 || d == DType::BF16,
                 "write_model_folder: ", s.name, " stored as ", dtype_name(d));
    items.push_back({s, q, d});
  }
  auto tensor_bytes = [&](const Item& it) {
    const int64_t n = shape_numel(it.spec.shape);
    if (!it.quantize) return n * int64_t(dtype_size(it.dtype));
    const int64_t blocks = ((it.spec.shape[0] + 127) / 128) * ((it.spec.shape[1] + 127) / 128);
    return n + blocks * 4;
  };
  // Shards of at most max_shard_bytes (a tensor never spans two).
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t b = tensor_bytes(items[i]);
    if (in_shard > 0 && in_shard + b > opts.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }
  nlohmann::ordered_json weight_map;
  int64_t total_bytes = 0;
  for (size_t sh = 0; sh < shards.size(); ++sh) {
    char fname[64];
    if (shards.size() == 1)
      std::snprintf(fname, sizeof fname, "model.safetensors");
    else
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", sh + 1, shards.size());
    std::vector<TensorDecl> decls;
    for (size_t i : shards[sh]) {
      const Item& it = items[i];
      decls.push_back({it.spec.name, it.dtype, it.spec.shape});
      if (it.quantize)
        decls.push_back({it.spec.name + "_scale_inv",
                         DType::F32,
                         {(it.spec.shape[0] + 127) / 128, (it.spec.shape[1] + 127) / 128}});
    }
    for (const auto& d : decls) {
      weight_map[d.name] = fname;
      total_bytes += int64_t(d.nbytes());
    }
    SafetensorsWriter w((fs::path(dir) / fname).string(), decls, {{"format", "pt"}});
    for (size_t i : shards[sh]) {
      const Item& it = items[i];
      const int64_t cols = it.spec.shape.back();
      const int64_t rows = shape_numel(it.spec.shape) / cols;
      std::vector<float> panel;   // [≤ 128, cols]: one FP8 scale block high
      std::vector<float> scales;  // [ceil(rows/128), ceil(cols/128)]
      const int64_t col_blocks = (cols + 127) / 128;
      for (int64_t r0 = 0; r0 < rows; r0 += 128) {
        const int64_t r1 = std::min(rows, r0 + 128), n = (r1 - r0) * cols;
        panel.resize(size_t(n));
        source(it.spec, r0, r1, panel.data());
        if (!it.quantize) {
          if (it.dtype == DType::F32) {
            w.write(it.spec.name, panel.data(), size_t(n) * 4);
          } else {
            std::vector<uint16_t> out(static_cast<size_t>(n));
            for (int64_t k = 0; k < n; ++k) out[size_t(k)] = f32_to_bf16(panel[size_t(k)]);
            w.write(it.spec.name, out.data(), size_t(n) * 2);
          }
          continue;
        }
        std::vector<float> s(static_cast<size_t>(col_blocks));
        for (int64_t cb = 0; cb < col_blocks; ++cb) {
          float amax = 0.0f;
          for (int64_t r = 0; r < r1 - r0; ++r)
            for (int64_t cc = cb * 128; cc < std::min(cols, cb * 128 + 128); ++cc)
              amax = std::max(amax, std::fabs(panel[size_t(r * cols + cc)]));
          s[size_t(cb)] = block_scale(amax, opts.ue8m0);
        }
        std::vector<uint8_t> q(static_cast<size_t>(n));
        for (int64_t r = 0; r < r1 - r0; ++r)
          for (int64_t cc = 0; cc < cols; ++cc)
            q[size_t(r * cols + cc)] =
                f32_to_e4m3(panel[size_t(r * cols + cc)] / s[size_t(cc / 128)]);
        w.write(it.spec.name, q.data(), q.size());
        scales.insert(scales.end(), s.begin(), s.end());
      }
      if (it.quantize) w.write(it.spec.name + "_scale_inv", scales.data(), scales.size() * 4);
    }
    w.finish();
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = weight_map;
    std::ofstream(fs::path(dir) / "model.safetensors.index.json") << index.dump(2) << "\n";
  }
}

}  // namespace osprey
