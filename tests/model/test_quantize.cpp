// osprey quantize: a bf16 folder → DeepSeek's FP8 format. The quantized model's logits stay close
// to the source's (and differ from them: something was quantized); unquantized tensors keep their
// bytes; the read-back error is within e4m3's rounding; bad sources are refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "config/model_config.h"
#include "model/greedy.h"
#include "model/quantize.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

using namespace osprey;
using namespace osprey::testing;
namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  const std::string d =
      ::testing::TempDir() + "/osprey_q_" + std::to_string(::getpid()) + "/" + name;
  fs::remove_all(d);
  fs::create_directories(fs::path(d).parent_path());
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Quantize, V32TinyStaysCloseAndKeepsTheOtherTensors) {
  const std::string src = model_dir("v32-tiny"), dst = tmp("v32-fp8");
  const QuantizeStats st = quantize_model_fp8(src, dst, /*ue8m0=*/true);
  const ModelConfig c = ModelConfig::from_file(dst + "/config.json");
  EXPECT_TRUE(c.quant.fp8);
  EXPECT_TRUE(c.quant.ue8m0);
  int64_t eligible = 0, total = 0;
  for (const WeightSpec& s : weight_specs(c)) {
    ++total;
    eligible += s.fp8 ? 1 : 0;
  }
  EXPECT_EQ(st.quantized_tensors, eligible);
  EXPECT_EQ(st.kept_tensors, total - eligible);
  // e4m3 keeps 3 mantissa bits: half a step is 1/16 of a value; a block's ue8m0 scale can put
  // its amax up to 2× lower in the range, never above it. Quantization happened (error > 0).
  EXPECT_GT(st.max_rel_error, 1e-3);
  EXPECT_LE(st.max_rel_error, 1.0 / 16 + 1e-6);
  // Unquantized tensors: the same dtype and bytes.
  const Checkpoint a(src), b(dst);
  for (const WeightSpec& s : weight_specs(c)) {
    const Tensor ta = a.get(s.name), tb = b.get(s.name);
    if (s.fp8) {
      EXPECT_EQ(tb.dtype, DType::F8_E4M3) << s.name;
      EXPECT_TRUE(b.contains(s.name + "_scale_inv")) << s.name;
      continue;
    }
    ASSERT_EQ(ta.dtype, tb.dtype) << s.name;
    EXPECT_EQ(std::memcmp(ta.data, tb.data, size_t(ta.nbytes())), 0) << s.name;
  }
}

// The quantized model runs and its logits stay within FP8's error of the source's without equalling
// them: relative L2 error over all logits (v2-tiny: no indexer, whose top-k of a random model flips
// under any perturbation; measured 0.06–0.09 per row with these tokens).
TEST(Quantize, LogitsStayClose) {
  const std::string src = model_dir("v2-tiny"), dst = tmp("v2-fp8");
  quantize_model_fp8(src, dst, false);
  const std::vector<int32_t> tokens = {3, 17, 99, 250, 4, 8, 15, 16, 23, 42};
  Buffer la = prefill_logits(*load_model_cpu(src), tokens);
  Buffer lb = prefill_logits(*load_model_cpu(dst), tokens);
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < la.numel(); ++i) {
    num += std::pow(double(la.f32()[i]) - double(lb.f32()[i]), 2);
    den += std::pow(double(la.f32()[i]), 2);
  }
  const double e = std::sqrt(num / den);
  EXPECT_GT(e, 1e-3);
  EXPECT_LT(e, 0.15);
}

TEST(Quantize, CopiesTheTokenizerAndRefusesBadSources) {
  // A folder with a tokenizer: the bundled arithmetic model (bf16).
  const std::string src = std::string(OSPREY_SOURCE_DIR) + "/models/osprey-arith";
  const std::string dst = tmp("arith-fp8");
  quantize_model_fp8(src, dst, false);
  EXPECT_TRUE(fs::exists(dst + "/tokenizer.json"));
  EXPECT_EQ(fs::file_size(dst + "/tokenizer.json"), fs::file_size(src + "/tokenizer.json"));
  EXPECT_FALSE(ModelConfig::from_file(dst + "/config.json").quant.ue8m0);
  // An FP8 source.
  EXPECT_NE(error_of([&] { quantize_model_fp8(dst, tmp("again"), false); }).find("already FP8"),
            std::string::npos);
  // The output is the source.
  EXPECT_NE(error_of([&] { quantize_model_fp8(src, src, false); }).find("must differ"),
            std::string::npos);
  // A config naming a tensor the weights lack: one layer more than the checkpoint holds.
  const std::string lying = tmp("lying");
  fs::create_directories(lying);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  // The checkpoint holds layers 0 .. layers + nextn - 1 (the MTP layers after the main ones), so
  // with one main layer more the first absent one is layers + nextn.
  const int absent = cfg["num_hidden_layers"].get<int>() + cfg.value("num_nextn_predict_layers", 0);
  cfg["num_hidden_layers"] = cfg["num_hidden_layers"].get<int>() + 1;
  std::ofstream(lying + "/config.json") << cfg.dump();
  fs::copy_file(src + "/model.safetensors", lying + "/model.safetensors");
  const std::string out = tmp("out");
  const std::string msg = error_of([&] { quantize_model_fp8(lying, out, false); });
  EXPECT_NE(msg.find("model.layers." + std::to_string(absent) + "."), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));  // checked before anything is written
}
